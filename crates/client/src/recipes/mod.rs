//! Recipes built only on the public [`Client`](crate::Client) API, as anyone
//! could write another.
//!
//! - [`Lock`]: a fair, herd-free lock whose grants carry a [`FencingToken`].
//! - [`Election`]: leader election whose leaderships carry a fenced epoch.
//! - [`FenceTracker`]: the check a storage system makes with a token.

mod election;
mod fence;
mod lock;

pub use election::{Election, Leader, Leadership};
pub use fence::{FenceTracker, FencingToken, StaleToken};
pub use lock::{Contender, LeaseState, Lock, LockGuard, LostReason};

use crate::{Client, CreateMode, Error, Result};

/// Creates `path` and any missing ancestors as empty persistent nodes.
pub(crate) async fn ensure_path(client: &Client, path: &str) -> Result<()> {
    if client.exists(path).await?.is_some() {
        return Ok(());
    }
    let mut prefix = String::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        prefix.push('/');
        prefix.push_str(segment);
        match client.create(&prefix, "", CreateMode::Persistent).await {
            Ok(_) | Err(Error::NodeExists(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
