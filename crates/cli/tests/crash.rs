//! Crash tests of `baton serve` as a child process: SIGKILL at random
//! moments under a concurrent load, a data directory that cannot be written,
//! a full disk, and SIGKILL while snapshots replace the log.
//!
//! Every restart runs the real binary on the same port and data directory,
//! so recovery is exactly what an operator gets. The test process holds the
//! clients, records every acknowledged result, and checks it against what
//! the restarted server holds.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use baton_client::{Client, CreateMode, Error, Lock, SessionId, SessionState, Stat};
use bytes::Bytes;
use common::{baton, free_addr};
use tokio::sync::watch;

/// Session timeout of the test's clients: long enough that sessions outlive
/// every restart, so clients resume rather than start over.
const SESSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a single client call may take before the test calls it a hang.
const OP_LIMIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A deterministic PRNG (splitmix64), so that a failing run's kill moments
/// and operation mix can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The seed from BATON_CRASH_SEED, or else from the clock.
fn seed() -> u64 {
    match std::env::var("BATON_CRASH_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("BATON_CRASH_SEED must be a u64, not {s:?}")),
        Err(_) => SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// A scratch directory holding a data directory and server logs. Removed
/// when the test passes, kept (and named) when it fails.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "baton-crash-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch { path }
    }

    fn data(&self) -> PathBuf {
        self.path.join("data")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "keeping {} (data directory and server logs) for inspection",
                self.path.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `baton serve` on `addr` and `data` with durable settings, logging at
/// info level whatever the caller's RUST_LOG says.
fn serve_command(addr: &str, data: &Path, extra: &[&str]) -> Command {
    serve_command_with(addr, data, "always", extra)
}

/// As [`serve_command`], with the given fsync policy.
fn serve_command_with(addr: &str, data: &Path, fsync: &str, extra: &[&str]) -> Command {
    let mut cmd = baton();
    cmd.args(["serve", "--listen", addr, "--data-dir"])
        .arg(data)
        .args(["--fsync", fsync, "--min-session-timeout", "100"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// What a server's log says once it listens (at info level).
const SERVING: &str = "baton_server::server: serving addr=";

/// A log file's text without terminal colour codes.
fn read_log(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence: ESC [ parameters final-letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The last `n` lines of a log file.
fn tail(path: &Path, n: usize) -> String {
    let text = read_log(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls until the process exits, for at most `limit`.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A running `baton serve` child whose stderr goes to a log file. Killed on
/// drop.
struct ServeProc {
    child: Child,
    addr: String,
    log: PathBuf,
    /// How many times the log said a server was serving before this one
    /// started (several starts may share one log).
    served_before: usize,
}

impl ServeProc {
    fn start(mut cmd: Command, addr: &str, log: &Path) -> ServeProc {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let served_before = read_log(log).matches(SERVING).count();
        let child = cmd.stderr(file).spawn().expect("start baton serve");
        ServeProc {
            child,
            addr: addr.to_owned(),
            log: log.to_owned(),
            served_before,
        }
    }

    /// Waits until the server accepts connections; fails if it exits first.
    /// `when` says which start this is, for the failure message. It must
    /// have said it serves, too: a port taken meanwhile by another test's
    /// server would take the connection.
    async fn wait_listening(&mut self, when: &str) {
        let limit = Duration::from_secs(20);
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "{when}: baton serve exited ({status}) instead of serving on {}; its log ends:\n{}",
                    self.addr,
                    self.log_tail()
                );
            }
            if read_log(&self.log).matches(SERVING).count() > self.served_before
                && tokio::net::TcpStream::connect(&self.addr).await.is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{when}: baton serve did not listen on {} within {limit:?}; its log ends:\n{}",
                self.addr,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL, and reaps the process.
    fn kill9(&mut self) {
        // SAFETY: kill has no memory effects; the process is not reaped yet,
        // so its pid is still its own.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        self.child.wait().expect("reap baton serve");
    }

    /// SIGTERM, and waits for the exit.
    fn terminate(&mut self, limit: Duration) -> ExitStatus {
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        wait_exit(&mut self.child, limit).unwrap_or_else(|| {
            panic!(
                "baton serve did not stop within {limit:?} of SIGTERM; its log ends:\n{}",
                self.log_tail()
            )
        })
    }

    fn log_tail(&self) -> String {
        tail(&self.log, 40)
    }
}

impl Drop for ServeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A session with the test's timeout.
async fn connect(addr: &str) -> Client {
    Client::builder(addr)
        .session_timeout(SESSION_TIMEOUT)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// `fut`, or a message saying it hung.
async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(OP_LIMIT, fut)
        .await
        .map_err(|_| format!("{what}: no answer within {OP_LIMIT:?} (hang)"))
}

/// Awaits all of `futures`, polling them in their order, so that requests
/// they make are sent in that order. (`futures::future::join_all` does so
/// only for a few futures; for more it polls them in no set order.)
async fn join_in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut all: Vec<_> = futures
        .into_iter()
        .map(|f| futures::future::maybe_done(Box::pin(f)))
        .collect();
    futures::future::poll_fn(|cx| {
        let mut done = true;
        for f in all.iter_mut() {
            done &= std::pin::Pin::new(f).poll(cx).is_ready();
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    all.iter_mut()
        .map(|f| {
            std::pin::Pin::new(f)
                .take_output()
                .expect("polled to completion")
        })
        .collect()
}

/// Writes `values` to `path` pipelined (sent in this order on the one
/// connection, and so applied in it); the result of each.
async fn pipelined_writes(
    client: &Client,
    path: &str,
    values: &[Bytes],
) -> Result<Vec<Result<Stat, Error>>, String> {
    let writes = values
        .iter()
        .map(|data| client.set_data(path, data.clone(), None))
        .collect();
    let what = format!("{} pipelined writes of {path}", values.len());
    bounded(&what, join_in_order(writes)).await
}

/// Distinct data for operation `op` of client `client`, padded so that the
/// log grows quickly enough for snapshots and rotations to happen.
fn payload(client: usize, op: u64) -> Bytes {
    Bytes::from(format!("c{client}-op{op}-{}", "x".repeat(200)))
}

/// Data shown in messages: the distinct prefix only.
fn show(data: &[u8]) -> String {
    let s = String::from_utf8_lossy(data);
    match s.find("-x") {
        Some(end) => s[..end].to_string(),
        None => s.chars().take(60).collect(),
    }
}

/// Names and contents of the regular files in `dir`.
fn read_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------
// 1. kill -9 under load
// ---------------------------------------------------------------------------

const CLIENTS: usize = 6;
const ROUNDS: usize = 6;
const LOCK: &str = "/crash/lock";
const FENCED: &str = "/crash/fenced";

/// A sequence number or lock token some acknowledged answer carried, with
/// the server generation ("epoch": the number of kills so far) read just
/// before the request was made and just after its answer arrived.
///
/// The epoch is bumped right after a kill has reaped the old server and
/// before the next one starts, so an answer recorded at epoch `a` came from
/// a server no newer than `a`, and a request made and answered within one
/// epoch `e` was answered by server `e` itself.
struct Issued {
    seq: u64,
    before: usize,
    after: usize,
    what: String,
}

/// What the load shares between its clients.
struct Shared {
    epoch: AtomicUsize,
    /// Token of the current lock holder, 0 for none: two holders at once is
    /// a failure.
    holder: AtomicU64,
    stop: AtomicBool,
}

/// A node written with unconditional `set_data` by one client, one write
/// after another (or pipelined, which applies them in the same order): what
/// it may hold after a crash.
struct Register {
    path: String,
    /// The last acknowledged data and the version it was acknowledged with.
    acked: (Bytes, u32),
    /// Writes of unknown outcome (ConnectionLoss) since then, in order.
    maybe: Vec<Bytes>,
}

impl Register {
    fn new(path: String, data: Bytes, version: u32) -> Register {
        Register {
            path,
            acked: (data, version),
            maybe: Vec::new(),
        }
    }

    /// Records the outcome of one write; an error if it cannot be right.
    fn record(&mut self, data: Bytes, result: Result<Stat, Error>) -> Result<(), String> {
        match result {
            Ok(stat) => {
                // Each write of unknown outcome since the last acknowledged
                // one may have added one version, no more.
                let prev = self.acked.1;
                let most = prev + 1 + self.maybe.len() as u32;
                let verdict = if stat.version <= prev || stat.version > most {
                    Err(format!(
                        "set {} to {}: acknowledged with version {}, expected {}..={most}",
                        self.path,
                        show(&data),
                        stat.version,
                        prev + 1
                    ))
                } else {
                    Ok(())
                };
                self.acked = (data, stat.version);
                self.maybe.clear();
                verdict
            }
            Err(Error::ConnectionLoss(_)) => {
                self.maybe.push(data);
                Ok(())
            }
            Err(e) => Err(format!(
                "set {} to {}: unexpected error: {e}",
                self.path,
                show(&data)
            )),
        }
    }

    /// Checks what the node holds after a restart: the acknowledged data at
    /// its version, or whole data of a later write in flight. Then takes it
    /// as known.
    fn settle(&mut self, data: Bytes, version: u32) -> Result<(), String> {
        let (acked, acked_version) = &self.acked;
        let verdict = if data == acked {
            if version == *acked_version {
                Ok(())
            } else {
                Err(format!(
                    "{} holds its acknowledged data {:?} at version {version}, acknowledged at {acked_version}",
                    self.path,
                    show(&data)
                ))
            }
        } else if self.maybe.contains(&data) {
            if version > *acked_version && version <= acked_version + self.maybe.len() as u32 {
                Ok(())
            } else {
                Err(format!(
                    "{} holds in-flight data {:?} at version {version} after acknowledged version {acked_version}",
                    self.path,
                    show(&data)
                ))
            }
        } else {
            Err(format!(
                "{} holds {:?} (version {version}): neither the acknowledged {:?} (version {acked_version}) nor a write in flight since",
                self.path,
                show(&data),
                show(acked)
            ))
        };
        self.acked = (data, version);
        self.maybe.clear();
        verdict
    }
}

/// One client of the load and everything it was told.
struct Worker {
    i: usize,
    client: Client,
    session: SessionId,
    rng: Rng,
    ops: u64,
    /// Children of `/crash/c<i>` (other than `own`) known to exist: those
    /// whose create was acknowledged, and those of unknown outcome that a
    /// check found. Path -> data.
    nodes: BTreeMap<String, Bytes>,
    /// Creates that failed with ConnectionLoss since the last check: data,
    /// and whether the node was ephemeral.
    maybe: Vec<(Bytes, bool)>,
    /// `/crash/c<i>/own`.
    own: Register,
    issued: Vec<Issued>,
    /// Tokens of acknowledged and of unknown-outcome fenced writes.
    fence_acked: Vec<u64>,
    fence_maybe: Vec<u64>,
    acked: u64,
    unknown: u64,
    errors: Vec<String>,
}

impl Worker {
    async fn run(mut self, shared: Arc<Shared>) -> Worker {
        while !shared.stop.load(Ordering::SeqCst) && self.errors.is_empty() {
            match self.rng.below(100) {
                0..=44 => self.create(&shared).await,
                45..=79 => self.set_own().await,
                _ => self.lock_cycle(&shared).await,
            }
            // Pacing between operations, not a wait for anything.
            let pause = self.rng.below(3);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        self
    }

    async fn create(&mut self, shared: &Shared) {
        self.ops += 1;
        let ephemeral = self.rng.below(4) == 0;
        let (prefix, mode) = if ephemeral {
            ("e-", CreateMode::EphemeralSequential)
        } else {
            ("n-", CreateMode::PersistentSequential)
        };
        let path = format!("/crash/c{}/{prefix}", self.i);
        let data = payload(self.i, self.ops);
        let before = shared.epoch.load(Ordering::SeqCst);
        let what = format!("client {}: create {path} ({})", self.i, show(&data));
        match bounded(&what, self.client.create(&path, data.clone(), mode)).await {
            Err(hang) => self.errors.push(hang),
            Ok(Ok(created)) => {
                let after = shared.epoch.load(Ordering::SeqCst);
                let Some(seq) = created.sequence else {
                    self.errors
                        .push(format!("{what}: no sequence number in {created:?}"));
                    return;
                };
                if !created.path.starts_with(&path) {
                    self.errors
                        .push(format!("{what}: created {} instead", created.path));
                }
                self.issued.push(Issued {
                    seq,
                    before,
                    after,
                    what: format!("create {}", created.path),
                });
                self.nodes.insert(created.path, data);
                self.acked += 1;
            }
            Ok(Err(Error::ConnectionLoss(_))) => {
                self.maybe.push((data, ephemeral));
                self.unknown += 1;
            }
            Ok(Err(e)) => self.errors.push(format!("{what}: unexpected error: {e}")),
        }
    }

    /// Writes the client's own node: usually once, sometimes a burst of
    /// pipelined writes, so that many are in flight when the kill comes.
    async fn set_own(&mut self) {
        let n = if self.rng.below(4) == 0 { 16 } else { 1 };
        let values: Vec<Bytes> = (0..n)
            .map(|_| {
                self.ops += 1;
                payload(self.i, self.ops)
            })
            .collect();
        match pipelined_writes(&self.client, &self.own.path, &values).await {
            Ok(results) => {
                for (data, result) in values.into_iter().zip(results) {
                    match &result {
                        Ok(_) => self.acked += 1,
                        Err(_) => self.unknown += 1,
                    }
                    if let Err(e) = self.own.record(data, result) {
                        self.errors.push(format!("client {}: {e}", self.i));
                    }
                }
            }
            Err(hang) => self.errors.push(hang),
        }
    }

    /// Acquires the shared lock, makes a fenced write with its token, and
    /// releases it.
    async fn lock_cycle(&mut self, shared: &Shared) {
        let what = format!("client {}: acquire {LOCK}", self.i);
        let before = shared.epoch.load(Ordering::SeqCst);
        let guard = match bounded(&what, Lock::new(&self.client, LOCK).acquire()).await {
            Err(hang) => return self.errors.push(hang),
            Ok(Ok(guard)) => guard,
            Ok(Err(Error::ConnectionLoss(_))) => {
                self.unknown += 1;
                return;
            }
            Ok(Err(e)) => return self.errors.push(format!("{what}: unexpected error: {e}")),
        };
        let after = shared.epoch.load(Ordering::SeqCst);
        let token = guard.token().0;
        self.issued.push(Issued {
            seq: token,
            before,
            after,
            what: format!("lock token of {}", guard.node()),
        });
        self.acked += 1;
        let other = shared.holder.swap(token, Ordering::SeqCst);
        if other != 0 {
            self.errors.push(format!(
                "client {}: granted {LOCK} with token {token} while token {other} held it",
                self.i
            ));
        }

        let data = format!("fence-{token}");
        let what = format!("client {}: fenced set {FENCED} to {data}", self.i);
        match bounded(&what, self.client.set_data_fenced(FENCED, data, token)).await {
            Err(hang) => self.errors.push(hang),
            Ok(Ok(_)) => {
                self.fence_acked.push(token);
                self.acked += 1;
            }
            Ok(Err(Error::ConnectionLoss(_))) => {
                self.fence_maybe.push(token);
                self.unknown += 1;
            }
            Ok(Err(e)) => self.errors.push(format!("{what}: unexpected error: {e}")),
        }

        let node = guard.node().to_owned();
        let _ = shared
            .holder
            .compare_exchange(token, 0, Ordering::SeqCst, Ordering::SeqCst);
        let what = format!("client {}: release {node}", self.i);
        match bounded(&what, guard.release()).await {
            Err(hang) => self.errors.push(hang),
            Ok(Ok(())) => {}
            // The delete may not have happened: make sure it does, or the
            // node (of a live session) would block the lock for good.
            Ok(Err(Error::ConnectionLoss(_))) => loop {
                match bounded(&what, self.client.delete(&node, None)).await {
                    Err(hang) => break self.errors.push(hang),
                    Ok(Ok(())) | Ok(Err(Error::NoNode(_))) => break,
                    Ok(Err(Error::ConnectionLoss(_))) => continue,
                    Ok(Err(e)) => break self.errors.push(format!("{what}: {e}")),
                }
            },
            Ok(Err(e)) => self.errors.push(format!("{what}: unexpected error: {e}")),
        }
    }
}

/// Receivers of the clients' session states, marked seen now, so that a
/// later disconnection shows as a change.
fn watch_states(clients: &[Client]) -> Vec<watch::Receiver<SessionState>> {
    clients
        .iter()
        .map(|c| {
            let mut rx = c.state_changes();
            rx.borrow_and_update();
            rx
        })
        .collect()
}

/// Waits until every client has seen its connection break and resumed its
/// session on the restarted server: its state changed since
/// [`watch_states`] and is Reconnected. Fails if a session ends, or if the
/// server exits meanwhile (as it does when recovery fails: it listens before
/// it recovers).
async fn wait_resumed(
    server: &mut ServeProc,
    states: &mut [watch::Receiver<SessionState>],
    when: &str,
) {
    let limit = Duration::from_secs(20);
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!(
                "{when}: the server restarted after SIGKILL exited ({status}); its log ends:\n{}",
                server.log_tail()
            );
        }
        let mut waiting = Vec::new();
        for (i, rx) in states.iter_mut().enumerate() {
            let changed = rx.has_changed().unwrap_or(true);
            let state = *rx.borrow();
            assert!(
                !state.is_terminal(),
                "{when}: session {i} ended ({state}) instead of resuming; the server log ends:\n{}",
                server.log_tail()
            );
            if !(changed && state == SessionState::Reconnected) {
                waiting.push(format!("session {i} {state}"));
            }
        }
        if waiting.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{when}: sessions not resumed {limit:?} after the restart: {waiting:?}; the server log ends:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a load task to stop; fails if it does not within twice the
/// time a call may take, or if the server exits meanwhile.
async fn join_load<T>(
    mut handle: tokio::task::JoinHandle<T>,
    server: &mut ServeProc,
    when: &str,
) -> T {
    let deadline = Instant::now() + OP_LIMIT * 2;
    loop {
        if let Ok(done) = tokio::time::timeout(Duration::from_millis(50), &mut handle).await {
            return done.expect("a load task panicked");
        }
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!(
                "{when}: the server exited ({status}) while the load was stopping; its log ends:\n{}",
                server.log_tail()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{when}: a load task did not stop within {:?}",
            OP_LIMIT * 2
        );
    }
}

/// Polls `check` every 20 ms until it returns `Some`, for at most `limit`.
async fn poll<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check().await {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks what the restarted server holds against what the clients were
/// told, then settles every unknown outcome to what was found.
async fn verify(
    round: usize,
    checker: &Client,
    workers: &mut [Worker],
    fence_floor: &mut u64,
) -> Vec<String> {
    let mut errors = Vec::new();
    for w in workers.iter_mut() {
        let i = w.i;
        // The session survived and this client resumed it.
        if w.client.session_id() != w.session {
            errors.push(format!(
                "client {i}: session {} is now {}",
                w.session,
                w.client.session_id()
            ));
        }
        if w.client.state() != SessionState::Reconnected {
            errors.push(format!(
                "client {i}: state {} after the restart, not reconnected",
                w.client.state()
            ));
        }
        if let Err(e) = bounded("ping", w.client.ping())
            .await
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            errors.push(format!("client {i}: ping after the restart: {e}"));
        }
        let marker = format!("/crash/eph/c{i}");
        match bounded("exists", checker.exists(&marker)).await {
            Ok(Ok(Some(stat))) if stat.owner() == Some(w.session) => {}
            other => errors.push(format!(
                "client {i}: its ephemeral {marker} (session {}) is not there as acknowledged: {other:?}",
                w.session
            )),
        }

        // Sequential children: every acknowledged one with its data, and
        // nothing that was never written.
        let parent = format!("/crash/c{i}");
        let names = match bounded("list", checker.get_children(&parent)).await {
            Ok(Ok((names, _))) => names,
            other => {
                errors.push(format!("list {parent}: {other:?}"));
                continue;
            }
        };
        let paths: Vec<String> = names
            .iter()
            .filter(|n| *n != "own")
            .map(|n| format!("{parent}/{n}"))
            .collect();
        let reads = futures::future::join_all(paths.iter().map(|p| checker.get_data(p)));
        let reads = match bounded("read children", reads).await {
            Ok(reads) => reads,
            Err(hang) => {
                errors.push(hang);
                continue;
            }
        };
        let mut maybe: HashMap<Bytes, bool> = w.maybe.drain(..).collect();
        for (path, read) in paths.iter().zip(reads) {
            let (data, stat) = match read {
                Ok(found) => found,
                Err(e) => {
                    errors.push(format!("read {path}: {e}"));
                    continue;
                }
            };
            let ephemeral = path.contains("/e-");
            if let Some(acked) = w.nodes.get(path) {
                if *acked != data {
                    errors.push(format!(
                        "round {round}: {path} holds {:?}, its acknowledged create wrote {:?}",
                        show(&data),
                        show(acked)
                    ));
                }
            } else if maybe.get(&data) == Some(&ephemeral) {
                // A create of unknown outcome happened: from now on it is
                // known.
                maybe.remove(&data);
                w.nodes.insert(path.clone(), data.clone());
            } else {
                errors.push(format!(
                    "round {round}: {path} holds {:?}, which no create in flight or acknowledged wrote",
                    show(&data)
                ));
            }
            if stat.version != 0 {
                errors.push(format!(
                    "round {round}: {path} has version {}, but nothing changed it",
                    stat.version
                ));
            }
            let owner = stat.owner();
            if ephemeral && owner != Some(w.session) || !ephemeral && owner.is_some() {
                errors.push(format!(
                    "round {round}: {path} is owned by {owner:?}, expected {}",
                    if ephemeral {
                        format!("session {}", w.session)
                    } else {
                        "no session".into()
                    }
                ));
            }
        }
        // Creates of unknown outcome not found now never happened; if one
        // showed up later it would be flagged above.
        for (path, data) in &w.nodes {
            if !paths.contains(path) {
                errors.push(format!(
                    "round {round}: acknowledged {path} ({}) is gone",
                    show(data)
                ));
            }
        }

        // The client's own node: the acknowledged value, or a later write
        // in flight, whole.
        match bounded("read own", checker.get_data(&w.own.path)).await {
            Ok(Ok((data, stat))) => {
                if let Err(e) = w.own.settle(data, stat.version) {
                    errors.push(format!("round {round}: {e}"));
                }
            }
            other => errors.push(format!("read {}: {other:?}", w.own.path)),
        }
    }

    // The lock's queue drains: no contender node was orphaned by a crash.
    let drained = poll(Duration::from_secs(15), || async {
        match checker.get_children(LOCK).await {
            Ok((names, _)) if names.is_empty() => Some(Ok(())),
            Err(Error::NoNode(_)) => Some(Ok(())),
            Ok(_) | Err(Error::ConnectionLoss(_)) => None,
            Err(e) => Some(Err(e.to_string())),
        }
    })
    .await;
    match drained {
        Some(Ok(())) => {}
        Some(Err(e)) => errors.push(format!("list {LOCK}: {e}")),
        None => {
            let left = checker.get_children(LOCK).await;
            errors.push(format!(
                "round {round}: the queue of {LOCK} did not drain within 15 s with every client idle: {left:?}"
            ));
        }
    }

    // The fenced node holds the token of an acknowledged or in-flight
    // fenced write, no lower than any acknowledged one.
    let acked: HashSet<u64> = workers
        .iter()
        .flat_map(|w| w.fence_acked.iter().copied())
        .collect();
    let written: HashSet<u64> = workers
        .iter()
        .flat_map(|w| w.fence_maybe.iter().copied())
        .chain(acked.iter().copied())
        .chain([0])
        .collect();
    let floor = acked.iter().copied().max().unwrap_or(0).max(*fence_floor);
    match bounded("read fenced", checker.get_data(FENCED)).await {
        Ok(Ok((data, _))) => {
            let text = String::from_utf8_lossy(&data).into_owned();
            match text.strip_prefix("fence-").and_then(|t| t.parse::<u64>().ok()) {
                Some(t) if t >= floor && written.contains(&t) => *fence_floor = t,
                _ => errors.push(format!(
                    "round {round}: {FENCED} holds {text:?}; expected the data of a fenced write with a token of at least {floor}"
                )),
            }
        }
        other => errors.push(format!("read {FENCED}: {other:?}")),
    }

    errors.extend(check_sequences(workers));
    errors
}

/// Sequence numbers and lock tokens are distinct, and every one handed out
/// by a restarted server is greater than every one handed out before.
fn check_sequences(workers: &[Worker]) -> Vec<String> {
    let mut errors = Vec::new();
    let all: Vec<&Issued> = workers.iter().flat_map(|w| &w.issued).collect();
    let mut seen: HashMap<u64, &str> = HashMap::new();
    for issued in &all {
        if let Some(first) = seen.insert(issued.seq, &issued.what) {
            errors.push(format!(
                "sequence number {} handed out twice: {first} and {}",
                issued.seq, issued.what
            ));
        }
    }
    let epochs = all.iter().map(|x| x.after).max().unwrap_or(0);
    for epoch in 1..=epochs {
        // Answered by a server older than `epoch`, for certain.
        let older = all.iter().filter(|x| x.after < epoch).max_by_key(|x| x.seq);
        // Asked and answered while server `epoch` was the only one up.
        let newer = all
            .iter()
            .filter(|x| x.before == epoch && x.after == epoch)
            .min_by_key(|x| x.seq);
        if let (Some(old), Some(new)) = (older, newer) {
            if new.seq <= old.seq {
                errors.push(format!(
                    "after restart {epoch}, {} got {}, not above {} of {} before it",
                    new.what, new.seq, old.seq, old.what
                ));
            }
        }
    }
    errors
}

/// Pins: with `--fsync always`, a SIGKILL at any moment (under load, during
/// snapshots and log rotations) loses no acknowledged create, data write,
/// fenced write or ephemeral node; an in-flight write is applied whole or
/// not at all; sequence numbers and lock tokens keep growing across
/// restarts; sessions resume with their ephemerals; no lock contender node
/// is orphaned; recovery never reports damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_minus_9_at_random_moments_loses_nothing_acknowledged() {
    let seed = seed();
    eprintln!("kill -9 test: seed {seed} (BATON_CRASH_SEED={seed} replays its kill moments and operation mix)");
    let scratch = Scratch::new("kill9");
    let progress = Arc::new(Mutex::new(String::from("starting")));
    let limit = Duration::from_secs(60);
    let run = kill9_rounds(seed, &scratch, progress.clone());
    if tokio::time::timeout(limit, run).await.is_err() {
        panic!(
            "the kill -9 test did not finish within {limit:?} (seed {seed}); it was at: {}; the server log ends:\n{}",
            progress.lock().unwrap(),
            tail(&scratch.file("server.log"), 40)
        );
    }
}

async fn kill9_rounds(seed: u64, scratch: &Scratch, progress: Arc<Mutex<String>>) {
    let at = |what: String| *progress.lock().unwrap() = what;
    let mut rng = Rng::new(seed);
    let addr = free_addr();
    let data = scratch.data();
    let log = scratch.file("server.log");
    let start = || {
        ServeProc::start(
            serve_command(&addr, &data, &["--snapshot-every", "16384"]),
            &addr,
            &log,
        )
    };
    let mut server = start();
    server.wait_listening("first start").await;

    at("setup".into());
    let checker = connect(&addr).await;
    for path in ["/crash", "/crash/eph"] {
        checker
            .create(path, "", CreateMode::Persistent)
            .await
            .unwrap();
    }
    checker
        .create(FENCED, "fence-0", CreateMode::Persistent)
        .await
        .unwrap();
    let mut workers = Vec::new();
    for i in 0..CLIENTS {
        let client = connect(&addr).await;
        let session = client.session_id();
        client
            .create(&format!("/crash/c{i}"), "", CreateMode::Persistent)
            .await
            .unwrap();
        let own = Bytes::from(format!("c{i}-initial"));
        let stat = client
            .create(
                &format!("/crash/c{i}/own"),
                own.clone(),
                CreateMode::Persistent,
            )
            .await
            .unwrap()
            .stat;
        client
            .create(&format!("/crash/eph/c{i}"), "", CreateMode::Ephemeral)
            .await
            .unwrap();
        workers.push(Worker {
            i,
            client,
            session,
            rng: Rng::new(seed ^ (i as u64 + 1).wrapping_mul(0x5851_F42D_4C95_7F2D)),
            ops: 0,
            nodes: BTreeMap::new(),
            maybe: Vec::new(),
            own: Register::new(format!("/crash/c{i}/own"), own, stat.version),
            issued: Vec::new(),
            fence_acked: Vec::new(),
            fence_maybe: Vec::new(),
            acked: 0,
            unknown: 0,
            errors: Vec::new(),
        });
    }
    let clients: Vec<Client> = workers
        .iter()
        .map(|w| w.client.clone())
        .chain([checker.clone()])
        .collect();
    let shared = Arc::new(Shared {
        epoch: AtomicUsize::new(0),
        holder: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let mut fence_floor = 0;

    for round in 1..=ROUNDS {
        at(format!("round {round}: load"));
        let mut states = watch_states(&clients);
        shared.stop.store(false, Ordering::SeqCst);
        let running: Vec<_> = workers
            .drain(..)
            .map(|w| tokio::spawn(w.run(shared.clone())))
            .collect();

        // The random moment of the kill (not a wait for a condition).
        let load = Duration::from_millis(200 + rng.below(800));
        tokio::time::sleep(load).await;
        server.kill9();
        shared.epoch.fetch_add(1, Ordering::SeqCst);

        at(format!("round {round}: restarting after SIGKILL"));
        server = start();
        server
            .wait_listening(&format!("round {round}, restarting after SIGKILL"))
            .await;

        at(format!("round {round}: waiting for the sessions to resume"));
        wait_resumed(&mut server, &mut states, &format!("round {round}")).await;

        at(format!("round {round}: stopping the load"));
        shared.stop.store(true, Ordering::SeqCst);
        for handle in running {
            let worker = join_load(handle, &mut server, &format!("round {round}")).await;
            workers.push(worker);
        }
        workers.sort_by_key(|w| w.i);
        let mut errors: Vec<String> = workers
            .iter_mut()
            .flat_map(|w| w.errors.drain(..))
            .collect();

        at(format!("round {round}: checking"));
        errors.extend(verify(round, &checker, &mut workers, &mut fence_floor).await);
        let acked: u64 = workers.iter().map(|w| w.acked).sum();
        let unknown: u64 = workers.iter().map(|w| w.unknown).sum();
        eprintln!(
            "round {round}: SIGKILL after {load:?} of load; so far {acked} acknowledged, {unknown} of unknown outcome"
        );
        assert!(
            errors.is_empty(),
            "after kill -9 number {round} (seed {seed}):\n  {}\nthe server log ends:\n{}",
            errors.join("\n  "),
            server.log_tail()
        );
    }

    at("finishing".into());
    let acked: u64 = workers.iter().map(|w| w.acked).sum();
    assert!(
        acked >= 100,
        "only {acked} operations were acknowledged over {ROUNDS} rounds: the load did not run"
    );
    let log_text = read_log(&log);
    let snapshots = log_text.matches("snapshot written").count();
    let recoveries = log_text.matches("recovered").count();
    eprintln!("{snapshots} snapshots written, {recoveries} recoveries");
    assert!(
        snapshots >= 1,
        "no snapshot was written during the test: the kills never met a snapshot or a rotated log"
    );
    assert!(
        recoveries > ROUNDS,
        "the server logged {recoveries} recoveries for {} starts",
        ROUNDS + 1
    );
    for c in &clients {
        c.close().await;
    }
    let status = server.terminate(Duration::from_secs(20));
    assert!(
        status.success(),
        "a graceful stop after the crashes failed ({status}); the log ends:\n{}",
        server.log_tail()
    );
}

// ---------------------------------------------------------------------------
// 2. A data directory that cannot be written
// ---------------------------------------------------------------------------

/// `chattr -R +i` on a directory, undone on drop.
struct Immutable {
    dir: PathBuf,
    set: bool,
}

impl Immutable {
    fn set(dir: &Path) -> Result<Immutable, String> {
        chattr("+i", dir)?;
        Ok(Immutable {
            dir: dir.to_owned(),
            set: true,
        })
    }

    fn clear(mut self) -> Result<(), String> {
        self.set = false;
        chattr("-i", &self.dir)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if self.set {
            let _ = chattr("-i", &self.dir);
        }
    }
}

fn chattr(flag: &str, dir: &Path) -> Result<(), String> {
    let out = Command::new("chattr")
        .args(["-R", flag])
        .arg(dir)
        .output()
        .map_err(|e| format!("cannot run chattr: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "chattr -R {flag} {} failed ({}): {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Pins: on a data directory it cannot write, `baton serve` exits non-zero
/// at once with one stderr line naming the file and the OS error, changes
/// no byte of the directory, and a later normal start recovers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_directory_gives_a_clear_error() {
    let scratch = Scratch::new("readonly");
    let data = scratch.data();
    let addr = free_addr();
    // A log, a snapshot and rotated segments to protect.
    let mut server = ServeProc::start(
        serve_command(&addr, &data, &["--snapshot-every", "4096"]),
        &addr,
        &scratch.file("first.log"),
    );
    server.wait_listening("first start").await;
    let c = connect(&addr).await;
    c.create("/ro", "parent v1", CreateMode::Persistent)
        .await
        .unwrap();
    for i in 0..100 {
        c.create(
            &format!("/ro/n{i}"),
            format!("value {i}"),
            CreateMode::Persistent,
        )
        .await
        .unwrap();
    }
    c.set_data("/ro", "parent v2", None).await.unwrap();
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "first server stopped with {status}");
    drop(server);
    let before = read_files(&data);
    assert!(
        before.keys().any(|f| f.starts_with("wal-")),
        "a log was written: {:?}",
        before.keys()
    );

    let immutable = match Immutable::set(&data) {
        Ok(guard) => guard,
        Err(why) => {
            eprintln!("skipping: cannot make the data directory immutable: {why}");
            return;
        }
    };
    let log = scratch.file("readonly.log");
    let started = Instant::now();
    let mut child = serve_command(&addr, &data, &[])
        .stderr(File::create(&log).unwrap())
        .spawn()
        .expect("start baton serve");
    let limit = Duration::from_secs(15);
    let Some(status) = wait_exit(&mut child, limit) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "baton serve kept running for {limit:?} on an immutable data directory; its log:\n{}",
            tail(&log, 40)
        );
    };
    let took = started.elapsed();
    let stderr = std::fs::read_to_string(&log).unwrap();
    eprintln!("on an immutable data directory: {status} after {took:?}; stderr: {stderr:?}");
    assert!(
        !status.success(),
        "baton serve succeeded on an immutable data directory: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line on stderr, not: {stderr:?}");
    let line = lines[0];
    assert!(
        line.contains(&data.display().to_string()),
        "the error names the data directory or its file: {line:?}"
    );
    assert!(
        line.contains("os error"),
        "the error gives the OS error: {line:?}"
    );

    immutable.clear().expect("chattr -R -i");
    let after = read_files(&data);
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|f| before.get(*f) != after.get(*f))
        .collect();
    assert!(
        changed.is_empty(),
        "the failed start changed files of the data directory: {changed:?}"
    );

    // A normal start recovers everything.
    let mut server = ServeProc::start(
        serve_command(&addr, &data, &[]),
        &addr,
        &scratch.file("second.log"),
    );
    server.wait_listening("normal start after chattr -i").await;
    let c = connect(&addr).await;
    assert_eq!(c.get_data("/ro").await.unwrap().0, "parent v2".as_bytes());
    let (children, _) = c.get_children("/ro").await.unwrap();
    assert_eq!(children.len(), 100, "{children:?}");
    for i in [0, 57, 99] {
        let (value, _) = c.get_data(&format!("/ro/n{i}")).await.unwrap();
        assert_eq!(value, format!("value {i}").into_bytes());
    }
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
}

// ---------------------------------------------------------------------------
// 3. A full disk
// ---------------------------------------------------------------------------

/// Most bytes the server may write to any one file: RLIMIT_FSIZE.
const FILE_LIMIT: u64 = 200 * 1024;

/// Writes distinct nodes until a write fails; records what was acknowledged
/// and what is of unknown outcome. Returns an unexpected error, if any.
/// Writes acknowledged and of unknown outcome, path to data.
type Written = Arc<Mutex<BTreeMap<String, Bytes>>>;

/// `n` clients of the server at `addr`, each running [`fill`] on a task.
async fn fillers(
    addr: &str,
    n: usize,
) -> (
    Written,
    Written,
    Vec<tokio::task::JoinHandle<Option<String>>>,
) {
    let (acked, unknown): (Written, Written) = Default::default();
    let mut writers = Vec::new();
    for i in 0..n {
        let client = connect(addr).await;
        writers.push(tokio::spawn(fill(
            client,
            i,
            acked.clone(),
            unknown.clone(),
        )));
    }
    (acked, unknown, writers)
}

async fn fill(
    client: Client,
    i: usize,
    acked: Arc<Mutex<BTreeMap<String, Bytes>>>,
    unknown: Arc<Mutex<BTreeMap<String, Bytes>>>,
) -> Option<String> {
    for k in 0u64.. {
        let path = format!("/full/c{i}-{k:05}");
        let data = Bytes::from(format!("c{i}-{k}-{}", "y".repeat(1000)));
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            client.create(&path, data.clone(), CreateMode::Persistent),
        )
        .await;
        match result {
            Ok(Ok(_)) => {
                acked.lock().unwrap().insert(path, data);
            }
            // The server went away with the request unanswered, or it is
            // waiting to be sent to a server that is gone: either way its
            // outcome is unknown.
            Ok(Err(Error::ConnectionLoss(_) | Error::ShuttingDown(_))) | Err(_) => {
                unknown.lock().unwrap().insert(path, data);
                return None;
            }
            Ok(Err(e)) => {
                unknown.lock().unwrap().insert(path.clone(), data);
                return Some(format!("create {path}: unexpected error: {e}"));
            }
        }
    }
    None
}

/// Pins: a server whose log write failed while replies were waiting for
/// their batch to be durable stopped only after its connections' grace to
/// flush (5 s, then up to 10 s for them all): they waited for a durable
/// mark that would never move. Now the mark stops with the log, what waits
/// for it is dropped unsent, and the server exits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_log_fails_with_replies_waiting_exits_at_once() {
    let scratch = Scratch::new("fail-with-replies-waiting");
    let data = scratch.data();
    let addr = free_addr();
    let control = scratch.file("disk-faults");
    std::fs::write(&control, "").unwrap();
    let cmd = serve_command(
        &addr,
        &data,
        &["--test-disk-faults", control.to_str().unwrap()],
    );
    let mut server = ServeProc::start(cmd, &addr, &scratch.file("server.log"));
    server.wait_listening("start with disk faults").await;
    let setup = connect(&addr).await;
    setup
        .create("/full", "", CreateMode::Persistent)
        .await
        .unwrap();
    setup.close().await;
    // Each sync a second late: the writers' replies wait for their batch.
    std::fs::write(&control, "slow 1000").unwrap();
    let (acked, _, writers) = fillers(&addr, 4).await;
    // Once a slow batch has been acknowledged the writers' next ones wait
    // behind a sync; the one after fails half written.
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "nothing acknowledged in 20 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::write(&control, "full").unwrap();
    let limit = Duration::from_secs(20);
    let status = wait_exit(&mut server.child, limit).unwrap_or_else(|| {
        panic!(
            "still running {limit:?} after the disk filled; its log ends:\n{}",
            server.log_tail()
        )
    });
    assert!(!status.success(), "{}", server.log_tail());
    let log = read_log(&server.log);
    assert!(log.contains("the log can no longer be written"), "{log}");
    assert!(log.contains("all connections closed"), "{log}");
    // No connection waited out its grace for replies never to be durable.
    assert!(!log.contains("closing without flushing"), "{log}");
    for writer in writers {
        writer.abort();
    }
}

/// Pins: a snapshot that cannot create its file (a file system out of
/// inodes: writes into the open log go on) fails on its own: every write
/// meanwhile is acknowledged, the server goes on serving (the log goes on
/// in its current segment when a new one cannot be made: that once
/// stopped the server), and once files can be created a later snapshot is
/// written; killed then, the server comes back with every acknowledged
/// write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_cannot_create_its_file_fails_alone_and_the_log_goes_on() {
    let scratch = Scratch::new("no-new-files");
    let data = scratch.data();
    let control = scratch.file("disk-faults");
    std::fs::write(&control, "").unwrap();
    let extra = [
        "--test-disk-faults",
        control.to_str().unwrap(),
        "--snapshot-every",
        "65536",
    ];
    let addr = free_addr();
    let log = scratch.file("server.log");
    let mut server = ServeProc::start(serve_command(&addr, &data, &extra), &addr, &log);
    server.wait_listening("start with no new files").await;
    let client = connect(&addr).await;
    let mut acked = BTreeMap::new();
    let value = Bytes::from("z".repeat(4096));
    let mut write = |i: usize| {
        let path = format!("/n{i:04}");
        acked.insert(path.clone(), value.clone());
        (path, value.clone())
    };
    // Its log's segment made, the file system runs out of inodes.
    std::fs::write(&control, "no-new-files").unwrap();
    // About 16 snapshots' worth of log, none of which can be written.
    for i in 0..256 {
        let (path, data) = write(i);
        client
            .create(&path, data, CreateMode::Persistent)
            .await
            .unwrap();
    }
    let text = read_log(&log);
    assert!(
        text.contains("failed") && text.contains("no space left on device"),
        "no snapshot failed; the log ends:\n{}",
        server.log_tail()
    );
    assert!(
        !text.contains("snapshot written"),
        "a snapshot was written though no file could be created"
    );
    // Nor a new log segment: the log went on in the one it had.
    assert!(
        text.contains("the log goes on in its current segment"),
        "{}",
        server.log_tail()
    );
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "{}",
        server.log_tail()
    );
    // Files can be created again: a later snapshot is written.
    std::fs::write(&control, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 256;
    while !read_log(&log).contains("snapshot written") {
        assert!(
            Instant::now() < deadline,
            "no snapshot written once files could be created; the log ends:\n{}",
            server.log_tail()
        );
        let (path, data) = write(i);
        client
            .create(&path, data, CreateMode::Persistent)
            .await
            .unwrap();
        i += 1;
    }
    client.close().await;
    server.kill9();
    let addr = free_addr();
    let mut again = ServeProc::start(serve_command(&addr, &data, &extra), &addr, &log);
    again.wait_listening("restart after the snapshots").await;
    let client = connect(&addr).await;
    let (children, _) = client.get_children("/").await.unwrap();
    let present: std::collections::HashSet<String> =
        children.iter().map(|n| format!("/{n}")).collect();
    for (path, data) in &acked {
        assert!(present.contains(path), "{path}: acknowledged, then lost");
        let (got, _) = client.get_data(path).await.unwrap();
        assert_eq!(&got[..], &data[..], "{path}");
    }
    client.close().await;
}

/// Checks that the server at `addr` holds every acknowledged write and
/// nothing that was never written.
async fn check_full(
    addr: &str,
    acked: &BTreeMap<String, Bytes>,
    unknown: &BTreeMap<String, Bytes>,
) -> (Client, usize) {
    let c = connect(addr).await;
    let (names, _) = c.get_children("/full").await.unwrap();
    let present: HashSet<String> = names.iter().map(|n| format!("/full/{n}")).collect();
    let missing: Vec<&String> = acked.keys().filter(|p| !present.contains(*p)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged writes are missing after the disk filled up: {:?}",
        missing.len(),
        missing.iter().take(10).collect::<Vec<_>>()
    );
    let mut landed = 0;
    for path in &present {
        let (data, _) = c.get_data(path).await.unwrap();
        if let Some(expected) = acked.get(path) {
            assert_eq!(&data, expected, "{path} holds other data than acknowledged");
        } else if let Some(expected) = unknown.get(path) {
            assert_eq!(&data, expected, "{path} holds other data than written");
            landed += 1;
        } else if path != "/full/after-restart" {
            panic!("{path} exists but was never written");
        }
    }
    (c, landed)
}

/// Pins: when the log cannot grow (EFBIG under RLIMIT_FSIZE, as on a full
/// disk) the server stops, exit status non-zero, saying the log can no
/// longer be written and naming the file and the OS error; no write that
/// was not made durable was acknowledged; the cut-off log recovers cleanly
/// (its torn tail dropped) and takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_server_and_corrupts_nothing() {
    use std::os::unix::process::CommandExt;

    let scratch = Scratch::new("full");
    let data = scratch.data();
    let addr = free_addr();
    let mut cmd = serve_command(&addr, &data, &[]);
    // SAFETY: setrlimit and signal are async-signal-safe, and touch no
    // memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: FILE_LIMIT,
                rlim_max: FILE_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Writes past the limit then fail with EFBIG instead of
            // killing the process, as on a full disk.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let first_log = scratch.file("limited.log");
    let mut server = ServeProc::start(cmd, &addr, &first_log);
    server.wait_listening("start with RLIMIT_FSIZE").await;
    let setup = connect(&addr).await;
    setup
        .create("/full", "", CreateMode::Persistent)
        .await
        .unwrap();
    setup.close().await;

    let (acked, unknown, writers) = fillers(&addr, 3).await;

    // The server must stop by itself once the log cannot grow.
    let limit = Duration::from_secs(30);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server kept running for {limit:?} with its files limited to {FILE_LIMIT} bytes ({} writes acknowledged); its log ends:\n{}",
            acked.lock().unwrap().len(),
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stderr = std::fs::read_to_string(&first_log).unwrap();
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    eprintln!("full disk: the server exited with {status}; its last line: {last}");
    assert!(
        !status.success(),
        "the server exited successfully on a full disk; its log ends:\n{}",
        server.log_tail()
    );
    assert!(
        last.contains("the log can no longer be written"),
        "the last line says the log can no longer be written: {last:?}"
    );
    assert!(
        last.contains(&data.display().to_string()) && last.contains("os error"),
        "the last line names the log file and the OS error: {last:?}"
    );
    drop(server);

    for writer in writers {
        let unexpected = tokio::time::timeout(Duration::from_secs(30), writer)
            .await
            .expect("a writer did not stop after the server exited")
            .expect("a writer panicked");
        assert_eq!(unexpected, None);
    }
    let acked = acked.lock().unwrap().clone();
    let unknown = unknown.lock().unwrap().clone();
    assert!(
        acked.len() >= 20,
        "only {} writes were acknowledged before the limit",
        acked.len()
    );
    let files = read_files(&data);
    let wal_bytes: u64 = files
        .iter()
        .filter(|(f, _)| f.starts_with("wal-"))
        .map(|(_, b)| b.len() as u64)
        .sum();
    eprintln!(
        "full disk: {} writes acknowledged, {} of unknown outcome, {wal_bytes} bytes of log",
        acked.len(),
        unknown.len()
    );
    assert!(
        wal_bytes + 2048 >= FILE_LIMIT,
        "the log ({wal_bytes} bytes) stopped short of the {FILE_LIMIT} byte limit"
    );

    // Without the limit, the log recovers cleanly and holds every
    // acknowledged write.
    let second_log = scratch.file("recovered.log");
    // A new port: another test's server may have taken the old one.
    let addr = free_addr();
    let mut server = ServeProc::start(serve_command(&addr, &data, &[]), &addr, &second_log);
    server.wait_listening("restart without the limit").await;
    let (c, landed) = check_full(&addr, &acked, &unknown).await;
    // It answered, so it has recovered and logged how.
    let recovered = read_log(&second_log);
    eprintln!(
        "full disk: {landed} writes of unknown outcome were applied; {}",
        recovered
            .lines()
            .find(|l| l.contains("recovered"))
            .unwrap_or("no recovery line")
    );
    // And the log takes writes again after the dropped tail.
    c.create("/full/after-restart", "yes", CreateMode::Persistent)
        .await
        .unwrap();
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    drop(server);

    let third_log = scratch.file("again.log");
    let addr = free_addr();
    let mut server = ServeProc::start(serve_command(&addr, &data, &[]), &addr, &third_log);
    server
        .wait_listening("second restart without the limit")
        .await;
    let (c, _) = check_full(&addr, &acked, &unknown).await;
    assert_eq!(
        c.get_data("/full/after-restart").await.unwrap().0,
        "yes".as_bytes()
    );
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    for log in [&second_log, &third_log] {
        let text = read_log(log);
        assert!(
            !text.contains("damaged") && !text.contains("ERROR"),
            "recovery after the full disk reported a problem:\n{text}"
        );
    }
}

/// Sets RLIMIT_FSIZE to `limit` bytes in the child (and ignores SIGXFSZ, so
/// that writes past it fail with EFBIG, as on a full disk).
fn limit_file_size(cmd: &mut Command, limit: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit and signal are async-signal-safe, and touch no
    // memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
}

/// Pins: under `--fsync never`, once an append has failed the server
/// acknowledges nothing applied after it, in particular not after the
/// failed bytes started a snapshot and a fresh, writable segment (a failed
/// write once let the next append move the durable mark past the lost
/// change). The log then recovers with every acknowledged change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_append_under_fsync_never_nothing_later_is_acknowledged() {
    const LIMIT: u64 = 1_000_000;
    const BIG: usize = 900_000;
    let scratch = Scratch::new("never-fail");
    let data = scratch.data();
    let addr = free_addr();
    let mut cmd = baton();
    cmd.args(["serve", "--listen", &addr, "--data-dir"])
        .arg(&data)
        .args(["--fsync", "never", "--snapshot-every", "950000"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    limit_file_size(&mut cmd, LIMIT);
    let mut server = ServeProc::start(cmd, &addr, &scratch.file("limited.log"));
    server.wait_listening("start with RLIMIT_FSIZE").await;
    let c = connect(&addr).await;
    c.create("/a", vec![b'a'; BIG], CreateMode::Persistent)
        .await
        .expect("the first large create fits in the file limit");
    // The second large create cannot be written; small ones follow it on
    // the same connection, in order.
    let mut writes = vec![("/b".to_string(), vec![b'b'; BIG])];
    for i in 0..20 {
        writes.push((format!("/c{i}"), vec![b'c'; 10]));
    }
    let results = join_in_order(
        writes
            .iter()
            .map(|(path, value)| {
                let c = c.clone();
                let value = Bytes::from(value.clone());
                async move {
                    tokio::time::timeout(
                        Duration::from_secs(10),
                        c.create(path, value, CreateMode::Persistent),
                    )
                    .await
                }
            })
            .collect(),
    )
    .await;
    let acked: Vec<&str> = writes
        .iter()
        .zip(&results)
        .filter(|(_, r)| matches!(r, Ok(Ok(_))))
        .map(|((p, _), _)| p.as_str())
        .collect();
    let status = wait_exit(&mut server.child, Duration::from_secs(20))
        .expect("the server stops once its log cannot be written");
    assert!(!status.success(), "{status}");
    assert!(
        acked.is_empty(),
        "acknowledged after a failed append: {acked:?}; the server's log ends:\n{}",
        server.log_tail()
    );
    drop(server);

    // A new port: another test's server may have taken the old one.
    let addr = free_addr();
    let mut server = ServeProc::start(
        serve_command(&addr, &data, &[]),
        &addr,
        &scratch.file("recovered.log"),
    );
    server.wait_listening("restart without the limit").await;
    let c = connect(&addr).await;
    assert_eq!(c.get_data("/a").await.unwrap().0.len(), BIG);
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
}

// ---------------------------------------------------------------------------
// 4. kill -9 while snapshots replace the log
// ---------------------------------------------------------------------------

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
