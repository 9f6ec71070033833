//! Persistent watches, plain and recursive, and the history of recent
//! events that lets a client resume them after a reconnect.
//!
//! A persistent watch stays armed until it is removed or its session (or
//! connection) goes. A plain one on P reports every change to P: its
//! creation, deletion, data changes and changes to its list of children. A
//! recursive one on P reports the creation, deletion and data changes of P
//! and of every node below it (not the children lists, whose changes are
//! those creations and deletions). A session gets one event per change and
//! path, however many of its watches (one-shot or persistent) it concerns.
//!
//! The server keeps the events of the latest changes, in revision order,
//! up to a bound. A client that lost its connection sets its persistent
//! watches again with the last revision it saw; the server replays the
//! events it missed from this history, or, if the history no longer goes
//! back that far, sends one `compacted` event, after which the client
//! reads afresh. Like the other watches, these belong to this server and
//! not to the state machine; every cluster member records the history as
//! it applies the log, so a new leader can replay what the old one sent.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use baton_proto::{path, EventKind, SessionId};

use crate::watches::watch_cost;

/// One watch: its session and whether it covers the subtree.
type Entry = (SessionId, bool);

/// Each path's watches, in the order they were set, and each session's
/// watches with what they count for: a watch is set, looked up, and a
/// session's watches forgotten when it ends, at the same cost however many
/// other sessions watch the same path (every client of a fleet watching
/// one subtree, say).
#[derive(Debug, Default)]
pub(crate) struct PersistentWatches {
    by_path: HashMap<Arc<str>, Watchers>,
    /// How many recursive watches there are (none: no ancestor walk).
    recursive: usize,
    by_session: HashMap<SessionId, Mine>,
    count: usize,
}

/// The watches set on one path, in the order they were set. Those of a
/// session that ended stay, counted in `ended`, until they outnumber the
/// rest: the list is then rebuilt without them, so it holds at most twice
/// the watches that are still set. Firing skips them.
#[derive(Debug, Default)]
struct Watchers {
    entries: Vec<Entry>,
    ended: usize,
}

/// One session's persistent watches: for each path, which of the two
/// kinds (see [`bit`]), and the bytes they count for.
#[derive(Debug, Default)]
struct Mine {
    paths: HashMap<Arc<str>, u8>,
    bytes: usize,
}

/// The bit of a session's kinds on a path that stands for a recursive
/// watch, or a plain one.
fn bit(recursive: bool) -> u8 {
    if recursive {
        2
    } else {
        1
    }
}

impl PersistentWatches {
    /// Sets `session`'s persistent watch on `path` (recursive or not); one
    /// already set is kept. Returns the bytes it adds to the session's
    /// watches (0 if it was set already).
    pub(crate) fn add(&mut self, session: SessionId, path: &str, recursive: bool) -> usize {
        if self.has(session, path, recursive) {
            return 0;
        }
        let key = match self.by_path.get_key_value(path) {
            Some((k, _)) => k.clone(),
            None => Arc::from(path),
        };
        self.by_path
            .entry(key.clone())
            .or_default()
            .entries
            .push((session, recursive));
        let cost = watch_cost(path);
        let mine = self.by_session.entry(session).or_default();
        *mine.paths.entry(key).or_default() |= bit(recursive);
        mine.bytes += cost;
        self.count += 1;
        self.recursive += recursive as usize;
        cost
    }

    /// Whether `session` has this watch.
    pub(crate) fn has(&self, session: SessionId, path: &str, recursive: bool) -> bool {
        self.by_session
            .get(&session)
            .and_then(|mine| mine.paths.get(path))
            .is_some_and(|kinds| kinds & bit(recursive) != 0)
    }

    /// The bytes `session`'s persistent watches count for.
    pub(crate) fn bytes(&self, session: SessionId) -> usize {
        self.by_session.get(&session).map_or(0, |mine| mine.bytes)
    }

