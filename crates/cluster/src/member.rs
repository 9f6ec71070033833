//! One cluster member: a Baton server whose changes go through the
//! replicated log.
//!
//! The member's server serves clients only while the member leads and has
//! proven it (`Leadership`): on becoming leader it first confirms it with a
//! quorum and applies everything committed, then gives every session a full
//! fresh timeout. A member that stops leading sends its clients to the new
//! leader, unless followers serve clients (`serving`): then a follower of a
//! known leader serves them itself. Proposals go to openraft in the order they are made (one proposer
//! task); reads wait for a batched read barrier (one quorum confirmation for
//! every read that arrived before it began).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_server::datadir::DataDir;
use baton_server::replicate::{Barrier, ClusterStatus, NotLeading, Proposed, Replicator};
use baton_server::{Applier, Config, Server, ServerError};
use baton_state::format::FsyncPolicy;
use baton_state::Proposal;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use openraft::ServerState;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::admin::Status;
use crate::barriers::Barriers;
use crate::joining::{Joining, JoiningError};
use crate::log_store::{LogStore, StoreError};
use crate::network::{self, Network};
use crate::state_machine::{SnapshotError, StateMachineStore};
use crate::types::{Change, Member, NodeId, Raft};

/// How a member is set up.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// This member's id.
    pub id: NodeId,
    /// The members a new cluster starts with (every member of a new cluster
    /// is given the same list). Ignored once the member's log holds a
    /// membership; `None` for a member that joins an existing cluster.
    pub initial: Option<BTreeMap<NodeId, Member>>,
    /// Where the member keeps its replicated log and snapshots.
    pub data_dir: PathBuf,
    /// Whether the replicated log is synced before a write counts as
    /// stored on this member: only [`FsyncPolicy::Always`] is accepted. A
    /// member that counted unsynced entries as stored would let one power
    /// loss and the leader's crash lose a write a majority acknowledged.
    pub fsync: FsyncPolicy,
    /// The shortest time a follower waits for its leader before it stands
    /// for election (the longest is twice this).
    pub election_timeout: Duration,
    /// How often the leader heartbeats its followers.
    pub heartbeat: Duration,
    /// Entries kept in the log behind a snapshot, for followers just behind.
    pub snapshot_every: u64,
    /// Reach these members at these peer addresses instead of the ones
    /// they advertise (a tunnel, a proxy).
    pub routes: BTreeMap<NodeId, String>,
    /// The member's server's settings (its data directory is unused: the
    /// state comes from the replicated log).
    pub server: Config,
    /// Mutual TLS with the other members; `None`: plain TCP.
    pub peer_tls: Option<crate::network::PeerTls>,
    /// Whether a follower serves clients itself (reads and watches from
    /// its own state, changes forwarded to the leader; the default), or
    /// sends them to the leader.
    pub followers_serve: bool,
}

impl MemberConfig {
    /// Defaults: 150 ms election timeout, 50 ms heartbeats, a snapshot every
    /// 10,000 entries, followers serving clients.
    pub fn new(id: NodeId, data_dir: PathBuf) -> Self {
        MemberConfig {
            id,
            initial: None,
            data_dir,
            fsync: FsyncPolicy::Always,
            election_timeout: Duration::from_millis(150),
            heartbeat: Duration::from_millis(50),
            snapshot_every: 10_000,
            routes: BTreeMap::new(),
            server: Config::default(),
            peer_tls: None,
            followers_serve: true,
        }
    }
}

