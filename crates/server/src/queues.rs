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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use baton_proto::{EventKind, SessionId};

use crate::state::queue::{QueueRule, Standing};
use crate::state::StateMachine;

#[derive(Debug)]
struct Entry {
    session: SessionId,
    /// The rule the node joined its queue by.
    rule: QueueRule,
    /// The member the watch waits on; `None` once the node heads.
    waiting_on: Option<Arc<str>>,
}

#[derive(Debug, Default)]
pub(crate) struct QueueWatches {
    by_node: HashMap<Arc<str>, Entry>,
    by_predecessor: HashMap<Arc<str>, Vec<Arc<str>>>,
    by_session: HashMap<SessionId, HashSet<Arc<str>>>,
}

impl QueueWatches {
    /// Sets `session`'s queue watch on `node`, which joined its queue by
    /// `rule` and waits on `predecessor` (`None`: it heads its queue
    /// already).
    pub(crate) fn set(
        &mut self,
        session: SessionId,
        node: Arc<str>,
        rule: QueueRule,
        predecessor: Option<Arc<str>>,
    ) {
        self.forget(&node);
        if let Some(p) = &predecessor {
            self.by_predecessor
                .entry(p.clone())
                .or_default()
                .push(node.clone());
        }
        self.by_session
            .entry(session)
            .or_default()
            .insert(node.clone());
        self.by_node.insert(
            node,
            Entry {
                session,
                rule,
                waiting_on: predecessor,
            },
        );
    }

    /// Removes the watch on `node`, if any, returning its session.
    fn forget(&mut self, node: &str) -> Option<SessionId> {
        let (key, entry) = self.by_node.remove_entry(node)?;
        if let Some(p) = &entry.waiting_on {
            if let Some(waiters) = self.by_predecessor.get_mut(p) {
                waiters.retain(|w| w != &key);
                if waiters.is_empty() {
                    self.by_predecessor.remove(p);
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
    /// *deleted* to its owner, and the waiters on the deleted node move on
    /// to the member their rule now says they wait on, or report *head*.
    /// `sm` is the state after the change. Notifications are appended to
    /// `out`.
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
        let Some(waiters) = self.by_predecessor.remove(&**path) else {
            return;
        };
        for node in waiters {
            let Some((session, rule)) = self.by_node.get(&node).map(|e| (e.session, e.rule)) else {
                continue;
            };
            match sm.standing(&node, rule).map(Standing::waits_on) {
                Ok(Some((p, _))) => {
                    let p = p.clone();
                    self.by_predecessor
                        .entry(p.clone())
                        .or_default()
                        .push(node.clone());
                    if let Some(entry) = self.by_node.get_mut(&node) {
                        entry.waiting_on = Some(p);
                    }
                }
                Ok(None) => {
                    if let Some(entry) = self.by_node.get_mut(&node) {
                        entry.waiting_on = None;
                    }
                    out.push((session, EventKind::Head, node));
                }
                // Deleted in the same step: its own trigger forgets it.
                Err(_) => {}
            }
        }
    }

    /// Number of queue watches.
    pub(crate) fn len(&self) -> usize {
        self.by_node.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use baton_proto::{CreateMode, SessionSecret};
    use bytes::Bytes;

    fn setup(n: usize) -> (StateMachine, Vec<Arc<str>>) {
        let mut sm = StateMachine::new();
        let mut nodes = Vec::new();
        for i in 0..n {
            sm.apply(
                &Command::OpenSession {
                    timeout_ms: 1000,
                    secret: SessionSecret([0; 16]),
                },
                0,
            );
            if i == 0 {
                sm.apply(
                    &Command::Create {
                        session: SessionId(1),
                        path: "/q".into(),
                        data: Bytes::new(),
                        mode: CreateMode::Persistent,
                        fence: None,
                    },
                    0,
                );
            }
        }
        for i in 0..n {
            let applied = sm.apply(
                &Command::Create {
                    session: SessionId(if i == 0 { 1 } else { i as u64 + 2 }),
                    path: "/q/n-".into(),
                    data: Bytes::new(),
                    mode: CreateMode::PersistentSequential,
                    fence: None,
                },
                0,
            );
            match applied.result.unwrap() {
                crate::state::Outcome::Created { path, .. } => nodes.push(path),
                other => panic!("{other:?}"),
            }
        }
        (sm, nodes)
    }

    fn delete(sm: &mut StateMachine, path: &str) {
        sm.apply(
            &Command::Delete {
                path: path.into(),
                version: None,
                fence: None,
            },
            0,
        )
        .result
        .unwrap();
    }

    #[test]
    fn a_leaving_waiter_wakes_nobody_and_a_release_wakes_the_next() {
        let (mut sm, n) = setup(4);
        let mut q = QueueWatches::default();
        for i in 0..4 {
            let pred = (i > 0).then(|| n[i - 1].clone());
            q.set(
                SessionId(10 + i as u64),
                n[i].clone(),
                QueueRule::Exclusive,
                pred,
            );
        }
        let mut out = Vec::new();
        // Waiter 2 leaves (its own session deletes its node): nobody hears.
        delete(&mut sm, &n[2]);
        q.on_deleted(&n[2], Some(SessionId(12)), &sm, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // The holder releases: waiter 1 heads the queue; waiter 3 is not woken.
        delete(&mut sm, &n[0]);
        q.on_deleted(&n[0], Some(SessionId(10)), &sm, &mut out);
        assert_eq!(out, [(SessionId(11), EventKind::Head, n[1].clone())]);
        out.clear();
        // Someone else deletes the new holder's node: its owner hears.
        delete(&mut sm, &n[1]);
        q.on_deleted(&n[1], Some(SessionId(99)), &sm, &mut out);
        assert_eq!(
            out,
            [
                (SessionId(11), EventKind::Deleted, n[1].clone()),
                (SessionId(13), EventKind::Head, n[3].clone()),
            ]
        );
        q.remove_session(SessionId(13));
        assert_eq!(q.len(), 0);
        assert!(q.by_predecessor.is_empty() && q.by_session.is_empty());
    }
}