    /// Removes `session`'s persistent watches on `path` (both kinds).
    pub(crate) fn remove(&mut self, session: SessionId, path: &str) {
        let Some(mine) = self.by_session.get_mut(&session) else {
            return;
        };
        let Some(kinds) = mine.paths.remove(path) else {
            return;
        };
        let set = kinds.count_ones() as usize;
        mine.bytes -= set * watch_cost(path);
        if mine.paths.is_empty() {
            self.by_session.remove(&session);
        }
        self.count -= set;
        self.recursive -= usize::from(kinds & bit(true) != 0);
        let Some(watchers) = self.by_path.get_mut(path) else {
            return;
        };
        watchers.entries.retain(|e| e.0 != session);
        if watchers.tidy(&self.by_session, path) {
            self.by_path.remove(path);
        }
    }

    /// Forgets every persistent watch of a session.
    pub(crate) fn remove_session(&mut self, session: SessionId) {
        let Some(mine) = self.by_session.remove(&session) else {
            return;
        };
        for (path, kinds) in mine.paths {
            let set = kinds.count_ones() as usize;
            self.count -= set;
            self.recursive -= usize::from(kinds & bit(true) != 0);
            let Some(watchers) = self.by_path.get_mut(&path) else {
                continue;
            };
            watchers.ended += set;
            if watchers.tidy(&self.by_session, &path) {
                self.by_path.remove(&path);
            }
        }
    }

    /// Appends the sessions whose persistent watches an event of `kind` on
    /// `path` concerns (a session may appear twice; the caller sends one
    /// event per session).
    pub(crate) fn fire(&self, target: &str, kind: EventKind, out: &mut Vec<SessionId>) {
        if self.count == 0 {
            return;
        }
        // A watch of a session that ended is skipped: its session has no
        // watches left (session ids are never used again).
        let set = |s: &SessionId| self.by_session.contains_key(s);
        if let Some(watchers) = self.by_path.get(target) {
            // A plain watch reports every change to its node; a recursive
            // one all but changes to children lists.
            out.extend(
                watchers
                    .entries
                    .iter()
                    .filter(|(s, r)| (!*r || kind != EventKind::ChildrenChanged) && set(s))
                    .map(|(s, _)| *s),
            );
        }
        if self.recursive == 0 || kind == EventKind::ChildrenChanged {
            return;
        }
        let mut at = target;
        while let Some(parent) = path::parent(at) {
            if let Some(watchers) = self.by_path.get(parent) {
                out.extend(
                    watchers
                        .entries
                        .iter()
                        .filter(|(s, r)| *r && set(s))
                        .map(|(s, _)| *s),
                );
            }
            at = parent;
        }
    }

    /// Whether an event of `kind` on `target` concerns a persistent watch
    /// on `path` (recursive or not).
    pub(crate) fn covers(path: &str, recursive: bool, target: &str, kind: EventKind) -> bool {
        if target == path {
            return !recursive || kind != EventKind::ChildrenChanged;
        }
        recursive && kind != EventKind::ChildrenChanged && path::is_within(target, path)
    }

    /// Number of persistent watches.
    pub(crate) fn len(&self) -> usize {
        self.count
    }
}

impl Watchers {
    /// Drops the watches of sessions that ended once they outnumber the
    /// rest (of `by_session`, the watches still set on `path`); whether none
    /// is left.
    fn tidy(&mut self, by_session: &HashMap<SessionId, Mine>, path: &str) -> bool {
        if 2 * self.ended > self.entries.len() {
            self.entries.retain(|(s, recursive)| {
                by_session
                    .get(s)
                    .and_then(|mine| mine.paths.get(path))
                    .is_some_and(|kinds| kinds & bit(*recursive) != 0)
            });
            self.ended = 0;
            if self.entries.capacity() > 4 * self.entries.len().max(4) {
                self.entries.shrink_to_fit();
            }
        }
        self.entries.is_empty()
    }
}

/// The events of the latest changes, oldest first, up to a bound.
#[derive(Debug)]
pub(crate) struct History {
    events: VecDeque<(u64, EventKind, Arc<str>)>,
    limit: usize,
    /// Every event of a change after this revision is held.
    complete_after: u64,
}

/// The history no longer holds every event after the revision asked for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Compacted;

impl History {
    /// A history holding up to `limit` events, complete after `revision`
    /// (the state it starts from).
    pub(crate) fn new(limit: usize, revision: u64) -> Self {
        History {
            events: VecDeque::new(),
            limit,
            complete_after: revision,
        }
    }

