//! A scrape: the server's counters, instruments and sizes, read at once and
//! encoded with `prometheus-client` in the OpenMetrics text format that
//! Prometheus reads.

use std::sync::atomic::Ordering;

use baton_proto::{ErrorCode, OpCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tracing::warn;

use super::instruments::{Histogram, Metrics, OPS, RESULTS};
use crate::locks::LockView;
use crate::replicate::{ClusterStatus, Role};
use crate::ServerHandle;

/// How many locks the metrics name (by path, so label values stay few),
/// busiest first.
const BUSIEST_LOCKS: usize = 10;

/// Encodes histogram `h`, its values divided by `scale` (1e9 to give
/// nanoseconds in seconds).
fn histogram(
    encoder: &mut DescriptorEncoder<'_>,
    h: &Histogram,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    scale: f64,
) -> Result<(), std::fmt::Error> {
    let (buckets, count, sum) = h.read(scale);
    let metric = encoder.encode_descriptor(name, help, unit, MetricType::Histogram)?;
    metric_histogram(metric, sum, count, &buckets)
}

fn metric_histogram(
    mut metric: prometheus_client::encoding::MetricEncoder<'_>,
    sum: f64,
    count: u64,
    buckets: &[(f64, u64)],
) -> Result<(), std::fmt::Error> {
    metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, buckets, None)
}

/// A label value as the text format needs it: `\`, `"` and line feeds
/// escaped (the encoder writes label values as given, and a path may hold
/// any of them).
fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A label value from a name: lower case, words joined by `_`.
fn label(name: &str) -> String {
    name.replace(' ', "_")
}

fn op_label(op: usize) -> String {
    OpCode::from_u8(op as u8).map_or_else(|| "unknown".into(), |op| label(op.name()))
}

fn result_label(result: usize) -> String {
    match result {
        0 => "ok".into(),
        r if r == RESULTS - 1 => "other".into(),
        r => label(ErrorCode::from_u16(r as u16).name()),
    }
}

/// Reads the server's state at each scrape.
#[derive(Debug)]
struct Scrape {
    handle: ServerHandle,
}

