//! Identities and rights: a client must name an identity with its token,
//! and each request needs that identity's rights on its path, so that one
//! team cannot read, release or fence another's locks.

use std::sync::Arc;
use std::time::Duration;

use baton::server::auth::{Identities, Identity, Rights};
use baton::{Client, CreateMode, Error, Lock};
use baton_testkit::*;

const ADMIN: &str = "admin-token-0123456789abcdef";
const TEAM_A: &str = "team-a-token-0123456789abcdef";
const TEAM_B: &str = "team-b-token-0123456789abcdef";
const READER: &str = "reader-token-0123456789abcdef";

fn rights(names: &[&str]) -> Rights {
    names
        .iter()
        .map(|n| Rights::parse(n).unwrap())
        .fold(Rights::default(), Rights::union_of)
}

/// An identity named `name`, with `token`, and the rights each rule gives
/// on its path prefix.
pub(crate) fn identity(name: &str, token: &str, rules: &[(&str, &[&str])]) -> Identity {
    let rules = rules
        .iter()
        .map(|(prefix, names)| (prefix.to_string(), rights(names)))
        .collect();
    Identity::new(
        name.into(),
        baton::proto::Token(token.to_owned().into()),
        rules,
    )
}

async fn guarded_server() -> TestServer {
    let identities = Identities::new(vec![
        identity("admin", ADMIN, &[("/", &["admin"])]),
        identity(
            "team-a",
            TEAM_A,
            &[
                ("/locks/a", &["read", "lock", "fence"]),
                ("/data/a", &["read", "write", "fence"]),
            ],
        ),
        identity("team-b", TEAM_B, &[("/locks/b", &["read", "lock"])]),
        identity("reader", READER, &[("/", &["read"])]),
    ])
    .unwrap();
    let config = baton::server::Config {
        identities: Some(Arc::new(identities)),
        ..fast_config()
    };
    TestServer::with_config(config).await
}

async fn as_identity(server: &TestServer, token: &str) -> Client {
    within(
        10,
        "a session",
        Client::builder(&server.addr())
            .token(token.to_owned())
            .session_timeout(Duration::from_secs(10))
            .connect(),
    )
    .await
    .unwrap()
}

fn denied(result: baton::Result<impl std::fmt::Debug>, right: &str, path: &str) {
    match result {
        Err(Error::PermissionDenied(message)) => assert!(
            message.contains(&format!("no {right} right on {path}")),
            "{message}"
        ),
        other => panic!("expected permission denied ({right} on {path}), got {other:?}"),
    }
}

