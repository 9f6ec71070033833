//! Small files written whole and atomically, and directory syncs.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use baton_server::persist::disk_faults;
use baton_state::format::record::{self, Frame};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub(super) fn encode_small<T: Serialize>(value: &T) -> Vec<u8> {
    let payload = bincode::serialize(value).expect("small values serialize");
    let mut out = Vec::new();
    record::frame(&mut out, |o| o.extend_from_slice(&payload));
    out
}

/// Reads a small file written by [`write_atomic`]; `None` if absent.
pub(super) fn read_small<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    match record::read_frame(&bytes) {
        Frame::Whole { payload, .. } => bincode::deserialize(payload)
            .map(Some)
            .map_err(|e| format!("{} does not decode: {e}", path.display())),
        _ => Err(format!(
            "{} is damaged; restore the data directory from a copy, or wipe it to have the member catch up from the others",
            path.display()
        )),
    }
}

/// Replaces `path` with `bytes` in one step (a temporary file renamed over
/// it), synced with its directory if `sync`.
pub(super) fn write_atomic(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    sync: bool,
) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let mut file = disk_faults::before_create()
        .and_then(|()| File::create(&tmp))
        .map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    file.write_all(bytes)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    if sync {
        file.sync_all()
            .map_err(|e| format!("syncing {}: {e}", tmp.display()))?;
    }
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
    if sync {
        sync_dir(dir)?;
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("syncing {}: {e}", dir.display()))
}