/// Why a member could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemberError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("{0}")]
    Storage(String),
    /// The replicated log could not be read.
    #[error(transparent)]
    Log(#[from] StoreError),
    /// The member's snapshot could not be read.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The joining marker could not be kept.
    #[error(transparent)]
    Joining(#[from] JoiningError),
    #[error("the replicated log could not start: {0}")]
    Raft(String),
    #[error("{0}")]
    Config(String),
}

/// Why a member refuses `--fsync never`.
pub const NO_UNSYNCED_MEMBERS: &str = "a cluster member syncs its log before it tells the leader an entry is stored (fsync always): with fsync never, one member's power loss and the leader's crash could lose writes a majority acknowledged";

/// A running member.
pub struct ClusterMember {
    server: Server,
    raft: Raft,
    stop: watch::Sender<bool>,
    /// Why the member is no longer a member, once it learns it.
    removed: watch::Receiver<Option<String>>,
    /// Why it must not take part as it is, once a leader finds its log
    /// went back.
    gone_back: watch::Receiver<Option<String>>,
    _data_dir: DataDir,
}

impl ClusterMember {
    /// Starts a member serving clients on `clients` (while it leads) and
    /// other members on `peers`.
    ///
    /// # Errors
    /// An invalid configuration, a data directory that cannot be used (or
    /// is in use), or a damaged replicated log.
    pub async fn start(
        config: MemberConfig,
        clients: TcpListener,
        peers: TcpListener,
    ) -> Result<ClusterMember, MemberError> {
        if config.fsync != FsyncPolicy::Always {
            return Err(MemberError::Config(NO_UNSYNCED_MEMBERS.into()));
        }
        if config.server.max_data > MAX_MEMBER_DATA {
            return Err(MemberError::Config(format!(
                "a cluster member accepts node data of at most {} MiB (--max-data {}): each change travels between members in one frame",
                MAX_MEMBER_DATA >> 20,
                config.server.max_data
            )));
        }
        let data_dir =
            DataDir::open(&config.data_dir).map_err(|e| MemberError::Storage(e.to_string()))?;
        let raft_dir = config.data_dir.join("raft");
        // No membership stored and none given: a member being added.
        let fresh =
            config.initial.is_none() && crate::log_store::stored_members(&raft_dir)?.is_none();
        let joining = Joining::open(&raft_dir, config.id, fresh)?;
        let log = LogStore::open(&raft_dir, config.fsync)?;
        let mut server_config = config.server.clone();
        server_config.data_dir = None;
        let (server, applier) = Server::member(clients, server_config)?;
        let sm = StateMachineStore::open(&raft_dir, applier.clone(), joining.clone())?;
        let election = config.election_timeout.as_millis() as u64;
        let raft_config = openraft::Config {
            cluster_name: "baton".into(),
            election_timeout_min: election,
            election_timeout_max: election * 2,
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            install_snapshot_timeout: 10_000,
            max_payload_entries: 64,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.snapshot_every,
            // Off until the cluster has added a member being added (see
            // `joining`); then the campaign turns it on.
            enable_elect: joining.is_none(),
            ..Default::default()
        };
        let raft_config = Arc::new(
            raft_config
                .validate()
                .map_err(|e| MemberError::Raft(e.to_string()))?,
        );
        let network = Network::new(config.id, config.routes.clone(), config.peer_tls.clone());
        let held = network.held();
        let raft = Raft::new(config.id, raft_config, network, log, sm.clone())
            .await
            .map_err(|e| MemberError::Raft(e.to_string()))?;
        let (stop, stopped) = watch::channel(false);
        let (went_back, gone_back) = watch::channel(None);
        let status = Status::new(raft.clone(), config.id, config.peer_tls.clone());
        let dialing = config.followers_serve.then(|| crate::serving::Dialing {
            from: config.id,
            routes: config.routes.clone(),
            tls: config.peer_tls.clone(),
        });
        let leader_side = serve_through(
            raft.clone(),
            applier,
            sm,
            status.clone(),
            config.id,
            dialing,
            stopped.clone(),
        );
        let answering = network::Answering {
            raft: raft.clone(),
            tls: config.peer_tls.clone(),
            routes: config.routes.clone(),
            joining,
            went_back: Arc::new(went_back),
            held,
            leader_side: Some(leader_side),
        };
        tokio::spawn(network::serve(peers, answering.clone(), stopped.clone()));
        let (removal, removed) = watch::channel(None);
        tokio::spawn(crate::campaign::run(
            answering,
            config.id,
            config.election_timeout,
            removal,
            stopped.clone(),
        ));
        tokio::spawn(status.refresh(config.routes.clone(), stopped.clone()));
        if let Some(initial) = config.initial {
            if !raft
                .is_initialized()
                .await
                .map_err(|e| MemberError::Raft(e.to_string()))?
            {
                info!(members = ?initial.keys().collect::<Vec<_>>(), "starting a new cluster");
                if let Err(e) = raft.initialize(initial).await {
                    // Another member of the new cluster got there first.
                    info!("cluster already started: {e}");
                }
            }
        }
        Ok(ClusterMember {
            server,
            raft,
            stop,
            removed,
            gone_back,
            _data_dir: data_dir,
        })
    }

    /// The address clients reach this member at.
    /// The address of the member's ZooKeeper listener, if it has one.
    pub fn zk_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.zk_addr()
    }

    pub fn client_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.server.local_addr()
    }

    /// The member's replicated log, for status and membership changes.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// A handle to the member's server, for its counters.
    pub fn handle(&self) -> baton_server::ServerHandle {
        self.server.handle()
    }

    /// Serves until `shutdown` completes, then stops the server and the
    /// replicated log. A replicated log that stops on its own (its storage
    /// failed) stops the member too, and so does learning that it was
    /// removed from the cluster (it logs why, and returns `Ok`: there is
    /// nothing to start again), or that its log went back (see
    /// [`network`]).
    ///
    /// # Errors
    /// As [`Server::run`], [`ServerError::ReplicationStopped`], or
    /// [`ServerError::Unfit`] for a log that went back.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
        let ClusterMember {
            server,
            raft,
            stop,
            removed,
            gone_back,
            _data_dir,
        } = self;
        let was_removed = set(removed);
        let unfit = Mutex::new(None);
        let went_back = async {
            let why = set(gone_back).await;
            *unfit.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        };
        let failed = Mutex::new(None);
        let stopped_alone = async {
            let mut metrics = raft.metrics();
            let why = loop {
                if let Err(e) = &metrics.borrow_and_update().running_state {
                    break e.to_string();
                }
                if metrics.changed().await.is_err() {
                    break "its core ended".to_string();
                }
            };
            tracing::error!("the replicated log stopped: {why}; stopping the member");
            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        };
        let result = server
            .run(async {
                tokio::select! {
                    () = shutdown => {}
                    () = stopped_alone => {}
                    _ = was_removed => {}
                    () = went_back => {}
                }
            })
            .await;
        stop.send_replace(true);
        if let Err(e) = raft.shutdown().await {
            warn!("stopping the replicated log: {e}");
        }
        result?;
        if let Some(why) = unfit.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(ServerError::Unfit(why));
        }
        match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(ServerError::ReplicationStopped(why)),
            None => Ok(()),
        }
    }
}

