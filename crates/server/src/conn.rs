//! One client connection: the handshake, then requests in and frames out.
//!
//! One task serves a connection, reading and writing the socket itself (no
//! split, no second task). An idle connection holds no buffer at all: read and
//! write buffers are allocated when bytes arrive or leave and are released as
//! soon as they are empty, so a hundred thousand idle sessions cost only their
//! bookkeeping.

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use baton_proto::{
    frame_codec, ConnectRequest, ConnectResponse, ErrorCode, RequestDecodeError, RequestFrame,
    SessionId, PROTOCOL_VERSION,
};
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncRead;
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant, Sleep};
use tokio_util::codec::Decoder;
use tracing::{debug, info, warn};

use crate::clock::Now;
use crate::core::{Connected, Connecting, Flow};
use crate::outbox::{Drained, Outbox, Status};
use crate::replicate::Barrier;
use crate::shared::Shared;
use crate::stats::Stats;
use sync_wrapper::SyncWrapper;

/// Bytes read from the socket per wake-up before other work gets a turn.
const READ_BUDGET: usize = 64 * 1024;
/// Bytes encoded into the write buffer per batch.
const WRITE_BUDGET: usize = 64 * 1024;
/// Most bytes of a connection's first frame: a connect request, a status
/// probe or a backup request, each a few fields and at most a token. Until
/// it has come, nobody is trusted with room for a request of the largest
/// node data.
const MAX_FIRST_FRAME: usize = 4 * 1024;
const _: () = assert!(MAX_FIRST_FRAME >= baton_proto::handshake::MAX_TOKEN + 256);
/// How long a closing connection may take to send its last frames.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long a backup waits for the log to hold the state it copied.
const BACKUP_DURABLE_WAIT: Duration = Duration::from_secs(30);

/// The answer to a backup request that is refused: the error's wire code
/// (`code`, so that a client can tell a refusal for rights or leadership
/// from a broken server) and a message that says what to do.
fn backup_refusal(code: ErrorCode, message: &str) -> String {
    serde_json::json!({ "error": message, "code": code.to_u16() }).to_string()
}

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
    use baton_proto::OpCode;
    [
        OpCode::Create,
        OpCode::Delete,
        OpCode::SetData,
        OpCode::Enqueue,
        OpCode::CloseSession,
    ]
    .iter()
    .any(|c| *c as u8 == op)
}

