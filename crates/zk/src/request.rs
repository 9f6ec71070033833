//! Requests: a header (`xid`, op code), then a body laid out by op code.

use baton_proto::DecodeError;
use bytes::{BufMut, Bytes, BytesMut};

use crate::codes::op;
use crate::jute::{put_bool, put_buffer, put_int, put_long, put_str, put_strings, JuteReader};
use crate::records::{framed, Acl};

/// A request's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub xid: i32,
    pub op: i32,
}

/// Why a request frame could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// Shorter than the 8-byte header: nothing to answer.
    #[error("request frame of {0} bytes is shorter than its 8-byte header")]
    NoHeader(usize),
    /// The op code is not one of ZooKeeper's client operations.
    #[error("unknown operation {op}")]
    UnknownOp { header: RequestHeader, op: i32 },
    /// The body does not follow its op's layout.
    #[error("{} request: {error}", op::name(header.op))]
    Malformed {
        header: RequestHeader,
        error: DecodeError,
    },
}

/// The create operations' variants (create, create2, createContainer,
/// createTTL): what the reply carries and which modes are allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Create {
    pub path: String,
    pub data: Bytes,
    pub acl: Vec<Acl>,
    /// ZooKeeper's create mode (see [`crate::codes::mode`]).
    pub flags: i32,
    /// The time to live, for createTTL.
    pub ttl: Option<i64>,
    /// The op code the create came as: 1, 15, 19 or 21.
    pub op: i32,
}

/// One operation of a multi or a multiRead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultiOp {
    Create(Create),
    Delete {
        path: String,
        version: i32,
    },
    SetData {
        path: String,
        data: Bytes,
        version: i32,
    },
    Check {
        path: String,
        version: i32,
    },
    GetData {
        path: String,
    },
    GetChildren {
        path: String,
    },
}

/// A request's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Create(Create),
    Delete {
        path: String,
        version: i32,
    },
    Exists {
        path: String,
        watch: bool,
    },
    GetData {
        path: String,
        watch: bool,
    },
    SetData {
        path: String,
        data: Bytes,
        version: i32,
    },
    GetAcl {
        path: String,
    },
    SetAcl {
        path: String,
        acl: Vec<Acl>,
        version: i32,
    },
    /// getChildren (op 8) or, with `stat`, getChildren2 (op 12).
    GetChildren {
        path: String,
        watch: bool,
        stat: bool,
    },
    Sync {
        path: String,
    },
    Ping,
    /// multi (op 14, read-only false) or multiRead (op 22).
    Multi {
        ops: Vec<MultiOp>,
        read: bool,
    },
    Reconfig,
    CheckWatches {
        path: String,
        kind: i32,
    },
    RemoveWatches {
        path: String,
        kind: i32,
    },
    DeleteContainer {
        path: String,
    },
    Auth {
        scheme: String,
        auth: Bytes,
    },
    /// setWatches (op 101, no persistent lists) or setWatches2 (op 105).
    SetWatches {
        relative_zxid: i64,
        data: Vec<String>,
        exist: Vec<String>,
        child: Vec<String>,
        persistent: Vec<String>,
        recursive: Vec<String>,
    },
    Sasl,
    GetEphemerals {
        prefix: String,
    },
    GetAllChildrenNumber {
        path: String,
    },
    AddWatch {
        path: String,
        mode: i32,
    },
    WhoAmI,
    CloseSession,
}

impl Request {
    /// Decodes a request frame (without its length).
    pub fn decode(frame: &Bytes) -> Result<(RequestHeader, Request), RequestError> {
        if frame.len() < 8 {
            return Err(RequestError::NoHeader(frame.len()));
        }
        let mut r = JuteReader::new(frame);
        let header = RequestHeader {
            xid: r.int("xid").expect("8 bytes"),
            op: r.int("op").expect("8 bytes"),
        };
        let malformed = |error| RequestError::Malformed { header, error };
        let request = match Request::body(header.op, &mut r) {
            Ok(Some(request)) => request,
            Ok(None) => {
                return Err(RequestError::UnknownOp {
                    header,
                    op: header.op,
                })
            }
            Err(e) => return Err(malformed(e)),
        };
        // Clients since 3.5 may append fields to some requests; extra bytes
        // are ignored, as ZooKeeper's own server ignores them.
        Ok((header, request))
    }

