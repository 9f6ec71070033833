//! A persistent ordered map, laid out to be small: a B+ tree whose nodes are
//! shared between copies.
//!
//! Cloning the map is O(1) (one reference count); a change after a clone
//! copies only the nodes on the path to what it changes (a leaf of at most
//! [`MAX`] entries, its ancestors, and perhaps a sibling leaf), so a snapshot
//! can hold a copy of the state while the original goes on changing.
//!
//! Entries sit side by side in their leaf, so an entry costs its own size
//! plus a small share of its leaf's and ancestors' headers and of the room
//! left in its leaf. In a hash trie or a red-black tree (persistent maps too)
//! each entry is an allocation of its own plus a node pointing at it: some
//! 90 bytes more per entry. Leaves are kept full: a full leaf gives entries
//! to a sibling with room before it splits, and one that keys only grow (or
//! only fall) into, as session ids and creation revisions do, is left full
//! when it splits. [`Unshared`] is the same tree for a map that is never
//! copied.
//!
//! Nothing here hashes, so the order of the entries, and of iteration, is
//! the keys' order on every server.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// Most entries in a leaf, and most children of an inner node.
const MAX: usize = 32;
/// A node with fewer takes entries from a sibling, or merges with it.
const MIN: usize = MAX / 4;

/// A persistent ordered map (see the module's documentation).
pub struct PMap<K, V> {
    root: Option<Arc<Node<K, V>>>,
}

#[derive(Clone)]
enum Node<K, V> {
    Leaf(Vec<(K, V)>),
    // Boxed so that a leaf (the common node) is small.
    Inner(Box<Inner<K, V>>),
}

#[derive(Clone)]
struct Inner<K, V> {
    /// Entries under this node.
    len: usize,
    /// `keys[i]` separates `kids[i]` and `kids[i + 1]`: every key of
    /// `kids[i]` is less than it, every key of `kids[i + 1]` at least it.
    keys: Vec<K>,
    kids: Vec<Arc<Node<K, V>>>,
}

impl<K, V> Node<K, V> {
    fn len(&self) -> usize {
        match self {
            Node::Leaf(entries) => entries.len(),
            Node::Inner(inner) => inner.len,
        }
    }
}

impl<K: Ord, V> Inner<K, V> {
    /// The child whose keys include `q`'s place.
    fn route<Q>(&self, q: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.keys.partition_point(|k| k.borrow() <= q)
    }
}

/// What an insert did below a node.
enum Inserted<K, V> {
    /// The key was there: its previous value.
    Replaced(V),
    Added,
    /// Added, and the node split: the separator and the new right sibling.
    Split(K, Node<K, V>),
}

impl<K, V> Default for PMap<K, V> {
    fn default() -> Self {
        PMap { root: None }
    }
}

impl<K, V> Clone for PMap<K, V> {
    fn clone(&self) -> Self {
        PMap {
            root: self.root.clone(),
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for PMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'a, K, V> IntoIterator for &'a PMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Iter<'a, K, V> {
        self.iter()
    }
}

impl<K, V> PMap<K, V> {
    pub fn new() -> Self {
        PMap { root: None }
    }

    pub fn len(&self) -> usize {
        self.root.as_ref().map_or(0, |r| r.len())
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// The entries in key order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        let mut iter = Iter {
            stack: Vec::new(),
            leaf: [].iter(),
        };
        if let Some(root) = &self.root {
            iter.descend(root);
        }
        iter
    }

    /// The values in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

impl<K: Ord, V> PMap<K, V> {
    pub fn get_key_value<Q>(&self, q: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let mut node = self.root.as_deref()?;
        loop {
            match node {
                Node::Inner(inner) => node = &inner.kids[inner.route(q)],
                Node::Leaf(entries) => {
                    let i = entries.binary_search_by(|(k, _)| k.borrow().cmp(q)).ok()?;
                    let (k, v) = &entries[i];
                    return Some((k, v));
                }
            }
        }
    }

    pub fn get<Q>(&self, q: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get_key_value(q).map(|(_, v)| v)
    }

    pub fn contains_key<Q>(&self, q: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get_key_value(q).is_some()
    }