/// Encodes one value without labels.
fn one(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let e = encoder.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(e)
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    one(encoder, name, help, None, ConstCounter::new(value))
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    one(encoder, name, help, None, ConstGauge::new(value))
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let shared: &crate::shared::Shared = self.handle.shared();
        let (stats, role, cluster, queue_watches, locks) = {
            let core = shared.core();
            (
                core.stats_snapshot(),
                core.role(),
                core.log().status(),
                core.queue_watch_count(),
                core.busiest_locks(BUSIEST_LOCKS),
            )
        };
        let role = match (role, shared.replicated) {
            (Role::Leader, false) => "single",
            (Role::Leader, true) => "leader",
            (Role::Follower { .. }, _) => "follower",
        };
        let info = [
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("role", role.to_string()),
            ("fsync", shared.config.fsync.to_string()),
        ];
        let m = e.encode_descriptor(
            "baton_server",
            "This server: version, role (single, leader or follower) and fsync policy.",
            None,
            MetricType::Info,
        )?;
        prometheus_client::metrics::info::Info::new(info.to_vec()).encode(m)?;
        let uptime = shared.started.elapsed().as_secs_f64();
        one(
            &mut e,
            "baton_uptime",
            "Time since the server started.",
            Some(&Unit::Seconds),
            ConstGauge::new(uptime),
        )?;
        let m = &shared.stats.metrics;

        gauge(
            &mut e,
            "baton_sessions",
            "Live sessions.",
            stats.sessions as i64,
        )?;
        counter(
            &mut e,
            "baton_sessions_expired",
            "Sessions ended by expiry.",
            stats.sessions_expired,
        )?;
        counter(
            &mut e,
            "baton_sessions_resumed",
            "Sessions resumed on a new connection.",
            m.sessions_resumed.load(Ordering::Relaxed),
        )?;
        counter(
            &mut e,
            "baton_watch_history_compacted",
            "Persistent watches resumed after more changes than the server's watch history holds: their clients were told to read afresh.",
            m.watch_history_compacted.load(Ordering::Relaxed),
        )?;
        gauge(
            &mut e,
            "baton_connections",
            "Connections open, handshakes under way included.",
            stats.connections_open as i64,
        )?;
        counter(
            &mut e,
            "baton_connections_accepted",
            "Connections accepted.",
            stats.connections_accepted,
        )?;
        counter(
            &mut e,
            "baton_connections_refused",
            "Connections refused at the connection limit.",
            stats.connections_refused,
        )?;
        gauge(
            &mut e,
            "baton_nodes",
            "Nodes in the tree, the root included.",
            stats.nodes as i64,
        )?;
        gauge(
            &mut e,
            "baton_watches",
            "Data and child watches: (session, path) pairs holding at least one.",
            (stats.watches as i64) - queue_watches as i64,
        )?;
        gauge(
            &mut e,
            "baton_queue_watches",
            "Queue watches (one per lock or election node that waits).",
            queue_watches as i64,
        )?;
        gauge(
            &mut e,
            "baton_revision",
            "The state's revision.",
            stats.revision as i64,
        )?;

        let replies = e.encode_descriptor(
            "baton_requests",
            "Requests answered, by operation and result (ok, or the error's name).",
            None,
            MetricType::Counter,
        )?;
        encode_replies(replies, m)?;
        histogram(
            &mut e,
            &m.handle,
            "baton_request_handle",
            "Time to handle a request, from decoded to answered (a read) or handed to the log (a change).",
            Some(&Unit::Seconds),
            1e9,
        )?;
        counter(
            &mut e,
            "baton_protocol_errors",
            "Requests and connections refused as malformed.",
            stats.protocol_errors,
        )?;
        counter(
            &mut e,
            "baton_watch_events",
            "Watch events sent to clients.",
            stats.watch_events,
        )?;
        one(
            &mut e,
            "baton_received",
            "Bytes of requests received.",
            Some(&Unit::Bytes),
            ConstCounter::new(stats.bytes_in),
        )?;
        one(
            &mut e,
            "baton_sent",
            "Bytes sent to clients.",
            Some(&Unit::Bytes),
            ConstCounter::new(stats.bytes_out),
        )?;
        counter(
            &mut e,
            "baton_slow_client_disconnects",
            "Connections closed because the client did not read its output.",
            stats.slow_client_disconnects,
        )?;

        histogram(
            &mut e,
            &m.log_sync,
            "baton_log_sync",
            "Time to sync the log (fdatasync), per batch.",
            Some(&Unit::Seconds),
            1e9,
        )?;
        histogram(
            &mut e,
            &m.log_batch,
            "baton_log_batch",
            "Bytes per log batch: one write, and under --fsync always one sync.",
            Some(&Unit::Bytes),
            1.0,
        )?;
        counter(
            &mut e,
            "baton_syncs",
            "fsync and fdatasync calls on the log, snapshots and the data directory.",
            stats.syncs,
        )?;
        histogram(
            &mut e,
            &m.snapshot,
            "baton_snapshot_duration",
            "Time to write a snapshot.",
            Some(&Unit::Seconds),
            1e9,
        )?;
        one(
            &mut e,
            "baton_snapshot_last",
            "Size of the last snapshot written.",
            Some(&Unit::Bytes),
            ConstGauge::new(m.snapshot_bytes.load(Ordering::Relaxed) as i64),
        )?;
        one(
            &mut e,
            "baton_snapshot_pause_max",
            "The longest the state was locked to start a snapshot.",
            Some(&Unit::Seconds),
            ConstGauge::new(stats.snapshot_pause_max_us as f64 / 1e6),
        )?;

        encode_locks(&mut e, &locks)?;
        if let Some(cluster) = &cluster {
            encode_cluster(&mut e, cluster)?;
        }
        Ok(())
    }
}

fn encode_replies(
    mut family: prometheus_client::encoding::MetricEncoder<'_>,
    m: &Metrics,
) -> Result<(), std::fmt::Error> {
    for op in 0..OPS {
        for result in 0..RESULTS {
            let n = m.replies(op, result);
            if n == 0 {
                continue;
            }
            let labels = [("op", op_label(op)), ("result", result_label(result))];
            let metric = family.encode_family(&labels)?;
            ConstCounter::new(n).encode(metric)?;
        }
    }
    Ok(())
}

