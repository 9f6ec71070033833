//! Queue watches on the client side: a node's place in a queue of siblings.
//!
//! [`Client::enqueue`](crate::Client::enqueue) and
//! [`Client::queue_watch`](crate::Client::queue_watch) return a
//! [`QueueWatch`]. It tells, once each: when the node heads its queue (no
//! predecessor left), and when the node was deleted by anyone but this
//! session. While the node waits, the server moves the watch from one
//! predecessor to the next by itself; this client hears nothing until its
//! node heads the queue.

use std::collections::HashMap;

use baton_proto::{EventKind, WatchEvent};
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::Error;

type HeadSlot = oneshot::Sender<Result<(), Error>>;
/// Set once: the node's deletion by another session, or the session's end.
type Gone = Option<Result<WatchEvent, Error>>;
type GoneSlot = watch::Sender<Gone>;

/// A queue watch waiting for its request's reply, carried with it.
pub(crate) struct QueueRequest {
    id: u64,
    head: HeadSlot,
    gone: GoneSlot,
}

struct Slot {
    id: u64,
    headed: bool,
    head: Option<HeadSlot>,
    gone: GoneSlot,
}

/// Live queue watches by node, as the session task keeps them.
#[derive(Default)]
pub(crate) struct QueueTable {
    by_node: HashMap<String, Slot>,
}

impl QueueTable {
    /// Registers a queue watch the server confirmed; `heads` if the reply
    /// said the node has no predecessor.
    pub(crate) fn add(&mut self, node: &str, heads: bool, req: QueueRequest) {
        let mut slot = Slot {
            id: req.id,
            headed: false,
            head: Some(req.head),
            gone: req.gone,
        };
        if heads {
            slot.headed = true;
            if let Some(h) = slot.head.take() {
                let _ = h.send(Ok(()));
            }
        }
        self.by_node.insert(node.to_owned(), slot);
    }

    pub(crate) fn remove(&mut self, node: &str, id: u64) {
        if self.by_node.get(node).is_some_and(|s| s.id == id) {
            self.by_node.remove(node);
        }
    }

    /// Removes the queue watch on `node`, whoever set it: for a node whose
    /// caller is gone.
    pub(crate) fn forget(&mut self, node: &str) {
        self.by_node.remove(node);
    }

    /// Handles an event; events about other nodes are ignored.
    pub(crate) fn fire(&mut self, event: &WatchEvent) {
        match event.kind {
            EventKind::Head => {
                if let Some(slot) = self.by_node.get_mut(&event.path) {
                    slot.headed = true;
                    if let Some(h) = slot.head.take() {
                        let _ = h.send(Ok(()));
                    }
                }
            }
            EventKind::Deleted => {
                if let Some(slot) = self.by_node.remove(&event.path) {
                    if let Some(h) = slot.head {
                        let _ = h.send(Err(Error::NoNode(format!(
                            "{} was deleted before it headed its queue",
                            event.path
                        ))));
                    }
                    slot.gone.send_replace(Some(Ok(event.clone())));
                }
            }
            _ => {}
        }
    }

    /// Ends every queue watch with `error` (the session ended).
    pub(crate) fn fail_all(&mut self, error: &Error) {
        for (_, slot) in self.by_node.drain() {
            if let Some(h) = slot.head {
                let _ = h.send(Err(error.clone()));
            }
            slot.gone.send_replace(Some(Err(error.clone())));
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_node.len()
    }

    /// The queue watches to set again after a reconnect: node, and whether
    /// it already headed its queue.
    pub(crate) fn entries(&mut self) -> Vec<(String, bool)> {
        self.by_node.retain(|_, slot| !slot.gone.is_closed());
        self.by_node
            .iter()
            .map(|(node, slot)| (node.clone(), slot.headed))
            .collect()
    }
}

/// A node's place in a queue of siblings (see the module docs).
///
/// Dropping it stops this client from listening; the server's watch goes
/// when the node does.
#[must_use = "a queue watch does nothing unless awaited"]
pub struct QueueWatch {
    node: String,
    id: u64,
    head: Option<oneshot::Receiver<Result<(), Error>>>,
    gone: watch::Receiver<Gone>,
    unregister: mpsc::UnboundedSender<(String, u64)>,
}

impl QueueWatch {
    pub(crate) fn new(
        node: String,
        id: u64,
        unregister: mpsc::UnboundedSender<(String, u64)>,
    ) -> (Self, QueueRequest) {
        let (head_tx, head_rx) = oneshot::channel();
        let (gone_tx, gone_rx) = watch::channel(None);
        (
            QueueWatch {
                node,
                id,
                head: Some(head_rx),
                gone: gone_rx,
                unregister,
            },
            QueueRequest {
                id,
                head: head_tx,
                gone: gone_tx,
            },
        )
    }

    /// The node whose place this is.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Points the watch at the node the server named (an enqueue's node is
    /// known only from its reply).
    pub(crate) fn retarget(&mut self, node: &str) {
        node.clone_into(&mut self.node);
    }

    /// Waits until the node heads its queue (at once if it does already).
    ///
    /// # Errors
    /// [`Error::NoNode`] if the node was deleted first;
    /// [`Error::SessionExpired`] or [`Error::Closed`] if the session ended.
    ///
    /// # Cancellation safety
    /// Safe: calling it again waits on.
    pub async fn head(&mut self) -> Result<(), Error> {
        let Some(rx) = self.head.as_mut() else {
            return Ok(());
        };
        let result = rx.await.unwrap_or(Err(Error::Closed));
        self.head = None;
        result
    }

    /// Waits until the node is deleted by anyone but this session (its own
    /// delete reports nothing), or the session ends.
    ///
    /// # Errors
    /// [`Error::SessionExpired`] or [`Error::Closed`] if the session ended
    /// first.
    ///
    /// # Cancellation safety
    /// Safe, and it may be called any number of times.
    pub async fn deleted(&self) -> Result<WatchEvent, Error> {
        let mut rx = self.gone.clone();
        let result = match rx.wait_for(Option::is_some).await {
            Ok(gone) => gone.clone().expect("waited for it"),
            Err(_) => Err(Error::Closed),
        };
        result
    }

    /// What [`deleted`](Self::deleted) would return now, if it would not
    /// wait: no round trip, no waiting.
    pub fn deleted_now(&self) -> Option<Result<WatchEvent, Error>> {
        self.gone.borrow().clone()
    }
}

impl Drop for QueueWatch {
    fn drop(&mut self) {
        let _ = self
            .unregister
            .send((std::mem::take(&mut self.node), self.id));
    }
}

impl std::fmt::Debug for QueueWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueWatch")
            .field("node", &self.node)
            .finish()
    }
}
