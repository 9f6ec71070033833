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
//! Recovery drops
//! a torn last batch of the last segment (it was never reported flushed)
//! and refuses any other damage, naming the file and offset.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use baton_server::persist::disk_faults;
use baton_state::format::record::{self, Frame};
use baton_state::format::segment::{self, Kind, LayoutError};
use baton_state::format::FsyncPolicy;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogId, RaftLogReader, StorageIOError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::warn;

use crate::types::{Entry, LogId, Member, NodeId, StorageError, TypeConfig, Vote};

/// A segment is closed and a new one started past this size.
const SEGMENT_BYTES: u64 = 64 << 20;
/// With `--fsync always`, the last segment grows this much at a time,
/// written with zeros and synced once: a sync of an append then flushes
/// only the append, not the file's new size as well (which takes the file
/// system's journal and about doubles the time of each sync).
const PREALLOCATE: u64 = 1 << 20;

fn segment_name(first: u64) -> String {
    format!("log-{first:020}.seg")
}

fn io_error(
    verb: ErrorVerb,
    subject: ErrorSubject<u64>,
    e: impl std::fmt::Display,
) -> StorageError {
    StorageError::IO {
        source: StorageIOError::new(subject, verb, openraft::AnyError::error(e.to_string())),
    }
}

fn log_error(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
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

/// The `votes` file: two slots, written in turn, so that a vote is saved
/// without creating a file (a member whose file system is out of inodes
/// still votes) and a write torn half way leaves the vote before it.
struct Votes {
    file: File,
    /// The sequence number of the vote last written.
    seq: u64,
}

/// The size of a slot of `votes`.
const VOTE_SLOT: usize = 64;

/// One slot of `votes`: a framed record of the sequence number and the
/// vote, padded with zeros.
fn vote_slot(seq: u64, vote: Option<&Vote>) -> [u8; VOTE_SLOT] {
    let mut framed = Vec::with_capacity(VOTE_SLOT);
    let payload = bincode::serialize(&(seq, vote)).expect("a vote serializes");
    record::frame(&mut framed, |o| o.extend_from_slice(&payload));
    let mut slot = [0u8; VOTE_SLOT];
    slot[..framed.len()].copy_from_slice(&framed);
    slot
}

/// The vote `votes` holds, with its sequence number; `None` if there is no
/// such file.
fn read_votes(path: &Path) -> Result<Option<(u64, Option<Vote>)>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let best = bytes
        .chunks(VOTE_SLOT)
        .take(2)
        .filter_map(|slot| match record::read_frame(slot) {
            Frame::Whole { payload, .. } => {
                bincode::deserialize::<(u64, Option<Vote>)>(payload).ok()
            }
            _ => None,
        })
        .max_by_key(|(seq, _)| *seq);
    match best {
        Some(best) => Ok(Some(best)),
        None => Err(format!(
            "{} is damaged (neither of its slots holds a vote); restore the data directory from a copy, or wipe it to have the member catch up from the others",
            path.display()
        )),
    }
}

/// Makes the `votes` file, holding `vote` (in one step: a temporary file
/// renamed into place), and opens it for the votes to come.
fn create_votes(dir: &Path, vote: Option<&Vote>) -> Result<Votes, String> {
    let path = dir.join("votes");
    let mut bytes = vote_slot(0, vote).to_vec();
    bytes.extend_from_slice(&[0u8; VOTE_SLOT]);
    write_atomic(dir, &path, &bytes, true)?;
    // The vote as earlier members kept it would only mislead a reader now.
    let _ = std::fs::remove_file(dir.join("vote"));
    open_votes(&path, 0)
}

fn open_votes(path: &Path, seq: u64) -> Result<Votes, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(|file| Votes { file, seq })
        .map_err(|e| format!("opening {}: {e}", path.display()))
}

