//! `baton`: run a Baton server, and inspect or change its nodes.

mod backup;
mod barrier;
mod bench;
mod chaos;
mod cluster;
mod commands;
mod duration;
mod elect;
mod lease;
mod local;
mod lock;
mod reaper;
mod semaphore;
mod serve;
mod signals;
mod status;
mod supervise;
mod sys;
mod txn;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Default server address for client commands.
pub const DEFAULT_SERVER: &str = "127.0.0.1:4181";

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Baton: fair, herd-free locks and leader election with fencing tokens",
    long_about = "Baton: fair, herd-free locks and leader election with fencing tokens.\n\n\
        `baton serve` runs the coordination server. The other commands are clients of a \
        running server: they open a session, do their work and close it.",
    after_help = "Exit status: 0 on success, 1 when the command fails (the reason is printed on \
        stderr), 2 for a usage error.\n\nLogs go to stderr; set RUST_LOG (for example \
        RUST_LOG=debug) to choose how much."
)]
struct Cli {
    /// Server to talk to, as host:port (several may be given, separated by
    /// commas) [default: 127.0.0.1:4181]
    #[arg(long, global = true, env = "BATON_SERVER")]
    server: Option<String>,

    /// Connect with TLS, trusting the certificate authorities in this PEM
    /// file. For `baton serve`: require client certificates that chain to
    /// them (the server reads BATON_SERVE_TLS_CA, not BATON_TLS_CA).
    #[arg(long, global = true, value_name = "FILE", env = "BATON_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,

    /// This side's certificate chain, PEM: a client's, for a server that
    /// asks for one; for `baton serve`, the server's (it then takes TLS
    /// connections only; the server reads BATON_SERVE_TLS_CERT, not
    /// BATON_TLS_CERT).
    #[arg(long, global = true, value_name = "FILE", env = "BATON_TLS_CERT")]
    tls_cert: Option<std::path::PathBuf>,

    /// The private key of --tls-cert, PEM (for `baton serve`,
    /// BATON_SERVE_TLS_KEY).
    #[arg(long, global = true, value_name = "FILE", env = "BATON_TLS_KEY")]
    tls_key: Option<std::path::PathBuf>,

    /// Read the token that names this client's identity from FILE (for a
    /// server that checks identities; the BATON_TOKEN variable holds the
    /// token itself instead). Use it over TLS.
    #[arg(long, global = true, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,

