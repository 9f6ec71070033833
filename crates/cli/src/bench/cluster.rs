//! `baton bench cluster`: a 3-member cluster on this machine against a
//! single server in the same run: contended lock handovers, durable writes,
//! and the failover time over repeated kills of the leader.

use std::time::{Duration, Instant};

use baton_client::Client;
use serde::Serialize;

use super::durability::{handover_run, write_run};
use super::server::ChildServer;
use super::{progress, Summary};
use crate::local::LocalCluster;
use crate::CliError;

/// Measure a cluster: handovers, durable writes, failover time.
///
/// Starts a single server and a cluster of --members `baton serve`
/// processes (both with `--fsync always`, data under --dir), runs the same
/// contended handovers and durable writes against each, then kills the
/// cluster's leader with SIGKILL --kills times, measuring from the kill to
/// the first write the cluster accepts, restarting the killed member (and
/// waiting until it has caught up) before the next kill.
#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Members of the cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=9))]
    members: u64,
    /// Contenders queueing on one lock for the handover measurement.
    #[arg(long, default_value_t = 16)]
    contenders: usize,
    /// Concurrent writers for the durable write measurement.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// How long each timed run lasts (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::duration::millis)]
    duration_ms: u64,
    /// How many times the leader is killed (0 skips it).
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Directory for the data directories (default: the system's temporary
    /// directory).
    #[arg(long, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print Markdown tables (as in docs/benchmarks.md).
    #[arg(long)]
    markdown: bool,
}

#[derive(Serialize)]
struct Report {
    members: u64,
    single_handovers_per_s: f64,
    cluster_handovers_per_s: f64,
    single_writes_per_s: f64,
    cluster_writes_per_s: f64,
    failover: Summary,
    failovers: Vec<f64>,
}

pub async fn run(args: ClusterArgs) -> Result<(), CliError> {
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let root = base.join(format!("baton-bench-cluster-{}", std::process::id()));
    let result = measure(&args, &root).await;
    let _ = std::fs::remove_dir_all(&root);
    let report = result?;
    super::emit(
        &report,
        args.json,
        args.markdown,
        print_markdown,
        print_table,
    );
    Ok(())
}

async fn measure(args: &ClusterArgs, root: &std::path::Path) -> Result<Report, CliError> {
    let duration = Duration::from_millis(args.duration_ms);
    let per_s = |n: u64| n as f64 / duration.as_secs_f64();

    progress("a single server, --fsync always");
    let single = ChildServer::start_in(&root.join("single"), &["--fsync", "always"]).await?;
    progress(format!(
        "single server: handovers, {} contenders, {} ms",
        args.contenders, args.duration_ms
    ));
    let single_handovers = handover_run(&single.addr, args.contenders, duration).await?;
    progress(format!(
        "single server: durable writes, {} writers, {} ms",
        args.writers, args.duration_ms
    ));
    let single_writes = write_run(&single.addr, args.writers, duration).await?;
    single.kill().await;

    progress(format!("a cluster of {} members", args.members));
    // Every client on the leader, as the single server's are on it.
    let leader_only = ["--followers-serve".to_string(), "false".to_string()];
    let mut cluster = LocalCluster::start(args.members, &root.join("cluster"), &leader_only)?;
    cluster
        .wait_leader(Duration::from_secs(20))
        .await
        .ok_or_else(|| CliError::msg("no member of the cluster leads after 20 s"))?;
    let addrs = cluster.clients();
    progress(format!(
        "cluster: handovers, {} contenders, {} ms",
        args.contenders, args.duration_ms
    ));
    let cluster_handovers = handover_run(&addrs, args.contenders, duration).await?;
    progress(format!(
        "cluster: durable writes, {} writers, {} ms",
        args.writers, args.duration_ms
    ));
    let cluster_writes = write_run(&addrs, args.writers, duration).await?;

    let mut failovers = Vec::new();
    for round in 1..=args.kills {
        let leader = cluster
            .wait_leader(Duration::from_secs(20))
            .await
            .ok_or_else(|| CliError::msg("no member leads"))?;
        cluster.kill9(leader).await;
        let killed = Instant::now();
        let took = first_write(&addrs, killed + Duration::from_secs(30)).await?;
        failovers.push(took);
        progress(format!(
            "failover {round}/{}: member {leader} killed, a write accepted {} ms later",
            args.kills,
            took.as_millis()
        ));
        cluster.restart(leader).await?;
        wait_caught_up(&cluster, leader).await?;
    }
    cluster.stop().await;
    let samples: Vec<f64> = failovers.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    Ok(Report {
        members: args.members,
        single_handovers_per_s: per_s(single_handovers),
        cluster_handovers_per_s: per_s(cluster_handovers),
        single_writes_per_s: per_s(single_writes),
        cluster_writes_per_s: per_s(cluster_writes),
        failover: Summary::of(&mut failovers),
        failovers: samples,
    })
}

