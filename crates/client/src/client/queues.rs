//! A client's operations on queues and fencing tokens: predecessors, joining
//! a queue, its watch, and token checks.

use std::sync::atomic::Ordering;

use baton_proto::{PredecessorWatch, QueueRule, Reply, Request, Stat};
use bytes::Bytes;

use super::{unexpected, Client, Created, Enqueued};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::pending::Registration;
use crate::queue::QueueWatch;
use crate::watcher::Watcher;

impl Client {
    /// The sibling created just before the node at `path` (its full path and
    /// metadata), or `None` if it was created first among those left.
    ///
    /// # Errors
    /// [`Error::NoNode`] if there is no node at `path`.
    pub async fn predecessor(&self, path: &str) -> Result<Option<(String, Stat)>> {
        self.check(path, None)?;
        let request = Request::Predecessor {
            path: path.to_owned(),
            watch: PredecessorWatch::None,
        };
        match self.call(request, None).await?.reply {
            Reply::Predecessor(found) => Ok(found),
            other => Err(unexpected(other)),
        }
    }

    /// Like [`predecessor`](Self::predecessor), and, if there is one, a watch
    /// on it that fires when it changes or goes away, set in the same step as
    /// the lookup. This is how a lock waiter waits for its predecessor alone:
    /// a release wakes one waiter, however many there are.
    ///
    /// # Errors
    /// [`Error::NoNode`] if there is no node at `path`.
    pub async fn predecessor_watch(&self, path: &str) -> Result<Option<(String, Stat, Watcher)>> {
        self.check(path, None)?;
        let request = Request::Predecessor {
            path: path.to_owned(),
            watch: PredecessorWatch::Predecessor,
        };
        let (answer, watcher) = self.call_watch(path, request, true).await?;
        match answer.reply {
            Reply::Predecessor(Some((pred, stat))) => {
                let mut watcher = watcher.expect("watch requested");
                watcher.retarget(&pred);
                Ok(Some((pred, stat, watcher)))
            }
            Reply::Predecessor(None) => Ok(None),
            other => Err(unexpected(other)),
        }
    }

    /// Joins the queue of `path`'s siblings: creates an ephemeral sequential
    /// node at `path` (plus the sequence suffix) holding `data`, and sets a
    /// queue watch on it, in one round trip. Returns the node, the node just
    /// before it (none: it heads the queue), and the [`QueueWatch`] that
    /// tells when it heads the queue and whether someone else deletes it.
    ///
    /// This is the step a lock contender takes: a release wakes exactly the
    /// next contender, and a contender leaving the middle wakes nobody.
    ///
    /// # Errors
    /// Those of [`create`](Self::create).
    ///
    /// # Cancellation safety
    /// If the future is dropped once the request was sent, the node is
    /// deleted as soon as its creation is confirmed, also when the
    /// confirmation had already reached the future but was not read yet: a
    /// queue never keeps a node nobody waits with. (A connection lost
    /// meanwhile leaves the question open, as for any request: see
    /// [`Error::ConnectionLoss`].)
    pub async fn enqueue(&self, path: &str, data: impl Into<Bytes>) -> Result<Enqueued> {
        self.enqueue_by(path, data, QueueRule::Exclusive).await
    }

    /// Like [`enqueue`](Self::enqueue), joining the queue by `rule`: with
    /// [`QueueRule::Shared`] the node heads once no exclusive member is
    /// ahead of it (a reader), with [`QueueRule::Permits`]`(n)` once fewer
    /// than `n` members are (a semaphore). The server applies the rule, so
    /// the [`QueueWatch`] fires *head* only when the node may proceed, and
    /// [`Enqueued::predecessor`] names what it waits on (none: it heads).
    /// The members of one queue must join by agreeing rules: shared and
    /// exclusive members together, or holders of as many permits.
    ///
    /// # Errors
    /// Those of [`create`](Self::create), and [`Error::BadArguments`] if the
    /// queue's members joined by another rule, or for 0 permits.
    ///
    /// # Cancellation safety
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_by(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        rule: QueueRule,
    ) -> Result<Enqueued> {
        let data = data.into();
        self.check(path, Some(&data))?;
        let id = self.inner.next_watch.fetch_add(1, Ordering::Relaxed);
        let (mut watch, registration) =
            QueueWatch::new(path.to_owned(), id, self.inner.unregister.clone());
        let request = Request::Enqueue {
            path: path.to_owned(),
            data,
            rule,
        };
        let registration = Registration::Queue(path.to_owned(), registration);
        match self.call(request, Some(registration)).await?.reply {
            Reply::Enqueue {
                path,
                sequence,
                stat,
                predecessor,
            } => {
                watch.retarget(&path);
                Ok(Enqueued {
                    node: Created {
                        path,
                        sequence: Some(sequence),
                        stat,
                    },
                    predecessor,
                    watch,
                })
            }
            other => Err(unexpected(other)),
        }
    }

