//! Requests: what a client asks of its session after the handshake.
//!
//! # Format
//! ```text
//! every request frame:
//!   xid   u32   chosen by the client, echoed by the reply
//!   op    u8    operation code
//!   body        depends on op:
//!
//! 1 create        path str, mode u8, data bytes, fence opt64
//! 2 delete        path str, version opt32, fence opt64
//! 3 exists        path str, watch u8
//! 4 get data      path str, watch u8
//! 5 get children  path str, watch u8
//! 6 set data      path str, data bytes, version opt32, fence opt64
//! 7 ping          (empty)
//! 8 close session (empty)
//! 9 set watches   revision u64, data paths, exist paths, child paths
//!                 (each list: count u32, then count str), then queue
//!                 watches: count u32, then count of (path str, head u8)
//! 10 predecessor  path str, watch u8 (0 none, 1 data watch on the
//!                 predecessor, 2 queue watch on the node)
//! 11 check token  path str, token u64
//! 12 stats        (empty)
//! 13 remove watches path str, kinds u8 (bit 0: data watch, bit 1: child
//!                 watch)
//! 14 enqueue      path str (prefix of an ephemeral sequential node),
//!                 data bytes
//! 15 session status session u64 (any session's, not only the asker's)
//! 16 multi        count u16, then count operations (see [`crate::txn`]),
//!                 applied all or none
//!
//! str     = u16 length + UTF-8 bytes
//! bytes   = u32 length + bytes
//! opt32   = u8 0 (absent) | u8 1 + u32
//! opt64   = u8 0 (absent) | u8 1 + u64
//! mode    = 0 persistent, 1 ephemeral, 2 persistent sequential,
//!           3 ephemeral sequential (bit 0: ephemeral, bit 1: sequential)
//! watch   = 0 or 1 (for predecessor: 0, 1 or 2)
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::acl::{put_create_acl, put_create_mode, split_create_mode, Acl};
use crate::error::{DecodeError, ErrorCode};
use crate::frame::encode_frame;
pub use crate::mode::{CreateMode, QueueRule};
use crate::path;
use crate::txn::TxnOp;
use crate::wire::{put_bool, put_bytes32, put_opt_u32, put_opt_u64, put_str16, Reader};

/// Operation codes, as numbered on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpCode {
    Create = 1,
    Delete = 2,
    Exists = 3,
    GetData = 4,
    GetChildren = 5,
    SetData = 6,
    Ping = 7,
    CloseSession = 8,
    SetWatches = 9,
    Predecessor = 10,
    CheckToken = 11,
    Stats = 12,
    RemoveWatches = 13,
    Enqueue = 14,
    SessionStatus = 15,
    Multi = 16,
    AddWatch = 17,
    LockDelay = 18,
    EnqueueByRule = 19,
    SetAcl = 20,
    Sync = 21,
}

impl OpCode {
    /// The highest operation number this crate knows.
    pub const LAST: u8 = OpCode::Sync as u8;

    /// The operation for a wire number, if there is one.
    pub fn from_u8(op: u8) -> Option<OpCode> {
        Some(match op {
            1 => OpCode::Create,
            2 => OpCode::Delete,
            3 => OpCode::Exists,
            4 => OpCode::GetData,
            5 => OpCode::GetChildren,
            6 => OpCode::SetData,
            7 => OpCode::Ping,
            8 => OpCode::CloseSession,
            9 => OpCode::SetWatches,
            10 => OpCode::Predecessor,
            11 => OpCode::CheckToken,
            12 => OpCode::Stats,
            13 => OpCode::RemoveWatches,
            14 => OpCode::Enqueue,
            15 => OpCode::SessionStatus,
            16 => OpCode::Multi,
            17 => OpCode::AddWatch,
            18 => OpCode::LockDelay,
            19 => OpCode::EnqueueByRule,
            20 => OpCode::SetAcl,
            21 => OpCode::Sync,
            _ => return None,
        })
    }

