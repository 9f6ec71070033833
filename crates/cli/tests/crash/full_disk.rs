//! A full disk: a log that cannot grow, and a snapshot that cannot make its file.

use std::collections::{BTreeMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{baton, free_addr};
use crate::harness::*;
use baton_client::{Client, CreateMode, Error};
use bytes::Bytes;

/// Most bytes the server may write to any one file: RLIMIT_FSIZE.
const FILE_LIMIT: u64 = 200 * 1024;

/// Writes distinct nodes until a write fails; records what was acknowledged
/// and what is of unknown outcome. Returns an unexpected error, if any.
/// Writes acknowledged and of unknown outcome, path to data.
type Written = Arc<Mutex<BTreeMap<String, Bytes>>>;

/// `n` clients of the server at `addr`, each running [`fill`] on a task.
async fn fillers(
    addr: &str,
    n: usize,
) -> (
    Written,
    Written,
    Vec<tokio::task::JoinHandle<Option<String>>>,
) {
    let (acked, unknown): (Written, Written) = Default::default();
    let mut writers = Vec::new();
    for i in 0..n {
        let client = connect(addr).await;
        writers.push(tokio::spawn(fill(
            client,
            i,
            acked.clone(),
            unknown.clone(),
        )));
    }
    (acked, unknown, writers)
}

async fn fill(
    client: Client,
    i: usize,
    acked: Arc<Mutex<BTreeMap<String, Bytes>>>,
    unknown: Arc<Mutex<BTreeMap<String, Bytes>>>,
) -> Option<String> {
    for k in 0u64.. {
        let path = format!("/full/c{i}-{k:05}");
        let data = Bytes::from(format!("c{i}-{k}-{}", "y".repeat(1000)));
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            client.create(&path, data.clone(), CreateMode::Persistent),
        )
        .await;
        match result {
            Ok(Ok(_)) => {
                acked.lock().unwrap().insert(path, data);
            }
            // The server went away with the request unanswered, or it is
            // waiting to be sent to a server that is gone: either way its
            // outcome is unknown.
            Ok(Err(Error::ConnectionLoss(_) | Error::ShuttingDown(_))) | Err(_) => {
                unknown.lock().unwrap().insert(path, data);
                return None;
            }
            Ok(Err(e)) => {
                unknown.lock().unwrap().insert(path.clone(), data);
                return Some(format!("create {path}: unexpected error: {e}"));
            }
        }
    }
    None
}

/// Pins: a server whose log write failed while replies were waiting for
/// their batch to be durable stopped only after its connections' grace to
/// flush (5 s, then up to 10 s for them all): they waited for a durable
/// mark that would never move. Now the mark stops with the log, what waits
/// for it is dropped unsent, and the server exits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_log_fails_with_replies_waiting_exits_at_once() {
    let scratch = Scratch::new("fail-with-replies-waiting");
    let data = scratch.data();
    let addr = free_addr();
    let control = scratch.file("disk-faults");
    std::fs::write(&control, "").unwrap();
    let cmd = serve_command(
        &addr,
        &data,
        &["--test-disk-faults", control.to_str().unwrap()],
    );
    let mut server = ServeProc::start(cmd, &addr, &scratch.file("server.log"));
    server.wait_listening("start with disk faults").await;
    let setup = connect(&addr).await;
    setup
        .create("/full", "", CreateMode::Persistent)
        .await
        .unwrap();
    setup.close().await;
    // Each sync a second late: the writers' replies wait for their batch.
    std::fs::write(&control, "slow 1000").unwrap();
    let (acked, _, writers) = fillers(&addr, 4).await;
    // Once a slow batch has been acknowledged the writers' next ones wait
    // behind a sync; the one after fails half written.
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "nothing acknowledged in 20 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::write(&control, "full").unwrap();
    let limit = Duration::from_secs(20);
    let status = wait_exit(&mut server.child, limit).unwrap_or_else(|| {
        panic!(
            "still running {limit:?} after the disk filled; its log ends:\n{}",
            server.log_tail()
        )
    });
    assert!(!status.success(), "{}", server.log_tail());
    let log = read_log(&server.log);
    assert!(log.contains("the log can no longer be written"), "{log}");
    assert!(log.contains("all connections closed"), "{log}");
    // No connection waited out its grace for replies never to be durable.
    assert!(!log.contains("closing without flushing"), "{log}");
    for writer in writers {
        writer.abort();
    }
}

