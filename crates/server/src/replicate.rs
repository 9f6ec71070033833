//! How changes reach the state machine: the one small interface the core
//! sees, whether a single server's write-ahead log is behind it or a
//! cluster's replicated log.
//!
//! A single server applies a proposal at once, under the core lock, and then
//! logs it; replies wait for the log to be durable (the durable mark). A
//! cluster member that leads proposes it to the replicated log instead; it
//! is applied, on every member and in the same order, once a majority has it
//! durably, and only then answered. The core never imports the consensus
//! engine: it sees [`Replicator`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use baton_proto::SessionId;

use crate::persist::Wal;
use crate::state::{Proposal, StateMachine};

/// Which member serves clients, as far as this server knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// This server serves clients: a single server, or the proven leader of
    /// a cluster.
    Leader,
    /// Another member leads, at this client address if it is known. If
    /// `serving`, this member serves clients itself: reads and watches from
    /// its own state, changes forwarded to the leader
    /// ([`Replicator::forward`], [`Replicator::follower_barrier`]); else
    /// clients are sent to the leader.
    Follower {
        leader: Option<String>,
        serving: bool,
    },
}

/// What became of a proposal.
#[derive(Debug, PartialEq, Eq)]
pub enum Proposed {
    /// The proposer applies it now, then hands it to [`Replicator::logged`]:
    /// a single server.
    ApplyNow,
    /// It is on its way to being committed; it comes back through
    /// [`Applier::apply`](crate::Applier::apply) on every member (a
    /// cluster).
    Later,
    /// This server cannot propose: it does not lead.
    NotLeader,
}

/// A wait for everything committed so far to be applied here, by a server
/// that has proven it still leads. Single servers are always ready.
pub type Barrier = Pin<Box<dyn Future<Output = Result<(), NotLeading>> + Send>>;

/// This server does not lead (any more); clients go to the leader.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this server does not lead the cluster")]
pub struct NotLeading;

/// How changes reach the state machine.
pub trait Replicator: Send + Sync + 'static {
    /// Proposes a change.
    fn propose(&self, proposal: &Proposal) -> Proposed;

    /// A change the proposer applied at once ([`Proposed::ApplyNow`]) and
    /// that produced `revision`; `sm` is the state after it.
    fn logged(&self, _revision: u64, _proposal: &Proposal, _sm: &StateMachine) {}

    /// Whether every change is applied as soon as it is proposed
    /// ([`Proposed::ApplyNow`]): then reads need no
    /// [`read_barrier`](Self::read_barrier) and no reply waits for another.
    fn applies_at_once(&self) -> bool {
        true
    }

    /// Completes once everything committed before the call is applied here
    /// and this server has proven, after the call, that it still leads.
    fn read_barrier(&self) -> Barrier {
        Box::pin(async { Ok(()) })
    }

    /// A follower's proposal: sent on to the leader, which proposes it; it
    /// comes back through [`Applier::apply`](crate::Applier::apply) like
    /// any other. [`Proposed::NotLeader`] if it cannot be sent.
    fn forward(&self, _proposal: &Proposal) -> Proposed {
        Proposed::NotLeader
    }

    /// A follower's read barrier: completes once this member has applied
    /// everything the leader had applied when, after the call, it proved it
    /// still leads; on the way the leader hears from `heard` (a session
    /// this member serves), as if it had sent the leader a request.
    fn follower_barrier(&self, _heard: Option<SessionId>) -> Barrier {
        Box::pin(async { Err(NotLeading) })
    }

    /// Stops whatever the log runs (after writing what is queued).
    fn stop(&self) {}

    /// What a replicated log says of the cluster (its members, their roles
    /// and progress), for the status probe and the metrics; `None` for a
    /// single server.
    fn status(&self) -> Option<ClusterStatus> {
        None
    }
}

/// A cluster as one member sees it, for the status probe (under its
/// `cluster` key) and the metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClusterStatus {
    /// This member's id.
    pub id: u64,
    /// The member that leads, as this member knows it.
    pub leader: Option<u64>,
    /// This member's Raft term.
    pub term: u64,
    /// The highest log index a majority holds; known only to the leader.
    pub commit_index: Option<u64>,
    /// The highest log index this member has applied.
    pub applied_index: Option<u64>,
    /// The log index of the membership this member goes by.
    pub membership_index: Option<u64>,
    /// Every member of that membership, learners included.
    pub members: Vec<MemberProgress>,
}

/// One member of a cluster, as a member sees it (the leader asks the
/// others; another member knows only itself).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemberProgress {
    pub id: u64,
    /// The address clients reach it at.
    pub client_addr: String,
    /// The address other members reach it at.
    pub peer_addr: String,
    /// Whether it votes (else it is a learner, catching up).
    pub voter: bool,
    /// leader, follower, candidate, learner, stopped, or unreachable.
    pub role: String,
    pub applied_index: Option<u64>,
    pub last_log_index: Option<u64>,
    /// Log entries it is behind the leader's log; reported by the leader.
    pub lag: Option<u64>,
}

/// A server that keeps nothing: applies at once, logs nothing.
pub(crate) struct InMemory;

impl Replicator for InMemory {
    fn propose(&self, _proposal: &Proposal) -> Proposed {
        Proposed::ApplyNow
    }
}

/// A cluster member before its replicated log is started: it proposes
/// nothing.
pub(crate) struct NoLogYet;

impl Replicator for NoLogYet {
    fn propose(&self, _proposal: &Proposal) -> Proposed {
        Proposed::NotLeader
    }

    fn applies_at_once(&self) -> bool {
        false
    }
}

/// A single server with a data directory: applies at once, and appends
/// what it applied to its write-ahead log (taking snapshots as it grows).
pub(crate) struct Local {
    wal: std::sync::Mutex<Option<Wal>>,
    snapshot_every_bytes: u64,
    stats: Arc<crate::stats::Stats>,
}

impl Local {
    pub(crate) fn new(
        wal: Wal,
        snapshot_every_bytes: u64,
        stats: Arc<crate::stats::Stats>,
    ) -> Self {
        Local {
            wal: std::sync::Mutex::new(Some(wal)),
            snapshot_every_bytes,
            stats,
        }
    }
}

impl Replicator for Local {
    fn propose(&self, _proposal: &Proposal) -> Proposed {
        Proposed::ApplyNow
    }

    fn logged(&self, revision: u64, proposal: &Proposal, sm: &StateMachine) {
        let wal = self.wal.lock().unwrap_or_else(|e| e.into_inner());
        let Some(wal) = wal.as_ref() else { return };
        wal.append(revision, proposal);
        // Checked before the state is copied: while a snapshot runs (or
        // after the log failed) no copy is made.
        if wal.snapshot_wanted(self.snapshot_every_bytes) {
            let started = std::time::Instant::now();
            wal.snapshot(sm.clone());
            let pause = started.elapsed().as_micros() as u64;
            self.stats
                .snapshot_pause_max_us
                .fetch_max(pause, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn stop(&self) {
        if let Some(mut wal) = self.wal.lock().unwrap_or_else(|e| e.into_inner()).take() {
            wal.stop();
        }
    }
}
