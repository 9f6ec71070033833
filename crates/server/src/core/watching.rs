//! Watches and queue watches: setting them, setting them again after a
//! resume, and the events a change fires.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use baton_proto::{ErrorReply, EventKind, SessionId};

use super::{too_many_watches, Core};
use crate::outbox::{Out, Outbox};
use crate::persistent::PersistentWatches;
use crate::state::Trigger;
use crate::watches::Kinds;

impl Core {
    /// Sets a watch for `session`, within its budget of watch bytes (which
    /// its persistent watches share).
    pub(super) fn watch(
        &mut self,
        session: SessionId,
        path: &str,
        kind: Kinds,
    ) -> Result<(), ErrorReply> {
        let budget = self.watch_budget(session);
        self.watches
            .add(session, path, kind, budget)
            .map_err(|over| too_many_watches(session, over.held, over.wanted, budget))
    }

    /// What is left of `session`'s watch budget for one-shot watches once
    /// its persistent watches are counted.
    fn watch_budget(&self, session: SessionId) -> usize {
        self.config
            .max_watch_bytes
            .saturating_sub(self.persistent.bytes(session))
    }

    /// Sets a persistent watch for `session` on `path`, within its watch
    /// budget, after sending it the events it missed since revision `from`
    /// (0: none), or `compacted` if the history no longer holds them all.
    pub(super) fn add_watch(
        &mut self,
        session: SessionId,
        outbox: &Arc<Outbox>,
        path: &str,
        recursive: bool,
        from: u64,
    ) -> Result<(), ErrorReply> {
        let budget = self.config.max_watch_bytes;
        if !self.persistent.has(session, path, recursive) {
            let held = self.watches.bytes(session) + self.persistent.bytes(session);
            let wanted = crate::watches::watch_cost(path);
            if held + wanted > budget {
                return Err(too_many_watches(session, held, wanted, budget));
            }
        }
        let now_rev = self.sm.revision();
        if from > 0 && from < now_rev {
            match self.history.since(from) {
                Ok(events) => {
                    let missed: Vec<(u64, EventKind, Arc<str>)> = events
                        .filter(|(_, kind, target)| {
                            PersistentWatches::covers(path, recursive, target, *kind)
                        })
                        .cloned()
                        .collect();
                    for (revision, kind, target) in missed {
                        self.notify(outbox, kind, revision, target);
                    }
                }
                Err(crate::persistent::Compacted) => {
                    self.stats
                        .metrics
                        .watch_history_compacted
                        .fetch_add(1, Ordering::Relaxed);
                    self.notify(outbox, EventKind::Compacted, now_rev, Arc::from(path));
                }
            }
        }
        self.persistent.add(session, path, recursive);
        Ok(())
    }

    /// Sets again the watches a client held before it moved to this
    /// connection; a watch whose node changed after `since` fires at once.
    /// If all of them could take the session past its watch budget, none is
    /// set and the request fails.
    pub(super) fn set_watches(
        &mut self,
        session: SessionId,
        outbox: &Arc<Outbox>,
        since: u64,
        data: Vec<String>,
        exist: Vec<String>,
        child: Vec<String>,
    ) -> Result<(), ErrorReply> {
        let budget = self.watch_budget(session);
        let held = self.watches.bytes(session);
        let mut paths: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let wanted: usize = data
            .iter()
            .chain(&exist)
            .chain(&child)
            .filter(|p| !self.watches.watches(session, p) && paths.insert(p.as_str()))
            .map(|p| crate::watches::watch_cost(p))
            .sum();
        if held + wanted > budget {
            return Err(too_many_watches(session, held, wanted, budget));
        }
        let now_rev = self.sm.revision();
        let (limit, mark, stats) = (self.config.max_outbound_bytes, &self.mark, &self.stats);
        let fire = |kind: EventKind, revision: u64, path: String| {
            let event = Out::Event {
                kind,
                revision,
                path: Arc::from(path),
            };
            if outbox.push(event, limit) {
                stats.events.fetch_add(1, Ordering::Relaxed);
                mark.wake_at(revision, outbox);
            }
        };
        let mut deleted = std::collections::HashSet::new();
        for path in data {
            match self.sm.node(&path) {
                None => {
                    deleted.insert(path.clone());
                    fire(EventKind::Deleted, now_rev, path);
                }
                Some(n) if n.mzxid() > since => fire(EventKind::DataChanged, n.mzxid(), path),
                Some(_) => self
                    .watches
                    .add(session, &path, Kinds::DATA, budget)
                    .map_err(|o| too_many_watches(session, o.held, o.wanted, budget))?,
            }
        }
        for path in exist {
            match self.sm.node(&path) {
                Some(n) => fire(EventKind::Created, n.czxid(), path),
                None => self
                    .watches
                    .add(session, &path, Kinds::DATA, budget)
                    .map_err(|o| too_many_watches(session, o.held, o.wanted, budget))?,
            }
        }
        for path in child {
            match self.sm.node(&path) {
                // One event per session and path, as for a live deletion:
                // a data watch on the same path already reported it.
                None if deleted.contains(&path) => {}
                None => fire(EventKind::Deleted, now_rev, path),
                Some(n) if n.pzxid() > since => fire(EventKind::ChildrenChanged, n.pzxid(), path),
                Some(_) => self
                    .watches
                    .add(session, &path, Kinds::CHILD, budget)
                    .map_err(|o| too_many_watches(session, o.held, o.wanted, budget))?,
            }
        }
        Ok(())
    }

