//! Snapshots: the whole state at one revision, in one checksummed file.
//!
//! # Format
//! ```text
//! header, 52 bytes (format 7):
//!   magic       [8]  "BATNSNAP"
//!   format      u32  7
//!   revision    u64  the state's revision
//!   last_now_ms u64  the time the latest change was stamped with
//!   sessions    u64  number of session entries
//!   nodes       u64  number of node entries
//!   body_crc    u32  CRC32C of everything after the header
//!   header_crc  u32  CRC32C of the 48 bytes before it
//! sessions: id u64, timeout_ms u32, secret [16],
//!   last: u8 0, or 1 then xid u32 and the reply to the session's latest
//!   change request:
//!     tag u8 1 created:  path str, sequence opt64, stat
//!            2 enqueued: path str, sequence u64, stat,
//!                        predecessor: u8 0 | 1 + path str + stat
//!            3 deleted
//!            4 data set: stat
//!            5 refused:  code u16, message str
//!            6 multi:    count u16, then count outcomes (tags 1, 3, 4, 8)
//!            7 multi failed: index u32, code u16, message str
//!            8 checked (inside a multi only)
//!            9 lock delay set
//!           10 ACL set:  stat, aversion u32
//! nodes, each after its parent, the root first:
//!   path str, data bytes, czxid u64, mzxid u64, pzxid u64, ctime u64,
//!   mtime u64, version u32, cversion u32, owner u64, fence u64,
//!   rule: kind u8 (0 exclusive, 1 shared, 2 permits), then permits u32 if 2,
//!   extras u8: bit 0 a lock-delay follows (delay_ms u32), bit 1 the node is
//!   a lock-delay tombstone (due_ms u64 follows), bit 2 an access control
//!   list follows (aversion u32, then the list as in baton_proto::acl), bit 3
//!   the node is a container
//! stat: 64 bytes, as on the wire
//! ```
//! Format 6 (still read) is format 7 without access control lists and
//! containers (no extras bits 2 and 3, no tag 10); format 5 is format 6 without the extras (no
//! lock-delays);
//! format 4 is format 5 without the nodes' rules (every node exclusive);
//! format 3 (still read) is format 4 without transactions (no tags 6 to
//! 8); format 2 (still read) is format 3 whose sessions keep no refusal (no
//! tag 5); format 1 (still read) has a 44-byte header without `last_now_ms`, and
//! sessions without `last`.
//!
//! The server writes a snapshot to a temporary file, syncs it, and renames it
//! into place, so a crash leaves either the old set of snapshots or the new
//! one. The same bytes, in memory, are what a cluster member sends one far
//! behind.

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;

use baton_proto::wire::Reader;
use baton_proto::{
    Acl, DecodeError, ErrorCode, ErrorReply, QueueRule, SessionId, SessionSecret, Stat,
};

use crate::{LastReply, NodeImage, Outcome, SessionImage, StateMachine};

const MAGIC: &[u8; 8] = b"BATNSNAP";
const FORMAT: u32 = 7;
const HEADER: usize = 52;
const HEADER_V1: usize = 44;

/// The file name of the snapshot at `revision`.
pub fn file_name(revision: u64) -> String {
    format!("snapshot-{revision:020}.snap")
}

