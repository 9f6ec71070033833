//! The simulated network between members: each call of openraft's network
//! reaches the other member's openraft after a delay the seed chooses,
//! unless the link is cut that way, the message is lost, or the member is
//! down; its answer comes back the same way.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_server::sim::Rng;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tokio::time::{sleep, timeout, Instant};

use crate::types::{Member, NodeId, Raft, TypeConfig};

/// The links between members, and the members up now.
pub(super) struct Links {
    /// Each member up, with its life (bumped by every restart).
    pub(super) up: BTreeMap<NodeId, (u64, Raft)>,
    /// Links cut one way, `(from, to)`, until a simulated time (µs).
    pub(super) cut: BTreeMap<(NodeId, NodeId), u64>,
    /// Members every message to or from is slowed for, until a time (µs):
    /// by more than a heartbeat.
    pub(super) slow: BTreeMap<NodeId, u64>,
    pub(super) rng: Rng,
    pub(super) start: Instant,
    /// Messages lost, one in this many.
    pub(super) loss: u64,
}

impl Links {
    fn now_us(&self) -> u64 {
        Instant::now().duration_since(self.start).as_micros() as u64
    }

    fn cut(&self, from: NodeId, to: NodeId) -> bool {
        self.cut
            .get(&(from, to))
            .is_some_and(|until| *until > self.now_us())
    }

    /// How long a message from `from` to `to` takes.
    fn delay(&mut self, from: NodeId, to: NodeId) -> Duration {
        let now = self.now_us();
        let slow = [from, to]
            .iter()
            .any(|m| self.slow.get(m).is_some_and(|until| *until > now));
        let us = if slow {
            self.rng.between(60_000, 200_000)
        } else if self.rng.chance(3) {
            self.rng.between(5_000, 60_000)
        } else {
            self.rng.between(50, 1_500)
        };
        Duration::from_micros(us)
    }

    fn lost(&mut self) -> bool {
        self.loss > 0 && self.rng.below(self.loss) == 0
    }
}

pub(super) type Shared = Arc<Mutex<Links>>;

fn lock(links: &Shared) -> MutexGuard<'_, Links> {
    links.lock().unwrap_or_else(|e| e.into_inner())
}

/// One member's side of the network.
pub(super) struct SimNetwork {
    pub(super) from: NodeId,
    pub(super) links: Shared,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, _node: &Member) -> Peer {
        Peer {
            from: self.from,
            to: target,
            links: self.links.clone(),
        }
    }
}

pub(super) struct Peer {
    from: NodeId,
    to: NodeId,
    links: Shared,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(&'static str);

impl Peer {
    /// Carries a call to the other member and its answer back, within
    /// `ttl`.
    async fn carry<T, F, Fut>(&self, ttl: Duration, call: F) -> Result<T, Failed>
    where
        F: FnOnce(Raft) -> Fut,
        Fut: Future<Output = T>,
    {
        let trip = async {
            let there = lock(&self.links).delay(self.from, self.to);
            sleep(there).await;
            let (target, lost) = {
                let mut links = lock(&self.links);
                let lost = links.cut(self.from, self.to) || links.lost();
                (links.up.get(&self.to).cloned(), lost)
            };
            let Some((life, raft)) = target else {
                return Err(Failed("the member is down"));
            };
            if lost {
                std::future::pending::<()>().await;
            }
            let answer = call(raft).await;
            let back = {
                let mut links = lock(&self.links);
                if links.up.get(&self.to).map(|(l, _)| *l) != Some(life) {
                    return Err(Failed("the member went down"));
                }
                let lost = links.cut(self.to, self.from) || links.lost();
                (links.delay(self.to, self.from), lost)
            };
            sleep(back.0).await;
            if back.1 {
                std::future::pending::<()>().await;
            }
            Ok(answer)
        };
        match timeout(ttl, trip).await {
            Ok(r) => r,
            Err(_) => Err(Failed("no answer in time")),
        }
    }
}

fn unreachable<E: std::error::Error>(e: Failed) -> RPCError<NodeId, Member, E> {
    RPCError::Unreachable(Unreachable::new(&e))
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let answer = self
            .carry(option.hard_ttl(), |raft| async move {
                raft.append_entries(rpc).await
            })
            .await
            .map_err(unreachable)?;
        answer.map_err(|e| RemoteError::new(self.to, e).into())
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let answer = self
            .carry(option.hard_ttl(), |raft| async move {
                raft.install_snapshot(rpc).await
            })
            .await
            .map_err(unreachable)?;
        answer.map_err(|e| RemoteError::new(self.to, e).into())
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let answer = self
            .carry(
                option.hard_ttl(),
                |raft| async move { raft.vote(rpc).await },
            )
            .await
            .map_err(unreachable)?;
        answer.map_err(|e| RemoteError::new(self.to, e).into())
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(50)))
    }
}
