//! A client connection's socket, for every front end: reads into a buffer
//! and writes from one, through rustls on a TLS connection, with length-
//! prefixed frames cut from what was read.
//!
//! An idle connection holds no buffer at all: read and write buffers are
//! allocated when bytes arrive or leave and are released as soon as they
//! are empty, so a hundred thousand idle sessions cost only their
//! bookkeeping.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use baton_proto::frame_codec;
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncRead;
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

use crate::stats::Stats;

/// Bytes read from the socket per wake-up before other work gets a turn.
pub(crate) const READ_BUDGET: usize = 64 * 1024;

/// Why a connection's frames could not be read.
pub(crate) enum FrameError {
    TooLarge(usize),
    Io(io::Error),
    /// The server takes TLS only, and the client spoke plaintext.
    Plaintext,
}

/// A connection's socket and its buffers.
pub(crate) struct Socket {
    pub(crate) stream: TcpStream,
    pub(crate) rbuf: LazyBuf,
    pub(crate) wbuf: LazyBuf,
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

/// A buffer that takes one pointer while it holds nothing.
#[derive(Default)]
pub(crate) struct LazyBuf(Option<Box<BytesMut>>);

impl LazyBuf {
    /// Bytes a buffer starts with: a request or a reply with its event and
    /// a few more (a handover's frames are 60-200 bytes each).
    pub(crate) const START: usize = 1024;

    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], |b| &b[..])
    }

    /// The buffer, allocated if needed with room for a few ordinary frames
    /// ([`LazyBuf::START`]): a buffer grown from nothing a few bytes at a
    /// time, as frames are encoded piece by piece, would be reallocated and
    /// copied several times for every frame a woken connection handles.
    pub(crate) fn get(&mut self) -> &mut BytesMut {
        self.0
            .get_or_insert_with(|| Box::new(BytesMut::with_capacity(Self::START)))
    }

    /// Frees the buffer (frames split off it keep their part alive).
    pub(crate) fn release(&mut self) {
        self.0 = None;
    }
}

