//! `baton bench`: measurements anyone can run on their own machine.
//!
//! Every run is bounded in count and time, talks to loopback only, and by
//! default starts its own server as a child process (the same binary running
//! `baton serve`), so that the server's memory and CPU can be read from
//! /proc without the load generator mixed in.

mod chart;
mod cluster;
mod durability;
mod herd;
mod herd_run;
mod ops;
mod raw_watch;
mod reads;
mod server;
mod zk_client;
mod zookeeper;

use std::process::ExitCode;

use crate::{CliError, CliResult};

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    Ops(ops::OpsArgs),
    Durability(durability::DurabilityArgs),
    Herd(herd::HerdArgs),
    Cluster(cluster::ClusterArgs),
    Zookeeper(zookeeper::ZkBenchArgs),
    Reads(reads::ReadsArgs),
}

/// Runs a benchmark against `server` if one was named (--server or
/// BATON_SERVER), else against a server it starts itself.
pub async fn run(server: Option<String>, cmd: BenchCommand) -> CliResult {
    match cmd {
        BenchCommand::Ops(args) => ops::run(server, args).await,
        BenchCommand::Durability(args) => durability::run(args).await,
        BenchCommand::Herd(args) => herd::run(server, args).await,
        BenchCommand::Cluster(args) => cluster::run(args).await,
        BenchCommand::Zookeeper(args) => zookeeper::run(args).await,
        BenchCommand::Reads(args) => reads::run(args).await,
    }
    .map(|()| ExitCode::SUCCESS)
}

/// Median and tail of a set of samples, in microseconds.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Summary {
    pub fn of(samples: &mut [std::time::Duration]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples[i].as_nanos() as f64 / 1000.0
        };
        Summary {
            count: samples.len(),
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: at(1.0),
        }
    }
}

/// Runs `work` on every item as its own task, at most 256 at a time (a
/// few hundred handshakes or closes under way at once), and waits for all:
/// their results in the items' order.
pub async fn each_bounded<T, F, Fut>(
    items: impl IntoIterator<Item = T>,
    work: F,
) -> Result<Vec<Fut::Output>, CliError>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    let tasks: Vec<_> = items
        .into_iter()
        .map(|item| {
            let (gate, job) = (gate.clone(), work(item));
            tokio::spawn(async move {
                let _permit = gate.acquire().await.expect("never closed");
                job.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.map_err(|e| CliError::msg(e.to_string()))?);
    }
    Ok(out)
}

/// Prints a progress line on stderr.
pub fn progress(msg: impl std::fmt::Display) {
    eprintln!("bench: {msg}");
}

/// Prints a benchmark's report: one JSON object with `json`, Markdown
/// tables with `markdown`, else the plain table.
pub fn emit<R: serde::Serialize>(
    report: &R,
    json: bool,
    markdown: bool,
    print_markdown: impl FnOnce(&R),
    print_table: impl FnOnce(&R),
) {
    if json {
        println!(
            "{}",
            serde_json::to_string(report).expect("report serializes")
        );
    } else if markdown {
        print_markdown(report);
    } else {
        print_table(report);
    }
}