    pub(crate) fn record(&mut self, revision: u64, kind: EventKind, path: &Arc<str>) {
        if self.limit == 0 {
            self.complete_after = revision;
            return;
        }
        if self.events.len() == self.limit {
            if let Some((old, _, _)) = self.events.pop_front() {
                // The events of `old` may no longer all be here.
                self.complete_after = self.complete_after.max(old);
            }
        }
        if self.events.len() == self.events.capacity() {
            // Grown as a queue grows (doubling), but never past the limit:
            // a full history holds no room it will not use.
            let want = (self.events.capacity() * 2).max(4).min(self.limit);
            self.events.reserve_exact(want - self.events.len());
        }
        self.events.push_back((revision, kind, path.clone()));
    }

    /// The events after revision `from`, oldest first.
    ///
    /// # Errors
    /// [`Compacted`] if some of them are no longer held.
    pub(crate) fn since(
        &self,
        from: u64,
    ) -> Result<impl Iterator<Item = &(u64, EventKind, Arc<str>)>, Compacted> {
        if from < self.complete_after {
            return Err(Compacted);
        }
        let start = self.events.partition_point(|(r, _, _)| *r <= from);
        Ok(self.events.range(start..))
    }

    /// Forgets everything: the state was replaced (a snapshot installed),
    /// so no event can be replayed from before `revision`.
    pub(crate) fn reset(&mut self, revision: u64) {
        self.events.clear();
        self.complete_after = revision;
    }
}

#[cfg(test)]
mod tests {
    /// A full history holds `limit` events and no room past them (a
    /// queue left to double would hold 16,384 slots for the default 10,000).
    #[test]
    fn a_history_grows_to_its_limit_and_no_further() {
        for limit in [1, 3, 10_000] {
            let mut history = super::History::new(limit, 0);
            let path: std::sync::Arc<str> = "/a".into();
            for revision in 1..=2 * limit as u64 + 5 {
                history.record(revision, baton_proto::EventKind::Created, &path);
            }
            assert_eq!(history.events.len(), limit);
            assert_eq!(history.events.capacity(), limit);
        }
    }

    use super::*;