impl Socket {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Socket {
            stream,
            rbuf: LazyBuf::default(),
            wbuf: LazyBuf::default(),
            secure: None,
        }
    }

    /// The client's identity, once the handshake found one.
    pub(crate) fn identity(&self) -> Option<&crate::auth::Identity> {
        self.secure.as_ref().and_then(|s| s.identity.as_deref())
    }

    /// The certificate the client presented in the TLS handshake, which
    /// verified it against the server's client authority (none without
    /// TLS, or without a client authority).
    pub(crate) fn peer_certificate(&self) -> Option<&rustls_pki_types::CertificateDer<'static>> {
        self.secure
            .as_ref()
            .and_then(|s| s.tls.as_ref())
            .and_then(|t| t.peer_certificates())
            .and_then(|certs| certs.first())
    }

    pub(crate) fn set_identity(&mut self, identity: Arc<crate::auth::Identity>) {
        self.secure.get_or_insert_with(Default::default).identity = Some(identity);
    }

    /// Takes the TLS handshake of a client whose first byte says it speaks
    /// TLS (else [`FrameError::Plaintext`]); false if it closed first.
    /// `plaintext` counts the bytes of plaintext read meanwhile (a client
    /// may send its first frame with the handshake's last records).
    pub(crate) async fn accept_tls(
        &mut self,
        config: Arc<rustls::ServerConfig>,
        stats: &Stats,
        plaintext: &mut u64,
    ) -> Result<bool, FrameError> {
        let mut first = [0u8; 1];
        if self.stream.peek(&mut first).await.map_err(FrameError::Io)? == 0 {
            return Ok(false);
        }
        if !crate::tls::looks_like_tls(first[0]) {
            return Err(FrameError::Plaintext);
        }
        let tls = rustls::ServerConnection::new(config)
            .map_err(|e| FrameError::Io(crate::tls::io_error(e)))?;
        self.secure.get_or_insert_with(Default::default).tls = Some(tls);
        while self.tls().is_some_and(|t| t.is_handshaking()) {
            if self.unsent() {
                self.write_all(stats).await.map_err(FrameError::Io)?;
                continue;
            }
            self.stream.readable().await.map_err(FrameError::Io)?;
            if self.read_some(plaintext).map_err(FrameError::Io)? == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Reads until a whole frame of at most `max` bytes is buffered; `None`
    /// on a clean close. `plaintext` counts the bytes read.
    pub(crate) async fn read_frame(
        &mut self,
        max: usize,
        plaintext: &mut u64,
    ) -> Result<Option<Bytes>, FrameError> {
        loop {
            if let Some(frame) = self.next_frame(max)? {
                return Ok(Some(frame));
            }
            self.stream.readable().await.map_err(FrameError::Io)?;
            if self.read_some(plaintext).map_err(FrameError::Io)? == 0 {
                return Ok(None);
            }
        }
    }

    /// Reads until at least `n` bytes are buffered; false on a clean close
    /// before that. `plaintext` counts the bytes read.
    pub(crate) async fn read_at_least(
        &mut self,
        n: usize,
        plaintext: &mut u64,
    ) -> io::Result<bool> {
        while self.rbuf.len() < n {
            self.stream.readable().await?;
            if self.read_some(plaintext)? == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The client's address, for logs.
    pub(crate) fn peer(&self) -> String {
        self.stream.peer_addr().map_or_else(
            |_| "unknown peer".to_string(),
            |a: SocketAddr| a.to_string(),
        )
    }

    /// Reads what the socket has, up to [`READ_BUDGET`], into the read buffer
    /// (through rustls on a TLS connection). Returns 0 only at end of
    /// stream; a spurious wake-up returns 1 without reading.
    ///
    /// Reads go through tokio's `poll_read`, which takes a read shorter than
    /// the buffer as the socket drained and clears its readiness then: the
    /// connection waits for the next bytes without one more `recv` that would
    /// only say "would block". The chunk is not zeroed first.
    pub(crate) fn read_some(&mut self, plaintext: &mut u64) -> io::Result<usize> {
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Bytes from the socket, and what they hold for the read buffer (the
        // same bytes, or on a TLS connection the plaintext of the records).
        let (mut raw, mut got, mut eof) = (0, 0, false);
        while raw < READ_BUDGET {
            let mut buf = tokio::io::ReadBuf::uninit(&mut chunk);
            // A pending read leaves the no-op waker registered; the wait in
            // the connection registers the task's own before it sleeps.
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
        *plaintext += got as u64;
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
    pub(crate) fn tls(&self) -> Option<&rustls::ServerConnection> {
        self.secure.as_ref().and_then(|s| s.tls.as_ref())
    }

    pub(crate) fn is_tls(&self) -> bool {
        self.tls().is_some()
    }

    /// Whether output waits to be written: plaintext in the write buffer,
    /// or TLS records rustls holds.
    pub(crate) fn unsent(&self) -> bool {
        !self.wbuf.is_empty() || self.tls().is_some_and(|t| t.wants_write())
    }

    /// Writes as much of the write buffer as the socket takes now; returns
    /// how many bytes that was.
    pub(crate) fn write_some(&mut self, stats: &Stats) -> io::Result<usize> {
        if self.is_tls() {
            return self.write_some_tls(stats);
        }
        let mut total = 0;
        while !self.wbuf.is_empty() {
            match self.stream.try_write(self.wbuf.bytes()) {
                Ok(n) => {
                    Stats::add(&stats.bytes_out, n as u64);
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

    /// [`write_some`](Self::write_some) on a TLS connection: plaintext goes
    /// into rustls, and the records it makes to the socket.
    fn write_some_tls(&mut self, stats: &Stats) -> io::Result<usize> {
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
                    Stats::add(&stats.bytes_out, n as u64);
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
    pub(crate) async fn write_all(&mut self, stats: &Stats) -> io::Result<()> {
        loop {
            self.write_some(stats)?;
            if !self.unsent() {
                return Ok(());
            }
            self.stream.writable().await?;
        }
    }

    /// The next complete frame in the read buffer, if any.
    ///
    /// The codec is made afresh for each whole frame rather than kept per
    /// connection: the length is checked here first, so the codec never sees
    /// a partial frame and has no state worth keeping.
    pub(crate) fn next_frame(&mut self, max: usize) -> Result<Option<Bytes>, FrameError> {
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
}

#[cfg(test)]
mod tests {
    use super::LazyBuf;

    /// A buffer is allocated once with room for a few frames, and an empty
    /// one is let go: an idle connection holds none.
    #[test]
    fn a_lazy_buffer_starts_with_room_and_is_let_go_when_released() {
        let mut buf = LazyBuf::default();
        assert!(buf.0.is_none());
        buf.get().extend_from_slice(&[1; 200]);
        assert!(buf.get().capacity() >= LazyBuf::START);
        let before = buf.get().as_ptr();
        buf.get().extend_from_slice(&[2; 600]);
        assert_eq!(buf.get().as_ptr(), before, "no reallocation for 800 bytes");
        assert_eq!(buf.len(), 800);
        buf.release();
        assert!(buf.0.is_none() && buf.is_empty());
    }
}
