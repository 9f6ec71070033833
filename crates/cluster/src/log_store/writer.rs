//! Writing the log: segments, preallocation, and batches synced before they count as flushed.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use baton_server::persist::disk_faults;
use baton_state::format::record::{self, Frame};
use baton_state::format::segment::{self, Kind};
use baton_state::format::FsyncPolicy;
use openraft::RaftLogId;
use tracing::warn;

use super::files::{encode_small, sync_dir};
use super::StoreError;
use crate::types::{Entry, LogId};

/// Where a segment's entries are: its first index, and for each entry the
/// offset of the batch it is in.
#[derive(Debug)]
pub(super) struct SegmentInfo {
    pub(super) first: u64,
    pub(super) path: PathBuf,
    /// Entry index -> offset of the batch holding it.
    pub(super) batches: BTreeMap<u64, u64>,
    /// Where its data ends.
    pub(super) len: u64,
    /// The file's length: past `len` the last segment holds zeros, space
    /// written ahead of the appends (see [`PREALLOCATE`]).
    pub(super) allocated: u64,
}

pub(super) struct Writer {
    pub(super) dir: PathBuf,
    pub(super) fsync: FsyncPolicy,
    /// A new segment is started past this size.
    pub(super) segment_bytes: u64,
    /// Every segment, oldest first.
    pub(super) segments: Vec<SegmentInfo>,
    /// The file of the last segment, once opened for appending.
    pub(super) current: Option<File>,
    /// The committed file, once opened.
    pub(super) committed: Option<File>,
    /// Why a write failed, once one has: nothing is appended after it.
    pub(super) broken: Option<Arc<StoreError>>,
    /// Whether the last segment is past its size because its successor
    /// could not be made (said once, until one is made).
    pub(super) overfull: bool,
}

impl Writer {
    /// Overwrites the committed file in place, unsynced: it only spares a
    /// restarted member from waiting for its leader before applying what it
    /// already has, so a lost or torn write costs nothing but that.
    pub(super) fn write_committed(&mut self, id: Option<LogId>) {
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
    pub(super) fn append(&mut self, indexes: &[u64], batch: &[u8]) -> Result<(), StoreError> {
        if let Some(why) = &self.broken {
            return Err(StoreError::Broken(Arc::clone(why)));
        }
        self.write_batch(indexes, batch).map_err(|e| {
            // Whatever part of the batch reached the file is a torn last
            // write, which recovery drops; nothing may be written after it.
            let e = Arc::new(e);
            self.broken = Some(Arc::clone(&e));
            StoreError::Failed(e)
        })
    }

    pub(super) fn write_batch(&mut self, indexes: &[u64], batch: &[u8]) -> Result<(), StoreError> {
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
                .map_err(|source| StoreError::Log {
                    what: "extending",
                    source,
                })?;
            self.segments.last_mut().expect("a segment").allocated = upto;
        }
        let file = self.current_file()?;
        let written = match disk_faults::torn_write(batch.len()) {
            Some(part) => file
                .write_all_at(&batch[..part], at)
                .and_then(|()| Err(disk_faults::no_space())),
            None => file.write_all_at(batch, at),
        };
        written.map_err(|source| StoreError::Log {
            what: "writing",
            source,
        })?;
        if sync {
            disk_faults::before_sync();
            file.sync_data().map_err(|source| StoreError::Log {
                what: "syncing",
                source,
            })?;
        }
        let seg = self.segments.last_mut().expect("a segment");
        for index in indexes {
            seg.batches.insert(*index, at);
        }
        seg.len = end;
        seg.allocated = seg.allocated.max(end);
        Ok(())
    }

    pub(super) fn current_file(&mut self) -> Result<&mut File, StoreError> {
        if self.current.is_none() {
            let seg = self.segments.last().ok_or(StoreError::NoSegment)?;
            let file = OpenOptions::new()
                .write(true)
                .open(&seg.path)
                .map_err(|e| StoreError::io("opening", &seg.path, e))?;
            self.current = Some(file);
        }
        Ok(self.current.as_mut().expect("opened above"))
    }

    /// Whether nothing is left of a segment starting at `first` that could
    /// not be made (a part of it removed, and the removal synced): one left
    /// would hold no records where recovery looks for them.
    pub(super) fn nothing_left_of(&self, first: u64) -> bool {
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
    pub(super) fn close_last(&mut self) -> Result<(), StoreError> {
        if let Some(seg) = self.segments.last_mut() {
            let file = OpenOptions::new()
                .write(true)
                .open(&seg.path)
                .map_err(|e| StoreError::io("opening", &seg.path, e))?;
            if seg.allocated > seg.len {
                file.set_len(seg.len)
                    .map_err(|e| StoreError::io("cutting", &seg.path, e))?;
                seg.allocated = seg.len;
            }
            file.sync_all()
                .map_err(|e| StoreError::io("syncing", &seg.path, e))?;
        }
        self.current = None;
        Ok(())
    }

    /// Starts a new last segment, whose first entry is `first`.
    pub(super) fn start_segment(&mut self, first: u64) -> Result<(), StoreError> {
        let path = self.dir.join(segment_name(first));
        let mut file = disk_faults::before_create()
            .and_then(|()| {
                OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(&path)
            })
            .map_err(|e| StoreError::io("creating", &path, e))?;
        let header = segment::header_of(self.fsync, Kind::Replicated);
        file.write_all(&header)
            .and_then(|()| file.sync_all())
            .map_err(|e| StoreError::io("writing", &path, e))?;
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
    pub(super) fn truncate(&mut self, from: u64) -> Result<(), StoreError> {
        self.current = None;
        let mut removed = false;
        while self.segments.last().is_some_and(|s| s.first >= from) {
            let seg = self.segments.pop().expect("checked");
            std::fs::remove_file(&seg.path)
                .map_err(|e| StoreError::io("removing", &seg.path, e))?;
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
            .map_err(|e| StoreError::io("reading", &seg.path, e))?;
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
        written.map_err(|e| StoreError::io("rewriting", &seg.path, e))?;
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
    pub(super) fn purge(&mut self, upto: u64) -> Result<(), StoreError> {
        let mut removed = false;
        while self.segments.len() > 1 && self.segments[1].first <= upto + 1 {
            let seg = self.segments.remove(0);
            std::fs::remove_file(&seg.path)
                .map_err(|e| StoreError::io("removing", &seg.path, e))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

/// A segment is closed and a new one started past this size.
pub(super) const SEGMENT_BYTES: u64 = 64 << 20;
/// With `--fsync always`, the last segment grows this much at a time,
/// written with zeros and synced once: a sync of an append then flushes
/// only the append, not the file's new size as well (which takes the file
/// system's journal and about doubles the time of each sync).
pub(super) const PREALLOCATE: u64 = 1 << 20;

pub(super) fn segment_name(first: u64) -> String {
    format!("log-{first:020}.seg")
}

/// The indexes and payloads of the records in `records` whose entries come
/// before index `from`.
pub(super) fn keep_before(records: &[u8], from: u64) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let mut kept = Vec::new();
    let mut at = 0;
    while at < records.len() {
        let Frame::Whole { payload, size } = record::read_frame(&records[at..]) else {
            return Err(StoreError::DamagedRecord);
        };
        let entry: Entry = bincode::deserialize(payload).map_err(StoreError::Decode)?;
        let index = entry.get_log_id().index;
        if index < from {
            kept.push((index, payload.to_vec()));
        }
        at += size;
    }
    Ok(kept)
}
