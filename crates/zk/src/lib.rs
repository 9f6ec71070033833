//! ZooKeeper's client protocol, as clients of ZooKeeper 3.4 to 3.9 speak
//! it, for Baton's ZooKeeper listener (and for tools that talk to a
//! ZooKeeper server: `baton bench`'s ZooKeeper mode).
//!
//! Every frame is a 4-byte big-endian length, then a record in jute, the
//! encoding of ZooKeeper's `zookeeper.jute` ([`jute`]). A session's first
//! frame is a [`ConnectRequest`]; then each request is a
//! [`RequestHeader`] and a body ([`Request`]), each reply a
//! [`ReplyHeader`] and, when its error code is 0, a body; watch
//! notifications are replies with xid -1. A connection's first four bytes
//! may instead be a four-letter word (`ruok`, `srvr`, ...: [`words`]).
//!
//! This crate reads and writes the records; it has no runtime and no
//! sockets.

pub mod codes;
pub mod jute;
pub mod records;
pub mod request;
pub mod words;

pub use records::{Acl, ConnectRequest, ConnectResponse, ReplyHeader, Stat};
pub use request::{Create, MultiOp, Request, RequestError, RequestHeader};
