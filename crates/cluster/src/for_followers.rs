//! What a leader does for the followers that serve clients (see
//! `serving`): it proposes the changes they forward, hears from the
//! sessions they serve, and confirms their read barriers.

use std::sync::Arc;

use baton_proto::SessionId;
use baton_server::Applier;

use crate::barriers::Barriers;
use crate::network::Served;
use crate::types::{Change, Raft};

/// What a leader does for the followers that serve clients.
#[derive(Clone)]
pub(crate) struct LeaderSide {
    pub(crate) raft: Raft,
    pub(crate) applier: Applier,
    pub(crate) barriers: Arc<Barriers>,
}

impl LeaderSide {
    /// Answers a follower's call: hears from `heard`, proposes `change`
    /// (saying whose changes it refused), and, if `confirm`, proves it
    /// leads and says how far it has applied.
    pub(crate) async fn serve(
        &self,
        change: Change,
        heard: Vec<u64>,
        confirm: bool,
    ) -> Result<Served, String> {
        let heard: Vec<SessionId> = heard.into_iter().map(SessionId).collect();
        self.applier.heard_elsewhere(&heard);
        let refused = self
            .applier
            .forwarded(change.0)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|s| s.0)
            .collect();
        let applied = if confirm {
            self.barriers.wait().await.map_err(|e| e.to_string())?;
            self.raft.metrics().borrow().last_applied.map(|l| l.index)
        } else {
            None
        };
        Ok(Served { applied, refused })
    }
}
