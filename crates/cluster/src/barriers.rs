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
    waiting: Mutex<Vec<oneshot::Sender<Result<(), NotLeading>>>>,
    wake: Notify,
}

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
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        self.wake.notify_one();
        Box::pin(async move { rx.await.unwrap_or(Err(NotLeading)) })
    }
}

/// How many times a round of read barriers asks a quorum to confirm this
/// member still leads when the answers did not come in time, as long as
/// no other member is known to lead.
const PROOF_TRIES: usize = 3;

/// Proves this member still leads (a quorum answers its heartbeat) and
/// waits until everything committed is applied. A quorum that did not
/// answer within a heartbeat (a busy machine) is asked again, a few times,
/// while this member still leads as far as it knows; told of a higher term
/// or another leader, it gives up at once.
async fn prove(raft: &Raft) -> Result<(), NotLeading> {
    for _ in 0..PROOF_TRIES {
        match raft.ensure_linearizable().await {
            Ok(_) => return Ok(()),
            Err(openraft::error::RaftError::APIError(
                openraft::error::CheckIsLeaderError::QuorumNotEnough(_),
            )) if raft.metrics().borrow().state == ServerState::Leader => continue,
            Err(_) => return Err(NotLeading),
        }
    }
    Err(NotLeading)
}
