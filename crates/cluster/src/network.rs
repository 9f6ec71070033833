//! The replicated log's traffic between members, over Baton's own framed
//! TCP on each member's peer port.
//!
//! # Format
//! ```text
//! every frame: length u32 (big-endian), then that many bytes of bincode
//! a connection opens with Hello { magic "BATNPEER", version 4, from: id }
//! then the dialing member sends requests and the other answers each, in
//! order, on the same connection; after the Hello every frame is
//!   call id u64 (big-endian), then the bincode of a request or an answer
//! and an answer carries the id of the request it answers:
//!   Append(AppendEntriesRequest)   -> Append(Result<AppendEntriesResponse>)
//!   Vote(VoteRequest)              -> Vote(Result<VoteResponse>)
//!   Snapshot(InstallSnapshotRequest, one chunk)
//!                                  -> Snapshot(Result<InstallSnapshotResponse>)
//!   Status                         -> Status(MemberStatus)
//!   Change(add or remove a member) -> Changed(Result<message, error>)
//!                                     (asked of the leader, by an operator)
//!   Added { id, at }               -> Added(Result<(), error>)
//!                                     (the leader to a member being added)
//!   WentBack { held }              -> WentBack(Result<(), error>)
//!                                     (the leader to a member whose log lost
//!                                     entries it had acknowledged)
//! ```
//! A member dials another when it first needs to and again after any
//! failure; connections of short-lived clients are kept for the next ones.
//! Every call has the deadline openraft gives it, and a member that cannot
//! be reached or does not answer in time is reported unreachable, so that
//! openraft backs off before trying again.
//!
//! A connection is reused only after a whole exchange: a call given up
//! between writing its request and reading its answer (openraft times its
//! calls out on its own, by dropping them) takes its connection with it,
//! and an answer whose id or kind is not the one asked for ends the
//! connection. One answer read in place of another would make the leader
//! count a member as holding entries it never stored.
//!
//! # A member whose data went back
//! A leader remembers, for the time it leads, how far each member said it
//! holds the log. A member that then answers that it lacks an entry at or
//! below that point has lost entries it stored and acknowledged: it was
//! started from an old copy of its data directory (a file-system backup
//! put back, a disk snapshot). Its acknowledgements may be part of a
//! majority that committed entries only the leader still holds, so the
//! leader does not count on it: it tells the member, which stops with the
//! procedure to follow (remove it, wipe it, add it again), and it keeps
//! the member unreachable meanwhile rather than hand the answer to the
//! consensus engine (which would stop the leader itself: a member of a
//! 3-member cluster put back from a copy then took its leader down, and
//! with it the only copy of entries the cluster had acknowledged).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BufMut;
use futures::{SinkExt, StreamExt};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tracing::{debug, info, warn};

use crate::types::{LogId, Member, NodeId, Raft, TypeConfig, Vote};

const MAGIC: [u8; 8] = *b"BATNPEER";
const VERSION: u16 = 4;
/// Largest frame between members: a batch of entries (each at most the
/// largest node data) or a snapshot chunk.
const MAX_FRAME: usize = 256 << 20;
/// Largest first frame a member takes from whoever connects: the greeting
/// is a few bytes, and until it has come nobody is trusted with room for a
/// large frame.
const MAX_HELLO_FRAME: usize = 64;
/// How long a dial may take before the member counts as unreachable.
const DIAL_TIMEOUT: Duration = Duration::from_millis(500);

/// The id of the next call this process makes to any member; its answer
/// must echo it.
static NEXT_CALL: AtomicU64 = AtomicU64::new(1);
/// Bytes of the call id in front of every request and answer.
const CALL_ID: usize = 8;

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME)
        .new_codec()
}

#[derive(Serialize, Deserialize)]
struct Hello {
    magic: [u8; 8],
    version: u16,
    from: NodeId,
}

#[derive(Serialize, Deserialize)]
enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    Status,
    Change(crate::admin::Change),
    /// From the leader to a member being added: the membership at this
    /// log index added member `id` (see `joining`).
    Added {
        id: NodeId,
        at: u64,
    },
    /// From the leader to a member that said it holds the log up to `held`
    /// and now lacks an entry at or below it.
    WentBack {
        held: LogId,
    },
}

#[derive(Serialize, Deserialize)]
enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Status(MemberStatus),
    Changed(Result<String, String>),
    Added(Result<(), String>),
    WentBack(Result<(), String>),
}

/// Which request a call makes, and so which answer it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Append,
    Vote,
    Snapshot,
    Status,
    Change,
    Added,
    WentBack,
}

impl Request {
    fn kind(&self) -> Kind {
        match self {
            Request::Append(_) => Kind::Append,
            Request::Vote(_) => Kind::Vote,
            Request::Snapshot(_) => Kind::Snapshot,
            Request::Status => Kind::Status,
            Request::Change(_) => Kind::Change,
            Request::Added { .. } => Kind::Added,
            Request::WentBack { .. } => Kind::WentBack,
        }
    }
}

impl Response {
    fn kind(&self) -> Kind {
        match self {
            Response::Append(_) => Kind::Append,
            Response::Vote(_) => Kind::Vote,
            Response::Snapshot(_) => Kind::Snapshot,
            Response::Status(_) => Kind::Status,
            Response::Changed(_) => Kind::Change,
            Response::Added(_) => Kind::Added,
            Response::WentBack(_) => Kind::WentBack,
        }
    }
}

