//! Persistent watches, plain and recursive: every change, in order, exactly
//! once, across cut connections; a client away for longer than the
//! server's history is told so.

use std::time::Duration;

use baton::{Client, CreateMode, EventKind, PersistentWatch};
use baton_testkit::*;

/// Reads `n` events from `w`, each within 10 s.
async fn take(w: &mut PersistentWatch, n: usize) -> Vec<(EventKind, String, u64)> {
    let mut out = Vec::new();
    while out.len() < n {
        let e = within(10, "the next event", w.next()).await.unwrap();
        out.push((e.kind, e.path, e.revision));
    }
    out
}

/// The changes a writer makes under `/p`, with the events a recursive watch
/// on `/p` must deliver for them, in order.
async fn write_round(c: &Client, round: usize, expected: &mut Vec<(EventKind, String)>) {
    let node = format!("/p/n{round}");
    c.create(&node, "0", CreateMode::Persistent).await.unwrap();
    expected.push((EventKind::Created, node.clone()));
    c.set_data(&node, "1", None).await.unwrap();
    expected.push((EventKind::DataChanged, node.clone()));
    let child = format!("{node}/c");
    c.create(&child, "", CreateMode::Persistent).await.unwrap();
    expected.push((EventKind::Created, child.clone()));
    c.delete(&child, None).await.unwrap();
    expected.push((EventKind::Deleted, child));
    c.delete(&node, None).await.unwrap();
    expected.push((EventKind::Deleted, node));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recursive_watch_delivers_every_change_in_order_exactly_once_across_cut_connections() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr().parse().unwrap()).await;
    let watcher = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    let writer = server.client().await;
    writer
        .create("/p", "", CreateMode::Persistent)
        .await
        .unwrap();
    let mut w = watcher.watch("/p", true).await.unwrap();
    let mut expected = Vec::new();
    for round in 0..60 {
        write_round(&writer, round, &mut expected).await;
        // Cut the watcher's connection now and then, while changes go on.
        if round % 10 == 3 {
            proxy.sever();
        }
    }
    let got = take(&mut w, expected.len()).await;
    let kinds: Vec<(EventKind, String)> = got.iter().map(|(k, p, _)| (*k, p.clone())).collect();
    assert_eq!(kinds, expected, "every change, in order, once");
    assert!(
        got.windows(2).all(|e| e[0].2 < e[1].2),
        "revisions only rise"
    );
    // Nothing more: no event was delivered twice.
    writer.set_data("/p", "end", None).await.unwrap();
    let last = take(&mut w, 1).await;
    assert_eq!(
        (last[0].0, last[0].1.as_str()),
        (EventKind::DataChanged, "/p")
    );
    assert!(w.try_next().is_none());
    watcher.close().await;
    writer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_plain_watch_sees_its_node_and_children_list_and_goes_when_dropped() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let mut plain = c.watch("/q", false).await.unwrap();
    let mut deep = c.watch("/q", true).await.unwrap();
    c.create("/q", "", CreateMode::Persistent).await.unwrap();
    c.create("/q/a", "", CreateMode::Persistent).await.unwrap();
    c.set_data("/q/a", "x", None).await.unwrap();
    c.set_data("/q", "y", None).await.unwrap();
    let names = |events: Vec<(EventKind, String, u64)>| {
        events
            .into_iter()
            .map(|(k, p, _)| (k, p))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(take(&mut plain, 3).await),
        [
            (EventKind::Created, "/q".to_string()),
            (EventKind::ChildrenChanged, "/q".to_string()),
            (EventKind::DataChanged, "/q".to_string()),
        ]
    );
    assert_eq!(
        names(take(&mut deep, 4).await),
        [
            (EventKind::Created, "/q".to_string()),
            (EventKind::Created, "/q/a".to_string()),
            (EventKind::DataChanged, "/q/a".to_string()),
            (EventKind::DataChanged, "/q".to_string()),
        ]
    );
    let watches = server.stats().watches;
    drop(plain);
    drop(deep);
    eventually(10, "the server to drop the watches", || {
        server.stats().watches + 2 <= watches
    })
    .await;
    c.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_away_for_longer_than_the_history_is_told_to_read_afresh() {
    let server = TestServer::with_config(baton::server::Config {
        watch_history: 8,
        ..fast_config()
    })
    .await;
    let proxy = Proxy::start(server.addr().parse().unwrap()).await;
    let watcher = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    let writer = server.client().await;
    writer
        .create("/h", "0", CreateMode::Persistent)
        .await
        .unwrap();
    let mut w = watcher.watch("/h", false).await.unwrap();
    // Away (every connection refused) while 20 changes are made.
    proxy.block();
    proxy.sever();
    for i in 1..=20 {
        writer.set_data("/h", i.to_string(), None).await.unwrap();
    }
    proxy.unblock();
    let e = within(10, "the compacted event", w.next()).await.unwrap();
    assert_eq!((e.kind, e.path.as_str()), (EventKind::Compacted, "/h"));
    // It reads afresh, then events go on.
    let (data, _) = watcher.get_data("/h").await.unwrap();
    assert_eq!(&data[..], b"20");
    writer.set_data("/h", "21", None).await.unwrap();
    let e = within(10, "the next change", w.next()).await.unwrap();
    assert_eq!(e.kind, EventKind::DataChanged);
    watcher.close().await;
    writer.close().await;
    server.stop().await;
}

