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
use std::task::{ready, Context, Poll};
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
    /// What its connections are called in logs.
    const NAME: &'static str;

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

/// A connection's task: its handshake, then the request loop of its
/// session (see [`Conn::serving`]), then its last frames.
///
/// An idle connection keeps everything it needs ([`Served`]) in its task,
/// with no allocation of its own: tokio's task for a future of at most 144
/// bytes is 256 bytes (with `tokio_unstable`, as this workspace builds it),
/// and it is written by hand rather than as an `async fn` to stay under
/// that (an `async fn` would keep its arguments and locals beside the state
/// of what it awaits). The handshake and the closing, which need more, are
/// boxed, and let go once done.
pub(crate) struct Serving<D>(Phase<D>);

/// A connection's handshake: the session it attached to, served, or none.
type Handshake<D> = Pin<Box<dyn Future<Output = Option<Serving<D>>> + Send>>;

enum Phase<D> {
    Handshake(Handshake<D>),
    /// The request loop.
    Running(Served<D>),
    /// Sending what is left before closing.
    Finishing(Pin<Box<dyn Future<Output = ()> + Send>>),
    Done,
}

impl<D> Serving<D> {
    /// Serves a connection by `handshake`, then by what it returns.
    pub(crate) fn after(
        handshake: impl Future<Output = Option<Serving<D>>> + Send + 'static,
    ) -> Self {
        Serving(Phase::Handshake(Box::pin(handshake)))
    }
}

/// What a connection keeps between wake-ups once its session is attached
/// (in its task): the connection, its protocol, its session and outbox,
/// and where its request loop stands.
struct Served<D> {
    conn: Conn,
    dialect: D,
    session: SessionId,
    outbox: Arc<Outbox>,
    /// Armed while output waits on a socket that takes nothing.
    stall: Option<Pin<Box<Sleep>>>,
    /// No more requests will be read.
    stopping: bool,
    /// Frames are held until the durable mark passes them (for the stats).
    held: bool,
    /// Set while the loop waits: whether it waits to write, and to read.
    waiting: Option<(bool, bool)>,
}

/// How a request loop ended.
enum Ended {
    /// Send what is queued (and the notice), then close.
    Finish,
    Closed(io::Result<()>),
}

/// A connection's state: boxed during the handshake, then kept in its
/// session's [`Served`] (see [`Serving`]).
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

    /// The request loop, once the handshake is done: a future that serves
    /// the session until the connection closes, then detaches it.
    pub(crate) fn serving<D: Dialect>(
        self,
        dialect: D,
        session: SessionId,
        outbox: Arc<Outbox>,
    ) -> Serving<D> {
        let mut served = Served {
            conn: self,
            dialect,
            session,
            outbox,
            stall: None,
            stopping: false,
            held: false,
            waiting: None,
        };
        if let Some(gate) = &mut served.conn.gate {
            gate.session = Some(session);
        }
        Serving(Phase::Running(served))
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

impl<D: Dialect + Send + Unpin + 'static> Future for Serving<D> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match &mut self.0 {
                Phase::Handshake(handshake) => match ready!(handshake.as_mut().poll(cx)) {
                    Some(serving) => self.0 = serving.0,
                    None => {
                        self.0 = Phase::Done;
                        return Poll::Ready(());
                    }
                },
                Phase::Running(served) => {
                    let ended = ready!(served.poll_loop(cx));
                    let Phase::Running(served) = std::mem::replace(&mut self.0, Phase::Done) else {
                        unreachable!("running")
                    };
                    match ended {
                        Ended::Closed(result) => {
                            served.end(result);
                            return Poll::Ready(());
                        }
                        Ended::Finish => {
                            // Boxed with its connection: only a closing
                            // connection needs the room.
                            let mut served = Box::new(served);
                            self.0 = Phase::Finishing(Box::pin(async move {
                                let Served {
                                    conn,
                                    dialect,
                                    session,
                                    outbox,
                                    ..
                                } = &mut *served;
                                let result = conn.finish(dialect, *session, outbox).await;
                                served.end(result);
                            }));
                        }
                    }
                }
                Phase::Finishing(finishing) => {
                    ready!(finishing.as_mut().poll(cx));
                    self.0 = Phase::Done;
                    return Poll::Ready(());
                }
                Phase::Done => return Poll::Ready(()),
            }
        }
    }
}

