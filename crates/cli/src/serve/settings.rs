//! `baton serve`'s settings: its flags, variables and file, read into the
//! [`Settings`] a server or a cluster member runs with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_cluster::Member;
use baton_server::auth::{Identities, Identity, Rights};
use baton_server::persist::FsyncPolicy;
use baton_server::tls::TlsFiles;
use baton_server::Config;
use serde::{Deserialize, Serialize};

use crate::CliError;

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
///
/// Settings come from a TOML file (--config), then BATON_* environment
/// variables, then flags, each overriding the one before. Every setting
/// below that names a variable is also a key of the file, spelled like the
/// flag without its dashes (`data-dir = "/var/lib/baton"`);
/// --print-config shows the settings in effect.
#[derive(clap::Args, Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
#[command(
    after_help = "Exit status: 0 once stopped by a signal, 1 when the server cannot start \
    (a bad setting is named with the file, variable or flag it came from) or fails."
)]
pub struct ServeArgs {
    /// Read settings from this TOML file; the environment and flags
    /// override them.
    #[arg(long, value_name = "FILE", env = "BATON_CONFIG")]
    #[serde(skip)]
    pub(crate) config: Option<PathBuf>,

    /// Print the settings in effect (as a config file) and exit.
    #[arg(long)]
    #[serde(skip)]
    pub(crate) print_config: bool,

    /// Address to listen on for clients, as host:port [default:
    /// 127.0.0.1:4181; in a cluster, this member's client address in
    /// --peers]. Port 0 takes a free port; either way the server prints
    /// `listening on HOST:PORT` on stdout once it accepts connections.
    #[arg(long, env = "BATON_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<String>,

    /// Serve metrics for Prometheus over HTTP at http://ADDR/metrics
    /// (host:port; OpenMetrics text). Off unless given.
    #[arg(long, value_name = "HOST:PORT", env = "BATON_METRICS_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metrics_listen: Option<String>,

    /// Also speak ZooKeeper's client protocol on this address (such as
    /// 127.0.0.1:2181), so that ZooKeeper clients and their recipes
    /// (kazoo, Curator, zkCli) work unchanged; on a cluster, give every
    /// member one. With TLS only if the server has a certificate
    /// (docs/zookeeper.md). Off unless given.
    #[arg(long, value_name = "HOST:PORT", env = "BATON_ZK_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) zk_listen: Option<String>,

    /// The four-letter words the ZooKeeper listener answers, separated by
    /// commas (ZooKeeper's 4lw.commands.whitelist), or * for all of ruok,
    /// srvr, stat, mntr, cons, wchs, isro, conf, envi.
    /// [default: ruok,srvr,mntr,isro]
    #[arg(long = "zk-4lw", value_name = "WORDS", env = "BATON_ZK_4LW")]
    #[serde(rename = "zk-4lw", skip_serializing_if = "Option::is_none")]
    pub(crate) zk_4lw: Option<String>,

    /// What ZooKeeper clients' reads promise on a cluster member:
    /// `linearizable` (every read confirmed with the leader first, stronger
    /// than ZooKeeper itself) or `sequential` (answered from the member's
    /// own state at once, as ZooKeeper's followers answer them: never
    /// going back, after the session's own changes, up to date after a
    /// sync; reads then scale with the members). [default: linearizable]
    #[arg(long, value_name = "MODE", env = "BATON_ZK_READ_MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) zk_read_mode: Option<String>,

    /// This server is member ID of a cluster (a positive number, unique in
    /// the cluster).
    #[arg(long, value_name = "ID", env = "BATON_NODE_ID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) node_id: Option<u64>,

    /// The members of a new cluster, every one as
    /// ID=PEER_HOST:PEER_PORT/CLIENT_HOST:CLIENT_PORT, separated by commas,
    /// this member included (its peer address is where it listens for the
    /// others). Give every member of a new cluster the same list; once a
    /// member has started, its data directory holds the membership and the
    /// list is not needed (nor used) again.
    #[arg(long, value_name = "MEMBERS", env = "BATON_PEERS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peers: Option<String>,

