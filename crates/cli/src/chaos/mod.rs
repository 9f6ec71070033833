//! `baton chaos`: Baton's promises, tried under faults and checked from
//! the recorded history alone.

mod nemesis;
mod net;
mod record;
mod supervised;
mod timeline;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use baton_chaos::{Finding, Verdict};
use tokio::time::Instant;

use crate::local::LocalCluster;
use crate::{CliError, CliResult};
use nemesis::{Nemesis, Target};
use record::{Recorder, Rng};
use workloads::{Ctx, Workload};

/// Try Baton's promises under faults, and check them from the history.
///
/// Starts its own single server (or, with --members 3 or 5, a local
/// cluster; or, with --server, uses servers already running, injecting
/// only faults of its own clients), runs workloads against it while faults
/// are injected, heals everything, and checks the history of every
/// operation: registers
/// linearizable (or, read by sequential sessions, never going back),
/// fenced writes never going back, tokens distinct and
/// growing, no acknowledged increment or queue item lost or doubled,
/// ephemeral nodes gone only after their session ended. Prints a summary,
/// writes the history (JSON lines) and a timeline (HTML) to --dir, and
/// exits with status 1 if any promise was broken (3 if the run could not be
/// made). The same --seed makes the same choices of faults and operations
/// (the timing of a real run still differs).
#[derive(clap::Args)]
pub struct ChaosArgs {
    /// 1 for a single server, 3 or 5 for a cluster.
    #[arg(long, default_value_t = 1, value_parser = members)]
    members: u64,

    /// How long the workloads and the faults run (a duration; a bare number
    /// is seconds here).
    #[arg(long, value_name = "DURATION", default_value = "30", value_parser = seconds)]
    seconds: u64,

    /// The workloads, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    workloads: Vec<Workload>,

    /// The faults, comma-separated [default: all; two schedules of them run
    /// at once, so they overlap].
    #[arg(long, value_delimiter = ',', value_enum)]
    nemesis: Vec<Nemesis>,

    /// Run without any fault (a baseline).
    #[arg(long, conflicts_with = "nemesis")]
    no_faults: bool,

    /// The seed of the run's choices [default: from the clock; printed].
    #[arg(long)]
    seed: Option<u64>,

    /// Where the servers' data and logs, the history and the timeline go
    /// [default: a new directory under the system's temporary one].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,

    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,

    /// Whether followers serve clients (`baton serve --followers-serve`):
    /// the workloads' clients spread over every member; `false` sends them
    /// all to the leader (a cluster only).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    followers_serve: bool,

    /// Observers to add to the cluster once a member leads: members that
    /// serve clients (the workloads' clients spread over them too) but
    /// never vote. The faults act on them as on any member (a stale copy
    /// too), but those that are about the majority (two at once, lag or
    /// slow then crash) pick voters only; one removed is added back as an
    /// observer (a cluster only).
    #[arg(long, value_name = "N", default_value_t = 0)]
    observers: u64,

    /// The members' election timeout (a cluster only).
    #[arg(long, value_name = "DURATION", default_value = "150ms", value_parser = crate::duration::millis)]
    election_timeout: u64,

    /// The `baton` binary the servers run [default: this one]: to try
    /// another build (an older one, say) with this run's workloads and
    /// checkers.
    #[arg(long, value_name = "PATH")]
    server_binary: Option<PathBuf>,

    /// Check the history an earlier run wrote (its history.jsonl) instead
    /// of running: the same checkers, summary and exit status; the
    /// timeline is written again beside the history.
    #[arg(long, value_name = "HISTORY", conflicts_with_all = ["members", "observers", "seconds", "workloads", "nemesis", "no_faults", "seed", "dir", "election_timeout", "server_binary", "followers_serve"])]
    check: Option<PathBuf>,
}

/// What a summary says of the run it is about.
struct RunInfo {
    seed: u64,
    members: u64,
    /// Of them, the observers.
    observers: u64,
    seconds: u64,
    json: bool,
}

impl RunInfo {
    /// The line a run's history begins with.
    fn begins(&self) -> String {
        format!(
            "run begins: seed {}, {}, {} s",
            self.seed,
            self.members_said(),
            self.seconds
        )
    }

    /// `3 member(s)`, or `5 member(s) (2 observers)` (of the five).
    fn members_said(&self) -> String {
        match self.observers {
            0 => format!("{} member(s)", self.members),
            1 => format!("{} member(s) (1 observer)", self.members),
            n => format!("{} member(s) ({n} observers)", self.members),
        }
    }

