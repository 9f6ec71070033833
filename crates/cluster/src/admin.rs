//! What a member says about the cluster, and membership changes.
//!
//! Every member keeps a description of the cluster up to date (twice a
//! second): its members and their addresses, and the leader's view of each
//! one's progress, which the leader gathers from the others over the peer
//! port. The status probe on the client port answers with it, and with the
//! member's own role and progress as they are when asked.
//!
//! Adding a member makes it a learner first, which catches up (by snapshot
//! if it is far behind), then a voter; or, for an observer, leaves it a
//! learner: it serves clients (reads and watches from its own state,
//! changes forwarded to the leader) but never votes, so it adds read
//! capacity without making a majority larger or slower. An observer can
//! later be made a voter, and a voter an observer. Removing a member is a
//! membership change without it. All are asked of the leader over the peer
//! port.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_server::replicate::{ClusterStatus, MemberProgress};
use openraft::{ChangeMembers, ServerState};
use tokio::sync::watch;

use crate::network::{self, CallError, MemberStatus};
use crate::types::{Member, NodeId, Raft};

/// How often the description of the cluster is refreshed.
const REFRESH: Duration = Duration::from_millis(500);
/// How long the leader waits for another member's status.
const ASK: Duration = Duration::from_millis(300);
/// How long an add waits for the learner to hold the membership that added
/// it (below the 120 s `baton cluster add` waits for the answer).
const CATCH_UP: Duration = Duration::from_secs(100);
/// How long an add waits for a learner that makes no progress at all (one
/// that is not running, or not in reach): a snapshot installed takes one
/// step, however large.
const NO_PROGRESS: Duration = Duration::from_secs(30);

pub use crate::network::Change;

/// The latest description of the cluster. What this member says of itself
/// is read when asked; what the leader gathered from the others is up to
/// `REFRESH` old.
#[derive(Clone)]
pub struct Status {
    raft: Raft,
    id: NodeId,
    tls: Option<network::PeerTls>,
    described: Arc<Mutex<Option<ClusterStatus>>>,
}

impl Status {
    pub fn new(raft: Raft, id: NodeId, tls: Option<network::PeerTls>) -> Status {
        Status {
            raft,
            id,
            tls,
            described: Arc::default(),
        }
    }

    /// The description; `None` until the first is made.
    pub fn get(&self) -> Option<ClusterStatus> {
        let mut described = self
            .described
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let m = self.raft.metrics().borrow().clone();
        let me = MemberStatus::of(&self.raft);
        described.leader = m.current_leader;
        described.term = m.current_term;
        described.applied_index = me.applied_index;
        for member in described.members.iter_mut().filter(|p| p.id == self.id) {
            member.role = me.role.clone();
            member.applied_index = me.applied_index;
            member.last_log_index = me.last_log_index;
        }
        Some(described)
    }

