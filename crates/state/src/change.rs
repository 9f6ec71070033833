//! The changes to the tree that [`StateMachine::apply`] makes: creating,
//! deleting and setting the data or access list of a node, and deleting an
//! emptied container.

use std::sync::Arc;

use baton_proto::path;
use baton_proto::{Acl, CreateMode, ErrorCode, ErrorReply, EventKind, SessionId};

use crate::{err, queue, Node, NodeAcl, Outcome, StateMachine, Trigger};

impl StateMachine {
    /// Creates a node; `mode` says how, with the rule by which it joins its
    /// parent's queue (exclusive unless it is enqueued by another).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create(
        &mut self,
        session: SessionId,
        requested: &str,
        data: &[u8],
        (mode, rule, acl): (CreateMode, queue::QueueRule, &Acl),
        fence: Option<u64>,
        now_ms: u64,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        if requested == "/" {
            return Err(err(
                ErrorCode::NodeExists,
                "the root node / always exists".into(),
            ));
        }
        let mut revision = self.revision + 1;
        let (full, sequence) = if mode.is_sequential() {
            // The sequence number is the create's revision. If someone
            // already chose the name that revision gives, the create passes
            // over that revision to the next free name rather than fail:
            // each step passes an existing node, so this ends, and sequence
            // numbers still only grow.
            let mut full = String::with_capacity(requested.len() + 10);
            loop {
                full.clear();
                full.push_str(requested);
                full.push_str(&path::sequence_suffix(revision));
                if full.len() > baton_proto::MAX_PATH_LEN {
                    return Err(err(
                        ErrorCode::InvalidPath,
                        format!(
                            "{requested} with its sequence suffix exceeds {} bytes",
                            baton_proto::MAX_PATH_LEN
                        ),
                    ));
                }
                if !self.nodes.contains_key(full.as_str()) {
                    break;
                }
                revision += 1;
            }
            (full, Some(revision))
        } else {
            (requested.to_owned(), None)
        };
        // Requests are checked as they are read; the state machine checks
        // again what it is about to name a node, whichever protocol or log
        // the command came from.
        if let Err(e) = path::validate(&full) {
            return Err(err(ErrorCode::InvalidPath, e.to_string()));
        }
        let parent_path = path::parent(requested).expect("a valid path other than the root");
        let owner = if mode.is_ephemeral() {
            if !self.sessions.contains_key(&session) {
                return Err(err(
                    ErrorCode::SessionExpired,
                    format!("session {session} has expired or was closed"),
                ));
            }
            Some(session)
        } else {
            None
        };
        let (parent_key, parent) = self.nodes.get_key_value(parent_path).ok_or_else(|| {
            err(
                ErrorCode::NoNode,
                format!("cannot create {full}: parent {parent_path} does not exist"),
            )
        })?;
        // The trigger names the parent with the tree's own key: no copy of
        // the path (a watch history may keep it a while).
        let parent_key = parent_key.clone();
        if parent.owner().is_some() {
            return Err(err(
                ErrorCode::NoChildrenForEphemerals,
                format!("cannot create {full}: parent {parent_path} is ephemeral"),
            ));
        }
        if self.nodes.contains_key(full.as_str()) {
            return Err(err(ErrorCode::NodeExists, format!("{full} already exists")));
        }
        check_fence(parent_path, parent, fence)?;
        self.ruled.check(parent_path, rule)?;