impl<D: Dialect> Served<D> {
    /// The request loop: handle what was read, send what is queued, wait.
    /// Server shutdown reaches it through the outbox, like any close.
    fn poll_loop(&mut self, cx: &mut Context<'_>) -> Poll<Ended> {
        loop {
            let (want_write, can_read) = match self.waiting {
                Some(waiting) => waiting,
                None => match self.step() {
                    Ok(waiting) => waiting,
                    Err(ended) => return Poll::Ready(ended),
                },
            };
            // Kept across wake-ups: a woken loop goes on with its wait, as
            // an awaited wait would.
            self.waiting = Some((want_write, can_read));
            let event = match self.poll_event(want_write, can_read, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Ended::Closed(Err(e))),
                Poll::Ready(Ok(event)) => event,
            };
            self.waiting = None;
            if let Some(ended) = self.on_event(event) {
                return Poll::Ready(ended);
            }
        }
    }

    /// One turn of the loop up to its wait: handles the requests read and
    /// moves durable queued frames to the socket. Returns whether to wait
    /// to write and to read, or how the loop ended.
    fn step(&mut self) -> Result<(bool, bool), Ended> {
        let Served {
            conn,
            dialect,
            session,
            outbox,
            stall,
            stopping,
            held,
            ..
        } = self;
        let session = *session;
        if !*stopping {
            *stopping = dialect.handle_buffered(conn, session, outbox);
            // Under `--fsync never`, the changes just applied are written
            // now, in one write, outside the core's lock.
            conn.shared.mark.hurry();
        }
        match outbox.status() {
            Status::Open => {}
            Status::Closing => return Err(Ended::Finish),
            Status::Overflowed => {
                warn!(peer = %conn.socket.peer(), %session, limit = conn.shared.config.max_outbound_bytes, "closing: client is not reading its replies and events");
                Stats::add(&conn.shared.stats.slow_client_disconnects, 1);
                return Err(Ended::Closed(Ok(())));
            }
        }

        // Move durable queued frames to the socket until none is left or
        // the socket is full.
        loop {
            if conn.socket.wbuf.len() < WRITE_BUDGET && outbox.has_queued() {
                let mark = &conn.shared.mark;
                match outbox.drain_with(conn.socket.wbuf.get(), WRITE_BUDGET, mark.get(), dialect) {
                    Drained::Waiting(revision) => {
                        if !mark.wake_at(revision, outbox) {
                            if mark.stopped() {
                                // Never durable, never sent: the server
                                // stops, and closes this connection.
                                break;
                            }
                            continue; // durable meanwhile
                        }
                        *held = true;
                    }
                    _ if std::mem::take(held) => {
                        let stats = &conn.shared.stats;
                        Stats::add(&stats.durable_sends, 1);
                        Stats::add(&stats.durable_send_ns, mark.since_moved_ns());
                    }
                    _ => {}
                }
            }
            if !conn.socket.unsent() {
                conn.socket.wbuf.release();
                break;
            }
            match conn.socket.write_some(&conn.shared.stats) {
                Ok(0) => {}
                Ok(_) => *stall = None,
                Err(e) => return Err(Ended::Closed(Err(e))),
            }
            if conn.socket.unsent() {
                break;
            }
        }
        if !conn.socket.unsent() {
            *stall = None;
        } else if stall.is_none() {
            *stall = Some(Box::pin(sleep(conn.shared.config.write_stall_timeout)));
        }

        let can_read = !*stopping
            && conn.socket.rbuf.len() < conn.max_frame() + READ_BUDGET
            && !conn.backlogged(outbox);
        Ok((conn.socket.unsent(), can_read))
    }

    /// The wait: one hand-written poll of everything that can wake the
    /// connection, so that an idle connection holds no future state at all.
    fn poll_event(
        &mut self,
        want_write: bool,
        can_read: bool,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Event>> {
        let stream = &self.conn.socket.stream;
        if want_write {
            if let Poll::Ready(r) = stream.poll_write_ready(cx) {
                return Poll::Ready(r.map(|()| Event::Writable));
            }
        }
        if can_read {
            if let Poll::Ready(r) = stream.poll_read_ready(cx) {
                return Poll::Ready(r.map(|()| Event::Readable));
            }
        }
        if let Some(stall) = &mut self.stall {
            if stall.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(Event::Stalled));
            }
        }
        if let Some(gate) = &mut self.conn.gate {
            if gate.poll_barrier(cx).is_ready() {
                return Poll::Ready(Ok(Event::Barrier));
            }
        }
        self.outbox.poll_woken(cx).map(|()| Ok(Event::Outbox))
    }

    /// Acts on what woke the connection; returns how the loop ended, if it
    /// did.
    fn on_event(&mut self, event: Event) -> Option<Ended> {
        let (conn, session, outbox) = (&mut self.conn, self.session, &self.outbox);
        match event {
            Event::Readable => match conn.read_some() {
                Ok(0) => return Some(Ended::Closed(Ok(()))), // the client closed the connection
                Ok(_) => {}
                Err(e) => return Some(Ended::Closed(Err(e))),
            },
            Event::Stalled => {
                warn!(peer = %conn.socket.peer(), %session, pending = conn.socket.wbuf.len() + outbox.queued_bytes(),
                    "closing: client took no bytes for {} ms", conn.shared.config.write_stall_timeout.as_millis());
                Stats::add(&conn.shared.stats.slow_client_disconnects, 1);
                return Some(Ended::Closed(Ok(())));
            }
            Event::Barrier => {
                if conn.gate.as_ref().is_some_and(|g| g.not_leading()) {
                    debug!(peer = %conn.socket.peer(), %session, "closing: this server does not lead any more");
                    let notice = conn.shared.core().not_leader_notice();
                    outbox.close(Some(notice), 0);
                    self.stopping = true;
                }
            }
            Event::Writable | Event::Outbox => {}
        }
        None
    }

    /// The connection is done: its session is detached (it lives on until
    /// it expires).
    fn end(&self, result: io::Result<()>) {
        let (conn, session) = (&self.conn, self.session);
        conn.shared.core().detach(session, &self.outbox);
        match result {
            Ok(()) => debug!(peer = %conn.socket.peer(), %session, "{} closed", D::NAME),
            Err(e) => debug!(peer = %conn.socket.peer(), %session, "{} ended: {e}", D::NAME),
        }
    }
}
