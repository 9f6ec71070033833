//! Counters the server keeps about itself, for tests, tools and operators.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Running totals since the server started. Updated with relaxed atomics:
/// each counter is exact, but a snapshot is not one instant across counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) connections_accepted: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) connections_open: AtomicU64,
    pub(crate) requests: AtomicU64,
    /// Watch events queued to clients (notifications).
    pub(crate) events: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) sessions_expired: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) slow_client_disconnects: AtomicU64,
    /// fsync or fdatasync calls on the log, snapshots and the data directory.
    pub(crate) syncs: AtomicU64,
    /// Snapshots written.
    pub(crate) snapshots: AtomicU64,
    /// The longest the core lock was held to start a snapshot, in µs.
    pub(crate) snapshot_pause_max_us: AtomicU64,
    /// Time spent handling requests (decoded to answered or proposed,
    /// the core lock's wait included), in ns.
    pub(crate) handle_ns: AtomicU64,
    /// Batches the log writer wrote (`--fsync always`), and in ns: how long
    /// each batch's first record waited for the writer, the writes, the syncs.
    pub(crate) log_batches: AtomicU64,
    pub(crate) log_wait_ns: AtomicU64,
    pub(crate) log_write_ns: AtomicU64,
    pub(crate) log_sync_ns: AtomicU64,
    /// Of those batches, the ones that found the writer idle, and their
    /// wait (the writer's wake-up), in ns.
    pub(crate) log_batches_woken: AtomicU64,
    pub(crate) log_wake_ns: AtomicU64,
    /// Connections that sent frames held for durability, and the time from
    /// the durable mark's move to their write, in ns.
    pub(crate) durable_sends: AtomicU64,
    pub(crate) durable_send_ns: AtomicU64,
    /// How long the log's latest syncs took.
    pub(crate) recent_syncs: Mutex<RecentSyncs>,
    /// Counts by operation and result, and histograms, for Prometheus.
    pub(crate) metrics: crate::metrics::Metrics,
}

/// The durations of the log's latest syncs, for operators: one lock per
/// sync, which takes a hundred microseconds or more itself.
#[derive(Debug, Default)]
pub(crate) struct RecentSyncs {
    us: Vec<u32>,
    next: usize,
}

/// How many of the latest syncs [`RecentSyncs`] keeps.
const RECENT_SYNCS: usize = 128;

/// The log's latest syncs, summed up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecentSyncSummary {
    /// How many syncs this covers (at most 128, the latest).
    pub syncs: usize,
    pub p50_us: u32,
    pub p99_us: u32,
    pub max_us: u32,
}

impl RecentSyncs {
    fn record(&mut self, took: Duration) {
        let us = took.as_micros().min(u32::MAX as u128) as u32;
        if self.us.len() < RECENT_SYNCS {
            self.us.push(us);
        } else {
            self.us[self.next] = us;
        }
        self.next = (self.next + 1) % RECENT_SYNCS;
    }

    fn summary(&self) -> Option<RecentSyncSummary> {
        let mut sorted = self.us.clone();
        sorted.sort_unstable();
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        (!sorted.is_empty()).then(|| RecentSyncSummary {
            syncs: sorted.len(),
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: at(1.0),
        })
    }
}

/// A copy of the counters plus sizes read from the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_open: u64,
    pub requests: u64,
    pub watch_events: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub sessions_expired: u64,
    pub protocol_errors: u64,
    pub slow_client_disconnects: u64,
    pub syncs: u64,
    pub snapshots: u64,
    /// The longest the core lock was held to start a snapshot, in µs.
    pub snapshot_pause_max_us: u64,
    /// Time spent handling requests, in ns (see the server's `Stats`).
    pub handle_ns: u64,
    pub log_batches: u64,
    pub log_wait_ns: u64,
    pub log_write_ns: u64,
    pub log_sync_ns: u64,
    pub log_batches_woken: u64,
    pub log_wake_ns: u64,
    pub durable_sends: u64,
    pub durable_send_ns: u64,
    pub sessions: u64,
    pub nodes: u64,
    pub watches: u64,
    pub revision: u64,
    /// CPU time the server process has used in user mode, in microseconds.
    pub cpu_user_us: u64,
    /// CPU time the server process has used in the kernel, in microseconds.
    pub cpu_system_us: u64,
}

