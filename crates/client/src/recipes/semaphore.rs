//! A fair, herd-free counting semaphore whose permits are fencing tokens.

use crate::{Client, Lock, LockGuard, QueueRule, Result};

/// A semaphore at one path with a fixed number of permits: up to that many
/// holders at once, the others waiting in the order they asked.
///
/// Holders and waiters join one queue under the semaphore's path by the
/// rule [`QueueRule::Permits`]; the server applies it: a member holds a
/// permit while fewer than `permits` members are ahead of it. When a holder
/// leaves (releases, or its session ends), the server wakes exactly the
/// first waiter; a waiter leaving wakes nobody. A permit is lost with its
/// holder's session, like a [`Lock`]'s, and every permit carries a
/// [`FencingToken`](crate::FencingToken) greater than those of all permits
/// granted before it.
///
/// Every contender of one semaphore must agree on its number of permits:
/// the server refuses to queue a contender that asks for another number
/// while others are queued ([`Error::BadArguments`](crate::Error::BadArguments)).
///
/// # Examples
///
/// At most three workers of a pool talk to a slow service at once:
///
/// ```no_run
/// # async fn demo() -> baton_client::Result<()> {
/// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
/// let slots = baton_client::recipes::Semaphore::new(&client, "/semaphores/api", 3);
/// let permit = slots.acquire().await?;
/// println!("working with permit {}", permit.token());
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Cancellation safety
///
/// As [`Lock::acquire`]: dropping an [`acquire`](Self::acquire) future
/// withdraws its contender (its node is deleted in the background),
/// wherever it was.
#[derive(Clone, Debug)]
pub struct Semaphore {
    lock: Lock,
    permits: u32,
}

impl Semaphore {
    /// The semaphore at `path` (created, with its ancestors, when first
    /// needed) with `permits` permits (at least 1: a semaphore of 0 is
    /// refused when acquired).
    pub fn new(client: &Client, path: &str, permits: u32) -> Self {
        Semaphore {
            lock: Lock::new(client, path).with_rule("permit", QueueRule::Permits(permits)),
            permits,
        }
    }

    /// Stores `identity` in every contender's node (see
    /// [`Lock::with_identity`]).
    pub fn with_identity(self, identity: impl Into<bytes::Bytes>) -> Self {
        Semaphore {
            lock: self.lock.with_identity(identity),
            permits: self.permits,
        }
    }

    /// The semaphore's path.
    pub fn path(&self) -> &str {
        self.lock.path()
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The semaphore as a [`Lock`] whose contenders take permits, to use its
    /// other ways of acquiring ([`Lock::try_acquire`],
    /// [`Lock::acquire_timeout`]) and to list the holders and waiters
    /// ([`Lock::contenders`]).
    pub fn as_lock(&self) -> &Lock {
        &self.lock
    }

    /// Waits for a permit and returns its guard; dropping or releasing the
    /// guard returns the permit.
    ///
    /// # Errors
    /// As [`Lock::acquire`], and [`Error::BadArguments`](crate::Error::BadArguments)
    /// if the semaphore has 0 permits or its queue holds contenders that
    /// asked for another number.
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.lock.acquire().await
    }
}
