//! The listener: accepts connections, runs the session expiry timer, and
//! stops everything on shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::{ConnectResponse, ErrorCode, PROTOCOL_VERSION};
use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Instant};
use tracing::{debug, error, info, warn};

use crate::clock::Now;
use crate::config::{Config, ConfigError};
use crate::datadir::{DataDir, DataDirError};
use crate::persist::{self, DurableMark, PersistError, Wal};
use crate::replicate::{InMemory, Local, NoLogYet, Replicator, Role};
use crate::shared::{Applier, ServerHandle, Shared};
use crate::state::StateMachine;
use crate::stats::Stats;

/// Why a server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: io::Error },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Persist(#[from] PersistError),
    #[error("the log can no longer be written ({0}); the server stopped without acknowledging anything it could not make durable")]
    LogFailed(String),
    #[error("listener failed: {0}")]
    Io(#[from] io::Error),
    #[error("the replicated log stopped ({0}); this member stopped serving: restart it, and it catches up from the others")]
    ReplicationStopped(String),
    /// The member must not take part as it is (the text says why and what
    /// to do); starting it again the same way would not help.
    #[error("{0}")]
    Unfit(String),
}

/// A Baton server bound to a listener, ready to [`run`](Server::run).
pub struct Server {
    listener: TcpListener,
    /// The ZooKeeper listener, if the configuration asks for one (bound
    /// with the server, served once it runs).
    zk_listener: Option<std::net::TcpListener>,
    shared: Arc<Shared>,
    data_dir: Option<DataDir>,
    log_failed: watch::Receiver<Option<String>>,
    /// Kept by an in-memory server, whose log never fails, so that
    /// `log_failed` never reports a closed channel.
    _no_log: Option<watch::Sender<Option<String>>>,
}

impl Server {
    /// Binds `addr` and prepares a server with `config`.
    ///
    /// # Errors
    /// An invalid configuration, or an address that cannot be bound.
    pub async fn bind(
        addr: impl ToSocketAddrs + std::fmt::Display,
        config: Config,
    ) -> Result<Self, ServerError> {
        // Recover first, listen after: a client that connects while a long
        // log is replayed is refused at once rather than left waiting.
        let parts = Parts::prepare(config)?;
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| ServerError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        Ok(parts.assemble(listener))
    }

    /// Prepares a server on an already bound listener.
    ///
    /// # Errors
    /// An invalid configuration, or a data directory that cannot be used.
    pub fn new(listener: TcpListener, config: Config) -> Result<Self, ServerError> {
        Ok(Parts::prepare(config)?.assemble(listener))
    }

    /// A cluster member on an already bound listener: it starts with an
    /// empty state and serves no client. The replicated log that feeds it
    /// goes through the returned [`Applier`], which also tells it when it
    /// leads; until then every handshake is sent on to the leader.
    ///
    /// # Errors
    /// An invalid configuration.
    pub fn member(listener: TcpListener, config: Config) -> Result<(Self, Applier), ServerError> {
        let server = Parts::member(config)?.assemble(listener);
        let applier = Applier::new(server.shared.clone());
        Ok((server, applier))
    }

