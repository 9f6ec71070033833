//! Active/standby master failover, HBase style: three master processes, one
//! election, one fenced record, and a frozen active master.
//!
//! Three master processes campaign in the election `/election/master` (a
//! [`baton::Election`]), each with its name as its value and a 1 s session
//! timeout. The winner is the active master: its epoch is its leadership's
//! fencing token, and every 100 ms it writes a heartbeat record such as
//! `master-1 epoch 7 heartbeat 3` to `/hbase/master-record` with
//! [`Client::set_data_fenced`], presenting its epoch. The record refuses an
//! epoch lower than the highest it has accepted. The other two masters are
//! standbys, waiting in `campaign()` in the order they joined.
//!
//! Then the operator (this process) freezes the active master with a real
//! `SIGSTOP`, as a long GC pause would, at the worst moment: after the master
//! has checked that it still leads and just before its next heartbeat write.
//! (The master announces that write and waits for the operator's word, so that
//! the freeze lands there on every run. Anywhere else, the frozen master would
//! see on waking that its leadership is lost and never write at all.) Its
//! election session goes silent, the server expires it after its timeout and
//! deletes its candidate node, and the standby that has waited longest wins:
//! its `campaign()` returns with a higher epoch and its first heartbeat is
//! accepted. The operator prints the FAILOVER TIME, from the `SIGSTOP` to the
//! moment the new master's report of its first accepted heartbeat reaches the
//! operator (so, if anything, slightly more than the real time). It is
//! usually less than the session timeout: the server counts the timeout from
//! when it last heard from the session (an idle client pings every third of
//! it), not from the freeze. The session deadline the frozen master reported
//! just before the freeze says when the expiry was due.
//!
//! After 1.5 s, well past the session timeout, the operator thaws the old
//! master (`SIGCONT`). It resumes right at the
//! write it was about to make, still carrying its old epoch, and the record
//! REJECTS it with `StaleFence`, naming both epochs. Only then does it look at
//! its leadership, finds it lost ([`baton::Leadership::lost`]), steps down and
//! exits, as an HBase master aborts when it loses its session (a restarted
//! one would join again as a standby).
//!
//! The record is a node on the same Baton server, but each master writes it
//! over a connection of its own with a long session timeout, as it would a
//! database: the frozen master's election session has expired, but its store
//! connection survives, so its late write really reaches the fencing check.
//!
//! What to look at in the output (one timeline: milliseconds since the start,
//! who, what): the epochs of the two active masters; the FAILOVER TIME,
//! against the 1 s session timeout; the REJECTED line; and the closing checks.
//! The example verifies its own story and exits with status 1 if anything
//! happened otherwise: the new epoch must be higher, the stale heartbeat
//! refused, the record left with the new master's data, and the epochs of the
//! accepted heartbeats, in the store's own order, must never decrease (one
//! active master at a time). Each master is this program started again with
//! the arguments `master <addr> <name>`; all of them are stopped before it
//! ends, and killed if anything fails. It needs a Unix system (for
//! `SIGSTOP`) and takes a few seconds:
//!
//! ```text
//! cargo run --example master_failover
//! ```

use std::collections::HashSet;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use baton::server::{Config, ServerHandle};
use baton::{Client, CreateMode, Election, Error, Leadership, Lock, SessionId};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant, MissedTickBehavior};

/// The election the masters campaign in.
mod common;
use common::{report, signal, Embedded, Signal, Timeline};

