//! `baton bench zookeeper`: the herd benchmark through ZooKeeper's client
//! protocol. The lock recipes ZooKeeper's users run (Curator's and kazoo's:
//! each waiter watches the node before its own; and the naive one, every
//! waiter watching the lock's children) drive Baton's ZooKeeper listener
//! and, in the same run, a ZooKeeper server if one is named; Baton's own
//! protocol and lock recipe run too, for comparison. Each run reports
//! contended handovers per second and the server's CPU per handover, read
//! from /proc.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_zk::codes::{event, mode};
use serde::Serialize;
use tokio::sync::{watch, Semaphore};

use super::server::ChildServer;
use super::zk_client::ZkClient;
use super::{progress, Summary};
use crate::CliError;

#[derive(clap::Args)]
pub struct ZkBenchArgs {
    /// Numbers of waiters, as a comma-separated list.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    waiters: Vec<usize>,
    /// Handovers measured per run (after every waiter has queued).
    #[arg(long, default_value_t = 2_000)]
    handovers: u64,
    /// Recipes: `predecessor` (each waiter watches the node before its own,
    /// as Curator's and kazoo's locks do) and `watch-all` (every waiter
    /// watches the lock's children: the herd).
    #[arg(long, value_delimiter = ',', default_value = "predecessor,watch-all")]
    recipe: Vec<ZkRecipe>,
    /// A ZooKeeper server (HOST:PORT) to run the same recipes against, in
    /// the same run.
    #[arg(long, value_name = "HOST:PORT")]
    zookeeper: Option<String>,
    /// The process id of that ZooKeeper server, to read its CPU time from
    /// /proc (without it, its CPU is not reported).
    #[arg(long, value_name = "PID")]
    zookeeper_pid: Option<u32>,
    /// Fsync policy of the Baton server this benchmark starts.
    #[arg(long, value_name = "POLICY", default_value = "always")]
    fsync: String,
    /// Session timeout of each waiter (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::duration::millis)]
    session_timeout_ms: u64,
    /// Time limit of each run, in seconds.
    #[arg(long, value_name = "S", default_value_t = 60)]
    max_seconds: u64,
    /// Skip the run of Baton's own protocol.
    #[arg(long)]
    no_native: bool,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ZkRecipe {
    Predecessor,
    WatchAll,
}

impl ZkRecipe {
    fn name(self) -> &'static str {
        match self {
            ZkRecipe::Predecessor => "predecessor",
            ZkRecipe::WatchAll => "watch-all",
        }
    }
}

/// One run's results.
#[derive(Clone, Debug, Serialize)]
pub struct ZkRun {
    /// `baton-native` (Baton's protocol and lock), `baton-zookeeper`
    /// (Baton's ZooKeeper listener) or `zookeeper`.
    pub server: &'static str,
    pub recipe: &'static str,
    pub waiters: usize,
    pub handovers: u64,
    pub seconds: f64,
    pub handovers_per_s: f64,
    pub wait_us_p50: f64,
    /// Server CPU (user + system) per handover, in µs; absent if unknown.
    pub server_cpu_us_per_handover: Option<f64>,
    /// Grants out of queue order, and holders that overlapped: both 0 for
    /// a sound lock.
    pub out_of_order: u64,
    pub violations: u64,
    pub failed: Option<String>,
}

