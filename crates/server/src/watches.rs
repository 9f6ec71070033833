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
/// watch is set or looked up, and a session's watches forgotten when it
/// ends, at the same cost however many other sessions watch the same path
/// (10,000 sessions watching one node, say).
#[derive(Debug, Default)]
pub(crate) struct Watches {
    by_path: HashMap<Arc<str>, Watchers>,
    by_session: HashMap<SessionId, SessionWatches>,
    /// (session, path) pairs watched: the sessions of every path's
    /// [`Watchers`], less those that have ended.
    count: usize,
}

/// The sessions that watch one path, in the order they set their watch.
/// A session that ends is left in the list, counted in `ended`, until the
/// path fires or the ended outnumber the rest: the list is then rebuilt
/// without them, so it holds at most twice the sessions that still watch.
#[derive(Debug, Default)]
struct Watchers {
    sessions: Vec<SessionId>,
    ended: usize,
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
        self.by_path
            .entry(key.clone())
            .or_default()
            .sessions
            .push(session);
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
        let Some(watchers) = self.by_path.get_mut(path) else {
            return;
        };
        let by_session = &mut self.by_session;
        let mut unwatched = 0;
        watchers.sessions.retain(|&session| {
            let Some(held) = by_session
                .get(&session)
                .and_then(|mine| mine.paths.get(path))
            else {
                return false; // ended
            };
            if held.0 & fired.0 == 0 {
                return true;
            }
            out.push(session);
            let emptied = take_off(by_session, session, path, fired);
            unwatched += usize::from(emptied);
            !emptied
        });
        watchers.ended = 0;
        self.count -= unwatched;
        if watchers.sessions.is_empty() {
            self.by_path.remove(path);
        }
    }

    /// Removes `session`'s watches of `kind` on `path`.
    pub(crate) fn remove(&mut self, session: SessionId, path: &str, kind: Kinds) {
        if !self.watches(session, path) || !take_off(&mut self.by_session, session, path, kind) {
            return;
        }
        let Some(watchers) = self.by_path.get_mut(path) else {
            return;
        };
        // The last: the one it set since it last watched the path.
        if let Some(i) = watchers.sessions.iter().rposition(|s| *s == session) {
            watchers.sessions.remove(i);
            self.count -= 1;
        }
        if watchers.tidy(&self.by_session, path) {
            self.by_path.remove(path);
        }
    }

    /// Forgets every watch of an ended session.
    pub(crate) fn remove_session(&mut self, session: SessionId) {
        let Some(mine) = self.by_session.remove(&session) else {
            return;
        };
        for path in mine.paths.into_keys() {
            self.count -= 1;
            let Some(watchers) = self.by_path.get_mut(&path) else {
                continue;
            };
            watchers.ended += 1;
            if watchers.tidy(&self.by_session, &path) {
                self.by_path.remove(&path);
            }
        }
    }

    /// Number of (session, path) pairs watched.
    pub(crate) fn len(&self) -> usize {
        self.count
    }
}

impl Watchers {
    /// Drops the sessions that ended once they outnumber the rest (of
    /// `by_session`, the sessions that watch `path`); whether none is left.
    fn tidy(&mut self, by_session: &HashMap<SessionId, SessionWatches>, path: &str) -> bool {
        if 2 * self.ended > self.sessions.len() {
            self.sessions.retain(|s| {
                by_session
                    .get(s)
                    .is_some_and(|mine| mine.paths.contains_key(path))
            });
            self.ended = 0;
            if self.sessions.capacity() > 4 * self.sessions.len().max(4) {
                self.sessions.shrink_to_fit();
            }
        }
        self.sessions.is_empty()
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
    /// budget agrees, and a path lists at most twice the sessions that
    /// still watch it.
    #[test]
    fn watches_agree_with_a_plain_model() {
        for seed in [0x9e37_79b9_7f4a_7c15, 7, 0x1234_5678_9abc_def1] {
            agree_with_a_plain_model(seed);
        }
    }

    fn agree_with_a_plain_model(seed: u64) {
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
        let mut rng = crate::sim::Rng::new(seed);
        let mut next = move |n: u64| rng.below(n);
        let mut order = 0u64;
        // Eight sessions at a time; one that ends is followed by a new one,
        // as session ids are never used again.
        let mut live: Vec<u64> = (0..8).collect();
        for _ in 0..20_000 {
            let slot = next(8) as usize;
            let session = live[slot];
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
                    live[slot] = live.iter().max().unwrap() + 1;
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
            for path in paths {
                let live = model.keys().filter(|(_, p)| *p == path).count();
                let (listed, ended) = w
                    .by_path
                    .get(path)
                    .map_or((0, 0), |l| (l.sessions.len(), l.ended));
                assert_eq!(listed - ended, live, "{path}");
                assert!(2 * ended <= listed, "{path}: {ended} of {listed} ended");
            }
            for &session in &live {
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
        assert!(model.is_empty() || !w.by_path.is_empty());
    }

    /// 1,000 sessions watch one path and end one by one: the path's list
    /// never holds more than twice the sessions still watching, and is gone
    /// with the last; one that still watches fires, and only it.
    #[test]
    fn ended_sessions_are_dropped_from_a_busy_path() {
        let mut w = Watches::default();
        for s in 0..1000 {
            w.add(SessionId(s), "/config", Kinds::DATA, usize::MAX)
                .unwrap();
        }
        for s in 0..999 {
            w.remove_session(SessionId(s));
            let listed = &w.by_path["/config"];
            assert!(listed.sessions.len() <= 2 * (1000 - s as usize - 1));
            assert_eq!(w.len(), 1000 - s as usize - 1);
        }
        let mut out = Vec::new();
        w.fire("/config", EventKind::DataChanged, &mut out);
        assert_eq!(out, [SessionId(999)]);
        assert_eq!(w.len(), 0);
        assert!(w.by_path.is_empty() && w.by_session.is_empty());
        w.add(SessionId(1000), "/config", Kinds::DATA, usize::MAX)
            .unwrap();
        w.remove_session(SessionId(1000));
        assert!(w.by_path.is_empty() && w.by_session.is_empty());
    }
}
