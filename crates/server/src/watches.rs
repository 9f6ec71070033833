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
            // Reported by queue watches only (see queues.rs).
            EventKind::Head => Kinds::default(),
        }
    }

    fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub(crate) fn union(self, other: Kinds) -> Kinds {
        Kinds(self.0 | other.0)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Watches {
    by_path: HashMap<Arc<str>, Vec<(SessionId, Kinds)>>,
    by_session: HashMap<SessionId, HashSet<Arc<str>>>,
    count: usize,
}

impl Watches {
    /// Sets a watch of `kind` for `session` on `path`.
    pub(crate) fn add(&mut self, session: SessionId, path: &str, kind: Kinds) {
        let key = match self.by_path.get_key_value(path) {
            Some((k, _)) => k.clone(),
            None => Arc::from(path),
        };
        let entries = self.by_path.entry(key.clone()).or_default();
        match entries.iter_mut().find(|(s, _)| *s == session) {
            Some((_, kinds)) => kinds.0 |= kind.0,
            None => {
                entries.push((session, kind));
                self.count += 1;
                self.by_session.entry(session).or_default().insert(key);
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
            if let Some(paths) = self.by_session.get_mut(&session) {
                paths.remove(path);
                if paths.is_empty() {
                    self.by_session.remove(&session);
                }
            }
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
            if let Some(paths) = self.by_session.get_mut(&session) {
                paths.remove(path);
                if paths.is_empty() {
                    self.by_session.remove(&session);
                }
            }
        }
    }

    /// Forgets every watch of an ended session.
    pub(crate) fn remove_session(&mut self, session: SessionId) {
        let Some(paths) = self.by_session.remove(&session) else {
            return;
        };
        for path in paths {
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

    #[test]
    fn a_watch_fires_once_per_session() {
        let mut w = Watches::default();
        let (a, b) = (SessionId(1), SessionId(2));
        w.add(a, "/x", Kinds::DATA);
        w.add(a, "/x", Kinds::DATA);
        w.add(b, "/x", Kinds::CHILD);
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
        w.add(a, "/x", Kinds::DATA);
        w.add(a, "/x", Kinds::CHILD);
        let mut out = Vec::new();
        w.fire("/x", EventKind::Deleted, &mut out);
        assert_eq!(out, [a]);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn removed_watches_do_not_fire() {
        let mut w = Watches::default();
        let (a, b) = (SessionId(1), SessionId(2));
        w.add(a, "/x", Kinds::DATA);
        w.add(a, "/x", Kinds::CHILD);
        w.add(b, "/x", Kinds::DATA);
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
        w.add(a, "/x", Kinds::DATA);
        w.add(a, "/y", Kinds::CHILD);
        w.add(b, "/x", Kinds::DATA);
        w.remove_session(a);
        assert_eq!(w.len(), 1);
        let mut out = Vec::new();
        w.fire("/x", EventKind::Created, &mut out);
        w.fire("/y", EventKind::ChildrenChanged, &mut out);
        assert_eq!(out, [b]);
    }
}
