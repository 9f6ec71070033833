//! One node of the tree, laid out to be small: a server holds one per
//! ephemeral lock contender, and there may be a hundred thousand.

use std::sync::Arc;

use baton_proto::{SessionId, Stat};

use super::pmap::PMap;
use super::NodeImage;
use bytes::Bytes;

/// A node: its data, its metadata and the full paths of its children.
///
/// Children are kept in creation order (by their creation revision), as full
/// paths sharing the allocation of the tree's keys: a lock waiter's
/// predecessor is then one ordered lookup away, however many siblings it has.
/// The child map is persistent, like the tree's: a node copied for a snapshot
/// shares it, and a change afterwards copies only the path to what changed,
/// however many children there are. A node without children allocates
/// nothing for them.
#[derive(Debug, Clone)]
pub struct Node {
    /// Exactly the node's bytes, copied out of the request frame so that a
    /// small value never keeps a large read buffer alive.
    data: Option<Arc<[u8]>>,
    pub(super) czxid: u64,
    pub(super) mzxid: u64,
    pub(super) pzxid: u64,
    pub(super) ctime: u64,
    pub(super) mtime: u64,
    pub(super) version: u32,
    pub(super) cversion: u32,
    /// Owning session's id if the node is ephemeral, else 0.
    owner: u64,
    /// Highest fencing token a fenced write to this node has carried.
    pub(super) fence: u64,
    /// Full paths of the children by creation revision (8 bytes, and no
    /// allocation, for a leaf).
    children: PMap<u64, Arc<str>>,
}

impl Node {
    pub(super) fn new(data: &[u8], revision: u64, now_ms: u64, owner: Option<SessionId>) -> Self {
        let mut node = Node {
            data: None,
            czxid: revision,
            mzxid: revision,
            pzxid: revision,
            ctime: now_ms,
            mtime: now_ms,
            version: 0,
            cversion: 0,
            owner: owner.map_or(0, |s| s.0),
            fence: 0,
            children: PMap::new(),
        };
        node.set_data(data);
        node
    }

    /// A node exactly as a snapshot recorded it (children are linked by the
    /// caller).
    pub(super) fn restore(image: &NodeImage) -> Self {
        let mut node = Node {
            data: None,
            czxid: image.czxid,
            mzxid: image.mzxid,
            pzxid: image.pzxid,
            ctime: image.ctime,
            mtime: image.mtime,
            version: image.version,
            cversion: image.cversion,
            owner: image.owner,
            fence: image.fence,
            children: PMap::new(),
        };
        node.set_data(&image.data);
        node
    }

    pub(super) fn set_data(&mut self, data: &[u8]) {
        self.data = (!data.is_empty()).then(|| Arc::from(data));
    }

    /// The node's data, shared (not copied) with the caller.
    pub fn data(&self) -> Bytes {
        match &self.data {
            Some(d) => Bytes::from_owner(d.clone()),
            None => Bytes::new(),
        }
    }

    pub fn data_len(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.len())
    }

    /// The node no longer belongs to a session (a lock-delay tombstone).
    pub(super) fn disown(&mut self) {
        self.owner = 0;
    }

    /// The session that owns the node, if it is ephemeral.
    pub fn owner(&self) -> Option<SessionId> {
        (self.owner != 0).then_some(SessionId(self.owner))
    }

    pub fn mzxid(&self) -> u64 {
        self.mzxid
    }

    pub fn czxid(&self) -> u64 {
        self.czxid
    }

    pub fn pzxid(&self) -> u64 {
        self.pzxid
    }

    /// Highest fencing token this node has accepted (0 if none).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Full paths of the children, in creation order.
    pub fn children(&self) -> impl Iterator<Item = &Arc<str>> {
        self.children.values()
    }

    /// The child created just before revision `czxid`, if any.
    pub fn child_before(&self, czxid: u64) -> Option<&Arc<str>> {
        self.children.last_below(&czxid).map(|(_, p)| p)
    }

    /// The child created at revision `czxid`, if it still exists.
    pub fn child_created_at(&self, czxid: u64) -> Option<&Arc<str>> {
        self.children.get(&czxid)
    }

    /// The children with their creation revisions, oldest first.
    pub(super) fn child_entries(&self) -> impl Iterator<Item = (u64, &Arc<str>)> {
        self.children.iter().map(|(c, p)| (*c, p))
    }

    pub fn child_count(&self) -> usize {
        self.children.len()
    }

    pub(super) fn add_child(&mut self, czxid: u64, path: Arc<str>) {
        self.children.insert(czxid, path);
    }

    pub(super) fn remove_child(&mut self, czxid: u64) {
        self.children.remove(&czxid);
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
            ephemeral_owner: self.owner,
            data_length: self.data_len() as u32,
            num_children: self.child_count() as u32,
        }
    }

    /// Names (last path segments) of the children, sorted by name.
    pub fn child_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .children()
            .map(|p| baton_proto::path::name(p))
            .collect();
        names.sort_unstable();
        names
    }
}

