//! Cluster mode, multi-process on loopback: members are `baton serve
//! --node-id` processes, each link between two members goes through a
//! proxy the test can cut, and clients are the library's.

#[path = "../common/mod.rs"]
mod common;
mod harness;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{Client, CreateMode, Lock};
use harness::{connect, Cluster, Journal};

const SESSION: Duration = Duration::from_secs(4);

/// Waits until a fresh client of `addrs` is served (a read on the leader,
/// which proves it leads); returns when.
async fn first_served(addrs: &str, limit: Duration) -> Instant {
    let deadline = Instant::now() + limit;
    loop {
        let attempt = async {
            let c = Client::builder(addrs)
                .connect_timeout(Duration::from_millis(300))
                .connect()
                .await?;
            let r = c.exists("/").await;
            c.close().await;
            r
        };
        if let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_millis(500), attempt).await {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "no member served within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One lock grant as a client saw it.
#[derive(Clone, Debug)]
struct Grant {
    token: u64,
    at: Instant,
    client: usize,
}

/// Pins: kill -9 of the leader while 50 clients take and release one lock.
/// A new leader serves within 2 s of the kill; every acknowledged write is
/// there afterwards; every grant's token is above every earlier one; holders
/// whose sessions resumed kept their locks (their fenced writes after the
/// failover were accepted and their releases went through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_a_contended_lock_loses_nothing() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let setup = cluster.client(SESSION).await;
    setup
        .create("/res", "", CreateMode::Persistent)
        .await
        .unwrap();
    setup
        .create("/log", "", CreateMode::Persistent)
        .await
        .unwrap();
    setup.close().await;

    let grants = Arc::new(Mutex::new(Vec::<Grant>::new()));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let journal = Journal::default();
    let count = Arc::new(AtomicU64::new(0));
    const CLIENTS: usize = 50;
    const ROUNDS: usize = 4;
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = cluster.client(SESSION).await;
        let (grants, acked, journal, count) = (
            grants.clone(),
            acked.clone(),
            journal.clone(),
            count.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let guard = Lock::new(&c, "/locks/one")
                    .acquire()
                    .await
                    .map_err(|e| format!("client {i} round {round}: acquire: {e}"))?;
                let token = guard.token().get();
                grants.lock().unwrap().push(Grant {
                    token,
                    at: Instant::now(),
                    client: i,
                });
                count.fetch_add(1, Ordering::Relaxed);
                c.set_data_fenced("/res", token.to_string(), token)
                    .await
                    .map_err(|e| format!("client {i} token {token}: fenced write: {e}"))?;
                let created = c
                    .create(
                        "/log/g-",
                        token.to_string(),
                        CreateMode::PersistentSequential,
                    )
                    .await
                    .map_err(|e| format!("client {i} token {token}: create: {e}"))?;
                acked.lock().unwrap().push(created.path);
                if guard.is_lost() {
                    return Err(format!(
                        "client {i} lost its lock {token} although its session lived"
                    ));
                }
                guard
                    .release()
                    .await
                    .map_err(|e| format!("client {i} token {token}: release: {e}"))?;
                journal.note(format!("client {i} round {round} token {token}"));
            }
            c.close().await;
            Ok::<_, String>(())
        }));
    }
    // Kill the leader a little way in.
    let deadline = Instant::now() + Duration::from_secs(30);
    while count.load(Ordering::Relaxed) < 30 {
        assert!(Instant::now() < deadline, "the clients made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.kill9(leader);
    let killed = Instant::now();
    let probe_at = first_served(&cluster.clients_but(leader), Duration::from_secs(10)).await;
    let failover = probe_at - killed;
    eprintln!(
        "failover: a new leader served {} ms after kill -9 of the leader",
        failover.as_millis()
    );
    assert!(
        failover < Duration::from_secs(2),
        "the new leader served only {} ms after the kill; logs:\n{}",
        failover.as_millis(),
        cluster.logs()
    );
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("a client hung")
            .unwrap()
            .unwrap_or_else(|e| {
                panic!(
                    "{e}\njournal:\n{}\nlogs:\n{}",
                    journal.dump(),
                    cluster.logs()
                )
            });
    }

    // Every grant's token is above every earlier grant's.
    let mut grants = grants.lock().unwrap().clone();
    grants.sort_by_key(|g| g.at);
    assert_eq!(grants.len(), CLIENTS * ROUNDS);
    for pair in grants.windows(2) {
        assert!(
            pair[1].token > pair[0].token,
            "token {} (client {}) after {} (client {})",
            pair[1].token,
            pair[1].client,
            pair[0].token,
            pair[0].client
        );
    }
    // Every acknowledged write is there, and the fenced resource holds the
    // last grant's token.
    let check = cluster.client(SESSION).await;
    let (names, _) = check.get_children("/log").await.unwrap();
    let present: std::collections::HashSet<String> =
        names.iter().map(|n| format!("/log/{n}")).collect();
    for path in acked.lock().unwrap().iter() {
        assert!(
            present.contains(path),
            "{path} was acknowledged and is gone"
        );
    }
    let (data, _) = check.get_data("/res").await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&data),
        grants.last().unwrap().token.to_string()
    );
    check.close().await;
}

