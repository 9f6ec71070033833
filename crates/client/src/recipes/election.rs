//! Leader election with fenced epochs, for active/standby failover.
//!
//! Candidates queue exactly as lock contenders do (an ephemeral sequential
//! node each, waiting for its predecessor alone), so the leader is the
//! candidate that has waited longest, a succession wakes one candidate, and
//! candidates lead in the order they joined. The node holds the candidate's
//! value (an address, say), and its creation revision is the leadership's
//! [`FencingToken`]: its epoch. A deposed leader that wakes from a pause
//! still carries its old epoch, which storage refuses (see
//! [`super::fence`]).

use bytes::Bytes;
use futures::Stream;

use super::lock::{LeaseState, Lock, LockGuard, LostReason};
use super::FencingToken;
use crate::{Client, Error, Result, SessionId};

/// An election at one path.
///
/// # Examples
///
/// A master that serves while it leads, and stops when its leadership is
/// lost; its token fences the writes of a deposed master:
///
/// ```no_run
/// # async fn serve(token: baton_client::FencingToken) {}
/// # async fn demo() -> baton_client::Result<()> {
/// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
/// let election = baton_client::Election::new(&client, "/elections/master");
/// let leadership = election.campaign("host-a:9000").await?;
/// tokio::select! {
///     () = serve(leadership.token()) => leadership.resign().await?,
///     reason = leadership.lost() => eprintln!("no longer the master ({reason})"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    client: Client,
    path: String,
    /// The path as given, for error messages.
    typed: String,
    stop_before: Option<std::time::Duration>,
}

/// The leader as observers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader campaigned with.
    pub value: Bytes,
    /// Its epoch: greater than every earlier leader's.
    pub token: FencingToken,
    /// Its candidate node.
    pub node: String,
    /// Its session.
    pub session: Option<SessionId>,
}

/// This candidate's leadership. Dropping it resigns in the background;
/// prefer [`resign`](Self::resign).
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    value: Bytes,
}

impl Leadership {
    /// The epoch of this leadership: its fencing token.
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// The value this leader campaigned with.
    pub fn value(&self) -> &Bytes {
        &self.value
    }

    /// This leader's candidate node.
    pub fn node(&self) -> &str {
        self.guard.node()
    }

    /// Resolves when leadership is lost: the session expired or was closed,
    /// the node was deleted, or no more than the
    /// [`stop_before`](Election::stop_before) margin is left, on this
    /// process's clock, before the server may expire the session. The first reason seen sticks:
    /// later calls give the same, at once.
    ///
    /// # Cancellation safety
    /// Safe: it only reads the leadership's state (as
    /// [`LockGuard::lost`]), so dropping it loses nothing.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// True once leadership is lost, and from then on; reads local state
    /// only.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Held, uncertain (disconnected, deadline ahead) or lost, from local
    /// state only. Once `Lost`, always `Lost`, with the same reason.
    pub fn state(&self) -> LeaseState {
        self.guard.state()
    }

    /// Steps down now: the next candidate leads at once.
    ///
    /// # Errors
    /// Errors of the delete (a node already gone is not one). After
    /// [`Error::ConnectionLoss`] (the delete's outcome is unknown) the
    /// delete is sent again in the background.
    ///
    /// # Cancellation safety
    /// Dropping the future before the delete is answered resigns in the
    /// background, as dropping the leadership does: also while the delete
    /// waits to be sent behind a stalled connection.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

impl Election {
    /// The election at `path` (created, with its ancestors, when needed).
    pub fn new(client: &Client, path: &str) -> Self {
        Election {
            client: client.clone(),
            path: path.trim_end_matches('/').to_owned(),
            typed: path.to_owned(),
            stop_before: None,
        }
    }

