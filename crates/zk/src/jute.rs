//! Jute, ZooKeeper's record encoding: big-endian `int` (4 bytes), `long`
//! (8), `boolean` (1); `buffer` and `ustring` as an `int` length then the
//! bytes (-1 for null, read as empty); `vector` as an `int` count (-1 for
//! null) then the elements.
//!
//! The reader checks every length against what is left, so a lying length
//! fails the decode (naming the field) rather than allocating what it
//! claims.

use baton_proto::wire::Reader;
use baton_proto::DecodeError;
use bytes::{BufMut, Bytes};

/// Reads jute fields from a frame.
pub struct JuteReader<'a> {
    inner: Reader<'a>,
    frame: &'a Bytes,
}

impl<'a> JuteReader<'a> {
    /// A reader over a frame; buffers share its memory.
    pub fn new(frame: &'a Bytes) -> Self {
        JuteReader {
            inner: Reader::new(frame),
            frame,
        }
    }

    pub fn int(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        Ok(self.inner.u32(what)? as i32)
    }

    pub fn long(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(self.inner.u64(what)? as i64)
    }

    /// A boolean: any byte but 0 is true, as Java's `readBoolean` reads it.
    pub fn boolean(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        Ok(self.inner.u8(what)? != 0)
    }

    /// A length: -1 (null) reads as 0; any other negative length, or one
    /// longer than what is left, fails.
    fn len(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        match self.int(what)? {
            -1 => Ok(0),
            n if n < 0 => Err(DecodeError::BadValue {
                what,
                value: n as u32 as u64,
            }),
            n => {
                let n = n as usize;
                if n > self.inner.remaining() {
                    return Err(DecodeError::Truncated { what });
                }
                Ok(n)
            }
        }
    }

    pub fn buffer(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let n = self.len(what)?;
        let raw = self.inner.take(n, what)?;
        Ok(self.frame.slice_ref(raw))
    }

    pub fn ustring(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let n = self.len(what)?;
        let raw = self.inner.take(n, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { what })
    }

    /// A vector whose elements are read by `element`, each at least
    /// `min_size` bytes (so that a count larger than the bytes left fails
    /// before anything is allocated).
    pub fn vector<T>(
        &mut self,
        what: &'static str,
        min_size: usize,
        mut element: impl FnMut(&mut Self) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, DecodeError> {
        let count = match self.int(what)? {
            -1 => 0,
            n if n < 0 => {
                return Err(DecodeError::BadValue {
                    what,
                    value: n as u32 as u64,
                })
            }
            n => n as usize,
        };
        if count.saturating_mul(min_size.max(1)) > self.inner.remaining() {
            return Err(DecodeError::Truncated { what });
        }
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            out.push(element(self)?);
        }
        Ok(out)
    }

    /// A vector of strings.
    pub fn strings(&mut self, what: &'static str) -> Result<Vec<String>, DecodeError> {
        self.vector(what, 4, |r| r.ustring(what))
    }

    /// Bytes left unread.
    pub fn remaining(&self) -> usize {
        self.inner.remaining()
    }

    pub fn at_end(&self) -> bool {
        self.inner.at_end()
    }
}

pub fn put_int(b: &mut impl BufMut, v: i32) {
    b.put_i32(v);
}

pub fn put_long(b: &mut impl BufMut, v: i64) {
    b.put_i64(v);
}

pub fn put_bool(b: &mut impl BufMut, v: bool) {
    b.put_u8(u8::from(v));
}

/// A buffer or ustring: its length, then its bytes.
///
/// # Panics
/// If `v` is longer than `i32::MAX` bytes (no frame is).
pub fn put_buffer(b: &mut impl BufMut, v: &[u8]) {
    b.put_i32(i32::try_from(v.len()).expect("a field of less than 2 GiB"));
    b.put_slice(v);
}

pub fn put_str(b: &mut impl BufMut, v: &str) {
    put_buffer(b, v.as_bytes());
}

/// A vector of strings.
pub fn put_strings<S: AsRef<str>>(b: &mut impl BufMut, v: impl ExactSizeIterator<Item = S>) {
    b.put_i32(i32::try_from(v.len()).expect("fewer than 2^31 elements"));
    for s in v {
        put_str(b, s.as_ref());
    }
}

/// Bytes a string takes encoded.
pub fn str_len(s: &str) -> usize {
    4 + s.len()
}
