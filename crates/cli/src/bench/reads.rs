//! `baton bench reads`: how many reads and watched reads a single server
//! and a cluster serve, and how long one change takes to reach many
//! watchers, with a ZooKeeper ensemble measured the same way in the same
//! run if one is named.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{Client, CreateMode, ReadMode, Watcher};
use bytes::Bytes;
use serde::Serialize;

use super::raw_watch::RawWatcher;
use super::zk_client::ZkClient;
use super::{progress, Summary};
use crate::local::LocalCluster;
use crate::CliError;

/// Measure reads, watched reads and the fan-out of one change.
///
/// Starts a single server, then a cluster of --members `baton serve`
/// processes once for each of --followers-serve (data under --dir), and
/// against each runs:
///
/// - reads: --clients sessions, each reading the data of --nodes nodes in
///   turn for --duration, as fast as its replies come back;
/// - watched reads: the same, each read leaving a watch on the node;
/// - fan-out: --watchers sessions each watch one node; one change to it is
///   made --fanouts times, and the time from sending the change until the
///   last watcher is told of it is reported (the median over the changes).
///
/// With --observers, each cluster also gets that many observers (members
/// that serve clients but never vote) once a member leads. Client N is
/// given the members' addresses, observers included, starting from member
/// N (mod their number), so clients are spread over every member that
/// serves them. A cluster is measured once for each of --read-modes (a
/// single server answers reads the same way in both). Server CPU is the servers' user and system time from /proc
/// over each timed run.
#[derive(clap::Args)]
pub struct ReadsArgs {
    /// Members of the cluster measured after the single server (1: the
    /// single server only).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=9))]
    members: u64,
    /// Observers added to each cluster measured (not to the single
    /// server): members that serve clients (with --followers-serve true)
    /// but never vote. The table shows them as members+observers.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=9))]
    observers: u64,
    /// Reading clients, each its own session.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Nodes the clients read, in turn.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// How long each timed run of reads lasts (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::duration::millis)]
    duration_ms: u64,
    /// Watchers of the fan-out, each its own session (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    watchers: usize,
    /// Changes made for the fan-out.
    #[arg(long, default_value_t = 5)]
    fanouts: usize,
    /// The fan-out's watchers speak the wire protocol on sockets of their
    /// own (one task each, nothing between the socket and the clock)
    /// rather than through a client library (Baton's, or this benchmark's
    /// ZooKeeper client): the time measured is then more the server's and
    /// less this process's, which shares the machine's cores.
    #[arg(long)]
    raw_watchers: bool,
    /// The cluster is measured once for each of these, comma-separated:
    /// `false`, followers send clients to the leader (every client ends up
    /// there); `true`, followers serve clients (`baton serve
    /// --followers-serve true`).
    #[arg(
        long,
        value_name = "BOOL,...",
        value_delimiter = ',',
        default_value = "false,true"
    )]
    followers_serve: Vec<bool>,
    /// The clients' read modes a cluster is measured with, comma-separated:
    /// `linearizable` (each read confirmed with the leader) and
    /// `sequential` (answered from the serving member's own state, as
    /// ZooKeeper's are).
    #[arg(
        long,
        value_name = "MODE,...",
        value_delimiter = ',',
        default_value = "linearizable,sequential"
    )]
    read_modes: Vec<ReadMode>,
    /// A ZooKeeper ensemble to measure the same way: its members'
    /// HOST:PORT, comma-separated.
    #[arg(long, value_name = "HOST:PORT,...")]
    zookeeper: Option<String>,
    /// The process ids of that ensemble's members, comma-separated, to read
    /// their CPU time from /proc (without them, its CPU is not reported).
    #[arg(long, value_name = "PID,...", value_delimiter = ',')]
    zookeeper_pids: Vec<u32>,
    /// Directory for the data directories (default: the system's temporary
    /// directory).
    #[arg(long, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
    /// Print one JSON object per run instead of a table.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print a Markdown table (as in docs/benchmarks.md).
    #[arg(long)]
    markdown: bool,
}

