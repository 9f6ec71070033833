//! `baton bench herd`: what the thundering herd costs, and what waiting for
//! one's predecessor alone saves.
//!
//! For each number of waiters and each recipe, that many clients (each with
//! its own session) contend for one lock: acquire, hold, release, queue
//! again, until enough handovers happened or the run's time is up. The
//! server's own counters (read with the stats request) give the watch
//! notifications, bytes and CPU time per handover.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::{recipes, Client, CreateMode, Error, Lock};
use baton_server::persist::FsyncPolicy;
use tokio::sync::watch;

use super::durability::fdatasync_floor;
use super::herd_run::{Recipe, Run, Split};
use super::ops::tcp_floor;
use super::server::ChildServer;
use super::{progress, Summary};
use crate::CliError;

/// Measure the thundering herd: handovers per second, waits, and the
/// server's notifications, bytes and CPU time per handover, for several
/// numbers of waiters and several lock recipes.
///
/// By default it starts its own server (`baton serve` as a child process on
/// a free loopback port, with --fsync); --server (or BATON_SERVER) names
/// another. Every run is bounded by --handovers and --max-seconds. The floor
/// of the machine (loopback round trip, 4 KiB append + fdatasync) is
/// measured in the same run.
#[derive(clap::Args)]
pub struct HerdArgs {
    /// Numbers of waiters, as a comma-separated list.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    waiters: Vec<usize>,
    /// Handovers per run.
    #[arg(long, default_value_t = 1_000)]
    handovers: u64,
    /// How long each holder holds the lock, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 0)]
    hold_us: u64,
    /// Recipes to compare, as a comma-separated list.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "predecessor,watch-all,poll"
    )]
    recipe: Vec<Recipe>,
    /// Permits of the semaphore recipe.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    permits: u32,
    /// How often the poll recipe retries (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "10ms", value_parser = crate::duration::millis)]
    poll_ms: u64,
    /// Time limit of each run, in seconds.
    #[arg(long, value_name = "S", default_value_t = 30)]
    max_seconds: u64,
    /// Session timeout each waiter asks for (a duration; a bare number is
    /// milliseconds). A client pings after a third of it goes quiet, so a
    /// shorter timeout adds pings (10,000 waiters at 30 s make 1,000 pings a
    /// second).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::duration::millis)]
    session_timeout_ms: u64,
    /// Fsync policy of the server this benchmark starts.
    #[arg(long, value_name = "POLICY", default_value = "always")]
    fsync: FsyncPolicy,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the results (results.json) and a chart (herd.svg) here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

pub async fn run(target: Option<String>, args: HerdArgs) -> Result<(), CliError> {
    let fsync_name = match args.fsync {
        FsyncPolicy::Always => "always",
        FsyncPolicy::Never => "never",
    };
    let child = match &target {
        Some(_) => None,
        None => {
            progress(format!(
                "starting a server (baton serve --fsync {fsync_name})"
            ));
            Some(
                ChildServer::start(&["--fsync", fsync_name, "--max-session-timeout", "120000"])
                    .await?,
            )
        }
    };
    let addr = target
        .clone()
        .unwrap_or_else(|| child.as_ref().expect("started").addr.clone());

    progress("floor: loopback round trip and 4 KiB append + fdatasync");
    let rtt = tokio::task::spawn_blocking(|| tcp_floor(10_000))
        .await
        .map_err(|e| CliError::msg(e.to_string()))??;
    let probe = std::env::temp_dir().join(format!("baton-herd-fdatasync-{}", std::process::id()));
    let fdatasync =
        tokio::task::spawn_blocking(move || fdatasync_floor(&probe, Duration::from_secs(2)))
            .await
            .map_err(|e| CliError::msg(e.to_string()))??;

    let mut runs = Vec::new();
    for &waiters in &args.waiters {
        for &recipe in &args.recipe {
            let mut run = match one_run(&addr, recipe, waiters, &args).await {
                Ok(run) => run,
                Err(e) => {
                    // A herd can swamp the server past any timeout: report
                    // the run as failed and go on with the others.
                    progress(format!(
                        "{waiters} waiters, {}: run failed: {e}",
                        recipe.name()
                    ));
                    Run::failed(recipe, waiters, e.to_string())
                }
            };
            run.floor_rtt_us = rtt.p50_us;
            run.floor_fdatasync_us = fdatasync.p50_us;
            if args.json {
                println!("{}", serde_json::to_string(&run).expect("run serializes"));
            }
            runs.push(run);
        }
    }
    if !args.json {
        print_table(&runs, &rtt, &fdatasync);
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::msg(format!("cannot create {}: {e}", dir.display())))?;
        let json = serde_json::to_string_pretty(&runs).expect("runs serialize");
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).map_err(|e| {
                CliError::msg(format!("cannot write {}: {e}", dir.join(name).display()))
            })
        };
        write("results.json", &json)?;
        write("herd.svg", &super::chart::herd_svg(&runs))?;
        progress(format!(
            "wrote {} and {}",
            dir.join("results.json").display(),
            dir.join("herd.svg").display()
        ));
    }
    drop(child);
    Ok(())
}