/// Pins: a leader cut off from the majority cannot grant a lock or accept
/// a fenced write; the majority elects a leader and goes on; once the
/// network heals, the old leader steps down and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_majority_acknowledges_nothing() {
    let cluster = Cluster::start(3, &[]).await;
    let old = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let setup = cluster.client(SESSION).await;
    setup
        .create("/res", "", CreateMode::Persistent)
        .await
        .unwrap();
    setup.close().await;
    // A client that knows only the old leader.
    let pinned = connect(&cluster.members[&old].client, Duration::from_secs(30)).await;
    pinned.ping().await.unwrap();
    // And a lock holder that knows only the old leader: once cut off, it
    // must not be told its session lives on (a resume answered there would
    // move its deadline while the majority expires it).
    let holder = connect(&cluster.members[&old].client, SESSION).await;
    let held = Lock::new(&holder, "/locks/held").acquire().await.unwrap();
    let alarm = holder.deadline_alarm(Duration::from_millis(200));

    cluster.isolate(old, true);
    let cut = Instant::now();
    let lock = tokio::time::timeout(
        Duration::from_secs(3),
        Lock::new(&pinned, "/locks/cut").acquire(),
    )
    .await;
    assert!(
        lock.is_err() || lock.as_ref().unwrap().is_err(),
        "the cut-off leader granted a lock"
    );
    let fenced = tokio::time::timeout(
        Duration::from_secs(2),
        pinned.set_data_fenced("/res", "from the cut-off side", 1_000_000),
    )
    .await;
    assert!(
        !matches!(fenced, Ok(Ok(_))),
        "the cut-off leader accepted a fenced write"
    );
    // The client gives up (its requests would otherwise be sent again, to
    // the new leader, once the network heals).
    drop(pinned);
    tokio::time::timeout(SESSION + Duration::from_secs(3), alarm.fired())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the holder cut off with the old leader still believed its session alive {} ms after the cut (its session timeout is {} ms); logs:\n{}",
                cut.elapsed().as_millis(),
                SESSION.as_millis(),
                cluster.logs()
            )
        });
    drop(held);
    drop(holder);

    // The majority goes on.
    let new = cluster.wait_leader(&[old], Duration::from_secs(10)).await;
    let majority = connect(&cluster.clients_but(old), SESSION).await;
    let guard = Lock::new(&majority, "/locks/cut").acquire().await.unwrap();
    majority
        .set_data_fenced("/res", "from the majority", guard.token().get())
        .await
        .unwrap();
    guard.release().await.unwrap();

    // Healed: the old leader follows and catches up.
    cluster.isolate(old, false);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(s) = cluster.status(old).await {
            if s["role"] == "follower" {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the old leader did not step down; logs:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster
        .wait_caught_up(&[old], Duration::from_secs(15))
        .await;
    assert_eq!(cluster.leader_now().await, Some(new));
    let (data, _) = majority.get_data("/res").await.unwrap();
    assert_eq!(&data[..], b"from the majority");
    majority.close().await;
}

/// Pins: a member restarted from its data directory catches up, and a
/// member whose data directory was wiped (removed from the cluster, then
/// added again) catches up from a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_and_wiped_members_catch_up() {
    let mut cluster = Cluster::start(3, &["--snapshot-entries", "50"]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let followers: Vec<u64> = cluster.others(leader);
    let (restarted, wiped) = (followers[0], followers[1]);
    let c = cluster.client(SESSION).await;
    c.create("/n", "", CreateMode::Persistent).await.unwrap();

    cluster.kill9(restarted);
    for i in 0..40 {
        c.create(&format!("/n/a{i}"), "x", CreateMode::Persistent)
            .await
            .unwrap();
    }
    cluster.restart(restarted, false);
    cluster
        .wait_caught_up(&[restarted], Duration::from_secs(20))
        .await;

    // Wiped: out of the cluster, its data gone, back in as a new member.
    let servers = cluster.clients();
    let out = common::baton()
        .args([
            "--server",
            &servers,
            "cluster",
            "remove",
            "--node-id",
            &wiped.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "remove: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    cluster.kill9(wiped);
    std::fs::remove_dir_all(&cluster.members[&wiped].dir).unwrap();
    // Enough entries that the log the member would need is gone behind a
    // snapshot.
    for i in 0..200 {
        c.create(&format!("/n/b{i}"), "y", CreateMode::Persistent)
            .await
            .unwrap();
    }
    cluster.restart(wiped, true);
    let (peer, client) = (
        cluster.members[&wiped].peer.clone(),
        cluster.members[&wiped].client.clone(),
    );
    let out = common::baton()
        .args([
            "--server",
            &servers,
            "cluster",
            "add",
            "--node-id",
            &wiped.to_string(),
        ])
        .args(["--peer-addr", &peer, "--client-addr", &client])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "add: {}\nlogs:\n{}",
        String::from_utf8_lossy(&out.stderr),
        cluster.logs()
    );
    cluster
        .wait_caught_up(&[wiped, restarted], Duration::from_secs(30))
        .await;
    let log = std::fs::read_to_string(&cluster.members[&wiped].log).unwrap();
    assert!(
        log.contains("snapshot installed"),
        "the wiped member did not catch up from a snapshot:\n{log}"
    );
    // And it serves once it leads: make every other member go away.
    let (children, _) = c.get_children("/n").await.unwrap();
    assert_eq!(children.len(), 240);
    c.close().await;
}

/// Pins: the whole cluster killed at once comes back with every
/// acknowledged change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_restarted_at_once_keeps_every_acknowledged_change() {
    let mut cluster = Cluster::start(3, &[]).await;
    cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let c = cluster.client(SESSION).await;
    c.create("/all", "", CreateMode::Persistent).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..100 {
        let created = c
            .create("/all/n-", format!("v{i}"), CreateMode::PersistentSequential)
            .await
            .unwrap();
        acked.push((created.path, format!("v{i}")));
    }
    let ids: Vec<u64> = cluster.members.keys().copied().collect();
    for id in &ids {
        cluster.kill9(*id);
    }
    drop(c);
    for id in &ids {
        cluster.restart(*id, false);
    }
    cluster.wait_leader(&[], Duration::from_secs(15)).await;
    let c = cluster.client(SESSION).await;
    for (path, value) in &acked {
        let (data, _) = c
            .get_data(path)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(String::from_utf8_lossy(&data), *value);
    }
    // Sequence numbers go on growing.
    let next = c
        .create("/all/n-", "after", CreateMode::PersistentSequential)
        .await
        .unwrap();
    let last: u64 = acked
        .last()
        .unwrap()
        .0
        .rsplit('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(next.sequence.unwrap() > last);
    c.close().await;
}

/// Pins: a session expires once in the whole cluster, its ephemerals
/// deleted in one step, also across a failover; and a holder paused
/// (SIGSTOP) past its session's end is refused by the fence after the
/// failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_expires_once_and_a_paused_holder_is_fenced_after_a_failover() {
    let mut cluster = Cluster::start(3, &["--min-session-timeout", "1000"]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let servers = cluster.clients();
    let observer = cluster.client(Duration::from_secs(30)).await;
    observer
        .create("/eph", "", CreateMode::Persistent)
        .await
        .unwrap();
    observer
        .create("/res", "", CreateMode::Persistent)
        .await
        .unwrap();

    // A session with three ephemerals, left to expire.
    let doomed = cluster.client(Duration::from_millis(2_000)).await;
    for i in 0..3 {
        doomed
            .create(&format!("/eph/e{i}"), "", CreateMode::Ephemeral)
            .await
            .unwrap();
    }

    // A holder, run by `baton lock`, that writes with its token when told.
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["--server", &servers, "lock", "--session-timeout", "2000", "/locks/f", "--"])
        .args([
            "sh",
            "-c",
            "echo $BATON_FENCING_TOKEN; read go; exec \"$BATON\" --server \"$BATON_SERVER\" set /res late --fence $BATON_FENCING_TOKEN",
        ])
        .env("BATON", env!("CARGO_BIN_EXE_baton"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let paused_token: u64 = line.trim().parse().unwrap();
    // Pause the holder, its supervisor and the command alike.
    let command_pid = child_of(holder.id());
    for pid in [holder.id(), command_pid] {
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    }

    // The doomed session's client goes silent too, and the leader dies.
    let (children, _, watcher) = observer.get_children_watch("/eph").await.unwrap();
    assert_eq!(children.len(), 3);
    drop(doomed);
    cluster.kill9(leader);
    let new = cluster
        .wait_leader(&[leader], Duration::from_secs(10))
        .await;

    // The ephemerals go in one step: one event, and then none is left.
    let event = tokio::time::timeout(Duration::from_secs(15), watcher)
        .await
        .expect("the doomed session expired")
        .unwrap();
    let (left, stat) = observer.get_children("/eph").await.unwrap();
    assert!(left.is_empty(), "{left:?} outlived their session");
    assert_eq!(
        stat.pzxid, event.revision,
        "all deleted by the one change that fired the watch"
    );

    // The next holder gets the lock once the paused one's session expired,
    // and writes with its token.
    let next = Lock::new(&observer, "/locks/f").acquire().await.unwrap();
    assert!(next.token().get() > paused_token);
    observer
        .set_data_fenced("/res", "current", next.token().get())
        .await
        .unwrap();

    // The paused command wakes and writes with its old token: refused.
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(command_pid as i32, libc::SIGCONT) };
    use std::io::Write;
    holder.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let refused = loop {
        let (data, _) = observer.get_data("/res").await.unwrap();
        assert_eq!(
            &data[..],
            b"current",
            "the paused holder's write was accepted"
        );
        if !pid_alive(command_pid) {
            break true;
        }
        assert!(
            Instant::now() < deadline,
            "the paused command never finished"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(refused);
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(holder.id() as i32, libc::SIGCONT) };
    let status = holder.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("stale fencing token"),
        "the late write was not refused by the fence ({status}): {stderr}"
    );
    next.release().await.unwrap();

    // The expiries (of the doomed session and of the paused holder's) were
    // proposed once, by the new leader; the other member proposed none.
    for id in cluster.members.keys().copied().filter(|id| *id != leader) {
        let s = cluster.status(id).await.unwrap();
        let want = if id == new { 2 } else { 0 };
        assert_eq!(s["sessions_expired"], want, "member {id}: {s}");
    }
    observer.close().await;
}

/// The pid of `parent`'s only child (the command `baton lock` runs, from
/// one of its threads).
fn child_of(parent: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{parent}/task"))
            .map(|d| d.filter_map(|e| e.ok()).collect::<Vec<_>>())
            .unwrap_or_default();
        for task in tasks {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            if let Some(pid) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
            {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "baton lock started no command");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie has exited.
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Pins: a leader acknowledges nothing that no follower stored, even after
/// its calls to a follower were given up halfway (a follower stopped while
/// large appends went to it, so that they timed out after their requests
/// went out). With one follower stopped throughout and the other stopped
/// again, a write must wait; and what was acknowledged survives the leader
/// and the long-stopped follower dying together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_acknowledges_nothing_while_both_followers_are_stopped() {
    let mut cluster = Cluster::start(3, &["--election-timeout", "600"]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let followers: Vec<u64> = cluster.others(leader);
    let (always, sometimes) = (followers[0], followers[1]);
    let client = cluster.client(Duration::from_secs(20)).await;
    client
        .create("/w", "before", CreateMode::Persistent)
        .await
        .unwrap();
    for i in 0..4 {
        client
            .create(&format!("/big-{i}"), "", CreateMode::Persistent)
            .await
            .unwrap();
    }
    cluster.pause(always);
    let mut last = Vec::new();
    for round in 0..10u8 {
        // The second follower stops while four large appends go to it, long
        // enough for the leader's calls to time out with their requests
        // written, then runs again and takes them.
        cluster.pause(sometimes);
        let big = vec![round; 900 * 1024];
        let writes: Vec<_> = (0..4)
            .map(|i| {
                let (client, big) = (client.clone(), big.clone());
                tokio::spawn(async move {
                    // A reply lost with a connection is asked again (the
                    // write is the same each time).
                    loop {
                        match client
                            .set_data(&format!("/big-{i}"), big.clone(), None)
                            .await
                        {
                            Err(baton_client::Error::ConnectionLoss(_)) => continue,
                            other => return other,
                        }
                    }
                })
            })
            .collect();
        // About 1.7 heartbeats, give or take one.
        let stopped_for = 140 + 40 * u64::from(round % 6);
        tokio::time::sleep(Duration::from_millis(stopped_for)).await;
        cluster.resume(sometimes);
        for w in writes {
            tokio::time::timeout(Duration::from_secs(30), w)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a large write was not acknowledged after the follower came back; logs:\n{}", cluster.logs()))
                .unwrap()
                .unwrap();
        }
        last = big;
        // Both followers stopped: nothing can be acknowledged.
        cluster.pause(sometimes);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(cluster.stopped(always) && cluster.stopped(sometimes)) {
            assert!(Instant::now() < deadline, "the followers did not stop");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Within the election timeout, while the leader still answers.
        let w = tokio::time::timeout(
            Duration::from_millis(500),
            client.set_data("/w", format!("w{round}"), None),
        )
        .await;
        assert!(
            !matches!(w, Ok(Ok(_))),
            "round {round}: a write was acknowledged while both followers were stopped ({w:?}); logs:\n{}",
            cluster.logs()
        );
        cluster.resume(sometimes);
    }
    drop(client);
    // The leader and the follower that missed everything die together; the
    // other follower alone holds what was acknowledged.
    cluster.kill9(leader);
    cluster.kill9(always);
    cluster.restart(leader, false);
    cluster.restart(always, false);
    let reader = cluster.client(Duration::from_secs(20)).await;
    for i in 0..4 {
        let (data, _) = tokio::time::timeout(
            Duration::from_secs(30),
            reader.get_data(&format!("/big-{i}")),
        )
        .await
        .expect("the restarted cluster answers")
        .unwrap();
        assert!(
            data[..] == last[..],
            "/big-{i}: an acknowledged write was lost; logs:\n{}",
            cluster.logs()
        );
    }
    reader.close().await;
}

/// Pins: a member killed with kill -9 is started again as the docs say,
/// with only its id and data directory (its data directory knows the
/// membership, and so its addresses), catches up and serves; a data
/// directory that records no membership, or one this member was removed
/// from, is refused with a message that says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_restarts_from_its_data_directory_alone() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let follower = *cluster.members.keys().find(|id| **id != leader).unwrap();
    let client = cluster.client(SESSION).await;
    client
        .create("/before", "1", CreateMode::Persistent)
        .await
        .unwrap();
    cluster.kill9(follower);
    client
        .create("/while-down", "2", CreateMode::Persistent)
        .await
        .unwrap();
    cluster.restart_from_data_dir(follower);
    cluster
        .wait_caught_up(&[follower], Duration::from_secs(20))
        .await;
    // It serves again: make it the leader's only way to a majority.
    let third = *cluster
        .members
        .keys()
        .find(|id| **id != leader && **id != follower)
        .unwrap();
    cluster.kill9(third);
    client
        .create("/after", "3", CreateMode::Persistent)
        .await
        .unwrap();
    client.close().await;

    // Refusals: an empty directory, and a member the cluster removed.
    let empty = cluster.root.join("empty");
    let out = common::baton()
        .args(["serve", "--node-id", "7", "--data-dir"])
        .arg(&empty)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("holds no cluster membership") && err.contains("--peers"),
        "{err}"
    );
    let dir = cluster.members[&follower].dir.clone();
    cluster.kill9(follower);
    let out = common::baton()
        .args(["serve", "--node-id", "9", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("member 9 is not in the membership") && err.contains("--join"),
        "{err}"
    );
}

/// Lines a child prints, as they come, for waiting on one with a deadline.
fn lines_of(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next line `want` accepts, within `limit`; every line read on the way
/// is kept in `seen`.
fn line_where(
    lines: &std::sync::mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    limit: Duration,
    want: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                seen.push(line.clone());
                if want(&line) {
                    return line;
                }
            }
            Err(_) => panic!(
                "no such line within {limit:?}; printed:\n{}",
                seen.join("\n")
            ),
        }
    }
}

/// `baton cluster local --members 3` in a scratch directory named by
/// `name`: the directory, the process and the lines it prints.
fn local_cluster(
    name: &str,
    extra: &[&str],
) -> (std::path::PathBuf, Local, std::sync::mpsc::Receiver<String>) {
    let dir = std::env::temp_dir().join(format!("baton-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut local = common::baton()
        .args(["cluster", "local", "--members", "3", "--data-dir"])
        .arg(&dir)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_of(local.stdout.take().unwrap());
    (dir, Local(local), lines)
}

/// A `baton cluster local` process, killed if a test ends without stopping
/// it (a failed assertion), so that its members do not outlive the test.
struct Local(std::process::Child);

impl std::ops::Deref for Local {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Local {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Pins: `baton cluster local` says when the leader changes, and a member
/// killed under it starts again with the command at the top of its log.
#[test]
fn cluster_local_follows_the_leader_and_a_dead_member_restarts_from_its_log() {
    use std::process::Stdio;
    let (dir, mut local, lines) = local_cluster("cluster-local", &[]);
    let mut seen = Vec::new();
    let leads = |line: &str| line.starts_with("member ") && line.ends_with(" leads");
    let first = line_where(&lines, &mut seen, Duration::from_secs(20), leads);
    let leader: u64 = first.split(' ').nth(1).unwrap().parse().unwrap();
    let pid: i32 = seen
        .iter()
        .find(|l| l.starts_with(&format!("member {leader} client ")))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    let client_addr = seen
        .iter()
        .find(|l| l.starts_with(&format!("member {leader} client ")))
        .and_then(|l| l.split(' ').nth(3))
        .unwrap()
        .to_owned();
    // SAFETY: kill(2) on a member process of the local cluster.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    line_where(&lines, &mut seen, Duration::from_secs(10), |l| {
        l.starts_with(&format!("member {leader} (pid {pid}) was killed")) && l.contains("member-")
    });
    let next = line_where(&lines, &mut seen, Duration::from_secs(20), leads);
    assert_ne!(next, first, "{seen:?}");

    // The command at the top of the dead member's log starts it again.
    let log = std::fs::read_to_string(dir.join(format!("member-{leader}.log"))).unwrap();
    let command = log
        .lines()
        .next()
        .and_then(|l| l.split_once("once it is gone: "))
        .map(|(_, c)| c.to_owned())
        .unwrap_or_else(|| panic!("no restart command in:\n{log}"));
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut again = std::process::Command::new(words[0])
        .args(&words[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let role = loop {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let answer = rt.block_on(baton_client::probe(
            &client_addr,
            Duration::from_millis(500),
            None,
        ));
        if let Ok(answer) = answer {
            let status: serde_json::Value = serde_json::from_str(&answer).unwrap();
            if status["role"] == "follower" {
                break status["role"].clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the restarted member does not follow"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(role, "follower");
    let _ = again.kill();
    let _ = again.wait();
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(local.id() as i32, libc::SIGTERM) };
    assert!(local.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pins: the members `baton cluster local` started die with it, however
/// it ends: killed with kill -9, it once left them running with nobody to
/// stop them (as `baton chaos`, which starts its servers the same way,
/// did under a script's timeout).
#[test]
fn members_of_a_local_cluster_die_with_it() {
    // An observer too (`--observers 1`): it is added once a member leads,
    // and dies with the rest. And ZooKeeper ports, read sequentially: each
    // member is started with them.
    let zk = common::free_ports(4);
    let zk_arg = zk.to_string();
    let (dir, mut local, lines) = local_cluster(
        "cluster-local-dies",
        &[
            "--observers",
            "1",
            "--zk",
            &zk_arg,
            "--zk-read-mode",
            "sequential",
        ],
    );
    let mut seen = Vec::new();
    line_where(&lines, &mut seen, Duration::from_secs(20), |l| {
        l.starts_with("member ") && l.ends_with(" leads")
    });
    let observer = line_where(&lines, &mut seen, Duration::from_secs(60), |l| {
        l.starts_with("member 4 client ") && l.ends_with(" (observer)")
    });
    line_where(&lines, &mut seen, Duration::from_secs(10), |l| {
        l.starts_with("1 observer(s) added")
    });
    let observer_client = observer.split(' ').nth(3).unwrap().to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status: serde_json::Value = serde_json::from_str(
        &rt.block_on(baton_client::probe(
            &observer_client,
            Duration::from_secs(5),
            None,
        ))
        .unwrap(),
    )
    .unwrap();
    let me = status["cluster"]["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["id"] == 4).cloned())
        .unwrap_or_default();
    assert_eq!(me["voter"], false, "{status}");
    for id in 1..=4u16 {
        let log = std::fs::read_to_string(dir.join(format!("member-{id}.log"))).unwrap();
        let first = log.lines().next().unwrap_or_default();
        let wanted = format!("--zk-listen 127.0.0.1:{}", zk + id - 1);
        assert!(
            first.contains(&wanted) && first.contains("--zk-read-mode sequential"),
            "member {id}: {first}"
        );
    }
    let pids: Vec<u32> = seen
        .iter()
        .filter(|l| l.starts_with("member ") && l.contains(" client "))
        .filter_map(|l| {
            l.trim_end_matches(" (observer)")
                .rsplit(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(pids.len(), 4, "{seen:?}");
    assert!(pids.iter().all(|p| pid_alive(*p)), "{seen:?}");
    local.kill().unwrap();
    local.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| pid_alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "members still running after baton cluster local was killed: {:?}",
            pids.iter().filter(|p| pid_alive(**p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pins: an observer that cannot start (here its ZooKeeper port is taken)
/// makes `baton cluster local` fail at once, naming the member, its log
/// and why it stopped, rather than wait on a membership change nobody is
/// left to complete.
#[test]
fn cluster_local_fails_fast_when_an_observer_cannot_start() {
    let zk = common::free_ports(4);
    // Member 4, the observer, listens for ZooKeeper clients on zk + 3.
    let _taken = std::net::TcpListener::bind(("127.0.0.1", zk + 3)).unwrap();
    let dir = std::env::temp_dir().join(format!("baton-observer-fails-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let child = common::baton()
        .args(["cluster", "local", "--members", "3", "--observers", "1"])
        .args(["--zk", &zk.to_string(), "--data-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut local = Local(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = local.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "baton cluster local still running 60 s after its observer could not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(local.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("adding observer 4: member 4 exited with status")
            && stderr.contains("member-4.log")
            && stderr.contains("--zk-listen")
            && stderr.contains(&format!("127.0.0.1:{}", zk + 3)),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `baton --server SERVERS cluster add` of member `id` at `peer` and
/// `client`, run on a thread of its own: (exit code, stdout, stderr).
fn add_on_a_thread(
    servers: &str,
    id: u64,
    peer: &str,
    client: &str,
) -> tokio::task::JoinHandle<(Option<i32>, String, String)> {
    let (servers, peer, client) = (servers.to_owned(), peer.to_owned(), client.to_owned());
    tokio::task::spawn_blocking(move || {
        run_baton(&[
            "--server",
            &servers,
            "cluster",
            "add",
            "--node-id",
            &id.to_string(),
            "--peer-addr",
            &peer,
            "--client-addr",
            &client,
        ])
    })
}

/// `baton ARGS` run to its end: (exit code, stdout, stderr).
fn run_baton(args: &[&str]) -> (Option<i32>, String, String) {
    let out = common::baton().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The token `baton lock` gives a command on `servers`.
fn lock_token(servers: &str, path: &str) -> u64 {
    let (code, out, err) = run_baton(&[
        "--server",
        servers,
        "lock",
        path,
        "--",
        "sh",
        "-c",
        "echo $BATON_FENCING_TOKEN",
    ]);
    assert_eq!(code, Some(0), "{err}");
    out.trim().parse().unwrap()
}

/// Pins: a cluster member backs up only what a majority committed: a
/// follower that does not serve clients sends the client to the leader
/// (one that serves confirms with the leader first: crates/cluster/tests/
/// read_modes.rs), and a member without a majority (the others down, or a
/// cluster that never formed) refuses, saying why; `baton snapshot save`
/// given every member finds the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_comes_from_a_leader_with_a_majority_or_not_at_all() {
    let mut cluster = Cluster::start(3, &["--followers-serve", "false"]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let follower = *cluster.members.keys().find(|id| **id != leader).unwrap();
    let file = cluster.root.join("backup.snap");
    let file = file.to_str().unwrap();
    let (code, out, err) = run_baton(&["--server", &cluster.clients(), "snapshot", "save", file]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("saved revision "), "{out}");
    let (code, _, err) = run_baton(&[
        "--server",
        &cluster.members[&follower].client,
        "snapshot",
        "save",
        file,
    ]);
    assert_eq!(code, Some(1), "a follower saved a backup: {err}");
    assert!(
        err.contains("does not lead") && err.contains("leader"),
        "{err}"
    );
    // The leader alone, its followers gone: no majority to prove anything.
    for id in cluster.members.keys().copied().collect::<Vec<_>>() {
        if id != leader {
            cluster.kill9(id);
        }
    }
    let (code, _, err) = run_baton(&[
        "--server",
        &cluster.members[&leader].client,
        "snapshot",
        "save",
        "--timeout",
        "20000",
        file,
    ]);
    assert_eq!(
        code,
        Some(1),
        "a member without a majority saved a backup: {err}"
    );
    assert!(err.contains("majority"), "{err}");
    drop(cluster);

    // A cluster that never formed: one member of three started.
    let lonely = Cluster::start(3, &[]).await;
    let mut lonely = lonely;
    for id in [2, 3] {
        lonely.kill9(id);
    }
    let (code, _, err) = run_baton(&[
        "--server",
        &lonely.members[&1].client,
        "snapshot",
        "save",
        file,
    ]);
    assert_eq!(code, Some(1), "a member alone saved a backup: {err}");
}

/// Pins: a cluster is restored from a backup through one first member that
/// leads alone and the others joining it empty; what the backup held is
/// there, and no token handed out before is handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_restored_from_a_backup_and_tokens_go_on_rising() {
    let cluster = Cluster::start(3, &[]).await;
    cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let servers = cluster.clients();
    let client = cluster.client(SESSION).await;
    client
        .create("/kept", "v", CreateMode::Persistent)
        .await
        .unwrap();
    lock_token(&servers, "/locks/job");
    let file = cluster.root.join("backup.snap");
    let (code, _, err) = run_baton(&[
        "--server",
        &servers,
        "snapshot",
        "save",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let mut highest = 0;
    for _ in 0..3 {
        highest = highest.max(lock_token(&servers, "/locks/job"));
    }
    client.close().await;
    // The restored cluster, on new ports and directories.
    let dir = std::env::temp_dir().join(format!("baton-restored-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let backup = dir.join("backup.snap");
    std::fs::copy(&file, &backup).unwrap();
    drop(cluster);
    // Listeners bound here and inherited by the members: no other test can
    // take their ports in between.
    let bound = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (l1, l2) = ((bound(), bound()), (bound(), bound()));
    let addr = |l: &std::net::TcpListener| l.local_addr().unwrap().to_string();
    let (c1, p1, c2, p2) = (addr(&l1.0), addr(&l1.1), addr(&l2.0), addr(&l2.1));
    let seed = dir.join("member-1");
    let (code, out, err) = run_baton(&[
        "snapshot",
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        seed.to_str().unwrap(),
        "--node-id",
        "1",
        "--peer-addr",
        &p1,
        "--client-addr",
        &c1,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("--join") && out.contains("cluster add"),
        "{out}"
    );
    let mut first = Member::start(
        &[
            "serve",
            "--node-id",
            "1",
            "--data-dir",
            seed.to_str().unwrap(),
        ],
        l1,
    );
    let second_dir = dir.join("member-2");
    let mut second = Member::start(
        &[
            "serve",
            "--node-id",
            "2",
            "--data-dir",
            second_dir.to_str().unwrap(),
            "--join",
        ],
        l2,
    );
    // The first member leads alone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while role_of(&c1).await.as_deref() != Some("leader") {
        assert!(
            Instant::now() < deadline,
            "the first member does not lead:\n{}",
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restored = connect(&c1, SESSION).await;
    let (data, _) = restored.get_data("/kept").await.unwrap();
    assert_eq!(&data[..], b"v");
    // The second member joins as an observer (`cluster status` says so),
    // then the same add without `--observer` makes it a voter.
    let add = |observer: bool| {
        let mut args = vec![
            "--server",
            &c1,
            "cluster",
            "add",
            "--node-id",
            "2",
            "--peer-addr",
            &p2,
            "--client-addr",
            &c2,
        ];
        if observer {
            args.push("--observer");
        }
        run_baton(&args)
    };
    let (code, out, err) = add(true);
    assert_eq!(
        code,
        Some(0),
        "add --observer: {err}\n{}\n{}",
        first.log(),
        second.log()
    );
    assert!(out.contains("added as an observer"), "{out}");
    let (code, out, err) = run_baton(&["--server", &c1, "cluster", "status"]);
    assert_eq!(code, Some(0), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("2 "))
        .unwrap_or_else(|| panic!("no member 2 in {out}"));
    assert!(line.contains("observer"), "{out}");
    let (code, out, err) = add(false);
    assert_eq!(
        code,
        Some(0),
        "add: {err}\n{}\n{}",
        first.log(),
        second.log()
    );
    assert!(out.contains("votes"), "{out}");
    let both = format!("{c1},{c2}");
    let token = lock_token(&both, "/locks/job");
    assert!(
        token > highest,
        "token {token} after a restore; {highest} was handed out before"
    );
    // The second member catches up from the first.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = baton_client::probe(&c2, Duration::from_millis(500), None).await;
        let caught_up = status.ok().and_then(|s| {
            let v: serde_json::Value = serde_json::from_str(&s).ok()?;
            v["cluster"]["applied_index"].as_u64()
        });
        if caught_up.is_some_and(|i| i > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "member 2 did not catch up:\n{}",
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    restored.close().await;
    first.stop();
    second.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The role the server at `addr` says it has (its status probe).
async fn role_of(addr: &str) -> Option<String> {
    let answer = baton_client::probe(addr, Duration::from_millis(500), None)
        .await
        .ok()?;
    let status: serde_json::Value = serde_json::from_str(&answer).ok()?;
    status["role"].as_str().map(str::to_owned)
}

/// A member process started by hand, its stderr in a file, killed on drop.
struct Member {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Member {
    /// `baton ARGS`, listening on the (client, peer) listeners given.
    fn start(args: &[&str], listeners: (std::net::TcpListener, std::net::TcpListener)) -> Member {
        use std::os::fd::AsRawFd;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let log = std::env::temp_dir().join(format!(
            "baton-member-{}-{}.log",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::File::create(&log).unwrap();
        let (cfd, pfd) = (listeners.0.as_raw_fd(), listeners.1.as_raw_fd());
        let mut command = common::baton();
        command
            .args(args)
            .args([
                "--listen-fd",
                &cfd.to_string(),
                "--peer-listen-fd",
                &pfd.to_string(),
            ])
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(file);
        harness::inherit(&mut command, [cfd, pfd]);
        let child = command.spawn().unwrap();
        Member { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Pins: without a majority, a client command says that no member leads
/// and what each member answered, instead of the last address's error, and
/// `baton cluster status` shows every member it reaches with its role and
/// term (exit 1); a leader left alone is shown as one without a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_every_message_says_no_member_leads_and_what_each_said() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let others: Vec<u64> = cluster.others(leader);
    let servers = cluster.clients();
    // The leader alone: it cannot prove it leads, and says so.
    cluster.kill9(others[0]);
    cluster.kill9(others[1]);
    let (code, _, err) = run_baton(&["--server", &servers, "--connect-timeout", "3s", "get", "/x"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no member leads"), "{err}");
    for m in cluster.members.values() {
        assert!(err.contains(&m.client), "{} not named in: {err}", m.client);
    }
    let (code, out, err) = run_baton(&["--server", &servers, "cluster", "status"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("majority"), "{err}");
    assert_eq!(out.matches("unreachable").count(), 2, "{out}");

    // No leader at all: the old leader gone too, one follower left.
    cluster.restart(others[0], false);
    let now = cluster.wait_leader(&[], Duration::from_secs(20)).await;
    let survivor = *cluster
        .members
        .keys()
        .find(|id| **id != now && **id != others[1])
        .unwrap();
    cluster.kill9(now);
    let (code, out, _) = run_baton(&["--server", &servers, "cluster", "status"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("no leader"), "{out}");
    let survivor_addr = &cluster.members[&survivor].client;
    let line = out
        .lines()
        .find(|l| l.contains(survivor_addr.as_str()))
        .unwrap_or_else(|| panic!("the survivor is not listed:\n{out}"));
    assert!(
        line.starts_with(&survivor.to_string()) && !line.contains("unreachable"),
        "{line}"
    );
    assert_eq!(out.matches("unreachable").count(), 2, "{out}");
    let (code, out, _) = run_baton(&["--server", &servers, "cluster", "status", "--json"]);
    assert_eq!(code, Some(1));
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(json["leader"].is_null(), "{json}");
    assert_eq!(json["members"].as_array().unwrap().len(), 3, "{json}");
    let (code, _, err) = run_baton(&["--server", &servers, "--connect-timeout", "2s", "get", "/x"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no member leads") && err.contains(survivor_addr.as_str()),
        "{err}"
    );
}

/// Pins: a paused member (SIGSTOP: a stopped VM, a long pause) listed first
/// does not hold up a client: the next member is tried alongside it and the
/// session opens on the new leader, well within a connect timeout that a
/// client waiting on the paused member alone would use up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_listed_first_does_not_hold_up_a_client() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    cluster.pause(leader);
    let new = cluster
        .wait_leader(&[leader], Duration::from_secs(20))
        .await;
    let first_the_paused = format!(
        "{},{}",
        cluster.members[&leader].client,
        cluster.clients_but(leader)
    );
    let opening = Client::builder(&first_the_paused)
        .connect_timeout(Duration::from_secs(60))
        .connect();
    let client = tokio::time::timeout(Duration::from_secs(30), opening)
        .await
        .expect("the client waited on the paused member")
        .unwrap();
    client
        .create("/x", "", CreateMode::Persistent)
        .await
        .unwrap();
    assert!(
        cluster.stopped(leader),
        "the paused member was let go meanwhile"
    );
    assert_eq!(cluster.leader_now().await, Some(new));
    client.close().await;
    cluster.resume(leader);
}

/// Pins: a member cut off from the others does not campaign its term up
/// (openraft has no pre-vote; Baton stops it standing for election while it
/// reaches no majority), so its return forces no election: the leader and
/// the term stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_member_returns_without_forcing_an_election() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let follower = *cluster.members.keys().find(|id| **id != leader).unwrap();
    let term = |s: &serde_json::Value| s["cluster"]["term"].as_u64().unwrap_or(0);
    let before = term(&cluster.status(leader).await.unwrap());
    cluster.isolate(follower, true);
    // Cut off for many election timeouts (150-300 ms each, after the
    // leader's lease): an unchecked member would stand again and again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cut_term = term(&cluster.status(follower).await.unwrap());
    cluster.isolate(follower, false);
    cluster
        .wait_caught_up(&[follower], Duration::from_secs(20))
        .await;
    let after = cluster.status(leader).await.unwrap();
    assert!(
        cut_term <= before,
        "the cut-off member's term went from {before} to {cut_term}; logs:\n{}",
        cluster.logs()
    );
    assert_eq!(after["role"], "leader", "the leader stepped down: {after}");
    assert_eq!(
        term(&after),
        before,
        "its return forced an election; logs:\n{}",
        cluster.logs()
    );
}

/// Pins: a member removed from the cluster stops, saying why, whether it
/// was cut off when it was removed (and learns it on its return) or in
/// reach; the change warns that two voters survive no more failures than
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_stops_and_says_why() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let followers: Vec<u64> = cluster.others(leader);
    let (in_reach, cut_off) = (followers[0], followers[1]);
    let stops = |cluster: &mut Cluster, id: u64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster.members.get_mut(&id).unwrap().running() {
            assert!(
                Instant::now() < deadline,
                "member {id} still runs; logs:\n{}",
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = cluster.members[&id].log_tail();
        assert!(log.contains("is no longer a member"), "{log}");
    };
    let remove = |servers: &str, id: u64| {
        let (code, out, err) = run_baton(&[
            "--server",
            servers,
            "cluster",
            "remove",
            "--node-id",
            &id.to_string(),
        ]);
        assert_eq!(code, Some(0), "{err}");
        out
    };
    // Removed while cut off: it learns it once it is back.
    cluster.isolate(cut_off, true);
    let out = remove(&cluster.clients_but(cut_off), cut_off);
    assert!(
        out.contains("Warning") && out.contains("2 voting members"),
        "{out}"
    );
    cluster.isolate(cut_off, false);
    stops(&mut cluster, cut_off);
    // Removed while in reach.
    let out = remove(&cluster.members[&leader].client, in_reach);
    assert!(!out.contains("Warning"), "{out}");
    stops(&mut cluster, in_reach);
    // The leader alone goes on.
    let client = connect(&cluster.members[&leader].client, SESSION).await;
    client
        .create("/alone", "", CreateMode::Persistent)
        .await
        .unwrap();
    client.close().await;
}

/// Pins: a follower started from an old copy of its own data directory
/// (a backup put back) lacks entries it had acknowledged. Its leader used
/// to stop on finding that (the consensus engine's own check), leaving the
/// acknowledged entries on one member; now the leader tells the follower,
/// which stops and says what to do, and the leader serves on. Done as the
/// follower's message says (removed, emptied, added again), it catches up
/// and nothing acknowledged is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_started_from_an_old_copy_of_its_data_is_stopped_and_nothing_is_lost() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let stale = cluster.others(leader)[0];
    let c = cluster.client(SESSION).await;
    c.create("/n", "", CreateMode::Persistent).await.unwrap();
    for i in 0..20 {
        c.create(&format!("/n/a{i}"), "x", CreateMode::Persistent)
            .await
            .unwrap();
    }
    cluster
        .wait_caught_up(&[stale], Duration::from_secs(20))
        .await;
    // The copy: taken from the stopped member, which then goes on.
    cluster.kill9(stale);
    let dir = cluster.members[&stale].dir.clone();
    let copy = dir.with_extension("old");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&dir)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(copied.success());
    cluster.restart(stale, false);
    for i in 0..100 {
        c.create(&format!("/n/b{i}"), "y", CreateMode::Persistent)
            .await
            .unwrap();
    }
    cluster
        .wait_caught_up(&[stale], Duration::from_secs(20))
        .await;
    // Put back.
    cluster.kill9(stale);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::rename(&copy, &dir).unwrap();
    cluster.restart(stale, false);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = cluster.members.get_mut(&stale).unwrap().exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the member put back from a copy still runs; logs:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "{status:?}");
    let log = cluster.members[&stale].log_tail();
    assert!(
        log.contains("data went back") && log.contains("--join"),
        "{log}"
    );
    // The leader leads on and takes writes.
    assert!(
        cluster.members.get_mut(&leader).unwrap().running(),
        "{}",
        cluster.logs()
    );
    c.create("/n/after", "z", CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(cluster.leader_now().await, Some(leader));

    // As the message says: removed, emptied, added again.
    let servers = cluster.clients_but(stale);
    let (code, _, err) = run_baton(&[
        "--server",
        &servers,
        "cluster",
        "remove",
        "--node-id",
        &stale.to_string(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    cluster.restart(stale, true);
    let (peer, client) = (
        cluster.members[&stale].peer.clone(),
        cluster.members[&stale].client.clone(),
    );
    let (code, _, err) = run_baton(&[
        "--server",
        &servers,
        "cluster",
        "add",
        "--node-id",
        &stale.to_string(),
        "--peer-addr",
        &peer,
        "--client-addr",
        &client,
    ]);
    assert_eq!(code, Some(0), "{err}\n{}", cluster.logs());
    cluster
        .wait_caught_up(&[stale], Duration::from_secs(30))
        .await;
    // Every acknowledged node is there, with the old leader gone too.
    cluster.kill9(leader);
    cluster
        .wait_leader(&[leader], Duration::from_secs(20))
        .await;
    let c2 = cluster.client(SESSION).await;
    let (children, _) = c2.get_children("/n").await.unwrap();
    assert_eq!(children.len(), 121, "{children:?}");
    c2.close().await;
}

/// Pins: a member being added, catching up over many batches of entries
/// whose memberships leave it out, is not taken for a removed one: it is
/// added, and it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_to_a_busy_cluster_catches_up_and_stays() {
    let mut cluster = Cluster::start(3, &[]).await;
    cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let client = cluster.client(SESSION).await;
    client
        .create("/n", "", CreateMode::Persistent)
        .await
        .unwrap();
    // Far more entries than one batch of appends carries.
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let client = client.clone();
            tokio::spawn(async move {
                let data = vec![b'x'; 16 * 1024];
                for i in 0..150 {
                    client
                        .create(&format!("/n/{w}-{i}"), data.clone(), CreateMode::Persistent)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let servers = cluster.clients();
    let (added, peer, client_addr) = cluster.add_member().await;
    let (code, out, err) = run_baton(&[
        "--server",
        &servers,
        "cluster",
        "add",
        "--node-id",
        &added.to_string(),
        "--peer-addr",
        &peer,
        "--client-addr",
        &client_addr,
    ]);
    assert_eq!(code, Some(0), "{err}\n{}", cluster.logs());
    assert!(out.contains("added"), "{out}");
    cluster
        .wait_caught_up(&[added], Duration::from_secs(30))
        .await;
    // Several rounds of status questions later, it is still there.
    let settled = cluster.applied(added).await.unwrap();
    client
        .create("/after", "", CreateMode::Persistent)
        .await
        .unwrap();
    cluster
        .wait_caught_up(&[added], Duration::from_secs(30))
        .await;
    assert!(cluster.applied(added).await.unwrap() > settled);
    assert!(
        cluster.members.get_mut(&added).unwrap().running(),
        "{}",
        cluster.logs()
    );
    let log = cluster.members[&added].log_tail();
    assert!(!log.contains("no longer a member"), "{log}");
    client.close().await;
}

/// The way back for a removed member that the docs give (wipe it, start it
/// with --join, `baton cluster add` it under its old id) after the cluster
/// went through a membership naming it the only voter: it does not lead
/// while it catches up through that membership, and no write is lost.
/// (`crates/cli/tests/commands/chaos.rs` pins the defect this once had, which needs
/// the load of a chaos run to show.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_wiped_and_added_again_under_its_old_id_keeps_every_write() {
    const ENTRIES: usize = 1000;
    let mut cluster = Cluster::start(3, &[]).await;
    let sole = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let others = cluster.others(sole);
    let change = |servers: &str, verb: &str, id: u64, addrs: Option<(&str, &str)>| {
        let id = id.to_string();
        let mut args = vec!["--server", servers, "cluster", verb, "--node-id", &id];
        if let Some((peer, client)) = addrs {
            args.extend(["--peer-addr", peer, "--client-addr", client]);
        }
        let (code, out, err) = run_baton(&args);
        assert_eq!(code, Some(0), "cluster {verb} {id}: {err}");
        out
    };
    let leader_client = cluster.members[&sole].client.clone();
    // The cluster shrinks to `sole` alone, which then takes many entries:
    // a membership naming it the only voter, deep in the log.
    for id in &others {
        change(&leader_client, "remove", *id, None);
    }
    // Entries enough that catching up from them takes many batches.
    let client = connect(&leader_client, SESSION).await;
    client
        .create("/n", "", CreateMode::Persistent)
        .await
        .unwrap();
    for i in 0..ENTRIES {
        client
            .create(&format!("/n/{i}"), "x", CreateMode::Persistent)
            .await
            .unwrap();
    }
    client.close().await;
    let rejoin = |cluster: &mut Cluster, id: u64| {
        cluster.kill9(id);
        std::fs::remove_dir_all(&cluster.members[&id].dir).unwrap();
        cluster.restart(id, true);
        (
            cluster.members[&id].peer.clone(),
            cluster.members[&id].client.clone(),
        )
    };
    // The other two come back, empty, under their old ids.
    for id in others.clone() {
        let (peer, client) = rejoin(&mut cluster, id);
        change(&leader_client, "add", id, Some((&peer, &client)));
    }
    // Then `sole` leaves, and comes back empty too, while the others lead.
    change(&leader_client, "remove", sole, None);
    let servers = cluster.clients_but(sole);
    let new_leader = cluster.wait_leader(&[sole], Duration::from_secs(10)).await;
    let (peer, client_addr) = rejoin(&mut cluster, sole);
    let watching = {
        let addr = client_addr.clone();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let task = tokio::spawn(async move {
            let mut led = false;
            while !flag.load(std::sync::atomic::Ordering::Acquire) {
                led |= role_of(&addr).await.as_deref() == Some("leader");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            led
        });
        (done, task)
    };
    let added = add_on_a_thread(&servers, sole, &peer, &client_addr)
        .await
        .unwrap();
    watching.0.store(true, std::sync::atomic::Ordering::Release);
    let led_while_joining = watching.1.await.unwrap();
    assert_eq!(added.0, Some(0), "add: {}\n{}", added.2, cluster.logs());
    assert!(
        !led_while_joining,
        "member {sole} led before it was added again (member {new_leader} led); logs:\n{}",
        cluster.logs()
    );
    // Nothing was lost, whoever leads now.
    let client = connect(&cluster.clients(), SESSION).await;
    let (children, _) = client.get_children("/n").await.unwrap();
    assert_eq!(children.len(), ENTRIES, "{}", cluster.logs());
    client.close().await;
}

/// Pins: two members added at once both vote afterwards. Each add once
/// computed the new set of voters from the membership it read when it
/// began, so the second undid the first (found by `baton chaos`: a member
/// dropped from the membership that nobody asked to remove).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_added_at_once_both_vote() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let leader_client = cluster.members[&leader].client.clone();
    let others = cluster.others(leader);
    for id in &others {
        let (code, _, err) = run_baton(&[
            "--server",
            &leader_client,
            "cluster",
            "remove",
            "--node-id",
            &id.to_string(),
        ]);
        assert_eq!(code, Some(0), "remove {id}: {err}");
    }
    let mut adds = Vec::new();
    for id in others.clone() {
        cluster.kill9(id);
        std::fs::remove_dir_all(&cluster.members[&id].dir).unwrap();
        cluster.restart(id, true);
        let (peer, client) = (
            cluster.members[&id].peer.clone(),
            cluster.members[&id].client.clone(),
        );
        adds.push((id, peer, client));
    }
    let running: Vec<_> = adds
        .iter()
        .map(|(id, peer, client)| add_on_a_thread(&leader_client, *id, peer, client))
        .collect();
    for (add, id) in running.into_iter().zip(&others) {
        let (code, _, err) = add.await.unwrap();
        assert_eq!(code, Some(0), "add {id}: {err}\n{}", cluster.logs());
    }
    let mut all: Vec<u64> = cluster.members.keys().copied().collect();
    all.sort();
    // The description of the cluster is refreshed twice a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = cluster.status(leader).await.unwrap_or_default();
        let mut voters: Vec<u64> = status["cluster"]["members"]
            .as_array()
            .map_or(&[][..], |v| &v[..])
            .iter()
            .filter(|m| m["voter"] == true)
            .filter_map(|m| m["id"].as_u64())
            .collect();
        voters.sort();
        if voters == all {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "voters {voters:?}, not {all:?}: {status}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Pins: adding a member that is not running fails once the learner has
/// made no progress for 30 s, saying so and what to do, and the cluster
/// goes on with the voters it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_member_that_is_not_running_fails_and_says_what_to_do() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    // Addresses nothing listens on.
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string()
    };
    let started = Instant::now();
    let (code, _, err) = add_on_a_thread(&cluster.members[&leader].client, 4, &free(), &free())
        .await
        .unwrap();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("member 4 was added as a learner but made no progress for 30 s")
            && err.contains("see that it runs and is in reach"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(90), "{err}");
    let client = cluster.client(SESSION).await;
    client
        .create("/after", "", CreateMode::Persistent)
        .await
        .unwrap();
    client.close().await;
}

/// Pins: a member being added that is killed halfway through its catch-up
/// (its log holds only memberships from before it was named) starts again
/// from the command line of a new cluster's first start (`--peers`, no
/// `--join`: how `baton chaos` and a service manager start it again) as the
/// member being added that it is, and the add under way completes; and
/// `baton cluster add` answers only once the new member's own log holds
/// the membership that added it. Both once failed: the add answered at
/// once for any log shorter than 5,000 entries, and a member killed before
/// the membership naming it reached it refused its data directory for
/// good, leaving the cluster a voter short for every later fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_while_being_added_starts_again_and_the_add_completes() {
    const ENTRIES: usize = 600;
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(&[], Duration::from_secs(10)).await;
    let (target, third) = {
        let others = cluster.others(leader);
        (others[0], others[1])
    };
    let leader_client = cluster.members[&leader].client.clone();
    let change = |verb: &str, args: &[&str]| {
        let id = target.to_string();
        let mut all = vec![
            "--server",
            &leader_client,
            "cluster",
            verb,
            "--node-id",
            &id,
        ];
        all.extend_from_slice(args);
        run_baton(&all)
    };
    let (code, _, err) = change("remove", &[]);
    assert_eq!(code, Some(0), "remove: {err}");
    // A log long in bytes (about 38 MiB) though short in entries.
    let client = connect(&leader_client, SESSION).await;
    let value = vec![b'x'; 64 << 10];
    for i in 0..ENTRIES {
        client
            .create(&format!("/big-{i}"), value.clone(), CreateMode::Persistent)
            .await
            .unwrap();
    }
    cluster.kill9(target);
    std::fs::remove_dir_all(&cluster.members[&target].dir).unwrap();
    cluster.restart(target, true);
    let (peer, client_addr) = (
        cluster.members[&target].peer.clone(),
        cluster.members[&target].client.clone(),
    );
    let raft = cluster.members[&target].dir.join("raft");
    let add = add_on_a_thread(&leader_client, target, &peer, &client_addr);
    // Halfway through its catch-up: past the membership that removed it,
    // short of the one that adds it.
    let held = |raft: &std::path::Path| {
        let raft = raft.to_owned();
        tokio::task::spawn_blocking(move || {
            baton_cluster::log_store::stored_members(&raft).unwrap_or_default()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if held(&raft)
            .await
            .unwrap()
            .is_some_and(|m| !m.contains_key(&target))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "member {target} did not get halfway through its catch-up; logs:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cluster.pause(target);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.stopped(target) {
        assert!(Instant::now() < deadline, "member {target} did not stop");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let held_then = held(&raft).await.unwrap().expect("a membership");
    assert!(
        !held_then.contains_key(&target),
        "member {target} already holds a membership naming it: {held_then:?}"
    );
    cluster.kill9(target);
    cluster.restart(target, false);
    let (code, out, err) = add.await.unwrap();
    assert_eq!(code, Some(0), "add: {err}\n{}", cluster.logs());
    assert!(out.contains("added"), "{out}");
    let log = std::fs::read_to_string(&cluster.members[&target].log).unwrap();
    assert!(
        log.contains("was being added to the cluster when it stopped"),
        "{log}"
    );
    let held_now = held(&raft).await.unwrap().expect("a membership");
    assert!(
        held_now.contains_key(&target),
        "the add answered before member {target} held the membership that added it: {held_now:?}"
    );
    // It votes: without the third member, the leader's majority is it.
    cluster.kill9(third);
    tokio::time::timeout(
        Duration::from_secs(30),
        client.create("/after", "", CreateMode::Persistent),
    )
    .await
    .expect("the leader and the added member are a majority")
    .unwrap();
    client.close().await;
}
