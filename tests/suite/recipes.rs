//! The counter and the barriers, under many contenders, cancellations and
//! sessions that end.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::recipes::{Barrier, Counter, DoubleBarrier};
use baton::{CreateMode, Error};
use baton_testkit::*;

/// 50 contenders on their own sessions add 1 each, 10 times, some adds
/// cancelled mid-flight: every add that returned got a value of its own,
/// and the final value counts every returned add and no more adds than
/// were started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_adds_are_atomic_under_fifty_contenders_with_cancellations() {
    let server = TestServer::start().await;
    let returned = Arc::new(Mutex::new(Vec::new()));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for contender in 0..50u64 {
        let client = server.client().await;
        let (returned, cancelled) = (returned.clone(), cancelled.clone());
        tasks.push(tokio::spawn(async move {
            let counter = Counter::new(&client, "/counters/c");
            for i in 0..10u64 {
                // About one add in eight gets a deadline too short to finish.
                if (contender * 7 + i * 3) % 8 == 0 {
                    let add = counter.add(1);
                    if tokio::time::timeout(Duration::from_micros(50), add)
                        .await
                        .is_err()
                    {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // It finished in time after all: it is a returned add,
                        // but its value is not known here.
                        returned.lock().unwrap().push(None);
                    }
                    continue;
                }
                let value = counter.add(1).await.unwrap();
                returned.lock().unwrap().push(Some(value));
            }
            client.close().await;
        }));
    }
    for t in tasks {
        within(60, "the contenders", t).await.unwrap();
    }
    let reader = server.client().await;
    let total = Counter::new(&reader, "/counters/c").get().await.unwrap();
    let returned = std::mem::take(&mut *returned.lock().unwrap());
    let values: Vec<i64> = returned.iter().flatten().copied().collect();
    let distinct: BTreeSet<i64> = values.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        values.len(),
        "two adds returned the same value"
    );
    let cancelled = cancelled.load(Ordering::Relaxed) as i64;
    let done = returned.len() as i64;
    assert!(
        total >= done && total <= done + cancelled,
        "{total} after {done} returned adds and {cancelled} cancelled"
    );
    assert!(*distinct.last().unwrap() <= total);
    reader.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_counter_counts_down_reads_an_empty_node_as_zero_and_refuses_text_and_overflow() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let counter = Counter::new(&c, "/deep/path/c");
    assert_eq!(counter.get().await.unwrap(), 0);
    assert_eq!(counter.add(5).await.unwrap(), 5);
    assert_eq!(counter.add(-7).await.unwrap(), -2);
    c.create("/empty", "", CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(Counter::new(&c, "/empty").add(3).await.unwrap(), 3);
    c.create("/text", "hello", CreateMode::Persistent)
        .await
        .unwrap();
    let err = Counter::new(&c, "/text").add(1).await.unwrap_err();
    assert!(
        matches!(&err, Error::BadArguments(m) if m.contains("\"hello\"")),
        "{err}"
    );
    c.set_data("/empty", i64::MAX.to_string(), None)
        .await
        .unwrap();
    let err = Counter::new(&c, "/empty").add(1).await.unwrap_err();
    assert!(
        matches!(&err, Error::BadArguments(m) if m.contains("range")),
        "{err}"
    );
    assert_eq!(Counter::new(&c, "/empty").get().await.unwrap(), i64::MAX);
    c.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_holds_every_waiter_until_it_is_removed() {
    let server = TestServer::start().await;
    let coordinator = server.client().await;
    let gate = Barrier::new(&coordinator, "/barriers/deploy");
    gate.set().await.unwrap();
    gate.set().await.unwrap();
    let through = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for _ in 0..10 {
        let client = server.client().await;
        let through = through.clone();
        waiters.push(tokio::spawn(async move {
            Barrier::new(&client, "/barriers/deploy")
                .wait()
                .await
                .unwrap();
            through.fetch_add(1, Ordering::SeqCst);
            client.close().await;
        }));
    }
    // Every waiter is waiting: ten exists watches on the gate.
    eventually(10, "the waiters' watches", || server.stats().watches >= 10).await;
    assert_eq!(through.load(Ordering::SeqCst), 0);
    gate.remove().await.unwrap();
    for w in waiters {
        within(10, "a waiter let through", w).await.unwrap();
    }
    assert_eq!(through.load(Ordering::SeqCst), 10);
    // Open already: waiting returns at once, and removing again is fine.
    gate.wait().await.unwrap();
    gate.remove().await.unwrap();
    coordinator.close().await;
    server.stop().await;
}

/// Seven parties with random delays: none leaves `enter` before all seven
/// entered, none leaves `leave` before all seven started leaving; twice in
/// a row on the same barrier, and a party whose session ends while it waits
/// to leave is counted out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_barrier_lets_parties_in_together_and_out_together() {
    const PARTIES: usize = 7;
    let server = TestServer::start().await;
    for round in 0..2 {
        let entering = Arc::new(AtomicUsize::new(0));
        let leaving = Arc::new(AtomicUsize::new(0));
        let mut parties = Vec::new();
        for p in 0..PARTIES {
            let client = server.client().await;
            let (entering, leaving) = (entering.clone(), leaving.clone());
            parties.push(tokio::spawn(async move {
                let barrier = DoubleBarrier::new(&client, "/barriers/job", PARTIES);
                tokio::time::sleep(Duration::from_millis((p as u64 * 13 + round * 5) % 40)).await;
                entering.fetch_add(1, Ordering::SeqCst);
                let entered = barrier.enter().await.unwrap();
                assert_eq!(
                    entering.load(Ordering::SeqCst),
                    PARTIES,
                    "in before everyone"
                );
                tokio::time::sleep(Duration::from_millis((p as u64 * 17) % 30)).await;
                leaving.fetch_add(1, Ordering::SeqCst);
                entered.leave().await.unwrap();
                assert_eq!(
                    leaving.load(Ordering::SeqCst),
                    PARTIES,
                    "out before everyone"
                );
                client.close().await;
            }));
        }
        for p in parties {
            within(30, "the parties", p).await.unwrap();
        }
        // Nothing left behind: the barrier can be used again.
        let c = server.client().await;
        let (children, _) = c.get_children("/barriers/job").await.unwrap();
        assert!(children.is_empty(), "round {round} left {children:?}");
        c.close().await;
    }

    // A party whose session ends while the others wait to leave.
    let quick = server.client_with_timeout(Duration::from_secs(2)).await;
    let stays = server.client().await;
    let (a, b) = (
        DoubleBarrier::new(&quick, "/barriers/two", 2),
        DoubleBarrier::new(&stays, "/barriers/two", 2),
    );
    let (ea, eb) = within(10, "both in", async { tokio::join!(a.enter(), b.enter()) }).await;
    let (_ea, eb) = (ea.unwrap(), eb.unwrap());
    let leave = tokio::spawn(eb.leave());
    quick.close().await;
    within(10, "the last one out", leave)
        .await
        .unwrap()
        .unwrap();
    stays.close().await;
    server.stop().await;
}