/// Pins: a snapshot that cannot create its file (a file system out of
/// inodes: writes into the open log go on) fails on its own: every write
/// meanwhile is acknowledged, the server goes on serving (the log goes on
/// in its current segment when a new one cannot be made: that once
/// stopped the server), and once files can be created a later snapshot is
/// written; killed then, the server comes back with every acknowledged
/// write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_cannot_create_its_file_fails_alone_and_the_log_goes_on() {
    let scratch = Scratch::new("no-new-files");
    let data = scratch.data();
    let control = scratch.file("disk-faults");
    std::fs::write(&control, "").unwrap();
    let extra = [
        "--test-disk-faults",
        control.to_str().unwrap(),
        "--snapshot-every",
        "65536",
    ];
    let addr = free_addr();
    let log = scratch.file("server.log");
    let mut server = ServeProc::start(serve_command(&addr, &data, &extra), &addr, &log);
    server.wait_listening("start with no new files").await;
    let client = connect(&addr).await;
    let mut acked = BTreeMap::new();
    let value = Bytes::from("z".repeat(4096));
    let mut write = |i: usize| {
        let path = format!("/n{i:04}");
        acked.insert(path.clone(), value.clone());
        (path, value.clone())
    };
    // Its log's segment made, the file system runs out of inodes.
    std::fs::write(&control, "no-new-files").unwrap();
    // About 16 snapshots' worth of log, none of which can be written.
    for i in 0..256 {
        let (path, data) = write(i);
        client
            .create(&path, data, CreateMode::Persistent)
            .await
            .unwrap();
    }
    let text = read_log(&log);
    assert!(
        text.contains("failed") && text.contains("no space left on device"),
        "no snapshot failed; the log ends:\n{}",
        server.log_tail()
    );
    assert!(
        !text.contains("snapshot written"),
        "a snapshot was written though no file could be created"
    );
    // Nor a new log segment: the log went on in the one it had.
    assert!(
        text.contains("the log goes on in its current segment"),
        "{}",
        server.log_tail()
    );
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "{}",
        server.log_tail()
    );
    // Files can be created again: a later snapshot is written.
    std::fs::write(&control, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 256;
    while !read_log(&log).contains("snapshot written") {
        assert!(
            Instant::now() < deadline,
            "no snapshot written once files could be created; the log ends:\n{}",
            server.log_tail()
        );
        let (path, data) = write(i);
        client
            .create(&path, data, CreateMode::Persistent)
            .await
            .unwrap();
        i += 1;
    }
    client.close().await;
    server.kill9();
    let addr = free_addr();
    let mut again = ServeProc::start(serve_command(&addr, &data, &extra), &addr, &log);
    again.wait_listening("restart after the snapshots").await;
    let client = connect(&addr).await;
    let (children, _) = client.get_children("/").await.unwrap();
    let present: std::collections::HashSet<String> =
        children.iter().map(|n| format!("/{n}")).collect();
    for (path, data) in &acked {
        assert!(present.contains(path), "{path}: acknowledged, then lost");
        let (got, _) = client.get_data(path).await.unwrap();
        assert_eq!(&got[..], &data[..], "{path}");
    }
    client.close().await;
}

