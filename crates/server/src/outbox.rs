//! The queue of frames waiting to be sent to one connection.
//!
//! Anyone may push (the connection's own task for replies, whoever applies a
//! change for the watch events it fires); only the connection's task drains.
//! Pushing never blocks and never waits for the network: a connection whose
//! queue outgrows its limit is marked overflowed and its task closes it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use baton_proto::response::{encode_disconnect, encode_event, encode_reply};
use baton_proto::{ErrorCode, ErrorReply, EventKind, Reply};
use bytes::BytesMut;
use tokio::sync::Notify;

/// One frame waiting to be encoded and sent.
#[derive(Debug)]
pub(crate) enum Out {
    Reply {
        xid: u32,
        op: u8,
        revision: u64,
        result: Result<Reply, ErrorReply>,
    },
    Event {
        kind: EventKind,
        revision: u64,
        path: Arc<str>,
    },
}

impl Out {
    /// Bytes this frame takes on the wire, closely enough for accounting.
    fn wire_size(&self) -> usize {
        const FIXED: usize = 16 + baton_proto::Stat::LEN;
        match self {
            Out::Reply { result, .. } => {
                FIXED
                    + match result {
                        Ok(Reply::Create { path, .. }) => path.len(),
                        Ok(Reply::GetData { data, .. }) => data.len(),
                        Ok(Reply::GetChildren { children, .. }) => {
                            children.iter().map(|c| c.len() + 2).sum()
                        }
                        Ok(_) => 0,
                        Err(e) => e.message.len(),
                    }
            }
            Out::Event { path, .. } => FIXED + path.len(),
        }
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        match self {
            Out::Reply {
                xid,
                op,
                revision,
                result,
            } => encode_reply(buf, *xid, *op, *revision, result),
            Out::Event {
                kind,
                revision,
                path,
            } => encode_event(buf, *kind, *revision, path),
        }
    }
}

/// Why a connection is being closed, sent as its last frame if `notice` is set.
#[derive(Debug, Clone)]
pub(crate) struct Closing {
    pub notice: Option<(ErrorCode, String)>,
}

#[derive(Debug, Default)]
pub(crate) struct OutState {
    queue: VecDeque<Out>,
    bytes: usize,
    closing: Option<Closing>,
    overflowed: bool,
}

/// A connection's outbound queue and the signal that wakes its task.
#[derive(Debug)]
pub(crate) struct Outbox {
    state: Mutex<OutState>,
    notify: Notify,
    limit: usize,
}

impl Outbox {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Outbox {
            state: Mutex::new(OutState::default()),
            notify: Notify::new(),
            limit,
        })
    }

    fn lock(&self) -> MutexGuard<'_, OutState> {
        // A panic while holding this lock cannot leave the queue half-updated
        // in a way that matters to a connection that is closing anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a frame and wakes the connection's task. Returns false if the
    /// connection is closing or has just overflowed (the frame is dropped).
    pub(crate) fn push(&self, out: Out) -> bool {
        let mut st = self.lock();
        if st.closing.is_some() || st.overflowed {
            return false;
        }
        st.bytes += out.wire_size();
        if st.bytes > self.limit {
            st.overflowed = true;
            st.queue.clear();
            drop(st);
            self.notify.notify_one();
            return false;
        }
        let was_empty = st.queue.is_empty();
        st.queue.push_back(out);
        drop(st);
        if was_empty {
            self.notify.notify_one();
        }
        true
    }

    /// Asks the connection's task to send what is queued, then `notice` if
    /// any, then close. The first request to close wins.
    pub(crate) fn close(&self, notice: Option<(ErrorCode, String)>) {
        let mut st = self.lock();
        if st.closing.is_none() {
            st.closing = Some(Closing { notice });
        }
        drop(st);
        self.notify.notify_one();
    }

    /// Waits until something was pushed or a close was asked for.
    ///
    /// # Cancellation safety
    /// Safe: a wake-up that arrives while nobody waits is kept for the next call.
    pub(crate) async fn wait(&self) {
        self.notify.notified().await
    }

    /// Encodes queued frames into `buf` until it holds about `budget` bytes.
    /// Returns what the task must do once `buf` is written out.
    pub(crate) fn drain_into(&self, buf: &mut BytesMut, budget: usize) -> Drained {
        let mut st = self.lock();
        if st.overflowed {
            return Drained::Overflowed;
        }
        while buf.len() < budget {
            let Some(out) = st.queue.pop_front() else {
                break;
            };
            st.bytes -= out.wire_size().min(st.bytes);
            out.encode(buf);
        }
        if !st.queue.is_empty() {
            return Drained::More;
        }
        match &st.closing {
            Some(Closing { notice }) => {
                if let Some((code, message)) = notice {
                    encode_disconnect(buf, *code, message);
                }
                Drained::Close
            }
            None => Drained::Idle,
        }
    }

    /// Bytes queued but not yet drained.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.lock().bytes
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }
}

/// What [`Outbox::drain_into`] left behind.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Drained {
    /// The queue is empty.
    Idle,
    /// Frames remain beyond the budget.
    More,
    /// The queue is empty and the connection must now be closed.
    Close,
    /// The client fell too far behind: close without sending more.
    Overflowed,
}
