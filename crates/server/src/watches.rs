//! One-shot watches: which sessions wait for a change at which path.
//!
//! Watches are state of this server, not of the tree: they are not commands
//! and do not go through the state machine. A session holds at most one data
//! watch (set by exists or get data) and one child watch (set by get children)
//! per path; setting one twice is the same as once. A watch is removed when it
//! fires or when its session ends.

use std::collections::{HashMap, HashSet};
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

#[derive(Debug, Default)]
pub(crate) struct Watches {
    by_path: HashMap<Arc<str>, Vec<(SessionId, Kinds)>>,
    by_session: HashMap<SessionId, SessionWatches>,
    count: usize,
}

/// The paths one session watches, and what they count for.
#[derive(Debug, Default)]
struct SessionWatches {
    paths: HashSet<Arc<str>>,
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
        if let Some(entries) = self.by_path.get_mut(path) {
            if let Some((_, kinds)) = entries.iter_mut().find(|(s, _)| *s == session) {
                kinds.0 |= kind.0;
                return Ok(());
            }
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
        self.by_path
            .entry(key.clone())
            .or_default()
            .push((session, kind));
        self.count += 1;
        let mine = self.by_session.entry(session).or_default();
        mine.paths.insert(key);
        mine.bytes += cost;
        Ok(())
    }

    /// Whether `session` watches `path` already (any kind).
    pub(crate) fn watches(&self, session: SessionId, path: &str) -> bool {
        self.by_session
            .get(&session)
            .is_some_and(|w| w.paths.contains(path))
    }

    /// The kinds of watch `session` holds on `path`.
    pub(crate) fn kinds(&self, session: SessionId, path: &str) -> Kinds {
        self.by_path
            .get(path)
            .and_then(|entries| entries.iter().find(|(s, _)| *s == session))
            .map_or(Kinds::default(), |&(_, kinds)| kinds)
    }

    /// Bytes `session`'s watches count for against its budget.
    pub(crate) fn bytes(&self, session: SessionId) -> usize {
        self.by_session.get(&session).map_or(0, |w| w.bytes)
    }

    /// Forgets that `session` watches `path`.
    fn forget(&mut self, session: SessionId, path: &str) {
        if let Some(mine) = self.by_session.get_mut(&session) {
            if mine.paths.remove(path) {
                mine.bytes -= watch_cost(path);
            }
            if mine.paths.is_empty() {
                self.by_session.remove(&session);
            }
        }
    }

    /// Removes and returns the sessions whose watches on `path` the event
    /// fires, each once.
    pub(crate) fn fire(&mut self, path: &str, kind: EventKind, out: &mut Vec<SessionId>) {
        let fired = Kinds::fired_by(kind);
        let Some(entries) = self.by_path.get_mut(path) else {
            return;
        };
        let mut emptied = Vec::new();
        entries.retain_mut(|(session, kinds)| {
            if kinds.0 & fired.0 == 0 {
                return true;
            }
            out.push(*session);
            kinds.0 &= !fired.0;
            if kinds.is_empty() {
                emptied.push(*session);
                false
            } else {
                true
            }
        });
        if entries.is_empty() {
            self.by_path.remove(path);
        }
        self.count -= emptied.len();
        for session in emptied {
            self.forget(session, path);
        }
    }

    /// Removes `session`'s watches of `kind` on `path`.
    pub(crate) fn remove(&mut self, session: SessionId, path: &str, kind: Kinds) {
        let Some(entries) = self.by_path.get_mut(path) else {
            return;
        };
        let Some(i) = entries.iter().position(|(s, _)| *s == session) else {
            return;
        };
        entries[i].1 .0 &= !kind.0;
        if entries[i].1.is_empty() {
            entries.swap_remove(i);
            self.count -= 1;
            if entries.is_empty() {
                self.by_path.remove(path);
            }
            self.forget(session, path);
        }
    }

    /// Forgets every watch of an ended session.
    pub(crate) fn remove_session(&mut self, session: SessionId) {
        let Some(mine) = self.by_session.remove(&session) else {
            return;
        };
        for path in mine.paths {
            if let Some(entries) = self.by_path.get_mut(&path) {
                let before = entries.len();
                entries.retain(|(s, _)| *s != session);
                self.count -= before - entries.len();
                if entries.is_empty() {
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
}
