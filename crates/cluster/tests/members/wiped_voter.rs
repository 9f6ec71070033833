//! A voter wiped and started empty while still a voter, then "added again"
//! (what `baton chaos` did in the 3-member run of seed 1014 at 17:05:52:
//! it took a removal that had failed for one that had been made).
//!
//! The leader still holds the member's progress (how far it matched), so
//! the empty member's answer that it lacks the entry there is a log that
//! went back. The leader must not hand that answer to openraft: openraft
//! 0.9 (without `loosen-follower-log-revert`) only debug-asserts a
//! conflict below the matching index, and in a release build goes on with
//! a searching end below the matching index, whose binary search wraps
//! around and sends an append with no previous log id and the entries from
//! the first one the leader holds: the empty member takes them, and stops
//! on applying them from index 0 ("try to get log at index 0 but got
//! Some(N)"), N the first entry the leader kept behind its snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use baton_client::CreateMode;
use baton_cluster::admin::Change;
use baton_cluster::{ClusterMember, MemberConfig};
use openraft::ServerState;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

struct Running {
    raft: baton_cluster::types::Raft,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

async fn start(config: MemberConfig, clients: TcpListener, peers: TcpListener) -> Running {
    let member = ClusterMember::start(config, clients, peers).await.unwrap();
    let raft = member.raft().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        member
            .run(async {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.to_string())
    });
    Running {
        raft,
        stop: Some(stop),
        task,
    }
}

fn config(id: u64, root: &std::path::Path) -> MemberConfig {
    let mut config = MemberConfig::new(id, root.join(format!("m{id}")));
    config.server.min_session_timeout = Duration::from_millis(500);
    // Snapshots (and purges behind them) every few entries, as in the
    // chaos run, so that the leader's log no longer starts at index 0.
    config.snapshot_every = 16;
    config
}

async fn leader_of(members: &BTreeMap<u64, Running>) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        for (id, m) in members {
            let metrics = m.raft.metrics().borrow().clone();
            if metrics.state == ServerState::Leader {
                return *id;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pins: a voter whose data directory is wiped, started empty and added
/// again without having been removed is found to have gone back and is
/// told to stop; the leader neither stops nor sends it entries it cannot
/// place (before the fix: openraft's debug assertion "follower log
/// reversion is not allowed" in the leader's core in a debug build, and in
/// a release build the empty member stopping on "'LogIndex(0)' violates:
/// 'try to get log at index 0 but got Some(N)'").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_wiped_and_added_again_without_a_removal_is_told_it_went_back() {
    let root = std::env::temp_dir().join(format!("baton-wiped-voter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (listeners, initial) = crate::common::bind_members(3).await;
    let mut members = BTreeMap::new();
    for (id, (clients, peers)) in listeners {
        let mut c = config(id, &root);
        c.initial = Some(initial.clone());
        members.insert(id, start(c, clients, peers).await);
    }
    let addrs: Vec<String> = initial.values().map(|m| m.client.clone()).collect();
    let client = crate::common::client_of(&addrs).await;
    // Enough entries for a few snapshots: the leader purges its log behind
    // them (it keeps `snapshot_every` entries behind the last one).
    for i in 0..100 {
        client
            .create(&format!("/n{i}"), "v", CreateMode::Persistent)
            .await
            .unwrap();
    }
    let leader = leader_of(&members).await;
    let wiped = (1..=3).find(|id| *id != leader).unwrap();
    // Every member holds every entry: the leader's progress for the member
    // to be wiped matches far into the log.
    let last = members[&leader].raft.metrics().borrow().last_log_index;
    for m in members.values() {
        m.raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|x| x.last_applied.map(|l| l.index) >= last, "caught up")
            .await
            .unwrap();
    }

    // Killed and wiped while still a voter (no removal).
    let mut gone = members.remove(&wiped).unwrap();
    let _ = gone.stop.take().map(|s| s.send(()));
    let _ = gone.task.await;
    std::fs::remove_dir_all(root.join(format!("m{wiped}"))).unwrap();

    // "Added again", as `baton cluster add` asks the leader: it takes the
    // member for a new one, though it is still a voter.
    let leader_raft = members[&leader].raft.clone();
    let before = leader_raft
        .metrics()
        .borrow()
        .membership_config
        .log_id()
        .map(|l| l.index);
    let add = {
        let peer = initial[&leader].peer.clone();
        let member = initial[&wiped].clone();
        tokio::spawn(async move {
            baton_cluster::network::ask_change(
                &peer,
                Change::Add {
                    id: wiped,
                    member,
                    observer: false,
                },
                Duration::from_secs(60),
                None,
            )
            .await
        })
    };
    // The add is under way (its membership entry appended) before the
    // empty member answers.
    leader_raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(
            |m| m.membership_config.log_id().map(|l| l.index) > before,
            "the add's membership entry",
        )
        .await
        .expect("the leader takes the add");

    // Started empty, on the addresses it had.
    let clients = TcpListener::bind(&initial[&wiped].client).await.unwrap();
    let peers = TcpListener::bind(&initial[&wiped].peer).await.unwrap();
    let fresh = start(config(wiped, &root), clients, peers).await;

    // It is told its data went back, and stops saying so.
    let stopped = tokio::time::timeout(Duration::from_secs(20), fresh.task)
        .await
        .expect("the wiped member stops")
        .unwrap();
    let why = stopped.expect_err("the wiped member reports why it stopped");
    let purged = leader_raft.metrics().borrow().purged;
    assert!(
        why.contains("data went back"),
        "the wiped member stopped for another reason: {why} (the leader's log purged up to {purged:?})"
    );
    // The leader goes on leading.
    let m = leader_raft.metrics().borrow().clone();
    assert!(
        m.running_state.is_ok(),
        "the leader stopped: {:?}",
        m.running_state
    );
    assert_eq!(m.state, ServerState::Leader);

    add.abort();
    client.close().await;
    for m in members.into_values() {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}