    /// The entry with the least key.
    pub fn first(&self) -> Option<(&K, &V)> {
        let mut node = self.root.as_deref()?;
        loop {
            match node {
                Node::Inner(inner) => node = &inner.kids[0],
                Node::Leaf(entries) => return entries.first().map(|(k, v)| (k, v)),
            }
        }
    }

    /// The entry with the greatest key less than `q`.
    pub fn last_below<Q>(&self, q: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        fn last<K, V>(mut node: &Node<K, V>) -> Option<(&K, &V)> {
            loop {
                match node {
                    Node::Inner(inner) => node = inner.kids.last()?,
                    Node::Leaf(entries) => return entries.last().map(|(k, v)| (k, v)),
                }
            }
        }
        fn below<'a, K: Ord + Borrow<Q>, V, Q: Ord + ?Sized>(
            node: &'a Node<K, V>,
            q: &Q,
        ) -> Option<(&'a K, &'a V)> {
            match node {
                Node::Leaf(entries) => {
                    let i = entries.partition_point(|(k, _)| k.borrow() < q);
                    i.checked_sub(1).map(|i| (&entries[i].0, &entries[i].1))
                }
                Node::Inner(inner) => {
                    let i = inner.route(q);
                    // Every key of the children before `i` is less than `q`.
                    below(&inner.kids[i], q)
                        .or_else(|| i.checked_sub(1).and_then(|i| last(&inner.kids[i])))
                }
            }
        }
        below(self.root.as_deref()?, q)
    }
}

impl<K: Ord + Clone, V: Clone> PMap<K, V> {
    /// The value at `q`, to change: the path to it is copied first if a copy
    /// of the map shares it.
    pub fn get_mut<Q>(&mut self, q: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get_mut_with(q, Arc::make_mut)
    }

    /// Inserts `value` at `key`, returning the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.insert_with(key, value, Arc::make_mut)
    }

    /// Removes the entry at `q`, returning it.
    pub fn remove<Q>(&mut self, q: &Q) -> Option<(K, V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.remove_with(q, Arc::make_mut)
    }
}

/// How a change gets at a node to change it: [`Arc::make_mut`] for a
/// persistent map (a node a copy shares is copied first), [`unique`] for an
/// [`Unshared`] one.
type Mut<K, V> = fn(&mut Arc<Node<K, V>>) -> &mut Node<K, V>;

fn unique<K, V>(node: &mut Arc<Node<K, V>>) -> &mut Node<K, V> {
    Arc::get_mut(node).expect("an unshared map's nodes are never shared")
}

impl<K: Ord + Clone, V> PMap<K, V> {
    fn get_mut_with<Q>(&mut self, q: &Q, make_mut: Mut<K, V>) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        // Nothing is copied for a key that is not there.
        if !self.contains_key(q) {
            return None;
        }
        let mut node = make_mut(self.root.as_mut()?);
        loop {
            match node {
                Node::Inner(inner) => {
                    let i = inner.route(q);
                    node = make_mut(&mut inner.kids[i]);
                }
                Node::Leaf(entries) => {
                    let i = entries.binary_search_by(|(k, _)| k.borrow().cmp(q)).ok()?;
                    return Some(&mut entries[i].1);
                }
            }
        }
    }

    fn insert_with(&mut self, key: K, value: V, make_mut: Mut<K, V>) -> Option<V> {
        let Some(root) = &mut self.root else {
            self.root = Some(Arc::new(Node::Leaf(vec![(key, value)])));
            return None;
        };
        match insert(make_mut(root), key, value, make_mut) {
            Inserted::Replaced(old) => Some(old),
            Inserted::Added => None,
            Inserted::Split(separator, right) => {
                let left = self.root.take().expect("a root");
                let len = left.len() + right.len();
                self.root = Some(Arc::new(Node::Inner(Box::new(Inner {
                    len,
                    keys: vec![separator],
                    kids: vec![left, Arc::new(right)],
                }))));
                None
            }
        }
    }

    fn remove_with<Q>(&mut self, q: &Q, make_mut: Mut<K, V>) -> Option<(K, V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        // Nothing is copied for a key that is not there.
        if !self.contains_key(q) {
            return None;
        }
        let removed = remove(make_mut(self.root.as_mut()?), q, make_mut);
        // A root with one child gives way to it; an empty root to nothing.
        loop {
            match self.root.as_deref() {
                Some(Node::Inner(inner)) if inner.kids.len() == 1 => {
                    self.root = Some(inner.kids[0].clone());
                }
                Some(root) if root.len() == 0 => self.root = None,
                _ => break,
            }
        }
        removed
    }
}

