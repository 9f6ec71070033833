//! The ZooKeeper listener against real ZooKeeper clients nobody here
//! wrote: the `zookeeper-client` crate here (every operation, watches,
//! sessions, multi, ACLs), kazoo's recipes in `python.rs`, and raw bytes
//! for bad input in `bad_input.rs`.

mod acls;
mod bad_input;
mod curator;
mod interplay;
mod operations;
mod python;
mod secure;
mod sessions;
mod watches;
mod zkcli;

use std::net::SocketAddr;
use std::time::Duration;

use baton_server::Config;
use baton_testkit::{fast_config, within, TestServer};
use zookeeper_client as zk;

/// A server with a ZooKeeper listener on a free port.
pub(crate) async fn zk_server() -> TestServer {
    zk_server_with(fast_config()).await
}

pub(crate) async fn zk_server_with(config: Config) -> TestServer {
    TestServer::with_config(Config {
        zk_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config
    })
    .await
}

pub(crate) fn zk_addr(server: &TestServer) -> SocketAddr {
    server.zk_addr.expect("a ZooKeeper listener")
}

/// A ZooKeeper client of `addrs` (a connect string) with `timeout`.
pub(crate) async fn zk_client(addrs: &str, timeout: Duration) -> zk::Client {
    within(
        20,
        "a ZooKeeper client to connect",
        zk::Client::connector()
            .with_session_timeout(timeout)
            .connect(addrs),
    )
    .await
    .expect("a ZooKeeper session")
}

/// Runs `program` with `args` (another ZooKeeper client's recipes: kazoo's,
/// Curator's) for at most 300 s; panics with its output, naming `what`, if
/// it fails. An environment variable `var` names the program (or what it
/// needs); without it the test skips and says so (None).
pub(crate) fn external(var: &str, what: &str) -> Option<String> {
    let value = std::env::var(var).ok();
    if value.is_none() {
        eprintln!("{var} is not set: skipping {what}; .ci/run sets it up");
    }
    value
}

pub(crate) async fn run_external(program: &str, args: &[&str], what: &str) {
    let run = tokio::process::Command::new(program)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .unwrap_or_else(|_| panic!("{what} finished within 300 s"))
        .unwrap_or_else(|e| panic!("{what}: {program} does not start: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    eprintln!("{text}");
}

/// Everyone may do everything (`world:anyone`, all permissions).
pub(crate) fn open(mode: zk::CreateMode) -> zk::CreateOptions<'static> {
    mode.with_acls(zk::Acls::anyone_all())
}

/// A 3-member cluster in this process, each member with a ZooKeeper
/// listener; stopped (and its directories removed) on drop.
pub(crate) struct ZkCluster {
    /// Each member's ZooKeeper address, in member order.
    pub(crate) zk: Vec<SocketAddr>,
    /// Each member's peer address, in member order.
    peers: Vec<String>,
    stops: Vec<Option<tokio::sync::oneshot::Sender<()>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: baton_testkit::TempDir,
}

impl ZkCluster {
    pub(crate) async fn start(n: u64) -> ZkCluster {
        use baton::cluster::{ClusterMember, Member, MemberConfig};
        let dir = baton_testkit::scratch("zk-cluster");
        let mut listeners = Vec::new();
        let mut initial = std::collections::BTreeMap::new();
        for id in 1..=n {
            let clients = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let peers = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            initial.insert(
                id,
                Member {
                    peer: peers.local_addr().unwrap().to_string(),
                    client: clients.local_addr().unwrap().to_string(),
                },
            );
            listeners.push((id, clients, peers));
        }
        let (mut zk, mut stops, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
        let peer_addrs = initial.values().map(|m| m.peer.clone()).collect();
        for (id, clients, peers) in listeners {
            let mut config = MemberConfig::new(id, dir.path().join(format!("m{id}")));
            config.initial = Some(initial.clone());
            config.server.min_session_timeout = Duration::from_millis(500);
            config.server.zk_listen = Some("127.0.0.1:0".parse().unwrap());
            config.server.zk_words = vec!["*".into()];
            let member = ClusterMember::start(config, clients, peers).await.unwrap();
            zk.push(member.zk_addr().expect("a ZooKeeper listener"));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            stops.push(Some(stop));
            tasks.push(tokio::spawn(async move {
                let _ = member
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await;
            }));
        }
        ZkCluster {
            zk,
            peers: peer_addrs,
            stops,
            tasks,
            _dir: dir,
        }
    }

    /// Starts one more member, empty, and has the cluster add it as an
    /// observer (a member that serves clients but never votes), asking each
    /// member until the one that leads does; its ZooKeeper address, once it
    /// is added (also pushed to `zk`).
    pub(crate) async fn add_observer(&mut self) -> SocketAddr {
        use baton::cluster::admin::Change;
        use baton::cluster::{ClusterMember, Member, MemberConfig};
        let id = self.zk.len() as u64 + 1;
        let clients = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peers = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let member = Member {
            peer: peers.local_addr().unwrap().to_string(),
            client: clients.local_addr().unwrap().to_string(),
        };
        // No initial membership: it waits to be added.
        let mut config = MemberConfig::new(id, self._dir.path().join(format!("m{id}")));
        config.server.min_session_timeout = Duration::from_millis(500);
        config.server.zk_listen = Some("127.0.0.1:0".parse().unwrap());
        config.server.zk_words = vec!["*".into()];
        let running = ClusterMember::start(config, clients, peers).await.unwrap();
        let zk = running.zk_addr().expect("a ZooKeeper listener");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        self.stops.push(Some(stop));
        self.tasks.push(tokio::spawn(async move {
            let _ = running
                .run(async {
                    let _ = stopped.await;
                })
                .await;
        }));
        let change = Change::Add {
            id,
            member: member.clone(),
            observer: true,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut said = Vec::new();
        'added: loop {
            for peer in &self.peers {
                let asked = baton::cluster::network::ask_change(
                    peer,
                    change.clone(),
                    Duration::from_secs(30),
                    None,
                )
                .await;
                match asked {
                    Ok(_) => break 'added,
                    Err(e) => said.push(e.to_string()),
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "member {id} not added as an observer: {said:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.peers.push(member.peer);
        self.zk.push(zk);
        zk
    }

    /// Stops the member that leads now (it says `Mode: leader` to `srvr`),
    /// asking until one does; returns its index.
    pub(crate) async fn stop_leader(&mut self) -> usize {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            for (i, addr) in self.zk.iter().enumerate() {
                if self.stops[i].is_none() {
                    continue;
                }
                let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                    continue;
                };
                let mut answer = String::new();
                if s.write_all(b"srvr").await.is_ok()
                    && s.read_to_string(&mut answer).await.is_ok()
                    && answer.contains("Mode: leader")
                {
                    let _ = self.stops[i].take().expect("running").send(());
                    let task = std::mem::replace(&mut self.tasks[i], tokio::spawn(async {}));
                    let _ = task.await;
                    return i;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no member leads");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The connect string naming every member.
    pub(crate) fn hosts(&self) -> String {
        self.zk
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(crate) async fn stop(mut self) {
        for stop in &mut self.stops {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
        }
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}
