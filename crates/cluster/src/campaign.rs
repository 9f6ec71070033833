//! When a member may stand for election, and when it learns it is no longer
//! a member.
//!
//! openraft (0.9) has no pre-vote: a member cut off from the others stands
//! for election again and again, its term climbing with each try, and when
//! it returns its term is ahead of the cluster's: the leader, told of the
//! higher term, steps down, and the cluster holds an election for nothing.
//! So every member asks each other member of its membership for its status,
//! twice per minimum election timeout (over a connection kept open, on a
//! task per member, so a slow answer holds up no other), and lets openraft
//! stand for election only while a majority of the voters (itself
//! included) has answered within the last two election timeouts. Cut off,
//! it stops standing before its first election falls due (a follower waits
//! out the leader's lease, two election timeouts, and then its own timeout
//! first), so its term stays where it was; on its return it follows the
//! leader it finds. A member that can reach a majority, whoever else is
//! gone, stands as before: failover is not delayed.
//!
//! The same answers tell a member that was removed from the cluster while
//! it was away or cut off (the leader stops replicating to a member once it
//! is removed, so it never hears of its removal through the log): a member
//! whose own membership names it, and a leader that has applied a newer
//! membership in which it is not even a learner. The member then says so
//! and stops, rather than campaign forever. (A member being added catches
//! up from memberships that leave it out, but the leader's names it as a
//! learner; one that waits to be added names no peer at all.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::network::{Answering, MemberStatus, StatusLink};
use crate::types::NodeId;

/// The latest answer of each member asked, and when it came.
type Answers = Arc<Mutex<BTreeMap<NodeId, (Instant, MemberStatus)>>>;

/// How long one question may take: long enough for a new connection, TLS
/// included, across a slow link (an answer that comes late still counts
/// when it comes).
const ASK_LIMIT: Duration = Duration::from_secs(2);

/// Watches member `id`'s reach and membership until `stop`; sends on
/// `removed`, with why, once the member learns it is no longer a member.
pub(crate) async fn run(
    member: Answering,
    id: NodeId,
    election_timeout: Duration,
    removed: watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
) {
    let Answering {
        raft,
        tls,
        routes,
        mut joining,
        ..
    } = member;
    let every = election_timeout / 2;
    let fresh = election_timeout * 2;
    let answers: Answers = Arc::default();
    // Askers by member, with the peer address each asks.
    let mut askers: BTreeMap<NodeId, (String, tokio::task::JoinHandle<()>)> = BTreeMap::new();
    // Elections start off for a member being added (see `joining`).
    let mut allowed = joining.is_none();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => break,
        }
        let m = raft.metrics().borrow().clone();
        if m.state == ServerState::Shutdown {
            break;
        }
        let membership = m.membership_config.membership().clone();
        // An asker for every other member of the membership as it is now.
        askers.retain(|n, (peer, task)| {
            let keep = membership
                .get_node(n)
                .is_some_and(|node| *peer == node.peer);
            if !keep {
                task.abort();
                answers.lock().unwrap_or_else(|e| e.into_inner()).remove(n);
            }
            keep
        });
        for (n, node) in membership.nodes() {
            if *n != id && !askers.contains_key(n) {
                let addr = routes.get(n).cloned().unwrap_or_else(|| node.peer.clone());
                let link = StatusLink::new(id, &addr, &node.peer, tls.as_ref());
                let task = tokio::spawn(ask(link, *n, every, answers.clone()));
                askers.insert(*n, (node.peer.clone(), task));
            }
        }
        if let Some(j) = &joining {
            if !j.added() {
                // Not a member yet, whatever an old membership in its log
                // says: it neither stands nor takes itself for removed.
                continue;
            }
            if let Err(e) = j.finish() {
                warn!("{e}; this member stays out of elections until it is started again");
                continue;
            }
            info!("this member has been added to the cluster: it stands for election as any other");
            joining = None;
        }
        if m.state == ServerState::Leader {
            continue;
        }
        let now = Instant::now();
        let latest: Vec<(NodeId, MemberStatus)> = answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, (at, _))| now.duration_since(*at) <= fresh)
            .map(|(n, (_, s))| (*n, s.clone()))
            .collect();
        let mine = m.membership_config.log_id().map(|l| l.index);
        let named = membership.get_node(&id).is_some();
        if let Some(why) = removal(id, named, mine, &latest) {
            warn!("{why}; stopping");
            removed.send_replace(Some(why));
            break;
        }
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        if !voters.contains(&id) {
            // A learner, or a member waiting to be added: openraft does not
            // let it stand anyway.
            continue;
        }
        let reached = 1 + latest.iter().filter(|(n, _)| voters.contains(n)).count();
        let may = reached * 2 > voters.len();
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
    for (_, (_, task)) in askers {
        task.abort();
    }
}

