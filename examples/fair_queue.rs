//! A thousand contenders on one lock: mutual exclusion, arrival order, and one
//! wake-up per handover.
//!
//! Each contender has a session of its own (its own [`Client`], so its own
//! connection) and takes the lock `/locks/fair` once: it acquires, enters a
//! critical section, leaves it, and releases. The example checks the three
//! promises of Baton's [`Lock`]:
//!
//! - **Mutual exclusion.** Every contender counts itself in and out of the
//!   critical section; a contender that finds someone already inside is a
//!   violation. There must be none.
//! - **Fairness (FIFO).** A gate holds the lock while the contenders arrive
//!   one at a time: each is started only once the one before it is in the
//!   queue (the lock node's child count has grown), so the arrival order is
//!   known. Then the gate releases, and the grants must follow the arrival
//!   order exactly, with fencing tokens (the creation revisions of the
//!   contenders' nodes) increasing from each grant to the next.
//! - **No thundering herd.** Each waiter watches only its predecessor, so a
//!   release wakes one waiter. The server counts the watch notifications it
//!   sends; across the run there should be one per handover, not one per
//!   waiter.
//!
//! Everything runs in this process: an embedded Baton server on a free local
//! port and the contenders' sessions (two file descriptors each; the example
//! raises its soft open-file limit if it can). It exits with status 1 if
//! any check fails, so it can serve as a test. Run it with
//!
//! ```text
//! cargo run --example fair_queue            # 1,000 contenders
//! cargo run --example fair_queue -- 200     # or another number
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::server::Config;
use baton::{Client, FencingToken, Lock};
use futures::{StreamExt, TryStreamExt};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

mod common;
use common::{Embedded, Timeline};

const LOCK: &str = "/locks/fair";
const DEFAULT_CONTENDERS: usize = 1_000;
/// Longest wait for one contender to join the queue.
const QUEUE_LIMIT: Duration = Duration::from_secs(10);
/// Longest wait for a whole phase (connecting, queueing, serving everyone).
const PHASE_LIMIT: Duration = Duration::from_secs(120);
/// Sessions opened at once while connecting.
const CONNECT_CONCURRENCY: usize = 32;

fn main() -> ExitCode {
    let contenders = match std::env::args().nth(1) {
        None => DEFAULT_CONTENDERS,
        Some(arg) => match arg.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("usage: fair_queue [number of contenders, at least 1]");
                return ExitCode::from(2);
            }
        },
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(contenders)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!();
            println!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the contenders record, shared between them.
#[derive(Default)]
struct Record {
    /// Contenders inside the critical section right now.
    inside: AtomicUsize,
    /// Most contenders ever inside at once.
    most_inside: AtomicUsize,
    /// Entries that found someone already inside.
    violations: AtomicUsize,
    /// (arrival index, token), in the order the lock was granted.
    grants: Mutex<Vec<(usize, FencingToken)>>,
}