/// Checks that the server at `addr` holds every acknowledged write and
/// nothing that was never written.
async fn check_full(
    addr: &str,
    acked: &BTreeMap<String, Bytes>,
    unknown: &BTreeMap<String, Bytes>,
) -> (Client, usize) {
    let c = connect(addr).await;
    let (names, _) = c.get_children("/full").await.unwrap();
    let present: HashSet<String> = names.iter().map(|n| format!("/full/{n}")).collect();
    let missing: Vec<&String> = acked.keys().filter(|p| !present.contains(*p)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged writes are missing after the disk filled up: {:?}",
        missing.len(),
        missing.iter().take(10).collect::<Vec<_>>()
    );
    let mut landed = 0;
    for path in &present {
        let (data, _) = c.get_data(path).await.unwrap();
        if let Some(expected) = acked.get(path) {
            assert_eq!(&data, expected, "{path} holds other data than acknowledged");
        } else if let Some(expected) = unknown.get(path) {
            assert_eq!(&data, expected, "{path} holds other data than written");
            landed += 1;
        } else if path != "/full/after-restart" {
            panic!("{path} exists but was never written");
        }
    }
    (c, landed)
}

/// Pins: when the log cannot grow (EFBIG under RLIMIT_FSIZE, as on a full
/// disk) the server stops, exit status non-zero, saying the log can no
/// longer be written and naming the file and the OS error; no write that
/// was not made durable was acknowledged; the cut-off log recovers cleanly
/// (its torn tail dropped) and takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_server_and_corrupts_nothing() {
    use std::os::unix::process::CommandExt;

    let scratch = Scratch::new("full");
    let data = scratch.data();
    let addr = free_addr();
    let mut cmd = serve_command(&addr, &data, &[]);
    // SAFETY: setrlimit and signal are async-signal-safe, and touch no
    // memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: FILE_LIMIT,
                rlim_max: FILE_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Writes past the limit then fail with EFBIG instead of
            // killing the process, as on a full disk.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let first_log = scratch.file("limited.log");
    let mut server = ServeProc::start(cmd, &addr, &first_log);
    server.wait_listening("start with RLIMIT_FSIZE").await;
    let setup = connect(&addr).await;
    setup
        .create("/full", "", CreateMode::Persistent)
        .await
        .unwrap();
    setup.close().await;

    let (acked, unknown, writers) = fillers(&addr, 3).await;

    // The server must stop by itself once the log cannot grow.
    let limit = Duration::from_secs(30);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server kept running for {limit:?} with its files limited to {FILE_LIMIT} bytes ({} writes acknowledged); its log ends:\n{}",
            acked.lock().unwrap().len(),
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stderr = std::fs::read_to_string(&first_log).unwrap();
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    eprintln!("full disk: the server exited with {status}; its last line: {last}");
    assert!(
        !status.success(),
        "the server exited successfully on a full disk; its log ends:\n{}",
        server.log_tail()
    );
    assert!(
        last.contains("the log can no longer be written"),
        "the last line says the log can no longer be written: {last:?}"
    );
    assert!(
        last.contains(&data.display().to_string()) && last.contains("os error"),
        "the last line names the log file and the OS error: {last:?}"
    );
    drop(server);

    for writer in writers {
        let unexpected = tokio::time::timeout(Duration::from_secs(30), writer)
            .await
            .expect("a writer did not stop after the server exited")
            .expect("a writer panicked");
        assert_eq!(unexpected, None);
    }
    let acked = acked.lock().unwrap().clone();
    let unknown = unknown.lock().unwrap().clone();
    assert!(
        acked.len() >= 20,
        "only {} writes were acknowledged before the limit",
        acked.len()
    );
    let files = read_files(&data);
    let wal_bytes: u64 = files
        .iter()
        .filter(|(f, _)| f.starts_with("wal-"))
        .map(|(_, b)| b.len() as u64)
        .sum();
    eprintln!(
        "full disk: {} writes acknowledged, {} of unknown outcome, {wal_bytes} bytes of log",
        acked.len(),
        unknown.len()
    );
    assert!(
        wal_bytes + 2048 >= FILE_LIMIT,
        "the log ({wal_bytes} bytes) stopped short of the {FILE_LIMIT} byte limit"
    );

    // Without the limit, the log recovers cleanly and holds every
    // acknowledged write.
    let second_log = scratch.file("recovered.log");
    // A new port: another test's server may have taken the old one.
    let addr = free_addr();
    let mut server = ServeProc::start(serve_command(&addr, &data, &[]), &addr, &second_log);
    server.wait_listening("restart without the limit").await;
    let (c, landed) = check_full(&addr, &acked, &unknown).await;
    // It answered, so it has recovered and logged how.
    let recovered = read_log(&second_log);
    eprintln!(
        "full disk: {landed} writes of unknown outcome were applied; {}",
        recovered
            .lines()
            .find(|l| l.contains("recovered"))
            .unwrap_or("no recovery line")
    );
    // And the log takes writes again after the dropped tail.
    c.create("/full/after-restart", "yes", CreateMode::Persistent)
        .await
        .unwrap();
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    drop(server);

    let third_log = scratch.file("again.log");
    let addr = free_addr();
    let mut server = ServeProc::start(serve_command(&addr, &data, &[]), &addr, &third_log);
    server
        .wait_listening("second restart without the limit")
        .await;
    let (c, _) = check_full(&addr, &acked, &unknown).await;
    assert_eq!(
        c.get_data("/full/after-restart").await.unwrap().0,
        "yes".as_bytes()
    );
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    for log in [&second_log, &third_log] {
        let text = read_log(log);
        assert!(
            !text.contains("damaged") && !text.contains("ERROR"),
            "recovery after the full disk reported a problem:\n{text}"
        );
    }
}

