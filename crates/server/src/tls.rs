//! TLS for client connections: certificates and keys read from PEM files,
//! and the connection-side handling of rustls.
//!
//! A connection drives rustls's `ServerConnection` itself (records in and
//! out of the socket as it becomes ready), so TLS fits the connection's
//! readiness loop and plaintext connections are served exactly as before.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use baton_proto::pem::{read_certs, read_key, PemError};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// Where a server's TLS material is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, PEM, its own certificate first.
    pub cert: PathBuf,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// If set, clients must present a certificate that chains to one of
    /// these (PEM) certificate authorities.
    pub client_ca: Option<PathBuf>,
}

/// The crypto provider: ring.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why the server's TLS settings cannot be made from its files; names the
/// file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("{}: not a usable CA certificate: {source}", path.display())]
    NotCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("TLS settings: {0}")]
    Settings(#[source] rustls::Error),
    #[error("{}: {source}", path.display())]
    ClientVerifier {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("{} and {} do not make a certificate and its key: {source}", cert.display(), key.display())]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// Reads certificate authorities into a root store.
///
/// # Errors
/// A [`TlsError`] naming the file and what is wrong with it.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|source| TlsError::NotCa {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(roots)
}

/// Builds the server's TLS settings from its files: read anew each time, so
/// a reload (SIGHUP) picks up renewed certificates.
///
/// # Errors
/// A [`TlsError`] naming the file and what is wrong with it, or a key that
/// does not match the certificate.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Settings)?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let roots = Arc::new(read_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|source| TlsError::ClientVerifier {
                    path: ca.clone(),
                    source,
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::KeyMismatch {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    Ok(Arc::new(config))
}

/// Whether the first byte a client sent can start a TLS handshake (a TLS
/// record of type handshake, 22). A Baton handshake starts with its length,
/// whose first byte is 0.
pub(crate) fn looks_like_tls(first: u8) -> bool {
    first == 0x16
}

/// Writes TLS records to a non-blocking socket: `WouldBlock` when it is full.
pub(crate) struct SocketWriter<'a>(pub(crate) &'a tokio::net::TcpStream);

impl io::Write for SocketWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A TLS error as an I/O error, for the connection's error paths.
pub(crate) fn io_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}
