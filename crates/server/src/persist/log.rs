//! The write-ahead log: segments, and the committer thread that writes and
//! syncs them in groups (recovery reads them back: `recovery.rs`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;
use tracing::{error, info, warn};

use super::record;
use super::recovery::{list, segment_name};
use super::segment;
use super::{disk_faults, snapshot, sync_dir, DurableMark, FsyncPolicy, PersistError};
use crate::state::{Proposal, StateMachine};
use crate::stats::Stats;

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
        let mut spare = lock(&shared.committing);
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
                std::mem::replace(&mut q.bytes, std::mem::take(&mut *spare)),
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
        // The next flush appends into this buffer rather than grow a new one
        // from nothing; a buffer grown large by a burst is let go.
        if bytes.capacity() <= SPARE_MAX {
            bytes.clear();
            *spare = bytes;
        }
    }
}

/// Largest write buffer a flush keeps for the next one.
const SPARE_MAX: usize = 64 * 1024;

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
    /// It holds the flushers' spare buffer (a written batch's, cleared) for
    /// the queue to fill next.
    committing: Mutex<Vec<u8>>,
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
            committing: Mutex::new(Vec::new()),
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
