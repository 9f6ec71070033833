//! What a server with a data directory keeps across restarts, and how it
//! treats a damaged log.

use std::time::Duration;

use baton::server::persist::{recover, PersistError};
use baton::server::{Config, Server, ServerError};
use baton::{CreateMode, Error, Lock, SessionState};
use baton_testkit::*;

/// Restarts a stopped server on the same address and directory.
async fn restart(addr: std::net::SocketAddr, config: Config) -> TestServer {
    TestServer::at(&addr.to_string(), config).await
}

#[tokio::test]
async fn nodes_data_versions_and_fences_survive_a_restart() {
    let dir = scratch("restart");
    let server = TestServer::with_config(durable_config(dir.path())).await;
    let addr = server.addr;
    let c = server.client().await;
    c.create("/app", "v1", CreateMode::Persistent)
        .await
        .unwrap();
    c.set_data("/app", "v2", None).await.unwrap();
    c.set_data_fenced("/app", "v3", 40).await.unwrap();
    c.create("/app/child", "x", CreateMode::Persistent)
        .await
        .unwrap();
    let before = c.exists("/app").await.unwrap().unwrap();
    c.close().await;
    server.stop().await;

    let server = restart(addr, durable_config(dir.path())).await;
    let c = server.client().await;
    let (data, stat) = c.get_data("/app").await.unwrap();
    assert_eq!(&data[..], b"v3");
    assert_eq!(stat, before);
    assert_eq!(c.get_children("/app").await.unwrap().0, ["child"]);
    // The fence held: a lower token is still refused.
    assert!(matches!(
        c.set_data_fenced("/app", "stale", 39).await,
        Err(Error::StaleFence(_))
    ));
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn sequence_numbers_and_lock_tokens_keep_growing_across_restarts() {
    let dir = scratch("tokens");
    let mut addr = None;
    let mut last = 0;
    for _ in 0..3 {
        let config = durable_config(dir.path());
        let server = match addr {
            None => TestServer::with_config(config).await,
            Some(a) => restart(a, config).await,
        };
        addr = Some(server.addr);
        let c = server.client().await;
        for _ in 0..3 {
            let guard = Lock::new(&c, "/locks/l").acquire().await.unwrap();
            assert!(guard.token().get() > last, "{} after {last}", guard.token());
            last = guard.token().get();
            guard.release().await.unwrap();
        }
        let created = c
            .create("/seq-", "", CreateMode::PersistentSequential)
            .await
            .unwrap();
        assert!(created.sequence.unwrap() > last);
        last = created.sequence.unwrap();
        c.close().await;
        server.stop().await;
    }
}

/// A lock queue whose next names were taken by hand still grants the lock,
/// and the log of those passed-over revisions recovers.
#[tokio::test]
async fn a_queue_with_squatted_names_still_grants_and_recovers() {
    let dir = scratch("squat");
    let server = TestServer::with_config(durable_config(dir.path())).await;
    let addr = server.addr;
    let c = server.client().await;
    c.create("/locks", "", CreateMode::Persistent)
        .await
        .unwrap();
    c.create("/locks/l", "", CreateMode::Persistent)
        .await
        .unwrap();
    let next = c.exists("/locks/l").await.unwrap().unwrap().czxid + 1;
    // The names the next revisions would give, with the prefix of the
    // enqueue below, created by someone else.
    let prefix = format!("lock-{:x}-squat-", c.session_id().0);
    for k in 0..4 {
        let name = format!("/locks/l/{prefix}{:010}", next + 4 + k);
        c.create(&name, "", CreateMode::Persistent).await.unwrap();
    }
    let joined = tokio::time::timeout(
        Duration::from_secs(5),
        c.enqueue(&format!("/locks/l/{prefix}"), "me"),
    )
    .await
    .expect("the enqueue answered")
    .expect("the enqueue passed over the taken names");
    let token = joined.node.sequence.unwrap();
    assert!(token >= next + 8, "token {token}");
    c.close().await;
    server.stop().await;

    let server = restart(addr, durable_config(dir.path())).await;
    let c = server.client().await;
    assert!(
        c.exists(&joined.node.path).await.unwrap().is_none(),
        "the ephemeral went with its session"
    );
    let created = c
        .create("/locks/l/after-", "", CreateMode::PersistentSequential)
        .await
        .unwrap();
    assert!(created.sequence.unwrap() > token);
    c.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_after_a_restart_and_keep_their_ephemerals() {
    let dir = scratch("sessions");
    let server = TestServer::with_config(durable_config(dir.path())).await;
    let addr = server.addr;
    let stays = server.client_with_timeout(Duration::from_secs(10)).await;
    let leaves = server.client_with_timeout(Duration::from_millis(500)).await;
    stays
        .create("/mine", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    leaves
        .create("/gone", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let guard = Lock::new(&stays, "/locks/held").acquire().await.unwrap();
    let session = stays.session_id();
    drop(leaves); // never comes back
    server.stop().await;

    let server = restart(addr, durable_config(dir.path())).await;
    // The client reconnects and resumes its session by itself.
    wait_state(&stays, SessionState::Reconnected).await;
    assert_eq!(stays.session_id(), session);
    assert!(stays.exists("/mine").await.unwrap().is_some());
    assert!(!guard.is_lost());
    let queue = Lock::new(&stays, "/locks/held").contenders().await.unwrap();
    assert_eq!(queue[0].node, guard.node());
    // The session that did not come back expires after its (fresh) timeout.
    let observer = server.client().await;
    eventually_async(10, "the silent session to expire", || async {
        observer.exists("/gone").await.unwrap().is_none()
    })
    .await;
    guard.release().await.unwrap();
    stays.close().await;
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn snapshots_replace_the_old_log_and_recovery_uses_them() {
    let dir = scratch("snapshots");
    let config = Config {
        snapshot_every_bytes: 4 * 1024,
        ..durable_config(dir.path())
    };
    let server = TestServer::with_config(config.clone()).await;
    let addr = server.addr;
    let c = server.client().await;
    for i in 0..400 {
        c.create(
            &format!("/n{i}"),
            format!("value {i}"),
            CreateMode::Persistent,
        )
        .await
        .unwrap();
    }
    let revision = server.stats().revision;
    c.close().await;
    server.stop().await;

    let files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let snapshots = files.iter().filter(|f| f.starts_with("snapshot-")).count();
    let segments = files.iter().filter(|f| f.starts_with("wal-")).count();
    assert!(snapshots >= 1, "{files:?}");
    assert!(snapshots <= 2, "old snapshots are removed: {files:?}");
    assert!(segments <= 3, "old log segments are removed: {files:?}");

    let (sm, recovery) = recover(dir.path()).unwrap();
    assert!(recovery.snapshot_revision > 0, "{recovery:?}");
    assert!(
        recovery.revision > revision,
        "the close came after: {recovery:?}"
    );
    assert_eq!(sm.node_count(), 401);
    let server = restart(addr, config).await;
    let c = server.client().await;
    for i in [0, 199, 399] {
        let (data, _) = c.get_data(&format!("/n{i}")).await.unwrap();
        assert_eq!(data, format!("value {i}").into_bytes());
    }
    c.close().await;
    server.stop().await;
}

/// Fills a directory's log with `n` creates and stops the server.
async fn write_log(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let server = TestServer::with_config(durable_config(dir)).await;
    let c = server.client().await;
    for i in 0..n {
        c.create(&format!("/r{i}"), "payload", CreateMode::Persistent)
            .await
            .unwrap();
    }
    c.close().await;
    server.stop().await;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("wal-"))
        .expect("a log segment")
}

#[tokio::test]
async fn a_torn_last_record_is_dropped_and_everything_before_it_kept() {
    let dir = scratch("torn");
    let log = write_log(dir.path(), 20).await;
    let len = std::fs::metadata(&log).unwrap().len();
    // Cut into the last record (the close of the session), as a crash in
    // the middle of a write would.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let (sm, recovery) = recover(dir.path()).unwrap();
    assert!(recovery.torn_bytes_dropped > 0, "{recovery:?}");
    for i in 0..20 {
        assert!(
            sm.node(&format!("/r{i}")).is_some(),
            "/r{i} was acknowledged"
        );
    }
    // The file was cut back to its last whole record, and the server starts.
    assert!(std::fs::metadata(&log).unwrap().len() < len - 5);
    let server = TestServer::with_config(durable_config(dir.path())).await;
    let c = server.client().await;
    assert!(c.exists("/r19").await.unwrap().is_some());
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_flipped_bit_inside_the_log_stops_the_server_and_changes_nothing() {
    let dir = scratch("bitflip");
    let log = write_log(dir.path(), 20).await;
    let mut bytes = std::fs::read(&log).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x04;
    std::fs::write(&log, &bytes).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = Server::new(listener, durable_config(dir.path()))
        .err()
        .expect("a damaged log must not start");
    match &err {
        ServerError::Persist(PersistError::Corrupt { file, offset, .. }) => {
            assert_eq!(file, &log);
            assert!(
                *offset <= middle as u64,
                "offset {offset}, flip at {middle}"
            );
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&log.display().to_string()), "{message}");
    assert!(message.contains("offset"), "{message}");
    assert_eq!(
        std::fs::read(&log).unwrap(),
        bytes,
        "nothing was overwritten"
    );
}

#[tokio::test]
async fn a_damaged_snapshot_stops_the_server() {
    let dir = scratch("badsnap");
    let config = Config {
        snapshot_every_bytes: 2 * 1024,
        ..durable_config(dir.path())
    };
    let server = TestServer::with_config(config.clone()).await;
    let c = server.client().await;
    for i in 0..200 {
        c.create(&format!("/s{i}"), "", CreateMode::Persistent)
            .await
            .unwrap();
    }
    c.close().await;
    server.stop().await;
    let snap = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("snapshot-") && name.ends_with(".snap")
        })
        .max()
        .expect("a snapshot");
    let mut bytes = std::fs::read(&snap).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x01;
    std::fs::write(&snap, &bytes).unwrap();
    match recover(dir.path()) {
        Err(PersistError::Corrupt { file, .. }) => assert_eq!(file, snap),
        other => panic!("{other:?}"),
    }
}

/// The data files whose names start with `prefix`, sorted.
fn files(dir: &std::path::Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    found.sort();
    found
}

/// Damage in a log segment whose every record a snapshot already holds (a
/// short record in an old segment, say) loses nothing: the server starts
/// and holds everything.
#[tokio::test]
async fn damage_in_a_segment_the_snapshot_covers_is_passed_over() {
    let dir = scratch("covered");
    let server = TestServer::with_config(durable_config(dir.path())).await;
    let addr = server.addr;
    let c = server.client().await;
    for i in 0..20 {
        c.create(&format!("/old{i}"), "x", CreateMode::Persistent)
            .await
            .unwrap();
    }
    c.close().await;
    server.stop().await;
    let old = files(dir.path(), "wal-").pop().expect("a segment");
    let old_bytes = std::fs::read(&old).unwrap();

    // A second run snapshots past everything the first segment holds.
    let config = Config {
        snapshot_every_bytes: 4 * 1024,
        ..durable_config(dir.path())
    };
    let server = restart(addr, config.clone()).await;
    let c = server.client().await;
    for i in 0..200 {
        c.create(&format!("/new{i}"), "y", CreateMode::Persistent)
            .await
            .unwrap();
    }
    eventually_async(10, "a snapshot", || async { server.stats().snapshots > 0 }).await;
    c.close().await;
    server.stop().await;
    // The old segment (removed once the snapshot was durable, or about to
    // be) is there, cut inside its last record.
    std::fs::write(&old, &old_bytes[..old_bytes.len() - 7]).unwrap();

    let (_, recovery) = recover(dir.path()).unwrap();
    assert_eq!(recovery.covered_damage, 1, "{recovery:?}");
    let server = restart(addr, config).await;
    let c = server.client().await;
    for path in ["/old0", "/old19", "/new0", "/new199"] {
        assert!(c.exists(path).await.unwrap().is_some(), "{path}");
    }
    c.close().await;
    server.stop().await;
}

/// Under --fsync never a snapshot replaces older log segments and
/// snapshots, so it is synced (file and directory) before they go.
#[tokio::test]
async fn snapshots_are_synced_under_fsync_never_too() {
    let dir = scratch("never-snap");
    let config = Config {
        fsync: baton::server::persist::FsyncPolicy::Never,
        snapshot_every_bytes: 4 * 1024,
        ..durable_config(dir.path())
    };
    let server = TestServer::with_config(config).await;
    let c = server.client().await;
    for i in 0..200 {
        c.create(&format!("/n{i}"), "v", CreateMode::Persistent)
            .await
            .unwrap();
    }
    eventually_async(10, "a snapshot", || async { server.stats().snapshots > 0 }).await;
    let stats = server.stats();
    assert!(
        stats.syncs >= 2 * stats.snapshots,
        "each snapshot syncs its file and the directory: {stats:?}"
    );
    c.close().await;
    server.stop().await;
}

/// A session's last reply is durable state: a change whose reply was lost
/// when the server went down is answered, not applied again, by the server
/// that recovered it, from its log and from its snapshot alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_sent_again_after_a_restart_is_applied_once() {
    for snapshot_every_bytes in [64 << 20, 1] {
        let dir = scratch("dedup-restart");
        let config = Config {
            snapshot_every_bytes,
            ..durable_config(dir.path())
        };
        let server = TestServer::with_config(config.clone()).await;
        let addr = server.addr;
        let proxy = Proxy::start(addr).await;
        let client = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
        client
            .create("/r", "", CreateMode::Persistent)
            .await
            .unwrap();
        proxy.hold_replies();
        let mut call = Box::pin(client.create("/r/n-", "", CreateMode::PersistentSequential));
        assert!(futures::poll!(&mut call).is_pending());
        eventually(10, "the server to apply the create", || {
            server.stats().nodes == 3
        })
        .await;
        if snapshot_every_bytes == 1 {
            // The recovered server starts from a snapshot that holds the
            // create (revision 3) and its reply: other writes go on until
            // one is taken.
            let other = server.client().await;
            let newest = || {
                std::fs::read_dir(dir.path())
                    .unwrap()
                    .filter_map(|e| {
                        let name = e.unwrap().file_name().to_string_lossy().into_owned();
                        name.strip_prefix("snapshot-")?
                            .strip_suffix(".snap")?
                            .parse::<u64>()
                            .ok()
                    })
                    .max()
                    .unwrap_or(0)
            };
            within(10, "a snapshot of the create", async {
                while newest() < 3 {
                    other.set_data("/r", "x", None).await.unwrap();
                }
            })
            .await;
            other.close().await;
        }
        server.stop().await;
        proxy.release();
        let server = restart(addr, config).await;
        let created = within(10, "the create in flight", call).await.unwrap();
        let (children, _) = client.get_children("/r").await.unwrap();
        assert_eq!(children.len(), 1, "applied once: {children:?}");
        assert_eq!(created.path, format!("/r/{}", children[0]));
        client.close().await;
        server.stop().await;
    }
}

/// The counters that split a durable change's path (docs/protocol.md 5.12)
/// account for what happened: every acknowledged change went through a
/// synced log batch, and the replies that waited for durability were sent.
#[tokio::test]
async fn the_durable_path_counters_account_for_each_write() {
    let dir = scratch("split");
    let server = TestServer::with_config(durable_config(dir.path())).await;
    let c = server.client().await;
    let before = server.stats();
    for i in 0..20 {
        c.create(&format!("/s{i}"), "v", CreateMode::Persistent)
            .await
            .unwrap();
    }
    let after = server.stats();
    let batches = after.log_batches - before.log_batches;
    // One writer waiting for each reply: at most one batch per change (the
    // writer may also have synced the session's opening on its own).
    assert!((1..=21).contains(&batches), "{batches} batches");
    assert!(after.log_batches_woken - before.log_batches_woken <= batches);
    assert!(after.log_sync_ns > before.log_sync_ns, "{after:?}");
    assert!(after.log_write_ns > before.log_write_ns, "{after:?}");
    assert!(after.log_wait_ns >= after.log_wake_ns, "{after:?}");
    assert!(
        after.syncs - before.syncs >= batches,
        "each batch is synced"
    );
    // Replies wait for their change to be durable (unless the log was
    // faster than the connection's next look), then go out.
    let held = after.durable_sends - before.durable_sends;
    assert!((1..=20).contains(&held), "{held} sends held for durability");
    assert!(after.durable_send_ns > before.durable_send_ns);
    assert!(after.handle_ns > before.handle_ns);
    c.close().await;
    server.stop().await;
}

/// Under --fsync never the changes a connection's requests make are written
/// by that connection once it has handled what it read, in one write, not
/// one write each under the core's lock; each is still written before it is
/// acknowledged, and a restart finds them all.
#[tokio::test]
async fn pipelined_changes_under_fsync_never_share_a_write() {
    let dir = scratch("never-batch");
    let config = Config {
        fsync: baton::server::persist::FsyncPolicy::Never,
        ..durable_config(dir.path())
    };
    let server = TestServer::with_config(config.clone()).await;
    let c = server.client().await;
    let before = server.stats();
    let creates = (0..200).map(|i| {
        let c = c.clone();
        async move {
            c.create(&format!("/p{i}"), "v", CreateMode::Persistent)
                .await
        }
    });
    for created in futures::future::join_all(creates).await {
        created.unwrap();
    }
    let after = server.stats();
    let batches = after.log_batches - before.log_batches;
    assert!(
        (1..=100).contains(&batches),
        "200 pipelined creates took {batches} writes"
    );
    assert_eq!(after.log_sync_ns, before.log_sync_ns, "never synced");
    c.close().await;
    let addr = server.addr();
    server.stop().await;
    let server = restart(addr.parse().unwrap(), config).await;
    assert_eq!(
        server.stats().nodes,
        201,
        "every acknowledged create survived"
    );
    server.stop().await;
}
