//! Writing replies and notifications in ZooKeeper's form: each native reply
//! the core queues answers the oldest request still pending on the
//! connection, whose ZooKeeper op code says which record the reply is.

use std::collections::VecDeque;

use baton_proto::{ErrorCode, EventKind, Reply, TxnFailure, TxnResult};
use baton_zk::codes::{err, event, op};
use baton_zk::jute::{put_bool, put_buffer, put_int, put_str, put_strings};
use baton_zk::records::{encode_notification, framed};
use baton_zk::{ReplyHeader, Stat};
use bytes::{Bytes, BytesMut};
use tracing::warn;

use crate::outbox::{Encode, Out};

/// What the reply to a pending request becomes.
pub(super) enum Answer {
    /// The native reply, as ZooKeeper answers the request's op.
    Plain,
    /// A sync: the path it named.
    Sync(String),
    /// A multi: the op code of each operation (each result's record), and
    /// the ACL version of the node it names.
    Multi(Box<[(i32, u32)]>),
    /// Answered from the state when it was handled: the body, or an error
    /// code. The native request that carries it in order is a ping.
    Local(Result<Bytes, i32>),
    /// The client gets no reply (a persistent watch set again by
    /// setWatches2, whose own reply follows).
    Quiet,
}

/// A request handled and not yet answered.
pub(super) struct Pending {
    /// The xid of the native request it became.
    pub(super) native: u32,
    /// The client's xid and op code.
    pub(super) xid: i32,
    pub(super) op: i32,
    pub(super) answer: Answer,
    /// The ACL version of the node the request names, when it was handled,
    /// for the stat in its reply (the native stat has none).
    pub(super) aversion: u32,
}

/// A connection's requests not yet answered, in request order (the core
/// answers a session's requests in that order).
#[derive(Default)]
pub(super) struct Answers {
    pub(super) pending: VecDeque<Pending>,
}

impl Encode for Answers {
    fn frame(&mut self, out: &Out, buf: &mut BytesMut) {
        match out {
            Out::Event {
                kind,
                revision,
                path,
            } => {
                let kind = match kind {
                    EventKind::Created => event::NODE_CREATED,
                    EventKind::Deleted => event::NODE_DELETED,
                    EventKind::DataChanged => event::NODE_DATA_CHANGED,
                    EventKind::ChildrenChanged => event::NODE_CHILDREN_CHANGED,
                    // Queue watches cannot be set through this protocol, and
                    // its persistent watches never resume from a revision.
                    EventKind::Head | EventKind::Compacted => return,
                };
                encode_notification(buf, *revision as i64, kind, path);
            }
            Out::Reply {
                xid,
                revision,
                result,
                ..
            } => {
                let Some(pending) = self.pending.pop_front() else {
                    warn!(xid, "a reply with no ZooKeeper request pending; dropped");
                    return;
                };
                if pending.native != *xid {
                    warn!(
                        expected = pending.native,
                        xid, "a reply out of request order; dropped"
                    );
                    return;
                }
                write_reply(buf, pending, *revision as i64, result);
            }
        }
    }

    /// ZooKeeper has no closing frame: the connection just closes.
    fn notice(&mut self, _: ErrorCode, _: &str, _: &mut BytesMut) {}
}

fn write_reply(
    buf: &mut BytesMut,
    pending: Pending,
    zxid: i64,
    result: &Result<Reply, baton_proto::ErrorReply>,
) {
    let Pending {
        xid,
        op: code,
        answer,
        aversion,
        ..
    } = pending;
    let header = |b: &mut BytesMut, err| ReplyHeader { xid, zxid, err }.encode(b);
    let reply = match (answer, result) {
        (Answer::Quiet, _) => return,
        (_, Err(e)) => return framed(buf, |b| header(b, error_code(e.code))),
        (Answer::Local(Ok(body)), Ok(_)) => {
            return framed(buf, |b| {
                header(b, err::OK);
                b.extend_from_slice(&body);
            })
        }
        (Answer::Local(Err(code)), Ok(_)) => return framed(buf, |b| header(b, code)),
        (Answer::Sync(path), Ok(_)) => {
            return framed(buf, |b| {
                header(b, err::OK);
                put_str(b, &path);
            })
        }
        (Answer::Multi(ops), Ok(Reply::Multi(results))) => {
            return framed(buf, |b| {
                header(b, err::OK);
                multi_results(b, &ops, results);
            })
        }
        (Answer::Multi(_), Ok(_)) => return framed(buf, |b| header(b, err::SYSTEM_ERROR)),
        (Answer::Plain, Ok(reply)) => reply,
    };
    framed(buf, |b| match reply {
        Reply::Create { path, stat, .. } => {
            header(b, err::OK);
            put_str(b, path);
            if code != op::CREATE {
                stat_of(stat, 0).encode(b);
            }
        }
        Reply::Exists(None) => header(b, err::NO_NODE),
        Reply::Exists(Some(stat)) | Reply::SetData(stat) => {
            header(b, err::OK);
            stat_of(stat, aversion).encode(b);
        }
        Reply::SetAcl { stat, aversion } => {
            header(b, err::OK);
            stat_of(stat, *aversion).encode(b);
        }
        Reply::GetData { stat, data } => {
            header(b, err::OK);
            put_buffer(b, data);
            stat_of(stat, aversion).encode(b);
        }
        Reply::GetChildren { stat, children } => {
            header(b, err::OK);
            put_strings(b, children.iter());
            if code == op::GET_CHILDREN2 {
                stat_of(stat, aversion).encode(b);
            }
        }
        // As ZooKeeper answers it: an error response of 0 (Java's client
        // reads that body).
        Reply::AddWatch => {
            header(b, err::OK);
            put_int(b, err::OK);
        }
        _ => header(b, err::OK),
    });
}