/// One run of Baton's own lock (the predecessor recipe) at `addr`, for
/// `bench zookeeper`'s comparison.
pub(super) async fn predecessor_run(
    addr: &str,
    waiters: usize,
    handovers: u64,
    max_seconds: u64,
) -> Result<Run, CliError> {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        args: HerdArgs,
    }
    let Wrap { args } = Wrap::try_parse_from([
        "herd".to_string(),
        format!("--handovers={handovers}"),
        format!("--max-seconds={max_seconds}"),
        "--session-timeout-ms=30s".to_string(),
    ])
    .map_err(|e| CliError::msg(e.to_string()))?;
    one_run(addr, Recipe::Predecessor, waiters, &args).await
}

impl Run {
    fn failed(recipe: Recipe, waiters: usize, why: String) -> Run {
        Run {
            recipe,
            waiters,
            handovers: 0,
            seconds: 0.0,
            handovers_per_s: 0.0,
            wait_us_p50: 0.0,
            wait_us_p99: 0.0,
            wait_us_max: 0.0,
            notifications_per_handover: 0.0,
            server_bytes_per_handover: 0.0,
            server_cpu_us_per_handover: 0.0,
            server_cpu_us_per_join: 0.0,
            join_seconds: 0.0,
            open_seconds: 0.0,
            server_cpu_us_per_open: 0.0,
            split: Split::default(),
            fifo_fraction: 0.0,
            violations: 0,
            timed_out: true,
            failed: Some(why),
            floor_rtt_us: 0.0,
            floor_fdatasync_us: 0.0,
        }
    }
}

/// The server's counters, waiting at most a minute: a herd can keep the
/// server busy for long.
async fn counters(control: &Client) -> Result<std::collections::BTreeMap<String, u64>, CliError> {
    match tokio::time::timeout(Duration::from_secs(60), control.server_stats()).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(CliError::msg(
            "the server did not answer a stats request within 60 s",
        )),
    }
}

/// Shared by a run's contenders.
struct Shared {
    recipe: Recipe,
    path: String,
    hold: Duration,
    poll: Duration,
    /// Grant count that ends the run; set once the queue has formed.
    target: AtomicU64,
    grants: AtomicU64,
    holders: AtomicUsize,
    /// Holders that hold alone (writers of the rwlock recipe).
    writers: AtomicUsize,
    /// Holders allowed at once: the semaphore's permits, else 1.
    permits: usize,
    violations: AtomicU64,
    fifo: AtomicU64,
    /// Token of the latest grant (predecessor recipe): a queue serves in
    /// arrival order exactly when grant tokens keep increasing.
    last_token: AtomicU64,
    /// Waiting attempts by arrival (their queue position), for FIFO.
    waiting: Mutex<BTreeSet<(u64, usize)>>,
    waits: Mutex<Vec<Duration>>,
    /// Set by the contender whose grant reaches the target. Contenders go on
    /// until the counters are read, so that withdrawing them is not counted.
    done: watch::Sender<bool>,
    /// Set after the counters are read: contenders stop and withdraw.
    stop: watch::Sender<bool>,
    stopping: AtomicBool,
    started: Instant,
}