/// One server or ensemble's results.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReadRun {
    /// `baton` or `zookeeper`.
    pub server: &'static str,
    /// Voting members (1: a single server).
    pub members: u64,
    /// Non-voting members that serve clients (`--observers`).
    pub observers: u64,
    /// Whether followers served clients (ZooKeeper's always do).
    pub followers_serve: bool,
    /// The clients' read mode: `linearizable` or `sequential` (ZooKeeper's
    /// reads are sequential).
    pub read_mode: &'static str,
    pub clients: usize,
    pub reads_per_s: f64,
    pub read: Summary,
    pub watched_reads_per_s: f64,
    /// Server CPU (user + system, every member) per read, in µs; absent if
    /// unknown.
    pub server_cpu_us_per_read: Option<f64>,
    pub watchers: usize,
    /// How the watchers listen: `library` (a client library's sessions) or
    /// `raw` (the wire protocol on a socket each, `--raw-watchers`).
    pub watcher_client: &'static str,
    /// From sending a change until its last watcher is told, over the
    /// changes made (in µs, as every summary).
    pub fanout: Option<Summary>,
    /// The writer's own wait for its change to be acknowledged (µs).
    pub fanout_write: Option<Summary>,
    /// Before each change: from asking every watcher to set its watch
    /// again until the last one is set (µs; polled every millisecond).
    pub fanout_watch: Option<Summary>,
    pub failed: Option<String>,
}

/// Where a benchmark's sessions go.
#[derive(Clone)]
enum Target {
    /// Baton servers: their client addresses, and the clients' read mode.
    Baton(Vec<String>, ReadMode),
    /// ZooKeeper servers: their addresses.
    Zookeeper(Vec<String>),
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::Baton(..) => "baton",
            Target::Zookeeper(_) => "zookeeper",
        }
    }

    fn members(&self) -> u64 {
        match self {
            Target::Baton(a, _) | Target::Zookeeper(a) => a.len() as u64,
        }
    }
}

/// One session of either kind.
enum Session {
    Baton(Client),
    Zookeeper(Arc<ZkClient>),
}

/// How long the benchmark's sessions live without a word.
const SESSION_TIMEOUT: Duration = Duration::from_secs(60);

impl Session {
    /// Opens session number `n`: a Baton client is given every member,
    /// starting from member `n`; a ZooKeeper client, member `n` alone.
    async fn open(target: &Target, n: usize) -> Result<Session, CliError> {
        match target {
            Target::Baton(addrs, mode) => {
                let start = n % addrs.len();
                let rotated: Vec<&str> = addrs[start..]
                    .iter()
                    .chain(&addrs[..start])
                    .map(String::as_str)
                    .collect();
                let client = Client::builder(&rotated.join(","))
                    .session_timeout(SESSION_TIMEOUT)
                    .read_mode(*mode)
                    .connect()
                    .await?;
                Ok(Session::Baton(client))
            }
            Target::Zookeeper(hosts) => Ok(Session::Zookeeper(
                ZkClient::connect(&hosts[n % hosts.len()], SESSION_TIMEOUT).await?,
            )),
        }
    }

    async fn read(&self, path: &str) -> Result<(), CliError> {
        match self {
            Session::Baton(c) => c.get_data(path).await.map(drop).map_err(Into::into),
            Session::Zookeeper(c) => c.get_data(path, false).await.map(drop),
        }
    }

    /// Reads `path`, leaving a watch on it; a Baton watch is handed back
    /// (dropping it would take the watch away).
    async fn read_watched(&self, path: &str) -> Result<Option<Watcher>, CliError> {
        match self {
            Session::Baton(c) => Ok(Some(c.get_data_watch(path).await?.2)),
            Session::Zookeeper(c) => c.get_data(path, true).await.map(|_| None),
        }
    }

    /// Waits for the change a watch left by [`Session::read_watched`]
    /// reports.
    async fn changed(&self, watcher: Option<Watcher>) -> Result<(), CliError> {
        match (self, watcher) {
            (Session::Baton(_), Some(w)) => w.changed().await.map(drop).map_err(Into::into),
            (Session::Zookeeper(c), None) => match c.event().await {
                Some(_) => Ok(()),
                None => Err(CliError::msg("the ZooKeeper connection closed")),
            },
            _ => unreachable!("a Baton session's watch is handed back"),
        }
    }

