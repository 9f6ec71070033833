//! Log records: one applied command each, framed and checksummed.
//!
//! # Format
//! ```text
//! record:
//!   len         u32   payload length
//!   len_crc     u32   CRC32C of the 4 length bytes
//!   payload_crc u32   CRC32C of the payload
//!   payload:
//!     revision  u64   the revision the command produced
//!     now_ms    u64   the time the command was stamped with
//!     command   tag u8; with 0x80 set, the request it answers follows
//!               (session u64, xid u32); then the command's fields:
//!       1 open session   timeout_ms u32, secret [16]
//!       2 close session  session u64
//!       3 expire session session u64
//!       4 create         session u64, path str, data bytes, mode u8 (bit 0
//!                        ephemeral, bit 1 sequential; 4 a container), fence opt64,
//!                        then an ACL if the mode has bit 0x80 (as in
//!                        baton_proto::acl)
//!       5 delete         path str, version opt32, fence opt64
//!       6 set data       path str, data bytes, version opt32, fence opt64
//!       7 enqueue        session u64, path str, data bytes (exclusive)
//!       8 multi          session u64, count u16, then count operations
//!                        (as in a multi request: see baton_proto::txn)
//!       9 enqueue        session u64, path str, data bytes, rule: kind u8
//!                        (1 shared, 2 permits), then permits u32 if 2
//!      10 lock delay     path str, delay_ms u32
//!      11 delete tombstone  path str
//!      12 set ACL        path str, ACL (as in baton_proto::acl), version opt32
//!      13 delete container  path str
//! str = u16 length + UTF-8; bytes = u32 length + bytes;
//! opt32/opt64 = u8 0 | u8 1 + value; all integers big-endian
//! ```
//! The length has its own checksum so that a flipped bit in it is found out
//! rather than taken for a record running past the end of the file.

use baton_proto::acl::{put_create_acl, put_create_mode, split_create_mode};
use baton_proto::wire::Reader;
use baton_proto::{Acl, CreateMode, DecodeError, QueueRule, SessionId, SessionSecret, TxnOp};

use crate::{Command, Origin, Proposal};

/// Bytes of a record's header.
pub const HEADER: usize = 12;

/// Largest payload a record may have: more is taken as corruption.
pub const MAX_PAYLOAD: usize = 128 << 20;

/// Appends one framed record to `out`: the proposal that produced
/// `revision`.
pub fn encode(out: &mut Vec<u8>, revision: u64, proposal: &Proposal) {
    frame(out, |out| {
        put_u64(out, revision);
        encode_proposal(out, proposal);
    });
}

/// Appends a framed record whose payload `write` appends: the length and
/// the two checksums are filled in around it.
pub fn frame(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    write(out);
    let len = (out.len() - start - HEADER) as u32;
    let len_bytes = len.to_be_bytes();
    let payload_crc = crc32c::crc32c(&out[start + HEADER..]);
    out[start..start + 4].copy_from_slice(&len_bytes);
    out[start + 4..start + 8].copy_from_slice(&crc32c::crc32c(&len_bytes).to_be_bytes());
    out[start + 8..start + 12].copy_from_slice(&payload_crc.to_be_bytes());
}

/// What reading a framed record found.
#[derive(Debug)]
pub enum Frame<'a> {
    /// A whole record whose checksums hold, `size` bytes with its header.
    Whole { payload: &'a [u8], size: usize },
    /// The bytes end before the record does.
    Short,
    /// A checksum or the length does not hold.
    Invalid(Invalid),
}

/// What is wrong with a record that is all there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("record length fails its checksum")]
    LengthChecksum,
    #[error("record length {0} is beyond any record")]
    TooLong(usize),
    #[error("record payload fails its checksum")]
    PayloadChecksum,
    #[error("record does not decode: {0}")]
    Decode(#[from] DecodeError),
}

