//! Baton's own protocol, one task per client connection: the first frame
//! (a handshake, a status probe or a backup request; `first.rs`), then
//! requests in and frames out (here), or a backup (`backup.rs`).
//!
//! One task serves a connection, reading and writing the socket itself (no
//! split, no second task), through the front ends' [`Socket`]; on a cluster
//! member its reads pass the [`ReadGate`].

mod backup;
mod first;

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use baton_proto::{ErrorCode, RequestDecodeError, RequestFrame, SessionId};
use tokio::time::{sleep, timeout, Sleep};
use tracing::{debug, info, warn};

use super::gate::{received, ReadGate};
use super::socket::{FrameError, Socket, READ_BUDGET};
use crate::clock::Now;
use crate::core::Flow;
use crate::outbox::{Drained, Outbox, Status};
use crate::shared::Shared;
use crate::stats::Stats;

/// Bytes encoded into the write buffer per batch.
const WRITE_BUDGET: usize = 64 * 1024;
/// How long a closing connection may take to send its last frames.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

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

/// Whether a request's op changes the state (and is proposed).
pub(crate) fn is_change(op: u8) -> bool {
    baton_proto::OpCode::from_u8(op).is_some_and(baton_proto::OpCode::is_change)
}

/// A connection's state, boxed: the task that serves it then holds one
/// pointer to it plus the state of its one wait, which keeps an idle
/// connection's task in tokio's smallest allocation.
///
/// It holds one of the server's connection slots and gives it back on drop.
pub(crate) struct Conn {
    socket: Socket,
    shared: Arc<Shared>,
    /// Present on a cluster member: holds back reads (see [`ReadGate`]).
    gate: Option<Box<ReadGate>>,
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

/// Serves one accepted connection until it closes.
pub(crate) async fn serve(mut conn: Box<Conn>) {
    if let Err(e) = conn.socket.stream.set_nodelay(true) {
        debug!("cannot set TCP_NODELAY: {e}");
    }
    let outbox = Outbox::new();
    // Boxed: the handshake's timers and buffers are freed once it is done,
    // instead of sizing every connection's task for them.
    let Some(session) = Box::pin(conn.handshake(&outbox)).await else {
        return;
    };
    let result = conn.run(session, &outbox).await;
    conn.shared.core().detach(session, &outbox);
    match result {
        Ok(()) => debug!(peer = %conn.socket.peer(), %session, "connection closed"),
        Err(e) => debug!(peer = %conn.socket.peer(), %session, "connection ended: {e}"),
    }
}

impl Conn {
    fn max_frame(&self) -> usize {
        self.shared.config.max_request_frame()
    }

