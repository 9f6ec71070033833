//! One client connection: the handshake, then requests in and frames out.
//!
//! One task serves a connection, reading and writing the socket itself (no
//! split, no second task). An idle connection holds no buffer at all: read and
//! write buffers are allocated when bytes arrive or leave and are released as
//! soon as they are empty, so a hundred thousand idle sessions cost only their
//! bookkeeping.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::{
    frame_codec, ConnectRequest, ConnectResponse, ErrorCode, RequestDecodeError, RequestFrame,
    SessionId, PROTOCOL_VERSION,
};
use bytes::{Buf, Bytes, BytesMut};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::codec::{Decoder, LengthDelimitedCodec};
use tracing::{debug, info, warn};

use crate::core::Flow;
use crate::outbox::{Drained, Outbox};
use crate::server::Shared;
use crate::stats::Stats;

/// Bytes read from the socket per wake-up before other work gets a turn.
const READ_BUDGET: usize = 64 * 1024;
/// Bytes encoded into the write buffer per batch.
const WRITE_BUDGET: usize = 64 * 1024;
/// How long a closing connection may take to send its last frames.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Why a connection's frames could not be read.
enum FrameError {
    TooLarge(usize),
    Io(io::Error),
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    rbuf: BytesMut,
    wbuf: BytesMut,
    codec: LengthDelimitedCodec,
    max_frame: usize,
    shared: Arc<Shared>,
}

/// Serves one accepted connection until it closes.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, "cannot set TCP_NODELAY: {e}");
    }
    let max_frame = shared.config.max_request_frame();
    let mut conn = Conn {
        stream,
        peer,
        rbuf: BytesMut::new(),
        wbuf: BytesMut::new(),
        codec: frame_codec(max_frame),
        max_frame,
        shared,
    };
    let outbox = Outbox::new(conn.shared.config.max_outbound_bytes);
    let Some(session) = conn.handshake(&outbox, &mut shutdown).await else {
        return;
    };
    let result = conn.run(session, &outbox, &mut shutdown).await;
    conn.shared.core().detach(session, &outbox);
    match result {
        Ok(()) => debug!(%peer, %session, "connection closed"),
        Err(e) => debug!(%peer, %session, "connection ended: {e}"),
    }
}