    /// Whether the operation changes the state: it is proposed (on a
    /// cluster, replicated) rather than answered from the state as it is.
    pub fn is_change(self) -> bool {
        match self {
            OpCode::Create
            | OpCode::Delete
            | OpCode::SetData
            | OpCode::Enqueue
            | OpCode::EnqueueByRule
            | OpCode::CloseSession
            | OpCode::Multi
            | OpCode::LockDelay
            | OpCode::SetAcl => true,
            OpCode::Exists
            | OpCode::GetData
            | OpCode::GetChildren
            | OpCode::Ping
            | OpCode::Sync
            | OpCode::SetWatches
            | OpCode::Predecessor
            | OpCode::CheckToken
            | OpCode::Stats
            | OpCode::RemoveWatches
            | OpCode::SessionStatus
            | OpCode::AddWatch => false,
        }
    }

    /// Whether a successful answer to the operation shows that the leader
    /// heard from its session after it was sent, in every read mode: a
    /// change (the leader proposed it), a ping or a sync (they pass a read
    /// barrier). Other reads show it only in the linearizable mode.
    pub fn heard_by_leader(self) -> bool {
        self.is_change() || matches!(self, OpCode::Ping | OpCode::Sync)
    }

    /// A short lower-case name for messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            OpCode::Create => "create",
            OpCode::Delete => "delete",
            OpCode::Exists => "exists",
            OpCode::GetData => "get data",
            OpCode::GetChildren => "get children",
            OpCode::SetData => "set data",
            OpCode::Ping => "ping",
            OpCode::CloseSession => "close session",
            OpCode::SetWatches => "set watches",
            OpCode::Predecessor => "predecessor",
            OpCode::CheckToken => "check token",
            OpCode::Stats => "stats",
            OpCode::RemoveWatches => "remove watches",
            OpCode::Enqueue => "enqueue",
            OpCode::SessionStatus => "session status",
            OpCode::Multi => "multi",
            OpCode::AddWatch => "add watch",
            OpCode::LockDelay => "lock delay",
            OpCode::EnqueueByRule => "enqueue by rule",
            OpCode::SetAcl => "set ACL",
            OpCode::Sync => "sync",
        }
    }
}

