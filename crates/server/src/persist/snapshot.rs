//! Snapshots: the whole state at one revision, in one checksummed file.
//!
//! # Format
//! ```text
//! header, 44 bytes:
//!   magic       [8]  "BATNSNAP"
//!   format      u32  1
//!   revision    u64  the state's revision
//!   sessions    u64  number of session entries
//!   nodes       u64  number of node entries
//!   body_crc    u32  CRC32C of everything after the header
//!   header_crc  u32  CRC32C of the 40 bytes before it
//! sessions: id u64, timeout_ms u32, secret [16]
//! nodes, each after its parent, the root first:
//!   path str, data bytes, czxid u64, mzxid u64, pzxid u64, ctime u64,
//!   mtime u64, version u32, cversion u32, owner u64, fence u64
//! ```
//! A snapshot is written to a temporary file, synced, and renamed into place,
//! so a crash leaves either the old set of snapshots or the new one.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use baton_proto::{SessionId, SessionSecret};

use super::record::Cursor;
use super::{sync_dir, PersistError};
use crate::state::{NodeImage, StateMachine};
use crate::stats::Stats;

const MAGIC: &[u8; 8] = b"BATNSNAP";
const FORMAT: u32 = 1;
const HEADER: usize = 44;

/// The file name of the snapshot at `revision`.
pub(crate) fn file_name(revision: u64) -> String {
    format!("snapshot-{revision:020}.snap")
}

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

    let mut body = CrcWriter::new(BufWriter::with_capacity(
        1 << 20,
        File::create(&tmp_path).map_err(io)?,
    ));
    body.inner.write_all(&[0u8; HEADER]).map_err(io)?; // patched below
    let mut sessions = 0u64;
    for (id, session) in sm.sessions() {
        body.put(&id.0.to_be_bytes()).map_err(io)?;
        body.put(&session.timeout_ms.to_be_bytes()).map_err(io)?;
        body.put(&session.secret.0).map_err(io)?;
        sessions += 1;
    }
    let mut nodes = 0u64;
    for n in sm.nodes_parent_first() {
        body.put(&(n.path.len() as u16).to_be_bytes()).map_err(io)?;
        body.put(n.path.as_bytes()).map_err(io)?;
        body.put(&(n.data.len() as u32).to_be_bytes()).map_err(io)?;
        body.put(&n.data).map_err(io)?;
        for v in [n.czxid, n.mzxid, n.pzxid, n.ctime, n.mtime] {
            body.put(&v.to_be_bytes()).map_err(io)?;
        }
        body.put(&n.version.to_be_bytes()).map_err(io)?;
        body.put(&n.cversion.to_be_bytes()).map_err(io)?;
        body.put(&n.owner.to_be_bytes()).map_err(io)?;
        body.put(&n.fence.to_be_bytes()).map_err(io)?;
        nodes += 1;
    }
    let crc = body.crc;
    let mut file = body.inner.into_inner().map_err(|e| io(e.into_error()))?;

    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&FORMAT.to_be_bytes());
    header.extend_from_slice(&revision.to_be_bytes());
    header.extend_from_slice(&sessions.to_be_bytes());
    header.extend_from_slice(&nodes.to_be_bytes());
    header.extend_from_slice(&crc.to_be_bytes());
    let header_crc = crc32c::crc32c(&header);
    header.extend_from_slice(&header_crc.to_be_bytes());
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.write_all(&header).map_err(io)?;
    Stats::add(&stats.syncs, 1);
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp_path, &final_path)
        .map_err(|e| PersistError::io(&final_path, "renaming a snapshot into place", e))?;
    sync_dir(dir, stats)?;
    Ok(final_path)
}

/// Reads and checks a snapshot.
///
/// # Errors
/// [`PersistError::Corrupt`] naming the file and what is wrong, or an I/O
/// error.
pub(crate) fn read(path: &Path) -> Result<StateMachine, PersistError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| PersistError::io(path, "reading a snapshot", e))?;
    let corrupt = |offset: usize, what: String| PersistError::Corrupt {
        file: path.to_owned(),
        offset: offset as u64,
        what,
    };
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(corrupt(
            0,
            "not a Baton snapshot (bad magic or too short)".into(),
        ));
    }
    let header = &bytes[..HEADER];
    let header_crc = u32::from_be_bytes(header[40..44].try_into().expect("4 bytes"));
    if crc32c::crc32c(&header[..40]) != header_crc {
        return Err(corrupt(0, "snapshot header fails its checksum".into()));
    }
    let mut h = Cursor(&header[8..36]);
    let format = h.u32().map_err(|e| corrupt(8, e))?;
    if format != FORMAT {
        return Err(corrupt(
            8,
            format!("snapshot format {format}, this server reads {FORMAT}"),
        ));
    }
    let revision = h.u64().map_err(|e| corrupt(12, e))?;
    let sessions = h.u64().map_err(|e| corrupt(20, e))?;
    let nodes = h.u64().map_err(|e| corrupt(28, e))?;
    let body_crc = u32::from_be_bytes(header[36..40].try_into().expect("4 bytes"));
    let body = &bytes[HEADER..];
    if crc32c::crc32c(body) != body_crc {
        return Err(corrupt(HEADER, "snapshot body fails its checksum".into()));
    }
    let mut r = Cursor(body);
    let at = |r: &Cursor| HEADER + body.len() - r.0.len();
    let mut session_list = Vec::new();
    for _ in 0..sessions {
        let entry =
            (|| Ok::<_, String>((SessionId(r.u64()?), r.u32()?, SessionSecret(r.array()?))))()
                .map_err(|e| corrupt(at(&r), e))?;
        session_list.push(entry);
    }
    let mut images = Vec::new();
    for _ in 0..nodes {
        let image = (|| {
            Ok::<_, String>(NodeImage {
                path: r.str()?,
                data: r.bytes()?,
                czxid: r.u64()?,
                mzxid: r.u64()?,
                pzxid: r.u64()?,
                ctime: r.u64()?,
                mtime: r.u64()?,
                version: r.u32()?,
                cversion: r.u32()?,
                owner: r.u64()?,
                fence: r.u64()?,
            })
        })()
        .map_err(|e| corrupt(at(&r), e))?;
        images.push(image);
    }
    if !r.0.is_empty() {
        return Err(corrupt(at(&r), "bytes after the last node".into()));
    }
    StateMachine::restore(revision, session_list, images).map_err(|e| corrupt(HEADER, e))
}

/// A writer that keeps the CRC32C of what went through it.
struct CrcWriter<W: Write> {
    inner: W,
    crc: u32,
}

impl<W: Write> CrcWriter<W> {
    fn new(inner: W) -> Self {
        CrcWriter { inner, crc: 0 }
    }

    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.inner.write_all(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use baton_proto::CreateMode;
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
