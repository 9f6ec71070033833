//! `baton lock` and `baton locks`: run a command while holding a lock, and
//! show a lock's queue.

use std::process::ExitCode;
use std::time::Duration;

use baton_client::recipes::RwLock;
use baton_client::{Client, Lock};

use crate::lease::{check_grace, default_grace, hold, identity, run_under, stop_before, Run};
use crate::signals::Interrupts;
use crate::{CliError, CliResult};

/// Exit status when the lock was not acquired within --timeout.
pub const EXIT_TIMEOUT: u8 = 124;

/// Run a command while holding a lock (or, with no command, hold it).
///
/// Waits for the lock at PATH (fair: waiters are served in arrival order),
/// then runs CMD with BATON_FENCING_TOKEN (the grant's fencing token, in
/// decimal), BATON_LOCK_PATH (this holder's node) and BATON_SERVER in its
/// environment, and releases the lock when CMD exits. Pass the token along
/// with every write CMD makes, and have the storage refuse lower tokens.
///
/// CMD is stopped before the lock can pass to anyone else. If the server
/// falls silent, CMD gets SIGTERM --kill-grace plus a safety margin (a tenth
/// of the session timeout) before the server may expire the session, and
/// SIGKILL when the grace is up; if the lock is gone already (its node was
/// deleted, the session expired), CMD gets SIGKILL at once. Either way baton
/// exits with status 125. SIGINT, SIGTERM and SIGHUP sent to baton are
/// passed on to CMD, which gets SIGKILL if it outlives the grace.
///
/// When CMD exits, everything it started and left running gets SIGKILL
/// (daemons that double-forked included), so nothing outlives the lock; if
/// baton itself dies (killed, or a crash), CMD and everything it started die
/// too (a small reaper process between baton and CMD sees to it).
///
/// With no CMD, prints the token and holds the lock until SIGINT, SIGTERM or
/// SIGHUP. Whatever the way out, baton closes its session before it exits,
/// so the lock is free at once.
///
/// With --shared, takes the lock as a reader: readers share it with each
/// other, and a `baton lock` without --shared (a writer) holds it alone.
/// Both kinds are served in arrival order (a reader that comes after a
/// waiting writer waits for it), and every holder gets a fencing token
/// ordered with all the others.
///
/// Exit status: CMD's status (128+N if a signal N ended it); 124 if the lock
/// was not acquired within --timeout; 125 if the lock was lost; 126 if CMD
/// could not be run, 127 if it was not found; 1 if baton itself failed.
#[derive(clap::Args)]
pub struct LockArgs {
    /// Take the lock shared, as a reader, rather than alone.
    #[arg(long)]
    shared: bool,

    #[command(flatten)]
    hold: HoldArgs,
}

/// How to wait for a grant and what to run while holding it: shared by
/// `baton lock` and `baton semaphore`.
#[derive(clap::Args)]
pub struct HoldArgs {
    /// Path of the lock (or semaphore), such as /locks/nightly-report.
    path: String,

    /// Give up waiting after this long (exit status 124): a duration such as
    /// 30s or 500ms (a bare number is milliseconds).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::millis)]
    timeout: Option<u64>,

    /// Session timeout to ask for: how long the lock survives this process
    /// falling silent (a duration; a bare number is milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::duration::millis)]
    session_timeout: u64,

    /// Time CMD gets between SIGTERM and SIGKILL [default: a fifth of the
    /// session timeout]. SIGTERM comes this long, plus a safety margin of a
    /// tenth of the session timeout, before the server may expire the
    /// session, so the two must fit in half the session timeout. A
    /// duration; a bare number is milliseconds.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::millis)]
    kill_grace: Option<u64>,

    /// Set the lock's lock-delay: if a holder's session expires (its
    /// process was killed, or fell silent) rather than releasing, the
    /// server grants the lock to no one else for this long, for resources
    /// that cannot check the fencing token. A duration (at most 10m; 0
    /// removes it); the setting stays with the lock for every contender.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::millis)]
    lock_delay: Option<u64>,

