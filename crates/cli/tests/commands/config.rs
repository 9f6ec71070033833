//! `baton serve`'s settings: a TOML file, `BATON_*` variables and flags, in
//! rising order of precedence, and a clear refusal of anything wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::{baton, free_addr, scratch, stop};

/// A fresh directory for one test's files.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `baton serve` with no `BATON_*` variable but those given.
fn serve(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = baton();
    for (key, _) in std::env::vars() {
        if key.starts_with("BATON_") {
            cmd.env_remove(key);
        }
    }
    cmd.arg("serve").args(args).envs(env.iter().copied());
    cmd
}

fn output(mut cmd: Command) -> Output {
    cmd.output().expect("run baton serve")
}

/// Runs `baton serve` expecting it to refuse to start; returns its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = output(serve(args, env));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started anyway: {err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

fn printed(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut all = vec!["--print-config"];
    all.extend_from_slice(args);
    let out = output(serve(&all, env));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `GET /metrics` from `addr`: the whole answer.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: baton\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn the_file_sets_the_server_and_the_environment_and_flags_override_it() {
    let dir_kept = scratch("layers");
    let dir = dir_kept.path().to_path_buf();
    let data_dir = dir.join("data");
    let metrics_addr = free_addr();
    let file = write(
        &dir,
        "baton.toml",
        &format!(
            "# a comment\nlisten = \"127.0.0.1:0\"\ndata-dir = {:?}\nfsync = \"never\"\n\
             max-data = 2048\nmin-session-timeout = 500\nmax-connections = 10\n\
             metrics-listen = \"{metrics_addr}\"\n",
            data_dir.to_str().unwrap()
        ),
    );
    let config = file.to_str().unwrap();
    let env = [("BATON_MAX_DATA", "4096"), ("BATON_MAX_CONNECTIONS", "20")];
    let shown = printed(&["--config", config, "--max-connections", "30"], &env);
    for line in [
        "listen = \"127.0.0.1:0\"",
        "fsync = \"never\"",
        "max-data = 4096",
        "min-session-timeout = 500",
        "max-connections = 30",
        "max-session-timeout = 60000",
    ] {
        assert!(shown.lines().any(|l| l == line), "no {line:?} in:\n{shown}");
    }

    // The server runs with them: the variable's data limit, not the file's.
    let mut child = serve(&["--config", config], &env)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = crate::common::listening_addr(&mut child);
    let create = |name: &str, size: usize| {
        baton()
            .args(["--server", &addr, "create", name])
            .arg("x".repeat(size))
            .output()
            .unwrap()
    };
    assert!(create("/fits", 3000).status.success());
    let too_big = create("/too-big", 5000);
    assert!(!too_big.status.success());
    let err = String::from_utf8_lossy(&too_big.stderr);
    assert!(err.contains("4096"), "{err}");
    assert!(data_dir.exists(), "the file's data directory is used");
    // And its metrics endpoint.
    let metrics = scrape(&metrics_addr);
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    assert!(
        metrics.contains("baton_server_info{version=") && metrics.contains("fsync=\"never\""),
        "{metrics}"
    );
    stop(child, 10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn printed_settings_read_back_as_the_same_settings() {
    let dir_kept = scratch("round-trip");
    let dir = dir_kept.path().to_path_buf();
    let first = printed(
        &[
            "--fsync",
            "never",
            "--max-watch-bytes",
            "100000",
            "--threads",
            "2",
        ],
        &[],
    );
    let file = write(&dir, "printed.toml", &first);
    let again = printed(&["--config", file.to_str().unwrap()], &[]);
    assert_eq!(first, again);
    // A cluster member's settings too.
    let member = printed(
        &[
            "--node-id",
            "2",
            "--peers",
            "1=127.0.0.1:1/127.0.0.1:2,2=127.0.0.1:3/127.0.0.1:4",
            "--election-timeout",
            "300",
        ],
        &[],
    );
    assert!(member.contains("election-timeout = 300"), "{member}");
    let file = write(&dir, "member.toml", &member);
    assert_eq!(member, printed(&["--config", file.to_str().unwrap()], &[]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_keys_and_values_are_refused_naming_the_key() {
    let dir_kept = scratch("bad");
    let dir = dir_kept.path().to_path_buf();
    let cases = [
        // An unknown key, with the line it is on.
        (
            "fsync = \"never\"\nmax-dat = 5\n",
            vec!["max-dat", "line 2"],
        ),
        // A value of the wrong type.
        ("max-data = \"big\"\n", vec!["max-data", "line 1"]),
        // A value of the right type that cannot work.
        ("fsync = \"sometimes\"\n", vec!["fsync", "always or never"]),
        (
            "min-session-timeout = 5\n",
            vec!["min-session-timeout", "100 ms"],
        ),
        (
            "min-session-timeout = 9000\nmax-session-timeout = 8000\n",
            vec!["max-session-timeout"],
        ),
        // A cluster setting for a single server.
        (
            "election-timeout = 300\n",
            vec!["election-timeout", "node-id"],
        ),
        // A cluster member that would acknowledge entries it has not synced.
        (
            "node-id = 1\npeers = \"1=127.0.0.1:1/127.0.0.1:2\"\nfsync = \"never\"\n",
            vec!["fsync", "refused for a cluster member", "power loss"],
        ),
        // Not TOML at all.
        ("max-data = = 3\n", vec!["line 1"]),
    ];
    for (i, (text, wanted)) in cases.iter().enumerate() {
        let file = write(&dir, &format!("bad-{i}.toml"), text);
        let err = refused(&["--config", file.to_str().unwrap()], &[]);
        for want in wanted {
            assert!(err.contains(want), "{text:?}: no {want:?} in: {err}");
        }
        if wanted.iter().any(|w| w.starts_with("line")) {
            assert!(err.contains(file.to_str().unwrap()), "{err}");
        }
    }
    // A bad variable is named as the flag it stands for.
    let err = refused(&[], &[("BATON_FSYNC", "sometimes")]);
    assert!(err.contains("fsync") && err.contains("sometimes"), "{err}");
    let err = refused(&[], &[("BATON_MAX_DATA", "lots")]);
    assert!(err.contains("max-data") && err.contains("lots"), "{err}");
    // A file that is not there.
    let missing = dir.join("missing.toml");
    let err = refused(&["--config", missing.to_str().unwrap()], &[]);
    assert!(
        err.contains("cannot read the config file") && err.contains("missing.toml"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn identities_in_the_file_guard_the_server_and_tokens_are_not_printed() {
    let dir_kept = scratch("identities");
    let dir = dir_kept.path().to_path_buf();
    let admin_token = write(&dir, "admin.token", "admin-token-0123456789abcdef\n");
    let file = write(
        &dir,
        "baton.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\ndata-dir = {:?}\n\n\
             [[identity]]\nname = \"ops\"\ntoken-file = {:?}\nrights = {{ \"/\" = [\"admin\"] }}\n\n\
             [[identity]]\nname = \"viewer\"\ntoken = \"viewer-token-0123456789abcdef\"\n\
             rights = {{ \"/\" = [\"read\"] }}\n",
            dir.join("data").to_str().unwrap(),
            admin_token.to_str().unwrap()
        ),
    );
    let config = file.to_str().unwrap();
    let shown = printed(&["--config", config], &[]);
    assert!(!shown.contains("viewer-token"), "{shown}");
    assert!(shown.contains("token = \"(hidden)\""), "{shown}");
    assert!(shown.contains("admin.token"), "{shown}");

    let mut child = serve(&["--config", config], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = crate::common::listening_addr(&mut child);
    let run = |token: Option<&str>, token_file: Option<&Path>, args: &[&str]| {
        let mut cmd = baton();
        cmd.env_remove("BATON_TOKEN").args(["--server", &addr]);
        if let Some(f) = token_file {
            cmd.arg("--token-file").arg(f);
        }
        if let Some(t) = token {
            cmd.env("BATON_TOKEN", t);
        }
        cmd.args(args).output().unwrap()
    };
    let ok = run(None, Some(&admin_token), &["create", "/guarded", "v"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let anonymous = run(None, None, &["get", "/guarded"]);
    assert_eq!(anonymous.status.code(), Some(1));
    let err = String::from_utf8_lossy(&anonymous.stderr);
    assert!(
        err.contains("authentication failed") && err.contains("token"),
        "{err}"
    );
    let viewer = Some("viewer-token-0123456789abcdef");
    assert_eq!(run(viewer, None, &["get", "/guarded"]).stdout, b"v");
    // The busiest locks: named to an identity that may read them, hidden
    // (and said to be) from a probe without one.
    let held = run(
        None,
        Some(&admin_token),
        &["lock", "/guarded/job", "--", "true"],
    );
    assert!(
        held.status.success(),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );
    let as_admin = run(None, Some(&admin_token), &["locks", "--all"]);
    let shown = String::from_utf8_lossy(&as_admin.stdout);
    assert!(shown.contains("/guarded/job"), "{shown}");
    let as_viewer = run(viewer, None, &["locks", "--all"]);
    assert!(String::from_utf8_lossy(&as_viewer.stdout).contains("/guarded/job"));
    let anonymous = run(None, None, &["locks", "--all"]);
    let shown = String::from_utf8_lossy(&anonymous.stdout);
    assert!(
        shown.contains("hidden") && !shown.contains("/guarded/job"),
        "{shown}"
    );
    let not_allowed = run(viewer, None, &["create", "/not-mine"]);
    assert_eq!(not_allowed.status.code(), Some(1));
    let err = String::from_utf8_lossy(&not_allowed.stderr);
    assert!(
        err.contains("permission denied")
            && err.contains("viewer")
            && err.contains("write right on /not-mine"),
        "{err}"
    );
    stop(child, 10);

    // A right that does not exist, a short token, an identity without one.
    for (text, want) in [
        ("[[identity]]\nname = \"x\"\ntoken = \"0123456789abcdefgh\"\nrights = { \"/\" = [\"own\"] }\n", "unknown right \"own\""),
        ("[[identity]]\nname = \"x\"\ntoken = \"short\"\nrights = {}\n", "at least 16"),
        ("[[identity]]\nname = \"x\"\nrights = {}\n", "token-file"),
        ("[[identity]]\nname = \"x\"\ntoken = \"0123456789abcdefgh\"\nrights = {}\nrole = \"a\"\n", "unknown field `role`"),
        // Client certificates that nothing would check; a name that is none.
        ("[[identity]]\nname = \"x\"\ntoken = \"0123456789abcdefgh\"\nrights = {}\ntls-client = \"x.example\"\n", "tls-ca"),
        ("[[identity]]\nname = \"x\"\ntoken = \"0123456789abcdefgh\"\nrights = {}\ntls-client = \"not a name\"\n", "neither a DNS name"),
    ] {
        let bad = write(&dir, "bad.toml", text);
        let err = refused(&["--config", bad.to_str().unwrap()], &[]);
        assert!(err.contains(want), "{text}: {err}");
        // Named with its identity, or with its line in the file.
        assert!(err.contains("identity x") || err.contains("line 5"), "{text}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The example configuration shipped for the systemd unit is accepted as
/// it is, and with every commented setting turned on.
#[test]
fn the_shipped_example_configuration_is_accepted() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/baton.toml");
    let shown = printed(&["--config", example], &[]);
    assert!(shown.contains("data-dir = \"/var/lib/baton\""), "{shown}");
    // Uncommented: the keys it mentions exist (the TLS files are made here).
    let dir_kept = scratch("example");
    let dir = dir_kept.path().to_path_buf();
    let pki = baton_testkit::pki::make_pki(&dir, "example");
    let text = std::fs::read_to_string(example)
        .unwrap()
        .lines()
        .map(|l| {
            l.strip_prefix("# ")
                .filter(|l| l.contains(" = "))
                .unwrap_or(l)
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace("/etc/baton/server.pem", pki.server_cert.to_str().unwrap())
        .replace("/etc/baton/server.key", pki.server_key.to_str().unwrap())
        .replace("/etc/baton/clients-ca.pem", pki.ca.to_str().unwrap());
    let all = write(&dir, "all.toml", &text);
    let shown = printed(&["--config", all.to_str().unwrap()], &[]);
    for key in [
        "metrics-listen",
        "tls-cert",
        "tls-ca",
        "max-data",
        "threads",
    ] {
        assert!(
            shown.contains(&format!("{key} = ")),
            "no {key} in:\n{shown}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pins: durations take units in flags, variables and the file (a bare
/// number stays milliseconds), and a bad one is refused naming the setting.
#[test]
fn durations_take_units_everywhere() {
    let dir_kept = scratch("durations");
    let dir = dir_kept.path().to_path_buf();
    let file = write(
        &dir,
        "d.toml",
        "max-session-timeout = \"2m\"\nmin-session-timeout = 1500\n",
    );
    let shown = printed(&["--config", file.to_str().unwrap()], &[]);
    assert!(shown.contains("max-session-timeout = 120000"), "{shown}");
    assert!(shown.contains("min-session-timeout = 1500"), "{shown}");
    let shown = printed(
        &["--min-session-timeout", "3s"],
        &[("BATON_MAX_SESSION_TIMEOUT", "90s")],
    );
    assert!(shown.contains("min-session-timeout = 3000"), "{shown}");
    assert!(shown.contains("max-session-timeout = 90000"), "{shown}");
    let err = refused(&["--min-session-timeout", "3 fortnights"], &[]);
    assert!(
        err.contains("min-session-timeout") && err.contains("duration"),
        "{err}"
    );
    let bad = write(&dir, "bad.toml", "max-session-timeout = \"soon\"\n");
    let err = refused(&["--config", bad.to_str().unwrap()], &[]);
    assert!(
        err.contains("max-session-timeout") && err.contains("duration"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pins: an address without a port, or a port that is taken, is refused
/// before the data directory is touched, and --print-config refuses what
/// serve would.
#[test]
fn bad_or_busy_addresses_are_refused_before_the_data_directory_is_made() {
    let dir_kept = scratch("addresses");
    let dir = dir_kept.path().to_path_buf();
    let data = dir.join("data");
    let data_arg = data.to_str().unwrap();
    for (flag, value) in [
        ("--listen", "127.0.0.1"),
        ("--listen", ":4181"),
        ("--metrics-listen", "localhost:http"),
    ] {
        let err = refused(&[flag, value, "--data-dir", data_arg], &[]);
        assert!(
            err.contains(&flag[2..]) && err.contains("HOST:PORT"),
            "{flag} {value}: {err}"
        );
        assert!(
            !data.exists(),
            "{flag} {value}: the data directory was made"
        );
        let err = refused(&["--print-config", flag, value], &[]);
        assert!(err.contains("HOST:PORT"), "{err}");
    }
    let err = refused(
        &["--node-id", "1", "--peers", "1=127.0.0.1/127.0.0.1:2"],
        &[],
    );
    assert!(err.contains("peers") && err.contains("member 1"), "{err}");
    // A port another process holds.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    for flag in ["--listen", "--metrics-listen"] {
        let err = refused(&[flag, &busy, "--data-dir", data_arg], &[]);
        assert!(
            err.contains(&busy) && err.contains(&flag[2..]),
            "{flag}: {err}"
        );
        assert!(!data.exists(), "{flag}: the data directory was made");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pins: the ZooKeeper read mode is printed with the configuration, and a
/// mode that is not one is refused naming the setting and the choices.
#[test]
fn the_zookeeper_read_mode_is_printed_and_a_bad_one_refused() {
    let out = printed(&["--zk-read-mode", "sequential"], &[]);
    assert!(
        out.contains("zk-read-mode") && out.contains("sequential"),
        "{out}"
    );
    let out = printed(&[], &[("BATON_ZK_READ_MODE", "linearizable")]);
    assert!(
        out.contains("zk-read-mode") && out.contains("linearizable"),
        "{out}"
    );
    let err = refused(&["--print-config", "--zk-read-mode", "fast"], &[]);
    assert!(
        err.contains("zk-read-mode") && err.contains("give linearizable or sequential"),
        "{err}"
    );
}
