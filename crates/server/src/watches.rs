//! One-shot watches: which sessions wait for a change at which path.
//!
//! Watches are state of this server, not of the tree: they are not commands
//! and do not go through the state machine. A session holds at most one data
//! watch (set by exists or get data) and one child watch (set by get children)
//! per path; setting one twice is the same as once. A watch is removed when it
//! fires or when its session ends.

use std::collections::HashMap;
use std::sync::Arc;

use baton_proto::{EventKind, SessionId};

/// Which kinds of watch a session holds on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Kinds(u8);

impl Kinds {
    pub(crate) const DATA: Kinds = Kinds(1);
    pub(crate) const CHILD: Kinds = Kinds(2);

    /// The watch kinds an event of `kind` fires.
    fn fired_by(kind: EventKind) -> Kinds {
        match kind {
            EventKind::Created | EventKind::DataChanged => Kinds::DATA,
            EventKind::ChildrenChanged => Kinds::CHILD,
            EventKind::Deleted => Kinds::DATA.union(Kinds::CHILD),
            // Reported by queue watches only (see queues.rs), and to a
            // persistent watch set again (see persistent.rs).
            EventKind::Head | EventKind::Compacted => Kinds::default(),
        }
    }

    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every kind of `other` is among these.
    pub(crate) fn contains(self, other: Kinds) -> bool {
        self.0 & other.0 == other.0
    }

    pub(crate) fn union(self, other: Kinds) -> Kinds {
        Kinds(self.0 | other.0)
    }
}

/// What one watched (session, path) pair is counted as against the
/// session's budget: the path's bytes plus this, for the entries that keep
/// it (a share of a path key, an entry per path and per session).
pub(crate) const WATCH_OVERHEAD: usize = 64;

/// Bytes one watch on `path` counts for against its session's budget.
pub(crate) fn watch_cost(path: &str) -> usize {
    path.len() + WATCH_OVERHEAD
}

/// The sessions that watch each path, in the order they set their watch
/// there, and for each session the kinds it holds on each of its paths: a
/// watch is set or looked up at the same cost however many other sessions
/// watch the same path (10,000 sessions watching one node, say).
#[derive(Debug, Default)]
pub(crate) struct Watches {
    by_path: HashMap<Arc<str>, Vec<SessionId>>,
    by_session: HashMap<SessionId, SessionWatches>,
    count: usize,
}

/// The paths one session watches, the kinds on each, and what they count
/// for.
#[derive(Debug, Default)]
struct SessionWatches {
    paths: HashMap<Arc<str>, Kinds>,
    bytes: usize,
}

/// Setting a watch would take its session past its budget.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OverBudget {
    /// Bytes the session's watches count for now.
    pub(crate) held: usize,
    /// Bytes the refused watches would have added.
    pub(crate) wanted: usize,
}

impl Watches {
    /// Sets a watch of `kind` for `session` on `path`, unless it would take
    /// the session's watches past `budget` bytes (see [`watch_cost`]).
    /// Adding a kind to a path already watched costs nothing.
    pub(crate) fn add(
        &mut self,
        session: SessionId,
        path: &str,
        kind: Kinds,
        budget: usize,
    ) -> Result<(), OverBudget> {
        if let Some(kinds) = self
            .by_session
            .get_mut(&session)
            .and_then(|mine| mine.paths.get_mut(path))
        {
            *kinds = kinds.union(kind);
            return Ok(());
        }
        let cost = watch_cost(path);
        let held = self.bytes(session);
        if held + cost > budget {
            return Err(OverBudget { held, wanted: cost });
        }
        let key = match self.by_path.get_key_value(path) {
            Some((k, _)) => k.clone(),
            None => Arc::from(path),
        };
        self.by_path.entry(key.clone()).or_default().push(session);
        self.count += 1;
        let mine = self.by_session.entry(session).or_default();
        mine.paths.insert(key, kind);
        mine.bytes += cost;
        Ok(())
    }

    /// Whether `session` watches `path` already (any kind).
    pub(crate) fn watches(&self, session: SessionId, path: &str) -> bool {
        self.by_session
            .get(&session)
            .is_some_and(|w| w.paths.contains_key(path))
    }

    /// The kinds of watch `session` holds on `path`.
    pub(crate) fn kinds(&self, session: SessionId, path: &str) -> Kinds {
        self.by_session
            .get(&session)
            .and_then(|w| w.paths.get(path))
            .copied()
            .unwrap_or_default()
    }

    /// Bytes `session`'s watches count for against its budget.
    pub(crate) fn bytes(&self, session: SessionId) -> usize {
        self.by_session.get(&session).map_or(0, |w| w.bytes)
    }

