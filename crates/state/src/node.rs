//! One node of the tree, laid out to be small: a server holds one per
//! ephemeral lock contender, and there may be a hundred thousand.

use std::sync::Arc;

use baton_proto::{SessionId, Stat};

use super::pmap::PMap;
use super::NodeImage;
use bytes::Bytes;
use triomphe::ThinArc;

/// A node's data, shared: one allocation holding a reference count, the
/// length and the bytes, behind a pointer of 8 bytes (a shared slice's
/// pointer is 16). Nodes sit side by side in the tree's leaves, so the
/// pointer's size is paid by every node, with data or without.
#[derive(Clone)]
struct Data(ThinArc<(), u8>);

impl AsRef<[u8]> for Data {
    fn as_ref(&self) -> &[u8] {
        &self.0.slice
    }
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.as_ref().len())
    }
}

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
    data: Option<Data>,
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
        self.data = (!data.is_empty()).then(|| Data(ThinArc::from_header_and_slice((), data)));
    }

    /// The node's data, shared (not copied) with the caller.
    pub fn data(&self) -> Bytes {
        match &self.data {
            Some(d) => Bytes::from_owner(d.clone()),
            None => Bytes::new(),
        }
    }

    pub fn data_len(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.as_ref().len())
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
/// deleting one stays cheap. Either set is shared, so that copying the
/// session (a snapshot's copy of the state shares it, until either changes
/// it) costs no copy of the set; and the whole is 16 bytes, as small as the
/// one path it holds most often.
#[derive(Debug, Clone, Default)]
pub struct Ephemerals(Repr);

#[derive(Debug, Clone)]
enum Repr {
    One(Arc<str>),
    /// None, or more than one.
    Set(Option<Arc<Set>>),
}

#[derive(Debug, Clone)]
enum Set {
    /// At least two, at most [`FEW`].
    Few(Vec<Arc<str>>),
    Many(std::collections::HashSet<Arc<str>>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Set(None)
    }
}

const FEW: usize = 16;

impl Set {
    fn contains(&self, path: &str) -> bool {
        match self {
            Set::Few(v) => v.iter().any(|p| &**p == path),
            Set::Many(s) => s.contains(path),
        }
    }
}

impl Ephemerals {
    pub(super) fn insert(&mut self, path: Arc<str>) {
        match &mut self.0 {
            Repr::Set(None) => self.0 = Repr::One(path),
            Repr::One(one) => {
                self.0 = Repr::Set(Some(Arc::new(Set::Few(vec![one.clone(), path]))));
            }
            Repr::Set(Some(set)) => match Arc::make_mut(set) {
                Set::Few(v) if v.len() < FEW => v.push(path),
                Set::Few(v) => {
                    let mut many: std::collections::HashSet<Arc<str>> = v.drain(..).collect();
                    many.insert(path);
                    *Arc::make_mut(set) = Set::Many(many);
                }
                Set::Many(s) => {
                    s.insert(path);
                }
            },
        }
    }

    pub(super) fn remove(&mut self, path: &str) {
        match &mut self.0 {
            Repr::One(one) => {
                if &**one == path {
                    self.0 = Repr::default();
                }
            }
            Repr::Set(None) => {}
            Repr::Set(Some(set)) => {
                if !set.contains(path) {
                    return;
                }
                match Arc::make_mut(set) {
                    Set::Few(v) => {
                        let i = v.iter().position(|p| &**p == path).expect("contained");
                        v.swap_remove(i);
                        if v.len() == 1 {
                            self.0 = Repr::One(v.pop().expect("one left"));
                        }
                    }
                    Set::Many(s) => {
                        s.remove(path);
                    }
                }
            }
        }
    }

    pub fn contains(&self, path: &str) -> bool {
        match &self.0 {
            Repr::One(one) => &**one == path,
            Repr::Set(None) => false,
            Repr::Set(Some(set)) => set.contains(path),
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::One(_) => 1,
            Repr::Set(None) => 0,
            Repr::Set(Some(set)) => match &**set {
                Set::Few(v) => v.len(),
                Set::Many(s) => s.len(),
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = &Arc<str>> + '_> {
        match &self.0 {
            Repr::One(one) => Box::new(std::iter::once(one)),
            Repr::Set(None) => Box::new(std::iter::empty()),
            Repr::Set(Some(set)) => match &**set {
                Set::Few(v) => Box::new(v.iter()),
                Set::Many(s) => Box::new(s.iter()),
            },
        }
    }

    pub(super) fn into_vec(self) -> Vec<Arc<str>> {
        match self.0 {
            Repr::One(one) => vec![one],
            Repr::Set(None) => Vec::new(),
            Repr::Set(Some(set)) => match Arc::unwrap_or_clone(set) {
                Set::Few(v) => v,
                Set::Many(s) => s.into_iter().collect(),
            },
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
        assert!(matches!(&e.0, Repr::Set(Some(set)) if matches!(**set, Set::Many(_))));
        assert_eq!(std::mem::size_of::<Ephemerals>(), 16);
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
        assert!(copy.iter().all(|p| paths.contains(p)));
        let mut few = Ephemerals::default();
        few.insert(paths[0].clone());
        assert!(matches!(few.0, Repr::One(_)));
        few.insert(paths[1].clone());
        few.remove(&paths[0]);
        assert!(matches!(&few.0, Repr::One(p) if *p == paths[1]));
        assert_eq!(few.into_vec(), vec![paths[1].clone()]);
    }
}
