//! A member's replicated log on a simulated disk: what is written is kept
//! in order, and only what the disk has synced survives a crash that loses
//! unsynced writes. An append is reported stored (openraft's flush
//! callback) only once synced, as the real log store does with `fsync
//! always`; a vote is synced before it is reported saved.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    ErrorSubject, ErrorVerb, OptionalSend, RaftLogId, RaftLogReader, StorageError, StorageIOError,
};

use crate::types::{Entry, LogId, NodeId, TypeConfig, Vote};

/// One write to the log, in the order made.
#[derive(Clone)]
enum Write {
    Append(Vec<Entry>),
    /// Entries from this index on are cut.
    Truncate(u64),
}

/// What a member's disk holds, across its crashes.
#[derive(Default)]
pub(super) struct Disk {
    writes: Vec<Write>,
    /// Writes synced: a prefix of `writes`.
    synced: usize,
    /// The vote, synced before it is reported saved.
    vote: Option<Vote>,
    /// Written in place and never synced, as the real log store keeps it.
    committed: Option<LogId>,
    /// Bumped by each crash: the log stores of an earlier life write
    /// nothing more.
    life: u64,
    /// Flush callbacks waiting for the next sync.
    flushes: Vec<LogFlushed<TypeConfig>>,
    /// A defect, to show the simulation finds it: appends are reported
    /// stored as soon as they are written.
    pub(super) stored_before_sync: bool,
}

impl Disk {
    /// An empty disk; with `stored_before_sync`, the defect.
    pub(super) fn new(stored_before_sync: bool) -> Disk {
        Disk {
            stored_before_sync,
            ..Disk::default()
        }
    }

    /// Syncs everything written; reports the appends now stored.
    pub(super) fn sync(&mut self) {
        self.synced = self.writes.len();
        for flushed in std::mem::take(&mut self.flushes) {
            flushed.log_io_completed(Ok(()));
        }
    }

    /// The member's process dies; with `lose`, what was not synced is lost
    /// too (the machine's power went).
    pub(super) fn crash(&mut self, lose: bool) {
        self.life += 1;
        self.flushes.clear();
        if lose {
            self.writes.truncate(self.synced);
            self.committed = None;
        }
    }

    /// The entries the writes leave, by index.
    fn entries(&self) -> BTreeMap<u64, Entry> {
        let mut entries = BTreeMap::new();
        for write in &self.writes {
            match write {
                Write::Append(new) => {
                    for e in new {
                        entries.insert(e.get_log_id().index, e.clone());
                    }
                }
                Write::Truncate(from) => {
                    entries.split_off(from);
                }
            }
        }
        entries
    }

    /// Entries held (synced or not), for the trace.
    pub(super) fn last_index(&self) -> Option<u64> {
        self.entries().keys().next_back().copied()
    }
}

/// The log store of one life of a member.
#[derive(Clone)]
pub(super) struct SimLog {
    disk: Arc<Mutex<Disk>>,
    life: u64,
    /// The entries as this life sees them (what the disk held at start,
    /// and what it wrote since).
    entries: Arc<Mutex<BTreeMap<u64, Entry>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn dead() -> StorageError<NodeId> {
    StorageError::IO {
        source: StorageIOError::new(
            ErrorSubject::Logs,
            ErrorVerb::Write,
            openraft::AnyError::error("the member crashed"),
        ),
    }
}

impl SimLog {
    /// The log a member starting now finds on `disk`.
    pub(super) fn open(disk: Arc<Mutex<Disk>>) -> SimLog {
        let (life, entries) = {
            let d = lock(&disk);
            (d.life, d.entries())
        };
        SimLog {
            disk,
            life,
            entries: Arc::new(Mutex::new(entries)),
        }
    }

    /// The disk, if this life has not ended.
    fn disk(&self) -> Result<MutexGuard<'_, Disk>, StorageError<NodeId>> {
        let disk = lock(&self.disk);
        if disk.life == self.life {
            Ok(disk)
        } else {
            Err(dead())
        }
    }
}

impl RaftLogReader<TypeConfig> for SimLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        Ok(lock(&self.entries)
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for SimLog {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last = lock(&self.entries)
            .values()
            .next_back()
            .map(|e| *e.get_log_id());
        Ok(LogState {
            last_purged_log_id: None,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError<NodeId>> {
        self.disk()?.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError<NodeId>> {
        Ok(self.disk()?.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId>,
    ) -> Result<(), StorageError<NodeId>> {
        self.disk()?.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<NodeId>> {
        Ok(self.disk()?.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut disk = self.disk()?;
        {
            let mut mine = lock(&self.entries);
            for e in &entries {
                mine.insert(e.get_log_id().index, e.clone());
            }
        }
        disk.writes.push(Write::Append(entries));
        if disk.stored_before_sync {
            callback.log_io_completed(Ok(()));
        } else {
            disk.flushes.push(callback);
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        let mut disk = self.disk()?;
        lock(&self.entries).split_off(&log_id.index);
        disk.writes.push(Write::Truncate(log_id.index));
        Ok(())
    }

    async fn purge(&mut self, _log_id: LogId) -> Result<(), StorageError<NodeId>> {
        // The simulation takes no snapshots, so openraft purges nothing.
        Ok(())
    }
}
