//! Queue watches: a waiter's place in a queue of sibling nodes.
//!
//! A queue watch on node C (a lock contender, an election candidate) fires
//! *head* once C heads its queue under the rule it joined by (for an
//! exclusive queue, once it has no predecessor left among its siblings; see
//! `baton_state::queue`), and then *deleted* if C is deleted by anyone but
//! its own session. While C waits, the watch sits on the one member the rule
//! says C waits on; when that one goes, the server applies the rule again
//! and moves the watch on, waking nobody unless C now heads the queue. A
//! handover therefore costs exactly one notification, and a waiter that
//! leaves the middle of the queue costs none.
//!
//! Like other watches, queue watches belong to this server, not to the
//! state machine; they are dropped with their session or connection, and the
//! client sets them again after a resume.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use baton_proto::{path, EventKind, SessionId};

use crate::state::queue::Standing;
use crate::state::StateMachine;

#[derive(Debug)]
struct Entry {
    session: SessionId,
    waiting: Waiting,
    /// Told apart from every other watch this server sets, so that a
    /// watch left behind in a [`Behind`] list is known for what it is.
    token: u64,
}

/// The watches waiting on one member of a queue, in the order they were
/// set. A watch that stops waiting is left in the list and counted, rather
/// than searched for: the readers of a read-write lock behind one writer may
/// be many, and each leaving would cost a search of them all. The list is
/// rebuilt once those left behind outnumber the others, so it holds at most
/// twice the watches still waiting.
#[derive(Debug)]
struct Behind {
    /// Each watch's node and token; some no longer wait here.
    nodes: Vec<(Arc<str>, u64)>,
    /// How many of `nodes` no longer wait here.
    gone: usize,
}

/// What a queue watch waits for.
#[derive(Debug, Clone)]
enum Waiting {
    /// Nothing: its node heads the queue.
    Nothing,
    /// The member at this path to leave.
    On(Arc<str>),
    /// A permit: any member of its queue ahead of it to leave. The node was
    /// created at `czxid` in the queue at `queue`.
    Permit { queue: Arc<str>, czxid: u64 },
}

#[derive(Debug, Default)]
pub(crate) struct QueueWatches {
    by_node: HashMap<Arc<str>, Entry>,
    by_predecessor: HashMap<Arc<str>, Behind>,
    /// Watches waiting for a permit, by queue, in queue order. The members
    /// that wait for a permit all hold the same number (the state machine
    /// refuses others), so once one of them must go on waiting, so must
    /// every one behind it.
    by_queue: HashMap<Arc<str>, BTreeMap<u64, Arc<str>>>,
    by_session: HashMap<SessionId, HashSet<Arc<str>>>,
    /// The token of the next watch set.
    next_token: u64,
}

impl QueueWatches {
    /// Sets `session`'s queue watch on `node`, created at `czxid`, which
    /// stands in its queue as `standing` says.
    pub(crate) fn set(
        &mut self,
        session: SessionId,
        node: Arc<str>,
        czxid: u64,
        standing: Standing<Arc<str>>,
    ) {
        self.forget(&node);
        self.by_session
            .entry(session)
            .or_default()
            .insert(node.clone());
        let token = self.next_token;
        self.next_token += 1;
        let waiting = self.wait(&node, token, czxid, standing);
        self.by_node.insert(
            node,
            Entry {
                session,
                waiting,
                token,
            },
        );
    }

    /// Files `node` under what it now waits for.
    fn wait(
        &mut self,
        node: &Arc<str>,
        token: u64,
        czxid: u64,
        standing: Standing<Arc<str>>,
    ) -> Waiting {
        match standing {
            Standing::Heads => Waiting::Nothing,
            Standing::Waits { on } => {
                // Room for one: a lock's waiter is the only one on its
                // predecessor.
                self.by_predecessor
                    .entry(on.clone())
                    .or_insert_with(|| Behind {
                        nodes: Vec::with_capacity(1),
                        gone: 0,
                    })
                    .nodes
                    .push((node.clone(), token));
                Waiting::On(on)
            }
            Standing::Queued { .. } => {
                let queue: Arc<str> = Arc::from(path::parent(node).expect("a queue member"));
                self.by_queue
                    .entry(queue.clone())
                    .or_default()
                    .insert(czxid, node.clone());
                Waiting::Permit { queue, czxid }
            }
        }
    }

