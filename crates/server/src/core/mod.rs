//! The server's shared core: the state machine plus what only this server
//! knows about its sessions (their connections, when each was last heard
//! from) and their watches. One mutex guards it all; nothing in here awaits.
//!
//! Replies and watch events are pushed to connection outboxes while the lock
//! is held. That single order is what keeps invariant 7 of docs/design.md:
//! an event is queued the moment its change is applied, so it is ahead of the
//! reply to any request applied later, on every connection.
//!
//! Changes reach the state machine through the [`Replicator`]. A single
//! server applies a change the moment it is proposed, and answers at once
//! (the reply then waits for durability in the outbox). A cluster member
//! that leads proposes it and answers when the change comes back committed
//! ([`Core::apply_committed`]); replies to one session stay in request order
//! through its [`Replies`] queue.
//!
//! - `sessions.rs`: handshakes, liveness, expiry, leadership changes;
//! - `requests.rs`: what each request does;
//! - `watching.rs`: watches, queue watches and the events changes fire.

mod requests;
mod sessions;
#[cfg(test)]
mod tests;
mod watching;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use baton_proto::{
    ErrorCode, ErrorReply, EventKind, Reply, SessionId, SessionSecret, TxnFailure, TxnResult,
};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::clock::Now;
use crate::config::Config;
use crate::outbox::{Out, Outbox};
use crate::persist::DurableMark;
use crate::persistent::{History, PersistentWatches};
use crate::queues::QueueWatches;
use crate::replicate::{Replicator, Role};
use crate::state::{Applied, Command, Origin, Outcome, Proposal, StateMachine, Unshared};
use crate::stats::{Stats, StatsSnapshot};
use crate::watches::{Kinds, Watches};

pub(crate) use sessions::{Connected, Connecting};

/// A time as the core keeps it for each session: nanoseconds since the
/// core was made ([`Core::origin`]), half the size of an `Instant`. Every
/// time a core is given is at or after the one it was made at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Stamp(u64);

impl Stamp {
    fn after(self, d: std::time::Duration) -> Stamp {
        Stamp(self.0.saturating_add(d.as_nanos() as u64))
    }
}

/// This server's view of a live session (its timeout is in the state).
struct Live {
    /// The connection the session is attached to, if any.
    conn: Option<Arc<Outbox>>,
    last_heard: Stamp,
    /// Replies owed, in request order, while changes of this session are
    /// proposed and not yet applied (a cluster leader only).
    replies: Option<Box<Replies>>,
}

impl Live {
    fn new(conn: Option<Arc<Outbox>>, now: Stamp) -> Self {
        Live {
            conn,
            last_heard: now,
            replies: None,
        }
    }
}

/// A watch event held back until the answer to the change that fired it
/// is queued: the connection, the event and its path.
type LaterEvent = (Arc<Outbox>, EventKind, Arc<str>);

/// A session's replies in request order: a change proposed and not yet
/// applied holds back the replies to requests made after it.
type Replies = VecDeque<Owed>;

enum Owed {
    /// The reply to this request comes when its change is applied.
    Change {
        xid: u32,
        op: u8,
    },
    Ready(Out),
}

/// What a handled request means for its connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// The session ended or moved: read no more requests.
    Stop,
}

/// A connection waiting for its new session to be opened by the replicated
/// log.
struct Opening {
    outbox: Arc<Outbox>,
    done: oneshot::Sender<Result<Connected, (ErrorCode, String)>>,
}

