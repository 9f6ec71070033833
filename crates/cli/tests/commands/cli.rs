//! The `baton` binary end to end: a `baton serve` child process and the
//! client commands against it.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use crate::common::{baton, free_addr, scratch, stop, Served};

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
fn set_prints_the_new_version_with_json_and_a_stale_fence_is_refused() {
    let s = Served::start();
    s.ok(&["create", "/res", "v0"]);
    let out: serde_json::Value =
        serde_json::from_str(&s.ok(&["set", "--json", "--fence", "7", "/res", "v1"])).unwrap();
    assert_eq!(out["path"], "/res");
    assert_eq!(out["stat"]["version"], 1);
    let err = s.fails(&["set", "--json", "--fence", "6", "/res", "v2"]);
    assert!(err.contains("stale fencing token"), "{err}");
    assert_eq!(s.ok(&["get", "/res"]), "v1");
    // Without --json, nothing on stdout.
    assert_eq!(s.ok(&["set", "--fence", "7", "/res", "v3"]), "");
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
    let out = baton()
        .args(["--server", &free_addr(), "ls", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("cannot connect") && err.contains("baton serve"),
        "{err}"
    );
}

/// Starts `baton watch ARGS...` and returns once it says on stderr (with
/// `ready`) that its watch is set.
fn start_watch(s: &Served, args: &[&str], ready: &str) -> std::process::Child {
    let mut watch = baton()
        .args(["--server", &s.addr, "watch"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    BufReader::new(watch.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert!(said.contains(ready), "{said}");
    watch
}

#[test]
fn ephemeral_create_holds_the_node_until_interrupted_and_watch_reports_changes() {
    let s = Served::start();
    s.ok(&["create", "/w"]);
    let mut watch = start_watch(&s, &["/w"], "watching /w");

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
        first.starts_with("children-changed /w revision ") && first.ends_with(": +e"),
        "{first}"
    );
    let second = lines.next().unwrap().unwrap();
    assert!(second.ends_with(": -e"), "{second}");
    unsafe { libc::kill(watch.id() as i32, libc::SIGINT) };
    assert!(watch.wait().unwrap().success());
}

/// `baton watch --recursive --json` prints every creation, deletion and
/// data change below the path, one object per line, in order.
#[test]
fn watch_recursive_prints_every_change_below_the_path_as_json() {
    let s = Served::start();
    let mut watch = start_watch(&s, &["--recursive", "--json", "/tree"], "and below");
    s.ok(&["create", "/tree"]);
    s.ok(&["create", "/tree/a", "one"]);
    s.ok(&["set", "/tree/a", "two"]);
    s.ok(&["rm", "/tree/a"]);
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let line: serde_json::Value =
            serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        seen.push((
            line["kind"].as_str().unwrap().to_owned(),
            line["path"].as_str().unwrap().to_owned(),
        ));
        assert!(line["revision"].as_u64().unwrap() > 0, "{line}");
    }
    let seen: Vec<(&str, &str)> = seen.iter().map(|(k, p)| (k.as_str(), p.as_str())).collect();
    assert_eq!(
        seen,
        [
            ("created", "/tree"),
            ("created", "/tree/a"),
            ("data-changed", "/tree/a"),
            ("deleted", "/tree/a"),
        ]
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

/// `bench reads` asked for more watchers than this process may open files
/// for says so at once, naming the limit, and starts no server.
#[test]
fn bench_reads_refuses_more_watchers_than_open_files_allow() {
    let out = baton()
        .args([
            "bench",
            "reads",
            "--members",
            "1",
            "--watchers",
            "100000000",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--watchers 100000000") && stderr.contains("ulimit -n"),
        "{stderr}"
    );
    assert!(!stderr.contains("bench: starting"), "{stderr}");
}

/// `bench reads` on one server and a 3-member cluster (and an observer)
/// whose followers serve: one JSON object per run, the cluster once per
/// read mode, each having read and told its watchers, two of which are
/// the observer's.
#[test]
fn bench_reads_reports_each_run_and_read_mode_as_json() {
    let out = baton()
        .args([
            "bench",
            "reads",
            "--members",
            "3",
            "--observers",
            "1",
            "--followers-serve",
            "true",
            "--clients",
            "2",
            "--nodes",
            "4",
            "--duration-ms",
            "200",
            "--watchers",
            "8",
            "--fanouts",
            "1",
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
    let runs: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(u64, &str)> = runs
        .iter()
        .map(|r| {
            (
                r["members"].as_u64().unwrap(),
                r["read_mode"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [(1, "linearizable"), (3, "linearizable"), (3, "sequential")]
    );
    for run in &runs {
        assert!(run["failed"].is_null(), "{run}");
        assert!(run["reads_per_s"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["fanout"]["p50_us"].as_f64().is_some(), "{run}");
        let observers = u64::from(run["members"] == 3);
        assert_eq!(run["observers"].as_u64(), Some(observers), "{run}");
    }
}

/// `bench reads --raw-watchers`: watchers that speak the protocol on
/// sockets of their own are told of every change too, also on a cluster
/// whose followers send them to the leader.
#[test]
fn bench_reads_raw_watchers_are_told_and_follow_the_leader() {
    let out = baton()
        .args([
            "bench",
            "reads",
            "--members",
            "3",
            "--followers-serve",
            "false",
            "--read-modes",
            "sequential",
            "--clients",
            "2",
            "--nodes",
            "2",
            "--duration-ms",
            "100",
            "--watchers",
            "9",
            "--fanouts",
            "2",
            "--raw-watchers",
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
    let runs: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    for run in &runs {
        assert!(run["failed"].is_null(), "{run}");
        assert_eq!(run["watcher_client"], "raw", "{run}");
        assert_eq!(run["fanout"]["count"].as_u64(), Some(2), "{run}");
    }
}

/// `bench reads --zookeeper`, with raw watchers and without, measures a
/// ZooKeeper server as ZooKeeper's clients see it: here Baton's own
/// ZooKeeper listener, so that the ZooKeeper side of the benchmark runs
/// wherever the tests do.
#[test]
fn bench_reads_measures_a_zookeeper_server_with_either_kind_of_watcher() {
    let dir = scratch("bench-reads-zk");
    let zk = free_addr();
    let mut server = baton()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--zk-listen",
            &zk,
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _addr = crate::common::listening_addr(&mut server);
    for raw in [false, true] {
        let mut args = vec![
            "bench",
            "reads",
            "--members",
            "1",
            "--zookeeper",
            &zk,
            "--clients",
            "2",
            "--nodes",
            "2",
            "--duration-ms",
            "100",
            "--watchers",
            "6",
            "--fanouts",
            "2",
            "--json",
        ];
        if raw {
            args.push("--raw-watchers");
        }
        let out = baton()
            .args(&args)
            .env_remove("BATON_SERVER")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let runs: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let zookeeper = runs.iter().find(|r| r["server"] == "zookeeper");
        let zookeeper = zookeeper.unwrap_or_else(|| panic!("no ZooKeeper run: {runs:?}"));
        assert!(zookeeper["failed"].is_null(), "{zookeeper}");
        assert!(
            zookeeper["reads_per_s"].as_f64().unwrap() > 0.0,
            "{zookeeper}"
        );
        assert_eq!(
            zookeeper["fanout"]["count"].as_u64(),
            Some(2),
            "{zookeeper}"
        );
        let how = if raw { "raw" } else { "library" };
        assert_eq!(zookeeper["watcher_client"], how, "{zookeeper}");
    }
    stop(server, 10);
}

#[test]
fn help_describes_every_command_in_its_own_words() {
    let out = baton().arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let listed: Vec<(String, String)> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let l = l.trim();
            let (name, text) = l.split_once(' ').unwrap_or((l, ""));
            (name.to_owned(), text.trim().to_owned())
        })
        .collect();
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "serve",
        "create",
        "get",
        "set",
        "ls",
        "stat",
        "rm",
        "txn",
        "barrier",
        "watch",
        "lock",
        "semaphore",
        "locks",
        "elect",
        "leader",
        "bench",
    ] {
        assert!(names.contains(&name), "{name} is not listed:\n{help}");
    }
    let mut seen = std::collections::HashSet::new();
    for (name, text) in &listed {
        assert!(!text.is_empty(), "{name} has no description:\n{help}");
        assert!(
            seen.insert(text.clone()),
            "{name} shares its description {text:?}:\n{help}"
        );
    }
}

/// Runs `baton ARGS` with its stdout on a new pseudo-terminal and returns
/// what the terminal received.
fn on_a_terminal(s: &Served, args: &[&str]) -> Vec<u8> {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors into the integers given.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are fresh and owned here.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let status = baton()
        .args(["--server", &s.addr])
        .args(args)
        .stdout(Stdio::from(slave))
        .status()
        .unwrap();
    assert!(status.success());
    // The terminal holds what was written; reading past it fails (EIO)
    // once nobody has the other end open.
    let mut master = std::fs::File::from(master);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = master.read(&mut buf) {
        got.extend_from_slice(&buf[..n]);
    }
    got
}

#[test]
fn get_ends_its_output_with_a_newline_on_a_terminal_only() {
    let s = Served::start();
    s.ok(&["create", "/t", "config-v1"]);
    // A terminal turns "\n" into "\r\n".
    assert_eq!(on_a_terminal(&s, &["get", "/t"]), b"config-v1\r\n");
    assert_eq!(s.ok(&["get", "/t"]), "config-v1", "raw bytes when piped");
    s.ok(&["set", "/t", "line\n"]);
    assert_eq!(on_a_terminal(&s, &["get", "/t"]), b"line\r\n");
}

/// Runs `baton ARGS` with `input` on its stdin.
fn with_stdin(s: &Served, args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = baton()
        .args(["--server", &s.addr])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // A baton that does not read its input closes the pipe early; what it
    // stored then tells.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

#[test]
fn create_and_set_take_data_past_the_argument_limit_from_stdin_or_a_file() {
    let s = Served::start();
    // More than the operating system lets an argument be, and not text.
    let big: Vec<u8> = (0..300 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let get = |path: &str| s.run(&["get", path]).stdout;

    let out = with_stdin(&s, &["create", "/from-stdin", "-"], &big);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"/from-stdin\n");
    assert!(get("/from-stdin") == big, "create -: the data differs");

    let other: Vec<u8> = big.iter().rev().copied().collect();
    let out = with_stdin(&s, &["set", "/from-stdin", "-"], &other);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(get("/from-stdin") == other, "set -: the data differs");

    let file = std::env::temp_dir().join(format!("baton-data-{}", std::process::id()));
    std::fs::write(&file, &big).unwrap();
    let file_arg = file.to_str().unwrap();
    s.ok(&["create", "/from-file", "--file", file_arg]);
    assert!(get("/from-file") == big, "create --file: the data differs");
    std::fs::write(&file, &other).unwrap();
    s.ok(&["set", "/from-file", "--file", file_arg]);
    assert!(get("/from-file") == other, "set --file: the data differs");
    std::fs::remove_file(&file).unwrap();

    let err = s.fails(&["set", "/from-file", "--file", file_arg]);
    assert!(err.contains(file_arg), "{err}");
}

#[test]
fn status_shows_the_server_at_a_glance_and_fails_when_none_answers() {
    let s = Served::start();
    s.ok(&["create", "/status-a", "x"]);
    s.ok(&["create", "/status-a/b", "y"]);
    let json: serde_json::Value = serde_json::from_str(&s.ok(&["status", "--json"])).unwrap();
    assert_eq!(json["role"], "single");
    assert_eq!(json["nodes"].as_u64(), Some(3), "{json}");
    assert_eq!(json["sessions"].as_u64(), Some(0), "{json}");
    assert_eq!(json["fsync"], "always");
    assert!(
        json["recent_syncs"]["syncs"].as_u64().unwrap() >= 2,
        "{json}"
    );
    assert!(json["storage"]["log_bytes"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));

    let table = s.ok(&["status"]);
    for want in [
        "a single server, up ",
        "nodes        3",
        "fsync        always; latest ",
        "storage      ",
    ] {
        assert!(table.contains(want), "no {want:?} in:\n{table}");
    }

    // Nobody there: exit 1 and say so.
    let out = baton()
        .args(["--server", &free_addr(), "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no server answered"), "{err}");
}

#[test]
fn locks_all_shows_the_busiest_locks_with_their_figures() {
    let s = Served::start();
    assert!(s
        .ok(&["locks", "--all"])
        .contains("no lock has been granted"));
    for _ in 0..3 {
        s.ok(&["lock", "/locks/busy", "--", "true"]);
    }
    s.ok(&["lock", "/locks/quiet", "--", "true"]);
    let table = s.ok(&["locks", "--all"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("lock"), "{table}");
    let busy: Vec<&str> = lines[1].split_whitespace().collect();
    // lock, queue, holders, token, grants, then the two averages.
    assert_eq!(
        &busy[..5],
        ["/locks/busy", "0", "0", "free", "3"],
        "{table}"
    );
    assert!(lines[2].starts_with("/locks/quiet"), "{table}");
    let status = s.ok(&["status"]);
    assert!(
        status.contains("busiest      /locks/busy (queue 0, 3 grants)"),
        "{status}"
    );
}

/// Pins: output piped into a reader that exits early ends the command
/// quietly (killed by SIGPIPE, as other Unix tools are), not with a panic.
#[test]
fn output_into_a_reader_that_exits_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    let s = Served::start();
    s.ok(&["create", "/many"]);
    // Enough children that the listing outgrows the pipe's buffer.
    let name = "n".repeat(1800);
    for i in 0..40 {
        s.ok(&["create", &format!("/many/{name}{i}")]);
    }
    let mut child = baton()
        .args(["--server", &s.addr, "ls", "/many"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is gone (its end of the pipe dropped above).
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.is_empty(), "{err}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}",
        out.status
    );
}

/// Pins the everyday commands and flags: delete (rm's other name), rm -r,
/// ls -R, --json on ls, get, stat, locks and leader, get --watch, watch
/// printing the new value, and locks without a path.
#[test]
fn everyday_commands_delete_trees_list_trees_and_speak_json() {
    let s = Served::start();
    for path in ["/t", "/t/a", "/t/a/x", "/t/b"] {
        s.ok(&["create", path, "v"]);
    }
    assert_eq!(s.ok(&["ls", "-R", "/t"]), "/t/a\n/t/b\n/t/a/x\n");
    let json: serde_json::Value = serde_json::from_str(&s.ok(&["ls", "--json", "/t"])).unwrap();
    assert_eq!(json, serde_json::json!(["a", "b"]));
    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["ls", "-R", "--json", "/t"])).unwrap();
    assert_eq!(json, serde_json::json!(["/t/a", "/t/b", "/t/a/x"]));
    let json: serde_json::Value = serde_json::from_str(&s.ok(&["get", "--json", "/t/a"])).unwrap();
    assert_eq!(json["data"], "v");
    assert_eq!(json["stat"]["numChildren"], 1);
    let json: serde_json::Value = serde_json::from_str(&s.ok(&["stat", "--json", "/t"])).unwrap();
    assert_eq!(json["numChildren"], 2);
    // Data that is not text comes as base64.
    let out = with_stdin(&s, &["set", "/t/b", "-"], &[0xff, 0x00, 0x80]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_str(&s.ok(&["get", "--json", "/t/b"])).unwrap();
    assert_eq!(json["data_base64"], "/wCA");
    // A node with children is not deleted without -r; with it, the tree goes.
    let err = s.fails(&["delete", "/t"]);
    assert!(err.contains("not empty"), "{err}");
    s.ok(&["rm", "-r", "/t"]);
    assert!(s.fails(&["get", "/t"]).contains("no node"));
    let err = s.fails(&["rm", "-r", "/"]);
    assert!(err.contains("refusing"), "{err}");

    // locks and leader as JSON; locks without a path.
    let held = s.run(&["lock", "/locks/j", "--", "true"]);
    assert!(held.status.success());
    let json: serde_json::Value = serde_json::from_str(&s.ok(&["locks", "--json"])).unwrap();
    assert_eq!(json[0]["lock"], "/locks/j", "{json}");
    assert!(s.ok(&["locks"]).contains("/locks/j"));
    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["locks", "--json", "/locks/j"])).unwrap();
    assert_eq!(json, serde_json::json!([]));
    assert_eq!(s.ok(&["leader", "--json", "/election/none"]).trim(), "null");

    // get --watch: the value now and after each change.
    s.ok(&["create", "/g", "one"]);
    let mut watching = baton()
        .args(["--server", &s.addr, "get", "--watch", "/g"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watching.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "one");
    s.ok(&["set", "/g", "two"]);
    assert_eq!(lines.next().unwrap().unwrap(), "two");
    unsafe { libc::kill(watching.id() as i32, libc::SIGINT) };
    assert!(watching.wait().unwrap().success());

    // watch: the new data on the line.
    let mut watch = start_watch(&s, &["/g"], "watching /g");
    s.ok(&["set", "/g", "three"]);
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.starts_with("data-changed /g revision ") && line.ends_with(": three"),
        "{line}"
    );
    unsafe { libc::kill(watch.id() as i32, libc::SIGINT) };
    assert!(watch.wait().unwrap().success());
}

/// Pins: a server address without a port is named as such; the election
/// timeout's help says how long a failover takes.
#[test]
fn a_malformed_server_address_and_the_failover_time_are_explained() {
    let out = baton()
        .args(["--server", "foo", "get", "/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"foo\"") && err.contains("HOST:PORT"),
        "{err}"
    );
    let help = baton().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("four times"), "{help}");
}

#[test]
fn txn_applies_the_lines_of_stdin_all_or_none_and_says_which_failed() {
    let s = Served::start();
    s.ok(&["create", "/jobs"]);
    s.ok(&["create", "/jobs/42", "todo"]);
    let ops = b"# finish job 42\n\
        check version /jobs/42 0\n\
        set --version 0 /jobs/42 done at last\n\
        create -s /jobs/log- 42 done\n";
    let out = with_stdin(&s, &["txn"], ops);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_eq!(lines[1], "ok    set /jobs/42 (version 1)");
    assert!(
        lines[2].starts_with("ok    create /jobs/log- -> /jobs/log-"),
        "{stdout}"
    );
    assert_eq!(s.ok(&["get", "/jobs/42"]), "done at last");

    // The version moved on: the same lines fail at the check, nothing changes.
    let out = with_stdin(&s, &["txn"], ops);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with("FAILED check version /jobs/42 0: bad version"),
        "{stdout}"
    );
    assert!(stdout.contains("not tried create /jobs/log-"), "{stdout}");
    assert_eq!(s.ok(&["ls", "/jobs"]).lines().count(), 2);
    let out = with_stdin(&s, &["txn", "--json"], ops);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["committed"], false);
    assert_eq!(json["failed"]["index"], 0);

    // A line that is not an operation is refused before anything is sent.
    let out = with_stdin(&s, &["txn"], b"create /x\nmove /x /y\n");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("line 2: unknown operation \"move\""),
        "{stderr}"
    );
    s.fails(&["get", "/x"]);
}

/// Three `baton barrier` processes: no command starts before the third
/// party arrives, and none of them exits before every command finished.
#[test]
fn barrier_runs_the_command_once_every_party_is_in_and_leaves_together() {
    use std::time::{Duration, Instant};
    let s = Served::start();
    let dir = baton_testkit::scratch("barrier");
    let party = |n: u32, sleep_ms: u32| {
        let out = dir.path().join(format!("party-{n}"));
        baton()
            .args([
                "--server",
                &s.addr,
                "barrier",
                "/barriers/b",
                "--parties",
                "3",
                "--",
            ])
            .args(["sh", "-c"])
            .arg(format!(
                "touch {out}.started; sleep {}; touch {out}.done",
                f64::from(sleep_ms) / 1000.0,
                out = out.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut first = party(1, 0);
    let mut second = party(2, 300);
    // Both wait: neither command has started while the third is missing.
    let deadline = Instant::now() + Duration::from_secs(10);
    // (The barrier's node appears with the first party to enter.)
    let entered = || {
        let out = s.run(&["ls", "/barriers/b"]);
        out.status.success() as usize * String::from_utf8_lossy(&out.stdout).lines().count()
    };
    while entered() < 2 {
        assert!(
            Instant::now() < deadline,
            "the first two parties never entered"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!dir.path().join("party-1.started").exists());
    assert!(first.try_wait().unwrap().is_none());
    let mut third = party(3, 0);
    for (n, child) in [(1, &mut first), (2, &mut second), (3, &mut third)] {
        let status = child.wait().unwrap();
        assert!(status.success(), "party {n}: {status:?}");
        // Out only once the slowest command (party 2's) was done.
        assert!(
            dir.path().join("party-2.done").exists(),
            "party {n} left early"
        );
    }
    // Nothing is left behind; a bad command is reported with its status.
    assert_eq!(s.ok(&["ls", "/barriers/b"]), "");
    let out = s.run(&[
        "barrier",
        "/barriers/c",
        "--parties",
        "1",
        "--",
        "no-such-command-here",
    ]);
    assert_eq!(out.status.code(), Some(127), "{out:?}");
}
