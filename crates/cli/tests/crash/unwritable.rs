//! A data directory that cannot be written.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::free_addr;
use crate::harness::*;
use baton_client::CreateMode;

/// `chattr -R +i` on a directory, undone on drop.
struct Immutable {
    dir: PathBuf,
    set: bool,
}

impl Immutable {
    fn set(dir: &Path) -> Result<Immutable, String> {
        chattr("+i", dir)?;
        Ok(Immutable {
            dir: dir.to_owned(),
            set: true,
        })
    }

    fn clear(mut self) -> Result<(), String> {
        self.set = false;
        chattr("-i", &self.dir)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if self.set {
            let _ = chattr("-i", &self.dir);
        }
    }
}

fn chattr(flag: &str, dir: &Path) -> Result<(), String> {
    let out = Command::new("chattr")
        .args(["-R", flag])
        .arg(dir)
        .output()
        .map_err(|e| format!("cannot run chattr: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "chattr -R {flag} {} failed ({}): {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Pins: on a data directory it cannot write, `baton serve` exits non-zero
/// at once with one stderr line naming the file and the OS error, changes
/// no byte of the directory, and a later normal start recovers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_directory_gives_a_clear_error() {
    let scratch = Scratch::new("readonly");
    let data = scratch.data();
    let addr = free_addr();
    // A log, a snapshot and rotated segments to protect.
    let mut server = ServeProc::start(
        serve_command(&addr, &data, &["--snapshot-every", "4096"]),
        &addr,
        &scratch.file("first.log"),
    );
    server.wait_listening("first start").await;
    let c = connect(&addr).await;
    c.create("/ro", "parent v1", CreateMode::Persistent)
        .await
        .unwrap();
    for i in 0..100 {
        c.create(
            &format!("/ro/n{i}"),
            format!("value {i}"),
            CreateMode::Persistent,
        )
        .await
        .unwrap();
    }
    c.set_data("/ro", "parent v2", None).await.unwrap();
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "first server stopped with {status}");
    drop(server);
    let before = read_files(&data);
    assert!(
        before.keys().any(|f| f.starts_with("wal-")),
        "a log was written: {:?}",
        before.keys()
    );

    let immutable = match Immutable::set(&data) {
        Ok(guard) => guard,
        Err(why) => {
            eprintln!("skipping: cannot make the data directory immutable: {why}");
            return;
        }
    };
    let log = scratch.file("readonly.log");
    let started = Instant::now();
    let mut child = serve_command(&addr, &data, &[])
        .stderr(File::create(&log).unwrap())
        .spawn()
        .expect("start baton serve");
    let limit = Duration::from_secs(15);
    let Some(status) = wait_exit(&mut child, limit) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "baton serve kept running for {limit:?} on an immutable data directory; its log:\n{}",
            tail(&log, 40)
        );
    };
    let took = started.elapsed();
    let stderr = std::fs::read_to_string(&log).unwrap();
    eprintln!("on an immutable data directory: {status} after {took:?}; stderr: {stderr:?}");
    assert!(
        !status.success(),
        "baton serve succeeded on an immutable data directory: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line on stderr, not: {stderr:?}");
    let line = lines[0];
    assert!(
        line.contains(&data.display().to_string()),
        "the error names the data directory or its file: {line:?}"
    );
    assert!(
        line.contains("os error"),
        "the error gives the OS error: {line:?}"
    );

    immutable.clear().expect("chattr -R -i");
    let after = read_files(&data);
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|f| before.get(*f) != after.get(*f))
        .collect();
    assert!(
        changed.is_empty(),
        "the failed start changed files of the data directory: {changed:?}"
    );

    // A normal start recovers everything.
    let mut server = ServeProc::start(
        serve_command(&addr, &data, &[]),
        &addr,
        &scratch.file("second.log"),
    );
    server.wait_listening("normal start after chattr -i").await;
    let c = connect(&addr).await;
    assert_eq!(c.get_data("/ro").await.unwrap().0, "parent v2".as_bytes());
    let (children, _) = c.get_children("/ro").await.unwrap();
    assert_eq!(children.len(), 100, "{children:?}");
    for i in [0, 57, 99] {
        let (value, _) = c.get_data(&format!("/ro/n{i}")).await.unwrap();
        assert_eq!(value, format!("value {i}").into_bytes());
    }
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
}