/// The ephemeral nodes of one session. Most sessions own none or one (a
/// lock contender owns one), kept without an allocation; a few are kept in
/// a small vector, and a session with many switches to a hash set so that
/// deleting one stays cheap.
#[derive(Debug, Clone, Default)]
pub struct Ephemerals(Repr);

#[derive(Debug, Clone)]
enum Repr {
    One(Arc<str>),
    Few(Vec<Arc<str>>),
    // Shared, so that copying the session (a snapshot's copy of the state
    // shares it, until either changes it) costs no copy of the set.
    Many(Arc<std::collections::HashSet<Arc<str>>>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Few(Vec::new())
    }
}

const FEW: usize = 16;

impl Ephemerals {
    pub(super) fn insert(&mut self, path: Arc<str>) {
        match &mut self.0 {
            Repr::Few(v) if v.is_empty() => self.0 = Repr::One(path),
            Repr::One(one) => self.0 = Repr::Few(vec![one.clone(), path]),
            Repr::Few(v) if v.len() < FEW => v.push(path),
            Repr::Few(v) => {
                let mut set: std::collections::HashSet<Arc<str>> = v.drain(..).collect();
                set.insert(path);
                self.0 = Repr::Many(Arc::new(set));
            }
            Repr::Many(s) => {
                Arc::make_mut(s).insert(path);
            }
        }
    }

    pub(super) fn remove(&mut self, path: &str) {
        match &mut self.0 {
            Repr::One(one) => {
                if &**one == path {
                    self.0 = Repr::default();
                }
            }
            Repr::Few(v) => {
                if let Some(i) = v.iter().position(|p| &**p == path) {
                    v.swap_remove(i);
                    if v.len() == 1 {
                        self.0 = Repr::One(v.pop().expect("one left"));
                    }
                }
            }
            Repr::Many(s) => {
                if s.contains(path) {
                    Arc::make_mut(s).remove(path);
                }
            }
        }
    }

    pub fn contains(&self, path: &str) -> bool {
        match &self.0 {
            Repr::One(one) => &**one == path,
            Repr::Few(v) => v.iter().any(|p| &**p == path),
            Repr::Many(s) => s.contains(path),
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::One(_) => 1,
            Repr::Few(v) => v.len(),
            Repr::Many(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = &Arc<str>> + '_> {
        match &self.0 {
            Repr::One(one) => Box::new(std::iter::once(one)),
            Repr::Few(v) => Box::new(v.iter()),
            Repr::Many(s) => Box::new(s.iter()),
        }
    }

    pub(super) fn into_vec(self) -> Vec<Arc<str>> {
        match self.0 {
            Repr::One(one) => vec![one],
            Repr::Few(v) => v,
            Repr::Many(s) => Arc::unwrap_or_clone(s).into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session's ephemerals go from none to one (no allocation) to a few
    /// to many and back, and are found and listed all along.
    #[test]
    fn ephemerals_of_any_number() {
        let mut e = Ephemerals::default();
        let paths: Vec<Arc<str>> = (0..40).map(|i| Arc::from(format!("/e{i}"))).collect();
        for (n, p) in paths.iter().enumerate() {
            e.insert(p.clone());
            assert_eq!(e.len(), n + 1);
            assert!(paths[..=n].iter().all(|p| e.contains(p)));
        }
        assert!(matches!(e.0, Repr::Many(_)));
        let copy = e.clone();
        for (n, p) in paths.iter().enumerate().rev() {
            e.remove(p);
            e.remove("/absent");
            assert_eq!(e.len(), n);
            assert!(!e.contains(p));
            assert_eq!(e.iter().count(), n);
        }
        assert!(e.is_empty());
        assert_eq!(copy.len(), 40, "a copy keeps its set");
        let mut few = Ephemerals::default();
        few.insert(paths[0].clone());
        assert!(matches!(few.0, Repr::One(_)));
        few.insert(paths[1].clone());
        few.remove(&paths[0]);
        assert!(matches!(&few.0, Repr::One(p) if *p == paths[1]));
        assert_eq!(few.into_vec(), vec![paths[1].clone()]);
    }
}
