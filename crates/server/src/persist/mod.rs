//! Durability: a write-ahead log of applied commands, snapshots, recovery,
//! and the durable mark that holds back replies until their change is safe.
//!
//! Every change the state machine applies is appended, under the core lock
//! and so in apply order, to an in-memory queue. A committer thread writes
//! the queue out and syncs it (one `fdatasync` for everything queued
//! meanwhile: group commit), then advances the durable mark. Replies and
//! watch events carry the revision they reflect, and a connection sends them
//! only once the mark has reached it (invariant 9 of docs/design.md).
//!
//! Files in the data directory:
//! - `wal-<first revision>.log`: log segments (see `segment` and [`record`]
//!   for the format);
//! - `snapshot-<revision>.snap`: snapshots (see [`snapshot`]);
//! - `LOCK`: held by the running server.

pub mod disk_faults;
mod log;
mod recovery;
pub mod restore;
pub mod snapshot;

pub use baton_state::format::{record, segment, FsyncPolicy};

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use log::Wal;
pub use recovery::{recover, Recovery};

use crate::outbox::Outbox;
use crate::stats::Stats;

/// Why the durable state cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PersistError {
    #[error("{what}: {}: {source}", file.display())]
    Io {
        file: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("{} is damaged at byte offset {offset}: {what}. The server does not start on a damaged log and changed nothing; restore the data directory from a copy, or move the file away to start from what remains", file.display())]
    Corrupt {
        file: PathBuf,
        offset: u64,
        what: String,
    },
}

impl PersistError {
    pub(crate) fn io(file: &Path, what: &'static str, source: io::Error) -> Self {
        PersistError::Io {
            file: file.to_owned(),
            what,
            source,
        }
    }
}

/// Syncs a directory, so that files created or renamed in it stay.
pub(crate) fn sync_dir(dir: &Path, stats: &Stats) -> Result<(), PersistError> {
    Stats::add(&stats.syncs, 1);
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| PersistError::io(dir, "syncing the data directory", e))
}

/// The highest revision that is durable, and the connections waiting for it
/// to pass the revision of something they queued.
#[derive(Debug)]
pub(crate) struct DurableMark {
    revision: AtomicU64,
    waiters: Mutex<Vec<Arc<Outbox>>>,
    /// The log failed: the mark never moves again (set under `waiters`).
    stopped: std::sync::atomic::AtomicBool,
    /// When the mark last moved, in ns since `born` (for the stats).
    moved_ns: AtomicU64,
    born: std::time::Instant,
    /// Writes what is queued, under `--fsync never` (see [`Self::hurry`]).
    flusher: std::sync::OnceLock<log::Flusher>,
}

impl DurableMark {
    /// A mark at `revision`. An in-memory server uses `u64::MAX`: everything
    /// is as durable as it will ever be at once.
    pub(crate) fn new(revision: u64) -> Self {
        DurableMark {
            revision: AtomicU64::new(revision),
            waiters: Mutex::new(Vec::new()),
            stopped: std::sync::atomic::AtomicBool::new(false),
            moved_ns: AtomicU64::new(0),
            born: std::time::Instant::now(),
            flusher: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn set_flusher(&self, flusher: log::Flusher) {
        let _ = self.flusher.set(flusher);
    }

    /// Moves the mark past what this thread applied, if the log can do it
    /// here and now: under `--fsync never`, the changes a connection made
    /// are written by that connection once it has let go of the core's
    /// lock. Called where a thread is about to wait for the mark.
    pub(crate) fn hurry(&self) {
        if let Some(flusher) = self.flusher.get() {
            flusher.flush();
        }
    }

    /// How long ago the mark last moved, in ns.
    pub(crate) fn since_moved_ns(&self) -> u64 {
        (self.born.elapsed().as_nanos() as u64)
            .saturating_sub(self.moved_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn get(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    /// Has `outbox` woken when the mark moves, if it has not reached
    /// `revision` yet. Returns false (registering nothing) if it has, or if
    /// the mark has stopped for good ([`Self::stop`]): then no wake-up will
    /// come for it.
    pub(crate) fn wake_at(&self, revision: u64, outbox: &Arc<Outbox>) -> bool {
        if self.get() >= revision {
            return false;
        }
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        // Checked again under the lock that `advance` and `stop` take: a
        // wake-up cannot fall between the check and the registration.
        if self.get() >= revision || self.stopped() {
            return false;
        }
        if outbox.set_awaiting_durability() {
            waiters.push(outbox.clone());
        }
        true
    }

    /// The log failed: the mark never moves again. Every waiting
    /// connection is woken, to find that what it waits for will never be
    /// durable (and so never sent).
    pub(crate) fn stop(&self) {
        let waiters = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            self.stopped.store(true, Ordering::Release);
            std::mem::take(&mut *waiters)
        };
        for outbox in waiters {
            outbox.durability_reached();
        }
    }

    /// Whether the mark has stopped for good.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Moves the mark to `revision` and wakes every waiting connection.
    pub(crate) fn advance(&self, revision: u64) {
        self.moved_ns
            .store(self.born.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.revision.fetch_max(revision, Ordering::AcqRel);
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|e| e.into_inner()));
        for outbox in waiters {
            outbox.durability_reached();
        }
    }
}
