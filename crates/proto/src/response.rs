//! What the server sends after the handshake: replies, watch events, and the
//! notice that comes before the server closes a connection.
//!
//! # Format
//! ```text
//! every server frame after the handshake starts with a kind byte:
//!
//! 1 reply        xid u32, op u8, revision u64, status u16, then
//!                  status 0:  the op's reply body (below)
//!                  otherwise: message str (the status is an error code)
//!                revision: the server's revision when it answered (for a
//!                change, the change's own revision); every change the reply
//!                reflects has a revision at most this
//! 2 event        event u8, revision u64, path str
//!                  event: 1 created, 2 deleted, 3 data changed,
//!                         4 children changed, 5 head (a queue watch's
//!                         node has no predecessor left)
//! 3 disconnect   code u16, message str; the last frame before the server
//!                closes the connection. The code says why: the session
//!                expired (session expired), was resumed on another connection
//!                (session moved), the server is stopping (shutting down), a
//!                cluster member stopped leading (not leader: the message is
//!                the new leader's client address), or the client broke the
//!                protocol (frame too large, malformed request). Only
//!                "session expired" means the session is gone;
//!                otherwise the client may resume it on a new connection.
//!
//! reply bodies by op:
//! 1 create        path str, sequence opt64, stat
//! 2 delete        (empty)
//! 3 exists        present u8, then stat if present is 1
//! 4 get data      stat, data bytes
//! 5 get children  stat, count u32, then count names (str), sorted
//! 6 set data      stat
//! 7 ping          (empty)
//! 8 close session (empty)
//! 9 set watches   (empty)
//! 10 predecessor  present u8, then if 1: path str (the predecessor's full
//!                 path), stat
//! 11 check token  present u8, then if 1: path str (the node's full path),
//!                 stat
//! 12 stats        count u32, then count of: name str, value u64
//! 13 remove watches (empty)
//! 14 enqueue      path str (the created node), sequence u64, stat,
//!                 present u8, then if 1: the predecessor's path str, stat
//! 16 multi        committed u8, then
//!                   1: count u16, then count results (see [`crate::txn`]),
//!                      one per operation, in order
//!                   0: index u16 (the operation that failed, from 0),
//!                      code u16, message str; no operation was applied
//! 15 session status liveness u8 (0 gone: no such session; 1 connected;
//!                 2 disconnected: alive, without a connection, until its
//!                 timeout runs out; 3 expiring: its expiry is on its way),
//!                 silent_ms u64 (since the server last heard from it),
//!                 timeout_ms u32 (0 when gone)
//!
//! stat, 64 bytes:
//!   czxid u64  mzxid u64  pzxid u64  ctime u64  mtime u64
//!   version u32  cversion u32  ephemeral_owner u64
//!   data_length u32  num_children u32
//! opt64 = u8 0 (absent) | u8 1 + u64
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, ErrorCode};
use crate::frame::encode_frame;
use crate::request::OpCode;
pub use crate::stat::Stat;
use crate::txn::TxnResult;
use crate::wire::{put_bool, put_bytes32, put_opt_u64, put_str16, Reader};

const KIND_REPLY: u8 = 1;
const KIND_EVENT: u8 = 2;
const KIND_DISCONNECT: u8 = 3;

/// Whether a session is alive, as the server that serves clients sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Liveness {
    /// No such session: it expired, was closed, or never was.
    Gone,
    /// Attached to a connection.
    Connected,
    /// Alive without a connection: its client may still resume it until
    /// its timeout runs out.
    Disconnected,
    /// Silent for its whole timeout: its expiry is on its way.
    Expiring,
}

impl Liveness {
    fn to_u8(self) -> u8 {
        match self {
            Liveness::Gone => 0,
            Liveness::Connected => 1,
            Liveness::Disconnected => 2,
            Liveness::Expiring => 3,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Liveness::Gone,
            1 => Liveness::Connected,
            2 => Liveness::Disconnected,
            3 => Liveness::Expiring,
            _ => return None,
        })
    }
}

