//! Server settings.

use std::path::PathBuf;
use std::time::Duration;

use baton_proto::DEFAULT_MAX_DATA;

use crate::persist::FsyncPolicy;

/// Lowest session timeout a server may be configured to grant.
pub const MIN_SESSION_TIMEOUT_FLOOR: Duration = Duration::from_millis(100);

/// Settings of one server. [`Config::default`] gives the documented defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Requested session timeouts are raised to at least this (default 2 s).
    pub min_session_timeout: Duration,
    /// Requested session timeouts are lowered to at most this (default 60 s).
    pub max_session_timeout: Duration,
    /// Largest data one node may hold (default 1 MiB).
    pub max_data: usize,
    /// Most connections served at once; more are refused (default 200,000).
    pub max_connections: usize,
    /// Bytes that may wait to be sent to one connection. Past half of it the
    /// server stops reading that connection's requests; past all of it (watch
    /// events keep coming to a client that does not read) the connection is
    /// closed. Default 16 MiB.
    pub max_outbound_bytes: usize,
    /// Bytes the watches of one session may count for (default 8 MiB): each
    /// watched path counts its length plus 64 bytes. A watch past it is
    /// refused with `too-many-watches`.
    pub max_watch_bytes: usize,
    /// Events of the latest changes kept so that a client resuming its
    /// persistent watches gets the ones it missed (default 10,000); one
    /// that missed more is told to read afresh (a `compacted` event).
    pub watch_history: usize,
    /// How long a new connection may take to send its handshake (default 10 s).
    pub handshake_timeout: Duration,
    /// How long output may wait on a client that takes no bytes at all before
    /// the connection is closed (default 15 s). Meanwhile the server reads no
    /// more of that client's requests.
    pub write_stall_timeout: Duration,
    /// Where durable state lives; `None` keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    /// When the log is synced to disk (default: before every reply that
    /// depends on it).
    pub fsync: FsyncPolicy,
    /// A snapshot is taken in the background after this many bytes of log
    /// (default 64 MiB); the log before it is then removed.
    pub snapshot_every_bytes: u64,
    /// If set, clients must connect with TLS, with these settings (see
    /// [`crate::tls::server_config`]); plaintext clients are refused with
    /// `tls-required`. Default: plaintext.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// If set, a client must name one of these identities with its token,
    /// and each request needs its identity's rights on its path (see
    /// [`crate::auth`]). Default: open to every client.
    pub identities: Option<std::sync::Arc<crate::auth::Identities>>,
    /// If set, the server also speaks ZooKeeper's client protocol on this
    /// address (with TLS only, if [`tls`](Self::tls) is set). Default: off.
    pub zk_listen: Option<std::net::SocketAddr>,
    /// The four-letter words the ZooKeeper listener answers (ZooKeeper's
    /// `4lw.commands.whitelist`; `*` for all). Default: `ruok`, `srvr`,
    /// `mntr`, `isro`.
    pub zk_words: Vec<String>,
    /// What the reads of ZooKeeper clients promise on a cluster member:
    /// linearizable (the default: every read confirmed with the leader
    /// first, stronger than ZooKeeper itself) or sequential (answered from
    /// the member's own state at once, as ZooKeeper's followers answer
    /// them: never going back, after the session's own changes, and up to
    /// date after a `sync`). A single server answers both the same way.
    pub zk_read_mode: baton_proto::ReadMode,
    /// How long a container stands with no children (having had some)
    /// before the leader deletes it (default 60 s, ZooKeeper's
    /// `znode.container.checkIntervalMs`).
    pub container_grace: Duration,
}

/// The four-letter words answered by default: status a health check or a
/// monitor reads, nothing about clients or the host.
pub const DEFAULT_ZK_WORDS: [&str; 4] = ["ruok", "srvr", "mntr", "isro"];

/// Events of the latest changes a server keeps by default, for clients
/// resuming their persistent watches.
pub const DEFAULT_WATCH_HISTORY: usize = 10_000;

