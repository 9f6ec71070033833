//! Transactions: an ordered list of operations applied all or none, under
//! one revision.
//!
//! # Format
//! ```text
//! an operation (in a multi request, and in the log):
//!   kind u8, then by kind:
//!   1 create      path str, mode u8, data bytes, fence opt64, then an
//!                 ACL if the mode has bit 0x80 (see [`acl`](crate::acl))
//!   2 delete      path str, version opt32, fence opt64
//!   3 set data    path str, data bytes, version opt32, fence opt64
//!   4 check       path str, check u8, then by check:
//!                   0 exists    (empty)
//!                   1 absent    (empty)
//!                   2 version   version u32
//!                   3 fence     token u64: the node accepts the token (it is
//!                               at least the highest the node has accepted),
//!                               as a fenced write would; nothing is raised
//!                   4 holder    token u64: a child of the node created at
//!                               revision token still exists (as check token)
//!
//! a result (in a multi reply):
//!   kind u8 (as the operation's), then by kind:
//!   1 create      path str, sequence opt64, stat
//!   2 delete      (empty)
//!   3 set data    stat
//!   4 check       (empty)
//! ```

use bytes::{BufMut, Bytes};

use crate::acl::{put_create_acl, put_create_mode, split_create_mode, Acl};
use crate::error::{DecodeError, ErrorCode};
use crate::mode::CreateMode;
use crate::path;
use crate::stat::Stat;
use crate::wire::{put_bytes32, put_opt_u32, put_opt_u64, put_str16, Reader};

/// Most operations in one transaction. A transaction with more is refused
/// with [`ErrorCode::TooManyOperations`]
/// and changes nothing.
pub const MAX_TXN_OPS: usize = 1024;

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    /// As [`Request::Create`](crate::Request::Create): with `fence`, the
    /// parent must accept the token.
    Create {
        path: String,
        data: Bytes,
        mode: CreateMode,
        fence: Option<u64>,
        acl: Acl,
    },
    /// As [`Request::Delete`](crate::Request::Delete).
    Delete {
        path: String,
        version: Option<u32>,
        fence: Option<u64>,
    },
    /// As [`Request::SetData`](crate::Request::SetData).
    SetData {
        path: String,
        data: Bytes,
        version: Option<u32>,
        fence: Option<u64>,
    },
    /// A condition on the node at `path`; the transaction fails unless it
    /// holds when this operation's turn comes.
    Check { path: String, check: Check },
}

/// What a [`TxnOp::Check`] requires of its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    /// The node exists.
    Exists,
    /// The node does not exist.
    Absent,
    /// The node exists at this data version.
    Version(u32),
    /// The node accepts this fencing token: it is at least the highest the
    /// node has accepted (a fenced write with it would pass the fence).
    Fence(u64),
    /// A child of the node created at this revision still exists: the
    /// holder of this fencing token still holds its place (as
    /// [`Request::CheckToken`](crate::Request::CheckToken)).
    Holder(u64),
}

/// What an operation of a committed transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnResult {
    Created {
        /// The node's actual path (with the suffix, for sequential nodes).
        path: String,
        sequence: Option<u64>,
        stat: Stat,
    },
    Deleted,
    DataSet(Stat),
    Checked,
}

/// Checks a transaction's limits, as client and server both do before it
/// is sent or proposed: at most [`MAX_TXN_OPS`] operations, and at most
/// `max_data` bytes of data (of its creates and set datas) in all.
///
/// # Errors
/// The operation at which a limit is passed (index [`MAX_TXN_OPS`] for too
/// many), the code to refuse it with, and a message saying why.
pub fn check_limits(ops: &[TxnOp], max_data: usize) -> Result<(), (u32, ErrorCode, String)> {
    if ops.len() > MAX_TXN_OPS {
        return Err((
            MAX_TXN_OPS as u32,
            ErrorCode::TooManyOperations,
            format!(
                "a transaction of {} operations exceeds the limit of {MAX_TXN_OPS}: split it, or make it smaller",
                ops.len()
            ),
        ));
    }
    let mut total = 0usize;
    for (index, op) in ops.iter().enumerate() {
        total += op.data().map_or(0, |d| d.len());
        if total > max_data {
            return Err((
                index as u32,
                ErrorCode::ValueTooLarge,
                format!(
                    "the transaction's data reaches {total} bytes at operation {index}, beyond the server's limit of {max_data} bytes for one transaction"
                ),
            ));
        }
    }
    Ok(())
}