/// One operation with its arguments. Paths are valid by construction when
/// decoded; [`RequestFrame::encode`] does not check them (the server does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Create {
        path: String,
        data: Bytes,
        mode: CreateMode,
        /// A fencing token the parent must accept (see [`Request::SetData`]).
        fence: Option<u64>,
        /// The node's access control list ([`Acl::OPEN`]: none; see
        /// [`acl`](crate::acl)).
        acl: Acl,
    },
    Delete {
        path: String,
        version: Option<u32>,
        /// A fencing token the node must accept.
        fence: Option<u64>,
    },
    Exists {
        path: String,
        watch: bool,
    },
    GetData {
        path: String,
        watch: bool,
    },
    GetChildren {
        path: String,
        watch: bool,
    },
    SetData {
        path: String,
        data: Bytes,
        version: Option<u32>,
        /// A fencing token: the write is applied only if it is at least the
        /// highest token the node has accepted, and then becomes it.
        fence: Option<u64>,
    },
    Ping,
    /// Brings the member that serves the session up to date with the
    /// leader: answered once the member has applied everything committed
    /// before the request arrived, after the leader proved it still leads.
    /// Requests sent after it see at least that state (what a read sees
    /// otherwise depends on the session's read mode; see
    /// [`ReadMode`](crate::ReadMode)).
    Sync,
    CloseSession,
    /// Sent first after resuming a session on a new connection: sets the
    /// client's outstanding watches again. The server fires at once each watch
    /// whose node changed after `revision` (the last revision the client saw)
    /// and sets the others.
    SetWatches {
        revision: u64,
        /// Paths watched for data changes and deletion (the node existed).
        data: Vec<String>,
        /// Paths watched for creation (the node did not exist).
        exist: Vec<String>,
        /// Paths watched for changes to their children.
        child: Vec<String>,
        /// Queue watches: the node, and whether it already heads its queue.
        queue: Vec<(String, bool)>,
    },
    /// The sibling created just before the node at `path` (in creation
    /// order), optionally leaving a watch on it: the step a lock waiter takes
    /// to wait for its predecessor alone. Answered in O(log n) siblings.
    Predecessor {
        path: String,
        watch: PredecessorWatch,
    },
    /// Whether a child of `path` created at revision `token` still exists:
    /// whether the holder of that fencing token still holds its node.
    CheckToken {
        path: String,
        token: u64,
    },
    /// The server's counters.
    Stats,
    /// Removes this session's watches on `path`: the data watch (set by
    /// exists, get data or predecessor) if `data`, the child watch if
    /// `child`, the persistent watches (plain and recursive) if
    /// `persistent`. Removed watches never fire.
    RemoveWatches {
        path: String,
        data: bool,
        child: bool,
        persistent: bool,
    },
    /// Sets a persistent watch on `path`, which stays armed and reports
    /// every change to the node (created, deleted, data changed, children
    /// changed) or, if `recursive`, every creation, deletion and data
    /// change of the node and of every node below it. With `from` > 0 the
    /// server first sends, in order, the events it would have sent for the
    /// changes after revision `from`, or a `compacted` event if it no
    /// longer holds them all.
    AddWatch {
        path: String,
        recursive: bool,
        from: u64,
    },
    /// Sets the lock-delay of the lock at `path` (0: none): when a session
    /// holding the lock expires, rather than releasing it, the lock is
    /// granted to no one else for `delay_ms`.
    LockDelay {
        path: String,
        delay_ms: u32,
    },
    /// Replaces the access control list of the node at `path`, if its ACL
    /// version (the number of times its list was set) is `version`.
    SetAcl {
        path: String,
        acl: Acl,
        version: Option<u32>,
    },
    /// Joins a queue by `rule`: creates an ephemeral sequential node at
    /// `path` (plus the sequence suffix) holding `data`, and sets a queue
    /// watch on it, in one step. The reply names the member it waits on
    /// under its rule, none if it heads the queue.
    ///
    /// A queue watch fires *head* once the rule lets the node proceed (for
    /// an exclusive member, once it has no predecessor left), and then
    /// *deleted* if the node is deleted by anyone but its own session. A
    /// member that leaves without letting it proceed wakes nobody: the
    /// server moves the watch on by itself.
    Enqueue {
        path: String,
        data: Bytes,
        rule: QueueRule,
    },
    /// Whether a session (anyone's) is alive as the serving server sees it:
    /// connected, or disconnected and until when it may still resume.
    SessionStatus {
        session: crate::SessionId,
    },
    /// A transaction: the operations applied in order, all or none, under
    /// one revision; a sequential create passing over a taken name takes
    /// the next free one, as outside a transaction.
    Multi {
        ops: Vec<TxnOp>,
    },
}

/// What a predecessor request watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PredecessorWatch {
    /// Nothing.
    #[default]
    None,
    /// The predecessor itself, as a data watch (fires on its change or
    /// deletion).
    Predecessor,
    /// The node's place in its queue, as a queue watch (see
    /// [`Request::Enqueue`]).
    Queue,
    /// No watch, and instead of the predecessor, the member the node waits
    /// on under the rule it joined its queue by (none: it heads), as a
    /// queue watch would start from.
    Standing,
}

impl PredecessorWatch {
    fn to_u8(self) -> u8 {
        match self {
            PredecessorWatch::None => 0,
            PredecessorWatch::Predecessor => 1,
            PredecessorWatch::Queue => 2,
            PredecessorWatch::Standing => 3,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => PredecessorWatch::None,
            1 => PredecessorWatch::Predecessor,
            2 => PredecessorWatch::Queue,
            3 => PredecessorWatch::Standing,
            _ => return None,
        })
    }
}