        self.revision = revision;
        let full: Arc<str> = Arc::from(full);
        let parent = self
            .nodes
            .get_mut(parent_path)
            .expect("parent checked above");
        accept_fence(parent, fence);
        let mut node = Node::new(data, revision, now_ms, owner);
        // The new node starts out fenced as its parent now is (at least by
        // the token that created it), so a holder with an older token can
        // change neither it nor a node re-created where a newer holder
        // deleted one.
        node.fence = parent.fence;
        let stat = node.stat();
        self.nodes.insert(full.clone(), node);
        if !acl.is_open() {
            let acl = NodeAcl {
                acl: acl.clone(),
                aversion: 0,
            };
            self.acls.insert(full.clone(), acl);
        }
        if mode.is_container() {
            self.containers.insert(full.clone(), ());
        }
        let parent = self
            .nodes
            .get_mut(parent_path)
            .expect("parent checked above");
        parent.add_child(revision, full.clone());
        parent.cversion = parent.cversion.wrapping_add(1);
        parent.pzxid = revision;
        if rule != queue::QueueRule::Exclusive || !self.ruled.is_empty() {
            let others = parent.child_entries();
            self.ruled
                .joined(parent_path, revision, &full, rule, others);
        }
        if let Some(owner) = owner {
            self.sessions
                .get_mut(&owner)
                .expect("session checked above")
                .ephemerals
                .insert(full.clone());
        }
        triggers.push(Trigger {
            kind: EventKind::Created,
            path: full.clone(),
        });
        triggers.push(Trigger {
            kind: EventKind::ChildrenChanged,
            path: parent_key,
        });
        Ok(Outcome::Created {
            path: full,
            sequence,
            stat,
        })
    }

    pub(crate) fn delete(
        &mut self,
        target: &str,
        version: Option<u32>,
        fence: Option<u64>,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        if target == "/" {
            return Err(err(
                ErrorCode::BadArguments,
                "the root node / cannot be deleted".into(),
            ));
        }
        let node = self
            .nodes
            .get(target)
            .ok_or_else(|| err(ErrorCode::NoNode, format!("{target} does not exist")))?;
        check_version(target, node, version)?;
        check_fence(target, node, fence)?;
        // Deleting changes the parent's children as creating does: the
        // parent's fence is checked, and raised, the same way, so that a
        // stale holder cannot bring back what a newer one deleted.
        let parent_path = path::parent(target).expect("the root is refused above");
        let parent = self.nodes.get(parent_path).expect("a node's parent exists");
        check_fence(parent_path, parent, fence)?;
        if node.child_count() > 0 {
            return Err(err(
                ErrorCode::NotEmpty,
                format!(
                    "{target} has {} children; delete them first",
                    node.child_count()
                ),
            ));
        }
        self.revision += 1;
        let key = self
            .nodes
            .get_key_value(target)
            .map(|(k, _)| k.clone())
            .expect("node checked above");
        accept_fence(
            self.nodes.get_mut(parent_path).expect("checked above"),
            fence,
        );
        self.unlink(&key, triggers);
        Ok(Outcome::Deleted)
    }

    /// Removes a childless node at the current revision: from the tree, from
    /// its parent, and from its owner's ephemerals.
    pub(crate) fn unlink(&mut self, target: &Arc<str>, triggers: &mut Vec<Trigger>) {
        let Some(node) = self.nodes.get(target) else {
            return;
        };
        debug_assert_eq!(node.child_count(), 0, "only childless nodes are unlinked");
        let (czxid, owner) = (node.czxid, node.owner());
        self.nodes.remove(target);
        let parent_path = path::parent(target).expect("the root is never unlinked");
        if !self.ruled.is_empty() {
            self.ruled.left(parent_path, czxid);
        }
        if !self.delays.is_empty() {
            self.delays.forget(target);
        }
        if !self.acls.is_empty() {
            self.acls.remove(target);
        }
        if !self.containers.is_empty() {
            self.containers.remove(target);
        }
        if let Some(parent) = self.nodes.get_mut(parent_path) {
            parent.remove_child(czxid);
            parent.cversion = parent.cversion.wrapping_add(1);
            parent.pzxid = self.revision;
        }
        if let Some(owner) = owner {
            if let Some(session) = self.sessions.get_mut(&owner) {
                session.ephemerals.remove(target);
            }
        }
        triggers.push(Trigger {
            kind: EventKind::Deleted,
            path: target.clone(),
        });
        triggers.push(Trigger {
            kind: EventKind::ChildrenChanged,
            path: Arc::from(parent_path),
        });
    }

    pub(crate) fn set_data(
        &mut self,
        target: &str,
        data: &[u8],
        version: Option<u32>,
        fence: Option<u64>,
        now_ms: u64,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        let Some((key, node)) = self.nodes.get_key_value(target) else {
            return Err(err(ErrorCode::NoNode, format!("{target} does not exist")));
        };
        check_version(target, node, version)?;
        check_fence(target, node, fence)?;
        let key = key.clone();
        self.revision += 1;
        let node = self.nodes.get_mut(target).expect("node checked above");
        accept_fence(node, fence);
        node.set_data(data);
        node.version = node.version.wrapping_add(1);
        node.mzxid = self.revision;
        node.mtime = now_ms;
        triggers.push(Trigger {
            kind: EventKind::DataChanged,
            path: key,
        });
        Ok(Outcome::DataSet(node.stat()))
    }

    /// Deletes a container that had children and has none left, as a
    /// delete would. Refused (and nothing changes) if the node is gone, is
    /// no container, has children again, or never had any: the leader
    /// proposed it from a state that has moved on.
    pub(crate) fn delete_container(
        &mut self,
        target: &str,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        let Some((key, node)) = self.nodes.get_key_value(target) else {
            return Err(err(ErrorCode::NoNode, format!("{target} does not exist")));
        };
        if !self.is_container(target) {
            return Err(err(
                ErrorCode::BadArguments,
                format!("{target} is not a container"),
            ));
        }
        if node.child_count() > 0 {
            return Err(err(
                ErrorCode::NotEmpty,
                format!("container {target} has children again"),
            ));
        }
        if node.cversion == 0 {
            return Err(err(
                ErrorCode::BadArguments,
                format!("container {target} never had children"),
            ));
        }
        let key = key.clone();
        self.revision += 1;
        self.unlink(&key, triggers);
        Ok(Outcome::Deleted)
    }

    /// Replaces a node's access control list. It fires no watch, and changes
    /// nothing of the node's stat: only its ACL version.
    pub(crate) fn set_acl(
        &mut self,
        target: &str,
        acl: &Acl,
        version: Option<u32>,
    ) -> Result<Outcome, ErrorReply> {
        let Some((key, node)) = self.nodes.get_key_value(target) else {
            return Err(err(ErrorCode::NoNode, format!("{target} does not exist")));
        };
        let aversion = self.acl(target).1;
        match version {
            Some(v) if v != aversion => {
                return Err(err(
                    ErrorCode::BadVersion,
                    format!("the ACL of {target} is at version {aversion}, not the expected {v}"),
                ))
            }
            _ => {}
        }
        let (key, stat) = (key.clone(), node.stat());
        self.revision += 1;
        let aversion = aversion.wrapping_add(1);
        let acl = acl.clone();
        self.acls.insert(key, NodeAcl { acl, aversion });
        Ok(Outcome::AclSet { stat, aversion })
    }
}

/// Refuses a fenced write whose token is below the highest the node has
/// accepted (invariant 3 of docs/design.md: an equal token is accepted).
pub(crate) fn check_fence(target: &str, node: &Node, fence: Option<u64>) -> Result<(), ErrorReply> {
    match fence {
        Some(token) if token < node.fence => Err(err(
            ErrorCode::StaleFence,
            format!(
                "fencing token {token} is stale for {target}: it has already accepted token {}",
                node.fence
            ),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn accept_fence(node: &mut Node, fence: Option<u64>) {
    if let Some(token) = fence {
        node.fence = node.fence.max(token);
    }
}

pub(crate) fn check_version(
    target: &str,
    node: &Node,
    expected: Option<u32>,
) -> Result<(), ErrorReply> {
    match expected {
        Some(v) if v != node.version => Err(err(
            ErrorCode::BadVersion,
            format!(
                "{target} is at version {}, not the expected {v}",
                node.version
            ),
        )),
        _ => Ok(()),
    }
}
