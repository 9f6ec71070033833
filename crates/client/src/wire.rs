//! The socket under a session: plaintext, or TLS through rustls.
//!
//! The client drives rustls's `ClientConnection` itself, so that a call can
//! still write its own request without waiting (records go to the socket as
//! far as it takes them, the rest when it drains), while the session task
//! reads: the connection state sits behind a short lock both sides take.

use std::io::{self, Read, Write};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::error::{Error, Result};

/// TLS settings for connecting to a server that takes TLS: the certificate
/// authority its certificate must chain to and, for a server that asks for
/// one, this client's certificate. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
}

impl ClientTls {
    /// Settings from PEM files: `ca`, the certificate authorities to trust,
    /// and `identity`, this client's certificate chain and private key.
    ///
    /// # Errors
    /// [`Error::Tls`] naming the file and what is wrong with it.
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self> {
        let mut roots = RootCertStore::empty();
        for cert in baton_proto::pem::read_certs(ca).map_err(Error::pem)? {
            roots.add(cert).map_err(|e| {
                Error::tls_because(
                    format!("{}: not a usable CA certificate: {e}", ca.display()),
                    e,
                )
            })?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::tls_because(e.to_string(), e))?
            .with_root_certificates(roots);
        let config = match identity {
            Some((cert, key)) => {
                let certs = baton_proto::pem::read_certs(cert).map_err(Error::pem)?;
                let key = baton_proto::pem::read_key(key).map_err(Error::pem)?;
                builder.with_client_auth_cert(certs, key).map_err(|e| {
                    Error::tls_because(
                        format!("{} and its key do not go together: {e}", cert.display()),
                        e,
                    )
                })?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls::new(Arc::new(config)))
    }

    /// Settings from a rustls configuration made by the caller.
    pub fn new(config: Arc<ClientConfig>) -> Self {
        ClientTls { config }
    }
}

/// The writing side of a connection.
pub(crate) struct Wire {
    half: OwnedWriteHalf,
    tls: Option<Mutex<ClientConnection>>,
}

/// The reading side of a connection.
pub(crate) enum ReadSide {
    Plain(OwnedReadHalf),
    Tls {
        half: OwnedReadHalf,
        wire: Arc<Wire>,
        /// Records read from the socket and not yet taken by rustls.
        raw: BytesMut,
    },
}

/// The name `addr`'s certificate must carry: its host part.
fn server_name(addr: &str) -> Result<ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
        None => addr,
    };
    ServerName::try_from(host.to_owned()).map_err(|e| {
        Error::connect_because(addr, format!("{host} is not a name TLS can check: {e}"), e)
    })
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// Connects to `addr`, and with `tls` completes the TLS handshake.
///
/// # Errors
/// [`Error::Connect`] saying why, with the error underneath as its cause.
pub(crate) async fn connect(addr: &str, tls: Option<&ClientTls>) -> Result<(Arc<Wire>, ReadSide)> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| Error::connect_because(addr, e.to_string(), e))?;
    let _ = stream.set_nodelay(true);
    let (mut read, write) = stream.into_split();
    let Some(tls) = tls else {
        let wire = Arc::new(Wire {
            half: write,
            tls: None,
        });
        return Ok((wire, ReadSide::Plain(read)));
    };
    let name = server_name(addr)?;
    let conn = ClientConnection::new(tls.config.clone(), name)
        .map_err(|e| Error::connect_because(addr, e.to_string(), e))?;
    let wire = Arc::new(Wire {
        half: write,
        tls: Some(Mutex::new(conn)),
    });
    let mut raw = BytesMut::with_capacity(16 * 1024);
    let failed =
        |e: io::Error| Error::connect_because(addr, format!("TLS handshake failed: {e}"), e);
    let plaintext = "(does the server take TLS? One started without --tls-cert speaks plaintext)";
    loop {
        let (handshaking, wants_write) = {
            let c = wire.tls();
            (c.is_handshaking(), c.wants_write())
        };
        if wants_write {
            wire.write_all(&mut BytesMut::new()).await.map_err(failed)?;
            continue;
        }
        if !handshaking {
            break;
        }
        raw.reserve(16 * 1024);
        if read.read_buf(&mut raw).await.map_err(failed)? == 0 {
            return Err(Error::connect(
                addr,
                format!("TLS handshake failed: the server closed the connection {plaintext}"),
            ));
        }
        let mut c = wire.tls();
        while !raw.is_empty() && c.is_handshaking() {
            let mut records = &raw[..];
            let taken = c.read_tls(&mut records).map_err(failed)?;
            raw.advance(taken);
            c.process_new_packets().map_err(|e| {
                let reason = format!("TLS handshake failed: {}", handshake_failure(&e, plaintext));
                Error::connect_because(addr, reason, e)
            })?;
            if taken == 0 {
                break;
            }
        }
    }
    Ok((
        wire.clone(),
        ReadSide::Tls {
            half: read,
            wire,
            raw,
        },
    ))
}

