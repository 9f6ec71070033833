//! The `baton` binary end to end: a `baton serve` child process and the
//! client commands against it.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::Stdio;

use common::{baton, Served};

#[test]
fn client_commands_create_read_change_and_remove_nodes() {
    let s = Served::start();
    assert_eq!(s.ok(&["create", "/app", "config-v1"]), "/app\n");
    assert_eq!(s.ok(&["get", "/app"]), "config-v1");
    s.ok(&["set", "/app", "config-v2"]);
    assert_eq!(s.ok(&["get", "/app"]), "config-v2");
    let seq = s.ok(&["create", "--sequential", "/app/job-", "x"]);
    assert!(
        seq.starts_with("/app/job-") && seq.trim_end().len() == "/app/job-".len() + 10,
        "{seq}"
    );
    s.ok(&["create", "/app/b"]);
    let listing = s.ok(&["ls", "/app"]);
    let names: Vec<&str> = listing.lines().collect();
    assert_eq!(names.len(), 2);
    assert_eq!(names[0], "b");
    let stat = s.ok(&["stat", "/app"]);
    assert!(stat.contains("version         1"), "{stat}");
    assert!(stat.contains("numChildren     2"), "{stat}");
    s.ok(&["rm", "/app/b"]);
    s.ok(&["rm", seq.trim_end()]);
    s.ok(&["rm", "/app"]);
    let err = s.fails(&["get", "/app"]);
    assert!(err.contains("no node") && err.contains("/app"), "{err}");
}

#[test]
fn failures_name_what_was_wrong_in_one_line() {
    let s = Served::start();
    let err = s.fails(&["get", "relative/path"]);
    assert!(err.contains("invalid path"), "{err}");
    s.ok(&["create", "/p"]);
    s.ok(&["create", "/p/c"]);
    let err = s.fails(&["rm", "/p"]);
    assert!(err.contains("not empty") && err.contains("/p"), "{err}");
    let err = s.fails(&["set", "/p", "x", "--version", "7"]);
    assert!(err.contains("bad version"), "{err}");
    let err = s.fails(&["create", "/p"]);
    assert!(err.contains("already exists"), "{err}");
}

#[test]
fn an_unreachable_server_is_reported_with_a_hint() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = baton()
        .args(["--server", &format!("127.0.0.1:{port}"), "ls", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("cannot connect") && err.contains("baton serve"),
        "{err}"
    );
}

#[test]
fn ephemeral_create_holds_the_node_until_interrupted_and_watch_reports_changes() {
    let s = Served::start();
    s.ok(&["create", "/w"]);
    let mut watch = baton()
        .args(["--server", &s.addr, "watch", "/w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The watcher says on stderr when its watches are set.
    let mut ready = String::new();
    BufReader::new(watch.stderr.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert!(ready.contains("watching /w"), "{ready}");

    let mut holder = baton()
        .args(["--server", &s.addr, "create", "--ephemeral", "/w/e", "held"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut created = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut created)
        .unwrap();
    assert_eq!(created, "/w/e\n");
    assert_eq!(s.ok(&["get", "/w/e"]), "held");
    // SIGINT ends the holder's session; its ephemeral node goes with it.
    unsafe { libc::kill(holder.id() as i32, libc::SIGINT) };
    assert!(holder.wait().unwrap().success());
    let err = s.fails(&["get", "/w/e"]);
    assert!(err.contains("no node"), "{err}");

    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(
        first.starts_with("children-changed /w revision "),
        "{first}"
    );
    unsafe { libc::kill(watch.id() as i32, libc::SIGINT) };
    assert!(watch.wait().unwrap().success());
}

#[test]
fn bench_ops_reports_every_measurement_as_json() {
    let out = baton()
        .args([
            "bench",
            "ops",
            "--pings",
            "200",
            "--clients",
            "1,4",
            "--duration-ms",
            "200",
            "--sessions",
            "200",
            "--json",
        ])
        .env_remove("BATON_SERVER")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "tcp_floor_rtt",
        "ping_rtt_client",
        "ping_rtt_raw",
        "ping_over_floor_p50",
    ] {
        assert!(report.get(key).is_some(), "missing {key}: {report}");
    }
    assert_eq!(report["create_delete"].as_array().unwrap().len(), 2);
    assert!(report["create_delete"][1]["pairs"].as_u64().unwrap() > 0);
    assert_eq!(report["memory"]["sessions"].as_u64(), Some(200));
}
