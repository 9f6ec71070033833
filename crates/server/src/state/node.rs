//! One node of the tree.

use std::collections::BTreeSet;
use std::sync::Arc;

use baton_proto::{SessionId, Stat};
use bytes::Bytes;

/// A node: its data, its metadata and the full paths of its children.
///
/// Children are kept as full paths sharing the allocation of the tree's keys;
/// all children of one node share its path as a prefix, so their order is the
/// order of their names.
#[derive(Debug, Clone)]
pub struct Node {
    pub data: Bytes,
    pub czxid: u64,
    pub mzxid: u64,
    pub pzxid: u64,
    pub ctime: u64,
    pub mtime: u64,
    pub version: u32,
    pub cversion: u32,
    /// Owning session if the node is ephemeral.
    pub owner: Option<SessionId>,
    pub children: BTreeSet<Arc<str>>,
}

impl Node {
    pub(crate) fn new(data: Bytes, revision: u64, now_ms: u64, owner: Option<SessionId>) -> Self {
        Node {
            data,
            czxid: revision,
            mzxid: revision,
            pzxid: revision,
            ctime: now_ms,
            mtime: now_ms,
            version: 0,
            cversion: 0,
            owner,
            children: BTreeSet::new(),
        }
    }

    /// The node's metadata as the protocol reports it.
    pub fn stat(&self) -> Stat {
        Stat {
            czxid: self.czxid,
            mzxid: self.mzxid,
            pzxid: self.pzxid,
            ctime: self.ctime,
            mtime: self.mtime,
            version: self.version,
            cversion: self.cversion,
            ephemeral_owner: self.owner.map_or(0, |s| s.0),
            data_length: self.data.len() as u32,
            num_children: self.children.len() as u32,
        }
    }

    /// Names (last path segments) of the children, in order.
    pub fn child_names(&self) -> impl Iterator<Item = &str> {
        self.children.iter().map(|p| baton_proto::path::name(p))
    }
}