pub(crate) struct Core {
    sm: StateMachine,
    watches: Watches,
    queues: QueueWatches,
    /// Persistent watches, plain and recursive.
    persistent: PersistentWatches,
    /// The events of the latest changes, to replay to a resuming client.
    history: History,
    /// Queue notifications of the change being dispatched (scratch).
    queue_events: Vec<(SessionId, EventKind, Arc<str>)>,
    /// Grants, holds and waits per lock, for operators.
    locks: crate::locks::LockBoard,
    /// Kept in order of id, side by side (ids only grow, so the map's leaves
    /// stay full): a hash table would cost twice as much per session.
    live: Unshared<SessionId, Live>,
    /// Candidate expiry times. An entry may be stale (the session was heard
    /// from since); it is checked and pushed back when it comes due.
    deadlines: Unshared<(Stamp, SessionId), ()>,
    /// What the core's [`Stamp`]s count from: the time it was made at.
    origin: Instant,
    config: Arc<Config>,
    stats: Arc<Stats>,
    fired: Vec<SessionId>,
    /// While a committed change is applied ([`Core::apply_committed`]): the
    /// session that made it, and the watch events the change fires for
    /// other sessions, queued only once its answer is (see there).
    later_events: Option<(SessionId, Vec<LaterEvent>)>,
    /// Set when the server stops: new handshakes are refused.
    shutting_down: bool,
    /// How changes reach the state machine.
    log: Arc<dyn Replicator>,
    /// How far the log is durable; frames wait for it.
    mark: Arc<DurableMark>,
    /// Whether this server serves clients.
    role: Role,
    /// New sessions proposed and not yet opened, by their secret.
    opening: HashMap<SessionSecret, Opening>,
    /// Sessions whose expiry is proposed and not yet applied, with their
    /// timeouts (for the message their connection gets).
    expiring: HashMap<SessionId, u32>,
    /// Lock-delay tombstones whose deletion is proposed and not yet applied.
    releasing: HashSet<Arc<str>>,
    /// On the leader: containers standing empty (having had children),
    /// since when; and the same in that order, for the timer (an entry
    /// whose time is no longer the map's is stale).
    /// A deletion proposed from a state that moves on meanwhile is refused
    /// by the state machine, and one proposed twice deletes once.
    emptied: HashMap<Arc<str>, Instant>,
    emptied_order: std::collections::VecDeque<(Instant, Arc<str>)>,
    /// Wakes the expiry timer when a session's deadline becomes the earliest.
    expiry_wake: Arc<Notify>,
    /// The time of the call in hand, as its caller gave it: what the core
    /// stamps and counts from, however deep in the call.
    now: Now,
}

/// What a core shares with the rest of the server.
pub(crate) struct With {
    pub(crate) config: Arc<Config>,
    pub(crate) stats: Arc<Stats>,
    /// How far the log is durable.
    pub(crate) mark: Arc<DurableMark>,
    /// Wakes the expiry timer.
    pub(crate) expiry_wake: Arc<Notify>,
}

impl Core {
    /// A core over a (possibly recovered) state, with `role`. If it leads,
    /// every session in the state gets a fresh full timeout from `now` to
    /// reconnect.
    pub(crate) fn new(
        sm: StateMachine,
        log: Arc<dyn Replicator>,
        role: Role,
        with: With,
        now: Now,
    ) -> Self {
        let With {
            config,
            stats,
            mark,
            expiry_wake,
        } = with;
        let revision = sm.revision();
        let mut core = Core {
            sm,
            watches: Watches::default(),
            queues: QueueWatches::default(),
            persistent: PersistentWatches::default(),
            history: History::new(config.watch_history, revision),
            queue_events: Vec::new(),
            locks: Default::default(),
            live: Unshared::new(),
            deadlines: Unshared::new(),
            origin: now.at,
            config,
            stats,
            fired: Vec::new(),
            later_events: None,
            shutting_down: false,
            log,
            mark,
            role: Role::Follower {
                leader: None,
                serving: false,
            },
            opening: HashMap::new(),
            expiring: HashMap::new(),
            releasing: HashSet::new(),
            emptied: HashMap::new(),
            emptied_order: Default::default(),
            expiry_wake,
            now,
        };
        match role {
            Role::Leader => core.lead(now),
            follower => core.role = follower,
        }
        core
    }

    /// Replaces how changes reach the state machine (a cluster member gets
    /// its replicated log once it is started).
    pub(crate) fn set_log(&mut self, log: Arc<dyn Replicator>) {
        self.log = log;
    }

    /// The log, to stop it or ask it about the cluster.
    pub(crate) fn log(&self) -> Arc<dyn Replicator> {
        self.log.clone()
    }

    /// Whether this server serves clients.
    pub(crate) fn role(&self) -> Role {
        self.role.clone()
    }

    /// A read barrier (see [`Replicator::read_barrier`]) for a request of
    /// `session` (or a handshake resuming it): the leader's own, or, on a
    /// follower that serves clients, one confirmed with the leader, which
    /// hears from `session` on the way.
    pub(crate) fn read_barrier(&self, session: Option<SessionId>) -> crate::replicate::Barrier {
        match self.role {
            Role::Follower { serving: true, .. } => self.log.follower_barrier(session),
            _ => self.log.read_barrier(),
        }
    }