/// `message` encoded behind room for its call id.
fn encode_call<T: Serialize>(message: &T) -> bincode::Result<bytes::BytesMut> {
    let size = bincode::serialized_size(message)? as usize;
    let mut buf = bytes::BytesMut::with_capacity(CALL_ID + size);
    buf.extend_from_slice(&[0; CALL_ID]);
    bincode::serialize_into((&mut buf).writer(), message)?;
    Ok(buf)
}

/// A frame's call id and the rest.
fn split_call(frame: &[u8]) -> Option<(u64, &[u8])> {
    let (id, rest) = frame.split_first_chunk::<CALL_ID>()?;
    Some((u64::from_be_bytes(*id), rest))
}

/// Why an exchange failed: the connection broke (worth one more try on a
/// fresh one, if it was an idle one), or the other side answered with
/// something that was not the answer asked for.
enum Broken {
    Io(Failed),
    Protocol(Failed),
}

/// Writes request `id` (encoded in `body`) on `conn` and reads its answer,
/// which must echo `id` and be of `kind`. On any error `conn` is in an
/// unknown state: the caller drops it.
async fn exchange_on(
    conn: &mut Conn,
    addr: &str,
    id: u64,
    kind: Kind,
    body: bytes::Bytes,
) -> Result<Response, Broken> {
    conn.send(body)
        .await
        .map_err(|e| Broken::Io(Failed(format!("sending to {addr}: {e}"))))?;
    let frame = conn
        .next()
        .await
        .ok_or_else(|| Broken::Io(Failed(format!("{addr} closed the connection"))))?
        .map_err(|e| Broken::Io(Failed(format!("reading from {addr}: {e}"))))?;
    let protocol = |why: String| Broken::Protocol(Failed(format!("{addr}: {why}")));
    let (answered, rest) =
        split_call(&frame).ok_or_else(|| protocol("an answer without a call id".into()))?;
    if answered != id {
        return Err(protocol(format!(
            "an answer to call {answered} came for call {id}"
        )));
    }
    let response: Response =
        bincode::deserialize(rest).map_err(|e| protocol(format!("a bad answer: {e}")))?;
    if response.kind() != kind {
        return Err(protocol(format!(
            "a {:?} answer came for a {kind:?} request",
            response.kind()
        )));
    }
    Ok(response)
}

/// What a member says of itself, for `baton cluster status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: NodeId,
    /// leader, follower, candidate or learner.
    pub role: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    /// The log index of the membership this member goes by (the latest it
    /// has, committed or not), its voters, and all its members (learners
    /// included).
    pub membership_index: Option<u64>,
    pub voters: Vec<NodeId>,
    pub members: Vec<NodeId>,
}

impl MemberStatus {
    /// This member's status, from its metrics.
    pub fn of(raft: &Raft) -> MemberStatus {
        let m = raft.metrics().borrow().clone();
        let role = match m.state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "stopped",
        };
        MemberStatus {
            id: m.id,
            role: role.into(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            membership_index: m.membership_config.log_id().map(|l| l.index),
            voters: m.membership_config.membership().voter_ids().collect(),
            members: m
                .membership_config
                .membership()
                .nodes()
                .map(|(id, _)| *id)
                .collect(),
        }
    }
}

/// Dials other members; a member reached at another address than its
/// advertised one (through a tunnel or a proxy) has a route.
#[derive(Clone)]
pub struct Network {
    id: NodeId,
    routes: Arc<BTreeMap<NodeId, String>>,
    idle: Idle,
    tls: Option<PeerTls>,
    held: Held,
}

impl Network {
    pub fn new(id: NodeId, routes: BTreeMap<NodeId, String>, tls: Option<PeerTls>) -> Network {
        Network {
            id,
            routes: Arc::new(routes),
            idle: Idle::default(),
            tls,
            held: Held::default(),
        }
    }

    /// How far each member said it holds the log, as this member's clients
    /// record it.
    pub fn held(&self) -> Held {
        self.held.clone()
    }
}

/// How far each member said it holds the log, in answers to this member's
/// appends while it led with one vote (a new vote starts afresh): shared by
/// every client openraft makes, however often it makes them.
#[derive(Clone, Default)]
pub struct Held(Arc<std::sync::Mutex<BTreeMap<NodeId, (Vote, LogId)>>>);

impl Held {
    /// Forgets what member `id` held: it is being added (again), with a log
    /// of its own from now on.
    pub fn forget(&self, id: NodeId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Member `target` said, answering an append sent with `vote`, that it
    /// holds the log up to `upto`.
    fn record(&self, target: NodeId, vote: Vote, upto: LogId) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match held.get_mut(&target) {
            Some((v, at)) if *v == vote => {
                if upto.index > at.index {
                    *at = upto;
                }
            }
            _ => {
                held.insert(target, (vote, upto));
            }
        }
    }

    /// How far member `target` said it holds the log, to appends sent with
    /// `vote`.
    fn of(&self, target: NodeId, vote: &Vote) -> Option<LogId> {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&target)
            .filter(|(v, _)| v == vote)
            .map(|(_, at)| *at)
    }
}

/// A connection to or from another member: plain TCP, or TLS over it.
trait PeerIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin> PeerIo for T {}

type Conn = Framed<Box<dyn PeerIo>, LengthDelimitedCodec>;

/// Mutual TLS between members: each presents its certificate, and takes
/// only certificates that chain to the members' authority. Cheap to clone.
#[derive(Clone)]
pub struct PeerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls(..)")
    }
}