/// A watch set from the revision of what was read misses nothing changed
/// in between, and is told when the history does not go back that far.
#[tokio::test]
async fn a_watch_from_a_revision_replays_the_changes_since() {
    let server = TestServer::with_config(baton::server::Config {
        watch_history: 16,
        ..fast_config()
    })
    .await;
    let c = server.client().await;
    let created = c.create("/r", "0", CreateMode::Persistent).await.unwrap();
    let read_at = created.stat.mzxid;
    c.set_data("/r", "1", None).await.unwrap();
    c.create("/r/x", "", CreateMode::Persistent).await.unwrap();
    let mut w = c.watch_from("/r", false, read_at).await.unwrap();
    let got: Vec<(EventKind, String)> = take(&mut w, 2)
        .await
        .into_iter()
        .map(|(k, p, _)| (k, p))
        .collect();
    assert_eq!(
        got,
        [
            (EventKind::DataChanged, "/r".to_string()),
            (EventKind::ChildrenChanged, "/r".to_string())
        ]
    );
    for i in 0..20 {
        c.set_data("/r", i.to_string(), None).await.unwrap();
    }
    let mut late = c.watch_from("/r", true, read_at).await.unwrap();
    let e = within(10, "the compacted event", late.next())
        .await
        .unwrap();
    assert_eq!(e.kind, EventKind::Compacted);
    c.close().await;
    server.stop().await;
}

/// Persistent watches count against the session's watch budget with its
/// other watches: past it, either kind is refused.
#[tokio::test]
async fn persistent_watches_share_the_watch_budget() {
    // The smallest budget a server takes: room for two watches of 2,000-byte
    // paths (2,064 bytes each), not for a third of any length.
    let server = TestServer::with_config(baton::server::Config {
        max_watch_bytes: 4_160,
        ..fast_config()
    })
    .await;
    let c = server.client().await;
    let long = |name: char| format!("/{}", name.to_string().repeat(1_999));
    let _a = c.watch(&long('a'), false).await.unwrap();
    let _b = c.watch(&long('b'), true).await.unwrap();
    let over = |r: baton::Result<()>| {
        matches!(
            r,
            Err(baton::Error::Server {
                code: baton::proto::ErrorCode::TooManyWatches,
                ..
            })
        )
    };
    assert!(
        over(c.watch("/c", false).await.map(drop)),
        "a third persistent watch"
    );
    assert!(
        over(c.exists_watch("/c").await.map(drop)),
        "a one-shot watch past the budget"
    );
    c.close().await;
    server.stop().await;
}
