//! Followers that serve clients.
//!
//! A follower with a known leader takes client sessions itself. It answers
//! reads and keeps watches from its own applied state, and sends what only
//! the leader may do to the leader, over one peer connection
//! ([`LeaderLink`]), one call at a time so that a session's changes reach
//! the leader in the order they were made:
//!
//! - changes: the leader proposes them (stamped with its clock); they come
//!   back through the replicated log, and the follower answers its client
//!   once it has applied them, so a client reads its own writes;
//! - liveness: the sessions the follower heard from since its last call,
//!   which the leader counts as heard from (the leader alone expires
//!   sessions);
//! - read barriers: the leader proves it still leads (a quorum heartbeat)
//!   and gives its read index (its commit index when it proved it); the
//!   follower waits until it has applied as far, then lets the reads go. A read served after such a
//!   barrier sees every change committed before the read arrived, as on
//!   the leader.
//!
//! Pings go through the barrier too, and a barrier carries the session it
//! is for: a follower answers a ping only once the leader has heard of the
//! session after the ping was sent, so a client's own deadline never runs
//! past the leader's (invariant 6 of docs/design.md). A follower cut off
//! from its leader answers nothing; its clients move on.
//!
//! A change of leader closes the follower's client connections (their
//! changes on their way to the old leader may be lost): the clients resume
//! and send their unanswered requests again, which the replicated state
//! answers at most once.

use std::collections::BTreeMap;
use std::time::Duration;

use baton_proto::SessionId;
use baton_server::replicate::{Barrier, NotLeading};
use baton_server::Applier;
use baton_state::Proposal;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::debug;

use crate::network::{LeaderLink, PeerTls, Served};
use crate::state_machine::StateMachineStore;
use crate::types::{Change, NodeId, Raft};

/// How long a follower waits for its leader's answer, and then to apply
/// as far as the leader had, before it gives up a call (its clients are
/// sent on: a member that far behind should not serve them).
const CALL_LIMIT: Duration = Duration::from_secs(5);

/// Proposals a follower sends its leader in one call, at most.
const CALL_PROPOSALS: usize = 1024;

/// What a follower's server asks of the link to the leader.
enum Up {
    Propose(Proposal),
    Barrier {
        heard: Option<SessionId>,
        done: oneshot::Sender<Result<(), NotLeading>>,
    },
    /// The member now follows this leader (`None`: none known, or it leads).
    Leader(Option<NodeId>),
}

/// A follower's way to its leader (see the module's documentation).
#[derive(Clone)]
pub(crate) struct ToLeader {
    up: mpsc::UnboundedSender<Up>,
}

/// How a follower reaches its leader: over the peer port ([`Dialing`]),
/// or, in the simulation, over the simulated network.
pub(crate) trait Dial: Send + 'static {
    type Link: CallLeader;
    /// A link to member `target`, which this member's membership names
    /// (`None`: it does not); nothing is dialed yet.
    fn dial(&self, raft: &Raft, target: NodeId) -> Option<Self::Link>;
}

/// A follower's link to one leader.
pub(crate) trait CallLeader: Send + 'static {
    type Error: std::fmt::Display;
    /// The member this link reaches.
    fn target(&self) -> NodeId;
    /// One call to the leader's side (`for_followers`), answered within
    /// `limit`: `Ok(Err)` is the leader's refusal of the whole call.
    fn serve(
        &mut self,
        change: Change,
        heard: Vec<u64>,
        confirm: bool,
        applied: Option<u64>,
        limit: Duration,
    ) -> impl std::future::Future<Output = Result<Result<Served, String>, Self::Error>> + Send;
}

/// How a member reaches the others' peer listeners.
#[derive(Clone)]
pub(crate) struct Dialing {
    pub(crate) from: NodeId,
    pub(crate) routes: BTreeMap<NodeId, String>,
    pub(crate) tls: Option<PeerTls>,
}

impl Dial for Dialing {
    type Link = LeaderLink;

    /// A link at the peer address the membership gives `target` (or its
    /// route).
    fn dial(&self, raft: &Raft, target: NodeId) -> Option<LeaderLink> {
        let metrics = raft.metrics().borrow().clone();
        let member = metrics
            .membership_config
            .membership()
            .get_node(&target)?
            .clone();
        let addr = self.routes.get(&target).unwrap_or(&member.peer);
        Some(LeaderLink::new(
            self.from,
            target,
            addr,
            &member.peer,
            self.tls.as_ref(),
        ))
    }
}

