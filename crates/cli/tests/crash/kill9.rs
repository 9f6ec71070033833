//! SIGKILL at random moments under a concurrent load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::free_addr;
use crate::harness::*;
use crate::model::*;
use baton_client::{Client, CreateMode};
use bytes::Bytes;

/// Pins: with `--fsync always`, a SIGKILL at any moment (under load, during
/// snapshots and log rotations) loses no acknowledged create, data write,
/// fenced write or ephemeral node; an in-flight write is applied whole or
/// not at all; sequence numbers and lock tokens keep growing across
/// restarts; sessions resume with their ephemerals; no lock contender node
/// is orphaned; recovery never reports damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_minus_9_at_random_moments_loses_nothing_acknowledged() {
    let seed = seed();
    eprintln!("kill -9 test: seed {seed} (BATON_CRASH_SEED={seed} replays its kill moments and operation mix)");
    let scratch = Scratch::new("kill9");
    let progress = Arc::new(Mutex::new(String::from("starting")));
    let limit = Duration::from_secs(60);
    let run = kill9_rounds(seed, &scratch, progress.clone());
    if tokio::time::timeout(limit, run).await.is_err() {
        panic!(
            "the kill -9 test did not finish within {limit:?} (seed {seed}); it was at: {}; the server log ends:\n{}",
            progress.lock().unwrap(),
            tail(&scratch.file("server.log"), 40)
        );
    }
}

async fn kill9_rounds(seed: u64, scratch: &Scratch, progress: Arc<Mutex<String>>) {
    let at = |what: String| *progress.lock().unwrap() = what;
    let mut rng = Rng::new(seed);
    let addr = free_addr();
    let data = scratch.data();
    let log = scratch.file("server.log");
    let start = || {
        ServeProc::start(
            serve_command(&addr, &data, &["--snapshot-every", "16384"]),
            &addr,
            &log,
        )
    };
    let mut server = start();
    server.wait_listening("first start").await;

    at("setup".into());
    let checker = connect(&addr).await;
    for path in ["/crash", "/crash/eph"] {
        checker
            .create(path, "", CreateMode::Persistent)
            .await
            .unwrap();
    }
    checker
        .create(FENCED, "fence-0", CreateMode::Persistent)
        .await
        .unwrap();
    let mut workers = Vec::new();
    for i in 0..CLIENTS {
        let client = connect(&addr).await;
        let session = client.session_id();
        client
            .create(&format!("/crash/c{i}"), "", CreateMode::Persistent)
            .await
            .unwrap();
        let own = Bytes::from(format!("c{i}-initial"));
        let stat = client
            .create(
                &format!("/crash/c{i}/own"),
                own.clone(),
                CreateMode::Persistent,
            )
            .await
            .unwrap()
            .stat;
        client
            .create(&format!("/crash/eph/c{i}"), "", CreateMode::Ephemeral)
            .await
            .unwrap();
        workers.push(Worker {
            i,
            client,
            session,
            rng: Rng::new(seed ^ (i as u64 + 1).wrapping_mul(0x5851_F42D_4C95_7F2D)),
            ops: 0,
            nodes: BTreeMap::new(),
            maybe: Vec::new(),
            own: Register::new(format!("/crash/c{i}/own"), own, stat.version),
            issued: Vec::new(),
            fence_acked: Vec::new(),
            fence_maybe: Vec::new(),
            acked: 0,
            unknown: 0,
            errors: Vec::new(),
        });
    }
    let clients: Vec<Client> = workers
        .iter()
        .map(|w| w.client.clone())
        .chain([checker.clone()])
        .collect();
    let shared = Arc::new(Shared {
        epoch: AtomicUsize::new(0),
        holder: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let mut fence_floor = 0;

    for round in 1..=ROUNDS {
        at(format!("round {round}: load"));
        let mut states = watch_states(&clients);
        shared.stop.store(false, Ordering::SeqCst);
        let running: Vec<_> = workers
            .drain(..)
            .map(|w| tokio::spawn(w.run(shared.clone())))
            .collect();

        // The random moment of the kill (not a wait for a condition).
        let load = Duration::from_millis(200 + rng.below(800));
        tokio::time::sleep(load).await;
        server.kill9();
        shared.epoch.fetch_add(1, Ordering::SeqCst);

        at(format!("round {round}: restarting after SIGKILL"));
        server = start();
        server
            .wait_listening(&format!("round {round}, restarting after SIGKILL"))
            .await;

        at(format!("round {round}: waiting for the sessions to resume"));
        wait_resumed(&mut server, &mut states, &format!("round {round}")).await;

        at(format!("round {round}: stopping the load"));
        shared.stop.store(true, Ordering::SeqCst);
        for handle in running {
            let worker = join_load(handle, &mut server, &format!("round {round}")).await;
            workers.push(worker);
        }
        workers.sort_by_key(|w| w.i);
        let mut errors: Vec<String> = workers
            .iter_mut()
            .flat_map(|w| w.errors.drain(..))
            .collect();

        at(format!("round {round}: checking"));
        errors.extend(verify(round, &checker, &mut workers, &mut fence_floor).await);
        let acked: u64 = workers.iter().map(|w| w.acked).sum();
        let unknown: u64 = workers.iter().map(|w| w.unknown).sum();
        eprintln!(
            "round {round}: SIGKILL after {load:?} of load; so far {acked} acknowledged, {unknown} of unknown outcome"
        );
        assert!(
            errors.is_empty(),
            "after kill -9 number {round} (seed {seed}):\n  {}\nthe server log ends:\n{}",
            errors.join("\n  "),
            server.log_tail()
        );
    }

    at("finishing".into());
    let acked: u64 = workers.iter().map(|w| w.acked).sum();
    assert!(
        acked >= 100,
        "only {acked} operations were acknowledged over {ROUNDS} rounds: the load did not run"
    );
    let log_text = read_log(&log);
    let snapshots = log_text.matches("snapshot written").count();
    let recoveries = log_text.matches("recovered").count();
    eprintln!("{snapshots} snapshots written, {recoveries} recoveries");
    assert!(
        snapshots >= 1,
        "no snapshot was written during the test: the kills never met a snapshot or a rotated log"
    );
    assert!(
        recoveries > ROUNDS,
        "the server logged {recoveries} recoveries for {} starts",
        ROUNDS + 1
    );
    for c in &clients {
        c.close().await;
    }
    let status = server.terminate(Duration::from_secs(20));
    assert!(
        status.success(),
        "a graceful stop after the crashes failed ({status}); the log ends:\n{}",
        server.log_tail()
    );
}
