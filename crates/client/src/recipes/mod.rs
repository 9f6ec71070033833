//! Recipes built only on the public [`Client`] API, as anyone
//! could write another.
//!
//! - [`Lock`]: a fair, herd-free lock whose grants carry a [`FencingToken`].
//! - [`RwLock`]: readers share, a writer holds alone, first in first out.
//! - [`Semaphore`]: up to N holders at once, each permit a fencing token.
//! - [`Election`]: leader election whose leaderships carry a fenced epoch.
//! - [`FenceTracker`]: the check a storage system makes with a token.
//! - [`Counter`]: a shared counter whose adds return the value they made.
//! - [`Barrier`]: holds everyone until it is lifted; [`DoubleBarrier`]:
//!   parties enter together and leave together.
//! - [`TreeCache`] and [`NodeCache`]: local, always-current copies of a
//!   subtree or a node, with a stream of changes.

mod barrier;
mod cache;
mod counter;
mod election;
mod fence;
mod lock;
mod rwlock;
mod semaphore;

pub use barrier::{Barrier, DoubleBarrier, Entered};
pub use cache::{CacheEvent, NodeCache, TreeCache};
pub use counter::Counter;

pub use election::{Election, Leader, Leadership};
pub use fence::{FenceTracker, FencingToken, StaleToken};
pub use lock::{Contender, LeaseState, Lock, LockGuard, LostReason};
pub use rwlock::RwLock;
pub use semaphore::Semaphore;

use crate::{Client, CreateMode, Error, Result};

/// Creates `path` and any missing ancestors as empty persistent nodes.
pub(crate) async fn ensure_path(client: &Client, path: &str) -> Result<()> {
    if client.exists(path).await?.is_some() {
        return Ok(());
    }
    // The deepest first, and an ancestor only if it is missing: creating
    // needs the write right on the parent, which an identity with rights on
    // its own subtree alone does not have on the ancestors above it.
    let mut missing = vec![path.to_owned()];
    while let Some(node) = missing.last() {
        match client.create(node, "", CreateMode::Persistent).await {
            Ok(_) | Err(Error::NodeExists(_)) => {
                missing.pop();
            }
            Err(Error::NoNode(why)) => match node.rsplit_once('/') {
                Some((parent, _)) if !parent.is_empty() => missing.push(parent.to_owned()),
                _ => return Err(Error::NoNode(why)),
            },
            Err(Error::PermissionDenied(why)) => {
                return Err(Error::PermissionDenied(format!(
                    "{node} does not exist and cannot be created by this client ({why}): create it first with an identity that may (baton create {node}), or give this one the write right there"
                )))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
