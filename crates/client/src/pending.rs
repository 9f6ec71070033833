//! A request on its way: written and not yet answered, the slot its answer
//! goes to, and the watch its reply may confirm. The sending side
//! ([`Link`](crate::link::Link)) records them; the session task answers them.

use std::collections::VecDeque;

use baton_proto::{Reply, Request};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::queue::QueueRequest;
use crate::watcher::{WatchKind, WatchRequest};

/// A successful reply.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) reply: Reply,
    /// The revision of the state the reply was made from.
    pub(crate) revision: u64,
}

pub(crate) type ReplySlot = oneshot::Sender<Result<Answer>>;

/// A request written and not yet answered.
pub(crate) struct Pending {
    pub(crate) xid: u32,
    /// When the request was queued: the server heard it no earlier.
    pub(crate) sent: Instant,
    /// The request, kept to be sent again (with the same xid) if the
    /// connection breaks before it is answered; `None` for the session's
    /// own pings and watch resets, which are not sent again.
    pub(crate) request: Option<Request>,
    /// How many connections the request was sent on.
    pub(crate) sends: u8,
    pub(crate) reply: Option<ReplySlot>,
    pub(crate) watch: Option<Registration>,
}

/// A watch that a request sets, registered locally once the reply confirms
/// it; each carries the request's path.
pub(crate) enum Registration {
    Watch(String, WatchRequest),
    Queue(String, QueueRequest),
}

/// A watch a reply confirms, and where it goes: its path and kind, or its
/// queue node and whether the node heads its queue.
pub(crate) enum Confirmed {
    Watch(String, WatchKind, WatchRequest),
    Queue(String, bool, QueueRequest),
}

impl Registration {
    /// The watch `reply` confirms, if the server set one.
    pub(crate) fn confirmed(self, reply: &Reply) -> Option<Confirmed> {
        match self {
            Registration::Watch(path, w) => {
                let (path, kind) = match reply {
                    Reply::Exists(None) => (path, WatchKind::Exist),
                    Reply::GetChildren { .. } => (path, WatchKind::Child),
                    // The watch is on the predecessor, if there is one.
                    Reply::Predecessor(Some((pred, _))) => (pred.clone(), WatchKind::Data),
                    Reply::Predecessor(None) => return None,
                    _ => (path, WatchKind::Data),
                };
                Some(Confirmed::Watch(path, kind, w))
            }
            Registration::Queue(path, q) => {
                let heads = reply.heads_queue()?;
                let node = match reply {
                    Reply::Enqueue { path, .. } => path.clone(),
                    _ => path,
                };
                Some(Confirmed::Queue(node, heads, q))
            }
        }
    }
}

/// Answers every request in `pending` with `error`.
pub(crate) fn fail_pending(pending: VecDeque<Pending>, error: &Error) {
    for p in pending {
        if let Some(slot) = p.reply {
            let _ = slot.send(Err(error.clone()));
        }
    }
}
