//! Baton's wire protocol: frame layouts, message types and their codec.
//!
//! This crate knows bytes, not sockets: it has no runtime and does no I/O, so
//! the server, the client and any tool can share one definition of the
//! protocol. `docs/protocol.md` in the repository is the normative description;
//! the types here implement it.
//!
//! A connection carries length-prefixed frames (see [`frame`]). The client's
//! first frame is a [`ConnectRequest`], answered by one [`ConnectResponse`];
//! after that the client sends [`RequestFrame`]s and the server sends
//! [`ServerMessage`]s (replies in request order, watch events, and a final
//! session-end notice). A connection may instead open with a status probe
//! ([`probe`]), which any server answers with a JSON description of itself.

pub mod acl;
pub mod error;
pub mod frame;
pub mod handshake;
mod mode;
pub mod path;
pub mod pem;
pub mod probe;
pub mod request;
pub mod response;
mod stat;
pub mod txn;
pub mod wire;

pub use acl::{Acl, AclEntry};
pub use error::{DecodeError, ErrorCode};
#[cfg(feature = "codec")]
pub use frame::frame_codec;
pub use frame::MAX_RESPONSE_FRAME;
pub use handshake::{
    ConnectRequest, ConnectResponse, ReadMode, SessionGrant, SessionSecret, Token,
};
pub use path::PathError;
pub use request::{
    CreateMode, OpCode, PredecessorWatch, QueueRule, Request, RequestDecodeError, RequestFrame,
};
pub use response::{
    Disconnect, ErrorReply, EventKind, Liveness, Reply, ReplyFrame, ServerMessage, SessionStatus,
    Stat, TxnFailure, WatchEvent,
};
pub use txn::{Check, TxnOp, TxnResult, MAX_TXN_OPS};

/// Version of the protocol described by this crate, sent in the handshake.
pub const PROTOCOL_VERSION: u16 = 1;

/// Four bytes that open every [`ConnectRequest`], so that a server can tell a
/// stray client of another protocol from a Baton client at once.
pub const MAGIC: [u8; 4] = *b"BATN";

/// Default limit on the data stored in one node: 1 MiB.
pub const DEFAULT_MAX_DATA: usize = 1 << 20;

/// Longest accepted path, in bytes of UTF-8.
pub const MAX_PATH_LEN: usize = 4096;

/// Room a request needs besides its data: the path and the fixed fields.
pub const REQUEST_OVERHEAD: usize = MAX_PATH_LEN + 1024;

/// Identifier of a session, chosen by the server. Printed in hexadecimal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "0x{:x}", self.0)
    }
}