    /// Start a member that joins a running cluster: it waits until the
    /// leader adds it (`baton cluster add`). Needs --peer-listen.
    #[arg(long)]
    #[serde(skip)]
    pub(crate) join: bool,

    /// Address to listen on for the other members [default: this member's
    /// peer address in --peers].
    #[arg(long, value_name = "HOST:PORT", env = "BATON_PEER_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peer_listen: Option<String>,

    /// How long a follower waits without hearing from its leader before it
    /// stands for election (the longest wait is twice this), after the
    /// leader's lease of twice this again: a failover takes about four
    /// times this (0.5-0.6 s with the default). A duration; a bare number is
    /// milliseconds. [default: 150ms]
    #[arg(long, value_name = "DURATION", env = "BATON_ELECTION_TIMEOUT", value_parser = crate::duration::millis)]
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt_millis"
    )]
    pub(crate) election_timeout: Option<u64>,

    /// Take a snapshot of the state (and let the replicated log behind it
    /// go) after this many entries. A member far behind catches up from
    /// the snapshot. [default: 10000]
    #[arg(long, value_name = "N", env = "BATON_SNAPSHOT_ENTRIES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) snapshot_entries: Option<u64>,

    /// Whether a follower serves clients itself: it answers reads and keeps
    /// watches from its own state (a linearizable session's reads confirmed
    /// with the leader; a sequential session's answered at once) and
    /// forwards changes to the leader, so that clients spread over every
    /// member. With false, followers send clients to the leader. [default:
    /// true]
    #[arg(long, value_name = "BOOL", env = "BATON_FOLLOWERS_SERVE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) followers_serve: Option<bool>,

    /// Mutual TLS between cluster members: each presents its tls-cert (which
    /// must name the host of its peer address and allow both server and
    /// client authentication) and takes only certificates that chain to the
    /// authority in this PEM file. Needs tls-cert and tls-key.
    #[arg(long, value_name = "FILE", env = "BATON_PEER_TLS_CA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peer_tls_ca: Option<PathBuf>,

    /// Reach member ID at ADDR instead of the peer address it advertises
    /// (through a tunnel or a proxy), as ID=ADDR, separated by commas.
    #[arg(long, value_name = "ROUTES", env = "BATON_ROUTE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) route: Option<String>,

    /// Take the client listener from this inherited file descriptor (a
    /// supervisor that bound it, as `baton cluster local` does).
    #[arg(long, value_name = "FD", hide = true, conflicts_with = "listen")]
    #[serde(skip)]
    pub(crate) listen_fd: Option<i32>,

    /// Take the peer listener from this inherited file descriptor.
    #[arg(long, value_name = "FD", hide = true, conflicts_with = "peer_listen")]
    #[serde(skip)]
    pub(crate) peer_listen_fd: Option<i32>,

    /// For testing only: before each write and sync of its log, read this
    /// file for a disk fault to play ("slow MS" or "full"; see
    /// `baton_server::persist::disk_faults`), as `baton chaos` does.
    #[arg(long, value_name = "FILE", hide = true)]
    #[serde(skip)]
    pub(crate) test_disk_faults: Option<PathBuf>,

    /// Directory that holds the server's durable state (write-ahead log and
    /// snapshots). It is created if missing and locked, so two servers cannot
    /// share it. On start the server recovers what it holds; sessions then
    /// get a full timeout to reconnect. [default: ./baton-data]
    #[arg(long, value_name = "DIR", env = "BATON_DATA_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data_dir: Option<PathBuf>,

    /// When the log is synced to disk: `always` (no reply before its change
    /// is on disk; concurrent changes share one sync) or `never` (a crash of
    /// the server loses nothing, a power loss loses the last moments; a
    /// single server only: cluster members always sync). [default: always]
    #[arg(long, value_name = "POLICY", env = "BATON_FSYNC")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fsync: Option<String>,

    /// Take a snapshot (and drop the log before it) after this many bytes
    /// of log. [default: 67108864]
    #[arg(long, value_name = "BYTES", env = "BATON_SNAPSHOT_EVERY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) snapshot_every: Option<u64>,

    /// Smallest session timeout granted (at least 100ms). A duration; a
    /// bare number is milliseconds. [default: 2s]
    #[arg(long, value_name = "DURATION", env = "BATON_MIN_SESSION_TIMEOUT", value_parser = crate::duration::millis)]
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt_millis"
    )]
    pub(crate) min_session_timeout: Option<u64>,

    /// Largest session timeout granted. A duration; a bare number is
    /// milliseconds. [default: 60s]
    #[arg(long, value_name = "DURATION", env = "BATON_MAX_SESSION_TIMEOUT", value_parser = crate::duration::millis)]
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt_millis"
    )]
    pub(crate) max_session_timeout: Option<u64>,

    /// Largest data one node may hold, in bytes. [default: 1048576]
    #[arg(long, value_name = "BYTES", env = "BATON_MAX_DATA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_data: Option<usize>,

    /// Most client connections served at once; more are refused.
    /// [default: 200000]
    #[arg(long, value_name = "N", env = "BATON_MAX_CONNECTIONS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_connections: Option<usize>,

    /// Bytes the watches of one session may count for: each watched path
    /// counts its length plus 64 bytes. A watch past the limit is refused
    /// with a `too many watches` error. [default: 8388608]
    #[arg(long, value_name = "BYTES", env = "BATON_MAX_WATCH_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_watch_bytes: Option<usize>,

    /// Events of the latest changes kept in memory so that a client whose
    /// connection broke gets the changes its persistent watches missed
    /// (about 100 bytes each); a client away for more changes is told to
    /// read afresh. [default: 10000]
    #[arg(long, value_name = "EVENTS", env = "BATON_WATCH_HISTORY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) watch_history: Option<usize>,

    /// How long a container node (ZooKeeper's createContainer) stands with
    /// no children, having had some, before the server deletes it. A
    /// duration; a bare number is milliseconds. [default: 60s]
    #[arg(long, value_name = "DURATION", env = "BATON_CONTAINER_GRACE", value_parser = crate::duration::millis)]
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt_millis"
    )]
    pub(crate) container_grace: Option<u64>,

    /// TLS: the server's certificate chain (PEM). Given, clients must
    /// connect with TLS. Set with the global --tls-cert, or
    /// BATON_SERVE_TLS_CERT.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_cert: Option<PathBuf>,

    /// TLS: the private key of tls-cert (PEM); --tls-key,
    /// BATON_SERVE_TLS_KEY.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_key: Option<PathBuf>,

    /// TLS: require client certificates that chain to the certificate
    /// authorities in this PEM file; --tls-ca, BATON_SERVE_TLS_CA.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_ca: Option<PathBuf>,

    /// Identities, from the config file only (`[[identity]]` tables): with
    /// any, a client must name one with its token, and each request needs
    /// that identity's rights on its path (docs/operations.md).
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) identity: Option<Vec<IdentityConfig>>,

    /// Threads that serve clients (and, in a cluster, the other members).
    /// By default a single server uses one per core and a cluster member
    /// one in all: a member's every change passes between several tasks
    /// (proposal, replication, the followers' answers, applying it), and on
    /// a few cores handing them between threads costs more than it gains
    /// (see docs/benchmarks.md).
    #[arg(long, value_name = "N", env = "BATON_THREADS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) threads: Option<u16>,
}

