//! Figures per lock, for operators: how often it was granted, how long
//! holders held it and waiters waited.
//!
//! A lock here is a parent whose children queue with queue watches (the
//! lock, read-write lock, semaphore and election recipes). A grant is a
//! queue node coming to head its queue while its session waits on this
//! server: at its enqueue, or when what it waited for goes. A lock has one
//! holder at a time, or several when they share it (readers, permits). Like the queue watches, these figures belong to this
//! server and not to the state machine; a new leader starts counting afresh.

use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

use crate::clock::Now;

use crate::state::StateMachine;

/// Most locks followed at once. Past it, locks nobody holds are forgotten
/// to make room; while every one is held, a new lock is not followed.
const MAX_LOCKS: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct LockBoard {
    locks: HashMap<Arc<str>, Figures>,
    /// How many of them have a holder now.
    held: usize,
}

#[derive(Debug, Default)]
struct Figures {
    grants: u64,
    /// Summed over grants: from the node's creation to its grant, in ms.
    wait_ms: u64,
    /// Holds that ended, and their summed length in ns.
    holds: u64,
    hold_ns: u64,
    /// The holders now, by node.
    holders: HashMap<Arc<str>, Holder>,
}

#[derive(Debug)]
struct Holder {
    token: u64,
    since: Instant,
}

impl Figures {
    fn end_hold(&mut self, holder: Holder, now: Instant) {
        self.holds += 1;
        self.hold_ns += now.saturating_duration_since(holder.since).as_nanos() as u64;
    }
}

/// One lock as `baton locks --all`, the status probe and the metrics show
/// it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LockView {
    pub(crate) lock: Arc<str>,
    /// Nodes in the queue now, the holders' included.
    pub(crate) queue: u64,
    /// Holders now: one for an exclusive lock that is held, more when
    /// readers or permit holders share it.
    pub(crate) holders: u64,
    /// The newest holder's fencing token, if the lock is held.
    pub(crate) token: Option<u64>,
    pub(crate) grants: u64,
    /// Summed waits from enqueue to grant, in seconds.
    pub(crate) wait_seconds: f64,
    /// Holds that ended, and their summed length in seconds.
    pub(crate) holds: u64,
    pub(crate) hold_seconds: f64,
    /// The lock's lock-delay, in ms (0: none).
    pub(crate) lock_delay_ms: u32,
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl LockBoard {
    /// `node` (created at wall-clock `created_ms`, token `token`) heads its
    /// queue as of `now`; `exclusive` if it joined as the only holder.
    pub(crate) fn granted(
        &mut self,
        node: &Arc<str>,
        exclusive: bool,
        token: u64,
        created_ms: u64,
        now: Now,
    ) {
        let lock = parent(node);
        if !self.locks.contains_key(lock) && self.locks.len() >= MAX_LOCKS {
            if self.held >= self.locks.len() {
                return; // every one is held: nothing to forget
            }
            self.locks.retain(|_, f| !f.holders.is_empty());
        }
        let figures = match self.locks.get_mut(lock) {
            Some(f) => f,
            None => self.locks.entry(Arc::from(lock)).or_default(),
        };
        if figures.holders.contains_key(node) {
            return; // told again (an enqueue sent again): one grant
        }
        if figures.holders.is_empty() {
            self.held += 1;
        } else if exclusive {
            // The previous holders' nodes are still there (a grant after a
            // failover, say): their holds end now.
            for (_, old) in std::mem::take(&mut figures.holders) {
                figures.end_hold(old, now.at);
            }
        }
        figures.grants += 1;
        figures.wait_ms += now.wall_ms.saturating_sub(created_ms);
        figures.holders.insert(
            node.clone(),
            Holder {
                token,
                since: now.at,
            },
        );
    }

    /// `path` was deleted at `now`: if it held its lock, the hold ends.
    pub(crate) fn deleted(&mut self, path: &str, now: Instant) {
        let Some(figures) = self.locks.get_mut(parent(path)) else {
            return;
        };
        if let Some(old) = figures.holders.remove(path) {
            figures.end_hold(old, now);
            if figures.holders.is_empty() {
                self.held -= 1;
            }
        }
    }

    /// The `n` busiest locks: longest queue first, then most grants.
    pub(crate) fn busiest(&self, sm: &StateMachine, n: usize) -> Vec<LockView> {
        let mut views: Vec<LockView> = self
            .locks
            .iter()
            .map(|(lock, f)| LockView {
                lock: lock.clone(),
                queue: sm.node(lock).map_or(0, |p| p.child_count() as u64),
                holders: f.holders.len() as u64,
                token: f.holders.values().map(|h| h.token).max(),
                grants: f.grants,
                wait_seconds: f.wait_ms as f64 / 1e3,
                holds: f.holds,
                hold_seconds: f.hold_ns as f64 / 1e9,
                lock_delay_ms: sm.lock_delay(lock).unwrap_or(0),
            })
            .collect();
        views.sort_by(|a, b| {
            (b.queue, b.grants)
                .cmp(&(a.queue, a.grants))
                .then_with(|| a.lock.cmp(&b.lock))
        });
        views.truncate(n);
        views
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The time `ms` milliseconds after `start`, on both clocks.
    fn at(start: Instant, ms: u64) -> Now {
        Now {
            at: start + std::time::Duration::from_millis(ms),
            wall_ms: 1_000 + ms,
        }
    }

    #[test]
    fn a_grant_and_a_release_make_one_hold() {
        let mut board = LockBoard::default();
        let start = Instant::now();
        let a: Arc<str> = Arc::from("/locks/job/lock-0000000005");
        let b: Arc<str> = Arc::from("/locks/job/lock-0000000007");
        board.granted(&a, true, 5, 1_000, at(start, 0));
        board.deleted("/locks/other/lock-0000000005", at(start, 100).at);
        board.deleted("/locks/job/lock-0000000006", at(start, 100).at);
        board.deleted(&a, at(start, 400).at);
        board.granted(&b, true, 7, 1_000, at(start, 250));
        let sm = StateMachine::new();
        let views = board.busiest(&sm, 10);
        assert_eq!(views.len(), 1);
        let v = &views[0];
        assert_eq!(&*v.lock, "/locks/job");
        assert_eq!((v.grants, v.holds, v.token), (2, 1, Some(7)));
        assert_eq!(v.wait_seconds, 0.25);
        assert_eq!(v.hold_seconds, 0.4);
    }

    #[test]
    fn the_board_stays_bounded_and_forgets_idle_locks_first() {
        let mut board = LockBoard::default();
        let now = at(Instant::now(), 0);
        for i in 0..MAX_LOCKS {
            let node: Arc<str> = Arc::from(format!("/l{i}/n").as_str());
            board.granted(&node, true, 1, 0, now);
            if i % 2 == 0 {
                board.deleted(&node, now.at);
            }
        }
        assert_eq!(board.len(), MAX_LOCKS);
        board.granted(&Arc::from("/new/n"), true, 1, 0, now);
        assert_eq!(board.len(), MAX_LOCKS / 2 + 1);
        assert_eq!(board.held, MAX_LOCKS / 2 + 1);
        // Full of held locks: a new one is not followed, and costs no scan.
        let mut full = LockBoard::default();
        for i in 0..MAX_LOCKS {
            full.granted(&Arc::from(format!("/h{i}/n").as_str()), true, 1, 0, now);
        }
        full.granted(&Arc::from("/late/n"), true, 1, 0, now);
        assert_eq!((full.len(), full.held), (MAX_LOCKS, MAX_LOCKS));
    }

    #[test]
    fn parents_of_paths() {
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
    }
}
