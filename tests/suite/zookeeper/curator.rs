//! Apache Curator's own recipes (tests/curator/CuratorRecipes.java: its
//! mutex with 30 contenders, leader latch, atomic long, semaphore and cache)
//! against Baton's ZooKeeper listener, on one server and on a 3-member
//! cluster. `.ci/run` installs Curator and a JDK from Debian's packages and
//! sets `BATON_TEST_CURATOR_CLASSPATH`; without it these tests skip and say
//! so.

use std::time::Duration;

use tokio::process::Command;

use super::{zk_addr, zk_server, ZkCluster};

async fn run_recipes(classpath: &str, hosts: &str) {
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/curator/CuratorRecipes.java"
    );
    let run = Command::new("java")
        .args(["-cp", classpath, source, hosts])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("Curator's recipes finished within 300 s")
        .expect("java starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "Curator's recipes failed against {hosts}:\n{text}"
    );
    eprintln!("{text}");
}

fn curator_classpath() -> Option<String> {
    let classpath = std::env::var("BATON_TEST_CURATOR_CLASSPATH").ok();
    if classpath.is_none() {
        eprintln!("BATON_TEST_CURATOR_CLASSPATH is not set (Curator's and ZooKeeper's jars): skipping Curator's recipes; .ci/run sets it up");
    }
    classpath
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_recipes_on_one_server() {
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let server = zk_server().await;
    run_recipes(&classpath, &zk_addr(&server).to_string()).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_recipes_on_a_three_member_cluster() {
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let cluster = ZkCluster::start(3).await;
    run_recipes(&classpath, &cluster.hosts()).await;
    cluster.stop().await;
}
