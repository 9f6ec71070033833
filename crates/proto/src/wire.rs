//! Checked big-endian readers and writers shared by every message type.

use bytes::{BufMut, Bytes};

use crate::error::DecodeError;

/// A checked big-endian reader: every read checks the remaining length, so a
/// short or lying payload yields [`DecodeError::Truncated`] naming the field,
/// never a panic. It reads frames of the protocol and Baton's files alike.
///
/// Over a frame ([`Reader::new`]) byte fields share the frame's memory; over
/// borrowed bytes ([`Reader::over`], a file read whole, say) they are copied
/// out, so that what is kept does not hold on to the whole input.
pub struct Reader<'a> {
    buf: &'a [u8],
    shared: Option<&'a Bytes>,
}

impl<'a> Reader<'a> {
    /// A reader over a frame's payload; byte fields share its memory.
    pub fn new(frame: &'a Bytes) -> Self {
        Reader {
            buf: &frame[..],
            shared: Some(frame),
        }
    }

    /// A reader over borrowed bytes; byte fields are copied out.
    pub fn over(bytes: &'a [u8]) -> Self {
        Reader {
            buf: bytes,
            shared: None,
        }
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] naming `what` if fewer are left.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated { what });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A byte that must be 0 or 1.
    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DecodeError::BadValue {
                what,
                value: value.into(),
            }),
        }
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    /// An optional u32: a presence byte (0 or 1), then the value if present.
    pub fn opt_u32(&mut self, what: &'static str) -> Result<Option<u32>, DecodeError> {
        if self.bool(what)? {
            Ok(Some(self.u32(what)?))
        } else {
            Ok(None)
        }
    }

    /// An optional u64: a presence byte (0 or 1), then the value if present.
    pub fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        if self.bool(what)? {
            Ok(Some(self.u64(what)?))
        } else {
            Ok(None)
        }
    }

    /// A u16 length followed by that many raw bytes.
    pub fn raw16(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u16(what)? as usize;
        self.take(len, what)
    }

    /// A u32 length followed by that many bytes: shared with a frame, copied
    /// from borrowed bytes.
    pub fn bytes32(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let len = self.u32(what)? as usize;
        let bytes = self.take(len, what)?;
        Ok(match self.shared {
            Some(frame) => frame.slice_ref(bytes),
            None => Bytes::copy_from_slice(bytes),
        })
    }

    /// A u16 length followed by that many bytes of UTF-8.
    pub fn str16(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let raw = self.raw16(what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { what })
    }

    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Whether every byte has been read.
    pub fn at_end(&self) -> bool {
        self.buf.is_empty()
    }

    /// Fails if bytes are left over: a message must be exactly its bytes.
    ///
    /// # Errors
    /// [`DecodeError::TrailingBytes`] with their count.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }
}

pub(crate) fn put_bool(buf: &mut impl BufMut, value: bool) {
    buf.put_u8(value as u8);
}

pub(crate) fn put_opt_u32(buf: &mut impl BufMut, value: Option<u32>) {
    match value {
        Some(v) => {
            buf.put_u8(1);
            buf.put_u32(v);
        }
        None => buf.put_u8(0),
    }
}

pub(crate) fn put_opt_u64(buf: &mut impl BufMut, value: Option<u64>) {
    match value {
        Some(v) => {
            buf.put_u8(1);
            buf.put_u64(v);
        }
        None => buf.put_u8(0),
    }
}

/// Writes a u16 length and the string. Strings longer than `u16::MAX` bytes are
/// cut at a character boundary: only messages and paths use this, and paths are
/// limited far below it.
pub(crate) fn put_str16(buf: &mut impl BufMut, value: &str) {
    let mut end = value.len().min(u16::MAX as usize);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    buf.put_u16(end as u16);
    buf.put_slice(&value.as_bytes()[..end]);
}

pub(crate) fn put_bytes32(buf: &mut impl BufMut, value: &[u8]) {
    buf.put_u32(value.len() as u32);
    buf.put_slice(value);
}
