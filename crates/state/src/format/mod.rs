//! Baton's file formats: log records (`record`), the segment files that hold
//! them (`segment`), and snapshots (`snapshot`). Each encodes to and decodes
//! from bytes; the server's persistence reads and writes the files.

pub mod record;
pub mod segment;
pub mod snapshot;

/// When the log is synced to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Before any reply or event that depends on a change leaves the server,
    /// the change is on disk (`fdatasync`). Concurrent changes share a sync.
    #[default]
    Always,
    /// Changes are written to the operating system but not synced: a crash of
    /// the server loses nothing, a power loss loses the last moments (as
    /// Redis without `appendfsync`).
    Never,
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FsyncPolicy::Always => "always",
            FsyncPolicy::Never => "never",
        })
    }
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            other => Err(format!(
                "unknown fsync policy {other:?}: use always or never"
            )),
        }
    }
}
