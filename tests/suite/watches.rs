//! One-shot watches and their ordering (DESIGN.md invariant 7).
//!
//! Several tests prove that an event did NOT arrive by making a request after
//! the change: by invariant 7 an event would reach the client before that
//! request's reply, so a watcher still pending when the reply is in was not
//! fired.

use std::time::Duration;

use baton::proto::{Request, ServerMessage};
use baton::{CreateMode, EventKind, SessionState};
use baton_testkit::*;
use futures::FutureExt;

#[tokio::test]
async fn own_change_fires_own_watch() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let created = c
        .create("/a", "hello", CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(created.path, "/a");
    assert_eq!(created.sequence, None);
    let (data, stat) = c.get_data("/a").await.unwrap();
    assert_eq!(&data[..], b"hello");
    assert_eq!(stat.version, 0);
    let (_, _, watcher) = c.get_data_watch("/a").await.unwrap();
    assert_eq!(watcher.path(), "/a");
    let set = c.set_data("/a", "x", None).await.unwrap();
    assert_eq!(set.version, 1);
    let event = within(5, "the watch", watcher).await.unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);
    assert_eq!(event.path, "/a");
    assert_eq!(event.revision, set.mzxid);
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn watch_fires_once_and_a_second_change_needs_a_new_watch() {
    let server = TestServer::start().await;
    let watcher_client = server.client().await;
    let writer = server.client().await;
    writer
        .create("/x", "0", CreateMode::Persistent)
        .await
        .unwrap();
    let events_before = server.stats().watch_events;

    let (_, _, first) = watcher_client.get_data_watch("/x").await.unwrap();
    let set1 = writer.set_data("/x", "1", None).await.unwrap();
    let set2 = writer.set_data("/x", "2", None).await.unwrap();
    let event = within(5, "the first watch", first).await.unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);
    assert_eq!(event.revision, set1.mzxid, "it reports the first change");
    assert_eq!(
        server.stats().watch_events - events_before,
        1,
        "two changes, one event"
    );

    let (data, _, second) = watcher_client.get_data_watch("/x").await.unwrap();
    assert_eq!(&data[..], b"2");
    let set3 = writer.set_data("/x", "3", None).await.unwrap();
    let event = within(5, "the second watch", second).await.unwrap();
    assert_eq!(event.revision, set3.mzxid);
    assert!(set3.mzxid > set2.mzxid);
    assert_eq!(server.stats().watch_events - events_before, 2);
    watcher_client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn watch_event_is_sent_once_on_the_wire() {
    let server = TestServer::start().await;
    let writer = server.client().await;
    writer
        .create("/w", "", CreateMode::Persistent)
        .await
        .unwrap();
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    raw.call(Request::GetData {
        path: "/w".into(),
        watch: true,
    })
    .await
    .unwrap();
    // The same watch set again is still one watch.
    raw.call(Request::Exists {
        path: "/w".into(),
        watch: true,
    })
    .await
    .unwrap();
    for i in 0..3 {
        writer.set_data("/w", format!("{i}"), None).await.unwrap();
    }
    writer.delete("/w", None).await.unwrap();
    raw.call(Request::Ping).await.unwrap();
    assert_eq!(raw.events.len(), 1, "{:?}", raw.events);
    assert_eq!(raw.events[0].kind, EventKind::DataChanged);
    assert_eq!(raw.events[0].path, "/w");
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn exists_watch_on_a_missing_node_fires_created() {
    let server = TestServer::start().await;
    let watcher_client = server.client().await;
    let writer = server.client().await;
    let (stat, watcher) = watcher_client.exists_watch("/later").await.unwrap();
    assert_eq!(stat, None);
    let created = writer
        .create("/later", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let event = within(5, "the exists watch", watcher).await.unwrap();
    assert_eq!(event.kind, EventKind::Created);
    assert_eq!(event.path, "/later");
    assert_eq!(event.revision, created.stat.czxid);
    watcher_client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn exists_watch_on_a_present_node_fires_on_change_and_on_delete() {
    let server = TestServer::start().await;
    let watcher_client = server.client().await;
    let writer = server.client().await;
    writer
        .create("/here", "", CreateMode::Persistent)
        .await
        .unwrap();
    let (stat, watcher) = watcher_client.exists_watch("/here").await.unwrap();
    assert!(stat.is_some());
    writer.set_data("/here", "new", None).await.unwrap();
    let event = within(5, "the exists watch", watcher).await.unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);

    let (_, watcher) = watcher_client.exists_watch("/here").await.unwrap();
    writer.delete("/here", None).await.unwrap();
    let event = within(5, "the exists watch", watcher).await.unwrap();
    assert_eq!(event.kind, EventKind::Deleted);
    watcher_client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn child_watch_fires_children_changed_but_not_for_data_changes() {
    let server = TestServer::start().await;
    let watcher_client = server.client().await;
    let writer = server.client().await;
    writer
        .create("/dir", "", CreateMode::Persistent)
        .await
        .unwrap();
    writer
        .create("/dir/old", "", CreateMode::Persistent)
        .await
        .unwrap();

    let (children, _, mut watcher) = watcher_client.get_children_watch("/dir").await.unwrap();
    assert_eq!(children, ["old"]);
    // Changes to the node's data, or a child's data, are not child changes.
    writer.set_data("/dir", "d", None).await.unwrap();
    writer.set_data("/dir/old", "d", None).await.unwrap();
    watcher_client.ping().await.unwrap();
    assert!(futures::poll!(&mut watcher).is_pending());

    let created = writer
        .create("/dir/new", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let event = within(5, "the child watch", watcher).await.unwrap();
    assert_eq!(event.kind, EventKind::ChildrenChanged);
    assert_eq!(event.path, "/dir");
    assert_eq!(event.revision, created.stat.czxid);

    let (_, _, watcher) = watcher_client.get_children_watch("/dir").await.unwrap();
    writer.delete("/dir/old", None).await.unwrap();
    let event = within(5, "the child watch", watcher).await.unwrap();
    assert_eq!(event.kind, EventKind::ChildrenChanged);
    watcher_client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn data_watch_is_not_fired_by_child_changes() {
    let server = TestServer::start().await;
    let watcher_client = server.client().await;
    let writer = server.client().await;
    writer
        .create("/p", "", CreateMode::Persistent)
        .await
        .unwrap();
    let (_, _, mut watcher) = watcher_client.get_data_watch("/p").await.unwrap();
    writer
        .create("/p/c", "", CreateMode::Persistent)
        .await
        .unwrap();
    watcher_client.ping().await.unwrap();
    assert!(futures::poll!(&mut watcher).is_pending());
    writer.set_data("/p", "x", None).await.unwrap();
    let event = within(5, "the data watch", watcher).await.unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);
    watcher_client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn deleting_a_node_fires_deleted_to_data_and_child_watchers() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let b = server.client().await;
    let writer = server.client().await;
    writer
        .create("/d", "", CreateMode::Persistent)
        .await
        .unwrap();
    let (_, _, data_watch) = a.get_data_watch("/d").await.unwrap();
    let (_, _, child_watch) = a.get_children_watch("/d").await.unwrap();
    let (_, exists_watch) = b.exists_watch("/d").await.unwrap();
    let (_, _, parent_watch) = b.get_children_watch("/").await.unwrap();

    writer.delete("/d", None).await.unwrap();

    for (name, watcher) in [
        ("data", data_watch),
        ("child", child_watch),
        ("exists", exists_watch),
    ] {
        let event = within(5, name, watcher).await.unwrap();
        assert_eq!(event.kind, EventKind::Deleted, "{name} watch");
        assert_eq!(event.path, "/d");
    }
    let event = within(5, "parent", parent_watch).await.unwrap();
    assert_eq!(event.kind, EventKind::ChildrenChanged);
    assert_eq!(event.path, "/");
    assert_eq!(server.stats().watches, 0);
    a.close().await;
    b.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_event_arrives_before_the_reply_to_a_later_request() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let b = server.client().await;
    b.create("/o", "", CreateMode::Persistent).await.unwrap();
    b.create("/kids", "", CreateMode::Persistent).await.unwrap();
    for i in 0..50 {
        let (_, _, mut data_watch) = a.get_data_watch("/o").await.unwrap();
        let (_, _, mut child_watch) = a.get_children_watch("/kids").await.unwrap();
        let value = format!("v{i}");
        b.set_data("/o", value.clone(), None).await.unwrap();
        b.create(&format!("/kids/k{i}"), "", CreateMode::Ephemeral)
            .await
            .unwrap();

        // A's next request on the changed path: its reply shows the change,
        // so the event must already have been delivered.
        let (data, _) = a.get_data("/o").await.unwrap();
        assert_eq!(data, value);
        let event = (&mut data_watch)
            .now_or_never()
            .unwrap_or_else(|| panic!("round {i}: reply to get before the data event"))
            .unwrap();
        assert_eq!(event.kind, EventKind::DataChanged);

        // A request on another path orders the same way.
        a.ping().await.unwrap();
        let event = (&mut child_watch)
            .now_or_never()
            .unwrap_or_else(|| panic!("round {i}: reply to ping before the child event"))
            .unwrap();
        assert_eq!(event.kind, EventKind::ChildrenChanged);
    }
    a.close().await;
    b.close().await;
    server.stop().await;
}

#[tokio::test]
async fn expiry_events_arrive_before_the_reply_to_a_later_request() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let doomed = server.client_with_timeout(Duration::from_millis(200)).await;
    doomed
        .create("/e", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let (_, mut watcher) = a.exists_watch("/e").await.unwrap();
    drop(doomed);
    // Poll the node until the expiry shows in a reply: the event must have
    // arrived first.
    within(10, "the session to expire", async {
        while a.exists("/e").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let event = (&mut watcher)
        .now_or_never()
        .expect("the Deleted event came before the reply")
        .unwrap();
    assert_eq!(event.kind, EventKind::Deleted);
    a.close().await;
    server.stop().await;
}

#[tokio::test]
async fn dropping_a_watcher_unregisters_it() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let writer = server.client().await;
    for path in ["/u", "/v", "/shared"] {
        writer
            .create(path, "", CreateMode::Persistent)
            .await
            .unwrap();
    }
    let client = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    let (_, _, dropped) = client.get_data_watch("/u").await.unwrap();
    let (_, _, kept) = client.get_data_watch("/v").await.unwrap();
    let (_, _, shared_dropped) = client.get_data_watch("/shared").await.unwrap();
    let (_, _, shared_kept) = client.get_data_watch("/shared").await.unwrap();
    drop(dropped);
    drop(shared_dropped);
    assert_eq!(
        server.stats().watches,
        3,
        "the server still holds all three"
    );

    // The client tells the server which watches it holds when it resumes its
    // session on a new connection: a dropped watcher is not among them.
    proxy.block();
    proxy.sever();
    wait_state(&client, SessionState::Disconnected).await;
    eventually(10, "the server to drop the old connection", || {
        server.stats().watches == 0
    })
    .await;
    proxy.unblock();
    wait_state(&client, SessionState::Reconnected).await;
    client.ping().await.unwrap();
    assert_eq!(server.stats().watches, 2, "/v and /shared, not /u");

    let events_before = server.stats().watch_events;
    for path in ["/u", "/v", "/shared"] {
        writer.set_data(path, "changed", None).await.unwrap();
    }
    assert_eq!(server.stats().watch_events - events_before, 2);
    let event = within(5, "the kept watcher", kept).await.unwrap();
    assert_eq!(event.path, "/v");
    let event = within(5, "the kept watcher on a shared path", shared_kept)
        .await
        .unwrap();
    assert_eq!(event.path, "/shared");
    client.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn expired_session_watches_vanish() {
    let server = TestServer::start().await;
    let writer = server.client().await;
    writer
        .create("/w1", "", CreateMode::Persistent)
        .await
        .unwrap();
    let baseline = server.stats().watches;

    // A raw session keeps its connection open but sends nothing after
    // setting its watches, so only expiry can remove them.
    let mut raw = Raw::open(&server.addr(), 200).await;
    for request in [
        Request::GetData {
            path: "/w1".into(),
            watch: true,
        },
        Request::Exists {
            path: "/w2".into(),
            watch: true,
        },
        Request::GetChildren {
            path: "/".into(),
            watch: true,
        },
    ] {
        raw.call(request).await.unwrap();
    }
    assert_eq!(server.stats().watches, baseline + 3);

    let notice = raw.expect_disconnect().await;
    assert_eq!(notice.code, baton::proto::ErrorCode::SessionExpired);
    assert_eq!(server.stats().watches, baseline);

    let events_before = server.stats().watch_events;
    writer.set_data("/w1", "x", None).await.unwrap();
    writer
        .create("/w2", "", CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(server.stats().watch_events, events_before);
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn expired_clients_watchers_resolve_with_session_expired() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let writer = server.client().await;
    writer
        .create("/n", "", CreateMode::Persistent)
        .await
        .unwrap();
    let client = connect_with_timeout(&proxy.addr(), Duration::from_millis(600)).await;
    let (_, _, data_watch) = client.get_data_watch("/n").await.unwrap();
    let (_, exists_watch) = client.exists_watch("/missing").await.unwrap();
    let (_, _, child_watch) = client.get_children_watch("/").await.unwrap();
    proxy.block();
    proxy.sever();
    wait_state(&client, SessionState::Disconnected).await;
    eventually(10, "the server to expire the session", || {
        server.stats().sessions_expired == 1
    })
    .await;
    proxy.unblock();
    for watcher in [data_watch, exists_watch, child_watch] {
        let result = within(10, "the watcher to fail", watcher).await;
        assert!(
            matches!(result, Err(baton::Error::SessionExpired(_))),
            "{result:?}"
        );
    }
    assert_eq!(client.state(), SessionState::Expired);
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn raw_watch_events_carry_the_change_revision() {
    let server = TestServer::start().await;
    let writer = server.client().await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    raw.call(Request::Exists {
        path: "/r".into(),
        watch: true,
    })
    .await
    .unwrap();
    let created = writer
        .create("/r", "", CreateMode::Persistent)
        .await
        .unwrap();
    let xid = raw.send(Request::Ping).await;
    // The event comes first, then the ping's reply.
    match raw.next_message().await {
        Some(ServerMessage::Event(e)) => {
            assert_eq!(e.kind, EventKind::Created);
            assert_eq!(e.revision, created.stat.czxid);
        }
        other => panic!("expected the event first, got {other:?}"),
    }
    let reply = raw.reply_to(xid).await;
    assert!(reply.revision >= created.stat.czxid);
    writer.close().await;
    server.stop().await;
}
