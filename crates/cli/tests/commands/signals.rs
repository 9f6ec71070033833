//! Every long-running command ends its session on SIGINT, SIGTERM and SIGHUP
//! alike (what a terminal, a service manager or a closed terminal sends),
//! then exits with status 0: nothing it held lingers for a session timeout.

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;

use crate::common::{baton, exit_within, Served};

const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Sessions open on the server, not counting the one that asks.
fn open_sessions(s: &Served) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = baton_client::Client::connect(&s.addr).await.unwrap();
        let stats = client.server_stats().await.unwrap();
        client.close().await;
        stats["sessions"] - 1
    })
}

/// Which stream says that the command is running, by its first line.
#[derive(Clone, Copy)]
enum Ready {
    Stdout,
    Stderr,
}

/// Runs `baton ARGS`, waits until it is ready, sends it `sig`, and checks
/// that it exits with status 0 having closed its session.
fn ends_its_session_on(s: &Served, sig: i32, args: &[&str], ready: Ready) {
    let mut child = baton()
        .args(["--server", &s.addr])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    match ready {
        Ready::Stdout => BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line),
        Ready::Stderr => BufReader::new(child.stderr.as_mut().unwrap()).read_line(&mut line),
    }
    .unwrap();
    assert!(!line.is_empty(), "baton {args:?} said nothing");
    assert_eq!(open_sessions(s), 1, "baton {args:?} has its session");
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(child.id() as i32, sig) };
    let status = exit_within(&mut child, 10);
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    assert!(
        status.success(),
        "baton {args:?} on signal {sig}: {status:?} {stderr}"
    );
    assert_eq!(
        open_sessions(s),
        0,
        "baton {args:?} left its session open on signal {sig}"
    );
}

#[test]
fn ephemeral_create_ends_its_session_on_every_stop_signal() {
    let s = Served::start();
    for sig in SIGNALS {
        let path = format!("/eph-{sig}");
        ends_its_session_on(&s, sig, &["create", "--ephemeral", &path], Ready::Stdout);
        let err = s.fails(&["get", &path]);
        assert!(err.contains("no node"), "{err}");
    }
}

#[test]
fn watch_ends_its_session_on_every_stop_signal() {
    let s = Served::start();
    for sig in SIGNALS {
        ends_its_session_on(&s, sig, &["watch", "/watched"], Ready::Stderr);
    }
}

#[test]
fn a_held_lock_is_let_go_on_every_stop_signal() {
    let s = Served::start();
    for sig in SIGNALS {
        ends_its_session_on(&s, sig, &["lock", "/locks/held"], Ready::Stdout);
        assert!(s.ok(&["locks", "/locks/held"]).contains("free"));
    }
}

#[test]
fn leadership_is_let_go_on_every_stop_signal() {
    let s = Served::start();
    for sig in SIGNALS {
        let args = ["elect", "/election/held", "--value", "v"];
        ends_its_session_on(&s, sig, &args, Ready::Stdout);
        assert_eq!(s.ok(&["leader", "/election/held"]), "none\n");
    }
}

#[test]
fn leader_watch_ends_its_session_on_every_stop_signal() {
    let s = Served::start();
    for sig in SIGNALS {
        let args = ["leader", "--watch", "/election/watched"];
        ends_its_session_on(&s, sig, &args, Ready::Stdout);
    }
}

/// A signal while `baton barrier` runs its command is passed on to the
/// command; baton exits with the command's status at once, without waiting
/// for other parties, and its party leaves with its session.
#[test]
fn barrier_passes_a_signal_on_to_its_command_and_leaves() {
    let s = Served::start();
    for sig in SIGNALS {
        let mut child = baton()
            .args([
                "--server",
                &s.addr,
                "barrier",
                "/barriers/sig",
                "--parties",
                "1",
                "--",
            ])
            .args(["sh", "-c", "echo started; exec sleep 30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "started\n");
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = exit_within(&mut child, 5);
        assert_eq!(status.code(), Some(128 + sig), "signal {sig}: {status:?}");
        assert_eq!(open_sessions(&s), 0, "signal {sig}: the session is closed");
    }
}
