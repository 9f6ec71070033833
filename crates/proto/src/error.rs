//! Error codes carried on the wire, and the errors of decoding a frame.

use crate::path::PathError;

/// Why a request (or a handshake) failed, as a stable number on the wire.
///
/// The numbers are part of the protocol (`docs/protocol.md`); new codes may be
/// added, so a decoder maps numbers it does not know to [`ErrorCode::Unknown`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The node does not exist (or, for create, its parent does not).
    NoNode,
    /// A node already exists at the path.
    NodeExists,
    /// The node's version is not the expected one.
    BadVersion,
    /// The node has children and cannot be deleted.
    NotEmpty,
    /// Ephemeral nodes cannot have children.
    NoChildrenForEphemerals,
    /// The path breaks the path rules (see [`crate::path`]).
    InvalidPath,
    /// The data is larger than the server's limit.
    ValueTooLarge,
    /// The session has expired or was closed.
    SessionExpired,
    /// The operation code is not one this server knows.
    UnknownOperation,
    /// The request's body does not follow its layout.
    MalformedRequest,
    /// The server is stopping and takes no more requests.
    ShuttingDown,
    /// The handshake asked for a protocol version the server does not speak.
    UnsupportedVersion,
    /// The session was resumed on another connection, which replaces this one.
    SessionMoved,
    /// The server is at its connection limit.
    TooManyConnections,
    /// The request is well formed but asks for something that cannot be done
    /// (deleting the root, for example).
    BadArguments,
    /// The answer would exceed the largest frame a client accepts.
    ResponseTooLarge,
    /// The server failed for a reason of its own; the message says which.
    Internal,
    /// A frame is longer than the server accepts; the connection is closed.
    FrameTooLarge,
    /// A fenced write carried a token lower than the highest the node has
    /// accepted: its sender's lease ran out. The message names both tokens.
    StaleFence,
    /// Setting the watch would take the session past the server's limit on
    /// the watches one session may hold.
    TooManyWatches,
    /// A request sent again after a broken connection had been handled
    /// before (applied or refused), and its reply is gone: only a session's
    /// latest change keeps its reply. It was not applied again.
    ResultLost,
    /// This cluster member does not lead: only the leader serves clients. The
    /// message is the leader's client address (`host:port`), or empty if no
    /// leader is known right now.
    NotLeader,
    /// The server takes TLS connections only, and this one spoke plaintext.
    TlsRequired,
    /// The server checks identities, and the handshake's token names none.
    AuthenticationFailed,
    /// The client's identity lacks the right the request needs on its
    /// path; the message names the identity, the right and the path.
    PermissionDenied,
    /// A transaction holds more operations than one may
    /// ([`MAX_TXN_OPS`](crate::txn::MAX_TXN_OPS)); nothing was applied.
    TooManyOperations,
    /// A code this decoder does not know, kept as received.
    Unknown(u16),
}

impl ErrorCode {
    /// Whether a request refused with this code shows that its session was
    /// alive after the request was sent: a refusal that came from the state
    /// (a node missing, a version or fence refused) does, as a cluster
    /// member gives those only once it has proven that it leads. A request
    /// refused on its form (an invalid path, data too large, bad arguments)
    /// is answered at once, even by a leader cut off from the majority that
    /// does not know it is deposed, and a refusal of the session itself
    /// shows the opposite: neither shows anything.
    pub fn shows_session_alive(self) -> bool {
        matches!(
            self,
            ErrorCode::NoNode
                | ErrorCode::NodeExists
                | ErrorCode::BadVersion
                | ErrorCode::NotEmpty
                | ErrorCode::NoChildrenForEphemerals
                | ErrorCode::StaleFence
                | ErrorCode::ResultLost
        )
    }