/// Reads the framed record at the start of `buf`.
pub fn read_frame(buf: &[u8]) -> Frame<'_> {
    if buf.len() < HEADER {
        return Frame::Short;
    }
    let len_bytes: [u8; 4] = buf[..4].try_into().expect("4 bytes");
    let len_crc = u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes"));
    if crc32c::crc32c(&len_bytes) != len_crc {
        return Frame::Invalid(Invalid::LengthChecksum);
    }
    let len = u32::from_be_bytes(len_bytes) as usize;
    if len > MAX_PAYLOAD {
        return Frame::Invalid(Invalid::TooLong(len));
    }
    if buf.len() < HEADER + len {
        return Frame::Short;
    }
    let payload = &buf[HEADER..HEADER + len];
    let payload_crc = u32::from_be_bytes(buf[8..12].try_into().expect("4 bytes"));
    if crc32c::crc32c(payload) != payload_crc {
        return Frame::Invalid(Invalid::PayloadChecksum);
    }
    Frame::Whole {
        payload,
        size: HEADER + len,
    }
}

/// Appends a proposal (its time, the request it answers, its command) to
/// `out`: the body of a log record after its revision, and what a cluster
/// replicates.
pub fn encode_proposal(out: &mut Vec<u8>, proposal: &Proposal) {
    put_u64(out, proposal.now_ms);
    let tag = |out: &mut Vec<u8>, tag: u8| match proposal.origin {
        Some(o) => {
            out.push(tag | ORIGIN);
            put_u64(out, o.session.0);
            out.extend_from_slice(&o.xid.to_be_bytes());
        }
        None => out.push(tag),
    };
    match &proposal.command {
        Command::OpenSession { timeout_ms, secret } => {
            tag(out, 1);
            out.extend_from_slice(&timeout_ms.to_be_bytes());
            out.extend_from_slice(&secret.0);
        }
        Command::CloseSession { session } => {
            tag(out, 2);
            put_u64(out, session.0);
        }
        Command::ExpireSession { session } => {
            tag(out, 3);
            put_u64(out, session.0);
        }
        Command::Create {
            session,
            path,
            data,
            mode,
            fence,
            acl,
        } => {
            tag(out, 4);
            put_u64(out, session.0);
            put_str(out, path);
            put_bytes(out, data);
            put_create_mode(out, mode.to_u8(), acl);
            put_opt64(out, *fence);
            put_create_acl(out, acl);
        }
        Command::Delete {
            path,
            version,
            fence,
        } => {
            tag(out, 5);
            put_str(out, path);
            put_opt32(out, *version);
            put_opt64(out, *fence);
        }
        Command::SetData {
            path,
            data,
            version,
            fence,
        } => {
            tag(out, 6);
            put_str(out, path);
            put_bytes(out, data);
            put_opt32(out, *version);
            put_opt64(out, *fence);
        }
        Command::Enqueue {
            session,
            path,
            data,
            rule,
        } => {
            let exclusive = *rule == QueueRule::Exclusive;
            tag(out, if exclusive { 7 } else { 9 });
            put_u64(out, session.0);
            put_str(out, path);
            put_bytes(out, data);
            if !exclusive {
                rule.put(out);
            }
        }
        Command::SetLockDelay { path, delay_ms } => {
            tag(out, 10);
            put_str(out, path);
            out.extend_from_slice(&delay_ms.to_be_bytes());
        }
        Command::DeleteTombstone { path } => {
            tag(out, 11);
            put_str(out, path);
        }
        Command::DeleteContainer { path } => {
            tag(out, 13);
            put_str(out, path);
        }
        Command::SetAcl { path, acl, version } => {
            tag(out, 12);
            put_str(out, path);
            acl.put(out);
            put_opt32(out, *version);
        }
        Command::Multi { session, ops } => {
            tag(out, 8);
            put_u64(out, session.0);
            out.extend_from_slice(&(ops.len() as u16).to_be_bytes());
            for op in ops {
                op.encode(out);
            }
        }
    }
}

/// The tag bit saying that the request a command answers follows the tag.
const ORIGIN: u8 = 0x80;

/// What reading a record at some offset of a log found.
#[derive(Debug)]
pub enum Read {
    /// A whole, valid record of `size` bytes (header included).
    Record {
        revision: u64,
        proposal: Proposal,
        size: usize,
    },
    /// The bytes end before the record does (a torn tail, if at the end).
    Short,
    /// A checksum or layout does not hold.
    Invalid(Invalid),
}

/// Reads the record at the start of `buf`.
pub fn read(buf: &[u8]) -> Read {
    match read_frame(buf) {
        Frame::Short => Read::Short,
        Frame::Invalid(why) => Read::Invalid(why),
        Frame::Whole { payload, size } => match decode_payload(payload) {
            Ok((revision, proposal)) => Read::Record {
                revision,
                proposal,
                size,
            },
            Err(e) => Read::Invalid(Invalid::Decode(e)),
        },
    }
}

