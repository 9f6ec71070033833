//! Certificates made for a test with rcgen: a certificate authority, a
//! server certificate for 127.0.0.1 and localhost, and a client certificate,
//! as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Where one authority's files are.
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// The DNS name the client certificate is valid for
    /// (`client.NAME.test`), what an identity's tls-client names.
    pub client_name: String,
}

/// Makes an authority named `name` and its certificates in `dir`.
pub fn make_pki(dir: &Path, name: &str) -> Pki {
    std::fs::create_dir_all(dir).unwrap();
    let write = |file: &str, text: String| {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} test authority"));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = params.self_signed(&ca_key).unwrap();

    let leaf = |names: Vec<String>, purposes: Vec<ExtendedKeyUsagePurpose>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} {purposes:?}"));
        params.extended_key_usages = purposes;
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    // A server's certificate also serves a cluster member, which presents it
    // to the other members as a client too.
    let (server_cert, server_key) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let client_name = format!("client.{name}.test");
    let (client_cert, client_key) = leaf(
        vec![client_name.clone()],
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    );
    Pki {
        ca: write("ca.pem", ca.pem()),
        server_cert: write("server.pem", server_cert),
        server_key: write("server.key", server_key),
        client_cert: write("client.pem", client_cert),
        client_key: write("client.key", client_key),
        client_name,
    }
}