    fn body(code: i32, r: &mut JuteReader) -> Result<Option<Request>, DecodeError> {
        let path = |r: &mut JuteReader| r.ustring("path");
        Ok(Some(match code {
            op::CREATE | op::CREATE2 | op::CREATE_CONTAINER | op::CREATE_TTL => {
                Request::Create(create(code, r)?)
            }
            op::DELETE => Request::Delete {
                path: path(r)?,
                version: r.int("version")?,
            },
            op::EXISTS => Request::Exists {
                path: path(r)?,
                watch: r.boolean("watch")?,
            },
            op::GET_DATA => Request::GetData {
                path: path(r)?,
                watch: r.boolean("watch")?,
            },
            op::SET_DATA => Request::SetData {
                path: path(r)?,
                data: r.buffer("data")?,
                version: r.int("version")?,
            },
            op::GET_ACL => Request::GetAcl { path: path(r)? },
            op::SET_ACL => Request::SetAcl {
                path: path(r)?,
                acl: Acl::decode_list(r)?,
                version: r.int("version")?,
            },
            op::GET_CHILDREN | op::GET_CHILDREN2 => Request::GetChildren {
                path: path(r)?,
                watch: r.boolean("watch")?,
                stat: code == op::GET_CHILDREN2,
            },
            op::SYNC => Request::Sync { path: path(r)? },
            op::PING => Request::Ping,
            op::MULTI | op::MULTI_READ => Request::Multi {
                ops: multi(r)?,
                read: code == op::MULTI_READ,
            },
            op::RECONFIG => Request::Reconfig,
            op::CHECK_WATCHES => Request::CheckWatches {
                path: path(r)?,
                kind: r.int("watcher type")?,
            },
            op::REMOVE_WATCHES => Request::RemoveWatches {
                path: path(r)?,
                kind: r.int("watcher type")?,
            },
            op::DELETE_CONTAINER => Request::DeleteContainer { path: path(r)? },
            op::AUTH => {
                let _type = r.int("auth type")?;
                Request::Auth {
                    scheme: r.ustring("auth scheme")?,
                    auth: r.buffer("auth")?,
                }
            }
            op::SET_WATCHES | op::SET_WATCHES2 => {
                let relative_zxid = r.long("relative zxid")?;
                let data = r.strings("data watches")?;
                let exist = r.strings("exist watches")?;
                let child = r.strings("child watches")?;
                let (persistent, recursive) = if code == op::SET_WATCHES2 {
                    (
                        r.strings("persistent watches")?,
                        r.strings("persistent recursive watches")?,
                    )
                } else {
                    (Vec::new(), Vec::new())
                };
                Request::SetWatches {
                    relative_zxid,
                    data,
                    exist,
                    child,
                    persistent,
                    recursive,
                }
            }
            op::SASL => Request::Sasl,
            op::GET_EPHEMERALS => Request::GetEphemerals {
                prefix: r.ustring("prefix path")?,
            },
            op::GET_ALL_CHILDREN_NUMBER => Request::GetAllChildrenNumber { path: path(r)? },
            op::ADD_WATCH => Request::AddWatch {
                path: path(r)?,
                mode: r.int("mode")?,
            },
            op::WHO_AM_I => Request::WhoAmI,
            op::CLOSE_SESSION => Request::CloseSession,
            _ => return Ok(None),
        }))
    }

    /// The op code this request is sent with.
    pub fn op(&self) -> i32 {
        match self {
            Request::Create(c) => c.op,
            Request::Delete { .. } => op::DELETE,
            Request::Exists { .. } => op::EXISTS,
            Request::GetData { .. } => op::GET_DATA,
            Request::SetData { .. } => op::SET_DATA,
            Request::GetAcl { .. } => op::GET_ACL,
            Request::SetAcl { .. } => op::SET_ACL,
            Request::GetChildren { stat: false, .. } => op::GET_CHILDREN,
            Request::GetChildren { stat: true, .. } => op::GET_CHILDREN2,
            Request::Sync { .. } => op::SYNC,
            Request::Ping => op::PING,
            Request::Multi { read: false, .. } => op::MULTI,
            Request::Multi { read: true, .. } => op::MULTI_READ,
            Request::Reconfig => op::RECONFIG,
            Request::CheckWatches { .. } => op::CHECK_WATCHES,
            Request::RemoveWatches { .. } => op::REMOVE_WATCHES,
            Request::DeleteContainer { .. } => op::DELETE_CONTAINER,
            Request::Auth { .. } => op::AUTH,
            Request::SetWatches { .. } => op::SET_WATCHES2,
            Request::Sasl => op::SASL,
            Request::GetEphemerals { .. } => op::GET_EPHEMERALS,
            Request::GetAllChildrenNumber { .. } => op::GET_ALL_CHILDREN_NUMBER,
            Request::AddWatch { .. } => op::ADD_WATCH,
            Request::WhoAmI => op::WHO_AM_I,
            Request::CloseSession => op::CLOSE_SESSION,
        }
    }

    /// Appends this request with `xid`, framed, to `buf`, as a client
    /// sends it. Reconfig and SASL are sent with empty bodies.
    pub fn encode(&self, xid: i32, buf: &mut BytesMut) {
        framed(buf, |b| {
            put_int(b, xid);
            put_int(b, self.op());
            self.encode_body(b);
        });
    }

