//! Resuming a session on a new connection after the old one broke
//! (DESIGN.md invariant 5), with the network cut by a proxy.

use std::time::Duration;

use baton::proto::{ErrorCode, Request};
use baton::{Client, CreateMode, Error, EventKind, SessionState};
use baton_testkit::*;

/// A client through `proxy` with a session timeout long enough to ride out
/// a short cut.
async fn client_via(proxy: &Proxy) -> Client {
    connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await
}

/// Cuts the client's connection and keeps it cut until the client has
/// noticed; the caller reopens the network with `proxy.unblock()`.
async fn cut(proxy: &Proxy, client: &Client) {
    proxy.block();
    proxy.sever();
    wait_state(client, SessionState::Disconnected).await;
}

#[tokio::test]
async fn dropped_connection_resumes_the_same_session_with_its_ephemerals() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let observer = server.client().await;
    let client = client_via(&proxy).await;
    let id = client.session_id();
    client
        .create("/r-eph", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let mut states = client.state_changes();
    assert_eq!(*states.borrow_and_update(), SessionState::Connected);

    cut(&proxy, &client).await;
    assert_eq!(*states.borrow_and_update(), SessionState::Disconnected);
    // A call made while disconnected waits for the reconnect.
    let mut deferred = Box::pin(client.exists("/r-eph"));
    assert!(futures::poll!(&mut deferred).is_pending());
    // The session outlives its connection.
    let stat = observer
        .exists("/r-eph")
        .await
        .unwrap()
        .expect("still there");
    assert_eq!(stat.owner(), Some(id));
    proxy.unblock();

    wait_state(&client, SessionState::Reconnected).await;
    assert_eq!(*states.borrow_and_update(), SessionState::Reconnected);
    let stat = within(10, "the deferred call", deferred)
        .await
        .unwrap()
        .expect("the ephemeral survived");
    assert_eq!(stat.owner(), Some(id));
    let created = client
        .create("/r-eph2", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    assert_eq!(created.stat.owner(), Some(id), "same session after resume");
    let stats = server.stats();
    assert_eq!(stats.sessions, 2);
    assert_eq!(stats.sessions_expired, 0);
    assert_eq!(client.session_id(), id);

    // The resumed session still ends normally.
    client.close().await;
    assert_eq!(observer.exists("/r-eph").await.unwrap(), None);
    assert_eq!(observer.exists("/r-eph2").await.unwrap(), None);
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn reconnects_after_several_cuts() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = client_via(&proxy).await;
    client
        .create("/many", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    for round in 0..5 {
        cut(&proxy, &client).await;
        proxy.unblock();
        wait_state(&client, SessionState::Reconnected).await;
        let stat = client.exists("/many").await.unwrap();
        assert!(stat.is_some(), "round {round}");
    }
    // Without blocking new connections: the client reconnects on its own.
    proxy.sever();
    let stat = within(10, "a call after a cut", client.exists("/many")).await;
    let stat = match stat {
        // The call may have raced the cut.
        Err(Error::ConnectionLoss(_)) => client.exists("/many").await,
        other => other,
    };
    assert_eq!(stat.unwrap().unwrap().owner(), Some(client.session_id()));
    assert_eq!(server.stats().sessions_expired, 0);
    client.close().await;
    server.stop().await;
}

/// A request that never reached the server before the cut is sent again
/// once the session is resumed, and the caller gets its answer.
#[tokio::test]
async fn a_call_in_flight_at_the_cut_is_sent_again_and_answered() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = client_via(&proxy).await;
    client
        .create("/inflight", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    // Held: the request is written but never reaches the server.
    proxy.hold();
    let mut call = Box::pin(client.get_data("/inflight"));
    assert!(futures::poll!(&mut call).is_pending());
    proxy.sever();
    let (_, stat) = within(10, "the call in flight", call).await.unwrap();
    assert_eq!(stat.owner(), Some(client.session_id()));
    assert_eq!(server.stats().sessions_expired, 0);
    client.close().await;
    server.stop().await;
}

/// Calls made while the connection does not drain: the socket takes what it
/// can, the write buffer fills and later calls wait in line for room. A cut
/// then sends the unanswered requests again on the new connection, followed
/// by those still waiting, each applied once and all in the order made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_behind_a_stalled_connection_survive_a_cut_in_order() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = client_via(&proxy).await;
    client
        .create("/stalled", "", CreateMode::Persistent)
        .await
        .unwrap();
    // Nothing moves from here on: 32 creates of 900 KiB (29 MiB) are more
    // than the sockets on both sides of the proxy and the client's 4 MiB
    // write buffer hold together.
    proxy.hold();
    let data = bytes::Bytes::from(vec![b's'; 900 * 1024]);
    let mut calls: Vec<_> = (0..32)
        .map(|_| {
            Box::pin(futures::future::maybe_done(client.create(
                "/stalled/n-",
                data.clone(),
                CreateMode::PersistentSequential,
            )))
        })
        .collect();
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    proxy.sever();
    within(
        60,
        "the calls made before the cut",
        futures::future::join_all(calls.iter_mut().map(|c| c.as_mut())),
    )
    .await;
    let sequences: Vec<u64> = calls
        .into_iter()
        .map(|mut c| c.as_mut().take_output().unwrap().unwrap().sequence.unwrap())
        .collect();
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "applied out of the order made: {sequences:?}"
    );
    let (children, _) = client.get_children("/stalled").await.unwrap();
    assert_eq!(children.len(), 32, "each create applied once");
    assert_eq!(server.stats().sessions_expired, 0);
    client.close().await;
    server.stop().await;
}

