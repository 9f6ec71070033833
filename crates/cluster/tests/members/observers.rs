//! Observers: members that serve clients (reads and watches from their own
//! state, changes forwarded to the leader) but never vote nor lead. One is
//! added to a running 3-member cluster, serves a session of each read mode
//! and a ZooKeeper client, goes on serving when the leader is stopped
//! (without standing for election), is made a voter and an observer again,
//! and stops once removed.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::Running;
use baton_client::{Client, CreateMode, ReadMode};
use baton_cluster::admin::Change;
use baton_cluster::{Member, MemberConfig};
use tokio::net::TcpListener;
use tokio::time::{timeout, Instant};

fn config(id: u64, root: &std::path::Path) -> MemberConfig {
    let mut config = MemberConfig::new(id, root.join(format!("m{id}")));
    config.server.min_session_timeout = Duration::from_millis(500);
    config.server.zk_listen = Some("127.0.0.1:0".parse().unwrap());
    config
}

async fn status(addr: &str) -> serde_json::Value {
    let answer = baton_client::probe(addr, Duration::from_secs(5), None)
        .await
        .unwrap();
    serde_json::from_str(&answer).unwrap()
}

/// The member's role in the cluster (leader, follower, learner, ...) as
/// its status says it.
fn own_role(status: &serde_json::Value) -> String {
    let id = &status["cluster"]["id"];
    status["cluster"]["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| &m["id"] == id))
        .and_then(|m| m["role"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The member that leads, as the members at `addrs` (by id) say, once one
/// does; not any of `not`.
async fn leader(addrs: &BTreeMap<u64, String>, not: &[u64]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for (id, addr) in addrs {
            if not.contains(id) {
                continue;
            }
            if let Ok(answer) = baton_client::probe(addr, Duration::from_secs(2), None).await {
                let status: serde_json::Value = serde_json::from_str(&answer).unwrap();
                if status["role"] == "leader" && status["serves_clients"] == true {
                    return *id;
                }
            }
        }
        assert!(Instant::now() < deadline, "no member leads");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader's description of member `id`, once `ready` holds for it.
async fn described(
    leader_addr: &str,
    id: u64,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = status(leader_addr).await;
        let me = status["cluster"]["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["id"] == id).cloned())
            .unwrap_or_default();
        if ready(&me) {
            return me;
        }
        assert!(Instant::now() < deadline, "member {id} is not {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the member at `addr` serves clients as an observer (a
/// learner that follows the leader).
async fn serving_observer(addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(addr).await;
        if own_role(&s) == "learner" && s["role"] == "follower" && s["serves_clients"] == true {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the observer does not serve: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Adds member 4 at `member`, as an observer or as a voter.
fn add4(member: &Member, observer: bool) -> Change {
    Change::Add {
        id: 4,
        member: member.clone(),
        observer,
    }
}

async fn change(peer: &str, change: Change) -> Result<String, String> {
    baton_cluster::network::ask_change(peer, change, Duration::from_secs(60), None)
        .await
        .map_err(|e| e.to_string())
}

async fn session(addr: &str, mode: ReadMode) -> Client {
    Client::builder(addr)
        .read_mode(mode)
        .session_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("a session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_serves_clients_never_votes_and_can_be_made_a_voter_and_back() {
    use zookeeper_client as zk;
    let root = std::env::temp_dir().join(format!("baton-observers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (listeners, initial) = crate::common::bind_members(3).await;
    let mut members: BTreeMap<u64, Running> = BTreeMap::new();
    for (id, (clients, peers)) in listeners {
        let mut c = config(id, &root);
        c.initial = Some(initial.clone());
        members.insert(id, crate::common::run_member(c, clients, peers).await);
    }
    let mut addrs: BTreeMap<u64, String> = initial
        .iter()
        .map(|(id, m)| (*id, m.client.clone()))
        .collect();
    let first = leader(&addrs, &[]).await;

    // Member 4 starts empty, waiting to be added, and is added as an
    // observer.
    let clients = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peers = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let member4 = Member {
        peer: peers.local_addr().unwrap().to_string(),
        client: clients.local_addr().unwrap().to_string(),
    };
    let mut observer = crate::common::run_member(config(4, &root), clients, peers).await;
    addrs.insert(4, observer.client.clone());
    let writer = session(&addrs[&first], ReadMode::Linearizable).await;
    writer
        .create("/k", "one", CreateMode::Persistent)
        .await
        .unwrap();
    let added = change(&initial[&first].peer, add4(&member4, true))
        .await
        .expect("member 4 added as an observer");
    assert!(added.contains("observer"), "{added}");
    let described4 = described(&addrs[&first], 4, |m| m["role"] == "learner").await;
    assert_eq!(described4["voter"], false, "{described4}");
    let leader_status = status(&addrs[&first]).await;
    assert_eq!(
        leader_status["cluster"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["voter"] == true)
            .count(),
        3,
        "the observer does not vote: {leader_status}"
    );

    // It serves clients itself: a sequential session reads there, a sync
    // catches it up, a watch set there fires on a change made on the
    // leader, and a change made there is forwarded to the leader.
    serving_observer(&observer.client).await;
    let sequential = session(&observer.client, ReadMode::Sequential).await;
    let linearizable = session(&observer.client, ReadMode::Linearizable).await;
    sequential.sync().await.unwrap();
    let (data, _, watcher) = sequential.get_data_watch("/k").await.unwrap();
    assert_eq!(&data[..], b"one");
    assert_eq!(
        &linearizable.get_data("/k").await.unwrap().0[..],
        b"one",
        "a linearizable read on the observer"
    );
    let written = writer.set_data("/k", "two", None).await.unwrap();
    let event = timeout(Duration::from_secs(10), watcher.changed())
        .await
        .expect("the observer's watch fires")
        .unwrap();
    assert_eq!(event.path, "/k");
    let (data, stat) = sequential.get_data("/k").await.unwrap();
    assert_eq!((&data[..], stat.mzxid), (&b"two"[..], written.mzxid));
    sequential
        .create("/from-observer", "x", CreateMode::Persistent)
        .await
        .expect("a change made on the observer");
    assert_eq!(
        &writer.get_data("/from-observer").await.unwrap().0[..],
        b"x"
    );
    let on_observer = status(&observer.client).await["sessions_here"]
        .as_u64()
        .unwrap();
    assert_eq!(on_observer, 2, "both sessions stayed on the observer");
    // A ZooKeeper client there too.
    let zk_client = timeout(
        Duration::from_secs(20),
        zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(&observer.zk.to_string()),
    )
    .await
    .expect("a ZooKeeper session on the observer")
    .unwrap();
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    zk_client
        .create("/zk-on-observer", b"z", &open)
        .await
        .unwrap();
    assert_eq!(zk_client.get_data("/k").await.unwrap().0, b"two");

    // The leader stops: a voter takes over, never the observer, which goes
    // on serving its sessions.
    let mut gone = members.remove(&first).unwrap();
    let _ = gone.stop.take().unwrap().send(());
    let _ = gone.task.await;
    let voters: BTreeMap<u64, String> = addrs
        .iter()
        .filter(|(id, _)| **id != first)
        .map(|(id, a)| (*id, a.clone()))
        .collect();
    let second = leader(&voters, &[]).await;
    assert_ne!(second, 4, "the observer leads");
    sequential.sync().await.unwrap();
    assert_eq!(&sequential.get_data("/k").await.unwrap().0[..], b"two");
    sequential
        .set_data("/from-observer", "y", None)
        .await
        .expect("a change made on the observer under the new leader");
    let s = status(&observer.client).await;
    assert_eq!(own_role(&s), "learner", "{s}");

    // Made a voter: 4 voters (one of them stopped), which the answer warns
    // of (an even number); then an observer again.
    let promoted = change(&initial[&second].peer, add4(&member4, false))
        .await
        .expect("the observer made a voter");
    assert!(promoted.contains("votes"), "{promoted}");
    assert!(promoted.contains("4 voting members"), "{promoted}");
    described(&addrs[&second], 4, |m| m["voter"] == true).await;
    let demoted = change(&initial[&second].peer, add4(&member4, true))
        .await
        .expect("the voter made an observer");
    assert!(demoted.contains("observer"), "{demoted}");
    described(&addrs[&second], 4, |m| {
        m["voter"] == false && m["role"] == "learner"
    })
    .await;
    // Still serving, and its marker of a member being added is gone: a
    // restart does not wait to be added again.
    assert_eq!(&sequential.get_data("/k").await.unwrap().0[..], b"two");
    assert!(!root.join("m4/raft/JOINING").exists());

    // Restarted from its data directory, it is an observer still: it
    // catches up (a write made while it was down included) and serves.
    let _ = observer.stop.take().unwrap().send(());
    timeout(Duration::from_secs(20), &mut observer.task)
        .await
        .expect("the observer stops")
        .unwrap();
    // (The first writer knows only the member stopped above.)
    let live: Vec<String> = voters.values().cloned().collect();
    let writer = session(&live.join(","), ReadMode::Linearizable).await;
    let while_down = timeout(
        Duration::from_secs(20),
        writer.set_data("/k", "three", None),
    )
    .await
    .expect("a write while the observer is down")
    .unwrap();
    let clients = TcpListener::bind(&member4.client).await.unwrap();
    let peers = TcpListener::bind(&member4.peer).await.unwrap();
    observer = crate::common::run_member(config(4, &root), clients, peers).await;
    serving_observer(&observer.client).await;
    let again = session(&observer.client, ReadMode::Sequential).await;
    timeout(Duration::from_secs(20), again.sync())
        .await
        .expect("a sync on the restarted observer")
        .unwrap();
    let (data, stat) = again.get_data("/k").await.unwrap();
    assert_eq!((&data[..], stat.mzxid), (&b"three"[..], while_down.mzxid));
    described(&addrs[&second], 4, |m| m["voter"] == false).await;
    again.close().await;

    // Removed, the observer stops; a removal of a member that is not there
    // is refused, naming it.
    let removed = change(&initial[&second].peer, Change::Remove { id: 4 })
        .await
        .expect("the observer removed");
    assert!(removed.contains("observer 4 removed"), "{removed}");
    timeout(Duration::from_secs(20), &mut observer.task)
        .await
        .expect("the removed observer stops")
        .unwrap();
    let refused = change(&initial[&second].peer, Change::Remove { id: 4 })
        .await
        .expect_err("member 4 is gone");
    assert!(refused.contains("member 4 is not a member"), "{refused}");

    drop(zk_client);
    for c in [writer, sequential, linearizable] {
        c.close().await;
    }
    for m in members.values_mut() {
        let _ = m.stop.take().unwrap().send(());
    }
    for m in members.into_values() {
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(root);
}
