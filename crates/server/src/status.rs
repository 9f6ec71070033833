//! What the status probe answers: this server, described in one JSON
//! object (see `baton_proto::probe`).

use serde_json::{json, Value};

use crate::replicate::Role;
use crate::server::Shared;

/// The status of the server behind `shared`, as a JSON object.
pub(crate) fn json(shared: &Shared) -> String {
    let (stats, role, cluster) = {
        let core = shared.core();
        (core.stats_snapshot(), core.role(), core.log().status())
    };
    let (role, leader) = match (role, shared.replicated) {
        (Role::Leader, false) => ("single", None),
        (Role::Leader, true) => ("leader", None),
        (Role::Follower { leader }, _) => ("follower", leader),
    };
    let cluster: Value = cluster
        .and_then(|c| serde_json::from_str(&c).ok())
        .unwrap_or(Value::Null);
    json!({
        "server": "baton",
        "version": env!("CARGO_PKG_VERSION"),
        "role": role,
        "leader": leader,
        "uptime_ms": shared.started.elapsed().as_millis() as u64,
        "revision": stats.revision,
        "sessions": stats.sessions,
        "nodes": stats.nodes,
        "watches": stats.watches,
        "connections": stats.connections_open,
        "sessions_expired": stats.sessions_expired,
        "fsync": shared.config.fsync.to_string(),
        "cluster": cluster,
    })
    .to_string()
}