/// What a TLS error during the handshake means, and what to do about it.
fn handshake_failure(e: &rustls::Error, plaintext: &str) -> String {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(_) => format!(
            "{e}: the server's certificate is not trusted; check that --tls-ca names the authority that signed it, and that it names the host in the server's address"
        ),
        E::AlertReceived(_) => format!(
            "{e}: the server refused this client; if it checks client certificates (baton serve --tls-ca), give --tls-cert and --tls-key signed by an authority it trusts"
        ),
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. } => format!("{e} {plaintext}"),
        _ => e.to_string(),
    }
}

/// Gives rustls what it takes of the records in `raw`, and processes them.
/// Returns how many bytes it took: it takes no more while the plaintext it
/// holds is not read.
fn feed(c: &mut ClientConnection, raw: &mut BytesMut) -> io::Result<usize> {
    let mut records = &raw[..];
    let taken = c.read_tls(&mut records)?;
    raw.advance(taken);
    c.process_new_packets().map_err(tls_error)?;
    Ok(taken)
}

/// Writes to a non-blocking socket: `WouldBlock` when it is full.
struct SocketWriter<'a>(&'a OwnedWriteHalf);

impl Write for SocketWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Wire {
    fn tls(&self) -> MutexGuard<'_, ClientConnection> {
        self.tls
            .as_ref()
            .expect("a TLS connection")
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what the socket takes now of `buf` (consumed as written) and
    /// of the TLS records waiting. Returns whether nothing is left.
    pub(crate) fn write_now(&self, buf: &mut BytesMut) -> io::Result<bool> {
        if self.tls.is_none() {
            while !buf.is_empty() {
                match self.half.try_write(buf) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::WriteZero,
                            "the socket took nothing",
                        ))
                    }
                    Ok(n) => buf.advance(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(true);
        }
        let mut c = self.tls();
        loop {
            if !buf.is_empty() {
                let taken = c.writer().write(buf)?;
                buf.advance(taken);
            }
            if !c.wants_write() {
                return Ok(buf.is_empty());
            }
            match c.write_tls(&mut SocketWriter(&self.half)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until the socket takes more.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        self.half.writable().await
    }

    /// Writes all of `buf`, waiting for the socket as needed.
    pub(crate) async fn write_all(&self, buf: &mut BytesMut) -> io::Result<()> {
        while !self.write_now(buf)? {
            self.writable().await?;
        }
        Ok(())
    }
}

impl AsyncRead for ReadSide {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let (half, wire, raw) = match self.get_mut() {
            ReadSide::Plain(half) => return Pin::new(half).poll_read(cx, buf),
            ReadSide::Tls { half, wire, raw } => (half, wire, raw),
        };
        loop {
            {
                let mut c = wire.tls();
                // Only what one record can hold is zeroed for each read.
                let room = buf.remaining().min(16 * 1024);
                match c.reader().read(buf.initialize_unfilled_to(room)) {
                    // Ok(0) is the server's close_notify: the end.
                    Ok(n) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
                if !raw.is_empty() {
                    let taken = feed(&mut c, raw)?;
                    // Records that answer the server's (a key update) go
                    // with the next write, or now if the socket takes them.
                    if c.wants_write() {
                        let _ = c.write_tls(&mut SocketWriter(&wire.half));
                    }
                    if taken > 0 {
                        continue;
                    }
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut *half).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(())); // the end, without close_notify
            }
            raw.extend_from_slice(read.filled());
        }
    }
}
