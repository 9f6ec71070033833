//! A command run under `baton lock` dies with its supervisor, however
//! `baton` itself ends (DESIGN.md invariant 6).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use crate::common::{baton, eventually, exit_within, running, Served};

/// A command that ignores every polite signal, starts a grandchild that
/// does the same and a daemon that does too (forked twice, in a session of
/// its own, so outside the command's process group and no longer its
/// descendant by parentage), prints the three pids and waits.
const STUBBORN: &str = "trap '' TERM HUP INT; sleep 1000 & g=$!; \
    d=$(sh -c 'setsid sleep 1000 >/dev/null 2>&1 & echo $!'); echo $$ $g $d; wait";

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(pid as i32, sig) };
}

/// `baton lock PATH -- sh -c SCRIPT`, once the script has printed its
/// line; returns baton and the pids on that line.
fn lock_running(s: &Served, path: &str, script: &str, env: &[(&str, &str)]) -> (Child, Vec<u32>) {
    let mut child = baton()
        .args(["--server", &s.addr, "lock", "--session-timeout", "2000"])
        .args(["--kill-grace", "300", path, "--", "sh", "-c", script])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pids = line
        .split_whitespace()
        .map(|p| p.parse().unwrap_or_else(|_| panic!("pids, not {line:?}")))
        .collect();
    (child, pids)
}

/// Kills whatever a failed test leaves behind.
struct Reap(Vec<u32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            signal(pid, libc::SIGKILL);
        }
    }
}

#[test]
fn the_command_dies_when_baton_is_killed_with_sigkill() {
    let s = Served::start();
    let (mut supervisor, pids) = lock_running(&s, "/locks/kill9", STUBBORN, &[]);
    let _reap = Reap(pids.clone());
    assert_eq!(pids.len(), 3, "{pids:?}");
    signal(supervisor.id(), libc::SIGKILL);
    exit_within(&mut supervisor, 10);
    // The command, its grandchild and the daemon it double-forked.
    eventually(
        10,
        "the command and all it started to die with baton",
        || pids.iter().all(|&pid| !running(pid)),
    );
    // And the lock is free once the session is gone.
    eventually(10, "the lock to be free", || {
        s.ok(&["locks", "/locks/kill9"]).contains("free")
    });
}

/// Sends `sig` to a running `baton lock` and checks that it stops the
/// command and everything in its process group, then lets go of the lock.
fn dies_with_baton_on(sig: i32, path: &str) {
    let s = Served::start();
    let (mut supervisor, pids) = lock_running(&s, path, STUBBORN, &[]);
    let _reap = Reap(pids.clone());
    signal(supervisor.id(), sig);
    let status = exit_within(&mut supervisor, 10);
    assert_eq!(status.code(), Some(128 + libc::SIGKILL), "{status:?}");
    for pid in pids {
        assert!(!running(pid), "{pid} outlived baton");
    }
    assert!(s.ok(&["locks", path]).contains("free"));
}

#[test]
fn the_command_and_its_group_die_when_baton_gets_sighup() {
    dies_with_baton_on(libc::SIGHUP, "/locks/hup");
}

#[test]
fn the_command_and_its_group_die_when_baton_gets_sigterm() {
    dies_with_baton_on(libc::SIGTERM, "/locks/term");
}

#[test]
fn the_command_and_its_group_die_when_baton_gets_sigint() {
    dies_with_baton_on(libc::SIGINT, "/locks/int");
}

#[test]
fn the_command_and_its_group_die_when_baton_panics() {
    if !cfg!(debug_assertions) {
        eprintln!("skipped: baton panics on request only in debug builds");
        return;
    }
    let s = Served::start();
    let (mut supervisor, pids) = lock_running(
        &s,
        "/locks/panic",
        STUBBORN,
        &[("BATON_TEST_PANIC_ON_SIGUSR1", "1")],
    );
    let _reap = Reap(pids.clone());
    signal(supervisor.id(), libc::SIGUSR1);
    let status = exit_within(&mut supervisor, 10);
    assert_eq!(status.code(), Some(101), "baton panicked: {status:?}");
    // Dead by the time baton is: the lock goes only after the reaper ends.
    for &pid in &pids {
        assert!(!running(pid), "{pid} outlived baton's panic");
    }
}

#[test]
fn what_the_command_leaves_running_is_killed_before_the_lock_is_released() {
    let s = Served::start();
    let (mut supervisor, pids) = lock_running(
        &s,
        "/locks/bg",
        "sleep 1000 & g=$!; d=$(sh -c 'setsid sleep 1000 >/dev/null 2>&1 & echo $!'); echo $g $d",
        &[],
    );
    let _reap = Reap(pids.clone());
    assert!(exit_within(&mut supervisor, 10).success());
    for pid in pids {
        assert!(!running(pid), "{pid} outlived the lock");
    }
    assert!(s.ok(&["locks", "/locks/bg"]).contains("free"));
}

#[test]
fn the_leaders_command_dies_when_baton_elect_is_killed_with_sigkill() {
    let s = Served::start();
    let mut supervisor = baton()
        .args([
            "--server",
            &s.addr,
            "elect",
            "/election/kill9",
            "--value",
            "v",
        ])
        .args(["--", "sh", "-c", STUBBORN])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(supervisor.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let _reap = Reap(pids.clone());
    signal(supervisor.id(), libc::SIGKILL);
    exit_within(&mut supervisor, 10);
    eventually(
        10,
        "the command and all it started to die with baton",
        || pids.iter().all(|&pid| !running(pid)),
    );
}