/// Writes `sm` as a snapshot into `out`, from its current position (the
/// header is written last, once the body's size and checksum are known).
///
/// # Errors
/// Any I/O failure of `out`.
pub fn encode<W: Write + Seek>(sm: &StateMachine, out: &mut W) -> std::io::Result<()> {
    let begin = out.stream_position()?;
    out.write_all(&[0u8; HEADER])?; // patched below
    let mut body = CrcWriter::new(&mut *out);
    let mut sessions = 0u64;
    for (id, session) in sm.sessions() {
        body.put(&id.0.to_be_bytes())?;
        body.put(&session.timeout_ms.to_be_bytes())?;
        body.put(&session.secret.0)?;
        match session.last_reply(id) {
            None => body.put(&[0])?,
            Some(last) => {
                body.put(&[1])?;
                body.put(&last.xid.to_be_bytes())?;
                match &last.reply {
                    Ok(outcome) => put_outcome(&mut body, outcome)?,
                    Err(e) => {
                        body.put(&[5])?;
                        body.put(&e.code.to_u16().to_be_bytes())?;
                        put_str(&mut body, &e.message)?;
                    }
                }
            }
        }
        sessions += 1;
    }
    let mut nodes = 0u64;
    for n in sm.nodes_parent_first() {
        put_str(&mut body, &n.path)?;
        body.put(&(n.data.len() as u32).to_be_bytes())?;
        body.put(&n.data)?;
        for v in [n.czxid, n.mzxid, n.pzxid, n.ctime, n.mtime] {
            body.put(&v.to_be_bytes())?;
        }
        body.put(&n.version.to_be_bytes())?;
        body.put(&n.cversion.to_be_bytes())?;
        body.put(&n.owner.to_be_bytes())?;
        body.put(&n.fence.to_be_bytes())?;
        let mut rule = Vec::with_capacity(18);
        n.rule.put(&mut rule);
        let with_acl = !n.acl.is_open() || n.aversion > 0;
        let extras = u8::from(n.lock_delay_ms > 0)
            | u8::from(n.tombstone_until > 0) << 1
            | u8::from(with_acl) << 2
            | u8::from(n.container) << 3;
        rule.push(extras);
        if n.lock_delay_ms > 0 {
            rule.extend_from_slice(&n.lock_delay_ms.to_be_bytes());
        }
        if n.tombstone_until > 0 {
            rule.extend_from_slice(&n.tombstone_until.to_be_bytes());
        }
        if with_acl {
            rule.extend_from_slice(&n.aversion.to_be_bytes());
            n.acl.put(&mut rule);
        }
        body.put(&rule)?;
        nodes += 1;
    }
    let crc = body.crc;
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&FORMAT.to_be_bytes());
    header.extend_from_slice(&sm.revision().to_be_bytes());
    header.extend_from_slice(&sm.last_now_ms().to_be_bytes());
    header.extend_from_slice(&sessions.to_be_bytes());
    header.extend_from_slice(&nodes.to_be_bytes());
    header.extend_from_slice(&crc.to_be_bytes());
    let header_crc = crc32c::crc32c(&header);
    header.extend_from_slice(&header_crc.to_be_bytes());
    let end = out.stream_position()?;
    out.seek(SeekFrom::Start(begin))?;
    out.write_all(&header)?;
    out.seek(SeekFrom::Start(end))?;
    out.flush()
}

fn put_str<W: Write>(w: &mut CrcWriter<W>, s: &str) -> std::io::Result<()> {
    w.put(&(s.len() as u16).to_be_bytes())?;
    w.put(s.as_bytes())
}

fn put_stat<W: Write>(w: &mut CrcWriter<W>, s: &Stat) -> std::io::Result<()> {
    for v in [s.czxid, s.mzxid, s.pzxid, s.ctime, s.mtime] {
        w.put(&v.to_be_bytes())?;
    }
    w.put(&s.version.to_be_bytes())?;
    w.put(&s.cversion.to_be_bytes())?;
    w.put(&s.ephemeral_owner.to_be_bytes())?;
    w.put(&s.data_length.to_be_bytes())?;
    w.put(&s.num_children.to_be_bytes())
}

fn put_outcome<W: Write>(w: &mut CrcWriter<W>, outcome: &Outcome) -> std::io::Result<()> {
    match outcome {
        Outcome::Created {
            path,
            sequence,
            stat,
        } => {
            w.put(&[1])?;
            put_str(w, path)?;
            match sequence {
                None => w.put(&[0])?,
                Some(s) => {
                    w.put(&[1])?;
                    w.put(&s.to_be_bytes())?;
                }
            }
            put_stat(w, stat)
        }
        Outcome::Enqueued {
            path,
            sequence,
            stat,
            predecessor,
        } => {
            w.put(&[2])?;
            put_str(w, path)?;
            w.put(&sequence.to_be_bytes())?;
            put_stat(w, stat)?;
            match predecessor {
                None => w.put(&[0]),
                Some((p, s)) => {
                    w.put(&[1])?;
                    put_str(w, p)?;
                    put_stat(w, s)
                }
            }
        }
        Outcome::Deleted => w.put(&[3]),
        Outcome::DataSet(stat) => {
            w.put(&[4])?;
            put_stat(w, stat)
        }
        Outcome::Multi(outcomes) => {
            w.put(&[6])?;
            w.put(&(outcomes.len() as u16).to_be_bytes())?;
            for outcome in outcomes {
                put_outcome(w, outcome)?;
            }
            Ok(())
        }
        Outcome::MultiFailed { index, error } => {
            w.put(&[7])?;
            w.put(&index.to_be_bytes())?;
            w.put(&error.code.to_u16().to_be_bytes())?;
            put_str(w, &error.message)
        }
        Outcome::Checked => w.put(&[8]),
        Outcome::LockDelaySet => w.put(&[9]),
        Outcome::AclSet { stat, aversion } => {
            w.put(&[10])?;
            put_stat(w, stat)?;
            w.put(&aversion.to_be_bytes())
        }
        // Sessions that opened or ended keep no reply: the first has no
        // request to answer, the second no session to keep it in.
        Outcome::SessionOpened(_) | Outcome::SessionEnded { .. } => w.put(&[0]),
    }
}

