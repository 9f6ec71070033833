//! A held lock: its token, and how the holder learns it was lost.

use std::sync::OnceLock;
use std::time::Duration;

use crate::recipes::FencingToken;
use crate::{Client, DeadlineAlarm, Error, QueueWatch, Result, SessionState};

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
    /// [`stop_before`](super::Lock::stop_before) margin is left before the server
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

/// A held lock. Dropping it releases the lock in the background; prefer
/// [`release`](Self::release), which says when it is done.
///
/// A guard watches its lease: [`lost`](Self::lost) resolves, and
/// [`is_lost`](Self::is_lost) turns true, when the session expires or is
/// closed, when someone deletes the lock node, or when, on this process's
/// clock, no more than the [`stop_before`](super::Lock::stop_before) margin is
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
    pub(super) fn new(
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

/// Deletes a contender's node in the background. The server tells nobody
/// but, if it headed the queue, the next contender.
pub(super) fn delete_in_background(client: &Client, node: String) {
    let client = client.clone();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = client.delete(&node, None).await;
        });
    }
}
