//! What a server's connection tasks, its expiry timer and its handles
//! share: the core behind its lock, the settings, the counters, and the
//! handles given out to embedders ([`ServerHandle`]) and to a replicated
//! log ([`Applier`]).

use std::sync::{Arc, Mutex, MutexGuard};

use baton_proto::SessionId;
use tokio::sync::{watch, Notify, Semaphore};

use crate::clock::Now;
use crate::config::Config;
use crate::core::{Core, With};
use crate::persist::DurableMark;
use crate::replicate::{NotLeading, Replicator, Role};
use crate::state::{Proposal, StateMachine};
use crate::stats::{Stats, StatsSnapshot};

/// What the connection tasks, the timer and the handles share.
pub(crate) struct Shared {
    core: Mutex<Core>,
    pub(crate) config: Arc<Config>,
    pub(crate) stats: Arc<Stats>,
    /// Wakes the expiry timer when a session with an earlier deadline appears.
    pub(crate) expiry_wake: Arc<Notify>,
    /// How far the log is durable (`u64::MAX` for an in-memory server).
    pub(crate) mark: Arc<DurableMark>,
    /// A cluster member: reads wait for read barriers.
    pub(crate) replicated: bool,
    /// When the server was built.
    pub(crate) started: std::time::Instant,
    /// Set when the server stops: handshakes under way and the expiry timer
    /// watch it (attached connections hear it through their outboxes).
    pub(crate) stopping: watch::Sender<bool>,
    /// One permit per connection that may still be served. A connection's
    /// permit is forgotten when accepted and added back when it closes.
    pub(crate) connection_slots: Semaphore,
    /// TLS settings for new connections, if clients must use TLS; replaced
    /// by a reload.
    tls: std::sync::RwLock<Option<Arc<rustls::ServerConfig>>>,
    /// One backup at a time: each holds a whole encoded snapshot.
    pub(crate) backups: Semaphore,
}

impl Shared {
    /// A server's shared state over `sm` (recovered, or empty for a
    /// cluster member), whose changes go through `log`.
    pub(crate) fn new(
        sm: StateMachine,
        log: Arc<dyn Replicator>,
        role: Role,
        config: Arc<Config>,
        stats: Arc<Stats>,
        mark: Arc<DurableMark>,
    ) -> Shared {
        let connection_slots = Semaphore::new(config.max_connections);
        let expiry_wake = Arc::new(Notify::new());
        let log_applies_at_once = log.applies_at_once();
        let with = With {
            config: config.clone(),
            stats: stats.clone(),
            mark: mark.clone(),
            expiry_wake: expiry_wake.clone(),
        };
        let tls = config.tls.clone();
        let core = Core::new(sm, log, role, with, Now::real());
        Shared {
            core: Mutex::new(core),
            config,
            stats,
            expiry_wake,
            mark,
            connection_slots,
            replicated: !log_applies_at_once,
            stopping: watch::channel(false).0,
            started: std::time::Instant::now(),
            tls: std::sync::RwLock::new(tls),
            backups: Semaphore::new(1),
        }
    }

