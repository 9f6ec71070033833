//! A state machine written out as images, and rebuilt from them.

use std::sync::Arc;

use baton_proto::{path, SessionId};

use crate::queue::{QueueRule, Ruled};
use crate::{Kept, Map, Node, NodeAcl, NodeImage, Session, SessionImage, StateMachine};

/// Why images do not make a state machine: the first inconsistency found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Inconsistent {
    #[error("session {0} appears twice")]
    SessionTwice(SessionId),
    #[error("{0} comes before its parent")]
    BeforeParent(String),
    #[error("the root is not the first node")]
    RootNotFirst,
    #[error("{path} is owned by unknown session {owner}")]
    UnknownOwner { path: String, owner: SessionId },
    #[error("{0} appears twice")]
    NodeTwice(String),
    #[error("the root node is missing")]
    RootMissing,
}

/// A revision moved on past `u64::MAX`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("revision {revision} cannot move {by} further on: it would pass {max}", max = u64::MAX)]
pub struct RevisionOverflow {
    pub revision: u64,
    pub by: u64,
}

impl StateMachine {
    /// Every node, each after its parent (the root first): the order a
    /// snapshot stores them in.
    pub fn nodes_parent_first(&self) -> impl Iterator<Item = NodeImage> + '_ {
        let mut queue: std::collections::VecDeque<&str> = std::collections::VecDeque::from(["/"]);
        std::iter::from_fn(move || {
            let path = queue.pop_front()?;
            let node = self.nodes.get(path).expect("children exist");
            queue.extend(node.children().map(|c| &**c));
            let stat = node.stat();
            Some(NodeImage {
                path: path.to_owned(),
                data: node.data(),
                czxid: stat.czxid,
                mzxid: stat.mzxid,
                pzxid: stat.pzxid,
                ctime: stat.ctime,
                mtime: stat.mtime,
                version: stat.version,
                cversion: stat.cversion,
                owner: stat.ephemeral_owner,
                fence: node.fence(),
                rule: self.rule(path),
                lock_delay_ms: self.lock_delay(path).unwrap_or(0),
                tombstone_until: self.tombstone_until(path).unwrap_or(0),
                acl: self.acl(path).0.clone(),
                aversion: self.acl(path).1,
                container: self.is_container(path),
            })
        })
    }

    /// Rebuilds a state machine from a snapshot's contents: the revision and
    /// the time of the latest change, the sessions, and the nodes, each after
    /// its parent.
    ///
    /// # Errors
    /// The first [`Inconsistent`] thing: a node before its parent, an
    /// ephemeral owned by an unknown session, a duplicate.
    pub fn restore(
        revision: u64,
        last_now_ms: u64,
        sessions: impl IntoIterator<Item = SessionImage>,
        nodes: impl IntoIterator<Item = NodeImage>,
    ) -> Result<StateMachine, Inconsistent> {
        let mut sm = StateMachine {
            nodes: Map::new(),
            sessions: Map::new(),
            revision,
            last_now_ms,
            ruled: Ruled::default(),
            delays: Default::default(),
            acls: Map::new(),
            containers: Map::new(),
        };
        for SessionImage {
            id,
            timeout_ms,
            secret,
            last,
        } in sessions
        {
            let mut session = Session::new(timeout_ms, secret);
            if let Some(last) = last {
                session.last_xid = last.xid;
                session.last = Some(Box::new(Kept::of(id, &last.reply)));
            }
            if sm.sessions.contains_key(&id) {
                return Err(Inconsistent::SessionTwice(id));
            }
            sm.sessions.insert(id, session);
        }
        for image in nodes {
            let node = Node::restore(&image);
            let rule = image.rule;
            let path: Arc<str> = Arc::from(image.path.as_str());
            if let Some(parent_path) = path::parent(&path) {
                let parent = sm
                    .nodes
                    .get_mut(parent_path)
                    .ok_or_else(|| Inconsistent::BeforeParent(path.to_string()))?;
                parent.add_child(node.czxid, path.clone());
                if rule != QueueRule::Exclusive || !sm.ruled.is_empty() {
                    let others = parent.child_entries();
                    sm.ruled
                        .joined(parent_path, node.czxid, &path, rule, others);
                }
            } else if !sm.nodes.is_empty() {
                return Err(Inconsistent::RootNotFirst);
            }
            if let Some(owner) = node.owner() {
                sm.sessions
                    .get_mut(&owner)
                    .ok_or_else(|| Inconsistent::UnknownOwner {
                        path: path.to_string(),
                        owner,
                    })?
                    .ephemerals
                    .insert(path.clone());
            }
            if sm.nodes.contains_key(&path) {
                return Err(Inconsistent::NodeTwice(path.to_string()));
            }
            sm.delays
                .restore(&path, image.lock_delay_ms, image.tombstone_until);
            if image.container {
                sm.containers.insert(path.clone(), ());
            }
            if !image.acl.is_open() || image.aversion > 0 {
                sm.acls.insert(
                    path.clone(),
                    NodeAcl {
                        acl: image.acl,
                        aversion: image.aversion,
                    },
                );
            }
            sm.nodes.insert(path.clone(), node);
        }
        if !sm.nodes.contains_key("/") {
            return Err(Inconsistent::RootMissing);
        }
        Ok(sm)
    }
}
