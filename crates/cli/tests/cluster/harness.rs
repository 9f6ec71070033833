//! A cluster of `baton serve --node-id` processes on loopback, each member
//! reaching every other through a proxy of its own (one per direction of
//! each link), so that a test can cut and heal the network between any two.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::Client;
use baton_testkit::Evidence;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::common::baton;

/// One direction of the link between two members: member `from` reaches
/// member `to` through it.
pub struct Link {
    pub addr: String,
    cut: Arc<AtomicBool>,
    /// Set to close every connection open through the link.
    sever: watch::Sender<u64>,
}

impl Link {
    async fn start(upstream: String) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let (sever, severed) = watch::channel(0u64);
        let is_cut = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if is_cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut severed = severed.clone();
                severed.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut ri, mut wi) = inbound.into_split();
                    let (mut ro, mut wo) = outbound.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut ri, &mut wo) => {}
                        _ = tokio::io::copy(&mut ro, &mut wi) => {}
                        _ = severed.changed() => {}
                    }
                    let _ = wi.shutdown().await;
                    let _ = wo.shutdown().await;
                });
            }
        });
        Link { addr, cut, sever }
    }

    /// Cuts the link: open connections close, new ones are dropped.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.sever.send_modify(|n| *n += 1);
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// One member process.
pub struct MemberProc {
    pub id: u64,
    pub client: String,
    pub peer: String,
    pub dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl MemberProc {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// The member's exit status, once it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for MemberProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The cluster.
pub struct Cluster {
    pub members: BTreeMap<u64, MemberProc>,
    /// (from, to) -> the link member `from` reaches member `to` through.
    pub links: BTreeMap<(u64, u64), Link>,
    pub root: Evidence,
    peers_spec: String,
    extra: Vec<String>,
}

impl Cluster {
    /// Starts `n` members, each with `extra` arguments to `baton serve`.
    pub async fn start(n: u64, extra: &[&str]) -> Cluster {
        let root = Evidence::new("cluster");
        let mut listeners = BTreeMap::new();
        for id in 1..=n {
            let client = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listeners.insert(id, (client, peer));
        }
        let addr = |l: &std::net::TcpListener| l.local_addr().unwrap().to_string();
        let peers_spec = listeners
            .iter()
            .map(|(id, (c, p))| format!("{id}={}/{}", addr(p), addr(c)))
            .collect::<Vec<_>>()
            .join(",");
        let mut links = BTreeMap::new();
        for from in 1..=n {
            for (to, (_, peer)) in &listeners {
                if from != *to {
                    links.insert((from, *to), Link::start(addr(peer)).await);
                }
            }
        }
        let mut cluster = Cluster {
            members: BTreeMap::new(),
            links,
            root,
            peers_spec,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for (id, (client, peer)) in listeners {
            cluster.spawn(id, client, peer, false);
        }
        cluster
    }

    fn spawn(
        &mut self,
        id: u64,
        client: std::net::TcpListener,
        peer: std::net::TcpListener,
        join: bool,
    ) {
        let dir = self.root.join(format!("member-{id}"));
        let log = self.root.join(format!("member-{id}.log"));
        let routes = self.routes_of(id);
        let (client_addr, peer_addr) = (
            client.local_addr().unwrap().to_string(),
            peer.local_addr().unwrap().to_string(),
        );
        let (cfd, pfd) = (client.as_raw_fd(), peer.as_raw_fd());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut command = baton();
        command
            .args(["serve", "--node-id", &id.to_string()])
            .arg("--data-dir")
            .arg(&dir)
            .args([
                "--listen-fd",
                &cfd.to_string(),
                "--peer-listen-fd",
                &pfd.to_string(),
            ])
            .args(["--route", &routes])
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        if join {
            command.arg("--join");
        } else {
            command.args(["--peers", &self.peers_spec]);
        }
        inherit(&mut command, [cfd, pfd]);
        let child = command.spawn().expect("start a member");
        self.members.insert(
            id,
            MemberProc {
                id,
                client: client_addr,
                peer: peer_addr,
                dir,
                log,
                child: Some(child),
            },
        );
    }

    /// Starts member `id` again as an operator would after it died: only
    /// its id and data directory (and the routes through this harness's
    /// links), no member list and no inherited sockets: it finds its
    /// addresses in the membership its data directory records.
    pub fn restart_from_data_dir(&mut self, id: u64) {
        self.kill9(id);
        let m = self.members.get_mut(&id).expect("a member");
        // The ports are free once the member is dead; take and drop them to
        // be sure before the member binds them itself.
        drop((bind_again(&m.client), bind_again(&m.peer)));
        let (dir, log) = (m.dir.clone(), m.log.clone());
        let routes = self.routes_of(id);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = baton()
            .args(["serve", "--node-id", &id.to_string()])
            .arg("--data-dir")
            .arg(&dir)
            .args(["--route", &routes])
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start a member");
        self.members.get_mut(&id).expect("a member").child = Some(child);
    }

    /// The `--route` argument of member `id`: every other member through
    /// the link from `id` to it.
    fn routes_of(&self, id: u64) -> String {
        self.links
            .iter()
            .filter(|((from, _), _)| *from == id)
            .map(|((_, to), link)| format!("{to}={}", link.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts member `id` again on its addresses, from its data directory
    /// (or, with `join`, as a member to be added).
    pub fn restart(&mut self, id: u64, join: bool) {
        let (client, peer) = {
            let m = &self.members[&id];
            (m.client.clone(), m.peer.clone())
        };
        let client = bind_again(&client);
        let peer = bind_again(&peer);
        if let Some(mut old) = self.members.remove(&id) {
            if let Some(mut child) = old.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.spawn(id, client, peer, join);
    }

    /// Starts a new member, empty and waiting to be added (`--join`), with
    /// the next id; returns its id, peer address and client address. The
    /// members reach it directly; it reaches them through links of its own.
    pub async fn add_member(&mut self) -> (u64, String, String) {
        let id = self.members.keys().max().copied().unwrap_or(0) + 1;
        let client = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (client_addr, peer_addr) = (
            client.local_addr().unwrap().to_string(),
            peer.local_addr().unwrap().to_string(),
        );
        let others: Vec<(u64, String)> = self
            .members
            .values()
            .map(|m| (m.id, m.peer.clone()))
            .collect();
        for (to, addr) in others {
            self.links.insert((id, to), Link::start(addr).await);
        }
        self.spawn(id, client, peer, true);
        (id, peer_addr, client_addr)
    }

    /// Every member but `id`, by id.
    pub fn others(&self, id: u64) -> Vec<u64> {
        self.members.keys().copied().filter(|m| *m != id).collect()
    }

    /// Every member's client address, for a client of the whole cluster.
    pub fn clients(&self) -> String {
        self.members
            .values()
            .map(|m| m.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Client addresses of every member but `except`.
    pub fn clients_but(&self, except: u64) -> String {
        self.members
            .values()
            .filter(|m| m.id != except)
            .map(|m| m.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub async fn client(&self, session_timeout: Duration) -> Client {
        connect(&self.clients(), session_timeout).await
    }

    /// What member `id` says of itself (the status probe).
    pub async fn status(&self, id: u64) -> Option<Value> {
        let answer =
            baton_client::probe(&self.members[&id].client, Duration::from_millis(500), None)
                .await
                .ok()?;
        serde_json::from_str(&answer).ok()
    }

    /// The member that leads now, among those that answer.
    pub async fn leader_now(&self) -> Option<u64> {
        for id in self.members.keys() {
            if let Some(s) = self.status(*id).await {
                if s["role"] == "leader" {
                    return Some(*id);
                }
            }
        }
        None
    }

    /// Waits (within `limit`) until a member other than those in `not`
    /// leads; returns it.
    pub async fn wait_leader(&self, not: &[u64], limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            for id in self.members.keys().filter(|id| !not.contains(id)) {
                if let Some(s) = self.status(*id).await {
                    if s["role"] == "leader" {
                        return *id;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no member outside {not:?} leads after {limit:?}; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Member `id`'s applied index.
    pub async fn applied(&self, id: u64) -> Option<u64> {
        self.status(id).await?["cluster"]["applied_index"].as_u64()
    }

    /// Waits until every member in `ids` has applied at least what the
    /// leader has.
    pub async fn wait_caught_up(&self, ids: &[u64], limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let leader = self.leader_now().await;
            if let Some(leader) = leader {
                let target = self.applied(leader).await.unwrap_or(u64::MAX);
                let mut behind = Vec::new();
                for id in ids {
                    if self.applied(*id).await.unwrap_or(0) < target {
                        behind.push(*id);
                    }
                }
                if behind.is_empty() {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "members {behind:?} did not catch up with the leader ({target}) in {limit:?}; logs:\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no leader; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Cuts (or heals) every link to and from member `id`.
    pub fn isolate(&self, id: u64, cut: bool) {
        for ((from, to), link) in &self.links {
            if *from == id || *to == id {
                if cut {
                    link.cut();
                } else {
                    link.heal();
                }
            }
        }
    }

    /// Stops member `id` (SIGSTOP: a paused process, as in a long GC pause
    /// or a stopped VM) until [`Cluster::resume`].
    pub fn pause(&self, id: u64) {
        self.signal(id, libc::SIGSTOP);
    }

    /// Lets member `id` run again after [`Cluster::pause`].
    pub fn resume(&self, id: u64) {
        self.signal(id, libc::SIGCONT);
    }

    fn signal(&self, id: u64, signal: libc::c_int) {
        let pid = self.members[&id].pid().expect("a running member") as libc::pid_t;
        // SAFETY: kill(2) on a child of this process, which it has not
        // reaped (the harness waits for it only when it kills it).
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "signal {signal} to member {id}"
        );
    }

    /// Whether member `id` is stopped (state T in /proc), as [`Cluster::pause`]
    /// leaves it once the signal is delivered.
    pub fn stopped(&self, id: u64) -> bool {
        let pid = self.members[&id].pid().expect("a running member");
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    }

    pub fn kill9(&mut self, id: u64) {
        if let Some(m) = self.members.get_mut(&id) {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    pub fn logs(&self) -> String {
        self.members
            .values()
            .map(|m| format!("--- member {}:\n{}", m.id, m.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The members stop before their directory goes (or is kept).
        self.members.clear();
    }
}

/// Makes the member `command` starts inherit the listeners `fds` (its
/// `--listen-fd` and `--peer-listen-fd`).
pub fn inherit(command: &mut std::process::Command, fds: [std::os::fd::RawFd; 2]) {
    // SAFETY: only fcntl on the two descriptors the member inherits.
    unsafe {
        command.pre_exec(move || {
            for fd in fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Binds `addr` again (a member's port, free again once it is dead).
fn bind_again(addr: &str) -> std::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => return l,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot bind {addr} again: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub async fn connect(addrs: &str, session_timeout: Duration) -> Client {
    Client::builder(addrs)
        .session_timeout(session_timeout)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("a session on {addrs}: {e}"))
}

/// Records what happened in a test, for the failure message.
#[derive(Default, Clone)]
pub struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    pub fn note(&self, line: impl Into<String>) {
        self.0.lock().unwrap().push(line.into());
    }

    pub fn dump(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}