    /// Keeps the description of the cluster up to date until `stop`: every
    /// `REFRESH`, and at once when the member's role, its leader or the
    /// membership changes.
    pub async fn refresh(self, routes: BTreeMap<NodeId, String>, mut stop: watch::Receiver<bool>) {
        let mut metrics = self.raft.metrics();
        loop {
            let shape = Shape::of(&metrics.borrow_and_update());
            let described = describe(&self.raft, self.id, &routes, self.tls.as_ref()).await;
            *self.described.lock().unwrap_or_else(|e| e.into_inner()) = Some(described);
            let next = tokio::time::Instant::now() + REFRESH;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => break,
                    changed = metrics.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if Shape::of(&metrics.borrow_and_update()) != shape {
                            break;
                        }
                    }
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// What, when it changes, makes the description out of date at once.
#[derive(PartialEq)]
struct Shape {
    state: ServerState,
    leader: Option<NodeId>,
    membership: Option<crate::types::LogId>,
}

impl Shape {
    fn of(m: &crate::types::Metrics) -> Shape {
        Shape {
            state: m.state,
            leader: m.current_leader,
            membership: *m.membership_config.log_id(),
        }
    }
}

/// The cluster as this member sees it; the leader asks every other member
/// for its progress.
async fn describe(
    raft: &Raft,
    id: NodeId,
    routes: &BTreeMap<NodeId, String>,
    tls: Option<&network::PeerTls>,
) -> ClusterStatus {
    let m = raft.metrics().borrow().clone();
    let membership = m.membership_config.membership().clone();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let leading = m.state == ServerState::Leader;
    let mut asked: BTreeMap<NodeId, Option<MemberStatus>> = BTreeMap::new();
    if leading {
        let asks = membership
            .nodes()
            .filter(|(n, _)| **n != id)
            .map(|(n, node)| {
                let addr = routes.get(n).cloned().unwrap_or_else(|| node.peer.clone());
                let (n, advertised) = (*n, node.peer.clone());
                async move {
                    let status = network::status_of(id, &addr, &advertised, ASK, tls).await;
                    (n, status.ok())
                }
            });
        asked = futures::future::join_all(asks).await.into_iter().collect();
    }
    let replication = m.replication.clone().unwrap_or_default();
    let last_log = m.last_log_index.unwrap_or(0);
    let members: Vec<MemberProgress> = membership
        .nodes()
        .map(|(n, node)| {
            let status = if *n == id {
                Some(MemberStatus::of(raft))
            } else {
                asked.get(n).cloned().flatten()
            };
            let matched = replication.get(n).cloned().flatten().map(|l| l.index);
            let role = match &status {
                Some(s) => s.role.clone(),
                None if voters.contains(n) => "unreachable".into(),
                None => "learner".into(),
            };
            MemberProgress {
                id: *n,
                client_addr: node.client.clone(),
                peer_addr: node.peer.clone(),
                voter: voters.contains(n),
                role,
                applied_index: status.as_ref().and_then(|s| s.applied_index),
                last_log_index: status.as_ref().and_then(|s| s.last_log_index),
                lag: if leading && *n != id {
                    Some(last_log.saturating_sub(matched.unwrap_or(0)))
                } else if leading {
                    Some(0)
                } else {
                    None
                },
            }
        })
        .collect();
    ClusterStatus {
        id,
        leader: m.current_leader,
        term: m.current_term,
        commit_index: if leading {
            commit_index(last_log, &voters, id, &replication)
        } else {
            None
        },
        applied_index: m.last_applied.map(|l| l.index),
        membership_index: m.membership_config.log_id().map(|l| l.index),
        members,
    }
}

/// The highest index a majority of voters holds, as the leader sees it.
fn commit_index(
    leader_last: u64,
    voters: &BTreeSet<NodeId>,
    leader: NodeId,
    replication: &BTreeMap<NodeId, Option<crate::types::LogId>>,
) -> Option<u64> {
    let mut held: Vec<u64> = voters
        .iter()
        .map(|v| {
            if *v == leader {
                leader_last
            } else {
                replication.get(v).cloned().flatten().map_or(0, |l| l.index)
            }
        })
        .collect();
    if held.is_empty() {
        return None;
    }
    held.sort_unstable_by(|a, b| b.cmp(a));
    Some(held[held.len() / 2])
}

/// What to add to a change's answer when the cluster is left with an even
/// number of voters, which survives no more failures than one fewer.
fn even_warning(voters: usize) -> String {
    if voters % 2 == 1 {
        return String::new();
    }
    tracing::warn!(voters, "the cluster has an even number of voting members");
    format!(
        ". Warning: the cluster now has {voters} voting members; a majority of them is {}, so it survives the loss of {} member(s), no more than with {}: add or remove one",
        voters / 2 + 1,
        (voters - 1) / 2,
        voters - 1
    )
}

/// Why a learner being added did not catch up; it stays a learner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatchUpError {
    /// This member stopped leading while it waited.
    #[error("member {id} was added as a learner, but this member stopped leading before the learner caught up; it stays a learner: run the same add again")]
    StoppedLeading { id: NodeId },
    /// The learner fell short of index `at`, holding the log up to `held`.
    #[error("member {id} was added as a learner but {stall} (it holds {}; the membership that added it is at index {at}); it stays a learner: see that it runs and is in reach, then run the same add again", holding(.held))]
    Stalled {
        id: NodeId,
        stall: Stall,
        held: Option<u64>,
        at: u64,
    },
}

/// What a learner's catch-up ran out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stall {
    /// The time an add waits for it as a whole.
    TooSlow,
    /// The time an add waits for it to make any progress.
    NoProgress,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stall::TooSlow => write!(f, "has not caught up within {} s", CATCH_UP.as_secs()),
            Stall::NoProgress => write!(f, "made no progress for {} s", NO_PROGRESS.as_secs()),
        }
    }
}

/// What a learner holds of the log, as [`CatchUpError`] says it.
fn holding(held: &Option<u64>) -> String {
    held.map_or("no entry".to_string(), |i| {
        format!("the log up to index {i}")
    })
}

