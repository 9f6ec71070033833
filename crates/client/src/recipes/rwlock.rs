//! A fair, herd-free read-write lock with fencing tokens.

use crate::{Client, Lock, LockGuard, QueueRule, Result};

/// A read-write lock at one path: readers share it, a writer holds it
/// alone, and both kinds are served in the order they asked (first in,
/// first out across both), so a stream of readers does not starve a
/// writer: a reader that asks after a waiting writer waits for it.
///
/// Readers and writers join one queue under the lock's path, each by its
/// rule ([`QueueRule::Shared`] or [`QueueRule::Exclusive`]), and the server
/// applies the rules: a reader is woken once no writer is ahead of it, so
/// the readers behind a writer are woken together when it leaves; a writer
/// is woken once nobody is ahead of it. Nobody else is woken: a handover
/// costs one wake-up per contender it lets through.
///
/// Every grant carries a [`FencingToken`](crate::FencingToken), ordered
/// with every other grant of the lock, readers' and writers' alike: a
/// storage system that keeps the highest token it has seen refuses a holder
/// whose lease ran out once anyone newer has written. Readers hold their
/// grant exactly like a [`Lock`]'s holder: [`LockGuard::lost`] says when to
/// stop, and a reader's or writer's node goes with its session.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> baton_client::Result<()> {
/// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
/// let config = baton_client::recipes::RwLock::new(&client, "/locks/config");
/// let reading = config.read().await?; // shared with other readers
/// let (value, _) = client.get_data("/config").await?;
/// reading.release().await?;
/// let writing = config.write().await?; // alone
/// client
///     .set_data_fenced("/config", value, writing.token().get())
///     .await?;
/// writing.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Cancellation safety
///
/// As [`Lock::acquire`]: dropping a [`read`](Self::read) or
/// [`write`](Self::write) future withdraws its contender (its node is
/// deleted in the background), wherever it was.
#[derive(Clone, Debug)]
pub struct RwLock {
    readers: Lock,
    writers: Lock,
}

impl RwLock {
    /// The read-write lock at `path` (created, with its ancestors, when
    /// first needed). Its queue must not be shared with a [`Lock`] or a
    /// [`Semaphore`](super::Semaphore) of the same path: a plain lock's
    /// contenders would count as writers, and the server refuses to mix
    /// readers with permit holders.
    pub fn new(client: &Client, path: &str) -> Self {
        RwLock {
            readers: Lock::new(client, path).with_rule("read", QueueRule::Shared),
            writers: Lock::new(client, path).with_rule("write", QueueRule::Exclusive),
        }
    }

    /// Stores `identity` in every contender's node (see
    /// [`Lock::with_identity`]).
    pub fn with_identity(self, identity: impl Into<bytes::Bytes>) -> Self {
        let identity = identity.into();
        RwLock {
            readers: self.readers.with_identity(identity.clone()),
            writers: self.writers.with_identity(identity),
        }
    }

    /// The lock's path.
    pub fn path(&self) -> &str {
        self.readers.path()
    }

    /// The lock as readers take it, to use its other ways of acquiring
    /// ([`Lock::try_acquire`], [`Lock::acquire_timeout`]).
    pub fn reader(&self) -> &Lock {
        &self.readers
    }

    /// The lock as writers take it.
    pub fn writer(&self) -> &Lock {
        &self.writers
    }

    /// Waits until no writer is ahead, and returns the read guard.
    ///
    /// # Errors
    /// As [`Lock::acquire`].
    pub async fn read(&self) -> Result<LockGuard> {
        self.readers.acquire().await
    }

    /// Waits until nobody is ahead, and returns the write guard.
    ///
    /// # Errors
    /// As [`Lock::acquire`].
    pub async fn write(&self) -> Result<LockGuard> {
        self.writers.acquire().await
    }
}
