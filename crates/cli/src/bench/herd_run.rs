//! What a herd run measures, shared by the run and its chart.

use serde::Serialize;

/// How contenders wait for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recipe {
    /// Baton's lock: each waiter watches its predecessor alone.
    Predecessor,
    /// The naive lock: every waiter watches the lock's children and checks
    /// again on every change.
    WatchAll,
    /// No queue: retry a non-blocking acquire every --poll-ms, as a loop
    /// around Redis `SET NX` does.
    Poll,
    /// Baton's read-write lock: one contender in four writes, the others
    /// read; readers share, each contender is woken once per grant.
    Rwlock,
    /// Baton's semaphore with --permits permits: each permit that comes
    /// free wakes the first waiter alone.
    Semaphore,
}

impl Recipe {
    pub(super) fn name(self) -> &'static str {
        match self {
            Recipe::Predecessor => "predecessor",
            Recipe::WatchAll => "watch-all",
            Recipe::Poll => "poll",
            Recipe::Rwlock => "rwlock",
            Recipe::Semaphore => "semaphore",
        }
    }
}

/// The path of a change through the server, from the server's counters:
/// handling (decode, apply, queue the answers), the log writer (waiting for
/// it, writing, syncing; `--fsync always` only), and the time from the
/// durable mark's move to the held frames' write.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Split {
    pub handle_us_per_handover: f64,
    pub log_batches_per_handover: f64,
    pub log_wait_us_per_batch: f64,
    /// Share of the batches that found the log writer idle, and its
    /// wake-up for those.
    pub log_woken_fraction: f64,
    pub log_wake_us: f64,
    pub log_write_us_per_batch: f64,
    pub log_sync_us_per_batch: f64,
    pub durable_send_us: f64,
}

/// One run's results.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub recipe: Recipe,
    pub waiters: usize,
    pub handovers: u64,
    pub seconds: f64,
    pub handovers_per_s: f64,
    pub wait_us_p50: f64,
    pub wait_us_p99: f64,
    pub wait_us_max: f64,
    pub notifications_per_handover: f64,
    pub server_bytes_per_handover: f64,
    pub server_cpu_us_per_handover: f64,
    /// Server CPU time while the queue formed (every waiter joining, and
    /// the grants made meanwhile), per waiter. A run that counts the
    /// joining in its handovers pays about this times waiters / handovers
    /// more per handover.
    pub server_cpu_us_per_join: f64,
    /// Seconds from the first contender's start until every waiter had
    /// joined the queue (the queue's formation; not in the handovers).
    pub join_seconds: f64,
    /// Opening the waiters' sessions, before any joined: seconds, and the
    /// server's CPU time per session.
    pub open_seconds: f64,
    pub server_cpu_us_per_open: f64,
    /// Where a handover's time goes on the server (see [`Split`]).
    pub split: Split,
    pub fifo_fraction: f64,
    pub violations: u64,
    /// The run ended at --max-seconds before reaching --handovers.
    pub timed_out: bool,
    /// Why the run could not be measured, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    pub floor_rtt_us: f64,
    pub floor_fdatasync_us: f64,
}