/// One `[[identity]]` table of the config file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct IdentityConfig {
    name: String,
    /// The token itself (prefer token-file: this file then holds a secret).
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    /// A file holding the token (surrounding white space ignored).
    #[serde(skip_serializing_if = "Option::is_none")]
    token_file: Option<PathBuf>,
    /// Rights by path prefix: `"/locks/payments" = ["read", "lock", "fence"]`.
    rights: std::collections::BTreeMap<String, Vec<String>>,
    /// A DNS name (or address) of the client certificates that prove this
    /// identity without a token: one signed by tls-ca and valid for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_client: Option<String>,
}

impl IdentityConfig {
    fn build(&self) -> Result<Identity, String> {
        let name = &self.name;
        let token = match (&self.token, &self.token_file) {
            (Some(t), None) => t.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| {
                    format!(
                        "identity {name}: cannot read its token-file {}: {e}",
                        path.display()
                    )
                })?
                .trim()
                .to_owned(),
            _ => {
                return Err(format!(
                    "identity {name}: give token-file (or token), one of them"
                ))
            }
        };
        if token.len() > baton_proto::handshake::MAX_TOKEN {
            return Err(format!(
                "identity {name}: its token has {} bytes; at most {} are sent",
                token.len(),
                baton_proto::handshake::MAX_TOKEN
            ));
        }
        if token.len() < 16 {
            return Err(format!(
                "identity {name}: its token has {} bytes; use at least 16 (e.g. `openssl rand -hex 32`)",
                token.len()
            ));
        }
        let mut rules = Vec::new();
        for (prefix, names) in &self.rights {
            let mut rights = Rights::default();
            for right in names {
                let r = Rights::parse(right).ok_or_else(|| {
                    format!(
                        "identity {name}: rights for {prefix}: unknown right {right:?} (read, write, lock, fence or admin)"
                    )
                })?;
                rights = Rights::union_of(rights, r);
            }
            rules.push((prefix.clone(), rights));
        }
        let identity = Identity::new(
            name.clone(),
            baton_proto::Token(token.into_bytes().into()),
            rules,
        );
        match &self.tls_client {
            None => Ok(identity),
            Some(tls_name) => identity.with_tls_name(tls_name).map_err(|e| e.to_string()),
        }
    }
}