const CREATE: u8 = 1;
const DELETE: u8 = 2;
const SET_DATA: u8 = 3;
const CHECK: u8 = 4;

impl TxnOp {
    /// The path the operation names.
    pub fn path(&self) -> &str {
        match self {
            TxnOp::Create { path, .. }
            | TxnOp::Delete { path, .. }
            | TxnOp::SetData { path, .. }
            | TxnOp::Check { path, .. } => path,
        }
    }

    /// The operation's data, if it writes any.
    pub fn data(&self) -> Option<&Bytes> {
        match self {
            TxnOp::Create { data, .. } | TxnOp::SetData { data, .. } => Some(data),
            TxnOp::Delete { .. } | TxnOp::Check { .. } => None,
        }
    }

    /// A short lower-case name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            TxnOp::Create { .. } => "create",
            TxnOp::Delete { .. } => "delete",
            TxnOp::SetData { .. } => "set data",
            TxnOp::Check { .. } => "check",
        }
    }

    /// Appends the operation in its wire layout.
    pub fn encode(&self, b: &mut impl BufMut) {
        match self {
            TxnOp::Create {
                path,
                data,
                mode,
                fence,
                acl,
            } => {
                b.put_u8(CREATE);
                put_str16(b, path);
                put_create_mode(b, mode.to_u8(), acl);
                put_bytes32(b, data);
                put_opt_u64(b, *fence);
                put_create_acl(b, acl);
            }
            TxnOp::Delete {
                path,
                version,
                fence,
            } => {
                b.put_u8(DELETE);
                put_str16(b, path);
                put_opt_u32(b, *version);
                put_opt_u64(b, *fence);
            }
            TxnOp::SetData {
                path,
                data,
                version,
                fence,
            } => {
                b.put_u8(SET_DATA);
                put_str16(b, path);
                put_bytes32(b, data);
                put_opt_u32(b, *version);
                put_opt_u64(b, *fence);
            }
            TxnOp::Check { path, check } => {
                b.put_u8(CHECK);
                put_str16(b, path);
                match *check {
                    Check::Exists => b.put_u8(0),
                    Check::Absent => b.put_u8(1),
                    Check::Version(v) => {
                        b.put_u8(2);
                        b.put_u32(v);
                    }
                    Check::Fence(t) => {
                        b.put_u8(3);
                        b.put_u64(t);
                    }
                    Check::Holder(t) => {
                        b.put_u8(4);
                        b.put_u64(t);
                    }
                }
            }
        }
    }

    /// Reads one operation; its path is checked against the path rules.
    ///
    /// # Errors
    /// A [`DecodeError`] naming the field cut short or out of range, or the
    /// invalid path.
    pub fn decode(r: &mut Reader) -> Result<TxnOp, DecodeError> {
        let kind = r.u8("operation kind")?;
        let path = read_path(r)?;
        Ok(match kind {
            CREATE => {
                let (raw, with_acl) = split_create_mode(r.u8("mode")?);
                let mode = CreateMode::from_u8(raw).ok_or(DecodeError::BadValue {
                    what: "mode",
                    value: raw.into(),
                })?;
                let data = r.bytes32("data")?;
                let fence = r.opt_u64("fence")?;
                let acl = if with_acl { Acl::read(r)? } else { Acl::OPEN };
                TxnOp::Create {
                    path,
                    mode,
                    data,
                    fence,
                    acl,
                }
            }
            DELETE => TxnOp::Delete {
                path,
                version: r.opt_u32("version")?,
                fence: r.opt_u64("fence")?,
            },
            SET_DATA => TxnOp::SetData {
                path,
                data: r.bytes32("data")?,
                version: r.opt_u32("version")?,
                fence: r.opt_u64("fence")?,
            },
            CHECK => {
                let check = match r.u8("check")? {
                    0 => Check::Exists,
                    1 => Check::Absent,
                    2 => Check::Version(r.u32("version")?),
                    3 => Check::Fence(r.u64("token")?),
                    4 => Check::Holder(r.u64("token")?),
                    other => {
                        return Err(DecodeError::BadValue {
                            what: "check",
                            value: other.into(),
                        })
                    }
                };
                TxnOp::Check { path, check }
            }
            other => {
                return Err(DecodeError::BadValue {
                    what: "operation kind",
                    value: other.into(),
                })
            }
        })
    }
}

