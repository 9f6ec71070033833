//! `baton bench durability`: what `--fsync always` costs, next to the floor
//! the disk and the loopback set, measured in the same run.

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{Client, CreateMode, Lock};
use serde::Serialize;

use super::ops::tcp_floor;
use super::server::ChildServer;
use super::{progress, Summary};
use crate::CliError;

/// Measure durable writes: the disk's fdatasync rate, writes per second at
/// several numbers of concurrent writers and contended lock handovers per
/// second with `--fsync always`, and recovery time for a long log.
///
/// Every server is a `baton serve` child process on a data directory under
/// --dir (default: the system's temporary directory), which is the disk
/// measured.
#[derive(clap::Args)]
pub struct DurabilityArgs {
    /// Directory on the disk to measure; data directories are made in it.
    #[arg(long, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
    /// Concurrent writers, as a comma-separated list.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    writers: Vec<usize>,
    /// Contenders queueing on one lock for the handover measurement.
    #[arg(long, default_value_t = 16)]
    contenders: usize,
    /// How long each timed run lasts (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::duration::millis)]
    duration_ms: u64,
    /// Log records to write before timing recovery (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    recovery_records: u64,
    /// Nodes in the tree when a snapshot starts, for the snapshot pause
    /// measurement (0 skips it).
    #[arg(long, default_value_t = 1_000_000)]
    snapshot_nodes: u64,
    /// Print one JSON object instead of a table.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print Markdown tables (as in docs/benchmarks.md).
    #[arg(long)]
    markdown: bool,
}

#[derive(Serialize)]
struct Report {
    fdatasync: Summary,
    fdatasync_per_s: f64,
    tcp_rtt: Summary,
    writes: Vec<Writes>,
    handovers_per_s: f64,
    handover_floor_per_s: f64,
    handovers: u64,
    recovery: Option<RecoveryTime>,
    snapshot: Option<SnapshotPause>,
}

#[derive(Serialize)]
struct SnapshotPause {
    nodes: u64,
    /// How long the server held its core lock to start the snapshot.
    pause_us: u64,
    /// Round trip of the first create under the big parent once the
    /// snapshot began.
    first_change_us: f64,
    /// Round trips of pings sent while the snapshot started and was written.
    ping: Summary,
    /// From the write that started the snapshot to the snapshot on disk.
    written_ms: f64,
}

#[derive(Serialize)]
struct Writes {
    writers: usize,
    writes: u64,
    writes_per_s: f64,
    /// Writes per second over the disk's fdatasync rate.
    over_fdatasync: f64,
}

#[derive(Serialize)]
struct RecoveryTime {
    records: u64,
    log_bytes: u64,
    /// From starting `baton serve` to a session opened on it.
    startup_ms: f64,
}

pub async fn run(args: DurabilityArgs) -> Result<(), CliError> {
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let root = base.join(format!("baton-bench-durability-{}", std::process::id()));
    std::fs::create_dir_all(&root)
        .map_err(|e| CliError::msg(format!("cannot create {}: {e}", root.display())))?;
    let result = measure(&args, &root).await;
    let _ = std::fs::remove_dir_all(&root);
    let report = result?;
    super::emit(
        &report,
        args.json,
        args.markdown,
        print_markdown,
        print_table,
    );
    Ok(())
}

async fn measure(args: &DurabilityArgs, root: &std::path::Path) -> Result<Report, CliError> {
    let duration = Duration::from_millis(args.duration_ms);
    progress(format!(
        "fdatasync of a 4 KiB append on {}, {} ms",
        root.display(),
        args.duration_ms
    ));
    let probe = root.join("fdatasync-probe");
    let fdatasync = tokio::task::spawn_blocking(move || fdatasync_floor(&probe, duration))
        .await
        .map_err(|e| CliError::msg(e.to_string()))??;
    let fdatasync_per_s = 1e6 / fdatasync.p50_us;
    progress("loopback TCP round trip, 10000 round trips");
    let tcp_rtt = tokio::task::spawn_blocking(|| tcp_floor(10_000))
        .await
        .map_err(|e| CliError::msg(e.to_string()))??;

    let server = ChildServer::start_in(&root.join("writes"), &["--fsync", "always"]).await?;
    let mut writes = Vec::new();
    for &writers in &args.writers {
        progress(format!(
            "durable writes, {writers} concurrent writers, {} ms",
            args.duration_ms
        ));
        let n = write_run(&server.addr, writers, duration).await?;
        let per_s = n as f64 / duration.as_secs_f64();
        writes.push(Writes {
            writers,
            writes: n,
            writes_per_s: per_s,
            over_fdatasync: per_s / fdatasync_per_s,
        });
    }
    progress(format!(
        "contended handovers, {} contenders on one lock, {} ms",
        args.contenders, args.duration_ms
    ));
    let handovers = handover_run(&server.addr, args.contenders, duration).await?;
    server.kill().await;
    let handovers_per_s = handovers as f64 / duration.as_secs_f64();
    let handover_floor_per_s = 1e6 / (fdatasync.p50_us + 1.5 * tcp_rtt.p50_us);

    let recovery = if args.recovery_records > 0 {
        Some(recovery_run(&root.join("recovery"), args.recovery_records).await?)
    } else {
        None
    };
    let snapshot = if args.snapshot_nodes > 0 {
        Some(snapshot_run(&root.join("snapshot"), args.snapshot_nodes).await?)
    } else {
        None
    };
    Ok(Report {
        snapshot,
        fdatasync,
        fdatasync_per_s,
        tcp_rtt,
        writes,
        handovers_per_s,
        handover_floor_per_s,
        handovers,
        recovery,
    })
}