    /// The command to run and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Show a lock's holders and queue, or the server's locks.
///
/// With a path: one line per contender, in order: the holder first, then
/// the waiters. Each line shows the position, what it takes (writer,
/// reader, permit or candidate), the fencing token, the owning session, the node and what the contender stored in it (for `baton lock`,
/// its process id and host); a contender whose session is silent,
/// disconnected or expiring says so, and when it will expire.
///
/// A read-write lock shows its readers and writers, a semaphore its permit
/// holders: every contender that holds is listed as a holder (readers
/// sharing the lock, up to N permit holders), then the waiters in order.
///
/// Without a path (or with --all): the locks the server follows, busiest
/// first (longest queue, then most grants; the 20 busiest), each with its
/// queue length, the holder's token, and how many grants it made and how
/// long waiters waited and holders held on average, as the server counted
/// them since it started (or, in a cluster, since it leads). `baton locks
/// PATH` then shows one of them in full.
#[derive(clap::Args)]
pub struct LocksArgs {
    /// Path of the lock.
    #[arg(conflicts_with = "all")]
    path: Option<String>,

    /// Show the server's locks (as without a path).
    #[arg(long)]
    all: bool,

    /// Print JSON: with a path, an array of contenders (`role`, `kind`,
    /// `token`,
    /// `session`, `node`, `identity`, `liveness`, `silent_ms`,
    /// `expires_in_ms`); without, an array of locks (`lock`, `queue`,
    /// `holders`, `token` (the newest holder's), `grants`, `wait_seconds`,
    /// `holds`, `hold_seconds`, `lock_delay_ms`).
    #[arg(long)]
    json: bool,
}

pub async fn locks(server: &str, args: LocksArgs) -> CliResult {
    let Some(path) = args.path else {
        return busiest(server, args.json).await;
    };
    let (queue, liveness) = crate::commands::with_session(server, async |client| {
        let queue = Lock::new(client, &path).contenders().await?;
        let mut liveness = Vec::with_capacity(queue.len());
        for c in &queue {
            liveness.push(match c.owner {
                Some(owner) => Some(client.session_status(owner).await?),
                None => None,
            });
        }
        Ok((queue, liveness))
    })
    .await?;
    if args.json {
        let contenders: Vec<serde_json::Value> = queue
            .iter()
            .zip(&liveness)
            .map(|(c, status)| {
                serde_json::json!({
                    "role": if c.holds { "holder" } else { "waiter" },
                    "kind": kind(c),
                    "token": c.token.get(),
                    "session": c.owner.map(|o| o.0),
                    "node": c.node,
                    "identity": String::from_utf8_lossy(&c.identity),
                    "liveness": status.map(|s| format!("{:?}", s.liveness).to_lowercase()),
                    "silent_ms": status.map(|s| s.silent_ms),
                    "expires_in_ms": status.and_then(|s| s.expires_in()).map(|d| d.as_millis() as u64),
                })
            })
            .collect();
        println!("{}", serde_json::Value::from(contenders));
        return Ok(ExitCode::SUCCESS);
    }
    if queue.is_empty() {
        println!("{path} is free: no holder, no waiters");
    }
    let mut waiters = 0;
    for (c, status) in queue.iter().zip(&liveness) {
        let role = if c.holds {
            "holder".to_string()
        } else {
            waiters += 1;
            format!("waiter {waiters}")
        };
        let owner = c.owner.map_or_else(|| "-".into(), |o| o.to_string());
        println!(
            "{role:<10} {:<7} token {:<12} session {owner:<10} {}  {}{}",
            kind(c),
            c.token.get(),
            c.node,
            String::from_utf8_lossy(&c.identity),
            match status {
                Some(status) => unhealthy(status),
                // A contender's node owned by no session: a holder whose
                // session expired, kept for the lock's lock-delay.
                None if c.holds => "  [its session expired: the lock-delay keeps the lock until the server deletes this node]".into(),
                None => String::new(),
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What a contender takes: `writer` (a `baton lock` holder or a read-write
/// lock's writer), `reader`, `permit` (of a semaphore) or `candidate` (of an
/// election), as its node's name says.
fn kind(c: &baton_client::recipes::Contender) -> &'static str {
    match c.kind.as_str() {
        "read" => "reader",
        "permit" => "permit",
        "candidate" => "candidate",
        _ => "writer",
    }
}

/// What to add to a contender's line when its session is silent,
/// disconnected, expiring or gone: a holder whose client went quiet still
/// holds the lock until its session expires, and the line must not look
/// healthy meanwhile.
fn unhealthy(status: &baton_client::SessionStatus) -> String {
    use baton_client::Liveness;
    let silent = crate::status::seconds(status.silent_ms as f64 / 1e3);
    let left = status
        .expires_in()
        .map(|d| crate::status::seconds(d.as_secs_f64()))
        .unwrap_or_default();
    match status.liveness {
        // Clients are heard from every third of their timeout: past half of
        // it, this one is paused or cut off without the server knowing yet.
        Liveness::Connected if status.silent_ms * 2 > u64::from(status.timeout_ms) => {
            format!("  [silent for {silent}: expires in {left} unless it is heard from]")
        }
        Liveness::Connected => String::new(),
        Liveness::Disconnected => format!(
            "  [disconnected: silent for {silent}, expires in {left} unless its client resumes it]"
        ),
        Liveness::Expiring => format!("  [expiring: silent for {silent}, past its timeout]"),
        Liveness::Gone => "  [its session is gone; the node goes with it]".into(),
    }
}

/// `baton locks --all`: the busiest locks, from the status probe of the
/// server that serves clients (a cluster's leader: a lock's figures are
/// counted where it is granted).
async fn busiest(servers: &str, json: bool) -> CliResult {
    let limit = std::time::Duration::from_secs(3);
    let mut status = crate::status::probe_any(servers, limit).await?;
    if let (Some("follower"), Some(leader)) = (status["role"].as_str(), status["leader"].as_str()) {
        status = crate::status::probe_any(leader, limit).await?;
    }
    let locks = status["locks"].as_array().cloned().unwrap_or_default();
    if json {
        println!("{}", serde_json::Value::from(locks));
        return Ok(ExitCode::SUCCESS);
    }
    if locks.is_empty() {
        if status["locks_hidden"] == true {
            println!(
                "lock names are hidden: this server checks identities; give the token of one that may read the locks (--token-file FILE or BATON_TOKEN)"
            );
        } else if crate::token().is_some() {
            println!(
                "no lock this identity may read has been granted on this server since it started"
            );
        } else {
            println!("no lock has been granted on this server since it started");
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<40} {:>7} {:>8} {:>12} {:>9} {:>12} {:>12}",
        "lock", "queue", "holders", "token", "grants", "avg wait", "avg hold"
    );
    for l in &locks {
        let n = |k: &str| l[k].as_u64().unwrap_or(0);
        let f = |k: &str| l[k].as_f64().unwrap_or(0.0);
        let average = |total: f64, count: u64| {
            if count == 0 {
                "-".to_string()
            } else {
                crate::status::seconds(total / count as f64)
            }
        };
        let delay = n("lock_delay_ms");
        let name = l["lock"].as_str().unwrap_or("?");
        let name = if delay > 0 {
            format!(
                "{name} (lock-delay {})",
                crate::status::seconds(delay as f64 / 1e3)
            )
        } else {
            name.to_string()
        };
        println!(
            "{:<40} {:>7} {:>8} {:>12} {:>9} {:>12} {:>12}",
            name,
            n("queue"),
            n("holders"),
            l["token"]
                .as_u64()
                .map_or_else(|| "free".to_string(), |t| t.to_string()),
            n("grants"),
            // Waits are counted in milliseconds.
            match average(f("wait_seconds"), n("grants")) {
                w if w == "0 µs" => "< 1 ms".to_string(),
                w => w,
            },
            average(f("hold_seconds"), n("holds")),
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn lock(server: &str, args: LockArgs) -> CliResult {
    let shared = args.shared;
    hold_while(server, &args.hold, "lock", |client, path| {
        let lock = Lock::new(client, path);
        if shared {
            RwLock::new(client, path).reader().clone()
        } else {
            lock
        }
    })
    .await
}

/// Waits for the grant of the lock `make` makes (of `args.path`; `noun`
/// names it in messages), then holds it while `args.command` runs, or
/// until a signal without one.
pub async fn hold_while(
    server: &str,
    args: &HoldArgs,
    noun: &'static str,
    make: impl FnOnce(&Client, &str) -> Lock,
) -> CliResult {
    let requested = Duration::from_millis(args.session_timeout);
    if let (Some(ms), false) = (args.kill_grace, args.command.is_empty()) {
        check_grace(Duration::from_millis(ms), requested)?;
    }
    let mut interrupts = Interrupts::new()?;
    let client = crate::client_builder(server)
        .session_timeout(requested)
        .connect()
        .await
        .map_err(crate::commands::connect_hint)?;
    let lock = make(&client, &args.path);
    let result = lock_with(&client, server, args, (lock, noun), &mut interrupts).await;
    // Every way out ends the session, and the lock's node goes with it.
    client.close().await;
    result
}

async fn lock_with(
    client: &Client,
    server: &str,
    args: &HoldArgs,
    (lock, noun): (Lock, &str),
    interrupts: &mut Interrupts,
) -> CliResult {
    let mut lock = lock.with_identity(identity());
    if let Some(ms) = args.lock_delay {
        lock = lock.lock_delay(Duration::from_millis(ms));
    }
    let grace = granted_grace(client, args.kill_grace, !args.command.is_empty())?;
    if let Some(grace) = grace {
        lock = lock.stop_before(stop_before(grace, client.session_timeout()));
    }
    let acquired = tokio::select! {
        r = async {
            match args.timeout {
                Some(ms) => lock.acquire_timeout(Duration::from_millis(ms)).await,
                None => lock.acquire().await.map(Some),
            }
        } => r?,
        sig = interrupts.recv() => {
            eprintln!("baton: {sig} while waiting for {}; not acquired", args.path);
            return Ok(ExitCode::from(128 + sig.number() as u8));
        }
    };
    let Some(guard) = acquired else {
        eprintln!(
            "baton: timed out after {} ms waiting for {noun} {}",
            args.timeout.unwrap_or_default(),
            args.path
        );
        return Ok(ExitCode::from(EXIT_TIMEOUT));
    };
    let what = format!("the {noun} {}", args.path);
    let Some(grace) = grace else {
        return Ok(hold(&guard, &what, interrupts).await);
    };
    let env = [
        ("BATON_FENCING_TOKEN", guard.token().to_string()),
        ("BATON_LOCK_PATH", guard.node().to_owned()),
        ("BATON_SERVER", server.to_owned()),
    ];
    let run = Run {
        client,
        what: &what,
        command: &args.command,
        env: &env,
        grace,
    };
    run_under(&guard, &run, interrupts).await
}

/// The kill grace for a command (none without one), checked against the
/// session timeout the server granted.
///
/// # Errors
/// If it does not fit (see [`check_grace`]).
pub fn granted_grace(
    client: &Client,
    kill_grace: Option<u64>,
    with_command: bool,
) -> Result<Option<Duration>, CliError> {
    if !with_command {
        return Ok(None);
    }
    let timeout = client.session_timeout();
    let grace = kill_grace.map_or_else(|| default_grace(timeout), Duration::from_millis);
    check_grace(grace, timeout).map_err(|e| {
        CliError::msg(format!(
            "the server granted a session timeout of {} ms: {e}",
            timeout.as_millis()
        ))
    })?;
    Ok(Some(grace))
}
