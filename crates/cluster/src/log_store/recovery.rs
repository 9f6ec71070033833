//! Reading the log back at start: segments checked, a torn last batch dropped, the membership found.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

use baton_state::format::record::{self, Frame};
use baton_state::format::segment::{self, Kind, LayoutError};
use openraft::RaftLogId;
use tracing::warn;

use super::files::read_small;
use super::writer::SegmentInfo;
use super::{BatchDamage, SegmentDamage, StoreError};
use crate::types::{Entry, LogId, Member, NodeId};

pub(super) struct Recovered {
    pub(super) entries: BTreeMap<u64, Entry>,
    pub(super) segments: Vec<SegmentInfo>,
}

/// Whether reading the log may repair what a crash left: leftover files
/// removed, a torn last write cut off. Only the member that owns the log
/// repairs it; anyone else reads it as it is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Repair {
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
pub fn stored_members(dir: &Path) -> Result<Option<BTreeMap<NodeId, Member>>, StoreError> {
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
pub(super) fn recover(
    dir: &Path,
    purged: Option<u64>,
    repair: Repair,
) -> Result<Recovered, StoreError> {
    let listed: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
        .map_err(|e| StoreError::io("listing", dir, e))?
        .filter_map(|e| e.ok())
        .collect();
    // A segment being rewritten by a truncation when the member stopped:
    // the segment itself is whole (the rename had not happened).
    for e in &listed {
        if repair == Repair::Yes && e.file_name().to_string_lossy().ends_with(".seg.tmp") {
            std::fs::remove_file(e.path())
                .map_err(|err| StoreError::io("removing", e.path(), err))?;
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
        let bytes = std::fs::read(path).map_err(|e| StoreError::io("reading", path, e))?;
        if !bytes.iter().all(|b| *b == 0) {
            break;
        }
        if repair == Repair::Yes {
            std::fs::remove_file(path).map_err(|e| StoreError::io("removing", path, e))?;
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
            .map_err(|e| StoreError::io("reading", &path, e))?;
        let damaged = |offset: usize, why: SegmentDamage| StoreError::Damaged {
            path: path.clone(),
            offset,
            why,
        };
        let layout = match segment::layout(&bytes) {
            Ok(l) if l.kind == Kind::Replicated => l,
            Ok(_) => return Err(damaged(0, SegmentDamage::NotReplicated)),
            Err(LayoutError::Short) if i == last => {
                // Created, never written: a crash right after the rotation.
                if repair == Repair::Yes {
                    std::fs::remove_file(&path).map_err(StoreError::Unnamed)?;
                }
                continue;
            }
            Err(why) => return Err(damaged(0, why.into())),
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
                                .map_err(StoreError::Unnamed)?;
                            file.set_len(at as u64)
                                .and_then(|()| file.sync_all())
                                .map_err(|e| StoreError::io("cutting", &path, e))?;
                        }
                        info.len = at as u64;
                        info.allocated = at as u64;
                        break;
                    }
                    return Err(damaged(at, why.into()));
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
                return Err(StoreError::Gap {
                    dir: dir.to_owned(),
                    after: e - 1,
                    next: *index,
                });
            }
        }
        expect = Some(index + 1);
    }
    Ok(Recovered { entries, segments })
}

/// The entries of the batch at `at`.
pub(super) fn read_entries(bytes: &[u8], at: usize) -> Result<(Vec<Entry>, usize), BatchDamage> {
    let (records, end) = segment::read_batch(bytes, at)?;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < records.len() {
        match record::read_frame(&records[pos..]) {
            Frame::Whole { payload, size } => {
                let entry: Entry = bincode::deserialize(payload).map_err(BatchDamage::Entry)?;
                out.push(entry);
                pos += size;
            }
            Frame::Short => return Err(BatchDamage::RecordPastBatch),
            Frame::Invalid(why) => return Err(why.into()),
        }
    }
    Ok((out, end))
}
