//! One-shot watches on the client side.
//!
//! A call such as [`Client::get_data_watch`](crate::Client::get_data_watch)
//! returns a [`Watcher`]: a future that resolves once, with the first change
//! of its kind at its path. The session task keeps a table of live watchers;
//! one event from the server resolves every watcher it concerns. Dropping a
//! watcher removes it from the table.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use baton_proto::{EventKind, WatchEvent};
use tokio::sync::{mpsc, oneshot};

use crate::error::Error;

/// Which change a watcher waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WatchKind {
    /// The node existed: its data changing or its deletion.
    Data,
    /// The node did not exist: its creation.
    Exist,
    /// Its list of children changing, or its deletion.
    Child,
}

impl WatchKind {
    fn fired_by(self, kind: EventKind) -> bool {
        match self {
            WatchKind::Data | WatchKind::Exist => kind != EventKind::ChildrenChanged,
            WatchKind::Child => matches!(kind, EventKind::ChildrenChanged | EventKind::Deleted),
        }
    }
}

type Slot = oneshot::Sender<Result<WatchEvent, Error>>;

/// A pending watch registration, carried with its request until the reply
/// says which kind of watch the server set.
pub(crate) struct WatchRequest {
    pub(crate) id: u64,
    pub(crate) slot: Slot,
}

/// Live watchers by path, as the session task keeps them.
#[derive(Default)]
pub(crate) struct WatchTable {
    by_path: HashMap<String, Vec<(WatchKind, u64, Slot)>>,
}

impl WatchTable {
    pub(crate) fn add(&mut self, path: &str, kind: WatchKind, req: WatchRequest) {
        let list = match self.by_path.get_mut(path) {
            Some(list) => list,
            None => self.by_path.entry(path.to_owned()).or_default(),
        };
        list.retain(|(_, _, slot)| !slot.is_closed());
        list.push((kind, req.id, req.slot));
    }

    pub(crate) fn remove(&mut self, path: &str, id: u64) {
        if let Some(list) = self.by_path.get_mut(path) {
            list.retain(|(_, i, _)| *i != id);
            if list.is_empty() {
                self.by_path.remove(path);
            }
        }
    }

    /// Resolves every watcher the event concerns.
    pub(crate) fn fire(&mut self, event: &WatchEvent) {
        let Some(list) = self.by_path.get_mut(&event.path) else {
            return;
        };
        let mut i = 0;
        while i < list.len() {
            if list[i].0.fired_by(event.kind) {
                let (_, _, slot) = list.swap_remove(i);
                let _ = slot.send(Ok(event.clone()));
            } else {
                i += 1;
            }
        }
        if list.is_empty() {
            self.by_path.remove(&event.path);
        }
    }

    /// Resolves every watcher with `error` (the session ended).
    pub(crate) fn fail_all(&mut self, error: &Error) {
        for (_, list) in self.by_path.drain() {
            for (_, _, slot) in list {
                let _ = slot.send(Err(error.clone()));
            }
        }
    }

    /// The paths to watch again after a reconnect, by kind.
    pub(crate) fn paths(&mut self) -> [Vec<String>; 3] {
        let mut out: [Vec<String>; 3] = Default::default();
        self.by_path.retain(|path, list| {
            list.retain(|(_, _, slot)| !slot.is_closed());
            for kind in [WatchKind::Data, WatchKind::Exist, WatchKind::Child] {
                if list.iter().any(|(k, _, _)| *k == kind) {
                    out[kind as usize].push(path.clone());
                }
            }
            !list.is_empty()
        });
        out
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_path.values().map(Vec::len).sum()
    }
}

/// A one-shot watch: resolves with the first change of its kind at its path.
///
/// It resolves with an error if the session ends first
/// ([`Error::SessionExpired`] or [`Error::Closed`]). A watch survives
/// reconnects: after the client resumes its session on a new connection, a
/// change made while it was disconnected still fires the watch.
///
/// Dropping a watcher unregisters it.
///
/// # Cancellation safety
/// Polling a watcher in a `select!` and dropping it is safe; the event is
/// simply not delivered to this watcher.
#[must_use = "a watcher does nothing unless awaited"]
pub struct Watcher {
    rx: oneshot::Receiver<Result<WatchEvent, Error>>,
    path: String,
    id: u64,
    unregister: mpsc::UnboundedSender<(String, u64)>,
    done: bool,
}

impl Watcher {
    pub(crate) fn new(
        path: String,
        id: u64,
        unregister: mpsc::UnboundedSender<(String, u64)>,
    ) -> (Self, WatchRequest) {
        let (slot, rx) = oneshot::channel();
        (
            Watcher {
                rx,
                path,
                id,
                unregister,
                done: false,
            },
            WatchRequest { id, slot },
        )
    }

    /// The watched path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Points the watcher at the path the server actually watched (for a
    /// predecessor watch, the predecessor's path), so that dropping it
    /// unregisters the right entry.
    pub(crate) fn retarget(&mut self, path: &str) {
        path.clone_into(&mut self.path);
    }

    /// Waits for the change. Same as awaiting the watcher itself.
    ///
    /// # Errors
    /// [`Error::SessionExpired`] or [`Error::Closed`] if the session ended
    /// before the change.
    pub async fn changed(self) -> Result<WatchEvent, Error> {
        self.await
    }
}

impl Future for Watcher {
    type Output = Result<WatchEvent, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(result)) => result,
            Poll::Ready(Err(_)) => Err(Error::Closed),
        };
        self.done = true;
        Poll::Ready(result)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if !self.done {
            let _ = self
                .unregister
                .send((std::mem::take(&mut self.path), self.id));
        }
    }
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("path", &self.path).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, path: &str) -> WatchEvent {
        WatchEvent {
            kind,
            revision: 1,
            path: path.into(),
        }
    }

    #[tokio::test]
    async fn one_event_resolves_every_watcher_it_concerns() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut table = WatchTable::default();
        let (a, ra) = Watcher::new("/x".into(), 1, tx.clone());
        let (b, rb) = Watcher::new("/x".into(), 2, tx.clone());
        let (c, rc) = Watcher::new("/x".into(), 3, tx.clone());
        table.add("/x", WatchKind::Data, ra);
        table.add("/x", WatchKind::Exist, rb);
        table.add("/x", WatchKind::Child, rc);
        table.fire(&event(EventKind::DataChanged, "/x"));
        assert_eq!(a.await.unwrap().kind, EventKind::DataChanged);
        assert_eq!(b.await.unwrap().kind, EventKind::DataChanged);
        assert_eq!(table.len(), 1);
        table.fire(&event(EventKind::Deleted, "/x"));
        assert_eq!(c.await.unwrap().kind, EventKind::Deleted);
        assert_eq!(table.len(), 0);
    }

    #[tokio::test]
    async fn dropping_a_watcher_asks_to_unregister_it() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (w, _req) = Watcher::new("/y".into(), 9, tx);
        drop(w);
        assert_eq!(rx.recv().await, Some(("/y".to_string(), 9)));
    }
}