/// A session's liveness, with how long it has been silent and its
/// timeout: a session not heard from again expires `timeout_ms -
/// silent_ms` from when the answer was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionStatus {
    pub liveness: Liveness,
    pub silent_ms: u64,
    pub timeout_ms: u32,
}

impl SessionStatus {
    /// How long until the session expires unless it is heard from; `None`
    /// if it is gone.
    pub fn expires_in(&self) -> Option<std::time::Duration> {
        (self.liveness != Liveness::Gone).then(|| {
            std::time::Duration::from_millis(
                u64::from(self.timeout_ms).saturating_sub(self.silent_ms),
            )
        })
    }
}

/// A successful reply's body, one variant per operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Create {
        /// The node's actual path (with the suffix, for sequential nodes).
        path: String,
        /// The sequence number, for sequential nodes.
        sequence: Option<u64>,
        stat: Stat,
    },
    Delete,
    Exists(Option<Stat>),
    GetData {
        stat: Stat,
        data: Bytes,
    },
    GetChildren {
        stat: Stat,
        children: Vec<String>,
    },
    SetData(Stat),
    Ping,
    /// The member caught up (see [`Request::Sync`](crate::Request::Sync));
    /// the reply's revision is how far it had applied.
    Sync,
    CloseSession,
    SetWatches,
    /// The sibling created just before the node, if any.
    Predecessor(Option<(String, Stat)>),
    /// The node holding the token, if it still exists.
    CheckToken(Option<(String, Stat)>),
    /// Named counters.
    Stats(Vec<(String, u64)>),
    RemoveWatches,
    AddWatch,
    LockDelay,
    /// A node's access control list was replaced: its stat, and its ACL
    /// version (the number of times its list was set).
    SetAcl {
        stat: Stat,
        aversion: u32,
    },
    /// The node created in the queue, and the member it waits on under
    /// its queue's rule (for an exclusive queue, the node just before it),
    /// none once it heads the queue: the server's decision, which the client
    /// reads ([`Reply::heads_queue`]).
    Enqueue {
        path: String,
        sequence: u64,
        stat: Stat,
        predecessor: Option<(String, Stat)>,
    },
    SessionStatus(SessionStatus),
    /// A transaction's answer: one result per operation, or the operation
    /// that failed (and nothing was applied).
    Multi(Result<Vec<TxnResult>, TxnFailure>),
}

/// Whether an answer shows that its session was alive after the request
/// was sent: a success, or a refusal that says so
/// ([`ErrorCode::shows_session_alive`]). A transaction that failed is
/// judged by its failing operation's code: refused on its form (too many
/// operations, too much data, a right missing) it was answered at once,
/// even by a member that no longer leads, and shows nothing.
pub fn shows_session_alive(result: &Result<Reply, ErrorReply>) -> bool {
    match result {
        Ok(Reply::Multi(Err(failure))) => failure.error.code.shows_session_alive(),
        Ok(_) => true,
        Err(e) => e.code.shows_session_alive(),
    }
}

/// Why a transaction changed nothing: the operation that failed (its index,
/// from 0) and its error. The operations before it were rolled back, those
/// after it never tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnFailure {
    pub index: u32,
    pub error: ErrorReply,
}

impl Reply {
    /// Whether the node of a queue reply heads its queue, as the server
    /// decided: an enqueue's reply, and the reply to a predecessor request
    /// that set a queue watch, name the member the node waits on, and none
    /// once it heads. `None` for a reply that is neither.
    pub fn heads_queue(&self) -> Option<bool> {
        match self {
            Reply::Enqueue { predecessor, .. } | Reply::Predecessor(predecessor) => {
                Some(predecessor.is_none())
            }
            _ => None,
        }
    }

