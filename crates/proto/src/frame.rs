//! Framing: every message travels as one length-prefixed frame.
//!
//! # Format
//! ```text
//! +----------------+---------------------------+
//! | length: u32 BE | payload: `length` bytes   |
//! +----------------+---------------------------+
//! ```
//! The length counts the payload only. This is tokio-util's
//! `LengthDelimitedCodec` with its default settings; [`frame_codec`] builds one
//! with an explicit maximum, and a frame longer than that maximum is an error
//! that ends the connection.

use bytes::{BufMut, BytesMut};
#[cfg(feature = "codec")]
use tokio_util::codec::LengthDelimitedCodec;

use crate::{DEFAULT_MAX_DATA, REQUEST_OVERHEAD};

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Default largest frame a server accepts: 1 MiB of data plus room for the
/// path and the fixed fields.
pub const DEFAULT_MAX_REQUEST_FRAME: usize = DEFAULT_MAX_DATA + REQUEST_OVERHEAD;

/// Largest frame a client accepts from a server (a long child list can exceed
/// the request limit).
pub const MAX_RESPONSE_FRAME: usize = 64 << 20;

/// A length-delimited codec that refuses frames longer than `max_frame`.
#[cfg(feature = "codec")]
pub fn frame_codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(HEADER_LEN)
        .big_endian()
        .max_frame_length(max_frame)
        .new_codec()
}

/// Appends one frame to `buf`: writes a placeholder length, lets `body` write
/// the payload, then patches the length in. Encoding in place saves the copy
/// that a separate payload buffer would cost.
pub fn encode_frame(buf: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    let start = buf.len();
    buf.put_u32(0);
    body(buf);
    let len = (buf.len() - start - HEADER_LEN) as u32;
    buf[start..start + HEADER_LEN].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::codec::Decoder;

    #[test]
    fn encoded_frames_decode_with_the_codec() {
        let mut buf = BytesMut::new();
        encode_frame(&mut buf, |b| b.put_slice(b"hello"));
        encode_frame(&mut buf, |_| {});
        let mut codec = frame_codec(16);
        assert_eq!(&codec.decode(&mut buf).unwrap().unwrap()[..], b"hello");
        assert_eq!(codec.decode(&mut buf).unwrap().unwrap().len(), 0);
        assert!(codec.decode(&mut buf).unwrap().is_none());
    }

    #[test]
    fn oversized_frame_is_an_error() {
        let mut buf = BytesMut::new();
        encode_frame(&mut buf, |b| b.put_slice(&[0u8; 17]));
        assert!(frame_codec(16).decode(&mut buf).is_err());
    }
}