/// Latency of appending 4 KiB and syncing it, repeated for `duration`.
pub(super) fn fdatasync_floor(
    path: &std::path::Path,
    duration: Duration,
) -> Result<Summary, CliError> {
    let io = |e: std::io::Error| CliError::msg(format!("fdatasync probe {}: {e}", path.display()));
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let block = [0x5au8; 4096];
    let mut samples = Vec::new();
    let end = Instant::now() + duration;
    while Instant::now() < end && samples.len() < 1_000_000 {
        let t = Instant::now();
        file.write_all(&block).map_err(io)?;
        file.sync_data().map_err(io)?;
        samples.push(t.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(path);
    Ok(Summary::of(&mut samples))
}

/// Each writer sets its own node's data, one write at a time, for
/// `duration`; returns the number of acknowledged writes.
pub(super) async fn write_run(
    addr: &str,
    writers: usize,
    duration: Duration,
) -> Result<u64, CliError> {
    let mut clients = Vec::with_capacity(writers);
    for i in 0..writers {
        let c = Client::connect(addr).await?;
        let path = format!("/w{i}");
        match c.create(&path, "", CreateMode::Persistent).await {
            Ok(_) | Err(baton_client::Error::NodeExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
        clients.push((c, path));
    }
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + duration;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(c, path)| {
            let done = done.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < end && n < 100_000_000 {
                    c.set_data(&path, n.to_string(), None).await?;
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
                c.close().await;
                Ok::<_, baton_client::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| CliError::msg(e.to_string()))??;
    }
    Ok(done.load(Ordering::Relaxed))
}

/// Contenders that acquire, release and queue again on one lock for
/// `duration`; returns the number of grants.
pub(super) async fn handover_run(
    addr: &str,
    contenders: usize,
    duration: Duration,
) -> Result<u64, CliError> {
    let grants = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..contenders {
        let c = Client::connect(addr).await?;
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let lock = Lock::new(&c, "/bench/handover");
            while Instant::now() < end {
                let remaining = end.saturating_duration_since(Instant::now());
                let Some(guard) = lock.acquire_timeout(remaining).await? else {
                    break;
                };
                grants.fetch_add(1, Ordering::Relaxed);
                guard.release().await?;
            }
            c.close().await;
            Ok::<_, baton_client::Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| CliError::msg(e.to_string()))??;
    }
    Ok(grants.load(Ordering::Relaxed))
}

/// Writes `records` log records (with `--fsync never`, to be quick; the log
/// is the same), then times a server's start on that log.
async fn recovery_run(dir: &std::path::Path, records: u64) -> Result<RecoveryTime, CliError> {
    progress(format!("writing a log of {records} records"));
    let huge = (u64::MAX / 2).to_string();
    let server =
        ChildServer::start_in(dir, &["--fsync", "never", "--snapshot-every", &huge]).await?;
    let writers = 64u64;
    let per_writer = records.div_ceil(writers);
    let written = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..writers {
        let c = Client::connect(&server.addr).await?;
        let written = written.clone();
        tasks.push(tokio::spawn(async move {
            let path = format!("/r{w}");
            c.create(&path, "", CreateMode::Persistent).await?;
            let mut n = 1; // the create is a record too
            while n < per_writer {
                // Pipelined: many writes in flight on the one connection.
                let batch = (per_writer - n).min(256);
                let sets = (0..batch).map(|i| c.set_data(&path, format!("value {}", n + i), None));
                futures::future::try_join_all(sets).await?;
                n += batch;
                written.fetch_add(batch, Ordering::Relaxed);
            }
            Ok::<_, baton_client::Error>(())
        }));
    }
    let mut last = Instant::now();
    for t in tasks {
        while !t.is_finished() {
            if last.elapsed() > Duration::from_secs(2) {
                progress(format!(
                    "{} of {records} records written",
                    written.load(Ordering::Relaxed)
                ));
                last = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        t.await.map_err(|e| CliError::msg(e.to_string()))??;
    }
    server.kill().await;
    let log_bytes: u64 = std::fs::read_dir(dir)
        .map_err(|e| CliError::msg(e.to_string()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("wal-"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    progress(format!(
        "starting a server on the log ({} MiB)",
        log_bytes >> 20
    ));
    let started = Instant::now();
    // The server listens once it has recovered; a session proves it.
    let server = ChildServer::start_in(dir, &[]).await?;
    Client::connect(&server.addr).await?.close().await;
    let startup_ms = started.elapsed().as_secs_f64() * 1000.0;
    server.kill().await;
    Ok(RecoveryTime {
        records: writers * per_writer,
        log_bytes,
        startup_ms,
    })
}

/// Creates `nodes` nodes, restarts the server so that a large write starts
/// a snapshot, and measures what that costs the clients: how long the core
/// lock was held (the server's own figure) and the round trips of pings sent
/// meanwhile.
async fn snapshot_run(dir: &std::path::Path, nodes: u64) -> Result<SnapshotPause, CliError> {
    progress(format!("creating {nodes} nodes"));
    let huge = (u64::MAX / 2).to_string();
    let server =
        ChildServer::start_in(dir, &["--fsync", "never", "--snapshot-every", &huge]).await?;
    let setup = Client::connect(&server.addr).await?;
    setup.create("/s", "", CreateMode::Persistent).await?;
    let writers = 64u64;
    let per_writer = nodes.div_ceil(writers);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let c = Client::connect(&server.addr).await?;
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while n < per_writer {
                let batch = (per_writer - n).min(256);
                let creates = (n..n + batch).map(|i| {
                    let c = &c;
                    async move {
                        let path = format!("/s/n{w}-{i}");
                        c.create(&path, "", CreateMode::Persistent).await
                    }
                });
                futures::future::try_join_all(creates).await?;
                n += batch;
            }
            c.close().await;
            Ok::<_, baton_client::Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| CliError::msg(e.to_string()))??;
    }
    setup.close().await;
    server.kill().await;

    // Writeback of the nodes just written would stall the server's writes
    // (and so every client) for reasons of the page cache, not of the
    // snapshot: flush it first.
    progress("syncing the page cache");
    tokio::task::spawn_blocking(|| {
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() }
    })
    .await
    .map_err(|e| CliError::msg(e.to_string()))?;
    progress("restarting it so that a large write starts a snapshot");
    // Sessions opening log less than this; the trigger's data more.
    let every = "32768";
    let server =
        ChildServer::start_in(dir, &["--fsync", "never", "--snapshot-every", every]).await?;
    let pinger = Client::connect(&server.addr).await?;
    let writer = Client::connect(&server.addr).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent_pings = Arc::new(AtomicU64::new(0));
    let pings = {
        let (pinger, stop, sent) = (pinger.clone(), stop.clone(), sent_pings.clone());
        tokio::spawn(async move {
            let mut rtts = Vec::new();
            while !stop.load(Ordering::Relaxed) && rtts.len() < 10_000_000 {
                let at = Instant::now();
                pinger.ping().await?;
                rtts.push((at, at.elapsed()));
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, baton_client::Error>(rtts)
        })
    };
    // The pinger is under way before the snapshot starts.
    while sent_pings.load(Ordering::Relaxed) < 1000 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    writer
        .create("/s/trigger", vec![0u8; 65536], CreateMode::Persistent)
        .await?;
    // The first change under the parent of a million children after the
    // snapshot began.
    let after = Instant::now();
    writer
        .create("/s/after", "", CreateMode::Persistent)
        .await?;
    let first_change_us = after.elapsed().as_secs_f64() * 1e6;
    let deadline = started + Duration::from_secs(600);
    let stats = loop {
        let stats = writer.server_stats().await?;
        if stats.get("snapshots").copied().unwrap_or(0) > 0 {
            break stats;
        }
        if Instant::now() > deadline {
            return Err(CliError::msg("no snapshot was written within 600 s"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let written_ms = started.elapsed().as_secs_f64() * 1000.0;
    let done = Instant::now();
    stop.store(true, Ordering::Relaxed);
    // The pings that were in flight while the snapshot started and was
    // written (one sent just before the trigger may have waited on it).
    let mut rtts: Vec<Duration> = pings
        .await
        .map_err(|e| CliError::msg(e.to_string()))??
        .into_iter()
        .filter(|(at, rtt)| *at + *rtt >= started && *at <= done)
        .map(|(_, rtt)| rtt)
        .collect();
    pinger.close().await;
    writer.close().await;
    server.kill().await;
    Ok(SnapshotPause {
        nodes: nodes + 3,
        first_change_us,
        pause_us: stats.get("snapshot_pause_max_us").copied().unwrap_or(0),
        ping: Summary::of(&mut rtts),
        written_ms,
    })
}

fn print_table(r: &Report) {
    println!("floor (same run)");
    println!(
        "  4 KiB append + fdatasync   p50 {:>8.1} us   ({:.0}/s)",
        r.fdatasync.p50_us, r.fdatasync_per_s
    );
    println!(
        "  loopback TCP round trip    p50 {:>8.1} us",
        r.tcp_rtt.p50_us
    );
    println!();
    println!("durable writes (--fsync always)");
    println!("  writers      writes/s   x fdatasync rate");
    for w in &r.writes {
        println!(
            "  {:>7}  {:>12.0}   {:>16.1}",
            w.writers, w.writes_per_s, w.over_fdatasync
        );
    }
    println!();
    println!(
        "contended handovers (--fsync always): {:.0}/s; floor 1/(fdatasync + 1.5 RTT) = {:.0}/s ({:.2}x)",
        r.handovers_per_s,
        r.handover_floor_per_s,
        r.handovers_per_s / r.handover_floor_per_s
    );
    if let Some(rec) = &r.recovery {
        println!();
        println!(
            "recovery: {} records ({:.1} MiB of log) replayed; server ready in {:.0} ms",
            rec.records,
            rec.log_bytes as f64 / 1048576.0,
            rec.startup_ms
        );
    }
    if let Some(s) = &r.snapshot {
        println!();
        println!(
            "snapshot of {} nodes: core lock held {} us to start it; next create under the parent {:.0} us; pings meanwhile p50 {:.1} us, max {:.1} us; on disk after {:.0} ms",
            s.nodes, s.pause_us, s.first_change_us, s.ping.p50_us, s.ping.max_us, s.written_ms
        );
    }
}

fn print_markdown(r: &Report) {
    println!("| floor, same run | p50 µs | per second |");
    println!("| --- | ---: | ---: |");
    println!(
        "| 4 KiB append + fdatasync | {:.1} | {:.0} |",
        r.fdatasync.p50_us, r.fdatasync_per_s
    );
    println!(
        "| loopback TCP round trip | {:.1} | {:.0} |",
        r.tcp_rtt.p50_us,
        1e6 / r.tcp_rtt.p50_us
    );
    println!();
    println!("| durable writes (`--fsync always`) | writes/s | / fdatasync rate |");
    println!("| --- | ---: | ---: |");
    for w in &r.writes {
        println!(
            "| {} writer{} | {:.0} | {:.1}x |",
            w.writers,
            if w.writers == 1 { "" } else { "s" },
            w.writes_per_s,
            w.over_fdatasync
        );
    }
    println!();
    println!("| contended handovers (`--fsync always`) | per second |");
    println!("| --- | ---: |");
    println!("| measured | {:.0} |", r.handovers_per_s);
    println!(
        "| floor: 1 / (fdatasync + 1.5 RTT) | {:.0} |",
        r.handover_floor_per_s
    );
    println!(
        "| measured / floor | {:.2}x |",
        r.handovers_per_s / r.handover_floor_per_s
    );
    if let Some(rec) = &r.recovery {
        println!();
        println!("| recovery | |");
        println!("| --- | ---: |");
        println!("| log records | {} |", rec.records);
        println!("| log size | {:.1} MiB |", rec.log_bytes as f64 / 1048576.0);
        println!(
            "| `baton serve` start to first session opened | {:.0} ms |",
            rec.startup_ms
        );
    }
    if let Some(s) = &r.snapshot {
        println!();
        println!("| snapshot of {} nodes (`--fsync never`) | |", s.nodes);
        println!("| --- | ---: |");
        println!("| core lock held to start it | {} µs |", s.pause_us);
        println!(
            "| next create under the parent, round trip | {:.0} µs |",
            s.first_change_us
        );
        println!(
            "| ping round trip meanwhile, p50 | {:.1} µs |",
            s.ping.p50_us
        );
        println!(
            "| ping round trip meanwhile, max | {:.1} µs |",
            s.ping.max_us
        );
        println!("| write to snapshot on disk | {:.0} ms |", s.written_ms);
    }
}