    #[cfg(test)]
    pub(crate) fn shared_for_test(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The address the ZooKeeper listener is bound to, if there is one.
    pub fn zk_addr(&self) -> Option<SocketAddr> {
        self.zk_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn handle(&self) -> ServerHandle {
        ServerHandle::new(self.shared.clone())
    }

    /// Serves until `shutdown` completes, then tells every client, waits (up
    /// to a few seconds) for their connections to close, and returns.
    ///
    /// # Errors
    /// Only if the listener itself fails for good.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
        let Server {
            listener,
            zk_listener,
            shared,
            data_dir,
            mut log_failed,
            _no_log,
        } = self;
        if let Some(dir) = &data_dir {
            info!(data_dir = %dir.path().display(), "data directory locked");
        }
        let limit = shared.config.max_connections;
        let timer = tokio::spawn(expiry_timer(shared.clone(), shared.stopping.subscribe()));
        info!(addr = %listener.local_addr()?, "serving");
        let zk = match zk_listener {
            Some(std_listener) => {
                let zk = TcpListener::from_std(std_listener)?;
                info!(addr = %zk.local_addr()?, "serving ZooKeeper clients");
                Some(tokio::spawn(accept_zk(zk, shared.clone())))
            }
            None => None,
        };

        tokio::pin!(shutdown);
        let mut accept_errors = 0u64;
        let mut last_accept_log: Option<Instant> = None;
        let mut failure = None;
        loop {
            let accepted = tokio::select! {
                _ = &mut shutdown => break,
                _ = log_failed.changed() => {
                    failure = log_failed.borrow().clone();
                    break;
                }
                r = listener.accept() => r,
            };
            let (stream, peer) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors or similar: wait instead of
                    // spinning, and say so once every few seconds.
                    accept_errors += 1;
                    if last_accept_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                        error!(
                            failures = accept_errors,
                            "accept failed: {e}; retrying every 100 ms"
                        );
                        last_accept_log = Some(Instant::now());
                        accept_errors = 0;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = shared.connection_slots.try_acquire() else {
                Stats::add(&shared.stats.connections_refused, 1);
                warn!(%peer, limit, "refusing connection: at the connection limit");
                tokio::spawn(refuse(stream, limit));
                continue;
            };
            slot.forget(); // given back when the connection's state drops
            Stats::add(&shared.stats.connections_accepted, 1);
            let conn = crate::front::native::Conn::new(shared.clone(), stream);
            tokio::spawn(crate::front::native::serve(conn));
        }

        info!("shutting down");
        drop(listener);
        if let Some(zk) = zk {
            zk.abort();
            let _ = zk.await;
        }
        // Attached sessions hear it through their outboxes; connections still
        // in their handshake through the watch channel.
        shared.core().shutdown_connections();
        shared.stopping.send_replace(true);
        let _ = timer.await;
        // Every open connection holds a slot until it ends.
        let all = shared.connection_slots.acquire_many(limit as u32);
        match timeout(Duration::from_secs(10), all).await {
            Ok(_) => info!("all connections closed"),
            Err(_) => warn!("stopped with connections still closing"),
        }
        let log = shared.core().log();
        log.stop();
        drop(data_dir);
        match failure {
            Some(reason) => Err(ServerError::LogFailed(reason)),
            None => Ok(()),
        }
    }
}

/// A server's state, recovered and ready, before it has a listener.
struct Parts {
    shared: Arc<Shared>,
    zk_listener: Option<std::net::TcpListener>,
    data_dir: Option<DataDir>,
    log_failed: watch::Receiver<Option<String>>,
    _no_log: Option<watch::Sender<Option<String>>>,
}

impl Parts {
    /// Checks the configuration, takes the data directory and recovers it.
    fn prepare(config: Config) -> Result<Parts, ServerError> {
        config.validate()?;

        let data_dir = config.data_dir.as_deref().map(DataDir::open).transpose()?;
        let stats = Arc::new(Stats::default());
        let (failed_tx, log_failed) = watch::channel(None);
        let mut failed_tx = Some(failed_tx);
        let (sm, log, mark): (_, Arc<dyn Replicator>, _) = match &data_dir {
            Some(dir) => {
                let started = std::time::Instant::now();
                let (sm, recovery) = persist::recover(dir.path())?;
                info!(
                    revision = recovery.revision,
                    snapshot = recovery.snapshot_revision,
                    records = recovery.records_replayed,
                    torn_bytes = recovery.torn_bytes_dropped,
                    sessions = sm.session_count(),
                    nodes = sm.node_count(),
                    ms = started.elapsed().as_millis() as u64,
                    "recovered"
                );
                let mark = Arc::new(DurableMark::new(sm.revision()));
                let failed = failed_tx.take().expect("taken once");
                let wal = Wal::start(
                    dir.path(),
                    sm.revision(),
                    config.fsync,
                    mark.clone(),
                    failed,
                    stats.clone(),
                )?;
                let log = Local::new(wal, config.snapshot_every_bytes, stats.clone());
                (sm, Arc::new(log), mark)
            }
            None => (
                StateMachine::new(),
                Arc::new(InMemory),
                Arc::new(DurableMark::new(u64::MAX)),
            ),
        };
        Parts::assemble_core(
            sm,
            config,
            stats,
            log,
            mark,
            Role::Leader,
            data_dir,
            log_failed,
            failed_tx,
        )
        .bind_zk()
    }

