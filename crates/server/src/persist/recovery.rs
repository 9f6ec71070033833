//! Recovery: the data directory's files, and the state they hold, read back
//! from the latest whole snapshot and the log after it.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::segment::{self, LayoutError};
use super::{snapshot, FsyncPolicy, PersistError};
use crate::state::StateMachine;

pub(super) fn segment_name(first_revision: u64) -> String {
    format!("wal-{first_revision:020}.log")
}

/// Revision named in a data file's name, for `prefix<20 digits><suffix>`.
pub(super) fn named_revision(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

/// The data files found in a directory, oldest first.
pub(super) struct Listing {
    pub(super) snapshots: Vec<(u64, PathBuf)>,
    pub(super) segments: Vec<(u64, PathBuf)>,
    /// Snapshots whose writing was cut short: never renamed into place, so
    /// never relied upon (or being written right now, outside recovery).
    pub(super) temporary: Vec<PathBuf>,
}

pub(super) fn list(dir: &Path) -> Result<Listing, PersistError> {
    let mut listing = Listing {
        snapshots: Vec::new(),
        segments: Vec::new(),
        temporary: Vec::new(),
    };
    let entries = std::fs::read_dir(dir)
        .map_err(|e| PersistError::io(dir, "listing the data directory", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| PersistError::io(dir, "listing the data directory", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rev) = named_revision(&name, "snapshot-", ".snap") {
            listing.snapshots.push((rev, entry.path()));
        } else if let Some(rev) = named_revision(&name, "wal-", ".log") {
            listing.segments.push((rev, entry.path()));
        } else if name.ends_with(".tmp") {
            listing.temporary.push(entry.path());
        }
    }
    listing.snapshots.sort();
    listing.segments.sort();
    Ok(listing)
}

/// What recovery found, for the log and for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Revision of the snapshot recovery started from (0 for none).
    pub snapshot_revision: u64,
    /// Log records replayed on top of it.
    pub records_replayed: u64,
    /// Bytes of a torn last write that were dropped.
    pub torn_bytes_dropped: u64,
    /// Damaged segments passed over because the snapshot (or the segment
    /// after them) already holds every record they held.
    pub covered_damage: u64,
    /// The recovered revision.
    pub revision: u64,
}

/// Recovers the state kept in `dir`: the newest snapshot, then every log
/// record after it. What damage recovery accepts:
///
/// - damage in a segment whose every record the snapshot (or the next
///   segment) already holds is passed over: nothing is lost;
/// - damage in the last write of the last segment (a write that a crash cut
///   short, whose pages may have reached the disk in any order) is dropped:
///   under `--fsync always` nothing in it was acknowledged;
/// - in a segment written under `--fsync never`, which is never synced, the
///   log is cut at the first damage and later segments are set aside
///   (renamed `*.dropped`): a power loss loses the last moments.
///
/// Any other damage is an error that names the file and offset, and then
/// nothing in the directory has been changed.
///
/// # Errors
/// [`PersistError::Corrupt`] or an I/O error.
pub fn recover(dir: &Path) -> Result<(StateMachine, Recovery), PersistError> {
    let listing = list(dir)?;
    let replayed = replay(&listing)?;
    for tmp in &listing.temporary {
        let _ = std::fs::remove_file(tmp);
    }
    let mut torn_bytes = 0;
    if let Some(torn) = &replayed.torn {
        // Only now that everything else checked out.
        torn_bytes = torn.len;
        warn!(file = %torn.path.display(), offset = torn.offset, "dropping {} bytes of a torn last write: {}", torn.len, torn.why);
        let file = OpenOptions::new()
            .write(true)
            .open(&torn.path)
            .map_err(|e| PersistError::io(&torn.path, "opening the log to drop a torn write", e))?;
        file.set_len(torn.offset)
            .and_then(|()| file.sync_all())
            .map_err(|e| PersistError::io(&torn.path, "dropping a torn write", e))?;
        for later in &torn.set_aside {
            let aside = later.with_extension("log.dropped");
            warn!(file = %later.display(), "setting aside a log segment that follows lost records");
            torn_bytes += std::fs::metadata(later).map_or(0, |m| m.len());
            std::fs::rename(later, &aside)
                .map_err(|e| PersistError::io(later, "setting aside a log segment", e))?;
        }
    }
    let recovery = Recovery {
        snapshot_revision: replayed.snapshot_revision,
        records_replayed: replayed.records,
        torn_bytes_dropped: torn_bytes,
        covered_damage: replayed.covered_damage,
        revision: replayed.sm.revision(),
    };
    Ok((replayed.sm, recovery))
}

struct Replayed {
    sm: StateMachine,
    snapshot_revision: u64,
    records: u64,
    covered_damage: u64,
    torn: Option<Torn>,
}

/// A torn tail to cut off, and the segments after it to set aside.
struct Torn {
    path: PathBuf,
    offset: u64,
    len: u64,
    why: String,
    set_aside: Vec<PathBuf>,
}

fn replay(listing: &Listing) -> Result<Replayed, PersistError> {
    let (sm, snapshot_revision) = match listing.snapshots.last() {
        Some((rev, path)) => (snapshot::read(path)?, *rev),
        None => (StateMachine::new(), 0),
    };
    if sm.revision() != snapshot_revision {
        let path = &listing.snapshots.last().expect("a snapshot was read").1;
        return Err(PersistError::Corrupt {
            file: path.clone(),
            offset: 0,
            what: format!(
                "holds revision {} but is named for {snapshot_revision}",
                sm.revision()
            ),
        });
    }
    let mut out = Replayed {
        sm,
        snapshot_revision,
        records: 0,
        covered_damage: 0,
        torn: None,
    };
    for (i, (_, path)) in listing.segments.iter().enumerate() {
        let next_first = listing.segments.get(i + 1).map(|(first, _)| *first);
        let mut buf = Vec::new();
        File::open(path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|e| PersistError::io(path, "reading the log", e))?;
        let read = segment::layout(&buf);
        let header_cut_short = matches!(read, Err(LayoutError::Short));
        let damage = match read {
            Ok(layout) if layout.kind != segment::Kind::Changes => {
                return Err(PersistError::Corrupt {
                    file: path.clone(),
                    offset: 0,
                    what:
                        "this is a cluster member's replicated log, not a server's log of changes"
                            .into(),
                })
            }
            Ok(layout) => replay_segment(&mut out, path, &buf, layout)?
                .map(|(at, why)| (at, why.to_string(), Some(layout))),
            Err(why) => Some((0, why.to_string(), None)),
        };
        let Some((at, why, layout)) = damage else {
            continue;
        };
        let corrupt = |why: String| PersistError::Corrupt {
            file: path.clone(),
            offset: at as u64,
            what: why,
        };
        let rest = || Torn {
            path: path.clone(),
            offset: at as u64,
            len: (buf.len() - at) as u64,
            why: why.clone(),
            set_aside: listing.segments[i + 1..]
                .iter()
                .map(|(_, p)| p.clone())
                .collect(),
        };
        if next_first.is_some_and(|next| out.sm.revision() + 1 >= next) {
            // Every record this segment held is in the snapshot or the
            // next segment: the damage loses nothing.
            warn!(file = %path.display(), offset = at, "passing over damage in a log segment whose records are all held elsewhere: {why}");
            out.covered_damage += 1;
            continue;
        }
        match layout {
            Some(l) if l.fsync == Some(FsyncPolicy::Never) => {
                // Never synced: whatever follows the damage is as lost as
                // what a power loss takes.
                out.torn = Some(rest());
                break;
            }
            Some(l) if next_first.is_none() && !segment::unit_after(&buf, at, l) => {
                out.torn = Some(rest());
                break;
            }
            None if next_first.is_none() && header_cut_short => {
                out.torn = Some(rest());
                break;
            }
            _ => return Err(corrupt(why)),
        }
    }
    Ok(out)
}

/// Applies a segment's records after the state's revision. Returns the
/// offset of the first damage and what it is, if any.
fn replay_segment(
    out: &mut Replayed,
    path: &Path,
    buf: &[u8],
    layout: segment::Layout,
) -> Result<Option<(usize, segment::Damage)>, PersistError> {
    let mut at = layout.start;
    while at < buf.len() {
        let (records, end) = match segment::read_unit(buf, at, layout) {
            Ok(unit) => unit,
            Err(why) => return Ok(Some((at, why))),
        };
        for logged in records {
            let revision = logged.revision;
            if revision <= out.sm.revision() {
                continue; // in the snapshot already
            }
            // A record takes the next revision, or more when a sequential
            // create passed over taken names: either way applying it must
            // give the revision it names.
            let before = out.sm.revision();
            let applied = out.sm.apply_proposal(&logged.proposal);
            let wrong = match applied.result {
                Err(e) => Some(format!("record for revision {revision} does not apply: {e}")),
                Ok(_) if applied.revision != revision => Some(format!(
                    "the record for revision {revision} follows revision {before} but applies as {}: records are missing before it",
                    applied.revision
                )),
                Ok(_) => None,
            };
            if let Some(what) = wrong {
                return Err(PersistError::Corrupt {
                    file: path.to_owned(),
                    offset: at as u64,
                    what,
                });
            }
            out.records += 1;
        }
        at = end;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::log::Wal;
    use crate::persist::record;
    use crate::persist::DurableMark;
    use crate::state::Proposal;
    use crate::stats::Stats;
    use baton_proto::{CreateMode, SessionId};
    use bytes::Bytes;
    use std::sync::Arc;
    use std::time::Duration;
    use std::time::Instant;
    use tokio::sync::watch;

    fn create(i: u64, len: usize) -> Proposal {
        Proposal {
            now_ms: 0,
            origin: None,
            command: crate::state::Command::Create {
                session: SessionId(0),
                path: format!("/n{i}"),
                data: Bytes::from(vec![b'x'; len]),
                mode: CreateMode::Persistent,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            },
        }
    }

    fn start(dir: &Path, fsync: FsyncPolicy, revision: u64) -> (Wal, Arc<DurableMark>) {
        let mark = Arc::new(DurableMark::new(revision));
        let (failed, _) = watch::channel(None);
        let wal = Wal::start(
            dir,
            revision,
            fsync,
            mark.clone(),
            failed,
            Arc::new(Stats::default()),
        )
        .unwrap();
        (wal, mark)
    }

    fn wait_for(mark: &DurableMark, revision: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while mark.get() < revision {
            assert!(
                Instant::now() < deadline,
                "the log never reached {revision}"
            );
            std::thread::yield_now();
        }
    }

    /// The batches of a format-2 segment: (start, end) of each.
    fn batches(buf: &[u8]) -> Vec<(usize, usize)> {
        let layout = segment::layout(buf).unwrap();
        let mut at = layout.start;
        let mut out = Vec::new();
        while at < buf.len() {
            let (_, end) = segment::read_unit(buf, at, layout).unwrap();
            out.push((at, end));
            at = end;
        }
        out
    }

    fn only_segment(dir: &Path) -> PathBuf {
        let listing = list(dir).unwrap();
        assert_eq!(listing.segments.len(), 1);
        listing.segments[0].1.clone()
    }

    /// A group commit that a crash cut short may reach the disk with a page
    /// in its middle unwritten and its later records whole. None of it was
    /// acknowledged (it was never synced), so recovery drops all of it and
    /// keeps every batch before it.
    #[test]
    fn a_group_commit_torn_out_of_order_is_dropped_whole() {
        let dir_kept = tempfile::Builder::new()
            .prefix(&format!("baton-{}-", "torn-batch"))
            .tempdir()
            .unwrap();
        let dir = dir_kept.path().to_path_buf();
        // A segment as the committer writes it: one batch with records 1 and
        // 2, then one with records 3 to 12.
        let mut buf = segment::header(FsyncPolicy::Always).to_vec();
        for revisions in [1..=2, 3..=12] {
            let start = segment::begin_batch(&mut buf);
            for i in revisions {
                record::encode(&mut buf, i, &create(i, 3000));
            }
            segment::end_batch(&mut buf, start);
        }
        let (start, end) = *batches(&buf).last().unwrap();
        // A page in the middle of the last batch never reached the disk;
        // the records after it did.
        let page = (start / 4096 + 2) * 4096;
        assert!(page + 8192 < end);
        buf[page..page + 4096].fill(0);
        let path = dir.join(segment_name(1));
        std::fs::write(&path, &buf).unwrap();

        let (sm, recovery) = recover(&dir).unwrap();
        for i in 1..=12 {
            assert_eq!(sm.node(&format!("/n{i}")).is_some(), i <= 2, "/n{i}");
        }
        assert_eq!(recovery.torn_bytes_dropped, (end - start) as u64);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), start as u64);
    }

    /// Damage with a whole batch after it is damage to synced data: the
    /// server refuses to guess, names the offset and changes nothing.
    #[test]
    fn damage_before_a_later_batch_stops_recovery() {
        let dir_kept = tempfile::Builder::new()
            .prefix(&format!("baton-{}-", "mid-damage"))
            .tempdir()
            .unwrap();
        let dir = dir_kept.path().to_path_buf();
        let (mut wal, mark) = start(&dir, FsyncPolicy::Always, 0);
        for i in 1..=3 {
            wal.append(i, &create(i, 100));
            wait_for(&mark, i);
        }
        wal.stop();
        let path = only_segment(&dir);
        let mut buf = std::fs::read(&path).unwrap();
        let (start, _) = batches(&buf)[1];
        buf[start + 40] ^= 1;
        std::fs::write(&path, &buf).unwrap();
        match recover(&dir) {
            Err(PersistError::Corrupt { offset, .. }) => assert_eq!(offset, start as u64),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), buf, "nothing was changed");
    }

    /// Under --fsync never each caller writes its own changes, into the
    /// buffer the write before it left (one grown past the spare's bound by
    /// a large batch is let go): every record is written once, in order.
    #[test]
    fn writes_that_reuse_their_buffer_keep_every_record() {
        let dir_kept = tempfile::Builder::new()
            .prefix(&format!("baton-{}-", "spare"))
            .tempdir()
            .unwrap();
        let dir = dir_kept.path().to_path_buf();
        let (mut wal, mark) = start(&dir, FsyncPolicy::Never, 0);
        let sizes = [100, 10, 100_000, 50, 3, 70_000, 1];
        for (i, &len) in (1u64..).zip(&sizes) {
            wal.append(i, &create(i, len));
            mark.hurry();
            assert_eq!(mark.get(), i, "written by the caller");
        }
        wal.stop();
        let (sm, recovery) = recover(&dir).unwrap();
        assert_eq!(recovery.torn_bytes_dropped, 0);
        assert_eq!(sm.revision(), sizes.len() as u64);
        for (i, &len) in (1u64..).zip(&sizes) {
            let node = sm.node(&format!("/n{i}")).expect("recovered");
            assert_eq!((node.czxid(), node.data_len()), (i, len));
        }
    }

    /// A segment written under --fsync never is never synced: after a power
    /// loss its damage is lost tail, wherever it is. Recovery cuts the log at
    /// the damage and sets aside the segments after it.
    #[test]
    fn damage_in_an_unsynced_segment_cuts_the_log_there() {
        let dir_kept = tempfile::Builder::new()
            .prefix(&format!("baton-{}-", "never"))
            .tempdir()
            .unwrap();
        let dir = dir_kept.path().to_path_buf();
        let (mut wal, mark) = start(&dir, FsyncPolicy::Never, 0);
        for i in 1..=3 {
            // Written one at a time, as three connections' changes are.
            wal.append(i, &create(i, 100));
            mark.hurry();
            assert_eq!(mark.get(), i, "written by the caller");
        }
        wal.stop();
        let first = only_segment(&dir);
        // A later run's segment.
        let (mut wal, mark) = start(&dir, FsyncPolicy::Never, 3);
        // Left to the committer, which looks for leftovers now and then.
        wal.append(4, &create(4, 100));
        wait_for(&mark, 4);
        wal.stop();
        let mut buf = std::fs::read(&first).unwrap();
        let (start, _) = batches(&buf)[1];
        buf[start + 40] ^= 1;
        std::fs::write(&first, &buf).unwrap();

        let (sm, recovery) = recover(&dir).unwrap();
        assert_eq!(sm.revision(), 1);
        assert!(recovery.torn_bytes_dropped > 0);
        let listing = list(&dir).unwrap();
        assert_eq!(listing.segments.len(), 1, "the later segment was set aside");
        assert!(dir.join(format!("{}.dropped", segment_name(4))).exists());
    }
}