    fn fired(w: &PersistentWatches, path: &str, kind: EventKind) -> Vec<u64> {
        let mut out = Vec::new();
        w.fire(path, kind, &mut out);
        let mut ids: Vec<u64> = out.into_iter().map(|s| s.0).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn plain_watches_see_their_node_and_recursive_ones_the_subtree() {
        let mut w = PersistentWatches::default();
        w.add(SessionId(1), "/a", false);
        w.add(SessionId(2), "/a", true);
        w.add(SessionId(3), "/a/b", true);
        assert_eq!(fired(&w, "/a", EventKind::ChildrenChanged), [1]);
        assert_eq!(fired(&w, "/a", EventKind::DataChanged), [1, 2]);
        assert_eq!(fired(&w, "/a/b/c", EventKind::Created), [2, 3]);
        assert_eq!(
            fired(&w, "/a/b/c", EventKind::ChildrenChanged),
            Vec::<u64>::new()
        );
        assert_eq!(fired(&w, "/ab", EventKind::Created), Vec::<u64>::new());
        assert!(PersistentWatches::covers(
            "/a",
            true,
            "/a/b/c",
            EventKind::Deleted
        ));
        assert!(!PersistentWatches::covers(
            "/a",
            true,
            "/ab",
            EventKind::Deleted
        ));
        assert!(PersistentWatches::covers(
            "/a",
            false,
            "/a",
            EventKind::ChildrenChanged
        ));
        assert!(!PersistentWatches::covers(
            "/a",
            false,
            "/a/b",
            EventKind::Created
        ));
        assert_eq!(w.add(SessionId(1), "/a", false), 0, "set once");
        assert_eq!(w.len(), 3);
        w.remove(SessionId(2), "/a");
        assert_eq!(fired(&w, "/a/b", EventKind::Deleted), [3]);
        w.remove_session(SessionId(3));
        w.remove_session(SessionId(1));
        assert_eq!((w.len(), w.recursive), (0, 0));
        assert!(w.by_path.is_empty() && w.by_session.is_empty());
    }

    /// Against a plain set of (session, path, recursive), over a long run
    /// of random adds, removals and ended sessions (each followed by a new
    /// one, as session ids are never used again): every event concerns the
    /// same watches, counts and budgets agree, and a path lists at most
    /// twice the watches still set on it.
    #[test]
    fn persistent_watches_agree_with_a_plain_model() {
        use std::collections::BTreeSet;
        for seed in [0x9e37_79b9_7f4a_7c15u64, 11, 0xdead_beef_cafe_f00d] {
            let mut w = PersistentWatches::default();
            let mut model: BTreeSet<(u64, &str, bool)> = BTreeSet::new();
            let paths = ["/a", "/a/b", "/a/b/c", "/d"];
            let kinds = [
                EventKind::Created,
                EventKind::DataChanged,
                EventKind::ChildrenChanged,
                EventKind::Deleted,
            ];
            let mut rng = crate::sim::Rng::new(seed);
            let mut next = move |n: u64| rng.below(n);
            let mut live: Vec<u64> = (0..6).collect();
            for _ in 0..20_000 {
                let slot = next(6) as usize;
                let session = live[slot];
                let path = paths[next(4) as usize];
                match next(10) {
                    0..=5 => {
                        let recursive = next(2) == 1;
                        let added = w.add(SessionId(session), path, recursive);
                        let new = model.insert((session, path, recursive));
                        assert_eq!(added, if new { watch_cost(path) } else { 0 });
                    }
                    6 => {
                        w.remove(SessionId(session), path);
                        model.retain(|(s, p, _)| !(*s == session && *p == path));
                    }
                    _ => {
                        w.remove_session(SessionId(session));
                        model.retain(|(s, _, _)| *s != session);
                        live[slot] = live.iter().max().unwrap() + 1;
                    }
                }
                let target = paths[next(4) as usize];
                let kind = kinds[next(4) as usize];
                let mut want: Vec<u64> = model
                    .iter()
                    .filter(|(_, p, r)| PersistentWatches::covers(p, *r, target, kind))
                    .map(|(s, _, _)| *s)
                    .collect();
                want.sort_unstable();
                assert_eq!(fired(&w, target, kind), want, "{kind:?} on {target}");
                assert_eq!(w.len(), model.len());
                assert_eq!(w.recursive, model.iter().filter(|(_, _, r)| *r).count());
                for &session in &live {
                    let held: usize = model
                        .iter()
                        .filter(|(s, _, _)| *s == session)
                        .map(|(_, p, _)| watch_cost(p))
                        .sum();
                    assert_eq!(w.bytes(SessionId(session)), held);
                }
                for path in paths {
                    let set = model.iter().filter(|(_, p, _)| *p == path).count();
                    let (listed, ended) = w
                        .by_path
                        .get(path)
                        .map_or((0, 0), |l| (l.entries.len(), l.ended));
                    assert_eq!(listed - ended, set, "{path}");
                    assert!(2 * ended <= listed, "{path}: {ended} of {listed} ended");
                }
            }
        }
    }

    #[test]
    fn the_history_replays_what_it_holds_and_says_when_it_does_not() {
        let mut h = History::new(4, 10);
        let p: Arc<str> = Arc::from("/a");
        for r in [11, 12, 12, 13] {
            h.record(r, EventKind::DataChanged, &p);
        }
        let revisions = |h: &History, from| {
            h.since(from)
                .map(|events| events.map(|(r, _, _)| *r).collect::<Vec<_>>())
        };
        assert_eq!(revisions(&h, 10), Ok(vec![11, 12, 12, 13]));
        assert_eq!(revisions(&h, 12), Ok(vec![13]));
        assert_eq!(revisions(&h, 13), Ok(vec![]));
        assert_eq!(revisions(&h, 9), Err(Compacted), "before the history began");
        // One event of revision 12 goes: 12 is no longer complete.
        h.record(14, EventKind::Deleted, &p);
        h.record(15, EventKind::Created, &p);
        assert_eq!(revisions(&h, 11), Err(Compacted));
        assert_eq!(revisions(&h, 12), Ok(vec![13, 14, 15]));
        h.reset(20);
        assert_eq!(revisions(&h, 15), Err(Compacted));
        assert_eq!(revisions(&h, 20), Ok(vec![]));
    }
}
