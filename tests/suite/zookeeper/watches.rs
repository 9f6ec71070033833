//! One-shot and persistent watches through the `zookeeper-client` crate:
//! what fires, once, and across a broken connection.

use std::time::Duration;

use baton_testkit::{within, Proxy};
use zookeeper_client as zk;

use super::{open, zk_addr, zk_client, zk_server};

#[tokio::test]
async fn one_shot_watches_fire_with_the_change() {
    let server = zk_server().await;
    let addr = zk_addr(&server).to_string();
    let c = zk_client(&addr, Duration::from_secs(10)).await;
    let other = zk_client(&addr, Duration::from_secs(10)).await;

    // Exists on a missing node: fires when it is created.
    let (stat, created) = c.check_and_watch_stat("/w").await.unwrap();
    assert!(stat.is_none());
    let (made, _) = other
        .create("/w", b"a", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let event = within(10, "the exist watch", created.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeCreated);
    assert_eq!(event.path, "/w");
    assert_eq!(
        event.zxid, made.czxid,
        "the event carries its change's zxid"
    );

    // Data and child watches.
    let (_, _, data) = c.get_and_watch_data("/w").await.unwrap();
    let (_, children) = c.list_and_watch_children("/w").await.unwrap();
    other
        .create("/w/kid", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let event = within(10, "the child watch", children.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeChildrenChanged);
    other.set_data("/w", b"b", None).await.unwrap();
    let event = within(10, "the data watch", data.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeDataChanged);

    // Deletion reaches a data watch as deleted.
    let (_, _, data) = c.get_and_watch_data("/w/kid").await.unwrap();
    other.delete("/w/kid", None).await.unwrap();
    let event = within(10, "the deletion", data.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeDeleted);
    server.stop().await;
}

#[tokio::test]
async fn persistent_and_recursive_watches_report_every_change() {
    let server = zk_server().await;
    let addr = zk_addr(&server).to_string();
    let c = zk_client(&addr, Duration::from_secs(10)).await;
    c.create("/p", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let mut plain = c.watch("/p", zk::AddWatchMode::Persistent).await.unwrap();
    let mut deep = c
        .watch("/p", zk::AddWatchMode::PersistentRecursive)
        .await
        .unwrap();
    c.create("/p/a", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    c.set_data("/p/a", b"x", None).await.unwrap();
    c.set_data("/p", b"y", None).await.unwrap();
    c.delete("/p/a", None).await.unwrap();

    let mut seen = Vec::new();
    for _ in 0..4 {
        let e = within(10, "a recursive event", deep.changed()).await;
        seen.push((e.event_type, e.path));
    }
    use zk::EventType::*;
    assert_eq!(
        seen,
        vec![
            (NodeCreated, "/p/a".to_string()),
            (NodeDataChanged, "/p/a".to_string()),
            (NodeDataChanged, "/p".to_string()),
            (NodeDeleted, "/p/a".to_string()),
        ]
    );
    let mut seen = Vec::new();
    for _ in 0..3 {
        let e = within(10, "a plain persistent event", plain.changed()).await;
        seen.push((e.event_type, e.path));
    }
    assert_eq!(
        seen,
        vec![
            (NodeChildrenChanged, "/p".to_string()),
            (NodeDataChanged, "/p".to_string()),
            (NodeChildrenChanged, "/p".to_string()),
        ]
    );
    server.stop().await;
}

/// The client's connection breaks; meanwhile the watched nodes change. On
/// its new connection the client sets its watches again (setWatches, with
/// the last zxid it saw): the one-shot watches whose node changed fire at
/// once, the others stay set, and the session's ephemeral node is still
/// there. (This client does not set persistent watches again: see
/// `set_watches2_sets_persistent_watches_again` in bad_input.rs.)
#[tokio::test]
async fn watches_and_ephemerals_survive_a_broken_connection() {
    let server = zk_server().await;
    let proxy = Proxy::start(zk_addr(&server)).await;
    let c = zk_client(&proxy.addr(), Duration::from_secs(10)).await;
    let other = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;
    c.create("/r", b"0", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    c.create("/r/mine", b"", &open(zk::CreateMode::Ephemeral))
        .await
        .unwrap();
    let (_, _, data) = c.get_and_watch_data("/r").await.unwrap();
    let (_, exist) = c.check_and_watch_stat("/r/later").await.unwrap();
    let (_, _, untouched) = c.get_and_watch_data("/r/mine").await.unwrap();
    let mut states = c.state_watcher();

    proxy.block();
    proxy.sever();
    within(10, "the client to see its connection break", async {
        while states.changed().await != zk::SessionState::Disconnected {}
    })
    .await;
    other.set_data("/r", b"1", None).await.unwrap();
    other
        .create("/r/later", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    proxy.unblock();
    within(10, "the client to resume its session", async {
        while states.changed().await != zk::SessionState::SyncConnected {}
    })
    .await;

    let e = within(10, "the data watch, set again", data.changed()).await;
    assert_eq!(e.event_type, zk::EventType::NodeDataChanged);
    let e = within(10, "the exist watch, set again", exist.changed()).await;
    assert_eq!(e.event_type, zk::EventType::NodeCreated);
    assert!(
        c.check_stat("/r/mine").await.unwrap().is_some(),
        "the ephemeral node survived"
    );
    other.set_data("/r/mine", b"now", None).await.unwrap();
    let e = within(
        10,
        "the untouched watch, after the reconnect",
        untouched.changed(),
    )
    .await;
    assert_eq!(e.event_type, zk::EventType::NodeDataChanged);
    server.stop().await;
}
