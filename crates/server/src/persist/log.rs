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

use super::record;
use super::segment::{self, LayoutError};
use super::{disk_faults, snapshot, sync_dir, DurableMark, FsyncPolicy, PersistError};
use crate::state::{Proposal, StateMachine};
use crate::stats::Stats;

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
        let damage = match segment::layout(&buf) {
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
                .map(|(at, why)| (at, why, Some(layout))),
            Err(LayoutError::Short) => {
                Some((0, "the file ends inside its header".to_string(), None))
            }
            Err(LayoutError::Damaged(why)) => Some((0, why, None)),
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
            None if next_first.is_none() && at == 0 && why.contains("ends inside") => {
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
) -> Result<Option<(usize, String)>, PersistError> {
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

/// Writes the records queued under `--fsync never` on the calling thread:
/// the connection that made a change writes it (with whatever else is
/// queued, in one write) once it has let go of the core's lock, instead of
/// writing each record under that lock. Weak: the mark holds it, and the
/// log holds the mark.
#[derive(Debug)]
pub(crate) struct Flusher(std::sync::Weak<WalShared>);

impl Flusher {
    /// Writes what is queued, unless the queue holds more than records (a
    /// segment rotation, a cleanup, the stop), which the committer handles:
    /// it is woken for them. The durable mark moves once the write is done.
    pub(crate) fn flush(&self) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let _committing = lock(&shared.committing);
        if shared.broken.load(Ordering::Acquire) {
            return;
        }
        let (mut bytes, last_revision, first_at) = {
            let mut q = lock(&shared.queue);
            if q.bytes.is_empty() {
                return;
            }
            if q.rotate.is_some() || q.cleanup.is_some() || q.stop {
                drop(q);
                shared.ready.notify_one();
                return;
            }
            (
                std::mem::take(&mut q.bytes),
                q.last_revision,
                q.first_at.take(),
            )
        };
        if let Some(at) = first_at {
            Stats::add(&shared.stats.log_batches, 1);
            Stats::add(&shared.stats.log_wait_ns, at.elapsed().as_nanos() as u64);
            shared.stats.metrics.log_batch.observe(bytes.len() as u64);
        }
        segment::end_batch(&mut bytes, 0);
        let started = std::time::Instant::now();
        let written = lock(&shared.segment).write(&bytes);
        Stats::add_since(&shared.stats.log_write_ns, started);
        match written {
            Ok(_) => shared.mark.advance(last_revision),
            Err(e) => fail(&shared, e),
        }
    }
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
    /// Held while a batch is taken from the queue and written (and synced),
    /// by the committer or, under `--fsync never`, by a connection writing
    /// its own changes ([`Flusher`]): batches reach the file in queue order.
    committing: Mutex<()>,
    mark: Arc<DurableMark>,
    stats: Arc<Stats>,
    /// Set (with the reason) when the log can no longer be written.
    failed: watch::Sender<Option<String>>,
    /// Set by the first failed write, before anything else happens: from
    /// then on nothing is written and the durable mark never moves, so
    /// nothing applied later is acknowledged, in either fsync mode.
    broken: AtomicBool,
    snapshot_running: AtomicBool,
    /// The thread writing the latest snapshot.
    snapshotter: Mutex<Option<JoinHandle<()>>>,
    /// The segment being appended to: written by the committer, and under
    /// `--fsync never` by connections writing their own changes.
    segment: Mutex<Segment>,
    /// Bytes appended since the last snapshot was started.
    since_snapshot: AtomicU64,
}

#[derive(Default)]
struct Queue {
    /// Batches of records: a batch header, then records. A second batch
    /// starts at the rotation point, if there is one.
    bytes: Vec<u8>,
    last_revision: u64,
    /// Start a new segment, whose first revision is the second field, after
    /// this many of the queued bytes.
    rotate: Option<(usize, u64)>,
    /// A snapshot at this revision is durable: older files can go.
    cleanup: Option<u64>,
    stop: bool,
    /// When the first of the queued records was queued (for the stats).
    first_at: Option<std::time::Instant>,
    /// The committer waits for work: an append must wake it. (While it
    /// writes or syncs it looks at the queue again before waiting, so a
    /// wake-up, which is a system call, would be wasted.)
    committer_waiting: bool,
}

impl Wal {
    /// Starts the log of a recovered directory: a new segment after the
    /// recovered revision, and the committer. `mark` must stand at the
    /// recovered revision.
    pub(crate) fn start(
        dir: &Path,
        recovered_revision: u64,
        fsync: FsyncPolicy,
        mark: Arc<DurableMark>,
        failed: watch::Sender<Option<String>>,
        stats: Arc<Stats>,
    ) -> Result<Wal, PersistError> {
        // Every run writes a segment of its own, whose header names its fsync
        // policy. A segment already named for the next revision holds no
        // record (recovery reached no further), so it is replaced.
        let first = recovered_revision + 1;
        let stale = dir.join(segment_name(first));
        if stale.exists() {
            std::fs::remove_file(&stale)
                .map_err(|e| PersistError::io(&stale, "replacing an empty log segment", e))?;
        }
        let segment = Segment::create(dir, first, fsync, &stats)?;
        let shared = Arc::new(WalShared {
            dir: dir.to_owned(),
            fsync,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            committing: Mutex::new(()),
            mark,
            stats,
            failed,
            broken: AtomicBool::new(false),
            snapshot_running: AtomicBool::new(false),
            snapshotter: Mutex::new(None),
            segment: Mutex::new(segment),
            since_snapshot: AtomicU64::new(0),
        });
        if fsync == FsyncPolicy::Never {
            shared.mark.set_flusher(Flusher(Arc::downgrade(&shared)));
        }
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
        lock(&self.shared.queue)
    }

    /// Logs the record of an applied command: it is queued. Under `--fsync
    /// always` the committer writes and syncs it; under `--fsync never` the
    /// connection that made it writes it to the operating system (so a crash
    /// of the server loses nothing) once it lets go of the core's lock (see
    /// [`Flusher`]). Either way the durable mark moves only after the write.
    /// After a failed write it does nothing: the change is never
    /// acknowledged.
    pub(crate) fn append(&self, revision: u64, proposal: &Proposal) {
        if self.shared.broken.load(Ordering::Acquire) {
            return;
        }
        let mut q = self.queue();
        let before = q.bytes.len();
        let batch_starts = before == 0 || q.rotate.is_some_and(|(at, _)| at == before);
        if batch_starts {
            segment::begin_batch(&mut q.bytes);
        }
        record::encode(&mut q.bytes, revision, proposal);
        q.first_at.get_or_insert_with(std::time::Instant::now);
        self.shared
            .since_snapshot
            .fetch_add((q.bytes.len() - before) as u64, Ordering::Relaxed);
        q.last_revision = revision;
        let waiting = q.committer_waiting;
        drop(q);
        // Under `--fsync never` the connection that made the change writes
        // it once it has let go of the core's lock (`DurableMark::hurry`),
        // together with the others it made meanwhile; the committer looks
        // every few milliseconds for any left over.
        if self.shared.fsync == FsyncPolicy::Always && waiting {
            self.shared.ready.notify_one();
        }
    }

    /// Bytes logged since the last snapshot began.
    pub(crate) fn since_snapshot(&self) -> u64 {
        self.shared.since_snapshot.load(Ordering::Relaxed)
    }

    /// Whether a snapshot may start now: none is running and the log has
    /// not failed. Checked before the state is copied for one.
    pub(crate) fn snapshot_wanted(&self, every_bytes: u64) -> bool {
        self.since_snapshot() >= every_bytes
            && !self.shared.snapshot_running.load(Ordering::Acquire)
            && !self.shared.broken.load(Ordering::Acquire)
    }

    /// Starts a snapshot of `sm` (a copy taken under the core lock) in the
    /// background, unless one is running or the log has failed. The log
    /// moves to a new segment at the snapshot's revision; once the snapshot
    /// is durable (synced, in either fsync mode) the older segments and
    /// snapshots are removed.
    pub(crate) fn snapshot(&self, sm: StateMachine) {
        if self.shared.broken.load(Ordering::Acquire)
            || self.shared.snapshot_running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let revision = sm.revision();
        self.shared.since_snapshot.store(0, Ordering::Relaxed);
        {
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
                match snapshot::write(&shared.dir, &sm, &shared.stats) {
                    Ok(path) => {
                        info!(revision, file = %path.display(), ms = started.elapsed().as_millis() as u64, "snapshot written");
                        Stats::add(&shared.stats.snapshots, 1);
                        let metrics = &shared.stats.metrics;
                        metrics.snapshot.observe_duration(started.elapsed());
                        if let Ok(meta) = std::fs::metadata(&path) {
                            metrics.snapshot_bytes.store(meta.len(), Ordering::Relaxed);
                        }
                        // The committer removes what the snapshot replaced,
                        // after the rotation queued before it, and only then
                        // lets the next snapshot start.
                        lock(&shared.queue).cleanup = Some(revision);
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
        match spawned {
            Ok(thread) => *lock(&self.shared.snapshotter) = Some(thread),
            Err(e) => {
                error!("cannot start a snapshot thread: {e}");
                self.shared.snapshot_running.store(false, Ordering::Release);
            }
        }
    }

    /// Lets a running snapshot finish (so that nothing writes into the data
    /// directory once the server has stopped), writes out what is queued and
    /// stops the committer.
    pub(crate) fn stop(&mut self) {
        if let Some(thread) = lock(&self.shared.snapshotter).take() {
            let _ = thread.join();
        }
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
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The log can no longer be written: nothing after this point can be made
/// durable, and what was applied in memory but not logged must never be
/// acknowledged. The mark stays where it is, no later write or snapshot
/// starts, and the server stops.
fn fail(shared: &WalShared, e: PersistError) {
    shared.broken.store(true, Ordering::Release);
    error!("{e}; stopping the server");
    shared.mark.stop();
    shared.failed.send_replace(Some(e.to_string()));
}

impl Segment {
    /// A new segment whose first record will be `first_revision`, with its
    /// header written.
    fn create(
        dir: &Path,
        first_revision: u64,
        fsync: FsyncPolicy,
        stats: &Stats,
    ) -> Result<Segment, PersistError> {
        let path = dir.join(segment_name(first_revision));
        let mut file = disk_faults::before_create()
            .and_then(|()| OpenOptions::new().create_new(true).append(true).open(&path))
            .map_err(|e| PersistError::io(&path, "creating a log segment", e))?;
        file.write_all(&segment::header(fsync))
            .map_err(|e| PersistError::io(&path, "writing a log segment's header", e))?;
        if fsync == FsyncPolicy::Always {
            sync_dir(dir, stats)?;
        }
        Ok(Segment {
            file,
            path,
            first_revision,
        })
    }

    /// [`Segment::create`] for a rotation: `None` if the new segment could
    /// not be made (a file system out of inodes, say) and nothing of it is
    /// left; the records then go on in the current segment, which stays
    /// until a snapshot holds all of them, and the next snapshot rotates
    /// again. A failed rotation costs only disk space, as a failed snapshot
    /// does; a part of the new segment that cannot be removed is an error
    /// (recovery would find a segment without its records).
    fn rotate_to(
        dir: &Path,
        first_revision: u64,
        fsync: FsyncPolicy,
        stats: &Stats,
    ) -> Result<Option<Segment>, PersistError> {
        let e = match Segment::create(dir, first_revision, fsync, stats) {
            Ok(segment) => return Ok(Some(segment)),
            Err(e) => e,
        };
        // A file by that name that this rotation did not make is not its
        // to remove.
        if matches!(&e, PersistError::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists)
        {
            return Err(e);
        }
        let path = dir.join(segment_name(first_revision));
        match std::fs::remove_file(&path) {
            Ok(()) => {
                if fsync == FsyncPolicy::Always {
                    sync_dir(dir, stats)?;
                }
            }
            Err(gone) if gone.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return Err(e),
        }
        warn!("{e}: the log goes on in its current segment, kept until a snapshot holds all of it");
        Ok(None)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<usize, PersistError> {
        let written = match disk_faults::torn_write(bytes.len()) {
            Some(part) => self
                .file
                .write_all(&bytes[..part])
                .and_then(|()| Err(disk_faults::no_space())),
            None => self.file.write_all(bytes),
        };
        written
            .map(|()| bytes.len())
            .map_err(|e| PersistError::io(&self.path, "writing the log", e))
    }

    fn sync(&mut self, stats: &Stats) -> Result<(), PersistError> {
        Stats::add(&stats.syncs, 1);
        disk_faults::before_sync();
        self.file
            .sync_data()
            .map_err(|e| PersistError::io(&self.path, "syncing the log", e))
    }
}

/// Writes queued batches (and syncs them under `--fsync always`), advances
/// the durable mark; rotates segments and removes files a snapshot made
/// obsolete. Under `--fsync never` connections write their own changes, and
/// this thread writes what they left and does the rest.
fn commit_loop(shared: &WalShared) {
    let always = shared.fsync == FsyncPolicy::Always;
    let mut spare = Vec::new();
    loop {
        let mut slept = false;
        {
            let mut q = lock(&shared.queue);
            while q.bytes.is_empty() && q.rotate.is_none() && q.cleanup.is_none() && !q.stop {
                slept = true;
                q.committer_waiting = true;
                q = if always {
                    shared.ready.wait(q).unwrap_or_else(|e| e.into_inner())
                } else {
                    // Appends do not wake the committer under `--fsync
                    // never` (their connections write them): it looks for
                    // any left over now and then.
                    let timeout = std::time::Duration::from_millis(5);
                    shared
                        .ready
                        .wait_timeout(q, timeout)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                };
                q.committer_waiting = false;
            }
        }
        // Taken before the batch and held until it is written: under
        // `--fsync never` a connection may have written the records meanwhile.
        let committing = lock(&shared.committing);
        let (mut bytes, last_revision, rotate, cleanup, stop, first_at) = {
            let mut q = lock(&shared.queue);
            let bytes = std::mem::replace(&mut q.bytes, std::mem::take(&mut spare));
            (
                bytes,
                q.last_revision,
                q.rotate.take(),
                q.cleanup.take(),
                q.stop,
                q.first_at.take(),
            )
        };
        if let Some(at) = first_at {
            let waited = at.elapsed().as_nanos() as u64;
            Stats::add(&shared.stats.log_batches, 1);
            shared.stats.metrics.log_batch.observe(bytes.len() as u64);
            Stats::add(&shared.stats.log_wait_ns, waited);
            if slept {
                // The writer was idle: the wait was its wake-up alone.
                Stats::add(&shared.stats.log_batches_woken, 1);
                Stats::add(&shared.stats.log_wake_ns, waited);
            }
        }
        if shared.broken.load(Ordering::Acquire) {
            return;
        }
        let split = rotate.map_or(bytes.len(), |(at, _)| at);
        let (before, after) = bytes.split_at_mut(split);
        for part in [&mut *before, &mut *after] {
            if !part.is_empty() {
                segment::end_batch(part, 0);
            }
        }
        let mut segment = lock(&shared.segment);
        let result = (|| {
            for (i, part) in [&*before, &*after].into_iter().enumerate() {
                if i == 1 {
                    let Some((_, first)) = rotate else { break };
                    if let Some(next) =
                        Segment::rotate_to(&shared.dir, first, shared.fsync, &shared.stats)?
                    {
                        *segment = next;
                    }
                }
                if !part.is_empty() {
                    let started = std::time::Instant::now();
                    segment.write(part)?;
                    Stats::add_since(&shared.stats.log_write_ns, started);
                    if always {
                        let started = std::time::Instant::now();
                        segment.sync(&shared.stats)?;
                        shared.stats.log_synced(started.elapsed());
                    }
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
        drop(committing);
        bytes.clear();
        spare = bytes;
        if let Some(revision) = cleanup {
            remove_obsolete(&shared.dir, revision, current);
            shared.snapshot_running.store(false, Ordering::Release);
        }
        if stop && lock(&shared.queue).bytes.is_empty() {
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

#[cfg(test)]
mod recovery_tests {
    use super::*;
    use baton_proto::{CreateMode, SessionId};
    use bytes::Bytes;
    use std::time::Duration;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("baton-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

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
        let dir = scratch("torn-batch");
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
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Damage with a whole batch after it is damage to synced data: the
    /// server refuses to guess, names the offset and changes nothing.
    #[test]
    fn damage_before_a_later_batch_stops_recovery() {
        let dir = scratch("mid-damage");
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
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A segment written under --fsync never is never synced: after a power
    /// loss its damage is lost tail, wherever it is. Recovery cuts the log at
    /// the damage and sets aside the segments after it.
    #[test]
    fn damage_in_an_unsynced_segment_cuts_the_log_there() {
        let dir = scratch("never");
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
        let _ = std::fs::remove_dir_all(&dir);
    }
}
