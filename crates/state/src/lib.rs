//! The deterministic core: the tree of nodes and the table of sessions.
//!
//! [`StateMachine::apply`] is the only way to change them. It takes a
//! [`Command`] and the time the change is stamped with, reads no clock, does no
//! I/O, and returns what happened plus the watch triggers the change fires.
//! Fed the same commands in the same order, two state machines end in the same
//! state: that is what lets a write-ahead log (and, later, a replicated log)
//! drive it unchanged.
//!
//! Every successful change takes the next *revision*. A sequential node's
//! sequence number is the revision of its creation, so sequence numbers under
//! any parent only grow, even after the parent is deleted and created again.
//! (A sequential create whose name is already taken by a node someone named
//! so passes over revisions until the name is free: revisions then grow by
//! more than one, still deterministically.)

mod change;
mod command;
pub mod delay;
pub mod format;
mod image;
mod multi;
mod node;
mod pmap;
mod proposal;
pub mod queue;
mod restore;

use std::sync::Arc;

use baton_proto::path;
use baton_proto::{Acl, CreateMode, ErrorCode, ErrorReply, SessionId, SessionSecret};

pub use command::{Applied, Command, Outcome, Trigger};
pub use image::{NodeImage, SessionImage};
pub use node::{Ephemerals, Node};
#[doc(hidden)]
pub use pmap::Unshared;
use proposal::Kept;
pub use proposal::{LastReply, Origin, Proposal};
pub use restore::{Inconsistent, RevisionOverflow};

/// A live session as the state machine knows it.
#[derive(Clone, Debug)]
pub struct Session {
    pub timeout_ms: u32,
    /// The xid of the request `last` answered.
    last_xid: u32,
    pub secret: SessionSecret,
    /// Full paths of the session's ephemeral nodes.
    pub ephemerals: Ephemerals,
    /// The reply to the session's latest change request (what it changed,
    /// or why it was refused): a retried request is answered from it rather
    /// than applied twice.
    last: Option<Box<Kept>>,
}

impl Session {
    fn new(timeout_ms: u32, secret: SessionSecret) -> Self {
        Session {
            timeout_ms,
            last_xid: 0,
            secret,
            ephemerals: Ephemerals::default(),
            last: None,
        }
    }

    /// The reply to the latest change request of this session (`id`), if
    /// any.
    pub fn last_reply(&self, id: SessionId) -> Option<LastReply> {
        self.last.as_deref().map(|kept| LastReply {
            xid: self.last_xid,
            reply: kept.reply(id),
        })
    }
}

/// A persistent (structurally shared) map: a clone costs O(1), and a
/// change after a clone copies only the path to what it changes.
type Map<K, V> = pmap::PMap<K, V>;

/// The tree and the sessions, changed only by [`apply`](Self::apply).
///
/// Cloning is O(1) whatever the size of the tree: the maps are persistent,
/// so a snapshot copies the state under the core lock in constant time and
/// writes it out while the original goes on changing.
#[derive(Clone, Debug)]
pub struct StateMachine {
    nodes: Map<Arc<str>, Node>,
    sessions: Map<SessionId, Session>,
    revision: u64,
    /// The time the latest change was stamped with: changes are stamped no
    /// earlier, whatever clock proposed them.
    last_now_ms: u64,
    /// Queues with members that joined by a rule other than exclusive
    /// (derived from the nodes).
    ruled: queue::Ruled,
    /// Lock-delays, and the tombstones they keep.
    delays: delay::Delays,
    /// The access control lists of the nodes that have one, or whose list
    /// was ever set (no entry: open, never set).
    acls: Map<Arc<str>, NodeAcl>,
    /// The nodes created as containers.
    containers: Map<Arc<str>, ()>,
}

/// A node's access control list and its version (the number of times it
/// was set), kept beside the node: few nodes have one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAcl {
    pub acl: Acl,
    pub aversion: u32,
}

/// The list of a node without one.
static OPEN: Acl = Acl::OPEN;

impl Default for StateMachine {
    fn default() -> Self {
        Self::new()
    }
}

fn err(code: ErrorCode, message: String) -> ErrorReply {
    ErrorReply { code, message }
}

