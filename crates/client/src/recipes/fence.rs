//! Fencing tokens, and the check storage makes with them.
//!
//! # Why storage must check the token
//!
//! A lock's lease can run out while its holder is paused: a long GC pause, a
//! stopped VM, a stalled disk. The server then expires the holder's session
//! and grants the lock to the next waiter, who writes. When the first holder
//! wakes it still believes it holds the lock and writes too, over the newer
//! data. Asking "do I still hold it?" just before writing does not help: the
//! pause can fall between the question and the write.
//!
//! Every grant therefore carries a [`FencingToken`], a number that strictly
//! increases from one grant of a lock to the next. The holder sends it with
//! every write, and the storage remembers the highest token it has accepted
//! for the resource and refuses any write with a lower one, atomically with
//! the write. The woken holder's write carries the old, lower token and is
//! refused; nothing it does after its lease ran out can land.
//!
//! Where the storage is a database, the check is one conditional update:
//!
//! ```sql
//! UPDATE accounts SET balance = $3, fencing_token = $2
//!  WHERE id = $1 AND fencing_token <= $2
//! ```
//!
//! zero rows updated means the token was stale (see
//! `examples/postgres_fencing.rs`). Baton's own nodes do the same check for
//! [`Client::set_data_fenced`](crate::Client::set_data_fenced), and
//! [`FenceTracker`] is the check for storage kept in a process's memory.

use std::collections::HashMap;
use std::sync::Mutex;

/// The number that comes with a lock or leadership grant: the creation
/// revision of the holder's node, strictly greater than that of any earlier
/// grant of the same lock. Printed in decimal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for FencingToken {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(FencingToken)
    }
}

/// A write refused because a higher token was already accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented} for {resource}: token {highest} was already accepted")]
pub struct StaleToken {
    pub resource: String,
    pub presented: FencingToken,
    pub highest: FencingToken,
}

/// The highest fencing token accepted per resource, for storage that lives in
/// this process: the reference implementation of the check.
///
/// [`admit`](Self::admit) runs the write while holding the check, so a check
/// and its write are one atomic step, and a token equal to the highest is
/// accepted (one holder may write many times).
#[derive(Debug, Default)]
pub struct FenceTracker {
    highest: Mutex<HashMap<String, FencingToken>>,
}

impl FenceTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `write` if `token` is at least the highest token accepted for
    /// `resource`, and records it as the highest.
    ///
    /// # Errors
    /// [`StaleToken`] if a higher token was accepted; `write` does not run.
    pub fn admit<R>(
        &self,
        resource: &str,
        token: FencingToken,
        write: impl FnOnce() -> R,
    ) -> Result<R, StaleToken> {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        match highest.get(resource) {
            Some(&h) if token < h => Err(StaleToken {
                resource: resource.to_owned(),
                presented: token,
                highest: h,
            }),
            _ => {
                let result = write();
                highest.insert(resource.to_owned(), token);
                Ok(result)
            }
        }
    }

    /// The highest token accepted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<FencingToken> {
        self.highest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(resource)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_higher_tokens_are_admitted_lower_ones_refused() {
        let t = FenceTracker::new();
        let mut data = Vec::new();
        t.admit("r", FencingToken(5), || data.push(5)).unwrap();
        t.admit("r", FencingToken(5), || data.push(5)).unwrap();
        t.admit("r", FencingToken(8), || data.push(8)).unwrap();
        let err = t.admit("r", FencingToken(6), || data.push(6)).unwrap_err();
        assert_eq!(err.presented, FencingToken(6));
        assert_eq!(err.highest, FencingToken(8));
        assert!(err.to_string().contains("6") && err.to_string().contains("8"));
        assert_eq!(data, [5, 5, 8], "the refused write did not run");
        // Resources are independent.
        t.admit("other", FencingToken(1), || ()).unwrap();
        assert_eq!(t.highest("r"), Some(FencingToken(8)));
    }
}
