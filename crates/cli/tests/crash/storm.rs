//! SIGKILL while snapshots replace the log.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::free_addr;
use crate::harness::*;
use crate::model::*;
use baton_client::{Client, CreateMode};
use bytes::Bytes;

/// A gap between the data directory's newest snapshot (revision S) and its
/// log, as listed now: no log segment starts at or before S + 1, so the
/// records after S are in no file. The listing is not atomic, so this only
/// chooses the moment of a kill; the restart gives the verdict.
fn log_gap(dir: &Path) -> Option<String> {
    let mut snapshots = Vec::new();
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir).ok()? {
        let name = entry.ok()?.file_name().to_string_lossy().into_owned();
        let revision = |prefix: &str, suffix: &str| {
            name.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse::<u64>()
                .ok()
        };
        if let Some(r) = revision("snapshot-", ".snap") {
            snapshots.push(r);
        } else if let Some(r) = revision("wal-", ".log") {
            segments.push(r);
        }
    }
    let newest = *snapshots.iter().max()?;
    let first = *segments.iter().min()?;
    segments.sort_unstable();
    (first > newest + 1).then(|| {
        format!("the newest snapshot was at revision {newest} and the log segments began at {segments:?}")
    })
}

const STORM_CLIENTS: usize = 4;
const STORM_ROUNDS: usize = 8;

/// Pins: a SIGKILL while snapshots keep replacing the log (a storm of
/// pipelined writes with a snapshot every 4 KiB, so that snapshots and
/// rotations follow each other faster than the log is synced) leaves a data
/// directory the server recovers, with every acknowledged write. The kill
/// comes the moment the directory shows a gap between its newest snapshot
/// and its log, if it ever does, else at a random moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_minus_9_while_snapshots_replace_the_log_keeps_it_recoverable() {
    storm_test("always").await;
}

/// Runs the snapshot storm under `--fsync <fsync>`, within a minute.
async fn storm_test(fsync: &str) {
    let seed = seed();
    eprintln!(
        "snapshot storm test (--fsync {fsync}): seed {seed} (BATON_CRASH_SEED={seed} replays its kill moments)"
    );
    let scratch = Scratch::new(&format!("storm-{fsync}"));
    let limit = Duration::from_secs(60);
    if tokio::time::timeout(limit, storm_rounds(seed, &scratch, fsync))
        .await
        .is_err()
    {
        panic!(
            "the snapshot storm test (--fsync {fsync}) did not finish within {limit:?} (seed {seed}); the server log ends:\n{}",
            tail(&scratch.file("server.log"), 40)
        );
    }
}

/// One storm client: pipelined bursts of large writes to its own node until
/// told to stop.
async fn storm(
    i: usize,
    client: Client,
    mut register: Register,
    stop: Arc<AtomicBool>,
    mut op: u64,
) -> (Register, u64, Vec<String>) {
    let mut errors = Vec::new();
    while !stop.load(Ordering::SeqCst) && errors.is_empty() {
        let values: Vec<Bytes> = (0..64)
            .map(|_| {
                op += 1;
                Bytes::from(format!("s{i}-op{op}-{}", "x".repeat(2000)))
            })
            .collect();
        match pipelined_writes(&client, &register.path.clone(), &values).await {
            Ok(results) => {
                for (data, result) in values.into_iter().zip(results) {
                    if let Err(e) = register.record(data, result) {
                        errors.push(format!("client {i}: {e}"));
                    }
                }
            }
            Err(hang) => errors.push(hang),
        }
    }
    (register, op, errors)
}

/// The same storm under `--fsync never`, where each connection writes the
/// records of the requests it handled (pipelined bursts share one write)
/// once it lets go of the core's lock, and segment rotations go through the
/// log's committer: a kill -9 (the process, not the machine) loses nothing
/// that was acknowledged, since every acknowledged change was written to the
/// operating system first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_minus_9_under_fsync_never_while_snapshots_replace_the_log_loses_nothing() {
    storm_test("never").await;
}

async fn storm_rounds(seed: u64, scratch: &Scratch, fsync: &str) {
    let mut rng = Rng::new(seed);
    let addr = free_addr();
    let data = scratch.data();
    let log = scratch.file("server.log");
    let start = || {
        ServeProc::start(
            serve_command_with(&addr, &data, fsync, &["--snapshot-every", "4096"]),
            &addr,
            &log,
        )
    };
    let mut server = start();
    server.wait_listening("first start").await;
    let mut clients = Vec::new();
    let mut registers = Vec::new();
    for i in 0..STORM_CLIENTS {
        let client = connect(&addr).await;
        let path = format!("/storm-{i}");
        let initial = Bytes::from(format!("s{i}-initial"));
        let stat = client
            .create(&path, initial.clone(), CreateMode::Persistent)
            .await
            .unwrap()
            .stat;
        registers.push(Register::new(path, initial, stat.version));
        clients.push(client);
    }
    let mut ops = [0u64; STORM_CLIENTS];

    for round in 1..=STORM_ROUNDS {
        let mut states = watch_states(&clients);
        let stop = Arc::new(AtomicBool::new(false));
        let running: Vec<_> = registers
            .drain(..)
            .enumerate()
            .map(|(i, register)| {
                tokio::spawn(storm(i, clients[i].clone(), register, stop.clone(), ops[i]))
            })
            .collect();

        // The kill: the moment the directory shows a gap, or at the latest
        // after a random stretch of load.
        let pid = server.child.id() as i32;
        let dir = data.clone();
        let latest = Instant::now() + Duration::from_millis(100 + rng.below(500));
        let gap = tokio::task::spawn_blocking(move || loop {
            let gap = log_gap(&dir);
            if gap.is_some() || Instant::now() >= latest {
                // SAFETY: kill has no memory effects; the server is not
                // reaped before this thread ends.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return gap;
            }
        })
        .await
        .unwrap();
        server.kill9();
        let when = match &gap {
            Some(gap) => format!("round {round}, killed when {gap}"),
            None => format!("round {round}, killed at a random moment"),
        };
        eprintln!("{when}");

        server = start();
        server.wait_listening(&format!("{when}, restarting")).await;
        wait_resumed(&mut server, &mut states, &when).await;

        stop.store(true, Ordering::SeqCst);
        let mut errors = Vec::new();
        for (i, handle) in running.into_iter().enumerate() {
            let (register, op, failed) = join_load(handle, &mut server, &when).await;
            registers.push(register);
            ops[i] = op;
            errors.extend(failed);
        }
        for (client, register) in clients.iter().zip(registers.iter_mut()) {
            match bounded("read", client.get_data(&register.path)).await {
                Ok(Ok((value, stat))) => {
                    if let Err(e) = register.settle(value, stat.version) {
                        errors.push(e);
                    }
                }
                other => errors.push(format!("read {}: {other:?}", register.path)),
            }
        }
        assert!(
            errors.is_empty(),
            "{when} (seed {seed}):\n  {}\nthe server log ends:\n{}",
            errors.join("\n  "),
            server.log_tail()
        );
    }

    let snapshots = read_log(&log).matches("snapshot written").count();
    eprintln!("snapshot storm: {snapshots} snapshots written");
    assert!(snapshots >= STORM_ROUNDS, "{snapshots} snapshots written");
    for c in &clients {
        c.close().await;
    }
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
}
