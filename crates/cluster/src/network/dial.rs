//! Dialing other members: openraft's network (one [`Peer`] per member it
//! calls), kept connections, and the calls an operator's command or a
//! leader makes (status, membership changes).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
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
use tokio::net::TcpStream;
use tokio_util::codec::Framed;
use tracing::{debug, info, warn};

use crate::types::{LogId, Member, NodeId, TypeConfig, Vote};

use super::tls::{server_name, Conn, PeerIo, PeerTls};
use super::wire::*;

/// How long a dial may take before the member counts as unreachable.
pub(super) const DIAL_TIMEOUT: Duration = Duration::from_millis(500);

/// Why an exchange failed: the connection broke (worth one more try on a
/// fresh one, if it was an idle one), or the other side answered with
/// something that was not the answer asked for.
pub(super) enum Broken {
    Io(Failed),
    Protocol(Failed),
}

/// Writes request `id` (encoded in `body`) on `conn` and reads its answer,
/// which must echo `id` and be of `kind`. On any error `conn` is in an
/// unknown state: the caller drops it.
pub(super) async fn exchange_on(
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

/// Dials other members; a member reached at another address than its
/// advertised one (through a tunnel or a proxy) has a route.
#[derive(Clone)]
pub struct Network {
    pub(super) id: NodeId,
    pub(super) routes: Arc<BTreeMap<NodeId, String>>,
    pub(super) idle: Idle,
    pub(super) tls: Option<PeerTls>,
    pub(super) held: Held,
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
    pub(super) fn record(&self, target: NodeId, vote: Vote, upto: LogId) {
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
    pub(super) fn of(&self, target: NodeId, vote: &Vote) -> Option<LogId> {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&target)
            .filter(|(v, _)| v == vote)
            .map(|(_, at)| *at)
    }
}

/// Connections left open by the short-lived clients openraft makes for
/// every read barrier and election, for the next ones to use: dialing
/// afresh each time would cost a connection per round and leave a socket
/// waiting out TIME_WAIT for each.
#[derive(Clone, Default)]
pub(super) struct Idle(Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<Conn>>>>);

/// Idle connections kept per member address, at most.
pub(super) const IDLE_PER_MEMBER: usize = 4;

impl Idle {
    pub(super) fn take(&self, addr: &str) -> Option<Conn> {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(addr)?.pop()
    }

    pub(super) fn put(&self, addr: &str, conn: Conn) {
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
    pub(super) from: NodeId,
    pub(super) target: NodeId,
    pub(super) addr: String,
    /// The member's advertised peer address, whose host its certificate
    /// must name (`addr` may be a route to it: a tunnel, a proxy).
    pub(super) name: String,
    /// The client's connection while no call is using it: a call takes it
    /// and puts it back only after a whole exchange.
    pub(super) conn: Option<Conn>,
    pub(super) idle: Option<Idle>,
    /// Calls failed in a row, for the replicated log's own connections
    /// (`None` for an operator's one-off question): the first failure and
    /// the recovery are logged, not every retry.
    pub(super) failures: Option<u32>,
    /// Mutual TLS with the other members, if they use it.
    pub(super) tls: Option<PeerTls>,
    /// How far each member said it holds the log (the replicated log's own
    /// clients only).
    pub(super) held: Option<Held>,
}

/// Why a call to another member got no answer: it could not be reached,
/// did not answer in time, or answered with something else.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Failed(pub(super) String);

/// Why a member did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No answer came (see [`Failed`]).
    #[error(transparent)]
    Failed(#[from] Failed),
    /// The member answered that it would not, saying why.
    #[error("{0}")]
    Refused(String),
}

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
    pub(super) async fn connection(&mut self, idle_ok: bool) -> Result<(Conn, bool), Failed> {
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
    pub(super) async fn dial(&self) -> Result<Conn, Failed> {
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
                let name = server_name(&self.name).map_err(|e| Failed(e.to_string()))?;
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
    pub(super) async fn call(
        &mut self,
        request: &Request,
        limit: Duration,
    ) -> Result<Response, Failed> {
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
    pub(super) async fn call_bytes(
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
    pub(super) async fn exchange(
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
    pub(super) fn note(&mut self, result: &Result<Response, Failed>) {
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
    pub(super) fn holds(&self, vote: Vote, upto: Option<LogId>) {
        if let (Some(held), Some(upto)) = (&self.held, upto) {
            held.record(self.target, vote, upto);
        }
    }

    /// Whether the member, answering that it lacks the entry at `prev`,
    /// lost entries it said it held in answers to appends sent with
    /// `vote`: how far it said it held them, if so.
    pub(super) fn went_back(&self, vote: &Vote, prev: Option<LogId>) -> Option<LogId> {
        let held = self.held.as_ref()?.of(self.target, vote)?;
        (prev?.index <= held.index).then_some(held)
    }

    /// Tells the member that its log lost entries it held up to `held`;
    /// what the leader makes of the member meanwhile (unreachable).
    pub(super) async fn tell_went_back(&mut self, held: LogId, option: RPCOption) -> Failed {
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

    pub(super) fn unreachable<E: std::error::Error>(
        &self,
        e: Failed,
    ) -> RPCError<NodeId, Member, E> {
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
pub(super) fn entries_that_fit(entries: &[crate::types::Entry], budget: usize) -> usize {
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
) -> Result<MemberStatus, Failed> {
    StatusLink::new(from, addr, advertised, tls)
        .ask(limit)
        .await
}

/// A connection for asking one member its status again and again, kept
/// between questions (and dropped with any question given up on).
pub struct StatusLink {
    pub(super) peer: Peer,
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
    pub async fn ask(&mut self, limit: Duration) -> Result<MemberStatus, Failed> {
        match self.peer.call(&Request::Status, limit).await? {
            Response::Status(s) => Ok(s),
            _ => unreachable!("exchange_on checks the kind"),
        }
    }
}

/// A follower's connection to its leader, for the clients the follower
/// serves: one call at a time, so the changes it forwards reach the
/// leader in the order they were made.
pub struct LeaderLink {
    peer: Peer,
}

impl LeaderLink {
    /// A link from member `from` to member `target`, reached at `addr` (its
    /// peer address, or a route to `advertised`); nothing is dialed yet.
    pub fn new(
        from: NodeId,
        target: NodeId,
        addr: &str,
        advertised: &str,
        tls: Option<&PeerTls>,
    ) -> LeaderLink {
        LeaderLink {
            peer: Peer {
                from,
                target,
                addr: addr.to_owned(),
                name: advertised.to_owned(),
                conn: None,
                idle: None,
                failures: Some(0),
                tls: tls.cloned(),
                held: None,
            },
        }
    }

    /// The member this link reaches.
    pub fn target(&self) -> NodeId {
        self.peer.target
    }

    /// Hands the leader `change` to propose and the sessions `heard` from,
    /// and, if `confirm`, has it prove it leads: the log index it had
    /// applied then, and the sessions whose changes it refused. `applied` is
    /// how far this member had applied. `Ok(Err)` is the leader's refusal
    /// of the whole call.
    ///
    /// # Errors
    /// The leader could not be reached or did not answer within `limit`.
    ///
    /// # Cancellation safety
    /// Safe: a call given up on takes its connection with it.
    pub async fn serve(
        &mut self,
        change: crate::types::Change,
        heard: Vec<u64>,
        confirm: bool,
        applied: Option<u64>,
        limit: Duration,
    ) -> Result<Result<Served, String>, Failed> {
        let request = Request::Serve {
            change,
            heard,
            confirm,
            applied,
        };
        match self.peer.call(&request, limit).await? {
            Response::Served(r) => Ok(r),
            _ => unreachable!("exchange_on checks the kind"),
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
    change: Change,
    limit: Duration,
    tls: Option<&PeerTls>,
) -> Result<String, CallError> {
    match Peer::once(addr, 0, tls)
        .call(&Request::Change(change), limit)
        .await?
    {
        Response::Changed(r) => r.map_err(CallError::Refused),
        _ => unreachable!("exchange_on checks the kind"),
    }
}

impl Peer {
    /// A peer for one call from outside the membership (an operator's
    /// tool, or the leader's word to a member being added) to `target` at
    /// `addr`.
    pub(super) fn once(addr: &str, target: NodeId, tls: Option<&PeerTls>) -> Peer {
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
) -> Result<(), CallError> {
    match Peer::once(addr, id, tls)
        .call(&Request::Added { id, at }, limit)
        .await?
    {
        Response::Added(r) => r.map_err(CallError::Refused),
        _ => unreachable!("exchange_on checks the kind"),
    }
}
