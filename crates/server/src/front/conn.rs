//! A client connection after its handshake, for every front end: one task
//! reads requests, hands them to its protocol ([`Dialect`]), and writes the
//! replies and events queued in its outbox once they are durable.
//!
//! One task serves a connection, reading and writing the socket itself (no
//! split, no second task), through the front ends' [`Socket`]; on a cluster
//! member its reads pass the [`ReadGate`].

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use baton_proto::SessionId;
use tokio::time::{sleep, timeout, Sleep};
use tracing::{debug, info, warn};

use super::gate::{received, Gated, ReadGate};
use super::socket::{Socket, READ_BUDGET};
use crate::outbox::{Drained, Encode, Outbox, Status};
use crate::shared::Shared;
use crate::stats::Stats;

/// What a protocol adds to a connection: how requests are read and handled,
/// and (through [`Encode`]) how replies and events are written.
pub(crate) trait Dialect: Encode {
    /// Handles every complete request frame in the connection's read
    /// buffer, unless the client falls behind
    /// ([`Conn::backlogged`]) or the read gate holds the next one back.
    /// Returns true when no more requests must be read.
    fn handle_buffered(
        &mut self,
        conn: &mut Conn,
        session: SessionId,
        outbox: &Arc<Outbox>,
    ) -> bool;
}

/// Bytes encoded into the write buffer per batch.
const WRITE_BUDGET: usize = 64 * 1024;
/// How long a closing connection may take to send its last frames.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// What woke a waiting connection.
#[derive(PartialEq, Eq)]
enum Event {
    Readable,
    Writable,
    Outbox,
    Stalled,
    /// A read barrier completed, or found that this server does not lead.
    Barrier,
}

/// A connection's state, boxed: the task that serves it then holds one
/// pointer to it plus the state of its one wait, which keeps an idle
/// connection's task in tokio's smallest allocation.
///
/// It holds one of the server's connection slots and gives it back on drop.
pub(crate) struct Conn {
    pub(crate) socket: Socket,
    pub(crate) shared: Arc<Shared>,
    /// Present on a cluster member: holds back reads (see [`ReadGate`]).
    pub(crate) gate: Option<Box<ReadGate>>,
}

impl Conn {
    /// Wraps an accepted stream that already took a connection slot.
    pub(crate) fn new(shared: Arc<Shared>, stream: tokio::net::TcpStream) -> Box<Self> {
        Stats::add(&shared.stats.connections_open, 1);
        let gate = shared.replicated.then(Box::default);
        Box::new(Conn {
            socket: Socket::new(stream),
            gate,
            shared,
        })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared
            .stats
            .connections_open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.shared.connection_slots.add_permits(1);
    }
}

impl Conn {
    pub(crate) fn max_frame(&self) -> usize {
        self.shared.config.max_request_frame()
    }