/// Asks one member for its status every `every`, noting each answer.
async fn ask(mut link: StatusLink, member: NodeId, every: Duration, answers: Answers) {
    loop {
        if let Ok(status) = link.ask(ASK_LIMIT).await {
            answers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(member, (Instant::now(), status));
        }
        tokio::time::sleep(every).await;
    }
}

/// Why member `id` is no longer a member, if `answers` show it: its own
/// membership (log index `mine`) names it (`named`), and a leader has
/// applied a newer membership that does not name it at all.
fn removal(
    id: NodeId,
    named: bool,
    mine: Option<u64>,
    answers: &[(NodeId, MemberStatus)],
) -> Option<String> {
    if !named {
        return None;
    }
    answers.iter().find_map(|(n, s)| {
        let index = s.membership_index?;
        let applied = s.role == "leader" && s.applied_index.is_some_and(|a| a >= index);
        (applied && Some(index) > mine && !s.members.contains(&id)).then(|| {
            format!(
                "member {id} is no longer a member of the cluster: its leader, member {n}, goes by a membership (log index {index}) whose members are {:?}",
                s.members
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(role: &str, membership_index: u64, applied: u64, members: &[NodeId]) -> MemberStatus {
        MemberStatus {
            role: role.into(),
            membership_index: Some(membership_index),
            applied_index: Some(applied),
            voters: members.to_vec(),
            members: members.to_vec(),
            ..MemberStatus::default()
        }
    }

    #[test]
    fn a_member_learns_its_removal_only_from_a_leader_that_applied_it() {
        let removed = [(1, status("leader", 9, 12, &[1, 2]))];
        assert!(removal(3, true, Some(5), &removed).is_some());
        // Not from a follower, not before it is applied, not from an older
        // membership, and not if the member is in it.
        let follower = [(1, status("follower", 9, 12, &[1, 2]))];
        assert!(removal(3, true, Some(5), &follower).is_none());
        let unapplied = [(1, status("leader", 9, 8, &[1, 2]))];
        assert!(removal(3, true, Some(5), &unapplied).is_none());
        let older = [(1, status("leader", 4, 12, &[1, 2]))];
        assert!(removal(3, true, Some(5), &older).is_none());
        let member = [(1, status("leader", 9, 12, &[1, 2, 3]))];
        assert!(removal(3, true, Some(5), &member).is_none());
        assert!(removal(3, true, Some(5), &[]).is_none());
    }

    #[test]
    fn a_member_being_added_is_not_taken_for_a_removed_one() {
        // Catching up from a snapshot whose membership leaves it out, while
        // the leader's names it as a learner (not yet a voter).
        let mut leader = status("leader", 70, 80, &[1, 2, 3, 4]);
        leader.voters = vec![1, 2, 3];
        assert!(removal(4, false, Some(0), &[(1, leader.clone())]).is_none());
        // And even a leader whose membership leaves it out says nothing to a
        // member whose own membership never named it.
        let other = status("leader", 70, 80, &[1, 2, 3]);
        assert!(removal(4, false, Some(0), &[(1, other)]).is_none());
    }
}