    /// Removes and returns the sessions whose watches on `path` the event
    /// fires, each once, in the order they set them.
    pub(crate) fn fire(&mut self, path: &str, kind: EventKind, out: &mut Vec<SessionId>) {
        let fired = Kinds::fired_by(kind);
        let Some(sessions) = self.by_path.get_mut(path) else {
            return;
        };
        let by_session = &mut self.by_session;
        let before = sessions.len();
        sessions.retain(|&session| {
            let Some(held) = by_session
                .get(&session)
                .and_then(|mine| mine.paths.get(path))
            else {
                return false;
            };
            if held.0 & fired.0 == 0 {
                return true;
            }
            out.push(session);
            !take_off(by_session, session, path, fired)
        });
        self.count -= before - sessions.len();
        if sessions.is_empty() {
            self.by_path.remove(path);
        }
    }

    /// Removes `session`'s watches of `kind` on `path`.
    pub(crate) fn remove(&mut self, session: SessionId, path: &str, kind: Kinds) {
        if !self.watches(session, path) || !take_off(&mut self.by_session, session, path, kind) {
            return;
        }
        let Some(sessions) = self.by_path.get_mut(path) else {
            return;
        };
        if let Some(i) = sessions.iter().position(|s| *s == session) {
            sessions.remove(i);
            self.count -= 1;
        }
        if sessions.is_empty() {
            self.by_path.remove(path);
        }
    }

    /// Forgets every watch of an ended session.
    pub(crate) fn remove_session(&mut self, session: SessionId) {
        let Some(mine) = self.by_session.remove(&session) else {
            return;
        };
        for path in mine.paths.into_keys() {
            if let Some(sessions) = self.by_path.get_mut(&path) {
                let before = sessions.len();
                sessions.retain(|s| *s != session);
                self.count -= before - sessions.len();
                if sessions.is_empty() {
                    self.by_path.remove(&path);
                }
            }
        }
    }

    /// Number of (session, path) pairs watched.
    pub(crate) fn len(&self) -> usize {
        self.count
    }
}