impl PeerTls {
    /// Settings from PEM files: this member's certificate and key (its
    /// certificate must name the host of its peer address, and allow both
    /// server and client authentication) and the authority every member's
    /// certificate chains to.
    ///
    /// # Errors
    /// A message naming the file and what is wrong with it.
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> Result<PeerTls, String> {
        use rustls::{ClientConfig, RootCertStore, ServerConfig};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in baton_proto::pem::read_certs(ca)? {
            roots
                .add(c)
                .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
        }
        let roots = Arc::new(roots);
        let certs = baton_proto::pem::read_certs(cert)?;
        let key = baton_proto::pem::read_key(key)?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| format!("{}: {e}", ca.display()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| format!("{} and its key: {e}", cert.display()))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("{} and its key: {e}", cert.display()))?;
        Ok(PeerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }
}

/// The name a member at `addr` must carry in its certificate: the host.
fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host} is not a name TLS can check: {e}"))
}

/// Connections left open by the short-lived clients openraft makes for
/// every read barrier and election, for the next ones to use: dialing
/// afresh each time would cost a connection per round and leave a socket
/// waiting out TIME_WAIT for each.
#[derive(Clone, Default)]
struct Idle(Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<Conn>>>>);

/// Idle connections kept per member address, at most.
const IDLE_PER_MEMBER: usize = 4;

impl Idle {
    fn take(&self, addr: &str) -> Option<Conn> {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(addr)?.pop()
    }

    fn put(&self, addr: &str, conn: Conn) {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let kept = idle.entry(addr.to_owned()).or_default();
        if kept.len() < IDLE_PER_MEMBER {
            kept.push(conn);
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Peer {
        let addr = self
            .routes
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.peer.clone());
        Peer {
            from: self.id,
            target,
            addr,
            name: node.peer.clone(),
            conn: None,
            idle: Some(self.idle.clone()),
            failures: Some(0),
            tls: self.tls.clone(),
            held: Some(self.held.clone()),
        }
    }
}

/// One connection to one other member, dialed when needed (or taken from
/// the idle ones), and left for others to use when the client is dropped.
pub struct Peer {
    from: NodeId,
    target: NodeId,
    addr: String,
    /// The member's advertised peer address, whose host its certificate
    /// must name (`addr` may be a route to it: a tunnel, a proxy).
    name: String,
    /// The client's connection while no call is using it: a call takes it
    /// and puts it back only after a whole exchange.
    conn: Option<Conn>,
    idle: Option<Idle>,
    /// Calls failed in a row, for the replicated log's own connections
    /// (`None` for an operator's one-off question): the first failure and
    /// the recovery are logged, not every retry.
    failures: Option<u32>,
    /// Mutual TLS with the other members, if they use it.
    tls: Option<PeerTls>,
    /// How far each member said it holds the log (the replicated log's own
    /// clients only).
    held: Option<Held>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(String);

impl Drop for Peer {
    fn drop(&mut self) {
        if let (Some(conn), Some(idle)) = (self.conn.take(), &self.idle) {
            idle.put(&self.addr, conn);
        }
    }
}

impl Peer {
    /// A connection ready for a call: this client's own, one of the idle
    /// ones (if `idle_ok`), or a new one. It is the caller's until it puts
    /// it back after a whole exchange; whoever drops it closes it.
    async fn connection(&mut self, idle_ok: bool) -> Result<(Conn, bool), Failed> {
        if let Some(conn) = self.conn.take() {
            return Ok((conn, false));
        }
        let idle = self.idle.as_ref().filter(|_| idle_ok);
        if let Some(conn) = idle.and_then(|idle| idle.take(&self.addr)) {
            return Ok((conn, true));
        }
        Ok((self.dial().await?, false))
    }

    /// A new connection, greeted.
    async fn dial(&self) -> Result<Conn, Failed> {
        let stream = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| {
                Failed(format!(
                    "no connection to {} within {DIAL_TIMEOUT:?}",
                    self.addr
                ))
            })?
            .map_err(|e| Failed(format!("cannot connect to {}: {e}", self.addr)))?;
        let _ = stream.set_nodelay(true);
        let io: Box<dyn PeerIo> = match &self.tls {
            None => Box::new(stream),
            Some(tls) => {
                let name = server_name(&self.name).map_err(Failed)?;
                let shake = tls.connector.connect(name, stream);
                let stream = tokio::time::timeout(DIAL_TIMEOUT, shake)
                    .await
                    .map_err(|_| {
                        Failed(format!(
                            "no TLS handshake with {} within {DIAL_TIMEOUT:?}",
                            self.addr
                        ))
                    })?
                    .map_err(|e| Failed(format!("TLS handshake with {} failed: {e}", self.addr)))?;
                Box::new(stream)
            }
        };
        let mut framed = Framed::new(io, codec());
        let hello = bincode::serialize(&Hello {
            magic: MAGIC,
            version: VERSION,
            from: self.from,
        })
        .expect("hello serializes");
        framed
            .send(bytes::Bytes::from(hello))
            .await
            .map_err(|e| Failed(format!("greeting {}: {e}", self.addr)))?;
        Ok(framed)
    }

    /// One call: the request out, its response back, within `limit`.
    async fn call(&mut self, request: &Request, limit: Duration) -> Result<Response, Failed> {
        let body = encode_call(request).map_err(|e| Failed(e.to_string()))?;
        self.call_bytes(request.kind(), body, limit).await
    }

