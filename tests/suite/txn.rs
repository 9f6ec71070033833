//! Transactions over the wire: all or none, fences only rise inside them,
//! answered once across a cut connection, and their limits refused with
//! typed errors.

use std::sync::Arc;
use std::time::Duration;

use baton::proto::{Check, ErrorCode, Reply, Request, TxnOp, TxnResult, MAX_TXN_OPS};
use baton::{Client, CreateMode, Error, EventKind};
use baton_testkit::*;
use bytes::Bytes;

fn failed_at(result: baton::Result<Vec<TxnResult>>) -> (u32, Error) {
    match result {
        Err(Error::TxnFailed { index, error }) => (index, *error),
        other => panic!("expected a failed transaction, got {other:?}"),
    }
}

#[tokio::test]
async fn a_transaction_commits_whole_and_its_events_fire_once() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let watcher = server.client().await;
    c.create("/jobs", "", CreateMode::Persistent).await.unwrap();
    c.create("/jobs/42", "todo", CreateMode::Persistent)
        .await
        .unwrap();
    let (_, _, changed) = watcher.get_data_watch("/jobs/42").await.unwrap();
    let results = c
        .txn()
        .check_version("/jobs/42", 0)
        .set_data("/jobs/42", "done", Some(0))
        .create("/jobs/log-", "42 done", CreateMode::PersistentSequential)
        .check_absent("/jobs/43")
        .commit()
        .await
        .unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0], TxnResult::Checked);
    let TxnResult::DataSet(stat) = &results[1] else {
        panic!("{results:?}")
    };
    assert_eq!(stat.version, 1);
    let TxnResult::Created { path, sequence, .. } = &results[2] else {
        panic!("{results:?}")
    };
    assert_eq!(*path, format!("/jobs/log-{:010}", sequence.unwrap()));
    let event = within(10, "the data watch", changed.changed())
        .await
        .unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);
    let (data, _) = c.get_data("/jobs/42").await.unwrap();
    assert_eq!(&data[..], b"done");
    c.close().await;
    watcher.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_transaction_that_fails_in_its_last_operation_changes_nothing() {
    let server = TestServer::start().await;
    let c = server.client().await;
    c.create("/q", "", CreateMode::Persistent).await.unwrap();
    c.create("/f", "v0", CreateMode::Persistent).await.unwrap();
    c.set_data_fenced("/f", "v1", 10).await.unwrap();
    let before = c
        .create("/q/n-", "", CreateMode::EphemeralSequential)
        .await
        .unwrap();
    let (index, error) = failed_at(
        c.txn()
            .create("/q/n-", "", CreateMode::EphemeralSequential)
            .set_data_fenced("/f", "v2", 20)
            .create("/new", "", CreateMode::Persistent)
            .check_version("/f", 99)
            .commit()
            .await,
    );
    assert_eq!(index, 3);
    assert!(matches!(error, Error::BadVersion(_)), "{error:?}");
    // No node, no data, no fence: a token between the old fence and the
    // one the transaction carried is still accepted.
    assert!(c.exists("/new").await.unwrap().is_none());
    let (data, _) = c.get_data("/f").await.unwrap();
    assert_eq!(&data[..], b"v1");
    c.set_data_fenced("/f", "v3", 15).await.unwrap();
    // No sequence number was spent: the next one follows the revision
    // after the last change (the fenced write above).
    let (children, _) = c.get_children("/q").await.unwrap();
    assert_eq!(children.len(), 1);
    let after = c
        .create("/q/n-", "", CreateMode::EphemeralSequential)
        .await
        .unwrap();
    assert_eq!(after.sequence.unwrap(), before.sequence.unwrap() + 2);
    c.close().await;
    server.stop().await;
}

