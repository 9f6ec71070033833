//! Small files written whole and atomically, and directory syncs.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use baton_server::persist::disk_faults;
use baton_state::format::record::{self, Frame};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::StoreError;

pub(super) fn encode_small<T: Serialize>(value: &T) -> Vec<u8> {
    let payload = bincode::serialize(value).expect("small values serialize");
    let mut out = Vec::new();
    record::frame(&mut out, |o| o.extend_from_slice(&payload));
    out
}

/// Reads a small file written by [`write_atomic`]; `None` if absent.
pub(super) fn read_small<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StoreError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("reading", path, e)),
    };
    match record::read_frame(&bytes) {
        Frame::Whole { payload, .. } => {
            bincode::deserialize(payload)
                .map(Some)
                .map_err(|source| StoreError::Undecodable {
                    path: path.to_owned(),
                    source,
                })
        }
        _ => Err(StoreError::DamagedFile {
            path: path.to_owned(),
        }),
    }
}

/// Replaces `path` with `bytes` in one step (a temporary file renamed over
/// it), synced with its directory if `sync`.
pub(super) fn write_atomic(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    sync: bool,
) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    let mut file = disk_faults::before_create()
        .and_then(|()| File::create(&tmp))
        .map_err(|e| StoreError::io("creating", &tmp, e))?;
    file.write_all(bytes)
        .map_err(|e| StoreError::io("writing", &tmp, e))?;
    if sync {
        file.sync_all()
            .map_err(|e| StoreError::io("syncing", &tmp, e))?;
    }
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| StoreError::io("renaming", &tmp, e))?;
    if sync {
        sync_dir(dir)?;
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io("syncing", dir, e))
}
