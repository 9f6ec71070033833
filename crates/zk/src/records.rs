//! The records of a ZooKeeper session other than requests: the connect
//! request and response, reply and notification headers, the stat, ACLs.

use baton_proto::DecodeError;
use bytes::{BufMut, Bytes, BytesMut};

use crate::codes::{event, xid};
use crate::jute::{put_bool, put_buffer, put_int, put_long, put_str, JuteReader};

/// A node's metadata as ZooKeeper lays it out (`org.apache.zookeeper.data.Stat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

impl Stat {
    /// Encoded size in bytes.
    pub const LEN: usize = 68;

    pub fn encode(&self, b: &mut impl BufMut) {
        put_long(b, self.czxid);
        put_long(b, self.mzxid);
        put_long(b, self.ctime);
        put_long(b, self.mtime);
        put_int(b, self.version);
        put_int(b, self.cversion);
        put_int(b, self.aversion);
        put_long(b, self.ephemeral_owner);
        put_int(b, self.data_length);
        put_int(b, self.num_children);
        put_long(b, self.pzxid);
    }

    pub fn decode(r: &mut JuteReader) -> Result<Stat, DecodeError> {
        Ok(Stat {
            czxid: r.long("stat")?,
            mzxid: r.long("stat")?,
            ctime: r.long("stat")?,
            mtime: r.long("stat")?,
            version: r.int("stat")?,
            cversion: r.int("stat")?,
            aversion: r.int("stat")?,
            ephemeral_owner: r.long("stat")?,
            data_length: r.int("stat")?,
            num_children: r.int("stat")?,
            pzxid: r.long("stat")?,
        })
    }
}

/// An ACL entry: permissions for an identity (`scheme:id`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Acl {
    pub perms: i32,
    pub scheme: String,
    pub id: String,
}

impl Acl {
    /// `world:anyone` with every permission (`ZooDefs.Ids.OPEN_ACL_UNSAFE`).
    pub fn open() -> Acl {
        Acl {
            perms: crate::codes::perms::ALL,
            scheme: "world".into(),
            id: "anyone".into(),
        }
    }

    pub fn decode(r: &mut JuteReader) -> Result<Acl, DecodeError> {
        Ok(Acl {
            perms: r.int("acl perms")?,
            scheme: r.ustring("acl scheme")?,
            id: r.ustring("acl id")?,
        })
    }

    pub fn encode(&self, b: &mut impl BufMut) {
        put_int(b, self.perms);
        put_str(b, &self.scheme);
        put_str(b, &self.id);
    }

    /// A list of ACL entries (each at least 12 bytes).
    pub fn decode_list(r: &mut JuteReader) -> Result<Vec<Acl>, DecodeError> {
        r.vector("acl", 12, Acl::decode)
    }

    pub fn encode_list(list: &[Acl], b: &mut impl BufMut) {
        put_int(b, list.len() as i32);
        for acl in list {
            acl.encode(b);
        }
    }
}

/// A session's first frame (`ConnectRequest`, plus the read-only flag that
/// clients since 3.4 append).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    pub protocol_version: i32,
    /// The latest zxid the client has seen (0 for a new client).
    pub last_zxid_seen: i64,
    /// The session timeout the client asks for, in milliseconds.
    pub timeout_ms: i32,
    /// The session to resume, or 0 for a new one.
    pub session_id: i64,
    pub passwd: Bytes,
    /// Absent from the oldest clients' requests.
    pub read_only: Option<bool>,
}

impl ConnectRequest {
    /// Decodes a connect request's frame (without its length).
    pub fn decode(frame: &Bytes) -> Result<ConnectRequest, DecodeError> {
        let mut r = JuteReader::new(frame);
        let request = ConnectRequest {
            protocol_version: r.int("protocol version")?,
            last_zxid_seen: r.long("last zxid seen")?,
            timeout_ms: r.int("timeout")?,
            session_id: r.long("session id")?,
            passwd: r.buffer("password")?,
            read_only: if r.at_end() {
                None
            } else {
                Some(r.boolean("read-only")?)
            },
        };
        if !r.at_end() {
            return Err(DecodeError::TrailingBytes(r.remaining()));
        }
        Ok(request)
    }

    /// Appends this request, framed (a 4-byte length first), to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        framed(buf, |b| {
            put_int(b, self.protocol_version);
            put_long(b, self.last_zxid_seen);
            put_int(b, self.timeout_ms);
            put_long(b, self.session_id);
            put_buffer(b, &self.passwd);
            if let Some(read_only) = self.read_only {
                put_bool(b, read_only);
            }
        });
    }
}

/// The answer to a connect request. A timeout of 0 tells the client that
/// its session has expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectResponse {
    pub protocol_version: i32,
    pub timeout_ms: i32,
    pub session_id: i64,
    pub passwd: Bytes,
    pub read_only: bool,
}

impl ConnectResponse {
    /// The answer that tells a client its session is gone.
    pub fn expired() -> ConnectResponse {
        ConnectResponse {
            protocol_version: 0,
            timeout_ms: 0,
            session_id: 0,
            passwd: Bytes::from_static(&[0; 16]),
            read_only: false,
        }
    }

    /// Appends this response, framed, to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        framed(buf, |b| {
            put_int(b, self.protocol_version);
            put_int(b, self.timeout_ms);
            put_long(b, self.session_id);
            put_buffer(b, &self.passwd);
            put_bool(b, self.read_only);
        });
    }

    /// Decodes a connect response's frame (without its length).
    pub fn decode(frame: &Bytes) -> Result<ConnectResponse, DecodeError> {
        let mut r = JuteReader::new(frame);
        Ok(ConnectResponse {
            protocol_version: r.int("protocol version")?,
            timeout_ms: r.int("timeout")?,
            session_id: r.long("session id")?,
            passwd: r.buffer("password")?,
            read_only: !r.at_end() && r.boolean("read-only")?,
        })
    }
}

/// A reply's header: the request's xid, the zxid the server had reached,
/// and an error code (0 for none; then no body follows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyHeader {
    pub xid: i32,
    pub zxid: i64,
    pub err: i32,
}

impl ReplyHeader {
    pub const LEN: usize = 16;

    pub fn encode(&self, b: &mut impl BufMut) {
        put_int(b, self.xid);
        put_long(b, self.zxid);
        put_int(b, self.err);
    }

    pub fn decode(r: &mut JuteReader) -> Result<ReplyHeader, DecodeError> {
        Ok(ReplyHeader {
            xid: r.int("xid")?,
            zxid: r.long("zxid")?,
            err: r.int("err")?,
        })
    }
}

/// Appends a watch notification (`WatcherEvent` under xid -1), framed.
pub fn encode_notification(buf: &mut BytesMut, zxid: i64, kind: i32, path: &str) {
    framed(buf, |b| {
        ReplyHeader {
            xid: xid::NOTIFICATION,
            zxid,
            err: 0,
        }
        .encode(b);
        put_int(b, kind);
        put_int(b, event::STATE_SYNC_CONNECTED);
        put_str(b, path);
    });
}

/// Appends a frame whose payload `body` writes, with its 4-byte length
/// in front.
pub fn framed(buf: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    let start = buf.len();
    buf.put_i32(0);
    body(buf);
    let len = (buf.len() - start - 4) as i32;
    buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
}
