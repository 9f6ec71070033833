//! kazoo's own recipes (tests/kazoo/recipes.py) against Baton's ZooKeeper
//! listener, on one server and on a 3-member cluster. `.ci/run` installs
//! kazoo in a virtual environment and sets `BATON_TEST_KAZOO_PYTHON` to its
//! python; without it these tests skip and say so.

use std::time::Duration;

use tokio::process::Command;

use baton_server::Config;
use baton_testkit::fast_config;

use super::{zk_addr, zk_server_with, ZkCluster};

/// Runs the recipes script against `hosts`; panics with its output if it
/// fails.
async fn run_recipes(python: &str, hosts: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kazoo/recipes.py");
    let run = Command::new(python)
        .arg(script)
        .arg(hosts)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("kazoo's recipes finished within 300 s")
        .expect("the recipes script starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "kazoo's recipes failed against {hosts}:\n{text}"
    );
    eprintln!("{text}");
}

fn kazoo_python() -> Option<String> {
    let python = std::env::var("BATON_TEST_KAZOO_PYTHON").ok();
    if python.is_none() {
        eprintln!("BATON_TEST_KAZOO_PYTHON is not set (a python with kazoo): skipping kazoo's recipes; .ci/run sets it up");
    }
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_recipes_on_one_server() {
    let Some(python) = kazoo_python() else { return };
    // Every four-letter word, for kazoo's server_version() (which asks
    // `envi`).
    let server = zk_server_with(Config {
        zk_words: vec!["*".into()],
        ..fast_config()
    })
    .await;
    run_recipes(&python, &zk_addr(&server).to_string()).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_recipes_on_a_three_member_cluster() {
    let Some(python) = kazoo_python() else { return };
    let cluster = ZkCluster::start(3).await;
    run_recipes(&python, &cluster.hosts()).await;
    cluster.stop().await;
}
