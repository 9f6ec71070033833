//! When a member may stand for election, and when it learns it is no longer
//! a member.
//!
//! openraft (0.9) has no pre-vote: a member cut off from the others stands
//! for election again and again, its term climbing with each try, and when
//! it returns its term is ahead of the cluster's: the leader, told of the
//! higher term, steps down, and the cluster holds an election for nothing.
//! So every member that does not lead asks every other member of its
//! membership for its status, twice per minimum election timeout, and lets
//! openraft stand for election only while it reaches a majority of the
//! voters (itself included). A member cut off stops campaigning within
//! about one election timeout and before its own first election falls due
//! (a follower waits for the leader's lease as well as its timeout), so
//! its term stays where it was; on its return it follows the leader it
//! finds.
//!
//! The same questions tell a member that was removed from the cluster
//! while it was away or cut off (the leader stops replicating to a member
//! once it is removed, so it never hears of its removal through the log): a
//! leader whose applied membership is newer than the member's and leaves it
//! out. The member then says so and stops, rather than campaign forever.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use openraft::ServerState;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::network::{MemberStatus, PeerTls, StatusLink};
use crate::types::{NodeId, Raft};

/// Watches this member's reach and membership until `stop`; sends on
/// `removed`, with why, once the member learns it is no longer a member.
pub(crate) async fn run(
    raft: Raft,
    id: NodeId,
    routes: BTreeMap<NodeId, String>,
    tls: Option<PeerTls>,
    election_timeout: Duration,
    removed: watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
) {
    let every = election_timeout / 2;
    let mut links: BTreeMap<NodeId, (String, StatusLink)> = BTreeMap::new();
    let mut allowed = true;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let m = raft.metrics().borrow().clone();
        if m.state == ServerState::Leader || m.state == ServerState::Shutdown {
            continue;
        }
        let membership = m.membership_config.membership().clone();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        // Links to the members of the membership as it is now.
        links.retain(|n, (peer, _)| {
            membership
                .get_node(n)
                .is_some_and(|node| *peer == node.peer)
        });
        for (n, node) in membership.nodes() {
            if *n != id && !links.contains_key(n) {
                let addr = routes.get(n).cloned().unwrap_or_else(|| node.peer.clone());
                let link = StatusLink::new(id, &addr, &node.peer, tls.as_ref());
                links.insert(*n, (node.peer.clone(), link));
            }
        }
        let answers: Vec<(NodeId, Option<MemberStatus>)> = join_all(
            links
                .iter_mut()
                .map(|(n, (_, link))| async move { (*n, link.ask(election_timeout).await.ok()) }),
        )
        .await;
        let mine = m.membership_config.log_id().map(|l| l.index);
        if let Some(why) = removal(id, mine, &answers) {
            warn!("{why}; stopping");
            removed.send_replace(Some(why));
            return;
        }
        let reached = 1 + answers
            .iter()
            .filter(|(n, s)| s.is_some() && voters.contains(n))
            .count();
        let may = voters.contains(&id) && reached * 2 > voters.len();
        if may != allowed {
            if may {
                info!(reached, voters = voters.len(), "a majority of the members is in reach again: standing for election when the leader falls silent");
            } else {
                info!(reached, voters = voters.len(), "fewer than a majority of the members in reach: not standing for election (the term stays where it is)");
            }
            raft.runtime_config().elect(may);
            allowed = may;
        }
    }
}

/// Why member `id` (whose membership has log index `mine`) is no longer a
/// member, if one of `answers` shows it: a leader that has applied a newer
/// membership that leaves `id` out.
fn removal(
    id: NodeId,
    mine: Option<u64>,
    answers: &[(NodeId, Option<MemberStatus>)],
) -> Option<String> {
    answers.iter().find_map(|(n, s)| {
        let s = s.as_ref()?;
        let index = s.membership_index?;
        let applied = s.role == "leader" && s.applied_index.is_some_and(|a| a >= index);
        (applied && Some(index) > mine && !s.voters.contains(&id)).then(|| {
            format!(
                "member {id} is no longer a member of the cluster: its leader, member {n}, goes by a membership (log index {index}) whose voters are {:?}",
                s.voters
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(role: &str, membership_index: u64, applied: u64, voters: &[NodeId]) -> MemberStatus {
        MemberStatus {
            role: role.into(),
            membership_index: Some(membership_index),
            applied_index: Some(applied),
            voters: voters.to_vec(),
            ..MemberStatus::default()
        }
    }

    #[test]
    fn a_member_learns_its_removal_only_from_a_leader_that_applied_it() {
        let removed = [(1, Some(status("leader", 9, 12, &[1, 2])))];
        assert!(removal(3, Some(5), &removed).is_some());
        // Not from a follower, not before it is applied, not from an older
        // membership, and not if the member is in it.
        let follower = [(1, Some(status("follower", 9, 12, &[1, 2])))];
        assert!(removal(3, Some(5), &follower).is_none());
        let unapplied = [(1, Some(status("leader", 9, 8, &[1, 2])))];
        assert!(removal(3, Some(5), &unapplied).is_none());
        let older = [(1, Some(status("leader", 4, 12, &[1, 2])))];
        assert!(removal(3, Some(5), &older).is_none());
        let member = [(1, Some(status("leader", 9, 12, &[1, 2, 3])))];
        assert!(removal(3, Some(5), &member).is_none());
        assert!(removal(3, Some(5), &[(1, None)]).is_none());
    }
}
