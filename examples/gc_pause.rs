//! The paused lock holder, for real: why a lock alone cannot protect a write,
//! and how a fencing token does.
//!
//! Worker 1 takes the lock `/locks/record`, checks that its lease is fine,
//! and is about to write `/store/record` when its process freezes (here a
//! real `SIGSTOP`, standing in for a long GC pause or a descheduled VM). The
//! pause falls between the check and the write, so no check could help.
//! While worker 1 is frozen, the Baton server hears nothing from its session,
//! expires it after its 1 s timeout and deletes its lock node; worker 2, who
//! was queued behind it, is granted the lock with a higher fencing token and
//! writes the record. Then worker 1 wakes (`SIGCONT`) and carries on with its
//! write, still believing it holds the lock.
//!
//! The story runs twice:
//!
//! 1. **Fenced.** Every write carries the writer's fencing token
//!    ([`Client::set_data_fenced`]), and the store refuses a token lower than
//!    the highest it has accepted. Worker 1's late write is refused with
//!    `StaleFence`, naming both tokens; the record keeps worker 2's data.
//! 2. **Unfenced.** The same run with plain [`Client::set_data`]: worker 1's
//!    stale write is accepted and silently overwrites worker 2's data. This
//!    is the bug fencing prevents.
//!
//! The store is a node on the same Baton server, reached by each worker over
//! a connection of its own (with a long session timeout), as a database
//! would be: it is a separate system from the lock, so worker 1's connection
//! to it survives the pause even though its lock session does not.
//!
//! Worker 1 is a separate process (this example started again with the
//! arguments `worker <addr> <name> <fenced|unfenced>`) so that it can really
//! be frozen; worker 2 runs in this process, as does the embedded server.
//! Each step is printed on one timeline: milliseconds since the run began,
//! who acted, and what happened.
//!
//! The example checks its own story and exits with status 1 if anything
//! happened otherwise (for instance, if the fenced store accepted the stale
//! write), so it can serve as a test. It needs a Unix system (for `SIGSTOP`)
//! and takes a few seconds:
//!
//! ```text
//! cargo run --example gc_pause
//! ```

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use baton::server::Config;
use baton::{Client, CreateMode, Error, Lock, SessionId};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::time::{sleep, timeout, Instant};

/// The lock both workers take.
mod common;
use common::{report, signal, Embedded, Signal, Timeline};