fn insert<K: Ord + Clone, V>(
    node: &mut Node<K, V>,
    key: K,
    value: V,
    make_mut: Mut<K, V>,
) -> Inserted<K, V> {
    match node {
        Node::Leaf(entries) => {
            let i = match entries.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(i) => return Inserted::Replaced(std::mem::replace(&mut entries[i].1, value)),
                Err(i) => i,
            };
            if entries.len() < MAX {
                room_for_one(entries);
                entries.insert(i, (key, value));
                return Inserted::Added;
            }
            // Full (and its siblings too, or it has none). Keys that only
            // grow here leave it full: the new entry starts a leaf of its own
            // after it (before it, for keys that only fall). Else it splits
            // in half.
            let mid = match i {
                MAX => MAX,
                0 => 0,
                _ => MAX / 2,
            };
            let mut right = entries.split_off(mid);
            if i <= mid && i < MAX {
                room_for_one(entries);
                entries.insert(i, (key, value));
            } else {
                room_for_one(&mut right);
                right.insert(i - mid, (key, value));
            }
            let separator = right[0].0.clone();
            Inserted::Split(separator, Node::Leaf(right))
        }
        Node::Inner(inner) => {
            let i = inner.route(&key);
            if let Some(at) = room_beside(inner, i, &key, make_mut) {
                let Node::Leaf(entries) = make_mut(&mut inner.kids[i]) else {
                    unreachable!("room is made in leaves");
                };
                entries.insert(at, (key, value));
                if i > 0 {
                    inner.keys[i - 1] = entries[0].0.clone();
                }
                inner.len += 1;
                return Inserted::Added;
            }
            let kid = make_mut(&mut inner.kids[i]);
            let (separator, new) = match insert(kid, key, value, make_mut) {
                Inserted::Replaced(old) => return Inserted::Replaced(old),
                Inserted::Added => {
                    inner.len += 1;
                    return Inserted::Added;
                }
                Inserted::Split(separator, new) => (separator, new),
            };
            inner.len += 1;
            if inner.kids.len() < MAX {
                room_for_one(&mut inner.keys);
                room_for_one(&mut inner.kids);
                inner.keys.insert(i, separator);
                inner.kids.insert(i + 1, Arc::new(new));
                return Inserted::Added;
            }
            // Full: kids `..mid` stay (all of them if the new kid is the
            // last: keys that only grow leave it full, else half); the
            // separator between `mid - 1` and `mid` moves up.
            inner.keys.reserve_exact(1);
            inner.kids.reserve_exact(1);
            inner.keys.insert(i, separator);
            inner.kids.insert(i + 1, Arc::new(new));
            let mid = if i + 1 == MAX { MAX } else { MAX / 2 + 1 };
            let kids = inner.kids.split_off(mid);
            let keys = inner.keys.split_off(mid);
            let up = inner.keys.pop().expect("a separator before the split");
            let len: usize = kids.iter().map(|k| k.len()).sum();
            inner.len -= len;
            Inserted::Split(up, Node::Inner(Box::new(Inner { len, keys, kids })))
        }
    }
}