impl ReadGate {
    /// Polls the barrier under way, if any: ready once it completed (the
    /// requests it covers may go) or found this server not leading.
    fn poll_barrier(&mut self, cx: &mut std::task::Context<'_>) -> Poll<()> {
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

/// What holds back the reads of a cluster leader's connection: a read waits
/// for the changes its session proposed before it to be applied, and for a
/// read barrier begun after it arrived (so that it sees every change
/// committed before it, and this server has proven it still leads).
/// Requests are counted in bytes of the connection's stream from its first
/// byte, the handshake included: where a request starts is what was
/// received less what is still buffered, so that the count of what a
/// barrier covers and the place of a request are one and the same.
#[derive(Default)]
struct ReadGate {
    /// Bytes read from the socket (their plaintext, with TLS).
    received: u64,
    /// Requests that end at or before this byte are covered by a barrier.
    covered: u64,
    /// A barrier under way, and the byte it covers up to once complete.
    /// (Wrapped: the connection's state is shared by reference across its
    /// awaits, and a barrier need not be `Sync`; it is only ever polled.)
    barrier: Option<(SyncWrapper<Barrier>, u64)>,
    /// The last barrier found that this server does not lead.
    not_leading: bool,
}

/// Why a connection's frames could not be read.
enum FrameError {
    TooLarge(usize),
    Io(io::Error),
    /// The server takes TLS only, and the client spoke plaintext.
    Plaintext,
}

/// A connection's state, boxed: the task that serves it then holds one
/// pointer to it plus the state of its one wait, which keeps an idle
/// connection's task in tokio's smallest allocation.
///
/// It holds one of the server's connection slots and gives it back on drop.
pub(crate) struct Conn {
    stream: TcpStream,
    rbuf: LazyBuf,
    wbuf: LazyBuf,
    shared: Arc<Shared>,
    /// Present on a cluster member: holds back reads (see [`ReadGate`]).
    gate: Option<Box<ReadGate>>,
    /// Present on a TLS connection or one with an identity (allocated only
    /// then, so a plaintext connection stays as small as before).
    secure: Option<Box<Secure>>,
}

/// What a connection keeps on a server with TLS or identities.
#[derive(Default)]
struct Secure {
    /// Records in and out of the socket go through it; the connection's
    /// buffers hold plaintext.
    tls: Option<rustls::ServerConnection>,
    /// The client's identity, on a server that checks identities.
    identity: Option<Arc<crate::auth::Identity>>,
}

impl Conn {
    /// Wraps an accepted stream that already took a connection slot.
    pub(crate) fn new(shared: Arc<Shared>, stream: TcpStream) -> Box<Self> {
        Stats::add(&shared.stats.connections_open, 1);
        let gate = shared.replicated.then(Box::default);
        Box::new(Conn {
            stream,
            rbuf: LazyBuf::default(),
            wbuf: LazyBuf::default(),
            gate,
            shared,
            secure: None,
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

/// A buffer that takes one pointer while it holds nothing.
#[derive(Default)]
struct LazyBuf(Option<Box<BytesMut>>);

impl LazyBuf {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], |b| &b[..])
    }

    /// The buffer, allocated if needed.
    fn get(&mut self) -> &mut BytesMut {
        self.0.get_or_insert_with(Default::default)
    }

    /// Frees the buffer (frames split off it keep their part alive).
    fn release(&mut self) {
        self.0 = None;
    }
}

/// Serves one accepted connection until it closes.
pub(crate) async fn serve(mut conn: Box<Conn>) {
    if let Err(e) = conn.stream.set_nodelay(true) {
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
        Ok(()) => debug!(peer = %conn.peer(), %session, "connection closed"),
        Err(e) => debug!(peer = %conn.peer(), %session, "connection ended: {e}"),
    }
}

impl Conn {
    /// The client's address, for logs.
    fn peer(&self) -> String {
        self.stream.peer_addr().map_or_else(
            |_| "unknown peer".to_string(),
            |a: SocketAddr| a.to_string(),
        )
    }

    fn max_frame(&self) -> usize {
        self.shared.config.max_request_frame()
    }

    /// Reads the connect request and answers it. Returns the session on
    /// success; on failure the reason has been logged and sent.
    async fn handshake(&mut self, outbox: &Arc<Outbox>) -> Option<SessionId> {
        let limit = self.shared.config.handshake_timeout;
        let mut shutdown = self.shared.stopping.subscribe();
        if *shutdown.borrow_and_update() {
            return None;
        }
        let frame = tokio::select! {
            r = timeout(limit, self.first_frame()) => match r {
                Ok(Ok(Some(frame))) => frame,
                Ok(Ok(None)) => return None,
                Ok(Err(FrameError::TooLarge(len))) => {
                    warn!(peer = %self.peer(), len, "closing: handshake frame of {len} bytes; not a Baton client?");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    return None;
                }
                Ok(Err(FrameError::Io(e))) if self.is_tls() => {
                    info!(peer = %self.peer(), "closing: {e}");
                    return None;
                }
                Ok(Err(FrameError::Io(e))) => {
                    debug!(peer = %self.peer(), "connection failed before its handshake: {e}");
                    return None;
                }
                Ok(Err(FrameError::Plaintext)) => {
                    info!(peer = %self.peer(), "refusing a plaintext client: this server takes TLS connections only");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    let message = "this server takes TLS connections only: connect with TLS (baton --tls-ca FILE, or ClientBuilder::tls)".to_string();
                    // Answered in the form the client asked in: a probe or a
                    // backup request gets a JSON error, a handshake a refusal.
                    let first = timeout(limit, self.read_frame()).await;
                    match first {
                        Ok(Ok(Some(frame)))
                            if baton_proto::probe::is_probe(&frame)
                                || baton_proto::probe::is_backup_request(&frame) =>
                        {
                            let answer = serde_json::json!({ "error": message }).to_string();
                            baton_proto::probe::encode_answer(self.wbuf.get(), &answer);
                            let _ = timeout(CLOSE_GRACE, self.write_all()).await;
                        }
                        _ => self.refuse(ErrorCode::TlsRequired, message).await,
                    }
                    return None;
                }
                Err(_) => {
                    info!(peer = %self.peer(), "closing: no handshake within {} ms", limit.as_millis());
                    return None;
                }
            },
            _ = shutdown.changed() => return None,
        };
        if baton_proto::probe::is_probe(&frame) {
            // Lock names go to the identity the probe names, if any.
            let viewer = match &self.shared.config.identities {
                None => crate::status::Viewer::Anyone,
                Some(identities) => match baton_proto::probe::backup_token(&frame)
                    .and_then(|t| identities.find(t))
                {
                    Some(identity) => crate::status::Viewer::Identity(identity),
                    None => crate::status::Viewer::Nobody,
                },
            };
            // It reads the data directory's listing: not on a runtime thread.
            let shared = self.shared.clone();
            let answer =
                match tokio::task::spawn_blocking(move || crate::status::json(&shared, &viewer))
                    .await
                {
                    Ok(answer) => answer,
                    Err(e) => serde_json::json!({ "error": format!("the status failed: {e}") })
                        .to_string(),
                };
            baton_proto::probe::encode_answer(self.wbuf.get(), &answer);
            let _ = timeout(CLOSE_GRACE, self.write_all()).await;
            return None;
        }
        if baton_proto::probe::is_backup_request(&frame) {
            if let Some(identities) = &self.shared.config.identities {
                let identity =
                    baton_proto::probe::backup_token(&frame).and_then(|t| identities.find(t));
                let refused = match identity {
                    None => Some("this server checks identities: a backup needs the token of one with the admin right".to_string()),
                    Some(id) => id.need(crate::auth::Rights::ADMIN, "/").err().map(|e| e.message),
                };
                if let Some(message) = refused {
                    info!(peer = %self.peer(), "backup refused: {message}");
                    let answer = backup_refusal(ErrorCode::PermissionDenied, &message);
                    baton_proto::probe::encode_answer(self.wbuf.get(), &answer);
                    let _ = timeout(CLOSE_GRACE, self.write_all()).await;
                    return None;
                }
            }
            if let Err(e) = self.send_backup().await {
                warn!(peer = %self.peer(), "backup not sent: {e}");
            }
            return None;
        }
        let request = match ConnectRequest::decode(frame) {
            Ok(r) => r,
            Err(e) => {
                warn!(peer = %self.peer(), "closing: bad handshake: {e}");
                Stats::add(&self.shared.stats.protocol_errors, 1);
                let message = format!("bad handshake: {e}");
                self.refuse(ErrorCode::MalformedRequest, message).await;
                return None;
            }
        };
        // A handshake of another version is refused for its version, below.
        let checked = request.version == baton_proto::PROTOCOL_VERSION;
        if let Some(identities) = self.shared.config.identities.as_ref().filter(|_| checked) {
            let found = request.token.as_ref().and_then(|t| identities.find(&t.0));
            let Some(identity) = found else {
                let message = if request.token.is_some() {
                    "the token names no identity of this server".to_string()
                } else {
                    "this server checks identities: connect with a token (baton --token-file FILE or BATON_TOKEN, or ClientBuilder::token)".to_string()
                };
                info!(peer = %self.peer(), "handshake refused: {message}");
                self.refuse(ErrorCode::AuthenticationFailed, message).await;
                return None;
            };
            self.secure.get_or_insert_with(Default::default).identity = Some(identity);
        }
        // A cluster member resumes a session only once it has proven, after
        // the handshake arrived, that it still leads: a leader cut off from
        // the majority still believes it leads, and an answered resume tells
        // the client its session is alive (its lease runs from there) while
        // the majority may already be expiring it. It opens one only then
        // too: a new session it cannot commit would keep the client waiting
        // out its whole connect timeout, where `not-leader` sends it on to
        // the other members at once.
        if self.shared.replicated {
            let barrier = self.shared.core().log().read_barrier();
            let proven = tokio::select! {
                r = timeout(limit, barrier) => matches!(r, Ok(Ok(()))),
                _ = shutdown.changed() => return None,
            };
            if !proven {
                let (code, message) = self.shared.core().not_leader_notice();
                self.refuse(code, message).await;
                return None;
            }
        }
        let connecting = self.shared.core().connect(&request, outbox, Now::real());
        let connected = match connecting {
            Ok(Connecting::Done(connected)) => Ok(connected),
            // A cluster's leader opens the session once it is committed.
            Ok(Connecting::Pending(waiting)) => {
                let limit = self.shared.config.handshake_timeout;
                tokio::select! {
                    r = timeout(limit, waiting) => match r {
                        Ok(Ok(result)) => result,
                        Ok(Err(_)) => Err(self.shared.core().not_leader_notice()),
                        Err(_) => Err((
                            ErrorCode::ShuttingDown,
                            format!("the session was not opened within {} ms; try again", limit.as_millis()),
                        )),
                    },
                    _ = shutdown.changed() => Err((
                        ErrorCode::ShuttingDown,
                        "the server is shutting down; try a server that is up".into(),
                    )),
                }
            }
            Err(refused) => Err(refused),
        };
        match connected {
            Ok(Connected { grant, revision }) => {
                let session = grant.session_id;
                // A new session is a change: its grant waits until it is durable.
                if !self.wait_durable(revision, outbox).await {
                    self.shared.core().detach(session, outbox);
                    return None;
                }
                debug!(peer = %self.peer(), %session, resumed = grant.resumed, timeout_ms = grant.timeout_ms, "session attached");
                ConnectResponse {
                    version: PROTOCOL_VERSION,
                    result: Ok(grant),
                }
                .encode(self.wbuf.get());
                match self.write_all().await {
                    Ok(()) => Some(session),
                    Err(e) => {
                        debug!(peer = %self.peer(), %session, "could not send handshake answer: {e}");
                        self.shared.core().detach(session, outbox);
                        None
                    }
                }
            }
            Err((code, message)) => {
                if code == ErrorCode::NotLeader {
                    debug!(peer = %self.peer(), leader = %message, "handshake sent to the leader");
                } else {
                    info!(peer = %self.peer(), "handshake refused: {message}");
                }
                self.shared.core().detach(SessionId(0), outbox);
                self.refuse(code, message).await;
                None
            }
        }
    }

    /// Sends a failed handshake answer, best effort.
    async fn refuse(&mut self, code: ErrorCode, message: String) {
        ConnectResponse {
            version: PROTOCOL_VERSION,
            result: Err((code, message)),
        }
        .encode(self.wbuf.get());
        let _ = timeout(CLOSE_GRACE, self.write_all()).await;
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
                    warn!(peer = %self.peer(), %session, limit = self.shared.config.max_outbound_bytes, "closing: client is not reading its replies and events");
                    Stats::add(&self.shared.stats.slow_client_disconnects, 1);
                    return Ok(());
                }
            }

            // Move durable queued frames to the socket until none is left or
            // the socket is full.
            loop {
                if self.wbuf.len() < WRITE_BUDGET && outbox.has_queued() {
                    let mark = &self.shared.mark;
                    match outbox.drain_into(self.wbuf.get(), WRITE_BUDGET, mark.get()) {
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
                if !self.unsent() {
                    self.wbuf.release();
                    break;
                }
                if self.write_some()? > 0 {
                    stall = None;
                }
                if self.unsent() {
                    break;
                }
            }
            if !self.unsent() {
                stall = None;
            } else if stall.is_none() {
                stall = Some(Box::pin(sleep(self.shared.config.write_stall_timeout)));
            }

            let can_read = !stopping
                && self.rbuf.len() < self.max_frame() + READ_BUDGET
                && !self.backlogged(outbox);
            let want_write = self.unsent();
            // One hand-written wait instead of a select over readiness
            // futures: an idle connection then holds no future state at all.
            // (The closure takes `this` whole, not each field it uses, to
            // keep that state one pointer.)
            let (this, stall) = (&mut *self, &mut stall);
            let event = poll_fn(move |cx| {
                if want_write {
                    if let Poll::Ready(r) = this.stream.poll_write_ready(cx) {
                        return Poll::Ready(r.map(|()| Event::Writable));
                    }
                }
                if can_read {
                    if let Poll::Ready(r) = this.stream.poll_read_ready(cx) {
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
                    warn!(peer = %self.peer(), %session, pending = self.wbuf.len() + outbox.queued_bytes(),
                        "closing: client took no bytes for {} ms", self.shared.config.write_stall_timeout.as_millis());
                    Stats::add(&self.shared.stats.slow_client_disconnects, 1);
                    return Ok(());
                }
                Event::Barrier => {
                    if self.gate.as_ref().is_some_and(|g| g.not_leading) {
                        debug!(peer = %self.peer(), %session, "closing: this server does not lead any more");
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
                let drained = outbox.drain_into(self.wbuf.get(), WRITE_BUDGET, mark.get());
                self.write_all().await?;
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
                info!(peer = %self.peer(), %session, "closing without flushing: client did not read its last frames within {} s", CLOSE_GRACE.as_secs());
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
        self.wbuf.len() + outbox.queued_bytes() > self.shared.config.max_outbound_bytes / 2
    }

    /// Handles every complete request frame in the read buffer, unless the
    /// client falls behind. Returns true when no more requests must be read.
    fn handle_buffered(&mut self, session: SessionId, outbox: &Arc<Outbox>) -> bool {
        while !self.backlogged(outbox) {
            if !self.gate_open(outbox) {
                return false;
            }
            let frame = match self.next_frame(self.max_frame()) {
                Ok(Some(frame)) => frame,
                Ok(None) => return false,
                Err(FrameError::TooLarge(len)) => {
                    let message = format!(
                        "frame of {len} bytes exceeds the server's limit of {} bytes",
                        self.max_frame()
                    );
                    warn!(peer = %self.peer(), %session, "closing: {message}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::FrameTooLarge, message)), 0);
                    return true;
                }
                Err(FrameError::Io(e)) => {
                    warn!(peer = %self.peer(), %session, "closing: unreadable frame: {e}");
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
                        self.secure.as_ref().and_then(|s| s.identity.as_deref()),
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
                    warn!(peer = %self.peer(), %session, "closing: {message}");
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
                    info!(peer = %self.peer(), %session, xid, op, "rejected request: {code}: {message}");
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

    /// Whether the next buffered request may be handled now. Always, on a
    /// single server; on a cluster member, a change may (it is proposed in
    /// request order), while any other request waits for the changes its
    /// session proposed before it and for a read barrier that covers it,
    /// which this starts if none is under way.
    fn gate_open(&mut self, outbox: &Outbox) -> bool {
        let Some(gate) = &mut self.gate else {
            return true;
        };
        let buffered = self.rbuf.bytes();
        if buffered.len() < 9 {
            return true; // no whole header yet: next_frame says what to do
        }
        let len = u32::from_be_bytes(buffered[..4].try_into().expect("4 bytes")) as u64;
        if is_change(buffered[8]) {
            return true;
        }
        if outbox.changes_in_flight() > 0 {
            return false; // woken once they are applied
        }
        let start = gate.received - buffered.len() as u64;
        if start + 4 + len <= gate.covered {
            return true;
        }
        if gate.barrier.is_none() && !gate.not_leading {
            let barrier = self.shared.core().log().read_barrier();
            gate.barrier = Some((SyncWrapper::new(barrier), gate.received));
        }
        false
    }

    /// The next complete frame in the read buffer, if any.
    ///
    /// The codec is made afresh for each whole frame rather than kept per
    /// connection: the length is checked here first, so the codec never sees
    /// a partial frame and has no state worth keeping.
    fn next_frame(&mut self, max: usize) -> Result<Option<Bytes>, FrameError> {
        if self.rbuf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.rbuf.bytes()[..4].try_into().expect("4 bytes")) as usize;
        if len > max {
            return Err(FrameError::TooLarge(len));
        }
        if self.rbuf.len() < 4 + len {
            let missing = 4 + len - self.rbuf.len();
            self.rbuf.get().reserve(missing);
            return Ok(None);
        }
        let frame = frame_codec(max)
            .decode(self.rbuf.get())
            .map_err(FrameError::Io)?
            .expect("a whole frame is buffered");
        if self.rbuf.is_empty() {
            // Let go of the buffer: frames still hold their part of it.
            self.rbuf.release();
        }
        Ok(Some(frame.freeze()))
    }

    /// The first frame of a connection, after the TLS handshake if the
    /// server takes TLS only.
    async fn first_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        if let Some(config) = self.shared.tls() {
            let mut first = [0u8; 1];
            if self.stream.peek(&mut first).await.map_err(FrameError::Io)? == 0 {
                return Ok(None);
            }
            if !crate::tls::looks_like_tls(first[0]) {
                return Err(FrameError::Plaintext);
            }
            let tls = rustls::ServerConnection::new(config)
                .map_err(|e| FrameError::Io(crate::tls::io_error(e)))?;
            self.secure.get_or_insert_with(Default::default).tls = Some(tls);
            while self.tls().is_some_and(|t| t.is_handshaking()) {
                if self.unsent() {
                    self.write_all().await.map_err(FrameError::Io)?;
                    continue;
                }
                self.stream.readable().await.map_err(FrameError::Io)?;
                if self.read_some().map_err(FrameError::Io)? == 0 {
                    return Ok(None);
                }
            }
        }
        self.read_frame().await
    }

    /// Reads until the connection's first frame is buffered; `None` on a
    /// clean close. It may be at most [`MAX_FIRST_FRAME`] bytes.
    async fn read_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        loop {
            if let Some(frame) = self.next_frame(MAX_FIRST_FRAME)? {
                return Ok(Some(frame));
            }
            self.stream.readable().await.map_err(FrameError::Io)?;
            if self.read_some().map_err(FrameError::Io)? == 0 {
                return Ok(None);
            }
        }
    }

    /// Reads what the socket has, up to [`READ_BUDGET`], into the read buffer
    /// (through rustls on a TLS connection). Returns 0 only at end of
    /// stream; a spurious wake-up returns 1 without reading.
    ///
    /// Reads go through tokio's `poll_read`, which takes a read shorter than
    /// the buffer as the socket drained and clears its readiness then: the
    /// connection waits for the next bytes without one more `recv` that would
    /// only say "would block". The chunk is not zeroed first.
    fn read_some(&mut self) -> io::Result<usize> {
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Bytes from the socket, and what they hold for the read buffer (the
        // same bytes, or on a TLS connection the plaintext of the records).
        let (mut raw, mut got, mut eof) = (0, 0, false);
        while raw < READ_BUDGET {
            let mut buf = tokio::io::ReadBuf::uninit(&mut chunk);
            // A pending read leaves the no-op waker registered; the wait in
            // `run` registers the task's own before it sleeps.
            match Pin::new(&mut self.stream).poll_read(&mut cx, &mut buf) {
                Poll::Pending => break,
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Ready(Ok(())) => {
                    let read = buf.filled();
                    if read.is_empty() {
                        eof = true;
                        break;
                    }
                    raw += read.len();
                    let drained = read.len() < buf.capacity();
                    let closed = if self.is_tls() {
                        let (n, closed) = self.tls_in(read)?;
                        got += n;
                        closed
                    } else {
                        self.rbuf.get().extend_from_slice(read);
                        got += read.len();
                        false
                    };
                    if closed {
                        eof = true;
                        break;
                    }
                    if drained {
                        break;
                    }
                }
            }
        }
        if let Some(gate) = &mut self.gate {
            gate.received += got as u64;
        }
        if eof && got == 0 {
            return Ok(0);
        }
        Ok(got.max(1))
    }

    /// Feeds records to rustls and moves the plaintext they hold into the
    /// read buffer. Returns the plaintext's length, and whether the client
    /// closed its side of the session.
    fn tls_in(&mut self, mut records: &[u8]) -> io::Result<(usize, bool)> {
        let tls = self
            .secure
            .as_mut()
            .and_then(|s| s.tls.as_mut())
            .expect("a TLS connection");
        let mut plain = 0;
        while !records.is_empty() {
            tls.read_tls(&mut records)?;
            if let Err(e) = tls.process_new_packets() {
                // Tell the client why (an alert), best effort.
                let _ = tls.write_tls(&mut crate::tls::SocketWriter(&self.stream));
                return Err(crate::tls::io_error(e));
            }
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match std::io::Read::read(&mut tls.reader(), &mut chunk) {
                    Ok(0) => return Ok((plain, true)),
                    Ok(n) => {
                        self.rbuf.get().extend_from_slice(&chunk[..n]);
                        plain += n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok((plain, false))
    }

    /// The connection's TLS state, on a TLS connection.
    fn tls(&self) -> Option<&rustls::ServerConnection> {
        self.secure.as_ref().and_then(|s| s.tls.as_ref())
    }

    fn is_tls(&self) -> bool {
        self.tls().is_some()
    }

    /// Whether output waits to be written: plaintext in the write buffer,
    /// or TLS records rustls holds.
    fn unsent(&self) -> bool {
        !self.wbuf.is_empty() || self.tls().is_some_and(|t| t.wants_write())
    }

    /// Writes as much of the write buffer as the socket takes now; returns
    /// how many bytes that was.
    fn write_some(&mut self) -> io::Result<usize> {
        if self.is_tls() {
            return self.write_some_tls();
        }
        let mut total = 0;
        while !self.wbuf.is_empty() {
            match self.stream.try_write(self.wbuf.bytes()) {
                Ok(n) => {
                    Stats::add(&self.shared.stats.bytes_out, n as u64);
                    self.wbuf.get().advance(n);
                    total += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.wbuf.release();
        Ok(total)
    }

    /// Answers a backup request: a snapshot of the state as it is now, once
    /// the log holds all of it, in frames (see `baton_proto::probe`).
    async fn send_backup(&mut self) -> io::Result<()> {
        let shared = self.shared.clone();
        let Ok(_one_at_a_time) = shared.backups.try_acquire() else {
            let error = "another backup is being taken; try again once it is done";
            return self
                .send_backup_frame(serde_json::json!({ "error": error }).to_string().as_bytes())
                .await;
        };
        // A cluster member backs up only state a majority has committed, as
        // of the request: it must lead, and prove it (a member cut off from
        // the majority, or one whose cluster never formed, would hand out
        // its own view).
        if self.shared.replicated {
            let barrier = self.shared.core().log().read_barrier();
            let limit = BACKUP_DURABLE_WAIT;
            if !matches!(timeout(limit, barrier).await, Ok(Ok(()))) {
                let (_, leader) = self.shared.core().not_leader_notice();
                let message = if leader.is_empty() {
                    "this cluster member does not lead a majority that answers (no leader is elected, or it is cut off): a backup must hold what a majority committed; take it from the leader once there is one (baton cluster status)".to_string()
                } else {
                    format!("this cluster member does not lead; take the backup from the leader, at {leader}")
                };
                info!(peer = %self.peer(), "backup refused: {message}");
                let answer = backup_refusal(ErrorCode::NotLeader, &message);
                return self.send_backup_frame(answer.as_bytes()).await;
            }
        }
        let sm = self.shared.core().state();
        let revision = sm.revision();
        let deadline = Instant::now() + BACKUP_DURABLE_WAIT;
        let mark = self.shared.mark.clone();
        while mark.get() < revision {
            if Instant::now() >= deadline {
                let error = format!(
                    "the log did not become durable up to revision {revision} within {} s",
                    BACKUP_DURABLE_WAIT.as_secs()
                );
                return self
                    .send_backup_frame(
                        &serde_json::json!({ "error": error })
                            .to_string()
                            .into_bytes(),
                    )
                    .await;
            }
            mark.hurry();
            sleep(Duration::from_millis(1)).await;
        }
        let started = std::time::Instant::now();
        let encoded = tokio::task::spawn_blocking(move || {
            let mut out = std::io::Cursor::new(Vec::new());
            crate::persist::snapshot::encode(&sm, &mut out)
                .map(|()| (out.into_inner(), sm.session_count(), sm.node_count()))
        })
        .await
        .map_err(io::Error::other)?;
        let (bytes, sessions, nodes) = match encoded {
            Ok(x) => x,
            Err(e) => {
                let error = format!("encoding the snapshot failed: {e}");
                return self
                    .send_backup_frame(
                        &serde_json::json!({ "error": error })
                            .to_string()
                            .into_bytes(),
                    )
                    .await;
            }
        };
        info!(peer = %self.peer(), revision, bytes = bytes.len(), ms = started.elapsed().as_millis() as u64, "sending a backup");
        let header = serde_json::json!({
            "revision": revision,
            "bytes": bytes.len(),
            "sessions": sessions,
            "nodes": nodes,
        });
        self.send_backup_frame(header.to_string().as_bytes())
            .await?;
        for chunk in bytes.chunks(baton_proto::probe::BACKUP_CHUNK) {
            self.send_backup_frame(chunk).await?;
        }
        self.send_backup_frame(&[]).await
    }

    /// Sends one frame of a backup answer, giving up on a client that takes
    /// no bytes for the write-stall timeout.
    async fn send_backup_frame(&mut self, payload: &[u8]) -> io::Result<()> {
        baton_proto::probe::encode_answer_bytes(self.wbuf.get(), payload);
        let limit = self.shared.config.write_stall_timeout;
        loop {
            self.write_some()?;
            if !self.unsent() {
                return Ok(());
            }
            if timeout(limit, self.stream.writable()).await.is_err() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took no bytes for {} ms", limit.as_millis()),
                ));
            }
        }
    }

    /// [`write_some`](Self::write_some) on a TLS connection: plaintext goes
    /// into rustls, and the records it makes to the socket.
    fn write_some_tls(&mut self) -> io::Result<usize> {
        let tls = self
            .secure
            .as_mut()
            .and_then(|s| s.tls.as_mut())
            .expect("a TLS connection");
        let mut total = 0;
        loop {
            if !self.wbuf.is_empty() {
                let taken = std::io::Write::write(&mut tls.writer(), self.wbuf.bytes())?;
                self.wbuf.get().advance(taken);
            }
            if !tls.wants_write() {
                break;
            }
            match tls.write_tls(&mut crate::tls::SocketWriter(&self.stream)) {
                Ok(n) => {
                    Stats::add(&self.shared.stats.bytes_out, n as u64);
                    total += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.wbuf.is_empty() {
            self.wbuf.release();
        }
        Ok(total)
    }

    /// Writes the whole write buffer, waiting for the socket as needed.
    async fn write_all(&mut self) -> io::Result<()> {
        loop {
            self.write_some()?;
            if !self.unsent() {
                return Ok(());
            }
            self.stream.writable().await?;
        }
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
