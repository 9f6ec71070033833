//! A three-member Baton cluster loses its leader, and a lock holder does not
//! notice beyond a pause.
//!
//! Three member processes (this program, started again as `member`) form a
//! cluster on loopback ports. A client takes a lock, another waits for it.
//! Then the leader is killed with SIGKILL. The timeline shows what follows:
//! the remaining two elect a leader, the holder's session resumes on it with
//! its lock (and its fencing token) intact, a fenced write with that token is
//! accepted, and on release the waiter gets the lock with a higher token.
//!
//! Run it with `cargo run --example cluster_failover`.

mod common;

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::Stdio;
use std::time::Duration;

use baton::cluster::{ClusterMember, Member, MemberConfig};
use baton::{Client, CreateMode, Lock, SessionState};
use common::Timeline;
use tokio::process::{Child, Command};
use tokio::time::Instant;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = if args.get(1).map(String::as_str) == Some("member") {
        member(&args[2..]).await
    } else {
        story().await
    };
    if let Err(e) = result {
        eprintln!("cluster_failover: {e}");
        std::process::exit(1);
    }
}

/// One member: `member ID PEERS DATA_DIR CLIENT_FD PEER_FD`.
async fn member(args: &[String]) -> Result<(), String> {
    let [id, peers, dir, client_fd, peer_fd] = args else {
        return Err("member ID PEERS DATA_DIR CLIENT_FD PEER_FD".into());
    };
    let id: u64 = id.parse().map_err(|_| "a member id")?;
    let mut initial = BTreeMap::new();
    for item in peers.split(',') {
        let (n, addrs) = item.split_once('=').ok_or("ID=PEER/CLIENT")?;
        let (peer, client) = addrs.split_once('/').ok_or("ID=PEER/CLIENT")?;
        initial.insert(
            n.parse::<u64>().map_err(|_| "a member id")?,
            Member {
                peer: peer.into(),
                client: client.into(),
            },
        );
    }
    let listener = |fd: &str| -> Result<tokio::net::TcpListener, String> {
        let fd: i32 = fd.parse().map_err(|_| "a descriptor")?;
        // SAFETY: the parent handed this descriptor to us as our listener.
        let std = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        std.set_nonblocking(true).map_err(|e| e.to_string())?;
        tokio::net::TcpListener::from_std(std).map_err(|e| e.to_string())
    };
    let mut config = MemberConfig::new(id, dir.into());
    config.initial = Some(initial);
    let member = ClusterMember::start(config, listener(client_fd)?, listener(peer_fd)?)
        .await
        .map_err(|e| e.to_string())?;
    member
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string())
}

struct Running {
    id: u64,
    client: String,
    child: Child,
}

