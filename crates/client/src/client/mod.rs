//! The `Client` handle and its builder; its operations on nodes are in
//! `nodes.rs`, on queues and fencing tokens in `queues.rs`.

mod nodes;
mod queues;
mod txn;

pub use txn::Txn;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::{
    path, ConnectRequest, ReadMode, Reply, Request, SessionId, SessionStatus, Stat, Token,
    PROTOCOL_VERSION,
};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::connect::open_leader;
use crate::deadline::{DeadlineAlarm, Liveness};
use crate::error::{Error, Result};
use crate::link::Link;
use crate::pending::{Answer, Registration};
use crate::persistent::PersistentWatch;
use crate::queue::{QueueTable, QueueWatch};
use crate::session::SessionTask;
use crate::state::SessionState;
use crate::watcher::{WatchTable, Watcher};
use crate::wire::ClientTls;

/// Default requested session timeout.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time allowed to open a TCP connection and finish the handshake.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a successful create returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// The node's actual path: with the sequence suffix, for sequential nodes.
    pub path: String,
    /// The sequence number of a sequential node. It is the revision of the
    /// creation, so it only ever grows under a given parent.
    pub sequence: Option<u64>,
    pub stat: Stat,
}

/// What [`Client::enqueue`] returns.
#[derive(Debug)]
pub struct Enqueued {
    /// The node created in the queue.
    pub node: Created,
    /// The member it waits on, as the server decided by the queue's rule
    /// (for an exclusive queue, the node just before it): `None` means it
    /// heads the queue.
    pub predecessor: Option<(String, Stat)>,
    /// Tells when the node heads the queue, and whether someone else
    /// deletes it.
    pub watch: QueueWatch,
}

impl Enqueued {
    /// Whether the node headed its queue when it joined.
    pub fn heads(&self) -> bool {
        self.predecessor.is_none()
    }
}

/// Settings for opening a session. Start with [`Client::builder`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    addrs: Vec<String>,
    session_timeout: Duration,
    connect_timeout: Duration,
    tls: Option<ClientTls>,
    token: Option<Token>,
    read_mode: ReadMode,
}

impl ClientBuilder {
    /// What the session's reads promise (default
    /// [`ReadMode::Linearizable`]; docs/design.md, "Read modes").
    ///
    /// With [`ReadMode::Sequential`] the member that serves the session
    /// answers reads from its own state at once, without confirming with
    /// the leader: reads are cheaper and never see the state go back (not
    /// across reconnects either), but may miss other sessions' latest
    /// changes until [`Client::sync`]. The session deadline then counts
    /// only from pings, syncs and changes, which the leader hears of, and
    /// the client pings every third of the timeout however busy it is.
    /// Recipes decide from events and changes, not from reads, and keep
    /// their guarantees in either mode.
    pub fn read_mode(mut self, mode: ReadMode) -> Self {
        self.read_mode = mode;
        self
    }

    /// The session timeout to ask for; the server clamps it to its bounds
    /// (see [`Client::session_timeout`] for the granted one).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long opening a session may take in all: finding the member that
    /// leads (members that do not answer within a quarter second have the
    /// next tried alongside them), its TCP connection and the handshake
    /// (default [`DEFAULT_CONNECT_TIMEOUT`]). A resume after a lost
    /// connection takes at most this long per round.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects with TLS, for a server that takes TLS (`baton serve
    /// --tls-cert`). The certificate must name the host as given in the
    /// server's address (a DNS name, or an IP address).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The token that names this client's identity, for a server that
    /// checks identities (docs/operations.md, "Identities and rights").
    /// Send it over TLS: anyone who reads it can act as the identity.
    pub fn token(mut self, token: impl Into<bytes::Bytes>) -> Self {
        self.token = Some(Token(token.into()));
        self
    }