/// Why a membership change was not made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    /// This member does not lead; the leader is at peer address `leader`.
    #[error("this member does not lead; ask the leader at peer address {leader}")]
    NotLeader { leader: String },
    /// This member does not lead, and knows of no leader.
    #[error("this member does not lead and no leader is known right now; try again")]
    NoLeader,
    /// openraft did not add the member as a learner.
    #[error("adding member {id} as a learner: {source}")]
    AddLearner {
        id: NodeId,
        #[source]
        source: WriteError,
    },
    /// The learner did not catch up.
    #[error(transparent)]
    CatchUp(#[from] CatchUpError),
    /// The learner caught up, but could not be told that it was added.
    #[error("member {id} caught up as a learner, but could not be told it was added ({source}); it stays a learner: run the same add again")]
    NotTold {
        id: NodeId,
        #[source]
        source: CallError,
    },
    /// openraft did not make the learner a voter.
    #[error("making member {id} a voter: {source}")]
    MakeVoter {
        id: NodeId,
        #[source]
        source: WriteError,
    },
    /// The member to remove is not in the cluster.
    #[error("member {id} is not a member of this cluster (neither a voter nor an observer)")]
    NotMember { id: NodeId },
    /// The member to remove, or to make an observer, is the only voter.
    #[error(
        "member {id} is the only voter: the cluster needs at least one; add another voter first"
    )]
    LastMember { id: NodeId },
    /// openraft did not make the voter an observer.
    #[error("making member {id} an observer: {source}")]
    MakeObserver {
        id: NodeId,
        #[source]
        source: WriteError,
    },
    /// openraft did not remove the member.
    #[error("removing member {id}: {source}")]
    Remove {
        id: NodeId,
        #[source]
        source: WriteError,
    },
}

/// Why openraft did not make a membership change.
pub type WriteError =
    openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, Member>>;

/// Waits until learner `id` holds the log up to index `at` (as the
/// leader knows from its replies), while this member leads, for at most
/// [`CATCH_UP`], and at most [`NO_PROGRESS`] without any.
async fn caught_up(raft: &Raft, id: NodeId, at: u64) -> Result<(), CatchUpError> {
    let holds = |m: &crate::types::Metrics| -> Option<u64> {
        m.replication
            .as_ref()?
            .get(&id)?
            .as_ref()
            .map(|log_id| log_id.index)
    };
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    let mut held = holds(&raft.metrics().borrow());
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let waited = raft
            .wait(Some(left.min(NO_PROGRESS)))
            .metrics(
                |m| m.state != ServerState::Leader || holds(m) > held,
                "the learner holds more of the log",
            )
            .await;
        let m = raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(CatchUpError::StoppedLeading { id });
        }
        let now = holds(&m);
        if now.is_some_and(|i| i >= at) {
            return Ok(());
        }
        if waited.is_err() {
            let stall = if left <= NO_PROGRESS {
                Stall::TooSlow
            } else {
                Stall::NoProgress
            };
            return Err(CatchUpError::Stalled {
                id,
                stall,
                held: now,
                at,
            });
        }
        held = now;
    }
}

/// How long a membership change waits for another under way to finish.
const ANOTHER_CHANGE: Duration = Duration::from_secs(10);

/// Makes membership change `change`, waiting (up to [`ANOTHER_CHANGE`])
/// while another is under way, which openraft refuses to overlap. With
/// `retain`, voters it removes stay as learners (observers).
async fn change_when_free(
    raft: &Raft,
    change: ChangeMembers<NodeId, Member>,
    retain: bool,
) -> Result<
    openraft::raft::ClientWriteResponse<crate::types::TypeConfig>,
    openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, Member>>,
> {
    let deadline = tokio::time::Instant::now() + ANOTHER_CHANGE;
    loop {
        match raft.change_membership(change.clone(), retain).await {
            Err(e)
                if tokio::time::Instant::now() < deadline
                    && matches!(
                        e.api_error(),
                        Some(openraft::error::ClientWriteError::ChangeMembershipError(
                            openraft::error::ChangeMembershipError::InProgress(_)
                        ))
                    ) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            done => return done,
        }
    }
}

/// How many voters the membership a change made has.
fn voters_after(
    changed: &openraft::raft::ClientWriteResponse<crate::types::TypeConfig>,
) -> Option<usize> {
    changed.membership.as_ref().map(|m| m.voter_ids().count())
}