    /// The TLS settings a new connection uses, if any.
    pub(crate) fn tls(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.tls.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Shared {
    /// Locks the core. Nothing awaits while holding it.
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        // The core's methods keep it consistent at every return; a panic in
        // one (a bug) must not stop every other client.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a replicated log needs of the member it feeds: apply committed
/// proposals, copy and install the state, and say when it leads.
#[derive(Clone)]
pub struct Applier {
    shared: Arc<Shared>,
}

impl Applier {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Applier { shared }
    }

    /// Applies committed proposals, in log order, under one hold of the
    /// core; answers each request that was made here. Returns the revision
    /// after them.
    pub fn apply(&self, proposals: &[Proposal]) -> u64 {
        let mut core = self.shared.core();
        let mut revision = core.revision();
        let now = Now::real();
        for proposal in proposals {
            revision = core.apply_committed(proposal, now);
        }
        revision
    }

    /// A copy of the state, in O(1), to write a snapshot from.
    pub fn state(&self) -> StateMachine {
        self.shared.core().state()
    }

    /// Replaces the state with one from a snapshot.
    pub fn install(&self, sm: StateMachine) {
        self.shared.core().install(sm, Now::real());
    }

    /// This member leads now, has proven it, and has applied everything
    /// committed: it serves clients, giving every session a full timeout.
    pub fn lead(&self) {
        self.shared.core().lead(Now::real());
        self.shared.expiry_wake.notify_one();
    }

    /// This member does not lead, or the leader changed: the clients
    /// connected now are told so and closed. If `serving` and the leader
    /// (its client address) is known, this member serves clients itself,
    /// forwarding their changes to the leader; else they are sent to the
    /// leader.
    pub fn follow(&self, leader: Option<String>, serving: bool) {
        self.shared.core().follow(leader, serving);
    }

    /// A follower's changes of these sessions could not reach the leader:
    /// their connections are closed, and their clients, once resumed,
    /// send them again.
    pub fn lost(&self, sessions: &[SessionId]) {
        self.shared.core().lost(sessions);
    }

    /// On the leader: what a follower that serves clients sends it, taken
    /// in one hold of the core. The follower heard from the sessions in
    /// `heard` (see `Core::heard_elsewhere`), and forwarded `proposals`
    /// for its clients, which are proposed in order (see
    /// `Core::forwarded`).
    ///
    /// # Errors
    /// [`NotLeading`] unless this member serves as the leader: nothing is
    /// counted or proposed, even for a call that only asks for a read
    /// barrier. A member restarted within its own term leads in the log's
    /// eyes before it has applied its whole log, and the read index it
    /// would give may be behind what the cluster has acknowledged.
    pub fn from_follower(
        &self,
        heard: &[SessionId],
        proposals: Vec<Proposal>,
    ) -> Result<FromFollower, NotLeading> {
        let mut core = self.shared.core();
        let now = Now::real();
        let unheard = core.heard_elsewhere(heard, now)?;
        let mut refused = Vec::new();
        for proposal in proposals {
            let session = proposal.origin.map(|o| o.session);
            if !core.forwarded(proposal, now)? {
                refused.extend(session);
            }
        }
        Ok(FromFollower { unheard, refused })
    }

    /// Sets how this member proposes changes.
    pub fn set_log(&self, log: Arc<dyn Replicator>) {
        self.shared.core().set_log(log);
    }

    /// Whether the state applied here holds session `id` (it was opened by
    /// an applied change and has not ended).
    pub fn has_session(&self, id: SessionId) -> bool {
        self.shared.core().state_has_session(id)
    }

    /// The state's revision now.
    pub fn revision(&self) -> u64 {
        self.shared.core().revision()
    }

    /// The server's counters and sizes.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.core().stats_snapshot()
    }

    #[cfg(feature = "sim")]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// The leader's answer to what a follower sent ([`Applier::from_follower`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FromFollower {
    /// Sessions it could not count as heard (expiring or ended): the
    /// follower tells their clients nothing that shows them alive.
    pub unheard: Vec<SessionId>,
    /// Sessions whose changes it refused (not proposed): the follower
    /// closes their connections.
    pub refused: Vec<SessionId>,
}

/// A cheap handle to a running server, for reading its counters.
#[derive(Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle").finish_non_exhaustive()
    }
}

impl ServerHandle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        ServerHandle { shared }
    }

    /// The server's counters and current sizes.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.core().stats_snapshot()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Replaces the TLS settings (renewed certificates, say): connections
    /// made from now on use them, those open keep theirs. Returns false,
    /// changing nothing, on a server that takes plaintext connections.
    pub fn reload_tls(&self, config: Arc<rustls::ServerConfig>) -> bool {
        let mut tls = self.shared.tls.write().unwrap_or_else(|e| e.into_inner());
        if tls.is_none() {
            return false;
        }
        *tls = Some(config);
        true
    }
}
