//! The status probe: what a server says of itself without a session.
//!
//! Any server answers it, a cluster member that does not lead included, so
//! that tools can find out which member leads and how each is doing (like
//! ZooKeeper's four-letter words on the client port).
//!
//! # Format
//! ```text
//! StatusProbe (client -> server, first frame), 6 bytes, or more with a
//! token:
//!   magic    [4]  "BATS"
//!   version  u16  1
//!   token    u16 length + bytes, optional: for a server that checks
//!            identities, the locks the token's identity may read are named
//! StatusAnswer (server -> client, one frame): a JSON object, UTF-8; then
//! the server closes the connection.
//!
//! BackupRequest (client -> server, first frame), 6 bytes, or more with a
//! token:
//!   magic    [4]  "BATB"
//!   version  u16  1
//!   token    u16 length + bytes, optional: for a server that checks
//!            identities, one with the admin right
//! BackupAnswer (server -> client): one frame holding a JSON object, either
//! {"revision", "bytes", "sessions", "nodes"} or {"error": message}; after
//! the first, the snapshot's `bytes` bytes in frames of at most 1 MiB, then
//! one empty frame; then the server closes the connection.
//! ```

use bytes::{BufMut, BytesMut};

use crate::frame::encode_frame;

/// The first bytes of a status probe (a handshake starts with "BATN").
pub const PROBE_MAGIC: [u8; 4] = *b"BATS";

/// The probe's version.
pub const PROBE_VERSION: u16 = 1;

/// Appends a status probe, framed, to `buf`, with `token` if given.
pub fn encode_probe(buf: &mut BytesMut, token: Option<&[u8]>) {
    encode_frame(buf, |b| {
        b.put_slice(&PROBE_MAGIC);
        b.put_u16(PROBE_VERSION);
        put_token(b, token);
    });
}

fn put_token(b: &mut BytesMut, token: Option<&[u8]>) {
    if let Some(token) = token {
        b.put_u16(token.len() as u16);
        b.put_slice(token);
    }
}

/// Whether a first frame's payload is a status probe.
pub fn is_probe(payload: &[u8]) -> bool {
    payload.len() >= 6 && payload[..4] == PROBE_MAGIC
}

/// The first bytes of a backup request.
pub const BACKUP_MAGIC: [u8; 4] = *b"BATB";

/// Most snapshot bytes in one frame of a backup answer.
pub const BACKUP_CHUNK: usize = 1 << 20;

/// Appends a backup request, framed, to `buf`.
pub fn encode_backup_request(buf: &mut BytesMut, token: Option<&[u8]>) {
    encode_frame(buf, |b| {
        b.put_slice(&BACKUP_MAGIC);
        b.put_u16(PROBE_VERSION);
        put_token(b, token);
    });
}

/// The token a backup request or a status probe carries, if any: none for
/// a request of another version, or one whose token is malformed, too long
/// or followed by other bytes.
pub fn backup_token(payload: &[u8]) -> Option<&[u8]> {
    if payload.get(4..6)? != PROBE_VERSION.to_be_bytes() {
        return None;
    }
    let rest = payload.get(6..)?;
    let len = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    (len <= crate::handshake::MAX_TOKEN && rest.len() == 2 + len).then(|| &rest[2..])
}

/// Whether a first frame's payload is a backup request.
pub fn is_backup_request(payload: &[u8]) -> bool {
    payload.len() >= 6 && payload[..4] == BACKUP_MAGIC
}

/// Appends the answer to a probe, framed: `json`, a JSON object.
pub fn encode_answer(buf: &mut BytesMut, json: &str) {
    encode_answer_bytes(buf, json.as_bytes());
}

/// Appends one frame of an answer holding `payload`.
pub fn encode_answer_bytes(buf: &mut BytesMut, payload: &[u8]) {
    encode_frame(buf, |b| b.put_slice(payload));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_token_is_read_only_from_a_well_formed_request() {
        let mut buf = BytesMut::new();
        encode_backup_request(&mut buf, Some(b"secret-token"));
        let payload = &buf[4..];
        assert_eq!(backup_token(payload), Some(&b"secret-token"[..]));
        let mut trailing = payload.to_vec();
        trailing.push(0);
        assert_eq!(backup_token(&trailing), None);
        let mut other_version = payload.to_vec();
        other_version[5] = 9;
        assert_eq!(backup_token(&other_version), None);
        assert_eq!(backup_token(&payload[..6]), None);
        let mut probe = BytesMut::new();
        encode_probe(&mut probe, Some(b"secret-token"));
        assert!(is_probe(&probe[4..]));
        assert_eq!(backup_token(&probe[4..]), Some(&b"secret-token"[..]));
    }
}