    async fn set(&self, path: &str, data: Bytes) -> Result<(), CliError> {
        match self {
            Session::Baton(c) => c
                .set_data(path, data, None)
                .await
                .map(drop)
                .map_err(Into::into),
            Session::Zookeeper(c) => c.set_data(path, data).await,
        }
    }

    async fn ensure(&self, path: &str) -> Result<(), CliError> {
        match self {
            Session::Baton(c) => match c.create(path, "", CreateMode::Persistent).await {
                Ok(_) | Err(baton_client::Error::NodeExists(_)) => Ok(()),
                Err(e) => Err(e.into()),
            },
            Session::Zookeeper(c) => c.ensure(path).await,
        }
    }

    async fn close(self) {
        match self {
            Session::Baton(c) => c.close().await,
            Session::Zookeeper(c) => c.close().await,
        }
    }
}

const ROOT: &str = "/bench-reads";

fn node(i: usize) -> String {
    format!("{ROOT}/n{i}")
}

/// Open files the benchmark keeps for itself beyond its sessions' sockets
/// (the runtime, the servers' pipes, files it reads).
const FD_MARGIN: u64 = 256;

pub async fn run(args: ReadsArgs) -> Result<(), CliError> {
    crate::sys::raise_fd_limit();
    // Every watcher and reader is a session with a socket here, and one in
    // the server it reaches (a single server reaches them all): refused
    // now, rather than after a long wait for sockets that cannot be made.
    let sessions = (args.watchers + args.clients) as u64;
    let limit = crate::sys::fd_limit();
    if sessions + FD_MARGIN > limit {
        return Err(CliError::msg(format!(
            "--watchers {} and --clients {} need about {} open files in this process and in a \
             single server, but a process here may open {limit} (ulimit -n; its hard limit \
             is ulimit -Hn): give fewer watchers, or raise the limit",
            args.watchers,
            args.clients,
            sessions + FD_MARGIN
        )));
    }
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let root = base.join(format!("baton-bench-reads-{}", std::process::id()));
    let mut runs = Vec::new();
    let mut setups = vec![(1, false)];
    if args.members > 1 {
        setups.extend(args.followers_serve.iter().map(|&f| (args.members, f)));
    }
    for (members, followers_serve) in setups {
        let mut extra = vec![
            "--max-session-timeout".to_string(),
            (SESSION_TIMEOUT.as_millis() * 2).to_string(),
        ];
        if members > 1 {
            extra.extend(["--followers-serve".to_string(), followers_serve.to_string()]);
        }
        let observers = if members > 1 { args.observers } else { 0 };
        let what = match (members, followers_serve) {
            (1, _) => "a single server".to_string(),
            (n, false) => {
                format!("a cluster of {n} members, followers sending clients to the leader")
            }
            (n, true) => format!("a cluster of {n} members, followers serving clients"),
        };
        progress(format!("starting {what}"));
        let dir = root.join(format!("members-{members}-{followers_serve}"));
        let mut cluster = LocalCluster::launch(members, &dir, &extra, members == 1, None)?;
        let result = async {
            cluster
                .wait_leader(Duration::from_secs(30))
                .await
                .ok_or_else(|| CliError::msg(format!("no member of {what} leads after 30 s")))?;
            for id in members + 1..=members + observers {
                progress(format!("adding observer {id}"));
                cluster
                    .add_observer(id)
                    .await
                    .map_err(|e| CliError::msg(format!("adding observer {id} to {what}: {e}")))?;
            }
            let addrs: Vec<String> = cluster.clients().split(',').map(str::to_owned).collect();
            let pids: Vec<u32> = cluster.members.values().map(|m| m.pid).collect();
            let modes = if members == 1 {
                &[ReadMode::Linearizable][..]
            } else {
                &args.read_modes[..]
            };
            let mut measured = Vec::new();
            for &mode in modes {
                progress(format!("{} reads", mode.name()));
                let target = Target::Baton(addrs.clone(), mode);
                let mut run = measure(&target, &pids, &args).await;
                run.followers_serve = followers_serve;
                (run.members, run.observers) = (members, observers);
                emit(&run, args.json);
                measured.push(run);
            }
            Ok::<_, CliError>(measured)
        }
        .await;
        cluster.stop().await;
        runs.extend(result?);
    }
    let _ = std::fs::remove_dir_all(&root);
    if let Some(zookeeper) = &args.zookeeper {
        let hosts: Vec<String> = zookeeper.split(',').map(|h| h.trim().to_owned()).collect();
        progress(format!("ZooKeeper at {}", hosts.join(",")));
        let run = measure(&Target::Zookeeper(hosts), &args.zookeeper_pids, &args).await;
        emit(&run, args.json);
        runs.push(run);
    }
    if !args.json {
        if args.markdown {
            print_markdown(&runs);
        } else {
            print_table(&runs);
        }
    }
    Ok(())
}