impl TxnResult {
    /// Appends the result in its wire layout.
    pub fn encode(&self, b: &mut impl BufMut) {
        match self {
            TxnResult::Created {
                path,
                sequence,
                stat,
            } => {
                b.put_u8(CREATE);
                put_str16(b, path);
                put_opt_u64(b, *sequence);
                stat.encode(b);
            }
            TxnResult::Deleted => b.put_u8(DELETE),
            TxnResult::DataSet(stat) => {
                b.put_u8(SET_DATA);
                stat.encode(b);
            }
            TxnResult::Checked => b.put_u8(CHECK),
        }
    }

    /// Reads one result.
    ///
    /// # Errors
    /// A [`DecodeError`] naming the field cut short or out of range.
    pub fn decode(r: &mut Reader) -> Result<TxnResult, DecodeError> {
        Ok(match r.u8("result kind")? {
            CREATE => TxnResult::Created {
                path: r.str16("path")?,
                sequence: r.opt_u64("sequence")?,
                stat: Stat::decode(r)?,
            },
            DELETE => TxnResult::Deleted,
            SET_DATA => TxnResult::DataSet(Stat::decode(r)?),
            CHECK => TxnResult::Checked,
            other => {
                return Err(DecodeError::BadValue {
                    what: "result kind",
                    value: other.into(),
                })
            }
        })
    }
}

fn read_path(r: &mut Reader) -> Result<String, DecodeError> {
    let raw = r.raw16("path")?;
    Ok(path::validate_bytes(raw)?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn ops() -> Vec<TxnOp> {
        vec![
            TxnOp::Create {
                path: "/a".into(),
                data: Bytes::from_static(b"x"),
                mode: CreateMode::EphemeralSequential,
                fence: Some(7),
                acl: crate::Acl::OPEN,
            },
            TxnOp::Delete {
                path: "/b".into(),
                version: Some(3),
                fence: None,
            },
            TxnOp::SetData {
                path: "/c".into(),
                data: Bytes::new(),
                version: None,
                fence: Some(u64::MAX),
            },
            TxnOp::Check {
                path: "/d".into(),
                check: Check::Exists,
            },
            TxnOp::Check {
                path: "/d".into(),
                check: Check::Absent,
            },
            TxnOp::Check {
                path: "/d".into(),
                check: Check::Version(9),
            },
            TxnOp::Check {
                path: "/d".into(),
                check: Check::Fence(11),
            },
            TxnOp::Check {
                path: "/d".into(),
                check: Check::Holder(12),
            },
        ]
    }

    #[test]
    fn operations_and_results_round_trip() {
        let mut b = BytesMut::new();
        for op in ops() {
            op.encode(&mut b);
        }
        let frozen = b.freeze();
        let mut r = Reader::new(&frozen);
        for op in ops() {
            assert_eq!(TxnOp::decode(&mut r).unwrap(), op);
        }
        assert!(r.at_end());

        let results = [
            TxnResult::Created {
                path: "/a0000000001".into(),
                sequence: Some(1),
                stat: Stat::default(),
            },
            TxnResult::Deleted,
            TxnResult::DataSet(Stat {
                version: 4,
                ..Stat::default()
            }),
            TxnResult::Checked,
        ];
        let mut b = BytesMut::new();
        for result in &results {
            result.encode(&mut b);
        }
        let frozen = b.freeze();
        let mut r = Reader::new(&frozen);
        for result in &results {
            assert_eq!(&TxnResult::decode(&mut r).unwrap(), result);
        }
        assert!(r.at_end());
    }

    #[test]
    fn a_bad_kind_a_bad_check_and_a_bad_path_are_named() {
        for (bytes, what) in [
            (&b"\x09\x00\x02/a"[..], "operation kind"),
            (&b"\x04\x00\x02/a\x07"[..], "check"),
        ] {
            let frozen = Bytes::copy_from_slice(bytes);
            let e = TxnOp::decode(&mut Reader::new(&frozen)).unwrap_err();
            assert!(
                matches!(e, DecodeError::BadValue { what: w, .. } if w == what),
                "{e:?}"
            );
        }
        let frozen = Bytes::from_static(b"\x01\x00\x02a/");
        let e = TxnOp::decode(&mut Reader::new(&frozen)).unwrap_err();
        assert!(matches!(e, DecodeError::InvalidPath(_)), "{e:?}");
    }
}
