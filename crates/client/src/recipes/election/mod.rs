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

mod observe;

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
    /// The value the leader campaigned with (empty if an observer could
    /// not read it before the leader left).
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
    pub(super) fn candidates(&self) -> Lock {
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
    /// then each new one, every one of them: also a leadership that began
    /// and ended between two reads. The observer follows the election's
    /// candidates from the events of one persistent watch on its node (it
    /// creates the node if missing), so it costs the server one watch
    /// however many candidates there are, and sees the queue as it was at
    /// every change. A leader whose session ended is never reported as
    /// leading after its end; one that left before its value could be read
    /// is reported with an empty value. After a disconnection longer than
    /// the server's watch history, the observer reads the candidates
    /// afresh and reports the leader from then on: only then can a
    /// leadership go unseen.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        observe::observe(self.clone())
    }
}
