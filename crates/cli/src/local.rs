//! `baton cluster local`: a whole cluster on this machine, one process per
//! member, for trying cluster mode out (and for `baton bench cluster`).
//!
//! The listeners are bound here, on free loopback ports, and handed to each
//! member process as inherited file descriptors, so no port can be taken in
//! between. A member that dies is reported, not restarted.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use baton_server::persist::disk_faults::DiskFault;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::{CliError, CliResult};

/// Start a whole cluster on this machine, to try it out.
///
/// Starts MEMBERS `baton serve` processes, each on free loopback ports
/// with its data directory under --data-dir, prints one line per member
/// (`member ID client ADDR peer ADDR pid PID`) and runs until Ctrl-C, when
/// it stops them all, saying which member leads whenever that changes. A
/// member that dies (kill one to see a failover) is reported and not
/// restarted; start it again by hand with the command printed at the top of
/// its log (DIR/member-ID.log). Clients use all the client addresses:
/// `baton --server A,B,C ...`.
#[derive(clap::Args)]
pub struct LocalArgs {
    /// How many members: 3 or 5 survive the loss of 1 or 2.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=9))]
    pub(crate) members: u64,
    /// Directory for the members' data directories and logs.
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: std::path::PathBuf,
    /// Each member's election timeout (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "150ms", value_parser = crate::duration::millis)]
    pub(crate) election_timeout: u64,
    /// Also serve ZooKeeper clients: member ID listens on 127.0.0.1 at
    /// PORT+ID-1 (2181 with a bare --zk: 2181, 2182, 2183), and the
    /// connect string to give them is printed (docs/zookeeper.md).
    #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "2181")]
    pub(crate) zk: Option<u16>,
    /// What ZooKeeper clients' reads promise (`baton serve
    /// --zk-read-mode`): `linearizable`, or `sequential` as ZooKeeper's
    /// followers answer them. [default: linearizable]
    #[arg(long, value_name = "MODE", requires = "zk")]
    pub(crate) zk_read_mode: Option<baton_client::ReadMode>,
    /// Whether followers serve clients too (`baton serve --followers-serve`):
    /// `false` sends every client to the leader.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) followers_serve: bool,
    /// Also start this many observers (members that serve clients but
    /// never vote), with the ids after the members', each added once a
    /// member leads (`baton cluster add --observer`).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=9))]
    pub(crate) observers: u64,
}

/// One member process of a local cluster.
pub struct LocalMember {
    pub id: u64,
    pub client: String,
    pub peer: String,
    /// The process id it was started with.
    pub pid: u32,
    child: Option<Child>,
}

/// Members on loopback ports, started and stopped as processes (or, for
/// `baton chaos`, one single server, as member 1).
pub struct LocalCluster {
    pub members: BTreeMap<u64, LocalMember>,
    dir: PathBuf,
    /// The member list of `--peers`; empty for a single server.
    peers: String,
    /// The members that list names (the cluster's first): a member added
    /// later is started again from its data directory alone.
    first: std::collections::BTreeSet<u64>,
    extra: Vec<String>,
    /// The `baton` binary the members run; `None`: this one.
    pub exe: Option<PathBuf>,
    /// Each member's client address as clients are given it (and members
    /// name it to each other), where that is not where it listens: a proxy
    /// in front of it.
    fronts: BTreeMap<u64, String>,
    /// The same for each member's peer address.
    peer_fronts: BTreeMap<u64, String>,
    /// Whether each member reads a disk fault control file
    /// ([`LocalCluster::disk_fault`]).
    disk_faults: bool,
    /// Member ID serves ZooKeeper clients at this port + ID - 1.
    zk_base: Option<u16>,
}

/// How often `baton cluster local` looks for a change of leader.
const LEADER_CHECK: Duration = Duration::from_millis(500);

fn bind(addr: &str) -> Result<std::net::TcpListener, CliError> {
    std::net::TcpListener::bind(addr).map_err(|e| CliError::msg(format!("cannot bind {addr}: {e}")))
}

fn local_addr(l: &std::net::TcpListener) -> Result<String, CliError> {
    l.local_addr()
        .map(|a| a.to_string())
        .map_err(|e| CliError::msg(e.to_string()))
}

