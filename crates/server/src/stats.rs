//! Counters the server keeps about itself, for tests, tools and operators.

use std::sync::atomic::{AtomicU64, Ordering};

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
    pub sessions: u64,
    pub nodes: u64,
    pub watches: u64,
    pub revision: u64,
}

impl Stats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
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
            ..StatsSnapshot::default()
        }
    }
}
