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
///
/// With --node-id it is a member of a cluster (3 or 5 members, so that the
/// loss of any minority, leader included, is survived): changes are
/// replicated to a majority before they are acknowledged, and only the
/// leader serves clients (the others send them to it). Start a new cluster
/// by starting every member with the same --peers list; start a member that
/// joins a running cluster with --join, then add it with `baton cluster
/// add`. `baton cluster local` starts a whole cluster on this machine.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on for clients, as host:port [default:
    /// 127.0.0.1:4181; in a cluster, this member's client address in
    /// --peers]. Port 0 takes a free port; either way the server prints
    /// `listening on HOST:PORT` on stdout once it accepts connections.
    #[arg(long)]
    pub(crate) listen: Option<String>,

    /// This server is member ID of a cluster (a positive number, unique in
    /// the cluster).
    #[arg(long, value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) node_id: Option<u64>,

    /// The members of a new cluster, every one as
    /// ID=PEER_HOST:PEER_PORT/CLIENT_HOST:CLIENT_PORT, separated by commas,
    /// this member included (its peer address is where it listens for the
    /// others). Give every member of a new cluster the same list; once a
    /// member has started, its data directory holds the membership and the
    /// list is not needed (nor used) again.
    #[arg(
        long,
        value_name = "MEMBERS",
        requires = "node_id",
        conflicts_with = "join"
    )]
    pub(crate) peers: Option<String>,

    /// Start a member that joins a running cluster: it waits until the
    /// leader adds it (`baton cluster add`). Needs --peer-listen.
    #[arg(long, requires_all = ["node_id", "peer_listen"])]
    pub(crate) join: bool,

    /// Address to listen on for the other members [default: this member's
    /// peer address in --peers].
    #[arg(long, value_name = "HOST:PORT", requires = "node_id")]
    pub(crate) peer_listen: Option<String>,

    /// How long a follower waits without hearing from its leader before it
    /// stands for election, in milliseconds (the longest wait is twice
    /// this). Failover takes about this long.
    #[arg(long, value_name = "MS", default_value_t = 150, requires = "node_id")]
    pub(crate) election_timeout: u64,

    /// Take a snapshot of the state (and let the replicated log behind it
    /// go) after this many entries. A member far behind catches up from
    /// the snapshot.
    #[arg(long, value_name = "N", default_value_t = 10_000, requires = "node_id")]
    pub(crate) snapshot_entries: u64,

    /// Reach member ID at ADDR instead of the peer address it advertises
    /// (through a tunnel or a proxy), as ID=ADDR, separated by commas.
    #[arg(long, value_name = "ROUTES", requires = "node_id")]
    pub(crate) route: Option<String>,

    /// Take the client listener from this inherited file descriptor (a
    /// supervisor that bound it, as `baton cluster local` does).
    #[arg(long, value_name = "FD", hide = true, conflicts_with = "listen")]
    pub(crate) listen_fd: Option<i32>,

    /// Take the peer listener from this inherited file descriptor.
    #[arg(long, value_name = "FD", hide = true, conflicts_with = "peer_listen")]
    pub(crate) peer_listen_fd: Option<i32>,

    /// Directory that holds the server's durable state (write-ahead log and
    /// snapshots). It is created if missing and locked, so two servers cannot
    /// share it. On start the server recovers what it holds; sessions then
    /// get a full timeout to reconnect.
    #[arg(long, default_value = "./baton-data")]
    pub(crate) data_dir: PathBuf,

    /// When the log is synced to disk: `always` (no reply before its change
    /// is on disk; concurrent changes share one sync) or `never` (a crash of
    /// the server loses nothing, a power loss loses the last moments).
    #[arg(long, value_name = "POLICY", default_value = "always")]
    pub(crate) fsync: FsyncPolicy,

    /// Take a snapshot (and drop the log before it) after this many bytes
    /// of log.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    pub(crate) snapshot_every: u64,

    /// Smallest session timeout granted, in milliseconds (at least 100).
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    pub(crate) min_session_timeout: u64,

    /// Largest session timeout granted, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub(crate) max_session_timeout: u64,

    /// Largest data one node may hold, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = baton_proto::DEFAULT_MAX_DATA)]
    pub(crate) max_data: usize,

    /// Most client connections served at once; more are refused.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    pub(crate) max_connections: usize,

    /// Bytes the watches of one session may count for: each watched path
    /// counts its length plus 64 bytes. A watch past the limit is refused
    /// with a `too many watches` error.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub(crate) max_watch_bytes: usize,

    /// Threads that serve clients (and, in a cluster, the other members).
    /// By default a single server uses one per core and a cluster member
    /// one in all: a member's every change passes between several tasks
    /// (proposal, replication, the followers' answers, applying it), and on
    /// a few cores handing them between threads costs more than it gains
    /// (see docs/benchmarks.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) threads: Option<u16>,
}

impl ServeArgs {
    /// How many threads the runtime gets: `None` for one per core.
    pub(crate) fn runtime_threads(&self) -> Option<usize> {
        match (self.threads, self.node_id) {
            (Some(n), _) => Some(n as usize),
            (None, Some(_)) => Some(1),
            (None, None) => None,
        }
    }
}

pub async fn run(args: ServeArgs) -> CliResult {
    let mut config = Config {
        min_session_timeout: Duration::from_millis(args.min_session_timeout),
        max_session_timeout: Duration::from_millis(args.max_session_timeout),
        max_data: args.max_data,
        max_connections: args.max_connections,
        max_watch_bytes: args.max_watch_bytes,
        data_dir: Some(args.data_dir.clone()),
        fsync: args.fsync,
        snapshot_every_bytes: args.snapshot_every,
        ..Config::default()
    };
    // Room for the largest reply twice over, whatever the data limit.
    config.max_outbound_bytes = config
        .max_outbound_bytes
        .max(4 * (config.max_data + baton_proto::REQUEST_OVERHEAD));
    if let Some(id) = args.node_id {
        return crate::cluster::serve_member(id, &args, config).await;
    }
    let server = match args.listen_fd {
        Some(fd) => Server::new(inherited(fd, "--listen-fd")?, config)?,
        None => {
            let listen = args.listen.as_deref().unwrap_or(crate::DEFAULT_SERVER);
            Server::bind(listen, config).await?
        }
    };
    let addr = server
        .local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?;
    tracing::info!(%addr, "baton server ready; stop with Ctrl-C or SIGTERM");
    say_listening(&addr.to_string());
    server.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// Prints `listening on ADDR` on stdout, for scripts and supervisors (and
/// for a port 0 to be found out).
pub fn say_listening(addr: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {addr}").and_then(|()| out.flush());
}

/// A listener inherited as file descriptor `fd`.
pub fn inherited(fd: i32, flag: &str) -> Result<tokio::net::TcpListener, CliError> {
    use std::os::fd::FromRawFd;
    // SAFETY: the descriptor was passed to this process to be used as its
    // listener and is used by nothing else.
    let std = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    std.set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(std))
        .map_err(|e| CliError::msg(format!("{flag} {fd} is not a listening socket: {e}")))
}

pub async fn shutdown_signal() {
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