    /// Opens a new session on the server that answers (of a cluster's
    /// members, the one that leads), within the connect timeout.
    ///
    /// # Errors
    /// [`Error::BadArguments`] for an address that is not HOST:PORT;
    /// [`Error::Connect`] saying why each address failed (the address's own
    /// error when only one was given); [`Error::NotLeader`] when members
    /// answered but none leads, with what each said;
    /// [`Error::AuthenticationFailed`]; [`Error::TooManyConnections`] if the
    /// server is full.
    pub async fn connect(self) -> Result<Client> {
        if self.addrs.is_empty() {
            return Err(Error::connect("", "no server address given"));
        }
        if let Some(bad) = self.addrs.iter().find(|a| !has_port(a)) {
            return Err(Error::BadArguments(format!(
                "{bad:?} is not a server address: give HOST:PORT, such as 127.0.0.1:4181 (several separated by commas)"
            )));
        }
        let request = ConnectRequest {
            version: PROTOCOL_VERSION,
            timeout_ms: self.session_timeout.as_millis().min(u32::MAX as u128) as u32,
            resume: None,
            token: self.token.clone(),
            read_mode: self.read_mode,
            last_seen: 0,
        };
        // A cluster between leaders (an election) sends everyone away for a
        // moment: keep trying, within the connect timeout.
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let mut backoff = Duration::from_millis(20);
        loop {
            let tls = self.tls.as_ref();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match open_leader(None, &self.addrs, &request, left, tls).await {
                Ok((conn, addr)) => return Ok(self.start(conn, addr)),
                Err(Error::NotLeader(why)) if tokio::time::Instant::now() + backoff < deadline => {
                    tracing::debug!("no leader yet ({why}); trying again in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn start(self, conn: crate::connect::Connection, addr: String) -> Client {
        let grant = conn.grant.clone();
        let link = Arc::new(Link::new());
        let (unreg_tx, unreg_rx) = mpsc::unbounded_channel();
        let (persistent_tx, persistent_rx) = mpsc::unbounded_channel();
        let (orphan_tx, orphan_rx) = mpsc::unbounded_channel();
        let (state_tx, state_rx) = watch::channel(SessionState::Connected);
        let timeout = Duration::from_millis(grant.timeout_ms.into());
        let liveness = Arc::new(Liveness::new(conn.sent, timeout));
        let task = SessionTask {
            liveness: liveness.clone(),
            addrs: self.addrs.clone(),
            connect_timeout: self.connect_timeout,
            tls: self.tls.clone(),
            token: self.token.clone(),
            read_mode: self.read_mode,
            session: grant.session_id,
            secret: grant.secret,
            timeout: Duration::from_millis(grant.timeout_ms.into()),
            link: link.clone(),
            unregister: unreg_rx,
            new_persistent: persistent_rx,
            orphaned: orphan_rx,
            state: state_tx,
            watches: WatchTable::default(),
            queues: QueueTable::default(),
            persistent: Default::default(),
            orphans: Vec::new(),
            last_revision: 0,
            leader: Some(addr),
            unanswered: VecDeque::new(),
        };
        tokio::spawn(task.run(conn));
        Client {
            _keep: Some(Arc::new(Keep(link.clone()))),
            inner: Arc::new(Inner {
                link,
                unregister: unreg_tx,
                new_persistent: persistent_tx,
                orphans: orphan_tx,
                state: state_rx,
                session: grant.session_id,
                timeout: Duration::from_millis(grant.timeout_ms.into()),
                max_data: grant.max_data as usize,
                liveness,
                addrs: self.addrs,
                next_watch: AtomicU64::new(1),
            }),
        }
    }
}

struct Inner {
    /// The sending side of the session: calls write their requests here.
    link: Arc<Link>,
    unregister: mpsc::UnboundedSender<(String, u64)>,
    /// Persistent watches being set, to the session task.
    new_persistent: mpsc::UnboundedSender<(String, crate::persistent::PersistentRequest)>,
    /// Queue nodes whose answers reached calls dropped before reading them:
    /// the session task deletes them.
    orphans: mpsc::UnboundedSender<String>,
    state: watch::Receiver<SessionState>,
    session: SessionId,
    timeout: Duration,
    max_data: usize,
    liveness: Arc<Liveness>,
    addrs: Vec<String>,
    next_watch: AtomicU64,
}

/// Held by every handle but detached ones: the last one dropped leaves the
/// session to expire.
struct Keep(Arc<Link>);

impl Drop for Keep {
    fn drop(&mut self) {
        self.0.handles_dropped();
    }
}

/// A session with a Baton server.
///
/// `Client` is a cheap handle: clones share one session, its connection and
/// one background task that reads from it. Each call writes its request to
/// the connection itself; requests from all clones are pipelined on it and
/// answered in order.
///
/// # Connection loss
/// If the connection breaks, the task reconnects and resumes the session (its
/// ephemeral nodes and watches survive) for as long as the server keeps it.
/// Requests in flight at that moment are sent again, with the same xids,
/// once the session is resumed, and the server applies each at most once: a
/// change it had applied is answered with the reply it gave (the session's
/// latest change keeps its reply), so the caller gets the real result. Only
/// an earlier change whose reply the server no longer keeps fails with
/// [`Error::ConnectionLoss`]: it was handled, and not applied again. Requests
/// made while disconnected wait and are sent after the reconnect; wrap calls
/// in `tokio::time::timeout` to bound that wait.
///
/// # Ending
/// [`close`](Client::close) ends the session at once, deleting its ephemeral
/// nodes. Dropping every clone without closing leaves the session to expire
/// after its timeout, as if the process had died (handles made with
/// [`detached`](Client::detached) do not count).
///
/// # Cancellation safety
/// Dropping a call's future does not withdraw a request already sent; only
/// its answer is lost.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// `None` in a detached handle.
    _keep: Option<Arc<Keep>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("session", &self.inner.session)
            .field("state", &self.state())
            .finish()
    }
}

impl Client {
    /// Opens a session on the server at `addr` (`host:port`; several may be
    /// given separated by commas) with default settings.
    ///
    /// # Errors
    /// See [`ClientBuilder::connect`].
    pub async fn connect(addr: &str) -> Result<Client> {
        Self::builder(addr).connect().await
    }

    /// Settings for a session on the server(s) at `addr`.
    /// A client for the servers at `addr`: HOST:PORT, several separated by
    /// commas (the members of a cluster).
    pub fn builder(addr: &str) -> ClientBuilder {
        ClientBuilder {
            addrs: addr
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
            token: None,
            read_mode: ReadMode::Linearizable,
        }
    }

    /// Another handle on this session that does not keep it: once every
    /// handle that does is dropped, the session is left to expire (as if the
    /// process had died), and calls on this one fail with [`Error::Closed`],
    /// those under way included. For work in the background that is worth
    /// doing only while the application still uses the session, such as
    /// cleaning up after a cancelled call: a task that held an ordinary
    /// handle would keep the session, and send its unanswered requests
    /// again after a reconnect, when the application has given it up.
    pub fn detached(&self) -> Client {
        Client {
            inner: self.inner.clone(),
            _keep: None,
        }
    }

    /// The session's id, as the server names it.
    pub fn session_id(&self) -> SessionId {
        self.inner.session
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The server addresses this client uses.
    pub fn addrs(&self) -> &[String] {
        &self.inner.addrs
    }

    /// The earliest moment the server may have expired this session, by this
    /// process's own monotonic clock: the time the latest answered request
    /// was sent, plus the session timeout. Known without a round trip, so a
    /// process that wakes from a long pause can tell at once that its session
    /// (and every lease tied to it) may be over.
    pub fn session_deadline(&self) -> Instant {
        self.inner.liveness.deadline()
    }

    /// An alarm that goes off the first time no more than `margin` is left
    /// before [`session_deadline`](Self::session_deadline), and stays off
    /// even if a late answer moves the deadline on afterwards. A lease holder
    /// stops when it goes off, so that it has stopped before the server may
    /// expire its session.
    pub fn deadline_alarm(&self, margin: Duration) -> DeadlineAlarm {
        self.inner.liveness.alarm(margin)
    }

    /// The session's state now.
    pub fn state(&self) -> SessionState {
        *self.inner.state.borrow()
    }

    /// A receiver that sees every change of the session's state.
    pub fn state_changes(&self) -> watch::Receiver<SessionState> {
        self.inner.state.clone()
    }

    /// Waits until the session is gone (expired or closed) and returns which.
    ///
    /// # Cancellation safety
    /// Safe: it waits on its own receiver of the session's state, so
    /// dropping it changes nothing, and a later call sees the same end.
    pub async fn ended(&self) -> SessionState {
        let mut rx = self.inner.state.clone();
        let state = match rx.wait_for(|s| s.is_terminal()).await {
            Ok(state) => *state,
            Err(_) => SessionState::Closed,
        };
        state
    }

    /// Removes this session's watches on `path` on the server: its data watch
    /// (from exists, get data or predecessor) if `data`, its child watch if
    /// `child`. Local watchers for them stay pending until dropped; drop them
    /// first.
    ///
    /// # Errors
    /// A session or connection error.
    pub async fn remove_watches(&self, path: &str, data: bool, child: bool) -> Result<()> {
        self.check(path, None)?;
        let request = Request::RemoveWatches {
            path: path.to_owned(),
            data,
            child,
            persistent: false,
        };
        self.call(request, None).await.map(|_| ())
    }

    /// A persistent watch on `path`: every change to the node (its
    /// creation, deletion, data changes and changes to its children list)
    /// or, if `recursive`, every creation, deletion and data change of the
    /// node and of every node below it, in revision order, until the watch
    /// is dropped. The node need not exist.
    ///
    /// The watch survives reconnects and, on a cluster, leader changes:
    /// the client sets it again from the revision it had reached, and the
    /// server replays the changes it missed, each delivered once. If it was
    /// away for more changes than the server keeps (see the server's
    /// `--watch-history`), the watch delivers one event of kind
    /// [`EventKind::Compacted`](crate::EventKind::Compacted): read afresh.
    ///
    /// # Errors
    /// [`Error::InvalidPath`], [`Error::Server`] with `too-many-watches`
    /// past the session's watch budget, and a session or connection error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> baton_client::Result<()> {
    /// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
    /// let mut changes = client.watch("/config", true).await?;
    /// loop {
    ///     let event = changes.next().await?;
    ///     println!("{:?} {} at revision {}", event.kind, event.path, event.revision);
    /// }
    /// # }
    /// ```
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<PersistentWatch> {
        self.watch_from(path, recursive, 0).await
    }

    /// Like [`watch`](Self::watch), and first every change after revision
    /// `from` that the watch would have reported, in order, from the
    /// server's watch history: set a watch from the revision of what was
    /// read (a node's `mzxid`, a parent's `pzxid`) and no change between
    /// the read and the watch is missed. If the history no longer goes
    /// back to `from`, the first event is of kind
    /// [`EventKind::Compacted`](crate::EventKind::Compacted). `from` = 0
    /// is [`watch`](Self::watch).
    ///
    /// # Errors
    /// As [`watch`](Self::watch).
    pub async fn watch_from(
        &self,
        path: &str,
        recursive: bool,
        from: u64,
    ) -> Result<PersistentWatch> {
        self.check(path, None)?;
        let id = self.inner.next_watch.fetch_add(1, Ordering::Relaxed);
        let (watch, registration) = PersistentWatch::new(
            path.to_owned(),
            (recursive, from),
            id,
            self.inner.unregister.clone(),
        );
        // Registered first: the events replayed come before the reply.
        self.inner
            .new_persistent
            .send((path.to_owned(), registration))
            .map_err(|_| self.ended_error())?;
        let request = Request::AddWatch {
            path: path.to_owned(),
            recursive,
            from,
        };
        match self.call(request, None).await?.reply {
            Reply::AddWatch => Ok(watch),
            other => Err(unexpected(other)),
        }
    }

    /// The server's counters (requests, watch events sent, bytes, CPU time,
    /// sessions, nodes, ...), by name.
    ///
    /// # Errors
    /// A session or connection error.
    pub async fn server_stats(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        match self.call(Request::Stats, None).await?.reply {
            Reply::Stats(counters) => Ok(counters.into_iter().collect()),
            other => Err(unexpected(other)),
        }
    }

    /// Whether `session` (anyone's) is alive as the server sees it:
    /// connected, disconnected and until when it may still resume, or gone.
    ///
    /// # Errors
    /// As any read.
    pub async fn session_status(&self, session: SessionId) -> Result<SessionStatus> {
        match self
            .call(Request::SessionStatus { session }, None)
            .await?
            .reply
        {
            Reply::SessionStatus(status) => Ok(status),
            other => Err(unexpected(other)),
        }
    }

    /// A round trip to the server (it also counts as a heartbeat).
    ///
    /// # Errors
    /// A session or connection error.
    pub async fn ping(&self) -> Result<()> {
        self.call(Request::Ping, None).await.map(|_| ())
    }

    /// Brings the member that serves this session up to date with the
    /// leader: once it returns, every read sent after it sees at least every
    /// change committed before the sync was sent, in either read mode (in
    /// [`ReadMode::Sequential`], what makes a read see another session's
    /// latest changes). Returns the revision the member had applied when it
    /// answered. Like a ping, it also counts as a heartbeat.
    ///
    /// # Errors
    /// A session or connection error.
    pub async fn sync(&self) -> Result<u64> {
        let answer = self.call(Request::Sync, None).await?;
        match answer.reply {
            Reply::Sync => Ok(answer.revision),
            other => Err(unexpected(other)),
        }
    }

    /// Ends the session now: the server deletes its ephemeral nodes and fires
    /// their watches. Every clone of this client is closed with it.
    pub async fn close(&self) {
        let (done, rx) = oneshot::channel();
        self.inner.link.close(done);
        let _ = rx.await;
    }

    /// Validates a path and data before they cost a round trip.
    fn check(&self, path: &str, data: Option<&Bytes>) -> Result<()> {
        path::validate(path).map_err(|e| Error::InvalidPath(e.to_string()))?;
        if let Some(data) = data {
            if data.len() > self.inner.max_data {
                return Err(Error::ValueTooLarge(format!(
                    "data of {} bytes exceeds the server's limit of {} bytes",
                    data.len(),
                    self.inner.max_data
                )));
            }
        }
        Ok(())
    }

    async fn call_watch(
        &self,
        path: &str,
        request: Request,
        watch: bool,
    ) -> Result<(Answer, Option<Watcher>)> {
        if !watch {
            return Ok((self.call(request, None).await?, None));
        }
        let id = self.inner.next_watch.fetch_add(1, Ordering::Relaxed);
        let (watcher, registration) =
            Watcher::new(path.to_owned(), id, self.inner.unregister.clone());
        let registration = Registration::Watch(path.to_owned(), registration);
        let answer = self.call(request, Some(registration)).await?;
        Ok((answer, Some(watcher)))
    }

    async fn call(&self, request: Request, watch: Option<Registration>) -> Result<Answer> {
        let (reply, rx) = oneshot::channel();
        let mut answer = Unread {
            rx,
            orphans: &self.inner.orphans,
        };
        self.inner.link.submit(request, reply, watch).await;
        (&mut answer.rx)
            .await
            .unwrap_or_else(|_| Err(self.ended_error()))
    }

    fn ended_error(&self) -> Error {
        match self.state() {
            SessionState::Expired => {
                Error::SessionExpired(format!("session {} has expired", self.inner.session))
            }
            _ => Error::Closed,
        }
    }
}

/// The receiving end of a call's answer, while the call waits for it.
///
/// A call can be dropped after its answer was delivered and before it is
/// polled again (the other branch of a `select!` won on the same wake-up,
/// or its task was aborted). The answer then goes with it, and so would the
/// knowledge of a queue node the call created, which would block its queue
/// for as long as the session lives. Dropping this hands such a node to the
/// session task, which deletes it, as it deletes the node of an answer that
/// arrives once the call is gone.
struct Unread<'a> {
    rx: oneshot::Receiver<Result<Answer>>,
    orphans: &'a mpsc::UnboundedSender<String>,
}

impl Drop for Unread<'_> {
    fn drop(&mut self) {
        // Closed first: an answer sent from now on fails to arrive and the
        // session task keeps the node itself, so exactly one side has it.
        // (Once the answer was read, there is nothing left to take.)
        self.rx.close();
        if let Ok(Ok(Answer {
            reply: Reply::Enqueue { path, .. },
            ..
        })) = self.rx.try_recv()
        {
            let _ = self.orphans.send(path);
        }
    }
}

fn unexpected(reply: Reply) -> Error {
    Error::Protocol(format!("reply of the wrong kind: {:?}", reply.op()))
}

/// Whether `addr` ends in `:PORT`, as a server address must.
fn has_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}
