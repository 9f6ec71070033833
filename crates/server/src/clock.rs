//! The time a call into the core happens at. The core reads no clock of its
//! own: its callers read the real clocks, and a simulation reads its own.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The time a call into the core happens at, on both clocks: the
/// monotonic instant that sessions' liveness and expiry count from, and the
/// wall-clock time (milliseconds since the Unix epoch) stamped on the
/// changes it proposes. The caller reads them (the real clocks, or a
/// simulation's): the core reads no clock of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Now {
    pub(crate) at: Instant,
    pub(crate) wall_ms: u64,
}

impl Now {
    /// The clocks as they are: tokio's monotonic clock (which a test's
    /// paused runtime controls) and the system's wall clock.
    pub(crate) fn real() -> Now {
        Now {
            at: Instant::now(),
            wall_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }
}