async fn story() -> Result<(), String> {
    let t = Timeline::new();
    let root = std::env::temp_dir().join(format!("baton-cluster-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string());
    let mut listeners = BTreeMap::new();
    for id in 1..=3u64 {
        listeners.insert(id, (bind()?, bind()?));
    }
    let addr =
        |l: &std::net::TcpListener| l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let peers = listeners
        .iter()
        .map(|(id, (c, p))| format!("{id}={}/{}", addr(p), addr(c)))
        .collect::<Vec<_>>()
        .join(",");
    let exe = std::env::current_exe().map_err(|e| format!("locating this program: {e}"))?;
    let mut members = Vec::new();
    for (id, (client, peer)) in &listeners {
        let (cfd, pfd) = (client.as_raw_fd(), peer.as_raw_fd());
        let mut command = Command::new(&exe);
        command
            .arg("member")
            .arg(id.to_string())
            .arg(&peers)
            .arg(root.join(format!("member-{id}")))
            .arg(cfd.to_string())
            .arg(pfd.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only fcntl on the two descriptors the member inherits.
        unsafe {
            command.pre_exec(move || {
                for fd in [cfd, pfd] {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting member {id}: {e}"))?;
        t.say(
            "cluster",
            format!(
                "member {id} started: clients at {}, pid {}",
                addr(client),
                child.id().unwrap_or(0)
            ),
        );
        members.push(Running {
            id: *id,
            client: addr(client),
            child,
        });
    }
    drop(listeners);
    let all = members
        .iter()
        .map(|m| m.client.clone())
        .collect::<Vec<_>>()
        .join(",");
    let result = run_story(&t, &mut members, &all).await;
    for m in &mut members {
        let _ = m.child.start_kill();
        let _ = m.child.wait().await;
    }
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// The member that leads now, by asking each.
async fn leader(members: &[Running]) -> Option<u64> {
    for m in members {
        if let Ok(answer) = baton::probe(&m.client, Duration::from_millis(300), None).await {
            if answer.contains("\"role\":\"leader\"") {
                return Some(m.id);
            }
        }
    }
    None
}

async fn run_story(t: &Timeline, members: &mut [Running], all: &str) -> Result<(), String> {
    let connect = |timeout_ms| {
        Client::builder(all)
            .session_timeout(Duration::from_millis(timeout_ms))
            .connect_timeout(Duration::from_secs(10))
            .connect()
    };
    let holder = connect(5_000).await.map_err(|e| format!("holder: {e}"))?;
    let first = leader(members).await.ok_or("no member leads")?;
    t.say("cluster", format!("member {first} leads"));
    holder
        .create("/data", "", CreateMode::Persistent)
        .await
        .map_err(|e| e.to_string())?;
    let guard = Lock::new(&holder, "/locks/demo")
        .acquire()
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    let token = guard.token().get();
    t.say(
        "holder",
        format!(
            "holds /locks/demo with fencing token {token} (session {})",
            holder.session_id()
        ),
    );
    let waiter = connect(5_000).await.map_err(|e| format!("waiter: {e}"))?;
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { Lock::new(&waiter, "/locks/demo").acquire().await })
    };
    t.say("waiter", "waits for /locks/demo");

    let victim = members
        .iter_mut()
        .find(|m| m.id == first)
        .ok_or("the leader is not among the members")?;
    victim.child.start_kill().map_err(|e| e.to_string())?;
    let _ = victim.child.wait().await;
    let killed = Instant::now();
    t.say(
        "cluster",
        format!("member {first} (the leader) killed with SIGKILL"),
    );
    let mut states = holder.state_changes();
    let deadline = killed + Duration::from_secs(10);
    let next = loop {
        if let Some(id) = leader(members).await.filter(|id| *id != first) {
            break id;
        }
        if Instant::now() > deadline {
            return Err("no new leader within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    t.say(
        "cluster",
        format!(
            "member {next} leads, {} ms after the kill",
            killed.elapsed().as_millis()
        ),
    );
    tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(|s| *s == SessionState::Reconnected),
    )
    .await
    .map_err(|_| "the holder's session did not resume")?
    .map_err(|e| e.to_string())?;
    t.say(
        "holder",
        format!("session {} resumed on member {next}", holder.session_id()),
    );
    if guard.is_lost() {
        return Err("the holder lost its lock".into());
    }
    holder
        .set_data_fenced("/data", format!("written with token {token}"), token)
        .await
        .map_err(|e| format!("the fenced write: {e}"))?;
    t.say(
        "holder",
        format!("still holds the lock: a write fenced with token {token} is accepted"),
    );
    guard.release().await.map_err(|e| e.to_string())?;
    t.say("holder", "releases the lock");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .map_err(|_| "the waiter was never granted the lock")?
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let next_token = granted.token().get();
    t.say(
        "waiter",
        format!("granted /locks/demo with token {next_token}, above {token}"),
    );
    if next_token <= token {
        return Err(format!("token {next_token} is not above {token}"));
    }
    granted.release().await.map_err(|e| e.to_string())?;
    holder.close().await;
    waiter.close().await;
    Ok(())
}
