//! Log segment files: a header naming the format and the fsync policy of the
//! writer, then *batches* of records, one batch per write.
//!
//! # Format
//! ```text
//! segment header, 16 bytes:
//!   magic       [8]  "BATNLOG\0"
//!   format      u16  2
//!   fsync       u8   0: written under --fsync always, 1: under --fsync never
//!   kind        u8   0: a server's log of changes, 1: a cluster member's
//!                    replicated log
//!   header_crc  u32  CRC32C of the 12 bytes before it
//! batches, each written with one write call:
//!   magic       u32  "BTCH"
//!   len         u32  bytes of records that follow
//!   header_crc  u32  CRC32C of the 8 bytes before it
//!   records     [len] whole records (see `record`)
//! ```
//! A segment without the header is of format 1: records only, with no
//! batches (what earlier servers wrote). Both are read; only format 2 is
//! written.
//!
//! Batches tell recovery how far one write reached. Under `--fsync always`
//! a batch is acknowledged only after it was synced, and the next one is
//! written only after that, so damage inside the *last* batch of the last
//! segment, with no whole batch header after it, is a write that a crash cut
//! short (its pages may reach the disk in any order), none of which was
//! acknowledged. Damage with a batch after it is damage to synced data.

use super::record::{self, Read as RecordRead};
use super::FsyncPolicy;
use crate::Proposal;

const MAGIC: &[u8; 8] = b"BATNLOG\0";
const FORMAT: u16 = 2;
/// Bytes of a format-2 segment header.
pub const HEADER: usize = 16;
const BATCH_MAGIC: [u8; 4] = *b"BTCH";
/// Bytes of a batch header.
pub const BATCH_HEADER: usize = 12;

/// What a segment holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A server's log of changes (records of proposals and revisions).
    Changes = 0,
    /// A cluster member's replicated log (records of log entries).
    Replicated = 1,
}

/// A format-2 segment header for a writer with `fsync`.
pub fn header(fsync: FsyncPolicy) -> [u8; HEADER] {
    header_of(fsync, Kind::Changes)
}

/// A format-2 segment header for a segment of `kind`, written with `fsync`.
pub fn header_of(fsync: FsyncPolicy, kind: Kind) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&FORMAT.to_be_bytes());
    h[10] = match fsync {
        FsyncPolicy::Always => 0,
        FsyncPolicy::Never => 1,
    };
    h[11] = kind as u8;
    let crc = crc32c::crc32c(&h[..12]);
    h[12..].copy_from_slice(&crc.to_be_bytes());
    h
}

/// How a segment's bytes are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// 1 (records only) or 2 (header and batches).
    pub format: u16,
    /// The writer's fsync policy, if the segment says (format 2).
    pub fsync: Option<FsyncPolicy>,
    /// What the segment holds (format 1 holds changes).
    pub kind: Kind,
    /// Offset of the first batch or record.
    pub start: usize,
}

/// The layout of a segment that begins with `buf`.
///
/// # Errors
/// A damaged or unknown header, saying what is wrong; or
/// [`LayoutError::Short`] if the file ends inside its header (a segment
/// whose creation a crash cut short).
pub fn layout(buf: &[u8]) -> Result<Layout, LayoutError> {
    // Format 1 starts with a record's length, whose first byte is never
    // the magic's (it would be a length past any record).
    if buf.first() != Some(&MAGIC[0]) {
        return Ok(Layout {
            format: 1,
            fsync: None,
            kind: Kind::Changes,
            start: 0,
        });
    }
    if buf.len() < HEADER {
        let seen = buf.len().min(MAGIC.len());
        return Err(if buf[..seen] == MAGIC[..seen] {
            LayoutError::Short
        } else {
            LayoutError::Damaged
        });
    }
    let crc = u32::from_be_bytes(buf[12..16].try_into().expect("4 bytes"));
    if buf[..8] != *MAGIC || crc32c::crc32c(&buf[..12]) != crc {
        return Err(LayoutError::Checksum);
    }
    let format = u16::from_be_bytes([buf[8], buf[9]]);
    if format != FORMAT {
        return Err(LayoutError::Format(format));
    }
    let fsync = match buf[10] {
        0 => FsyncPolicy::Always,
        1 => FsyncPolicy::Never,
        other => return Err(LayoutError::Fsync(other)),
    };
    let kind = match buf[11] {
        0 => Kind::Changes,
        1 => Kind::Replicated,
        other => return Err(LayoutError::Kind(other)),
    };
    Ok(Layout {
        format: FORMAT,
        fsync: Some(fsync),
        kind,
        start: HEADER,
    })
}

/// Why a segment's header cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The file ends inside the header.
    #[error("the file ends inside its header")]
    Short,
    /// The header's bytes are not a segment header's.
    #[error("the segment header is damaged")]
    Damaged,
    #[error("the segment header fails its checksum")]
    Checksum,
    /// A format this build does not read.
    #[error("log segment format {0}, this server reads 1 and {FORMAT}")]
    Format(u16),
    #[error("unknown fsync policy {0} in the segment header")]
    Fsync(u8),
    #[error("unknown segment kind {0} in the segment header")]
    Kind(u8),
}

/// Reserves a batch header at the end of `out`; returns where it starts,
/// for [`end_batch`].
pub fn begin_batch(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0u8; BATCH_HEADER]);
    start
}

/// Fills in the header of the batch begun at `start`: it holds everything
/// after the header.
pub fn end_batch(out: &mut [u8], start: usize) {
    let len = (out.len() - start - BATCH_HEADER) as u32;
    out[start..start + 4].copy_from_slice(&BATCH_MAGIC);
    out[start + 4..start + 8].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[start..start + 8]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_be_bytes());
}