/// Figures of the busiest locks, one label value (the lock's path) each.
fn encode_locks(e: &mut DescriptorEncoder<'_>, locks: &[LockView]) -> Result<(), std::fmt::Error> {
    type Field = fn(&LockView) -> Option<f64>;
    let families: [(&str, &str, MetricType, Option<Unit>, Field); 7] = [
        (
            "baton_lock_queue",
            "Nodes queued for the lock now, the holders' included.",
            MetricType::Gauge,
            None,
            |l| Some(l.queue as f64),
        ),
        (
            "baton_lock_holders",
            "Holders of the lock now: more than one when readers or permit holders share it.",
            MetricType::Gauge,
            None,
            |l| Some(l.holders as f64),
        ),
        (
            "baton_lock_token",
            "The newest holder's fencing token (absent while the lock is free).",
            MetricType::Gauge,
            None,
            |l| l.token.map(|t| t as f64),
        ),
        (
            "baton_lock_grants",
            "Grants of the lock.",
            MetricType::Counter,
            None,
            |l| Some(l.grants as f64),
        ),
        (
            "baton_lock_wait",
            "Summed over grants: the wait from enqueue to grant.",
            MetricType::Counter,
            Some(Unit::Seconds),
            |l| Some(l.wait_seconds),
        ),
        (
            "baton_lock_holds",
            "Holds of the lock that ended.",
            MetricType::Counter,
            None,
            |l| Some(l.holds as f64),
        ),
        (
            "baton_lock_hold",
            "Summed over the holds that ended: their length.",
            MetricType::Counter,
            Some(Unit::Seconds),
            |l| Some(l.hold_seconds),
        ),
    ];
    if locks.is_empty() {
        return Ok(());
    }
    for (name, help, kind, unit, field) in families {
        let mut family = e.encode_descriptor(name, help, unit.as_ref(), kind)?;
        for lock in locks {
            let Some(v) = field(lock) else { continue };
            let labels = [("lock", escaped(&lock.lock))];
            let metric = family.encode_family(&labels)?;
            match kind {
                MetricType::Counter => ConstCounter::new(v).encode(metric)?,
                _ => ConstGauge::new(v).encode(metric)?,
            }
        }
    }
    Ok(())
}

/// A cluster member's view: its term, indexes and, on the leader, each
/// member's lag.
fn encode_cluster(e: &mut DescriptorEncoder<'_>, c: &ClusterStatus) -> Result<(), std::fmt::Error> {
    gauge(
        e,
        "baton_cluster_term",
        "The member's Raft term.",
        c.term as i64,
    )?;
    if let Some(commit) = c.commit_index {
        gauge(
            e,
            "baton_cluster_commit_index",
            "The highest log index known committed (on the leader).",
            commit as i64,
        )?;
    }
    if let Some(applied) = c.applied_index {
        gauge(
            e,
            "baton_cluster_applied_index",
            "The highest log index this member has applied.",
            applied as i64,
        )?;
    }
    if let Some(leader) = c.leader {
        gauge(
            e,
            "baton_cluster_leader",
            "The id of the member that leads, as this member knows it.",
            leader as i64,
        )?;
    }
    let members: Vec<(String, i64)> = c
        .members
        .iter()
        .filter_map(|m| Some((m.id.to_string(), m.lag? as i64)))
        .collect();
    if !members.is_empty() {
        let mut family = e.encode_descriptor(
            "baton_cluster_member_lag",
            "Log entries a member is behind the leader's log (reported by the leader).",
            None,
            MetricType::Gauge,
        )?;
        for (id, lag) in members {
            let labels = [("member", id)];
            ConstGauge::new(lag).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// The metrics of the server behind `handle`, as OpenMetrics text.
pub fn render(handle: &ServerHandle) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        handle: handle.clone(),
    }));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        warn!("encoding the metrics failed: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_every_operation_and_result() {
        assert_eq!(op_label(4), "get_data");
        assert_eq!(op_label(0), "unknown");
        assert_eq!(result_label(0), "ok");
        assert_eq!(result_label(1), "no_node");
        assert_eq!(result_label(19), "stale_fencing_token");
        assert_eq!(result_label(RESULTS - 1), "other");
    }
}
