//! Persistent watches on the client side: armed until dropped, delivering
//! every change in order, exactly once, across reconnects.
//!
//! The session task keeps each [`PersistentWatch`]'s sender with what it
//! last delivered. After a reconnect it sets the watches again with the
//! revision they had reached; the server replays the events missed since
//! (or says `compacted`), and events delivered already are not delivered
//! twice.

use std::collections::HashMap;

use baton_proto::{path, EventKind, Request, WatchEvent};
use tokio::sync::mpsc;

use crate::error::Error;

type Slot = mpsc::UnboundedSender<Result<WatchEvent, Error>>;

/// A persistent watch to register, handed to the session task before its
/// request is written: the events the server replays for it come before
/// the reply.
pub(crate) struct PersistentRequest {
    pub(crate) id: u64,
    pub(crate) recursive: bool,
    slot: Slot,
    /// Events up to this revision are not delivered.
    from: u64,
}

struct Entry {
    id: u64,
    recursive: bool,
    slot: Slot,
    /// The revision of the latest event delivered, and the events of that
    /// revision delivered: a replay after a reconnect may carry them again.
    revision: u64,
    at_revision: Vec<(EventKind, String)>,
}

impl Entry {
    fn covers(&self, watched: &str, event: &WatchEvent) -> bool {
        if event.kind == EventKind::Compacted {
            return event.path == watched;
        }
        if event.path == watched {
            return !self.recursive || event.kind != EventKind::ChildrenChanged;
        }
        self.recursive
            && event.kind != EventKind::ChildrenChanged
            && path::is_within(&event.path, watched)
    }

    /// Delivers the event unless it was delivered already.
    fn deliver(&mut self, event: &WatchEvent) {
        if event.kind != EventKind::Compacted {
            if event.revision < self.revision {
                return;
            }
            let key = (event.kind, event.path.clone());
            if event.revision == self.revision {
                if self.at_revision.contains(&key) {
                    return;
                }
            } else {
                self.revision = event.revision;
                self.at_revision.clear();
            }
            self.at_revision.push(key);
        } else {
            // Everything before it is unknown; count from its revision on.
            self.revision = event.revision;
            self.at_revision.clear();
        }
        let _ = self.slot.send(Ok(event.clone()));
    }
}

/// Live persistent watches by path, as the session task keeps them.
#[derive(Default)]
pub(crate) struct PersistentTable {
    by_path: HashMap<String, Vec<Entry>>,
    recursive: usize,
}

impl PersistentTable {
    /// Registers a watch whose request is about to be written.
    pub(crate) fn add(&mut self, path: &str, req: PersistentRequest) {
        self.recursive += req.recursive as usize;
        self.by_path
            .entry(path.to_owned())
            .or_default()
            .push(Entry {
                id: req.id,
                recursive: req.recursive,
                slot: req.slot,
                revision: req.from,
                at_revision: Vec::new(),
            });
    }

    /// Removes watch `id` on `path`; returns true if that was the last
    /// persistent watch on the path (the server's may be removed).
    pub(crate) fn remove(&mut self, path: &str, id: u64) -> bool {
        let Some(list) = self.by_path.get_mut(path) else {
            return false;
        };
        let before = list.len();
        list.retain(|e| {
            let gone = e.id == id;
            if gone {
                self.recursive -= e.recursive as usize;
            }
            !gone
        });
        if list.len() == before {
            return false;
        }
        if list.is_empty() {
            self.by_path.remove(path);
            return true;
        }
        false
    }

    /// Delivers the event to every watch it concerns.
    pub(crate) fn fire(&mut self, event: &WatchEvent) {
        if self.by_path.is_empty() {
            return;
        }
        if let Some(list) = self.by_path.get_mut(&event.path) {
            for e in list.iter_mut().filter(|e| e.covers(&event.path, event)) {
                e.deliver(event);
            }
        }
        if self.recursive == 0
            || matches!(
                event.kind,
                EventKind::ChildrenChanged | EventKind::Compacted
            )
        {
            return;
        }
        let mut at = event.path.as_str();
        while let Some(parent) = path::parent(at) {
            if let Some(list) = self.by_path.get_mut(parent) {
                for e in list.iter_mut().filter(|e| e.recursive) {
                    e.deliver(event);
                }
            }
            at = parent;
        }
    }

    /// Ends every watch with `error` (the session ended).
    pub(crate) fn fail_all(&mut self, error: &Error) {
        for (_, list) in self.by_path.drain() {
            for e in list {
                let _ = e.slot.send(Err(error.clone()));
            }
        }
        self.recursive = 0;
    }

