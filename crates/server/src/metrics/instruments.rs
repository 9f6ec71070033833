//! What the server measures beyond its plain counters, kept where the hot
//! path can add to it: counters per operation and result, and fixed-bucket
//! histograms, all relaxed atomics. It depends on nothing else in the
//! server; [`scrape`](super::scrape) reads it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_proto::ErrorCode;

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

    /// The histogram as it stands, its values divided by `scale` (1e9 to
    /// give nanoseconds in seconds): each bucket's upper bound (`f64::MAX`
    /// for the last) and count, the count of all, and the sum.
    pub(crate) fn read(&self, scale: f64) -> (Vec<(f64, u64)>, u64, f64) {
        let mut buckets = Vec::with_capacity(self.counts.len());
        let mut count = 0;
        for (i, c) in self.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            count += n;
            let bound = self.bounds.get(i).map_or(f64::MAX, |&b| b as f64 / scale);
            buckets.push((bound, n));
        }
        (
            buckets,
            count,
            self.sum.load(Ordering::Relaxed) as f64 / scale,
        )
    }
}

/// Operations by wire number (0 for one the server does not know).
pub(crate) const OPS: usize = baton_proto::OpCode::LAST as usize + 1;
/// Results: 0 for success, then the error codes by wire number, then one
/// for any other code.
pub(crate) const RESULTS: usize = 28;

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
    /// Persistent watches set again after a revision whose events the
    /// history no longer held (answered with a `compacted` event).
    pub(crate) watch_history_compacted: AtomicU64,
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
            watch_history_compacted: AtomicU64::new(0),
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

    /// Replies counted to operation `op` (by wire number) with `result` (0
    /// for success, then error codes by wire number).
    pub(crate) fn replies(&self, op: usize, result: usize) -> u64 {
        self.replies[op * RESULTS + result].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation the protocol knows is counted under its own number,
    /// not as an unknown one.
    #[test]
    fn every_known_operation_has_its_own_counters() {
        for op in 0..=u8::MAX {
            if baton_proto::OpCode::from_u8(op).is_some() {
                assert!((op as usize) < OPS, "operation {op} is past OPS = {OPS}");
            }
        }
    }

    /// Every error code the protocol knows is counted under its own
    /// number, not with the codes it does not know.
    #[test]
    fn every_known_error_code_has_its_own_counters() {
        for code in 1..=u16::MAX {
            if !matches!(
                baton_proto::ErrorCode::from_u16(code),
                baton_proto::ErrorCode::Unknown(_)
            ) {
                assert!(
                    (code as usize) < RESULTS - 1,
                    "error code {code} is counted as another (RESULTS = {RESULTS})"
                );
            }
        }
    }

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
}
