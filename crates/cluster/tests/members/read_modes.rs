//! What each read mode promises on a follower that serves clients, attacked
//! with a follower cut off from the other members (docs/design.md, "Read
//! modes"): a sequential session's reads are answered from the follower's
//! own state at once, may be behind, never go back, and do not keep the
//! session alive; a linearizable session's reads are never behind; a sync
//! catches up; and a member behind what a client has seen does not serve
//! it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::Running;
use baton_client::{Client, CreateMode, ReadMode};
use baton_cluster::MemberConfig;
use baton_testkit::Proxy;
use tokio::time::{timeout, Instant};

/// Three members serving clients, whose peer traffic between every pair
/// passes a proxy of its own (`(from, to)`: the connections `from` dials
/// to `to`), so that one member can be cut off from the others. Member 3
/// waits a minute before it stands for election: it stays a follower.
async fn cluster(
    name: &str,
) -> (
    Vec<Running>,
    BTreeMap<(u64, u64), Proxy>,
    std::path::PathBuf,
) {
    cluster_with(name, ReadMode::Linearizable).await
}

/// [`cluster`], with ZooKeeper clients' reads in `zk_read_mode`.
async fn cluster_with(
    name: &str,
    zk_read_mode: ReadMode,
) -> (
    Vec<Running>,
    BTreeMap<(u64, u64), Proxy>,
    std::path::PathBuf,
) {
    let root = std::env::temp_dir().join(format!("baton-modes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (listeners, initial) = crate::common::bind_members(3).await;
    let mut proxies = BTreeMap::new();
    for from in 1..=3u64 {
        for (&to, member) in &initial {
            if from != to {
                let upstream = member.peer.parse().unwrap();
                proxies.insert((from, to), Proxy::start(upstream).await);
            }
        }
    }
    let mut running = Vec::new();
    for (id, (clients, peers)) in listeners {
        let mut config = MemberConfig::new(id, root.join(format!("m{id}")));
        config.initial = Some(initial.clone());
        config.server.min_session_timeout = Duration::from_millis(500);
        config.followers_serve = true;
        config.server.zk_listen = Some("127.0.0.1:0".parse().unwrap());
        config.server.zk_read_mode = zk_read_mode;
        config.routes = proxies
            .iter()
            .filter(|((from, _), _)| *from == id)
            .map(|((_, to), proxy)| (*to, proxy.addr()))
            .collect();
        if id == 3 {
            config.election_timeout = Duration::from_secs(60);
        }
        running.push(crate::common::run_member(config, clients, peers).await);
    }
    (running, proxies, root)
}

async fn status(m: &Running) -> serde_json::Value {
    let answer = baton_client::probe(&m.client, Duration::from_secs(5), None)
        .await
        .unwrap();
    serde_json::from_str(&answer).unwrap()
}

/// Waits until member `m` serves clients as a follower, and returns the
/// client address of the member that leads.
async fn serving_follower(members: &[Running], m: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = status(&members[m]).await;
        if status["role"] == "follower" && status["serves_clients"] == true {
            let leader = status["cluster"]["leader"].as_u64().unwrap();
            return members[leader as usize - 1].client.clone();
        }
        assert!(Instant::now() < deadline, "no serving follower: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cuts member `id` off from the others (or joins it back).
fn cut_off(proxies: &BTreeMap<(u64, u64), Proxy>, id: u64, cut: bool) {
    for ((from, to), proxy) in proxies {
        if *from == id || *to == id {
            if cut {
                proxy.block();
                proxy.sever();
            } else {
                proxy.unblock();
            }
        }
    }
}

async fn session(addrs: &str, mode: ReadMode, session_timeout: Duration) -> Client {
    Client::builder(addrs)
        .read_mode(mode)
        .session_timeout(session_timeout)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("a session")
}

/// Stops every member, and removes their data.
async fn stop_all(mut members: Vec<Running>, root: std::path::PathBuf) {
    for m in &mut members {
        let _ = m.stop.take().unwrap().send(());
    }
    for m in members {
        let _ = m.task.await;
    }
    let _ = std::fs::remove_dir_all(root);
}

async fn sessions_on(m: &Running) -> u64 {
    status(m).await["sessions_here"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_modes_keep_their_promises_on_a_follower_cut_off_from_its_leader() {
    let (members, proxies, root) = cluster("cut").await;
    let follower = &members[2];
    let leader = serving_follower(&members, 2).await;
    let writer = session(&leader, ReadMode::Linearizable, Duration::from_secs(10)).await;
    writer
        .create("/k", "one", CreateMode::Persistent)
        .await
        .unwrap();

    // Sessions of the follower alone, one of each mode. The sequential
    // one's timeout is long, so that it pings only every 10 s.
    let sequential = session(
        &follower.client,
        ReadMode::Sequential,
        Duration::from_secs(30),
    )
    .await;
    let linearizable = session(
        &follower.client,
        ReadMode::Linearizable,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(sessions_on(follower).await, 2);
    // A sync makes the follower catch up with the leader: the write is seen.
    let synced = sequential.sync().await.unwrap();
    let (data, stat) = sequential.get_data("/k").await.unwrap();
    assert_eq!(&data[..], b"one");
    assert!(
        synced >= stat.mzxid,
        "synced to {synced}, node at {}",
        stat.mzxid
    );
    assert_eq!(&linearizable.get_data("/k").await.unwrap().0[..], b"one");

    cut_off(&proxies, 3, true);
    let written = writer.set_data("/k", "two", None).await.unwrap();
    let deadline_before = sequential.session_deadline();

    // The sequential session is answered at once, from the follower's
    // state: behind the write, but not before what it saw.
    let (data, stat) = timeout(Duration::from_secs(2), sequential.get_data("/k"))
        .await
        .expect("a sequential read is answered without the leader")
        .unwrap();
    assert_eq!(&data[..], b"one", "the follower cannot have the write");
    assert!(stat.mzxid < written.mzxid);
    // ... and that read, which the leader never heard of, shows nothing of
    // the session's life.
    assert_eq!(sequential.session_deadline(), deadline_before);

    // A linearizable read is never behind: the follower cannot confirm
    // with its leader, sends the client there, and the read sees the write.
    let (data, _) = timeout(Duration::from_secs(10), linearizable.get_data("/k"))
        .await
        .expect("the linearizable read is answered by the leader")
        .unwrap();
    assert_eq!(&data[..], b"two");

    // A sync cannot be answered by the cut-off follower either: the
    // session moves to the leader, and the sync and the reads after it see
    // the write.
    let synced = timeout(Duration::from_secs(10), sequential.sync())
        .await
        .expect("the sync is answered by the leader")
        .unwrap();
    assert!(synced >= written.mzxid);
    let (data, stat) = sequential.get_data("/k").await.unwrap();
    assert_eq!(&data[..], b"two");
    assert_eq!(stat.mzxid, written.mzxid);
    assert!(sequential.session_deadline() > deadline_before);
    assert_eq!(sessions_on(follower).await, 0);

    // A member behind what a client has seen does not serve it: neither a
    // session that saw the write, nor (cut off, it cannot prove it is up to
    // date) a new one.
    let mut raw = baton_testkit::Raw::connect(&follower.client).await;
    let request = baton_proto::ConnectRequest {
        read_mode: ReadMode::Sequential,
        last_seen: written.mzxid,
        ..baton_proto::ConnectRequest::new(10_000)
    };
    let (code, named) = raw.handshake(&request).await.result.unwrap_err();
    assert_eq!(code, baton_proto::ErrorCode::NotLeader);
    assert_eq!(named, leader, "the refusal names the leader");
    let mut raw = baton_testkit::Raw::connect(&follower.client).await;
    let request = baton_proto::ConnectRequest::new(10_000);
    assert!(raw.handshake(&request).await.result.is_err());
    // Nor does it give a backup, which would be behind.
    let limit = Duration::from_secs(10);
    assert!(baton_client::backup(&follower.client, limit, None, None)
        .await
        .is_err());

    // Joined again, the follower catches up and serves both modes; a
    // sequential session that starts there and syncs sees the write.
    cut_off(&proxies, 3, false);
    let back = session(
        &follower.client,
        ReadMode::Sequential,
        Duration::from_secs(10),
    )
    .await;
    back.sync().await.unwrap();
    assert_eq!(&back.get_data("/k").await.unwrap().0[..], b"two");
    assert_eq!(sessions_on(follower).await, 1);
    // A backup from the follower, confirmed with the leader, holds the write.
    let backup = baton_client::backup(&follower.client, limit, None, None)
        .await
        .expect("a backup from the serving follower");
    assert!(backup.revision >= written.mzxid);

    for c in [writer, sequential, linearizable, back] {
        c.close().await;
    }
    stop_all(members, root).await;
}

/// A ZooKeeper client does not send a change again after its connection
/// is closed: the change it makes as soon as its session is open on a
/// follower must not be refused by a leader that has not yet applied the
/// session's opening (it committed it; the follower applied it first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_as_soon_as_a_session_opens_on_a_follower_is_applied() {
    use zookeeper_client as zk;
    let (members, _proxies, root) = cluster("at-once").await;
    serving_follower(&members, 2).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for i in 0..40 {
        let client = timeout(
            Duration::from_secs(20),
            zk::Client::connector()
                .with_session_timeout(Duration::from_secs(10))
                .connect(&members[2].zk.to_string()),
        )
        .await
        .expect("a ZooKeeper session on the follower")
        .unwrap();
        client
            .create(&format!("/at-once-{i}"), b"", &open)
            .await
            .unwrap_or_else(|e| panic!("session {i}'s first change: {e}"));
    }
    stop_all(members, root).await;
}

/// A session that sends more changes at once than a connection may have on
/// their way (1,024) has them all applied, on the leader and on a follower
/// that sends them on: the connection waits for some to be applied before it
/// takes more, and is woken then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_changes_at_once_than_a_connection_may_have_on_their_way_are_all_applied() {
    let (members, _proxies, root) = cluster("pipelined").await;
    let leader = serving_follower(&members, 2).await;
    const EACH: usize = 2_500;
    for (name, addr) in [("leader", leader), ("follower", members[2].client.clone())] {
        let client = session(&addr, ReadMode::Linearizable, Duration::from_secs(20)).await;
        let parent = format!("/pipelined-{name}");
        client
            .create(&parent, "", CreateMode::Persistent)
            .await
            .unwrap();
        let creates = (0..EACH).map(|i| {
            let (client, path) = (&client, format!("{parent}/n{i}"));
            async move { client.create(&path, "", CreateMode::Persistent).await }
        });
        let results = timeout(Duration::from_secs(60), futures::future::join_all(creates))
            .await
            .unwrap_or_else(|_| panic!("{EACH} creates on the {name} within 60 s"));
        for (i, r) in results.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("create {i} on the {name}: {e}"));
        }
        assert_eq!(client.get_children(&parent).await.unwrap().0.len(), EACH);
        client.close().await;
    }
    stop_all(members, root).await;
}

/// With ZooKeeper clients reading sequentially (`--zk-read-mode
/// sequential`), a ZooKeeper client's reads on a follower are answered from
/// the follower's own state at once, as ZooKeeper's followers answer them:
/// cut off from the leader, behind it, but never before what the session
/// saw or changed itself; a sync once joined again brings the reads after
/// it up to date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_clients_read_sequentially_on_a_follower_when_asked() {
    use zookeeper_client as zk;
    let (members, proxies, root) = cluster_with("zk-seq", ReadMode::Sequential).await;
    let leader = serving_follower(&members, 2).await;
    let writer = session(&leader, ReadMode::Linearizable, Duration::from_secs(10)).await;
    writer
        .create("/zk", "one", CreateMode::Persistent)
        .await
        .unwrap();
    let client = timeout(
        Duration::from_secs(20),
        zk::Client::connector()
            .with_session_timeout(Duration::from_secs(60))
            .connect(&members[2].zk.to_string()),
    )
    .await
    .expect("a ZooKeeper session on the follower")
    .unwrap();
    client.sync("/zk").await.unwrap();
    assert_eq!(client.get_data("/zk").await.unwrap().0, b"one");
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create("/zk/mine", b"mine", &open).await.unwrap();
    assert_eq!(client.get_data("/zk/mine").await.unwrap().0, b"mine");

    cut_off(&proxies, 3, true);
    let written = writer.set_data("/zk", "two", None).await.unwrap();
    let (data, stat) = timeout(Duration::from_secs(2), client.get_data("/zk"))
        .await
        .expect("a sequential read is answered without the leader")
        .unwrap();
    assert_eq!(data, b"one", "the follower cannot have the write");
    assert!(stat.mzxid < written.mzxid as i64);
    assert_eq!(client.get_data("/zk/mine").await.unwrap().0, b"mine");

    cut_off(&proxies, 3, false);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match timeout(Duration::from_secs(5), client.sync("/zk")).await {
            Ok(Ok(())) => break,
            other => assert!(
                Instant::now() < deadline,
                "no sync once joined again: {other:?}"
            ),
        }
    }
    let (data, stat) = client.get_data("/zk").await.unwrap();
    assert_eq!(data, b"two");
    assert_eq!(stat.mzxid, written.mzxid as i64);

    writer.close().await;
    drop(client);
    stop_all(members, root).await;
}
