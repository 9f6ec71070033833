//! The leader's read barriers, batched: one quorum confirmation for every
//! read that was waiting when it began.

use std::sync::{Arc, Mutex};

use baton_server::replicate::{Barrier, NotLeading};
use openraft::ServerState;
use tokio::sync::{oneshot, watch, Notify};

use crate::types::Raft;

/// Read barriers, batched: each round confirms leadership with a quorum once
/// (and waits until everything committed is applied) for every read that
/// was waiting when the round began.
pub(crate) struct Barriers {
    waiting: Mutex<Vec<oneshot::Sender<Proof>>>,
    wake: Notify,
}

/// What a round proved: this member led when the round began, and the
/// log index of its read (everything committed then), which it has
/// applied since.
type Proof = Result<Option<u64>, NotLeading>;

impl Barriers {
    pub(crate) fn start(raft: Raft, mut stop: watch::Receiver<bool>) -> Arc<Barriers> {
        let barriers = Arc::new(Barriers {
            waiting: Mutex::new(Vec::new()),
            wake: Notify::new(),
        });
        let this = barriers.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = this.wake.notified() => {}
                    _ = stop.changed() => return,
                }
                loop {
                    let round = std::mem::take(
                        &mut *this.waiting.lock().unwrap_or_else(|e| e.into_inner()),
                    );
                    if round.is_empty() {
                        break;
                    }
                    let result = prove(&raft).await;
                    for waiter in round {
                        let _ = waiter.send(result.clone());
                    }
                }
            }
        });
        barriers
    }

    pub(crate) fn wait(&self) -> Barrier {
        let proof = self.read_index();
        Box::pin(async move { proof.await.map(|_| ()) })
    }

    /// A barrier whose answer is the log index of the read it proved: a
    /// follower that has applied as far sees every change committed before
    /// the barrier began.
    ///
    /// Not the leader's applied index as its metrics say it once the
    /// barrier is through: openraft lets a read go as soon as its own
    /// record of what was applied has reached the read index, and its
    /// metrics may lag that record by a while (the simulation found a
    /// follower that answered a read from a state without a change
    /// acknowledged just before the read began: the leader's metrics were
    /// two entries behind for 30 ms).
    pub(crate) fn read_index(&self) -> impl std::future::Future<Output = Proof> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        self.wake.notify_one();
        async move { rx.await.unwrap_or(Err(NotLeading)) }
    }
}

/// How many times a round of read barriers asks a quorum to confirm this
/// member still leads when the answers did not come in time, as long as
/// no other member is known to lead.
const PROOF_TRIES: usize = 3;

/// Proves this member still leads (a quorum answers its heartbeat) and
/// waits until everything committed is applied; gives the read's log
/// index. A quorum that did not answer within a heartbeat (a busy
/// machine) is asked again, a few times, while this member still leads as
/// far as it knows; told of a higher term or another leader, it gives up
/// at once.
async fn prove(raft: &Raft) -> Proof {
    for _ in 0..PROOF_TRIES {
        match raft.ensure_linearizable().await {
            Ok(read) => return Ok(read.map(|l| l.index)),
            Err(openraft::error::RaftError::APIError(
                openraft::error::CheckIsLeaderError::QuorumNotEnough(_),
            )) if raft.metrics().borrow().state == ServerState::Leader => continue,
            Err(_) => return Err(NotLeading),
        }
    }
    Err(NotLeading)
}