async fn one_run(
    addr: &str,
    recipe: Recipe,
    waiters: usize,
    args: &HerdArgs,
) -> Result<Run, CliError> {
    let label = format!("{} waiters, {}", waiters, recipe.name());
    let control = Client::builder(addr)
        .session_timeout(Duration::from_secs(120))
        .connect()
        .await?;
    progress(format!("{label}: opening {waiters} sessions"));
    let opening = counters(&control).await?;
    let open_started = Instant::now();
    let clients = open_sessions(
        addr,
        waiters,
        Duration::from_millis(args.session_timeout_ms),
    )
    .await?;
    let open_seconds = open_started.elapsed().as_secs_f64();
    let path = format!("/herd/{}-{waiters}-{}", recipe.name(), std::process::id());
    ensure_path(&control, &path).await?;

    let (stop, _) = watch::channel(false);
    let (done, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        recipe,
        path,
        hold: Duration::from_micros(args.hold_us),
        poll: Duration::from_millis(args.poll_ms),
        target: AtomicU64::new(u64::MAX),
        grants: AtomicU64::new(0),
        holders: AtomicUsize::new(0),
        writers: AtomicUsize::new(0),
        permits: match recipe {
            Recipe::Semaphore => args.permits as usize,
            _ => 1,
        },
        violations: AtomicU64::new(0),
        fifo: AtomicU64::new(0),
        last_token: AtomicU64::new(0),
        waiting: Mutex::new(BTreeSet::new()),
        waits: Mutex::new(Vec::new()),
        done,
        stop,
        stopping: AtomicBool::new(false),
        started: Instant::now(),
    });
    let joining = counters(&control).await?;
    let join_started = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| tokio::spawn(contend(c.clone(), i, shared.clone())))
        .collect();

    let measured = measure(
        &control,
        &shared,
        recipe,
        waiters,
        args,
        &label,
        join_started,
    )
    .await;
    // Whatever happened, stop the contenders and close their sessions, so
    // that the next run starts on a quiet server.
    shared.stopping.store(true, Ordering::Release);
    shared.stop.send_replace(true);
    for t in tasks {
        let _ = t.await;
    }
    close_all(clients).await;
    let _ = control.close().await;
    let Measured {
        before,
        after,
        grants,
        seconds,
        join_seconds,
    } = measured?;

    let handovers = grants.max(1);
    let delta = |name: &str| {
        after
            .get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get(name).copied().unwrap_or(0)) as f64
    };
    let cpu = delta("cpu_user_us") + delta("cpu_system_us");
    let cpu_of = |m: &std::collections::BTreeMap<String, u64>| {
        m.get("cpu_user_us").copied().unwrap_or(0) + m.get("cpu_system_us").copied().unwrap_or(0)
    };
    let join_cpu = cpu_of(&before).saturating_sub(cpu_of(&joining)) as f64;
    let open_cpu = cpu_of(&joining).saturating_sub(cpu_of(&opening)) as f64;
    let mut waits = std::mem::take(&mut *shared.waits.lock().unwrap_or_else(|e| e.into_inner()));
    let wait = Summary::of(&mut waits);
    let run = Run {
        recipe,
        waiters,
        handovers: grants,
        seconds,
        handovers_per_s: grants as f64 / seconds,
        wait_us_p50: wait.p50_us,
        wait_us_p99: wait.p99_us,
        wait_us_max: wait.max_us,
        notifications_per_handover: delta("watch_events") / handovers as f64,
        server_bytes_per_handover: delta("bytes_out") / handovers as f64,
        server_cpu_us_per_handover: cpu / handovers as f64,
        server_cpu_us_per_join: join_cpu / waiters.max(1) as f64,
        join_seconds,
        open_seconds,
        server_cpu_us_per_open: open_cpu / waiters.max(1) as f64,
        split: {
            let batches = delta("log_batches").max(1.0);
            Split {
                handle_us_per_handover: delta("handle_ns") / 1e3 / handovers as f64,
                log_batches_per_handover: delta("log_batches") / handovers as f64,
                log_wait_us_per_batch: delta("log_wait_ns") / 1e3 / batches,
                log_woken_fraction: delta("log_batches_woken") / batches,
                log_wake_us: delta("log_wake_ns") / 1e3 / delta("log_batches_woken").max(1.0),
                log_write_us_per_batch: delta("log_write_ns") / 1e3 / batches,
                log_sync_us_per_batch: delta("log_sync_ns") / 1e3 / batches,
                durable_send_us: delta("durable_send_ns") / 1e3 / delta("durable_sends").max(1.0),
            }
        },
        // Over every grant of the run, the warm-up's included.
        fifo_fraction: shared.fifo.load(Ordering::Relaxed) as f64
            / shared.grants.load(Ordering::Relaxed).max(1) as f64,
        violations: shared.violations.load(Ordering::Relaxed),
        timed_out: grants < args.handovers,
        failed: None,
        floor_rtt_us: 0.0,
        floor_fdatasync_us: 0.0,
    };
    progress(format!(
        "{label}: {} handovers in {:.1} s, {:.0}/s, {:.2} notifications per handover",
        run.handovers, run.seconds, run.handovers_per_s, run.notifications_per_handover
    ));
    Ok(run)
}

