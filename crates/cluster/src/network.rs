//! The replicated log's traffic between members, over Baton's own framed
//! TCP on each member's peer port.
//!
//! # Format
//! ```text
//! every frame: length u32 (big-endian), then that many bytes of bincode
//! a connection opens with Hello { magic "BATNPEER", version 1, from: id }
//! then the dialing member sends requests and the other answers each, in
//! order, on the same connection:
//!   Append(AppendEntriesRequest)   -> Append(Result<AppendEntriesResponse>)
//!   Vote(VoteRequest)              -> Vote(Result<VoteResponse>)
//!   Snapshot(InstallSnapshotRequest, one chunk)
//!                                  -> Snapshot(Result<InstallSnapshotResponse>)
//!   Status                         -> Status(MemberStatus)
//!   Change(add or remove a member) -> Changed(Result<message, error>)
//!                                     (asked of the leader, by an operator)
//! ```
//! A member dials another when it first needs to and again after any
//! failure; connections of short-lived clients are kept for the next ones.
//! Every call has the deadline openraft gives it, and a member that cannot
//! be reached or does not answer in time is reported unreachable, so that
//! openraft backs off before trying again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

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

use crate::types::{Member, NodeId, Raft, TypeConfig};

const MAGIC: [u8; 8] = *b"BATNPEER";
const VERSION: u16 = 1;
/// Largest frame between members: a batch of entries (each at most the
/// largest node data) or a snapshot chunk.
const MAX_FRAME: usize = 256 << 20;
/// How long a dial may take before the member counts as unreachable.
const DIAL_TIMEOUT: Duration = Duration::from_millis(500);

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
}

#[derive(Serialize, Deserialize)]
enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Status(MemberStatus),
    Changed(Result<String, String>),
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
}

