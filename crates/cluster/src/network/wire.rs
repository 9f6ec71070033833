//! The messages members exchange, and how each is framed (the format is in
//! the module above).

use std::sync::atomic::AtomicU64;

use bytes::BufMut;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio_util::codec::LengthDelimitedCodec;

use crate::types::{LogId, Member, NodeId, Raft, TypeConfig};

pub(super) const MAGIC: [u8; 8] = *b"BATNPEER";
pub(super) const VERSION: u16 = 8;
/// Largest frame between members: a batch of entries (each at most the
/// largest node data) or a snapshot chunk.
pub(super) const MAX_FRAME: usize = 256 << 20;
/// Largest first frame a member takes from whoever connects: the greeting
/// is a few bytes, and until it has come nobody is trusted with room for a
/// large frame.
pub(super) const MAX_HELLO_FRAME: usize = 64;

/// The id of the next call this process makes to any member; its answer
/// must echo it.
pub(super) static NEXT_CALL: AtomicU64 = AtomicU64::new(1);
/// Bytes of the call id in front of every request and answer.
pub(super) const CALL_ID: usize = 8;

pub(super) fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME)
        .new_codec()
}

#[derive(Serialize, Deserialize)]
pub(super) struct Hello {
    pub(super) magic: [u8; 8],
    pub(super) version: u16,
    pub(super) from: NodeId,
}

#[derive(Serialize, Deserialize)]
pub(super) enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    Status,
    Change(Change),
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
    /// From a follower that serves clients to its leader: propose these
    /// changes (in order), the follower heard from these sessions, and, if
    /// `confirm`, prove leadership and give the read's log index.
    /// `applied` is how far the follower had applied when it sent them (the
    /// sessions it serves were opened by entries up to there).
    Serve {
        change: crate::types::Change,
        heard: Vec<u64>,
        confirm: bool,
        applied: Option<u64>,
    },
}

#[derive(Serialize, Deserialize)]
pub(super) enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Status(MemberStatus),
    Changed(Result<String, String>),
    Added(Result<(), String>),
    WentBack(Result<(), String>),
    /// What the leader made of it, or why it refused all of it (it does
    /// not lead).
    Served(Result<Served, String>),
}

/// Which request a call makes, and so which answer it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Append,
    Vote,
    Snapshot,
    Status,
    Change,
    Added,
    WentBack,
    Serve,
}

impl Request {
    pub(super) fn kind(&self) -> Kind {
        match self {
            Request::Append(_) => Kind::Append,
            Request::Vote(_) => Kind::Vote,
            Request::Snapshot(_) => Kind::Snapshot,
            Request::Status => Kind::Status,
            Request::Change(_) => Kind::Change,
            Request::Added { .. } => Kind::Added,
            Request::WentBack { .. } => Kind::WentBack,
            Request::Serve { .. } => Kind::Serve,
        }
    }
}

impl Response {
    pub(super) fn kind(&self) -> Kind {
        match self {
            Response::Append(_) => Kind::Append,
            Response::Vote(_) => Kind::Vote,
            Response::Snapshot(_) => Kind::Snapshot,
            Response::Status(_) => Kind::Status,
            Response::Changed(_) => Kind::Change,
            Response::Added(_) => Kind::Added,
            Response::WentBack(_) => Kind::WentBack,
            Response::Served(_) => Kind::Serve,
        }
    }
}

/// `message` encoded behind room for its call id.
pub(super) fn encode_call<T: Serialize>(message: &T) -> bincode::Result<bytes::BytesMut> {
    let size = bincode::serialized_size(message)? as usize;
    let mut buf = bytes::BytesMut::with_capacity(CALL_ID + size);
    buf.extend_from_slice(&[0; CALL_ID]);
    bincode::serialize_into((&mut buf).writer(), message)?;
    Ok(buf)
}

/// A frame's call id and the rest.
pub(super) fn split_call(frame: &[u8]) -> Option<(u64, &[u8])> {
    let (id, rest) = frame.split_first_chunk::<CALL_ID>()?;
    Some((u64::from_be_bytes(*id), rest))
}

/// A leader's answer to a follower that serves clients.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// If a confirmation was asked for, the log index of the leader's
    /// read: its commit index when it proved it leads, which it has
    /// applied since. A follower that has applied as far sees every change
    /// committed before the confirmation began.
    pub read_index: Option<u64>,
    /// Sessions whose changes it refused (not proposed): ended, expiring,
    /// or not yet opened as far as the leader has applied.
    pub refused: Vec<u64>,
    /// Sessions the follower heard from that the leader could not count as
    /// heard (expiring or ended): their barriers fail, so that nothing
    /// answered there shows them alive.
    pub unheard: Vec<u64>,
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

/// A change of membership, asked of the leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// Add this member: as a learner, then, once it has caught up, as a
    /// voter; or, with `observer`, leave it a learner for good: it serves
    /// clients but never votes. Asked of a member already in the cluster,
    /// it makes an observer a voter, or (with `observer`) a voter an
    /// observer.
    Add {
        id: NodeId,
        member: Member,
        observer: bool,
    },
    /// Remove this member (a voter or an observer) from the cluster.
    Remove { id: NodeId },
}