    /// One call of a request already encoded by [`encode_call`], whose
    /// answer must be of `kind`.
    ///
    /// # Cancellation safety
    /// Safe: the connection is this call's own from the moment the request
    /// is written until its whole answer is read, and only then goes back
    /// to the client (or, when the client is dropped, to the idle ones). A
    /// call given up at any point (by `limit`, or by its caller dropping
    /// it) drops its connection with it, so no later call can read an
    /// answer that was not meant for it. Each request also carries an id
    /// its answer must echo, and an answer to anything else, or of another
    /// kind, ends the connection.
    async fn call_bytes(
        &mut self,
        kind: Kind,
        body: bytes::BytesMut,
        limit: Duration,
    ) -> Result<Response, Failed> {
        let result = tokio::time::timeout(limit, self.exchange(kind, body)).await;
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(Failed(format!(
                "no answer from {} within {limit:?}",
                self.addr
            ))),
        };
        self.note(&result);
        result
    }

    /// The exchange behind [`Peer::call_bytes`]. A connection taken from
    /// the idle ones that turns out broken is replaced by a fresh one,
    /// once: every request between members may be made twice.
    async fn exchange(
        &mut self,
        kind: Kind,
        mut body: bytes::BytesMut,
    ) -> Result<Response, Failed> {
        let id = NEXT_CALL.fetch_add(1, Ordering::Relaxed);
        body[..8].copy_from_slice(&id.to_be_bytes());
        let body = body.freeze();
        let (mut conn, mut reused) = self.connection(true).await?;
        loop {
            match exchange_on(&mut conn, &self.addr, id, kind, body.clone()).await {
                Ok(response) => {
                    self.conn = Some(conn);
                    return Ok(response);
                }
                Err(Broken::Io(_)) if reused => {
                    // Not from the idle ones again: a fresh dial.
                    drop(conn);
                    conn = self.dial().await?;
                    reused = false;
                }
                Err(Broken::Io(e) | Broken::Protocol(e)) => return Err(e),
            }
        }
    }

    /// Logs the first failure in a row and the recovery, for the
    /// replicated log's own clients.
    fn note(&mut self, result: &Result<Response, Failed>) {
        let Some(failures) = self.failures.as_mut() else {
            return;
        };
        match result {
            Err(e) if *failures == 0 => {
                warn!(
                    member = self.target,
                    "cannot reach member {} ({e}); trying again", self.target
                );
                *failures = 1;
            }
            Err(_) => *failures += 1,
            Ok(_) if *failures > 0 => {
                info!(
                    member = self.target,
                    "member {} is reachable again, after {} failed calls", self.target, *failures
                );
                *failures = 0;
            }
            Ok(_) => {}
        }
    }

    /// The member said, answering an append sent with `vote`, that it holds
    /// the log up to `upto`.
    fn holds(&self, vote: Vote, upto: Option<LogId>) {
        if let (Some(held), Some(upto)) = (&self.held, upto) {
            held.record(self.target, vote, upto);
        }
    }

    /// Whether the member, answering that it lacks the entry at `prev`,
    /// lost entries it said it held in answers to appends sent with
    /// `vote`: how far it said it held them, if so.
    fn went_back(&self, vote: &Vote, prev: Option<LogId>) -> Option<LogId> {
        let held = self.held.as_ref()?.of(self.target, vote)?;
        (prev?.index <= held.index).then_some(held)
    }

    /// Tells the member that its log lost entries it held up to `held`;
    /// what the leader makes of the member meanwhile (unreachable).
    async fn tell_went_back(&mut self, held: LogId, option: RPCOption) -> Failed {
        tracing::error!(
            member = self.target,
            "member {} lacks entries it said it held up to {held}: its data went back (started from an old copy?); it is told to stop, and counted on for nothing",
            self.target
        );
        let told = match self
            .call(&Request::WentBack { held }, option.hard_ttl())
            .await
        {
            Ok(Response::WentBack(Ok(()))) => "told to stop".to_string(),
            Ok(Response::WentBack(Err(e))) => format!("it disagrees: {e}"),
            Ok(_) => unreachable!("exchange_on checks the kind"),
            Err(e) => format!("it was not told: {e}"),
        };
        Failed(format!(
            "member {} lost entries it held up to {held} ({told})",
            self.target
        ))
    }