impl Request {
    pub fn op(&self) -> OpCode {
        match self {
            Request::Create { .. } => OpCode::Create,
            Request::Delete { .. } => OpCode::Delete,
            Request::Exists { .. } => OpCode::Exists,
            Request::GetData { .. } => OpCode::GetData,
            Request::GetChildren { .. } => OpCode::GetChildren,
            Request::SetData { .. } => OpCode::SetData,
            Request::Ping => OpCode::Ping,
            Request::Sync => OpCode::Sync,
            Request::CloseSession => OpCode::CloseSession,
            Request::SetWatches { .. } => OpCode::SetWatches,
            Request::Predecessor { .. } => OpCode::Predecessor,
            Request::CheckToken { .. } => OpCode::CheckToken,
            Request::Stats => OpCode::Stats,
            Request::RemoveWatches { .. } => OpCode::RemoveWatches,
            // An exclusive enqueue is sent as protocol version 1 first
            // defined it; another rule needs the operation that carries it.
            Request::Enqueue { rule, .. } if *rule == QueueRule::Exclusive => OpCode::Enqueue,
            Request::Enqueue { .. } => OpCode::EnqueueByRule,
            Request::SessionStatus { .. } => OpCode::SessionStatus,
            Request::Multi { .. } => OpCode::Multi,
            Request::AddWatch { .. } => OpCode::AddWatch,
            Request::LockDelay { .. } => OpCode::LockDelay,
            Request::SetAcl { .. } => OpCode::SetAcl,
        }
    }

    /// The path the request names, if any.
    pub fn path(&self) -> Option<&str> {
        match self {
            Request::Create { path, .. }
            | Request::Delete { path, .. }
            | Request::Exists { path, .. }
            | Request::GetData { path, .. }
            | Request::GetChildren { path, .. }
            | Request::SetData { path, .. }
            | Request::Predecessor { path, .. }
            | Request::CheckToken { path, .. }
            | Request::RemoveWatches { path, .. }
            | Request::AddWatch { path, .. }
            | Request::LockDelay { path, .. }
            | Request::SetAcl { path, .. }
            | Request::Enqueue { path, .. } => Some(path),
            Request::Ping
            | Request::Sync
            | Request::CloseSession
            | Request::SetWatches { .. }
            | Request::Stats
            | Request::SessionStatus { .. }
            | Request::Multi { .. } => None,
        }
    }
}

/// A request with the xid its reply will echo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFrame {
    pub xid: u32,
    pub request: Request,
}

/// Why a request frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestDecodeError {
    /// The frame is shorter than the 5-byte header, so there is no xid to
    /// answer: the connection must be closed.
    NoHeader,
    /// The header was read: answer `xid` with `code` and keep the connection.
    Reject {
        xid: u32,
        op: u8,
        code: ErrorCode,
        message: String,
    },
}

impl std::fmt::Display for RequestDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestDecodeError::NoHeader => {
                f.write_str("request frame shorter than its 5-byte header")
            }
            RequestDecodeError::Reject {
                xid,
                op,
                code,
                message,
            } => write!(f, "xid {xid} op {op}: {code}: {message}"),
        }
    }
}

