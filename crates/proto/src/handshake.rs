//! The first exchange on a connection: open a new session or resume one.
//!
//! # Format
//! ```text
//! ConnectRequest (client -> server, first frame), 34 bytes, or more with a
//! token:
//!   magic        [4]  "BATN"
//!   version      u16  protocol version the client speaks (1)
//!   timeout_ms   u32  requested session timeout
//!   session_id   u64  0 to open a new session, else the session to resume
//!   secret       [16] the session's secret when resuming, else zeros
//!   optional, for a server that checks identities:
//!   token        u16 length + bytes (at most MAX_TOKEN; empty = none)
//!   optional, after a token (an empty one if the client has none):
//!   read_mode    u8   0 = linearizable, 1 = sequential (see ReadMode)
//!   last_seen    u64  the highest revision the client has seen, 0 if none
//!
//! ConnectResponse (server -> client, first frame):
//!   status       u16  0 = success, else an error code
//!   version      u16  protocol version the server speaks
//!   on success:
//!     timeout_ms u32  negotiated timeout (clamped to the server's bounds)
//!     session_id u64
//!     secret     [16]
//!     resumed    u8   1 if an existing session was resumed
//!     max_data   u32  the server's limit on node data, in bytes
//!   on error:
//!     message    u16 length + UTF-8
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, ErrorCode};
use crate::frame::encode_frame;
use crate::wire::{put_bool, put_str16, Reader};
use crate::{SessionId, MAGIC, PROTOCOL_VERSION};

/// The secret that proves a client owns a session when it resumes it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SessionSecret(pub [u8; 16]);

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

/// The client's first frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Protocol version the client speaks.
    pub version: u16,
    /// Requested session timeout in milliseconds.
    pub timeout_ms: u32,
    /// The session to resume, or `None` for a new session.
    pub resume: Option<(SessionId, SessionSecret)>,
    /// The token that names this client's identity, for a server that
    /// checks identities.
    pub token: Option<Token>,
    /// What the session's reads promise.
    pub read_mode: ReadMode,
    /// The highest revision the client has seen (in a reply or an event),
    /// 0 if none: a member that has not applied that far does not resume
    /// the session, so that what the client sees never goes back.
    pub last_seen: u64,
}

/// What a session's reads promise (docs/design.md, "Read modes").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReadMode {
    /// Every read sees every change committed before it arrived: the
    /// member that serves it confirms with the leader first (a follower,
    /// with a call to the leader; the leader, with a heartbeat to a
    /// majority). The default.
    #[default]
    Linearizable,
    /// Reads are answered from the serving member's applied state at once,
    /// as ZooKeeper's are: a session sees the changes in commit order and
    /// never sees the state go back (not across reconnects either), sees
    /// its own changes, and may lag other sessions' changes by as long as
    /// its member is behind. [`Request::Sync`](crate::Request::Sync) brings
    /// the member up to date. Pings still confirm with the leader.
    Sequential,
}

impl ReadMode {
    fn to_u8(self) -> u8 {
        match self {
            ReadMode::Linearizable => 0,
            ReadMode::Sequential => 1,
        }
    }

    fn from_u8(mode: u8) -> Option<Self> {
        match mode {
            0 => Some(ReadMode::Linearizable),
            1 => Some(ReadMode::Sequential),
            _ => None,
        }
    }

    /// The mode's name, as `--read-mode` takes it.
    pub fn name(self) -> &'static str {
        match self {
            ReadMode::Linearizable => "linearizable",
            ReadMode::Sequential => "sequential",
        }
    }
}

impl std::str::FromStr for ReadMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "linearizable" => Ok(ReadMode::Linearizable),
            "sequential" => Ok(ReadMode::Sequential),
            other => Err(format!(
                "{other:?} is not a read mode: give linearizable or sequential"
            )),
        }
    }
}

/// Most bytes of a token.
pub const MAX_TOKEN: usize = 1024;