impl StateMachine {
    /// An empty tree holding only the root `/`, at revision 0.
    pub fn new() -> Self {
        let mut nodes = Map::new();
        nodes.insert(Arc::from("/"), Node::new(&[], 0, 0, None));
        StateMachine {
            nodes,
            sessions: Map::new(),
            revision: 0,
            last_now_ms: 0,
            ruled: queue::Ruled::default(),
            delays: delay::Delays::default(),
            acls: Map::new(),
            containers: Map::new(),
        }
    }

    /// The access control list of the node at `path` and its ACL version
    /// (open and 0 for a node without one, or no node).
    pub fn acl(&self, path: &str) -> (&Acl, u32) {
        if self.acls.is_empty() {
            return (&OPEN, 0);
        }
        match self.acls.get(path) {
            Some(a) => (&a.acl, a.aversion),
            None => (&OPEN, 0),
        }
    }

    /// Whether the node at `path` is a container.
    pub fn is_container(&self, path: &str) -> bool {
        !self.containers.is_empty() && self.containers.contains_key(path)
    }

    /// Whether the node at `path` is a container whose children have all
    /// gone (it had some): what the leader deletes once it has stood so a
    /// while.
    pub fn is_empty_container(&self, path: &str) -> bool {
        self.is_container(path)
            && self
                .nodes
                .get(path)
                .is_some_and(|n| n.child_count() == 0 && n.cversion > 0)
    }

    /// The containers whose children have all gone.
    pub fn empty_containers(&self) -> impl Iterator<Item = &Arc<str>> {
        self.containers
            .iter()
            .map(|(path, ())| path)
            .filter(|path| self.is_empty_container(path))
    }

    /// The revision of the last successful change.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Moves the revision `by` further on, as if that many changes had
    /// been made: every sequence number, session id and fencing token
    /// handed out from then on is above the skipped range. A restored
    /// backup skips past everything the server it was taken from can have
    /// handed out after it.
    ///
    /// # Errors
    /// The revision would pass `u64::MAX`; nothing changes.
    pub fn skip_revisions(&mut self, by: u64) -> Result<(), RevisionOverflow> {
        self.revision = self.revision.checked_add(by).ok_or(RevisionOverflow {
            revision: self.revision,
            by,
        })?;
        Ok(())
    }

