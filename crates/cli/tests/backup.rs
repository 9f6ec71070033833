//! `baton snapshot save` under load and `baton snapshot restore` into a new
//! server, and what a damaged backup or a used data directory get.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use baton_client::{Client, CreateMode};
use common::{baton, free_addr, scratch, stop, Served};

/// A `baton serve` on `data_dir`, and its address.
fn serve_on(data_dir: &Path) -> (Child, String) {
    let mut child = baton()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = common::listening_addr(&mut child);
    (child, addr)
}

#[test]
fn a_backup_taken_under_load_restores_every_change_acknowledged_before_it() {
    let dir = scratch("load");
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
    common::eventually(30, "the writers to make 200 changes", || {
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
    let (child, addr) = serve_on(&data);
    let restored: BTreeSet<String> = runtime.block_on(async {
        let client = Client::connect(&addr).await.unwrap();
        let (children, _) = client.get_children("/load").await.unwrap();
        client.close().await;
        children.into_iter().map(|c| format!("/load/{c}")).collect()
    });
    stop(child, 30);

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
    let dir = scratch("damaged");
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
    let (child, addr) = serve_on(&fresh);
    let got = baton()
        .args(["--server", &addr, "get", "/kept"])
        .output()
        .unwrap();
    assert_eq!(got.stdout, b"v");
    stop(child, 30);

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
