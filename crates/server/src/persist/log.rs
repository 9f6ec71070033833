//! Log segments, the committer thread, and recovery.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;
use tracing::{error, info, warn};

use super::record::{self, Read as RecordRead};
use super::{snapshot, sync_dir, DurableMark, FsyncPolicy, PersistError};
use crate::state::{Command, StateMachine};

fn segment_name(first_revision: u64) -> String {
    format!("wal-{first_revision:020}.log")
}

/// Revision named in a data file's name, for `prefix<20 digits><suffix>`.
fn named_revision(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

/// The data files found in a directory, oldest first.
struct Listing {
    snapshots: Vec<(u64, PathBuf)>,
    segments: Vec<(u64, PathBuf)>,
    /// Snapshots whose writing was cut short: never renamed into place, so
    /// never relied upon (or being written right now, outside recovery).
    temporary: Vec<PathBuf>,
}

fn list(dir: &Path) -> Result<Listing, PersistError> {
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
    /// Bytes of a torn last record that were dropped.
    pub torn_bytes_dropped: u64,
    /// The recovered revision.
    pub revision: u64,
}

/// Recovers the state kept in `dir`: the newest snapshot, then every log
/// record after it. A torn last record (a write cut short by a crash) is
/// dropped; any other damage is an error that names the file and offset, and
/// then nothing in the directory has been changed.
///
/// # Errors
/// [`PersistError::Corrupt`] or an I/O error.
pub fn recover(dir: &Path) -> Result<(StateMachine, Recovery), PersistError> {
    let listing = list(dir)?;
    let (sm, torn) = replay(dir, &listing)?;
    for tmp in &listing.temporary {
        let _ = std::fs::remove_file(tmp);
    }
    if let Some((path, offset, len)) = &torn {
        // Only now that everything else checked out.
        warn!(file = %path.display(), offset, "dropping a torn last record of {len} bytes");
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| PersistError::io(path, "opening the log to drop a torn record", e))?;
        file.set_len(*offset)
            .and_then(|()| file.sync_all())
            .map_err(|e| PersistError::io(path, "dropping a torn record", e))?;
    }
    let recovery = Recovery {
        snapshot_revision: sm.1,
        records_replayed: sm.2,
        torn_bytes_dropped: torn.map_or(0, |(_, _, len)| len),
        revision: sm.0.revision(),
    };
    Ok((sm.0, recovery))
}

type Replayed = ((StateMachine, u64, u64), Option<(PathBuf, u64, u64)>);