/// If `key` goes inside kid `i` of `inner`, a full leaf without it, and a
/// sibling leaf has room: moves entries to that sibling (half its room, at
/// most the entries on that side of the key) and returns where in kid `i`
/// the key now goes. The separator between kid `i` and its sibling on the
/// right is set here; the caller sets the one on its left once the key is
/// in. Giving a neighbour entries before splitting keeps leaves fuller (four
/// fifths rather than two thirds, for keys that come in no order).
fn room_beside<K: Ord + Clone, V>(
    inner: &mut Inner<K, V>,
    i: usize,
    key: &K,
    make_mut: Mut<K, V>,
) -> Option<usize> {
    let room = |kid: &Node<K, V>| match kid {
        Node::Leaf(entries) => MAX - entries.len(),
        Node::Inner(_) => 0,
    };
    let Node::Leaf(entries) = &*inner.kids[i] else {
        return None;
    };
    if entries.len() < MAX {
        return None;
    }
    let p = entries.binary_search_by(|(k, _)| k.cmp(key)).err()?;
    if p == 0 || p == MAX {
        return None;
    }
    if i > 0 && room(&inner.kids[i - 1]) > 0 {
        let m = room(&inner.kids[i - 1]).div_ceil(2).min(p);
        let (before, from) = inner.kids.split_at_mut(i);
        let (Node::Leaf(left), Node::Leaf(full)) =
            (make_mut(&mut before[i - 1]), make_mut(&mut from[0]))
        else {
            unreachable!("checked above");
        };
        left.reserve_exact(m);
        left.extend(full.drain(..m));
        return Some(p - m);
    }
    if i + 1 < inner.kids.len() && room(&inner.kids[i + 1]) > 0 {
        let m = room(&inner.kids[i + 1]).div_ceil(2).min(MAX - p);
        let (to, after) = inner.kids.split_at_mut(i + 1);
        let (Node::Leaf(full), Node::Leaf(right)) = (make_mut(&mut to[i]), make_mut(&mut after[0]))
        else {
            unreachable!("checked above");
        };
        right.reserve_exact(m);
        right.splice(0..0, full.drain(MAX - m..));
        inner.keys[i] = right[0].0.clone();
        return Some(p);
    }
    None
}

/// Makes room in `v` for one more element, growing it as a vector does
/// (doubling) but never past [`MAX`]: a full node holds no spare room.
fn room_for_one<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        let want = (v.capacity() * 2).clamp(4, MAX);
        v.reserve_exact(want.saturating_sub(v.len()).max(1));
    }
}

fn remove<K, V, Q>(node: &mut Node<K, V>, q: &Q, make_mut: Mut<K, V>) -> Option<(K, V)>
where
    K: Ord + Clone + Borrow<Q>,
    Q: Ord + ?Sized,
{
    match node {
        Node::Leaf(entries) => {
            let i = entries.binary_search_by(|(k, _)| k.borrow().cmp(q)).ok()?;
            let removed = entries.remove(i);
            // Memory goes back as a leaf empties.
            if entries.capacity() > 8 && entries.len() <= entries.capacity() / 4 {
                entries.shrink_to(entries.len() * 2);
            }
            Some(removed)
        }
        Node::Inner(inner) => {
            let i = inner.route(q);
            let removed = remove(make_mut(&mut inner.kids[i]), q, make_mut)?;
            inner.len -= 1;
            let left = inner.kids[i].len();
            if left == 0 {
                // No node but the root is ever empty.
                inner.kids.remove(i);
                if !inner.keys.is_empty() {
                    inner.keys.remove(i.saturating_sub(1));
                }
            } else if left < MIN && inner.kids.len() > 1 {
                rebalance(inner, i, make_mut);
            }
            Some(removed)
        }
    }
}

/// Kid `i` of `inner` has become small: it merges with a sibling, or takes
/// entries from it so that both have at least [`MIN`]. (A node may hold
/// fewer where a full leaf split at its end, until it fills; no node but
/// the root is ever empty.)
fn rebalance<K: Ord + Clone, V>(inner: &mut Inner<K, V>, i: usize, make_mut: Mut<K, V>) {
    let a = if i > 0 { i - 1 } else { i };
    let b = a + 1;
    let (left, right) = inner.kids.split_at_mut(b);
    let (left, right) = (make_mut(&mut left[a]), make_mut(&mut right[0]));
    let total = left.len() + right.len();
    let separator = &mut inner.keys[a];
    match (left, right) {
        (Node::Leaf(l), Node::Leaf(r)) => {
            if total <= MAX {
                l.reserve_exact(r.len());
                l.append(r);
            } else {
                let want = total / 2;
                if l.len() < want {
                    l.extend(r.drain(..want - l.len()));
                } else {
                    let moved = l.split_off(want);
                    r.splice(0..0, moved);
                }
                *separator = r[0].0.clone();
                return;
            }
        }
        (Node::Inner(l), Node::Inner(r)) => {
            if l.kids.len() + r.kids.len() <= MAX {
                l.keys.reserve_exact(r.keys.len() + 1);
                l.kids.reserve_exact(r.kids.len());
                l.keys.push(separator.clone());
                l.keys.append(&mut r.keys);
                l.kids.append(&mut r.kids);
                l.len += r.len;
            } else {
                let want = (l.kids.len() + r.kids.len()) / 2;
                while l.kids.len() < want {
                    let kid = r.kids.remove(0);
                    let next = r.keys.remove(0);
                    l.keys.push(std::mem::replace(separator, next));
                    l.len += kid.len();
                    r.len -= kid.len();
                    l.kids.push(kid);
                }
                while l.kids.len() > want {
                    let kid = l.kids.pop().expect("kids");
                    let prev = l.keys.pop().expect("keys");
                    r.keys.insert(0, std::mem::replace(separator, prev));
                    l.len -= kid.len();
                    r.len += kid.len();
                    r.kids.insert(0, kid);
                }
                return;
            }
        }
        _ => unreachable!("siblings are at the same depth"),
    }
    // Merged into `a`: `b` and their separator go.
    inner.kids.remove(b);
    inner.keys.remove(a);
}