    /// The request loop: handle what was read, send what is queued, wait.
    /// Server shutdown reaches it through the outbox, like any close.
    async fn run(&mut self, session: SessionId, outbox: &Arc<Outbox>) -> io::Result<()> {
        let mut stopping = false; // no more requests will be read
                                  // Armed while output waits on a socket that takes nothing.
        let mut stall: Option<Pin<Box<Sleep>>> = None;
        // Frames are held until the durable mark passes them (for the stats).
        let mut held = false;
        loop {
            if !stopping {
                stopping = self.handle_buffered(session, outbox);
                // Under `--fsync never`, the changes just applied are written
                // now, in one write, outside the core's lock.
                self.shared.mark.hurry();
            }
            match outbox.status() {
                Status::Open => {}
                Status::Closing => return Box::pin(self.finish(session, outbox)).await,
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
                    match outbox.drain_into(self.socket.wbuf.get(), WRITE_BUDGET, mark.get()) {
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
    async fn finish(&mut self, session: SessionId, outbox: &Arc<Outbox>) -> io::Result<()> {
        let flush = async {
            loop {
                let mark = self.shared.mark.clone();
                let drained = outbox.drain_into(self.socket.wbuf.get(), WRITE_BUDGET, mark.get());
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
    async fn wait_durable(&self, revision: u64, outbox: &Arc<Outbox>) -> bool {
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
    fn backlogged(&self, outbox: &Outbox) -> bool {
        self.socket.wbuf.len() + outbox.queued_bytes() > self.shared.config.max_outbound_bytes / 2
    }

    /// Handles every complete request frame in the read buffer, unless the
    /// client falls behind. Returns true when no more requests must be read.
    fn handle_buffered(&mut self, session: SessionId, outbox: &Arc<Outbox>) -> bool {
        while !self.backlogged(outbox) {
            if !self.gate_open(outbox) {
                return false;
            }
            let frame = match self.socket.next_frame(self.max_frame()) {
                Ok(Some(frame)) => frame,
                Ok(None) => return false,
                Err(FrameError::TooLarge(len)) => {
                    let message = format!(
                        "frame of {len} bytes exceeds the server's limit of {} bytes",
                        self.max_frame()
                    );
                    warn!(peer = %self.socket.peer(), %session, "closing: {message}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::FrameTooLarge, message)), 0);
                    return true;
                }
                Err(FrameError::Io(e)) => {
                    warn!(peer = %self.socket.peer(), %session, "closing: unreadable frame: {e}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::MalformedRequest, e.to_string())), 0);
                    return true;
                }
                Err(FrameError::Plaintext) => unreachable!("only the first frame is checked"),
            };
            Stats::add(&self.shared.stats.bytes_in, frame.len() as u64 + 4);
            let started = std::time::Instant::now();
            let flow = match RequestFrame::decode(frame) {
                Ok(request) => {
                    let flow = self.shared.core().handle(
                        session,
                        request,
                        outbox,
                        self.socket.identity(),
                        Now::real(),
                    );
                    let took = started.elapsed();
                    let stats = &self.shared.stats;
                    Stats::add(&stats.handle_ns, took.as_nanos() as u64);
                    stats.metrics.handle.observe_duration(took);
                    flow
                }
                Err(RequestDecodeError::NoHeader) => {
                    let message = "request frame shorter than its 5-byte header".to_string();
                    warn!(peer = %self.socket.peer(), %session, "closing: {message}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::MalformedRequest, message)), 0);
                    Flow::Stop
                }
                Err(RequestDecodeError::Reject {
                    xid,
                    op,
                    code,
                    message,
                }) => {
                    info!(peer = %self.socket.peer(), %session, xid, op, "rejected request: {code}: {message}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    self.shared
                        .core()
                        .reject(session, xid, op, code, message, outbox, Now::real())
                }
            };
            if flow == Flow::Stop {
                return true;
            }
        }
        false
    }

    /// Whether the next buffered request may be handled now: always on a
    /// single server; on a cluster member, as its [`ReadGate`] admits it.
    fn gate_open(&mut self, outbox: &Outbox) -> bool {
        let Some(gate) = &mut self.gate else {
            return true;
        };
        let buffered = self.socket.rbuf.bytes();
        if buffered.len() < 9 {
            return true; // no whole header yet: next_frame says what to do
        }
        let len = u32::from_be_bytes(buffered[..4].try_into().expect("4 bytes")) as u64;
        let start = gate.received - buffered.len() as u64;
        gate.admits(
            start + 4 + len,
            is_change(buffered[8]),
            outbox,
            &self.shared,
        )
    }

    /// Reads what the socket has (see [`Socket::read_some`]), counting it
    /// for the read gate.
    fn read_some(&mut self) -> io::Result<usize> {
        let mut spare = 0;
        let received = received(&mut self.gate, &mut spare);
        self.socket.read_some(received)
    }
}

#[cfg(test)]
mod size_tests {
    /// An idle connection costs its task (tokio rounds a task up to a
    /// multiple of 128 bytes; a future of at most 152 bytes keeps it at 256),
    /// its boxed state and its outbox; each session and node is kept in a
    /// table. These bounds are what docs/benchmarks.md's memory per session
    /// rests on: a field added carelessly shows up here first.
    #[test]
    fn idle_connection_and_state_stay_small() {
        fn size_of_fut<F: std::future::Future>(_: &F) -> usize {
            std::mem::size_of::<F>()
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let server = crate::Server::new(l, crate::Config::default()).unwrap();
            let conn = super::Conn::new(server.shared_for_test(), s);
            let fut = super::serve(conn);
            assert!(
                size_of_fut(&fut) <= 152,
                "connection future: {} bytes",
                size_of_fut(&fut)
            );
            let sizes = [
                ("connection state", std::mem::size_of::<super::Conn>(), 80),
                ("outbox", std::mem::size_of::<crate::outbox::Outbox>(), 80),
                ("node", std::mem::size_of::<crate::state::Node>(), 88),
                ("session", std::mem::size_of::<crate::state::Session>(), 56),
            ];
            for (what, size, most) in sizes {
                assert!(size <= most, "{what}: {size} bytes, more than {most}");
            }
        });
    }
}
