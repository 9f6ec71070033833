//! `baton chaos`, end to end: short runs against a single server and a
//! cluster under every kind of fault, and against a cluster whose links are
//! cut, must find every promise kept, and leave a history the checkers read
//! back and a timeline.

use crate::common::{baton, scratch, Served};

fn chaos(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = baton()
        .args(["chaos", "--json", "--dir"])
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "baton chaos {args:?} failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn ops(summary: &serde_json::Value, kind: &str) -> u64 {
    summary["operations"][kind]["ok"].as_u64().unwrap_or(0)
}

#[test]
fn a_short_run_against_a_single_server_keeps_every_promise_and_leaves_its_history() {
    let dir_kept = scratch("chaos-single");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(&dir, &["--seconds", "6", "--seed", "1"]);
    assert_eq!(summary["violations"], 0, "{summary}");
    for kind in [
        "read",
        "write",
        "cas",
        "acquire",
        "fenced-write",
        "increment",
        "enqueue",
        "take",
        "hold-ephemeral",
    ] {
        assert!(ops(&summary, kind) > 0, "no {kind} in {summary}");
    }
    // The history reads back, and the checkers find the same.
    let file = std::fs::File::open(dir.join("history.jsonl")).unwrap();
    let history = baton_chaos::History::read(std::io::BufReader::new(file)).unwrap();
    assert!(!history.ops.is_empty() && !history.faults.is_empty());
    assert!(!baton_chaos::violated(&baton_chaos::check(&history)));
    let page = std::fs::read_to_string(dir.join("timeline.html")).unwrap();
    // Notes (a lease that ran out under a paused holder, say) may be
    // listed; no violation is.
    assert!(page.contains("<svg") && page.contains("<h2>Findings</h2>"));
    assert!(!page.contains("<b>Violation</b>"), "{page}");

    // `--check` decides the same from the file alone.
    let history_path = dir.join("history.jsonl");
    let again = check_again(&history_path);
    assert!(again.status.success(), "{again:?}");
    let checked: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    for field in ["seed", "members", "seconds", "operations", "violations"] {
        assert_eq!(
            checked[field], summary[field],
            "{field}: {checked} {summary}"
        );
    }
    // A read of a value nobody wrote, put in the file, is found.
    let text = std::fs::read_to_string(&history_path).unwrap();
    let read = r#""reply":{"type":"value","value":"#;
    let at = text.find(read).expect("a read in the history") + read.len();
    let digits = text[at..].bytes().take_while(u8::is_ascii_digit).count();
    let forged = format!("{}987654321{}", &text[..at], &text[at + digits..]);
    std::fs::write(&history_path, forged).unwrap();
    let forged = check_again(&history_path);
    assert_eq!(forged.status.code(), Some(1), "{forged:?}");
    let checked: serde_json::Value = serde_json::from_slice(&forged.stdout).unwrap();
    assert_eq!(checked["violations"], 1, "{checked}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn check_again(history: &std::path::Path) -> std::process::Output {
    baton()
        .args(["chaos", "--json", "--check"])
        .arg(history)
        .output()
        .unwrap()
}

#[test]
fn a_short_run_against_a_cluster_keeps_every_promise() {
    let dir_kept = scratch("chaos-cluster");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--members",
            "3",
            // Long enough for faults of three kinds even when a membership
            // change (which waits for a member to catch up) is slowed by the
            // tests running beside it.
            "--seconds",
            "12",
            "--seed",
            "2",
            "--workloads",
            "register,fenced,counter",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    assert!(ops(&summary, "fenced-write") > 0, "{summary}");
    // Faults of several kinds were injected (the default is all of them),
    // and the summary counts them by name.
    let servers = summary["injected"]["servers"].as_object().unwrap();
    assert!(servers.len() >= 3, "{summary}");
    let total: u64 = servers.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(summary["injected"]["into_servers"], total, "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Followers serve the clients (linearizable reads confirmed with the
/// leader, sequential reads answered from their own state, changes
/// forwarded to it, watches and lock queues kept where the client is),
/// while members are paused, killed and cut off from each other and from
/// their clients: every promise kept, linearizable registers included.
#[test]
fn a_short_run_with_followers_serving_keeps_every_promise() {
    let dir_kept = scratch("chaos-serving");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--members",
            "3",
            "--seconds",
            "10",
            "--seed",
            "7",
            "--followers-serve",
            "true",
            "--workloads",
            "register,sequential,fenced,ephemeral,queue",
            "--nemesis",
            "pause,kill,partition,one-way,cut-clients,client-pause",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    assert!(ops(&summary, "read") > 0, "{summary}");
    assert!(ops(&summary, "sequential-read") > 0, "{summary}");
    assert!(ops(&summary, "sequential-write") > 0, "{summary}");
    assert!(ops(&summary, "fenced-write") > 0, "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Observers (members that serve clients but never vote) under the faults
/// that act on any member, their clients reading sequentially and
/// linearizably: every promise kept; one removed is added back as an
/// observer, one killed starts again from its data directory (the run
/// once started it again with the first members' `--peers`, which it
/// refused, over and over), and the summary and the history say how many
/// there were.
#[test]
fn a_short_run_with_observers_keeps_every_promise() {
    // Which member a kill strikes depends on which leads at that moment,
    // so a seed's kills could miss the observers in some run: such a run is
    // followed by one of another seed (each of these struck an observer in
    // every run so far), and the test fails if none strikes one.
    let mut struck = Vec::new();
    for seed in ["12", "16", "15"] {
        let dir_kept = scratch("chaos-observers");
        let dir = dir_kept.path().to_path_buf();
        let summary = chaos(
            &dir,
            &[
                "--members",
                "3",
                "--observers",
                "2",
                "--seconds",
                "10",
                "--seed",
                seed,
                "--workloads",
                "register,sequential,ephemeral,queue",
                "--nemesis",
                "pause,kill,partition,cut-clients,membership",
            ],
        );
        assert_eq!(summary["violations"], 0, "seed {seed}: {summary}");
        assert_eq!(summary["members"], 5, "{summary}");
        assert_eq!(summary["observers"], 2, "{summary}");
        assert!(ops(&summary, "read") > 0, "{summary}");
        assert!(ops(&summary, "sequential-read") > 0, "{summary}");
        let history = dir.join("history.jsonl");
        let text = std::fs::read_to_string(&history).unwrap();
        assert!(text.contains("5 member(s) (2 observers)"), "{summary}");
        // No member these faults leave alone ends by itself, and each
        // killed one starts again.
        for line in text.lines() {
            assert!(
                !line.contains("had ended on its own") && !line.contains("did not restart"),
                "seed {seed}: {line}"
            );
        }
        // Read back, the history is still taken for one of 5 members.
        let again = check_again(&history);
        assert!(again.status.success(), "{again:?}");
        // Members 4 and 5 are the observers.
        struck = ["4", "5"]
            .into_iter()
            .filter(|id| {
                text.contains(&format!("kill -9 member {id}\""))
                    && text.contains(&format!("kill: restart member {id}\""))
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        if !struck.is_empty() {
            break;
        }
    }
    assert!(
        !struck.is_empty(),
        "no run killed and restarted an observer: the test needs seeds that do"
    );
}

/// Links cut between members (a deposed leader still reached by its
/// clients) and between the clients and a member: every promise kept.
#[test]
fn a_short_run_with_links_cut_keeps_every_promise() {
    let dir_kept = scratch("chaos-net");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--members",
            "3",
            "--seconds",
            "10",
            "--seed",
            "3",
            "--workloads",
            "register,ephemeral,election",
            "--nemesis",
            "partition,one-way,slow,cut-clients",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    assert!(ops(&summary, "read") > 0, "{summary}");
    let faults = summary["faults"].as_object().unwrap();
    assert!(faults.keys().any(|k| k.starts_with("cut")), "{summary}");
    assert!(
        !faults
            .keys()
            .any(|k| k.starts_with("pause") || k.starts_with("kill")),
        "{summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A disk that syncs slowly, one that fills up (a torn write, then the
/// server stops and is started again), and one that can create no file (a
/// snapshot fails; a member stops and is started again): on a single
/// server and a cluster, every promise kept.
#[test]
fn a_short_run_with_slow_and_full_disks_keeps_every_promise() {
    for (members, seed, nemesis) in [
        ("1", "4", "full-disk,no-new-files"),
        ("3", "5", "slow-disk,full-disk,no-new-files"),
    ] {
        let dir_kept = scratch(&format!("chaos-disk-{members}"));
        let dir = dir_kept.path().to_path_buf();
        let summary = chaos(
            &dir,
            &[
                "--members",
                members,
                "--seconds",
                "10",
                "--seed",
                seed,
                "--workloads",
                "register,counter,queue,fenced",
                "--nemesis",
                nemesis,
            ],
        );
        assert_eq!(summary["violations"], 0, "{summary}");
        assert!(ops(&summary, "increment") > 0, "{summary}");
        let faults = summary["faults"].as_object().unwrap();
        for kind in nemesis.split(',') {
            let kind = kind.replace('-', " ");
            assert!(faults.keys().any(|k| k.starts_with(&kind)), "{summary}");
        }
        // A full disk stopped a server at least once, and it came back.
        let history = std::fs::read_to_string(dir.join("history.jsonl")).unwrap();
        assert!(history.contains("full disk: restart member"), "{summary}");
        let logs: String = (1..=members.parse::<u64>().unwrap())
            .map(|id| std::fs::read_to_string(dir.join(format!("member-{id}.log"))).unwrap())
            .collect();
        assert!(logs.contains("no space left on device"), "{summary}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Whether libfaketime is here for the client-clock fault; `.ci/run`
/// installs it and sets BATON_TEST_FAKETIME, which makes it required.
fn faketime_here() -> bool {
    let here = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .any(|arch| {
            std::path::Path::new(&format!("/usr/lib/{arch}/faketime/libfaketimeMT.so.1")).is_file()
        });
    if !here {
        assert!(
            std::env::var_os("BATON_TEST_FAKETIME").is_none(),
            "BATON_TEST_FAKETIME is set, but libfaketime is not installed"
        );
        eprintln!("skipping: no libfaketime here (apt-get install faketime; .ci/run does)");
    }
    here
}

/// `baton lock` holders (processes of their own, as users run them) whose
/// clocks jump back past their session timeout and forward, while their
/// links to the server are cut now and then: the fence refuses every late
/// write, and tokens only grow.
#[test]
fn a_short_run_with_client_clocks_jumping_keeps_every_promise() {
    if !faketime_here() {
        return;
    }
    let dir_kept = scratch("chaos-clock");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--seconds",
            "12",
            "--seed",
            "6",
            "--workloads",
            "supervised",
            "--nemesis",
            "client-clock,cut-clients",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    assert!(ops(&summary, "fenced-write") > 0, "{summary}");
    let faults = summary["faults"].as_object().unwrap();
    assert!(
        faults["client clocks jump"].as_u64().unwrap() > 0,
        "{summary}"
    );
    let history = std::fs::read_to_string(dir.join("history.jsonl")).unwrap();
    assert!(history.contains("client clocks jump back"), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Asked for by name without libfaketime, the clock fault is refused with
/// what to install; among the defaults it would be left out with a warning.
#[test]
fn the_clock_fault_without_libfaketime_says_what_to_install() {
    let dir_kept = scratch("chaos-no-faketime");
    let dir = dir_kept.path().to_path_buf();
    let out = baton()
        .env("BATON_LIBFAKETIME", dir.join("no-such-library.so"))
        .args([
            "chaos",
            "--seconds",
            "1",
            "--nemesis",
            "client-clock",
            "--dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("apt-get install faketime") && err.contains("BATON_LIBFAKETIME"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Observers asked of a single server, or of servers this run did not
/// start: refused at once (status 3), saying what to give instead.
#[test]
fn observers_need_a_cluster_this_run_starts() {
    let out = baton()
        .args(["chaos", "--observers", "1", "--seconds", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--members 3 or 5"), "{err}");
    let out = baton()
        .args(["--server", "127.0.0.1:1", "chaos", "--observers", "1"])
        .args(["--seconds", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--observers"), "{err}");
}

/// Pins the defect this fault found: a member removed, wiped and added
/// again under its old id caught up from the oldest entries first, reached
/// a membership of its past that named it the only voter, elected itself
/// at once and led with half the state (acknowledged increments lost, in
/// every such run of 12 s). A member being added now stands for election
/// only once the leader has told it which membership added it, and it has
/// applied that one.
#[test]
fn a_member_removed_and_added_again_never_leads_from_a_membership_of_its_past() {
    let dir_kept = scratch("chaos-membership");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--members",
            "3",
            "--seconds",
            "12",
            "--seed",
            "9",
            "--workloads",
            "counter,register",
            "--nemesis",
            "membership",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    let history = std::fs::read_to_string(dir.join("history.jsonl")).unwrap();
    assert!(
        history.matches("added again").count() >= 3,
        "too few members added again: {summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pins the defect this fault found: a follower started from an old copy
/// of its data directory lacked entries it had acknowledged, and its leader
/// stopped on finding that (the consensus engine's own check), leaving
/// acknowledged entries on one member; a new leader without them was then
/// elected (hundreds of violations in a 40 s run). Now the leader tells the
/// follower, which stops; it is removed, emptied and added again.
#[test]
fn a_follower_put_back_from_an_old_copy_is_stopped_and_nothing_is_lost() {
    let dir_kept = scratch("chaos-stale-copy");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--members",
            "3",
            "--seconds",
            "15",
            "--seed",
            "5",
            "--workloads",
            "counter,register",
            "--nemesis",
            "stale-copy",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    let history = std::fs::read_to_string(dir.join("history.jsonl")).unwrap();
    assert!(
        history.contains("its log behind what it had acknowledged")
            && history.contains("stale copy: member")
            && history.contains("added again"),
        "no member was found with its data gone back, and added again: {summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An observer started from an old copy of its data directory: the leader
/// finds its log went back and stops it, it is added again as an observer,
/// and no client reading through it sees the state go back meanwhile. (The
/// seed's draws pick an observer among two followers and two observers
/// whichever member leads.)
#[test]
fn an_observer_put_back_from_an_old_copy_is_stopped_and_serves_nothing_older() {
    let dir_kept = scratch("chaos-stale-observer");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--members",
            "3",
            "--observers",
            "2",
            "--seconds",
            "15",
            "--seed",
            "6",
            "--workloads",
            "register,sequential,counter",
            "--nemesis",
            "stale-copy",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    assert!(ops(&summary, "sequential-read") > 0, "{summary}");
    let history = std::fs::read_to_string(dir.join("history.jsonl")).unwrap();
    let observer = ["4", "5"].into_iter().find(|id| {
        history.contains(&format!("kill -9 member {id} (an observer), copy its data"))
            && history.contains(&format!(
                "stale copy: member {id} stopped, its log behind what it had acknowledged"
            ))
            && history.contains(&format!("stale copy: member {id} added again"))
    });
    assert!(
        observer.is_some(),
        "no observer was found with its data gone back, and added again: {summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pointed at a server it did not start (`--server`), it runs the workloads
/// there with only its own clients' faults, refuses faults that need the
/// server's process, and will not write over an earlier run's nodes.
#[test]
fn pointed_at_a_running_server_it_injects_only_its_clients_faults() {
    let served = Served::start();
    let dir_kept = scratch("chaos-pointed");
    let dir = dir_kept.path().to_path_buf();
    let refused = served.run(&["chaos", "--seconds", "3", "--nemesis", "kill,client-pause"]);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("only client-pause and client-clock") && said.contains("kill"),
        "{said}"
    );
    let out = served.run(&[
        "chaos",
        "--json",
        "--seconds",
        "6",
        "--seed",
        "8",
        "--workloads",
        "register,fenced,counter,ephemeral",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["violations"], 0, "{summary}");
    assert_eq!(summary["members"], 1, "{summary}");
    assert!(ops(&summary, "fenced-write") > 0, "{summary}");
    let faults = summary["faults"].as_object().unwrap();
    assert!(faults.contains_key("client pause"), "{summary}");
    assert_eq!(summary["injected"]["into_servers"], 0, "{summary}");
    assert!(
        summary["injected"]["clients"]["client-pause"].as_u64() > Some(0),
        "{summary}"
    );
    assert!(
        !faults
            .keys()
            .any(|k| k.contains("kill") || k.contains("leads")),
        "{summary}"
    );
    // Its nodes are there now: a second run says so rather than mix in.
    let again = served.run(&["chaos", "--seconds", "3", "--no-faults"]);
    assert_eq!(again.status.code(), Some(3), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("/chaos absent"),
        "{again:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rounds that found the member connection that fell one answer behind
/// (a call given up by the consensus engine's own deadline, its request
/// written, left its answer for the next call to read: the leader counted
/// entries a follower never stored, and acknowledged writes no majority
/// held). Run against the build before that fix, these rounds lose
/// acknowledged writes within two minutes (docs/reliability.md); here the
/// first follower is killed in some rounds and the leader starved of the
/// CPU in some, and every promise holds.
#[test]
fn crash_rounds_with_the_first_follower_killed_and_the_leader_starved_lose_nothing() {
    let dir_kept = scratch("chaos-crash-rounds");
    let dir = dir_kept.path().to_path_buf();
    let summary = chaos(
        &dir,
        &[
            "--members",
            "3",
            "--seconds",
            "15",
            "--seed",
            "40",
            "--workloads",
            "register,counter",
            "--nemesis",
            "lag-then-crash,slow-then-crash,stutter",
        ],
    );
    assert_eq!(summary["violations"], 0, "{summary}");
    let history = std::fs::read_to_string(dir.join("history.jsonl")).unwrap();
    for step in ["crash member", "of the CPU meanwhile", "kill -9 members"] {
        assert!(history.contains(step), "no {step:?} in this run: {summary}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
