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
//! failure; every call has the deadline openraft gives it, and a member that
//! cannot be reached or does not answer in time is reported unreachable, so
//! that openraft backs off before trying again.

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
}

impl Network {
    pub fn new(id: NodeId, routes: BTreeMap<NodeId, String>) -> Network {
        Network {
            id,
            routes: Arc::new(routes),
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
            conn: None,
            failures: Some(0),
        }
    }
}

/// One connection to one other member, dialed when needed.
pub struct Peer {
    from: NodeId,
    target: NodeId,
    addr: String,
    conn: Option<Framed<TcpStream, LengthDelimitedCodec>>,
    /// Calls failed in a row, for the replicated log's own connections
    /// (`None` for an operator's one-off question): the first failure and
    /// the recovery are logged, not every retry.
    failures: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(String);

impl Peer {
    async fn dial(&mut self) -> Result<&mut Framed<TcpStream, LengthDelimitedCodec>, Failed> {
        if self.conn.is_none() {
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
            let mut framed = Framed::new(stream, codec());
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
        let addr = self.addr.clone();
        let result = tokio::time::timeout(limit, async {
            let conn = self.dial().await?;
            conn.send(bytes::Bytes::from(bytes))
                .await
                .map_err(|e| Failed(format!("sending to {addr}: {e}")))?;
            let frame = conn
                .next()
                .await
                .ok_or_else(|| Failed(format!("{addr} closed the connection")))?
                .map_err(|e| Failed(format!("reading from {addr}: {e}")))?;
            bincode::deserialize(&frame).map_err(|e| Failed(format!("bad answer from {addr}: {e}")))
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
        match self.call(&Request::Append(rpc), option.hard_ttl()).await {
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

/// Asks the member at `addr` (a peer address) for its status.
///
/// # Errors
/// The member could not be reached or did not answer within `limit`.
pub async fn status_of(from: NodeId, addr: &str, limit: Duration) -> Result<MemberStatus, String> {
    let mut peer = Peer {
        from,
        target: 0,
        addr: addr.to_owned(),
        conn: None,
        failures: None,
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
) -> Result<String, String> {
    let mut peer = Peer {
        from: 0,
        target: 0,
        addr: addr.to_owned(),
        conn: None,
        failures: None,
    };
    match peer.call(&Request::Change(change), limit).await {
        Ok(Response::Changed(r)) => r,
        Ok(_) => Err("an answer of the wrong kind".into()),
        Err(e) => Err(e.0),
    }
}

/// Answers other members on `listener` until `stop` is set.
pub async fn serve(listener: TcpListener, raft: Raft, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(answer(stream, peer.to_string(), raft.clone(), stop.clone()));
            }
            Err(e) => {
                debug!("peer accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Answers one member's connection.
async fn answer(stream: TcpStream, peer: String, raft: Raft, mut stop: watch::Receiver<bool>) {
    let mut framed = Framed::new(stream, codec());
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