/// Makes the member's server propose through `raft` (one proposer, batched
/// read barriers) and serve clients while it leads and has proven it, and,
/// given how to reach the leader (`dialing`), while it follows a known
/// leader (see `serving`). Returns what the member does, while it leads,
/// for the followers that serve clients.
pub(crate) fn serve_through<D: crate::serving::Dial>(
    raft: Raft,
    applier: Applier,
    state: StateMachineStore,
    status: Status,
    id: NodeId,
    dialing: Option<D>,
    stopped: watch::Receiver<bool>,
) -> crate::for_followers::LeaderSide {
    let barriers = Barriers::start(raft.clone(), stopped.clone());
    let proposals = start_proposer(raft.clone(), stopped.clone());
    let to_leader = dialing.map(|dialing| {
        crate::serving::ToLeader::start(
            raft.clone(),
            applier.clone(),
            state,
            dialing,
            stopped.clone(),
        )
    });
    applier.set_log(Arc::new(ClusterLog {
        proposals: proposals.clone(),
        barriers: barriers.clone(),
        to_leader: to_leader.clone(),
        status,
    }));
    tokio::spawn(Leadership::watch(
        raft.clone(),
        applier.clone(),
        proposals,
        to_leader,
        id,
        stopped,
    ));
    crate::for_followers::LeaderSide {
        raft,
        applier,
        barriers,
    }
}