/// What the server holds under `root`: every node's data, by path.
async fn tree_of(c: &baton::Client, root: &str) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut pending = vec![root.to_owned()];
    while let Some(path) = pending.pop() {
        if let Ok((data, _)) = c.get_data(&path).await {
            if let Ok((names, _)) = c.get_children(&path).await {
                pending.extend(names.iter().map(|n| format!("{path}/{n}")));
            }
            out.insert(path, data.to_vec());
        }
    }
    out
}

/// A tree cache follows 200 random changes, made while its connection is
/// cut now and then, and ends equal to the server's tree; a node cache
/// follows its node; the stream reports the changes in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_follow_every_change_across_cut_connections() {
    use baton::recipes::{CacheEvent, NodeCache, TreeCache};
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr().parse().unwrap()).await;
    let follower = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    let writer = server.client().await;
    writer
        .create("/cfg", "root", CreateMode::Persistent)
        .await
        .unwrap();
    writer
        .create("/cfg/a", "1", CreateMode::Persistent)
        .await
        .unwrap();
    let tree = TreeCache::start(&follower, "/cfg").await.unwrap();
    let node = NodeCache::start(&follower, "/cfg/a").await.unwrap();
    assert_eq!(&tree.get("/cfg/a").unwrap().0[..], b"1");
    assert_eq!(tree.children("/cfg"), ["a"]);
    let mut changes = tree.changes();
    writer.set_data("/cfg/a", "2", None).await.unwrap();
    let first = within(10, "the first change", changes.recv())
        .await
        .unwrap();
    assert_eq!(
        first,
        CacheEvent::Updated {
            path: "/cfg/a".into(),
            data: bytes::Bytes::from_static(b"2")
        }
    );
    let mut seed = 7u64;
    let mut rand = |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (seed >> 33) % n
    };
    for i in 0..200 {
        let path = format!("/cfg/n{}", rand(8));
        let child = format!("{path}/c");
        let _ = match rand(4) {
            0 => writer
                .create(&path, i.to_string(), CreateMode::Persistent)
                .await
                .map(drop),
            1 => writer.set_data(&path, i.to_string(), None).await.map(drop),
            2 => writer
                .create(&child, i.to_string(), CreateMode::Persistent)
                .await
                .map(drop),
            _ => {
                let _ = writer.delete(&child, None).await;
                writer.delete(&path, None).await
            }
        };
        if i % 50 == 25 {
            proxy.sever();
        }
    }
    writer.set_data("/cfg/a", "last", None).await.unwrap();
    let want = tree_of(&writer, "/cfg").await;
    eventually(10, "the cache to catch up", || {
        let have: std::collections::BTreeMap<String, Vec<u8>> = tree
            .snapshot()
            .into_iter()
            .map(|(p, (d, _))| (p, d.to_vec()))
            .collect();
        have == want
    })
    .await;
    eventually(10, "the node cache to catch up", || {
        node.get().is_some_and(|(d, _)| &d[..] == b"last")
    })
    .await;
    writer.delete("/cfg/a", None).await.unwrap();
    eventually(10, "the node cache to see the deletion", || {
        node.get().is_none()
    })
    .await;
    assert!(tree.is_following());
    follower.close().await;
    writer.close().await;
    server.stop().await;
}