pub async fn run(args: ZkBenchArgs) -> Result<(), CliError> {
    let zk_port = free_port()?;
    let zk_listen = format!("127.0.0.1:{zk_port}");
    progress(format!(
        "starting a server (baton serve --fsync {} --zk-listen {zk_listen})",
        args.fsync
    ));
    let baton = ChildServer::start(&[
        "--fsync",
        &args.fsync,
        "--max-session-timeout",
        "120000",
        "--zk-listen",
        &zk_listen,
    ])
    .await?;
    let mut targets: Vec<(&'static str, String, Option<u32>)> =
        vec![("baton-zookeeper", zk_listen.clone(), baton.pid())];
    if let Some(zookeeper) = &args.zookeeper {
        targets.push(("zookeeper", zookeeper.clone(), args.zookeeper_pid));
    }
    let mut runs = Vec::new();
    for &waiters in &args.waiters {
        if !args.no_native {
            let run = native(&baton.addr, waiters, &args).await;
            emit(&run, args.json);
            runs.push(run);
        }
        for &recipe in &args.recipe {
            for (server, addr, pid) in &targets {
                let run = match one_run(server, addr, *pid, recipe, waiters, &args).await {
                    Ok(run) => run,
                    Err(e) => {
                        progress(format!(
                            "{waiters} waiters, {recipe:?} on {server}: run failed: {e}"
                        ));
                        ZkRun::failed(server, recipe.name(), waiters, e.to_string())
                    }
                };
                emit(&run, args.json);
                runs.push(run);
            }
        }
    }
    if !args.json {
        print_table(&runs);
    }
    drop(baton);
    Ok(())
}

impl ZkRun {
    fn failed(server: &'static str, recipe: &'static str, waiters: usize, why: String) -> ZkRun {
        ZkRun {
            server,
            recipe,
            waiters,
            handovers: 0,
            seconds: 0.0,
            handovers_per_s: 0.0,
            wait_us_p50: 0.0,
            server_cpu_us_per_handover: None,
            out_of_order: 0,
            violations: 0,
            failed: Some(why),
        }
    }
}

fn emit(run: &ZkRun, json: bool) {
    if json {
        println!("{}", serde_json::to_string(run).expect("a run serializes"));
    }
}

/// A loopback port free now.
fn free_port() -> Result<u16, CliError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| CliError::msg(format!("cannot find a free port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?
        .port())
}

/// Baton's own protocol and lock recipe, through `bench herd`'s run.
async fn native(addr: &str, waiters: usize, args: &ZkBenchArgs) -> ZkRun {
    match super::herd::predecessor_run(addr, waiters, args.handovers, args.max_seconds).await {
        Ok(r) => ZkRun {
            server: "baton-native",
            recipe: "predecessor",
            waiters,
            handovers: r.handovers,
            seconds: r.seconds,
            handovers_per_s: r.handovers_per_s,
            wait_us_p50: r.wait_us_p50,
            server_cpu_us_per_handover: Some(r.server_cpu_us_per_handover),
            out_of_order: ((1.0 - r.fifo_fraction) * r.handovers as f64).round() as u64,
            violations: r.violations,
            failed: r.failed,
        },
        Err(e) => ZkRun::failed("baton-native", "predecessor", waiters, e.to_string()),
    }
}

/// CPU time (user + system) of process `pid`, in µs.
fn cpu_us(pid: u32) -> Option<u64> {
    crate::sys::cpu_time(pid).map(|t| t.as_micros() as u64)
}

/// What a run's contenders share.
struct Shared {
    recipe: ZkRecipe,
    path: String,
    /// Contenders that have queued (and set their watch) or held once.
    joined: AtomicUsize,
    grants: AtomicU64,
    target: AtomicU64,
    holders: AtomicUsize,
    violations: AtomicU64,
    out_of_order: AtomicU64,
    last_seq: AtomicU64,
    waits: std::sync::Mutex<Vec<Duration>>,
    done: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    stopping: AtomicBool,
}

async fn one_run(
    server: &'static str,
    addr: &str,
    pid: Option<u32>,
    recipe: ZkRecipe,
    waiters: usize,
    args: &ZkBenchArgs,
) -> Result<ZkRun, CliError> {
    let label = format!("{waiters} waiters, {} on {server}", recipe.name());
    progress(format!("{label}: opening {waiters} sessions"));
    let timeout = Duration::from_millis(args.session_timeout_ms);
    let gate = Arc::new(Semaphore::new(128));
    let opening: Vec<_> = (0..waiters)
        .map(|_| {
            let (gate, addr) = (gate.clone(), addr.to_owned());
            tokio::spawn(async move {
                let _permit = gate.acquire().await.expect("never closed");
                ZkClient::connect(&addr, timeout).await
            })
        })
        .collect();
    let mut clients = Vec::with_capacity(waiters);
    for o in opening {
        clients.push(o.await.map_err(|e| CliError::msg(e.to_string()))??);
    }
    let control = ZkClient::connect(addr, Duration::from_secs(60)).await?;
    control.ensure("/bench-zk").await?;
    let path = format!(
        "/bench-zk/{}-{waiters}-{}-{}",
        recipe.name(),
        std::process::id(),
        server
    );
    control.ensure(&path).await?;
    let shared = Arc::new(Shared {
        recipe,
        path,
        joined: AtomicUsize::new(0),
        grants: AtomicU64::new(0),
        target: AtomicU64::new(u64::MAX),
        holders: AtomicUsize::new(0),
        violations: AtomicU64::new(0),
        out_of_order: AtomicU64::new(0),
        last_seq: AtomicU64::new(0),
        waits: Default::default(),
        done: watch::channel(false).0,
        stop: watch::channel(false).0,
        stopping: AtomicBool::new(false),
    });
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| tokio::spawn(contend(c.clone(), shared.clone())))
        .collect();

    // The steady state: once every waiter has queued.
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    while shared.joined.load(Ordering::Acquire) < waiters && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu_before = pid.and_then(cpu_us);
    let grants_before = shared.grants.load(Ordering::Acquire);
    shared
        .target
        .store(grants_before + args.handovers, Ordering::Release);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.max_seconds);
    let mut done = shared.done.subscribe();
    let mut last_report = Instant::now();
    while !*done.borrow() && Instant::now() < deadline {
        if last_report.elapsed() >= Duration::from_secs(2) {
            progress(format!(
                "{label}: {}/{} handovers",
                shared.grants.load(Ordering::Relaxed) - grants_before,
                args.handovers
            ));
            last_report = Instant::now();
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), done.changed()).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let grants = shared.grants.load(Ordering::Acquire) - grants_before;
    let cpu_after = pid.and_then(cpu_us);
    shared.stopping.store(true, Ordering::Release);
    shared.stop.send_replace(true);
    for t in tasks {
        let _ = t.await;
    }
    let closing: Vec<_> = clients
        .into_iter()
        .map(|c| tokio::spawn(async move { c.close().await }))
        .collect();
    for c in closing {
        let _ = c.await;
    }
    control.close().await;
    let mut waits = std::mem::take(&mut *shared.waits.lock().unwrap_or_else(|e| e.into_inner()));
    let run = ZkRun {
        server,
        recipe: recipe.name(),
        waiters,
        handovers: grants,
        seconds,
        handovers_per_s: grants as f64 / seconds,
        wait_us_p50: Summary::of(&mut waits).p50_us,
        server_cpu_us_per_handover: match (cpu_before, cpu_after) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / grants.max(1) as f64),
            _ => None,
        },
        out_of_order: shared.out_of_order.load(Ordering::Relaxed),
        violations: shared.violations.load(Ordering::Relaxed),
        failed: (grants < args.handovers).then(|| {
            format!(
                "{grants} of {} handovers within {} s",
                args.handovers, args.max_seconds
            )
        }),
    };
    progress(format!(
        "{label}: {} handovers in {:.1} s, {:.0}/s",
        run.handovers, run.seconds, run.handovers_per_s
    ));
    Ok(run)
}