impl CallLeader for LeaderLink {
    type Error = crate::network::Failed;

    fn target(&self) -> NodeId {
        LeaderLink::target(self)
    }

    fn serve(
        &mut self,
        change: Change,
        heard: Vec<u64>,
        confirm: bool,
        applied: Option<u64>,
        limit: Duration,
    ) -> impl std::future::Future<Output = Result<Result<Served, String>, Self::Error>> + Send {
        LeaderLink::serve(self, change, heard, confirm, applied, limit)
    }
}

impl ToLeader {
    /// Starts the link's task, which reaches the leader through `dialing`.
    pub(crate) fn start<D: Dial>(
        raft: Raft,
        applier: Applier,
        state: StateMachineStore,
        dialing: D,
        stop: watch::Receiver<bool>,
    ) -> ToLeader {
        let (up, rx) = mpsc::unbounded_channel();
        tokio::spawn(link(raft, applier, state, dialing, rx, stop));
        ToLeader { up }
    }

    /// Sends a client's change on to the leader; `false` if the link is
    /// gone.
    pub(crate) fn propose(&self, proposal: &Proposal) -> bool {
        self.up.send(Up::Propose(proposal.clone())).is_ok()
    }

    /// A barrier confirmed with the leader, which hears from `heard` on the
    /// way.
    pub(crate) fn barrier(&self, heard: Option<SessionId>) -> Barrier {
        let (done, rx) = oneshot::channel();
        let sent = self.up.send(Up::Barrier { heard, done }).is_ok();
        Box::pin(async move {
            if !sent {
                return Err(NotLeading);
            }
            rx.await.unwrap_or(Err(NotLeading))
        })
    }

    /// The member now follows `leader` (`None`: it leads, or none is
    /// known): what was on its way to another is dropped.
    pub(crate) fn set_leader(&self, leader: Option<NodeId>) {
        let _ = self.up.send(Up::Leader(leader));
    }
}

/// What waits for the next call to the leader.
#[derive(Default)]
struct Pending {
    proposals: Vec<Proposal>,
    /// Each with the session it hears from, if any.
    barriers: Vec<Waiting>,
}

/// A barrier waiting for its call, and the session it hears from.
type Waiting = (Option<SessionId>, oneshot::Sender<Result<(), NotLeading>>);

impl Pending {
    fn is_empty(&self) -> bool {
        self.proposals.is_empty() && self.barriers.is_empty()
    }

    /// Fails what was waiting, and forgets the sessions whose changes are
    /// lost: their connections are closed, so that their clients resume
    /// and send them again.
    fn fail(&mut self, applier: &Applier) {
        for (_, b) in self.barriers.drain(..) {
            let _ = b.send(Err(NotLeading));
        }
        let lost: Vec<SessionId> = self
            .proposals
            .drain(..)
            .filter_map(|p| p.origin.map(|o| o.session))
            .collect();
        if !lost.is_empty() {
            applier.lost(&lost);
        }
    }
}

