//! The cluster's vote, in two slots of one file written in turn.

use std::fs::{File, OpenOptions};
use std::path::Path;

use baton_server::persist::disk_faults;
use baton_state::format::record::{self, Frame};

use super::files::write_atomic;
use super::StoreError;
use crate::types::Vote;

/// The `votes` file: two slots, written in turn, so that a vote is saved
/// without creating a file (a member whose file system is out of inodes
/// still votes) and a write torn half way leaves the vote before it.
pub(super) struct Votes {
    pub(super) file: File,
    /// The sequence number of the vote last written.
    pub(super) seq: u64,
}

/// The size of a slot of `votes`.
pub(super) const VOTE_SLOT: usize = 64;

/// One slot of `votes`: a framed record of the sequence number and the
/// vote, padded with zeros.
pub(super) fn vote_slot(seq: u64, vote: Option<&Vote>) -> [u8; VOTE_SLOT] {
    let mut framed = Vec::with_capacity(VOTE_SLOT);
    let payload = bincode::serialize(&(seq, vote)).expect("a vote serializes");
    record::frame(&mut framed, |o| o.extend_from_slice(&payload));
    let mut slot = [0u8; VOTE_SLOT];
    slot[..framed.len()].copy_from_slice(&framed);
    slot
}

/// The vote `votes` holds, with its sequence number; `None` if there is no
/// such file.
pub(super) fn read_votes(path: &Path) -> Result<Option<(u64, Option<Vote>)>, StoreError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("reading", path, e)),
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
        None => Err(StoreError::DamagedVotes {
            path: path.to_owned(),
        }),
    }
}

/// Makes the `votes` file, holding `vote` (in one step: a temporary file
/// renamed into place), and opens it for the votes to come.
pub(super) fn create_votes(dir: &Path, vote: Option<&Vote>) -> Result<Votes, StoreError> {
    let path = dir.join("votes");
    let mut bytes = vote_slot(0, vote).to_vec();
    bytes.extend_from_slice(&[0u8; VOTE_SLOT]);
    write_atomic(dir, &path, &bytes, true)?;
    // The vote as earlier members kept it would only mislead a reader now.
    let _ = std::fs::remove_file(dir.join("vote"));
    open_votes(&path, 0)
}

pub(super) fn open_votes(path: &Path, seq: u64) -> Result<Votes, StoreError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(|file| Votes { file, seq })
        .map_err(|e| StoreError::io("opening", path, e))
}

impl Votes {
    /// Writes `vote` over the older slot, and syncs it.
    pub(super) fn save(&mut self, vote: &Vote, path: &Path) -> Result<(), StoreError> {
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
            .map_err(|e| StoreError::io("writing the vote to", path, e))?;
        self.seq = seq;
        Ok(())
    }
}
