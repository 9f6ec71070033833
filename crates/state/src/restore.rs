//! A state machine written out as images, and rebuilt from them.

use std::sync::Arc;

use baton_proto::path;

use crate::{Kept, Map, Node, NodeImage, Session, SessionImage, StateMachine};

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
            })
        })
    }

    /// Rebuilds a state machine from a snapshot's contents: the revision and
    /// the time of the latest change, the sessions, and the nodes, each after
    /// its parent.
    ///
    /// # Errors
    /// A description of the first inconsistency: a node before its parent, an
    /// ephemeral owned by an unknown session, a duplicate.
    pub fn restore(
        revision: u64,
        last_now_ms: u64,
        sessions: impl IntoIterator<Item = SessionImage>,
        nodes: impl IntoIterator<Item = NodeImage>,
    ) -> Result<StateMachine, String> {
        let mut sm = StateMachine {
            nodes: Map::new(),
            sessions: Map::new(),
            revision,
            last_now_ms,
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
                return Err(format!("session {id} appears twice"));
            }
            sm.sessions.insert(id, session);
        }
        for image in nodes {
            let node = Node::restore(&image);
            let path: Arc<str> = Arc::from(image.path.as_str());
            if let Some(parent_path) = path::parent(&path) {
                let parent = sm
                    .nodes
                    .get_mut(parent_path)
                    .ok_or_else(|| format!("{path} comes before its parent"))?;
                parent.add_child(node.czxid, path.clone());
            } else if !sm.nodes.is_empty() {
                return Err("the root is not the first node".into());
            }
            if let Some(owner) = node.owner() {
                sm.sessions
                    .get_mut(&owner)
                    .ok_or_else(|| format!("{path} is owned by unknown session {owner}"))?
                    .ephemerals
                    .insert(path.clone());
            }
            if sm.nodes.contains_key(&path) {
                return Err(format!("{path} appears twice"));
            }
            sm.nodes.insert(path.clone(), node);
        }
        if !sm.nodes.contains_key("/") {
            return Err("the root node is missing".into());
        }
        Ok(sm)
    }
}