impl LocalCluster {
    /// Starts `n` members with data directories and logs under `dir`, each
    /// with `extra` arguments to `baton serve`.
    pub fn start(n: u64, dir: &Path, extra: &[String]) -> Result<LocalCluster, CliError> {
        Self::launch(n, dir, extra, false, None)
    }

    /// [`LocalCluster::start`], each member also serving ZooKeeper clients
    /// on 127.0.0.1 at `zk_base` + its id - 1.
    pub fn start_with_zk(
        n: u64,
        dir: &Path,
        extra: &[String],
        zk_base: u16,
    ) -> Result<LocalCluster, CliError> {
        Self::launch_full(
            n,
            dir,
            extra,
            false,
            None,
            false,
            Some(zk_base),
            |_, c, p| Ok((c.to_owned(), p.to_owned())),
        )
    }

    /// Starts `n` members (or, with `single`, one single server, not a
    /// cluster member, as member 1), each running `exe` (`None`: this very
    /// binary), with data directories and logs under `dir`.
    pub fn launch(
        n: u64,
        dir: &Path,
        extra: &[String],
        single: bool,
        exe: Option<PathBuf>,
    ) -> Result<LocalCluster, CliError> {
        Self::launch_behind(n, dir, extra, single, exe, false, |_, client, peer| {
            Ok((client.to_owned(), peer.to_owned()))
        })
    }