/// A cluster member's default election timeout, in milliseconds.
const DEFAULT_ELECTION_TIMEOUT_MS: u64 = 150;
/// A cluster member's default snapshot interval, in log entries.
const DEFAULT_SNAPSHOT_ENTRIES: u64 = 10_000;

/// `baton serve`'s settings once the file, the environment and the flags
/// are merged, the defaults filled in and every value checked.
#[derive(Clone, Debug)]
pub struct Settings {
    pub(crate) listen: Option<String>,
    pub(crate) metrics_listen: Option<String>,
    /// The ZooKeeper listener's address, resolved.
    pub(crate) zk_listen: Option<std::net::SocketAddr>,
    pub(crate) zk_words: Vec<String>,
    pub(crate) zk_read_mode: baton_client::ReadMode,
    pub(crate) node_id: Option<u64>,
    pub(crate) peers: Option<String>,
    pub(crate) join: bool,
    pub(crate) peer_listen: Option<String>,
    pub(crate) election_timeout: u64,
    pub(crate) snapshot_entries: u64,
    pub(crate) followers_serve: bool,
    pub(crate) route: Option<String>,
    pub(crate) listen_fd: Option<i32>,
    pub(crate) peer_listen_fd: Option<i32>,
    pub(crate) test_disk_faults: Option<PathBuf>,
    pub(crate) data_dir: PathBuf,
    pub(crate) fsync: FsyncPolicy,
    pub(crate) snapshot_every: u64,
    pub(crate) min_session_timeout: u64,
    pub(crate) max_session_timeout: u64,
    pub(crate) max_data: usize,
    pub(crate) max_connections: usize,
    pub(crate) max_watch_bytes: usize,
    pub(crate) watch_history: usize,
    pub(crate) container_grace: u64,
    pub(crate) threads: Option<u16>,
    /// Where the TLS material is, if clients must use TLS.
    pub(crate) tls_files: Option<TlsFiles>,
    /// The TLS settings read from them at start.
    pub(crate) tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// The identities clients must name, if any.
    pub(crate) identities: Option<std::sync::Arc<Identities>>,
    /// Mutual TLS with the other members of a cluster, if set.
    pub(crate) peer_tls: Option<baton_cluster::network::PeerTls>,
    /// The merged settings as a config file would give them.
    pub(crate) effective: ServeArgs,
}