/// The sequence number a sequential node's name ends with.
fn seq(name: &str) -> u64 {
    name.get(name.len().saturating_sub(10)..)
        .and_then(|d| d.parse().ok())
        .unwrap_or(u64::MAX)
}

/// One contender: queue, wait as the recipe says, hold, release, again,
/// until the run stops.
async fn contend(c: Arc<ZkClient>, shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    let mut joined = false;
    while !shared.stopping.load(Ordering::Acquire) {
        let acquired = tokio::select! {
            r = acquire(&c, &shared, &mut joined) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Ok((node, asked)) = acquired else {
            return;
        };
        shared
            .waits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(asked.elapsed());
        if shared.holders.fetch_add(1, Ordering::SeqCst) != 0 {
            shared.violations.fetch_add(1, Ordering::Relaxed);
        }
        let mine = seq(&node);
        if shared.last_seq.fetch_max(mine, Ordering::SeqCst) > mine {
            shared.out_of_order.fetch_add(1, Ordering::Relaxed);
        }
        shared.holders.fetch_sub(1, Ordering::SeqCst);
        let grants = shared.grants.fetch_add(1, Ordering::AcqRel) + 1;
        if c.delete(&node).await.is_err() {
            return;
        }
        if grants >= shared.target.load(Ordering::Acquire) {
            shared.done.send_replace(true);
        }
    }
}

/// Queues and waits until the node heads the queue; the node and when it
/// was asked for.
async fn acquire(
    c: &ZkClient,
    shared: &Shared,
    joined: &mut bool,
) -> Result<(String, Instant), CliError> {
    let asked = Instant::now();
    let node = c
        .create(
            &format!("{}/lock-", shared.path),
            mode::EPHEMERAL_SEQUENTIAL,
        )
        .await?;
    let name = baton_proto::path::name(&node).to_owned();
    let watch_all = shared.recipe == ZkRecipe::WatchAll;
    loop {
        let mut kids = c.children(&shared.path, watch_all).await?;
        kids.sort_unstable_by_key(|k| seq(k));
        let Some(at) = kids.iter().position(|k| *k == name) else {
            return Err(CliError::msg(format!("{node} is gone from the queue")));
        };
        if at == 0 {
            if !std::mem::replace(joined, true) {
                shared.joined.fetch_add(1, Ordering::AcqRel);
            }
            return Ok((node, asked));
        }
        let awaited = match shared.recipe {
            ZkRecipe::Predecessor => {
                let before = format!("{}/{}", shared.path, kids[at - 1]);
                if !c.exists(&before, true).await? {
                    continue; // gone meanwhile: look again
                }
                before
            }
            ZkRecipe::WatchAll => shared.path.clone(),
        };
        if !std::mem::replace(joined, true) {
            shared.joined.fetch_add(1, Ordering::AcqRel);
        }
        loop {
            let e = c
                .event()
                .await
                .ok_or_else(|| CliError::msg("the connection closed"))?;
            let relevant = match shared.recipe {
                ZkRecipe::Predecessor => e.kind == event::NODE_DELETED && e.path == awaited,
                ZkRecipe::WatchAll => e.path == awaited,
            };
            if relevant {
                break;
            }
        }
    }
}

fn print_table(runs: &[ZkRun]) {
    println!(
        "{:>7}  {:<12}  {:<16}  {:>10}  {:>13}  {:>9}  {:>6}",
        "waiters", "recipe", "server", "handover/s", "cpu µs/handov", "wait p50", "sound"
    );
    for r in runs {
        let cpu = r
            .server_cpu_us_per_handover
            .map_or_else(|| "-".to_string(), |c| format!("{c:.1}"));
        let sound = if r.failed.is_some() {
            "FAILED"
        } else if r.violations == 0 && r.out_of_order == 0 {
            "yes"
        } else {
            "NO"
        };
        println!(
            "{:>7}  {:<12}  {:<16}  {:>10.0}  {:>13}  {:>7.0}µs  {:>6}",
            r.waiters, r.recipe, r.server, r.handovers_per_s, cpu, r.wait_us_p50, sound
        );
        if let Some(why) = &r.failed {
            println!("         {why}");
        }
    }
}