/// Why bytes are not a snapshot this build reads: the offset of the first
/// thing wrong, and what it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}: {what}")]
pub struct Corrupt {
    pub offset: usize,
    pub what: String,
}

fn corrupt(offset: usize, what: impl ToString) -> Corrupt {
    Corrupt {
        offset,
        what: what.to_string(),
    }
}

/// Reads and checks a snapshot held in memory.
///
/// # Errors
/// [`Corrupt`]: the offset of the first thing wrong, and what it is.
pub fn decode(bytes: &[u8]) -> Result<StateMachine, Corrupt> {
    if bytes.len() < HEADER_V1 || &bytes[..8] != MAGIC {
        return Err(corrupt(0, "not a Baton snapshot (bad magic or too short)"));
    }
    let format = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let header_len = match format {
        1 => HEADER_V1,
        2..=FORMAT if bytes.len() >= HEADER => HEADER,
        2..=FORMAT => return Err(corrupt(0, "snapshot shorter than its header")),
        other => {
            return Err(corrupt(
                8,
                format!("snapshot format {other}, this server reads 1 to {FORMAT}"),
            ))
        }
    };
    let header = &bytes[..header_len];
    let header_crc = u32::from_be_bytes(header[header_len - 4..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&header[..header_len - 4]) != header_crc {
        return Err(corrupt(0, "snapshot header fails its checksum"));
    }
    let mut h = Reader::over(&header[12..header_len - 8]);
    let revision = h.u64("revision").map_err(|e| corrupt(12, e))?;
    let last_now_ms = if format == 1 {
        0
    } else {
        h.u64("last change time").map_err(|e| corrupt(20, e))?
    };
    let sessions = h
        .u64("session count")
        .map_err(|e| corrupt(header_len - 24, e))?;
    let nodes = h
        .u64("node count")
        .map_err(|e| corrupt(header_len - 16, e))?;
    let body_crc = u32::from_be_bytes(
        header[header_len - 8..header_len - 4]
            .try_into()
            .expect("4 bytes"),
    );
    let body = &bytes[header_len..];
    if crc32c::crc32c(body) != body_crc {
        return Err(corrupt(header_len, "snapshot body fails its checksum"));
    }
    let mut r = Reader::over(body);
    let at = |r: &Reader| header_len + body.len() - r.remaining();
    let mut session_list = Vec::new();
    for _ in 0..sessions {
        let entry = (|| {
            Ok::<_, DecodeError>(SessionImage {
                id: SessionId(r.u64("session id")?),
                timeout_ms: r.u32("session timeout")?,
                secret: SessionSecret(r.array("session secret")?),
                last: if format == 1 {
                    None
                } else {
                    last_reply(&mut r, format)?
                },
            })
        })()
        .map_err(|e| corrupt(at(&r), e))?;
        session_list.push(entry);
    }
    let mut images = Vec::new();
    for _ in 0..nodes {
        let image = (|| {
            Ok::<_, DecodeError>(NodeImage {
                path: r.str16("node path")?,
                data: r.bytes32("node data")?,
                czxid: r.u64("czxid")?,
                mzxid: r.u64("mzxid")?,
                pzxid: r.u64("pzxid")?,
                ctime: r.u64("ctime")?,
                mtime: r.u64("mtime")?,
                version: r.u32("version")?,
                cversion: r.u32("cversion")?,
                owner: r.u64("owner")?,
                fence: r.u64("fence")?,
                rule: if format >= 5 {
                    QueueRule::read(&mut r)?
                } else {
                    QueueRule::Exclusive
                },
                lock_delay_ms: 0,
                tombstone_until: 0,
                acl: Acl::OPEN,
                aversion: 0,
                container: false,
            })
            .and_then(|mut image| {
                if format >= 6 {
                    let extras = r.u8("node extras")?;
                    if extras & 1 != 0 {
                        image.lock_delay_ms = r.u32("lock delay")?;
                    }
                    if extras & 2 != 0 {
                        image.tombstone_until = r.u64("tombstone due")?;
                    }
                    if extras & 4 != 0 && format >= 7 {
                        image.aversion = r.u32("ACL version")?;
                        image.acl = Acl::read(&mut r)?;
                    }
                    image.container = extras & 8 != 0;
                    if extras & !15 != 0 || (extras & 12 != 0 && format < 7) {
                        return Err(DecodeError::BadValue {
                            what: "node extras",
                            value: extras.into(),
                        });
                    }
                }
                Ok(image)
            })
        })()
        .map_err(|e| corrupt(at(&r), e))?;
        images.push(image);
    }
    if !r.at_end() {
        return Err(corrupt(at(&r), "bytes after the last node"));
    }
    StateMachine::restore(revision, last_now_ms, session_list, images)
        .map_err(|e| corrupt(header_len, e))
}

fn get_stat(r: &mut Reader) -> Result<Stat, DecodeError> {
    Ok(Stat {
        czxid: r.u64("czxid")?,
        mzxid: r.u64("mzxid")?,
        pzxid: r.u64("pzxid")?,
        ctime: r.u64("ctime")?,
        mtime: r.u64("mtime")?,
        version: r.u32("version")?,
        cversion: r.u32("cversion")?,
        ephemeral_owner: r.u64("ephemeral owner")?,
        data_length: r.u32("data length")?,
        num_children: r.u32("child count")?,
    })
}

fn last_reply(r: &mut Reader, format: u32) -> Result<Option<LastReply>, DecodeError> {
    if r.u8("kept reply")? == 0 {
        return Ok(None);
    }
    let xid = r.u32("kept reply xid")?;
    let reply = match r.u8("reply tag")? {
        0 => return Ok(None),
        5 if format >= 3 => Err(ErrorReply::new(
            ErrorCode::from_u16(r.u16("refusal code")?),
            r.str16("refusal message")?,
        )),
        tag => Ok(outcome(r, tag, format, false)?),
    };
    Ok(Some(LastReply { xid, reply }))
}

/// The kept outcome tagged `tag`; `in_multi` for one operation's outcome
/// inside a transaction's.
fn outcome(r: &mut Reader, tag: u8, format: u32, in_multi: bool) -> Result<Outcome, DecodeError> {
    let path = |r: &mut Reader| r.str16("reply path").map(|p| Arc::<str>::from(p.as_str()));
    Ok(match tag {
        1 => Outcome::Created {
            path: path(r)?,
            sequence: match r.u8("sequence present")? {
                0 => None,
                _ => Some(r.u64("sequence")?),
            },
            stat: get_stat(r)?,
        },
        2 if !in_multi => Outcome::Enqueued {
            path: path(r)?,
            sequence: r.u64("sequence")?,
            stat: get_stat(r)?,
            predecessor: match r.u8("predecessor present")? {
                0 => None,
                _ => Some((path(r)?, get_stat(r)?)),
            },
        },
        3 => Outcome::Deleted,
        4 => Outcome::DataSet(get_stat(r)?),
        6 if format >= 4 && !in_multi => {
            let count = r.u16("multi outcome count")?;
            let mut outcomes = Vec::new();
            for _ in 0..count {
                let tag = r.u8("multi outcome tag")?;
                outcomes.push(outcome(r, tag, format, true)?);
            }
            Outcome::Multi(outcomes)
        }
        7 if format >= 4 && !in_multi => Outcome::MultiFailed {
            index: r.u32("failed operation")?,
            error: ErrorReply::new(
                ErrorCode::from_u16(r.u16("refusal code")?),
                r.str16("refusal message")?,
            ),
        },
        8 if format >= 4 && in_multi => Outcome::Checked,
        9 if format >= 6 && !in_multi => Outcome::LockDelaySet,
        10 if format >= 7 && !in_multi => Outcome::AclSet {
            stat: get_stat(r)?,
            aversion: r.u32("ACL version")?,
        },
        tag => {
            return Err(DecodeError::BadValue {
                what: "reply tag",
                value: tag.into(),
            })
        }
    })
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
    use crate::Command;
    use baton_proto::CreateMode;
    use bytes::Bytes;

    /// The reply each session keeps for a resent request comes back from a
    /// snapshot as it was: what a change made, and why a request was
    /// refused.
    #[test]
    fn the_replies_sessions_keep_read_back_refusals_included() {
        use crate::{Origin, Proposal};
        let mut sm = StateMachine::new();
        for n in [1u8, 2] {
            sm.apply(
                &Command::OpenSession {
                    timeout_ms: 3000,
                    secret: SessionSecret([n; 16]),
                },
                1,
            );
        }
        let at = |session, xid, command| Proposal {
            now_ms: 2,
            origin: Some(Origin {
                session: SessionId(session),
                xid,
            }),
            command,
        };
        let set = |version| Command::SetData {
            path: "/a".into(),
            data: Bytes::from_static(b"x"),
            version: Some(version),
            fence: None,
        };
        let create = Command::Create {
            session: SessionId(1),
            path: "/a".into(),
            data: Bytes::new(),
            mode: CreateMode::Persistent,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        };
        sm.apply_proposal(&at(1, 4, create)).result.unwrap();
        let refused = sm.apply_proposal(&at(2, 7, set(5))).result.unwrap_err();
        assert_eq!(refused.code, baton_proto::ErrorCode::BadVersion);
        let mut out = std::io::Cursor::new(Vec::new());
        encode(&sm, &mut out).unwrap();
        let mut back = decode(out.get_ref()).unwrap();
        for id in [1, 2] {
            assert_eq!(
                back.session(SessionId(id))
                    .unwrap()
                    .last_reply(SessionId(id)),
                sm.session(SessionId(id)).unwrap().last_reply(SessionId(id))
            );
        }
        // The refused request, again after the state would let it pass,
        // is refused again from the snapshot's state too.
        back.apply_proposal(&at(1, 5, set(0))).result.unwrap();
        let again = back.apply_proposal(&at(2, 7, set(1)));
        assert_eq!(again.result, Err(refused));
        assert!(!again.changed);
    }

    /// Nodes' access control lists and ACL versions come back from a
    /// snapshot, and so does the reply kept for a set-ACL request.
    #[test]
    fn access_control_lists_read_back() {
        use crate::{Origin, Proposal};
        use baton_proto::acl::perms;
        use baton_proto::{Acl, AclEntry};
        let acl = Acl::new(vec![AclEntry {
            perms: perms::READ | perms::ADMIN,
            scheme: "digest".into(),
            id: "ann:hash".into(),
        }]);
        let mut sm = StateMachine::new();
        let session = match sm
            .apply(
                &Command::OpenSession {
                    timeout_ms: 3000,
                    secret: SessionSecret([1; 16]),
                },
                1,
            )
            .result
        {
            Ok(Outcome::SessionOpened(id)) => id,
            other => panic!("{other:?}"),
        };
        for (path, acl) in [
            ("/kept", acl.clone()),
            ("/open", Acl::OPEN),
            ("/reset", acl.clone()),
        ] {
            let create = Command::Create {
                session,
                path: path.into(),
                data: Bytes::new(),
                mode: CreateMode::Persistent,
                fence: None,
                acl,
            };
            sm.apply(&create, 2).result.unwrap();
        }
        // Set twice: back to open, at ACL version 2.
        for (xid, acl) in [(1, acl.clone()), (2, Acl::OPEN)] {
            let set = Proposal {
                now_ms: 3,
                origin: Some(Origin { session, xid }),
                command: Command::SetAcl {
                    path: "/reset".into(),
                    acl,
                    version: None,
                },
            };
            sm.apply_proposal(&set).result.unwrap();
        }
        let mut out = std::io::Cursor::new(Vec::new());
        encode(&sm, &mut out).unwrap();
        let back = decode(out.get_ref()).unwrap();
        assert_eq!(back.acl("/kept"), (&acl, 0));
        assert_eq!(back.acl("/open"), (&Acl::OPEN, 0));
        assert_eq!(back.acl("/reset"), (&Acl::OPEN, 2));
        let kept = back.session(session).unwrap().last_reply(session).unwrap();
        assert_eq!(
            kept,
            sm.session(session).unwrap().last_reply(session).unwrap()
        );
        assert!(matches!(
            kept.reply,
            Ok(Outcome::AclSet { aversion: 2, .. })
        ));
    }
}