impl ServeArgs {
    /// The defaults, as a config file would give them.
    fn defaults() -> ServeArgs {
        ServeArgs {
            election_timeout: Some(DEFAULT_ELECTION_TIMEOUT_MS),
            snapshot_entries: Some(DEFAULT_SNAPSHOT_ENTRIES),
            data_dir: Some(PathBuf::from("./baton-data")),
            fsync: Some(FsyncPolicy::Always.to_string()),
            snapshot_every: Some(64 << 20),
            min_session_timeout: Some(2_000),
            max_session_timeout: Some(60_000),
            max_data: Some(baton_proto::DEFAULT_MAX_DATA),
            max_connections: Some(200_000),
            max_watch_bytes: Some(8 << 20),
            watch_history: Some(baton_server::config::DEFAULT_WATCH_HISTORY),
            container_grace: Some(60_000),
            ..ServeArgs::default()
        }
    }

    /// Merges the config file (if any), the environment and the flags over
    /// the defaults, and checks the result.
    ///
    /// # Errors
    /// A message naming the file, the key and what is wrong with it.
    pub fn resolve(self) -> Result<Settings, CliError> {
        let file = match &self.config {
            Some(path) => read_config(path)?,
            None => ServeArgs::default(),
        };
        let asked = overlay(file, self)?;
        let layered = overlay(ServeArgs::defaults(), asked.clone())?;
        Settings::check(layered, &asked)
    }
}

/// Reads a config file: unknown keys and values of the wrong type are
/// refused with the key and the line named.
fn read_config(path: &Path) -> Result<ServeArgs, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::msg(format!(
            "cannot read the config file {}: {e}",
            path.display()
        ))
    })?;
    toml::from_str(&text).map_err(|e| {
        CliError::msg(format!(
            "config file {}: {}",
            path.display(),
            e.to_string().trim_end()
        ))
    })
}

/// `top`'s settings over `base`'s: a setting `top` leaves out keeps
/// `base`'s value.
fn overlay(base: ServeArgs, top: ServeArgs) -> Result<ServeArgs, CliError> {
    let table = |s: &ServeArgs| {
        toml::Table::try_from(s).map_err(|e| CliError::msg(format!("settings: {e}")))
    };
    let mut merged = table(&base)?;
    merged.extend(table(&top)?);
    let mut out: ServeArgs = merged
        .try_into()
        .map_err(|e: toml::de::Error| CliError::msg(format!("settings: {e}")))?;
    // What a file cannot say comes from the command line.
    out.config = top.config.or(base.config);
    out.print_config = top.print_config || base.print_config;
    out.join = top.join || base.join;
    out.listen_fd = top.listen_fd.or(base.listen_fd);
    out.peer_listen_fd = top.peer_listen_fd.or(base.peer_listen_fd);
    out.test_disk_faults = top.test_disk_faults.or(base.test_disk_faults);
    Ok(out)
}