    /// Proposes a change a request (or this server) asks for. `Some` is the
    /// answer to give now (a single server applied it at once, or it was
    /// refused); `None` means the answer comes when the change is applied.
    fn propose(&mut self, proposal: Proposal) -> Option<Result<Reply, ErrorReply>> {
        let proposed = match self.role {
            Role::Leader => self.log.propose(&proposal),
            Role::Follower { serving: true, .. } => self.log.forward(&proposal),
            Role::Follower { serving: false, .. } => crate::replicate::Proposed::NotLeader,
        };
        match proposed {
            crate::replicate::Proposed::ApplyNow => {
                let applied = self.sm.apply_proposal(&proposal);
                if applied.changed {
                    self.log.logged(applied.revision, &proposal, &self.sm);
                }
                self.settle(&proposal, applied)
            }
            crate::replicate::Proposed::Later => None,
            crate::replicate::Proposed::NotLeader => Some(Err(self.not_leader())),
        }
    }

    /// Applies a change the replicated log committed (on every member, in
    /// log order), and answers the request it came from if that request was
    /// proposed here. Returns the revision after it.
    pub(crate) fn apply_committed(&mut self, proposal: &Proposal, now: Now) -> u64 {
        self.now = now;
        let applied = self.sm.apply_proposal(proposal);
        let revision = applied.revision;
        // The answer to the request goes before the watch events of other
        // sessions: connections are woken in the order their frames are
        // queued, and a member's runtime runs them in that order, so a
        // change that fires thousands of watches would otherwise be
        // answered only once every one of those connections had run. Its
        // own session's events still come before its answer, and the
        // others keep their order among themselves; nothing can be asked
        // of the core in between (invariant 7).
        self.later_events = proposal.origin.map(|o| (o.session, Vec::new()));
        // The replies the request's session is owed, taken before a close
        // ends the session.
        let owed = proposal.origin.and_then(|o| {
            let live = self.live.get_mut(&o.session)?;
            Some((live.conn.clone()?, live.replies.take()?))
        });
        let answer = self.settle(proposal, applied);
        if let (Some(origin), Some((conn, replies)), Some(answer)) = (proposal.origin, owed, answer)
        {
            let closes = matches!(answer, Ok(Reply::CloseSession));
            self.owed_answered(origin, &conn, replies, answer);
            if closes {
                conn.close(None, 0);
            }
        }
        let later = self.later_events.take().map(|(_, later)| later);
        for (conn, kind, path) in later.unwrap_or_default() {
            self.notify(&conn, kind, revision, path);
        }
        revision
    }

    /// What follows an applied change: the bookkeeping of a session that
    /// opened or ended, the events it fires, and the answer to the request
    /// it came from, if that request was made here (an enqueue also gets its
    /// queue watch).
    fn settle(
        &mut self,
        proposal: &Proposal,
        applied: Applied,
    ) -> Option<Result<Reply, ErrorReply>> {
        let actor = proposal.origin.map(|o| o.session);
        let here = actor.is_some_and(|s| self.serves(s));
        match (&proposal.command, &applied.result) {
            (Command::OpenSession { secret, timeout_ms }, Ok(Outcome::SessionOpened(id))) => {
                self.opened(*id, *secret, *timeout_ms, applied.revision);
                return None;
            }
            (
                Command::CloseSession { session } | Command::ExpireSession { session },
                Ok(Outcome::SessionEnded { .. }),
            ) => {
                if self.sm.tombstones().next().is_some() {
                    // It may have left a tombstone: the timer deletes it
                    // when due.
                    self.expiry_wake.notify_one();
                }
                self.ended(*session, &proposal.command, &applied);
                return here.then_some(Ok(Reply::CloseSession));
            }
            (Command::ExpireSession { session }, Err(_)) => {
                self.expiring.remove(session);
                return None;
            }
            _ => {}
        }
        self.dispatch(&applied.triggers, actor);
        if !here {
            return None;
        }
        Some(match applied.result {
            Err(e) => Err(e),
            Ok(Outcome::Created {
                path,
                sequence,
                stat,
            }) => Ok(Reply::Create {
                path: path.to_string(),
                sequence,
                stat,
            }),
            Ok(Outcome::Enqueued {
                path,
                sequence,
                stat,
                ..
            }) => self.queue_up(actor.expect("here"), &path, sequence, stat),
            Ok(Outcome::Deleted) => Ok(Reply::Delete),
            Ok(Outcome::DataSet(stat)) => Ok(Reply::SetData(stat)),
            Ok(Outcome::LockDelaySet) => Ok(Reply::LockDelay),
            Ok(Outcome::AclSet { stat, aversion }) => Ok(Reply::SetAcl { stat, aversion }),
            Ok(Outcome::Multi(outcomes)) => Ok(Reply::Multi(Ok(outcomes
                .into_iter()
                .map(txn_result)
                .collect()))),
            Ok(Outcome::MultiFailed { index, error }) => {
                Ok(Reply::Multi(Err(TxnFailure { index, error })))
            }
            Ok(Outcome::SessionOpened(_) | Outcome::SessionEnded { .. } | Outcome::Checked) => {
                unreachable!("sessions open and end above; checks answer inside a transaction")
            }
        })
    }

