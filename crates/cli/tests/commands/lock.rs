//! `baton lock`, `baton locks` and `baton set --fence`, end to end.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use crate::common::{baton, eventually, exit_within, running, Served};

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Starts `baton lock PATH` holding the lock (no command); returns it and
/// the token it printed.
fn holder(s: &Served, path: &str, session_timeout_ms: u32) -> (Child, u64, BufReader<ChildStdout>) {
    let timeout = session_timeout_ms.to_string();
    holding(s, &["lock", "--session-timeout", &timeout, path])
}

#[test]
fn lock_runs_the_command_with_its_token_and_passes_its_status_on() {
    let s = Served::start();
    let out = s.run(&[
        "lock",
        "/locks/run",
        "--",
        "sh",
        "-c",
        "echo \"$BATON_FENCING_TOKEN $BATON_LOCK_PATH $BATON_SERVER\"; exit 3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    let token: u64 = fields[0].parse().expect("decimal token");
    assert!(token > 0);
    assert!(fields[1].starts_with("/locks/run/lock-"), "{stdout}");
    assert!(fields[1].ends_with(&format!("{token:010}")), "{stdout}");
    assert_eq!(fields[2], s.addr);
    // Released on exit: the queue is empty.
    assert!(s.ok(&["locks", "/locks/run"]).contains("free"));
}

#[test]
fn a_waiter_times_out_with_status_124_and_locks_shows_the_queue() {
    let s = Served::start();
    let (mut held, token, _out) = holder(&s, "/locks/busy", 10_000);
    let listing = s.ok(&["locks", "/locks/busy"]);
    let first = listing.lines().next().unwrap();
    assert!(first.starts_with("holder"), "{listing}");
    assert!(first.contains(&format!("token {token}")), "{listing}");
    assert!(first.contains("pid "), "{listing}");
    let out = s.run(&["lock", "--timeout", "200", "/locks/busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    // The same with a unit.
    let out = s.run(&["lock", "--timeout", "0.2s", "/locks/busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(
        s.ok(&["locks", "/locks/busy"]).lines().count(),
        1,
        "the timed-out waiter left"
    );
    signal(&held, libc::SIGINT);
    assert!(held.wait().unwrap().success());
    assert!(s.ok(&["locks", "/locks/busy"]).contains("free"));
}

#[test]
fn a_holder_killed_with_sigkill_is_succeeded_after_its_session_timeout() {
    let s = Served::start();
    let (mut first, first_token, _out) = holder(&s, "/locks/kill9", 500);
    let mut next = baton()
        .args([
            "--server",
            &s.addr,
            "lock",
            "/locks/kill9",
            "--",
            "sh",
            "-c",
            "echo $BATON_FENCING_TOKEN",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(10, "the second contender to queue", || {
        s.ok(&["locks", "/locks/kill9"]).lines().count() == 2
    });
    signal(&first, libc::SIGKILL);
    first.wait().unwrap();
    let status = next.wait().unwrap();
    assert!(status.success());
    let mut printed = String::new();
    next.stdout
        .take()
        .unwrap()
        .read_to_string(&mut printed)
        .unwrap();
    let token: u64 = printed.trim().parse().unwrap();
    assert!(token > first_token, "{token} after {first_token}");
}

#[test]
fn a_stopped_holders_late_fenced_write_is_refused() {
    let s = Served::start();
    s.ok(&["create", "/data", "initial"]);
    let (mut paused, old_token, _out) = holder(&s, "/locks/gc", 400);
    s.ok(&[
        "set",
        "/data",
        "from the first holder",
        "--fence",
        &old_token.to_string(),
    ]);
    // The holder is paused past its session timeout, as a long GC pause
    // would; meanwhile the lock passes on and the new holder writes.
    signal(&paused, libc::SIGSTOP);
    let exe = env!("CARGO_BIN_EXE_baton");
    let out = s.run(&[
        "lock",
        "--timeout",
        "10000",
        "/locks/gc",
        "--",
        "sh",
        "-c",
        "exec \"$0\" --server \"$BATON_SERVER\" set /data 'from the second holder' --fence \"$BATON_FENCING_TOKEN\"",
        exe,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The paused holder wakes and writes with its old token: refused.
    signal(&paused, libc::SIGCONT);
    let err = s.fails(&["set", "/data", "stale", "--fence", &old_token.to_string()]);
    assert!(err.contains("stale fencing token"), "{err}");
    assert!(err.contains(&old_token.to_string()), "{err}");
    assert_eq!(s.ok(&["get", "/data"]), "from the second holder");
    // The woken holder itself learns its lease is over.
    let status = paused.wait().unwrap();
    assert_eq!(status.code(), Some(125));
    let mut stderr = String::new();
    paused
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("lost the lock"), "{stderr}");
}

#[test]
fn losing_the_lock_stops_the_command_and_exits_125() {
    let s = Served::start();
    let mut running = baton()
        .args([
            "--server",
            &s.addr,
            "lock",
            "--kill-grace",
            "300",
            "/locks/lost",
            "--",
            "sh",
            "-c",
            "trap '' TERM; echo started; sleep 100",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(running.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    // Someone deletes the holder's node.
    let listing = s.ok(&["locks", "/locks/lost"]);
    let node = listing
        .split_whitespace()
        .find(|w| w.starts_with("/locks/lost/"))
        .unwrap()
        .to_string();
    s.ok(&["rm", &node]);
    // The command ignores SIGTERM, so it takes the SIGKILL after the grace.
    let status = running.wait().unwrap();
    assert_eq!(status.code(), Some(125));
    let mut stderr = String::new();
    running
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("lost the lock /locks/lost"), "{stderr}");
}

#[test]
fn a_bad_lock_path_is_reported_as_typed() {
    let s = Served::start();
    for path in ["relative", "/locks/a//b", "/locks/./x"] {
        let err = s.fails(&["lock", path, "--", "true"]);
        assert!(err.contains(&format!("{path:?}")), "{err}");
        assert!(!err.contains("lock-"), "an internal node name: {err}");
    }
}

#[test]
fn a_command_that_cannot_be_run_leaves_the_lock_free_at_once() {
    let s = Served::start();
    let out = s.run(&["lock", "/locks/missing", "--", "/nonexistent/cmd", "x"]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        s.ok(&["locks", "/locks/missing"]).contains("free"),
        "the session outlived baton"
    );
    assert!(err.contains("\"/nonexistent/cmd\""), "{err}");
    assert_eq!(out.status.code(), Some(127), "{err}");
    // Found, but not executable.
    let file = std::env::temp_dir().join(format!("baton-not-executable-{}", std::process::id()));
    std::fs::write(&file, "data").unwrap();
    let file = file.to_str().unwrap().to_owned();
    let out = s.run(&["lock", "/locks/missing", "--", &file]);
    let _ = std::fs::remove_file(&file);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(s.ok(&["locks", "/locks/missing"]).contains("free"));
    assert!(err.contains(&format!("{file:?}")), "{err}");
    assert_eq!(out.status.code(), Some(126), "{err}");
}

#[test]
fn a_kill_grace_that_does_not_fit_in_the_session_timeout_is_refused() {
    let s = Served::start();
    let err = s.fails(&[
        "lock",
        "--session-timeout",
        "1000",
        "--kill-grace",
        "900",
        "/locks/grace",
        "--",
        "true",
    ]);
    assert!(err.contains("--kill-grace 900 ms does not fit"), "{err}");
    assert!(err.contains("session timeout of 1000 ms"), "{err}");
    assert!(err.contains("--kill-grace 400 or less"), "{err}");
    assert!(err.contains("--session-timeout 2250 or more"), "{err}");
}

#[test]
fn a_silent_server_gets_the_command_killed_before_it_may_expire_the_session() {
    let s = Served::start();
    let timeout = Duration::from_millis(1000);
    let mut supervisor = baton()
        .args(["--server", &s.addr, "lock", "--session-timeout", "1000"])
        .args(["--kill-grace", "400", "/locks/silent", "--", "sh", "-c"])
        // Ignores SIGTERM, so only the SIGKILL ends it.
        .arg("trap '' TERM; echo $$; exec sleep 1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(supervisor.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().parse().unwrap();
    // The server stops: it hears nothing after this, so its session
    // deadline (and the client's) is at most a session timeout away.
    signal_pid(s.pid(), libc::SIGSTOP);
    let stopped = Instant::now();
    eventually(10, "the command to be killed", || !running(pid));
    let dead = stopped.elapsed();
    signal_pid(s.pid(), libc::SIGCONT);
    assert!(
        dead < timeout,
        "the command ran {dead:?} after the server stopped, past the session deadline"
    );
    assert_eq!(exit_within(&mut supervisor, 10).code(), Some(125));
    let mut stderr = String::new();
    supervisor
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("SIGTERM"), "{stderr}");
}

fn signal_pid(pid: u32, sig: i32) {
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Pins: `baton locks` does not show a holder whose session is silent or
/// disconnected as a healthy one: it says so, and when the session will
/// expire.
#[test]
fn locks_says_when_the_holders_session_is_silent_or_disconnected() {
    let s = Served::start();
    let (mut holding, _token, _out) = holder(&s, "/locks/quiet", 6000);
    let shown = s.ok(&["locks", "/locks/quiet"]);
    assert!(
        shown.starts_with("holder") && !shown.contains('['),
        "{shown}"
    );
    // Paused: connected, but silent past half its timeout.
    signal(&holding, libc::SIGSTOP);
    let mut shown = String::new();
    eventually(10, "locks to call the stopped holder silent", || {
        shown = s.ok(&["locks", "/locks/quiet"]);
        shown.contains("[silent for")
    });
    assert!(shown.contains("expires in"), "{shown}");
    // Killed: its connection is gone, its session not yet.
    signal(&holding, libc::SIGKILL);
    holding.wait().unwrap();
    eventually(10, "locks to call the killed holder disconnected", || {
        shown = s.ok(&["locks", "/locks/quiet"]);
        shown.contains("[disconnected")
    });
    assert!(
        shown.starts_with("holder") && shown.contains("expires in"),
        "{shown}"
    );
    // And once the session expires the lock is free.
    eventually(20, "the lock to be free", || {
        s.ok(&["locks", "/locks/quiet"]).contains("free")
    });
}

/// Starts `baton ARGS...` holding a lock or permit (no command); returns it,
/// the token it printed and the rest of its output.
fn holding(s: &Served, args: &[&str]) -> (Child, u64, BufReader<ChildStdout>) {
    let mut child = baton()
        .args(["--server", &s.addr])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let token = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a token, not {line:?}"));
    (child, token, out)
}

#[test]
fn shared_holders_read_together_a_writer_waits_and_locks_lists_readers() {
    let s = Served::start();
    let (mut r1, t1, _o1) = holding(&s, &["lock", "--shared", "/locks/rw"]);
    let (mut r2, t2, _o2) = holding(&s, &["lock", "--shared", "/locks/rw"]);
    assert!(t2 > t1, "tokens are ordered across readers");
    let out = s.run(&["lock", "--timeout", "200ms", "/locks/rw", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(124),
        "a writer waits for the readers"
    );
    let listing = s.ok(&["locks", "/locks/rw"]);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 2, "{listing}");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("holder") && l.contains("reader")),
        "{listing}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["locks", "--json", "/locks/rw"])).unwrap();
    assert_eq!(json[0]["kind"], "reader", "{json}");
    assert_eq!(json[1]["role"], "holder", "{json}");
    // A waiting writer is listed as one, behind the readers.
    let mut writer = baton()
        .args(["--server", &s.addr, "lock", "/locks/rw", "--", "true"])
        .spawn()
        .unwrap();
    eventually(10, "the writer to queue", || {
        s.ok(&["locks", "/locks/rw"])
            .lines()
            .nth(2)
            .is_some_and(|l| l.starts_with("waiter 1") && l.contains("writer"))
    });
    for r in [&r1, &r2] {
        signal(r, libc::SIGTERM);
    }
    assert!(
        exit_within(&mut writer, 10).success(),
        "the writer runs once the readers leave"
    );
    exit_within(&mut r1, 10);
    exit_within(&mut r2, 10);
}

#[test]
fn a_semaphore_admits_its_permits_runs_the_command_and_refuses_another_count() {
    let s = Served::start();
    let out = s.run(&[
        "semaphore",
        "--permits",
        "2",
        "/sem/jobs",
        "--",
        "sh",
        "-c",
        "echo $BATON_FENCING_TOKEN",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (mut a, ta, _oa) = holding(&s, &["semaphore", "--permits", "2", "/sem/jobs"]);
    let (mut b, tb, _ob) = holding(&s, &["semaphore", "--permits", "2", "/sem/jobs"]);
    assert!(token < ta && ta < tb);
    let out = s.run(&[
        "semaphore",
        "--permits",
        "2",
        "--timeout",
        "200ms",
        "/sem/jobs",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(124), "both permits are held");
    let err = s.fails(&["semaphore", "--permits", "3", "/sem/jobs", "--", "true"]);
    assert!(
        err.contains("2 permits") && err.contains("3 permits"),
        "{err}"
    );
    let listing = s.ok(&["locks", "/sem/jobs"]);
    assert_eq!(
        listing
            .lines()
            .filter(|l| l.starts_with("holder") && l.contains("permit"))
            .count(),
        2,
        "{listing}"
    );
    let zero = s.run(&["semaphore", "--permits", "0", "/sem/jobs"]);
    assert_eq!(zero.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--permits"));
    for c in [&a, &b] {
        signal(c, libc::SIGTERM);
    }
    exit_within(&mut a, 10);
    exit_within(&mut b, 10);
    assert!(s.ok(&["locks", "/sem/jobs"]).contains("free"));
}

#[test]
fn lock_delay_is_set_by_baton_lock_and_shown_by_baton_locks() {
    let s = Served::start();
    s.ok(&["lock", "--lock-delay", "5s", "/locks/ld", "--", "true"]);
    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["locks", "--all", "--json"])).unwrap();
    assert_eq!(json[0]["lock"], "/locks/ld", "{json}");
    assert_eq!(json[0]["lock_delay_ms"], 5000, "{json}");
    assert!(s.ok(&["locks", "--all"]).contains("/locks/ld (lock-delay"));
    let err = s.fails(&["lock", "--lock-delay", "11m", "/locks/ld", "--", "true"]);
    assert!(err.contains("longer than the most allowed"), "{err}");
}