    /// The code's number on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::NoNode => 1,
            ErrorCode::NodeExists => 2,
            ErrorCode::BadVersion => 3,
            ErrorCode::NotEmpty => 4,
            ErrorCode::NoChildrenForEphemerals => 5,
            ErrorCode::InvalidPath => 6,
            ErrorCode::ValueTooLarge => 7,
            ErrorCode::SessionExpired => 8,
            ErrorCode::UnknownOperation => 9,
            ErrorCode::MalformedRequest => 10,
            ErrorCode::ShuttingDown => 11,
            ErrorCode::UnsupportedVersion => 12,
            ErrorCode::SessionMoved => 13,
            ErrorCode::TooManyConnections => 14,
            ErrorCode::BadArguments => 15,
            ErrorCode::ResponseTooLarge => 16,
            ErrorCode::Internal => 17,
            ErrorCode::FrameTooLarge => 18,
            ErrorCode::StaleFence => 19,
            ErrorCode::TooManyWatches => 20,
            ErrorCode::ResultLost => 21,
            ErrorCode::NotLeader => 22,
            ErrorCode::TlsRequired => 23,
            ErrorCode::AuthenticationFailed => 24,
            ErrorCode::PermissionDenied => 25,
            ErrorCode::TooManyOperations => 26,
            ErrorCode::Unknown(code) => code,
        }
    }

    /// The code for a number read from the wire; 0 means success and is not
    /// an error code, so it maps to `Unknown(0)`.
    pub fn from_u16(code: u16) -> ErrorCode {
        match code {
            1 => ErrorCode::NoNode,
            2 => ErrorCode::NodeExists,
            3 => ErrorCode::BadVersion,
            4 => ErrorCode::NotEmpty,
            5 => ErrorCode::NoChildrenForEphemerals,
            6 => ErrorCode::InvalidPath,
            7 => ErrorCode::ValueTooLarge,
            8 => ErrorCode::SessionExpired,
            9 => ErrorCode::UnknownOperation,
            10 => ErrorCode::MalformedRequest,
            11 => ErrorCode::ShuttingDown,
            12 => ErrorCode::UnsupportedVersion,
            13 => ErrorCode::SessionMoved,
            14 => ErrorCode::TooManyConnections,
            15 => ErrorCode::BadArguments,
            16 => ErrorCode::ResponseTooLarge,
            17 => ErrorCode::Internal,
            18 => ErrorCode::FrameTooLarge,
            19 => ErrorCode::StaleFence,
            20 => ErrorCode::TooManyWatches,
            21 => ErrorCode::ResultLost,
            22 => ErrorCode::NotLeader,
            23 => ErrorCode::TlsRequired,
            24 => ErrorCode::AuthenticationFailed,
            25 => ErrorCode::PermissionDenied,
            26 => ErrorCode::TooManyOperations,
            other => ErrorCode::Unknown(other),
        }
    }

    /// A short lower-case name, used in messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NoNode => "no node",
            ErrorCode::NodeExists => "node exists",
            ErrorCode::BadVersion => "bad version",
            ErrorCode::NotEmpty => "not empty",
            ErrorCode::NoChildrenForEphemerals => "no children for ephemerals",
            ErrorCode::InvalidPath => "invalid path",
            ErrorCode::ValueTooLarge => "value too large",
            ErrorCode::SessionExpired => "session expired",
            ErrorCode::UnknownOperation => "unknown operation",
            ErrorCode::MalformedRequest => "malformed request",
            ErrorCode::ShuttingDown => "shutting down",
            ErrorCode::UnsupportedVersion => "unsupported version",
            ErrorCode::SessionMoved => "session moved",
            ErrorCode::TooManyConnections => "too many connections",
            ErrorCode::BadArguments => "bad arguments",
            ErrorCode::ResponseTooLarge => "response too large",
            ErrorCode::Internal => "internal error",
            ErrorCode::FrameTooLarge => "frame too large",
            ErrorCode::StaleFence => "stale fencing token",
            ErrorCode::TooManyWatches => "too many watches",
            ErrorCode::ResultLost => "result lost",
            ErrorCode::NotLeader => "not leader",
            ErrorCode::TlsRequired => "tls required",
            ErrorCode::AuthenticationFailed => "authentication failed",
            ErrorCode::PermissionDenied => "permission denied",
            ErrorCode::TooManyOperations => "too many operations",
            ErrorCode::Unknown(_) => "unknown error",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorCode::Unknown(code) => write!(f, "unknown error code {code}"),
            other => f.write_str(other.name()),
        }
    }
}

/// Why a frame's payload could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The payload ended before the named field was complete.
    #[error("frame ends inside {what}")]
    Truncated { what: &'static str },
    /// Bytes are left after the message.
    #[error("{0} unexpected bytes after the message")]
    TrailingBytes(usize),
    /// A string field is not valid UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str },
    /// A field holds a value outside its allowed set.
    #[error("{what} has invalid value {value}")]
    BadValue { what: &'static str, value: u64 },
    /// The handshake does not start with the protocol's magic bytes.
    #[error("handshake does not start with the magic bytes \"BATN\": not a Baton client?")]
    BadMagic,
    /// A path field breaks the path rules.
    #[error("invalid path: {0}")]
    InvalidPath(#[from] PathError),
}
