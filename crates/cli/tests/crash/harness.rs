//! The harness: a `baton serve` child on a data directory, its log, the
//! clients, bounded waits, and a seeded random source for replays.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::common::baton;
use baton_client::{Client, Error, SessionState, Stat};
use baton_testkit::Evidence;
use bytes::Bytes;
use tokio::sync::watch;

/// Session timeout of the test's clients: long enough that sessions outlive
/// every restart, so clients resume rather than start over.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a single client call may take before the test calls it a hang.
pub const OP_LIMIT: Duration = Duration::from_secs(20);

/// A deterministic PRNG (splitmix64), so that a failing run's kill moments
/// and operation mix can be replayed from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The seed from BATON_CRASH_SEED, or else from the clock.
pub fn seed() -> u64 {
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
pub struct Scratch(Evidence);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        Scratch(Evidence::new(&format!("crash-{name}")))
    }

    pub fn data(&self) -> PathBuf {
        self.0.join("data")
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

/// `baton serve` on `addr` and `data` with durable settings, logging at
/// info level whatever the caller's RUST_LOG says.
pub fn serve_command(addr: &str, data: &Path, extra: &[&str]) -> Command {
    serve_command_with(addr, data, "always", extra)
}

/// As [`serve_command`], with the given fsync policy.
pub fn serve_command_with(addr: &str, data: &Path, fsync: &str, extra: &[&str]) -> Command {
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
pub const SERVING: &str = "baton_server::server: serving addr=";

/// A log file's text without terminal colour codes.
pub fn read_log(path: &Path) -> String {
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
pub fn tail(path: &Path, n: usize) -> String {
    let text = read_log(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls until the process exits, for at most `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
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
pub struct ServeProc {
    pub child: Child,
    pub addr: String,
    pub log: PathBuf,
    /// How many times the log said a server was serving before this one
    /// started (several starts may share one log).
    pub served_before: usize,
}

impl ServeProc {
    pub fn start(mut cmd: Command, addr: &str, log: &Path) -> ServeProc {
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
    pub async fn wait_listening(&mut self, when: &str) {
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
    pub fn kill9(&mut self) {
        // SAFETY: kill has no memory effects; the process is not reaped yet,
        // so its pid is still its own.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        self.child.wait().expect("reap baton serve");
    }

    /// SIGTERM, and waits for the exit.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        wait_exit(&mut self.child, limit).unwrap_or_else(|| {
            panic!(
                "baton serve did not stop within {limit:?} of SIGTERM; its log ends:\n{}",
                self.log_tail()
            )
        })
    }

    pub fn log_tail(&self) -> String {
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
pub async fn connect(addr: &str) -> Client {
    Client::builder(addr)
        .session_timeout(SESSION_TIMEOUT)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// `fut`, or a message saying it hung.
pub async fn bounded<T>(
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    tokio::time::timeout(OP_LIMIT, fut)
        .await
        .map_err(|_| format!("{what}: no answer within {OP_LIMIT:?} (hang)"))
}

/// Awaits all of `futures`, polling them in their order, so that requests
/// they make are sent in that order. (`futures::future::join_all` does so
/// only for a few futures; for more it polls them in no set order.)
pub async fn join_in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
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
pub async fn pipelined_writes(
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
pub fn payload(client: usize, op: u64) -> Bytes {
    Bytes::from(format!("c{client}-op{op}-{}", "x".repeat(200)))
}

/// Data shown in messages: the distinct prefix only.
pub fn show(data: &[u8]) -> String {
    let s = String::from_utf8_lossy(data);
    match s.find("-x") {
        Some(end) => s[..end].to_string(),
        None => s.chars().take(60).collect(),
    }
}

/// Names and contents of the regular files in `dir`.
pub fn read_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
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

/// Receivers of the clients' session states, marked seen now, so that a
/// later disconnection shows as a change.
pub fn watch_states(clients: &[Client]) -> Vec<watch::Receiver<SessionState>> {
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
pub async fn wait_resumed(
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
pub async fn join_load<T>(
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
pub async fn poll<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
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

/// Sets RLIMIT_FSIZE to `limit` bytes in the child (and ignores SIGXFSZ, so
/// that writes past it fail with EFBIG, as on a full disk).
pub fn limit_file_size(cmd: &mut Command, limit: u64) {
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
