//! Baton: fair, herd-free locks and leader election with fencing tokens, on
//! Baton's own coordination server.
//!
//! This facade re-exports the client (the usual entry point), the server for
//! embedding it in a process or a test, a cluster member (the server behind
//! a replicated log), and the wire protocol.
//!
//! ```no_run
//! # async fn demo() -> baton::Result<()> {
//! let client = baton::Client::connect("127.0.0.1:4181").await?;
//! client.create("/app", "", baton::CreateMode::Persistent).await?;
//! # Ok(())
//! # }
//! ```

pub use baton_client::*;
pub use baton_cluster as cluster;
pub use baton_proto as proto;
pub use baton_server as server;

#[cfg(test)]
mod layout;
