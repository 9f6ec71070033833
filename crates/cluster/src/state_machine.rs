//! The replicated log's state machine: the member's own Baton state
//! machine, fed through its server's [`Applier`].
//!
//! Committed entries are applied in log order; a proposal carries the time
//! its leader stamped it with, so every member computes the same state,
//! revisions, sequence numbers and fencing tokens included.
//!
//! # Snapshots
//! A snapshot is Baton's own snapshot format after one framed record
//! holding the log's metadata (the last log id it includes and the
//! membership then):
//! ```text
//! record (len, len_crc, payload_crc), payload: bincode of the metadata
//! then a Baton snapshot (docs: persist::snapshot)
//! ```
//! The same bytes are the file `raft/snapshot` and what a member far behind
//! receives. Taking one costs an O(1) copy of the state; it is written out
//! on a blocking thread.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use baton_server::persist::disk_faults;
use baton_server::Applier;
use baton_state::format::record::{self, Frame};
use baton_state::format::snapshot;
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError};
use tracing::info;

use crate::joining::Joining;
use crate::types::{
    Applied, Change, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership,
    TypeConfig,
};

/// The state machine of one member. Cheap to clone.
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Arc<Inner>,
}

struct Inner {
    applier: Applier,
    /// Told of every membership applied, while the member is being added.
    joining: Option<Arc<Joining>>,
    path: PathBuf,
    /// The log position of the state, and the membership as of it. Held
    /// while an entry is applied, so a snapshot's copy and its metadata
    /// always agree.
    applied: Mutex<Position>,
    /// The latest snapshot, as bytes.
    current: Mutex<Option<(SnapshotMeta, Arc<Vec<u8>>)>>,
    snapshots: AtomicU64,
}

#[derive(Clone, Default)]
struct Position {
    last: Option<LogId>,
    membership: StoredMembership,
}

