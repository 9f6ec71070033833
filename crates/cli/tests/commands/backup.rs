//! `baton snapshot save` under load and `baton snapshot restore` into a new
//! server, and what a damaged backup or a used data directory get.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::{baton, free_addr, scratch, stop, Served};
use baton_client::{Client, CreateMode};

/// A `baton serve` on `data_dir`.
fn serve_on(data_dir: &Path) -> OnDir {
    let mut child = baton()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = crate::common::listening_addr(&mut child);
    OnDir {
        child: Some(child),
        addr,
    }
}

/// A `baton serve` on a data directory of the test's, killed if the test
/// fails before it stops it.
struct OnDir {
    child: Option<Child>,
    addr: String,
}

impl OnDir {
    /// Stops it with SIGTERM: it must exit 0.
    fn stop(mut self) {
        stop(self.child.take().expect("running"), 30);
    }
}

impl Drop for OnDir {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_backup_taken_under_load_restores_every_change_acknowledged_before_it() {
    let dir_kept = scratch("load");
    let dir = dir_kept.path().to_path_buf();
    let s = Served::start();
    s.ok(&["create", "/load"]);
    let file = dir.join("backup.snap");

    // Four writers create sequential nodes without pause, each noting what
    // was acknowledged, and when: before the save began or after.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stop_writing = Arc::new(AtomicBool::new(false));
    let saving = Arc::new(AtomicBool::new(false));
    let acked_before = Arc::new(Mutex::new(BTreeSet::new()));
    let acked_all = Arc::new(Mutex::new(BTreeSet::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (addr, stop_writing, saving) = (s.addr.clone(), stop_writing.clone(), saving.clone());
        let (acked_before, acked_all) = (acked_before.clone(), acked_all.clone());
        writers.push(runtime.spawn(async move {
            let client = Client::connect(&addr).await.unwrap();
            // Bounded: at most 20,000 creates each.
            for _ in 0..20_000 {
                if stop_writing.load(Ordering::SeqCst) {
                    break;
                }
                let before = !saving.load(Ordering::SeqCst);
                let created = client
                    .create(
                        &format!("/load/w{w}-"),
                        "x",
                        CreateMode::PersistentSequential,
                    )
                    .await
                    .unwrap();
                acked_all.lock().unwrap().insert(created.path.clone());
                if before {
                    acked_before.lock().unwrap().insert(created.path);
                }
            }
            client.close().await;
        }));
    }
    // Let the load get going, then save twice while it runs.
    crate::common::eventually(30, "the writers to make 200 changes", || {
        acked_all.lock().unwrap().len() >= 200
    });
    saving.store(true, Ordering::SeqCst);
    let first = s.ok(&["snapshot", "save", file.to_str().unwrap()]);
    assert!(first.starts_with("saved revision "), "{first}");
    let before_second = acked_all.lock().unwrap().clone();
    let second = s.ok(&["snapshot", "save", file.to_str().unwrap()]);
    stop_writing.store(true, Ordering::SeqCst);
    for w in writers {
        runtime.block_on(w).unwrap();
    }
    assert!(!file.with_extension("snap.tmp").exists());

    // Restore into a new directory and start a server there.
    let data = dir.join("restored");
    let out = baton()
        .args(["snapshot", "restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = serve_on(&data);
    let restored: BTreeSet<String> = runtime.block_on(async {
        let client = Client::connect(&server.addr).await.unwrap();
        let (children, _) = client.get_children("/load").await.unwrap();
        client.close().await;
        children.into_iter().map(|c| format!("/load/{c}")).collect()
    });
    server.stop();

    // Every change acknowledged before the second save began is there; and
    // nothing is there that no writer made.
    let missing: Vec<_> = before_second.difference(&restored).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged changes missing: {missing:?}",
        missing.len()
    );
    let acked_all = acked_all.lock().unwrap();
    let unknown: Vec<_> = restored.difference(&acked_all).collect();
    assert!(
        unknown.is_empty(),
        "nodes no writer was told of: {unknown:?}"
    );
    let acked_before = acked_before.lock().unwrap();
    // The saves ran under load: changes were acknowledged while they ran.
    assert!(
        acked_all.len() > acked_before.len(),
        "{} changes before the saves, {} in all",
        acked_before.len(),
        acked_all.len()
    );
    eprintln!(
        "{} changes before the saves, {} before the second, {} in all, {} restored",
        acked_before.len(),
        before_second.len(),
        acked_all.len(),
        restored.len()
    );
    let revision = |said: &str| -> u64 {
        said.strip_prefix("saved revision ")
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(revision(&second) > revision(&first), "{first} / {second}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_backup_or_a_used_directory_is_refused_and_nothing_is_written() {
    let dir_kept = scratch("damaged");
    let dir = dir_kept.path().to_path_buf();
    let s = Served::start();
    s.ok(&["create", "/kept", "v"]);
    let file = dir.join("backup.snap");
    s.ok(&["snapshot", "save", file.to_str().unwrap()]);
    let good = std::fs::read(&file).unwrap();

    let restore = |from: &Path, into: &Path| {
        baton()
            .args(["snapshot", "restore"])
            .arg(from)
            .arg("--data-dir")
            .arg(into)
            .output()
            .unwrap()
    };
    // A flipped bit in the middle, a cut-off end, and garbage.
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x10;
    for (name, bytes) in [
        ("flipped", flipped),
        ("cut", good[..good.len() - 3].to_vec()),
        ("garbage", b"not a snapshot at all".to_vec()),
    ] {
        let bad = dir.join(name);
        std::fs::write(&bad, bytes).unwrap();
        let into = dir.join(format!("into-{name}"));
        let out = restore(&bad, &into);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is not a whole Baton snapshot") && err.contains(name),
            "{name}: {err}"
        );
        assert!(!into.exists(), "{name}: nothing is created");
    }

    // A data directory in use is not touched.
    let used = dir.join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("wal-00000000000000000001.log"), b"old").unwrap();
    let out = restore(&file, &used);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not empty"), "{err}");
    assert_eq!(std::fs::read_dir(&used).unwrap().count(), 1);

    // The good one restores.
    let fresh = dir.join("fresh");
    let out = restore(&file, &fresh);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = serve_on(&fresh);
    let got = baton()
        .args(["--server", &server.addr, "get", "/kept"])
        .output()
        .unwrap();
    assert_eq!(got.stdout, b"v");
    server.stop();

    // Nobody to save from.
    let out = baton()
        .args(["--server", &free_addr(), "snapshot", "save"])
        .arg(dir.join("never.snap"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir.join("never.snap").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sequence number `baton create --sequential` printed (its name's
/// suffix).
fn sequence_of(created: &str) -> u64 {
    let name = created.trim();
    name[name.len() - 10..]
        .parse()
        .unwrap_or_else(|_| panic!("{name}"))
}

/// The fencing token `baton lock` gave its command.
fn lock_token(addr: &str, path: &str) -> u64 {
    let out = baton()
        .args(["--server", addr, "lock", path, "--", "sh", "-c"])
        .arg("echo $BATON_FENCING_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn restore_into(file: &Path, data: &Path, extra: &[&str]) -> String {
    let out = baton()
        .args(["snapshot", "restore"])
        .arg(file)
        .arg("--data-dir")
        .arg(data)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Pins: a restored backup never hands out a token, a sequence number or a
/// revision the server it was taken from may have handed out after it, and
/// neither does a second restore of the same backup.
#[test]
fn a_restored_backup_never_hands_out_a_token_again() {
    let dir_kept = scratch("tokens");
    let dir = dir_kept.path().to_path_buf();
    let s = Served::start();
    let first = lock_token(&s.addr, "/locks/report");
    let file = dir.join("backup.snap");
    s.ok(&["snapshot", "save", file.to_str().unwrap()]);
    // The old server goes on handing out tokens after the backup.
    let mut highest = first;
    for _ in 0..5 {
        highest = highest.max(lock_token(&s.addr, "/locks/report"));
        highest = highest.max(sequence_of(&s.ok(&[
            "create",
            "--sequential",
            "/seq-",
            "x",
        ])));
    }
    drop(s);

    let mut handed_out = highest;
    for n in 0..2 {
        let data = dir.join(format!("restored-{n}"));
        let said = restore_into(&file, &data, &[]);
        assert!(said.contains("continues from revision"), "{said}");
        let server = serve_on(&data);
        let token = lock_token(&server.addr, "/locks/report");
        assert!(
            token > handed_out,
            "restore {n}: token {token} after a restore; the servers before handed out up to {handed_out}"
        );
        let created = baton()
            .args([
                "--server",
                &server.addr,
                "create",
                "--sequential",
                "/seq-",
                "x",
            ])
            .output()
            .unwrap();
        let sequence = sequence_of(&String::from_utf8_lossy(&created.stdout));
        assert!(sequence > handed_out, "restore {n}: sequence {sequence}");
        handed_out = handed_out.max(token).max(sequence);
        server.stop();
    }

    // An operator who knows better may choose the step, and is told what
    // it is.
    let data = dir.join("restored-chosen");
    let said = restore_into(&file, &data, &["--bump-revision", "1000"]);
    assert!(said.contains("1000"), "{said}");
    let server = serve_on(&data);
    assert!(lock_token(&server.addr, "/locks/report") > first + 1000);
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
