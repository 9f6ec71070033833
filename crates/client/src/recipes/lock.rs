//! A fair, herd-free lock with fencing tokens.
//!
//! Each contender creates an ephemeral sequential node under the lock's path
//! and waits only for the contender created just before it (its
//! predecessor), so a release wakes exactly one waiter and the lock is
//! granted in arrival order. The holder's node's creation revision is its
//! [`FencingToken`](super::FencingToken): strictly greater than that of every
//! earlier grant of the lock, also after the lock's node is deleted and
//! created again.
//!
//! # Orphans
//!
//! A contender node is named `lock-<session>-<n>-` plus the server's sequence
//! suffix, unique to this client. If the connection breaks while its create
//! is in flight, the create may or may not have happened; after the session
//! is resumed the contender lists the lock's children and adopts its node if
//! it is there (the server applies nothing from the old connection after the
//! resume), so no forgotten node can block the queue. An `acquire` that is
//! cancelled (its future dropped) deletes its node, also when the create's
//! answer is still on its way.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::{oneshot, watch};
use tokio::time::{sleep_until, Instant};

use super::{ensure_path, FencingToken};
use crate::{Client, CreateMode, Error, EventKind, Result, SessionId, SessionState};

/// Distinguishes the contender nodes one process creates.
static NEXT_CONTENDER: AtomicU64 = AtomicU64::new(1);

/// A lock at one path. Cheap to create; every `acquire` is a new contender.
#[derive(Clone, Debug)]
pub struct Lock {
    client: Client,
    path: String,
    identity: Bytes,
    /// How contender nodes' names begin ("lock" or "candidate").
    kind: &'static str,
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
}

/// Why a held lock was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The server expired the session.
    SessionExpired,
    /// The session was closed.
    SessionClosed,
    /// Someone deleted the holder's node.
    NodeDeleted,
    /// By this process's own clock the session timeout has passed since the
    /// server last heard from it: the server may have expired it, so the
    /// lease must be taken as over (it cannot be proven otherwise in time).
    DeadlinePassed,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::SessionExpired => "the session expired",
            LostReason::SessionClosed => "the session was closed",
            LostReason::NodeDeleted => "the lock node was deleted",
            LostReason::DeadlinePassed => "the session timeout passed without word from the server",
        })
    }
}

/// What a holder can say about its lease right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Connected, and the session deadline is ahead.
    Held,
    /// The connection is down but the session deadline is still ahead: the
    /// lock may still be held. Avoid starting new work.
    Uncertain,
    /// The lock is lost.
    Lost(LostReason),
}

impl Lock {
    /// The lock at `path` (created, with its ancestors, when first needed).
    pub fn new(client: &Client, path: &str) -> Self {
        Lock {
            client: client.clone(),
            path: path.trim_end_matches('/').to_owned(),
            identity: Bytes::new(),
            kind: "lock",
        }
    }