fn decode_payload(payload: &[u8]) -> Result<(u64, Proposal), DecodeError> {
    let mut r = Reader::over(payload);
    let revision = r.u64("revision")?;
    let proposal = read_proposal(&mut r)?;
    r.finish()?;
    Ok((revision, proposal))
}

/// Decodes a proposal encoded by [`encode_proposal`].
///
/// # Errors
/// A [`DecodeError`] naming the field that is cut short or out of range,
/// or the bytes left over after the proposal.
pub fn decode_proposal(bytes: &[u8]) -> Result<Proposal, DecodeError> {
    let mut r = Reader::over(bytes);
    let proposal = read_proposal(&mut r)?;
    r.finish()?;
    Ok(proposal)
}

fn read_proposal(r: &mut Reader) -> Result<Proposal, DecodeError> {
    let now_ms = r.u64("time")?;
    let tag = r.u8("command tag")?;
    let origin = if tag & ORIGIN != 0 {
        Some(Origin {
            session: SessionId(r.u64("origin session")?),
            xid: r.u32("origin xid")?,
        })
    } else {
        None
    };
    let command = match tag & !ORIGIN {
        1 => Command::OpenSession {
            timeout_ms: r.u32("timeout")?,
            secret: SessionSecret(r.array("secret")?),
        },
        2 => Command::CloseSession {
            session: SessionId(r.u64("session")?),
        },
        3 => Command::ExpireSession {
            session: SessionId(r.u64("session")?),
        },
        4 => {
            let session = SessionId(r.u64("session")?);
            let path = r.str16("path")?;
            let data = r.bytes32("data")?;
            let (raw, with_acl) = split_create_mode(r.u8("create mode")?);
            let mode = CreateMode::from_u8(raw).ok_or(DecodeError::BadValue {
                what: "create mode",
                value: raw.into(),
            })?;
            let fence = r.opt_u64("fence")?;
            let acl = if with_acl { Acl::read(r)? } else { Acl::OPEN };
            Command::Create {
                session,
                path,
                data,
                mode,
                fence,
                acl,
            }
        }
        5 => Command::Delete {
            path: r.str16("path")?,
            version: r.opt_u32("version")?,
            fence: r.opt_u64("fence")?,
        },
        6 => Command::SetData {
            path: r.str16("path")?,
            data: r.bytes32("data")?,
            version: r.opt_u32("version")?,
            fence: r.opt_u64("fence")?,
        },
        t @ (7 | 9) => Command::Enqueue {
            session: SessionId(r.u64("session")?),
            path: r.str16("path")?,
            data: r.bytes32("data")?,
            rule: if t == 7 {
                QueueRule::Exclusive
            } else {
                QueueRule::read(r)?
            },
        },
        10 => Command::SetLockDelay {
            path: r.str16("path")?,
            delay_ms: r.u32("delay")?,
        },
        11 => Command::DeleteTombstone {
            path: r.str16("path")?,
        },
        13 => Command::DeleteContainer {
            path: r.str16("path")?,
        },
        12 => Command::SetAcl {
            path: r.str16("path")?,
            acl: Acl::read(r)?,
            version: r.opt_u32("version")?,
        },
        8 => {
            let session = SessionId(r.u64("session")?);
            let count = r.u16("operation count")?;
            let mut ops = Vec::new();
            for _ in 0..count {
                ops.push(TxnOp::decode(r)?);
            }
            Command::Multi { session, ops }
        }
        tag => {
            return Err(DecodeError::BadValue {
                what: "command tag",
                value: tag.into(),
            })
        }
    };
    Ok(Proposal {
        now_ms,
        origin,
        command,
    })
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

fn put_opt32(out: &mut Vec<u8>, v: Option<u32>) {
    match v {
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_be_bytes());
        }
        None => out.push(0),
    }
}