/// Takes `kinds` off `session`'s watch on `path`; whether none is left
/// (the session then no longer watches the path, and its budget has the
/// path's cost back).
fn take_off(
    by_session: &mut HashMap<SessionId, SessionWatches>,
    session: SessionId,
    path: &str,
    kinds: Kinds,
) -> bool {
    let Some(mine) = by_session.get_mut(&session) else {
        return true;
    };
    let emptied = match mine.paths.get_mut(path) {
        Some(held) => {
            held.0 &= !kinds.0;
            held.is_empty()
        }
        None => true,
    };
    if emptied && mine.paths.remove(path).is_some() {
        mine.bytes -= watch_cost(path);
    }
    if mine.paths.is_empty() {
        by_session.remove(&session);
    }
    emptied
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each watched path counts against its session's budget until it
    /// fires or is removed; a refused watch is not set.
    #[test]
    fn watches_count_against_their_sessions_budget() {
        let mut w = Watches::default();
        let (a, b) = (SessionId(1), SessionId(2));
        let budget = 2 * watch_cost("/x");
        w.add(a, "/x", Kinds::DATA, budget).unwrap();
        w.add(a, "/x", Kinds::CHILD, budget).unwrap(); // same path: free
        w.add(a, "/y", Kinds::DATA, budget).unwrap();
        assert_eq!(w.bytes(a), budget);
        let refused = w.add(a, "/z", Kinds::DATA, budget).unwrap_err();
        assert_eq!(
            refused,
            OverBudget {
                held: budget,
                wanted: watch_cost("/z")
            }
        );
        assert!(!w.watches(a, "/z"));
        // Another session has its own budget.
        w.add(b, "/z", Kinds::DATA, budget).unwrap();
        let mut out = Vec::new();
        w.fire("/y", EventKind::DataChanged, &mut out);
        assert_eq!(w.bytes(a), watch_cost("/x"));
        w.add(a, "/z", Kinds::DATA, budget).unwrap();
        w.remove(a, "/x", Kinds::DATA.union(Kinds::CHILD));
        w.remove_session(b);
        assert_eq!(w.bytes(a), watch_cost("/z"));
        assert_eq!(w.bytes(b), 0);
    }

    #[test]
    fn a_watch_fires_once_per_session() {
        let mut w = Watches::default();
        let (a, b) = (SessionId(1), SessionId(2));
        w.add(a, "/x", Kinds::DATA, usize::MAX).unwrap();
        w.add(a, "/x", Kinds::DATA, usize::MAX).unwrap();
        w.add(b, "/x", Kinds::CHILD, usize::MAX).unwrap();
        let mut out = Vec::new();
        w.fire("/x", EventKind::DataChanged, &mut out);
        assert_eq!(out, [a]);
        out.clear();
        w.fire("/x", EventKind::DataChanged, &mut out);
        assert!(out.is_empty());
        w.fire("/x", EventKind::Deleted, &mut out);
        assert_eq!(out, [b]);
        assert_eq!(w.len(), 0);
        assert!(w.by_path.is_empty() && w.by_session.is_empty());
    }

    #[test]
    fn deleted_fires_data_and_child_watches_as_one_event() {
        let mut w = Watches::default();
        let a = SessionId(1);
        w.add(a, "/x", Kinds::DATA, usize::MAX).unwrap();
        w.add(a, "/x", Kinds::CHILD, usize::MAX).unwrap();
        let mut out = Vec::new();
        w.fire("/x", EventKind::Deleted, &mut out);
        assert_eq!(out, [a]);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn removed_watches_do_not_fire() {
        let mut w = Watches::default();
        let (a, b) = (SessionId(1), SessionId(2));
        w.add(a, "/x", Kinds::DATA, usize::MAX).unwrap();
        w.add(a, "/x", Kinds::CHILD, usize::MAX).unwrap();
        w.add(b, "/x", Kinds::DATA, usize::MAX).unwrap();
        w.remove(a, "/x", Kinds::DATA);
        let mut out = Vec::new();
        w.fire("/x", EventKind::DataChanged, &mut out);
        assert_eq!(out, [b]);
        w.remove(a, "/x", Kinds::CHILD);
        out.clear();
        w.fire("/x", EventKind::Deleted, &mut out);
        assert!(out.is_empty());
        assert_eq!(w.len(), 0);
        assert!(w.by_session.is_empty());
    }

    #[test]
    fn ending_a_session_forgets_its_watches() {
        let mut w = Watches::default();
        let (a, b) = (SessionId(1), SessionId(2));
        w.add(a, "/x", Kinds::DATA, usize::MAX).unwrap();
        w.add(a, "/y", Kinds::CHILD, usize::MAX).unwrap();
        w.add(b, "/x", Kinds::DATA, usize::MAX).unwrap();
        w.remove_session(a);
        assert_eq!(w.len(), 1);
        let mut out = Vec::new();
        w.fire("/x", EventKind::Created, &mut out);
        w.fire("/y", EventKind::ChildrenChanged, &mut out);
        assert_eq!(out, [b]);
    }

    /// Against a plain map of (session, path) to kinds, over a long run of
    /// random adds, removals, fires and ended sessions: the same sessions
    /// fire, in the order they first set their watch, and every count and
    /// budget agrees.
    #[test]
    fn watches_agree_with_a_plain_model() {
        use std::collections::BTreeMap;
        let mut w = Watches::default();
        let mut model: BTreeMap<(u64, &str), (u64, Kinds)> = BTreeMap::new();
        let paths = ["/a", "/b", "/a/c"];
        let kinds = [Kinds::DATA, Kinds::CHILD, Kinds::DATA.union(Kinds::CHILD)];
        let events = [
            EventKind::Created,
            EventKind::DataChanged,
            EventKind::ChildrenChanged,
            EventKind::Deleted,
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut order = 0u64;
        for _ in 0..20_000 {
            let session = next(8);
            let path = paths[next(3) as usize];
            match next(10) {
                0..=4 => {
                    let kind = kinds[next(3) as usize];
                    w.add(SessionId(session), path, kind, usize::MAX).unwrap();
                    order += 1;
                    let entry = model
                        .entry((session, path))
                        .or_insert((order, Kinds::default()));
                    entry.1 = entry.1.union(kind);
                }
                5 => {
                    let kind = kinds[next(3) as usize];
                    w.remove(SessionId(session), path, kind);
                    if let Some(entry) = model.get_mut(&(session, path)) {
                        entry.1 .0 &= !kind.0;
                        if entry.1.is_empty() {
                            model.remove(&(session, path));
                        }
                    }
                }
                6 => {
                    w.remove_session(SessionId(session));
                    model.retain(|(s, _), _| *s != session);
                }
                _ => {
                    let event = events[next(4) as usize];
                    let fired = Kinds::fired_by(event);
                    let mut out = Vec::new();
                    w.fire(path, event, &mut out);
                    let mut want: Vec<(u64, u64)> = Vec::new();
                    model.retain(|(s, p), (when, held)| {
                        if *p != path || held.0 & fired.0 == 0 {
                            return true;
                        }
                        want.push((*when, *s));
                        held.0 &= !fired.0;
                        !held.is_empty()
                    });
                    want.sort();
                    let want: Vec<SessionId> =
                        want.into_iter().map(|(_, s)| SessionId(s)).collect();
                    assert_eq!(out, want, "{event:?} on {path}");
                }
            }
            assert_eq!(w.len(), model.len());
            for session in 0..8 {
                let held: usize = model
                    .keys()
                    .filter(|(s, _)| *s == session)
                    .map(|(_, p)| watch_cost(p))
                    .sum();
                assert_eq!(w.bytes(SessionId(session)), held);
                for path in paths {
                    let want = model
                        .get(&(session, path))
                        .map_or(Kinds::default(), |e| e.1);
                    assert_eq!(w.kinds(SessionId(session), path), want);
                }
            }
        }
        assert_eq!(w.by_path.values().map(Vec::len).sum::<usize>(), model.len());
    }
}