impl Default for Config {
    fn default() -> Self {
        Config {
            min_session_timeout: Duration::from_millis(2_000),
            max_session_timeout: Duration::from_millis(60_000),
            max_data: DEFAULT_MAX_DATA,
            max_connections: 200_000,
            max_outbound_bytes: 16 << 20,
            max_watch_bytes: 8 << 20,
            watch_history: DEFAULT_WATCH_HISTORY,
            handshake_timeout: Duration::from_secs(10),
            write_stall_timeout: Duration::from_secs(15),
            data_dir: None,
            fsync: FsyncPolicy::Always,
            snapshot_every_bytes: 64 << 20,
            tls: None,
            identities: None,
            zk_listen: None,
            zk_words: DEFAULT_ZK_WORDS.iter().map(|w| w.to_string()).collect(),
            zk_read_mode: baton_proto::ReadMode::Linearizable,
            container_grace: Duration::from_secs(60),
        }
    }
}

/// A setting that cannot work, with the reason. The message starts with
/// the setting's name as `baton serve` spells it (flag and config key).
#[derive(Debug, thiserror::Error)]
#[error("invalid server configuration: {0}")]
pub struct ConfigError(pub String);

impl Config {
    /// Checks that the settings make sense together.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the setting and what it must be.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_session_timeout < MIN_SESSION_TIMEOUT_FLOOR {
            return Err(ConfigError(format!(
                "min-session-timeout: {} ms is below the floor of {} ms",
                self.min_session_timeout.as_millis(),
                MIN_SESSION_TIMEOUT_FLOOR.as_millis()
            )));
        }
        if self.max_session_timeout < self.min_session_timeout {
            return Err(ConfigError(format!(
                "max-session-timeout: {} ms is below min-session-timeout ({} ms)",
                self.max_session_timeout.as_millis(),
                self.min_session_timeout.as_millis()
            )));
        }
        if self.max_session_timeout > Duration::from_millis(u32::MAX as u64) {
            return Err(ConfigError(
                "max-session-timeout: more than 4294967295 ms".into(),
            ));
        }
        if self.max_data > u32::MAX as usize - baton_proto::REQUEST_OVERHEAD {
            return Err(ConfigError(format!(
                "max-data: {} bytes is too large",
                self.max_data
            )));
        }
        if self.max_connections == 0 {
            return Err(ConfigError("max-connections: must be at least 1".into()));
        }
        if self.max_outbound_bytes < 2 * (self.max_data + baton_proto::REQUEST_OVERHEAD) {
            return Err(ConfigError(format!(
                "max-outbound-bytes: {} must hold at least two of the largest replies ({} bytes each)",
                self.max_outbound_bytes,
                self.max_data + baton_proto::REQUEST_OVERHEAD
            )));
        }
        let one_watch = baton_proto::MAX_PATH_LEN + crate::watches::WATCH_OVERHEAD;
        if self.max_watch_bytes < one_watch {
            return Err(ConfigError(format!(
                "max-watch-bytes: {} must allow at least one watch on the longest path ({one_watch} bytes)",
                self.max_watch_bytes
            )));
        }
        for word in &self.zk_words {
            if word != "*" && !baton_zk::words::WORDS.contains(&word.as_str()) {
                return Err(ConfigError(format!(
                    "zk-4lw: {word:?} is not a four-letter word Baton answers (it answers {}, or * for all)",
                    baton_zk::words::WORDS.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The timeout granted for a requested one: clamped to the bounds.
    pub fn negotiate_timeout(&self, requested_ms: u32) -> u32 {
        let lo = self.min_session_timeout.as_millis() as u32;
        let hi = self.max_session_timeout.as_millis() as u32;
        requested_ms.clamp(lo, hi)
    }

    /// Largest request frame accepted: the data limit plus headers.
    pub fn max_request_frame(&self) -> usize {
        self.max_data + baton_proto::REQUEST_OVERHEAD
    }
}
