//! What a chaos run keeps: its clock, its history (written as it goes),
//! and its source of choices.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_chaos::history::{Call, Fault, History, Op, Outcome, Reply};

/// Records operations and faults, on the run's own monotonic clock, to
/// memory and to the history file (a line each, as they happen, so that a
/// run cut short still leaves what it did).
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

struct Inner {
    start: Instant,
    next_id: AtomicU64,
    history: Mutex<History>,
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl Recorder {
    pub fn new(path: &std::path::Path) -> std::io::Result<Recorder> {
        let file = std::fs::File::create(path)?;
        Ok(Recorder {
            inner: Arc::new(Inner {
                start: Instant::now(),
                next_id: AtomicU64::new(1),
                history: Mutex::new(History::default()),
                file: Mutex::new(std::io::BufWriter::new(file)),
            }),
        })
    }

    /// Nanoseconds since the run began.
    pub fn now(&self) -> u64 {
        self.at(Instant::now())
    }

    /// `when` in nanoseconds since the run began (0 if before).
    pub fn at(&self, when: Instant) -> u64 {
        when.saturating_duration_since(self.inner.start).as_nanos() as u64
    }

    /// A fresh value no write has used: the id the next operation gets.
    pub fn unique(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Records an operation that has completed.
    pub fn op(&self, process: u64, key: &str, call: Call, invoked_ns: u64, outcome: Outcome) {
        let op = Op {
            id: self.unique(),
            process,
            key: key.to_owned(),
            call,
            invoked_ns,
            completed_ns: self.now().max(invoked_ns),
            outcome,
        };
        self.keep(&History::op_line(&op));
        lock(&self.inner.history).ops.push(op);
    }

    /// Records a fault (or another event for the timeline), now.
    pub fn fault(&self, what: impl Into<String>) {
        let fault = Fault {
            at_ns: self.now(),
            what: what.into(),
        };
        self.keep(&History::fault_line(&fault));
        lock(&self.inner.history).faults.push(fault);
    }

    fn keep(&self, line: &str) {
        let mut file = lock(&self.inner.file);
        let _ = writeln!(file, "{line}");
    }

    /// The history so far, its file flushed.
    pub fn history(&self) -> History {
        let _ = lock(&self.inner.file).flush();
        lock(&self.inner.history).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a client error says of an operation's outcome: a refusal the
/// server answered (the request was handled and changed nothing) is a
/// failure; anything else (the connection lost, the session gone, a wait
/// given up) leaves it unknown.
pub fn outcome_of(e: &baton_client::Error) -> Outcome {
    use baton_client::Error as E;
    match e {
        E::NoNode(_)
        | E::NodeExists(_)
        | E::NotEmpty(_)
        | E::InvalidPath(_)
        | E::ValueTooLarge(_)
        | E::BadArguments(_)
        | E::PermissionDenied(_) => Outcome::Fail { why: e.to_string() },
        E::BadVersion(_) => Outcome::Ok {
            reply: Reply::CasRefused,
        },
        E::StaleFence(_) => Outcome::Ok {
            reply: Reply::Stale,
        },
        _ => Outcome::Unknown { why: e.to_string() },
    }
}

/// How long one operation may take before its outcome counts as unknown.
pub const OP_LIMIT: Duration = Duration::from_secs(5);

/// Runs `op` within [`OP_LIMIT`]: its result, or an unknown outcome.
pub async fn within<T>(
    op: impl std::future::Future<Output = baton_client::Result<T>>,
) -> Result<T, Outcome> {
    match tokio::time::timeout(OP_LIMIT, op).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(outcome_of(&e)),
        Err(_) => Err(Outcome::Unknown {
            why: format!("no answer within {} s", OP_LIMIT.as_secs()),
        }),
    }
}

/// A seeded source of choices (SplitMix64): the same seed, the same
/// choices, so a run's faults and operations can be made again.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Another source, for a worker, derived from this one and `salt`.
    pub fn fork(&self, salt: u64) -> Rng {
        let mut r = Rng(self.0 ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        r.next();
        r
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `percent` in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration in `[low, high)`.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = high.saturating_sub(low).as_millis() as u64;
        low + Duration::from_millis(self.below(span.max(1)))
    }
}