const LOCK: &str = "/locks/record";
/// The record the lock protects.
const RECORD: &str = "/store/record";
/// Worker 1's lock session timeout: how long a pause it survives.
const LOCK_SESSION: Duration = Duration::from_millis(1_000);
/// Session timeout of the connections to the store (not to be lost in a pause).
const STORE_SESSION: Duration = Duration::from_secs(30);
/// Longest wait for any one step of the story.
const STEP_LIMIT: Duration = Duration::from_secs(10);
/// Longest a whole run may take.
const RUN_LIMIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Fenced,
    Unfenced,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Fenced => "fenced",
            Mode::Unfenced => "unfenced",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "fenced" => Some(Mode::Fenced),
            "unfenced" => Some(Mode::Unfenced),
            _ => None,
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.first().map(String::as_str) {
        Some("worker") => {
            let [_, addr, name, mode] = args.as_slice() else {
                eprintln!("usage: gc_pause worker <addr> <name> <fenced|unfenced>");
                return ExitCode::from(2);
            };
            let Some(mode) = Mode::parse(mode) else {
                eprintln!("unknown mode {mode:?}: expected fenced or unfenced");
                return ExitCode::from(2);
            };
            match runtime.block_on(worker(addr, name, mode)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    // The parent reports this; say why on stderr too.
                    eprintln!("{name}: {e}");
                    report("failed", &e);
                    ExitCode::FAILURE
                }
            }
        }
        None => match runtime.block_on(story()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                println!();
                println!("FAILED: {e}");
                ExitCode::FAILURE
            }
        },
        Some(other) => {
            eprintln!("unexpected argument {other:?}; run without arguments");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------
// The story, told by the parent process.
// ---------------------------------------------------------------------------

async fn story() -> Result<(), String> {
    println!("The paused lock holder: worker 1 freezes between checking its lease and writing.");
    let mut outcomes = Vec::new();
    for (n, mode) in [Mode::Fenced, Mode::Unfenced].into_iter().enumerate() {
        println!();
        match mode {
            Mode::Fenced => println!(
                "=== Run {}: the store checks fencing tokens (set_data_fenced) ===",
                n + 1
            ),
            Mode::Unfenced => println!(
                "=== Run {}: the same, with plain unfenced writes (set_data) ===",
                n + 1
            ),
        }
        let outcome = timeout(RUN_LIMIT, run(mode))
            .await
            .map_err(|_| format!("the {} run took longer than {RUN_LIMIT:?}", mode.arg()))??;
        outcomes.push(outcome);
    }
    println!();
    println!("=== Summary ===");
    for line in outcomes {
        println!("{line}");
    }
    println!("Both runs happened as told: fencing tokens stop the paused holder; without them its stale write wins.");
    Ok(())
}

/// One run of the story; returns its one-line summary.
async fn run(mode: Mode) -> Result<String, String> {
    let t = Timeline::new();
    let server = Embedded::start(Config {
        // Sessions of one second, shorter than the server's default floor.
        min_session_timeout: Duration::from_millis(100),
        ..Config::default()
    })
    .await?;
    t.say(
        "server",
        format!(
            "Baton listening on {} (session timeouts from 100 ms allowed)",
            server.addr
        ),
    );

    // The store, and worker 2's connection to it.
    let store = Client::builder(&server.addr)
        .session_timeout(STORE_SESSION)
        .connect()
        .await
        .map_err(|e| format!("connecting to the store: {e}"))?;
    store
        .create("/store", "", CreateMode::Persistent)
        .await
        .map_err(|e| format!("creating /store: {e}"))?;
    store
        .create(RECORD, "initial", CreateMode::Persistent)
        .await
        .map_err(|e| format!("creating {RECORD}: {e}"))?;
    t.say("store", format!("{RECORD} = \"initial\""));

    // Worker 1, in a process of its own. Dropping `child` kills it, also
    // while it is stopped: every early return below cleans up.
    let exe = std::env::current_exe().map_err(|e| format!("locating this program: {e}"))?;
    let mut child = Command::new(exe)
        .args(["worker", &server.addr, "worker 1", mode.arg()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting worker 1: {e}"))?;
    let pid = child
        .id()
        .ok_or("worker 1 exited before it could be watched")?;
    let mut w1 = WorkerLink {
        lines: BufReader::new(child.stdout.take().ok_or("no stdout pipe to worker 1")?).lines(),
        stdin: child.stdin.take().ok_or("no stdin pipe to worker 1")?,
    };

    let connected = w1.expect("connected").await?;
    let (w1_session, w1_timeout) = parse_pair(&connected)?;
    let w1_session = SessionId(w1_session);
    t.say(
        "worker 1",
        format!("process {pid} connected: session {w1_session}, timeout {w1_timeout} ms"),
    );
    let token1: u64 = parse(&w1.expect("granted").await?)?;
    t.say(
        "worker 1",
        format!("acquired {LOCK} with fencing token {token1}"),
    );
    let checked = w1.expect("checked").await?;
    let (held, ahead) = checked
        .split_once(' ')
        .ok_or_else(|| format!("bad lease check report {checked:?}"))?;
    if held != "held" {
        return Err(format!(
            "worker 1's lease was already lost at its check ({checked})"
        ));
    }
    t.say(
        "worker 1",
        format!("checks its lease: held (is_lost() == false, session deadline in {ahead} ms)"),
    );
    w1.expect("about-to-write").await?;
    let data1 = worker_data("worker 1", token1);
    t.say(
        "worker 1",
        format!("about to write \"{data1}\" to {RECORD} ..."),
    );

    // The pause falls between the check and the write.
    signal(pid, Signal::Stop)?;
    let frozen_at = Instant::now();
    t.say(
        "os",
        "SIGSTOP worker 1: frozen mid-step (a GC pause), no heartbeats",
    );

    // Worker 2 wants the lock too and queues behind the frozen holder.
    let expired_before = server.handle.stats().sessions_expired;
    let w2 = Client::builder(&server.addr)
        .session_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("connecting worker 2: {e}"))?;
    let lock2 = Lock::new(&w2, LOCK).with_identity("worker 2");
    let observer = lock2.clone();
    let mut acquiring = tokio::spawn(async move { lock2.acquire().await });
    t.say("worker 2", format!("wants {LOCK}: joins the queue"));
    let queue = poll_until("worker 2 to join the queue", || async {
        let queue = observer.contenders().await.ok()?;
        queue
            .iter()
            .any(|c| c.owner == Some(w2.session_id()))
            .then_some(queue)
    })
    .await?;
    let described: Vec<String> = queue
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let who = String::from_utf8_lossy(&c.identity);
            let role = if i == 0 { "holds it" } else { "waits" };
            format!("{who} (token {}) {role}", c.token)
        })
        .collect();
    t.say("lock", format!("queue: {}", described.join(", ")));

    // Nothing is heard from worker 1: the server expires its session.
    poll_until("the server to expire worker 1's session", || async {
        (server.handle.stats().sessions_expired > expired_before).then_some(())
    })
    .await?;
    t.say(
        "server",
        format!(
            "expired worker 1's session {w1_session} after {} ms of silence: its lock node is deleted",
            frozen_at.elapsed().as_millis()
        ),
    );

    let guard2 = timeout(STEP_LIMIT, &mut acquiring)
        .await
        .map_err(|_| "worker 2 was not granted the lock after worker 1's session expired")?
        .map_err(|e| format!("worker 2's acquire task failed: {e}"))?
        .map_err(|e| format!("worker 2's acquire failed: {e}"))?;
    let token2 = guard2.token().get();
    t.say(
        "worker 2",
        format!("granted {LOCK} with fencing token {token2} (worker 1 had {token1})"),
    );
    if token2 <= token1 {
        return Err(format!(
            "worker 2's token {token2} is not greater than worker 1's {token1}"
        ));
    }
    let queue = observer
        .contenders()
        .await
        .map_err(|e| format!("listing the queue: {e}"))?;
    if queue.iter().any(|c| c.owner == Some(w1_session)) {
        return Err("worker 1's lock node is still queued after its session expired".into());
    }

    let data2 = worker_data("worker 2", token2);
    let written = match mode {
        Mode::Fenced => store.set_data_fenced(RECORD, data2.clone(), token2).await,
        Mode::Unfenced => store.set_data(RECORD, data2.clone(), None).await,
    };
    written.map_err(|e| format!("worker 2's write failed: {e}"))?;
    let how = match mode {
        Mode::Fenced => format!("with token {token2}"),
        Mode::Unfenced => "unfenced".to_owned(),
    };
    t.say(
        "worker 2",
        format!("writes \"{data2}\" to {RECORD} {how}: accepted"),
    );

    // Worker 1 wakes and goes on with its write, without looking again.
    w1.send("go").await?;
    signal(pid, Signal::Continue)?;
    t.say(
        "os",
        format!(
            "SIGCONT worker 1 after {} ms frozen: it resumes right at its write",
            frozen_at.elapsed().as_millis()
        ),
    );
    let (verdict, detail) = w1.next().await?;
    if verdict != "refused" && verdict != "accepted" {
        return Err(format!("worker 1's write failed: {verdict} {detail}"));
    }
    let lease = w1.expect("lease").await?;
    let status = timeout(STEP_LIMIT, child.wait())
        .await
        .map_err(|_| "worker 1 did not exit after its write")?
        .map_err(|e| format!("waiting for worker 1: {e}"))?;

    let how = match mode {
        Mode::Fenced => format!("with its old token {token1}"),
        Mode::Unfenced => "unfenced".to_owned(),
    };
    if verdict == "refused" {
        t.say(
            "worker 1",
            format!("writes \"{data1}\" {how}: REFUSED: {detail}"),
        );
    } else {
        t.say(
            "worker 1",
            format!("writes \"{data1}\" {how}: accepted (record version {detail})"),
        );
    }
    t.say(
        "worker 1",
        format!("(only now does its lease check say: {lease})"),
    );
    if !status.success() {
        return Err(format!("worker 1 exited with {status}"));
    }
    if !lease.starts_with("lost") {
        return Err(format!(
            "after the pause worker 1's lease should read as lost, but reads {lease:?}"
        ));
    }

    let (record, _) = store
        .get_data(RECORD)
        .await
        .map_err(|e| format!("reading {RECORD}: {e}"))?;
    let record = String::from_utf8_lossy(&record).into_owned();
    t.say("store", format!("{RECORD} = \"{record}\""));

    // Did the story happen as told?
    let summary = match mode {
        Mode::Fenced => {
            if verdict != "refused" {
                return Err(format!(
                    "the fenced store ACCEPTED worker 1's write with stale token {token1} \
                     after token {token2} was accepted"
                ));
            }
            if !(detail.contains(&token1.to_string()) && detail.contains(&token2.to_string())) {
                return Err(format!(
                    "the refusal does not name both tokens {token1} and {token2}: {detail}"
                ));
            }
            if record != data2 {
                return Err(format!(
                    "the record should hold worker 2's data \"{data2}\", but holds \"{record}\""
                ));
            }
            t.say(
                "check",
                "OK: the stale write was refused; the record keeps worker 2's data",
            );
            format!(
                "fenced:   worker 1's write with token {token1} was refused; record = \"{record}\""
            )
        }
        Mode::Unfenced => {
            if verdict != "accepted" {
                return Err(format!(
                    "the unfenced write was expected to go through, but: {detail}"
                ));
            }
            if record != data1 {
                return Err(format!(
                    "the record should hold worker 1's stale data \"{data1}\", but holds \"{record}\""
                ));
            }
            t.say(
                "check",
                "BUG (what fencing prevents): worker 1's stale write silently won; \
                 worker 2's update is lost",
            );
            format!(
                "unfenced: worker 1's stale write overwrote worker 2's; record = \"{record}\" (lost update)"
            )
        }
    };

    guard2
        .release()
        .await
        .map_err(|e| format!("worker 2 releasing the lock: {e}"))?;
    w2.close().await;
    store.close().await;
    server.stop().await;
    Ok(summary)
}