    pub fn node(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// The node at `path` with its shared path.
    pub fn node_entry(&self, path: &str) -> Option<(&Arc<str>, &Node)> {
        self.nodes.get_key_value(path)
    }

    /// The sibling created just before the node at `path`, with its node.
    ///
    /// # Errors
    /// [`ErrorCode::NoNode`] if there is no node at `path`, and
    /// [`ErrorCode::BadArguments`] for the root, which has no siblings.
    pub fn predecessor(&self, path: &str) -> Result<Option<(&Arc<str>, &Node)>, ErrorReply> {
        let (parent, node) = self.with_parent(path)?;
        Ok(parent
            .child_before(node.czxid)
            .map(|p| (p, self.nodes.get(&**p).expect("children exist"))))
    }

    /// The node at `path` and its parent, with the errors of
    /// [`predecessor`](Self::predecessor).
    fn with_parent(&self, path: &str) -> Result<(&Node, &Node), ErrorReply> {
        let node = self
            .nodes
            .get(path)
            .ok_or_else(|| err(ErrorCode::NoNode, format!("{path} does not exist")))?;
        let parent_path = path::parent(path)
            .ok_or_else(|| err(ErrorCode::BadArguments, "the root has no siblings".into()))?;
        let parent = self.nodes.get(parent_path).expect("a node's parent exists");
        Ok((parent, node))
    }

    /// Where the node at `path` stands in its queue (its siblings, in the
    /// order they were created) under the rule it joined by: whether it
    /// heads, or what it waits on. See [`queue::standing`]; this answers the
    /// same, with no more than one lookup per member the rule reads (for a
    /// shared member, one lookup in all, whatever number share the queue).
    ///
    /// # Errors
    /// As [`predecessor`](Self::predecessor).
    pub fn standing(&self, path: &str) -> Result<queue::Standing<(&Arc<str>, &Node)>, ErrorReply> {
        let (parent, node) = self.with_parent(path)?;
        let lookup = |p: &Arc<str>| self.nodes.get(&**p).expect("children exist");
        let queue = path::parent(path).expect("not the root");
        let rule = self.ruled.rule(queue, node.czxid);
        match rule {
            queue::QueueRule::Shared => {
                return Ok(match self.ruled.nearest_exclusive(queue, node.czxid) {
                    None => queue::Standing::Heads,
                    Some(p) => queue::Standing::Waits { on: (p, lookup(p)) },
                });
            }
            // The newest member (a member just enqueued) needs no walk: every
            // other member is ahead of it.
            queue::QueueRule::Permits(n)
                if parent
                    .child_before(u64::MAX)
                    .is_some_and(|last| &**last == path) =>
            {
                let ahead = parent.child_count() - 1;
                return Ok(match parent.child_before(node.czxid) {
                    Some(p) if ahead >= n as usize => queue::Standing::Queued {
                        behind: (p, lookup(p)),
                    },
                    _ => queue::Standing::Heads,
                });
            }
            _ => {}
        }
        // Each sibling ahead is looked up only when the rule asks for it.
        let mut before = node.czxid;
        let ahead = std::iter::from_fn(move || {
            let p = parent.child_before(before)?;
            let n = lookup(p);
            before = n.czxid;
            Some(((p, n), self.ruled.rule(queue, n.czxid)))
        });
        Ok(queue::standing(rule, ahead))
    }

    /// The rule by which the node at `path` joined its queue: exclusive
    /// unless an enqueue said otherwise.
    pub fn rule(&self, path: &str) -> queue::QueueRule {
        // Asked on every grant: with no queue ruled otherwise (the common
        // case) the node is not looked up.
        if self.ruled.is_empty() {
            return queue::QueueRule::Exclusive;
        }
        match (self.nodes.get(path), path::parent(path)) {
            (Some(node), Some(queue)) => self.ruled.rule(queue, node.czxid),
            _ => queue::QueueRule::Exclusive,
        }
    }

    /// The child of `parent` created at revision `token`, if it still exists.
    ///
    /// # Errors
    /// [`ErrorCode::NoNode`] if there is no node at `parent`.
    pub fn child_created_at(
        &self,
        parent: &str,
        token: u64,
    ) -> Result<Option<(&Arc<str>, &Node)>, ErrorReply> {
        let node = self
            .nodes
            .get(parent)
            .ok_or_else(|| err(ErrorCode::NoNode, format!("{parent} does not exist")))?;
        Ok(node
            .child_created_at(token)
            .map(|p| (p, self.nodes.get(&**p).expect("children exist"))))
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn session(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }

    pub fn sessions(&self) -> impl Iterator<Item = (SessionId, &Session)> {
        self.sessions.iter().map(|(id, s)| (*id, s))
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Applies one command that answers no request, stamping changes with
    /// `now_ms` (milliseconds since the Unix epoch, chosen by the caller).
    pub fn apply(&mut self, command: &Command, now_ms: u64) -> Applied {
        self.apply_proposal(&Proposal {
            now_ms,
            origin: None,
            command: command.clone(),
        })
    }

    /// Applies a proposal. A change is stamped with the proposal's time, or
    /// with the previous change's if that is later, so that times never go
    /// back whichever clock proposed them.
    ///
    /// A proposal that answers a request its session already made (the same
    /// xid, or an earlier one) is not applied again: the same xid gets the
    /// reply the first time gave, an earlier one `result-lost`. That is what
    /// lets a client resend the requests a broken connection left unanswered.
    pub fn apply_proposal(&mut self, proposal: &Proposal) -> Applied {
        if let Some(origin) = proposal.origin {
            if let Some(answered) = self.answered(origin) {
                return Applied {
                    result: answered,
                    triggers: Vec::new(),
                    revision: self.revision,
                    changed: false,
                };
            }
        }
        let now_ms = proposal.now_ms.max(self.last_now_ms);
        let before = self.revision;
        let mut triggers = Vec::new();
        let result = self.apply_command(&proposal.command, now_ms, &mut triggers);
        let changed = self.revision != before;
        if changed {
            self.last_now_ms = now_ms;
        }
        // What it changed, or why it was refused (see `proposal`): a
        // transaction that failed was refused too.
        if let Some(origin) = proposal.origin {
            let refused = matches!(result, Err(_) | Ok(Outcome::MultiFailed { .. }));
            if changed || refused {
                self.remember(origin, &result);
            }
        }
        Applied {
            result,
            triggers,
            revision: self.revision,
            changed,
        }
    }

    fn apply_command(
        &mut self,
        command: &Command,
        now_ms: u64,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        match command {
            Command::OpenSession { timeout_ms, secret } => {
                Ok(self.open_session(*timeout_ms, *secret))
            }
            Command::CloseSession { session } => self.end_session(*session, None, triggers),
            Command::ExpireSession { session } => {
                self.end_session(*session, Some(now_ms), triggers)
            }
            Command::SetLockDelay { path, delay_ms } => self.set_lock_delay(path, *delay_ms),
            Command::DeleteTombstone { path } => self.delete_tombstone(path, triggers),
            Command::SetAcl { path, acl, version } => self.set_acl(path, acl, *version),
            Command::DeleteContainer { path } => self.delete_container(path, triggers),
            Command::Create {
                session,
                path,
                data,
                mode,
                fence,
                acl,
            } => self.create(
                *session,
                path,
                data,
                (*mode, queue::QueueRule::Exclusive, acl),
                *fence,
                now_ms,
                triggers,
            ),
            Command::Enqueue {
                session,
                path,
                data,
                rule,
            } => self.enqueue(*session, path, data, *rule, now_ms, triggers),
            Command::Delete {
                path,
                version,
                fence,
            } => self.delete(path, *version, *fence, triggers),
            Command::SetData {
                path,
                data,
                version,
                fence,
            } => self.set_data(path, data, *version, *fence, now_ms, triggers),
            Command::Multi { session, ops } => Ok(self.multi(*session, ops, now_ms, triggers)),
        }
    }

    /// The time the latest change was stamped with.
    pub fn last_now_ms(&self) -> u64 {
        self.last_now_ms
    }

    fn enqueue(
        &mut self,
        session: SessionId,
        path: &str,
        data: &[u8],
        rule: queue::QueueRule,
        now_ms: u64,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        let mode = (CreateMode::EphemeralSequential, rule, &OPEN);
        let Outcome::Created {
            path,
            sequence,
            stat,
        } = self.create(session, path, data, mode, None, now_ms, triggers)?
        else {
            unreachable!("a create reports a created node");
        };
        let predecessor = self
            .standing(&path)
            .expect("just created")
            .waits_on()
            .map(|(p, n)| (p.clone(), n.stat()));
        Ok(Outcome::Enqueued {
            path,
            sequence: sequence.expect("sequential"),
            stat,
            predecessor,
        })
    }

    fn open_session(&mut self, timeout_ms: u32, secret: SessionSecret) -> Outcome {
        self.revision += 1;
        let id = SessionId(self.revision);
        self.sessions.insert(id, Session::new(timeout_ms, secret));
        Outcome::SessionOpened(id)
    }

    /// Ends a session: closed, or expired at `expired_at` (ms), when its
    /// nodes that hold a lock with a lock-delay stay as tombstones.
    fn end_session(
        &mut self,
        id: SessionId,
        expired_at: Option<u64>,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        let Some(session) = self.sessions.get_mut(&id) else {
            return Err(err(
                ErrorCode::SessionExpired,
                format!("session {id} has expired or was closed"),
            ));
        };
        let mut deleted = std::mem::take(&mut session.ephemerals).into_vec();
        self.sessions.remove(&id);
        self.revision += 1;
        // Sorted so that the order of the fired watches does not depend on
        // hashing: the same commands give the same events everywhere.
        deleted.sort_unstable();
        if let Some(now_ms) = expired_at {
            self.keep_tombstones(&mut deleted, now_ms);
        }
        for p in &deleted {
            self.unlink(p, triggers);
        }
        Ok(Outcome::SessionEnded { deleted })
    }
}

#[cfg(test)]
mod tests;
