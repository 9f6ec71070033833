//! What a member's peer listener answers with.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::types::{NodeId, Raft};

use super::dial::Held;
use super::tls::PeerTls;

/// What a member's peer listener answers with.
#[derive(Clone)]
pub struct Answering {
    pub raft: Raft,
    pub tls: Option<PeerTls>,
    /// Where to reach members whose advertised address is not the way.
    pub routes: BTreeMap<NodeId, String>,
    /// While this member is being added.
    pub joining: Option<Arc<crate::joining::Joining>>,
    /// Set, with what to do, once a leader finds this member's log went
    /// back: the member stops.
    pub went_back: Arc<watch::Sender<Option<String>>>,
    /// How far each member said it holds the log, while this one leads.
    pub held: Held,
    /// What this member does, while it leads, for the followers that
    /// serve clients.
    pub(crate) leader_side: Option<crate::for_followers::LeaderSide>,
}
