//! A `baton serve` child process for the CLI tests.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn baton() -> Command {
    Command::new(env!("CARGO_BIN_EXE_baton"))
}

/// A `baton serve` child on a free port, killed on drop.
pub struct Served {
    child: Child,
    pub addr: String,
    dir: PathBuf,
}

impl Served {
    pub fn start() -> Served {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("baton-cli-test-{}-{n}", std::process::id()));
        // Port 0: the server takes a free port and says which.
        let mut child = baton()
            .args([
                "serve",
                "--min-session-timeout",
                "100",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start baton serve");
        let addr = listening_addr(&mut child);
        Served { child, addr, dir }
    }

    /// The server's process id (to stop it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn run(&self, args: &[&str]) -> Output {
        baton()
            .arg("--server")
            .arg(&self.addr)
            .args(args)
            .output()
            .expect("run baton")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "baton {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(out.status.code(), Some(1), "baton {args:?} should fail");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "one line on stderr: {err:?}");
        err
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The address a `baton serve` child says it listens on: the first line of
/// its stdout, which must be piped.
pub fn listening_addr(child: &mut Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .expect("read baton serve's stdout");
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("baton serve did not say where it listens: {line:?}"))
        .to_owned()
}

/// A loopback address whose port was free a moment ago (see
/// [`free_ports`]).
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_ports(1))
}

/// The first of `n` consecutive loopback ports that are free now, below
/// the kernel's range of ephemeral ports: a port the kernel hands out is
/// free again once probed, and a connection another test opens meanwhile
/// could be given it before the process it is meant for listens on it.
pub fn free_ports(n: u16) -> u16 {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral.saturating_sub(n).max(10_001));
    // Where to start looking: a different place for each process, and
    // calls of one process (tests run side by side) 211 ports apart.
    static BASE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            ^ std::process::id().wrapping_mul(2_654_435_761)
    });
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let seed = base.wrapping_add(call.wrapping_mul(211));
    for i in 0..200u32 {
        let first =
            low + ((seed.wrapping_add(i.wrapping_mul(7919)) % u32::from(high - low)) as u16);
        let held: Vec<_> = (first..first + n)
            .map_while(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == usize::from(n) {
            return first;
        }
    }
    panic!("no {n} consecutive free ports between {low} and {high}");
}

/// A fresh, empty directory for one test's files, removed when the guard
/// is dropped.
#[allow(unused_imports)]
pub use baton_testkit::scratch;

/// Stops a `baton serve` child with SIGTERM; it must exit 0 within `secs`
/// seconds.
pub fn stop(mut child: Child, secs: u64) {
    // SAFETY: kill(2) on a child process id.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(exit_within(&mut child, secs).success());
}

/// Polls `check` every 10 ms until it holds, failing after `secs` seconds.
pub fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True while `pid` runs (a zombie does not count: it has finished).
pub fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 2..].chars().next();
            !matches!(state, Some('Z' | 'X'))
        }
        Err(_) => false,
    }
}

/// Waits for `child` to exit, failing after `secs` seconds.
pub fn exit_within(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let mut status = None;
    eventually(secs, "baton to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}
