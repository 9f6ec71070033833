//! The status probe: what a server says of itself without a session.
//!
//! Any server answers it, a cluster member that does not lead included, so
//! that tools can find out which member leads and how each is doing (like
//! ZooKeeper's four-letter words on the client port).
//!
//! # Format
//! ```text
//! StatusProbe (client -> server, first frame), 6 bytes:
//!   magic    [4]  "BATS"
//!   version  u16  1
//! StatusAnswer (server -> client, one frame): a JSON object, UTF-8; then
//! the server closes the connection.
//! ```

use bytes::{BufMut, BytesMut};

use crate::frame::encode_frame;

/// The first bytes of a status probe (a handshake starts with "BATN").
pub const PROBE_MAGIC: [u8; 4] = *b"BATS";

/// The probe's version.
pub const PROBE_VERSION: u16 = 1;

/// Appends a status probe, framed, to `buf`.
pub fn encode_probe(buf: &mut BytesMut) {
    encode_frame(buf, |b| {
        b.put_slice(&PROBE_MAGIC);
        b.put_u16(PROBE_VERSION);
    });
}

/// Whether a first frame's payload is a status probe.
pub fn is_probe(payload: &[u8]) -> bool {
    payload.len() >= 6 && payload[..4] == PROBE_MAGIC
}

/// Appends the answer to a probe, framed: `json`, a JSON object.
pub fn encode_answer(buf: &mut BytesMut, json: &str) {
    encode_frame(buf, |b| b.put_slice(json.as_bytes()));
}
