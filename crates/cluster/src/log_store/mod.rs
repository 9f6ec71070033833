//! The replicated log on disk, in Baton's own log format.
//!
//! # Files (in the member's `raft/` directory)
//! ```text
//! log-<first index, 20 digits>.seg   segments: a format-2 segment header
//!                                    (kind 1, "replicated"), then batches of
//!                                    framed records, one batch per write;
//!                                    each record's payload is one log entry
//!                                    (bincode: log id, then the payload)
//! votes                              the vote, in two 64-byte slots written
//!                                    in turn in place: each a framed record
//!                                    of (sequence u64, vote), the valid one
//!                                    with the higher sequence counting
//! vote                               the vote as earlier members kept it (one
//!                                    framed record, replaced whole): read
//!                                    only if `votes` is missing
//! committed                          the last committed log id (a hint:
//!                                    written in place, never synced)
//! purged                             the last purged log id
//! ```
//! Every entry is kept in memory as well (the log is purged behind
//! snapshots, so it stays short); the files are for restarts.
//!
//! Each append is written as one batch and synced before it is reported
//! flushed, on the calling task's thread (openraft waits for it anyway).
//! Recovery drops a torn last batch of the last segment (it was never
//! reported flushed) and refuses any other damage, naming the file and
//! offset.
//!
//! - `writer.rs`: segments and batches written and synced;
//! - `recovery.rs`: the log read back at start;
//! - `votes.rs`: the vote's two slots;
//! - `files.rs`: small files written whole, and directory syncs;
//! - `error.rs`: why the log could not be read or written.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use baton_state::format::{record, segment, FsyncPolicy};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogId, RaftLogReader, StorageIOError};
use tracing::warn;

use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

mod error;
mod files;
mod recovery;
mod votes;
mod writer;

use files::{encode_small, read_small, write_atomic};
use recovery::{recover, Repair};
use votes::{create_votes, open_votes, read_votes, Votes};
use writer::{Writer, SEGMENT_BYTES};

pub use error::{BatchDamage, SegmentDamage, StoreError};
pub use recovery::stored_members;