    /// The requests that set the watches again after a reconnect, each from
    /// the revision its watches had reached (the one before, for a watch
    /// whose latest events may not all have arrived), given that every
    /// event up to `seen` was received.
    pub(crate) fn resume(&mut self, seen: u64) -> Vec<Request> {
        let mut out = Vec::new();
        self.by_path.retain(|path, list| {
            list.retain(|e| !e.slot.is_closed());
            for recursive in [false, true] {
                let from = list
                    .iter()
                    .filter(|e| e.recursive == recursive)
                    .map(|e| {
                        // A later frame proves every event of the watch's
                        // latest revision arrived; without one, ask again
                        // from just before it.
                        if e.revision < seen {
                            seen
                        } else {
                            e.revision.saturating_sub(1)
                        }
                    })
                    .min();
                if let Some(from) = from {
                    out.push(Request::AddWatch {
                        path: path.clone(),
                        recursive,
                        from,
                    });
                }
            }
            !list.is_empty()
        });
        self.recursive = self
            .by_path
            .values()
            .flatten()
            .filter(|e| e.recursive)
            .count();
        out
    }
}

/// A persistent watch: every change it covers, in revision order, until it
/// is dropped. See [`Client::watch`](crate::Client::watch).
///
/// Events are kept for it until read, however many arrive; read them
/// promptly (a watch nobody reads grows without bound).
///
/// # Cancellation safety
/// [`next`](Self::next) is cancellation safe: an event not yet returned
/// stays for the next call.
pub struct PersistentWatch {
    rx: mpsc::UnboundedReceiver<Result<WatchEvent, Error>>,
    path: String,
    id: u64,
    recursive: bool,
    unregister: mpsc::UnboundedSender<(String, u64)>,
}

impl PersistentWatch {
    pub(crate) fn new(
        path: String,
        (recursive, from): (bool, u64),
        id: u64,
        unregister: mpsc::UnboundedSender<(String, u64)>,
    ) -> (Self, PersistentRequest) {
        let (slot, rx) = mpsc::unbounded_channel();
        (
            PersistentWatch {
                rx,
                path,
                id,
                recursive,
                unregister,
            },
            PersistentRequest {
                id,
                recursive,
                slot,
                from,
            },
        )
    }

    /// The watched path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether it covers the subtree below its path too.
    pub fn is_recursive(&self) -> bool {
        self.recursive
    }

    /// The next change. An event of kind [`EventKind::Compacted`] says that
    /// changes were missed (the client was away for longer than the
    /// server's watch history covers): read afresh what is watched; the
    /// events after it follow as usual.
    ///
    /// # Errors
    /// [`Error::SessionExpired`] or [`Error::Closed`] once the session
    /// ended; every later call fails the same way.
    pub async fn next(&mut self) -> Result<WatchEvent, Error> {
        match self.rx.recv().await {
            Some(result) => result,
            None => Err(Error::Closed),
        }
    }

    /// The next change if one has arrived, without waiting.
    pub fn try_next(&mut self) -> Option<Result<WatchEvent, Error>> {
        self.rx.try_recv().ok()
    }
}

impl Drop for PersistentWatch {
    fn drop(&mut self) {
        let _ = self
            .unregister
            .send((std::mem::take(&mut self.path), self.id));
    }
}

impl std::fmt::Debug for PersistentWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentWatch")
            .field("path", &self.path)
            .field("recursive", &self.recursive)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, revision: u64, path: &str) -> WatchEvent {
        WatchEvent {
            kind,
            revision,
            path: path.into(),
        }
    }

    #[tokio::test]
    async fn events_reach_the_watches_they_concern_once_each() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut table = PersistentTable::default();
        let (mut plain, req) = PersistentWatch::new("/a".into(), (false, 5), 1, tx.clone());
        table.add("/a", req);
        let (mut deep, req) = PersistentWatch::new("/a".into(), (true, 5), 2, tx.clone());
        table.add("/a", req);
        table.fire(&event(EventKind::ChildrenChanged, 6, "/a"));
        table.fire(&event(EventKind::Created, 6, "/a/b/c"));
        // Sent again after a reconnect: not delivered twice.
        table.fire(&event(EventKind::Created, 6, "/a/b/c"));
        table.fire(&event(EventKind::DataChanged, 7, "/ab"));
        table.fire(&event(EventKind::Deleted, 8, "/a"));
        let kinds = |w: &mut PersistentWatch| {
            std::iter::from_fn(|| w.try_next())
                .map(|e| {
                    let e = e.unwrap();
                    (e.kind, e.revision, e.path)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            kinds(&mut plain),
            [
                (EventKind::ChildrenChanged, 6, "/a".to_string()),
                (EventKind::Deleted, 8, "/a".to_string())
            ]
        );
        assert_eq!(
            kinds(&mut deep),
            [
                (EventKind::Created, 6, "/a/b/c".to_string()),
                (EventKind::Deleted, 8, "/a".to_string())
            ]
        );
        // Resumed from the revision reached: 8 was the last frame seen, so
        // from just before it for both.
        let resume = table.resume(8);
        assert_eq!(resume.len(), 2);
        assert!(resume
            .iter()
            .all(|r| matches!(r, Request::AddWatch { from: 7, .. })));
        assert!(!table.remove("/a", 1), "the recursive one stays");
        assert!(table.remove("/a", 2));
    }
}