#[tokio::test]
async fn a_client_without_a_known_token_is_refused_with_a_clear_error() {
    let server = guarded_server().await;
    let err = within(10, "the refusal", Client::connect(&server.addr()))
        .await
        .unwrap_err();
    match &err {
        Error::AuthenticationFailed(m) => assert!(m.contains("connect with a token"), "{m}"),
        other => panic!("{other:?}"),
    }
    let wrong = Client::builder(&server.addr())
        .token("not-a-token-of-this-server".to_owned())
        .connect();
    match within(10, "the refusal", wrong).await.unwrap_err() {
        Error::AuthenticationFailed(m) => assert!(m.contains("names no identity"), "{m}"),
        other => panic!("{other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn a_read_only_identity_cannot_join_a_lock_write_or_fence() {
    let server = guarded_server().await;
    let admin = as_identity(&server, ADMIN).await;
    admin
        .create("/locks", "", CreateMode::Persistent)
        .await
        .unwrap();
    admin
        .create("/locks/a", "", CreateMode::Persistent)
        .await
        .unwrap();
    admin
        .create("/locks/a/guarded", "v", CreateMode::Persistent)
        .await
        .unwrap();

    let reader = as_identity(&server, READER).await;
    assert_eq!(reader.get_data("/locks/a/guarded").await.unwrap().0, "v");
    denied(
        reader.enqueue("/locks/a/lock-", "").await,
        "lock",
        "/locks/a/lock-",
    );
    denied(
        reader
            .create("/locks/a/x", "", CreateMode::Persistent)
            .await,
        "write",
        "/locks/a/x",
    );
    denied(
        reader.set_data_fenced("/locks/a/guarded", "w", 1).await,
        "fence",
        "/locks/a/guarded",
    );
    denied(reader.server_stats().await, "admin", "/");
    // Refusals leave the session and the data alone.
    assert_eq!(reader.get_data("/locks/a/guarded").await.unwrap().0, "v");
    assert!(admin.server_stats().await.is_ok());
    reader.close().await;
    admin.close().await;
    server.stop().await;
}

#[tokio::test]
async fn one_team_cannot_read_release_or_fence_another_teams_lock() {
    let server = guarded_server().await;
    let admin = as_identity(&server, ADMIN).await;
    for path in ["/locks", "/locks/a", "/locks/b", "/data", "/data/a"] {
        admin
            .create(path, "", CreateMode::Persistent)
            .await
            .unwrap();
    }
    let a = as_identity(&server, TEAM_A).await;
    let b = as_identity(&server, TEAM_B).await;

    // Each team takes its own lock and releases it.
    let held_b = Lock::new(&b, "/locks/b").acquire().await.unwrap();
    let held_a = Lock::new(&a, "/locks/a").acquire().await.unwrap();
    // Team a cannot see team b's queue, release its holder, or write there.
    denied(a.get_children("/locks/b").await, "read", "/locks/b");
    denied(a.delete(held_b.node(), None).await, "write", held_b.node());
    denied(
        a.set_data_fenced("/locks/b", "x", held_a.token().get())
            .await,
        "fence",
        "/locks/b",
    );
    denied(
        Lock::new(&a, "/locks/b").try_acquire().await,
        "lock",
        "/locks/b/",
    );
    assert!(!held_b.is_lost());
    // Team a fences its own data with its own token.
    a.create("/data/a/report", "", CreateMode::Persistent)
        .await
        .unwrap();
    a.set_data_fenced("/data/a/report", "v1", held_a.token().get())
        .await
        .unwrap();
    held_a.release().await.unwrap();
    held_b.release().await.unwrap();
    a.close().await;
    b.close().await;
    admin.close().await;
    server.stop().await;
}

#[tokio::test]
async fn backups_need_the_admin_right_and_the_probe_names_no_lock() {
    let server = guarded_server().await;
    let admin = as_identity(&server, ADMIN).await;
    admin
        .create("/locks", "", CreateMode::Persistent)
        .await
        .unwrap();
    let _held = Lock::new(&admin, "/locks/secret").acquire().await.unwrap();
    let limit = Duration::from_secs(10);
    for token in [None, Some(READER)] {
        let err = baton::backup(&server.addr(), limit, None, token.map(str::as_bytes))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("permission denied"), "{err}");
        // A refusal for rights, not a protocol error.
        assert!(matches!(err, baton::Error::PermissionDenied(_)), "{err:?}");
    }
    let backup = baton::backup(&server.addr(), limit, None, Some(ADMIN.as_bytes()))
        .await
        .unwrap();
    assert!(backup.nodes >= 3);
    let status = baton::probe(&server.addr(), limit, None).await.unwrap();
    assert!(!status.contains("/locks/secret"), "{status}");
    admin.close().await;
    server.stop().await;
}

/// The longest token an identity may have works for every first frame that
/// carries one: a session's handshake, a status probe and a backup request.
#[tokio::test]
async fn the_longest_token_opens_a_session_a_probe_and_a_backup() {
    let longest = "t".repeat(baton::proto::handshake::MAX_TOKEN);
    let identities =
        Identities::new(vec![identity("long", &longest, &[("/", &["admin"])])]).unwrap();
    let server = TestServer::with_config(baton::server::Config {
        identities: Some(Arc::new(identities)),
        ..fast_config()
    })
    .await;
    let client = as_identity(&server, &longest).await;
    client
        .create("/locks", "", CreateMode::Persistent)
        .await
        .unwrap();
    let _held = Lock::new(&client, "/locks/long").acquire().await.unwrap();
    let limit = Duration::from_secs(10);
    let status = baton::probe_as(&server.addr(), limit, None, Some(longest.as_bytes()))
        .await
        .unwrap();
    assert!(status.contains("/locks/long"), "{status}");
    let backup = baton::backup(&server.addr(), limit, None, Some(longest.as_bytes()))
        .await
        .unwrap();
    assert!(backup.nodes >= 2);
    client.close().await;
    server.stop().await;
}

/// A client of another protocol version is told so, not that its token is
/// missing: the version decides how the rest of its handshake reads.
#[tokio::test]
async fn another_protocol_version_is_refused_for_its_version() {
    use baton::proto::{ConnectRequest, ErrorCode, PROTOCOL_VERSION};
    let server = guarded_server().await;
    let mut raw = Raw::connect(&server.addr()).await;
    let request = ConnectRequest {
        version: PROTOCOL_VERSION + 1,
        ..ConnectRequest::new(1_000)
    };
    let (code, _) = raw.handshake(&request).await.result.unwrap_err();
    assert_eq!(code, ErrorCode::UnsupportedVersion);
    server.stop().await;
}

/// Pins: a lock whose node is missing, and which its identity may not
/// create, says which node is missing and what to do; once an identity
/// that may has made it, the lock is taken.
#[tokio::test]
async fn a_lock_whose_node_an_identity_may_not_create_says_what_to_do() {
    let server = guarded_server().await;
    let team_a = as_identity(&server, TEAM_A).await;
    let err = Lock::new(&team_a, "/locks/a/job")
        .acquire()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, baton::Error::PermissionDenied(_)), "{err:?}");
    assert!(
        text.contains("/locks") && text.contains("does not exist") && text.contains("baton create"),
        "{text}"
    );
    let admin = as_identity(&server, ADMIN).await;
    admin
        .create("/locks", "", CreateMode::Persistent)
        .await
        .unwrap();
    admin
        .create("/locks/a", "", CreateMode::Persistent)
        .await
        .unwrap();
    // Creating /locks/a/job needs write on /locks/a, which team-a (read,
    // lock, fence) lacks: the admin makes it, as the message says.
    admin
        .create("/locks/a/job", "", CreateMode::Persistent)
        .await
        .unwrap();
    let guard = Lock::new(&team_a, "/locks/a/job").acquire().await.unwrap();
    guard.release().await.unwrap();
    team_a.close().await;
    admin.close().await;
    server.stop().await;
}