impl RequestFrame {
    /// Appends this request, framed, to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        encode_frame(buf, |b| {
            b.put_u32(self.xid);
            b.put_u8(self.request.op() as u8);
            match &self.request {
                Request::Create {
                    path,
                    data,
                    mode,
                    fence,
                    acl,
                } => {
                    put_str16(b, path);
                    put_create_mode(b, mode.to_u8(), acl);
                    put_bytes32(b, data);
                    put_opt_u64(b, *fence);
                    put_create_acl(b, acl);
                }
                Request::Delete {
                    path,
                    version,
                    fence,
                } => {
                    put_str16(b, path);
                    put_opt_u32(b, *version);
                    put_opt_u64(b, *fence);
                }
                Request::Exists { path, watch }
                | Request::GetData { path, watch }
                | Request::GetChildren { path, watch } => {
                    put_str16(b, path);
                    put_bool(b, *watch);
                }
                Request::SetData {
                    path,
                    data,
                    version,
                    fence,
                } => {
                    put_str16(b, path);
                    put_bytes32(b, data);
                    put_opt_u32(b, *version);
                    put_opt_u64(b, *fence);
                }
                Request::Predecessor { path, watch } => {
                    put_str16(b, path);
                    b.put_u8(watch.to_u8());
                }
                Request::Enqueue { path, data, rule } => {
                    put_str16(b, path);
                    put_bytes32(b, data);
                    if *rule != QueueRule::Exclusive {
                        rule.put(b);
                    }
                }
                Request::CheckToken { path, token } => {
                    put_str16(b, path);
                    b.put_u64(*token);
                }
                Request::RemoveWatches {
                    path,
                    data,
                    child,
                    persistent,
                } => {
                    put_str16(b, path);
                    b.put_u8(*data as u8 | (*child as u8) << 1 | (*persistent as u8) << 2);
                }
                Request::AddWatch {
                    path,
                    recursive,
                    from,
                } => {
                    put_str16(b, path);
                    b.put_u8(*recursive as u8);
                    b.put_u64(*from);
                }
                Request::LockDelay { path, delay_ms } => {
                    put_str16(b, path);
                    b.put_u32(*delay_ms);
                }
                Request::SetAcl { path, acl, version } => {
                    put_str16(b, path);
                    acl.put(b);
                    put_opt_u32(b, *version);
                }
                Request::SessionStatus { session } => b.put_u64(session.0),
                Request::Multi { ops } => {
                    b.put_u16(ops.len() as u16);
                    for op in ops {
                        op.encode(b);
                    }
                }
                Request::Ping | Request::Sync | Request::CloseSession | Request::Stats => {}
                Request::SetWatches {
                    revision,
                    data,
                    exist,
                    child,
                    queue,
                } => {
                    b.put_u64(*revision);
                    for list in [data, exist, child] {
                        b.put_u32(list.len() as u32);
                        for path in list {
                            put_str16(b, path);
                        }
                    }
                    b.put_u32(queue.len() as u32);
                    for (path, head) in queue {
                        put_str16(b, path);
                        put_bool(b, *head);
                    }
                }
            }
        });
    }

    /// Decodes a frame's payload. Data fields share the payload's memory.
    ///
    /// # Errors
    /// [`RequestDecodeError::NoHeader`] if there is no header to answer;
    /// otherwise a [`RequestDecodeError::Reject`] with the code to answer:
    /// unknown operation, invalid path or malformed request.
    pub fn decode(payload: Bytes) -> Result<Self, RequestDecodeError> {
        let mut r = Reader::new(&payload);
        let (Ok(xid), Ok(op)) = (r.u32("xid"), r.u8("op")) else {
            return Err(RequestDecodeError::NoHeader);
        };
        let reject = |code: ErrorCode, message: String| RequestDecodeError::Reject {
            xid,
            op,
            code,
            message,
        };
        let Some(opcode) = OpCode::from_u8(op) else {
            return Err(reject(
                ErrorCode::UnknownOperation,
                format!("operation code {op} is not part of protocol version 1"),
            ));
        };
        match decode_body(opcode, &mut r).and_then(|req| r.finish().map(|()| req)) {
            Ok(request) => Ok(RequestFrame { xid, request }),
            Err(DecodeError::InvalidPath(e)) => Err(reject(ErrorCode::InvalidPath, e.to_string())),
            Err(e) => Err(reject(
                ErrorCode::MalformedRequest,
                format!("{} request: {e}", opcode.name()),
            )),
        }
    }
}

fn read_path(r: &mut Reader) -> Result<String, DecodeError> {
    let raw = r.raw16("path")?;
    Ok(path::validate_bytes(raw)?.to_owned())
}

