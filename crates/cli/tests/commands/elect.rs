//! `baton elect` and `baton leader`, end to end.

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;

use crate::common::{baton, eventually, Served};

#[test]
fn elect_runs_the_command_as_leader_and_leader_shows_it() {
    let s = Served::start();
    assert_eq!(s.ok(&["leader", "/election/m"]), "none\n");
    let mut active = baton()
        .args([
            "--server",
            &s.addr,
            "elect",
            "/election/m",
            "--value",
            "host-a:1",
            "--",
            "sh",
            "-c",
        ])
        .arg("echo \"$BATON_FENCING_TOKEN $BATON_LEADER_VALUE $BATON_SERVER\"; read line; exit 7")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(active.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let token: u64 = fields[0].parse().unwrap();
    assert_eq!(fields[1], "host-a:1");
    assert_eq!(fields[2], s.addr);
    assert_eq!(
        s.ok(&["leader", "/election/m"]),
        format!("host-a:1 {token}\n")
    );
    drop(active.stdin.take()); // the command reads EOF and exits 7
    assert_eq!(active.wait().unwrap().code(), Some(7));
    assert_eq!(
        s.ok(&["leader", "/election/m"]),
        "none\n",
        "resigned on exit"
    );
}

#[test]
fn a_standby_takes_over_from_a_killed_leader_and_watchers_see_it() {
    let s = Served::start();
    let mut watch = baton()
        .args(["--server", &s.addr, "leader", "--watch", "/election/f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = BufReader::new(watch.stdout.take().unwrap()).lines();
    assert_eq!(seen.next().unwrap().unwrap(), "none");
    let mut active = baton()
        .args([
            "--server",
            &s.addr,
            "elect",
            "--session-timeout",
            "500",
            "/election/f",
            "--value",
            "a",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(active.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let first: u64 = first.trim().parse().unwrap();
    assert_eq!(seen.next().unwrap().unwrap(), format!("a {first}"));
    let mut standby = baton()
        .args([
            "--server",
            &s.addr,
            "elect",
            "/election/f",
            "--value",
            "b",
            "--",
            "sh",
            "-c",
        ])
        // It leads until its stdin closes: long enough to be watched.
        .arg("echo $BATON_FENCING_TOKEN; read line || true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(10, "the standby to queue", || {
        s.ok(&["locks", "/election/f"]).lines().count() == 2
    });
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(active.id() as i32, libc::SIGKILL) };
    active.wait().unwrap();
    let mut printed = String::new();
    BufReader::new(standby.stdout.take().unwrap())
        .read_line(&mut printed)
        .unwrap();
    let second: u64 = printed.trim().parse().unwrap();
    assert!(second > first);
    assert_eq!(seen.next().unwrap().unwrap(), format!("b {second}"));
    drop(standby.stdin.take()); // the standby's command ends: it resigns
    assert!(standby.wait().unwrap().success());
    assert_eq!(seen.next().unwrap().unwrap(), "none");
    unsafe { libc::kill(watch.id() as i32, libc::SIGINT) };
    assert!(watch.wait().unwrap().success());
}

#[test]
fn losing_leadership_stops_the_command_and_exits_125() {
    let s = Served::start();
    let mut running = baton()
        .args([
            "--server",
            &s.addr,
            "elect",
            "--kill-grace",
            "300",
            "/election/l",
            "--value",
            "x",
            "--",
        ])
        .args(["sh", "-c", "echo started; sleep 100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(running.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    let listing = s.ok(&["locks", "/election/l"]);
    let node = listing
        .split_whitespace()
        .find(|w| w.starts_with("/election/l/candidate-"))
        .unwrap()
        .to_string();
    s.ok(&["rm", &node]);
    assert_eq!(running.wait().unwrap().code(), Some(125));
    let mut stderr = String::new();
    running
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("lost leadership of /election/l"),
        "{stderr}"
    );
}

#[test]
fn a_bad_election_path_is_reported_as_typed() {
    let s = Served::start();
    for path in ["relative", "/election//m"] {
        let err = s.fails(&["elect", path, "--value", "v", "--", "true"]);
        assert!(err.contains(&format!("{path:?}")), "{err}");
        assert!(!err.contains("candidate-"), "an internal node name: {err}");
        let err = s.fails(&["leader", path]);
        assert!(err.contains(&format!("{path:?}")), "{err}");
    }
}

#[test]
fn a_command_that_cannot_be_run_leaves_no_leader_behind() {
    let s = Served::start();
    let out = s.run(&[
        "elect",
        "/election/missing",
        "--value",
        "v",
        "--",
        "/nonexistent/cmd",
    ]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        s.ok(&["leader", "/election/missing"]),
        "none\n",
        "the dead candidate still leads"
    );
    assert!(err.contains("\"/nonexistent/cmd\""), "{err}");
    assert_eq!(out.status.code(), Some(127), "{err}");
}

#[test]
fn a_kill_grace_that_does_not_fit_in_the_session_timeout_is_refused() {
    let s = Served::start();
    let err = s.fails(&[
        "elect",
        "--session-timeout",
        "2000",
        "--kill-grace",
        "1000",
        "/election/grace",
        "--value",
        "v",
        "--",
        "true",
    ]);
    assert!(err.contains("--kill-grace 1000 ms does not fit"), "{err}");
    assert_eq!(s.ok(&["leader", "/election/grace"]), "none\n");
}