    /// How long opening a session may take in all: finding the cluster
    /// member that leads (a member that does not answer within a quarter
    /// second has the next tried alongside it), connecting and the
    /// handshake. A duration: 500ms, 2s, 1m (a bare number is
    /// milliseconds). [default: 5s]
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        env = "BATON_CONNECT_TIMEOUT"
    )]
    connect_timeout: Option<duration::Span>,

    /// What client commands' reads promise: `linearizable` (every read
    /// sees every change committed before it; the member confirms with the
    /// leader first) or `sequential` (the member that answers reads from
    /// its own state at once, as ZooKeeper's followers do; it may be a
    /// little behind the leader, but never goes back). [default:
    /// linearizable]
    #[arg(long, global = true, value_name = "MODE", env = "BATON_READ_MODE")]
    read_mode: Option<baton_client::ReadMode>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Serve(Box<serve::ServeArgs>),
    Create(commands::CreateArgs),
    Get(commands::GetArgs),
    Set(commands::SetArgs),
    Ls(commands::LsArgs),
    Stat(commands::StatArgs),
    #[command(visible_alias = "delete")]
    Rm(commands::RmArgs),
    Txn(txn::TxnArgs),
    Barrier(barrier::BarrierArgs),
    Watch(watch::WatchArgs),
    Lock(lock::LockArgs),
    Semaphore(semaphore::SemaphoreArgs),
    Locks(lock::LocksArgs),
    Status(status::StatusArgs),
    Elect(elect::ElectArgs),
    Leader(elect::LeaderArgs),
    /// Measure Baton: round trips, durable writes, the thundering herd.
    ///
    /// Each benchmark starts its own server unless --server (or
    /// BATON_SERVER) names one, and prints a table (or JSON).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Manage a cluster: status, members, or a whole one on this machine.
    ///
    /// `status`, `add` and `remove` ask the members given with --server (any
    /// of them: one that does not lead names the leader).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    #[command(subcommand)]
    Snapshot(backup::SnapshotCommand),
    Chaos(chaos::ChaosArgs),
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == reaper::SUBCOMMAND) {
        reaper::run(args.collect());
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let mut cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if !matches!(cli.command, Command::Serve(_)) {
        // Output piped into a reader that exits (`baton ls / | head -1`)
        // ends the command quietly, as it ends other Unix tools, instead of
        // a panic on the failed write.
        // SAFETY: sets a signal's disposition to its default; no handler.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    init_tracing(matches!(cli.command, Command::Serve(_)));
    // A server's settings are merged and checked before anything starts:
    // they choose the runtime.
    let mut settings = None;
    if let Command::Serve(args) = &mut cli.command {
        // The TLS flags are the server's own here, when given on the
        // command line; its variables are BATON_SERVE_TLS_*, not the
        // clients' BATON_TLS_* (a BATON_TLS_CA exported for clients would
        // make a server started from the same shell demand client
        // certificates).
        let mut args = std::mem::take(&mut **args);
        let given = |id: &str, value: &Option<std::path::PathBuf>| {
            value.clone().filter(|_| {
                matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
            })
        };
        let own = |name: &str| std::env::var_os(name).map(std::path::PathBuf::from);
        args.tls_cert = given("tls_cert", &cli.tls_cert)
            .or_else(|| own("BATON_SERVE_TLS_CERT"))
            .or(args.tls_cert);
        args.tls_key = given("tls_key", &cli.tls_key)
            .or_else(|| own("BATON_SERVE_TLS_KEY"))
            .or(args.tls_key);
        args.tls_ca = given("tls_ca", &cli.tls_ca)
            .or_else(|| own("BATON_SERVE_TLS_CA"))
            .or(args.tls_ca);
        match args.resolve() {
            Ok(s) if s.effective_print_config() => {
                print!("{}", s.to_toml());
                return ExitCode::SUCCESS;
            }
            Ok(s) => settings = Some(s),
            Err(e) => {
                eprintln!("baton: {e:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    sys::raise_fd_limit();
    let mut builder = match settings.as_ref().map(|s| s.runtime_threads()) {
        Some(Some(1)) => tokio::runtime::Builder::new_current_thread(),
        Some(Some(n)) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("baton: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !matches!(cli.command, Command::Serve(_)) {
        match client_tls(&cli).and_then(|tls| Ok((tls, client_token(&cli)?))) {
            Ok((tls, token)) => {
                let _ = CLIENT_TLS.set(tls);
                let _ = CLIENT_TLS_FILES.set(TlsFiles {
                    ca: cli.tls_ca.clone(),
                    cert: cli.tls_cert.clone(),
                    key: cli.tls_key.clone(),
                });
                let _ = CLIENT_TOKEN.set(token);
                let _ = CONNECT_TIMEOUT.set(cli.connect_timeout.map(|s| s.0));
                let _ = READ_MODE.set(cli.read_mode.unwrap_or_default());
            }
            Err(e) => {
                eprintln!("baton: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let explicit_server = cli.server.clone();
    let server = cli.server.unwrap_or_else(|| DEFAULT_SERVER.to_string());
    if !matches!(cli.command, Command::Serve(_)) {
        let bad = server
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .find_map(|a| serve::check_addr(a).err());
        if let Some(why) = bad {
            eprintln!("baton: --server (or BATON_SERVER): {why}; several are separated by commas");
            return ExitCode::FAILURE;
        }
    }
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(_) => match settings {
                Some(settings) => serve::run(settings).await,
                None => unreachable!("the settings of `baton serve` are resolved first"),
            },
            Command::Create(args) => commands::create(&server, args).await,
            Command::Get(args) => commands::get(&server, args).await,
            Command::Set(args) => commands::set(&server, args).await,
            Command::Ls(args) => commands::ls(&server, args).await,
            Command::Stat(args) => commands::stat(&server, args).await,
            Command::Rm(args) => commands::rm(&server, args).await,
            Command::Txn(args) => txn::txn(&server, args).await,
            Command::Barrier(args) => barrier::barrier(&server, args).await,
            Command::Watch(args) => watch::watch(&server, args).await,
            Command::Lock(args) => lock::lock(&server, args).await,
            Command::Semaphore(args) => semaphore::semaphore(&server, args).await,
            Command::Locks(args) => lock::locks(&server, args).await,
            Command::Status(args) => status::status(&server, args).await,
            Command::Elect(args) => elect::elect(&server, args).await,
            Command::Leader(args) => elect::leader(&server, args).await,
            Command::Bench(cmd) => bench::run(explicit_server, cmd).await,
            Command::Chaos(args) => chaos::run(explicit_server, args).await,
            Command::Cluster(cmd) => cluster::run(&server, cmd).await,
            Command::Snapshot(cmd) => backup::run(&server, cmd).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("baton: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The TLS settings client commands connect with (`None`: plaintext).
static CLIENT_TLS: std::sync::OnceLock<Option<baton_client::ClientTls>> =
    std::sync::OnceLock::new();

/// The client's TLS settings from --tls-ca, --tls-cert and --tls-key.
fn client_tls(cli: &Cli) -> Result<Option<baton_client::ClientTls>, CliError> {
    match (&cli.tls_ca, &cli.tls_cert, &cli.tls_key) {
        (None, None, None) => Ok(None),
        (None, _, _) => Err(CliError::msg(
            "--tls-cert and --tls-key need --tls-ca: the certificate authority the server's certificate must chain to",
        )),
        (Some(_), Some(_), None) | (Some(_), None, Some(_)) => Err(CliError::msg(
            "give --tls-cert and --tls-key together (this client's certificate and its key)",
        )),
        (Some(ca), cert, key) => {
            let identity = cert.as_deref().zip(key.as_deref());
            Ok(Some(baton_client::ClientTls::from_files(ca, identity)?))
        }
    }
}

/// The TLS files client commands were given: the authority, and this
/// client's certificate and key.
static CLIENT_TLS_FILES: std::sync::OnceLock<TlsFiles> = std::sync::OnceLock::new();

#[derive(Default)]
struct TlsFiles {
    ca: Option<std::path::PathBuf>,
    cert: Option<std::path::PathBuf>,
    key: Option<std::path::PathBuf>,
}

/// Mutual TLS for talking to cluster members on their peer port (`baton
/// cluster add` and `remove`): with --tls-ca, --tls-cert and --tls-key all
/// given, else `None`.
pub fn peer_tls() -> Result<Option<baton_cluster::network::PeerTls>, CliError> {
    let files = CLIENT_TLS_FILES.get_or_init(TlsFiles::default);
    match (&files.ca, &files.cert, &files.key) {
        (Some(ca), Some(cert), Some(key)) => {
            baton_cluster::network::PeerTls::from_files(cert, key, ca)
                .map(Some)
                .map_err(|e| CliError::msg(e.to_string()))
        }
        // Without a certificate of its own this client cannot speak to
        // members that use TLS between them; it tries plain TCP.
        _ => Ok(None),
    }
}

/// The TLS settings of client commands.
pub fn tls() -> Option<&'static baton_client::ClientTls> {
    CLIENT_TLS.get().and_then(Option::as_ref)
}

/// The token client commands name their identity with, if any.
static CLIENT_TOKEN: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();

/// The token from --token-file, or else BATON_TOKEN.
fn client_token(cli: &Cli) -> Result<Option<Vec<u8>>, CliError> {
    if let Some(path) = &cli.token_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::msg(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(CliError::msg(format!(
                "the token file {} is empty",
                path.display()
            )));
        }
        return Ok(Some(token.as_bytes().to_vec()));
    }
    Ok(std::env::var("BATON_TOKEN")
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .map(String::into_bytes))
}

/// The token of client commands.
pub fn token() -> Option<&'static [u8]> {
    CLIENT_TOKEN.get().and_then(Option::as_deref)
}

/// A session's settings for `server`, with this command's TLS settings and
/// token.
/// The client commands' `--connect-timeout`, once parsed.
static CONNECT_TIMEOUT: std::sync::OnceLock<Option<std::time::Duration>> =
    std::sync::OnceLock::new();

/// The client commands' `--read-mode`.
static READ_MODE: std::sync::OnceLock<baton_client::ReadMode> = std::sync::OnceLock::new();

pub fn client_builder(server: &str) -> baton_client::ClientBuilder {
    let mut builder = baton_client::Client::builder(server)
        .read_mode(READ_MODE.get().copied().unwrap_or_default());
    if let Some(limit) = CONNECT_TIMEOUT.get().copied().flatten() {
        builder = builder.connect_timeout(limit);
    }
    if let Some(tls) = tls() {
        builder = builder.tls(tls.clone());
    }
    if let Some(token) = token() {
        builder = builder.token(token.to_vec());
    }
    builder
}

/// Logs to stderr, filtered by RUST_LOG; `info` for the server, `warn` for
/// client commands so that their stdout and stderr stay quiet.
fn init_tracing(server: bool) {
    use tracing_subscriber::EnvFilter;
    // openraft's own messages are many (several per election, one per
    // failed call to a member that is down) and are off unless RUST_LOG
    // asks for them: a member logs elections, leadership, unreachable
    // members and storage failures itself.
    let default = if server { "info,openraft=off" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours on a terminal only: not in a journal or a log file.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
}

/// An error that ends the command, printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Client(#[from] baton_client::Error),
    #[error("{0}")]
    Server(#[from] baton_server::ServerError),
    #[error("{0}")]
    Other(String),
}

impl CliError {
    pub fn msg(s: impl Into<String>) -> Self {
        CliError::Other(s.into())
    }
}

pub type CliResult = Result<ExitCode, CliError>;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}

/// jemalloc: less memory per idle session than the system allocator (see
/// docs/benchmarks.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings: a background thread gives memory freed after a
/// burst (a thundering herd, a flood of sessions) back to the system, so a
/// long-running server's footprint follows its steady state. It does so
/// within about a second (`dirty_decay_ms`): with jemalloc's default of
/// 10 s, part of what a burst freed was still held once the RSS had
/// stopped falling (docs/benchmarks.md). Pages used again within that
/// second are not given back, so a steady load keeps its memory.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000\0";