/// A secret that names a client's identity. Shown as `Token(..)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub Bytes);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Whether `other` is the same token, in time that depends on the
    /// lengths only.
    pub fn matches(&self, other: &[u8]) -> bool {
        self.0.len() == other.len()
            && self
                .0
                .iter()
                .zip(other)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

impl ConnectRequest {
    /// A request for a new session speaking this crate's protocol version.
    pub fn new(timeout_ms: u32) -> Self {
        ConnectRequest {
            version: PROTOCOL_VERSION,
            timeout_ms,
            resume: None,
            token: None,
            read_mode: ReadMode::Linearizable,
            last_seen: 0,
        }
    }

    /// Appends this request, framed, to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        encode_frame(buf, |b| {
            b.put_slice(&MAGIC);
            b.put_u16(self.version);
            b.put_u32(self.timeout_ms);
            let (id, secret) = self.resume.unwrap_or_default();
            b.put_u64(id.0);
            b.put_slice(&secret.0);
            let extended = self.read_mode != ReadMode::Linearizable || self.last_seen != 0;
            if self.token.is_some() || extended {
                let token = self.token.as_ref().map_or(&[][..], |t| &t.0[..]);
                b.put_u16(token.len() as u16);
                b.put_slice(token);
            }
            if extended {
                b.put_u8(self.read_mode.to_u8());
                b.put_u64(self.last_seen);
            }
        });
    }

    /// Decodes a frame's payload. For a protocol version other than
    /// [`PROTOCOL_VERSION`] only the magic and the version are read (the
    /// other fields are zero), so that the version can be refused by name.
    ///
    /// # Errors
    /// [`DecodeError`] if the payload is not exactly a connect request.
    pub fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(&payload);
        if r.array::<4>("magic")? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u16("version")?;
        if version != PROTOCOL_VERSION {
            // A later version may lay out the rest differently: stop here so
            // the server can answer "unsupported version" rather than
            // "malformed".
            return Ok(ConnectRequest {
                version,
                timeout_ms: 0,
                resume: None,
                token: None,
                read_mode: ReadMode::Linearizable,
                last_seen: 0,
            });
        }
        let timeout_ms = r.u32("timeout")?;
        let id = r.u64("session id")?;
        let secret = SessionSecret(r.array("secret")?);
        let token = if r.at_end() {
            None
        } else {
            let token = r.raw16("token")?;
            if token.len() > MAX_TOKEN {
                return Err(DecodeError::BadValue {
                    what: "token length",
                    value: token.len() as u64,
                });
            }
            (!token.is_empty()).then(|| Token(payload.slice_ref(token)))
        };
        let (read_mode, last_seen) = if r.at_end() {
            (ReadMode::Linearizable, 0)
        } else {
            let mode = r.u8("read mode")?;
            let read_mode = ReadMode::from_u8(mode).ok_or(DecodeError::BadValue {
                what: "read mode",
                value: mode.into(),
            })?;
            (read_mode, r.u64("last seen revision")?)
        };
        r.finish()?;
        let resume = (id != 0).then_some((SessionId(id), secret));
        Ok(ConnectRequest {
            version,
            timeout_ms,
            resume,
            token,
            read_mode,
            last_seen,
        })
    }
}

/// What the server grants on a successful handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionGrant {
    /// Negotiated session timeout in milliseconds.
    pub timeout_ms: u32,
    pub session_id: SessionId,
    pub secret: SessionSecret,
    /// True if an existing session was resumed rather than a new one opened.
    pub resumed: bool,
    /// The server's limit on the data of one node, in bytes.
    pub max_data: u32,
}

/// The server's first frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectResponse {
    /// Protocol version the server speaks.
    pub version: u16,
    pub result: Result<SessionGrant, (ErrorCode, String)>,
}

impl ConnectResponse {
    /// Appends this response, framed, to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        encode_frame(buf, |b| match &self.result {
            Ok(grant) => {
                b.put_u16(0);
                b.put_u16(self.version);
                b.put_u32(grant.timeout_ms);
                b.put_u64(grant.session_id.0);
                b.put_slice(&grant.secret.0);
                put_bool(b, grant.resumed);
                b.put_u32(grant.max_data);
            }
            Err((code, message)) => {
                b.put_u16(code.to_u16());
                b.put_u16(self.version);
                put_str16(b, message);
            }
        });
    }

    /// Decodes a frame's payload.
    ///
    /// # Errors
    /// [`DecodeError`] if the payload is not exactly a connect response.
    pub fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(&payload);
        let status = r.u16("status")?;
        let version = r.u16("version")?;
        let result = if status == 0 {
            Ok(SessionGrant {
                timeout_ms: r.u32("timeout")?,
                session_id: SessionId(r.u64("session id")?),
                secret: SessionSecret(r.array("secret")?),
                resumed: r.bool("resumed")?,
                max_data: r.u32("max data")?,
            })
        } else {
            Err((ErrorCode::from_u16(status), r.str16("message")?))
        };
        r.finish()?;
        Ok(ConnectResponse { version, result })
    }
}
