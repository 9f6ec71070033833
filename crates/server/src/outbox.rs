//! The queue of frames waiting to be sent to one connection.
//!
//! Anyone may push (the connection's own task for replies, whoever applies a
//! change for the watch events it fires); only the connection's task drains.
//! Pushing never blocks and never waits for the network: a connection whose
//! queue outgrows its limit is marked overflowed and its task closes it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use baton_proto::response::{encode_disconnect, encode_event, encode_reply};
use baton_proto::{ErrorCode, ErrorReply, EventKind, Reply};
use bytes::BytesMut;

/// Changes one connection may have proposed and not yet seen applied (on a
/// cluster member, where a change is answered once the log has committed
/// and applied it). A client that sends more waits, its requests left in
/// the socket, so that what a member holds for proposals on their way (its
/// own, or a follower's sent on to the leader) is bounded by its
/// connections, as its queued replies are.
pub(crate) const MAX_CHANGES_IN_FLIGHT: u32 = 1024;

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
    /// The revision this frame reflects: it may leave once that is durable.
    pub(crate) fn revision(&self) -> u64 {
        match self {
            Out::Reply { revision, .. } | Out::Event { revision, .. } => *revision,
        }
    }

    /// Bytes this frame takes on the wire, closely enough for accounting.
    pub(crate) fn wire_size(&self) -> usize {
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
                        Ok(Reply::Predecessor(Some((path, _))))
                        | Ok(Reply::CheckToken(Some((path, _)))) => path.len(),
                        Ok(Reply::Enqueue {
                            path, predecessor, ..
                        }) => {
                            // FIXED covers one stat; a predecessor brings another.
                            path.len()
                                + predecessor
                                    .as_ref()
                                    .map_or(0, |(p, _)| baton_proto::Stat::LEN + p.len())
                        }
                        Ok(Reply::Stats(counters)) => {
                            counters.iter().map(|(name, _)| name.len() + 10).sum()
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

/// How a front end writes the frames of its protocol.
pub(crate) trait Encode {
    /// Writes one queued frame.
    fn frame(&mut self, out: &Out, buf: &mut BytesMut);
    /// Writes the notice a connection is closed with (a protocol with no
    /// such frame writes nothing: closing says it all).
    fn notice(&mut self, code: ErrorCode, message: &str, buf: &mut BytesMut);
}

/// Baton's own frames.
pub(crate) struct NativeFrames;

impl Encode for NativeFrames {
    fn frame(&mut self, out: &Out, buf: &mut BytesMut) {
        out.encode(buf);
    }

    fn notice(&mut self, code: ErrorCode, message: &str, buf: &mut BytesMut) {
        encode_disconnect(buf, code, message);
    }
}

#[derive(Debug, Default)]
struct OutState {
    /// Frames queued and a requested close: none while the connection is
    /// idle, which then keeps no memory here beyond this state.
    busy: Option<Box<Busy>>,
    /// The waker of the connection's task while it waits.
    waker: Option<Waker>,
    /// Wire bytes queued, for the limit.
    bytes: usize,
    woken: bool,
    overflowed: bool,
    /// Registered with the durable mark, to be woken when it moves.
    awaiting_durability: bool,
    /// Changes this connection's session proposed that are not applied
    /// yet (in a cluster): a read waits for them.
    in_flight: u32,
}

/// What a connection has to send: its queued frames, and the close asked
/// for, if one was.
#[derive(Debug, Default)]
struct Busy {
    queue: VecDeque<Out>,
    /// Set once a close was asked for.
    closing: Option<Closing>,
}

impl OutState {
    fn closing(&self) -> bool {
        self.busy.as_ref().is_some_and(|b| b.closing.is_some())
    }

    fn busy(&mut self) -> &mut Busy {
        self.busy.get_or_insert_with(Box::default)
    }
}

/// A requested close: the last frame's code and message, if it is to have
/// one, and the revision that frame reflects.
#[derive(Debug)]
struct Closing {
    notice: Option<(ErrorCode, String)>,
    revision: u64,
}

/// A connection's outbound queue and the waker of the task that drains it.
///
/// Kept small on purpose (one per connection): the task polls it directly,
/// so waiting holds no future state, and the limit comes with each push.
/// What a busy connection has to send is boxed apart, so that an idle
/// connection's outbox is 48 bytes (64 with its reference counts).
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    state: Mutex<OutState>,
}

impl Outbox {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Outbox::default())
    }

    fn lock(&self) -> MutexGuard<'_, OutState> {
        // A panic while holding this lock cannot leave the queue half-updated
        // in a way that matters to a connection that is closing anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a frame and wakes the connection's task. If the queue would
    /// pass `limit` bytes the connection is marked overflowed instead (its
    /// task then closes it). Returns false if the frame was dropped.
    pub(crate) fn push(&self, out: Out, limit: usize) -> bool {
        let mut st = self.lock();
        if st.closing() || st.overflowed {
            return false;
        }
        let bytes = st.bytes.saturating_add(out.wire_size());
        if bytes > limit {
            st.overflowed = true;
            if let Some(busy) = &mut st.busy {
                busy.queue = VecDeque::new();
            }
            st.bytes = 0;
            wake(st);
            return false;
        }
        st.bytes = bytes;
        st.busy().queue.push_back(out);
        wake(st);
        true
    }

    /// Asks the connection's task to send what is queued, then `notice` if
    /// any (once `revision` is durable), then close. The first request to
    /// close wins.
    pub(crate) fn close(&self, notice: Option<(ErrorCode, String)>, revision: u64) {
        let mut st = self.lock();
        let busy = st.busy();
        if busy.closing.is_none() {
            busy.closing = Some(Closing { notice, revision });
        }
        wake(st);
    }

    /// Marks the outbox as registered with the durable mark; false if it
    /// already was.
    pub(crate) fn set_awaiting_durability(&self) -> bool {
        !std::mem::replace(&mut self.lock().awaiting_durability, true)
    }

    /// The durable mark moved: wake the connection's task.
    pub(crate) fn durability_reached(&self) {
        let mut st = self.lock();
        st.awaiting_durability = false;
        wake(st);
    }

    /// Ready once something was pushed or a close was asked for since the
    /// last time it was ready. A wake-up that arrives while nobody polls is
    /// kept for the next poll.
    pub(crate) fn poll_woken(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.lock();
        if std::mem::take(&mut st.woken) {
            return Poll::Ready(());
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Encodes queued frames whose revision is at most `durable` into `buf`,
    /// until it holds about `budget` bytes. Returns what the task must do
    /// once `buf` is written out.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn drain_into(&self, buf: &mut BytesMut, budget: usize, durable: u64) -> Drained {
        self.drain_with(buf, budget, durable, &mut NativeFrames)
    }

    /// [`drain_into`](Self::drain_into), with the frames written as
    /// `encode` writes them (in another front end's protocol).
    pub(crate) fn drain_with(
        &self,
        buf: &mut BytesMut,
        budget: usize,
        durable: u64,
        encode: &mut impl Encode,
    ) -> Drained {
        let mut st = self.lock();
        if st.overflowed {
            return Drained::Overflowed;
        }
        let st = &mut *st;
        let Some(busy) = st.busy.as_deref_mut() else {
            return Drained::Idle;
        };
        while buf.len() < budget {
            let Some(out) = busy.queue.front() else {
                break;
            };
            if out.revision() > durable {
                return Drained::Waiting(out.revision());
            }
            let out = busy.queue.pop_front().expect("a front exists");
            st.bytes = st.bytes.saturating_sub(out.wire_size());
            encode.frame(&out, buf);
        }
        if !busy.queue.is_empty() {
            return Drained::More;
        }
        match &mut busy.closing {
            Some(closing) if closing.revision > durable => Drained::Waiting(closing.revision),
            Some(closing) => {
                // Sent once, however often a closing queue is drained.
                if let Some((code, message)) = closing.notice.take() {
                    encode.notice(code, &message, buf);
                }
                Drained::Close
            }
            None => {
                // An idle connection keeps no queue memory.
                st.busy = None;
                Drained::Idle
            }
        }
    }

    /// Notes a change proposed for this connection, not yet applied.
    pub(crate) fn change_proposed(&self) {
        self.lock().in_flight += 1;
    }

    /// Notes that a change proposed for this connection was applied; the
    /// connection is woken once none is left, for reads that wait, and as
    /// the count falls below [`MAX_CHANGES_IN_FLIGHT`], for a change that
    /// waits.
    pub(crate) fn change_applied(&self) {
        let mut st = self.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        if st.in_flight == 0 || st.in_flight == MAX_CHANGES_IN_FLIGHT - 1 {
            wake(st);
        }
    }

    /// Changes proposed for this connection and not yet applied.
    pub(crate) fn changes_in_flight(&self) -> u32 {
        self.lock().in_flight
    }

    /// Whether the connection may go on, must close, or fell too far behind.
    pub(crate) fn status(&self) -> Status {
        let st = self.lock();
        if st.overflowed {
            Status::Overflowed
        } else if st.closing() {
            Status::Closing
        } else {
            Status::Open
        }
    }

    pub(crate) fn has_queued(&self) -> bool {
        self.lock()
            .busy
            .as_ref()
            .is_some_and(|b| !b.queue.is_empty())
    }

    /// Bytes queued but not yet drained.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.lock().bytes
    }
}

