//! Apache Curator's own recipes (tests/curator/CuratorRecipes.java: its
//! mutex with 30 contenders, leader latch, atomic long, semaphore and cache)
//! against Baton's ZooKeeper listener, on one server, on a 3-member cluster
//! and through an observer of one; and ZooKeeper's own Java client keeping
//! its watches across the loss of the cluster's leader
//! (tests/curator/WatchFailover.java). `.ci/run` installs Curator and a JDK
//! from Debian's packages and sets `BATON_TEST_CURATOR_CLASSPATH`; without
//! it these tests skip and say so.

use std::time::Duration;

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::{external, run_external, zk_addr, zk_server, ZkCluster};

async fn run_recipes(classpath: &str, hosts: &str) {
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/curator/CuratorRecipes.java"
    );
    run_external(
        "java",
        &["-cp", classpath, source, hosts],
        &format!("Curator's recipes against {hosts}"),
    )
    .await;
}

fn curator_classpath() -> Option<String> {
    external(
        "BATON_TEST_CURATOR_CLASSPATH",
        "Curator's recipes (Curator's and ZooKeeper's jars)",
    )
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

/// Every client of Curator's recipes on one observer (a member that never
/// votes): its reads, watches and caches served there, its changes, locks,
/// latches and sessions forwarded to the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_recipes_through_an_observer() {
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let mut cluster = ZkCluster::start(3).await;
    let observer = cluster.add_observer().await;
    run_recipes(&classpath, &observer.to_string()).await;
    cluster.stop().await;
}

/// ZooKeeper's Java client sets its persistent recursive watch and a
/// one-shot watch again on the new leader (setWatches2), and both report a
/// change made there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_client_keeps_its_watches_across_the_loss_of_the_leader() {
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let mut cluster = ZkCluster::start(3).await;
    let hosts = cluster.hosts();
    watches_across_the_loss_of_the_leader(&classpath, &mut cluster, &hosts).await;
    cluster.stop().await;
}

/// The same with only an observer in the client's connect string: the
/// observer, which follows the new leader, serves the client throughout,
/// and its watches report a change made after the leader is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_client_on_an_observer_keeps_its_watches_across_the_loss_of_the_leader() {
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let mut cluster = ZkCluster::start(3).await;
    let observer = cluster.add_observer().await.to_string();
    watches_across_the_loss_of_the_leader(&classpath, &mut cluster, &observer).await;
    cluster.stop().await;
}

/// Runs tests/curator/WatchFailover.java against `hosts`, stops the
/// cluster's leader once it has set its watches, and checks that they
/// reported the change it then makes.
async fn watches_across_the_loss_of_the_leader(
    classpath: &str,
    cluster: &mut ZkCluster,
    hosts: &str,
) {
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/curator/WatchFailover.java"
    );
    let mut child = Command::new("java")
        .args(["-cp", classpath, source, hosts])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("java starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let ready = line == "ready";
            said.push(line);
            if ready {
                return;
            }
        }
        panic!("the client ended before it was ready: {said:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("the client was not ready within 120 s: {said:?}"));
    cluster.stop_leader().await;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    drop(stdin);
    let rest = tokio::time::timeout(Duration::from_secs(120), async {
        let mut rest = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            rest.push(line);
        }
        rest
    })
    .await
    .expect("the client finished within 120 s");
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{said:?} {rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("ok")), "{rest:?}");
}