impl Settings {
    /// Checks the merged settings `s`; `asked` are those the file, the
    /// environment and the flags gave, before the defaults.
    fn check(mut s: ServeArgs, asked: &ServeArgs) -> Result<Settings, CliError> {
        // Filled in by the defaults.
        let set = |what: Option<u64>| what.unwrap_or_default();
        let bad = |key: &str, why: String| CliError::msg(format!("setting {key}: {why}"));
        let bad_because = |key: &str, why: &dyn std::fmt::Display| bad(key, why.to_string());
        let fsync_text = s.fsync.clone().unwrap_or_default();
        let fsync: FsyncPolicy = fsync_text.parse().map_err(|e: String| bad("fsync", e))?;
        if s.node_id == Some(0) {
            return Err(bad("node-id", "must be a positive number".into()));
        }
        if s.threads == Some(0) {
            return Err(bad("threads", "must be at least 1".into()));
        }
        if s.node_id.is_some() && fsync != FsyncPolicy::Always {
            return Err(bad(
                "fsync",
                format!(
                    "`never` is refused for a cluster member: {}",
                    baton_cluster::member::NO_UNSYNCED_MEMBERS
                ),
            ));
        }
        if s.node_id.is_none() {
            let cluster_only = [
                ("peers", s.peers.is_some()),
                ("join", s.join),
                ("peer-listen", s.peer_listen.is_some()),
                ("election-timeout", asked.election_timeout.is_some()),
                ("snapshot-entries", asked.snapshot_entries.is_some()),
                ("followers-serve", asked.followers_serve.is_some()),
                ("route", s.route.is_some()),
                ("peer-tls-ca", s.peer_tls_ca.is_some()),
            ];
            if let Some((key, _)) = cluster_only.iter().find(|(_, set)| *set) {
                return Err(bad(
                    key,
                    "is for a cluster member: give node-id (--node-id) too".into(),
                ));
            }
        }
        if s.peers.is_some() && s.join {
            return Err(bad(
                "join",
                "a member either starts a new cluster (peers) or joins a running one (join), not both".into(),
            ));
        }
        if s.join && s.peer_listen.is_none() && s.peer_listen_fd.is_none() {
            return Err(bad(
                "join",
                "a joining member needs peer-listen (--peer-listen), the address the others reach it at".into(),
            ));
        }
        // Addresses are checked here, so that --print-config refuses what
        // serve would, and before anything touches the data directory.
        for (key, addr) in [
            ("listen", &s.listen),
            ("metrics-listen", &s.metrics_listen),
            ("peer-listen", &s.peer_listen),
            ("zk-listen", &s.zk_listen),
        ] {
            if let Some(addr) = addr {
                check_addr(addr).map_err(|why| bad(key, why))?;
            }
        }
        if let Some(peers) = &s.peers {
            let members = parse_members(peers).map_err(|e| bad("peers", e.to_string()))?;
            for (id, m) in members {
                for addr in [&m.peer, &m.client] {
                    check_addr(addr).map_err(|why| bad("peers", format!("member {id}: {why}")))?;
                }
            }
        }
        if let Some(routes) = &s.route {
            for (id, addr) in parse_routes(routes).map_err(|e| bad("route", e.to_string()))? {
                check_addr(&addr).map_err(|why| bad("route", format!("member {id}: {why}")))?;
            }
        }
        let tls_files = match (&s.tls_cert, &s.tls_key, &s.tls_ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), ca) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: ca.clone(),
            }),
            (None, _, Some(_)) => {
                return Err(bad(
                    "tls-ca",
                    "client certificates are checked on TLS connections: give tls-cert and tls-key (--tls-cert, --tls-key) too".into(),
                ))
            }
            (Some(_), None, _) => return Err(bad("tls-cert", "needs tls-key (--tls-key), its private key".into())),
            (None, Some(_), _) => return Err(bad("tls-key", "needs tls-cert (--tls-cert), the certificate it goes with".into())),
        };
        let identities = match &s.identity {
            None => None,
            Some(list) if list.is_empty() => None,
            Some(list) => {
                let built = list
                    .iter()
                    .map(IdentityConfig::build)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad("identity", e))?;
                let identities = Identities::new(built).map_err(|e| bad_because("identity", &e))?;
                let by_certificate = list.iter().find(|i| i.tls_client.is_some());
                if let (Some(i), None) = (by_certificate, &s.tls_ca) {
                    return Err(bad(
                        "identity",
                        format!("identity {}: tls-client names client certificates, which only a server with tls-ca (--tls-ca: the authority that signs them) checks", i.name),
                    ));
                }
                Some(std::sync::Arc::new(identities))
            }
        };
        // Shown without the tokens themselves.
        if let Some(list) = &mut s.identity {
            for identity in list {
                if identity.token.is_some() {
                    identity.token = Some("(hidden)".into());
                }
            }
        }
        let peer_tls =
            match (&s.peer_tls_ca, &tls_files) {
                (None, _) => None,
                (Some(ca), Some(files)) => Some(
                    baton_cluster::network::PeerTls::from_files(&files.cert, &files.key, ca)
                        .map_err(|e| bad_because("peer-tls-ca", &e))?,
                ),
                (Some(_), None) => return Err(bad(
                    "peer-tls-ca",
                    "members present their tls-cert to each other: give tls-cert and tls-key too"
                        .into(),
                )),
            };
        let tls = match &tls_files {
            Some(files) => Some(
                baton_server::tls::server_config(files).map_err(|e| bad_because("tls-cert", &e))?,
            ),
            None => None,
        };
        if s.node_id.is_none() {
            // Shown as a single server uses them.
            s.election_timeout = None;
            s.snapshot_entries = None;
            if s.listen_fd.is_none() {
                s.listen
                    .get_or_insert_with(|| crate::DEFAULT_SERVER.to_owned());
            }
        }
        let zk_listen = match &s.zk_listen {
            Some(addr) => Some(resolve_addr(addr).map_err(|why| bad("zk-listen", why))?),
            None => None,
        };
        let zk_words = match &s.zk_4lw {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect(),
            None => Config::default().zk_words,
        };
        let zk_read_mode = match &s.zk_read_mode {
            Some(mode) => mode.parse().map_err(|why| bad("zk-read-mode", why))?,
            None => Config::default().zk_read_mode,
        };
        let settings = Settings {
            listen: s.listen.clone(),
            metrics_listen: s.metrics_listen.clone(),
            zk_listen,
            zk_words,
            zk_read_mode,
            node_id: s.node_id,
            peers: s.peers.clone(),
            join: s.join,
            peer_listen: s.peer_listen.clone(),
            election_timeout: s.election_timeout.unwrap_or(DEFAULT_ELECTION_TIMEOUT_MS),
            snapshot_entries: s.snapshot_entries.unwrap_or(DEFAULT_SNAPSHOT_ENTRIES),
            followers_serve: s.followers_serve.unwrap_or(true),
            route: s.route.clone(),
            listen_fd: s.listen_fd,
            peer_listen_fd: s.peer_listen_fd,
            test_disk_faults: s.test_disk_faults.clone(),
            data_dir: s.data_dir.clone().unwrap_or_default(),
            fsync,
            snapshot_every: set(s.snapshot_every),
            min_session_timeout: set(s.min_session_timeout),
            max_session_timeout: set(s.max_session_timeout),
            max_data: s.max_data.unwrap_or_default(),
            max_connections: s.max_connections.unwrap_or_default(),
            max_watch_bytes: s.max_watch_bytes.unwrap_or_default(),
            watch_history: s.watch_history.unwrap_or_default(),
            container_grace: set(s.container_grace),
            threads: s.threads,
            tls_files,
            tls,
            identities,
            peer_tls,
            effective: s,
        };
        settings
            .server_config()
            .validate()
            .map_err(|e| CliError::msg(format!("setting {}", e.0)))?;
        Ok(settings)
    }

    /// Whether `--print-config` asked only for the settings.
    pub(crate) fn effective_print_config(&self) -> bool {
        self.effective.print_config
    }

    /// How many threads the runtime gets: `None` for one per core.
    pub(crate) fn runtime_threads(&self) -> Option<usize> {
        match (self.threads, self.node_id) {
            (Some(n), _) => Some(n as usize),
            (None, Some(_)) => Some(1),
            (None, None) => None,
        }
    }

    /// The settings in effect, as a config file.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(&self.effective).unwrap_or_default();
        format!(
            "# `baton serve` settings in effect: defaults, then the config file, the\n\
             # BATON_* environment and the flags. Times are in milliseconds, sizes in bytes.\n{body}"
        )
    }

    /// The server's settings.
    pub(crate) fn server_config(&self) -> Config {
        let mut config = Config {
            min_session_timeout: Duration::from_millis(self.min_session_timeout),
            max_session_timeout: Duration::from_millis(self.max_session_timeout),
            max_data: self.max_data,
            max_connections: self.max_connections,
            max_watch_bytes: self.max_watch_bytes,
            watch_history: self.watch_history,
            data_dir: Some(self.data_dir.clone()),
            fsync: self.fsync,
            snapshot_every_bytes: self.snapshot_every,
            tls: self.tls.clone(),
            identities: self.identities.clone(),
            zk_listen: self.zk_listen,
            zk_words: self.zk_words.clone(),
            zk_read_mode: self.zk_read_mode,
            container_grace: Duration::from_millis(self.container_grace),
            ..Config::default()
        };
        // Room for the largest reply twice over, whatever the data limit.
        config.max_outbound_bytes = config
            .max_outbound_bytes
            .max(4 * (config.max_data + baton_proto::REQUEST_OVERHEAD));
        config
    }
}

