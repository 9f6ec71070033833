//! What the state machine is asked to do, and what it answers.

use std::sync::Arc;

use baton_proto::{Acl, CreateMode, ErrorReply, EventKind, SessionId, SessionSecret, Stat, TxnOp};
use bytes::Bytes;

use crate::queue::QueueRule;

/// A change to the state. Reads are not commands: they change nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Opens a session; its id is the revision of this command.
    OpenSession {
        timeout_ms: u32,
        secret: SessionSecret,
    },
    /// Ends a session at its client's request.
    CloseSession { session: SessionId },
    /// Ends a session whose client fell silent for its whole timeout.
    ExpireSession { session: SessionId },
    /// Creates a node. With `fence`, the parent must accept the token; the
    /// node gets `acl` as its access control list.
    Create {
        session: SessionId,
        path: String,
        data: Bytes,
        mode: CreateMode,
        fence: Option<u64>,
        acl: Acl,
    },
    /// Deletes a node. With `fence`, the node must accept the token.
    Delete {
        path: String,
        version: Option<u32>,
        fence: Option<u64>,
    },
    /// Replaces a node's data. With `fence`, the node must accept the token.
    SetData {
        path: String,
        data: Bytes,
        version: Option<u32>,
        fence: Option<u64>,
    },
    /// Joins a queue by `rule`: creates an ephemeral sequential node of
    /// `session` under the queue's path, and reports the member it waits
    /// on under its rule (none if it heads).
    Enqueue {
        session: SessionId,
        path: String,
        data: Bytes,
        rule: QueueRule,
    },
    /// A transaction of `session`: `ops` applied in order, all or none.
    Multi { session: SessionId, ops: Vec<TxnOp> },
    /// Sets the lock-delay of the lock at `path` (0: none); see
    /// [`delay`](crate::delay).
    SetLockDelay { path: String, delay_ms: u32 },
    /// Deletes a lock-delay tombstone that is due.
    DeleteTombstone { path: String },
    /// Deletes a container that has had children and has none left (the
    /// leader proposes it once the container has stood empty a while).
    DeleteContainer { path: String },
    /// Replaces a node's access control list, if its ACL version is
    /// `version` (any, if none).
    SetAcl {
        path: String,
        acl: Acl,
        version: Option<u32>,
    },
}

/// The successful result of a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    SessionOpened(SessionId),
    /// The session ended; these ephemeral nodes went with it.
    SessionEnded {
        deleted: Vec<Arc<str>>,
    },
    Created {
        path: Arc<str>,
        sequence: Option<u64>,
        stat: Stat,
    },
    /// A queue was joined: the created node, and the member it waits on
    /// under its rule, if it does not head the queue.
    Enqueued {
        path: Arc<str>,
        sequence: u64,
        stat: Stat,
        predecessor: Option<(Arc<str>, Stat)>,
    },
    Deleted,
    DataSet(Stat),
    /// A check of a transaction held.
    Checked,
    /// A lock's lock-delay was set.
    LockDelaySet,
    /// A node's access control list was set: its stat, and its ACL version
    /// (the number of times its list was set).
    AclSet {
        stat: Stat,
        aversion: u32,
    },
    /// A transaction was applied: one outcome per operation, in order.
    Multi(Vec<Outcome>),
    /// A transaction changed nothing: the operation at `index` (from 0)
    /// failed with `error`. Like a refusal it takes no revision, and the
    /// session keeps it as the answer to its request.
    MultiFailed {
        index: u32,
        error: ErrorReply,
    },
}

/// A change that fires the watches set on `path` for `kind`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    pub kind: EventKind,
    pub path: Arc<str>,
}

/// What [`StateMachine::apply`](crate::StateMachine::apply) did.
#[derive(Debug)]
pub struct Applied {
    /// The command's result; an error changes nothing and takes no revision.
    pub result: Result<Outcome, ErrorReply>,
    /// Watches to fire, in order; empty when the command failed.
    pub triggers: Vec<Trigger>,
    /// The revision after the command (unchanged if it failed).
    pub revision: u64,
    /// Whether the command changed the state (took a revision). A failed
    /// command, and a request answered from its session's last reply, did
    /// not: neither is logged.
    pub changed: bool,
}