/// An ordered map laid out as a `PMap` (entries side by side in leaves)
/// that is never copied, so its values need not be `Clone`: for what this
/// server alone keeps about each session.
#[derive(Debug)]
pub struct Unshared<K, V>(PMap<K, V>);

impl<K, V> Default for Unshared<K, V> {
    fn default() -> Self {
        Unshared(PMap::new())
    }
}

impl<K: Ord + Clone, V> Unshared<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.values()
    }

    pub fn get<Q>(&self, q: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.get(q)
    }

    pub fn contains_key<Q>(&self, q: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.contains_key(q)
    }

    pub fn get_mut<Q>(&mut self, q: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.get_mut_with(q, unique)
    }

    /// Inserts `value` at `key`, returning the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0.insert_with(key, value, unique)
    }

    /// Removes the value at `q`, returning it.
    pub fn remove<Q>(&mut self, q: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.remove_with(q, unique).map(|(_, v)| v)
    }

    /// The entry with the least key.
    pub fn first(&self) -> Option<(&K, &V)> {
        self.0.first()
    }

    /// Removes the entry with the least key, returning it.
    pub fn pop_first(&mut self) -> Option<(K, V)> {
        let first = self.first()?.0.clone();
        self.0.remove_with(&first, unique)
    }

    pub fn clear(&mut self) {
        self.0 = PMap::new();
    }
}

/// The entries of a [`PMap`], in key order.
pub struct Iter<'a, K, V> {
    /// The inner nodes above the current leaf, each with the next kid to
    /// visit.
    stack: Vec<(&'a Inner<K, V>, usize)>,
    leaf: std::slice::Iter<'a, (K, V)>,
}

