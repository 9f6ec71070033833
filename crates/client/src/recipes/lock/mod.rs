//! A fair, herd-free lock with fencing tokens.
//!
//! Each contender joins the lock's queue with one request
//! ([`Client::enqueue`]): an ephemeral sequential node under the lock's path,
//! with a queue watch that fires when no contender created before it is
//! left. The server moves that watch from predecessor to predecessor by
//! itself, so a release wakes exactly the next waiter, a waiter leaving the
//! middle of the queue wakes nobody, and the lock is granted in arrival
//! order. The holder's node's creation revision is its
//! [`FencingToken`](super::FencingToken): strictly greater than that of every
//! earlier grant of the lock, also after the lock's node is deleted and
//! created again.
//!
//! # Orphans
//!
//! A contender node is named `lock-<session>-<n>-` plus the server's sequence
//! suffix, unique to this client. If the connection breaks while its enqueue
//! is in flight, the enqueue may or may not have happened; after the session
//! is resumed the contender lists the lock's children and adopts its node if
//! it is there (the server applies nothing from the old connection after the
//! resume), so no forgotten node can block the queue. A contender joins in
//! a task of its own, so an `acquire` that is cancelled (its future dropped)
//! deletes its node whenever it is dropped: also when the create's answer is
//! still on its way, and when that answer was lost with a connection (the
//! task looks for the node by its name and deletes it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

use baton_proto::path;

use super::FencingToken;
use crate::{Client, Error, QueueRule, Result, SessionId};

mod guard;
mod queue;

pub use guard::{LeaseState, LockGuard, LostReason};
use queue::{ended_error, join_queue, withdraw, Entry, Handoff, Joined};

/// Distinguishes the contender nodes one process creates.
static NEXT_CONTENDER: AtomicU64 = AtomicU64::new(1);

/// A lock at one path. Cheap to create; every `acquire` is a new contender.
///
/// # Examples
///
/// Hold the lock while writing, with its fencing token on every write, so
/// that storage refuses a holder whose lease already ran out:
///
/// ```no_run
/// # async fn demo() -> baton_client::Result<()> {
/// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
/// let lock = baton_client::Lock::new(&client, "/locks/orders");
/// let guard = lock.acquire().await?;
/// client
///     .set_data_fenced("/orders/state", "paid", guard.token().get())
///     .await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Lock {
    client: Client,
    path: String,
    /// The path as given, for error messages.
    typed: String,
    identity: Bytes,
    /// How contender nodes' names begin ("lock", "candidate", "read",
    /// "write" or "permit").
    kind: &'static str,
    /// The rule contenders join the queue by.
    rule: QueueRule,
    /// How long before the session deadline a holder is told to stop; by
    /// default a tenth of the session timeout.
    stop_before: Option<Duration>,
    /// The lock-delay to set on the lock, if any, and whether it was set
    /// (by this lock or a clone): a setting is a logged change, made once.
    lock_delay: Option<(Duration, Arc<AtomicBool>)>,
}

/// One contender in a lock's queue, as [`Lock::contenders`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contender {
    /// Full path of the contender's node.
    pub node: String,
    /// The session that owns it.
    pub owner: Option<SessionId>,
    /// The token it holds or will hold.
    pub token: FencingToken,
    /// What the contender stored in its node (see [`Lock::with_identity`]).
    pub identity: Bytes,
    /// Whether it holds (or shares) the lock now, as the server decides by
    /// the rule it joined by; otherwise it waits.
    pub holds: bool,
    /// How its node's name begins: `lock`, `read`, `write`, `permit` or
    /// `candidate` for the recipes' contenders.
    pub kind: String,
}

impl Lock {
    /// The lock at `path` (created, with its ancestors, when first needed).
    /// A trailing `/` is ignored. The path is checked when first used: an
    /// invalid one fails with [`Error::InvalidPath`] naming it as given.
    pub fn new(client: &Client, path: &str) -> Self {
        Lock {
            client: client.clone(),
            path: path.trim_end_matches('/').to_owned(),
            typed: path.to_owned(),
            identity: Bytes::new(),
            kind: "lock",
            rule: QueueRule::Exclusive,
            stop_before: None,
            lock_delay: None,
        }
    }