/// Creates `path` and its ancestors as persistent nodes if missing.
async fn ensure_path(client: &Client, path: &str) -> Result<(), CliError> {
    let mut prefix = String::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        prefix.push('/');
        prefix.push_str(segment);
        match client.create(&prefix, "", CreateMode::Persistent).await {
            Ok(_) | Err(Error::NodeExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The counters around the steady state of a run, and its grants.
struct Measured {
    before: std::collections::BTreeMap<String, u64>,
    after: std::collections::BTreeMap<String, u64>,
    grants: u64,
    seconds: f64,
    /// From `join_started` until the queue had formed.
    join_seconds: f64,
}

async fn measure(
    control: &Client,
    shared: &Shared,
    recipe: Recipe,
    waiters: usize,
    args: &HerdArgs,
    label: &str,
    join_started: Instant,
) -> Result<Measured, CliError> {
    // Warm up: measure the steady state, once every contender has joined the
    // queue (each waiter then holds one watch), not the joining itself.
    let warm_until = Instant::now() + Duration::from_secs(args.max_seconds);
    if recipe != Recipe::Poll {
        loop {
            let watches = counters(control)
                .await?
                .get("watches")
                .copied()
                .unwrap_or(0);
            if watches + 1 >= waiters as u64 || Instant::now() >= warm_until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let before = counters(control).await?;
    let join_seconds = join_started.elapsed().as_secs_f64();
    let grants_before = shared.grants.load(Ordering::Acquire);
    shared
        .target
        .store(grants_before + args.handovers, Ordering::Release);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.max_seconds);
    let mut last_report = Instant::now();
    let mut done_rx = shared.done.subscribe();
    loop {
        if *done_rx.borrow() || Instant::now() >= deadline {
            break;
        }
        if last_report.elapsed() >= Duration::from_secs(2) {
            progress(format!(
                "{label}: {}/{} handovers, {:.1} s",
                shared.grants.load(Ordering::Relaxed) - grants_before,
                args.handovers,
                started.elapsed().as_secs_f64()
            ));
            last_report = Instant::now();
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), done_rx.changed()).await;
    }
    // Counters first, so that withdrawing the waiters is not counted; the
    // grants are counted at the same moment.
    let after = counters(control).await?;
    Ok(Measured {
        before,
        after,
        grants: shared.grants.load(Ordering::Acquire) - grants_before,
        seconds: started.elapsed().as_secs_f64(),
        join_seconds,
    })
}

/// Opens `n` sessions, a few hundred handshakes at a time.
async fn open_sessions(addr: &str, n: usize, timeout: Duration) -> Result<Vec<Client>, CliError> {
    let opened = super::each_bounded(0..n, |_| {
        let addr = addr.to_owned();
        async move {
            Client::builder(&addr)
                .session_timeout(timeout)
                .connect()
                .await
        }
    })
    .await?;
    Ok(opened.into_iter().collect::<Result<_, _>>()?)
}

async fn close_all(clients: Vec<Client>) {
    let _ = super::each_bounded(clients, |c| async move { c.close().await }).await;
}

/// One contender: acquire, hold, release, again, until the run stops.
async fn contend(client: Client, me: usize, shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    while !shared.stopping.load(Ordering::Acquire) {
        let asked = Instant::now();
        let granted = tokio::select! {
            r = acquire(&client, me, &shared) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Ok(held) = granted else {
            return;
        };
        shared
            .waits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(asked.elapsed());
        let writes = writes(&shared, me);
        if !enter(&shared, writes) {
            shared.violations.fetch_add(1, Ordering::Relaxed);
        }
        if !shared.hold.is_zero() {
            tokio::time::sleep(shared.hold).await;
        }
        if writes {
            shared.writers.fetch_sub(1, Ordering::SeqCst);
        }
        shared.holders.fetch_sub(1, Ordering::SeqCst);
        let grants = shared.grants.fetch_add(1, Ordering::AcqRel) + 1;
        let _ = held.release(&client).await;
        if grants >= shared.target.load(Ordering::Acquire) {
            shared.done.send_replace(true);
        }
    }
}

/// Whether contender `me` holds alone: every contender but a reader of the
/// rwlock recipe, where one contender in four writes.
fn writes(shared: &Shared, me: usize) -> bool {
    shared.recipe != Recipe::Rwlock || me.is_multiple_of(4)
}

/// Counts a new holder in; false if that breaks the recipe's promise
/// (a writer with anyone else, a reader with a writer, more holders than
/// permits).
fn enter(shared: &Shared, writes: bool) -> bool {
    let holders = shared.holders.fetch_add(1, Ordering::SeqCst) + 1;
    match shared.recipe {
        Recipe::Semaphore => holders <= shared.permits,
        Recipe::Rwlock if !writes => shared.writers.load(Ordering::SeqCst) == 0,
        _ => {
            let writers = shared.writers.fetch_add(1, Ordering::SeqCst) + 1;
            holders == 1 && writers == 1
        }
    }
}

/// A held lock of any recipe.
enum Held {
    Guard(baton_client::LockGuard),
    Node(String),
}

impl Held {
    async fn release(self, client: &Client) -> Result<(), Error> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Node(node) => client.delete(&node, None).await,
        }
    }
}

/// Records this attempt's arrival, and at its grant whether it was the
/// longest-waiting attempt.
struct Arrival<'a> {
    shared: &'a Shared,
    key: Option<(u64, usize)>,
}

impl<'a> Arrival<'a> {
    fn new(shared: &'a Shared, order: u64, me: usize) -> Self {
        let key = (order, me);
        shared
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key);
        Arrival {
            shared,
            key: Some(key),
        }
    }

    fn granted(mut self) {
        let key = self.key.take().expect("granted once");
        let mut waiting = self
            .shared
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if waiting.first() == Some(&key) {
            self.shared.fifo.fetch_add(1, Ordering::Relaxed);
        }
        waiting.remove(&key);
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.shared
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
        }
    }
}