async fn run(n: usize) -> Result<(), String> {
    let t = Timeline::new();
    println!("Fair queue: {n} contenders, each with its own session, on one lock ({LOCK}).");
    println!();
    raise_open_file_limit(2 * n + 256)?;

    let server = Embedded::start(Config::default()).await?;
    t.say("server", format!("Baton listening on {}", server.addr));

    // The gate holds the lock while the queue forms.
    let gate = Client::connect(&server.addr)
        .await
        .map_err(|e| format!("connecting the gate: {e}"))?;
    let gate_guard = Lock::new(&gate, LOCK)
        .with_identity("gate")
        .acquire()
        .await
        .map_err(|e| format!("the gate acquiring {LOCK}: {e}"))?;
    t.say(
        "gate",
        format!(
            "holds {LOCK} (token {}) while the queue forms",
            gate_guard.token()
        ),
    );

    let addr = server.addr.clone();
    let clients: Vec<Client> = timeout(
        PHASE_LIMIT,
        futures::stream::iter(0..n)
            .map(|_| Client::connect(&addr))
            .buffered(CONNECT_CONCURRENCY)
            .try_collect(),
    )
    .await
    .map_err(|_| format!("opening {n} sessions took longer than {PHASE_LIMIT:?}"))?
    .map_err(|e| format!("opening a contender's session: {e}"))?;
    t.say(
        "clients",
        format!(
            "{n} sessions open ({} connections on the server)",
            server.handle.stats().connections_open
        ),
    );

    // Contenders arrive one at a time: #i starts once #i-1 is queued.
    let record = Arc::new(Record::default());
    let queued_by = Instant::now() + PHASE_LIMIT;
    let mut tasks: Vec<JoinHandle<Result<(), String>>> = Vec::with_capacity(n);
    for (i, client) in clients.iter().enumerate() {
        let lock = Lock::new(client, LOCK).with_identity(format!("contender {i}"));
        tasks.push(tokio::spawn(contend(i, lock, record.clone())));
        wait_until_queued(&gate, i + 2, queued_by.min(Instant::now() + QUEUE_LIMIT))
            .await
            .map_err(|e| format!("contender {i}: {e}"))?;
        if (i + 1) % 250 == 0 || i + 1 == n {
            t.say(
                "clients",
                format!("{} contenders queued behind the gate", i + 1),
            );
        }
    }
    let queue = Lock::new(&gate, LOCK)
        .contenders()
        .await
        .map_err(|e| format!("listing the queue: {e}"))?;
    let ids: Vec<String> = queue
        .iter()
        .map(|c| String::from_utf8_lossy(&c.identity).into_owned())
        .collect();
    let expected: Vec<String> = std::iter::once("gate".to_owned())
        .chain((0..n).map(|i| format!("contender {i}")))
        .collect();
    if ids != expected {
        let at = ids
            .iter()
            .zip(&expected)
            .position(|(got, want)| got != want)
            .unwrap_or(ids.len().min(expected.len()));
        return Err(format!(
            "the queue is not in arrival order: {} in the queue, position {at} holds {:?} instead of {:?}",
            ids.len(),
            ids.get(at),
            expected.get(at)
        ));
    }
    t.say(
        "lock",
        format!(
            "queue in arrival order: gate, contender 0 (token {}), ..., contender {} (token {})",
            queue[1].token,
            n - 1,
            queue[n].token
        ),
    );

    // Open the gate and let every contender through.
    let events_before = server.handle.stats().watch_events;
    let served_from = Instant::now();
    gate_guard
        .release()
        .await
        .map_err(|e| format!("the gate releasing {LOCK}: {e}"))?;
    t.say("gate", "releases the lock");
    let all = timeout(PHASE_LIMIT, futures::future::join_all(tasks))
        .await
        .map_err(|_| format!("serving {n} contenders took longer than {PHASE_LIMIT:?}"))?;
    let serving = served_from.elapsed();
    let mut failures = Vec::new();
    for (i, result) in all.into_iter().enumerate() {
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("contender {i}: {e}")),
            Err(e) => failures.push(format!("contender {i}'s task: {e}")),
        }
    }
    let events = server.handle.stats().watch_events - events_before;
    t.say(
        "clients",
        format!("every contender served in {} ms", serving.as_millis()),
    );

    // The report.
    let grants = record
        .grants
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let violations = record.violations.load(Ordering::SeqCst);
    let most_inside = record.most_inside.load(Ordering::SeqCst);
    let in_order = grants
        .iter()
        .enumerate()
        .filter(|(k, (i, _))| k == i)
        .count();
    let tokens_increase = grants.windows(2).all(|w| w[0].1 < w[1].1);
    let handovers = grants.len();
    let per_handover = if handovers == 0 {
        0.0
    } else {
        events as f64 / handovers as f64
    };
    println!();
    println!("contenders (sessions)           {n}");
    println!("grants                          {}", grants.len());
    println!("mutual exclusion violations     {violations} (most holders at once: {most_inside})");
    println!(
        "FIFO: granted in arrival order  {in_order}/{n} ({:.1}%)",
        100.0 * in_order as f64 / n as f64
    );
    println!(
        "tokens increase grant to grant  {}",
        if tokens_increase { "yes" } else { "NO" }
    );
    println!(
        "handovers                       {handovers} (gate -> contender 0 -> ... -> contender {})",
        n - 1
    );
    println!("watch notifications sent        {events} (server counter)");
    println!("notifications per handover      {per_handover:.3}");
    println!(
        "handover rate                   {:.0} per second",
        handovers as f64 / serving.as_secs_f64().max(1e-9)
    );
    println!();

    // The verdict.
    let mut problems = failures;
    if violations > 0 || most_inside > 1 {
        problems.push(format!(
            "{violations} mutual exclusion violations (up to {most_inside} holders at once)"
        ));
    }
    if grants.len() != n {
        problems.push(format!("{} grants for {n} contenders", grants.len()));
    }
    if in_order != n {
        let first = grants
            .iter()
            .enumerate()
            .find(|(k, (i, _))| k != i)
            .map(|(k, (i, _))| format!("grant {k} went to contender {i}"))
            .unwrap_or_default();
        problems.push(format!(
            "{} of {n} grants out of arrival order ({first})",
            n - in_order
        ));
    }
    if !tokens_increase {
        problems.push("fencing tokens did not increase from grant to grant".into());
    }
    // A herd would be about n/2 notifications per handover; allow a little
    // slack for re-armed watches after a reconnect.
    if per_handover > 1.1 {
        problems.push(format!(
            "{per_handover:.3} watch notifications per handover: releases woke more than the next waiter"
        ));
    }

    futures::future::join_all(clients.iter().map(Client::close)).await;
    gate.close().await;
    server.stop().await;

    if problems.is_empty() {
        println!("OK: no overlap, strict arrival order, one notification per handover.");
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// One contender: acquire, critical section, release.
async fn contend(i: usize, lock: Lock, record: Arc<Record>) -> Result<(), String> {
    let guard = lock.acquire().await.map_err(|e| format!("acquire: {e}"))?;
    let now_inside = record.inside.fetch_add(1, Ordering::SeqCst) + 1;
    if now_inside > 1 {
        record.violations.fetch_add(1, Ordering::SeqCst);
    }
    record.most_inside.fetch_max(now_inside, Ordering::SeqCst);
    record
        .grants
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((i, guard.token()));
    // Stay inside across a yield, so that an overlapping holder would show.
    tokio::task::yield_now().await;
    record.inside.fetch_sub(1, Ordering::SeqCst);
    guard.release().await.map_err(|e| format!("release: {e}"))
}

/// Waits until the lock node has `count` children (queued contenders).
async fn wait_until_queued(client: &Client, count: usize, deadline: Instant) -> Result<(), String> {
    loop {
        // Each look is a round trip, which paces the loop.
        let stat = client
            .exists(LOCK)
            .await
            .map_err(|e| format!("looking at the queue: {e}"))?;
        if stat.is_some_and(|s| s.num_children as usize >= count) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("not queued in time (wanted {count} in the queue)"));
        }
        tokio::task::yield_now().await;
    }
}

/// Raises this process's soft limit on open files to `wanted`, if needed
/// and allowed.
#[cfg(unix)]
fn raise_open_file_limit(wanted: usize) -> Result<(), String> {
    let wanted = wanted as libc::rlim_t;
    // SAFETY: getrlimit and setrlimit only read and write the struct we pass.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Ok(()); // unknown: try anyway
        }
        if limit.rlim_cur >= wanted {
            return Ok(());
        }
        if limit.rlim_max < wanted {
            return Err(format!(
                "this needs about {wanted} open files, but the hard limit is {}; \
                 raise it or run with fewer contenders",
                limit.rlim_max
            ));
        }
        limit.rlim_cur = wanted;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(format!(
                "raising the open-file limit to {wanted}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn raise_open_file_limit(_wanted: usize) -> Result<(), String> {
    Ok(())
}