    fn unreachable<E: std::error::Error>(&self, e: Failed) -> RPCError<NodeId, Member, E> {
        debug!(target = self.target, "peer call failed: {e}");
        RPCError::Unreachable(Unreachable::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        // Entries that do not fit in one frame go in several calls: this one
        // sends those that fit and reports the rest unsent (openraft sends
        // them next). One entry always fits (see MAX_MEMBER_DATA).
        let request = Request::Append(rpc);
        let mut bytes = encode_call(&request)
            .map_err(|e| RPCError::Network(NetworkError::new(&Failed(e.to_string()))))?;
        let Request::Append(mut rpc) = request else {
            unreachable!("made above")
        };
        let split = bytes.len() > MAX_FRAME && rpc.entries.len() > 1;
        if split {
            let keep = entries_that_fit(&rpc.entries, MAX_FRAME - 64 * 1024);
            rpc.entries.truncate(keep);
        }
        let (vote, prev) = (rpc.vote, rpc.prev_log_id);
        // How far the member holds the log if it takes the call.
        let upto = rpc.entries.last().map(|e| e.log_id).or(prev);
        if split {
            bytes = encode_call(&Request::Append(rpc))
                .map_err(|e| RPCError::Network(NetworkError::new(&Failed(e.to_string()))))?;
        }
        let answer = self
            .call_bytes(Kind::Append, bytes, option.hard_ttl())
            .await;
        match answer {
            Ok(Response::Append(Ok(AppendEntriesResponse::Success))) => {
                self.holds(vote, upto);
                Ok(if split {
                    AppendEntriesResponse::PartialSuccess(upto)
                } else {
                    AppendEntriesResponse::Success
                })
            }
            Ok(Response::Append(Ok(AppendEntriesResponse::PartialSuccess(upto)))) => {
                self.holds(vote, upto);
                Ok(AppendEntriesResponse::PartialSuccess(upto))
            }
            Ok(Response::Append(Ok(AppendEntriesResponse::Conflict))) => {
                match self.went_back(&vote, prev) {
                    Some(held) => {
                        let failed = self.tell_went_back(held, option).await;
                        Err(self.unreachable(failed))
                    }
                    None => Ok(AppendEntriesResponse::Conflict),
                }
            }
            Ok(Response::Append(r)) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            Ok(_) => unreachable!("exchange_on checks the kind"),
            Err(e) => Err(self.unreachable(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        // The last chunk taken: the member holds the log up to the snapshot.
        let whole = rpc.done.then_some((rpc.vote, rpc.meta.last_log_id));
        match self.call(&Request::Snapshot(rpc), option.hard_ttl()).await {
            Ok(Response::Snapshot(Ok(r))) => {
                if let Some((vote, upto)) = whole {
                    self.holds(vote, upto);
                }
                Ok(r)
            }
            Ok(Response::Snapshot(r)) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            Ok(_) => unreachable!("exchange_on checks the kind"),
            Err(e) => Err(self.unreachable(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        match self.call(&Request::Vote(rpc), option.hard_ttl()).await {
            Ok(Response::Vote(r)) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            Ok(_) => unreachable!("exchange_on checks the kind"),
            Err(e) => Err(self.unreachable(e)),
        }
    }

    /// After a member could not be reached: 50 ms, doubling up to 500 ms,
    /// so that a member back from a restart is caught up at once and one
    /// that stays away is dialed twice a second.
    fn backoff(&self) -> openraft::network::Backoff {
        let mut next = Duration::from_millis(50);
        openraft::network::Backoff::new(std::iter::from_fn(move || {
            let now = next;
            next = (next * 2).min(Duration::from_millis(500));
            Some(now)
        }))
    }
}

/// How many of `entries`, from the first, fit in `budget` bytes encoded
/// (at least one).
fn entries_that_fit(entries: &[crate::types::Entry], budget: usize) -> usize {
    let mut used = 0usize;
    let mut keep = 0;
    for entry in entries {
        let size = bincode::serialized_size(entry).map_or(usize::MAX, |n| n as usize);
        if keep > 0 && used.saturating_add(size) > budget {
            break;
        }
        used = used.saturating_add(size);
        keep += 1;
    }
    keep
}

/// Asks the member at `addr` (a peer address) for its status.
///
/// # Errors
/// The member could not be reached or did not answer within `limit`.
/// `advertised` is the member's own peer address (its certificate names that
/// host); `addr` is where to reach it, the same or a route to it.
pub async fn status_of(
    from: NodeId,
    addr: &str,
    advertised: &str,
    limit: Duration,
    tls: Option<&PeerTls>,
) -> Result<MemberStatus, String> {
    StatusLink::new(from, addr, advertised, tls)
        .ask(limit)
        .await
}

/// A connection for asking one member its status again and again, kept
/// between questions (and dropped with any question given up on).
pub struct StatusLink {
    peer: Peer,
}

impl StatusLink {
    /// A link from member `from` to the member at `addr` (its peer address,
    /// or a route to `advertised`); nothing is dialed yet.
    pub fn new(from: NodeId, addr: &str, advertised: &str, tls: Option<&PeerTls>) -> StatusLink {
        StatusLink {
            peer: Peer {
                from,
                target: 0,
                addr: addr.to_owned(),
                name: advertised.to_owned(),
                conn: None,
                idle: None,
                failures: None,
                tls: tls.cloned(),
                held: None,
            },
        }
    }

    /// The member's status.
    ///
    /// # Errors
    /// The member could not be reached or did not answer within `limit`.
    ///
    /// # Cancellation safety
    /// Safe: a question given up on takes its connection with it.
    pub async fn ask(&mut self, limit: Duration) -> Result<MemberStatus, String> {
        match self.peer.call(&Request::Status, limit).await {
            Ok(Response::Status(s)) => Ok(s),
            Ok(_) => unreachable!("exchange_on checks the kind"),
            Err(e) => Err(e.0),
        }
    }
}

/// Asks the member at `addr` (a peer address; the leader) to change the
/// membership.
///
/// # Errors
/// The member could not be reached, did not answer within `limit`, or
/// refused (it does not lead; the change failed), saying why.
pub async fn ask_change(
    addr: &str,
    change: crate::admin::Change,
    limit: Duration,
    tls: Option<&PeerTls>,
) -> Result<String, String> {
    match Peer::once(addr, 0, tls)
        .call(&Request::Change(change), limit)
        .await
    {
        Ok(Response::Changed(r)) => r,
        Ok(_) => unreachable!("exchange_on checks the kind"),
        Err(e) => Err(e.0),
    }
}

impl Peer {
    /// A peer for one call from outside the membership (an operator's
    /// tool, or the leader's word to a member being added) to `target` at
    /// `addr`.
    fn once(addr: &str, target: NodeId, tls: Option<&PeerTls>) -> Peer {
        Peer {
            from: 0,
            target,
            addr: addr.to_owned(),
            name: addr.to_owned(),
            conn: None,
            idle: None,
            failures: None,
            tls: tls.cloned(),
            held: None,
        }
    }
}

/// Tells member `id`, at peer address `addr`, that the membership at log
/// index `at` added it (see `joining`).
///
/// # Errors
/// It could not be reached, or did not take it.
pub async fn tell_added(
    addr: &str,
    id: NodeId,
    at: u64,
    limit: Duration,
    tls: Option<&PeerTls>,
) -> Result<(), String> {
    match Peer::once(addr, id, tls)
        .call(&Request::Added { id, at }, limit)
        .await
    {
        Ok(Response::Added(r)) => r,
        Ok(_) => unreachable!("exchange_on checks the kind"),
        Err(e) => Err(e.0),
    }
}

/// What a member's peer listener answers with.
#[derive(Clone)]
pub struct Answering {
    pub raft: Raft,
    pub tls: Option<PeerTls>,
    /// Where to reach members whose advertised address is not the way.
    pub routes: BTreeMap<NodeId, String>,
    /// While this member is being added.
    pub joining: Option<Arc<crate::joining::Joining>>,
    /// Set, with what to do, once a leader finds this member's log went
    /// back: the member stops.
    pub went_back: Arc<watch::Sender<Option<String>>>,
    /// How far each member said it holds the log, while this one leads.
    pub held: Held,
}

/// The leader says this member held the log up to `held` and now lacks
/// entries at or below it: if its log indeed ends before `held`, it stops.
fn went_back(answering: &Answering, held: LogId) -> Result<(), String> {
    let last = answering.raft.metrics().borrow().last_log_index;
    if last.is_some_and(|last| last >= held.index) {
        return Err(format!(
            "this member's log holds index {} (it ends at {})",
            held.index,
            last.unwrap_or_default()
        ));
    }
    let id = raft_id(&answering.raft);
    let why = format!(
        "this member's data went back: it had told the leader it held the log up to {held}, and its log now ends at {}. It was started from an old copy of its data directory (a backup or a disk snapshot put back), and entries the cluster acknowledged may rest on what it lost. It must not take part again as it is: remove it (baton cluster remove {id}), empty its data directory, start it with --join and add it again (baton cluster add {id} ...); see docs/operations.md",
        last.map_or("nothing".to_string(), |l| format!("index {l}"))
    );
    tracing::error!("{why}");
    answering.went_back.send_replace(Some(why));
    Ok(())
}

/// Answers other members on `listener` until `stop` is set.
pub async fn serve(listener: TcpListener, answering: Answering, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(answer(
                    stream,
                    peer.to_string(),
                    answering.clone(),
                    stop.clone(),
                ));
            }
            Err(e) => {
                debug!("peer accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn raft_id(raft: &Raft) -> NodeId {
    raft.metrics().borrow().id
}

/// Answers one member's connection.
async fn answer(
    stream: TcpStream,
    peer: String,
    answering: Answering,
    mut stop: watch::Receiver<bool>,
) {
    let raft = &answering.raft;
    let io: Box<dyn PeerIo> = match &answering.tls {
        None => Box::new(stream),
        Some(tls) => {
            let shake = tls.acceptor.accept(stream);
            match tokio::time::timeout(Duration::from_secs(5), shake).await {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(e)) => {
                    info!(%peer, "closing a peer connection: TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    info!(%peer, "closing a peer connection: no TLS handshake within 5 s");
                    return;
                }
            }
        }
    };
    let greeting = LengthDelimitedCodec::builder()
        .max_frame_length(MAX_HELLO_FRAME)
        .new_codec();
    let mut framed = Framed::new(io, greeting);
    let hello = match tokio::time::timeout(Duration::from_secs(5), framed.next()).await {
        Ok(Some(Ok(frame))) => bincode::deserialize::<Hello>(&frame).ok(),
        _ => None,
    };
    let Some(hello) = hello.filter(|h| h.magic == MAGIC) else {
        info!(%peer, "closing a peer connection that did not greet like a Baton member");
        return;
    };
    if hello.version != VERSION {
        info!(%peer, version = hello.version, "closing a peer connection of another protocol version");
        return;
    }
    framed.codec_mut().set_max_frame_length(MAX_FRAME);
    loop {
        let frame = tokio::select! {
            f = framed.next() => f,
            _ = stop.changed() => return,
        };
        let Some(Ok(frame)) = frame else { return };
        let Some((id, Ok(request))) =
            split_call(&frame).map(|(id, rest)| (id, bincode::deserialize::<Request>(rest)))
        else {
            info!(%peer, from = hello.from, "closing a peer connection: undecodable request");
            return;
        };
        let response = match request {
            Request::Append(r) => Response::Append(raft.append_entries(r).await),
            Request::Vote(r) => Response::Vote(raft.vote(r).await),
            Request::Snapshot(r) => Response::Snapshot(raft.install_snapshot(r).await),
            Request::Status => Response::Status(MemberStatus::of(raft)),
            Request::Change(change) => {
                Response::Changed(crate::admin::change(&answering, change).await)
            }
            Request::WentBack { held } => Response::WentBack(went_back(&answering, held)),
            Request::Added { id, at } => Response::Added(match &answering.joining {
                Some(joining) => joining.told(id, at),
                // Already in: a word repeated by a leader that retried.
                None if id == raft_id(raft) => Ok(()),
                None => Err(format!("this is member {}, not member {id}", raft_id(raft))),
            }),
        };
        let mut bytes = match encode_call(&response) {
            Ok(b) => b,
            Err(e) => {
                info!(%peer, "cannot encode an answer: {e}");
                return;
            }
        };
        bytes[..CALL_ID].copy_from_slice(&id.to_be_bytes());
        if framed.send(bytes.freeze()).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Change, Entry, LogId};
    use baton_server::state::{Command, Proposal};
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(index: u64, data: usize) -> Entry {
        Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(Change(vec![Proposal {
                now_ms: 1,
                origin: None,
                command: Command::SetData {
                    path: "/a".into(),
                    data: vec![7u8; data].into(),
                    version: None,
                    fence: None,
                },
            }])),
        }
    }

    /// `response` as the answer to `request` (a frame with its call id).
    fn answer_to(request: &[u8], response: &Response) -> bytes::Bytes {
        let (id, _) = split_call(request).expect("a call id");
        let mut answer = encode_call(response).unwrap();
        answer[..CALL_ID].copy_from_slice(&id.to_be_bytes());
        answer.freeze()
    }

    /// A stand-in member that answers every request with its status,
    /// counting connections; with `close_after_answer` it hangs up after
    /// each answer.
    async fn fake_member(
        close_after_answer: bool,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut framed = Framed::new(stream, codec());
                    let _hello = framed.next().await;
                    while let Some(Ok(request)) = framed.next().await {
                        let answer =
                            answer_to(&request, &Response::Status(MemberStatus::default()));
                        if framed.send(answer).await.is_err() || close_after_answer {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn ask(network: &mut Network, addr: &str) -> Result<Response, Failed> {
        let member = Member {
            peer: addr.to_owned(),
            client: String::new(),
        };
        let mut peer = network.new_client(2, &member).await;
        peer.call(&Request::Status, Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn short_lived_clients_share_one_connection() {
        let (addr, accepted) = fake_member(false).await;
        let mut network = Network::new(1, BTreeMap::new(), None);
        for _ in 0..20 {
            assert!(matches!(
                ask(&mut network, &addr).await,
                Ok(Response::Status(_))
            ));
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_idle_connection_the_other_side_closed_is_replaced() {
        let (addr, accepted) = fake_member(true).await;
        let mut network = Network::new(1, BTreeMap::new(), None);
        for _ in 0..5 {
            assert!(matches!(
                ask(&mut network, &addr).await,
                Ok(Response::Status(_))
            ));
        }
        // Each call after the first found its idle connection closed and
        // dialed again.
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
    }

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// What a member held counts only for appends sent with the same vote,
    /// never goes back, and is forgotten when the member is added again.
    #[test]
    fn how_far_a_member_held_the_log_counts_within_one_leadership() {
        let held = Held::default();
        let (term1, term2) = (Vote::new_committed(1, 1), Vote::new_committed(2, 1));
        held.record(2, term1, log_id(10));
        held.record(2, term1, log_id(7));
        assert_eq!(held.of(2, &term1), Some(log_id(10)));
        assert_eq!(held.of(3, &term1), None);
        assert_eq!(held.of(2, &term2), None);
        held.record(2, term2, log_id(4));
        assert_eq!(held.of(2, &term2), Some(log_id(4)));
        assert_eq!(held.of(2, &term1), None);
        held.forget(2);
        assert_eq!(held.of(2, &term2), None);
    }

    /// A stand-in member that answers its `n`th request (from 1, over all
    /// its connections) with a status whose id is `n` (or, to an append,
    /// with entries up to index `n` taken), after 300 ms for those in
    /// `slow`.
    async fn numbering_member(slow: &'static [u64]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let counter = Arc::new(AtomicU64::new(0));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut framed = Framed::new(stream, codec());
                    let _hello = framed.next().await;
                    while let Some(Ok(request)) = framed.next().await {
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        if slow.contains(&n) {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                        let response = match split_call(&request)
                            .and_then(|(_, r)| bincode::deserialize::<Request>(r).ok())
                        {
                            Some(Request::Append(_)) => Response::Append(Ok(
                                AppendEntriesResponse::PartialSuccess(Some(log_id(n))),
                            )),
                            _ => Response::Status(MemberStatus {
                                id: n,
                                ..MemberStatus::default()
                            }),
                        };
                        let answer = answer_to(&request, &response);
                        if framed.send(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// The number a [`numbering_member`] gave the request answered.
    fn numbered(answer: Result<Response, Failed>) -> u64 {
        match answer {
            Ok(Response::Status(s)) => s.id,
            Ok(_) => panic!("an answer of another kind"),
            Err(e) => panic!("no answer: {e}"),
        }
    }

    /// A status call that its caller gives up on (as openraft's own
    /// timeout does) after its request went out, before its answer came.
    async fn given_up(peer: &mut Peer) {
        let call = peer.call(&Request::Status, Duration::from_secs(5));
        let given_up = tokio::time::timeout(Duration::from_millis(100), call).await;
        assert!(given_up.is_err(), "the call should have been cut short");
    }

    #[tokio::test]
    async fn a_call_given_up_after_its_request_went_out_never_lends_its_answer_to_the_next() {
        // Requests 1 and 3 are answered late.
        let addr = numbering_member(&[1, 3]).await;
        let mut network = Network::new(1, BTreeMap::new(), None);
        let member = Member {
            peer: addr.clone(),
            client: String::new(),
        };
        let mut peer = network.new_client(2, &member).await;
        given_up(&mut peer).await;
        // The next call on the same client gets its own answer.
        let second = numbered(peer.call(&Request::Status, Duration::from_secs(5)).await);
        assert_eq!(second, 2, "the second call read another call's answer");
        // Its connection, clean, goes to the idle ones with the client; the
        // next client takes it and is given up on the same way.
        drop(peer);
        let mut peer = network.new_client(2, &member).await;
        given_up(&mut peer).await;
        drop(peer);
        // Nothing half read was left among the idle connections.
        let mut asked = Vec::new();
        for _ in 0..3 {
            let mut peer = network.new_client(2, &member).await;
            asked.push(numbered(
                peer.call(&Request::Status, Duration::from_secs(5)).await,
            ));
        }
        assert_eq!(
            asked,
            [4, 5, 6],
            "answers read by calls that did not ask for them"
        );
    }

    #[tokio::test]
    async fn an_append_given_up_by_openraft_is_not_answered_by_its_late_reply() {
        let addr = numbering_member(&[1]).await;
        let mut network = Network::new(1, BTreeMap::new(), None);
        let member = Member {
            peer: addr,
            client: String::new(),
        };
        let mut peer = network.new_client(2, &member).await;
        let append = || AppendEntriesRequest::<TypeConfig> {
            vote: openraft::Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: vec![entry(1, 10)],
        };
        // openraft wraps each call in a timeout of its own, as long as the
        // one it passes in, started earlier: here, a shorter one.
        let ttl = Duration::from_millis(200);
        let first = tokio::time::timeout(
            Duration::from_millis(100),
            peer.append_entries(append(), RPCOption::new(ttl)),
        )
        .await;
        assert!(
            first.is_err(),
            "the first append should have been cut short"
        );
        let second = peer
            .append_entries(append(), RPCOption::new(ttl))
            .await
            .expect("an answer");
        assert_eq!(
            second,
            AppendEntriesResponse::PartialSuccess(Some(log_id(2))),
            "the second append took the first one's answer"
        );
    }

    #[tokio::test]
    async fn an_answer_to_another_call_or_of_another_kind_ends_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut framed = Framed::new(stream, codec());
                    let _hello = framed.next().await;
                    while let Some(Ok(request)) = framed.next().await {
                        let answer = match n {
                            // An answer to a call never made.
                            0 => {
                                let mut a = encode_call(&Response::Status(MemberStatus::default()))
                                    .unwrap();
                                a[..CALL_ID].copy_from_slice(&u64::MAX.to_be_bytes());
                                a.freeze()
                            }
                            // An answer of another kind.
                            1 => answer_to(&request, &Response::Changed(Ok("done".into()))),
                            _ => answer_to(&request, &Response::Status(MemberStatus::default())),
                        };
                        if framed.send(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let mut network = Network::new(1, BTreeMap::new(), None);
        for expected in ["call", "Change answer"] {
            let e = ask(&mut network, &addr).await.err().expect("refused");
            assert!(e.0.contains(expected), "{e}");
        }
        assert!(matches!(
            ask(&mut network, &addr).await,
            Ok(Response::Status(_))
        ));
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            3,
            "each refused answer ended its connection"
        );
    }

    #[test]
    fn entries_are_sent_as_many_as_fit_and_never_none() {
        let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1000)).collect();
        let one = bincode::serialized_size(&entries[0]).unwrap() as usize;
        assert_eq!(entries_that_fit(&entries, 10 * one), 10);
        assert_eq!(entries_that_fit(&entries, 3 * one + one / 2), 3);
        // One entry larger than the budget still goes, alone.
        assert_eq!(entries_that_fit(&entries, one / 2), 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Whatever bytes come as a frame, reading them as a greeting, a
        /// request or an answer is an error or a value, never a panic.
        #[test]
        fn arbitrary_frames_never_panic_the_decoders(frame in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = bincode::deserialize::<Hello>(&frame);
            if let Some((_, rest)) = split_call(&frame) {
                let _ = bincode::deserialize::<Request>(rest);
                let _ = bincode::deserialize::<Response>(rest);
            }
        }

        /// A real append request with one byte changed or the frame cut
        /// short: still no panic.
        #[test]
        fn a_damaged_append_never_panics_the_decoder(at in proptest::prelude::any::<usize>(), flip in 1u8..=255, cut in proptest::prelude::any::<bool>()) {
            let request = Request::Append(AppendEntriesRequest::<TypeConfig> {
                vote: openraft::Vote::new_committed(3, 2),
                prev_log_id: Some(log_id(4)),
                leader_commit: Some(log_id(4)),
                entries: vec![entry(5, 20), entry(6, 3)],
            });
            let mut frame = encode_call(&request).unwrap().to_vec();
            let at = at % frame.len();
            if cut {
                frame.truncate(at);
            } else {
                frame[at] ^= flip;
            }
            if let Some((_, rest)) = split_call(&frame) {
                let _ = bincode::deserialize::<Request>(rest);
            }
        }
    }
}
