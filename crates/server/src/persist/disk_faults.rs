//! A fault hook in front of the logs' writes and syncs, for testing only
//! (`baton serve --test-disk-faults FILE`, which `baton chaos` sets): a
//! slow disk and a full one, switched on and off while the server runs.
//!
//! Unarmed (the default) it costs one load of a set-once cell per write.
//! Armed, every write and sync of the write-ahead log (a single server's
//! and a member's replicated one) and of a snapshot, and every creation of
//! their files, first reads the control file, whose one line says what the
//! disk does now:
//!
//! - empty, or no file: nothing;
//! - `slow MS`: every sync takes MS milliseconds longer (a disk whose
//!   flushes stall, as a throttled or overloaded one does);
//! - `full`: a write puts half its bytes in the file, then fails with "no
//!   space left on device" (a torn last write, as a full disk leaves), and
//!   so does the creation of a file;
//! - `no-new-files`: creating a file (a snapshot, a new log segment) fails
//!   with "no space left on device", while writes into files already open
//!   go on (a file system out of inodes).
//!
//! The server meets an injected fault exactly as a real one: a failed log
//! write stops it, and nothing after it is acknowledged; a failed snapshot
//! leaves the log as it was (a single server goes on and tries again
//! later; a member's consensus engine stops it, to be started again).

use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

static CONTROL: OnceLock<PathBuf> = OnceLock::new();

/// What the disk does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    /// Every sync this much late.
    Slow(Duration),
    /// Writes fail half done, and files cannot be created.
    Full,
    /// Files cannot be created; writes into open ones go on.
    NoNewFiles,
}

impl DiskFault {
    /// The control file's line for this fault.
    pub fn line(self) -> String {
        match self {
            DiskFault::Slow(d) => format!("slow {}", d.as_millis()),
            DiskFault::Full => "full".into(),
            DiskFault::NoNewFiles => "no-new-files".into(),
        }
    }

    /// Reads a control file's text: `None` for no fault (an empty text),
    /// an error naming what is wrong for a text it does not know.
    pub fn parse(text: &str) -> Result<Option<DiskFault>, UnknownFault> {
        let mut words = text.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (None, _, _) => Ok(None),
            (Some("full"), None, _) => Ok(Some(DiskFault::Full)),
            (Some("no-new-files"), None, _) => Ok(Some(DiskFault::NoNewFiles)),
            (Some("slow"), Some(ms), None) => ms
                .parse::<u64>()
                .map(|ms| Some(DiskFault::Slow(Duration::from_millis(ms))))
                .map_err(|_| UnknownFault::Millis(ms.to_owned())),
            _ => Err(UnknownFault::Line(text.trim().to_owned())),
        }
    }
}

/// A control file's text that names no fault this hook knows.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnknownFault {
    #[error("{0:?} is not a number of milliseconds")]
    Millis(String),
    #[error("{0:?}: expected \"slow MS\", \"full\", \"no-new-files\" or nothing")]
    Line(String),
}

/// Arms the hook: from now on `path` says what the disk does. Only the
/// first call counts.
pub fn arm(path: PathBuf) {
    let _ = CONTROL.set(path);
}

/// The fault in effect now, if the hook is armed.
fn now() -> Option<DiskFault> {
    let path = CONTROL.get()?;
    let text = std::fs::read_to_string(path).ok()?;
    match DiskFault::parse(&text) {
        Ok(fault) => fault,
        Err(why) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(file = %path.display(), "ignoring the disk fault control file: {why}")
            });
            None
        }
    }
}

/// Before a write of `len` bytes (of a log or a snapshot): how many of
/// them to write before failing with "no space left on device", if the
/// disk is full now.
pub fn torn_write(len: usize) -> Option<usize> {
    (now() == Some(DiskFault::Full)).then_some(len / 2)
}

/// Before a file (of a log or a snapshot) is created: fails as a full
/// disk, or one out of inodes, does.
///
/// # Errors
/// "No space left on device", if the disk says so now.
pub fn before_create() -> io::Result<()> {
    match now() {
        Some(DiskFault::Full | DiskFault::NoNewFiles) => Err(no_space()),
        _ => Ok(()),
    }
}

/// The error a full disk gives.
pub fn no_space() -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        "no space left on device (a disk fault injected for testing)",
    )
}

/// Before a sync (of a log or a snapshot): waits as long as a slow disk
/// would.
pub fn before_sync() {
    if let Some(DiskFault::Slow(d)) = now() {
        std::thread::sleep(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_line_is_read_back_and_nonsense_is_refused() {
        for fault in [
            DiskFault::Full,
            DiskFault::NoNewFiles,
            DiskFault::Slow(Duration::from_millis(250)),
        ] {
            assert_eq!(DiskFault::parse(&fault.line()), Ok(Some(fault)));
        }
        assert_eq!(DiskFault::parse(""), Ok(None));
        assert_eq!(DiskFault::parse("  \n"), Ok(None));
        assert!(DiskFault::parse("slow").is_err());
        assert!(DiskFault::parse("slow fast").is_err());
        assert!(DiskFault::parse("full now").is_err());
        assert!(DiskFault::parse("no-new-files 3").is_err());
        assert!(DiskFault::parse("empty").is_err());
    }
}