    pub fn op(&self) -> OpCode {
        match self {
            Reply::Create { .. } => OpCode::Create,
            Reply::Delete => OpCode::Delete,
            Reply::Exists(_) => OpCode::Exists,
            Reply::GetData { .. } => OpCode::GetData,
            Reply::GetChildren { .. } => OpCode::GetChildren,
            Reply::SetData(_) => OpCode::SetData,
            Reply::Ping => OpCode::Ping,
            Reply::Sync => OpCode::Sync,
            Reply::CloseSession => OpCode::CloseSession,
            Reply::SetWatches => OpCode::SetWatches,
            Reply::Predecessor(_) => OpCode::Predecessor,
            Reply::CheckToken(_) => OpCode::CheckToken,
            Reply::Stats(_) => OpCode::Stats,
            Reply::RemoveWatches => OpCode::RemoveWatches,
            Reply::AddWatch => OpCode::AddWatch,
            Reply::LockDelay => OpCode::LockDelay,
            Reply::SetAcl { .. } => OpCode::SetAcl,
            Reply::Enqueue { .. } => OpCode::Enqueue,
            Reply::SessionStatus(_) => OpCode::SessionStatus,
            Reply::Multi(_) => OpCode::Multi,
        }
    }

    fn encode_body(&self, b: &mut BytesMut) {
        match self {
            Reply::Create {
                path,
                sequence,
                stat,
            } => {
                put_str16(b, path);
                put_opt_u64(b, *sequence);
                stat.encode(b);
            }
            Reply::Exists(stat) => {
                put_bool(b, stat.is_some());
                if let Some(stat) = stat {
                    stat.encode(b);
                }
            }
            Reply::GetData { stat, data } => {
                stat.encode(b);
                put_bytes32(b, data);
            }
            Reply::GetChildren { stat, children } => {
                stat.encode(b);
                b.put_u32(children.len() as u32);
                for child in children {
                    put_str16(b, child);
                }
            }
            Reply::SetData(stat) => stat.encode(b),
            Reply::SetAcl { stat, aversion } => {
                stat.encode(b);
                b.put_u32(*aversion);
            }
            Reply::Predecessor(node) | Reply::CheckToken(node) => put_node(b, node),
            Reply::Enqueue {
                path,
                sequence,
                stat,
                predecessor,
            } => {
                put_str16(b, path);
                b.put_u64(*sequence);
                stat.encode(b);
                put_node(b, predecessor);
            }
            Reply::Stats(counters) => {
                b.put_u32(counters.len() as u32);
                for (name, value) in counters {
                    put_str16(b, name);
                    b.put_u64(*value);
                }
            }
            Reply::SessionStatus(s) => {
                b.put_u8(s.liveness.to_u8());
                b.put_u64(s.silent_ms);
                b.put_u32(s.timeout_ms);
            }
            Reply::Multi(Ok(results)) => {
                b.put_u8(1);
                b.put_u16(results.len() as u16);
                for result in results {
                    result.encode(b);
                }
            }
            Reply::Multi(Err(failure)) => {
                b.put_u8(0);
                b.put_u16(failure.index as u16);
                b.put_u16(failure.error.code.to_u16());
                put_str16(b, &failure.error.message);
            }
            Reply::Delete
            | Reply::Ping
            | Reply::Sync
            | Reply::CloseSession
            | Reply::SetWatches
            | Reply::RemoveWatches
            | Reply::AddWatch
            | Reply::LockDelay => {}
        }
    }

