//! The Baton client: a session with a Baton server, its nodes and watches.
//!
//! ```no_run
//! use baton_client::{Client, CreateMode};
//!
//! # async fn demo() -> baton_client::Result<()> {
//! let client = Client::connect("127.0.0.1:4181").await?;
//! let created = client
//!     .create("/jobs-", "payload", CreateMode::EphemeralSequential)
//!     .await?;
//! println!("{} has sequence number {:?}", created.path, created.sequence);
//! let (_data, _stat, watcher) = client.get_data_watch(&created.path).await?;
//! client.delete(&created.path, None).await?;
//! println!("watch fired: {:?}", watcher.await?);
//! client.close().await;
//! # Ok(())
//! # }
//! ```

mod client;
mod connect;
mod deadline;
mod error;
mod link;
mod pending;
mod persistent;
mod probe;
mod queue;
pub mod recipes;
mod session;
mod state;
mod watcher;
mod wire;

pub use baton_proto::{
    Check, CreateMode, EventKind, Liveness, QueueRule, ReadMode, SessionId, SessionStatus, Stat,
    TxnOp, TxnResult, WatchEvent, MAX_TXN_OPS,
};
pub use client::{
    Client, ClientBuilder, Created, Enqueued, Txn, DEFAULT_CONNECT_TIMEOUT, DEFAULT_SESSION_TIMEOUT,
};
pub use deadline::DeadlineAlarm;
pub use error::{Error, Result};
pub use persistent::PersistentWatch;
pub use probe::{backup, probe, probe_as, Backup};
pub use queue::QueueWatch;
pub use recipes::{Election, FenceTracker, FencingToken, Leadership, Lock, LockGuard};
pub use state::SessionState;
pub use watcher::Watcher;
pub use wire::ClientTls;
