//! TLS between members, and the stream a peer connection runs on.

use std::sync::Arc;

use baton_server::tls::TlsError;

use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// A connection to or from another member: plain TCP, or TLS over it.
pub(super) trait PeerIo:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin> PeerIo for T {}

pub(super) type Conn = Framed<Box<dyn PeerIo>, LengthDelimitedCodec>;

/// Mutual TLS between members: each presents its certificate, and takes
/// only certificates that chain to the members' authority. Cheap to clone.
#[derive(Clone)]
pub struct PeerTls {
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
    pub(super) connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls(..)")
    }
}

impl PeerTls {
    /// Settings from PEM files: this member's certificate and key (its
    /// certificate must name the host of its peer address, and allow both
    /// server and client authentication) and the authority every member's
    /// certificate chains to.
    ///
    /// # Errors
    /// A [`TlsError`] naming the file and what is wrong with it.
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> Result<PeerTls, TlsError> {
        use rustls::{ClientConfig, ServerConfig};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(baton_server::tls::read_roots(ca)?);
        let certs = baton_proto::pem::read_certs(cert)?;
        let key_path = key;
        let key = baton_proto::pem::read_key(key)?;
        let mismatch = |source| TlsError::KeyMismatch {
            cert: cert.to_owned(),
            key: key_path.to_owned(),
            source,
        };
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|source| TlsError::ClientVerifier {
            path: ca.to_owned(),
            source,
        })?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Settings)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(mismatch)?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Settings)?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(mismatch)?;
        Ok(PeerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }
}

/// A peer address whose host is neither a DNS name nor an IP address.
#[derive(Debug, thiserror::Error)]
#[error("{host} is not a name TLS can check: {source}")]
pub(super) struct NotAName {
    host: String,
    #[source]
    source: rustls::pki_types::InvalidDnsNameError,
}

/// The name a member at `addr` must carry in its certificate: the host.
pub(super) fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, NotAName> {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|source| NotAName {
        host: host.to_owned(),
        source,
    })
}
