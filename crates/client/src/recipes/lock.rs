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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

use baton_proto::path;

use super::{ensure_path, FencingToken};
use crate::{Client, DeadlineAlarm, Enqueued, Error, QueueWatch, Result, SessionId, SessionState};

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
    /// How contender nodes' names begin ("lock" or "candidate").
    kind: &'static str,
    /// How long before the session deadline a holder is told to stop; by
    /// default a tenth of the session timeout.
    stop_before: Option<Duration>,
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
    /// By this process's own clock, no more than the holder's
    /// [`stop_before`](Lock::stop_before) margin is left before the server
    /// may expire the session (it has not been heard from for the session
    /// timeout less the margin). The lock is still held, but it cannot be
    /// proven to last, so the holder must stop now; when the margin is up,
    /// the server may grant the lock to the next contender.
    DeadlinePassed,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::SessionExpired => "the session expired",
            LostReason::SessionClosed => "the session was closed",
            LostReason::NodeDeleted => "the lock node was deleted",
            LostReason::DeadlinePassed => {
                "the session deadline is near and the server has not been heard from"
            }
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
    /// A trailing `/` is ignored. The path is checked when first used: an
    /// invalid one fails with [`Error::InvalidPath`] naming it as given.
    pub fn new(client: &Client, path: &str) -> Self {
        Lock {
            client: client.clone(),
            path: path.trim_end_matches('/').to_owned(),
            typed: path.to_owned(),
            identity: Bytes::new(),
            kind: "lock",
            stop_before: None,
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
    fn check_path(&self) -> Result<()> {
        let what = match self.kind {
            "candidate" => "election",
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

    /// The queue in order: the holder first, then the waiters.
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

    /// Joins the queue: this contender's node and its queue watch.
    async fn enter(&self) -> Result<Entry> {
        self.check_path()?;
        let margin = self.margin()?;
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
        let (client, lock, identity) = (
            self.client.detached(),
            self.path.clone(),
            self.identity.clone(),
        );
        tokio::spawn(async move {
            if tx.is_closed() {
                return; // given up before anything was sent
            }
            let joined = join_queue(&client, &lock, &prefix, identity, &tx).await;
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

/// The caller's end of a join. Dropped with the node handed over but not
/// taken yet (the caller was dropped between the wake-up and its next
/// poll), it deletes the node; one handed over later finds it closed, and
/// the join's task deletes the node itself.
struct Handoff<'a> {
    rx: oneshot::Receiver<Result<Joined>>,
    client: &'a Client,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(Ok(joined)) = self.rx.try_recv() {
            delete_in_background(self.client, joined.node);
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

/// How many times joining a lock's queue is tried again (after a connection
/// loss, or because the lock's node vanished) before the contender gives up:
/// a failure that repeats this often is not going away by itself.
const MAX_RETRIES: u32 = 5;

/// What is left of a contender's retries while it joins the queue.
struct Retries {
    lock: String,
    spent: u32,
}

impl Retries {
    fn new(lock: &str) -> Self {
        Retries {
            lock: lock.to_owned(),
            spent: 0,
        }
    }

    /// Counts one retry after `error`.
    ///
    /// # Errors
    /// `error`, saying so, once [`MAX_RETRIES`] are spent.
    fn spend(&mut self, error: Error) -> Result<()> {
        if self.spent < MAX_RETRIES {
            self.spent += 1;
            return Ok(());
        }
        let why = format!(
            "joining the queue of the lock {} failed {} times in a row; giving up",
            self.lock,
            MAX_RETRIES + 1
        );
        Err(match error {
            Error::ConnectionLoss(last) => Error::ConnectionLoss(format!("{why} (last: {last})")),
            Error::NoNode(last) => Error::NoNode(format!(
                "{why}: the lock's node keeps being deleted (last: {last})"
            )),
            other => other,
        })
    }
}

/// A contender's place in the queue.
struct Joined {
    node: String,
    token: FencingToken,
    /// True if it heads the queue already.
    heads: bool,
    watch: QueueWatch,
}

impl From<Enqueued> for Joined {
    fn from(enqueued: Enqueued) -> Self {
        let token = enqueued.node.sequence.expect("queue nodes are sequential");
        let heads = enqueued.heads();
        Joined {
            node: enqueued.node.path,
            token: FencingToken(token),
            heads,
            watch: enqueued.watch,
        }
    }
}

/// Joins the queue of `lock` with a node named `prefix` plus the sequence
/// suffix. After a connection loss while enqueuing, finds the node if the
/// enqueue happened (the server applies nothing from the old connection once
/// the session is resumed, so the enqueue either happened before the list or
/// never), else joins afresh, unless `caller` is gone.
async fn join_queue(
    client: &Client,
    lock: &str,
    prefix: &str,
    identity: Bytes,
    caller: &oneshot::Sender<Result<Joined>>,
) -> Result<Joined> {
    let path = format!("{lock}/{prefix}");
    let mut retries = Retries::new(lock);
    // Whether the last enqueue's outcome is unknown: its node may be there.
    let mut unsure = false;
    loop {
        if unsure {
            if let Some((node, token)) = find_own(client, lock, prefix, &mut retries).await? {
                match client.queue_watch(&node).await {
                    // The member it waits on, none if it heads.
                    Ok((waits_on, watch)) => {
                        return Ok(Joined {
                            node,
                            token,
                            heads: waits_on.is_none(),
                            watch,
                        })
                    }
                    // Gone meanwhile, or the connection broke again: join afresh.
                    Err(e @ (Error::NoNode(_) | Error::ConnectionLoss(_))) => {
                        let _ = client.delete(&node, None).await;
                        retries.spend(e)?;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if caller.is_closed() {
            // Nobody would take a new node. (Nobody reads this error either:
            // it only makes the task withdraw what may be left.)
            return Err(Error::Closed);
        }
        match client.enqueue(&path, identity.clone()).await {
            Ok(enqueued) => return Ok(Joined::from(enqueued)),
            Err(e @ Error::NoNode(_)) => {
                unsure = false;
                retries.spend(e)?;
                ensure_path(client, lock).await?;
            }
            Err(e @ Error::ConnectionLoss(_)) => {
                unsure = true;
                retries.spend(e)?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Deletes every node under `lock` whose name begins with `prefix`: what a
/// join that failed or lost its caller may have left (an enqueue of unknown
/// outcome). A connection lost meanwhile is ridden out a few times.
async fn withdraw(client: &Client, lock: &str, prefix: &str) {
    for _ in 0..=MAX_RETRIES {
        let names = match client.get_children(lock).await {
            Ok((names, _)) => names,
            Err(Error::ConnectionLoss(_)) => continue,
            Err(_) => return,
        };
        let mut lost = false;
        for name in names.iter().filter(|n| n.starts_with(prefix)) {
            if let Err(Error::ConnectionLoss(_)) =
                client.delete(&format!("{lock}/{name}"), None).await
            {
                lost = true;
            }
        }
        if !lost {
            return;
        }
    }
}

/// This contender's node under `lock`, found by its unique prefix.
async fn find_own(
    client: &Client,
    lock: &str,
    prefix: &str,
    retries: &mut Retries,
) -> Result<Option<(String, FencingToken)>> {
    loop {
        let names = match client.get_children(lock).await {
            Ok((names, _)) => names,
            Err(Error::NoNode(_)) => return Ok(None),
            Err(e @ Error::ConnectionLoss(_)) => {
                retries.spend(e)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(name) = names.into_iter().find(|n| n.starts_with(prefix)) else {
            return Ok(None);
        };
        let node = format!("{lock}/{name}");
        match client.exists(&node).await {
            Ok(Some(stat)) => return Ok(Some((node, FencingToken(stat.czxid)))),
            Ok(None) => return Ok(None),
            Err(e @ Error::ConnectionLoss(_)) => retries.spend(e)?,
            Err(e) => return Err(e),
        }
    }
}

/// A contender's node while it waits; dropping it withdraws the node.
struct Entry {
    client: Client,
    node: Option<String>,
    token: FencingToken,
    heads: bool,
    watch: Option<QueueWatch>,
    /// The holder's stop-before margin.
    margin: Duration,
}

impl Entry {
    fn grant(&mut self) -> LockGuard {
        let node = self.node.take().expect("granted once");
        let watch = self.watch.take().expect("granted once");
        LockGuard::new(self.client.clone(), node, self.token, watch, self.margin)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            delete_in_background(&self.client, node);
        }
    }
}

/// Deletes a contender's node in the background. The server tells nobody
/// but, if it headed the queue, the next contender.
fn delete_in_background(client: &Client, node: String) {
    let client = client.clone();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = client.delete(&node, None).await;
        });
    }
}

/// A held lock. Dropping it releases the lock in the background; prefer
/// [`release`](Self::release), which says when it is done.
///
/// A guard watches its lease: [`lost`](Self::lost) resolves, and
/// [`is_lost`](Self::is_lost) turns true, when the session expires or is
/// closed, when someone deletes the lock node, or when, on this process's
/// clock, no more than the [`stop_before`](Lock::stop_before) margin is
/// left before the server may expire the session (this needs no round
/// trip, so a process that wakes from a long pause knows at once). The last
/// case comes first when the server cannot be reached: the holder is told
/// while the lock is still its own, with the margin to stop. Once lost,
/// always lost: an answer that arrives late and shows the session alive
/// after all does not give the lock back.
#[derive(Debug)]
pub struct LockGuard {
    client: Client,
    node: String,
    token: FencingToken,
    /// The node's queue watch: tells if anyone else deletes it.
    queue: QueueWatch,
    /// Goes off when the session deadline comes near.
    alarm: DeadlineAlarm,
    /// The first loss seen, kept for good.
    lost: OnceLock<LostReason>,
    released: bool,
}

impl LockGuard {
    fn new(
        client: Client,
        node: String,
        token: FencingToken,
        queue: QueueWatch,
        margin: Duration,
    ) -> Self {
        let alarm = client.deadline_alarm(margin);
        LockGuard {
            client,
            node,
            token,
            queue,
            alarm,
            lost: OnceLock::new(),
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

    /// Resolves when the lock is lost, with the reason (the first one seen:
    /// later calls give the same).
    ///
    /// # Examples
    ///
    /// Stop the work the lock guards as soon as the lease is gone:
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn demo(lock: baton_client::Lock) -> baton_client::Result<()> {
    /// let guard = lock.acquire().await?;
    /// tokio::select! {
    ///     () = work() => guard.release().await?,
    ///     reason = guard.lost() => eprintln!("stopped: the lock was lost ({reason})"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancellation safety
    /// Safe: it only reads the guard's state, so dropping it (a `select!`
    /// whose other branch won) loses nothing, and a later call resolves as
    /// this one would have.
    pub async fn lost(&self) -> LostReason {
        loop {
            if let Some(reason) = self.lost_now() {
                return reason;
            }
            tokio::select! {
                _ = self.queue.deleted() => {}
                _ = self.client.ended() => {}
                _ = self.alarm.fired() => {}
            }
        }
    }

    /// True once the lock is lost, and from then on. Reads only local
    /// state: no round trip.
    pub fn is_lost(&self) -> bool {
        self.lost_now().is_some()
    }

    /// Held, uncertain (disconnected, deadline ahead) or lost, from local
    /// state only. Once `Lost`, always `Lost`, with the same reason.
    pub fn state(&self) -> LeaseState {
        match self.lost_now() {
            Some(reason) => LeaseState::Lost(reason),
            None if self.client.state().is_connected() => LeaseState::Held,
            None => LeaseState::Uncertain,
        }
    }

    /// The loss, if there was one; the first one seen sticks.
    fn lost_now(&self) -> Option<LostReason> {
        if let Some(reason) = self.lost.get() {
            return Some(*reason);
        }
        let reason = self.loss()?;
        Some(*self.lost.get_or_init(|| reason))
    }

    /// What ends the lease now, if anything.
    fn loss(&self) -> Option<LostReason> {
        match self.queue.deleted_now() {
            Some(Ok(_)) => return Some(LostReason::NodeDeleted),
            Some(Err(Error::SessionExpired(_))) => return Some(LostReason::SessionExpired),
            Some(Err(_)) => return Some(LostReason::SessionClosed),
            None => {}
        }
        match self.client.state() {
            SessionState::Expired => return Some(LostReason::SessionExpired),
            SessionState::Closed => return Some(LostReason::SessionClosed),
            _ => {}
        }
        self.alarm.has_fired().then_some(LostReason::DeadlinePassed)
    }

    /// Releases the lock: deletes the holder's node, which wakes the next
    /// waiter (and nobody else).
    ///
    /// # Errors
    /// Errors of the delete; a node already gone (the lock was lost) is not
    /// an error. After [`Error::ConnectionLoss`] (the delete's outcome is
    /// unknown) the delete is sent again in the background.
    ///
    /// # Cancellation safety
    /// Dropping the future before the delete is answered releases the lock
    /// in the background, as dropping the guard does: also while the delete
    /// waits to be sent behind a stalled connection.
    pub async fn release(mut self) -> Result<()> {
        let deleted = self.client.delete(&self.node, None).await;
        // Marked only once the delete is answered: dropped before (while it
        // waits for room to be sent, say), or with its outcome unknown, the
        // guard deletes in the background. Deleting twice costs at worst a
        // NoNode: a sequential node's name is never given out again.
        self.released = !matches!(deleted, Err(Error::ConnectionLoss(_)));
        match deleted {
            Ok(()) | Err(Error::NoNode(_)) => Ok(()),
            Err(e) if e.is_session_gone() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            delete_in_background(&self.client, std::mem::take(&mut self.node));
        }
    }
}