    /// Sets again the queue watches a client held before it moved to this
    /// connection: a node that is gone reports *deleted*, one that now heads
    /// its queue (and did not before) reports *head*.
    pub(super) fn set_queue_watches(
        &mut self,
        session: SessionId,
        outbox: &Arc<Outbox>,
        queue: Vec<(String, bool)>,
    ) {
        let revision = self.sm.revision();
        for (path, headed) in queue {
            let owned = self
                .sm
                .node_entry(&path)
                .filter(|(_, n)| n.owner() == Some(session))
                .map(|(k, _)| k.clone());
            let Some(node) = owned else {
                self.notify(outbox, EventKind::Deleted, revision, Arc::from(path));
                continue;
            };
            let (czxid, standing) = {
                let standing = self.sm.standing(&node).expect("the node exists");
                let czxid = self.sm.node(&node).map_or(0, |n| n.czxid());
                (czxid, standing.map(|(p, _)| p.clone()))
            };
            let heads = standing.heads();
            self.queues.set(session, node.clone(), czxid, standing);
            if heads && !headed {
                self.granted(&node);
                self.notify(outbox, EventKind::Head, revision, node);
            }
        }
    }

    /// `node` now heads its queue: a grant of its lock.
    fn granted(&mut self, node: &Arc<str>) {
        if let Some(n) = self.sm.node(node) {
            let (token, created_ms) = (n.czxid(), n.stat().ctime);
            let exclusive = self.sm.rule(node) == crate::state::queue::QueueRule::Exclusive;
            self.locks
                .granted(node, exclusive, token, created_ms, self.now);
        }
    }

    /// Queues one event for a connection, counting it if it was queued.
    pub(super) fn notify(
        &self,
        conn: &Arc<Outbox>,
        kind: EventKind,
        revision: u64,
        path: Arc<str>,
    ) {
        let event = Out::Event {
            kind,
            revision,
            path,
        };
        if self.push(conn, event) {
            self.stats.events.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues an event for `session`'s connection, if it has one. While a
    /// committed change is applied, an event of another session than the
    /// one that made the change waits until the change's answer is queued
    /// (see `Core::apply_committed`).
    fn notify_session(
        &mut self,
        session: SessionId,
        kind: EventKind,
        revision: u64,
        path: Arc<str>,
    ) {
        let Some(conn) = self.live.get(&session).and_then(|l| l.conn.as_ref()) else {
            return;
        };
        match &mut self.later_events {
            Some((origin, later)) if *origin != session => later.push((conn.clone(), kind, path)),
            _ => self.notify(conn, kind, revision, path),
        }
    }

    /// Queues the events a change made by `actor` fired, one per watching
    /// session (`actor` is `None` for a session's expiry or close).
    pub(super) fn dispatch(&mut self, triggers: &[Trigger], actor: Option<SessionId>) {
        let revision = self.sm.revision();
        for trigger in triggers {
            self.history.record(revision, trigger.kind, &trigger.path);
            if trigger.kind == EventKind::ChildrenChanged || trigger.kind == EventKind::Deleted {
                self.container_changed(&trigger.path);
            }
            if trigger.kind == EventKind::Deleted {
                self.locks.deleted(&trigger.path, self.now.at);
                self.queues
                    .on_deleted(&trigger.path, actor, &self.sm, &mut self.queue_events);
                for (session, kind, node) in std::mem::take(&mut self.queue_events) {
                    if kind == EventKind::Head {
                        self.granted(&node);
                    }
                    self.notify_session(session, kind, revision, node);
                }
            }
            self.fired.clear();
            self.watches
                .fire(&trigger.path, trigger.kind, &mut self.fired);
            if self.persistent.len() > 0 {
                self.persistent
                    .fire(&trigger.path, trigger.kind, &mut self.fired);
                // One event per session, however many watches it concerns.
                self.fired.sort_unstable();
                self.fired.dedup();
            }
            for i in 0..self.fired.len() {
                let session = self.fired[i];
                self.notify_session(session, trigger.kind, revision, trigger.path.clone());
            }
        }
    }
}
