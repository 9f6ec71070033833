//! Why the replicated log could not be read or written.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use baton_state::format::record;
use baton_state::format::segment::{self, LayoutError};

use crate::state_machine::SnapshotError;

/// Why the replicated log, its vote or one of its small files could not
/// be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O error on a file or directory, named with what was being
    /// done to it ("reading", "syncing", ...).
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An I/O error on the last segment, while appending to the log.
    #[error("{what} the replicated log: {source}")]
    Log {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// An I/O error on a segment, as the operating system words it.
    #[error(transparent)]
    Unnamed(io::Error),
    /// A small file whose record holds but does not decode.
    #[error("{} does not decode: {source}", path.display())]
    Undecodable {
        path: PathBuf,
        #[source]
        source: bincode::Error,
    },
    /// A small file whose record is damaged.
    #[error("{} is damaged; restore the data directory from a copy, or wipe it to have the member catch up from the others", path.display())]
    DamagedFile { path: PathBuf },
    /// A `votes` file neither of whose slots holds a vote.
    #[error("{} is damaged (neither of its slots holds a vote); restore the data directory from a copy, or wipe it to have the member catch up from the others", path.display())]
    DamagedVotes { path: PathBuf },
    /// Damage in a segment other than a torn last write.
    #[error("{} is damaged at byte offset {offset}: {why}. The member does not start on a damaged log and changed nothing; restore its data directory from a copy, or wipe it to have the member catch up from the others", path.display())]
    Damaged {
        path: PathBuf,
        offset: usize,
        #[source]
        why: SegmentDamage,
    },
    /// The segments leave out entries between two they hold.
    #[error("the replicated log in {} skips from entry {after} to {next}", dir.display())]
    Gap { dir: PathBuf, after: u64, next: u64 },
    /// An append with no segment to write to.
    #[error("no segment")]
    NoSegment,
    /// The batch a truncation cuts is damaged.
    #[error(transparent)]
    Batch(#[from] segment::Damage),
    /// A record of the batch a truncation cuts is damaged.
    #[error("a damaged record in a batch being cut")]
    DamagedRecord,
    /// An entry of the batch a truncation cuts does not decode.
    #[error(transparent)]
    Decode(bincode::Error),
    /// An earlier write of the log failed: nothing is appended after it.
    #[error("an earlier write of the replicated log failed: {0}")]
    Broken(#[source] Arc<StoreError>),
    /// The write that failed, as the writer keeps it for the writes after.
    #[error(transparent)]
    Failed(Arc<StoreError>),
    /// The snapshot's metadata, read for the membership it holds.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

impl StoreError {
    /// An I/O error `source` met while `what` (a verb: "reading") `path`.
    pub(super) fn io(what: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

/// What is wrong with a damaged segment.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentDamage {
    /// A segment of another kind of log.
    #[error("not a segment of a replicated log")]
    NotReplicated,
    /// The segment's header.
    #[error(transparent)]
    Header(#[from] LayoutError),
    /// A batch of entries.
    #[error(transparent)]
    Batch(#[from] BatchDamage),
}

/// What is wrong with a batch of entries.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchDamage {
    /// The batch's header, or a batch cut short.
    #[error(transparent)]
    Batch(#[from] segment::Damage),
    /// A record whose header says it ends past its batch.
    #[error("a record runs past the end of its batch")]
    RecordPastBatch,
    /// A record's checksum or length.
    #[error(transparent)]
    Record(#[from] record::Invalid),
    /// A whole record that is not an entry.
    #[error("an entry does not decode: {0}")]
    Entry(#[source] bincode::Error),
}