    /// Read back from a history's first line ([`RunInfo::begins`]).
    fn of(history: &baton_chaos::History, json: bool) -> Option<RunInfo> {
        let line = history
            .faults
            .iter()
            .find_map(|f| f.what.strip_prefix("run begins: seed "))?;
        let mut words = line.split([',', ' ']).filter(|w| !w.is_empty());
        let seed = words.next()?.parse().ok()?;
        let members = words.next()?.parse().ok()?;
        let _ = words.next()?; // member(s)
        let mut observers = 0;
        let mut next = words.next()?;
        if let Some(n) = next.strip_prefix('(') {
            observers = n.parse().ok()?;
            let _ = words.next()?; // observer(s))
            next = words.next()?;
        }
        let seconds = next.parse().ok()?;
        Some(RunInfo {
            seed,
            members,
            observers,
            seconds,
            json,
        })
    }
}

/// `--check`: the checkers over a history already written.
fn check_again(path: &std::path::Path, json: bool) -> CliResult {
    let file = std::fs::File::open(path)
        .map_err(|e| CliError::msg(format!("cannot open {}: {e}", path.display())))?;
    let history = baton_chaos::History::read(std::io::BufReader::new(file))
        .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
    let info = RunInfo::of(&history, json).ok_or_else(|| {
        CliError::msg(format!(
            "{}: no \"run begins\" line: not a history baton chaos wrote",
            path.display()
        ))
    })?;
    let findings = baton_chaos::check(&history);
    let timeline_path = path.with_file_name("timeline.html");
    let title = format!(
        "baton chaos, seed {}, {}, {} s",
        info.seed,
        info.members_said(),
        info.seconds
    );
    std::fs::write(&timeline_path, timeline::html(&history, &findings, &title))
        .map_err(|e| CliError::msg(format!("cannot write {}: {e}", timeline_path.display())))?;
    report(&info, &history, &findings, path, &timeline_path);
    Ok(if baton_chaos::violated(&findings) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `--members`: 1, 3 or 5.
fn members(text: &str) -> Result<u64, String> {
    match text.trim() {
        "1" => Ok(1),
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err(format!("{text:?}: 1 (a single server), 3 or 5 members")),
    }
}

/// `--seconds`: a bare number is seconds; a duration with a unit is taken
/// as it is.
fn seconds(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(s) => Ok(s),
        Err(_) => crate::duration::millis(text).map(|ms| ms.div_ceil(1000)),
    }
}

/// Workers per workload.
const WORKERS: u64 = 4;

/// A member's snapshot interval in a run, in log entries (a few seconds of
/// the workloads).
const SNAPSHOT_ENTRIES: u64 = 2_000;

/// A single server's snapshot interval in a run, in bytes of log.
const SNAPSHOT_BYTES: u64 = 1 << 20;

pub async fn run(server: Option<String>, args: ChaosArgs) -> CliResult {
    match run_all(server, args).await {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("baton: {e}");
            Ok(ExitCode::from(3))
        }
    }
}

