//! Certificates and keys from PEM files, for TLS on both sides.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a PEM file does not give what was asked of it; names the file.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("cannot read certificates from {}: {source}", path.display())]
    CertificatesUnreadable {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{}: not a PEM certificate file: {source}", path.display())]
    NotCertificates {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{} holds no certificate (expected PEM blocks `-----BEGIN CERTIFICATE-----`)", path.display())]
    NoCertificate { path: PathBuf },
    #[error("cannot read a private key from {}: {source}", path.display())]
    KeyUnreadable {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
}

/// Reads a certificate chain from a PEM file.
///
/// # Errors
/// A [`PemError`] naming the file and what is wrong with it.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|source| PemError::CertificatesUnreadable {
            path: path.to_owned(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| PemError::NotCertificates {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Reads a private key from a PEM file.
///
/// # Errors
/// A [`PemError`] naming the file and what is wrong with it.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| PemError::KeyUnreadable {
        path: path.to_owned(),
        source,
    })
}