/// Pins: under `--fsync never`, once an append has failed the server
/// acknowledges nothing applied after it, in particular not after the
/// failed bytes started a snapshot and a fresh, writable segment (a failed
/// write once let the next append move the durable mark past the lost
/// change). The log then recovers with every acknowledged change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_append_under_fsync_never_nothing_later_is_acknowledged() {
    const LIMIT: u64 = 1_000_000;
    const BIG: usize = 900_000;
    let scratch = Scratch::new("never-fail");
    let data = scratch.data();
    let addr = free_addr();
    let mut cmd = baton();
    cmd.args(["serve", "--listen", &addr, "--data-dir"])
        .arg(&data)
        .args(["--fsync", "never", "--snapshot-every", "950000"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    limit_file_size(&mut cmd, LIMIT);
    let mut server = ServeProc::start(cmd, &addr, &scratch.file("limited.log"));
    server.wait_listening("start with RLIMIT_FSIZE").await;
    let c = connect(&addr).await;
    c.create("/a", vec![b'a'; BIG], CreateMode::Persistent)
        .await
        .expect("the first large create fits in the file limit");
    // The second large create cannot be written; small ones follow it on
    // the same connection, in order.
    let mut writes = vec![("/b".to_string(), vec![b'b'; BIG])];
    for i in 0..20 {
        writes.push((format!("/c{i}"), vec![b'c'; 10]));
    }
    let results = join_in_order(
        writes
            .iter()
            .map(|(path, value)| {
                let c = c.clone();
                let value = Bytes::from(value.clone());
                async move {
                    tokio::time::timeout(
                        Duration::from_secs(10),
                        c.create(path, value, CreateMode::Persistent),
                    )
                    .await
                }
            })
            .collect(),
    )
    .await;
    let acked: Vec<&str> = writes
        .iter()
        .zip(&results)
        .filter(|(_, r)| matches!(r, Ok(Ok(_))))
        .map(|((p, _), _)| p.as_str())
        .collect();
    let status = wait_exit(&mut server.child, Duration::from_secs(20))
        .expect("the server stops once its log cannot be written");
    assert!(!status.success(), "{status}");
    assert!(
        acked.is_empty(),
        "acknowledged after a failed append: {acked:?}; the server's log ends:\n{}",
        server.log_tail()
    );
    drop(server);

    // A new port: another test's server may have taken the old one.
    let addr = free_addr();
    let mut server = ServeProc::start(
        serve_command(&addr, &data, &[]),
        &addr,
        &scratch.file("recovered.log"),
    );
    server.wait_listening("restart without the limit").await;
    let c = connect(&addr).await;
    assert_eq!(c.get_data("/a").await.unwrap().0.len(), BIG);
    c.close().await;
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
}
