//! Joining a lock's queue in a task of its own, and leaving it: the parts
//! of a contender that outlive a cancelled `acquire`.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::recipes::{ensure_path, FencingToken};
use crate::{Client, Enqueued, Error, QueueRule, QueueWatch, Result, SessionState};

use super::guard::{delete_in_background, LockGuard};

/// The caller's end of a join. Dropped with the node handed over but not
/// taken yet (the caller was dropped between the wake-up and its next
/// poll), it deletes the node; one handed over later finds it closed, and
/// the join's task deletes the node itself.
pub(super) struct Handoff<'a> {
    pub(super) rx: oneshot::Receiver<Result<Joined>>,
    pub(super) client: &'a Client,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(Ok(joined)) = self.rx.try_recv() {
            delete_in_background(self.client, joined.node);
        }
    }
}

pub(super) fn ended_error(state: SessionState) -> Error {
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
pub(super) const MAX_RETRIES: u32 = 5;

/// What is left of a contender's retries while it joins the queue.
pub(super) struct Retries {
    pub(super) lock: String,
    pub(super) spent: u32,
}

impl Retries {
    pub(super) fn new(lock: &str) -> Self {
        Retries {
            lock: lock.to_owned(),
            spent: 0,
        }
    }

    /// Counts one retry after `error`.
    ///
    /// # Errors
    /// `error`, saying so, once [`MAX_RETRIES`] are spent.
    pub(super) fn spend(&mut self, error: Error) -> Result<()> {
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
pub(super) struct Joined {
    pub(super) node: String,
    pub(super) token: FencingToken,
    /// True if it heads the queue already.
    pub(super) heads: bool,
    pub(super) watch: QueueWatch,
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

/// Joins the queue of `lock` by `rule` with a node named `prefix` plus the
/// sequence suffix, holding `identity`. After a connection loss while enqueuing, finds the node if the
/// enqueue happened (the server applies nothing from the old connection once
/// the session is resumed, so the enqueue either happened before the list or
/// never), else joins afresh, unless `caller` is gone.
pub(super) async fn join_queue(
    client: &Client,
    lock: &str,
    prefix: &str,
    (identity, rule): (Bytes, QueueRule),
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
        match client.enqueue_by(&path, identity.clone(), rule).await {
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
pub(super) async fn withdraw(client: &Client, lock: &str, prefix: &str) {
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
pub(super) async fn find_own(
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
pub(super) struct Entry {
    pub(super) client: Client,
    pub(super) node: Option<String>,
    pub(super) token: FencingToken,
    pub(super) heads: bool,
    pub(super) watch: Option<QueueWatch>,
    /// The holder's stop-before margin.
    pub(super) margin: Duration,
}

impl Entry {
    pub(super) fn grant(&mut self) -> LockGuard {
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
