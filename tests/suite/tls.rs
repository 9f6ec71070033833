//! TLS between clients and the server, with certificates made in the test:
//! everything works over it, a plaintext client is told at once, client
//! certificates are checked when the server asks, and a reload replaces
//! the certificate for new connections.

use std::sync::Arc;
use std::time::Duration;

use baton::server::tls::{server_config, TlsFiles};
use baton::{Client, ClientTls, CreateMode, Error, EventKind, Lock};
use baton_testkit::pki::{make_pki, Pki};
use baton_testkit::*;
use bytes::Bytes;

fn files(pki: &Pki, client_ca: Option<&Pki>) -> TlsFiles {
    TlsFiles {
        cert: pki.server_cert.clone(),
        key: pki.server_key.clone(),
        client_ca: client_ca.map(|p| p.ca.clone()),
    }
}

async fn tls_server(pki: &Pki, client_ca: Option<&Pki>) -> TestServer {
    let config = baton::server::Config {
        tls: Some(server_config(&files(pki, client_ca)).unwrap()),
        ..fast_config()
    };
    TestServer::with_config(config).await
}

fn trusting(pki: &Pki) -> ClientTls {
    ClientTls::from_files(&pki.ca, None).unwrap()
}

async fn connect(addr: &str, tls: ClientTls) -> baton::Result<Client> {
    within(
        10,
        "a TLS connection",
        Client::builder(addr)
            .tls(tls)
            .session_timeout(Duration::from_secs(10))
            .connect(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_requests_watches_and_locks_work_over_tls_and_survive_a_cut() {
    let dir = scratch("tls-works");
    let pki = make_pki(dir.path(), "a");
    let server = tls_server(&pki, None).await;
    let proxy = Proxy::start(server.addr).await;
    let a = connect(&proxy.addr(), trusting(&pki)).await.unwrap();
    let b = connect(&server.addr(), trusting(&pki)).await.unwrap();

    // Pipelined requests, large values (many TLS records each) and a watch.
    a.create("/t", "", CreateMode::Persistent).await.unwrap();
    let big = Bytes::from(vec![b'z'; 900 * 1024]);
    a.create("/t/big", big.clone(), CreateMode::Persistent)
        .await
        .unwrap();
    let reads = (0..50).map(|_| b.get_data("/t/big"));
    for r in within(60, "50 large reads", join_in_order(reads)).await {
        assert_eq!(r.unwrap().0, big);
    }
    let paths: Vec<String> = (0..200).map(|i| format!("/t/n{i}")).collect();
    let creates = paths
        .iter()
        .map(|p| a.create(p, "x", CreateMode::Ephemeral));
    for r in within(30, "200 pipelined creates", join_in_order(creates)).await {
        r.unwrap();
    }
    let (_, _, watch) = b.get_data_watch("/t/n7").await.unwrap();

    // A lock handed from a to b.
    let held = Lock::new(&a, "/locks/tls").acquire().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { Lock::new(&b, "/locks/tls").acquire().await }
    });

    // Cut a's connection: it resumes over a new TLS connection, with its
    // ephemeral nodes and its lock.
    proxy.sever();
    wait_state(&a, baton::SessionState::Reconnected).await;
    a.set_data("/t/n7", "after the cut", None).await.unwrap();
    let event = within(10, "the watch", watch).await.unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);
    assert!(!held.is_lost());
    let first = held.token().get();
    held.release().await.unwrap();
    let next = within(10, "b's turn", waiting).await.unwrap().unwrap();
    assert!(next.token().get() > first);
    next.release().await.unwrap();
    a.close().await;
    b.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_plaintext_client_is_told_the_server_takes_tls_only() {
    let dir = scratch("tls-plain");
    let pki = make_pki(dir.path(), "a");
    let server = tls_server(&pki, None).await;
    let err = within(10, "the refusal", Client::connect(&server.addr()))
        .await
        .unwrap_err();
    match &err {
        Error::Connect { reason, .. } => {
            assert!(reason.contains("TLS connections only"), "{err}")
        }
        other => panic!("not a connect error: {other:?}"),
    }
    // The same for the status probe and a backup request.
    let err = baton::probe(&server.addr(), Duration::from_secs(10), None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("TLS connections only"), "{err}");
    let err = baton::backup(&server.addr(), Duration::from_secs(10), None, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("TLS connections only"), "{err}");
    // Over TLS both answer.
    let status = baton::probe(
        &server.addr(),
        Duration::from_secs(10),
        Some(&trusting(&pki)),
    )
    .await
    .unwrap();
    assert!(status.contains("\"role\":\"single\""), "{status}");
    server.stop().await;
}

#[tokio::test]
async fn a_tls_client_against_a_plaintext_server_fails_clearly() {
    let dir = scratch("tls-against-plain");
    let pki = make_pki(dir.path(), "a");
    let server = TestServer::start().await;
    let err = connect(&server.addr(), trusting(&pki)).await.unwrap_err();
    assert!(err.to_string().contains("TLS handshake failed"), "{err}");
    server.stop().await;
}

#[tokio::test]
async fn the_server_checks_the_certificate_and_the_client_checks_the_server() {
    let dir = scratch("tls-auth");
    let (ours, theirs) = (make_pki(dir.path(), "ours"), make_pki(dir.path(), "theirs"));
    let server = tls_server(&ours, Some(&ours)).await;
    let addr = server.addr();
    // No client certificate, or one from another authority: refused.
    assert!(connect(&addr, trusting(&ours)).await.is_err());
    let stranger =
        ClientTls::from_files(&ours.ca, Some((&theirs.client_cert, &theirs.client_key))).unwrap();
    assert!(connect(&addr, stranger).await.is_err());
    // A client that trusts another authority refuses the server.
    let err = connect(&addr, trusting(&theirs)).await.unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
    // The right certificate: served.
    let member =
        ClientTls::from_files(&ours.ca, Some((&ours.client_cert, &ours.client_key))).unwrap();
    let c = connect(&addr, member).await.unwrap();
    c.create("/in", "", CreateMode::Persistent).await.unwrap();
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_reload_gives_new_connections_the_new_certificate() {
    let dir = scratch("tls-reload");
    let (old, new) = (make_pki(dir.path(), "old"), make_pki(dir.path(), "new"));
    let server = tls_server(&old, None).await;
    let addr = server.addr();
    let before = connect(&addr, trusting(&old)).await.unwrap();
    assert!(connect(&addr, trusting(&new)).await.is_err());

    let renewed = server_config(&files(&new, None)).unwrap();
    assert!(server.handle.reload_tls(Arc::clone(&renewed)));
    let after = connect(&addr, trusting(&new)).await.unwrap();
    assert!(connect(&addr, trusting(&old)).await.is_err());
    // The connection made before goes on with the old certificate.
    before
        .create("/before", "", CreateMode::Persistent)
        .await
        .unwrap();
    after.get_data("/before").await.unwrap();

    // A plaintext server has nothing to reload.
    let plain = TestServer::start().await;
    assert!(!plain.handle.reload_tls(renewed));
    before.close().await;
    after.close().await;
    plain.stop().await;
    server.stop().await;
}

/// A client certificate valid for an identity's tls-client name proves
/// that identity without a token; its rights then apply. A certificate
/// the authority signed for another name proves nothing, and a token
/// still names its own identity.
#[tokio::test]
async fn a_client_certificate_proves_the_identity_it_names() {
    use crate::auth::identity;
    use baton::server::auth::Identities;
    let dir = scratch("tls-identity");
    let (ours, other) = (make_pki(dir.path(), "ours"), make_pki(dir.path(), "other"));
    let reader = identity("reader", "reader-token-0123456789", &[("/", &["read"])])
        .with_tls_name(&ours.client_name)
        .unwrap();
    let ops = identity("ops", "ops-token-0123456789", &[("/", &["admin"])]);
    let identities = Identities::new(vec![reader, ops]).unwrap();
    // The other authority's client certificate is trusted too, but no
    // identity names it.
    let both_cas = dir.path().join("both-ca.pem");
    let pem = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    std::fs::write(&both_cas, pem(&ours.ca) + &pem(&other.ca)).unwrap();
    let config = baton::server::Config {
        tls: Some(
            server_config(&TlsFiles {
                cert: ours.server_cert.clone(),
                key: ours.server_key.clone(),
                client_ca: Some(both_cas),
            })
            .unwrap(),
        ),
        identities: Some(Arc::new(identities)),
        ..fast_config()
    };
    let server = TestServer::with_config(config).await;
    let addr = server.addr();
    let with_cert = |pki: &Pki| {
        ClientTls::from_files(&ours.ca, Some((&pki.client_cert, &pki.client_key))).unwrap()
    };

    let reader = connect(&addr, with_cert(&ours)).await.unwrap();
    reader.get_data("/").await.unwrap();
    let refused = reader.create("/x", "", CreateMode::Persistent).await;
    assert!(
        matches!(refused, Err(Error::PermissionDenied(_))),
        "{refused:?}"
    );
    reader.close().await;

    // A certificate for a name no identity has: refused at the handshake.
    let err = connect(&addr, with_cert(&other)).await.unwrap_err();
    assert!(err.to_string().contains("tls-client"), "{err}");

    // A token names its identity, whatever the certificate.
    let ops = within(
        10,
        "a TLS connection with a token",
        Client::builder(&addr)
            .tls(with_cert(&ours))
            .token("ops-token-0123456789")
            .session_timeout(Duration::from_secs(10))
            .connect(),
    )
    .await
    .unwrap();
    ops.create("/x", "", CreateMode::Persistent).await.unwrap();
    ops.close().await;
    server.stop().await;
}