    /// [`LocalCluster::launch`], with each member reached at the addresses
    /// `front` gives for it (its id and the client and peer addresses it
    /// listens on): the client and peer addresses of proxies in front of
    /// it. Members name each other by those, and [`LocalCluster::clients`]
    /// gives those. With `disk_faults`, each member plays the disk faults
    /// [`LocalCluster::disk_fault`] sets for it.
    pub fn launch_behind(
        n: u64,
        dir: &Path,
        extra: &[String],
        single: bool,
        exe: Option<PathBuf>,
        disk_faults: bool,
        front: impl FnMut(u64, &str, &str) -> Result<(String, String), CliError>,
    ) -> Result<LocalCluster, CliError> {
        Self::launch_full(n, dir, extra, single, exe, disk_faults, None, front)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_full(
        n: u64,
        dir: &Path,
        extra: &[String],
        single: bool,
        exe: Option<PathBuf>,
        disk_faults: bool,
        zk_base: Option<u16>,
        mut front: impl FnMut(u64, &str, &str) -> Result<(String, String), CliError>,
    ) -> Result<LocalCluster, CliError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::msg(format!("cannot create {}: {e}", dir.display())))?;
        let mut listeners = BTreeMap::new();
        for id in 1..=n {
            listeners.insert(id, (bind("127.0.0.1:0")?, bind("127.0.0.1:0")?));
        }
        let mut peers = Vec::new();
        let mut fronts = BTreeMap::new();
        let mut peer_fronts = BTreeMap::new();
        for (id, (client, peer)) in &listeners {
            let (client, peer) = front(*id, &local_addr(client)?, &local_addr(peer)?)?;
            peers.push(format!("{id}={peer}/{client}"));
            fronts.insert(*id, client);
            peer_fronts.insert(*id, peer);
        }
        let mut cluster = LocalCluster {
            members: BTreeMap::new(),
            dir: dir.to_owned(),
            peers: if single {
                String::new()
            } else {
                peers.join(",")
            },
            first: if single {
                Default::default()
            } else {
                listeners.keys().copied().collect()
            },
            extra: extra.to_vec(),
            exe,
            fronts,
            peer_fronts,
            disk_faults,
            zk_base,
        };
        for (id, (client, peer)) in listeners {
            cluster.spawn(id, client, peer, false)?;
        }
        Ok(cluster)
    }

    /// Starts member `id` on the listeners given; with `join`, to be added
    /// to the running cluster (`--join`) rather than as one of its first
    /// members.
    fn spawn(
        &mut self,
        id: u64,
        client: std::net::TcpListener,
        peer: std::net::TcpListener,
        join: bool,
    ) -> Result<(), CliError> {
        let exe = match &self.exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe()
                .map_err(|e| CliError::msg(format!("cannot find the baton binary: {e}")))?,
        };
        let log_path = self.dir.join(format!("member-{id}.log"));
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| CliError::msg(format!("cannot open {}: {e}", log_path.display())))?;
        let data_dir = self.dir.join(format!("member-{id}"));
        let mut extra = self.extra.clone();
        if let Some(base) = self.zk_base {
            extra.push("--zk-listen".into());
            extra.push(format!("127.0.0.1:{}", u64::from(base) + id - 1));
        }
        // How to start this member again once it is gone: its data
        // directory records the membership, and so the ports it listens on.
        let again = if self.peers.is_empty() {
            format!(
                "{} serve --data-dir {} --listen {} {}",
                exe.display(),
                data_dir.display(),
                local_addr(&client)?,
                extra.join(" ")
            )
        } else {
            format!(
                "{} serve --node-id {id} --data-dir {} {}",
                exe.display(),
                data_dir.display(),
                extra.join(" ")
            )
        };
        use std::io::Write;
        writeln!(
            log,
            "baton cluster local: starting member {id}; to start it again by hand once it is gone: {}",
            again.trim_end()
        )
        .map_err(|e| CliError::msg(format!("cannot write {}: {e}", log_path.display())))?;
        let (client_fd, peer_fd) = (client.as_raw_fd(), peer.as_raw_fd());
        let mut command = Command::new(&exe);
        command.arg("serve");
        if join {
            command
                .args(["--node-id", &id.to_string(), "--join"])
                .args(["--peer-listen-fd", &peer_fd.to_string()]);
        } else if self.first.contains(&id) {
            command
                .args(["--node-id", &id.to_string(), "--peers", &self.peers])
                .args(["--peer-listen-fd", &peer_fd.to_string()]);
        } else if !self.peers.is_empty() {
            // Added later (an observer, say): its data directory holds the
            // membership, and `--peers` would not name it.
            command
                .args(["--node-id", &id.to_string()])
                .args(["--peer-listen-fd", &peer_fd.to_string()]);
        }
        command
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-fd", &client_fd.to_string()])
            .args(&extra);
        if self.disk_faults {
            command
                .arg("--test-disk-faults")
                .arg(self.disk_fault_file(id));
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| CliError::msg(e.to_string()))?)
            .stderr(log)
            .kill_on_drop(true);
        // A member dies with the process that started it, however that
        // ends (kill -9, a SIGTERM from a script's timeout), rather than
        // running on unsupervised: the signal is sent when the thread that
        // started it ends, and members are started from the runtime's
        // threads, which last as long as this process.
        // SAFETY: getpid here; in the forked child, fcntl on the two
        // descriptors the member is to inherit, prctl and getppid, all
        // async-signal-safe; nothing is allocated in the child.
        let parent = unsafe { libc::getpid() };
        unsafe {
            command.pre_exec(move || {
                for fd in [client_fd, peer_fd] {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                #[cfg(target_os = "linux")]
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                // This process may have died before the request was made.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| CliError::msg(format!("cannot start member {id}: {e}")))?;
        self.members.insert(
            id,
            LocalMember {
                id,
                client: local_addr(&client)?,
                peer: local_addr(&peer)?,
                pid: child.id().unwrap_or(0),
                child: Some(child),
            },
        );
        Ok(())
    }

    /// Starts member `id` on new loopback ports, waiting to be added
    /// (`--join`), and asks the leader to add it as an observer; what the
    /// leader says of it. Fails as soon as the new member's process ends
    /// (a port it cannot listen on, say), naming its log and its last line.
    pub async fn add_observer(&mut self, id: u64) -> Result<String, CliError> {
        self.add_observer_behind(id, |_, client, peer| {
            Ok((client.to_owned(), peer.to_owned()))
        })
        .await
    }

    /// [`LocalCluster::add_observer`], with what stands in front of its
    /// ports (as [`LocalCluster::launch_behind`] is given): the addresses
    /// the cluster and its clients are told.
    pub async fn add_observer_behind(
        &mut self,
        id: u64,
        front: impl FnOnce(u64, &str, &str) -> Result<(String, String), CliError>,
    ) -> Result<String, CliError> {
        let (client, peer) = (bind("127.0.0.1:0")?, bind("127.0.0.1:0")?);
        let (client_front, peer_front) = front(id, &local_addr(&client)?, &local_addr(&peer)?)?;
        self.fronts.insert(id, client_front);
        self.peer_fronts.insert(id, peer_front);
        self.spawn(id, client, peer, true)?;
        let mut child = self
            .members
            .get_mut(&id)
            .and_then(|m| m.child.take())
            .expect("the member just started");
        let outcome = tokio::select! {
            said = self.ask_to_add_observer(id) => Ok(said),
            status = child.wait() => Err(status),
        };
        // Back where supervision and `stop` look for it, ended or not.
        if let Some(m) = self.members.get_mut(&id) {
            m.child = Some(child);
        }
        match outcome {
            Ok(said) => said,
            Err(status) => {
                let how = match status {
                    Ok(s) => match (s.code(), s.signal()) {
                        (Some(code), _) => format!("exited with status {code}"),
                        (None, Some(signal)) => format!("was killed by signal {signal}"),
                        (None, None) => "ended".to_string(),
                    },
                    Err(e) => format!("could not be waited for ({e})"),
                };
                let log = self.dir.join(format!("member-{id}.log"));
                let last = std::fs::read_to_string(&log)
                    .ok()
                    .and_then(|text| {
                        text.lines()
                            .rev()
                            .find(|l| !l.trim().is_empty())
                            .map(str::to_owned)
                    })
                    .unwrap_or_default();
                Err(CliError::msg(format!(
                    "member {id} {how} before it was added; its log {} ends: {last}",
                    log.display()
                )))
            }
        }
    }

    /// Asks the member that leads to add member `id` as an observer; again
    /// of the next one if the lead moves meanwhile.
    async fn ask_to_add_observer(&self, id: u64) -> Result<String, CliError> {
        let change = baton_cluster::admin::Change::Add {
            id,
            member: self.member(id),
            observer: true,
        };
        let tls = crate::peer_tls()?;
        let mut last = String::from("no member leads");
        for _ in 0..3 {
            let Some(leader) = self.wait_leader(Duration::from_secs(10)).await else {
                continue;
            };
            let peer = self.member(leader).peer;
            let limit = Duration::from_secs(120);
            match baton_cluster::network::ask_change(&peer, change.clone(), limit, tls.as_ref())
                .await
            {
                Ok(said) => return Ok(said),
                Err(e) => last = e.to_string(),
            }
        }
        Err(CliError::msg(last))
    }

    /// Every member's client address as clients are given it (a proxy's,
    /// for a cluster launched behind proxies), comma-separated.
    pub fn clients(&self) -> String {
        self.members
            .values()
            .map(|m| self.fronts.get(&m.id).unwrap_or(&m.client).clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn disk_fault_file(&self, id: u64) -> PathBuf {
        self.dir.join(format!("member-{id}.disk-faults"))
    }

    /// Sets the disk fault member `id` plays from now on (`None`: a sound
    /// disk again); the cluster must have been launched with disk faults.
    pub fn disk_fault(&self, id: u64, fault: Option<DiskFault>) -> Result<(), CliError> {
        let path = self.disk_fault_file(id);
        // Written whole, then renamed over the old: the member never reads
        // half a line.
        let next = path.with_extension("next");
        let line = fault.map(DiskFault::line).unwrap_or_default();
        std::fs::write(&next, line)
            .and_then(|()| std::fs::rename(&next, &path))
            .map_err(|e| CliError::msg(format!("cannot write {}: {e}", path.display())))
    }

    /// Whether member `id`'s process has ended (by itself: a failed log
    /// write stops a server).
    pub fn exited(&mut self, id: u64) -> bool {
        self.members
            .get_mut(&id)
            .and_then(|m| m.child.as_mut())
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// SIGKILL to member `id`, reaped.
    pub async fn kill9(&mut self, id: u64) {
        if let Some(child) = self.members.get_mut(&id).and_then(|m| m.child.as_mut()) {
            let _ = child.kill().await;
        }
    }

    /// Starts member `id` again on its ports, from its data directory.
    pub async fn restart(&mut self, id: u64) -> Result<(), CliError> {
        self.start_again(id, false).await
    }

    /// Starts member `id` again on its ports with an empty data directory,
    /// to be added to the cluster again (it must have been removed): see
    /// [`LocalCluster::member`] for its addresses.
    pub async fn rejoin(&mut self, id: u64) -> Result<(), CliError> {
        self.start_again(id, true).await
    }

    /// Member `id`'s peer and client addresses as the others name them.
    pub fn member(&self, id: u64) -> baton_cluster::Member {
        let m = &self.members[&id];
        baton_cluster::Member {
            peer: self.peer_fronts.get(&id).unwrap_or(&m.peer).clone(),
            client: self.fronts.get(&id).unwrap_or(&m.client).clone(),
        }
    }

    /// Member `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("member-{id}"))
    }

    async fn start_again(&mut self, id: u64, join: bool) -> Result<(), CliError> {
        let (client, peer) = {
            let m = &self.members[&id];
            (m.client.clone(), m.peer.clone())
        };
        self.kill9(id).await;
        if join {
            let data = self.data_dir(id);
            if data.exists() {
                std::fs::remove_dir_all(&data)
                    .map_err(|e| CliError::msg(format!("cannot wipe {}: {e}", data.display())))?;
            }
        }
        // The ports are free again once the member is gone; a moment may
        // pass before the kernel lets go of them.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let (client, peer) = loop {
            match (bind(&client), bind(&peer)) {
                (Ok(c), Ok(p)) => break (c, p),
                (Err(e), _) | (_, Err(e)) if tokio::time::Instant::now() > deadline => {
                    return Err(e)
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        self.spawn(id, client, peer, join)
    }

    /// The id of the member that leads now, if one answers that it does.
    pub async fn leader(&self) -> Option<u64> {
        for m in self.members.values() {
            if let Ok(answer) =
                baton_client::probe(&m.client, Duration::from_millis(500), None).await
            {
                let status: serde_json::Value = serde_json::from_str(&answer).ok()?;
                if status["role"] == "leader" {
                    return status["cluster"]["id"].as_u64();
                }
                if status["role"] == "single" {
                    return Some(m.id);
                }
            }
        }
        None
    }

    /// Waits (within `limit`) until a member leads; returns it.
    pub async fn wait_leader(&self, limit: Duration) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Some(id) = self.leader().await {
                return Some(id);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Member `id`'s applied index, from its status.
    pub async fn applied(&self, id: u64) -> Option<u64> {
        let answer =
            baton_client::probe(&self.members[&id].client, Duration::from_millis(500), None)
                .await
                .ok()?;
        let status: serde_json::Value = serde_json::from_str(&answer).ok()?;
        status["cluster"]["applied_index"].as_u64()
    }

    /// Stops every member: SIGTERM, then SIGKILL after ten seconds.
    pub async fn stop(mut self) {
        for m in self.members.values_mut() {
            let running = m
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
            if running && m.pid > 0 {
                // SAFETY: kill has no memory effects; the child is running
                // and not yet reaped, so the pid is still its own.
                unsafe {
                    libc::kill(m.pid as i32, libc::SIGTERM);
                }
            }
        }
        for m in self.members.values_mut() {
            if let Some(child) = m.child.as_mut() {
                if tokio::time::timeout(Duration::from_secs(10), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.kill().await;
                }
            }
        }
    }
}

pub async fn run(args: LocalArgs) -> CliResult {
    let mut extra = vec![
        "--election-timeout".to_string(),
        args.election_timeout.to_string(),
    ];
    extra.extend([
        "--followers-serve".to_string(),
        args.followers_serve.to_string(),
    ]);
    if let Some(mode) = args.zk_read_mode {
        extra.extend(["--zk-read-mode".to_string(), mode.name().to_string()]);
    }
    let mut cluster = match args.zk {
        Some(base) => {
            let all = args.members + args.observers;
            if u64::from(base) + all - 1 > u64::from(u16::MAX) {
                return Err(CliError::msg(format!(
                    "--zk {base}: {all} members need ports {base} to {}, past 65535",
                    u64::from(base) + all - 1
                )));
            }
            LocalCluster::start_with_zk(args.members, &args.data_dir, &extra, base)?
        }
        None => LocalCluster::start(args.members, &args.data_dir, &extra)?,
    };
    for m in cluster.members.values() {
        println!(
            "member {} client {} peer {} pid {}",
            m.id, m.client, m.peer, m.pid
        );
    }
    if let Some(base) = args.zk {
        let hosts: Vec<String> = (0..args.members)
            .map(|i| format!("127.0.0.1:{}", u64::from(base) + i))
            .collect();
        println!("ZooKeeper clients: connect string {}", hosts.join(","));
    }
    let clients = cluster.clients();
    println!(
        "cluster of {} running; logs in {}/member-N.log; try: baton --server {clients} cluster status",
        args.members,
        args.data_dir.display()
    );
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    match leader {
        Some(leader) => println!("member {leader} leads"),
        None => println!("no member leads yet; see the members' logs"),
    }
    if args.observers > 0 && leader.is_none() {
        cluster.stop().await;
        return Err(CliError::msg(
            "no member led within 10 s, so the observers could not be added; see the members' logs",
        ));
    }
    for id in args.members + 1..=args.members + args.observers {
        if let Err(e) = cluster.add_observer(id).await {
            cluster.stop().await;
            return Err(CliError::msg(format!("adding observer {id}: {e}")));
        }
        let m = &cluster.members[&id];
        println!(
            "member {} client {} peer {} pid {} (observer)",
            m.id, m.client, m.peer, m.pid
        );
    }
    if args.observers > 0 {
        println!(
            "{} observer(s) added; clients may use every address: baton --server {}",
            args.observers,
            cluster.clients()
        );
    }
    supervise(&mut cluster, leader).await?;
    println!("stopping the cluster");
    cluster.stop().await;
    Ok(ExitCode::SUCCESS)
}

/// Waits for Ctrl-C (or SIGTERM, SIGHUP), reporting members that exit
/// meanwhile, and each change of leader.
async fn supervise(cluster: &mut LocalCluster, mut leader: Option<u64>) -> Result<(), CliError> {
    let listen =
        |kind| signal(kind).map_err(|e| CliError::msg(format!("cannot listen for signals: {e}")));
    let (mut int, mut term, mut hup) = (
        listen(SignalKind::interrupt())?,
        listen(SignalKind::terminate())?,
        listen(SignalKind::hangup())?,
    );
    loop {
        let exited = {
            let exits: Vec<_> = cluster
                .members
                .values_mut()
                .filter_map(|m| {
                    let id = m.id;
                    m.child
                        .as_mut()
                        .map(|c| Box::pin(async move { (id, c.wait().await) }))
                })
                .collect();
            if exits.is_empty() {
                return Ok(());
            }
            tokio::select! {
                ((id, status), _, _) = futures::future::select_all(exits) => Some(Some((id, status))),
                _ = tokio::time::sleep(LEADER_CHECK) => Some(None),
                _ = int.recv() => None,
                _ = term.recv() => None,
                _ = hup.recv() => None,
            }
        };
        let Some(exited) = exited else {
            return Ok(());
        };
        let Some((id, status)) = exited else {
            let now = cluster.leader().await;
            if now != leader {
                match now {
                    Some(id) => println!("member {id} leads"),
                    None => println!("no member leads at the moment"),
                }
                leader = now;
            }
            continue;
        };
        let member = cluster.members.get_mut(&id).expect("a member");
        let pid = member.pid;
        member.child = None;
        let how = match status {
            Ok(s) if s.signal().is_some() => {
                format!("was killed by signal {}", s.signal().unwrap_or(0))
            }
            Ok(s) => format!("exited with status {}", s.code().unwrap_or(-1)),
            Err(e) => format!("could not be waited for: {e}"),
        };
        println!(
            "member {id} (pid {pid}) {how}; not restarted (the command to start it again is at the top of {}/member-{id}.log)",
            cluster.dir.display()
        );
    }
}