impl Conn {
    /// Reads the connect request and answers it. Returns the session on
    /// success; on failure the reason has been logged and sent.
    async fn handshake(
        &mut self,
        outbox: &Arc<Outbox>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<SessionId> {
        let limit = self.shared.config.handshake_timeout;
        let frame = tokio::select! {
            r = timeout(limit, self.read_frame()) => match r {
                Ok(Ok(Some(frame))) => frame,
                Ok(Ok(None)) => return None,
                Ok(Err(FrameError::TooLarge(len))) => {
                    warn!(peer = %self.peer, len, "closing: handshake frame of {len} bytes; not a Baton client?");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    return None;
                }
                Ok(Err(FrameError::Io(e))) => {
                    debug!(peer = %self.peer, "connection failed before its handshake: {e}");
                    return None;
                }
                Err(_) => {
                    info!(peer = %self.peer, "closing: no handshake within {} ms", limit.as_millis());
                    return None;
                }
            },
            _ = shutdown.changed() => return None,
        };
        let request = match ConnectRequest::decode(frame) {
            Ok(r) => r,
            Err(e) => {
                warn!(peer = %self.peer, "closing: bad handshake: {e}");
                Stats::add(&self.shared.stats.protocol_errors, 1);
                let message = format!("bad handshake: {e}");
                self.refuse(ErrorCode::MalformedRequest, message).await;
                return None;
            }
        };
        let connected = self.shared.core().connect(&request, outbox, Instant::now());
        match connected {
            Ok((grant, replan)) => {
                if replan {
                    self.shared.expiry_wake.notify_one();
                }
                let session = grant.session_id;
                debug!(peer = %self.peer, %session, resumed = grant.resumed, timeout_ms = grant.timeout_ms, "session attached");
                ConnectResponse {
                    version: PROTOCOL_VERSION,
                    result: Ok(grant),
                }
                .encode(&mut self.wbuf);
                match self.write_all().await {
                    Ok(()) => Some(session),
                    Err(e) => {
                        debug!(peer = %self.peer, %session, "could not send handshake answer: {e}");
                        self.shared.core().detach(session, outbox);
                        None
                    }
                }
            }
            Err((code, message)) => {
                info!(peer = %self.peer, "handshake refused: {message}");
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
        .encode(&mut self.wbuf);
        let _ = timeout(CLOSE_GRACE, self.write_all()).await;
    }

    /// The request loop: handle what was read, send what is queued, wait.
    async fn run(
        &mut self,
        session: SessionId,
        outbox: &Arc<Outbox>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> io::Result<()> {
        let mut stopping = false; // no more requests will be read
        let mut closing_since: Option<Instant> = None; // the outbox said close
        let mut shutting_down = *shutdown.borrow();
        if shutting_down {
            outbox.close(Some(shutdown_notice()));
        }
        loop {
            if !stopping {
                stopping = self.handle_buffered(session, outbox);
            }

            let mut more = false;
            if self.wbuf.is_empty() && closing_since.is_none() {
                match outbox.drain_into(&mut self.wbuf, WRITE_BUDGET) {
                    Drained::Idle => {}
                    Drained::More => more = true,
                    Drained::Close => {
                        stopping = true;
                        closing_since = Some(Instant::now());
                    }
                    Drained::Overflowed => {
                        warn!(peer = %self.peer, %session, limit = outbox.limit(), "closing: client is not reading its replies and events");
                        Stats::add(&self.shared.stats.slow_client_disconnects, 1);
                        return Ok(());
                    }
                }
            }
            if !self.wbuf.is_empty() {
                self.write_some()?;
            }
            if closing_since.is_some() && self.wbuf.is_empty() {
                return Ok(());
            }
            if more && self.wbuf.is_empty() {
                continue;
            }

            let can_read = !stopping
                && self.rbuf.len() < self.max_frame + READ_BUDGET
                && !self.backlogged(outbox);
            let close_deadline = closing_since.map(|t| t + CLOSE_GRACE);
            tokio::select! {
                biased;
                _ = shutdown.changed(), if !shutting_down => {
                    shutting_down = true;
                    outbox.close(Some(shutdown_notice()));
                }
                r = self.stream.writable(), if !self.wbuf.is_empty() => r?,
                r = self.stream.readable(), if can_read => {
                    r?;
                    if self.read_some()? == 0 {
                        return Ok(()); // the client closed the connection
                    }
                }
                _ = outbox.wait() => {}
                _ = sleep_until(close_deadline.unwrap_or_else(Instant::now)), if close_deadline.is_some() => {
                    info!(peer = %self.peer, %session, "closing without flushing: client did not read its last frames within {} s", CLOSE_GRACE.as_secs());
                    return Ok(());
                }
            }
        }
    }

    /// True while the client has more output waiting than it should: then
    /// requests wait in the socket rather than produce more output.
    fn backlogged(&self, outbox: &Outbox) -> bool {
        self.wbuf.len() + outbox.queued_bytes() > outbox.limit() / 2
    }

    /// Handles every complete request frame in the read buffer, unless the
    /// client falls behind. Returns true when no more requests must be read.
    fn handle_buffered(&mut self, session: SessionId, outbox: &Arc<Outbox>) -> bool {
        while !self.backlogged(outbox) {
            let frame = match self.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return false,
                Err(FrameError::TooLarge(len)) => {
                    let message = format!(
                        "frame of {len} bytes exceeds the server's limit of {} bytes",
                        self.max_frame
                    );
                    warn!(peer = %self.peer, %session, "closing: {message}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::FrameTooLarge, message)));
                    return true;
                }
                Err(FrameError::Io(e)) => {
                    warn!(peer = %self.peer, %session, "closing: unreadable frame: {e}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::MalformedRequest, e.to_string())));
                    return true;
                }
            };
            Stats::add(&self.shared.stats.bytes_in, frame.len() as u64 + 4);
            let flow = match RequestFrame::decode(frame) {
                Ok(request) => self
                    .shared
                    .core()
                    .handle(session, request, outbox, Instant::now()),
                Err(RequestDecodeError::NoHeader) => {
                    let message = "request frame shorter than its 5-byte header".to_string();
                    warn!(peer = %self.peer, %session, "closing: {message}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::MalformedRequest, message)));
                    Flow::Stop
                }
                Err(RequestDecodeError::Reject {
                    xid,
                    op,
                    code,
                    message,
                }) => {
                    info!(peer = %self.peer, %session, xid, op, "rejected request: {code}: {message}");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    self.shared.core().reject(
                        session,
                        xid,
                        op,
                        code,
                        message,
                        outbox,
                        Instant::now(),
                    )
                }
            };
            if flow == Flow::Stop {
                return true;
            }
        }
        false
    }

    /// The next complete frame in the read buffer, if any.
    fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        if self.rbuf.len() >= 4 {
            let len = u32::from_be_bytes(self.rbuf[..4].try_into().expect("4 bytes")) as usize;
            if len > self.max_frame {
                return Err(FrameError::TooLarge(len));
            }
        }
        let frame = self.codec.decode(&mut self.rbuf).map_err(FrameError::Io)?;
        if self.rbuf.is_empty() {
            // Let go of the buffer: frames still hold their part of it.
            self.rbuf = BytesMut::new();
        }
        Ok(frame.map(BytesMut::freeze))
    }

    /// Reads until one complete frame is buffered; `None` on a clean close.
    async fn read_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        loop {
            if let Some(frame) = self.next_frame()? {
                return Ok(Some(frame));
            }
            self.stream.readable().await.map_err(FrameError::Io)?;
            if self.read_some().map_err(FrameError::Io)? == 0 {
                return Ok(None);
            }
        }
    }

    /// Reads what the socket has, up to [`READ_BUDGET`]. Returns 0 only at end
    /// of stream; a spurious wake-up returns 1 without reading.
    fn read_some(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let mut total = 0;
        while total < READ_BUDGET {
            match self.stream.try_read(&mut chunk) {
                Ok(0) => return Ok(total),
                Ok(n) => {
                    self.rbuf.extend_from_slice(&chunk[..n]);
                    total += n;
                    if n < chunk.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(total.max(1))
    }

    /// Writes as much of the write buffer as the socket takes now.
    fn write_some(&mut self) -> io::Result<()> {
        while !self.wbuf.is_empty() {
            match self.stream.try_write(&self.wbuf) {
                Ok(n) => {
                    Stats::add(&self.shared.stats.bytes_out, n as u64);
                    self.wbuf.advance(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.wbuf = BytesMut::new();
        Ok(())
    }

    /// Writes the whole write buffer, waiting for the socket as needed.
    async fn write_all(&mut self) -> io::Result<()> {
        loop {
            self.write_some()?;
            if self.wbuf.is_empty() {
                return Ok(());
            }
            self.stream.writable().await?;
        }
    }
}

fn shutdown_notice() -> (ErrorCode, String) {
    (
        ErrorCode::ShuttingDown,
        "the server is shutting down; resume the session on a server that is up".into(),
    )
}