    /// Names this contender's nodes `<kind>-<session>-<n>-<sequence>`.
    pub(crate) fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// Data stored in this contender's node, for whoever lists the queue
    /// (a host name and process id, say).
    pub fn with_identity(mut self, identity: impl Into<Bytes>) -> Self {
        self.identity = identity.into();
        self
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Waits for the lock and returns its guard.
    ///
    /// # Errors
    /// [`Error::SessionExpired`] or [`Error::Closed`] if the session ends
    /// first (never a grant based on a node that is gone), [`Error::NoNode`] if
    /// someone deletes this contender's node while it waits, and errors of
    /// the underlying requests.
    ///
    /// # Cancellation safety
    /// Dropping the future withdraws the contender: its node is deleted.
    pub async fn acquire(&self) -> Result<LockGuard> {
        let mut entry = self.enter().await?;
        loop {
            if let Some(guard) = self.step(&mut entry, true).await? {
                return Ok(guard);
            }
        }
    }

    /// Takes the lock if nobody holds or waits for it; never waits.
    ///
    /// # Errors
    /// Errors of the underlying requests.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        let mut entry = self.enter().await?;
        self.step(&mut entry, false).await
        // If not granted, dropping `entry` withdraws the node.
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

    /// The queue in order: the holder first, then the waiters.
    ///
    /// # Errors
    /// Errors of the underlying requests; an absent lock has no contenders.
    pub async fn contenders(&self) -> Result<Vec<Contender>> {
        let names = match self.client.get_children(&self.path).await {
            Ok((names, _)) => names,
            Err(Error::NoNode(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let reads = names.iter().map(|name| {
            let node = format!("{}/{name}", self.path);
            async move {
                match self.client.get_data(&node).await {
                    Ok((identity, stat)) => Ok(Some(Contender {
                        node,
                        owner: stat.owner(),
                        token: FencingToken(stat.czxid),
                        identity,
                    })),
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

    /// Joins the queue: creates this contender's node.
    async fn enter(&self) -> Result<Entry> {
        let n = NEXT_CONTENDER.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{}-{:x}-{n}-", self.kind, self.client.session_id().0);
        let (tx, rx) = oneshot::channel();
        let (client, lock, identity) = (
            self.client.clone(),
            self.path.clone(),
            self.identity.clone(),
        );
        // The create runs in its own task, so that if this future is dropped
        // while the answer is on its way, the node is still deleted.
        tokio::spawn(async move {
            let created = create_contender(&client, &lock, &prefix, identity).await;
            if let Err(Ok((node, _))) = tx.send(created) {
                let _ = client.delete(&node, None).await;
            }
        });
        let (node, token) = rx.await.map_err(|_| Error::Closed)??;
        Ok(Entry {
            client: self.client.clone(),
            node: Some(node),
            token,
        })
    }

    /// One look at the queue: the guard if this contender is first; else,
    /// if `wait`, waits until its predecessor goes away or changes.
    async fn step(&self, entry: &mut Entry, wait: bool) -> Result<Option<LockGuard>> {
        let node = entry
            .node
            .clone()
            .expect("an entry holds its node until granted");
        if !wait {
            return match self.client.predecessor(&node).await? {
                None => Ok(Some(entry.grant(self.client.clone()))),
                Some(_) => Ok(None),
            };
        }
        match self.client.predecessor_watch(&node).await {
            Ok(None) => Ok(Some(entry.grant(self.client.clone()))),
            Ok(Some((_, _, watcher))) => {
                tokio::select! {
                    // The predecessor left or changed: look again.
                    fired = watcher => fired.map(|_| None),
                    state = self.client.ended() => Err(ended_error(state)),
                }
            }
            Err(Error::ConnectionLoss(_)) => Ok(None), // look again once resumed
            Err(Error::NoNode(_)) => Err(Error::NoNode(format!(
                "contender node {node} was deleted while waiting for the lock {}",
                self.path
            ))),
            Err(e) => Err(e),
        }
    }
}

fn ended_error(state: SessionState) -> Error {
    match state {
        SessionState::Expired => {
            Error::SessionExpired("the session expired while waiting for the lock".into())
        }
        _ => Error::Closed,
    }
}

/// Creates the contender node, recovering it if the connection broke while
/// the create was in flight.
async fn create_contender(
    client: &Client,
    lock: &str,
    prefix: &str,
    identity: Bytes,
) -> Result<(String, FencingToken)> {
    let path = format!("{lock}/{prefix}");
    loop {
        match client
            .create(&path, identity.clone(), CreateMode::EphemeralSequential)
            .await
        {
            Ok(created) => {
                let token = created.sequence.expect("sequential nodes have a sequence");
                return Ok((created.path, FencingToken(token)));
            }
            Err(Error::NoNode(_)) => ensure_path(client, lock).await?,
            Err(Error::ConnectionLoss(_)) => {
                // Resumed by the time this list is answered; the old
                // connection's create either happened before that or never.
                if let Some(found) = find_own(client, lock, prefix).await? {
                    return Ok(found);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// This contender's node under `lock`, found by its unique prefix.
async fn find_own(
    client: &Client,
    lock: &str,
    prefix: &str,
) -> Result<Option<(String, FencingToken)>> {
    loop {
        let names = match client.get_children(lock).await {
            Ok((names, _)) => names,
            Err(Error::NoNode(_)) => return Ok(None),
            Err(Error::ConnectionLoss(_)) => continue,
            Err(e) => return Err(e),
        };
        let Some(name) = names.into_iter().find(|n| n.starts_with(prefix)) else {
            return Ok(None);
        };
        let node = format!("{lock}/{name}");
        match client.exists(&node).await {
            Ok(Some(stat)) => return Ok(Some((node, FencingToken(stat.czxid)))),
            Ok(None) => return Ok(None),
            Err(Error::ConnectionLoss(_)) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A contender's node while it waits; dropping it withdraws the node.
struct Entry {
    client: Client,
    node: Option<String>,
    token: FencingToken,
}

impl Entry {
    fn grant(&mut self, client: Client) -> LockGuard {
        let node = self.node.take().expect("granted once");
        LockGuard::new(client, node, self.token)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            delete_in_background(&self.client, node);
        }
    }
}

fn delete_in_background(client: &Client, node: String) {
    let client = client.clone();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = withdraw(&client, &node).await;
        });
    }
}

/// Deletes a contender's node. Its own watch on the node is removed first
/// (in the same round trip), so that a release notifies only the successor.
async fn withdraw(client: &Client, node: &str) -> Result<()> {
    let (_, deleted) = tokio::join!(
        client.remove_watches(node, true, false),
        client.delete(node, None)
    );
    match deleted {
        Ok(()) | Err(Error::NoNode(_)) => Ok(()),
        Err(e) if e.is_session_gone() => Ok(()),
        Err(e) => Err(e),
    }
}

/// A held lock. Dropping it releases the lock in the background; prefer
/// [`release`](Self::release), which says when it is done.
///
/// A guard watches its lease: [`lost`](Self::lost) resolves, and
/// [`is_lost`](Self::is_lost) turns true, when the session expires or is
/// closed, when someone deletes the lock node, or when the session timeout
/// has passed on this process's clock since the server last heard from it
/// (the last case needs no round trip, so a process that wakes from a long
/// pause knows at once).
#[derive(Debug)]
pub struct LockGuard {
    client: Client,
    node: String,
    token: FencingToken,
    lost: watch::Receiver<Option<LostReason>>,
    /// The task watching the lease; taken when the guard is released.
    monitor: Option<tokio::task::JoinHandle<()>>,
    released: bool,
}

impl LockGuard {
    fn new(client: Client, node: String, token: FencingToken) -> Self {
        let (tx, lost) = watch::channel(None);
        let monitor = tokio::spawn(monitor(client.clone(), node.clone(), tx));
        LockGuard {
            client,
            node,
            token,
            lost,
            monitor: Some(monitor),
            released: false,
        }
    }

    /// The fencing token of this grant: send it with every write the lock
    /// protects, and have the storage refuse lower ones.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Full path of the holder's node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Resolves when the lock is lost, with the reason.
    ///
    /// # Cancellation safety
    /// Safe.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.lost.clone();
        loop {
            if let Some(reason) = self.lost_now() {
                return reason;
            }
            let deadline = self.client.session_deadline();
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The monitor ended without a reason: the session task is gone.
                        return LostReason::SessionClosed;
                    }
                }
                _ = sleep_until(deadline) => {}
            }
        }
    }

    /// True once the lock is lost. Reads only local state: no round trip.
    pub fn is_lost(&self) -> bool {
        self.lost_now().is_some()
    }

    /// Held, uncertain (disconnected, deadline ahead) or lost, from local
    /// state only.
    pub fn state(&self) -> LeaseState {
        match self.lost_now() {
            Some(reason) => LeaseState::Lost(reason),
            None if self.client.state().is_connected() => LeaseState::Held,
            None => LeaseState::Uncertain,
        }
    }

    fn lost_now(&self) -> Option<LostReason> {
        if let Some(reason) = *self.lost.borrow() {
            return Some(reason);
        }
        match self.client.state() {
            SessionState::Expired => return Some(LostReason::SessionExpired),
            SessionState::Closed => return Some(LostReason::SessionClosed),
            _ => {}
        }
        (Instant::now() >= self.client.session_deadline()).then_some(LostReason::DeadlinePassed)
    }

    /// Releases the lock: deletes the holder's node, which wakes the next
    /// waiter.
    ///
    /// # Errors
    /// Errors of the delete; a node already gone (the lock was lost) is not
    /// an error.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        stop_monitor(self.monitor.take()).await;
        withdraw(&self.client, &self.node).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (client, node, monitor) = (
            self.client.clone(),
            std::mem::take(&mut self.node),
            self.monitor.take(),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                stop_monitor(monitor).await;
                let _ = withdraw(&client, &node).await;
            });
        }
    }
}

/// Stops the lease monitor and waits until it has: a watch request it is in
/// the middle of sending must not reach the server after the withdrawal's
/// removal of that watch, or the release would notify its own session too.
async fn stop_monitor(monitor: Option<tokio::task::JoinHandle<()>>) {
    if let Some(monitor) = monitor {
        monitor.abort();
        let _ = monitor.await;
    }
}

/// Watches a held lock's node and session, and publishes the first reason
/// the lock is lost.
async fn monitor(client: Client, node: String, lost: watch::Sender<Option<LostReason>>) {
    let reason = 'arm: loop {
        let mut watcher = match client.exists_watch(&node).await {
            Ok((Some(_), watcher)) => watcher,
            Ok((None, _)) => break LostReason::NodeDeleted,
            Err(Error::ConnectionLoss(_)) => continue,
            Err(Error::SessionExpired(_)) => break LostReason::SessionExpired,
            Err(_) => break LostReason::SessionClosed,
        };
        loop {
            let deadline = client.session_deadline();
            tokio::select! {
                fired = &mut watcher => match fired {
                    Ok(event) if event.kind == EventKind::Deleted => break 'arm LostReason::NodeDeleted,
                    Ok(_) => continue 'arm, // its data changed: watch again
                    Err(Error::SessionExpired(_)) => break 'arm LostReason::SessionExpired,
                    Err(_) => break 'arm LostReason::SessionClosed,
                },
                state = client.ended() => break 'arm match state {
                    SessionState::Expired => LostReason::SessionExpired,
                    _ => LostReason::SessionClosed,
                },
                // The deadline moves on with every answered request; only a
                // deadline that stays passed ends the lease.
                _ = sleep_until(deadline) => {
                    if Instant::now() >= client.session_deadline() {
                        break 'arm LostReason::DeadlinePassed;
                    }
                }
            }
        }
    };
    let _ = lost.send(Some(reason));
}