/// The text `watched` is set to, once it is (never, if its sender goes
/// without setting it).
async fn set(mut watched: watch::Receiver<Option<String>>) -> String {
    loop {
        if let Some(why) = watched.borrow_and_update().clone() {
            return why;
        }
        if watched.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// How a member proposes and reads: the [`Replicator`] its server sees.
struct ClusterLog {
    proposals: mpsc::UnboundedSender<ToProposer>,
    barriers: Arc<Barriers>,
    /// A follower's way to its leader, if followers serve clients.
    to_leader: Option<crate::serving::ToLeader>,
    status: Status,
}

impl Replicator for ClusterLog {
    fn propose(&self, proposal: &Proposal) -> Proposed {
        match self.proposals.send(ToProposer::Propose(proposal.clone())) {
            Ok(()) => Proposed::Later,
            Err(_) => Proposed::NotLeader,
        }
    }

    fn applies_at_once(&self) -> bool {
        false
    }

    fn read_barrier(&self) -> Barrier {
        self.barriers.wait()
    }

    fn forward(&self, proposal: &Proposal) -> Proposed {
        match &self.to_leader {
            Some(to) if to.propose(proposal) => Proposed::Later,
            _ => Proposed::NotLeader,
        }
    }

    fn follower_barrier(&self, heard: Option<baton_proto::SessionId>) -> Barrier {
        match &self.to_leader {
            Some(to) => to.barrier(heard),
            None => Box::pin(async { Err(NotLeading) }),
        }
    }

    fn status(&self) -> Option<ClusterStatus> {
        self.status.get()
    }
}

/// What the member's server asks of the proposer.
enum ToProposer {
    /// Propose this change.
    Propose(Proposal),
    /// The member stopped leading: drop what is not yet proposed (its
    /// requests were failed; a later term must not commit them).
    Drop,
}

/// Entries proposed and not yet applied, at most. openraft (0.9) writes and
/// syncs each entry of its leader before it takes up the next, so each
/// proposal of its own would cost a sync of the leader's log: instead the
/// proposals made while this many entries are on their way go together in
/// the next entry.
const ENTRIES_IN_FLIGHT: usize = 4;
/// Proposals in one entry, at most.
const ENTRY_PROPOSALS: usize = 1024;
/// Bytes of proposals (about) past which no more join an entry; one
/// proposal alone may be larger, up to [`MAX_MEMBER_DATA`] and its path.
const ENTRY_BYTES: usize = 1 << 20;
/// The largest node data a cluster member accepts (`--max-data`): every
/// change travels between members in one frame (of at most 256 MiB, with
/// the entries sent along with it).
pub const MAX_MEMBER_DATA: usize = 64 << 20;

/// About how many bytes a proposal takes in an entry.
fn proposal_bytes(p: &Proposal) -> usize {
    use baton_state::Command;
    let carried = match &p.command {
        Command::Create {
            path, data, acl, ..
        } => path.len() + data.len() + acl.wire_len(),
        Command::SetAcl { path, acl, .. } => path.len() + acl.wire_len(),
        Command::SetData { path, data, .. } | Command::Enqueue { path, data, .. } => {
            path.len() + data.len()
        }
        Command::Delete { path, .. }
        | Command::SetLockDelay { path, .. }
        | Command::DeleteTombstone { path }
        | Command::DeleteContainer { path } => path.len(),
        Command::Multi { ops, .. } => ops
            .iter()
            .map(|op| op.path().len() + op.data().map_or(0, |d| d.len()) + 16)
            .sum(),
        Command::OpenSession { .. }
        | Command::CloseSession { .. }
        | Command::ExpireSession { .. } => 0,
    };
    carried + 64
}

/// Hands proposals to openraft in the order they were made, batched into
/// entries. The answers come back through the state machine; openraft's
/// receivers are kept until they are answered only so that it has someone
/// to answer.
fn start_proposer(
    raft: Raft,
    mut stop: watch::Receiver<bool>,
) -> mpsc::UnboundedSender<ToProposer> {
    let (tx, mut rx) = mpsc::unbounded_channel::<ToProposer>();
    tokio::spawn(async move {
        let mut in_flight = FuturesUnordered::new();
        let mut pending: Vec<Proposal> = Vec::new();
        loop {
            if !pending.is_empty() && in_flight.len() < ENTRIES_IN_FLIGHT {
                // Let the runtime poll the sockets once more before the
                // entry is made: a request that arrived meanwhile (in a
                // handover, the next holder's release a few microseconds
                // after the last holder's enqueue) shares this entry and
                // its sync instead of waiting behind it for one of its own.
                tokio::task::yield_now().await;
                while let Ok(message) = rx.try_recv() {
                    file(message, &mut pending, &mut in_flight);
                }
                if pending.is_empty() {
                    continue;
                }
                let mut take = 0;
                let mut bytes = 0;
                while take < pending.len().min(ENTRY_PROPOSALS)
                    && (take == 0 || bytes < ENTRY_BYTES)
                {
                    bytes += proposal_bytes(&pending[take]);
                    take += 1;
                }
                let batch: Vec<Proposal> = pending.drain(..take).collect();
                match raft.client_write_ff(Change(batch)).await {
                    Ok(answer) => in_flight.push(answer),
                    Err(e) => {
                        warn!("the replicated log stopped taking proposals: {e}");
                        return;
                    }
                }
                continue;
            }
            tokio::select! {
                message = rx.recv() => {
                    let Some(message) = message else { return };
                    file(message, &mut pending, &mut in_flight);
                    while let Ok(message) = rx.try_recv() {
                        file(message, &mut pending, &mut in_flight);
                    }
                }
                Some(_) = in_flight.next(), if !in_flight.is_empty() => {}
                _ = stop.changed() => return,
            }
        }
    });
    tx
}

/// Takes one message for the proposer.
fn file<F>(message: ToProposer, pending: &mut Vec<Proposal>, in_flight: &mut FuturesUnordered<F>) {
    match message {
        ToProposer::Propose(p) => pending.push(p),
        ToProposer::Drop => {
            // openraft answers an entry only once it is applied or cut from
            // the log, and an entry of a deposed leader that a snapshot
            // later passes over is neither: the answers are of no use, and
            // waiting for them could hold up the next term's proposals for
            // good.
            pending.clear();
            *in_flight = FuturesUnordered::new();
        }
    }
}

/// Tells the member's server when it leads, and whom clients should go to
/// when it does not.
struct Leadership;

impl Leadership {
    async fn watch(
        raft: Raft,
        applier: Applier,
        proposer: mpsc::UnboundedSender<ToProposer>,
        to_leader: Option<crate::serving::ToLeader>,
        id: NodeId,
        mut stop: watch::Receiver<bool>,
    ) {
        let serving = to_leader.is_some();
        let mut metrics = raft.metrics();
        // What the server was last told: Some(vote) while it leads, else the
        // leader it sends clients to.
        let mut leading: Option<crate::types::Vote> = None;
        let mut following: Option<Option<NodeId>> = None;
        // The leadership last seen, and how far this member's log reached
        // then: everything in it may have been committed, and is applied
        // before the member serves anyone.
        let mut log_then: Option<(crate::types::Vote, Option<u64>)> = None;
        loop {
            let m = metrics.borrow_and_update().clone();
            if m.state == ServerState::Leader && m.current_leader == Some(id) {
                if leading.is_some() && leading != Some(m.vote) {
                    // Leading again in a later term, the steps between
                    // unseen (metrics keep only their latest value): step
                    // down first, as if they had been seen.
                    info!(
                        term = m.current_term,
                        "leading in a new term: sending clients away until it is proven"
                    );
                    applier.follow(None, false);
                    let _ = proposer.send(ToProposer::Drop);
                    leading = None;
                    following = Some(None);
                }
                let applied = m.last_applied.map(|l| l.index);
                if log_then.is_none_or(|(vote, _)| vote != m.vote) {
                    log_then = Some((m.vote, m.last_log_index));
                    if leading != Some(m.vote) && applied < m.last_log_index {
                        info!(
                            term = m.current_term,
                            ?applied,
                            log = ?m.last_log_index,
                            "leading: applying the whole log before serving clients"
                        );
                    }
                }
                let held = log_then.and_then(|(_, last)| last);
                if leading != Some(m.vote) && applied < held {
                    // openraft's read index is the first entry of the
                    // leader's term or its commit index, whichever is
                    // later. A leader restarted within its own term (its
                    // vote kept) may have lost its commit index with a
                    // power loss, and its term's first entry is then far
                    // behind what the cluster committed and acknowledged:
                    // it would serve a state that went back. Its log holds
                    // every committed entry, so it waits until all of it
                    // is applied (the metrics change as entries are).
                } else if leading != Some(m.vote) {
                    // Prove leadership and catch up before serving anyone.
                    match raft.ensure_linearizable().await {
                        Ok(_) => {
                            info!(term = m.current_term, "leading: serving clients");
                            if let Some(to) = &to_leader {
                                to.set_leader(None);
                            }
                            applier.lead();
                            leading = Some(m.vote);
                            following = None;
                        }
                        Err(e) => info!("not serving yet, leadership unconfirmed: {e}"),
                    }
                }
            } else if leading.is_some() || following != Some(m.current_leader) {
                let address = m.current_leader.and_then(|l| {
                    m.membership_config
                        .membership()
                        .get_node(&l)
                        .map(|n| n.client.clone())
                });
                if leading.is_some() {
                    info!(leader = ?m.current_leader, "not leading any more: sending clients to the leader");
                } else if following != Some(m.current_leader) {
                    match m.current_leader {
                        Some(leader) => info!(term = m.current_term, "member {leader} leads"),
                        None => info!(term = m.current_term, "no member is known to lead"),
                    }
                }
                if let Some(to) = &to_leader {
                    to.set_leader(m.current_leader.filter(|l| *l != id));
                }
                applier.follow(address, serving);
                let _ = proposer.send(ToProposer::Drop);
                leading = None;
                following = Some(m.current_leader);
            }
            tokio::select! {
                r = metrics.changed() => if r.is_err() { return },
                _ = stop.changed() => return,
            }
        }
    }
}