    /// Whether `session` is attached to a connection of this server.
    fn serves(&self, session: SessionId) -> bool {
        self.live.get(&session).is_some_and(|l| l.conn.is_some())
    }

    /// Answers a request of `session` on `outbox`: at once, unless replies
    /// to its earlier changes are still owed (then after them).
    fn answer(
        &mut self,
        session: SessionId,
        outbox: &Arc<Outbox>,
        xid: u32,
        op: u8,
        result: Result<Reply, ErrorReply>,
    ) {
        let out = self.reply_frame(xid, op, result);
        if let Some(replies) = self.live.get_mut(&session).and_then(|l| l.replies.as_mut()) {
            replies.push_back(Owed::Ready(out));
            return;
        }
        self.push(outbox, out);
    }

    /// Notes that the reply to a change of `session` is owed until it is
    /// applied.
    fn owe(&mut self, session: SessionId, outbox: &Outbox, xid: u32, op: u8) {
        if let Some(live) = self.live.get_mut(&session) {
            live.replies
                .get_or_insert_with(Default::default)
                .push_back(Owed::Change { xid, op });
            outbox.change_proposed();
        }
    }

    /// A change of `origin`'s session was applied: its reply, and those
    /// ready behind it, are sent in request order; what is still owed goes
    /// back to the session.
    fn owed_answered(
        &mut self,
        origin: Origin,
        conn: &Arc<Outbox>,
        mut replies: Box<Replies>,
        answer: Result<Reply, ErrorReply>,
    ) {
        let mut answer = Some(answer);
        for owed in replies.iter_mut() {
            if let Owed::Change { xid, op } = *owed {
                if xid == origin.xid {
                    let answer = answer.take().expect("one match");
                    *owed = Owed::Ready(self.reply_frame(xid, op, answer));
                    conn.change_applied();
                    break;
                }
            }
        }
        while let Some(Owed::Ready(_)) = replies.front() {
            let Some(Owed::Ready(out)) = replies.pop_front() else {
                unreachable!("checked above");
            };
            self.push(conn, out);
        }
        if !replies.is_empty() {
            if let Some(live) = self.live.get_mut(&origin.session) {
                live.replies = Some(replies);
            }
        }
    }

    /// Queues a frame for a connection; it leaves once its revision is
    /// durable, and the connection is woken then.
    fn push(&self, outbox: &Arc<Outbox>, out: Out) -> bool {
        let revision = out.revision();
        let pushed = outbox.push(out, self.config.max_outbound_bytes);
        if pushed {
            self.mark.wake_at(revision, outbox);
        }
        pushed
    }

    /// A reply frame. A reply too large to send becomes a
    /// `response-too-large` error of that request: the connection and the
    /// session go on.
    fn reply_frame(&self, xid: u32, op: u8, result: Result<Reply, ErrorReply>) -> Out {
        let mut out = Out::Reply {
            xid,
            op,
            revision: self.sm.revision(),
            result,
        };
        let size = out.wire_size();
        if let Out::Reply { result, .. } = &mut out {
            if size > self.max_reply() {
                *result = Err(self.too_large(size));
            }
            let error = result.as_ref().err().map(|e| e.code);
            self.stats.metrics.replied(op, error);
        }
        out
    }

    /// Queues a reply at once.
    fn reply(&self, outbox: &Arc<Outbox>, xid: u32, op: u8, result: Result<Reply, ErrorReply>) {
        self.push(outbox, self.reply_frame(xid, op, result));
    }