const ELECTION: &str = "/election/master";
/// The record the active master heartbeats to, fenced by its epoch.
const RECORD: &str = "/hbase/master-record";
/// The masters' election session timeout: how long a freeze they survive.
const MASTER_SESSION: Duration = Duration::from_millis(1_000);
/// How long the operator keeps the active master frozen, at least.
const FREEZE: Duration = Duration::from_millis(1_500);
/// Session timeout of the connections to the store (not lost in a freeze).
const STORE_SESSION: Duration = Duration::from_secs(30);
/// How often the active master writes its heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(100);
/// Longest wait for any one step of the story.
const STEP_LIMIT: Duration = Duration::from_secs(10);
/// Longest the whole story may take.
const RUN_LIMIT: Duration = Duration::from_secs(30);

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
        Some("master") => {
            let [_, addr, name] = args.as_slice() else {
                eprintln!("usage: master_failover master <addr> <name>");
                return ExitCode::from(2);
            };
            match runtime.block_on(master(addr, name)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{name}: {e}");
                    report("failed", &e);
                    ExitCode::FAILURE
                }
            }
        }
        None => match runtime.block_on(async {
            let mut masters = Vec::new();
            let told = timeout(RUN_LIMIT, story(&mut masters)).await;
            // Whatever happened, no master outlives the story.
            for m in &mut masters {
                m.kill().await;
            }
            told
        }) {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) => {
                println!("\nFAILED: {e}");
                ExitCode::FAILURE
            }
            Err(_) => {
                println!("\nFAILED: the story took longer than {RUN_LIMIT:?}");
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
// The story, told by the operator (the parent process).
// ---------------------------------------------------------------------------

async fn story(masters: &mut Vec<Master>) -> Result<(), String> {
    println!(
        "Master failover: three masters, one election, a fenced record, a frozen active master."
    );
    let t = Timeline::new();
    let server = Embedded::start(Config {
        // Sessions of one second, shorter than the server's default floor.
        min_session_timeout: Duration::from_millis(100),
        ..Config::default()
    })
    .await?;
    t.say("server", format!("Baton listening on {}", server.addr));

    // The operator's own connection: to set up and read the record, and to
    // look at the election as region servers and clients would.
    let ops = Client::builder(&server.addr)
        .session_timeout(STORE_SESSION)
        .connect()
        .await
        .map_err(|e| format!("connecting the operator: {e}"))?;
    for (path, data) in [("/hbase", ""), (RECORD, "no master yet")] {
        ops.create(path, data, CreateMode::Persistent)
            .await
            .map_err(|e| format!("creating {path}: {e}"))?;
    }
    t.say(
        "store",
        format!("{RECORD} created; masters write it with set_data_fenced(epoch)"),
    );

    let (tx, rx) = mpsc::unbounded_channel();
    let mut op = Operator {
        t,
        server: server.handle.clone(),
        events: rx,
        log: Vec::new(),
        may_exit: HashSet::new(),
        expired: server.handle.stats().sessions_expired,
        frozen_at: None,
    };
    let exe = std::env::current_exe().map_err(|e| format!("locating this program: {e}"))?;

    // master-1 starts first and leads; the others queue behind it in order.
    masters.push(spawn_master(&exe, &server.addr, "master-1", &tx)?);
    let epoch1: u64 = parse(&op.wait_report("master-1", "active").await?.rest)?;
    let m1_session = SessionId(parse(first_field(
        &op.wait_report("master-1", "connected").await?.rest,
    ))?);
    masters.push(spawn_master(&exe, &server.addr, "master-2", &tx)?);
    op.wait_report("master-2", "standby").await?;
    masters.push(spawn_master(&exe, &server.addr, "master-3", &tx)?);
    op.wait_report("master-3", "standby").await?;
    op.wait("master-1's third heartbeat", |op| {
        (op.heartbeats("master-1").len() >= 3).then_some(())
    })
    .await?;

    // Freeze the active master between its lease check and its write.
    op.t.say(
        "operator",
        format!(
            "freezes master-1 at its next heartbeat, for longer than its {} ms session timeout",
            MASTER_SESSION.as_millis()
        ),
    );
    let m1_pid = masters[0].pid;
    masters[0].send("freeze-next").await?;
    let about = op.wait_report("master-1", "about-to-write").await?;
    let (ahead, stale_record) = about
        .rest
        .split_once(' ')
        .map(|(ahead, record)| (ahead.to_owned(), record.to_owned()))
        .ok_or_else(|| format!("bad report from master-1: {about:?}"))?;
    signal(m1_pid, Signal::Stop)?;
    let frozen_at = Instant::now();
    op.frozen_at = Some(frozen_at);
    op.t.say(
        "os",
        format!(
            "SIGSTOP master-1 (process {}): frozen mid-step, like a long GC pause; its sessions go silent",
            m1_pid
        ),
    );

    // A standby takes over.
    let (new_name, active) = op
        .wait("a standby to take over", |op| {
            ["master-2", "master-3"]
                .into_iter()
                .find_map(|name| op.find(name, "active").map(|e| (name, e)))
        })
        .await?;
    if new_name != "master-2" {
        return Err(format!(
            "{new_name} took over, but master-2 had waited longer and should have"
        ));
    }
    let epoch2: u64 = parse(&active.rest)?;
    if epoch2 <= epoch1 {
        return Err(format!(
            "the new epoch {epoch2} is not greater than the old epoch {epoch1}"
        ));
    }
    let first = op
        .wait("master-2's first accepted heartbeat", |op| {
            op.heartbeats("master-2").first().cloned()
        })
        .await?;
    let failover = first.at.saturating_duration_since(frozen_at);
    op.t.say(
        "operator",
        format!(
            "FAILOVER TIME: {} ms from the freeze to master-2's first accepted heartbeat, \
             epoch {epoch1} -> {epoch2}",
            failover.as_millis(),
        ),
    );
    op.t.say(
        "operator",
        format!(
            "(the server counts the {} ms session timeout from when it last heard from \
             master-1's session: its deadline was {ahead} ms away at its check, just before the freeze)",
            MASTER_SESSION.as_millis()
        ),
    );

    // What everyone else now sees.
    let leader = Election::new(&ops, ELECTION)
        .leader()
        .await
        .map_err(|e| format!("asking for the leader: {e}"))?
        .ok_or("the election reports no leader after the failover")?;
    let value = String::from_utf8_lossy(&leader.value).into_owned();
    if leader.token.get() != epoch2 || !value.starts_with("master-2") {
        return Err(format!(
            "the election reports {value:?} with epoch {} as leader, not master-2 with {epoch2}",
            leader.token
        ));
    }
    let queue = Lock::new(&ops, ELECTION)
        .contenders()
        .await
        .map_err(|e| format!("listing the candidates: {e}"))?;
    if queue.iter().any(|c| c.owner == Some(m1_session)) {
        return Err("master-1's candidate node is still there after the failover".into());
    }
    let queue: Vec<String> = queue
        .iter()
        .map(|c| format!("{} ({})", String::from_utf8_lossy(&c.identity), c.token))
        .collect();
    op.t.say(
        "election",
        format!(
            "leader(): \"{value}\", epoch {}; candidates now: {}",
            leader.token,
            queue.join(", ")
        ),
    );

    // Thaw the old master, well past its session timeout: it goes on with
    // its write, with its old epoch.
    op.wait("the freeze to outlast the session timeout", |op| {
        (frozen_at.elapsed() >= FREEZE && op.heartbeats("master-2").len() >= 3).then_some(())
    })
    .await?;
    masters[0].send("go").await?;
    signal(m1_pid, Signal::Continue)?;
    op.t.say(
        "os",
        format!(
            "SIGCONT master-1 after {} ms frozen: it resumes right at its write, epoch {epoch1}",
            frozen_at.elapsed().as_millis()
        ),
    );
    let refusal = op
        .wait("master-1's late heartbeat to be answered", |op| {
            let accepted = op.heartbeats("master-1").iter().any(|h| h.record == stale_record);
            if accepted {
                Some(Err(()))
            } else {
                op.find("master-1", "refused").map(Ok)
            }
        })
        .await?
        .map_err(|()| {
            format!("the record ACCEPTED master-1's stale heartbeat \"{stale_record}\" (epoch {epoch1} after {epoch2})")
        })?;
    op.may_exit.insert("master-1".into());
    op.wait_report("master-1", "stepped-down").await?;
    op.wait_report("master-1", "exited").await?;
    masters[0].exited().await?;
    let refused_at = op.log.len();

    // The new master carries on; then the operator shuts everything down:
    // the standby first, so that nobody takes over when master-2 resigns.
    op.wait("two more heartbeats from master-2", |op| {
        let later = op.log[refused_at..]
            .iter()
            .filter(|e| e.who == "master-2" && e.kind == "accepted")
            .count();
        (later >= 2).then_some(())
    })
    .await?;
    op.t.say("operator", "stops master-3, then master-2");
    for m in [2, 1] {
        let m = &mut masters[m];
        op.may_exit.insert(m.name.clone());
        m.send("stop").await?;
        op.wait_report(&m.name, "exited").await?;
        m.exited().await?;
    }

    // Did the story happen as told?
    let (data, _) = ops
        .get_data(RECORD)
        .await
        .map_err(|e| format!("reading {RECORD}: {e}"))?;
    let record = String::from_utf8_lossy(&data).into_owned();
    op.t.say("store", format!("{RECORD} = \"{record}\""));
    let message = refusal.rest.split_once(' ').map_or("", |(_, m)| m);
    if !(message.contains(&epoch1.to_string()) && message.contains(&epoch2.to_string())) {
        return Err(format!(
            "the refusal does not name both epochs {epoch1} and {epoch2}: {message}"
        ));
    }
    let mut accepted = op.heartbeats_all();
    accepted.sort_by_key(|h| h.revision);
    let last = accepted.last().ok_or("no heartbeat was accepted")?;
    if last.who != "master-2" || record != last.record {
        return Err(format!(
            "the record should hold master-2's last heartbeat \"{}\" (by {}), but holds \"{record}\"",
            last.record, last.who
        ));
    }
    if let Some(w) = accepted.windows(2).find(|w| w[1].epoch < w[0].epoch) {
        return Err(format!(
            "epochs went backwards in the store: \"{}\" was accepted after \"{}\"",
            w[1].record, w[0].record
        ));
    }
    if accepted.iter().any(|h| h.who == "master-3") {
        return Err("master-3 wrote a heartbeat, but it should never have led".into());
    }
    let count = |epoch| accepted.iter().filter(|h| h.epoch == epoch).count();
    for line in [
        format!("OK: the new epoch {epoch2} is greater than the old {epoch1}"),
        format!("OK: master-1's late heartbeat with epoch {epoch1} was rejected as stale"),
        "OK: the record holds master-2's last heartbeat".to_owned(),
        format!(
            "OK: one active master at a time: in the store's order, {} heartbeats with epoch \
             {epoch1}, then {} with epoch {epoch2}, never back",
            count(epoch1),
            count(epoch2)
        ),
    ] {
        op.t.say("check", line);
    }
    ops.close().await;
    server.stop().await;
    println!(
        "\nFailover in {} ms; the frozen master's late heartbeat was fenced off.",
        failover.as_millis()
    );
    Ok(())
}

/// One line a master reported, and when it arrived.
#[derive(Clone, Debug)]
struct Event {
    who: String,
    at: Instant,
    kind: String,
    rest: String,
}

/// An accepted heartbeat, as its master reported it.
#[derive(Clone, Debug)]
struct Heartbeat {
    who: String,
    at: Instant,
    epoch: u64,
    /// The store's revision of the write: the order the store applied them.
    revision: u64,
    record: String,
}

/// The operator's view: every report from the masters, printed as it
/// arrives, and the server's count of expired sessions.
struct Operator {
    t: Timeline,
    server: ServerHandle,
    events: mpsc::UnboundedReceiver<Event>,
    log: Vec<Event>,
    /// Masters whose exit is expected from now on.
    may_exit: HashSet<String>,
    expired: u64,
    frozen_at: Option<Instant>,
}

impl Operator {
    /// Handles reports until `done` gives a value, for at most [`STEP_LIMIT`].
    async fn wait<T>(
        &mut self,
        what: &str,
        mut done: impl FnMut(&Self) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + STEP_LIMIT;
        loop {
            if let Some(value) = done(self) {
                return Ok(value);
            }
            if Instant::now() >= deadline {
                return Err(format!("timed out after {STEP_LIMIT:?} waiting for {what}"));
            }
            tokio::select! {
                event = self.events.recv() => self.note(event.ok_or("the masters' reports stopped")?)?,
                () = sleep(Duration::from_millis(2)) => self.check_expiry(),
            }
        }
    }

    async fn wait_report(&mut self, who: &str, kind: &str) -> Result<Event, String> {
        self.wait(&format!("{who} to report {kind}"), |op| op.find(who, kind))
            .await
    }

    fn find(&self, who: &str, kind: &str) -> Option<Event> {
        self.log
            .iter()
            .find(|e| e.who == who && e.kind == kind)
            .cloned()
    }

    fn heartbeats_all(&self) -> Vec<Heartbeat> {
        self.log
            .iter()
            .filter(|e| e.kind == "accepted")
            .filter_map(|e| {
                let mut fields = e.rest.splitn(3, ' ');
                Some(Heartbeat {
                    who: e.who.clone(),
                    at: e.at,
                    epoch: fields.next()?.parse().ok()?,
                    revision: fields.next()?.parse().ok()?,
                    record: fields.next()?.to_owned(),
                })
            })
            .collect()
    }

    fn heartbeats(&self, who: &str) -> Vec<Heartbeat> {
        let mut all = self.heartbeats_all();
        all.retain(|h| h.who == who);
        all
    }

    /// Says so when the server has expired a session since the last look.
    fn check_expiry(&mut self) {
        let expired = self.server.stats().sessions_expired;
        if expired > self.expired {
            self.expired = expired;
            let after = self
                .frozen_at
                .map(|f| format!(" {} ms after the freeze", f.elapsed().as_millis()))
                .unwrap_or_default();
            self.t.say(
                "server",
                format!("expired a silent session{after}: its candidate node is deleted"),
            );
        }
    }

    /// Prints one report and keeps it.
    fn note(&mut self, event: Event) -> Result<(), String> {
        // An expiry that happened before this report is printed before it.
        self.check_expiry();
        let rest = event.rest.as_str();
        let what = match event.kind.as_str() {
            "connected" => {
                let fields: Vec<&str> = rest.split(' ').collect();
                let [session, timeout_ms, pid] = fields.as_slice() else {
                    return Err(format!("bad report from {}: {rest:?}", event.who));
                };
                let session = SessionId(parse(session)?);
                format!(
                    "process {pid} up: election session {session} (timeout {timeout_ms} ms); campaigns"
                )
            }
            "standby" => format!("standby: waiting in campaign() behind the leader {rest}"),
            "active" => format!("ACTIVE MASTER: its campaign() returned with epoch {rest}"),
            "accepted" => {
                let record = rest.splitn(3, ' ').nth(2).unwrap_or(rest);
                format!("heartbeat accepted: \"{record}\"")
            }
            "about-to-write" => {
                let (ahead, record) = rest.split_once(' ').unwrap_or((rest, ""));
                format!(
                    "checks its leadership: held (session deadline in {ahead} ms); \
                     about to write \"{record}\" ..."
                )
            }
            "refused" => {
                let (epoch, message) = rest.split_once(' ').unwrap_or((rest, ""));
                format!("its heartbeat with epoch {epoch} is REJECTED: StaleFence: {message}")
            }
            "stepped-down" => format!("steps down: leadership lost ({rest}); exits"),
            "stopped" => rest.to_owned(),
            "failed" => return Err(format!("{} failed: {rest}", event.who)),
            "exited" if self.may_exit.contains(&event.who) => {
                self.log.push(event);
                return Ok(());
            }
            "exited" => return Err(format!("{} exited unexpectedly", event.who)),
            other => {
                return Err(format!(
                    "unexpected report from {}: {other} {rest}",
                    event.who
                ))
            }
        };
        self.t.say(&event.who, what);
        self.log.push(event);
        Ok(())
    }
}

/// A master process. Dropping it kills the process, also while stopped.
struct Master {
    name: String,
    pid: u32,
    child: Child,
    stdin: ChildStdin,
}

fn spawn_master(
    exe: &Path,
    addr: &str,
    name: &str,
    events: &mpsc::UnboundedSender<Event>,
) -> Result<Master, String> {
    let mut child = Command::new(exe)
        .args(["master", addr, name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting {name}: {e}"))?;
    let pid = child.id().ok_or_else(|| format!("{name} exited at once"))?;
    let stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let stdin = child.stdin.take().ok_or("no stdin pipe")?;
    let (who, events) = (name.to_owned(), events.clone());
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let event = |kind: &str, rest: &str| Event {
            who: who.clone(),
            at: Instant::now(),
            kind: kind.to_owned(),
            rest: rest.to_owned(),
        };
        while let Ok(Some(line)) = lines.next_line().await {
            let (kind, rest) = line.split_once(' ').unwrap_or((&line, ""));
            let _ = events.send(event(kind, rest));
        }
        let _ = events.send(event("exited", ""));
    });
    Ok(Master {
        name: name.to_owned(),
        pid,
        child,
        stdin,
    })
}

impl Master {
    async fn send(&mut self, line: &str) -> Result<(), String> {
        let sent = async {
            self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
            self.stdin.flush().await
        };
        sent.await
            .map_err(|e| format!("writing to {}: {e}", self.name))
    }

    /// Kills the process (if still running) and reaps it.
    async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = timeout(Duration::from_secs(5), self.child.wait()).await;
    }

    /// Waits for the process to end, which it must do successfully.
    async fn exited(&mut self) -> Result<(), String> {
        let status = timeout(STEP_LIMIT, self.child.wait())
            .await
            .map_err(|_| format!("{} did not exit", self.name))?
            .map_err(|e| format!("waiting for {}: {e}", self.name))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{} exited with {status}", self.name))
        }
    }
}