    /// Removes the watch on `node`, if any, returning its session.
    fn forget(&mut self, node: &str) -> Option<SessionId> {
        let entry = self.by_node.remove(node)?;
        match &entry.waiting {
            Waiting::Nothing => {}
            Waiting::On(p) => {
                if let Some(behind) = self.by_predecessor.get_mut(p) {
                    behind.gone += 1;
                    if behind.gone >= behind.nodes.len() {
                        self.by_predecessor.remove(p);
                    } else if 2 * behind.gone > behind.nodes.len() {
                        let by_node = &self.by_node;
                        behind
                            .nodes
                            .retain(|(n, t)| by_node.get(n).is_some_and(|e| e.token == *t));
                        behind.gone = 0;
                        if behind.nodes.capacity() > 4 * behind.nodes.len() {
                            behind.nodes.shrink_to(2 * behind.nodes.len());
                        }
                    }
                }
            }
            Waiting::Permit { queue, czxid } => {
                if let Some(waiters) = self.by_queue.get_mut(queue) {
                    waiters.remove(czxid);
                    if waiters.is_empty() {
                        self.by_queue.remove(queue);
                    }
                }
            }
        }
        if let Some(nodes) = self.by_session.get_mut(&entry.session) {
            nodes.remove(node);
            if nodes.is_empty() {
                self.by_session.remove(&entry.session);
            }
        }
        Some(entry.session)
    }

    /// Forgets every queue watch of a session.
    pub(crate) fn remove_session(&mut self, session: SessionId) {
        if let Some(nodes) = self.by_session.remove(&session) {
            for node in nodes {
                // by_session is already gone; forget() tolerates that.
                self.forget(&node);
            }
        }
    }

    /// Reacts to the deletion of `path` by `actor` (`None`: a session's
    /// expiry or close): a queue node deleted by another session reports
    /// *deleted* to its owner; the waiters on the deleted node move on to
    /// what their rule now says they wait for, or report *head*; and the
    /// first waiters for a permit in its queue report *head* if a permit is
    /// now theirs. `sm` is the state after the change. Notifications are
    /// appended to `out`.
    pub(crate) fn on_deleted(
        &mut self,
        path: &Arc<str>,
        actor: Option<SessionId>,
        sm: &StateMachine,
        out: &mut Vec<(SessionId, EventKind, Arc<str>)>,
    ) {
        if let Some(owner) = self.forget(path) {
            if actor != Some(owner) {
                out.push((owner, EventKind::Deleted, path.clone()));
            }
        }
        if let Some(behind) = self.by_predecessor.remove(&**path) {
            for (node, token) in behind.nodes {
                // Only the watches still waiting on `path`: one set again
                // since waits elsewhere, or heads, and must not hear twice.
                if self.by_node.get(&node).is_some_and(|e| e.token == token) {
                    self.reconsider(&node, sm, out);
                }
            }
        }
        let Some(queue) = path::parent(path) else {
            return;
        };
        // A permit may have come free: the first waiters for one are
        // reconsidered in order, until one must go on waiting.
        while let Some(node) = self
            .by_queue
            .get(queue)
            .and_then(|w| w.first_key_value())
            .map(|(_, n)| n.clone())
        {
            if !self.reconsider(&node, sm, out) {
                break;
            }
        }
    }

