//! What holds back the reads of a cluster member's connection, for every
//! front end: a read waits for the changes its session proposed before it
//! to be applied, and for a read barrier begun after it arrived (so that it
//! sees every change committed before it, and this server has proven it
//! still leads, or, on a follower, the leader has). A session in the
//! sequential read mode sends only its pings and syncs through a barrier;
//! its other reads see the member's applied state as it is.
//!
//! Requests are counted in bytes of the connection's stream from its first
//! byte, the handshake included: where a request starts is what was
//! received less what is still buffered, so that the count of what a
//! barrier covers and the place of a request are one and the same.

use std::task::{Context, Poll};

use baton_proto::SessionId;
use sync_wrapper::SyncWrapper;

use crate::outbox::{Outbox, MAX_CHANGES_IN_FLIGHT};
use crate::replicate::Barrier;
use crate::shared::Shared;

/// A cluster member's read gate (see the module's documentation).
#[derive(Default)]
pub(crate) struct ReadGate {
    /// Bytes read from the socket (their plaintext, with TLS).
    pub(crate) received: u64,
    /// Requests that end at or before this byte are covered by a barrier.
    covered: u64,
    /// A barrier under way, and the byte it covers up to once complete.
    /// (Wrapped: the connection's state is shared by reference across its
    /// awaits, and a barrier need not be `Sync`; it is only ever polled.)
    barrier: Option<(SyncWrapper<Barrier>, u64)>,
    /// The last barrier found that this server does not lead.
    not_leading: bool,
    /// The connection's session, once it has one: a follower's barrier
    /// tells the leader it was heard from.
    pub(crate) session: Option<SessionId>,
    /// Whether the session reads in the sequential mode
    /// ([`ReadMode::Sequential`](baton_proto::ReadMode)).
    pub(crate) sequential: bool,
}

/// What a request asks of the read gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gated {
    /// A change: proposed in request order, it passes at once, unless its
    /// connection has [`MAX_CHANGES_IN_FLIGHT`] changes on their way.
    Change,
    /// A read: after a barrier, unless the session reads sequentially.
    Read,
    /// A ping or a sync: after a barrier, in every read mode (its answer
    /// tells the client the leader heard from its session).
    Confirm,
}

/// Where a connection counts the bytes it receives: in its read gate, or,
/// with no gate (a single server), in `spare`, which nothing reads.
pub(crate) fn received<'a>(gate: &'a mut Option<Box<ReadGate>>, spare: &'a mut u64) -> &'a mut u64 {
    match gate {
        Some(gate) => &mut gate.received,
        None => spare,
    }
}

impl ReadGate {
    /// Whether the request that ends at byte `end` of the stream may be
    /// handled now. A change may (it is proposed in request order), unless
    /// too many of its connection's are on their way; any
    /// other request waits for the changes its session proposed before it,
    /// and then, unless it is a read of a sequential session, for a read
    /// barrier that covers it, which this starts if none is under way.
    pub(crate) fn admits(
        &mut self,
        end: u64,
        gated: Gated,
        outbox: &Outbox,
        shared: &Shared,
    ) -> bool {
        if gated == Gated::Change {
            // Woken as one is applied.
            return outbox.changes_in_flight() < MAX_CHANGES_IN_FLIGHT;
        }
        if outbox.changes_in_flight() > 0 {
            return false; // woken once they are applied
        }
        if end <= self.covered || (gated == Gated::Read && self.sequential) {
            return true;
        }
        if self.barrier.is_none() && !self.not_leading {
            let barrier = shared.core().read_barrier(self.session);
            self.barrier = Some((SyncWrapper::new(barrier), self.received));
        }
        false
    }

    /// Whether the last barrier found that this server does not lead.
    pub(crate) fn not_leading(&self) -> bool {
        self.not_leading
    }

    /// Polls the barrier under way, if any: ready once it completed (the
    /// requests it covers may go) or found this server not leading.
    pub(crate) fn poll_barrier(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some((barrier, covers)) = &mut self.barrier else {
            return Poll::Pending;
        };
        let covers = *covers;
        match barrier.get_mut().as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                self.barrier = None;
                match result {
                    Ok(()) => self.covered = self.covered.max(covers),
                    Err(_) => self.not_leading = true,
                }
                Poll::Ready(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// A connection with [`MAX_CHANGES_IN_FLIGHT`] changes on their way
    /// proposes no more until one is applied, and is woken then: what a
    /// member holds for proposals is bounded by its connections.
    #[test]
    fn a_connection_with_too_many_changes_on_their_way_waits_for_one() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let server = crate::Server::new(l, crate::Config::default()).unwrap();
            let shared = server.shared_for_test();
            let outbox = Outbox::new();
            let mut gate = ReadGate::default();
            let mut cx = Context::from_waker(Waker::noop());
            for _ in 0..MAX_CHANGES_IN_FLIGHT {
                assert!(gate.admits(0, Gated::Change, &outbox, &shared));
                outbox.change_proposed();
            }
            assert!(!gate.admits(0, Gated::Change, &outbox, &shared));
            assert!(!gate.admits(0, Gated::Read, &outbox, &shared));
            assert_eq!(outbox.poll_woken(&mut cx), Poll::Pending);
            outbox.change_applied();
            assert_eq!(
                outbox.poll_woken(&mut cx),
                Poll::Ready(()),
                "woken below the limit"
            );
            assert!(gate.admits(0, Gated::Change, &outbox, &shared));
            for _ in 1..MAX_CHANGES_IN_FLIGHT {
                assert_eq!(outbox.poll_woken(&mut cx), Poll::Pending);
                outbox.change_applied();
            }
            assert_eq!(
                outbox.poll_woken(&mut cx),
                Poll::Ready(()),
                "woken when none is left"
            );
            assert_eq!(outbox.changes_in_flight(), 0);
        });
    }
}