impl Votes {
    /// Writes `vote` over the older slot, and syncs it.
    fn save(&mut self, vote: &Vote, path: &Path) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let seq = self.seq + 1;
        let slot = vote_slot(seq, Some(vote));
        let at = (seq % 2) * VOTE_SLOT as u64;
        let written = match disk_faults::torn_write(slot.len()) {
            Some(part) => self
                .file
                .write_all_at(&slot[..part], at)
                .and_then(|()| Err(disk_faults::no_space())),
            None => self.file.write_all_at(&slot, at),
        };
        written
            .and_then(|()| {
                disk_faults::before_sync();
                self.file.sync_data()
            })
            .map_err(|e| format!("writing the vote to {}: {e}", path.display()))?;
        self.seq = seq;
        Ok(())
    }
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
    pub fn open(dir: &Path, fsync: FsyncPolicy) -> Result<LogStore, String> {
        Self::open_with_segments_of(dir, fsync, SEGMENT_BYTES)
    }

    /// As [`open`](Self::open), starting a new segment past `segment_bytes`
    /// (for tests of the rotation).
    #[doc(hidden)]
    pub fn open_with_segments_of(
        dir: &Path,
        fsync: FsyncPolicy,
        segment_bytes: u64,
    ) -> Result<LogStore, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
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
        .map_err(|e| io_error(ErrorVerb::Write, ErrorSubject::Vote, e))?;
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
                encoded.map_err(|e| log_error(ErrorVerb::Write, e))?;
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
            .map_err(|e| log_error(ErrorVerb::Write, e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let path = self.inner.dir.join("purged");
        let bytes = encode_small(&Some(log_id));
        blocking(|| write_atomic(&self.inner.dir, &path, &bytes, true))
            .map_err(|e| log_error(ErrorVerb::Delete, e))?;
        {
            let mut st = self.state();
            let kept = st.entries.split_off(&(log_id.index + 1));
            st.entries = kept;
            st.purged = Some(log_id);
        }
        blocking(|| self.writer().purge(log_id.index)).map_err(|e| log_error(ErrorVerb::Delete, e))
    }
}

/// Where a segment's entries are: its first index, and for each entry the
/// offset of the batch it is in.
#[derive(Debug)]
struct SegmentInfo {
    first: u64,
    path: PathBuf,
    /// Entry index -> offset of the batch holding it.
    batches: BTreeMap<u64, u64>,
    /// Where its data ends.
    len: u64,
    /// The file's length: past `len` the last segment holds zeros, space
    /// written ahead of the appends (see [`PREALLOCATE`]).
    allocated: u64,
}

struct Writer {
    dir: PathBuf,
    fsync: FsyncPolicy,
    /// A new segment is started past this size.
    segment_bytes: u64,
    /// Every segment, oldest first.
    segments: Vec<SegmentInfo>,
    /// The file of the last segment, once opened for appending.
    current: Option<File>,
    /// The committed file, once opened.
    committed: Option<File>,
    /// Why a write failed, once one has: nothing is appended after it.
    broken: Option<String>,
    /// Whether the last segment is past its size because its successor
    /// could not be made (said once, until one is made).
    overfull: bool,
}

