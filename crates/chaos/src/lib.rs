//! Baton's fault suite, the part that needs no server: the history a run
//! records, and the checkers that decide from that history alone whether
//! Baton kept its promises.
//!
//! A run's workers record every operation they make as an [`Op`]: what was
//! asked, when it was invoked and when it completed (on the run's own
//! monotonic clock, in nanoseconds), and what came of it: a result, a
//! definite failure (nothing was applied), or an unknown outcome (a
//! connection lost with the request in flight, a timeout: it may or may not
//! have been applied, at any time after its invocation). The checkers
//! ([`check`]) then judge the history as Jepsen's do:
//!
//! - [`register`]: each register is linearizable, by a Wing-Gong-Lowe
//!   search against a sequential model of a versioned register;
//! - [`sequential`]: registers read by sessions in the sequential read
//!   mode: what each session sees never goes back and includes its own
//!   writes, a read after a sync sees what was acknowledged before it, and
//!   every value read was written at the version read;
//! - [`fence`]: writes accepted under fencing tokens never go back
//!   (invariant 3), and overlapping critical sections are reported (they
//!   are what fencing exists for, not a failure);
//! - [`tokens`]: grants of one lock, and leaderships of one election, carry
//!   distinct tokens that grow with real time (invariants 1 and 2);
//! - [`counter`], [`queue`]: no acknowledged increment is lost, and every
//!   acknowledged item is taken exactly once;
//! - [`ephemeral`]: an ephemeral node goes only after its session ended.
//!
//! The crate has no I/O of its own beyond JSON lines; `baton chaos` runs the
//! workloads and the faults, and the simulation drives the same checkers.

pub mod counter;
pub mod ephemeral;
pub mod fence;
pub mod history;
pub mod queue;
pub mod register;
pub mod sequential;
pub mod tokens;

pub use history::{Call, History, Op, Outcome, Reply};

use serde::{Deserialize, Serialize};

/// What one checker concluded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The checker, such as `register` or `fence`.
    pub checker: String,
    /// The key (register, lock, queue) it is about.
    pub key: String,
    pub verdict: Verdict,
    /// What was found, for a person: the operations involved by id.
    pub detail: String,
    /// The operations involved, by id.
    pub ops: Vec<u64>,
}

/// A checker's verdict on one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// A promise was broken: the run fails.
    Violation,
    /// Something worth knowing that breaks no promise (overlapping critical
    /// sections under a pause, say).
    Note,
    /// The checker could not decide within its budget.
    Unknown,
}

/// Runs every checker on `history`, returning what they found (violations
/// first). An empty list: every promise held.
pub fn check(history: &History) -> Vec<Finding> {
    let mut found = Vec::new();
    found.extend(register::check(history, register::DEFAULT_BUDGET));
    found.extend(sequential::check(history));
    found.extend(fence::check(history));
    found.extend(tokens::check(history));
    found.extend(counter::check(history));
    found.extend(queue::check(history));
    found.extend(ephemeral::check(history));
    found.sort_by_key(|f| match f.verdict {
        Verdict::Violation => 0,
        Verdict::Unknown => 1,
        Verdict::Note => 2,
    });
    found
}

/// Whether any finding breaks a promise.
pub fn violated(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.verdict == Verdict::Violation)
}