fn parse<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("unexpected report: {s:?}"))
}

fn first_field(s: &str) -> &str {
    s.split(' ').next().unwrap_or(s)
}

// ---------------------------------------------------------------------------
// A master, in its own process. It reports each step as one line on stdout
// (`<kind> <details>`) and takes commands on stdin: `freeze-next` (announce
// the next heartbeat write and wait for `go` before making it), `stop`.
// ---------------------------------------------------------------------------

async fn master(addr: &str, name: &str) -> Result<(), String> {
    // If the operator dies, so does this master (even while stopped).
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let mut commands = read_commands();
    let session = Client::builder(addr)
        .session_timeout(MASTER_SESSION)
        .connect()
        .await
        .map_err(|e| format!("connecting to the election: {e}"))?;
    let store = Client::builder(addr)
        .session_timeout(STORE_SESSION)
        .connect()
        .await
        .map_err(|e| format!("connecting to the store: {e}"))?;
    report(
        "connected",
        format!(
            "{} {} {}",
            session.session_id().0,
            session.session_timeout().as_millis(),
            std::process::id()
        ),
    );

    let election = Election::new(&session, ELECTION);
    let campaign = election.campaign(format!("{name} (pid {})", std::process::id()));
    let leadership = tokio::select! {
        won = campaign => won.map_err(|e| format!("campaigning: {e}"))?,
        never = announce_standby(&session, &election) => match never {},
        () = stop_requested(&mut commands) => {
            // Dropping the campaign withdrew the candidate.
            session.close().await;
            store.close().await;
            report("stopped", "stops standing by: withdraws its candidacy; exits");
            return Ok(());
        }
    };
    report("active", leadership.token());
    lead(name, &session, &store, leadership, &mut commands).await?;
    store.close().await;
    session.close().await;
    Ok(())
}