/// Marks the state woken, releases the lock, then wakes the waiting task.
fn wake(mut st: MutexGuard<'_, OutState>) {
    st.woken = true;
    let waker = st.waker.take();
    drop(st);
    if let Some(w) = waker {
        w.wake();
    }
}

/// See [`Outbox::status`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Open,
    /// A close was asked for: send what is queued, then close.
    Closing,
    /// The client fell too far behind: close without sending more.
    Overflowed,
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
    /// What is left waits for this revision to become durable.
    Waiting(u64),
    /// The client fell too far behind: close without sending more.
    Overflowed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// The byte count must not wrap past 4 GiB under a large outbound limit
    /// (a large `--max-data` allows one): a wrapped count lets the queue grow
    /// without bound.
    #[test]
    fn the_queued_byte_count_does_not_wrap_past_4_gib() {
        let outbox = Outbox::new();
        // One shared MiB, counted once per reply that refers to it.
        let data = Bytes::from(vec![0u8; 1 << 20]);
        let limit = 6usize << 30;
        let reply = |data: Bytes| Out::Reply {
            xid: 1,
            op: 4,
            revision: 0,
            result: Ok(Reply::GetData {
                stat: baton_proto::Stat::default(),
                data,
            }),
        };
        let mut pushed = 0usize;
        while outbox.push(reply(data.clone()), limit) {
            pushed += 1;
            assert!(pushed <= 6 * 1024, "the limit never stopped the queue");
        }
        assert!(
            outbox.queued_bytes() == 0 && outbox.status() == Status::Overflowed,
            "passing the limit overflows the connection"
        );
        assert!(pushed > 4 * 1024, "{pushed} MiB queued before the limit");
    }
}
