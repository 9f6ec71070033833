//! kazoo's own recipes (tests/kazoo/recipes.py) against Baton's ZooKeeper
//! listener, on one server, on a 3-member cluster, and through an observer
//! of one. `.ci/run` installs
//! kazoo in a virtual environment and sets `BATON_TEST_KAZOO_PYTHON` to its
//! python; without it these tests skip and say so.

use baton_server::Config;
use baton_testkit::fast_config;

use super::{external, run_external, zk_addr, zk_server_with, ZkCluster};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kazoo/recipes.py");

async fn run_recipes(python: &str, hosts: &str) {
    run_external(
        python,
        &[SCRIPT, hosts],
        &format!("kazoo's recipes against {hosts}"),
    )
    .await;
}

fn kazoo_python() -> Option<String> {
    external(
        "BATON_TEST_KAZOO_PYTHON",
        "kazoo's recipes (a python with kazoo)",
    )
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

/// Every client of kazoo's recipes on one observer (a member that never
/// votes): its reads and watches served there, its changes, locks,
/// elections and sessions forwarded to the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_recipes_through_an_observer() {
    let Some(python) = kazoo_python() else { return };
    let mut cluster = ZkCluster::start(3).await;
    let observer = cluster.add_observer().await;
    run_recipes(&python, &observer.to_string()).await;
    cluster.stop().await;
}