impl Writer {
    /// Overwrites the committed file in place, unsynced: it only spares a
    /// restarted member from waiting for its leader before applying what it
    /// already has, so a lost or torn write costs nothing but that.
    fn write_committed(&mut self, id: Option<LogId>) {
        use std::os::unix::fs::FileExt;
        let bytes = encode_small(&id);
        if self.committed.is_none() {
            let path = self.dir.join("committed");
            match OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&path)
            {
                Ok(f) => self.committed = Some(f),
                Err(e) => {
                    warn!("opening {}: {e}", path.display());
                    return;
                }
            }
        }
        let file = self.committed.as_ref().expect("opened above");
        if let Err(e) = file.write_all_at(&bytes, 0) {
            warn!("writing the committed log id: {e}");
            self.committed = None;
        }
    }

    /// Writes one batch (of the entries at `indexes`) and, with `--fsync
    /// always`, syncs it.
    fn append(&mut self, indexes: &[u64], batch: &[u8]) -> Result<(), String> {
        if let Some(why) = &self.broken {
            return Err(format!(
                "an earlier write of the replicated log failed: {why}"
            ));
        }
        let result = self.write_batch(indexes, batch);
        if let Err(e) = &result {
            // Whatever part of the batch reached the file is a torn last
            // write, which recovery drops; nothing may be written after it.
            self.broken = Some(e.clone());
        }
        result
    }

    fn write_batch(&mut self, indexes: &[u64], batch: &[u8]) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let first = indexes[0];
        if self
            .segments
            .last()
            .is_none_or(|s| s.len >= self.segment_bytes)
        {
            self.close_last()?;
            match self.start_segment(first) {
                Ok(()) => self.overfull = false,
                // Its successor cannot be made (a file system out of
                // inodes, say), and nothing of it is left: the log goes on
                // in the last segment, and the next batch tries again. A
                // segment past its size costs only disk space until a
                // purge.
                Err(e) if !self.segments.is_empty() && self.nothing_left_of(first) => {
                    if !self.overfull {
                        warn!("{e}: the replicated log goes on in its last segment for now");
                        self.overfull = true;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let sync = self.fsync == FsyncPolicy::Always;
        let (at, allocated) = {
            let seg = self.segments.last().expect("a segment");
            (seg.len, seg.allocated)
        };
        let end = at + batch.len() as u64;
        if sync && end > allocated {
            let upto = end.div_ceil(PREALLOCATE) * PREALLOCATE;
            let zeros = vec![0; (upto - allocated) as usize];
            let file = self.current_file()?;
            file.write_all_at(&zeros, allocated)
                .and_then(|()| file.sync_data())
                .map_err(|e| format!("extending the replicated log: {e}"))?;
            self.segments.last_mut().expect("a segment").allocated = upto;
        }
        let file = self.current_file()?;
        let written = match disk_faults::torn_write(batch.len()) {
            Some(part) => file
                .write_all_at(&batch[..part], at)
                .and_then(|()| Err(disk_faults::no_space())),
            None => file.write_all_at(batch, at),
        };
        written.map_err(|e| format!("writing the replicated log: {e}"))?;
        if sync {
            disk_faults::before_sync();
            file.sync_data()
                .map_err(|e| format!("syncing the replicated log: {e}"))?;
        }
        let seg = self.segments.last_mut().expect("a segment");
        for index in indexes {
            seg.batches.insert(*index, at);
        }
        seg.len = end;
        seg.allocated = seg.allocated.max(end);
        Ok(())
    }

    fn current_file(&mut self) -> Result<&mut File, String> {
        if self.current.is_none() {
            let seg = self.segments.last().ok_or("no segment")?;
            let file = OpenOptions::new()
                .write(true)
                .open(&seg.path)
                .map_err(|e| format!("opening {}: {e}", seg.path.display()))?;
            self.current = Some(file);
        }
        Ok(self.current.as_mut().expect("opened above"))
    }

    /// Whether nothing is left of a segment starting at `first` that could
    /// not be made (a part of it removed, and the removal synced): one left
    /// would hold no records where recovery looks for them.
    fn nothing_left_of(&self, first: u64) -> bool {
        let path = self.dir.join(segment_name(first));
        match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).is_ok(),
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }

    /// Closes the last segment before the next one is started: it loses
    /// the zeros past its data and is synced before the next one exists
    /// (only the last segment may end in zeros). Once the next one could
    /// not be made, appends to it write zeros ahead again.
    fn close_last(&mut self) -> Result<(), String> {
        if let Some(seg) = self.segments.last_mut() {
            let file = OpenOptions::new()
                .write(true)
                .open(&seg.path)
                .map_err(|e| format!("opening {}: {e}", seg.path.display()))?;
            if seg.allocated > seg.len {
                file.set_len(seg.len)
                    .map_err(|e| format!("cutting {}: {e}", seg.path.display()))?;
                seg.allocated = seg.len;
            }
            file.sync_all()
                .map_err(|e| format!("syncing {}: {e}", seg.path.display()))?;
        }
        self.current = None;
        Ok(())
    }

    /// Starts a new last segment, whose first entry is `first`.
    fn start_segment(&mut self, first: u64) -> Result<(), String> {
        let path = self.dir.join(segment_name(first));
        let mut file = disk_faults::before_create()
            .and_then(|()| {
                OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(&path)
            })
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        let header = segment::header_of(self.fsync, Kind::Replicated);
        file.write_all(&header)
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        sync_dir(&self.dir)?;
        self.segments.push(SegmentInfo {
            first,
            path,
            batches: BTreeMap::new(),
            len: header.len() as u64,
            allocated: header.len() as u64,
        });
        self.current = Some(file);
        Ok(())
    }

    /// Removes every entry from index `from` on: whole later segments go,
    /// and the segment holding `from` is cut at the batch holding it, the
    /// entries of that batch before `from` written again as a batch of
    /// their own. The cut segment is written whole to a new file renamed
    /// over it, so that a crash leaves either the old segment or the new
    /// one, never the kept entries lost (they may be committed).
    fn truncate(&mut self, from: u64) -> Result<(), String> {
        self.current = None;
        let mut removed = false;
        while self.segments.last().is_some_and(|s| s.first >= from) {
            let seg = self.segments.pop().expect("checked");
            std::fs::remove_file(&seg.path)
                .map_err(|e| format!("removing {}: {e}", seg.path.display()))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        let Some(seg) = self.segments.last_mut() else {
            return Ok(());
        };
        let Some(&offset) = seg.batches.get(&from) else {
            return Ok(()); // the segment ends before `from`
        };
        let mut bytes = Vec::new();
        File::open(&seg.path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| format!("reading {}: {e}", seg.path.display()))?;
        let (records, _) = segment::read_batch(&bytes, offset as usize)?;
        let kept = keep_before(records, from)?;
        bytes.truncate(offset as usize);
        if !kept.is_empty() {
            let start = segment::begin_batch(&mut bytes);
            for (_, payload) in &kept {
                record::frame(&mut bytes, |out| out.extend_from_slice(payload));
            }
            segment::end_batch(&mut bytes, start);
        }
        let tmp = seg.path.with_extension("seg.tmp");
        let written = disk_faults::before_create()
            .and_then(|()| File::create(&tmp))
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, &seg.path));
        written.map_err(|e| format!("rewriting {}: {e}", seg.path.display()))?;
        sync_dir(&self.dir)?;
        seg.batches.retain(|_, o| *o < offset);
        for (index, _) in &kept {
            seg.batches.insert(*index, offset);
        }
        seg.len = bytes.len() as u64;
        seg.allocated = seg.len;
        Ok(())
    }

    /// Removes the segments whose every entry is at most `upto` (all but
    /// the last).
    fn purge(&mut self, upto: u64) -> Result<(), String> {
        let mut removed = false;
        while self.segments.len() > 1 && self.segments[1].first <= upto + 1 {
            let seg = self.segments.remove(0);
            std::fs::remove_file(&seg.path)
                .map_err(|e| format!("removing {}: {e}", seg.path.display()))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

/// The indexes and payloads of the records in `records` whose entries come
/// before index `from`.
fn keep_before(records: &[u8], from: u64) -> Result<Vec<(u64, Vec<u8>)>, String> {
    let mut kept = Vec::new();
    let mut at = 0;
    while at < records.len() {
        let Frame::Whole { payload, size } = record::read_frame(&records[at..]) else {
            return Err("a damaged record in a batch being cut".into());
        };
        let entry: Entry = bincode::deserialize(payload).map_err(|e| e.to_string())?;
        let index = entry.get_log_id().index;
        if index < from {
            kept.push((index, payload.to_vec()));
        }
        at += size;
    }
    Ok(kept)
}

struct Recovered {
    entries: BTreeMap<u64, Entry>,
    segments: Vec<SegmentInfo>,
}

/// Whether reading the log may repair what a crash left: leftover files
/// removed, a torn last write cut off. Only the member that owns the log
/// repairs it; anyone else reads it as it is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repair {
    Yes,
    No,
}

/// The membership the replicated log in `dir` (a member's `raft/`
/// directory) and its snapshot hold last, read without changing anything:
/// every member by id, `None` if the log holds none (a member that never
/// started, or one that waits to be added).
///
/// # Errors
/// Damage in the log or the snapshot's metadata, naming the file.
pub fn stored_members(dir: &Path) -> Result<Option<BTreeMap<NodeId, Member>>, String> {
    if !dir.exists() {
        return Ok(None);
    }
    let purged: Option<LogId> = read_small::<Option<LogId>>(&dir.join("purged"))?.flatten();
    let recovered = recover(dir, purged.map(|p| p.index), Repair::No)?;
    let from_log = recovered
        .entries
        .values()
        .rev()
        .find_map(|e| match &e.payload {
            openraft::EntryPayload::Membership(m) => Some((Some(e.log_id.index), m.clone())),
            _ => None,
        });
    let from_snapshot = crate::state_machine::snapshot_meta(&dir.join("snapshot"))?.map(|meta| {
        let m = meta.last_membership;
        (m.log_id().map(|l| l.index), m.membership().clone())
    });
    // The newer of the two, as openraft takes it: a snapshot installed past
    // the log, the log not yet purged behind it, holds the newer one.
    let membership = match (from_log, from_snapshot) {
        (Some(log), Some(snap)) if snap.0 > log.0 => Some(snap.1),
        (Some(log), _) => Some(log.1),
        (None, snap) => snap.map(|s| s.1),
    };
    Ok(membership.map(|m| m.nodes().map(|(id, n)| (*id, n.clone())).collect()))
}

/// Reads every segment: entries in order, and where each batch is.
fn recover(dir: &Path, purged: Option<u64>, repair: Repair) -> Result<Recovered, String> {
    let listed: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
        .map_err(|e| format!("listing {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .collect();
    // A segment being rewritten by a truncation when the member stopped:
    // the segment itself is whole (the rename had not happened).
    for e in &listed {
        if repair == Repair::Yes && e.file_name().to_string_lossy().ends_with(".seg.tmp") {
            std::fs::remove_file(e.path())
                .map_err(|err| format!("removing {}: {err}", e.path().display()))?;
        }
    }
    let mut names: Vec<(u64, PathBuf)> = listed
        .into_iter()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let first = name
                .strip_prefix("log-")?
                .strip_suffix(".seg")?
                .parse()
                .ok()?;
            Some((first, e.path()))
        })
        .collect();
    names.sort();
    // A last segment created by a rotation whose header never reached the
    // disk (a crash right after it) holds nothing.
    while let Some((_, path)) = names.last() {
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if !bytes.iter().all(|b| *b == 0) {
            break;
        }
        if repair == Repair::Yes {
            std::fs::remove_file(path).map_err(|e| format!("removing {}: {e}", path.display()))?;
        }
        names.pop();
    }
    let mut entries = BTreeMap::new();
    let mut segments = Vec::new();
    let last = names.len().saturating_sub(1);
    for (i, (first, path)) in names.into_iter().enumerate() {
        let mut bytes = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let damaged = |offset: usize, what: &str| {
            format!(
                "{} is damaged at byte offset {offset}: {what}. The member does not start on a damaged log and changed nothing; restore its data directory from a copy, or wipe it to have the member catch up from the others",
                path.display()
            )
        };
        let layout = match segment::layout(&bytes) {
            Ok(l) if l.kind == Kind::Replicated => l,
            Ok(_) => return Err(damaged(0, "not a segment of a replicated log")),
            Err(LayoutError::Short) if i == last => {
                // Created, never written: a crash right after the rotation.
                if repair == Repair::Yes {
                    std::fs::remove_file(&path).map_err(|e| e.to_string())?;
                }
                continue;
            }
            Err(LayoutError::Short) => return Err(damaged(0, "the file ends inside its header")),
            Err(LayoutError::Damaged(why)) => return Err(damaged(0, &why)),
        };
        let mut info = SegmentInfo {
            first,
            path: path.clone(),
            batches: BTreeMap::new(),
            len: bytes.len() as u64,
            allocated: bytes.len() as u64,
        };
        let mut at = layout.start;
        while at < bytes.len() {
            match read_entries(&bytes, at) {
                Ok((batch, end)) => {
                    for entry in batch {
                        let index = entry.get_log_id().index;
                        info.batches.insert(index, at as u64);
                        entries.insert(index, entry);
                    }
                    at = end;
                }
                Err(_) if i == last && bytes[at..].iter().all(|b| *b == 0) => {
                    // Space written ahead of the appends: the log ends here.
                    info.len = at as u64;
                    break;
                }
                Err(why) => {
                    if i == last && !segment::unit_after(&bytes, at, layout) {
                        if repair == Repair::Yes {
                            warn!(file = %path.display(), offset = at, "dropping a torn last write of the replicated log: {why}");
                            let file = OpenOptions::new()
                                .write(true)
                                .open(&path)
                                .map_err(|e| e.to_string())?;
                            file.set_len(at as u64)
                                .and_then(|()| file.sync_all())
                                .map_err(|e| format!("cutting {}: {e}", path.display()))?;
                        }
                        info.len = at as u64;
                        info.allocated = at as u64;
                        break;
                    }
                    return Err(damaged(at, &why));
                }
            }
        }
        segments.push(info);
    }
    if let Some(purged) = purged {
        entries = entries.split_off(&(purged + 1));
    }
    // Entries follow one another, with no gap.
    let mut expect = None;
    for index in entries.keys() {
        if let Some(e) = expect {
            if *index != e {
                return Err(format!(
                    "the replicated log in {} skips from entry {} to {index}",
                    dir.display(),
                    e - 1
                ));
            }
        }
        expect = Some(index + 1);
    }
    Ok(Recovered { entries, segments })
}

/// The entries of the batch at `at`.
fn read_entries(bytes: &[u8], at: usize) -> Result<(Vec<Entry>, usize), String> {
    let (records, end) = segment::read_batch(bytes, at)?;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < records.len() {
        match record::read_frame(&records[pos..]) {
            Frame::Whole { payload, size } => {
                let entry: Entry = bincode::deserialize(payload)
                    .map_err(|e| format!("an entry does not decode: {e}"))?;
                out.push(entry);
                pos += size;
            }
            Frame::Short => return Err("a record runs past the end of its batch".into()),
            Frame::Invalid(why) => return Err(why),
        }
    }
    Ok((out, end))
}

fn encode_small<T: Serialize>(value: &T) -> Vec<u8> {
    let payload = bincode::serialize(value).expect("small values serialize");
    let mut out = Vec::new();
    record::frame(&mut out, |o| o.extend_from_slice(&payload));
    out
}

/// Reads a small file written by [`write_atomic`]; `None` if absent.
fn read_small<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    match record::read_frame(&bytes) {
        Frame::Whole { payload, .. } => bincode::deserialize(payload)
            .map(Some)
            .map_err(|e| format!("{} does not decode: {e}", path.display())),
        _ => Err(format!(
            "{} is damaged; restore the data directory from a copy, or wipe it to have the member catch up from the others",
            path.display()
        )),
    }
}

/// Replaces `path` with `bytes` in one step (a temporary file renamed over
/// it), synced with its directory if `sync`.
fn write_atomic(dir: &Path, path: &Path, bytes: &[u8], sync: bool) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let mut file = disk_faults::before_create()
        .and_then(|()| File::create(&tmp))
        .map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    file.write_all(bytes)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    if sync {
        file.sync_all()
            .map_err(|e| format!("syncing {}: {e}", tmp.display()))?;
    }
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
    if sync {
        sync_dir(dir)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("syncing {}: {e}", dir.display()))
}