/// Carries out a membership change on the leader; what it did, for the
/// operator.
///
/// # Errors
/// What went wrong, for the operator: this member does not lead (with the
/// leader's peer address), or the change failed.
pub async fn change(answering: &network::Answering, change: Change) -> Result<String, ChangeError> {
    let raft = &answering.raft;
    let m = raft.metrics().borrow().clone();
    if m.state != ServerState::Leader {
        let leader = m.current_leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.peer.clone())
        });
        return Err(match leader {
            Some(leader) => ChangeError::NotLeader { leader },
            None => ChangeError::NoLeader,
        });
    }
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let named = membership.get_node(&id_of(&change)).is_some();
    match change {
        Change::Add {
            id, observer: true, ..
        } if voters.contains(&id) => {
            if voters.len() == 1 {
                return Err(ChangeError::LastMember { id });
            }
            let changed = change_when_free(
                raft,
                ChangeMembers::RemoveVoters(BTreeSet::from([id])),
                true,
            )
            .await
            .map_err(|source| ChangeError::MakeObserver { id, source })?;
            let count = voters_after(&changed).unwrap_or(voters.len() - 1);
            Ok(format!(
                "member {id} no longer votes; it serves clients as an observer{}",
                even_warning(count)
            ))
        }
        Change::Add {
            id,
            member,
            observer,
        } => {
            // Added again after its removal, it starts from the log it has
            // now: what it held before does not count (see `network`). Not
            // while it is still a member (a voter or a learner): the leader
            // still counts how far it matched, and a member wiped meanwhile
            // must be found to have gone back, not handed to openraft as a
            // follower whose log lost what it matched (which openraft only
            // debug-asserts against: in a release build it then sends the
            // member entries it cannot place).
            if !named {
                answering.held.forget(id);
            }
            let added = raft
                .add_learner(id, member.clone(), true)
                .await
                .map_err(|source| ChangeError::AddLearner { id, source })?;
            // openraft's blocking add returns once the learner is within
            // `replication_lag_threshold` (5,000) entries of the leader's
            // log, which a learner that holds nothing yet may well be. It
            // must hold the membership that added it before it is told
            // where that is and before it votes (see `joining`): a voter
            // that has not caught up is a majority's member that cannot
            // accept the next entry, and, killed before the membership
            // naming it reached it, it finds itself in none.
            caught_up(raft, id, added.log_id.index).await?;
            // It has caught up to the membership that added it: it is told
            // where that is before it votes (see `joining`).
            let addr = answering.routes.get(&id).unwrap_or(&member.peer);
            let mut told = Ok(());
            for _ in 0..5 {
                told = network::tell_added(
                    addr,
                    id,
                    added.log_id.index,
                    Duration::from_secs(2),
                    answering.tls.as_ref(),
                )
                .await;
                if told.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            told.map_err(|source| ChangeError::NotTold { id, source })?;
            if observer {
                return Ok(format!(
                    "member {id} ({member}) added as an observer; it has caught up and serves clients, and does not vote"
                ));
            }
            let mut next = voters;
            next.insert(id);
            // The change itself, applied to the membership as it is then:
            // a set of voters computed here would undo a change made
            // meanwhile (two adds at once each dropped the other's member).
            let changed = change_when_free(
                raft,
                ChangeMembers::AddVoterIds(BTreeSet::from([id])),
                false,
            )
            .await
            .map_err(|source| ChangeError::MakeVoter { id, source })?;
            let count = voters_after(&changed).unwrap_or(next.len());
            Ok(format!(
                "member {id} ({member}) added; it has caught up and votes{}",
                even_warning(count)
            ))
        }
        Change::Remove { id } if named && !voters.contains(&id) => {
            change_when_free(
                raft,
                ChangeMembers::RemoveNodes(BTreeSet::from([id])),
                false,
            )
            .await
            .map_err(|source| ChangeError::Remove { id, source })?;
            Ok(format!(
                "observer {id} removed; it stops once it learns it (at once if it is running and in reach)"
            ))
        }
        Change::Remove { id } => {
            if !voters.contains(&id) {
                return Err(ChangeError::NotMember { id });
            }
            let mut next = voters;
            next.remove(&id);
            if next.is_empty() {
                return Err(ChangeError::LastMember { id });
            }
            let changed = change_when_free(
                raft,
                ChangeMembers::RemoveVoters(BTreeSet::from([id])),
                false,
            )
            .await
            .map_err(|source| ChangeError::Remove { id, source })?;
            let count = voters_after(&changed).unwrap_or(next.len());
            Ok(format!(
                "member {id} removed; it stops once it learns it (at once if it is running and in reach){}",
                even_warning(count)
            ))
        }
    }
}

/// The member a change is about.
fn id_of(change: &Change) -> NodeId {
    match change {
        Change::Add { id, .. } | Change::Remove { id } => *id,
    }
}