impl StatsSnapshot {
    /// The counters as (name, value) pairs, as the stats request reports them.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("connections_accepted", self.connections_accepted),
            ("connections_refused", self.connections_refused),
            ("connections_open", self.connections_open),
            ("requests", self.requests),
            ("watch_events", self.watch_events),
            ("bytes_in", self.bytes_in),
            ("bytes_out", self.bytes_out),
            ("sessions_expired", self.sessions_expired),
            ("protocol_errors", self.protocol_errors),
            ("slow_client_disconnects", self.slow_client_disconnects),
            ("syncs", self.syncs),
            ("snapshots", self.snapshots),
            ("snapshot_pause_max_us", self.snapshot_pause_max_us),
            ("handle_ns", self.handle_ns),
            ("log_batches", self.log_batches),
            ("log_wait_ns", self.log_wait_ns),
            ("log_write_ns", self.log_write_ns),
            ("log_sync_ns", self.log_sync_ns),
            ("log_batches_woken", self.log_batches_woken),
            ("log_wake_ns", self.log_wake_ns),
            ("durable_sends", self.durable_sends),
            ("durable_send_ns", self.durable_send_ns),
            ("sessions", self.sessions),
            ("nodes", self.nodes),
            ("watches", self.watches),
            ("revision", self.revision),
            ("cpu_user_us", self.cpu_user_us),
            ("cpu_system_us", self.cpu_system_us),
        ]
    }
}

/// CPU time used by this process so far: (user, system) in microseconds.
fn process_cpu_us() -> (u64, u64) {
    // SAFETY: getrusage writes only the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return (0, 0);
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(usage.ru_utime), us(usage.ru_stime))
}

impl Stats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Records one sync of the log that took `took`.
    pub(crate) fn log_synced(&self, took: Duration) {
        Stats::add(&self.log_sync_ns, took.as_nanos() as u64);
        self.metrics.log_sync.observe_duration(took);
        self.recent_syncs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(took);
    }

    /// The log's latest syncs, or `None` before the first.
    pub fn recent_syncs(&self) -> Option<RecentSyncSummary> {
        self.recent_syncs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .summary()
    }

    /// Adds the time since `since`, in ns.
    pub(crate) fn add_since(counter: &AtomicU64, since: std::time::Instant) {
        Stats::add(counter, since.elapsed().as_nanos() as u64);
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            connections_accepted: get(&self.connections_accepted),
            connections_refused: get(&self.connections_refused),
            connections_open: get(&self.connections_open),
            requests: get(&self.requests),
            watch_events: get(&self.events),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            sessions_expired: get(&self.sessions_expired),
            protocol_errors: get(&self.protocol_errors),
            slow_client_disconnects: get(&self.slow_client_disconnects),
            syncs: get(&self.syncs),
            snapshots: get(&self.snapshots),
            snapshot_pause_max_us: get(&self.snapshot_pause_max_us),
            handle_ns: get(&self.handle_ns),
            log_batches: get(&self.log_batches),
            log_wait_ns: get(&self.log_wait_ns),
            log_write_ns: get(&self.log_write_ns),
            log_sync_ns: get(&self.log_sync_ns),
            log_batches_woken: get(&self.log_batches_woken),
            log_wake_ns: get(&self.log_wake_ns),
            durable_sends: get(&self.durable_sends),
            durable_send_ns: get(&self.durable_send_ns),
            cpu_user_us: process_cpu_us().0,
            cpu_system_us: process_cpu_us().1,
            ..StatsSnapshot::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_syncs_keep_the_latest_128() {
        let mut r = RecentSyncs::default();
        assert_eq!(r.summary(), None);
        for us in 1..=1000u64 {
            r.record(Duration::from_micros(us));
        }
        let s = r.summary().unwrap();
        assert_eq!(s.syncs, 128);
        // The latest 128 are 873..=1000.
        assert_eq!(s.max_us, 1000);
        assert_eq!(s.p50_us, 937);
        assert_eq!(s.p99_us, 999);
    }
}