/// The link's task: one call to the leader at a time, carrying everything
/// that arrived while the one before was under way.
async fn link<D: Dial>(
    raft: Raft,
    applier: Applier,
    state: StateMachineStore,
    dialing: D,
    mut rx: mpsc::UnboundedReceiver<Up>,
    mut stop: watch::Receiver<bool>,
) {
    let mut leader: Option<NodeId> = None;
    let mut peer: Option<D::Link> = None;
    let mut pending = Pending::default();
    loop {
        // Take in everything there is, waiting only if there is nothing to
        // send.
        loop {
            let up = if pending.is_empty() || leader.is_none() {
                tokio::select! {
                    up = rx.recv() => up,
                    _ = stop.changed() => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(up) => Some(up),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                }
            };
            match up {
                None => return,
                Some(Up::Propose(p)) => pending.proposals.push(p),
                Some(Up::Barrier { heard, done }) => pending.barriers.push((heard, done)),
                Some(Up::Leader(l)) => {
                    if l != leader {
                        pending.fail(&applier);
                        leader = l;
                        peer = None;
                    }
                }
            }
            if leader.is_none() && !pending.is_empty() {
                pending.fail(&applier);
            }
        }
        let Some(target) = leader else { continue };
        if peer.as_ref().is_none_or(|p| p.target() != target) {
            match dialing.dial(&raft, target) {
                Some(p) => peer = Some(p),
                None => {
                    pending.fail(&applier);
                    continue;
                }
            }
        }
        let link = peer.as_mut().expect("set above");
        let take = pending.proposals.len().min(CALL_PROPOSALS);
        let proposals: Vec<Proposal> = pending.proposals.drain(..take).collect();
        let mut barriers = if pending.proposals.is_empty() {
            std::mem::take(&mut pending.barriers)
        } else {
            Vec::new() // after the rest of the proposals
        };
        // The sessions heard from go with their barriers: the leader's
        // answer about each decides its own barrier.
        let mut heard: Vec<u64> = barriers
            .iter()
            .filter_map(|(s, _)| s.map(|s| s.0))
            .collect();
        heard.sort_unstable();
        heard.dedup();
        let confirm = !barriers.is_empty();
        let sessions: Vec<SessionId> = proposals
            .iter()
            .filter_map(|p| p.origin.map(|o| o.session))
            .collect();
        // The sessions whose changes these are were opened by entries this
        // member has applied (its state has, which openraft's metrics may
        // say only later): the leader judges them once it has too.
        let applied = state.applied_index();
        let answer = link
            .serve(Change(proposals), heard, confirm, applied, CALL_LIMIT)
            .await;
        let mut unheard_barriers: Vec<Waiting> = Vec::new();
        let read_index = match answer {
            Ok(Ok(Served {
                read_index,
                refused,
                unheard,
            })) => {
                if !refused.is_empty() {
                    let refused: Vec<SessionId> = refused.into_iter().map(SessionId).collect();
                    applier.lost(&refused);
                }
                if !unheard.is_empty() {
                    // Expiring or ended at the leader, or opened by an entry
                    // it has not applied yet: decided below, once this
                    // member has applied the leader's read.
                    let (gone, kept) = std::mem::take(&mut barriers)
                        .into_iter()
                        .partition(|(s, _)| s.is_some_and(|s| unheard.contains(&s.0)));
                    unheard_barriers = gone;
                    barriers = kept;
                }
                read_index
            }
            Ok(Err(refused)) => {
                debug!(leader = target, "the leader refused: {refused}");
                fail_call(&applier, &sessions, barriers);
                continue;
            }
            Err(e) => {
                // The link logs the first failure in a row and the recovery.
                debug!(
                    leader = target,
                    "cannot reach the leader for the clients served here: {e}"
                );
                peer = None;
                fail_call(&applier, &sessions, barriers);
                continue;
            }
        };
        if confirm {
            // The reads may go once this member has applied the leader's
            // read (nothing: at once).
            let index = read_index.unwrap_or(0);
            let (raft, applier) = (raft.clone(), applier.clone());
            tokio::spawn(async move {
                let caught_up = raft
                    .wait(Some(CALL_LIMIT))
                    .applied_index_at_least(Some(index), "a follower's read barrier")
                    .map(|r| r.is_ok())
                    .await;
                let result = if caught_up { Ok(()) } else { Err(NotLeading) };
                for (_, b) in barriers {
                    let _ = b.send(result.clone());
                }
                // A session the leader did not count as heard: a ping or a
                // resume answered here would tell its client it is alive,
                // its deadline moved past the leader's. If this member's
                // state, now holding everything committed before the
                // leader answered (the session's opening among it: no
                // client holds a session before its opening is
                // committed), no longer holds the session, it ended: the
                // request goes on and is answered that the session expired,
                // as a ZooKeeper client whose connect string names only
                // this member must be told. Else (the leader is expiring
                // it, or has not applied its opening yet) it is refused:
                // the client tries again, or goes to the leader.
                for (session, b) in unheard_barriers {
                    let ended = caught_up && session.is_some_and(|s| !applier.has_session(s));
                    let _ = b.send(if ended { Ok(()) } else { Err(NotLeading) });
                }
            });
        } else {
            fail_call(&applier, &[], unheard_barriers);
        }
    }
}

/// A call failed: its barriers fail, and the sessions whose changes it
/// carried are closed (they send them again once resumed).
fn fail_call(applier: &Applier, sessions: &[SessionId], barriers: Vec<Waiting>) {
    for (_, b) in barriers {
        let _ = b.send(Err(NotLeading));
    }
    if !sessions.is_empty() {
        applier.lost(sessions);
    }
}