fn emit(run: &ReadRun, json: bool) {
    if json {
        println!("{}", serde_json::to_string(run).expect("a run serializes"));
    }
    if let Some(why) = &run.failed {
        progress(format!(
            "{} with {} members: {why}",
            run.server, run.members
        ));
    }
}

/// Every measurement against one target; a failure is reported in the run.
async fn measure(target: &Target, pids: &[u32], args: &ReadsArgs) -> ReadRun {
    let mut run = ReadRun {
        server: target.name(),
        members: target.members(),
        // ZooKeeper's followers always serve their clients.
        followers_serve: target.members() > 1 && matches!(target, Target::Zookeeper(_)),
        read_mode: match target {
            Target::Baton(_, mode) => mode.name(),
            Target::Zookeeper(_) => ReadMode::Sequential.name(),
        },
        clients: args.clients,
        watchers: args.watchers,
        watcher_client: if args.raw_watchers { "raw" } else { "library" },
        ..ReadRun::default()
    };
    if let Err(e) = measure_into(&mut run, target, pids, args).await {
        run.failed = Some(e.to_string());
    }
    run
}

async fn measure_into(
    run: &mut ReadRun,
    target: &Target,
    pids: &[u32],
    args: &ReadsArgs,
) -> Result<(), CliError> {
    let duration = Duration::from_millis(args.duration_ms);
    let setup = Session::open(target, 0).await?;
    setup.ensure(ROOT).await?;
    for i in 0..args.nodes.max(1) {
        setup.ensure(&node(i)).await?;
        setup.set(&node(i), Bytes::from(vec![b'x'; 64])).await?;
    }
    progress(format!(
        "{} members: opening {} reading sessions",
        run.members, args.clients
    ));
    let readers = open_many(target, args.clients).await?;
    progress(format!(
        "{} members: reads, {} clients, {} ms",
        run.members, args.clients, args.duration_ms
    ));
    let cpu_before = cpu_of(pids);
    let (reads, mut latencies) = read_run(&readers, args.nodes, duration, false).await?;
    let cpu_after = cpu_of(pids);
    run.reads_per_s = reads as f64 / duration.as_secs_f64();
    run.read = Summary::of(&mut latencies);
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        run.server_cpu_us_per_read =
            Some((after - before).as_secs_f64() * 1e6 / reads.max(1) as f64);
    }
    progress(format!(
        "{} members: watched reads, {} clients, {} ms",
        run.members, args.clients, args.duration_ms
    ));
    let (watched, _) = read_run(&readers, args.nodes, duration, true).await?;
    run.watched_reads_per_s = watched as f64 / duration.as_secs_f64();
    close_many(readers).await;
    if args.watchers > 0 && args.fanouts > 0 {
        let (fanout, writes, watches) = fanout_run(run, target, &setup, args).await?;
        run.fanout = Some(fanout);
        run.fanout_write = Some(writes);
        run.fanout_watch = Some(watches);
    }
    setup.close().await;
    Ok(())
}