    /// Looks again at where `node` stands, after a change that may let it
    /// through: it heads (and its session is told), or its watch moves on
    /// to what it now waits for. Returns whether it heads.
    fn reconsider(
        &mut self,
        node: &Arc<str>,
        sm: &StateMachine,
        out: &mut Vec<(SessionId, EventKind, Arc<str>)>,
    ) -> bool {
        let Some(session) = self.by_node.get(node).map(|e| e.session) else {
            return false;
        };
        let (czxid, standing) = match sm.standing(node) {
            Ok(standing) => (
                sm.node(node).map_or(0, |n| n.czxid()),
                standing.map(|(p, _)| p.clone()),
            ),
            // Deleted in the same step: its own trigger forgets it.
            Err(_) => return false,
        };
        let heads = standing.heads();
        let current = self.by_node.get(node).map(|e| e.waiting.clone());
        match (current, &standing) {
            // Still waiting for the same thing: nothing moves.
            (Some(Waiting::Permit { .. }), Standing::Queued { .. }) => return false,
            (Some(Waiting::On(p)), Standing::Waits { on }) if &p == on => return false,
            _ => {}
        }
        self.set(session, node.clone(), czxid, standing);
        if heads {
            out.push((session, EventKind::Head, node.clone()));
        }
        heads
    }