/// The socket address `addr` (HOST:PORT) names: the first its host
/// resolves to.
fn resolve_addr(addr: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr:?} resolves to no address"))
}

/// Whether `addr` reads as HOST:PORT: a host (a name, an IPv4 address or
/// a bracketed IPv6 one) and a port number.
pub(crate) fn check_addr(addr: &str) -> Result<(), String> {
    let bad = |why: &str| {
        format!("{addr:?} is not an address to listen on or reach: {why}; give HOST:PORT, such as 127.0.0.1:4181")
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("it has no port"))?;
    if host.is_empty() {
        return Err(bad("it has no host"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(bad("an IPv6 address goes in brackets"));
    }
    port.parse::<u16>()
        .map(|_| ())
        .map_err(|_| bad(&format!("{port:?} is not a port number")))
}

/// Parses `ID=PEER/CLIENT,...`.
pub fn parse_members(spec: &str) -> Result<BTreeMap<u64, Member>, CliError> {
    let mut members = BTreeMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |why: &str| {
            CliError::msg(format!(
                "--peers: {item:?} {why}; write each member as ID=PEER_HOST:PEER_PORT/CLIENT_HOST:CLIENT_PORT, for example 1=10.0.0.1:4190/10.0.0.1:4181"
            ))
        };
        let (id, addrs) = item.split_once('=').ok_or_else(|| bad("has no '='"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| bad("does not start with a positive member id"))?;
        let (peer, client) = addrs
            .split_once('/')
            .ok_or_else(|| bad("has no '/' between the peer and the client address"))?;
        if peer.is_empty() || client.is_empty() {
            return Err(bad("has an empty address"));
        }
        let member = Member {
            peer: peer.trim().to_owned(),
            client: client.trim().to_owned(),
        };
        if members.insert(id, member).is_some() {
            return Err(bad("repeats a member id"));
        }
    }
    if members.is_empty() {
        return Err(CliError::msg("--peers names no member"));
    }
    Ok(members)
}

pub(crate) fn parse_routes(spec: &str) -> Result<BTreeMap<u64, String>, CliError> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (id, addr) = item
                .split_once('=')
                .ok_or_else(|| CliError::msg(format!("--route: {item:?} is not ID=HOST:PORT")))?;
            let id = id.trim().parse().map_err(|_| {
                CliError::msg(format!("--route: {item:?} does not start with a member id"))
            })?;
            Ok((id, addr.trim().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_bad_ones_say_how_to_write_them() {
        let m = parse_members("1=127.0.0.1:4190/127.0.0.1:4181, 2=h:2/h:3").unwrap();
        assert_eq!(m[&1].peer, "127.0.0.1:4190");
        assert_eq!(m[&2].client, "h:3");
        for bad in ["1=a", "x=a/b", "0=a/b", "1=a/b,1=c/d", "1=/b", ""] {
            let e = parse_members(bad).unwrap_err().to_string();
            assert!(e.contains("--peers"), "{bad}: {e}");
        }
    }
}