impl<'a, K, V> Iter<'a, K, V> {
    /// Goes down the leftmost path from `node` to a leaf.
    fn descend(&mut self, mut node: &'a Node<K, V>) {
        loop {
            match node {
                Node::Inner(inner) => {
                    self.stack.push((inner, 1));
                    node = &inner.kids[0];
                }
                Node::Leaf(entries) => {
                    self.leaf = entries.iter();
                    return;
                }
            }
        }
    }
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((k, v)) = self.leaf.next() {
                return Some((k, v));
            }
            let (inner, next) = self.stack.last_mut()?;
            if *next < inner.kids.len() {
                let kid = &inner.kids[*next];
                *next += 1;
                self.descend(kid);
            } else {
                self.stack.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    impl<K: Ord, V> PMap<K, V> {
        /// Checks the tree's invariants: separators bound their kids, counts
        /// add up, no node but the root is empty, leaves are at one depth.
        fn check(&self) {
            fn walk<K: Ord, V>(
                node: &Node<K, V>,
                lo: Option<&K>,
                hi: Option<&K>,
                root: bool,
            ) -> (usize, usize) {
                match node {
                    Node::Leaf(e) => {
                        assert!(e.len() <= MAX);
                        assert!(root || !e.is_empty());
                        assert!(e.windows(2).all(|w| w[0].0 < w[1].0));
                        if let (Some(lo), Some(first)) = (lo, e.first()) {
                            assert!(&first.0 >= lo);
                        }
                        if let (Some(hi), Some(last)) = (hi, e.last()) {
                            assert!(&last.0 < hi);
                        }
                        (e.len(), 0)
                    }
                    Node::Inner(inner) => {
                        assert_eq!(inner.keys.len() + 1, inner.kids.len());
                        assert!(inner.kids.len() <= MAX);
                        assert!(inner.kids.len() >= if root { 2 } else { 1 });
                        let mut total = 0;
                        let mut depth = None;
                        for (j, kid) in inner.kids.iter().enumerate() {
                            let lo = if j == 0 { lo } else { Some(&inner.keys[j - 1]) };
                            let hi = inner.keys.get(j).or(hi);
                            let (n, d) = walk(kid, lo, hi, false);
                            assert_eq!(n, kid.len());
                            assert!(depth.is_none_or(|x| x == d));
                            depth = Some(d);
                            total += n;
                        }
                        assert_eq!(total, inner.len);
                        (total, depth.unwrap() + 1)
                    }
                }
            }
            if let Some(root) = &self.root {
                assert!(root.len() > 0);
                walk(root, None, None, true);
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Snapshot,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u16..2000, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => (0u16..2000).prop_map(Op::Remove),
            1 => Just(Op::Snapshot),
        ]
    }

    proptest! {
        /// The map behaves as std's BTreeMap, and a copy keeps its contents
        /// whatever the original does afterwards.
        #[test]
        fn behaves_as_a_btreemap(ops in proptest::collection::vec(op(), 0..3000)) {
            let mut map = PMap::new();
            let mut unshared = Unshared::new();
            let mut model = BTreeMap::new();
            let mut copies = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        prop_assert_eq!(map.insert(k, v), model.insert(k, v));
                        unshared.insert(k, v);
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(unshared.remove(&k), model.get(&k).copied());
                        prop_assert_eq!(map.remove(&k), model.remove_entry(&k));
                    }
                    Op::Snapshot => copies.push((map.clone(), model.clone())),
                }
                prop_assert_eq!(map.len(), model.len());
                prop_assert_eq!(unshared.first(), model.first_key_value());
            }
            unshared.0.check();
            prop_assert!(unshared.0.iter().eq(model.iter()));
            while let Some((k, v)) = unshared.pop_first() {
                prop_assert_eq!(Some((&k, &v)), model.iter().find(|(m, _)| **m == k));
            }
            map.check();
            prop_assert!(map.iter().eq(model.iter()));
            for k in [0u16, 1, 500, 1999, 2000] {
                prop_assert_eq!(map.get(&k), model.get(&k));
                prop_assert_eq!(map.last_below(&k), model.range(..k).next_back());
            }
            for (copy, model) in copies {
                copy.check();
                prop_assert!(copy.iter().eq(model.iter()));
            }
        }
    }

    #[test]
    fn ascending_keys_fill_their_leaves() {
        let mut map = PMap::new();
        for k in 0..100_000u64 {
            map.insert(k, ());
        }
        map.check();
        let Some(Node::Inner(root)) = map.root.as_deref() else {
            panic!("a tree of 100,000 has inner nodes");
        };
        fn leaves<K, V>(n: &Node<K, V>, out: &mut Vec<usize>) {
            match n {
                Node::Leaf(e) => out.push(e.len()),
                Node::Inner(i) => i.kids.iter().for_each(|k| leaves(k, out)),
            }
        }
        let mut sizes = Vec::new();
        root.kids.iter().for_each(|k| leaves(k, &mut sizes));
        assert_eq!(sizes.len(), 100_000usize.div_ceil(MAX));
        for k in (0..100_000u64).step_by(7) {
            assert_eq!(map.last_below(&k).map(|(k, _)| *k), k.checked_sub(1));
            assert!(map.get_mut(&k).is_some());
        }
        for k in 0..99_990u64 {
            assert!(map.remove(&k).is_some());
        }
        map.check();
        assert_eq!(map.len(), 10);
        assert!(map.iter().map(|(k, _)| *k).eq(99_990..100_000));
    }

    #[test]
    fn descending_and_interleaved_keys_keep_the_invariants() {
        let mut map = PMap::new();
        for k in (0..20_000u64).rev() {
            map.insert(k, k);
        }
        map.check();
        for k in (0..20_000u64).step_by(3) {
            map.remove(&k);
        }
        map.check();
        for k in (0..20_000u64).filter(|k| k % 3 != 0).rev() {
            assert_eq!(map.remove(&k), Some((k, k)));
        }
        assert!(map.is_empty());
        map.check();
    }
}