    fn decode_body(op: OpCode, r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match op {
            OpCode::Create => Reply::Create {
                path: r.str16("path")?,
                sequence: r.opt_u64("sequence")?,
                stat: Stat::decode(r)?,
            },
            OpCode::Delete => Reply::Delete,
            OpCode::Exists => Reply::Exists(if r.bool("present")? {
                Some(Stat::decode(r)?)
            } else {
                None
            }),
            OpCode::GetData => Reply::GetData {
                stat: Stat::decode(r)?,
                data: r.bytes32("data")?,
            },
            OpCode::GetChildren => {
                let stat = Stat::decode(r)?;
                let count = r.u32("child count")?;
                // Each name takes at least 2 bytes, so a lying count fails
                // with Truncated instead of reserving memory up front.
                let mut children = Vec::new();
                for _ in 0..count {
                    children.push(r.str16("child name")?);
                }
                Reply::GetChildren { stat, children }
            }
            OpCode::SetData => Reply::SetData(Stat::decode(r)?),
            OpCode::Ping => Reply::Ping,
            OpCode::Sync => Reply::Sync,
            OpCode::CloseSession => Reply::CloseSession,
            OpCode::SetWatches => Reply::SetWatches,
            OpCode::Predecessor => Reply::Predecessor(Self::decode_node(r)?),
            OpCode::CheckToken => Reply::CheckToken(Self::decode_node(r)?),
            OpCode::Stats => {
                let count = r.u32("counter count")?;
                let mut counters = Vec::new();
                for _ in 0..count {
                    counters.push((r.str16("counter name")?, r.u64("counter value")?));
                }
                Reply::Stats(counters)
            }
            OpCode::RemoveWatches => Reply::RemoveWatches,
            OpCode::AddWatch => Reply::AddWatch,
            OpCode::LockDelay => Reply::LockDelay,
            OpCode::SetAcl => Reply::SetAcl {
                stat: Stat::decode(r)?,
                aversion: r.u32("ACL version")?,
            },
            OpCode::SessionStatus => {
                let raw = r.u8("liveness")?;
                Reply::SessionStatus(SessionStatus {
                    liveness: Liveness::from_u8(raw).ok_or(DecodeError::BadValue {
                        what: "liveness",
                        value: raw.into(),
                    })?,
                    silent_ms: r.u64("silent_ms")?,
                    timeout_ms: r.u32("timeout_ms")?,
                })
            }
            OpCode::Multi => Reply::Multi(if r.bool("committed")? {
                let count = r.u16("result count")?;
                let mut results = Vec::new();
                for _ in 0..count {
                    results.push(TxnResult::decode(r)?);
                }
                Ok(results)
            } else {
                Err(TxnFailure {
                    index: r.u16("failed operation")?.into(),
                    error: ErrorReply::new(
                        ErrorCode::from_u16(r.u16("error code")?),
                        r.str16("error message")?,
                    ),
                })
            }),
            OpCode::Enqueue | OpCode::EnqueueByRule => Reply::Enqueue {
                path: r.str16("path")?,
                sequence: r.u64("sequence")?,
                stat: Stat::decode(r)?,
                predecessor: Self::decode_node(r)?,
            },
        })
    }

    fn decode_node(r: &mut Reader) -> Result<Option<(String, Stat)>, DecodeError> {
        Ok(if r.bool("present")? {
            Some((r.str16("path")?, Stat::decode(r)?))
        } else {
            None
        })
    }
}

fn put_node(b: &mut BytesMut, node: &Option<(String, Stat)>) {
    put_bool(b, node.is_some());
    if let Some((path, stat)) = node {
        put_str16(b, path);
        stat.encode(b);
    }
}

/// A failed reply: the code and a human-readable message naming what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorReply {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorReply {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// The reply to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyFrame {
    pub xid: u32,
    /// The request's operation code, echoed (even if the server did not know it).
    pub op: u8,
    /// The server's revision when it answered.
    pub revision: u64,
    pub result: Result<Reply, ErrorReply>,
}

/// What changed at a watched path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Created,
    Deleted,
    DataChanged,
    ChildrenChanged,
    /// A queue watch's node has no predecessor left: it heads its queue.
    Head,
    /// A persistent watch asked to resume after a revision whose later
    /// changes the server no longer holds: the watcher must read again
    /// what it watches (it has missed changes).
    Compacted,
}

impl EventKind {
    fn to_u8(self) -> u8 {
        match self {
            EventKind::Created => 1,
            EventKind::Deleted => 2,
            EventKind::DataChanged => 3,
            EventKind::ChildrenChanged => 4,
            EventKind::Head => 5,
            EventKind::Compacted => 6,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => EventKind::Created,
            2 => EventKind::Deleted,
            3 => EventKind::DataChanged,
            4 => EventKind::ChildrenChanged,
            5 => EventKind::Head,
            6 => EventKind::Compacted,
            _ => return None,
        })
    }
}

