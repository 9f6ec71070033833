//! What the status probe answers: this server, described in one JSON
//! object (see `baton_proto::probe`).

use std::path::Path;

use serde_json::{json, Value};

use crate::replicate::Role;
use crate::shared::Shared;

/// How many locks the status names, busiest first.
const BUSIEST_LOCKS: usize = 20;

/// Who asks: which locks the status may name.
pub(crate) enum Viewer {
    /// A server without identities: every lock.
    Anyone,
    /// The locks this identity may read.
    Identity(std::sync::Arc<crate::auth::Identity>),
    /// No identity (or an unknown one) on a server that checks them: none.
    Nobody,
}

/// The status of the server behind `shared`, as a JSON object, as
/// `viewer` may see it.
pub(crate) fn json(shared: &Shared, viewer: &Viewer) -> String {
    let (stats, role, cluster, locks, serving, attached) = {
        let core = shared.core();
        let locks = match viewer {
            Viewer::Anyone => core.busiest_locks(BUSIEST_LOCKS),
            Viewer::Identity(identity) => {
                let mut all = core.busiest_locks(usize::MAX);
                all.retain(|l| identity.need(crate::auth::Rights::READ, &l.lock).is_ok());
                all.truncate(BUSIEST_LOCKS);
                all
            }
            Viewer::Nobody => Vec::new(),
        };
        (
            core.stats_snapshot(),
            core.role(),
            core.log().status(),
            locks,
            core.serves_clients(),
            core.attached_sessions(),
        )
    };
    let (role, leader) = match (role, shared.replicated) {
        (Role::Leader, false) => ("single", None),
        (Role::Leader, true) => ("leader", None),
        (Role::Follower { leader, .. }, _) => ("follower", leader),
    };
    let cluster: Value = cluster
        .and_then(|c| serde_json::to_value(c).ok())
        .unwrap_or(Value::Null);
    json!({
        "server": "baton",
        "version": env!("CARGO_PKG_VERSION"),
        "role": role,
        "leader": leader,
        "serves_clients": serving,
        "sessions_here": attached,
        "uptime_ms": shared.started.elapsed().as_millis() as u64,
        "revision": stats.revision,
        "sessions": stats.sessions,
        "nodes": stats.nodes,
        "watches": stats.watches,
        "connections": stats.connections_open,
        "sessions_expired": stats.sessions_expired,
        "fsync": shared.config.fsync.to_string(),
        "recent_syncs": shared.stats.recent_syncs().map(|r| json!({
            "syncs": r.syncs,
            "p50_us": r.p50_us,
            "p99_us": r.p99_us,
            "max_us": r.max_us,
        })),
        "storage": shared.config.data_dir.as_deref().map(storage),
        "locks_hidden": matches!(viewer, Viewer::Nobody),
        "locks": locks.iter().map(|l| json!({
            "lock": &*l.lock,
            "queue": l.queue,
            "holders": l.holders,
            "token": l.token,
            "grants": l.grants,
            "wait_seconds": l.wait_seconds,
            "holds": l.holds,
            "hold_seconds": l.hold_seconds,
            "lock_delay_ms": l.lock_delay_ms,
        })).collect::<Vec<_>>(),
        "cluster": cluster,
    })
    .to_string()
}

/// What the data directory holds: its path and the bytes of log and of
/// snapshots in it. A few files: read when asked.
fn storage(dir: &Path) -> Value {
    let (mut log, mut snapshots, mut log_files) = (0u64, 0u64, 0u64);
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let len = entry.metadata().map_or(0, |m| m.len());
            if name.starts_with("wal-") && name.ends_with(".log") {
                log += len;
                log_files += 1;
            } else if name.starts_with("snapshot-") && name.ends_with(".snap") {
                snapshots += len;
            }
        }
    }
    json!({
        "data_dir": dir.display().to_string(),
        "log_bytes": log,
        "log_files": log_files,
        "snapshot_bytes": snapshots,
    })
}