/// What is wrong with a unit of a segment (a batch, or a format-1 record).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("the file ends inside a record")]
    EndsInRecord,
    #[error("a record runs past the end of its batch")]
    RecordPastBatch,
    #[error("the file ends inside a batch")]
    EndsInBatch,
    #[error("the file ends inside a batch header")]
    EndsInBatchHeader,
    #[error("a batch header fails its checksum")]
    BatchHeaderChecksum,
    #[error(transparent)]
    Record(#[from] record::Invalid),
}

/// One record as read back: a proposal and the revision it produced.
pub struct Logged {
    pub revision: u64,
    pub proposal: Proposal,
}

/// Reads the unit at `at`: a whole batch (format 2) or one record (format
/// 1). Returns its records and where the next unit starts.
///
/// # Errors
/// What is wrong with the unit; nothing of a damaged unit is returned.
pub fn read_unit(buf: &[u8], at: usize, layout: Layout) -> Result<(Vec<Logged>, usize), Damage> {
    let (body, end) = if layout.format == 1 {
        (&buf[at..], None)
    } else {
        let (body, end) = read_batch(buf, at)?;
        (body, Some(end))
    };
    let mut records = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        match record::read(&body[pos..]) {
            RecordRead::Record {
                revision,
                proposal,
                size,
            } => {
                records.push(Logged { revision, proposal });
                pos += size;
                if end.is_none() {
                    break; // format 1: one record per unit
                }
            }
            RecordRead::Short if end.is_none() => return Err(Damage::EndsInRecord),
            RecordRead::Short => return Err(Damage::RecordPastBatch),
            RecordRead::Invalid(why) => return Err(why.into()),
        }
    }
    Ok((records, end.unwrap_or(at + pos)))
}

/// The records of the format-2 batch at `at`, and where the next batch
/// starts.
///
/// # Errors
/// What is wrong with the batch's header, or a batch that runs past the
/// end of `buf`.
pub fn read_batch(buf: &[u8], at: usize) -> Result<(&[u8], usize), Damage> {
    let len = batch_len(&buf[at..])?;
    let end = at + BATCH_HEADER + len;
    if end > buf.len() {
        return Err(Damage::EndsInBatch);
    }
    Ok((&buf[at + BATCH_HEADER..end], end))
}

/// The length of the batch whose header starts `buf`.
fn batch_len(buf: &[u8]) -> Result<usize, Damage> {
    if buf.len() < BATCH_HEADER {
        return Err(Damage::EndsInBatchHeader);
    }
    let crc = u32::from_be_bytes(buf[8..12].try_into().expect("4 bytes"));
    if buf[..4] != BATCH_MAGIC || crc32c::crc32c(&buf[..8]) != crc {
        return Err(Damage::BatchHeaderChecksum);
    }
    let len = u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
    Ok(len)
}

/// Whether a whole unit header starts anywhere after `at`: then damage at
/// `at` is followed by data written later, and is not a torn last write.
pub fn unit_after(buf: &[u8], at: usize, layout: Layout) -> bool {
    (at + 1..buf.len()).any(|p| {
        if layout.format == 1 {
            matches!(record::read(&buf[p..]), RecordRead::Record { .. })
        } else {
            buf[p] == BATCH_MAGIC[0] && batch_len(&buf[p..]).is_ok()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use baton_proto::SessionId;

    fn close(r: u64) -> Proposal {
        Proposal {
            now_ms: 0,
            origin: None,
            command: Command::CloseSession {
                session: SessionId(r),
            },
        }
    }

    fn batch(revisions: std::ops::Range<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        let start = begin_batch(&mut out);
        for r in revisions {
            record::encode(&mut out, r, &close(r));
        }
        end_batch(&mut out, start);
        out
    }

    #[test]
    fn batches_read_back_whole_and_damage_is_found() {
        let mut seg = header(FsyncPolicy::Always).to_vec();
        seg.extend(batch(1..4));
        seg.extend(batch(4..5));
        let layout = layout(&seg).unwrap();
        assert_eq!(layout.fsync, Some(FsyncPolicy::Always));
        let (records, next) = read_unit(&seg, layout.start, layout).unwrap();
        assert_eq!(records.len(), 3);
        let (records, end) = read_unit(&seg, next, layout).unwrap();
        assert_eq!((records[0].revision, end), (4, seg.len()));
        // A flip anywhere in the first batch damages all of it, and the
        // second batch's header after it tells it from a torn tail.
        for byte in layout.start..next {
            let mut bad = seg.clone();
            bad[byte] ^= 0x20;
            assert!(read_unit(&bad, layout.start, layout).is_err(), "{byte}");
            assert!(unit_after(&bad, layout.start, layout), "{byte}");
        }
        // A cut in the last batch: no header after it.
        for cut in next + 1..seg.len() {
            assert!(read_unit(&seg[..cut], next, layout).is_err());
            assert!(!unit_after(&seg[..cut], next, layout));
        }
    }

    #[test]
    fn a_segment_without_a_header_is_format_1() {
        let mut seg = Vec::new();
        record::encode(&mut seg, 1, &close(1));
        assert_eq!(layout(&seg).unwrap().format, 1);
        assert_eq!(layout(&[]).unwrap().format, 1);
        assert!(matches!(layout(&MAGIC[..5]), Err(LayoutError::Short)));
        let (records, end) = read_unit(&seg, 0, layout(&seg).unwrap()).unwrap();
        assert_eq!((records.len(), end), (1, seg.len()));
    }
}
