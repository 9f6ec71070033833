//! Metrics for Prometheus, served over HTTP (`baton serve --metrics-listen`).
//!
//! The hot path only adds to atomics: counters per operation and result,
//! and fixed-bucket histograms ([`Histogram`]). A scrape reads them and the
//! state's sizes and encodes everything with `prometheus-client`, in the
//! OpenMetrics text format that Prometheus reads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::{ErrorCode, OpCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::locks::LockView;
use crate::server::Shared;
use crate::ServerHandle;

/// Upper bounds of the latency buckets, in nanoseconds: 1 µs to 10 s.
const LATENCY_NS: &[u64] = &[
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Upper bounds of the log batch size buckets, in bytes: 64 B to 16 MiB.
const BATCH_BYTES: &[u64] = &[
    64,
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];

/// Upper bounds of the snapshot duration buckets, in nanoseconds: 1 ms to
/// 5 minutes.
const SNAPSHOT_NS: &[u64] = &[
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
    60_000_000_000,
    300_000_000_000,
];

/// Observations counted in fixed buckets with relaxed atomics: two adds
/// and a binary search over a few bounds per observation.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [u64],
    /// One per bound, then one past the last.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [u64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, value: u64) {
        let bucket = self.bounds.partition_point(|&b| b < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    pub(crate) fn observe_duration(&self, took: Duration) {
        self.observe(took.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// Encodes the histogram, its values divided by `scale` (1e9 to give
    /// nanoseconds in seconds).
    fn encode(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        unit: Option<&Unit>,
        scale: f64,
    ) -> Result<(), std::fmt::Error> {
        let mut buckets = Vec::with_capacity(self.counts.len());
        let mut count = 0;
        for (i, c) in self.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            count += n;
            let bound = self.bounds.get(i).map_or(f64::MAX, |&b| b as f64 / scale);
            buckets.push((bound, n));
        }
        let sum = self.sum.load(Ordering::Relaxed) as f64 / scale;
        let metric = encoder.encode_descriptor(name, help, unit, MetricType::Histogram)?;
        metric_histogram(metric, sum, count, &buckets)
    }
}

fn metric_histogram(
    mut metric: prometheus_client::encoding::MetricEncoder<'_>,
    sum: f64,
    count: u64,
    buckets: &[(f64, u64)],
) -> Result<(), std::fmt::Error> {
    metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, buckets, None)
}

/// How many locks the metrics name (by path, so label values stay few),
/// busiest first.
const BUSIEST_LOCKS: usize = 10;

/// Operations by wire number (0 for one the server does not know).
const OPS: usize = 16;
/// Results: 0 for success, then the error codes by wire number, then one
/// for any other code.
const RESULTS: usize = 27;

/// What the server measures beyond its plain counters.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Replies by operation and result.
    replies: Box<[AtomicU64]>,
    /// Time to handle a request: from decoded to answered or proposed.
    pub(crate) handle: Histogram,
    /// Syncs of the log.
    pub(crate) log_sync: Histogram,
    /// Bytes per log batch (one write, and under `--fsync always` one sync).
    pub(crate) log_batch: Histogram,
    /// Time to write a snapshot.
    pub(crate) snapshot: Histogram,
    /// Size of the last snapshot written, in bytes.
    pub(crate) snapshot_bytes: AtomicU64,
    /// Sessions resumed on a new connection.
    pub(crate) sessions_resumed: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            replies: (0..OPS * RESULTS).map(|_| AtomicU64::new(0)).collect(),
            handle: Histogram::new(LATENCY_NS),
            log_sync: Histogram::new(LATENCY_NS),
            log_batch: Histogram::new(BATCH_BYTES),
            snapshot: Histogram::new(SNAPSHOT_NS),
            snapshot_bytes: AtomicU64::new(0),
            sessions_resumed: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Counts a reply to operation `op` with `error` (`None`: success).
    pub(crate) fn replied(&self, op: u8, error: Option<ErrorCode>) {
        let op = if (op as usize) < OPS { op as usize } else { 0 };
        let result = match error {
            None => 0,
            Some(code) => (code.to_u16() as usize).min(RESULTS - 1),
        };
        self.replies[op * RESULTS + result].fetch_add(1, Ordering::Relaxed);
    }
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
        let shared: &Shared = self.handle.shared();
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
            (crate::replicate::Role::Leader, false) => "single",
            (crate::replicate::Role::Leader, true) => "leader",
            (crate::replicate::Role::Follower { .. }, _) => "follower",
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
        m.handle.encode(
            &mut e,
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

        m.log_sync.encode(
            &mut e,
            "baton_log_sync",
            "Time to sync the log (fdatasync), per batch.",
            Some(&Unit::Seconds),
            1e9,
        )?;
        m.log_batch.encode(
            &mut e,
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
        m.snapshot.encode(
            &mut e,
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
        if let Some(cluster) = cluster.and_then(|c| serde_json::from_str::<Value>(&c).ok()) {
            encode_cluster(&mut e, &cluster)?;
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
            let n = m.replies[op * RESULTS + result].load(Ordering::Relaxed);
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
    let families: [(&str, &str, MetricType, Option<Unit>, Field); 6] = [
        (
            "baton_lock_queue",
            "Nodes queued for the lock now, the holder's included.",
            MetricType::Gauge,
            None,
            |l| Some(l.queue as f64),
        ),
        (
            "baton_lock_token",
            "The holder's fencing token (absent while the lock is free).",
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
fn encode_cluster(e: &mut DescriptorEncoder<'_>, c: &Value) -> Result<(), std::fmt::Error> {
    let n = |v: &Value| v.as_u64().map(|n| n as i64);
    if let Some(term) = n(&c["term"]) {
        gauge(e, "baton_cluster_term", "The member's Raft term.", term)?;
    }
    if let Some(commit) = n(&c["commit_index"]) {
        gauge(
            e,
            "baton_cluster_commit_index",
            "The highest log index known committed (on the leader).",
            commit,
        )?;
    }
    if let Some(applied) = n(&c["applied_index"]) {
        gauge(
            e,
            "baton_cluster_applied_index",
            "The highest log index this member has applied.",
            applied,
        )?;
    }
    if let Some(leader) = n(&c["leader"]) {
        gauge(
            e,
            "baton_cluster_leader",
            "The id of the member that leads, as this member knows it.",
            leader,
        )?;
    }
    let members: Vec<(String, i64)> = c["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| Some((m["id"].as_u64()?.to_string(), n(&m["lag"])?)))
                .collect()
        })
        .unwrap_or_default();
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

/// Most bytes of an HTTP request read before it is refused.
const MAX_HTTP_REQUEST: usize = 8 << 10;
/// How long a metrics client may take to send its request.
const HTTP_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one metrics connection may last in all, reading and writing.
const HTTP_ANSWER_TIMEOUT: Duration = Duration::from_secs(15);
/// Most metrics connections served at once.
const HTTP_CONNECTIONS: usize = 64;

/// Serves `GET /metrics` on `listener` until the server behind `handle`
/// stops. Each connection gets one answer and is closed.
pub async fn serve(listener: TcpListener, handle: ServerHandle) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving metrics at http://{addr}/metrics");
    }
    let mut stopping = handle.shared().stopping.subscribe();
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stopping.wait_for(|s| *s) => return,
        };
        match accepted {
            Ok((stream, _)) => {
                // Past the limit a connection is closed unanswered.
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                let handle = handle.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HTTP_ANSWER_TIMEOUT, answer(stream, &handle)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => debug!("metrics request failed: {e}"),
                        Err(_) => debug!("metrics request abandoned: not answered within {HTTP_ANSWER_TIMEOUT:?}"),
                    }
                    drop(slot);
                });
            }
            Err(e) => {
                warn!("accepting a metrics connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads one HTTP request and answers it.
async fn answer(mut stream: TcpStream, handle: &ServerHandle) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head_read = async {
        loop {
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.len() > MAX_HTTP_REQUEST {
                return Ok::<_, std::io::Error>(true);
            }
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(false);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    match tokio::time::timeout(HTTP_READ_TIMEOUT, head_read).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => return Ok(()),
        Ok(Err(e)) => return Err(e),
    }
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = if buf.len() > MAX_HTTP_REQUEST {
        (
            "431 Request Header Fields Too Large",
            "text/plain; charset=utf-8",
            "request too large\n".to_string(),
        )
    } else if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET is served here\n".to_string(),
        )
    } else if path == "/metrics" {
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(handle),
        )
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "Baton serves its metrics at /metrics\n".to_string(),
        )
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_value_in_the_first_bucket_that_holds_it() {
        let h = Histogram::new(&[10, 100]);
        for v in [0, 10, 11, 100, 101, 5_000] {
            h.observe(v);
        }
        let counts: Vec<u64> = h.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, [2, 2, 2]);
        assert_eq!(h.sum.load(Ordering::Relaxed), 5_222);
    }

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