/// CPU time of all of `pids`, if every one is known.
fn cpu_of(pids: &[u32]) -> Option<Duration> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|&p| crate::sys::cpu_time(p))
        .sum::<Option<Duration>>()
}

/// Opens `n` sessions, a few hundred handshakes at a time, numbered from 1
/// (session 0 is the one that sets up and writes).
async fn open_many(target: &Target, n: usize) -> Result<Vec<Arc<Session>>, CliError> {
    let opened = Arc::new(AtomicUsize::new(0));
    let sessions = super::each_bounded(1..=n, |i| {
        let (target, opened) = (target.clone(), opened.clone());
        async move {
            let session = Session::open(&target, i).await;
            let done = opened.fetch_add(1, Ordering::Relaxed) + 1;
            if done % 2_000 == 0 && done < n {
                progress(format!("{done}/{n} sessions open"));
            }
            session.map(Arc::new)
        }
    })
    .await?;
    sessions.into_iter().collect()
}

async fn close_many(sessions: Vec<Arc<Session>>) {
    let owned = sessions.into_iter().filter_map(Arc::into_inner);
    let _ = super::each_bounded(owned, |s| async move { s.close().await }).await;
}

/// Every session reads (leaving watches if `watched`) until `duration` is
/// up; the reads made and their latencies.
async fn read_run(
    sessions: &[Arc<Session>],
    nodes: usize,
    duration: Duration,
    watched: bool,
) -> Result<(u64, Vec<Duration>), CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(me, session)| {
            let (session, stop) = (session.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                // Watches stay set until the run ends.
                let mut watchers = Vec::new();
                let mut next = me;
                while !stop.load(Ordering::Relaxed) {
                    let path = node(next % nodes.max(1));
                    next += 1;
                    let started = Instant::now();
                    if watched {
                        watchers.extend(session.read_watched(&path).await?);
                    } else {
                        session.read(&path).await?;
                    }
                    latencies.push(started.elapsed());
                }
                drop(watchers);
                Ok::<_, CliError>(latencies)
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut reads = 0;
    let mut all = Vec::new();
    for t in tasks {
        let latencies = t.await.map_err(|e| CliError::msg(e.to_string()))??;
        reads += latencies.len() as u64;
        all.extend(latencies);
    }
    Ok((reads, all))
}

/// What the fan-out's watchers share.
#[derive(Default)]
struct Fan {
    /// Watches set, over all rounds.
    ready: AtomicUsize,
    /// Watchers told, over all rounds.
    told: AtomicUsize,
    /// The latest time a watcher was told in the round, in ns since `base`.
    last_ns: AtomicU64,
}

impl Fan {
    /// A watcher was told, now.
    fn told_at(&self, base: Instant) {
        let at = base.elapsed().as_nanos() as u64;
        self.last_ns.fetch_max(at, Ordering::SeqCst);
        self.told.fetch_add(1, Ordering::SeqCst);
    }
}

/// Opens `n` raw watchers (see [`RawWatcher`]), spread as the sessions of
/// [`open_many`] are.
async fn open_raw(target: &Target, n: usize) -> Result<Vec<RawWatcher>, CliError> {
    let opened = Arc::new(AtomicUsize::new(0));
    let watchers = super::each_bounded(1..=n, |i| {
        let (target, opened) = (target.clone(), opened.clone());
        async move {
            let watcher = match &target {
                Target::Baton(addrs, mode) => {
                    RawWatcher::baton(addrs, i, *mode, SESSION_TIMEOUT).await
                }
                Target::Zookeeper(hosts) => {
                    RawWatcher::zookeeper(&hosts[i % hosts.len()], SESSION_TIMEOUT).await
                }
            };
            let done = opened.fetch_add(1, Ordering::Relaxed) + 1;
            if done % 2_000 == 0 && done < n {
                progress(format!("{done}/{n} raw watchers open"));
            }
            watcher
        }
    })
    .await?;
    watchers.into_iter().collect()
}

/// How long a round of the fan-out may take, at most: setting every watch,
/// then telling every watcher.
const ROUND_LIMIT: Duration = Duration::from_secs(120);

/// `args.watchers` sessions watch one node; it is changed `args.fanouts`
/// times. The time until the last watcher is told of each change, the
/// writer's wait for each change, and the time to set every watch before
/// each.
async fn fanout_run(
    run: &ReadRun,
    target: &Target,
    writer: &Session,
    args: &ReadsArgs,
) -> Result<(Summary, Summary, Summary), CliError> {
    let path = format!("{ROOT}/fan");
    writer.ensure(&path).await?;
    progress(format!(
        "{} members: opening {} watching sessions",
        run.members, args.watchers
    ));
    let (open, opened) = tokio::sync::watch::channel(0usize);
    let fan = Arc::new(Fan::default());
    let base = Instant::now();
    let rounds = args.fanouts;
    // Watches are set again for round R only once round R-1 is over, so
    // that setting them does not compete with telling the others. A raw
    // watcher is handed back once its rounds are over, to be closed.
    let mut watchers = Vec::new();
    let tasks: Vec<tokio::task::JoinHandle<Result<Option<RawWatcher>, CliError>>> =
        if args.raw_watchers {
            open_raw(target, args.watchers)
                .await?
                .into_iter()
                .map(|mut watcher| {
                    let (fan, path, mut opened) = (fan.clone(), path.clone(), opened.clone());
                    tokio::spawn(async move {
                        for round in 1..=rounds {
                            if opened.wait_for(|r| *r >= round).await.is_err() {
                                break;
                            }
                            watcher.watch(&path).await?;
                            fan.ready.fetch_add(1, Ordering::SeqCst);
                            watcher.changed().await?;
                            fan.told_at(base);
                        }
                        Ok(Some(watcher))
                    })
                })
                .collect()
        } else {
            watchers = open_many(target, args.watchers).await?;
            watchers
                .iter()
                .map(|session| {
                    let (session, fan, path) = (session.clone(), fan.clone(), path.clone());
                    let mut opened = opened.clone();
                    tokio::spawn(async move {
                        for round in 1..=rounds {
                            if opened.wait_for(|r| *r >= round).await.is_err() {
                                break;
                            }
                            let watch = session.read_watched(&path).await?;
                            fan.ready.fetch_add(1, Ordering::SeqCst);
                            session.changed(watch).await?;
                            fan.told_at(base);
                        }
                        Ok(None)
                    })
                })
                .collect()
        };
    let n = args.watchers;
    let mut fanouts = Vec::new();
    let mut writes = Vec::new();
    let mut watch_sets = Vec::new();
    let result = async {
        for round in 1..=rounds {
            let asked = Instant::now();
            open.send_replace(round);
            until(
                || fan.ready.load(Ordering::SeqCst) >= n * round,
                || {
                    format!(
                        "{} of {n} watches set within {} s",
                        fan.ready.load(Ordering::SeqCst) - n * (round - 1),
                        ROUND_LIMIT.as_secs()
                    )
                },
            )
            .await?;
            watch_sets.push(asked.elapsed());
            fan.last_ns.store(0, Ordering::SeqCst);
            let sent = base.elapsed();
            writer
                .set(&path, Bytes::from(format!("change {round}")))
                .await?;
            writes.push(base.elapsed() - sent);
            until(
                || fan.told.load(Ordering::SeqCst) >= n * round,
                || {
                    format!(
                        "{} of {n} watchers told of change {round} within {} s",
                        fan.told.load(Ordering::SeqCst) - n * (round - 1),
                        ROUND_LIMIT.as_secs()
                    )
                },
            )
            .await?;
            let last = Duration::from_nanos(fan.last_ns.load(Ordering::SeqCst));
            let took = last.saturating_sub(sent);
            progress(format!(
                "{} members: change {round}/{rounds} reached {n} watchers in {:.1} ms",
                run.members,
                took.as_secs_f64() * 1e3
            ));
            fanouts.push(took);
        }
        Ok::<_, CliError>(())
    }
    .await;
    // Stopped, and gone (with their hold on the sessions) before they close.
    for t in &tasks {
        if !t.is_finished() {
            t.abort();
        }
    }
    let mut raw = Vec::new();
    for t in tasks {
        if let Ok(Ok(Some(watcher))) = t.await {
            raw.push(watcher);
        }
    }
    let _ = super::each_bounded(raw, |w| async move { w.close().await }).await;
    close_many(watchers).await;
    result?;
    Ok((
        Summary::of(&mut fanouts),
        Summary::of(&mut writes),
        Summary::of(&mut watch_sets),
    ))
}

/// Polls `done` until it holds, for at most [`ROUND_LIMIT`]; else fails
/// with `why()`.
async fn until(done: impl Fn() -> bool, why: impl Fn() -> String) -> Result<(), CliError> {
    let deadline = Instant::now() + ROUND_LIMIT;
    while !done() {
        if Instant::now() > deadline {
            return Err(CliError::msg(why()));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// A summary's median in ms.
fn ms(s: &Option<Summary>) -> String {
    s.map_or("-".into(), |s| format!("{:.1}", s.p50_us / 1e3))
}

fn cpu(r: &ReadRun) -> String {
    r.server_cpu_us_per_read
        .map_or("-".into(), |c| format!("{c:.1}"))
}

/// Voting members, and observers if any (`3+2`).
fn members(r: &ReadRun) -> String {
    match r.observers {
        0 => r.members.to_string(),
        n => format!("{}+{n}", r.members),
    }
}

/// Who serves a run's clients: `one` server, the `leader` alone, or
/// `all` members.
fn serving(r: &ReadRun) -> &'static str {
    match (r.members, r.followers_serve) {
        (1, _) => "one",
        (_, false) => "leader",
        (_, true) => "all",
    }
}

fn print_table(runs: &[ReadRun]) {
    println!(
        "{:<10} {:>7} {:>7} {:>12} {:>8} {:>10} {:>9} {:>12} {:>12} {:>9} {:>12} {:>10} {:>10}",
        "server",
        "members",
        "serving",
        "reads",
        "clients",
        "reads/s",
        "read p50",
        "cpu µs/read",
        "watched/s",
        "watchers",
        "fan-out p50",
        "write p50",
        "watch p50"
    );
    for r in runs {
        println!(
            "{:<10} {:>7} {:>7} {:>12} {:>8} {:>10.0} {:>7.0}µs {:>12} {:>12.0} {:>9} {:>10}ms {:>8}ms {:>8}ms",
            r.server,
            members(r),
            serving(r),
            r.read_mode,
            r.clients,
            r.reads_per_s,
            r.read.p50_us,
            cpu(r),
            r.watched_reads_per_s,
            r.watchers,
            ms(&r.fanout),
            ms(&r.fanout_write),
            ms(&r.fanout_watch)
        );
        if let Some(why) = &r.failed {
            println!("           FAILED: {why}");
        }
    }
}

fn print_markdown(runs: &[ReadRun]) {
    let (watchers, how) = runs
        .first()
        .map_or((0, "library"), |r| (r.watchers, r.watcher_client));
    let how = if how == "raw" { " (raw)" } else { "" };
    println!("| server | members | clients served by | reads | reads/s | read p50 µs | server CPU µs/read | watched reads/s | fan-out to {watchers} watchers{how}, p50 ms | its write, p50 ms | every watch set again, p50 ms |");
    println!("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in runs {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.0} | {} | {:.0} | {} | {} | {} |",
            r.server,
            members(r),
            serving(r),
            r.read_mode,
            r.reads_per_s,
            r.read.p50_us,
            cpu(r),
            r.watched_reads_per_s,
            ms(&r.fanout),
            ms(&r.fanout_write),
            ms(&r.fanout_watch)
        );
    }
    for r in runs.iter().filter(|r| r.failed.is_some()) {
        println!();
        println!(
            "{} with {} members failed: {}",
            r.server,
            r.members,
            r.failed.as_deref().unwrap_or_default()
        );
    }
}
