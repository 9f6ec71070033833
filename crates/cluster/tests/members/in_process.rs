//! A three-member cluster in one process, on loopback: the replicated path
//! end to end, quickly.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::Running;
use baton_client::{Client, CreateMode, Lock};
use baton_cluster::network::PeerTls;
use baton_cluster::{ClusterMember, Member, MemberConfig};
use tokio::net::TcpListener;

struct Cluster {
    members: Vec<Running>,
    peers: Vec<String>,
}

async fn cluster(n: u64, name: &str) -> (Vec<Running>, std::path::PathBuf) {
    let (c, root) = cluster_with(n, name, None).await;
    (c.members, root)
}

async fn cluster_with(n: u64, name: &str, tls: Option<PeerTls>) -> (Cluster, std::path::PathBuf) {
    cluster_opts(n, name, tls, false).await
}

async fn cluster_opts(
    n: u64,
    name: &str,
    tls: Option<PeerTls>,
    followers_serve: bool,
) -> (Cluster, std::path::PathBuf) {
    let root = std::env::temp_dir().join(format!("baton-inproc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (listeners, initial) = crate::common::bind_members(n).await;
    let mut running = Vec::new();
    let peer_addrs = initial.values().map(|m| m.peer.clone()).collect();
    for (id, (clients, peers)) in listeners {
        let mut config = MemberConfig::new(id, root.join(format!("m{id}")));
        config.initial = Some(initial.clone());
        config.server.min_session_timeout = Duration::from_millis(500);
        config.peer_tls = tls.clone();
        config.followers_serve = followers_serve;
        config.server.zk_listen = Some("127.0.0.1:0".parse().unwrap());
        running.push(crate::common::run_member(config, clients, peers).await);
    }
    (
        Cluster {
            members: running,
            peers: peer_addrs,
        },
        root,
    )
}

/// The index of the member that leads now: the one that takes a new
/// session itself (the others refuse with `not-leader`, naming it), asked
/// until one does (an election may be under way).
async fn leader_of(members: &[Running]) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        for (i, m) in members.iter().enumerate() {
            let mut raw = baton_testkit::Raw::connect(&m.client).await;
            let request = baton_proto::ConnectRequest::new(10_000);
            if raw.handshake(&request).await.result.is_ok() {
                return i;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no member leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The index of the member whose status says it leads, asked until one
/// does.
async fn leader_by_status(members: &[Running]) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        for (i, m) in members.iter().enumerate() {
            if let Ok(answer) = baton_client::probe(&m.client, Duration::from_secs(1), None).await {
                let status: serde_json::Value = serde_json::from_str(&answer).unwrap();
                if status["role"] == "leader" {
                    return i;
                }
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no member leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client of member `m` alone.
async fn client_on(m: &Running) -> Client {
    Client::builder(&m.client)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("a session on the member")
}

/// Followers serve clients: a follower's client writes (forwarded to the
/// leader) and reads its own writes at once, is told of a change made on
/// the leader by a watch set on the follower, waits in a lock's queue there
/// and is granted the lock when the leader's client releases it, with a
/// greater token; its ephemeral node goes when it closes; and once the
/// leader is gone, its session resumes on a member that is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_serve_reads_watches_and_locks_and_forward_changes() {
    let (cluster, root) = cluster_opts(3, "serving", None, true).await;
    let mut members = cluster.members;
    let leader = leader_by_status(&members).await;
    let follower = (leader + 1) % members.len();
    let status_of = |m: &Running| {
        let addr = m.client.clone();
        async move {
            let answer = baton_client::probe(&addr, Duration::from_secs(5), None)
                .await
                .unwrap();
            serde_json::from_str::<serde_json::Value>(&answer).unwrap()
        }
    };
    // Once the follower has heard from the leader, it serves.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = status_of(&members[follower]).await;
        assert_eq!(status["role"], "follower", "{status}");
        if status["serves_clients"] == true {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower does not serve: {status}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let on_leader = client_on(&members[leader]).await;
    let on_follower = client_on(&members[follower]).await;
    // The follower's client is the follower's own (not sent to the leader).
    let status = status_of(&members[follower]).await;
    assert_eq!(status["sessions_here"], 1, "{status}");

    // Its own writes, read back at once through the follower.
    on_follower
        .create("/f", "one", CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(&on_follower.get_data("/f").await.unwrap().0[..], b"one");
    on_follower.set_data("/f", "two", Some(0)).await.unwrap();
    assert_eq!(&on_follower.get_data("/f").await.unwrap().0[..], b"two");
    // A write on the leader is seen by the follower's next read
    // (linearizable reads), and fires the watch set there.
    let (_, _, watch) = on_follower.get_data_watch("/f").await.unwrap();
    on_leader.set_data("/f", "three", None).await.unwrap();
    assert_eq!(&on_follower.get_data("/f").await.unwrap().0[..], b"three");
    tokio::time::timeout(Duration::from_secs(10), watch)
        .await
        .expect("the follower's watch fires")
        .unwrap();

    // A lock held on the leader, waited for on the follower.
    let held = Lock::new(&on_leader, "/locks/s").acquire().await.unwrap();
    let first = held.token();
    let waiting = {
        let c = on_follower.detached();
        tokio::spawn(async move { Lock::new(&c, "/locks/s").acquire().await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while on_leader.get_children("/locks/s").await.unwrap().0.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower's client did not queue"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the follower's client gets the lock")
        .unwrap()
        .unwrap();
    assert!(granted.token() > first, "{} after {first}", granted.token());
    granted.release().await.unwrap();

    // A ZooKeeper client of the follower alone is served there too, and
    // sees what the leader's client wrote.
    {
        use zookeeper_client as zk;
        let zk = tokio::time::timeout(
            Duration::from_secs(20),
            zk::Client::connector()
                .with_session_timeout(Duration::from_secs(10))
                .connect(&members[follower].zk.to_string()),
        )
        .await
        .expect("a ZooKeeper session on the follower")
        .unwrap();
        assert_eq!(zk.get_data("/f").await.unwrap().0, b"three");
        let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        zk.create("/from-zk", b"z", &open).await.unwrap();
        assert_eq!(&on_leader.get_data("/from-zk").await.unwrap().0[..], b"z");
        drop(zk);
    }

    // An ephemeral node of the follower's session goes when it closes.
    on_follower
        .create("/e", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    assert!(on_leader.exists("/e").await.unwrap().is_some());
    on_follower.close().await;
    assert!(on_leader.exists("/e").await.unwrap().is_none());

    // A session on a follower outlives the leader.
    let addrs: Vec<String> = members.iter().map(|m| m.client.clone()).collect();
    let rotated: Vec<String> = addrs[follower..]
        .iter()
        .chain(&addrs[..follower])
        .cloned()
        .collect();
    let survivor = crate::common::client_of(&rotated).await;
    survivor
        .create("/s", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let id = survivor.session_id();
    on_leader.close().await;
    let gone = members.remove(leader);
    let _ = gone.stop.map(|s| s.send(()));
    let _ = gone.task.await;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(Some(stat)) = survivor.exists("/s").await {
                return stat;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the survivor's session answers after the leader went");
    assert_eq!(seen.ephemeral_owner, id.0);
    assert_eq!(survivor.session_id(), id);
    survivor.close().await;
    for m in members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Members that use mutual TLS between them elect a leader and replicate,
/// and take no connection without a certificate from their authority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_with_mutual_tls_replicate_and_refuse_strangers() {
    let root = std::env::temp_dir().join(format!("baton-inproc-tls-pki-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (ours, theirs) = (
        baton_testkit::pki::make_pki(&root.join("pki"), "members"),
        baton_testkit::pki::make_pki(&root.join("pki"), "strangers"),
    );
    let tls = PeerTls::from_files(&ours.server_cert, &ours.server_key, &ours.ca).unwrap();
    let (cluster, data) = cluster_with(3, "tls", Some(tls.clone())).await;
    let addrs: Vec<String> = cluster.members.iter().map(|m| m.client.clone()).collect();
    let client = Client::builder(&addrs.join(","))
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("a session on the cluster");
    client
        .create("/over-tls", "v", CreateMode::Persistent)
        .await
        .unwrap();
    let guard = Lock::new(&client, "/locks/t").acquire().await.unwrap();
    guard.release().await.unwrap();

    let peer = &cluster.peers[0];
    let limit = Duration::from_secs(5);
    let status = baton_cluster::network::status_of(0, peer, peer, limit, Some(&tls)).await;
    assert!(status.is_ok(), "{status:?}");
    // Plain TCP, or a certificate of another authority: refused.
    assert!(
        baton_cluster::network::status_of(0, peer, peer, limit, None)
            .await
            .is_err()
    );
    let stranger = PeerTls::from_files(&theirs.server_cert, &theirs.server_key, &ours.ca).unwrap();
    let refused = baton_cluster::network::status_of(0, peer, peer, limit, Some(&stranger)).await;
    assert!(refused.is_err(), "{refused:?}");
    client.close().await;
    for m in cluster.members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_serve_locks_and_survive_the_loss_of_the_leader() {
    let (mut members, root) = cluster(3, "basic").await;
    let addrs: Vec<String> = members.iter().map(|m| m.client.clone()).collect();
    let client = crate::common::client_of(&addrs).await;
    client
        .create("/a", "one", CreateMode::Persistent)
        .await
        .unwrap();
    let (data, _) = client.get_data("/a").await.unwrap();
    assert_eq!(&data[..], b"one");
    // A transaction is one replicated change; a failed one changes nothing.
    let committed = client
        .txn()
        .create("/t", "", CreateMode::Persistent)
        .create("/t/n-", "", CreateMode::PersistentSequential)
        .set_data("/a", "two", Some(0))
        .commit()
        .await
        .unwrap();
    assert_eq!(committed.len(), 3);
    let failed = client
        .txn()
        .create("/u", "", CreateMode::Persistent)
        .check_version("/a", 0)
        .commit()
        .await;
    assert!(
        matches!(failed, Err(baton_client::Error::TxnFailed { index: 1, .. })),
        "{failed:?}"
    );
    let guard = Lock::new(&client, "/locks/x").acquire().await.unwrap();
    let first = guard.token();
    guard.release().await.unwrap();

    // Stop whichever member the client is on (the leader).
    let stats_before = client.server_stats().await.unwrap();
    let leader_addr = leader_of(&members).await;
    let _ = stats_before;
    let gone = members.remove(leader_addr);
    let _ = gone.stop.map(|s| s.send(()));
    let _ = gone.task.await;

    let (data, _) = tokio::time::timeout(Duration::from_secs(10), client.get_data("/a"))
        .await
        .expect("the cluster answers after the leader went")
        .unwrap();
    assert_eq!(&data[..], b"two");
    let (children, _) = client.get_children("/t").await.unwrap();
    assert_eq!(children.len(), 1);
    assert!(client.exists("/u").await.unwrap().is_none());
    let guard = Lock::new(&client, "/locks/x").acquire().await.unwrap();
    assert!(guard.token() > first, "{} after {first}", guard.token());
    guard.release().await.unwrap();
    client.close().await;
    for m in members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The greeting a member sends first on a peer connection, as its bytes on
/// the wire: magic, protocol version and sender id, behind the frame length.
fn hello_frame(from: u64) -> Vec<u8> {
    let mut body = b"BATNPEER".to_vec();
    body.extend_from_slice(&2u16.to_le_bytes());
    body.extend_from_slice(&from.to_le_bytes());
    framed(&body)
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// Writes `bytes` to the peer port `addr` and waits for the member to hang
/// up, which it must do well before the 5 s it gives a silent peer.
async fn member_hangs_up_on(addr: &str, bytes: &[u8], what: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The member may hang up while this is still being written.
    let _ = conn.write_all(bytes).await;
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(4), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "{addr} kept the connection after {what}");
}

/// Whoever reaches a member's peer port with bytes that are not a member's
/// (noise, a frame too large for a greeting, a greeting followed by a
/// request that does not decode) has only that connection closed; no room
/// is set aside for a frame before the peer has greeted, and the cluster
/// goes on replicating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_hang_up_on_bad_peer_bytes_and_go_on_serving() {
    let (cluster, root) = cluster_with(3, "bad-peer-bytes", None).await;
    let addrs: Vec<String> = cluster.members.iter().map(|m| m.client.clone()).collect();
    let client = Client::builder(&addrs.join(","))
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("a session on the cluster");
    client
        .create("/before", "v", CreateMode::Persistent)
        .await
        .unwrap();

    // Deterministic noise.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    };
    for peer in &cluster.peers {
        // A frame header announcing 200 MiB before any greeting.
        member_hangs_up_on(peer, &(200u32 << 20).to_be_bytes(), "a 200 MiB first frame").await;
        // A greeting-sized frame of noise.
        member_hangs_up_on(peer, &framed(&noise(18)), "a first frame of noise").await;
        // A good greeting from another protocol version.
        let mut old = hello_frame(9);
        old[12] = 1;
        member_hangs_up_on(peer, &old, "a greeting of protocol version 1").await;
        // A good greeting, then requests that do not decode: noise, and a
        // request kind that does not exist.
        for body in [
            noise(300),
            [7u64.to_be_bytes().to_vec(), 99u32.to_le_bytes().to_vec()].concat(),
        ] {
            let mut bytes = hello_frame(9);
            bytes.extend(framed(&body));
            member_hangs_up_on(peer, &bytes, "an undecodable request").await;
        }
        // Unframed noise.
        member_hangs_up_on(peer, &noise(4096), "unframed noise").await;
    }

    // Every member still answers its peers, and the cluster replicates.
    for peer in &cluster.peers {
        let limit = Duration::from_secs(5);
        let status = baton_cluster::network::status_of(0, peer, peer, limit, None).await;
        assert!(status.is_ok(), "{peer}: {status:?}");
    }
    client
        .create("/after", "v", CreateMode::Persistent)
        .await
        .unwrap();
    let guard = Lock::new(&client, "/locks/after").acquire().await.unwrap();
    guard.release().await.unwrap();
    client.close().await;
    for m in cluster.members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A member whose replicated log stops on its own (as when its storage
/// fails) does not go on serving as if nothing happened: it stops, saying
/// why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_replicated_log_stops_stops_with_an_error() {
    let root = std::env::temp_dir().join(format!("baton-inproc-stops-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let clients = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peers = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = MemberConfig::new(1, root.join("m1"));
    config.initial = Some(BTreeMap::from([(
        1,
        Member {
            peer: peers.local_addr().unwrap().to_string(),
            client: clients.local_addr().unwrap().to_string(),
        },
    )]));
    let member = ClusterMember::start(config, clients, peers).await.unwrap();
    let raft = member.raft().clone();
    let run = tokio::spawn(member.run(std::future::pending()));
    raft.shutdown().await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the member stops")
        .unwrap();
    let err = result.expect_err("the member reports why it stopped");
    assert!(
        err.to_string().contains("the replicated log stopped"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A recursive persistent watch delivers every change, in order and once,
/// while the leader it was set on is stopped and another takes over: the
/// client sets it again on the new leader from the revision it had
/// reached, and the new leader, which recorded the same events as it
/// applied the log, replays what was missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_watch_misses_nothing_across_the_loss_of_the_leader() {
    let (mut members, root) = cluster(3, "persistent").await;
    let addrs: Vec<String> = members.iter().map(|m| m.client.clone()).collect();
    let watcher = crate::common::client_of(&addrs).await;
    let writer = crate::common::client_of(&addrs).await;
    writer
        .create("/w", "", CreateMode::Persistent)
        .await
        .unwrap();
    let mut w = watcher.watch("/w", true).await.unwrap();
    let limit = Duration::from_secs(15);
    let mut expected = Vec::new();
    for i in 0..40 {
        if i == 20 {
            // Stop the leader: the member both clients are on.
            let leader = leader_of(&members).await;
            let gone = members.remove(leader);
            let _ = gone.stop.map(|s| s.send(()));
            let _ = gone.task.await;
        }
        let node = format!("/w/n{i}");
        tokio::time::timeout(limit, writer.create(&node, "", CreateMode::Persistent))
            .await
            .expect("the cluster answers")
            .unwrap();
        expected.push((baton_client::EventKind::Created, node));
    }
    let (mut got, mut got_revisions) = (Vec::new(), Vec::new());
    while got.len() < expected.len() {
        let e = tokio::time::timeout(limit, w.next())
            .await
            .expect("the next event")
            .unwrap();
        got.push((e.kind, e.path));
        got_revisions.push(e.revision);
    }
    assert_eq!(got, expected, "every change, in order, once");
    // The new leader replays from its own history what came before it led:
    // asked from a revision before the stop, it sends every change since.
    let from = got_revisions[9];
    let leader = leader_of(&members).await;
    let mut raw = baton_testkit::Raw::open(&members[leader].client, 10_000).await;
    let reply = raw
        .call(baton_proto::Request::AddWatch {
            path: "/w".into(),
            recursive: true,
            from,
        })
        .await;
    assert!(reply.is_ok(), "{reply:?}");
    let replayed: Vec<_> = raw
        .events
        .iter()
        .map(|e| (e.kind, e.path.clone()))
        .collect();
    assert_eq!(
        replayed,
        expected[10..],
        "the changes after revision {from}"
    );
    writer.set_data("/w", "end", None).await.unwrap();
    let e = tokio::time::timeout(limit, w.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.path, "/w", "nothing was delivered twice");
    assert!(w.try_next().is_none());
    watcher.close().await;
    writer.close().await;
    for m in members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A semaphore on a cluster: its rule is replicated with each enqueue, so
/// after the leader is stopped the new leader still grants no more permits
/// than the semaphore has, and a permit freed after the failover goes to
/// the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_keeps_its_permits_across_the_loss_of_the_leader() {
    use baton_client::recipes::Semaphore;
    let (mut members, root) = cluster(3, "semaphore").await;
    let addrs: Vec<String> = members.iter().map(|m| m.client.clone()).collect();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(crate::common::client_of(&addrs).await);
    }
    let a = Semaphore::new(&clients[0], "/sem", 2)
        .acquire()
        .await
        .unwrap();
    let b = Semaphore::new(&clients[1], "/sem", 2)
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let c = clients[2].clone();
        tokio::spawn(async move { Semaphore::new(&c, "/sem", 2).acquire().await })
    };
    let limit = Duration::from_secs(15);
    tokio::time::timeout(limit, async {
        while clients[0].get_children("/sem").await.unwrap().0.len() < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiter queues");
    let leader = leader_of(&members).await;
    let gone = members.remove(leader);
    let _ = gone.stop.map(|s| s.send(()));
    let _ = gone.task.await;
    // Still two permits held and one waiter, as the new leader sees it.
    let listed = tokio::time::timeout(
        limit,
        Semaphore::new(&clients[0], "/sem", 2)
            .as_lock()
            .contenders(),
    )
    .await
    .expect("the cluster answers")
    .unwrap();
    let holds: Vec<bool> = listed.iter().map(|c| c.holds).collect();
    assert_eq!(holds, [true, true, false], "{listed:?}");
    assert!(!waiter.is_finished());
    let first = a.token();
    tokio::time::timeout(limit, a.release())
        .await
        .expect("the release is answered")
        .unwrap();
    let third = tokio::time::timeout(limit, waiter)
        .await
        .expect("the waiter gets the freed permit")
        .unwrap()
        .unwrap();
    assert!(third.token() > first);
    third.release().await.unwrap();
    b.release().await.unwrap();
    for c in clients {
        c.close().await;
    }
    for m in members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Lock-delay on a cluster: a holder's session expires, its node stays as
/// a tombstone, the leader is stopped during the delay, and the new leader
/// deletes the tombstone when it is due, so the waiter gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_under_way_is_finished_by_the_next_leader() {
    let (mut members, root) = cluster(3, "lock-delay").await;
    let addrs: Vec<String> = members.iter().map(|m| m.client.clone()).collect();
    let store = crate::common::client_of(&addrs).await;
    let waiter = crate::common::client_of(&addrs).await;
    store
        .create("/l", "", CreateMode::Persistent)
        .await
        .unwrap();
    store
        .set_lock_delay("/l", Duration::from_secs(2))
        .await
        .unwrap();
    // The holder: a session of its own that will fall silent.
    let leader = leader_of(&members).await;
    let mut raw = baton_testkit::Raw::open(&members[leader].client, 500).await;
    let session = raw.grant().session_id;
    let held = match raw
        .call(baton_proto::Request::Enqueue {
            path: "/l/lock-".into(),
            data: Default::default(),
            rule: Default::default(),
        })
        .await
    {
        Ok(baton_proto::Reply::Enqueue { path, .. }) => path,
        other => panic!("{other:?}"),
    };
    let waiting = {
        let w = waiter.clone();
        tokio::spawn(async move { Lock::new(&w, "/l").acquire().await })
    };
    let limit = Duration::from_secs(15);
    tokio::time::timeout(limit, async {
        while store.get_children("/l").await.unwrap().0.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiter queues");
    drop(raw);
    tokio::time::timeout(limit, async {
        while store.session_status(session).await.unwrap().liveness != baton_client::Liveness::Gone
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the holder's session expires");
    // Stop the leader while the tombstone waits.
    let leader = leader_of(&members).await;
    let gone = members.remove(leader);
    let _ = gone.stop.map(|s| s.send(()));
    let _ = gone.task.await;
    let guard = tokio::time::timeout(limit, waiting)
        .await
        .expect("the next leader ends the lock-delay")
        .unwrap()
        .unwrap();
    assert!(store.exists(&held).await.unwrap().is_none());
    guard.release().await.unwrap();
    waiter.close().await;
    store.close().await;
    for m in members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A ZooKeeper client whose connect string names every member: it finds
/// the leader (the others close its connection), and its session, its
/// ephemeral node and its watches survive the leader's loss, with the
/// change made meanwhile reported; a digest ACL set before the loss still
/// binds on the new leader, and the credential the client sends again
/// there still opens it. (This client sets persistent watches
/// again with setWatches, not setWatches2, so they are not tried here: the
/// ZooKeeper suite's raw-bytes test covers setWatches2.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_session_its_watches_and_acls_survive_the_loss_of_the_leader() {
    use zookeeper_client as zk;
    let (mut members, root) = cluster(3, "zookeeper").await;
    let hosts: Vec<String> = members.iter().map(|m| m.zk.to_string()).collect();
    let hosts = hosts.join(",");
    let limit = Duration::from_secs(20);
    let connect = || {
        zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(&hosts)
    };
    let c = tokio::time::timeout(limit, connect())
        .await
        .expect("a session")
        .unwrap();
    let other = tokio::time::timeout(limit, connect())
        .await
        .expect("a session")
        .unwrap();
    let open = |mode: zk::CreateMode| mode.with_acls(zk::Acls::anyone_all());
    c.create("/z", b"0", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    c.create("/z/mine", b"", &open(zk::CreateMode::Ephemeral))
        .await
        .unwrap();
    // A node only its creator's credential may read.
    c.auth("digest", b"alice:secret").await.unwrap();
    let private = zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all());
    c.create("/private", b"p", &private).await.unwrap();
    let id = c.session_id();
    let (_, _, data) = c.get_and_watch_data("/z").await.unwrap();
    let (_, kids) = c.list_and_watch_children("/z").await.unwrap();
    let before = c.check_stat("/z").await.unwrap().unwrap().mzxid;

    let leader = leader_of(&members).await;
    let gone = members.remove(leader);
    let _ = gone.stop.map(|s| s.send(()));
    let _ = gone.task.await;

    // A request on its way when the leader went fails with a connection
    // loss, as on ZooKeeper; the application sends it again.
    tokio::time::timeout(limit, async {
        for _ in 0..100 {
            match other.set_data("/z", b"1", None).await {
                Err(zk::Error::ConnectionLoss) => continue,
                result => return result.map(drop),
            }
        }
        panic!("a hundred connection losses in a row");
    })
    .await
    .expect("the cluster answers after the leader went")
    .unwrap();
    let e = tokio::time::timeout(limit, data.changed())
        .await
        .expect("the data watch");
    assert_eq!(e.event_type, zk::EventType::NodeDataChanged);
    assert!(
        e.zxid > before,
        "zxids go on growing across leaders: {} after {before}",
        e.zxid
    );
    let (_, stat) = tokio::time::timeout(limit, c.get_data("/z/mine"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stat.ephemeral_owner, id.0,
        "the same session, its node kept"
    );
    assert_eq!(c.session_id(), id);
    // The new leader keeps the node's ACL, and the session's credential
    // (which its client sends again on the new connection).
    assert!(matches!(
        other.get_data("/private").await,
        Err(zk::Error::NoAuth)
    ));
    assert_eq!(c.get_data("/private").await.unwrap().0, b"p");
    other
        .create("/z/after", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let e = tokio::time::timeout(limit, kids.changed())
        .await
        .expect("the child watch, set again on the new leader");
    assert_eq!(
        (e.event_type, e.path.as_str()),
        (zk::EventType::NodeChildrenChanged, "/z")
    );
    drop((c, other));
    for m in members {
        let _ = m.stop.map(|s| s.send(()));
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(&root);
}
