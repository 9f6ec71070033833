//! The data directory: created on start and locked for the server's lifetime,
//! so that two servers never share one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("cannot create data directory {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot open lock file {path}: {source}")]
    LockFile { path: PathBuf, source: io::Error },
    #[error("data directory {path} is in use by another baton server (it holds {lock}); stop it or choose another --data-dir")]
    InUse { path: PathBuf, lock: PathBuf },
}

/// An open, exclusively locked data directory. The lock is released when this
/// is dropped (or the process dies).
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates `path` if needed and takes its lock.
    ///
    /// # Errors
    /// The directory cannot be created, the lock file cannot be opened, or
    /// another process holds the lock.
    pub fn open(path: &Path) -> Result<Self, DataDirError> {
        std::fs::create_dir_all(path).map_err(|source| DataDirError::Create {
            path: path.to_owned(),
            source,
        })?;
        let lock_path = path.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| DataDirError::LockFile {
                path: lock_path.clone(),
                source,
            })?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::WouldBlock {
                return Err(DataDirError::InUse {
                    path: path.to_owned(),
                    lock: lock_path,
                });
            }
            return Err(DataDirError::LockFile {
                path: lock_path,
                source: err,
            });
        }
        Ok(DataDir {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_server_cannot_take_a_locked_directory() {
        let dir = std::env::temp_dir().join(format!("baton-datadir-test-{}", std::process::id()));
        let first = DataDir::open(&dir).expect("first open");
        match DataDir::open(&dir) {
            Err(DataDirError::InUse { .. }) => {}
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(first);
        DataDir::open(&dir).expect("reopen after release");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
