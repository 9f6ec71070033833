//! Baton's server: sessions, a tree of persistent, ephemeral and sequential
//! nodes, and one-shot watches, served over Baton's framed TCP protocol.
//!
//! The [`state`] module is the deterministic core (no clock, no I/O). Around it:
//! the core lock with session liveness and watches, one task per connection,
//! and a session expiry timer. Embed a server with [`Server`]:
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton_server::ServerError> {
//! let server = baton_server::Server::bind("127.0.0.1:0", baton_server::Config::default()).await?;
//! println!("listening on {}", server.local_addr()?);
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

pub mod auth;
mod clock;
pub mod config;
mod core;
pub mod datadir;
mod front;
mod locks;
pub mod metrics;
mod outbox;
pub mod persist;
mod persistent;
mod queues;
pub mod replicate;
mod server;
mod shared;
#[cfg(any(test, feature = "sim"))]
#[doc(hidden)]
pub mod sim;
mod stats;
mod status;
pub mod tls;

/// The deterministic state machine and its file formats (the `baton-state`
/// crate).
pub use baton_state as state;
mod watches;

pub use config::{Config, ConfigError};
pub use server::{run, Server, ServerError};
pub use shared::{Applier, FromFollower, ServerHandle};
pub use stats::StatsSnapshot;