/// A holder with an older token commits a transaction (a fenced write and a
/// fenced create) while a holder with a newer token writes the same node.
/// Whichever comes first, the newer write is never undone, and the older
/// transaction is applied whole or not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_and_a_newer_fenced_write_racing_never_undo_the_newer() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let b = server.client().await;
    a.create("/res", "", CreateMode::Persistent).await.unwrap();
    let (mut first, mut second) = (0, 0);
    for round in 0..40u64 {
        let (old, new) = (2 * round + 1, 2 * round + 2);
        let log = format!("/res/log-{round}-");
        let txn = a
            .txn()
            .set_data_fenced("/res", format!("a{round}"), old)
            .create_fenced(&log, "", CreateMode::PersistentSequential, old)
            .commit();
        let write = b.set_data_fenced("/res", format!("b{round}"), new);
        // One round in three each way round for certain, the rest racing.
        let (txn, write) = within(10, "the race", async {
            match round % 3 {
                0 => {
                    let write = write.await;
                    (txn.await, write)
                }
                1 => {
                    let txn = txn.await;
                    (txn, write.await)
                }
                _ => tokio::join!(txn, write),
            }
        })
        .await;
        write.unwrap();
        let logged = a
            .get_children("/res")
            .await
            .unwrap()
            .0
            .iter()
            .filter(|n| n.starts_with(&format!("log-{round}-")))
            .count();
        match txn {
            Ok(results) => {
                assert_eq!((results.len(), logged), (2, 1));
                first += 1;
            }
            Err(Error::TxnFailed { index: 0, error }) => {
                assert!(matches!(*error, Error::StaleFence(_)), "{error:?}");
                assert_eq!(logged, 0, "a failed transaction left its create");
                second += 1;
            }
            Err(e) => panic!("round {round}: {e:?}"),
        }
        let (data, _) = a.get_data("/res").await.unwrap();
        assert_eq!(data, format!("b{round}"), "round {round}");
    }
    assert_eq!(first + second, 40);
    assert!(
        first >= 13 && second >= 14,
        "{first} committed, {second} refused"
    );
    a.close().await;
    b.close().await;
    server.stop().await;
}

/// The reply to a transaction is lost with its connection after the server
/// applied it: the client sends it again on the resumed session and gets
/// the first answer; the transaction is applied once.
#[tokio::test]
async fn a_transaction_cut_after_it_was_applied_is_answered_once_and_applied_once() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let observer = server.client().await;
    let c = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    c.create("/once", "", CreateMode::Persistent).await.unwrap();
    proxy.hold_replies();
    let mut commit = Box::pin(
        c.txn()
            .create("/once/n-", "", CreateMode::PersistentSequential)
            .set_data("/once", "x", None)
            .commit(),
    );
    assert!(futures::poll!(&mut commit).is_pending());
    eventually_async(10, "the transaction applied", || async {
        observer.exists("/once").await.unwrap().unwrap().version == 1
    })
    .await;
    proxy.sever();
    proxy.release();
    let results = within(10, "the resent transaction", commit).await.unwrap();
    let TxnResult::DataSet(stat) = &results[1] else {
        panic!("{results:?}")
    };
    assert_eq!(stat.version, 1);
    let (children, stat) = observer.get_children("/once").await.unwrap();
    assert_eq!((children.len(), stat.version), (1, 1));
    c.close().await;
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn the_limits_of_a_transaction_are_refused_with_typed_errors_by_client_and_server() {
    let config = baton::server::Config {
        max_data: 1000,
        ..fast_config()
    };
    let server = TestServer::with_config(config).await;
    let c = server.client().await;
    let many = (0..=MAX_TXN_OPS).fold(c.txn(), |t, _| t.check_exists("/"));
    let (index, error) = failed_at(many.commit().await);
    assert_eq!(index as usize, MAX_TXN_OPS);
    assert!(matches!(error, Error::TooManyOperations(_)), "{error:?}");
    let big = c
        .txn()
        .create("/a", vec![0u8; 600], CreateMode::Persistent)
        .create("/b", vec![0u8; 600], CreateMode::Persistent)
        .commit()
        .await;
    let (index, error) = failed_at(big);
    assert_eq!(index, 1);
    assert!(matches!(error, Error::ValueTooLarge(_)), "{error:?}");

    // The server checks the same, for clients that do not.
    let mut raw = Raw::open(&server.addr(), 5000).await;
    let check = || TxnOp::Check {
        path: "/".into(),
        check: Check::Exists,
    };
    let ops = vec![check(); MAX_TXN_OPS + 1];
    match raw.call(Request::Multi { ops }).await {
        Ok(Reply::Multi(Err(f))) => {
            assert_eq!(
                (f.index as usize, f.error.code),
                (MAX_TXN_OPS, ErrorCode::TooManyOperations)
            )
        }
        other => panic!("{other:?}"),
    }
    let create = |path: &str| TxnOp::Create {
        path: path.into(),
        data: Bytes::from(vec![0u8; 600]),
        mode: CreateMode::Persistent,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    };
    match raw
        .call(Request::Multi {
            ops: vec![create("/a"), create("/b")],
        })
        .await
    {
        Ok(Reply::Multi(Err(f))) => {
            assert_eq!((f.index, f.error.code), (1, ErrorCode::ValueTooLarge))
        }
        other => panic!("{other:?}"),
    }
    assert!(c.exists("/a").await.unwrap().is_none());
    // An invalid path in an operation is refused when the frame is read,
    // and the connection goes on.
    let mut frame = bytes::BytesMut::new();
    let xid = raw.next_xid();
    frame.extend_from_slice(&xid.to_be_bytes());
    frame.extend_from_slice(&[16, 0, 1]);
    TxnOp::Create {
        path: "no-slash".into(),
        data: Bytes::new(),
        mode: CreateMode::Persistent,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    }
    .encode(&mut frame);
    raw.write_frame(&frame).await;
    assert_eq!(
        error_code(raw.reply_to(xid).await.result),
        ErrorCode::InvalidPath
    );
    assert!(matches!(
        raw.call(Request::Multi { ops: vec![check()] }).await,
        Ok(Reply::Multi(Ok(results))) if results == [TxnResult::Checked]
    ));
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn an_operation_an_identity_may_not_make_refuses_the_whole_transaction() {
    use baton::server::auth::{Identities, Identity, Rights};
    let rights = |names: &[&str]| {
        names
            .iter()
            .map(|n| Rights::parse(n).unwrap())
            .fold(Rights::default(), Rights::union_of)
    };
    let token = |t: &str| baton::proto::Token(t.to_owned().into());
    let identities = Identities::new(vec![
        Identity::new(
            "admin".into(),
            token("admin-token"),
            vec![("/".into(), rights(&["admin"]))],
        ),
        Identity::new(
            "team".into(),
            token("team-token"),
            vec![("/team".into(), rights(&["read", "write"]))],
        ),
    ])
    .unwrap();
    let config = baton::server::Config {
        identities: Some(Arc::new(identities)),
        ..fast_config()
    };
    let server = TestServer::with_config(config).await;
    let connect = |t: &'static str| {
        Client::builder(&server.addr())
            .token(t.to_owned())
            .session_timeout(Duration::from_secs(10))
            .connect()
    };
    let admin = within(10, "admin", connect("admin-token")).await.unwrap();
    let team = within(10, "team", connect("team-token")).await.unwrap();
    admin
        .create("/team", "", CreateMode::Persistent)
        .await
        .unwrap();
    admin
        .create("/other", "", CreateMode::Persistent)
        .await
        .unwrap();
    let (index, error) = failed_at(
        team.txn()
            .create("/team/a", "", CreateMode::Persistent)
            .set_data("/other", "x", None)
            .commit()
            .await,
    );
    assert_eq!(index, 1);
    assert!(
        matches!(&error, Error::PermissionDenied(m) if m.contains("/other")),
        "{error:?}"
    );
    assert!(admin.exists("/team/a").await.unwrap().is_none());
    team.txn()
        .create("/team/a", "", CreateMode::Persistent)
        .check_exists("/team")
        .commit()
        .await
        .unwrap();
    admin.close().await;
    team.close().await;
    server.stop().await;
}