    /// How long before the session deadline a leader is told its leadership
    /// is lost, to step down before the server may expire its session and
    /// let the next candidate lead. Default: a tenth of the session timeout;
    /// at most half of it. See [`Lock::stop_before`].
    pub fn stop_before(mut self, margin: std::time::Duration) -> Self {
        self.stop_before = Some(margin);
        self
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The queue of candidates, as a lock.
    fn candidates(&self) -> Lock {
        Lock::new(&self.client, &self.typed).with_kind("candidate")
    }

    /// Joins the election with `value` and waits until this candidate leads.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] naming the election's path as given, if it is
    /// not valid. [`Error::SessionExpired`] or [`Error::Closed`] if the
    /// session ends first: a candidate whose session is gone never leads.
    /// [`Error::BadArguments`] if the [`stop_before`](Self::stop_before)
    /// margin does not fit in the session timeout.
    ///
    /// # Cancellation safety
    /// Dropping the future withdraws the candidate.
    pub async fn campaign(&self, value: impl Into<Bytes>) -> Result<Leadership> {
        let value = value.into();
        let mut lock = self.candidates().with_identity(value.clone());
        if let Some(margin) = self.stop_before {
            lock = lock.stop_before(margin);
        }
        let guard = lock.acquire().await?;
        Ok(Leadership { guard, value })
    }

    /// The current leader, if any. A leader whose session has ended is never
    /// reported: its node went with its session, in the same step.
    ///
    /// # Errors
    /// Errors of the underlying requests.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        loop {
            let queue = self.candidates().contenders().await?;
            let Some(first) = queue.into_iter().next() else {
                return Ok(None);
            };
            // Read the value with the node's stat, so that a leader that just
            // left is not reported with another's value.
            match self.client.get_data(&first.node).await {
                Ok((value, stat)) => {
                    return Ok(Some(Leader {
                        value,
                        token: FencingToken(stat.czxid),
                        node: first.node,
                        session: stat.owner(),
                    }))
                }
                Err(Error::NoNode(_)) => continue, // it left meanwhile: look again
                Err(e) => return Err(e),
            }
        }
    }

    /// Changes of leader, in order: the current leader (or `None`) first,
    /// then each new one. Observers watch only the leader's node (or, while
    /// there is none, the election's list of candidates), so they cost the
    /// server nothing per candidate. Watches fire once and are set again on
    /// each look, so a leadership that begins and ends between two looks
    /// (within a round trip or so) can go unseen; what is seen is never out
    /// of order, and a leader whose session ended is never reported.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let election = self.clone();
        futures::stream::unfold(
            (election, None::<Option<Leader>>),
            |(election, last)| async move {
                loop {
                    if let Some(shown) = &last {
                        if let Err(e) = election.wait_for_change(shown.as_ref()).await {
                            return Some((Err(e), (election, last)));
                        }
                    }
                    let now = match election.leader().await {
                        Ok(now) => now,
                        Err(e) => return Some((Err(e), (election, last))),
                    };
                    let changed = match (&last, &now) {
                        (None, _) => true,
                        (Some(before), now) => {
                            before.as_ref().map(|l| l.token) != now.as_ref().map(|l| l.token)
                        }
                    };
                    if changed {
                        return Some((Ok(now.clone()), (election, Some(now))));
                    }
                }
            },
        )
    }

    /// Waits for the shown leader to go (or, with none, for a candidate).
    async fn wait_for_change(&self, shown: Option<&Leader>) -> Result<()> {
        match shown {
            Some(leader) => match self.client.exists_watch(&leader.node).await? {
                (None, _) => Ok(()),
                // Any change to the leader's node is worth a look.
                (Some(_), watcher) => watcher.await.map(|_| ()),
            },
            None => match self.client.get_children_watch(&self.path).await {
                Ok((children, _, watcher)) if children.is_empty() => watcher.await.map(|_| ()),
                Ok(_) => Ok(()),
                Err(Error::NoNode(_)) => {
                    // No election node yet: wait for it to appear.
                    let (stat, watcher) = self.client.exists_watch(&self.path).await?;
                    if stat.is_none() {
                        watcher.await?;
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            },
        }
    }
}