/// Why a member's snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The snapshot file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The snapshot file holds something other than a snapshot.
    #[error("{}: {why}", path.display())]
    Damaged {
        path: PathBuf,
        #[source]
        why: SnapshotDamage,
    },
    /// The metadata of a snapshot to write does not encode.
    #[error(transparent)]
    Encode(bincode::Error),
    /// The directory of a snapshot to write could not be made.
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A snapshot could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What is wrong with a snapshot's bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotDamage {
    /// The record of its metadata is damaged.
    #[error("the snapshot's metadata is damaged")]
    Metadata,
    /// The record of its metadata holds but does not decode.
    #[error("the snapshot's metadata does not decode: {0}")]
    MetadataDecode(#[source] bincode::Error),
    /// The state after the metadata, damaged at the offset the error
    /// gives (from the start of the snapshot).
    #[error("damaged {0}")]
    State(#[source] snapshot::Corrupt),
    /// Installed, it is not the snapshot it was sent as.
    #[error("the snapshot's metadata does not match what was sent with it")]
    NotAsSent,
}

/// `e` as openraft's storage error: its message first, then those of its
/// sources.
fn snapshot_error(verb: ErrorVerb, e: &(dyn std::error::Error + 'static)) -> StorageError {
    StorageError::IO {
        source: StorageIOError::new(
            ErrorSubject::Snapshot(None),
            verb,
            openraft::AnyError::error(e),
        ),
    }
}

impl StateMachineStore {
    /// The state machine behind `applier`, starting from the snapshot kept
    /// in `dir`, if any.
    ///
    /// # Errors
    /// A snapshot file that cannot be read or is damaged.
    pub fn open(
        dir: &Path,
        applier: Applier,
        joining: Option<Arc<Joining>>,
    ) -> Result<StateMachineStore, SnapshotError> {
        let path = dir.join("snapshot");
        let store = StateMachineStore {
            inner: Arc::new(Inner {
                applier,
                joining,
                path: path.clone(),
                applied: Mutex::new(Position::default()),
                current: Mutex::new(None),
                snapshots: AtomicU64::new(0),
            }),
        };
        match std::fs::read(&path) {
            Ok(bytes) => {
                let meta = store.load(&bytes).map_err(|why| SnapshotError::Damaged {
                    path: path.clone(),
                    why,
                })?;
                info!(last = ?meta.last_log_id, "state restored from the member's snapshot");
                *store.current() = Some((meta, Arc::new(bytes)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(SnapshotError::Read { path, source }),
        }
        Ok(store)
    }

    fn applied(&self) -> MutexGuard<'_, Position> {
        self.inner.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The log index of the last entry applied to the member's state (or
    /// installed with a snapshot). openraft's metrics say it too, but only
    /// once its core has taken the state machine's report, which may be
    /// a while later.
    pub(crate) fn applied_index(&self) -> Option<u64> {
        self.applied().last.map(|l| l.index)
    }

    fn current(&self) -> MutexGuard<'_, Option<(SnapshotMeta, Arc<Vec<u8>>)>> {
        self.inner.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs the state a snapshot's bytes hold, returning its metadata.
    fn load(&self, bytes: &[u8]) -> Result<SnapshotMeta, SnapshotDamage> {
        let Frame::Whole { payload, size } = record::read_frame(bytes) else {
            return Err(SnapshotDamage::Metadata);
        };
        let meta: SnapshotMeta =
            bincode::deserialize(payload).map_err(SnapshotDamage::MetadataDecode)?;
        let sm = snapshot::decode(&bytes[size..]).map_err(|c| {
            SnapshotDamage::State(snapshot::Corrupt {
                offset: c.offset + size,
                what: c.what,
            })
        })?;
        let mut applied = self.applied();
        self.inner.applier.install(sm);
        applied.last = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        if let Some(j) = &self.inner.joining {
            j.applied(meta.last_membership.log_id().map(|l| l.index));
        }
        Ok(meta)
    }
}

/// The metadata of the snapshot file at `path` (its first record), without
/// reading the state after it; `None` if there is no such file.
///
/// # Errors
/// The file cannot be read, or its metadata is damaged.
pub fn snapshot_meta(path: &Path) -> Result<Option<SnapshotMeta>, SnapshotError> {
    use std::io::Read;
    let read_error = |source| SnapshotError::Read {
        path: path.to_owned(),
        source,
    };
    let damaged = |why| SnapshotError::Damaged {
        path: path.to_owned(),
        why,
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_error(e)),
    };
    // The metadata record is small (the membership's addresses); read a
    // bounded prefix, not the whole state.
    let mut head = Vec::new();
    (&mut file)
        .take(1 << 20)
        .read_to_end(&mut head)
        .map_err(read_error)?;
    let Frame::Whole { payload, .. } = record::read_frame(&head) else {
        return Err(damaged(SnapshotDamage::Metadata));
    };
    bincode::deserialize(payload)
        .map(Some)
        .map_err(|e| damaged(SnapshotDamage::MetadataDecode(e)))
}

/// A member's snapshot file: the metadata's record (`header`, bincode),
/// then `state` in Baton's snapshot format.
fn encode(header: &[u8], state: &baton_state::StateMachine) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    record::frame(&mut out, |o| o.extend_from_slice(header));
    let mut cursor = Cursor::new(out);
    cursor.set_position(cursor.get_ref().len() as u64);
    snapshot::encode(state, &mut cursor)?;
    Ok(cursor.into_inner())
}

/// Makes `raft_dir` (a member's `raft/` directory, new) the start of a
/// cluster restored from a backup: a snapshot of `state` at the log's first
/// position whose membership is member `id` alone, at `member`'s addresses.
/// Started, the member leads at once (it is the only voter); the others
/// join empty and are added, catching up from its snapshot.
///
/// # Errors
/// The directory cannot be made or written, naming it.
pub fn write_seed(
    raft_dir: &Path,
    id: crate::NodeId,
    member: crate::Member,
    state: &baton_state::StateMachine,
) -> Result<(), SnapshotError> {
    let first = LogId::new(openraft::CommittedLeaderId::new(0, 0), 0);
    let voters = std::collections::BTreeSet::from([id]);
    let nodes = std::collections::BTreeMap::from([(id, member)]);
    let meta = SnapshotMeta {
        last_log_id: Some(first),
        last_membership: StoredMembership::new(
            Some(first),
            openraft::Membership::new(vec![voters], nodes),
        ),
        snapshot_id: "restored-0".into(),
    };
    write_snapshot(raft_dir, &meta, state)
}

/// Writes `state` as of `meta` as the snapshot of the member whose `raft/`
/// directory is `raft_dir` (made if need be), synced.
///
/// # Errors
/// The directory cannot be made or written, naming it.
pub fn write_snapshot(
    raft_dir: &Path,
    meta: &SnapshotMeta,
    state: &baton_state::StateMachine,
) -> Result<(), SnapshotError> {
    let header = bincode::serialize(meta).map_err(SnapshotError::Encode)?;
    std::fs::create_dir_all(raft_dir).map_err(|source| SnapshotError::Create {
        path: raft_dir.to_owned(),
        source,
    })?;
    let path = raft_dir.join("snapshot");
    encode(&header, state)
        .and_then(|bytes| save(&path, &bytes))
        .map_err(|source| SnapshotError::Write { path, source })
}

/// Writes a snapshot's bytes to `path` in one step, synced.
fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    disk_faults::before_create()?;
    let mut file = std::fs::File::create(&tmp)?;
    if let Some(kept) = disk_faults::torn_write(bytes.len()) {
        file.write_all(&bytes[..kept])?;
        return Err(disk_faults::no_space());
    }
    file.write_all(bytes)?;
    disk_faults::before_sync();
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (state, position) = {
            let applied = self.applied();
            (self.inner.applier.state(), applied.clone())
        };
        let n = self.inner.snapshots.fetch_add(1, Ordering::Relaxed) + 1;
        let meta = SnapshotMeta {
            last_log_id: position.last,
            last_membership: position.membership,
            snapshot_id: format!("{}-{n}", position.last.map_or(0, |l| l.index)),
        };
        let path = self.inner.path.clone();
        let header = bincode::serialize(&meta).map_err(|e| snapshot_error(ErrorVerb::Write, &e))?;
        let bytes = tokio::task::spawn_blocking(move || {
            let bytes = encode(&header, &state)?;
            save(&path, &bytes)?;
            Ok::<_, std::io::Error>(bytes)
        })
        .await
        .map_err(|e| snapshot_error(ErrorVerb::Write, &e))?
        .map_err(|e| snapshot_error(ErrorVerb::Write, &e))?;
        let bytes = Arc::new(bytes);
        *self.current() = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes.to_vec())),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.applied();
        Ok((applied.last, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut out = Vec::new();
        for entry in entries {
            let mut applied = self.applied();
            let revision = match entry.payload {
                EntryPayload::Normal(Change(proposals)) => self.inner.applier.apply(&proposals),
                EntryPayload::Membership(membership) => {
                    if let Some(j) = &self.inner.joining {
                        j.applied(Some(entry.log_id.index));
                    }
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    self.inner.applier.revision()
                }
                EntryPayload::Blank => self.inner.applier.revision(),
            };
            applied.last = Some(entry.log_id);
            out.push(Applied { revision });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let loaded = self
            .load(&bytes)
            .map_err(|e| snapshot_error(ErrorVerb::Read, &e))?;
        if loaded.last_log_id != meta.last_log_id {
            return Err(snapshot_error(ErrorVerb::Read, &SnapshotDamage::NotAsSent));
        }
        let path = self.inner.path.clone();
        let to_save = bytes.clone();
        tokio::task::spawn_blocking(move || save(&path, &to_save))
            .await
            .map_err(|e| snapshot_error(ErrorVerb::Write, &e))?
            .map_err(|e| snapshot_error(ErrorVerb::Write, &e))?;
        info!(last = ?meta.last_log_id, bytes = bytes.len(), "snapshot installed");
        *self.current() = Some((meta.clone(), Arc::new(bytes)));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        Ok(self.current().as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.to_vec())),
        }))
    }
}
