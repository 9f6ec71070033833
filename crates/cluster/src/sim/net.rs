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

use crate::for_followers::LeaderSide;
use crate::network::Served;
use crate::serving::{CallLeader, Dial};
use crate::types::{Change, Member, NodeId, Raft, TypeConfig};

/// A member up now.
#[derive(Clone)]
pub(super) struct UpMember {
    /// Its life (bumped by every restart).
    pub(super) life: u64,
    pub(super) raft: Raft,
    /// What it does, while it leads, for the followers that serve clients.
    pub(super) side: LeaderSide,
}

/// The links between members, and the members up now.
pub(super) struct Links {
    /// Each member up.
    pub(super) up: BTreeMap<NodeId, UpMember>,
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
pub(crate) struct Failed(&'static str);

/// Carries a call from member `from` to member `to` and its answer back,
/// within `ttl`.
async fn carry<T, F, Fut>(
    links: &Shared,
    from: NodeId,
    to: NodeId,
    ttl: Duration,
    call: F,
) -> Result<T, Failed>
where
    F: FnOnce(UpMember) -> Fut,
    Fut: Future<Output = T>,
{
    let trip = async {
        let there = lock(links).delay(from, to);
        sleep(there).await;
        let (target, lost) = {
            let mut links = lock(links);
            let lost = links.cut(from, to) || links.lost();
            (links.up.get(&to).cloned(), lost)
        };
        let Some(target) = target else {
            return Err(Failed("the member is down"));
        };
        let life = target.life;
        if lost {
            std::future::pending::<()>().await;
        }
        let answer = call(target).await;
        let back = {
            let mut links = lock(links);
            if links.up.get(&to).map(|m| m.life) != Some(life) {
                return Err(Failed("the member went down"));
            }
            let lost = links.cut(to, from) || links.lost();
            (links.delay(to, from), lost)
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

impl Peer {
    /// Carries a call to the other member's openraft and its answer back,
    /// within `ttl`.
    async fn carry<T, F, Fut>(&self, ttl: Duration, call: F) -> Result<T, Failed>
    where
        F: FnOnce(Raft) -> Fut,
        Fut: Future<Output = T>,
    {
        carry(&self.links, self.from, self.to, ttl, |m| call(m.raft)).await
    }
}

/// A follower's way to its leader's side over the simulated network.
pub(super) struct SimDial {
    pub(super) from: NodeId,
    pub(super) links: Shared,
}

impl Dial for SimDial {
    type Link = SimLeaderLink;

    fn dial(&self, raft: &Raft, target: NodeId) -> Option<SimLeaderLink> {
        let named = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&target)
            .is_some();
        named.then(|| SimLeaderLink {
            from: self.from,
            to: target,
            links: self.links.clone(),
        })
    }
}

pub(super) struct SimLeaderLink {
    from: NodeId,
    to: NodeId,
    links: Shared,
}

impl CallLeader for SimLeaderLink {
    type Error = Failed;

    fn target(&self) -> NodeId {
        self.to
    }

    async fn serve(
        &mut self,
        change: Change,
        heard: Vec<u64>,
        confirm: bool,
        applied: Option<u64>,
        limit: Duration,
    ) -> Result<Result<Served, String>, Failed> {
        carry(&self.links, self.from, self.to, limit, |m| async move {
            // The leader answers on a task of its own, as on its peer
            // listener: a follower that gives up does not cut it short.
            tokio::spawn(async move { m.side.serve(change, heard, confirm, applied).await })
                .await
                .unwrap_or_else(|e| Err(format!("the leader's answer failed: {e}")))
        })
        .await
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