    fn encode_body(&self, b: &mut BytesMut) {
        match self {
            Request::Create(c) => encode_create(c, b),
            Request::Delete { path, version } => {
                put_str(b, path);
                put_int(b, *version);
            }
            Request::Exists { path, watch }
            | Request::GetData { path, watch }
            | Request::GetChildren { path, watch, .. } => {
                put_str(b, path);
                put_bool(b, *watch);
            }
            Request::SetData {
                path,
                data,
                version,
            } => {
                put_str(b, path);
                put_buffer(b, data);
                put_int(b, *version);
            }
            Request::GetAcl { path }
            | Request::Sync { path }
            | Request::DeleteContainer { path }
            | Request::GetAllChildrenNumber { path } => put_str(b, path),
            Request::GetEphemerals { prefix } => put_str(b, prefix),
            Request::SetAcl { path, acl, version } => {
                put_str(b, path);
                Acl::encode_list(acl, b);
                put_int(b, *version);
            }
            Request::Multi { ops, .. } => {
                for o in ops {
                    encode_multi_op(o, b);
                }
                put_int(b, -1);
                put_bool(b, true);
                put_int(b, -1);
            }
            Request::CheckWatches { path, kind } | Request::RemoveWatches { path, kind } => {
                put_str(b, path);
                put_int(b, *kind);
            }
            Request::Auth { scheme, auth } => {
                put_int(b, 0);
                put_str(b, scheme);
                put_buffer(b, auth);
            }
            Request::SetWatches {
                relative_zxid,
                data,
                exist,
                child,
                persistent,
                recursive,
            } => {
                put_long(b, *relative_zxid);
                for list in [data, exist, child, persistent, recursive] {
                    put_strings(b, list.iter());
                }
            }
            Request::AddWatch { path, mode } => {
                put_str(b, path);
                put_int(b, *mode);
            }
            Request::Ping
            | Request::Reconfig
            | Request::Sasl
            | Request::WhoAmI
            | Request::CloseSession => {}
        }
    }
}

fn create(code: i32, r: &mut JuteReader) -> Result<Create, DecodeError> {
    Ok(Create {
        path: r.ustring("path")?,
        data: r.buffer("data")?,
        acl: Acl::decode_list(r)?,
        flags: r.int("flags")?,
        ttl: if code == op::CREATE_TTL {
            Some(r.long("ttl")?)
        } else {
            None
        },
        op: code,
    })
}

fn encode_create(c: &Create, b: &mut BytesMut) {
    put_str(b, &c.path);
    put_buffer(b, &c.data);
    Acl::encode_list(&c.acl, b);
    put_int(b, c.flags);
    if let Some(ttl) = c.ttl {
        b.put_i64(ttl);
    }
}

/// A multi's operations: each a header (op, done, err) and its body, until
/// a header with `done` set.
fn multi(r: &mut JuteReader) -> Result<Vec<MultiOp>, DecodeError> {
    let mut ops = Vec::new();
    loop {
        let code = r.int("multi header")?;
        let done = r.boolean("multi header")?;
        let _err = r.int("multi header")?;
        if done {
            return Ok(ops);
        }
        let path = |r: &mut JuteReader| r.ustring("path");
        ops.push(match code {
            op::CREATE | op::CREATE2 | op::CREATE_CONTAINER | op::CREATE_TTL => {
                MultiOp::Create(create(code, r)?)
            }
            op::DELETE => MultiOp::Delete {
                path: path(r)?,
                version: r.int("version")?,
            },
            op::SET_DATA => MultiOp::SetData {
                path: path(r)?,
                data: r.buffer("data")?,
                version: r.int("version")?,
            },
            op::CHECK => MultiOp::Check {
                path: path(r)?,
                version: r.int("version")?,
            },
            // multiRead's operations carry a watch flag, which ZooKeeper
            // ignores there (a multiRead sets no watch).
            op::GET_DATA => {
                let path = path(r)?;
                r.boolean("watch")?;
                MultiOp::GetData { path }
            }
            op::GET_CHILDREN => {
                let path = path(r)?;
                r.boolean("watch")?;
                MultiOp::GetChildren { path }
            }
            other => {
                return Err(DecodeError::BadValue {
                    what: "multi operation",
                    value: other as u32 as u64,
                })
            }
        });
    }
}

fn encode_multi_op(o: &MultiOp, b: &mut BytesMut) {
    let head = |b: &mut BytesMut, code: i32| {
        put_int(b, code);
        put_bool(b, false);
        put_int(b, -1);
    };
    match o {
        MultiOp::Create(c) => {
            head(b, c.op);
            encode_create(c, b);
        }
        MultiOp::Delete { path, version } => {
            head(b, op::DELETE);
            put_str(b, path);
            put_int(b, *version);
        }
        MultiOp::SetData {
            path,
            data,
            version,
        } => {
            head(b, op::SET_DATA);
            put_str(b, path);
            put_buffer(b, data);
            put_int(b, *version);
        }
        MultiOp::Check { path, version } => {
            head(b, op::CHECK);
            put_str(b, path);
            put_int(b, *version);
        }
        MultiOp::GetData { path } => {
            head(b, op::GET_DATA);
            put_str(b, path);
            put_bool(b, false);
        }
        MultiOp::GetChildren { path } => {
            head(b, op::GET_CHILDREN);
            put_str(b, path);
            put_bool(b, false);
        }
    }
}