/// The active master's loop: a heartbeat every [`HEARTBEAT`], until it loses
/// its leadership or is told to stop.
async fn lead(
    name: &str,
    session: &Client,
    store: &Client,
    leadership: Leadership,
    commands: &mut mpsc::UnboundedReceiver<String>,
) -> Result<(), String> {
    let epoch = leadership.token().get();
    let mut ticker = tokio::time::interval(HEARTBEAT);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut freeze_next = false;
    let mut beat = 0;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            reason = leadership.lost() => {
                report("stepped-down", reason);
                return Ok(());
            }
            command = commands.recv() => match command.as_deref() {
                Some("freeze-next") => {
                    freeze_next = true;
                    continue;
                }
                Some("stop") | None => {
                    leadership.resign().await.map_err(|e| format!("resigning: {e}"))?;
                    report("stopped", "resigns as active master; exits");
                    return Ok(());
                }
                Some(other) => return Err(format!("unknown command {other:?}")),
            }
        }
        if leadership.is_lost() {
            report("stepped-down", leadership.lost().await);
            return Ok(());
        }
        // Still leading, as of this check. The write comes next, and a pause
        // can fall in between: that is what the epoch is for.
        beat += 1;
        let record = format!("{name} epoch {epoch} heartbeat {beat}");
        if freeze_next {
            let ahead = session
                .session_deadline()
                .saturating_duration_since(Instant::now());
            report("about-to-write", format!("{} {record}", ahead.as_millis()));
            match commands.recv().await.as_deref() {
                Some("go") => {}
                other => return Err(format!("expected \"go\", got {other:?}")),
            }
        }
        match store.set_data_fenced(RECORD, record.clone(), epoch).await {
            Ok(stat) => report("accepted", format!("{epoch} {} {record}", stat.mzxid)),
            Err(Error::StaleFence(message)) => {
                report("refused", format!("{epoch} {message}"));
                // Someone with a higher epoch wrote: this master has been
                // replaced. Its leadership says so too.
                let reason = timeout(STEP_LIMIT, leadership.lost())
                    .await
                    .map_err(|_| "refused as stale, yet its leadership still looks held")?;
                report("stepped-down", reason);
                return Ok(());
            }
            Err(e) => return Err(format!("writing the heartbeat: {e}")),
        }
    }
}

/// Reports, once this candidate is queued behind another leader, who that
/// is; then never finishes.
async fn announce_standby(session: &Client, election: &Election) -> std::convert::Infallible {
    let me = session.session_id();
    let deadline = Instant::now() + STEP_LIMIT;
    while Instant::now() < deadline {
        let queued = Lock::new(session, ELECTION)
            .contenders()
            .await
            .is_ok_and(|queue| queue.iter().any(|c| c.owner == Some(me)));
        if queued {
            if let Ok(Some(leader)) = election.leader().await {
                if leader.session != Some(me) {
                    let value = String::from_utf8_lossy(&leader.value);
                    report("standby", format!("{value}, epoch {}", leader.token));
                    break;
                }
            }
        }
        sleep(Duration::from_millis(5)).await;
    }
    std::future::pending().await
}

async fn stop_requested(commands: &mut mpsc::UnboundedReceiver<String>) {
    while let Some(command) = commands.recv().await {
        if command == "stop" {
            return;
        }
    }
}

/// Lines from stdin, read on a thread of their own.
fn read_commands() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_owned()).is_err() {
                break;
            }
        }
    });
    rx
}