/// A transaction's changes reach queue watches and sessions as the same
/// changes made alone: deleting the holder's node grants the lock to the
/// next waiter, and an ephemeral node created in a transaction goes with
/// its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_s_changes_reach_lock_waiters_and_ephemerals_like_any_other() {
    let server = TestServer::start().await;
    let holder = server.client().await;
    let waiter = server.client().await;
    let admin = server.client().await;
    let guard = baton::Lock::new(&holder, "/locks/t")
        .acquire()
        .await
        .unwrap();
    let lock = baton::Lock::new(&waiter, "/locks/t");
    let mut waiting = Box::pin(lock.acquire());
    assert!(futures::poll!(&mut waiting).is_pending());
    eventually_async(10, "the waiter queued", || async {
        admin.get_children("/locks/t").await.unwrap().0.len() == 2
    })
    .await;
    // An operator removes the stuck holder and records why, together.
    admin
        .txn()
        .delete(guard.node(), None)
        .create(
            "/locks/t-evicted",
            guard.node().to_owned(),
            CreateMode::Persistent,
        )
        .commit()
        .await
        .unwrap();
    let granted = within(10, "the next waiter granted", waiting)
        .await
        .unwrap();
    assert!(granted.token() > guard.token());
    within(10, "the old holder told", guard.lost()).await;

    let short = server.client_with_timeout(Duration::from_secs(2)).await;
    short
        .txn()
        .create("/eph", "", CreateMode::Ephemeral)
        .create("/kept", "", CreateMode::Persistent)
        .commit()
        .await
        .unwrap();
    short.close().await;
    eventually_async(10, "the ephemeral gone with its session", || async {
        admin.exists("/eph").await.unwrap().is_none()
    })
    .await;
    assert!(admin.exists("/kept").await.unwrap().is_some());
    granted.release().await.unwrap();
    for c in [holder, waiter, admin] {
        c.close().await;
    }
    server.stop().await;
}