fn decode_body(op: OpCode, r: &mut Reader) -> Result<Request, DecodeError> {
    Ok(match op {
        OpCode::Create => {
            let path = read_path(r)?;
            let (raw_mode, with_acl) = split_create_mode(r.u8("mode")?);
            let mode = CreateMode::from_u8(raw_mode).ok_or(DecodeError::BadValue {
                what: "mode",
                value: raw_mode.into(),
            })?;
            let data = r.bytes32("data")?;
            let fence = r.opt_u64("fence")?;
            let acl = if with_acl { Acl::read(r)? } else { Acl::OPEN };
            Request::Create {
                path,
                data,
                mode,
                fence,
                acl,
            }
        }
        OpCode::Delete => Request::Delete {
            path: read_path(r)?,
            version: r.opt_u32("version")?,
            fence: r.opt_u64("fence")?,
        },
        OpCode::Exists => Request::Exists {
            path: read_path(r)?,
            watch: r.bool("watch")?,
        },
        OpCode::GetData => Request::GetData {
            path: read_path(r)?,
            watch: r.bool("watch")?,
        },
        OpCode::GetChildren => Request::GetChildren {
            path: read_path(r)?,
            watch: r.bool("watch")?,
        },
        OpCode::SetData => Request::SetData {
            path: read_path(r)?,
            data: r.bytes32("data")?,
            version: r.opt_u32("version")?,
            fence: r.opt_u64("fence")?,
        },
        OpCode::Predecessor => {
            let path = read_path(r)?;
            let raw = r.u8("watch")?;
            let watch = PredecessorWatch::from_u8(raw).ok_or(DecodeError::BadValue {
                what: "watch",
                value: raw.into(),
            })?;
            Request::Predecessor { path, watch }
        }
        OpCode::Enqueue => Request::Enqueue {
            path: read_path(r)?,
            data: r.bytes32("data")?,
            rule: QueueRule::Exclusive,
        },
        OpCode::EnqueueByRule => Request::Enqueue {
            path: read_path(r)?,
            data: r.bytes32("data")?,
            rule: QueueRule::read(r)?,
        },
        OpCode::CheckToken => Request::CheckToken {
            path: read_path(r)?,
            token: r.u64("token")?,
        },
        OpCode::Stats => Request::Stats,
        OpCode::SessionStatus => Request::SessionStatus {
            session: crate::SessionId(r.u64("session")?),
        },
        OpCode::RemoveWatches => {
            let path = read_path(r)?;
            let kinds = r.u8("kinds")?;
            if kinds > 7 {
                return Err(DecodeError::BadValue {
                    what: "kinds",
                    value: kinds.into(),
                });
            }
            Request::RemoveWatches {
                path,
                data: kinds & 1 != 0,
                child: kinds & 2 != 0,
                persistent: kinds & 4 != 0,
            }
        }
        OpCode::LockDelay => Request::LockDelay {
            path: read_path(r)?,
            delay_ms: r.u32("delay")?,
        },
        OpCode::SetAcl => Request::SetAcl {
            path: read_path(r)?,
            acl: Acl::read(r)?,
            version: r.opt_u32("version")?,
        },
        OpCode::AddWatch => {
            let path = read_path(r)?;
            let mode = r.u8("mode")?;
            if mode > 1 {
                return Err(DecodeError::BadValue {
                    what: "mode",
                    value: mode.into(),
                });
            }
            Request::AddWatch {
                path,
                recursive: mode == 1,
                from: r.u64("from")?,
            }
        }
        OpCode::Multi => {
            let count = r.u16("operation count")?;
            // Each operation takes at least 4 bytes, so a lying count ends
            // in Truncated before this grows beyond the frame.
            let mut ops = Vec::new();
            for _ in 0..count {
                ops.push(TxnOp::decode(r)?);
            }
            Request::Multi { ops }
        }
        OpCode::Ping => Request::Ping,
        OpCode::Sync => Request::Sync,
        OpCode::CloseSession => Request::CloseSession,
        OpCode::SetWatches => Request::SetWatches {
            revision: r.u64("revision")?,
            data: read_paths(r)?,
            exist: read_paths(r)?,
            child: read_paths(r)?,
            queue: {
                let count = r.u32("queue watch count")?;
                let mut queue = Vec::new();
                for _ in 0..count {
                    queue.push((read_path(r)?, r.bool("head")?));
                }
                queue
            },
        },
    })
}

fn read_paths(r: &mut Reader) -> Result<Vec<String>, DecodeError> {
    let count = r.u32("path count")?;
    // Each path takes at least 2 bytes, so a lying count ends in Truncated
    // before it can make this grow beyond the frame.
    let mut paths = Vec::new();
    for _ in 0..count {
        paths.push(read_path(r)?);
    }
    Ok(paths)
}