    /// Sets a queue watch on `node`, one of this session's own ephemeral
    /// nodes (as [`enqueue`](Self::enqueue) does for the node it creates),
    /// and returns the member it waits on as the server decided by the
    /// queue's rule (for an exclusive queue, the node just before it), none
    /// if it heads the queue.
    ///
    /// # Errors
    /// [`Error::NoNode`] if there is no such node, [`Error::BadArguments`] if
    /// it is not this session's ephemeral node.
    pub async fn queue_watch(&self, node: &str) -> Result<(Option<(String, Stat)>, QueueWatch)> {
        self.check(node, None)?;
        let id = self.inner.next_watch.fetch_add(1, Ordering::Relaxed);
        let (watch, registration) =
            QueueWatch::new(node.to_owned(), id, self.inner.unregister.clone());
        let request = Request::Predecessor {
            path: node.to_owned(),
            watch: PredecessorWatch::Queue,
        };
        let registration = Registration::Queue(node.to_owned(), registration);
        match self.call(request, Some(registration)).await?.reply {
            Reply::Predecessor(found) => Ok((found, watch)),
            other => Err(unexpected(other)),
        }
    }

    /// Where the node at `path` stands in its queue under the rule it joined
    /// by, as the server decides it: the member it waits on, or `None` if it
    /// heads the queue (holds the lock, shares it as a reader, or holds a
    /// permit). Sets no watch.
    ///
    /// # Errors
    /// [`Error::NoNode`] if there is no node at `path`.
    pub async fn queue_standing(&self, path: &str) -> Result<Option<(String, Stat)>> {
        self.check(path, None)?;
        let request = Request::Predecessor {
            path: path.to_owned(),
            watch: PredecessorWatch::Standing,
        };
        match self.call(request, None).await?.reply {
            Reply::Predecessor(found) => Ok(found),
            other => Err(unexpected(other)),
        }
    }

    /// Sets the lock-delay of the lock at `path` (`Duration::ZERO`: none):
    /// when a session holding the lock expires, rather than releasing it,
    /// the server grants the lock to no one else for `delay` after the
    /// expiry, for resources that cannot check a fencing token. The holder's
    /// node stays in the queue meanwhile, owned by no session. A release, or
    /// a session closed, is not delayed. At most 10 minutes.
    ///
    /// # Errors
    /// [`Error::NoNode`] if there is no node at `path`,
    /// [`Error::BadArguments`] for the root or a delay over 10 minutes.
    pub async fn set_lock_delay(&self, path: &str, delay: std::time::Duration) -> Result<()> {
        self.check(path, None)?;
        let delay_ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
        let request = Request::LockDelay {
            path: path.to_owned(),
            delay_ms,
        };
        match self.call(request, None).await?.reply {
            Reply::LockDelay => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// The child of `parent` whose creation revision (fencing token) is
    /// `token`, if it still exists: whether that token's holder still holds
    /// its lock node.
    ///
    /// # Errors
    /// [`Error::NoNode`] if there is no node at `parent`.
    pub async fn check_token(&self, parent: &str, token: u64) -> Result<Option<(String, Stat)>> {
        self.check(parent, None)?;
        let request = Request::CheckToken {
            path: parent.to_owned(),
            token,
        };
        match self.call(request, None).await?.reply {
            Reply::CheckToken(found) => Ok(found),
            other => Err(unexpected(other)),
        }
    }
}