    /// The parts of a cluster member: its state comes from the replicated
    /// log (which the caller starts, feeding it through [`Applier`]), and it
    /// serves no client until it leads.
    fn member(config: Config) -> Result<Parts, ServerError> {
        config.validate()?;
        let (failed_tx, log_failed) = watch::channel(None);
        Parts::assemble_core(
            StateMachine::new(),
            config,
            Arc::new(Stats::default()),
            Arc::new(NoLogYet),
            Arc::new(DurableMark::new(u64::MAX)),
            Role::Follower {
                leader: None,
                serving: false,
            },
            None,
            log_failed,
            Some(failed_tx),
        )
        .bind_zk()
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble_core(
        sm: StateMachine,
        config: Config,
        stats: Arc<Stats>,
        log: Arc<dyn Replicator>,
        mark: Arc<DurableMark>,
        role: Role,
        data_dir: Option<DataDir>,
        log_failed: watch::Receiver<Option<String>>,
        no_log: Option<watch::Sender<Option<String>>>,
    ) -> Parts {
        Parts {
            zk_listener: None,
            shared: Arc::new(Shared::new(sm, log, role, Arc::new(config), stats, mark)),
            data_dir,
            log_failed,
            _no_log: no_log,
        }
    }

    /// Binds the ZooKeeper listener the configuration asks for, if any.
    fn bind_zk(mut self) -> Result<Parts, ServerError> {
        if let Some(addr) = self.shared.config.zk_listen {
            let bind = |addr| {
                let listener = std::net::TcpListener::bind(addr)?;
                listener.set_nonblocking(true)?;
                Ok::<_, io::Error>(listener)
            };
            self.zk_listener = Some(bind(addr).map_err(|source| ServerError::Bind {
                addr: format!("{addr} (--zk-listen)"),
                source,
            })?);
        }
        Ok(self)
    }

    fn assemble(self, listener: TcpListener) -> Server {
        Server {
            listener,
            zk_listener: self.zk_listener,
            shared: self.shared,
            data_dir: self.data_dir,
            log_failed: self.log_failed,
            _no_log: self._no_log,
        }
    }
}

/// Serves with `config` on `listener` until `shutdown` completes.
///
/// # Errors
/// An invalid configuration, or a listener that fails for good.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    Server::new(listener, config)?.run(shutdown).await
}

/// Accepts ZooKeeper clients until the server stops (the task is aborted).
/// They share the server's connection slots with Baton's own clients.
async fn accept_zk(listener: TcpListener, shared: Arc<Shared>) {
    let mut last_error_log: Option<Instant> = None;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                if last_error_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                    error!("ZooKeeper accept failed: {e}; retrying every 100 ms");
                    last_error_log = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = shared.connection_slots.try_acquire() else {
            Stats::add(&shared.stats.connections_refused, 1);
            warn!(%peer, limit = shared.config.max_connections, "refusing ZooKeeper connection: at the connection limit");
            continue; // closed: ZooKeeper's clients move on to the next server
        };
        slot.forget(); // given back when the connection's state drops
        Stats::add(&shared.stats.connections_accepted, 1);
        let conn = crate::front::conn::Conn::new(shared.clone(), stream);
        tokio::spawn(crate::front::zk::serve(conn));
    }
}

/// Answers a connection over the limit with a handshake error, best effort.
async fn refuse(mut stream: TcpStream, limit: usize) {
    let mut buf = BytesMut::new();
    ConnectResponse {
        version: PROTOCOL_VERSION,
        result: Err((
            ErrorCode::TooManyConnections,
            format!("the server is at its limit of {limit} connections; try again later"),
        )),
    }
    .encode(&mut buf);
    let _ = timeout(Duration::from_secs(1), stream.write_all(&buf)).await;
}

/// Expires sessions when their deadlines pass.
async fn expiry_timer(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let next = {
            let mut core = shared.core();
            let expired = core.expire_due(Now::real());
            if expired > 0 {
                debug!(expired, "expired sessions");
            }
            core.next_deadline()
        };
        // The expiries just applied are written now (under `--fsync never`).
        shared.mark.hurry();
        // Far enough to mean "until woken"; tokio caps it anyway.
        let next = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = sleep_until(next) => {}
            _ = shared.expiry_wake.notified() => {}
            _ = stop.changed() => return,
        }
    }
}