/// A fired watch: the change at `path`, made at `revision`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    pub revision: u64,
    pub path: String,
}

/// The last frame before the server closes a connection, saying why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disconnect {
    pub code: ErrorCode,
    pub message: String,
}

/// Any frame the server sends after the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerMessage {
    Reply(ReplyFrame),
    Event(WatchEvent),
    Disconnect(Disconnect),
}

/// Appends a framed reply to `buf`.
pub fn encode_reply(
    buf: &mut BytesMut,
    xid: u32,
    op: u8,
    revision: u64,
    result: &Result<Reply, ErrorReply>,
) {
    encode_frame(buf, |b| {
        b.put_u8(KIND_REPLY);
        b.put_u32(xid);
        b.put_u8(op);
        b.put_u64(revision);
        match result {
            Ok(reply) => {
                b.put_u16(0);
                reply.encode_body(b);
            }
            Err(e) => {
                b.put_u16(e.code.to_u16());
                put_str16(b, &e.message);
            }
        }
    });
}

/// Appends a framed watch event to `buf`; the server calls this once per
/// watcher with a shared path, so it takes the parts rather than a
/// [`WatchEvent`].
pub fn encode_event(buf: &mut BytesMut, kind: EventKind, revision: u64, path: &str) {
    encode_frame(buf, |b| {
        b.put_u8(KIND_EVENT);
        b.put_u8(kind.to_u8());
        b.put_u64(revision);
        put_str16(b, path);
    });
}

/// Appends a framed disconnect notice to `buf`.
pub fn encode_disconnect(buf: &mut BytesMut, code: ErrorCode, message: &str) {
    encode_frame(buf, |b| {
        b.put_u8(KIND_DISCONNECT);
        b.put_u16(code.to_u16());
        put_str16(b, message);
    });
}

impl ServerMessage {
    /// Appends this message, framed, to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            ServerMessage::Reply(r) => encode_reply(buf, r.xid, r.op, r.revision, &r.result),
            ServerMessage::Event(e) => encode_event(buf, e.kind, e.revision, &e.path),
            ServerMessage::Disconnect(s) => encode_disconnect(buf, s.code, &s.message),
        }
    }

    /// Decodes a frame's payload. Data fields share the payload's memory.
    ///
    /// # Errors
    /// [`DecodeError`] if the payload is not exactly one server message.
    pub fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(&payload);
        let msg = match r.u8("kind")? {
            KIND_REPLY => {
                let xid = r.u32("xid")?;
                let op = r.u8("op")?;
                let revision = r.u64("revision")?;
                let status = r.u16("status")?;
                let result = if status == 0 {
                    let opcode = OpCode::from_u8(op).ok_or(DecodeError::BadValue {
                        what: "op",
                        value: op.into(),
                    })?;
                    Ok(Reply::decode_body(opcode, &mut r)?)
                } else {
                    Err(ErrorReply {
                        code: ErrorCode::from_u16(status),
                        message: r.str16("message")?,
                    })
                };
                ServerMessage::Reply(ReplyFrame {
                    xid,
                    op,
                    revision,
                    result,
                })
            }
            KIND_EVENT => {
                let raw = r.u8("event")?;
                let kind = EventKind::from_u8(raw).ok_or(DecodeError::BadValue {
                    what: "event",
                    value: raw.into(),
                })?;
                ServerMessage::Event(WatchEvent {
                    kind,
                    revision: r.u64("revision")?,
                    path: r.str16("path")?,
                })
            }
            KIND_DISCONNECT => ServerMessage::Disconnect(Disconnect {
                code: ErrorCode::from_u16(r.u16("code")?),
                message: r.str16("message")?,
            }),
            other => {
                return Err(DecodeError::BadValue {
                    what: "kind",
                    value: other.into(),
                })
            }
        };
        r.finish()?;
        Ok(msg)
    }
}
