//! A member's side of a simulated client connection, for the cluster's
//! simulation: messages in, messages out, on channels instead of a socket.
//!
//! It follows the rules the connection task keeps on a cluster member
//! (`conn.rs`): a handshake is answered only after a read barrier proved,
//! after it arrived, that the member still leads, and a new session's grant
//! only once it is committed; a change is proposed as it arrives; any other
//! request waits for the changes its session proposed before it and for a
//! read barrier begun after it arrived; a barrier that finds the member no
//! longer leads closes the connection with the not-leader notice.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;

use baton_proto::{RequestFrame, SessionId};
use bytes::BytesMut;
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::{frames_of, Down, Up};
use crate::clock::Now;
use crate::core::Connecting;
use crate::outbox::{Drained, Outbox, Status};
use crate::replicate::Barrier;
use crate::shared::{Applier, Shared};

/// Serves one simulated connection to the server behind `applier`: reads
/// what the client sends from `ups` (the connection ends when it closes)
/// and hands what goes back to `down`, in order. Returns once the
/// connection is over, the session detached.
///
/// `barriers: false` is a defect, for showing that the simulation finds
/// it: reads are then served from the member's state without proving that
/// it still leads.
pub async fn serve(
    applier: &Applier,
    mut ups: mpsc::UnboundedReceiver<Up>,
    down: impl Fn(Down),
    barriers: bool,
) {
    let shared = applier.shared().clone();
    let outbox = Outbox::new();
    let Some(Up::Connect(request)) = ups.recv().await else {
        return;
    };
    let limit = shared.config.handshake_timeout;
    // Proven to lead after the handshake arrived, or refused.
    let barrier = shared.core().read_barrier(request.resume.map(|(id, _)| id));
    if !matches!(timeout(limit, barrier).await, Ok(Ok(()))) {
        let notice = shared.core().not_leader_notice();
        down(Down::Connected(Err(notice)));
        down(Down::Closed);
        return;
    }
    let connecting = shared.core().connect(&request, &outbox, Now::real());
    let connected = match connecting {
        Ok(Connecting::Done(connected)) => Ok(connected),
        Ok(Connecting::Pending(waiting)) => match timeout(limit, waiting).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(shared.core().not_leader_notice()),
            Err(_) => Err((
                baton_proto::ErrorCode::ShuttingDown,
                "the session was not opened in time".into(),
            )),
        },
        Err(refused) => Err(refused),
    };
    let grant = match connected {
        Ok(connected) => {
            if !durable(&shared, connected.revision, &outbox).await {
                shared.core().detach(connected.grant.session_id, &outbox);
                down(Down::Closed);
                return;
            }
            connected.grant
        }
        Err(refused) => {
            shared.core().detach(SessionId(0), &outbox);
            down(Down::Connected(Err(refused)));
            down(Down::Closed);
            return;
        }
    };
    let session = grant.session_id;
    down(Down::Connected(Ok(grant)));
    let mut conn = Conn {
        shared,
        outbox,
        session,
        waiting: VecDeque::new(),
        received: 0,
        covered: 0,
        barrier: None,
        not_leading: false,
        barriers,
    };
    conn.run(&mut ups, &down).await;
    conn.shared.core().detach(session, &conn.outbox);
}

struct Conn {
    shared: Arc<Shared>,
    outbox: Arc<Outbox>,
    session: SessionId,
    /// Requests received and not yet handled, each with its place.
    waiting: VecDeque<(u64, RequestFrame)>,
    /// Requests received.
    received: u64,
    /// Requests up to this place are covered by a completed barrier.
    covered: u64,
    /// A barrier under way, and the place it covers up to.
    barrier: Option<(Barrier, u64)>,
    not_leading: bool,
    /// Whether reads wait for a barrier (false: the defect).
    barriers: bool,
}

enum Woke {
    Up(Option<Up>),
    Barrier(bool),
    Outbox,
}

impl Conn {
    async fn run(&mut self, ups: &mut mpsc::UnboundedReceiver<Up>, down: &impl Fn(Down)) {
        let mut reading = true;
        loop {
            if reading {
                self.handle_waiting();
            }
            // Send what is durable.
            let mut buf = BytesMut::new();
            let drained = self
                .outbox
                .drain_into(&mut buf, usize::MAX, self.shared.mark.get());
            let frames = frames_of(&mut buf);
            if !frames.is_empty() {
                down(Down::Frames(frames));
            }
            match (drained, self.outbox.status()) {
                (Drained::Close, _) | (_, Status::Overflowed) => {
                    down(Down::Closed);
                    return;
                }
                (Drained::Waiting(revision), _)
                    if !self.shared.mark.wake_at(revision, &self.outbox) =>
                {
                    continue; // durable meanwhile
                }
                (_, Status::Closing) => reading = false,
                _ => {}
            }
            let (outbox, barrier) = (&self.outbox, &mut self.barrier);
            let woke = poll_fn(|cx| {
                if reading {
                    if let std::task::Poll::Ready(up) = ups.poll_recv(cx) {
                        return std::task::Poll::Ready(Woke::Up(up));
                    }
                }
                if let Some((b, _)) = barrier {
                    if let std::task::Poll::Ready(r) = b.as_mut().poll(cx) {
                        return std::task::Poll::Ready(Woke::Barrier(r.is_ok()));
                    }
                }
                outbox.poll_woken(cx).map(|()| Woke::Outbox)
            })
            .await;
            match woke {
                Woke::Up(Some(Up::Request(frame))) => {
                    self.received += 1;
                    self.waiting.push_back((self.received, frame));
                }
                Woke::Up(Some(Up::Connect(_))) => {} // one handshake per connection
                Woke::Up(None) => return,            // the client's side is gone
                Woke::Barrier(proven) => {
                    let (_, covers) = self.barrier.take().expect("polled above");
                    if proven {
                        self.covered = self.covered.max(covers);
                    } else {
                        self.not_leading = true;
                        let notice = self.shared.core().not_leader_notice();
                        self.outbox.close(Some(notice), 0);
                        reading = false;
                    }
                }
                Woke::Outbox => {}
            }
        }
    }

    /// Handles the waiting requests the gate lets through, in order.
    fn handle_waiting(&mut self) {
        while let Some((place, frame)) = self.waiting.front() {
            let change = frame.request.op().is_change();
            if change && self.outbox.changes_in_flight() >= crate::outbox::MAX_CHANGES_IN_FLIGHT {
                return; // woken as one is applied
            }
            if !change {
                if self.outbox.changes_in_flight() > 0 {
                    return; // woken once they are applied
                }
                if *place > self.covered && self.barriers {
                    if self.barrier.is_none() && !self.not_leading {
                        let barrier = self.shared.core().read_barrier(Some(self.session));
                        self.barrier = Some((barrier, self.received));
                    }
                    return;
                }
            }
            let (_, frame) = self.waiting.pop_front().expect("looked at above");
            let flow =
                self.shared
                    .core()
                    .handle(self.session, frame, &self.outbox, None, Now::real());
            if flow == crate::core::Flow::Stop {
                return;
            }
        }
    }
}

/// Waits until `revision` is durable; false if it never will be.
async fn durable(shared: &Shared, revision: u64, outbox: &Arc<Outbox>) -> bool {
    let mark = &shared.mark;
    while mark.wake_at(revision, outbox) {
        if outbox.status() != Status::Open {
            return false;
        }
        poll_fn(|cx| outbox.poll_woken(cx)).await;
    }
    mark.get() >= revision
}