fn replay(_dir: &Path, listing: &Listing) -> Result<Replayed, PersistError> {
    let (mut sm, snapshot_revision) = match listing.snapshots.last() {
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
    let mut replayed = 0u64;
    let mut torn = None;
    let last = listing.segments.len().saturating_sub(1);
    for (i, (_, path)) in listing.segments.iter().enumerate() {
        let mut buf = Vec::new();
        File::open(path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|e| PersistError::io(path, "reading the log", e))?;
        let corrupt = |offset: usize, what: String| PersistError::Corrupt {
            file: path.clone(),
            offset: offset as u64,
            what,
        };
        let mut at = 0usize;
        while at < buf.len() {
            match record::read(&buf[at..]) {
                RecordRead::Record {
                    revision,
                    now_ms,
                    command,
                    size,
                } => {
                    if revision > sm.revision() {
                        // A record takes the next revision, or more when a
                        // sequential create passed over taken names: either
                        // way applying it must give the revision it names.
                        let before = sm.revision();
                        let applied = sm.apply(&command, now_ms);
                        if let Err(e) = applied.result {
                            return Err(corrupt(
                                at,
                                format!("record for revision {revision} does not apply: {e}"),
                            ));
                        }
                        if applied.revision != revision {
                            return Err(corrupt(
                                at,
                                format!(
                                    "the record for revision {revision} follows revision {before} but applies as {}: records are missing before it",
                                    applied.revision
                                ),
                            ));
                        }
                        replayed += 1;
                    }
                    at += size;
                }
                found @ (RecordRead::Short | RecordRead::Invalid(_)) => {
                    let why = match found {
                        RecordRead::Invalid(why) => why,
                        _ => "the file ends inside a record".to_string(),
                    };
                    if i != last || valid_record_after(&buf, at) {
                        return Err(corrupt(at, why));
                    }
                    torn = Some((path.clone(), at as u64, (buf.len() - at) as u64));
                    break;
                }
            }
        }
    }
    Ok(((sm, snapshot_revision, replayed), torn))
}

/// Whether a whole valid record starts anywhere after `at`: if so, the bad
/// record at `at` is damage in the middle of the log, not a torn tail.
fn valid_record_after(buf: &[u8], at: usize) -> bool {
    (at + 1..buf.len()).any(|p| matches!(record::read(&buf[p..]), RecordRead::Record { .. }))
}

/// Appending side of the log, owned by the core.
pub(crate) struct Wal {
    shared: Arc<WalShared>,
    committer: Option<JoinHandle<()>>,
}

struct WalShared {
    dir: PathBuf,
    fsync: FsyncPolicy,
    queue: Mutex<Queue>,
    ready: Condvar,
    mark: Arc<DurableMark>,
    /// Set (with the reason) when the log can no longer be written.
    failed: watch::Sender<Option<String>>,
    snapshot_running: AtomicBool,
    /// The segment being appended to: written by the committer under
    /// `--fsync always`, directly by `append` under `--fsync never`.
    segment: Mutex<Segment>,
    /// Bytes appended since the last snapshot was started.
    since_snapshot: AtomicU64,
}

#[derive(Default)]
struct Queue {
    bytes: Vec<u8>,
    last_revision: u64,
    /// Start a new segment, whose first revision is the second field, after
    /// this many of the queued bytes.
    rotate: Option<(usize, u64)>,
    /// A snapshot at this revision is durable: older files can go.
    cleanup: Option<u64>,
    stop: bool,
}

impl Wal {
    /// Opens the log of a recovered directory for appending and starts the
    /// committer. `mark` must stand at the recovered revision.
    pub(crate) fn start(
        dir: &Path,
        recovered_revision: u64,
        fsync: FsyncPolicy,
        mark: Arc<DurableMark>,
        failed: watch::Sender<Option<String>>,
    ) -> Result<Wal, PersistError> {
        let listing = list(dir)?;
        let segment = match listing.segments.last() {
            Some((first, path)) => Segment::open(path, *first)?,
            None => Segment::create(dir, recovered_revision + 1, fsync)?,
        };
        let shared = Arc::new(WalShared {
            dir: dir.to_owned(),
            fsync,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            mark,
            failed,
            snapshot_running: AtomicBool::new(false),
            segment: Mutex::new(segment),
            since_snapshot: AtomicU64::new(0),
        });
        let committer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("baton-wal".into())
                .spawn(move || commit_loop(&shared))
                .map_err(|e| PersistError::io(dir, "starting the log writer thread", e))?
        };
        Ok(Wal {
            shared,
            committer: Some(committer),
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.shared.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs the record of an applied command. Under `--fsync always` it is
    /// queued for the committer, which syncs it; under `--fsync never` it is
    /// written to the operating system at once (so a crash of the server
    /// loses nothing) and is as durable as it will get.
    pub(crate) fn append(&self, revision: u64, now_ms: u64, command: &Command) {
        if self.shared.fsync == FsyncPolicy::Never {
            let mut segment = lock(&self.shared.segment);
            if segment.broken {
                // Nothing may follow a record that could not be written.
                return;
            }
            let mut record = std::mem::take(&mut segment.scratch);
            record.clear();
            record::encode(&mut record, revision, now_ms, command);
            let written = segment.write(&record);
            self.shared
                .since_snapshot
                .fetch_add(record.len() as u64, Ordering::Relaxed);
            segment.scratch = record;
            match written {
                Ok(()) => {
                    drop(segment);
                    self.shared.mark.advance(revision);
                }
                Err(e) => {
                    segment.broken = true;
                    drop(segment);
                    fail(&self.shared, e);
                }
            }
            return;
        }
        let mut q = self.queue();
        let before = q.bytes.len();
        record::encode(&mut q.bytes, revision, now_ms, command);
        self.shared
            .since_snapshot
            .fetch_add((q.bytes.len() - before) as u64, Ordering::Relaxed);
        q.last_revision = revision;
        drop(q);
        self.shared.ready.notify_one();
    }

    /// Bytes logged since the last snapshot began.
    pub(crate) fn since_snapshot(&self) -> u64 {
        self.shared.since_snapshot.load(Ordering::Relaxed)
    }

    /// Starts a snapshot of `sm` (a copy taken under the core lock) in the
    /// background, unless one is running. The log moves to a new segment at
    /// the snapshot's revision; once the snapshot is durable the older
    /// segments and snapshots are removed.
    pub(crate) fn snapshot(&self, sm: StateMachine) {
        if self.shared.snapshot_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let revision = sm.revision();
        self.shared.since_snapshot.store(0, Ordering::Relaxed);
        if self.shared.fsync == FsyncPolicy::Never {
            // Everything up to the snapshot's revision is written already.
            let mut segment = lock(&self.shared.segment);
            match Segment::create(&self.shared.dir, revision + 1, self.shared.fsync) {
                Ok(next) => *segment = next,
                Err(e) => {
                    drop(segment);
                    fail(&self.shared, e);
                    self.shared.snapshot_running.store(false, Ordering::Release);
                    return;
                }
            }
        } else {
            let mut q = self.queue();
            let at = q.bytes.len();
            q.rotate = Some((at, revision + 1));
            drop(q);
            self.shared.ready.notify_one();
        }
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("baton-snapshot".into())
            .spawn(move || {
                let started = Instant::now();
                match snapshot::write(&shared.dir, &sm, shared.fsync == FsyncPolicy::Always) {
                    Ok(path) => {
                        info!(revision, file = %path.display(), ms = started.elapsed().as_millis() as u64, "snapshot written");
                        // The committer removes what the snapshot replaced,
                        // after the rotation queued before it, and only then
                        // lets the next snapshot start.
                        shared.queue.lock().unwrap_or_else(|e| e.into_inner()).cleanup = Some(revision);
                        shared.ready.notify_one();
                    }
                    // The log still holds everything: a failed snapshot costs
                    // only disk space and recovery time.
                    Err(e) => {
                        error!("snapshot at revision {revision} failed: {e}");
                        shared.snapshot_running.store(false, Ordering::Release);
                    }
                }
            });
        if let Err(e) = spawned {
            error!("cannot start a snapshot thread: {e}");
            self.shared.snapshot_running.store(false, Ordering::Release);
        }
    }

    /// Writes out what is queued and stops the committer.
    pub(crate) fn stop(&mut self) {
        self.queue().stop = true;
        self.shared.ready.notify_one();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The segment being appended to.
struct Segment {
    file: File,
    path: PathBuf,
    first_revision: u64,
    /// A reusable buffer for records written directly.
    scratch: Vec<u8>,
    /// A write failed: nothing more is written to this log.
    broken: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The log can no longer be written: nothing after this point can be made
/// durable, and what was applied in memory but not logged must never be
/// acknowledged. The mark stays where it is and the server stops.
fn fail(shared: &WalShared, e: PersistError) {
    error!("{e}; stopping the server");
    shared.failed.send_replace(Some(e.to_string()));
}

impl Segment {
    fn create(
        dir: &Path,
        first_revision: u64,
        fsync: FsyncPolicy,
    ) -> Result<Segment, PersistError> {
        let path = dir.join(segment_name(first_revision));
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| PersistError::io(&path, "creating a log segment", e))?;
        if fsync == FsyncPolicy::Always {
            sync_dir(dir)?;
        }
        Ok(Segment {
            file,
            path,
            first_revision,
            scratch: Vec::new(),
            broken: false,
        })
    }

    fn open(path: &Path, first_revision: u64) -> Result<Segment, PersistError> {
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| PersistError::io(path, "opening the log for appending", e))?;
        Ok(Segment {
            file,
            path: path.to_owned(),
            first_revision,
            scratch: Vec::new(),
            broken: false,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), PersistError> {
        self.file
            .write_all(bytes)
            .map_err(|e| PersistError::io(&self.path, "writing the log", e))
    }

    fn sync(&mut self) -> Result<(), PersistError> {
        self.file
            .sync_data()
            .map_err(|e| PersistError::io(&self.path, "syncing the log", e))
    }
}

/// Writes queued records, syncs them, advances the durable mark; rotates
/// segments and removes files a snapshot made obsolete.
fn commit_loop(shared: &WalShared) {
    let always = shared.fsync == FsyncPolicy::Always;
    let mut spare = Vec::new();
    loop {
        let (mut bytes, last_revision, rotate, cleanup, stop) = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            while q.bytes.is_empty() && q.rotate.is_none() && q.cleanup.is_none() && !q.stop {
                q = shared.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            let bytes = std::mem::replace(&mut q.bytes, std::mem::take(&mut spare));
            (
                bytes,
                q.last_revision,
                q.rotate.take(),
                q.cleanup.take(),
                q.stop,
            )
        };
        let mut segment = lock(&shared.segment);
        let result = (|| {
            let split = rotate.map_or(bytes.len(), |(at, _)| at);
            segment.write(&bytes[..split])?;
            if always && split > 0 {
                segment.sync()?;
            }
            if let Some((_, first)) = rotate {
                *segment = Segment::create(&shared.dir, first, shared.fsync)?;
                segment.write(&bytes[split..])?;
                if always && split < bytes.len() {
                    segment.sync()?;
                }
            }
            Ok::<(), PersistError>(())
        })();
        let current = segment.first_revision;
        drop(segment);
        if let Err(e) = result {
            fail(shared, e);
            return;
        }
        if !bytes.is_empty() {
            shared.mark.advance(last_revision);
        }
        bytes.clear();
        spare = bytes;
        if let Some(revision) = cleanup {
            remove_obsolete(&shared.dir, revision, current);
            shared.snapshot_running.store(false, Ordering::Release);
        }
        if stop
            && shared
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .bytes
                .is_empty()
        {
            return;
        }
    }
}

/// Removes the snapshots older than the one at `snapshot` and the segments
/// before the current one (all their records are in that snapshot).
fn remove_obsolete(dir: &Path, snapshot: u64, current_segment: u64) {
    let Ok(listing) = list(dir) else { return };
    for (rev, path) in &listing.snapshots {
        if *rev < snapshot {
            let _ = std::fs::remove_file(path);
        }
    }
    // A segment holds the records from its first revision up to the next
    // segment's first: it can go only when all of those are in the snapshot.
    for pair in listing.segments.windows(2) {
        let ((first, path), (next, _)) = (&pair[0], &pair[1]);
        if *first < current_segment && *next <= snapshot + 1 {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_segments_wholly_inside_the_snapshot_are_removed() {
        let dir = std::env::temp_dir().join(format!("baton-obsolete-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for first in [1u64, 50, 101] {
            std::fs::write(dir.join(segment_name(first)), b"").unwrap();
        }
        std::fs::write(dir.join("snapshot-00000000000000000010.snap.tmp"), b"").unwrap();
        // Records 50..=100 are not all in a snapshot at 60: that segment stays.
        remove_obsolete(&dir, 60, 101);
        let left = list(&dir).unwrap();
        let firsts: Vec<u64> = left.segments.iter().map(|(f, _)| *f).collect();
        assert_eq!(firsts, [50, 101]);
        // A snapshot being written is not touched outside recovery.
        assert_eq!(left.temporary.len(), 1);
        remove_obsolete(&dir, 100, 101);
        let firsts: Vec<u64> = list(&dir)
            .unwrap()
            .segments
            .iter()
            .map(|(f, _)| *f)
            .collect();
        assert_eq!(firsts, [101]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
