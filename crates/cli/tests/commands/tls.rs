//! `baton serve --tls-cert/--tls-key [--tls-ca]` and the client commands'
//! TLS flags, end to end: a plaintext command is told what to do, and
//! SIGHUP makes the server load a renewed certificate.

use std::path::Path;
use std::process::{Child, Output, Stdio};

use crate::common::{baton, eventually, scratch, stop};
use baton_testkit::pki::make_pki;

/// `baton serve` with TLS from `cert` and `key` (and client certificates
/// checked against `client_ca`), and its address.
fn serve_tls(dir: &Path, cert: &Path, key: &Path, client_ca: Option<&Path>) -> (Child, String) {
    let mut cmd = baton();
    cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
    if let Some(ca) = client_ca {
        cmd.arg("--tls-ca").arg(ca);
    }
    let mut child = cmd
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .env_remove("BATON_SERVER")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let addr = crate::common::listening_addr(&mut child);
    (child, addr)
}

fn run(addr: &str, tls: &[&Path], args: &[&str]) -> Output {
    let mut cmd = baton();
    let flags = ["--tls-ca", "--tls-cert", "--tls-key"];
    for (flag, file) in flags.iter().zip(tls) {
        cmd.arg(flag).arg(file);
    }
    cmd.args(["--server", addr]).args(args).output().unwrap()
}

#[test]
fn commands_work_over_tls_and_a_plaintext_one_is_told_what_to_do() {
    let dir_kept = scratch("commands");
    let dir = dir_kept.path().to_path_buf();
    let pki = make_pki(&dir, "a");
    let (server, addr) = serve_tls(&dir, &pki.server_cert, &pki.server_key, None);
    let ca: &[&Path] = &[&pki.ca];
    let out = run(&addr, ca, &["create", "/secure", "over tls"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(run(&addr, ca, &["get", "/secure"]).stdout, b"over tls");
    let out = run(&addr, ca, &["lock", "/locks/t", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = run(&addr, ca, &["status", "--json"]);
    assert!(status.status.success());
    let backup = dir.join("tls.snap");
    let out = run(&addr, ca, &["snapshot", "save", backup.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without --tls-ca: refused at once, saying why.
    for args in [&["get", "/secure"][..], &["status"][..]] {
        let out = run(&addr, &[], args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("TLS connections only"), "{args:?}: {err}");
    }
    // A key without its certificate, or a certificate without an
    // authority to check the server against.
    let out = run(&addr, &[&pki.ca, &pki.client_cert], &["get", "/secure"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("together"));
    let out = baton()
        .args(["--server", &addr, "--tls-cert"])
        .arg(&pki.client_cert)
        .args(["get", "/secure"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("need --tls-ca"));
    stop(server, 30);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn client_certificates_are_checked_when_the_server_has_an_authority() {
    let dir_kept = scratch("mutual");
    let dir = dir_kept.path().to_path_buf();
    let (ours, theirs) = (make_pki(&dir, "ours"), make_pki(&dir, "theirs"));
    let (server, addr) = serve_tls(&dir, &ours.server_cert, &ours.server_key, Some(&ours.ca));
    let without = run(&addr, &[&ours.ca], &["create", "/x"]);
    assert_eq!(without.status.code(), Some(1));
    let stranger = run(
        &addr,
        &[&ours.ca, &theirs.client_cert, &theirs.client_key],
        &["create", "/x"],
    );
    assert_eq!(stranger.status.code(), Some(1));
    let member = run(
        &addr,
        &[&ours.ca, &ours.client_cert, &ours.client_key],
        &["create", "/x"],
    );
    assert!(
        member.status.success(),
        "{}",
        String::from_utf8_lossy(&member.stderr)
    );
    stop(server, 30);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_loads_a_renewed_certificate_and_a_bad_one_changes_nothing() {
    let dir_kept = scratch("sighup");
    let dir = dir_kept.path().to_path_buf();
    let (old, new) = (make_pki(&dir, "old"), make_pki(&dir, "new"));
    // The files the server reads, renewed in place below.
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::copy(&old.server_cert, &cert).unwrap();
    std::fs::copy(&old.server_key, &key).unwrap();
    let (server, addr) = serve_tls(&dir, &cert, &key, None);
    let works = |ca: &Path| run(&addr, &[ca], &["status"]).status.success();
    assert!(works(&old.ca));
    assert!(!works(&new.ca));

    // A broken file and SIGHUP: the server says so, and the old
    // certificate stays.
    let log = || std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    std::fs::write(&cert, "not a certificate").unwrap();
    unsafe { libc::kill(server.id() as i32, libc::SIGHUP) };
    eventually(10, "the failed reload in the log", || {
        log().contains("TLS certificate not reloaded")
    });
    assert!(crate::common::running(server.id()));
    assert!(works(&old.ca));
    assert!(!works(&new.ca));

    // The renewed certificate and SIGHUP: new connections get it.
    std::fs::copy(&new.server_cert, &cert).unwrap();
    std::fs::copy(&new.server_key, &key).unwrap();
    unsafe { libc::kill(server.id() as i32, libc::SIGHUP) };
    eventually(10, "the renewed certificate", || works(&new.ca));
    assert!(!works(&old.ca));
    assert!(log().contains("TLS certificate reloaded"), "{}", log());
    stop(server, 30);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pins: a client that trusts the wrong authority is told the server's
/// certificate is not trusted (not that the server may not take TLS); the
/// server reads its own BATON_SERVE_TLS_* variables and not the clients'
/// BATON_TLS_*, so a BATON_TLS_CA exported for clients does not make it
/// demand client certificates.
#[test]
fn tls_messages_name_the_cause_and_the_server_has_its_own_variables() {
    let dir_kept = scratch("messages");
    let dir = dir_kept.path().to_path_buf();
    let (ours, theirs) = (make_pki(&dir, "ours"), make_pki(&dir, "theirs"));
    let (server, addr) = serve_tls(&dir, &ours.server_cert, &ours.server_key, None);
    let out = run(&addr, &[&theirs.ca], &["get", "/"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not trusted") && err.contains("--tls-ca"),
        "{err}"
    );
    assert!(!err.contains("does the server take TLS"), "{err}");
    stop(server, 30);

    // A shell that exports the clients' variables starts a plaintext
    // server; the server's own variables give it TLS.
    let plain_dir = dir.join("plain");
    let mut plain = baton()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&plain_dir)
        .env("BATON_TLS_CA", &ours.ca)
        .env("BATON_TLS_CERT", &ours.client_cert)
        .env("BATON_TLS_KEY", &ours.client_key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let plain_addr = crate::common::listening_addr(&mut plain);
    let out = baton()
        .env_remove("BATON_TLS_CA")
        .args(["--server", &plain_addr, "create", "/plain"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stop(plain, 30);
    let own_dir = dir.join("own");
    let mut own = baton()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&own_dir)
        .env("BATON_SERVE_TLS_CERT", &ours.server_cert)
        .env("BATON_SERVE_TLS_KEY", &ours.server_key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let own_addr = crate::common::listening_addr(&mut own);
    let out = run(&own_addr, &[&ours.ca], &["create", "/tls"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stop(own, 30);
    let _ = std::fs::remove_dir_all(&dir);
}
