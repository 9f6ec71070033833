//! What a leader does for the followers that serve clients (see
//! `serving`): it proposes the changes they forward, hears from the
//! sessions they serve, and confirms their read barriers.

use std::sync::Arc;

use baton_proto::SessionId;
use baton_server::Applier;

use crate::barriers::Barriers;

/// How long a leader waits to apply what a follower has applied (it
/// committed all of it, so only its apply can be behind).
const APPLY_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
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
    /// Answers a follower's call: hears from `heard` (saying which it could
    /// not count as heard), proposes `change` (saying whose changes it
    /// refused), and, if `confirm`, proves it leads and gives the read's
    /// log index. Refuses the whole call unless this member serves as the
    /// leader (see `Applier::from_follower`).
    ///
    /// The follower had applied up to `applied` when it sent the call: a
    /// session it serves may have been opened by an entry up to there,
    /// which this member (that committed it) may not have applied yet. The
    /// sessions are judged once it has, so that a change made right after
    /// its session opened is not refused as coming from a session unknown
    /// here (a ZooKeeper client, which does not send a change again after
    /// its connection is closed, would see it fail).
    pub(crate) async fn serve(
        &self,
        change: Change,
        heard: Vec<u64>,
        confirm: bool,
        applied: Option<u64>,
    ) -> Result<Served, String> {
        if applied.is_some() {
            self.raft
                .wait(Some(APPLY_LIMIT))
                .applied_index_at_least(applied, "a follower's sessions")
                .await
                .map_err(|e| format!("this member has not applied what the follower has: {e}"))?;
        }
        let heard: Vec<SessionId> = heard.into_iter().map(SessionId).collect();
        let answer = self
            .applier
            .from_follower(&heard, change.0)
            .map_err(|e| e.to_string())?;
        let ids = |sessions: Vec<SessionId>| sessions.into_iter().map(|s| s.0).collect();
        let read_index = if confirm {
            // The read's index, not the applied index in the metrics,
            // which may lag what the barrier proved (see `Barriers`).
            self.barriers
                .read_index()
                .await
                .map_err(|e| e.to_string())?
        } else {
            None
        };
        Ok(Served {
            read_index,
            refused: ids(answer.refused),
            unheard: ids(answer.unheard),
        })
    }
}