    /// Number of queue watches.
    pub(crate) fn len(&self) -> usize {
        self.by_node.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::queue::QueueRule;
    use crate::state::{Command, Outcome};
    use baton_proto::{CreateMode, SessionSecret};
    use bytes::Bytes;

    /// A state with the queue `/q` and `n` sessions (ids 1..), and a board.
    struct Queue {
        sm: StateMachine,
        q: QueueWatches,
        out: Vec<(SessionId, EventKind, Arc<str>)>,
    }

    impl Queue {
        fn new(sessions: usize) -> Self {
            let mut sm = StateMachine::new();
            for _ in 0..sessions {
                sm.apply(
                    &Command::OpenSession {
                        timeout_ms: 1000,
                        secret: SessionSecret([0; 16]),
                    },
                    0,
                );
            }
            sm.apply(
                &Command::Create {
                    session: SessionId(1),
                    path: "/q".into(),
                    data: Bytes::new(),
                    mode: CreateMode::Persistent,
                    fence: None,
                    acl: baton_proto::Acl::OPEN,
                },
                0,
            )
            .result
            .unwrap();
            Queue {
                sm,
                q: QueueWatches::default(),
                out: Vec::new(),
            }
        }

        /// Session `s` joins by `rule` and sets its queue watch, as the
        /// server does for an enqueue.
        fn join(&mut self, s: u64, rule: QueueRule) -> Arc<str> {
            let applied = self.sm.apply(
                &Command::Enqueue {
                    session: SessionId(s),
                    path: "/q/n-".into(),
                    data: Bytes::new(),
                    rule,
                },
                0,
            );
            let Ok(Outcome::Enqueued { path, sequence, .. }) = applied.result else {
                panic!("{:?}", applied.result);
            };
            let standing = self.sm.standing(&path).unwrap().map(|(p, _)| p.clone());
            self.q.set(SessionId(s), path.clone(), sequence, standing);
            path
        }

        /// `by` deletes `node`; returns the notifications.
        fn delete(&mut self, node: &Arc<str>, by: u64) -> Vec<(SessionId, EventKind, Arc<str>)> {
            self.delete_as(node, Some(SessionId(by)));
            std::mem::take(&mut self.out)
        }

        /// `actor` (`None`: an expiry) deletes `node`; the notifications
        /// are left in `out`.
        fn delete_as(&mut self, node: &Arc<str>, actor: Option<SessionId>) {
            self.sm
                .apply(
                    &Command::Delete {
                        path: node.to_string(),
                        version: None,
                        fence: None,
                    },
                    0,
                )
                .result
                .unwrap();
            self.q.on_deleted(node, actor, &self.sm, &mut self.out);
        }

        fn heads(&self, node: &Arc<str>) -> bool {
            self.sm.standing(node).unwrap().heads()
        }
    }

    fn head(s: u64, node: &Arc<str>) -> (SessionId, EventKind, Arc<str>) {
        (SessionId(s), EventKind::Head, node.clone())
    }

    #[test]
    fn a_leaving_waiter_wakes_nobody_and_a_release_wakes_the_next() {
        let mut t = Queue::new(14);
        let n: Vec<Arc<str>> = (0..4)
            .map(|i| t.join(10 + i, QueueRule::Exclusive))
            .collect();
        // Waiter 2 leaves (its own session deletes its node): nobody hears.
        assert_eq!(t.delete(&n[2], 12), []);
        // The holder releases: waiter 1 heads the queue; waiter 3 is not woken.
        assert_eq!(t.delete(&n[0], 10), [head(11, &n[1])]);
        // Someone else deletes the new holder's node: its owner hears.
        assert_eq!(
            t.delete(&n[1], 99),
            [
                (SessionId(11), EventKind::Deleted, n[1].clone()),
                head(13, &n[3])
            ]
        );
        t.q.remove_session(SessionId(13));
        assert_eq!(t.q.len(), 0);
        assert!(t.q.by_predecessor.is_empty() && t.q.by_session.is_empty());
    }

    /// Readers behind a writer are woken together when it leaves, each once;
    /// the writer behind them is woken once the last of them leaves, and
    /// readers leaving before that wake nobody.
    #[test]
    fn readers_wake_together_and_a_writer_once_after_them() {
        let mut t = Queue::new(20);
        let w1 = t.join(1, QueueRule::Exclusive);
        let readers: Vec<Arc<str>> = (2..8).map(|s| t.join(s, QueueRule::Shared)).collect();
        let w2 = t.join(8, QueueRule::Exclusive);
        let late = t.join(9, QueueRule::Shared);
        let woken = t.delete(&w1, 1);
        let want: Vec<_> = readers.iter().zip(2..).map(|(r, s)| head(s, r)).collect();
        assert_eq!(woken, want);
        for (i, r) in readers.iter().enumerate().take(5) {
            assert_eq!(
                t.delete(r, 2 + i as u64),
                [],
                "reader {i} leaving wakes nobody"
            );
        }
        assert_eq!(t.delete(&readers[5], 7), [head(8, &w2)]);
        assert!(!t.heads(&late), "the reader behind the writer waits for it");
        assert_eq!(t.delete(&w2, 8), [head(9, &late)]);
    }

    /// Many readers behind one writer leaving one by one, each watch
    /// dropped with its session (as when their client goes): the list of
    /// watches waiting on the writer never holds more than twice those
    /// still in it, and the writer leaving wakes exactly the readers left.
    #[test]
    fn readers_leaving_one_by_one_are_not_searched_for() {
        let n = 1_000;
        let mut t = Queue::new(n + 2);
        let w = t.join(1, QueueRule::Exclusive);
        let readers: Vec<Arc<str>> = (2..n as u64 + 2)
            .map(|s| t.join(s, QueueRule::Shared))
            .collect();
        for s in 2..n as u64 - 8 {
            t.q.remove_session(SessionId(s));
            let behind = &t.q.by_predecessor[&w];
            let live = behind.nodes.len() - behind.gone;
            assert_eq!(live, n + 1 - s as usize);
            assert!(behind.nodes.len() <= 2 * live + 1, "{s}");
        }
        let woken = t.delete(&w, 1);
        let want: Vec<_> = (n as u64 - 8..n as u64 + 2)
            .map(|s| head(s, &readers[s as usize - 2]))
            .collect();
        assert_eq!(woken, want);
        assert!(t.q.by_predecessor.is_empty());
    }

    /// Over a long run of random joins (exclusive and shared), deletions by
    /// the owner, by another session and by an expiry, watches set again
    /// (as after a resume) and watches dropped with their session: every
    /// *head* goes to a node that heads, no node hears it twice, every
    /// watched node that heads has heard it (or headed when its watch was
    /// set), and the lists of waiting watches keep their bound.
    #[test]
    fn queue_watches_keep_their_promises_over_random_runs() {
        for seed in [0x9e37_79b9_7f4a_7c15, 11, 0x0bad_cafe_f00d_d00d] {
            random_run(seed);
        }
    }

    fn random_run(seed: u64) {
        let sessions = 40u64;
        let mut t = Queue::new(sessions as usize + 1);
        let mut rng = crate::sim::Rng::new(seed);
        let mut next = move |n: u64| rng.below(n);
        // Each node in the queue, with its owner.
        let mut nodes: Vec<(Arc<str>, u64)> = Vec::new();
        // The watched nodes told they head, or that headed when set.
        let mut told: HashSet<Arc<str>> = HashSet::new();
        for step in 0..6_000 {
            let owner = 1 + next(sessions);
            match next(12) {
                0..=3 => {
                    let rule = if next(3) == 0 {
                        QueueRule::Exclusive
                    } else {
                        QueueRule::Shared
                    };
                    let node = t.join(owner, rule);
                    if t.heads(&node) {
                        told.insert(node.clone());
                    }
                    nodes.push((node, owner));
                }
                4..=7 if !nodes.is_empty() => {
                    let (node, owner) = nodes.remove(next(nodes.len() as u64) as usize);
                    let actor = match next(3) {
                        0 => Some(SessionId(owner)),
                        1 => Some(SessionId(sessions + 1)),
                        _ => None,
                    };
                    t.delete_as(&node, actor);
                    told.remove(&node);
                }
                8..=9 if !nodes.is_empty() => {
                    // The owner sets its watch again, as after a resume.
                    let (node, owner) = nodes[next(nodes.len() as u64) as usize].clone();
                    let czxid = t.sm.node(&node).unwrap().czxid();
                    let standing = t.sm.standing(&node).unwrap().map(|(p, _)| p.clone());
                    told.remove(&node);
                    if standing.heads() {
                        told.insert(node.clone());
                    }
                    t.q.set(SessionId(owner), node, czxid, standing);
                }
                10 => {
                    t.q.remove_session(SessionId(owner));
                    for (node, o) in &nodes {
                        if *o == owner {
                            told.remove(node);
                        }
                    }
                }
                _ => {}
            }
            for (session, kind, node) in std::mem::take(&mut t.out) {
                if kind != EventKind::Head {
                    continue;
                }
                assert!(t.heads(&node), "step {step}: {node} told head, but waits");
                assert_eq!(t.q.by_node[&node].session, session, "step {step}");
                assert!(told.insert(node.clone()), "step {step}: {node} told twice");
            }
            for node in t.q.by_node.keys() {
                assert_eq!(
                    t.heads(node),
                    told.contains(node),
                    "step {step}: {node} heads, but was not told (or the other way)"
                );
            }
            for (p, behind) in &t.q.by_predecessor {
                let live =
                    t.q.by_node
                        .values()
                        .filter(|e| matches!(&e.waiting, Waiting::On(q) if q == p))
                        .count();
                assert!(live > 0, "step {step}: {p} kept with nobody waiting");
                assert_eq!(behind.nodes.len() - behind.gone, live, "step {step}");
                assert!(behind.nodes.len() <= 2 * live + 1, "step {step}");
            }
        }
    }

    /// With 2 permits, each holder leaving wakes exactly the first waiter,
    /// and a waiter leaving wakes nobody.
    #[test]
    fn a_permit_coming_free_wakes_exactly_the_first_waiter() {
        let mut t = Queue::new(20);
        let p = QueueRule::Permits(2);
        let m: Vec<Arc<str>> = (1..=6).map(|s| t.join(s, p)).collect();
        assert!(t.heads(&m[0]) && t.heads(&m[1]) && !t.heads(&m[2]));
        assert_eq!(t.q.by_queue["/q"].len(), 4, "four wait for a permit");
        assert_eq!(t.delete(&m[3], 4), [], "a waiter leaving wakes nobody");
        assert_eq!(t.delete(&m[1], 2), [head(3, &m[2])]);
        assert_eq!(t.delete(&m[0], 1), [head(5, &m[4])]);
        assert_eq!(t.delete(&m[4], 5), [head(6, &m[5])]);
        assert!(!t.q.by_queue.contains_key("/q"));
    }
}