/// `e` as openraft's storage error: its message first, then those of its
/// sources.
fn io_error(
    verb: ErrorVerb,
    subject: ErrorSubject<u64>,
    e: &(dyn std::error::Error + 'static),
) -> StorageError {
    // openraft keeps an error as text: the message alone, which names its
    // cause already.
    StorageError::IO {
        source: StorageIOError::new(subject, verb, openraft::AnyError::error(e)),
    }
}

fn log_error(verb: ErrorVerb, e: &(dyn std::error::Error + 'static)) -> StorageError {
    io_error(verb, ErrorSubject::Logs, e)
}

/// The replicated log of one member. Cheap to clone: clones share it.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
    writer: Mutex<Writer>,
    /// The `votes` file, once there is one.
    votes: Mutex<Option<Votes>>,
}

struct State {
    entries: BTreeMap<u64, Entry>,
    purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

/// Runs file I/O on the calling task's thread. openraft (0.9) waits for
/// each write of the log to be durable before it goes on, so handing the
/// write to another thread would only add two wake-ups to every commit; on
/// a multi-threaded runtime the thread's other tasks move to another thread
/// meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl LogStore {
    /// Opens (or creates) the replicated log in `dir`, recovering what it
    /// holds.
    ///
    /// # Errors
    /// Damage in the log other than a torn last write, or an I/O error,
    /// each naming the file.
    pub fn open(dir: &Path, fsync: FsyncPolicy) -> Result<LogStore, StoreError> {
        Self::open_with_segments_of(dir, fsync, SEGMENT_BYTES)
    }

    /// As [`open`](Self::open), starting a new segment past `segment_bytes`
    /// (for tests of the rotation).
    #[doc(hidden)]
    pub fn open_with_segments_of(
        dir: &Path,
        fsync: FsyncPolicy,
        segment_bytes: u64,
    ) -> Result<LogStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io("creating", dir, e))?;
        // The vote: from `votes`, or, in a directory an earlier member
        // kept, from `vote`, moved into a `votes` file now (if no file can
        // be made now, at the next vote).
        let (vote, votes) = match read_votes(&dir.join("votes"))? {
            Some((seq, vote)) => (vote, Some(open_votes(&dir.join("votes"), seq)?)),
            None => {
                let vote: Option<Vote> = read_small(&dir.join("vote"))?;
                let votes = create_votes(dir, vote.as_ref())
                    .map_err(|e| warn!("the vote stays where it is for now: {e}"))
                    .ok();
                (vote, votes)
            }
        };
        // Both are written as an Option of a log id.
        let purged: Option<LogId> = read_small::<Option<LogId>>(&dir.join("purged"))?.flatten();
        let recovered = recover(dir, purged.map(|p| p.index), Repair::Yes)?;
        // The committed id is a hint, overwritten in place and never synced:
        // a damaged one is dropped, and one past the end of the log (whose
        // tail a power loss took) is cut back to the last entry, which is
        // committed as the log is a prefix of what it was.
        let committed = match read_small::<Option<LogId>>(&dir.join("committed")) {
            Ok(c) => c.flatten(),
            Err(e) => {
                warn!("ignoring the committed log id: {e}");
                None
            }
        };
        let last = recovered
            .entries
            .values()
            .next_back()
            .map(|e| *e.get_log_id())
            .or(purged);
        let committed = match (committed, last) {
            (Some(c), Some(l)) if c.index > l.index => Some(l),
            (Some(_), None) => None,
            (c, _) => c,
        };
        let state = State {
            entries: recovered.entries,
            purged,
            vote,
            committed,
        };
        let writer = Writer {
            dir: dir.to_owned(),
            fsync,
            segment_bytes,
            segments: recovered.segments,
            current: None,
            committed: None,
            broken: None,
            overfull: false,
        };
        Ok(LogStore {
            inner: Arc::new(Inner {
                dir: dir.to_owned(),
                state: Mutex::new(state),
                writer: Mutex::new(writer),
                votes: Mutex::new(votes),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.inner.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last log id in the log (or the last purged one).
    pub fn last_log_id(&self) -> Option<LogId> {
        let st = self.state();
        st.entries
            .values()
            .next_back()
            .map(|e| *e.get_log_id())
            .or(st.purged)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let st = self.state();
        Ok(st.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let st = self.state();
        let last = st
            .entries
            .values()
            .next_back()
            .map(|e| *e.get_log_id())
            .or(st.purged);
        Ok(LogState {
            last_purged_log_id: st.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let dir = &self.inner.dir;
        blocking(|| {
            let mut votes = self.inner.votes.lock().unwrap_or_else(|e| e.into_inner());
            match votes.as_mut() {
                Some(v) => v.save(vote, &dir.join("votes")),
                None => {
                    *votes = Some(create_votes(dir, Some(vote))?);
                    Ok(())
                }
            }
        })
        .map_err(|e| io_error(ErrorVerb::Write, ErrorSubject::Vote, &e))?;
        self.state().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.state().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Overwritten in place, never synced: a member that restarts without
        // it learns it again from its leader.
        self.state().committed = committed;
        self.writer().write_committed(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.state().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = Vec::new();
        let start = segment::begin_batch(&mut batch);
        let mut indexes = Vec::new();
        {
            let mut st = self.state();
            for entry in entries {
                let index = entry.get_log_id().index;
                let mut encoded = Ok(());
                record::frame(&mut batch, |out| {
                    encoded = bincode::serialize_into(out, &entry);
                });
                encoded.map_err(|e| log_error(ErrorVerb::Write, &e))?;
                st.entries.insert(index, entry);
                indexes.push(index);
            }
        }
        if indexes.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        segment::end_batch(&mut batch, start);
        let result = blocking(|| self.writer().append(&indexes, &batch));
        if let Err(e) = &result {
            tracing::error!("the replicated log can no longer be written: {e}");
        }
        callback.log_io_completed(result.map_err(std::io::Error::other));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.state().entries.split_off(&log_id.index);
        blocking(|| self.writer().truncate(log_id.index))
            .map_err(|e| log_error(ErrorVerb::Write, &e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let path = self.inner.dir.join("purged");
        let bytes = encode_small(&Some(log_id));
        blocking(|| write_atomic(&self.inner.dir, &path, &bytes, true))
            .map_err(|e| log_error(ErrorVerb::Delete, &e))?;
        {
            let mut st = self.state();
            let kept = st.entries.split_off(&(log_id.index + 1));
            st.entries = kept;
            st.purged = Some(log_id);
        }
        blocking(|| self.writer().purge(log_id.index)).map_err(|e| log_error(ErrorVerb::Delete, &e))
    }
}