    /// The largest reply a request may get: one that fits in a response
    /// frame and in half the connection's outbox. A connection reads no
    /// requests while half its outbox is full, so a reply this size always
    /// has room.
    fn max_reply(&self) -> usize {
        baton_proto::MAX_RESPONSE_FRAME.min(self.config.max_outbound_bytes / 2)
    }

    fn too_large(&self, size: usize) -> ErrorReply {
        ErrorReply::new(
            ErrorCode::ResponseTooLarge,
            format!(
                "the reply would take {size} bytes, over the server's {} byte limit for one reply",
                self.max_reply()
            ),
        )
    }

    /// The error of a request this server cannot serve: it does not lead.
    fn not_leader(&self) -> ErrorReply {
        let (code, message) = self.not_leader_notice();
        ErrorReply { code, message }
    }

    /// The counters and current sizes of this server.
    /// The `n` busiest locks: longest queue first, then most grants.
    pub(crate) fn busiest_locks(&self, n: usize) -> Vec<crate::locks::LockView> {
        self.locks.busiest(&self.sm, n)
    }

    /// Queue watches held now.
    pub(crate) fn queue_watch_count(&self) -> usize {
        self.queues.len()
    }

    pub(crate) fn stats_snapshot(&self) -> StatsSnapshot {
        let mut snap = self.stats.snapshot();
        snap.sessions = self.sm.session_count() as u64;
        snap.nodes = self.sm.node_count() as u64;
        snap.watches = (self.watches.len() + self.queues.len() + self.persistent.len()) as u64;
        snap.revision = self.sm.revision();
        snap
    }

    /// The state's revision.
    /// The state as it is, for what a front end answers from it.
    pub(crate) fn sm(&self) -> &StateMachine {
        &self.sm
    }

    /// Which watches `session` holds on `path`: its one-shot watches'
    /// kinds, and whether it holds a persistent watch there (plain or
    /// recursive).
    pub(crate) fn watches_on(&self, session: SessionId, path: &str) -> (Kinds, bool) {
        let persistent =
            self.persistent.has(session, path, false) || self.persistent.has(session, path, true);
        (self.watches.kinds(session, path), persistent)
    }

    /// Watches held, one-shot and persistent, for operators.
    pub(crate) fn watch_count(&self) -> usize {
        self.watches.len() + self.persistent.len()
    }

    pub(crate) fn revision(&self) -> u64 {
        self.sm.revision()
    }

    /// A copy of the state (O(1)), for a snapshot.
    pub(crate) fn state(&self) -> StateMachine {
        self.sm.clone()
    }

    /// Whether the state holds session `id`.
    pub(crate) fn state_has_session(&self, id: SessionId) -> bool {
        self.sm.session(id).is_some()
    }

    /// Replaces the state with one installed from a snapshot. Sessions are
    /// tracked again from it if this server leads.
    pub(crate) fn install(&mut self, sm: StateMachine, now: Now) {
        self.now = now;
        self.sm = sm;
        // No event from before the snapshot can be replayed.
        self.history.reset(self.sm.revision());
        // The holders it knew of may be gone: count afresh.
        self.locks = Default::default();
        match self.role {
            Role::Leader => self.lead(now),
            Role::Follower { serving: true, .. } => {
                // The changes the snapshot passed over fired no watch here:
                // the clients this follower serves resume, and set their
                // watches again from the last revision they saw (a change
                // they missed fires at once).
                self.close_all(&(ErrorCode::NotLeader, String::new()));
            }
            Role::Follower { serving: false, .. } => {}
        }
    }
}

fn too_many_watches(session: SessionId, held: usize, wanted: usize, budget: usize) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::TooManyWatches,
        format!(
            "session {session} holds watches counting {held} bytes; {wanted} more would pass the server's limit of {budget} bytes per session (--max-watch-bytes); remove watches or let them fire first"
        ),
    )
}

fn no_node(path: &str) -> ErrorReply {
    ErrorReply::new(ErrorCode::NoNode, format!("{path} does not exist"))
}

/// An operation's outcome in a transaction's answer.
fn txn_result(outcome: Outcome) -> TxnResult {
    match outcome {
        Outcome::Created {
            path,
            sequence,
            stat,
        } => TxnResult::Created {
            path: path.to_string(),
            sequence,
            stat,
        },
        Outcome::Deleted => TxnResult::Deleted,
        Outcome::DataSet(stat) => TxnResult::DataSet(stat),
        Outcome::Checked => TxnResult::Checked,
        other => unreachable!("a transaction's operation does not give {other:?}"),
    }
}