async fn run_all(server: Option<String>, args: ChaosArgs) -> CliResult {
    if let Some(path) = &args.check {
        return check_again(path, args.json);
    }
    if let Some(servers) = &server {
        if args.members != 1 || args.observers > 0 || args.server_binary.is_some() {
            return Err(CliError::msg(
                "--members, --observers and --server-binary are for the servers baton chaos starts; with --server (or BATON_SERVER) it uses those named",
            ));
        }
        let theirs: Vec<String> = args
            .nemesis
            .iter()
            .filter(|k| k.acts_on_members())
            .map(|k| {
                clap::ValueEnum::to_possible_value(k)
                    .map_or_else(|| format!("{k:?}"), |v| v.get_name().to_owned())
            })
            .collect();
        if !theirs.is_empty() {
            return Err(CliError::msg(format!(
                "with --server {servers} (servers this run did not start) only client-pause and client-clock can be injected; {} need(s) the servers' own processes: leave --server out to let baton chaos start its own",
                theirs.join(", ")
            )));
        }
    }
    if args.observers > 0 && args.members == 1 {
        return Err(CliError::msg(
            "--observers needs a cluster to add them to: give --members 3 or 5 too",
        ));
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("baton-chaos-{}-{seed}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::msg(format!("cannot create {}: {e}", dir.display())))?;
    let workloads = if args.workloads.is_empty() {
        vec![
            Workload::Register,
            Workload::Sequential,
            Workload::Fenced,
            Workload::Counter,
            Workload::Queue,
            Workload::Election,
            Workload::Ephemeral,
            Workload::Supervised,
        ]
    } else {
        args.workloads.clone()
    };
    let mut kinds = if args.no_faults {
        Vec::new()
    } else if args.nemesis.is_empty() && server.is_some() {
        vec![Nemesis::ClientPause, Nemesis::ClientClock]
    } else if args.nemesis.is_empty() {
        vec![
            Nemesis::Pause,
            Nemesis::Kill,
            Nemesis::PauseTwo,
            Nemesis::KillTwo,
            Nemesis::Stutter,
            Nemesis::LagThenCrash,
            Nemesis::ClientPause,
            Nemesis::Partition,
            Nemesis::OneWay,
            Nemesis::Slow,
            Nemesis::SlowThenCrash,
            Nemesis::CutClients,
            Nemesis::SlowDisk,
            Nemesis::FullDisk,
            Nemesis::NoNewFiles,
            Nemesis::ClientClock,
            Nemesis::Membership,
        ]
    } else {
        args.nemesis.clone()
    };
    // The clients' clocks jump through libfaketime: asked for by name, it
    // must be there; among the defaults, it is left out with a warning.
    let clock = if kinds.contains(&Nemesis::ClientClock) {
        match supervised::ClientClock::find(&dir) {
            Ok(clock) => Some(clock),
            Err(why) if args.nemesis.is_empty() => {
                eprintln!("baton chaos: warning: leaving the client-clock fault out: {why}");
                kinds.retain(|k| *k != Nemesis::ClientClock);
                None
            }
            Err(why) => return Err(CliError::msg(why)),
        }
    } else {
        None
    };
    if clock.is_some() && !workloads.contains(&Workload::Supervised) {
        eprintln!(
            "baton chaos: warning: client-clock jumps only the clocks of the supervised workload, which is not running"
        );
    }
    if let Some(servers) = server {
        // Not this run's servers: its own clients' faults only, and the
        // sessions as short as the servers grant.
        eprintln!(
            "baton chaos: seed {seed}; servers {servers} for {} s; workloads {workloads:?}; faults {kinds:?}; files in {}",
            args.seconds,
            dir.display()
        );
        let members = servers.split(',').filter(|a| !a.trim().is_empty()).count() as u64;
        return run_on(
            &args,
            seed,
            (members, 0),
            &dir,
            &servers,
            None,
            &workloads,
            &kinds,
            Duration::from_millis(1000),
            clock,
        )
        .await;
    }
    // Lease holders' sessions: short, but past a failover on a cluster.
    let lease_session = if args.members > 1 {
        Duration::from_millis((4 * args.election_timeout + 500).max(1000))
    } else {
        Duration::from_millis(1000)
    };
    // Sessions as short as the lease holders' (and a cluster's failover
    // under them, with an election timeout short enough to fit); snapshots
    // often, so that they are taken, sent to members behind and read back
    // under the faults too.
    let extra: Vec<String> = if args.members > 1 {
        let mut extra: Vec<String> = vec![
            "--min-session-timeout".into(),
            // A session outlives a failover: four election timeouts.
            (4 * args.election_timeout + 500).max(1000).to_string(),
            "--election-timeout".into(),
            args.election_timeout.to_string(),
            "--snapshot-entries".into(),
            SNAPSHOT_ENTRIES.to_string(),
        ];
        extra.extend(["--followers-serve".into(), args.followers_serve.to_string()]);
        extra
    } else {
        vec![
            "--min-session-timeout".into(),
            "1000".into(),
            "--snapshot-every".into(),
            SNAPSHOT_BYTES.to_string(),
        ]
    };
    eprintln!(
        "baton chaos: seed {seed}; {} for {} s; workloads {:?}; faults {:?}; files in {}",
        match (args.members, args.observers) {
            (1, _) => "a single server".to_string(),
            (n, 0) => format!("{n} members"),
            (n, o) => format!("{n} members and {o} observers"),
        },
        args.seconds,
        workloads,
        kinds,
        dir.display()
    );
    // Proxies in front of every port, when links are to be cut.
    let net = net::Net::new();
    let behind = kinds.iter().any(|k| k.needs_network());
    let front = |id: u64, client: &str, peer: &str| -> Result<(String, String), CliError> {
        if behind {
            Ok((net.front_client(id, client)?, net.front_peer(id, peer)?))
        } else {
            Ok((client.to_owned(), peer.to_owned()))
        }
    };
    let mut cluster = LocalCluster::launch_behind(
        args.members,
        &dir,
        &extra,
        args.members == 1,
        args.server_binary.clone(),
        kinds.iter().any(|k| k.needs_disk_faults()),
        &front,
    )?;
    if cluster.wait_leader(Duration::from_secs(20)).await.is_none() {
        cluster.stop().await;
        return Err(CliError::msg(
            "no member of the cluster led within 20 s; see the member logs",
        ));
    }
    let observers: std::collections::BTreeSet<u64> =
        (args.members + 1..=args.members + args.observers).collect();
    for &id in &observers {
        if let Err(e) = cluster.add_observer_behind(id, &front).await {
            cluster.stop().await;
            return Err(CliError::msg(format!("adding observer {id}: {e}")));
        }
        eprintln!("baton chaos: member {id} added as an observer");
    }
    let servers = cluster.clients();
    let target = Arc::new(tokio::sync::Mutex::new(Target::new(
        cluster,
        net,
        // As `baton serve` sets it: a third of the election timeout.
        Duration::from_millis((args.election_timeout / 3).max(10)),
        observers,
    )));
    let result = run_on(
        &args,
        seed,
        (args.members + args.observers, args.observers),
        &dir,
        &servers,
        Some(&target),
        &workloads,
        &kinds,
        lease_session,
        clock,
    )
    .await;
    let target =
        Arc::try_unwrap(target).map_err(|_| CliError::msg("a fault still holds the servers"))?;
    target.into_inner().cluster.stop().await;
    result
}

#[allow(clippy::too_many_arguments)]
async fn run_on(
    args: &ChaosArgs,
    seed: u64,
    (members, observers): (u64, u64),
    dir: &std::path::Path,
    servers: &str,
    target: Option<&Arc<tokio::sync::Mutex<Target>>>,
    workloads: &[Workload],
    kinds: &[Nemesis],
    lease_session: Duration,
    clock: Option<supervised::ClientClock>,
) -> CliResult {
    let history_path = dir.join("history.jsonl");
    let recorder = Recorder::new(&history_path)
        .map_err(|e| CliError::msg(format!("cannot write {}: {e}", history_path.display())))?;
    workloads::set_up(servers).await.map_err(|e| {
        CliError::msg(match e {
            baton_client::Error::NodeExists(_) => format!(
                "setting the workloads' nodes up: {e}: the workloads need {} absent (an earlier run's? remove it first)",
                workloads::ROOT
            ),
            e => format!("setting the workloads' nodes up: {e}"),
        })
    })?;
    let rng = Rng::new(seed);
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let ctx = Ctx {
        servers: servers.to_owned(),
        recorder: recorder.clone(),
        until,
        client_pauses: kinds.contains(&Nemesis::ClientPause),
        lease_session,
    };
    let info = RunInfo {
        seed,
        members,
        observers,
        seconds: args.seconds,
        json: args.json,
    };
    recorder.fault(info.begins());
    let mut work = tokio::task::JoinSet::new();
    for (w, workload) in workloads.iter().enumerate() {
        for i in 0..WORKERS {
            let process = 100 * (w as u64 + 1) + i;
            let (ctx, rng) = (ctx.clone(), rng.fork(process));
            match workload {
                Workload::Register => {
                    work.spawn(workloads::register(ctx, process, rng));
                }
                Workload::Sequential => {
                    work.spawn(workloads::sequential(ctx, process, rng));
                }
                Workload::Counter => {
                    work.spawn(workloads::counter(ctx, process, i == 0, rng));
                }
                Workload::Queue => {
                    work.spawn(workloads::queue(ctx, process, i % 2 == 0, rng));
                }
                Workload::Fenced => {
                    work.spawn(workloads::on_own_thread(move || {
                        workloads::fenced(ctx, process, rng)
                    }));
                }
                Workload::Election => {
                    work.spawn(workloads::on_own_thread(move || {
                        workloads::election(ctx, process, rng)
                    }));
                }
                Workload::Supervised => {
                    work.spawn(supervised::supervised(ctx, process, rng, clock.clone()));
                }
                Workload::Ephemeral => {}
            }
        }
        if *workload == Workload::Ephemeral {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let observer = 100 * (w as u64 + 1) + 99;
            work.spawn(workloads::observe_ephemerals(ctx.clone(), observer, rx));
            for i in 0..WORKERS {
                let process = 100 * (w as u64 + 1) + i;
                let (ctx, rng, tx) = (ctx.clone(), rng.fork(process), tx.clone());
                work.spawn(workloads::on_own_thread(move || {
                    workloads::ephemeral(ctx, process, rng, tx)
                }));
            }
        }
    }
    let mut faults = tokio::task::JoinSet::new();
    for n in 0..2 {
        let Some(target) = target else { break };
        faults.spawn(nemesis::schedule(
            target.clone(),
            kinds.to_vec(),
            recorder.clone(),
            rng.fork(1_000_000 + n),
            until,
        ));
    }
    if let Some(clock) = clock {
        faults.spawn(supervised::jump_clocks(
            clock,
            lease_session,
            recorder.clone(),
            rng.fork(1_000_002),
            until,
        ));
    }
    if let Some(target) = target {
        faults.spawn(nemesis::follow_leader(
            target.clone(),
            recorder.clone(),
            until,
        ));
    }
    progress(&recorder, until, args.json).await;
    while faults.join_next().await.is_some() {}
    if let Some(target) = target {
        target.lock().await.heal(&recorder).await;
    }
    recorder.fault("run ends: faults healed; workers finishing");
    // Workers finish their operation in hand (each bounded by its limit).
    let finishing = tokio::time::timeout(Duration::from_secs(60), async {
        while work.join_next().await.is_some() {}
    })
    .await;
    if finishing.is_err() {
        recorder.fault("workers still busy 60 s after the end; checked without them");
    }
    final_reads(servers, &recorder, workloads).await;
    let history = recorder.history();
    let findings = baton_chaos::check(&history);
    let timeline_path = dir.join("timeline.html");
    let title = format!(
        "baton chaos, seed {seed}, {}, {} s",
        info.members_said(),
        args.seconds
    );
    let _ = std::fs::write(&timeline_path, timeline::html(&history, &findings, &title));
    report(&info, &history, &findings, &history_path, &timeline_path);
    Ok(if baton_chaos::violated(&findings) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A line on stderr every few seconds while the run goes on.
async fn progress(recorder: &Recorder, until: Instant, quiet: bool) {
    let started = Instant::now();
    while Instant::now() < until {
        tokio::time::sleep(
            Duration::from_secs(5).min(until.saturating_duration_since(Instant::now())),
        )
        .await;
        if !quiet {
            let h = recorder.history();
            eprintln!(
                "  {:>4} s: {} operations, {} faults and events",
                started.elapsed().as_secs(),
                h.ops.len(),
                h.faults.len()
            );
        }
    }
}

/// After the faults: what every register and the counter hold, and the
/// queue drained, so that nothing acknowledged can hide.
async fn final_reads(servers: &str, recorder: &Recorder, workloads: &[Workload]) {
    let Ok(client) = baton_client::Client::builder(servers)
        .connect_timeout(Duration::from_secs(30))
        .connect()
        .await
    else {
        recorder.fault("final reads: no session could be opened");
        return;
    };
    let process = 1;
    use baton_chaos::history::{Call, Outcome, Reply};
    // The registers, and the fenced resources read as registers: an
    // accepted write that was lost would show.
    let mut registers: Vec<&str> = Vec::new();
    if workloads.contains(&Workload::Register) {
        registers.extend(workloads::REGISTERS);
    }
    if workloads.contains(&Workload::Fenced) {
        registers.push(workloads::FENCED);
    }
    if workloads.contains(&Workload::Supervised) {
        registers.push(workloads::SUPERVISED_RESOURCE);
    }
    for key in registers {
        let t = recorder.now();
        if let Ok((data, stat)) = record::within(client.get_data(key)).await {
            recorder.op(
                process,
                key,
                Call::Read,
                t,
                Outcome::Ok {
                    reply: Reply::Value {
                        value: workloads::value_of(&data),
                        version: stat.version,
                    },
                },
            );
        }
    }
    if workloads.contains(&Workload::Counter) {
        let t = recorder.now();
        if let Ok((data, _)) = record::within(client.get_data(workloads::COUNTER)).await {
            let count = workloads::value_of(&data);
            recorder.op(
                process,
                workloads::COUNTER,
                Call::ReadCounter,
                t,
                Outcome::Ok {
                    reply: Reply::Count { count },
                },
            );
        }
    }
    if workloads.contains(&Workload::Queue) && !workloads::drain(&client, recorder, 10).await {
        recorder.fault("final reads: the queue was not found empty");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), client.close()).await;
}

fn report(
    info: &RunInfo,
    history: &baton_chaos::History,
    findings: &[Finding],
    history_path: &std::path::Path,
    timeline_path: &std::path::Path,
) {
    use baton_chaos::history::Outcome;
    let mut by_kind: std::collections::BTreeMap<String, (u64, u64, u64)> = Default::default();
    for op in &history.ops {
        let kind = serde_json::to_value(&op.call)
            .ok()
            .and_then(|v| v["type"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let e = by_kind.entry(kind).or_default();
        match op.outcome {
            Outcome::Ok { .. } => e.0 += 1,
            Outcome::Fail { .. } => e.1 += 1,
            Outcome::Unknown { .. } => e.2 += 1,
        }
    }
    // Faults injected, by name: into the servers, and on the run's own
    // clients.
    let mut servers: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut clients: std::collections::BTreeMap<&str, u64> = Default::default();
    for f in &history.faults {
        if let Some((name, on_servers)) = nemesis::injected(&f.what) {
            let by = if on_servers {
                &mut servers
            } else {
                &mut clients
            };
            *by.entry(name).or_default() += 1;
        }
    }
    let (into_servers, on_clients): (u64, u64) = (servers.values().sum(), clients.values().sum());
    let mut faults: std::collections::BTreeMap<String, u64> = Default::default();
    for f in &history.faults {
        let kind = f
            .what
            .split(" member")
            .next()
            .unwrap_or(&f.what)
            .split(" for ")
            .next()
            .unwrap_or(&f.what)
            .to_string();
        let kind = if kind.starts_with("run begins") {
            "run begins".to_string()
        } else if kind.starts_with("client clocks jump") {
            "client clocks jump".to_string()
        } else if kind.starts_with("client clocks") {
            "client clocks true again".to_string()
        } else if kind.starts_with("client ") {
            "client pause".to_string()
        } else {
            kind
        };
        *faults.entry(kind).or_default() += 1;
    }
    let violations = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Violation)
        .count();
    let RunInfo {
        seed,
        members,
        observers,
        seconds,
        json,
    } = *info;
    if json {
        let out = serde_json::json!({
            "seed": seed,
            "members": members,
            "observers": observers,
            "seconds": seconds,
            "operations": by_kind.iter().map(|(k, (ok, fail, unknown))| (k.clone(), serde_json::json!({"ok": ok, "fail": fail, "unknown": unknown}))).collect::<serde_json::Map<_, _>>(),
            "faults": faults,
            "injected": {
                "into_servers": into_servers,
                "on_clients": on_clients,
                "servers": servers,
                "clients": clients,
            },
            "violations": violations,
            "findings": findings,
            "history": history_path,
            "timeline": timeline_path,
        });
        println!("{out}");
        return;
    }
    println!(
        "baton chaos: seed {seed}, {}, {seconds} s",
        info.members_said()
    );
    println!(
        "{:<16} {:>9} {:>9} {:>9}",
        "operation", "ok", "failed", "unknown"
    );
    for (kind, (ok, fail, unknown)) in &by_kind {
        println!("{kind:<16} {ok:>9} {fail:>9} {unknown:>9}");
    }
    let named = |total: u64, by: &std::collections::BTreeMap<&str, u64>| {
        if by.is_empty() {
            return total.to_string();
        }
        let each: Vec<String> = by.iter().map(|(name, n)| format!("{n} {name}")).collect();
        format!("{total} ({})", each.join(", "))
    };
    println!(
        "faults injected into the servers: {}; on its own clients: {}",
        named(into_servers, &servers),
        named(on_clients, &clients)
    );
    println!("faults and events:");
    for (kind, n) in &faults {
        println!("  {n:>6}  {kind}");
    }
    if findings.is_empty() {
        println!("every promise held");
    }
    for f in findings {
        println!(
            "{:?}: {} {}: {} (operations {:?})",
            f.verdict, f.checker, f.key, f.detail, f.ops
        );
    }
    println!(
        "{violations} violation(s); history in {}, timeline in {}",
        history_path.display(),
        timeline_path.display()
    );
}
