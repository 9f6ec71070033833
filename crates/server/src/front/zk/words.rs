//! Four-letter words: what operators and health checks ask a ZooKeeper
//! server in plain text (`echo ruok | nc host 2181`). Only the words in
//! the server's list are answered (ZooKeeper's `4lw.commands.whitelist`);
//! another gets ZooKeeper's refusal. The connection closes once answered.

use std::fmt::Write as _;

use tokio::time::timeout;
use tracing::debug;

use super::super::conn::{Conn, CLOSE_GRACE};
use crate::replicate::Role;

/// The version a `srvr` reports: ZooKeeper's format, Baton's version.
fn version() -> String {
    format!(
        "3.8.0-baton-{}, built on baton {}",
        env!("CARGO_PKG_VERSION"),
        env!("CARGO_PKG_VERSION")
    )
}

/// Writes the answer to `word` and closes.
pub(super) async fn answer(conn: &mut Conn, word: &'static str) {
    let allowed = conn
        .shared
        .config
        .zk_words
        .iter()
        .any(|w| w == word || w == "*");
    let text = if !allowed {
        format!("{word} is not executed because it is not in the whitelist.\n")
    } else {
        text(conn, word)
    };
    debug!(peer = %conn.socket.peer(), word, allowed, "four-letter word");
    conn.socket.wbuf.get().extend_from_slice(text.as_bytes());
    let _ = timeout(CLOSE_GRACE, conn.socket.write_all(&conn.shared.stats)).await;
}

/// The mode ZooKeeper would report.
fn mode(conn: &Conn) -> &'static str {
    if !conn.shared.replicated {
        return "standalone";
    }
    match conn.shared.core().role() {
        Role::Leader => "leader",
        _ => "follower",
    }
}

fn text(conn: &Conn, word: &str) -> String {
    let shared = &conn.shared;
    let (stats, revision, nodes, sessions, watches, ephemerals) = {
        let core = shared.core();
        let sm = core.sm();
        let ephemerals: usize = sm.sessions().map(|(_, s)| s.ephemerals.len()).sum();
        (
            core.stats_snapshot(),
            core.revision(),
            sm.node_count(),
            sm.session_count(),
            core.watch_count(),
            ephemerals,
        )
    };
    let mut out = String::new();
    match word {
        "ruok" => out.push_str("imok"),
        "isro" => out.push_str("rw"),
        "srvr" | "stat" => {
            let _ = writeln!(out, "Zookeeper version: {}", version());
            if word == "stat" {
                let _ = writeln!(out, "Clients:");
                let _ = writeln!(out, " /{}[0](queued=0,recved=0,sent=0)", conn.socket.peer());
                let _ = writeln!(out);
            }
            let _ = writeln!(out, "Latency min/avg/max: 0/0/0");
            let _ = writeln!(out, "Received: {}", stats.requests);
            let _ = writeln!(out, "Sent: {}", stats.requests);
            let _ = writeln!(out, "Connections: {}", stats.connections_open);
            let _ = writeln!(out, "Outstanding: 0");
            let _ = writeln!(out, "Zxid: 0x{revision:x}");
            let _ = writeln!(out, "Mode: {}", mode(conn));
            let _ = writeln!(out, "Node count: {nodes}");
        }
        "mntr" => {
            let rows: [(&str, String); 11] = [
                ("zk_version", version()),
                ("zk_server_state", mode(conn).into()),
                ("zk_znode_count", nodes.to_string()),
                ("zk_watch_count", watches.to_string()),
                ("zk_ephemerals_count", ephemerals.to_string()),
                ("zk_global_sessions", sessions.to_string()),
                (
                    "zk_num_alive_connections",
                    stats.connections_open.to_string(),
                ),
                ("zk_packets_received", stats.requests.to_string()),
                ("zk_packets_sent", stats.requests.to_string()),
                ("zk_outstanding_requests", "0".into()),
                (
                    "zk_uptime",
                    shared.started.elapsed().as_millis().to_string(),
                ),
            ];
            for (name, value) in rows {
                let _ = writeln!(out, "{name}\t{value}");
            }
        }
        "cons" => {
            let _ = writeln!(out, " /{}[0](queued=0,recved=0,sent=0)", conn.socket.peer());
            let _ = writeln!(out);
        }
        "wchs" => {
            let _ = writeln!(out, "{sessions} connections watching {watches} paths");
            let _ = writeln!(out, "Total watches:{watches}");
        }
        "conf" => {
            let config = &shared.config;
            let _ = writeln!(
                out,
                "clientPort={}",
                conn.socket.stream.local_addr().map_or(0, |a| a.port())
            );
            if let Some(dir) = &config.data_dir {
                let _ = writeln!(out, "dataDir={}", dir.display());
            }
            let _ = writeln!(out, "maxClientCnxns={}", config.max_connections);
            let _ = writeln!(
                out,
                "minSessionTimeout={}",
                config.min_session_timeout.as_millis()
            );
            let _ = writeln!(
                out,
                "maxSessionTimeout={}",
                config.max_session_timeout.as_millis()
            );
            let _ = writeln!(out, "serverId=0");
        }
        "envi" => {
            let _ = writeln!(out, "Environment:");
            let _ = writeln!(out, "zookeeper.version={}", version());
            let _ = writeln!(out, "os.name={}", std::env::consts::OS);
            let _ = writeln!(out, "os.arch={}", std::env::consts::ARCH);
            let _ = writeln!(
                out,
                "user.dir={}",
                std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            );
        }
        // Known to ZooKeeper, not answered by Baton (they change the
        // server, or report what it does not keep).
        other => {
            let _ = writeln!(
                out,
                "{other} is not supported by this server (Baton); see docs/zookeeper.md"
            );
        }
    }
    out
}
