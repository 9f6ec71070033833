//! The state as a snapshot holds it: sessions and nodes written out.

use baton_proto::{Acl, SessionId, SessionSecret};
use bytes::Bytes;

use crate::queue::QueueRule;
use crate::LastReply;

/// A session as a snapshot holds it (its ephemerals come with the nodes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionImage {
    pub id: SessionId,
    pub timeout_ms: u32,
    pub secret: SessionSecret,
    pub last: Option<LastReply>,
}

/// A node as a snapshot holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeImage {
    pub path: String,
    pub data: Bytes,
    pub czxid: u64,
    pub mzxid: u64,
    pub pzxid: u64,
    pub ctime: u64,
    pub mtime: u64,
    pub version: u32,
    pub cversion: u32,
    /// Owning session, 0 if persistent.
    pub owner: u64,
    pub fence: u64,
    /// The rule the node joined its queue by.
    pub rule: QueueRule,
    /// The node's lock-delay, in ms (0: none).
    pub lock_delay_ms: u32,
    /// If the node is a lock-delay tombstone, when it is due (ms); else 0.
    pub tombstone_until: u64,
    /// The node's access control list.
    pub acl: Acl,
    /// The number of times the node's list was set.
    pub aversion: u32,
    /// Whether the node is a container.
    pub container: bool,
}
