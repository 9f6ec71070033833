//! Identities and TLS apply to ZooKeeper clients: `addAuth("digest",
//! "NAME:TOKEN")` or a client certificate names a Baton identity, whose
//! rights each request needs; with a certificate, the ZooKeeper port takes
//! TLS only.

use std::sync::Arc;
use std::time::Duration;

use baton::server::auth::{Identities, Identity};
use baton::server::tls::{server_config, TlsFiles};
use baton_testkit::pki::make_pki;
use baton_testkit::{fast_config, scratch, within};
use baton_zk::{ConnectRequest, ConnectResponse};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use zookeeper_client as zk;

use super::{open, zk_addr, zk_server_with};

fn identity(name: &str, token: &str, prefix: &str, rights: &[&str]) -> Identity {
    crate::auth::identity(name, token, &[(prefix, rights)])
}

#[tokio::test]
async fn digest_credentials_name_identities_and_their_rights_apply() {
    let identities = Identities::new(vec![
        identity("ops", "ops-token-0123456789", "/", &["admin"]),
        identity("viewer", "viewer-token-0123456789", "/app", &["read"]),
    ])
    .unwrap();
    let server = zk_server_with(baton::server::Config {
        identities: Some(Arc::new(identities)),
        ..fast_config()
    })
    .await;
    let addr = zk_addr(&server).to_string();
    let connect = |auth: Option<&'static [u8]>| {
        let addr = addr.clone();
        async move {
            let mut connector =
                zk::Client::connector().with_session_timeout(Duration::from_secs(10));
            if let Some(auth) = auth {
                connector = connector.with_auth("digest", auth);
            }
            within(10, "a ZooKeeper session", connector.connect(&addr)).await
        }
    };

    // Not authenticated: every request is refused.
    let anonymous = connect(None).await.unwrap();
    assert!(matches!(
        anonymous.get_data("/").await,
        Err(zk::Error::NoAuth)
    ));
    // A wrong token fails the authentication.
    let wrong = anonymous.auth("digest", b"ops:not-the-token").await;
    assert!(matches!(wrong, Err(zk::Error::AuthFailed)), "{wrong:?}");

    let ops = connect(Some(b"ops:ops-token-0123456789")).await.unwrap();
    ops.create("/app", b"v", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let users = ops.list_auth_users().await.unwrap();
    assert!(
        users
            .iter()
            .any(|u| u.scheme() == "digest" && u.user() == "ops"),
        "{users:?}"
    );

    let viewer = connect(Some(b"viewer:viewer-token-0123456789"))
        .await
        .unwrap();
    assert_eq!(viewer.get_data("/app").await.unwrap().0, b"v");
    assert!(matches!(
        viewer.set_data("/app", b"no", None).await,
        Err(zk::Error::NoAuth)
    ));
    assert!(matches!(
        viewer
            .create("/app/x", b"", &open(zk::CreateMode::Persistent))
            .await,
        Err(zk::Error::NoAuth)
    ));
    // Outside its prefix it reads nothing, whether answered by the core or
    // from the state.
    ops.create("/other", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    assert!(matches!(
        viewer.get_data("/other").await,
        Err(zk::Error::NoAuth)
    ));
    assert!(matches!(
        viewer.get_acl("/other").await,
        Err(zk::Error::NoAuth)
    ));
    assert!(matches!(
        viewer.count_descendants_number("/other").await,
        Err(zk::Error::NoAuth)
    ));
    server.stop().await;
}

/// A ZooKeeper connect request over `stream`; the connect response, if
/// one comes.
async fn connect_over<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> Option<ConnectResponse> {
    let mut buf = BytesMut::new();
    ConnectRequest {
        protocol_version: 0,
        last_zxid_seen: 0,
        timeout_ms: 10_000,
        session_id: 0,
        passwd: Bytes::from_static(&[0; 16]),
        read_only: Some(false),
    }
    .encode(&mut buf);
    stream.write_all(&buf).await.ok()?;
    stream.flush().await.ok()?;
    let len = stream.read_u32().await.ok()?;
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await.ok()?;
    ConnectResponse::decode(&Bytes::from(body)).ok()
}

#[tokio::test]
async fn with_a_certificate_the_zookeeper_port_takes_tls_only() {
    let dir = scratch("zk-tls");
    let pki = make_pki(dir.path(), "zk");
    let tls = server_config(&TlsFiles {
        cert: pki.server_cert.clone(),
        key: pki.server_key.clone(),
        client_ca: None,
    })
    .unwrap();
    let server = zk_server_with(baton::server::Config {
        tls: Some(tls),
        ..fast_config()
    })
    .await;
    let addr = zk_addr(&server);

    let mut roots = rustls::RootCertStore::empty();
    for cert in baton::proto::pem::read_certs(&pki.ca).unwrap() {
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut secure = within(
        10,
        "the TLS handshake",
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .unwrap();
    let granted = within(10, "a connect response over TLS", connect_over(&mut secure))
        .await
        .expect("a session over TLS");
    assert!(
        granted.timeout_ms > 0 && granted.session_id != 0,
        "{granted:?}"
    );

    // A plaintext client is closed without a session.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    let answer = within(
        10,
        "the plaintext client to be closed",
        connect_over(&mut plain),
    )
    .await;
    assert!(
        answer.is_none(),
        "a plaintext client was answered: {answer:?}"
    );
    server.stop().await;
}

/// Sends `request` over `stream` and reads its reply: the header's error
/// code and the body.
async fn call_over<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    xid: i32,
    request: baton_zk::Request,
) -> (i32, Bytes) {
    let mut buf = BytesMut::new();
    request.encode(xid, &mut buf);
    stream.write_all(&buf).await.unwrap();
    stream.flush().await.unwrap();
    let len = within(10, "a reply", stream.read_u32()).await.unwrap();
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await.unwrap();
    let body = Bytes::from(body);
    let mut r = baton_zk::jute::JuteReader::new(&body);
    let header = baton_zk::ReplyHeader::decode(&mut r).unwrap();
    assert_eq!(header.xid, xid);
    (header.err, body.slice(baton_zk::ReplyHeader::LEN..))
}

/// With mutual TLS, a client certificate valid for an identity's
/// tls-client name proves that identity to a ZooKeeper client, as
/// ZooKeeper's x509 authentication does: no addAuth, the identity's rights
/// apply, whoAmI names it, and `x509:NAME` in an ACL names it.
#[tokio::test]
async fn a_client_certificate_proves_an_identity_to_zookeeper_clients() {
    use baton_zk::codes::{err, mode, op};
    use baton_zk::request::Create;
    let dir = scratch("zk-tls-identity");
    let pki = make_pki(dir.path(), "zkid");
    let writer = identity(
        "writer",
        "writer-token-0123456789",
        "/app",
        &["read", "write"],
    )
    .with_tls_name(&pki.client_name)
    .unwrap();
    let ops = identity("ops", "ops-token-0123456789", "/", &["admin"]);
    let tls = server_config(&TlsFiles {
        cert: pki.server_cert.clone(),
        key: pki.server_key.clone(),
        client_ca: Some(pki.ca.clone()),
    })
    .unwrap();
    let server = zk_server_with(baton::server::Config {
        tls: Some(tls),
        identities: Some(Arc::new(Identities::new(vec![writer, ops]).unwrap())),
        ..fast_config()
    })
    .await;

    let mut roots = rustls::RootCertStore::empty();
    for cert in baton::proto::pem::read_certs(&pki.ca).unwrap() {
        roots.add(cert).unwrap();
    }
    let certs = baton::proto::pem::read_certs(&pki.client_cert).unwrap();
    let key = baton::proto::pem::read_key(&pki.client_key).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)
    .unwrap();
    let tcp = TcpStream::connect(zk_addr(&server)).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = within(
        10,
        "the TLS handshake",
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .unwrap();
    within(10, "a connect response", connect_over(&mut s))
        .await
        .expect("a session over mutual TLS");

    let create = |path: &str, acl: Vec<baton_zk::Acl>| {
        baton_zk::Request::Create(Create {
            path: path.into(),
            data: Bytes::new(),
            acl,
            flags: mode::PERSISTENT,
            ttl: None,
            op: op::CREATE,
        })
    };
    // The writer's rights, without any addAuth.
    let (code, _) = call_over(&mut s, 1, create("/app", vec![baton_zk::Acl::open()])).await;
    assert_eq!(code, err::OK);
    let (code, _) = call_over(&mut s, 2, create("/elsewhere", vec![baton_zk::Acl::open()])).await;
    assert_eq!(code, err::NO_AUTH, "no right outside /app");
    // whoAmI names the identity its certificate proved.
    let (code, body) = call_over(&mut s, 3, baton_zk::Request::WhoAmI).await;
    assert_eq!(code, err::OK);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("x509") && text.contains("writer"), "{text:?}");
    // `auth` names it in an ACL, as x509:writer.
    let auth = baton_zk::Acl {
        perms: 31,
        scheme: "auth".into(),
        id: String::new(),
    };
    let (code, _) = call_over(&mut s, 4, create("/app/mine", vec![auth])).await;
    assert_eq!(code, err::OK);
    let (code, body) = call_over(
        &mut s,
        5,
        baton_zk::Request::GetAcl {
            path: "/app/mine".into(),
        },
    )
    .await;
    assert_eq!(code, err::OK);
    let mut r = baton_zk::jute::JuteReader::new(&body);
    let acl = baton_zk::Acl::decode_list(&mut r).unwrap();
    assert_eq!(
        acl.iter()
            .map(|a| (a.perms, a.scheme.as_str(), a.id.as_str()))
            .collect::<Vec<_>>(),
        [(31, "x509", "writer")]
    );
    server.stop().await;
}