fn put_opt64(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => {
            out.push(1);
            put_u64(out, v);
        }
        None => out.push(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn digest_acl() -> baton_proto::Acl {
        use baton_proto::acl::perms;
        baton_proto::Acl::new(vec![
            baton_proto::AclEntry {
                perms: perms::ALL,
                scheme: "digest".into(),
                id: "ann:Xdm0BV8gT1tcNfPQDHUsCGmPqaU=".into(),
            },
            baton_proto::AclEntry {
                perms: perms::READ,
                scheme: "world".into(),
                id: "anyone".into(),
            },
        ])
    }

    fn proposals() -> Vec<Proposal> {
        let commands = vec![
            Command::OpenSession {
                timeout_ms: 5000,
                secret: SessionSecret([9; 16]),
            },
            Command::CloseSession {
                session: SessionId(3),
            },
            Command::ExpireSession {
                session: SessionId(4),
            },
            Command::Create {
                session: SessionId(1),
                path: "/a/b-".into(),
                data: Bytes::from_static(b"xyz"),
                mode: CreateMode::EphemeralSequential,
                fence: Some(7),
                acl: baton_proto::Acl::OPEN,
            },
            Command::Delete {
                path: "/a".into(),
                version: Some(2),
                fence: None,
            },
            Command::SetData {
                path: "/a".into(),
                data: Bytes::new(),
                version: None,
                fence: Some(u64::MAX),
            },
            Command::Enqueue {
                session: SessionId(2),
                path: "/q/lock-".into(),
                data: Bytes::from_static(b"me"),
                rule: QueueRule::Exclusive,
            },
            Command::Enqueue {
                session: SessionId(2),
                path: "/q/read-".into(),
                data: Bytes::new(),
                rule: QueueRule::Shared,
            },
            Command::Enqueue {
                session: SessionId(3),
                path: "/s/permit-".into(),
                data: Bytes::new(),
                rule: QueueRule::Permits(7),
            },
            Command::SetLockDelay {
                path: "/s".into(),
                delay_ms: 2_500,
            },
            Command::DeleteTombstone {
                path: "/s/permit-0000000009".into(),
            },
            Command::Create {
                session: SessionId(5),
                path: "/secret".into(),
                data: Bytes::from_static(b"s"),
                mode: CreateMode::PersistentSequential,
                fence: None,
                acl: digest_acl(),
            },
            Command::SetAcl {
                path: "/secret".into(),
                acl: digest_acl(),
                version: Some(3),
            },
            Command::SetAcl {
                path: "/".into(),
                acl: baton_proto::Acl::OPEN,
                version: None,
            },
            Command::Create {
                session: SessionId(5),
                path: "/c".into(),
                data: Bytes::new(),
                mode: CreateMode::Container,
                fence: None,
                acl: digest_acl(),
            },
            Command::DeleteContainer { path: "/c".into() },
            Command::Multi {
                session: SessionId(5),
                ops: vec![TxnOp::Create {
                    path: "/m".into(),
                    data: Bytes::new(),
                    mode: CreateMode::Ephemeral,
                    fence: Some(4),
                    acl: digest_acl(),
                }],
            },
        ];
        commands
            .into_iter()
            .enumerate()
            .map(|(i, command)| Proposal {
                now_ms: 1000 + i as u64,
                origin: (i % 2 == 1).then_some(Origin {
                    session: SessionId(i as u64),
                    xid: u32::MAX - i as u32,
                }),
                command,
            })
            .collect()
    }

    #[test]
    fn records_round_trip() {
        let mut log = Vec::new();
        for (i, p) in proposals().iter().enumerate() {
            encode(&mut log, i as u64 + 1, p);
        }
        let mut at = 0;
        for (i, want) in proposals().into_iter().enumerate() {
            match read(&log[at..]) {
                Read::Record {
                    revision,
                    proposal,
                    size,
                } => {
                    assert_eq!(revision, i as u64 + 1);
                    assert_eq!(proposal, want);
                    at += size;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(read(&log[at..]), Read::Short));
        let mut one = Vec::new();
        encode_proposal(&mut one, &proposals()[3]);
        assert_eq!(decode_proposal(&one).unwrap(), proposals()[3]);
    }

    #[test]
    fn cut_and_flipped_records_are_told_apart() {
        let mut log = Vec::new();
        encode(&mut log, 1, &proposals()[3]);
        for cut in 1..log.len() {
            assert!(matches!(read(&log[..cut]), Read::Short), "cut at {cut}");
        }
        for byte in 0..log.len() {
            let mut bad = log.clone();
            bad[byte] ^= 0x10;
            assert!(
                matches!(read(&bad), Read::Invalid(_)),
                "flip in byte {byte} went unnoticed"
            );
        }
    }
}
