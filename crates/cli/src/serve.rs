//! `baton serve`: run a server until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton_server::persist::FsyncPolicy;
use baton_server::{Config, Server};
use tokio::signal::unix::{signal, SignalKind};

use crate::{CliError, CliResult};

/// Run a Baton server in the foreground until SIGINT (Ctrl-C) or SIGTERM.
///
/// Clients connect to it over TCP; sessions that fall silent for their
/// negotiated timeout expire and take their ephemeral nodes with them.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on, as host:port. Port 0 takes a free port; either
    /// way the server prints `listening on HOST:PORT` on stdout once it
    /// accepts connections.
    #[arg(long, default_value = crate::DEFAULT_SERVER)]
    listen: String,

    /// Directory that holds the server's durable state (write-ahead log and
    /// snapshots). It is created if missing and locked, so two servers cannot
    /// share it. On start the server recovers what it holds; sessions then
    /// get a full timeout to reconnect.
    #[arg(long, default_value = "./baton-data")]
    data_dir: PathBuf,

    /// When the log is synced to disk: `always` (no reply before its change
    /// is on disk; concurrent changes share one sync) or `never` (a crash of
    /// the server loses nothing, a power loss loses the last moments).
    #[arg(long, value_name = "POLICY", default_value = "always")]
    fsync: FsyncPolicy,

    /// Take a snapshot (and drop the log before it) after this many bytes
    /// of log.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    snapshot_every: u64,

    /// Smallest session timeout granted, in milliseconds (at least 100).
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    min_session_timeout: u64,

    /// Largest session timeout granted, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    max_session_timeout: u64,

    /// Largest data one node may hold, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = baton_proto::DEFAULT_MAX_DATA)]
    max_data: usize,

    /// Most client connections served at once; more are refused.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    max_connections: usize,

    /// Bytes the watches of one session may count for: each watched path
    /// counts its length plus 64 bytes. A watch past the limit is refused
    /// with a `too many watches` error.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    max_watch_bytes: usize,
}

pub async fn run(args: ServeArgs) -> CliResult {
    let mut config = Config {
        min_session_timeout: Duration::from_millis(args.min_session_timeout),
        max_session_timeout: Duration::from_millis(args.max_session_timeout),
        max_data: args.max_data,
        max_connections: args.max_connections,
        max_watch_bytes: args.max_watch_bytes,
        data_dir: Some(args.data_dir),
        fsync: args.fsync,
        snapshot_every_bytes: args.snapshot_every,
        ..Config::default()
    };
    // Room for the largest reply twice over, whatever the data limit.
    config.max_outbound_bytes = config
        .max_outbound_bytes
        .max(4 * (config.max_data + baton_proto::REQUEST_OVERHEAD));
    let server = Server::bind(args.listen.as_str(), config).await?;
    let addr = server
        .local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?;
    tracing::info!(%addr, "baton server ready; stop with Ctrl-C or SIGTERM");
    // For scripts and supervisors (and for a port 0 to be found out).
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on {addr}").and_then(|()| out.flush());
    }
    server.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}
