//! Snapshot files: the state at one revision written durably into the data
//! directory, and read back (the format is `baton_state::format::snapshot`).

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

pub use baton_state::format::snapshot::{decode, encode, file_name};

use super::{sync_dir, PersistError};
use crate::state::StateMachine;
use crate::stats::Stats;

/// Writes `sm` as the snapshot of its revision into `dir`, durably: the
/// file and the directory are synced (in either fsync mode, since what it
/// replaces is removed once it is written).
///
/// # Errors
/// Any I/O failure, naming the file.
pub(crate) fn write(dir: &Path, sm: &StateMachine, stats: &Stats) -> Result<PathBuf, PersistError> {
    let revision = sm.revision();
    let final_path = dir.join(file_name(revision));
    let tmp_path = dir.join(format!("{}.tmp", file_name(revision)));
    let io = |e| PersistError::io(&tmp_path, "writing a snapshot", e);
    super::disk_faults::before_create().map_err(io)?;
    let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp_path).map_err(io)?);
    encode(sm, &mut out).map_err(io)?;
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    let written = file.metadata().map_err(io)?.len();
    if let Some(kept) = super::disk_faults::torn_write(written as usize) {
        file.set_len(kept as u64).map_err(io)?;
        return Err(io(super::disk_faults::no_space()));
    }
    super::disk_faults::before_sync();
    Stats::add(&stats.syncs, 1);
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp_path, &final_path)
        .map_err(|e| PersistError::io(&final_path, "renaming a snapshot into place", e))?;
    sync_dir(dir, stats)?;
    Ok(final_path)
}

/// Reads and checks a snapshot file.
///
/// # Errors
/// [`PersistError::Corrupt`] naming the file and what is wrong, or an I/O
/// error.
pub(crate) fn read(path: &Path) -> Result<StateMachine, PersistError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| PersistError::io(path, "reading a snapshot", e))?;
    decode(&bytes).map_err(|c| PersistError::Corrupt {
        file: path.to_owned(),
        offset: c.offset as u64,
        what: c.what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use baton_proto::{CreateMode, SessionId, SessionSecret};
    use bytes::Bytes;

    #[test]
    fn a_snapshot_reads_back_as_the_state_it_was_written_from() {
        let dir = std::env::temp_dir().join(format!("baton-snapshot-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut sm = StateMachine::new();
        sm.apply(
            &Command::OpenSession {
                timeout_ms: 3000,
                secret: SessionSecret([3; 16]),
            },
            1,
        );
        for (path, mode) in [
            ("/a", CreateMode::Persistent),
            ("/a/b-", CreateMode::EphemeralSequential),
            ("/c", CreateMode::Ephemeral),
        ] {
            let applied = sm.apply(
                &Command::Create {
                    session: SessionId(1),
                    path: path.into(),
                    data: Bytes::from(path.as_bytes().to_vec()),
                    mode,
                    fence: Some(5),
                    acl: baton_proto::Acl::OPEN,
                },
                2,
            );
            applied.result.unwrap();
        }
        let path = write(&dir, &sm, &Stats::default()).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.revision(), sm.revision());
        assert_eq!(
            back.nodes_parent_first().collect::<Vec<_>>(),
            sm.nodes_parent_first().collect::<Vec<_>>()
        );
        assert_eq!(back.session(SessionId(1)).unwrap().ephemerals.len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