/// Time from `killed` to the first write the cluster accepts, tried every
/// few milliseconds with a fresh client.
async fn first_write(addrs: &str, deadline: Instant) -> Result<Duration, CliError> {
    let started = deadline - Duration::from_secs(30);
    loop {
        let attempt = async {
            let c = Client::builder(addrs)
                .connect_timeout(Duration::from_millis(200))
                .connect()
                .await?;
            let r = c.set_data("/", "", None).await;
            c.close().await;
            r
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(300), attempt).await {
            return Ok(started.elapsed());
        }
        if Instant::now() > deadline {
            return Err(CliError::msg(
                "no write accepted within 30 s of killing the leader",
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until member `id` has applied what the leader had applied when
/// the wait began (each member reports its own applied index as it is when
/// asked).
async fn wait_caught_up(cluster: &LocalCluster, id: u64) -> Result<(), CliError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut want = None;
    loop {
        if want.is_none() {
            if let Some(leader) = cluster.leader().await {
                want = cluster.applied(leader).await;
            }
        }
        if let Some(want) = want {
            if cluster.applied(id).await.unwrap_or(0) >= want {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(CliError::msg(format!(
                "member {id} did not catch up within 30 s of its restart"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn print_table(r: &Report) {
    println!(
        "{:<34} {:>14} {:>14} {:>8}",
        "",
        "single server",
        format!("{} members", r.members),
        "ratio"
    );
    println!(
        "{:<34} {:>14.0} {:>14.0} {:>8.2}",
        "contended handovers/s",
        r.single_handovers_per_s,
        r.cluster_handovers_per_s,
        r.cluster_handovers_per_s / r.single_handovers_per_s
    );
    println!(
        "{:<34} {:>14.0} {:>14.0} {:>8.2}",
        "durable writes/s",
        r.single_writes_per_s,
        r.cluster_writes_per_s,
        r.cluster_writes_per_s / r.single_writes_per_s
    );
    if r.failover.count > 0 {
        println!();
        println!(
            "failover (kill -9 of the leader to the first accepted write), {} kills: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            r.failover.count,
            r.failover.p50_us / 1000.0,
            r.failover.p99_us / 1000.0,
            r.failover.max_us / 1000.0
        );
    }
}

fn print_markdown(r: &Report) {
    println!(
        "| `--fsync always` | single server | {} members | {} members / single |",
        r.members, r.members
    );
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| contended handovers/s | {:.0} | {:.0} | {:.2}x |",
        r.single_handovers_per_s,
        r.cluster_handovers_per_s,
        r.cluster_handovers_per_s / r.single_handovers_per_s
    );
    println!(
        "| durable writes/s | {:.0} | {:.0} | {:.2}x |",
        r.single_writes_per_s,
        r.cluster_writes_per_s,
        r.cluster_writes_per_s / r.single_writes_per_s
    );
    if r.failover.count > 0 {
        println!();
        println!("| failover: kill -9 of the leader to the first accepted write | ms |");
        println!("| --- | ---: |");
        println!("| kills | {} |", r.failover.count);
        println!("| p50 | {:.0} |", r.failover.p50_us / 1000.0);
        println!("| p99 | {:.0} |", r.failover.p99_us / 1000.0);
        println!("| max | {:.0} |", r.failover.max_us / 1000.0);
    }
}