/// A multi's results: a header (op, done, err) and a record per operation,
/// then the closing header. A failed multi reports every operation as an
/// error: those before the one that failed with 0, those after it with
/// runtime-inconsistency, as ZooKeeper does.
fn multi_results(
    b: &mut BytesMut,
    ops: &[(i32, u32)],
    results: &Result<Vec<TxnResult>, TxnFailure>,
) {
    match results {
        Ok(results) => {
            for (&(code, aversion), result) in ops.iter().zip(results) {
                match result {
                    TxnResult::Created { path, stat, .. } => {
                        let kind = if code == op::CREATE {
                            op::CREATE
                        } else {
                            op::CREATE2
                        };
                        multi_header(b, kind, err::OK);
                        put_str(b, path);
                        if kind == op::CREATE2 {
                            stat_of(stat, 0).encode(b);
                        }
                    }
                    TxnResult::Deleted => multi_header(b, op::DELETE, err::OK),
                    TxnResult::DataSet(stat) => {
                        multi_header(b, op::SET_DATA, err::OK);
                        stat_of(stat, aversion).encode(b);
                    }
                    TxnResult::Checked => multi_header(b, op::CHECK, err::OK),
                }
            }
        }
        Err(failure) => failed_multi(
            b,
            ops.len(),
            failure.index as usize,
            error_code(failure.error.code),
        ),
    }
    multi_end(b);
}

/// The results of a multi of `count` operations whose operation `index`
/// failed with `code` (without the closing header).
pub(super) fn failed_multi(b: &mut BytesMut, count: usize, index: usize, code: i32) {
    for i in 0..count {
        let e = match i.cmp(&index) {
            std::cmp::Ordering::Less => err::OK,
            std::cmp::Ordering::Equal => code,
            std::cmp::Ordering::Greater => err::RUNTIME_INCONSISTENCY,
        };
        multi_error(b, e);
    }
}

pub(super) fn multi_header(b: &mut BytesMut, kind: i32, e: i32) {
    put_int(b, kind);
    put_bool(b, false);
    put_int(b, e);
}

/// An operation's error result.
pub(super) fn multi_error(b: &mut BytesMut, e: i32) {
    multi_header(b, op::ERROR, e);
    put_int(b, e);
}

/// The header that closes a multi's results.
pub(super) fn multi_end(b: &mut BytesMut) {
    put_int(b, -1);
    put_bool(b, true);
    put_int(b, -1);
}

/// A node's stat in ZooKeeper's layout, with its ACL version (which
/// Baton keeps beside the node, not in its stat).
pub(super) fn stat_of(s: &baton_proto::Stat, aversion: u32) -> Stat {
    Stat {
        czxid: s.czxid as i64,
        mzxid: s.mzxid as i64,
        ctime: s.ctime as i64,
        mtime: s.mtime as i64,
        version: s.version as i32,
        cversion: s.cversion as i32,
        aversion: aversion as i32,
        ephemeral_owner: s.ephemeral_owner as i64,
        data_length: s.data_length as i32,
        num_children: s.num_children as i32,
        pzxid: s.pzxid as i64,
    }
}

/// ZooKeeper's code for a refusal of Baton's.
pub(super) fn error_code(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::NoNode => err::NO_NODE,
        ErrorCode::NodeExists => err::NODE_EXISTS,
        ErrorCode::BadVersion => err::BAD_VERSION,
        ErrorCode::NotEmpty => err::NOT_EMPTY,
        ErrorCode::NoChildrenForEphemerals => err::NO_CHILDREN_FOR_EPHEMERALS,
        ErrorCode::InvalidPath
        | ErrorCode::ValueTooLarge
        | ErrorCode::BadArguments
        | ErrorCode::TooManyOperations => err::BAD_ARGUMENTS,
        ErrorCode::SessionExpired => err::SESSION_EXPIRED,
        ErrorCode::SessionMoved => err::SESSION_MOVED,
        ErrorCode::UnknownOperation => err::UNIMPLEMENTED,
        ErrorCode::MalformedRequest | ErrorCode::ResponseTooLarge | ErrorCode::FrameTooLarge => {
            err::MARSHALLING_ERROR
        }
        // A fenced write refused: its condition failed, as a version does.
        ErrorCode::StaleFence => err::BAD_VERSION,
        ErrorCode::PermissionDenied => err::NO_AUTH,
        ErrorCode::AuthenticationFailed => err::AUTH_FAILED,
        ErrorCode::ResultLost => err::RUNTIME_INCONSISTENCY,
        ErrorCode::TooManyWatches => err::QUOTA_EXCEEDED,
        _ => err::SYSTEM_ERROR,
    }
}