    /// The request loop: handle what was read, send what is queued, wait.
    /// Server shutdown reaches it through the outbox, like any close.
    pub(crate) async fn run<D: Dialect>(
        &mut self,
        mut dialect: D,
        session: SessionId,
        outbox: &Arc<Outbox>,
    ) -> io::Result<()> {
        if let Some(gate) = &mut self.gate {
            gate.session = Some(session);
        }
        let mut stopping = false; // no more requests will be read
                                  // Armed while output waits on a socket that takes nothing.
        let mut stall: Option<Pin<Box<Sleep>>> = None;
        // Frames are held until the durable mark passes them (for the stats).
        let mut held = false;
        loop {
            if !stopping {
                stopping = dialect.handle_buffered(self, session, outbox);
                // Under `--fsync never`, the changes just applied are written
                // now, in one write, outside the core's lock.
                self.shared.mark.hurry();
            }
            match outbox.status() {
                Status::Open => {}
                Status::Closing => {
                    return Box::pin(self.finish(&mut dialect, session, outbox)).await
                }
                Status::Overflowed => {
                    warn!(peer = %self.socket.peer(), %session, limit = self.shared.config.max_outbound_bytes, "closing: client is not reading its replies and events");
                    Stats::add(&self.shared.stats.slow_client_disconnects, 1);
                    return Ok(());
                }
            }

            // Move durable queued frames to the socket until none is left or
            // the socket is full.
            loop {
                if self.socket.wbuf.len() < WRITE_BUDGET && outbox.has_queued() {
                    let mark = &self.shared.mark;
                    match outbox.drain_with(
                        self.socket.wbuf.get(),
                        WRITE_BUDGET,
                        mark.get(),
                        &mut dialect,
                    ) {
                        Drained::Waiting(revision) => {
                            if !mark.wake_at(revision, outbox) {
                                if mark.stopped() {
                                    // Never durable, never sent: the server
                                    // stops, and closes this connection.
                                    break;
                                }
                                continue; // durable meanwhile
                            }
                            held = true;
                        }
                        _ if std::mem::take(&mut held) => {
                            let stats = &self.shared.stats;
                            Stats::add(&stats.durable_sends, 1);
                            Stats::add(&stats.durable_send_ns, mark.since_moved_ns());
                        }
                        _ => {}
                    }
                }
                if !self.socket.unsent() {
                    self.socket.wbuf.release();
                    break;
                }
                if self.socket.write_some(&self.shared.stats)? > 0 {
                    stall = None;
                }
                if self.socket.unsent() {
                    break;
                }
            }
            if !self.socket.unsent() {
                stall = None;
            } else if stall.is_none() {
                stall = Some(Box::pin(sleep(self.shared.config.write_stall_timeout)));
            }

            let can_read = !stopping
                && self.socket.rbuf.len() < self.max_frame() + READ_BUDGET
                && !self.backlogged(outbox);
            let want_write = self.socket.unsent();
            // One hand-written wait instead of a select over readiness
            // futures: an idle connection then holds no future state at all.
            // (The closure takes `this` whole, not each field it uses, to
            // keep that state one pointer.)
            let (this, stall) = (&mut *self, &mut stall);
            let event = poll_fn(move |cx| {
                if want_write {
                    if let Poll::Ready(r) = this.socket.stream.poll_write_ready(cx) {
                        return Poll::Ready(r.map(|()| Event::Writable));
                    }
                }
                if can_read {
                    if let Poll::Ready(r) = this.socket.stream.poll_read_ready(cx) {
                        return Poll::Ready(r.map(|()| Event::Readable));
                    }
                }
                if let Some(stall) = stall {
                    if stall.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Ok(Event::Stalled));
                    }
                }
                if let Some(gate) = &mut this.gate {
                    if gate.poll_barrier(cx).is_ready() {
                        return Poll::Ready(Ok(Event::Barrier));
                    }
                }
                outbox.poll_woken(cx).map(|()| Ok(Event::Outbox))
            })
            .await?;
            match event {
                Event::Readable => {
                    if self.read_some()? == 0 {
                        return Ok(()); // the client closed the connection
                    }
                }
                Event::Stalled => {
                    warn!(peer = %self.socket.peer(), %session, pending = self.socket.wbuf.len() + outbox.queued_bytes(),
                        "closing: client took no bytes for {} ms", self.shared.config.write_stall_timeout.as_millis());
                    Stats::add(&self.shared.stats.slow_client_disconnects, 1);
                    return Ok(());
                }
                Event::Barrier => {
                    if self.gate.as_ref().is_some_and(|g| g.not_leading()) {
                        debug!(peer = %self.socket.peer(), %session, "closing: this server does not lead any more");
                        let notice = self.shared.core().not_leader_notice();
                        outbox.close(Some(notice), 0);
                        stopping = true;
                    }
                }
                Event::Writable | Event::Outbox => {}
            }
        }
    }

    /// Sends what is queued and then the disconnect notice, if any, giving a
    /// client that does not read a little time.
    async fn finish<D: Dialect>(
        &mut self,
        dialect: &mut D,
        session: SessionId,
        outbox: &Arc<Outbox>,
    ) -> io::Result<()> {
        let flush = async {
            loop {
                let mark = self.shared.mark.clone();
                let drained =
                    outbox.drain_with(self.socket.wbuf.get(), WRITE_BUDGET, mark.get(), dialect);
                self.socket.write_all(&self.shared.stats).await?;
                match drained {
                    Drained::Close | Drained::Overflowed => return Ok(()),
                    Drained::Waiting(revision) => {
                        mark.hurry();
                        if mark.wake_at(revision, outbox) {
                            poll_fn(|cx| outbox.poll_woken(cx)).await;
                        } else if mark.stopped() {
                            // The log failed: what is left is never durable,
                            // and is not sent.
                            return Ok(());
                        }
                    }
                    Drained::Idle | Drained::More => {}
                }
            }
        };
        match timeout(CLOSE_GRACE, flush).await {
            Ok(r) => r,
            Err(_) => {
                info!(peer = %self.socket.peer(), %session, "closing without flushing: client did not read its last frames within {} s", CLOSE_GRACE.as_secs());
                Ok(())
            }
        }
    }

    /// Waits until `revision` is durable; false if the connection is closed
    /// (or the server stops) first.
    pub(crate) async fn wait_durable(&self, revision: u64, outbox: &Arc<Outbox>) -> bool {
        let mark = &self.shared.mark;
        mark.hurry();
        while mark.wake_at(revision, outbox) {
            if outbox.status() != Status::Open {
                return false;
            }
            poll_fn(|cx| outbox.poll_woken(cx)).await;
        }
        // Not registered: durable, or never (the log failed).
        mark.get() >= revision
    }

    /// True while the client has more output waiting than it should: then
    /// requests wait in the socket rather than produce more output.
    pub(crate) fn backlogged(&self, outbox: &Outbox) -> bool {
        self.socket.wbuf.len() + outbox.queued_bytes() > self.shared.config.max_outbound_bytes / 2
    }

    /// Reads what the socket has (see [`Socket::read_some`]), counting it
    /// for the read gate.
    pub(crate) fn read_some(&mut self) -> io::Result<usize> {
        let mut spare = 0;
        let received = received(&mut self.gate, &mut spare);
        self.socket.read_some(received)
    }

    /// Whether the next buffered request may be handled now: always on a
    /// single server; on a cluster member, as its [`ReadGate`] admits it.
    /// A request's header is `header` bytes after its 4-byte length, and
    /// `gated` reads from it what the request asks of the gate.
    pub(crate) fn gate_open(
        &mut self,
        outbox: &Outbox,
        header: usize,
        gated: impl FnOnce(&[u8]) -> Gated,
    ) -> bool {
        let Some(gate) = &mut self.gate else {
            return true;
        };
        let buffered = self.socket.rbuf.bytes();
        if buffered.len() < 4 + header {
            return true; // no whole header yet: next_frame says what to do
        }
        let len = u32::from_be_bytes(buffered[..4].try_into().expect("4 bytes")) as u64;
        let start = gate.received - buffered.len() as u64;
        gate.admits(
            start + 4 + len,
            gated(&buffered[4..4 + header]),
            outbox,
            &self.shared,
        )
    }
}