    /// Sets the lock's lock-delay when a contender joins (see
    /// [`Client::set_lock_delay`]): if a holder's session expires rather
    /// than releasing, no one else is granted the lock for `delay`. The
    /// setting is the server's, kept with the lock's node, so every
    /// contender obeys it; the last one set wins. It is set by the first
    /// acquire of this lock (and its clones) only, and goes if the lock's
    /// node is deleted: set it again then with [`Client::set_lock_delay`].
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some((delay, Arc::new(AtomicBool::new(false))));
        self
    }

    /// Names this contender's nodes `<kind>-<session>-<n>-<sequence>`.
    pub(crate) fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// Makes contenders join the queue by `rule`, naming their nodes after
    /// `kind`: the one difference between a lock, a read or write lock and
    /// a semaphore.
    pub(crate) fn with_rule(mut self, kind: &'static str, rule: QueueRule) -> Self {
        self.kind = kind;
        self.rule = rule;
        self
    }

    /// Data stored in this contender's node, for whoever lists the queue
    /// (a host name and process id, say).
    pub fn with_identity(mut self, identity: impl Into<Bytes>) -> Self {
        self.identity = identity.into();
        self
    }

    /// How long before the session deadline the holder is told the lock is
    /// lost: the time it has to stop before the server may expire its
    /// session and grant the lock to the next contender. When no more than
    /// this is left before [`Client::session_deadline`], the guard's
    /// [`lost`](LockGuard::lost) resolves with [`LostReason::DeadlinePassed`].
    /// Default: a tenth of the session timeout.
    ///
    /// A healthy session's deadline stays about two thirds of the session
    /// timeout ahead (the client pings when it has been quiet for a third),
    /// so the margin may be at most half the session timeout, which leaves a
    /// sixth for the ping's round trip; `acquire` refuses more.
    pub fn stop_before(mut self, margin: Duration) -> Self {
        self.stop_before = Some(margin);
        self
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Checks the lock's path, so that a bad one is reported as given
    /// rather than as the name of a node under it.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] naming the path as given.
    pub(crate) fn check_path(&self) -> Result<()> {
        let what = match self.kind {
            "candidate" => "election",
            "permit" => "semaphore",
            _ => "lock",
        };
        if self.path.is_empty() && !self.typed.is_empty() {
            return Err(Error::InvalidPath(format!(
                "{what} path {:?} is the root; a {what} needs a node of its own, such as /{what}s/NAME",
                self.typed
            )));
        }
        path::validate(&self.path).map_err(|e| {
            Error::InvalidPath(if self.path == self.typed {
                format!("{what} {e}")
            } else {
                format!("{what} {e} (given as {:?})", self.typed)
            })
        })
    }

    /// The margin a holder gets (see [`stop_before`](Self::stop_before)).
    ///
    /// # Errors
    /// [`Error::BadArguments`] if it is more than half the session timeout.
    fn margin(&self) -> Result<Duration> {
        let timeout = self.client.session_timeout();
        let Some(margin) = self.stop_before else {
            return Ok(timeout / 10);
        };
        if margin > timeout / 2 {
            return Err(Error::BadArguments(format!(
                "a stop-before margin of {} ms does not fit in the session timeout of {} ms: \
                 it may be at most half of it ({} ms), because a healthy session's deadline \
                 is only about two thirds of the timeout ahead",
                margin.as_millis(),
                timeout.as_millis(),
                (timeout / 2).as_millis()
            )));
        }
        Ok(margin)
    }

    /// Waits for the lock and returns its guard.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] naming the lock's path as given, if it is not
    /// valid. [`Error::SessionExpired`] or [`Error::Closed`] if the session
    /// ends first (never a grant based on a node that is gone), [`Error::NoNode`] if
    /// someone deletes this contender's node while it waits,
    /// [`Error::BadArguments`] if the [`stop_before`](Self::stop_before)
    /// margin does not fit in the session timeout, and errors of the
    /// underlying requests. A connection loss while joining the queue is
    /// ridden out a few times (the contender finds its node, or joins
    /// afresh); if the same thing fails six times in a row, the last
    /// [`Error::ConnectionLoss`] is returned (a node whose creation was never
    /// confirmed is looked for once more and deleted, in the background).
    ///
    /// # Cancellation safety
    /// Dropping the future withdraws the contender: its node is deleted (in
    /// the background), whatever the future was waiting for, also if the
    /// answer to its enqueue was lost with a connection.
    pub async fn acquire(&self) -> Result<LockGuard> {
        let mut entry = self.enter().await?;
        if !entry.heads {
            let waited = tokio::select! {
                r = entry.watch.as_mut().expect("held until granted").head() => r,
                state = self.client.ended() => Err(ended_error(state)),
            };
            waited.map_err(|e| match e {
                Error::NoNode(_) => Error::NoNode(format!(
                    "contender node {} was deleted while waiting for the lock {}",
                    entry.node.as_deref().unwrap_or_default(),
                    self.path
                )),
                other => other,
            })?;
        }
        Ok(entry.grant())
    }

    /// Takes the lock if nobody holds or waits for it; never waits.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), but for the ones about waiting.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        let mut entry = self.enter().await?;
        // If not granted, dropping `entry` withdraws the node.
        Ok(entry.heads.then(|| entry.grant()))
    }

    /// Like [`acquire`](Self::acquire), giving up after `timeout`: `None`
    /// then, and the contender is withdrawn.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: std::time::Duration) -> Result<Option<LockGuard>> {
        match tokio::time::timeout(timeout, self.acquire()).await {
            Ok(result) => result.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// The queue in order: the holders first (one, or several sharing the
    /// lock: readers, permit holders), then the waiters.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] if the lock's path is not valid, and errors of
    /// the underlying requests; an absent lock has no contenders.
    pub async fn contenders(&self) -> Result<Vec<Contender>> {
        self.check_path()?;
        let names = match self.client.get_children(&self.path).await {
            Ok((names, _)) => names,
            Err(Error::NoNode(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let reads = names.iter().map(|name| {
            let node = format!("{}/{name}", self.path);
            let kind = name.split('-').next().unwrap_or_default().to_owned();
            async move {
                let read = async {
                    let (identity, stat) = self.client.get_data(&node).await?;
                    let waits_on = self.client.queue_standing(&node).await?;
                    Ok(Contender {
                        owner: stat.owner(),
                        token: FencingToken(stat.czxid),
                        identity,
                        holds: waits_on.is_none(),
                        kind,
                        node,
                    })
                };
                match read.await {
                    Ok(contender) => Ok(Some(contender)),
                    Err(Error::NoNode(_)) => Ok(None), // left meanwhile
                    Err(e) => Err(e),
                }
            }
        });
        let mut queue: Vec<Contender> = futures::future::try_join_all(reads)
            .await?
            .into_iter()
            .flatten()
            .collect();
        queue.sort_by_key(|c| c.token);
        Ok(queue)
    }

    /// Joins the queue: this contender's node and its queue watch.
    async fn enter(&self) -> Result<Entry> {
        self.check_path()?;
        let margin = self.margin()?;
        if let Some((delay, set)) = &self.lock_delay {
            if !set.load(Ordering::Acquire) {
                crate::recipes::ensure_path(&self.client, &self.path).await?;
                self.client.set_lock_delay(&self.path, *delay).await?;
                set.store(true, Ordering::Release);
            }
        }
        let n = NEXT_CONTENDER.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{}-{:x}-{n}-", self.kind, self.client.session_id().0);
        let joined = self.join(prefix).await?;
        Ok(Entry {
            client: self.client.clone(),
            node: Some(joined.node),
            token: joined.token,
            heads: joined.heads,
            watch: Some(joined.watch),
            margin,
        })
    }

    /// Joins the queue in a task of its own, and waits for it to hand over
    /// the node. The caller may give up at any point; the task finishes what
    /// it started, so that no node is left behind: a node the caller does
    /// not take is deleted, and a join that ends in an error or without a
    /// caller, while the session lives, deletes every node with this
    /// contender's `prefix`, as an enqueue whose answer was lost with a
    /// connection may have left one. Once the application drops its last
    /// handle on the session, the task stops: the session's nodes go with
    /// it when it expires.
    async fn join(&self, prefix: String) -> Result<Joined> {
        let (tx, rx) = oneshot::channel();
        // Detached: a join left behind must not keep a session the
        // application dropped (nor send its abandoned requests again).
        let (client, lock, identity, rule) = (
            self.client.detached(),
            self.path.clone(),
            self.identity.clone(),
            self.rule,
        );
        tokio::spawn(async move {
            if tx.is_closed() {
                return; // given up before anything was sent
            }
            let joined = join_queue(&client, &lock, &prefix, (identity, rule), &tx).await;
            let failed = joined.is_err();
            if let Err(Ok(joined)) = tx.send(joined) {
                let _ = client.delete(&joined.node, None).await;
            }
            if failed && !client.state().is_terminal() {
                withdraw(&client, &lock, &prefix).await;
            }
        });
        let mut handoff = Handoff {
            rx,
            client: &self.client,
        };
        (&mut handoff.rx).await.map_err(|_| Error::Closed)?
    }
}
