//! Checked big-endian readers and writers shared by every message type.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::DecodeError;

/// A cursor over one frame's payload; every read checks the remaining length,
/// so a short or lying frame yields [`DecodeError::Truncated`], never a panic.
pub(crate) struct Reader {
    buf: Bytes,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated { what });
        }
        Ok(self.buf.split_to(n))
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DecodeError::BadValue {
                what,
                value: value.into(),
            }),
        }
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    /// An optional u32: a presence byte (0 or 1), then the value if present.
    pub(crate) fn opt_u32(&mut self, what: &'static str) -> Result<Option<u32>, DecodeError> {
        if self.bool(what)? {
            Ok(Some(self.u32(what)?))
        } else {
            Ok(None)
        }
    }

    /// An optional u64: a presence byte (0 or 1), then the value if present.
    pub(crate) fn opt_u64(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        if self.bool(what)? {
            Ok(Some(self.u64(what)?))
        } else {
            Ok(None)
        }
    }

    /// A u16 length followed by that many raw bytes.
    pub(crate) fn raw16(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let len = self.u16(what)? as usize;
        self.take(len, what)
    }

    /// A u32 length followed by that many bytes, shared with the frame (no copy).
    pub(crate) fn bytes32(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    /// A u16 length followed by that many bytes of UTF-8.
    pub(crate) fn str16(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let raw = self.raw16(what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { what })
    }

    /// Whether every byte has been read.
    pub(crate) fn at_end(&self) -> bool {
        self.buf.is_empty()
    }

    /// Fails if bytes are left over: a frame must be exactly its message.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }
}

pub(crate) fn put_bool(buf: &mut BytesMut, value: bool) {
    buf.put_u8(value as u8);
}

pub(crate) fn put_opt_u32(buf: &mut BytesMut, value: Option<u32>) {
    match value {
        Some(v) => {
            buf.put_u8(1);
            buf.put_u32(v);
        }
        None => buf.put_u8(0),
    }
}

pub(crate) fn put_opt_u64(buf: &mut BytesMut, value: Option<u64>) {
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
pub(crate) fn put_str16(buf: &mut BytesMut, value: &str) {
    let mut end = value.len().min(u16::MAX as usize);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    buf.put_u16(end as u16);
    buf.put_slice(&value.as_bytes()[..end]);
}

pub(crate) fn put_bytes32(buf: &mut BytesMut, value: &[u8]) {
    buf.put_u32(value.len() as u32);
    buf.put_slice(value);
}