impl Network {
    pub fn new(id: NodeId, routes: BTreeMap<NodeId, String>, tls: Option<PeerTls>) -> Network {
        Network {
            id,
            routes: Arc::new(routes),
            idle: Idle::default(),
            tls,
        }
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
            reused: false,
            idle: Some(self.idle.clone()),
            failures: Some(0),
            tls: self.tls.clone(),
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
    conn: Option<Conn>,
    /// Whether `conn` was taken from the idle ones (and may have been
    /// closed by the other side meanwhile).
    reused: bool,
    idle: Option<Idle>,
    /// Calls failed in a row, for the replicated log's own connections
    /// (`None` for an operator's one-off question): the first failure and
    /// the recovery are logged, not every retry.
    failures: Option<u32>,
    /// Mutual TLS with the other members, if they use it.
    tls: Option<PeerTls>,
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
    /// The connection, dialed if there is none (or taken from the idle
    /// ones, if `idle_ok`).
    async fn dial(&mut self, idle_ok: bool) -> Result<&mut Conn, Failed> {
        if self.conn.is_none() {
            let idle = self.idle.as_ref().filter(|_| idle_ok);
            if let Some(conn) = idle.and_then(|idle| idle.take(&self.addr)) {
                self.conn = Some(conn);
                self.reused = true;
                return Ok(self.conn.as_mut().expect("taken above"));
            }
            self.reused = false;
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
                        .map_err(|e| {
                            Failed(format!("TLS handshake with {} failed: {e}", self.addr))
                        })?;
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
            self.conn = Some(framed);
        }
        Ok(self.conn.as_mut().expect("dialed above"))
    }

    /// One call: the request out, its response back, within `limit`.
    async fn call(&mut self, request: &Request, limit: Duration) -> Result<Response, Failed> {
        let bytes = bincode::serialize(request).map_err(|e| Failed(e.to_string()))?;
        self.call_bytes(bytes::Bytes::from(bytes), limit).await
    }

    /// One call of a request already encoded. A connection taken from the
    /// idle ones that turns out broken is replaced by a fresh one, once:
    /// every request between members may be made twice.
    async fn call_bytes(
        &mut self,
        bytes: bytes::Bytes,
        limit: Duration,
    ) -> Result<Response, Failed> {
        let addr = self.addr.clone();
        let result = tokio::time::timeout(limit, async {
            loop {
                let conn = self.dial(true).await?;
                let exchanged = async {
                    conn.send(bytes.clone())
                        .await
                        .map_err(|e| Failed(format!("sending to {addr}: {e}")))?;
                    conn.next()
                        .await
                        .ok_or_else(|| Failed(format!("{addr} closed the connection")))?
                        .map_err(|e| Failed(format!("reading from {addr}: {e}")))
                }
                .await;
                match exchanged {
                    Ok(frame) => {
                        return bincode::deserialize(&frame)
                            .map_err(|e| Failed(format!("bad answer from {addr}: {e}")))
                    }
                    Err(_) if self.reused => {
                        // Not from the idle ones again: a fresh dial.
                        self.conn = None;
                        self.dial(false).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(Failed(format!("no answer from {addr} within {limit:?}"))),
        };
        if result.is_err() {
            self.conn = None;
        }
        if let Some(failures) = self.failures.as_mut() {
            match &result {
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
                        "member {} is reachable again, after {} failed calls",
                        self.target,
                        *failures
                    );
                    *failures = 0;
                }
                Ok(_) => {}
            }
        }
        result
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
        let mut partial = None;
        let request = Request::Append(rpc);
        let mut bytes = bincode::serialize(&request)
            .map_err(|e| RPCError::Network(NetworkError::new(&Failed(e.to_string()))))?;
        let Request::Append(mut rpc) = request else {
            unreachable!("made above")
        };
        if bytes.len() > MAX_FRAME && rpc.entries.len() > 1 {
            let keep = entries_that_fit(&rpc.entries, MAX_FRAME - 64 * 1024);
            rpc.entries.truncate(keep);
            partial = rpc.entries.last().map(|e| e.log_id);
            bytes = bincode::serialize(&Request::Append(rpc))
                .map_err(|e| RPCError::Network(NetworkError::new(&Failed(e.to_string()))))?;
        }
        match self.call_bytes(bytes.into(), option.hard_ttl()).await {
            Ok(Response::Append(Ok(AppendEntriesResponse::Success))) if partial.is_some() => {
                Ok(AppendEntriesResponse::PartialSuccess(partial))
            }
            Ok(Response::Append(r)) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            Ok(_) => Err(RPCError::Network(NetworkError::new(&Failed(
                "an answer of the wrong kind".into(),
            )))),
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
        match self.call(&Request::Snapshot(rpc), option.hard_ttl()).await {
            Ok(Response::Snapshot(r)) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            Ok(_) => Err(RPCError::Network(NetworkError::new(&Failed(
                "an answer of the wrong kind".into(),
            )))),
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
            Ok(_) => Err(RPCError::Network(NetworkError::new(&Failed(
                "an answer of the wrong kind".into(),
            )))),
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
    let mut peer = Peer {
        from,
        target: 0,
        addr: addr.to_owned(),
        name: advertised.to_owned(),
        conn: None,
        reused: false,
        idle: None,
        failures: None,
        tls: tls.cloned(),
    };
    match peer.call(&Request::Status, limit).await {
        Ok(Response::Status(s)) => Ok(s),
        Ok(_) => Err("an answer of the wrong kind".into()),
        Err(e) => Err(e.0),
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
    let mut peer = Peer {
        from: 0,
        target: 0,
        addr: addr.to_owned(),
        name: addr.to_owned(),
        conn: None,
        reused: false,
        idle: None,
        failures: None,
        tls: tls.cloned(),
    };
    match peer.call(&Request::Change(change), limit).await {
        Ok(Response::Changed(r)) => r,
        Ok(_) => Err("an answer of the wrong kind".into()),
        Err(e) => Err(e.0),
    }
}

/// Answers other members on `listener` until `stop` is set.
pub async fn serve(
    listener: TcpListener,
    raft: Raft,
    mut stop: watch::Receiver<bool>,
    tls: Option<PeerTls>,
) {
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
                    raft.clone(),
                    stop.clone(),
                    tls.clone(),
                ));
            }
            Err(e) => {
                debug!("peer accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Answers one member's connection.
async fn answer(
    stream: TcpStream,
    peer: String,
    raft: Raft,
    mut stop: watch::Receiver<bool>,
    tls: Option<PeerTls>,
) {
    let io: Box<dyn PeerIo> = match tls {
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
    let mut framed = Framed::new(io, codec());
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
    loop {
        let frame = tokio::select! {
            f = framed.next() => f,
            _ = stop.changed() => return,
        };
        let Some(Ok(frame)) = frame else { return };
        let Ok(request) = bincode::deserialize::<Request>(&frame) else {
            info!(%peer, from = hello.from, "closing a peer connection: undecodable request");
            return;
        };
        let response = match request {
            Request::Append(r) => Response::Append(raft.append_entries(r).await),
            Request::Vote(r) => Response::Vote(raft.vote(r).await),
            Request::Snapshot(r) => Response::Snapshot(raft.install_snapshot(r).await),
            Request::Status => Response::Status(MemberStatus::of(&raft)),
            Request::Change(change) => Response::Changed(crate::admin::change(&raft, change).await),
        };
        let bytes = match bincode::serialize(&response) {
            Ok(b) => b,
            Err(e) => {
                info!(%peer, "cannot encode an answer: {e}");
                return;
            }
        };
        if framed.send(bytes::Bytes::from(bytes)).await.is_err() {
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
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
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
                    while let Some(Ok(_request)) = framed.next().await {
                        let answer =
                            bincode::serialize(&Response::Status(MemberStatus::default())).unwrap();
                        if framed.send(bytes::Bytes::from(answer)).await.is_err()
                            || close_after_answer
                        {
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

    #[test]
    fn entries_are_sent_as_many_as_fit_and_never_none() {
        let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1000)).collect();
        let one = bincode::serialized_size(&entries[0]).unwrap() as usize;
        assert_eq!(entries_that_fit(&entries, 10 * one), 10);
        assert_eq!(entries_that_fit(&entries, 3 * one + one / 2), 3);
        // One entry larger than the budget still goes, alone.
        assert_eq!(entries_that_fit(&entries, one / 2), 1);
    }
}