fn worker_data(name: &str, token: u64) -> String {
    format!("written by {name} holding token {token}")
}

/// The parent's end of the pipes to worker 1.
struct WorkerLink {
    lines: Lines<BufReader<ChildStdout>>,
    stdin: ChildStdin,
}

impl WorkerLink {
    /// The next report: its kind and the rest of the line.
    async fn next(&mut self) -> Result<(String, String), String> {
        let line = timeout(STEP_LIMIT, self.lines.next_line())
            .await
            .map_err(|_| format!("worker 1 reported nothing for {STEP_LIMIT:?}"))?
            .map_err(|e| format!("reading from worker 1: {e}"))?
            .ok_or("worker 1 exited early")?;
        let (kind, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        Ok((kind.to_owned(), rest.to_owned()))
    }

    /// The next report, which must be of `kind`.
    async fn expect(&mut self, kind: &str) -> Result<String, String> {
        let (got, rest) = self.next().await?;
        if got == kind {
            Ok(rest)
        } else if got == "failed" {
            Err(format!("worker 1 failed: {rest}"))
        } else {
            Err(format!("expected {kind} from worker 1, got {got} {rest}"))
        }
    }

    async fn send(&mut self, line: &str) -> Result<(), String> {
        let sent = async {
            self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
            self.stdin.flush().await
        };
        sent.await.map_err(|e| format!("writing to worker 1: {e}"))
    }
}

fn parse<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("unexpected report from worker 1: {s:?}"))
}