/// A change the server applied, whose reply the cut lost, is sent again and
/// answered from the session's last reply: applied once, and the caller
/// learns the real result (the name its sequential node got).
#[tokio::test]
async fn a_change_whose_reply_was_lost_is_applied_once() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = client_via(&proxy).await;
    client
        .create("/once", "", CreateMode::Persistent)
        .await
        .unwrap();
    proxy.hold_replies();
    let mut call = Box::pin(client.create("/once/n-", "", CreateMode::PersistentSequential));
    assert!(futures::poll!(&mut call).is_pending());
    eventually(10, "the server to apply the create", || {
        server.stats().nodes == 3
    })
    .await;
    proxy.sever();
    let created = within(10, "the create in flight", call).await.unwrap();
    let (children, _) = client.get_children("/once").await.unwrap();
    assert_eq!(children.len(), 1, "applied once: {children:?}");
    assert_eq!(created.path, format!("/once/{}", children[0]));
    client.close().await;
    server.stop().await;
}

/// Of two changes in flight whose replies were lost, only the session's
/// latest keeps its reply: the earlier one fails with a connection loss (its
/// outcome unknown to the caller) and neither is applied twice.
#[tokio::test]
async fn of_two_lost_replies_only_the_latest_is_recovered_and_neither_applied_twice() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = client_via(&proxy).await;
    client
        .create("/twice", "", CreateMode::Persistent)
        .await
        .unwrap();
    proxy.hold_replies();
    let mut first = Box::pin(client.create("/twice/a-", "", CreateMode::PersistentSequential));
    let mut second = Box::pin(client.create("/twice/b-", "", CreateMode::PersistentSequential));
    assert!(futures::poll!(&mut first).is_pending());
    assert!(futures::poll!(&mut second).is_pending());
    eventually(10, "the server to apply both", || server.stats().nodes == 4).await;
    proxy.sever();
    let first = within(10, "the first create", first).await;
    assert!(
        matches!(&first, Err(Error::ConnectionLoss(m)) if m.contains("reply is lost")),
        "{first:?}"
    );
    let second = within(10, "the second create", second).await.unwrap();
    let (children, _) = client.get_children("/twice").await.unwrap();
    assert_eq!(children.len(), 2, "{children:?}");
    assert!(second.path.starts_with("/twice/b-"));
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn silent_connection_is_abandoned_and_the_session_resumed_before_it_expires() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = connect_with_timeout(&proxy.addr(), Duration::from_millis(4_500)).await;
    client
        .create("/quiet", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    // The connection stays open but nothing moves on it: only the client's
    // own heartbeat check can notice.
    proxy.hold();
    wait_state(&client, SessionState::Disconnected).await;
    wait_state(&client, SessionState::Reconnected).await;
    let stat = client.exists("/quiet").await.unwrap().expect("kept");
    assert_eq!(stat.owner(), Some(client.session_id()));
    assert_eq!(server.stats().sessions_expired, 0);
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn watches_set_before_the_cut_fire_for_changes_made_while_disconnected() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let writer = server.client().await;
    writer
        .create("/wd", "", CreateMode::Persistent)
        .await
        .unwrap();
    writer
        .create("/wc", "", CreateMode::Persistent)
        .await
        .unwrap();
    writer
        .create("/wx", "", CreateMode::Persistent)
        .await
        .unwrap();
    let client = client_via(&proxy).await;
    let (_, _, data_watch) = client.get_data_watch("/wd").await.unwrap();
    let (_, exist_watch) = client.exists_watch("/wn").await.unwrap();
    let (_, _, child_watch) = client.get_children_watch("/wc").await.unwrap();
    let (_, _, delete_watch) = client.get_data_watch("/wx").await.unwrap();

    cut(&proxy, &client).await;
    // Make sure the server has let go of the old connection (and with it
    // the watches it held), so only the resume can bring them back.
    eventually(10, "the server to detach the session", || {
        server.stats().watches == 0
    })
    .await;
    let set = writer.set_data("/wd", "new", None).await.unwrap();
    let created = writer
        .create("/wn", "", CreateMode::Persistent)
        .await
        .unwrap();
    writer
        .create("/wc/kid", "", CreateMode::Persistent)
        .await
        .unwrap();
    writer.delete("/wx", None).await.unwrap();
    proxy.unblock();

    wait_state(&client, SessionState::Reconnected).await;
    let event = within(10, "the data watch", data_watch).await.unwrap();
    assert_eq!(
        (event.kind, event.path.as_str()),
        (EventKind::DataChanged, "/wd")
    );
    assert_eq!(event.revision, set.mzxid);
    let event = within(10, "the exists watch", exist_watch).await.unwrap();
    assert_eq!(
        (event.kind, event.path.as_str()),
        (EventKind::Created, "/wn")
    );
    assert_eq!(event.revision, created.stat.czxid);
    let event = within(10, "the child watch", child_watch).await.unwrap();
    assert_eq!(
        (event.kind, event.path.as_str()),
        (EventKind::ChildrenChanged, "/wc")
    );
    let event = within(10, "the delete watch", delete_watch).await.unwrap();
    assert_eq!(
        (event.kind, event.path.as_str()),
        (EventKind::Deleted, "/wx")
    );
    client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn watches_set_before_the_cut_stay_armed_after_the_resume() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let writer = server.client().await;
    writer
        .create("/st", "", CreateMode::Persistent)
        .await
        .unwrap();
    let client = client_via(&proxy).await;
    let (_, _, mut data_watch) = client.get_data_watch("/st").await.unwrap();
    let (_, mut exist_watch) = client.exists_watch("/later").await.unwrap();
    let (_, _, mut child_watch) = client.get_children_watch("/st").await.unwrap();

    cut(&proxy, &client).await;
    eventually(10, "the server to detach the session", || {
        server.stats().watches == 0
    })
    .await;
    proxy.unblock();
    wait_state(&client, SessionState::Reconnected).await;
    client.ping().await.unwrap();
    // Nothing changed: no watch fired, and the server holds them again.
    assert!(futures::poll!(&mut data_watch).is_pending());
    assert!(futures::poll!(&mut exist_watch).is_pending());
    assert!(futures::poll!(&mut child_watch).is_pending());
    assert_eq!(server.stats().watches, 2, "/st (data and child) and /later");

    writer.set_data("/st", "x", None).await.unwrap();
    writer
        .create("/later", "", CreateMode::Persistent)
        .await
        .unwrap();
    writer
        .create("/st/c", "", CreateMode::Persistent)
        .await
        .unwrap();
    let event = within(10, "the data watch", data_watch).await.unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);
    let event = within(10, "the exists watch", exist_watch).await.unwrap();
    assert_eq!(event.kind, EventKind::Created);
    let event = within(10, "the child watch", child_watch).await.unwrap();
    assert_eq!(event.kind, EventKind::ChildrenChanged);
    client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn cut_longer_than_the_session_timeout_ends_in_expired() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let observer = server.client().await;
    let client = connect_with_timeout(&proxy.addr(), Duration::from_millis(600)).await;
    client
        .create("/short", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let (_, _, watcher) = client.get_children_watch("/").await.unwrap();
    let (_, gone) = observer.exists_watch("/short").await.unwrap();

    cut(&proxy, &client).await;
    let mut deferred = Box::pin(client.get_data("/"));
    assert!(futures::poll!(&mut deferred).is_pending());
    within(10, "the server to expire the session", gone)
        .await
        .unwrap();
    proxy.unblock();

    let ended = within(10, "the client to learn of the expiry", client.ended()).await;
    assert_eq!(ended, SessionState::Expired);
    let result = within(10, "the deferred call", deferred).await;
    assert!(
        matches!(result, Err(Error::SessionExpired(_))),
        "{result:?}"
    );
    let result = within(10, "the watcher", watcher).await;
    assert!(
        matches!(result, Err(Error::SessionExpired(_))),
        "{result:?}"
    );
    let result = client.create("/again", "", CreateMode::Ephemeral).await;
    assert!(
        matches!(result, Err(Error::SessionExpired(_))),
        "{result:?}"
    );
    assert!(result.unwrap_err().is_session_gone());
    assert_eq!(observer.exists("/again").await.unwrap(), None);
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn resuming_on_a_new_connection_moves_the_session_off_the_old_one() {
    let server = TestServer::start().await;
    let mut first = Raw::open(&server.addr(), 10_000).await;
    first
        .call(Request::Create {
            path: "/moved".into(),
            data: "".into(),
            mode: CreateMode::Ephemeral,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        })
        .await
        .unwrap();
    let grant = first.grant().clone();

    let (mut second, response) = Raw::resume(&server.addr(), &grant).await;
    let resumed = response.result.expect("resumed");
    assert!(resumed.resumed);
    assert_eq!(resumed.session_id, grant.session_id);
    assert_eq!(resumed.timeout_ms, grant.timeout_ms);

    let notice = first.expect_disconnect().await;
    assert_eq!(notice.code, ErrorCode::SessionMoved);
    match second
        .call(Request::Exists {
            path: "/moved".into(),
            watch: false,
        })
        .await
    {
        Ok(baton::proto::Reply::Exists(Some(stat))) => {
            assert_eq!(stat.owner(), Some(grant.session_id));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.stats().sessions, 1);
    server.stop().await;
}

/// A server that has not applied what a client has seen does not serve it
/// (what the client sees never goes back): the handshake is refused with
/// `not-leader` naming nobody, and the client tries another server. One
/// that has applied that far serves it, in either read mode.
#[tokio::test]
async fn a_server_behind_what_the_client_saw_does_not_serve_it() {
    use baton::proto::{ConnectRequest, ReadMode};
    let server = TestServer::start().await;
    let client = server.client().await;
    client
        .create("/seen", "x", CreateMode::Persistent)
        .await
        .unwrap();
    for mode in [ReadMode::Linearizable, ReadMode::Sequential] {
        // (Each session opened below is a change: the revision moves on.)
        let seen = client.sync().await.unwrap();
        let mut raw = Raw::connect(&server.addr()).await;
        let request = ConnectRequest {
            read_mode: mode,
            last_seen: seen + 1,
            ..ConnectRequest::new(10_000)
        };
        let refused = raw.handshake(&request).await.result.unwrap_err();
        assert_eq!(refused, (ErrorCode::NotLeader, String::new()), "{mode:?}");
        let mut raw = Raw::connect(&server.addr()).await;
        let request = ConnectRequest {
            read_mode: mode,
            last_seen: seen,
            ..ConnectRequest::new(10_000)
        };
        raw.handshake(&request).await.result.expect("served");
    }
    client.close().await;
    server.stop().await;
}

/// A sync answers with how far the server had applied, at least every
/// change made before it; a sequential session's reads see its own changes.
#[tokio::test]
async fn a_sync_answers_with_the_revision_applied() {
    let server = TestServer::start().await;
    let writer = server.client().await;
    let reader = Client::builder(&server.addr())
        .read_mode(baton::ReadMode::Sequential)
        .connect()
        .await
        .unwrap();
    let created = writer
        .create("/synced", "one", CreateMode::Persistent)
        .await
        .unwrap();
    let synced = reader.sync().await.unwrap();
    assert!(synced >= created.stat.czxid);
    assert_eq!(&reader.get_data("/synced").await.unwrap().0[..], b"one");
    let set = reader.set_data("/synced", "two", None).await.unwrap();
    let (data, stat) = reader.get_data("/synced").await.unwrap();
    assert_eq!((&data[..], stat.mzxid), (&b"two"[..], set.mzxid));
    writer.close().await;
    reader.close().await;
    server.stop().await;
}
