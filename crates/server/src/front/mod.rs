//! The front ends: what serves client connections, each protocol its own,
//! over what they share.
//!
//! - `socket.rs`: a connection's socket, TLS and buffers, and frames cut
//!   from them (every protocol here frames with a 4-byte length);
//! - `gate.rs`: a cluster member's read gate;
//! - `native/`: Baton's own protocol.

pub(crate) mod conn;
pub(crate) mod gate;
pub(crate) mod native;
pub(crate) mod socket;
pub(crate) mod zk;