fn parse_pair(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(' ')
        .ok_or_else(|| format!("unexpected report from worker 1: {s:?}"))?;
    Ok((parse(a)?, parse(b)?))
}

/// Polls `check` until it gives a value, for at most [`STEP_LIMIT`].
async fn poll_until<T, F, Fut>(what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + STEP_LIMIT;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {STEP_LIMIT:?} waiting for {what}"));
        }
        sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------
// Worker 1, in its own process. It reports each step as one line on stdout
// (`<kind> <details>`) and waits for "go" on stdin before its write.
// ---------------------------------------------------------------------------

async fn worker(addr: &str, name: &str, mode: Mode) -> Result<(), String> {
    // If the parent dies, so does this worker (even while stopped).
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }

    let lock_client = Client::builder(addr)
        .session_timeout(LOCK_SESSION)
        .connect()
        .await
        .map_err(|e| format!("connecting to the lock service: {e}"))?;
    let store = Client::builder(addr)
        .session_timeout(STORE_SESSION)
        .connect()
        .await
        .map_err(|e| format!("connecting to the store: {e}"))?;
    report(
        "connected",
        format!(
            "{} {}",
            lock_client.session_id().0,
            lock_client.session_timeout().as_millis()
        ),
    );

    let guard = Lock::new(&lock_client, LOCK)
        .with_identity(name.to_owned())
        .acquire()
        .await
        .map_err(|e| format!("acquiring {LOCK}: {e}"))?;
    let token = guard.token().get();
    report("granted", token);

    // The check: is the lease still good?
    let ahead = lock_client
        .session_deadline()
        .saturating_duration_since(Instant::now())
        .as_millis();
    let held = if guard.is_lost() { "lost" } else { "held" };
    report("checked", format!("{held} {ahead}"));
    if guard.is_lost() {
        return Err("the lease was lost right after the grant".into());
    }

    // ... and the write, after a pause that nobody sees coming.
    report("about-to-write", "");
    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| format!("reading stdin: {e}"))?;
    match go {
        Ok(line) if line.trim() == "go" => {}
        other => return Err(format!("expected \"go\" on stdin, got {other:?}")),
    }
    let data = worker_data(name, token);
    let written = match mode {
        Mode::Fenced => store.set_data_fenced(RECORD, data, token).await,
        Mode::Unfenced => store.set_data(RECORD, data, None).await,
    };
    match written {
        Ok(stat) => report("accepted", stat.version),
        Err(Error::StaleFence(message)) => report("refused", message),
        Err(e) => return Err(format!("writing {RECORD}: {e}")),
    }

    // Had it looked now, it would have known.
    let lease = match guard.state() {
        baton::recipes::LeaseState::Lost(reason) => format!("lost ({reason})"),
        other => format!("{other:?}"),
    };
    report("lease", lease);

    drop(guard);
    store.close().await;
    lock_client.close().await;
    Ok(())
}