async fn acquire(client: &Client, me: usize, shared: &Shared) -> Result<Held, Error> {
    match shared.recipe {
        Recipe::Predecessor | Recipe::Rwlock | Recipe::Semaphore => {
            let guard = match shared.recipe {
                Recipe::Predecessor => Lock::new(client, &shared.path).acquire().await?,
                Recipe::Semaphore => {
                    let permits = shared.permits as u32;
                    recipes::Semaphore::new(client, &shared.path, permits)
                        .acquire()
                        .await?
                }
                _ if writes(shared, me) => {
                    recipes::RwLock::new(client, &shared.path).write().await?
                }
                _ => recipes::RwLock::new(client, &shared.path).read().await?,
            };
            // Arrival order is queue order (the token); grants are in
            // arrival order while each grant's token exceeds the last one
            // (readers granted together count in whatever order they run).
            let token = guard.token().get();
            if shared.last_token.fetch_max(token, Ordering::AcqRel) < token {
                shared.fifo.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Held::Guard(guard))
        }
        Recipe::WatchAll => {
            let created = client
                .create(
                    &format!("{}/n-", shared.path),
                    "",
                    CreateMode::EphemeralSequential,
                )
                .await?;
            let token = created.sequence.unwrap_or(created.stat.czxid);
            let arrival = Arrival::new(shared, token, me);
            let name = baton_proto::path::name(&created.path).to_owned();
            loop {
                let (children, _, watcher) = client.get_children_watch(&shared.path).await?;
                // Sequence suffixes of one prefix sort as their numbers.
                if children.iter().min() == Some(&name) {
                    arrival.granted();
                    return Ok(Held::Node(created.path));
                }
                watcher.await?;
            }
        }
        Recipe::Poll => {
            let node = format!("{}/held", shared.path);
            let order = shared.started.elapsed().as_nanos() as u64;
            let arrival = Arrival::new(shared, order, me);
            loop {
                match client.create(&node, "", CreateMode::Ephemeral).await {
                    Ok(_) => {
                        arrival.granted();
                        return Ok(Held::Node(node));
                    }
                    Err(Error::NodeExists(_)) => tokio::time::sleep(shared.poll).await,
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

fn print_table(runs: &[Run], rtt: &Summary, fdatasync: &Summary) {
    println!(
        "floor: loopback round trip p50 {:.1} us; 4 KiB append + fdatasync p50 {:.1} us",
        rtt.p50_us, fdatasync.p50_us
    );
    println!(
        "{:>8} {:<12} {:>10} {:>12} {:>12} {:>12} {:>10} {:>12} {:>12} {:>12} {:>6} {:>5}",
        "waiters",
        "recipe",
        "handovers",
        "handovers/s",
        "wait p50 us",
        "wait p99 us",
        "notif/h",
        "bytes/h",
        "cpu us/h",
        "cpu us/join",
        "fifo",
        "viol"
    );
    for r in runs {
        println!(
            "{:>8} {:<12} {:>10} {:>12.0} {:>12.0} {:>12.0} {:>10.2} {:>12.0} {:>12.1} {:>12.1} {:>5.0}% {:>5}{}",
            r.waiters,
            r.recipe.name(),
            r.handovers,
            r.handovers_per_s,
            r.wait_us_p50,
            r.wait_us_p99,
            r.notifications_per_handover,
            r.server_bytes_per_handover,
            r.server_cpu_us_per_handover,
            r.server_cpu_us_per_join,
            r.fifo_fraction * 100.0,
            r.violations,
            match (&r.failed, r.timed_out) {
                (Some(_), _) => "  (failed)",
                (None, true) => "  (time limit)",
                (None, false) => "",
            }
        );
    }
    println!("forming the queue, apart from the handovers above: opening the sessions, then every waiter joining; and the handovers against the floor (handovers/s x round trip)");
    println!(
        "{:>8} {:<12} {:>8} {:>12} {:>8} {:>12} {:>9}",
        "waiters", "recipe", "open s", "cpu us/open", "join s", "cpu us/join", "of 1/rtt"
    );
    for r in runs.iter().filter(|r| r.failed.is_none()) {
        println!(
            "{:>8} {:<12} {:>8.2} {:>12.1} {:>8.2} {:>12.1} {:>9.2}",
            r.waiters,
            r.recipe.name(),
            r.open_seconds,
            r.server_cpu_us_per_open,
            r.join_seconds,
            r.server_cpu_us_per_join,
            r.handovers_per_s * rtt.p50_us / 1e6
        );
    }
    if runs.iter().any(|r| r.split.log_batches_per_handover > 0.0) {
        println!("on the server, per handover: handling, log batches; per batch: waiting for the log writer (share that found it idle, its wake-up), write, sync; then durable to sent");
        println!(
            "{:>8} {:<12} {:>10} {:>8} {:>8} {:>7} {:>8} {:>9} {:>8} {:>11}",
            "waiters",
            "recipe",
            "handle us",
            "batches",
            "wait us",
            "idle",
            "wake us",
            "write us",
            "sync us",
            "to send us"
        );
        for r in runs.iter().filter(|r| r.failed.is_none()) {
            let s = &r.split;
            println!(
                "{:>8} {:<12} {:>10.1} {:>8.2} {:>8.1} {:>6.0}% {:>8.1} {:>9.1} {:>8.1} {:>11.1}",
                r.waiters,
                r.recipe.name(),
                s.handle_us_per_handover,
                s.log_batches_per_handover,
                s.log_wait_us_per_batch,
                s.log_woken_fraction * 100.0,
                s.log_wake_us,
                s.log_write_us_per_batch,
                s.log_sync_us_per_batch,
                s.durable_send_us
            );
        }
    }
}
