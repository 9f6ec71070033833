//! The server's shared core: the state machine plus what only this server
//! knows about its sessions (their connections, when each was last heard
//! from) and their watches. One mutex guards it all; nothing in here awaits.
//!
//! Replies and watch events are pushed to connection outboxes while the lock
//! is held. That single order is what keeps invariant 7 of docs/design.md: an event is
//! queued the moment its change is applied, so it is ahead of the reply to any
//! request applied later, on every connection.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_proto::{
    path, ConnectRequest, ErrorCode, ErrorReply, EventKind, PredecessorWatch, Reply, Request,
    RequestFrame, SessionGrant, SessionId, SessionSecret, PROTOCOL_VERSION,
};
use tokio::time::Instant;

use crate::config::Config;
use crate::outbox::{Out, Outbox};
use crate::persist::{DurableMark, Wal};
use crate::queues::QueueWatches;
use crate::state::{Command, Origin, Outcome, Proposal, StateMachine, Trigger};
use crate::stats::{Stats, StatsSnapshot};
use crate::watches::{Kinds, Watches};

/// This server's view of a live session (its timeout is in the state).
struct Live {
    /// The connection the session is attached to, if any.
    conn: Option<Arc<Outbox>>,
    last_heard: Instant,
}

/// What a handled request means for its connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// The session ended or moved: read no more requests.
    Stop,
}

pub(crate) struct Core {
    sm: StateMachine,
    watches: Watches,
    queues: QueueWatches,
    /// Queue notifications of the change being dispatched (scratch).
    queue_events: Vec<(SessionId, EventKind, Arc<str>)>,
    live: HashMap<SessionId, Live>,
    /// Candidate expiry times. An entry may be stale (the session was heard
    /// from since); it is checked and pushed back when it comes due.
    deadlines: BTreeSet<(Instant, SessionId)>,
    config: Arc<Config>,
    stats: Arc<Stats>,
    fired: Vec<SessionId>,
    /// Set when the server stops: new handshakes are refused.
    shutting_down: bool,
    /// The log every applied change is appended to, if the server is durable.
    wal: Option<Wal>,
    /// How far the log is durable; frames wait for it.
    mark: Arc<DurableMark>,
}

/// A successful handshake.
pub(crate) struct Connected {
    pub(crate) grant: SessionGrant,
    /// The expiry timer must re-plan: this session's deadline is the earliest.
    pub(crate) replan: bool,
    /// The answer may be sent once this revision is durable.
    pub(crate) revision: u64,
}

fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn expired(id: SessionId) -> (ErrorCode, String) {
    (
        ErrorCode::SessionExpired,
        format!("session {id} has expired or was closed; open a new session"),
    )
}

impl Core {
    /// A core over a (possibly recovered) state. Every session in it gets a
    /// fresh full timeout from `now` to reconnect.
    pub(crate) fn new(
        sm: StateMachine,
        config: Arc<Config>,
        stats: Arc<Stats>,
        wal: Option<Wal>,
        mark: Arc<DurableMark>,
        now: Instant,
    ) -> Self {
        let mut live = HashMap::new();
        let mut deadlines = BTreeSet::new();
        for (id, session) in sm.sessions() {
            live.insert(
                id,
                Live {
                    conn: None,
                    last_heard: now,
                },
            );
            deadlines.insert((now + Duration::from_millis(session.timeout_ms.into()), id));
        }
        Core {
            sm,
            watches: Watches::default(),
            queues: QueueWatches::default(),
            queue_events: Vec::new(),
            live,
            deadlines,
            config,
            stats,
            fired: Vec::new(),
            shutting_down: false,
            wal,
            mark,
        }
    }

    /// Applies a command (answering the request `origin`, if any) and, if it
    /// changed the state, logs it.
    fn apply(&mut self, origin: Option<Origin>, command: Command) -> crate::state::Applied {
        let proposal = Proposal {
            now_ms: wall_clock_ms(),
            origin,
            command,
        };
        let applied = self.sm.apply_proposal(&proposal);
        if applied.changed {
            if let Some(wal) = &self.wal {
                wal.append(applied.revision, &proposal);
                // Checked before the state is copied: while a snapshot runs
                // (or after the log failed) no copy is made.
                if wal.snapshot_wanted(self.config.snapshot_every_bytes) {
                    let started = std::time::Instant::now();
                    wal.snapshot(self.sm.clone());
                    let pause = started.elapsed().as_micros() as u64;
                    self.stats
                        .snapshot_pause_max_us
                        .fetch_max(pause, Ordering::Relaxed);
                }
            }
        }
        applied
    }

    /// Queues a frame for a connection; it leaves once its revision is
    /// durable, and the connection is woken then.
    fn push(&self, outbox: &Arc<Outbox>, out: Out) -> bool {
        let revision = out_revision(&out);
        let pushed = outbox.push(out, self.config.max_outbound_bytes);
        if pushed {
            self.mark.wake_at(revision, outbox);
        }
        pushed
    }

    /// Stops the log writer after it wrote what is queued.
    pub(crate) fn stop_log(&mut self) {
        if let Some(mut wal) = self.wal.take() {
            wal.stop();
        }
    }

    /// The earliest time a session may expire, for the expiry timer.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    /// Opens or resumes a session for a new connection, attaching it to
    /// `outbox`. Returns the grant and whether the expiry timer must re-plan.
    pub(crate) fn connect(
        &mut self,
        req: &ConnectRequest,
        outbox: &Arc<Outbox>,
        now: Instant,
    ) -> Result<Connected, (ErrorCode, String)> {
        if self.shutting_down {
            return Err((
                ErrorCode::ShuttingDown,
                "the server is shutting down; try a server that is up".into(),
            ));
        }
        if req.version != PROTOCOL_VERSION {
            return Err((
                ErrorCode::UnsupportedVersion,
                format!(
                    "client speaks protocol version {}, this server speaks {PROTOCOL_VERSION}",
                    req.version
                ),
            ));
        }
        let max_data = self.config.max_data as u32;
        match req.resume {
            None => {
                let timeout_ms = self.config.negotiate_timeout(req.timeout_ms);
                let mut secret = [0u8; 16];
                getrandom::fill(&mut secret).map_err(|e| {
                    (
                        ErrorCode::Internal,
                        format!("no randomness for a session secret: {e}"),
                    )
                })?;
                let secret = SessionSecret(secret);
                let applied = self.apply(None, Command::OpenSession { timeout_ms, secret });
                let Ok(Outcome::SessionOpened(id)) = applied.result else {
                    unreachable!("opening a session cannot fail");
                };
                let timeout = Duration::from_millis(timeout_ms.into());
                self.live.insert(
                    id,
                    Live {
                        conn: Some(outbox.clone()),
                        last_heard: now,
                    },
                );
                let deadline = now + timeout;
                let earlier = self.next_deadline().is_none_or(|t| deadline < t);
                self.deadlines.insert((deadline, id));
                Ok(Connected {
                    grant: SessionGrant {
                        timeout_ms,
                        session_id: id,
                        secret,
                        resumed: false,
                        max_data,
                    },
                    replan: earlier,
                    revision: applied.revision,
                })
            }
            Some((id, secret)) => {
                let session = self.sm.session(id).ok_or_else(|| expired(id))?;
                if session.secret != secret {
                    return Err((
                        ErrorCode::SessionExpired,
                        format!("wrong secret for session {id}; open a new session"),
                    ));
                }
                let timeout_ms = session.timeout_ms;
                let live = self.live.get_mut(&id).ok_or_else(|| expired(id))?;
                live.last_heard = now;
                if let Some(old) = live.conn.replace(outbox.clone()) {
                    old.close(
                        Some((
                            ErrorCode::SessionMoved,
                            format!("session {id} was resumed on another connection"),
                        )),
                        0,
                    );
                }
                // The client sets its watches again (set watches) on the new
                // connection, relative to the last revision it saw.
                self.watches.remove_session(id);
                self.queues.remove_session(id);
                Ok(Connected {
                    grant: SessionGrant {
                        timeout_ms,
                        session_id: id,
                        secret,
                        resumed: true,
                        max_data,
                    },
                    replan: false,
                    revision: self.sm.revision(),
                })
            }
        }
    }

    /// A connection went away; its session lives on until it expires.
    pub(crate) fn detach(&mut self, id: SessionId, outbox: &Arc<Outbox>) {
        if let Some(live) = self.live.get_mut(&id) {
            if live.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, outbox)) {
                live.conn = None;
                self.watches.remove_session(id);
                self.queues.remove_session(id);
            }
        }
    }

    /// Handles one request of `session` arriving on `outbox`'s connection:
    /// applies it, queues the events it fires and then its reply.
    pub(crate) fn handle(
        &mut self,
        session: SessionId,
        frame: RequestFrame,
        outbox: &Arc<Outbox>,
        now: Instant,
    ) -> Flow {
        let RequestFrame { xid, request } = frame;
        let op = request.op() as u8;
        if let Err(flow) = self.touch(session, xid, op, outbox, now) {
            return flow;
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let result = match request {
            Request::Create {
                path,
                data,
                mode,
                fence,
            } => self.check_size(&data).and_then(|()| {
                self.write(
                    Origin { session, xid },
                    Command::Create {
                        session,
                        path,
                        data,
                        mode,
                        fence,
                    },
                )
            }),
            Request::Delete {
                path,
                version,
                fence,
            } => self.write(
                Origin { session, xid },
                Command::Delete {
                    path,
                    version,
                    fence,
                },
            ),
            Request::SetData {
                path,
                data,
                version,
                fence,
            } => self.check_size(&data).and_then(|()| {
                self.write(
                    Origin { session, xid },
                    Command::SetData {
                        path,
                        data,
                        version,
                        fence,
                    },
                )
            }),
            Request::Predecessor { path, watch } => self.predecessor(session, &path, watch),
            Request::Enqueue { path, data } => self.check_size(&data).and_then(|()| {
                self.write(
                    Origin { session, xid },
                    Command::Enqueue {
                        session,
                        path,
                        data,
                    },
                )
            }),
            Request::CheckToken { path, token } => self
                .sm
                .child_created_at(&path, token)
                .map(|found| Reply::CheckToken(found.map(|(p, n)| (p.to_string(), n.stat())))),
            Request::RemoveWatches { path, data, child } => {
                let kinds = match (data, child) {
                    (true, true) => Kinds::DATA.union(Kinds::CHILD),
                    (true, false) => Kinds::DATA,
                    (false, true) => Kinds::CHILD,
                    (false, false) => Kinds::default(),
                };
                self.watches.remove(session, &path, kinds);
                Ok(Reply::RemoveWatches)
            }
            Request::Stats => Ok(Reply::Stats(
                self.stats_snapshot()
                    .counters()
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .collect(),
            )),
            Request::Exists { path, watch } => (if watch {
                self.watch(session, &path, Kinds::DATA)
            } else {
                Ok(())
            })
            .map(|()| Reply::Exists(self.sm.node(&path).map(|n| n.stat()))),
            Request::GetData { path, watch } => self.get_data(session, &path, watch),
            Request::GetChildren { path, watch } => self.get_children(session, &path, watch),
            Request::Ping => Ok(Reply::Ping),
            Request::SetWatches {
                revision,
                data,
                exist,
                child,
                queue,
            } => self
                .set_watches(session, outbox, revision, data, exist, child)
                .map(|()| {
                    self.set_queue_watches(session, outbox, queue);
                    Reply::SetWatches
                }),
            Request::CloseSession => {
                self.end_session(
                    session,
                    Some(Origin { session, xid }),
                    Command::CloseSession { session },
                    None,
                );
                self.reply(outbox, xid, op, Ok(Reply::CloseSession));
                outbox.close(None, 0);
                return Flow::Stop;
            }
        };
        self.reply(outbox, xid, op, result);
        Flow::Continue
    }

    /// Answers a request that could not be decoded but can be answered.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reject(
        &mut self,
        session: SessionId,
        xid: u32,
        op: u8,
        code: ErrorCode,
        message: String,
        outbox: &Arc<Outbox>,
        now: Instant,
    ) -> Flow {
        if let Err(flow) = self.touch(session, xid, op, outbox, now) {
            return flow;
        }
        self.reply(outbox, xid, op, Err(ErrorReply { code, message }));
        Flow::Continue
    }

    /// Records that `session` was heard from on `outbox`'s connection. Fails
    /// if the session has ended (the request is answered, the connection
    /// closed) or moved to another connection.
    fn touch(
        &mut self,
        session: SessionId,
        xid: u32,
        op: u8,
        outbox: &Arc<Outbox>,
        now: Instant,
    ) -> Result<(), Flow> {
        match self.live.get_mut(&session) {
            Some(live) if live.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, outbox)) => {
                live.last_heard = now;
                Ok(())
            }
            Some(_) => Err(Flow::Stop), // resumed on another connection
            None => {
                let (code, message) = expired(session);
                self.reply(outbox, xid, op, Err(ErrorReply { code, message }));
                outbox.close(Some(expired(session)), 0);
                Err(Flow::Stop)
            }
        }
    }

    /// Queues a reply. A reply too large to send becomes a
    /// `response-too-large` error of that request: the connection and the
    /// session go on.
    fn reply(&self, outbox: &Arc<Outbox>, xid: u32, op: u8, result: Result<Reply, ErrorReply>) {
        let mut out = Out::Reply {
            xid,
            op,
            revision: self.sm.revision(),
            result,
        };
        let size = out.wire_size();
        if size > self.max_reply() {
            if let Out::Reply { result, .. } = &mut out {
                *result = Err(self.too_large(size));
            }
        }
        self.push(outbox, out);
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

    fn check_size(&self, data: &[u8]) -> Result<(), ErrorReply> {
        if data.len() > self.config.max_data {
            return Err(ErrorReply::new(
                ErrorCode::ValueTooLarge,
                format!(
                    "data of {} bytes exceeds the server's limit of {} bytes",
                    data.len(),
                    self.config.max_data
                ),
            ));
        }
        Ok(())
    }

    /// Applies a change a request asked for, fires its watches, and
    /// answers: an enqueue also gets its queue watch.
    fn write(&mut self, origin: Origin, command: Command) -> Result<Reply, ErrorReply> {
        let applied = self.apply(Some(origin), command);
        self.dispatch(&applied.triggers, Some(origin.session));
        match applied.result? {
            Outcome::Created {
                path,
                sequence,
                stat,
            } => Ok(Reply::Create {
                path: path.to_string(),
                sequence,
                stat,
            }),
            Outcome::Enqueued {
                path,
                sequence,
                stat,
                ..
            } => self.queue_up(origin.session, &path, sequence, stat),
            Outcome::Deleted => Ok(Reply::Delete),
            Outcome::DataSet(stat) => Ok(Reply::SetData(stat)),
            Outcome::SessionOpened(_) | Outcome::SessionEnded { .. } => {
                unreachable!("requests do not open or end sessions through write")
            }
        }
    }

    fn get_data(
        &mut self,
        session: SessionId,
        path: &str,
        watch: bool,
    ) -> Result<Reply, ErrorReply> {
        let node = self.sm.node(path).ok_or_else(|| no_node(path))?;
        let reply = Reply::GetData {
            stat: node.stat(),
            data: node.data(),
        };
        if watch {
            self.watch(session, path, Kinds::DATA)?;
        }
        Ok(reply)
    }

    /// The node's predecessor among its siblings, with a watch if asked:
    /// looked up and watched in one step, so that its deletion cannot slip
    /// between the two.
    fn predecessor(
        &mut self,
        session: SessionId,
        path: &str,
        watch: PredecessorWatch,
    ) -> Result<Reply, ErrorReply> {
        let found = self
            .sm
            .predecessor(path)?
            .map(|(p, n)| (p.clone(), n.stat()));
        match watch {
            PredecessorWatch::None => {}
            PredecessorWatch::Predecessor => {
                if let Some((p, _)) = &found {
                    self.watch(session, p, Kinds::DATA)?;
                }
            }
            PredecessorWatch::Queue => {
                let (node, owner) = {
                    let (k, n) = self.sm.node_entry(path).ok_or_else(|| no_node(path))?;
                    (k.clone(), n.owner())
                };
                if owner != Some(session) {
                    return Err(ErrorReply::new(
                        ErrorCode::BadArguments,
                        format!("{path} is not an ephemeral node of this session; a queue watch is set on one's own place in a queue"),
                    ));
                }
                self.queues
                    .set(session, node, found.as_ref().map(|(p, _)| p.clone()));
            }
        }
        Ok(Reply::Predecessor(
            found.map(|(p, stat)| (p.to_string(), stat)),
        ))
    }

    /// Sets the queue watch of a node its session just enqueued (or, for an
    /// enqueue sent again, enqueued before) and answers with the node's
    /// predecessor as it is now, which is what the watch starts from.
    fn queue_up(
        &mut self,
        session: SessionId,
        path: &Arc<str>,
        sequence: u64,
        stat: baton_proto::Stat,
    ) -> Result<Reply, ErrorReply> {
        let (node, predecessor) = match self.sm.node_entry(path) {
            Some((k, n)) if n.owner() == Some(session) => (
                k.clone(),
                self.sm
                    .predecessor(path)?
                    .map(|(p, n)| (p.clone(), n.stat())),
            ),
            _ => {
                return Err(ErrorReply::new(
                    ErrorCode::NoNode,
                    format!("{path}, this session's place in the queue, was deleted since"),
                ))
            }
        };
        self.queues
            .set(session, node, predecessor.as_ref().map(|(p, _)| p.clone()));
        Ok(Reply::Enqueue {
            path: path.to_string(),
            sequence,
            stat,
            predecessor: predecessor.map(|(p, stat)| (p.to_string(), stat)),
        })
    }

    /// The counters and current sizes of this server.
    pub(crate) fn stats_snapshot(&self) -> StatsSnapshot {
        let mut snap = self.stats.snapshot();
        snap.sessions = self.sm.session_count() as u64;
        snap.nodes = self.sm.node_count() as u64;
        snap.watches = (self.watches.len() + self.queues.len()) as u64;
        snap.revision = self.sm.revision();
        snap
    }

    fn get_children(
        &mut self,
        session: SessionId,
        path: &str,
        watch: bool,
    ) -> Result<Reply, ErrorReply> {
        let node = self.sm.node(path).ok_or_else(|| no_node(path))?;
        // Checked before the list is built (and before a watch is set).
        let size: usize = node.children().map(|p| path::name(p).len() + 2).sum();
        if size + 1024 > self.max_reply() {
            return Err(ErrorReply::new(
                ErrorCode::ResponseTooLarge,
                format!(
                    "{path} has {} children; listing them takes {size} bytes, over the server's {} byte limit for one reply",
                    node.child_count(),
                    self.max_reply()
                ),
            ));
        }
        let reply = Reply::GetChildren {
            stat: node.stat(),
            children: node.child_names().into_iter().map(str::to_owned).collect(),
        };
        if watch {
            self.watch(session, path, Kinds::CHILD)?;
        }
        Ok(reply)
    }

    /// Sets a watch for `session`, within its budget of watch bytes.
    fn watch(&mut self, session: SessionId, path: &str, kind: Kinds) -> Result<(), ErrorReply> {
        let budget = self.config.max_watch_bytes;
        self.watches
            .add(session, path, kind, budget)
            .map_err(|over| too_many_watches(session, over.held, over.wanted, budget))
    }

    /// Sets again the watches a client held before it moved to this
    /// connection; a watch whose node changed after `since` fires at once.
    /// If all of them could take the session past its watch budget, none is
    /// set and the request fails.
    fn set_watches(
        &mut self,
        session: SessionId,
        outbox: &Arc<Outbox>,
        since: u64,
        data: Vec<String>,
        exist: Vec<String>,
        child: Vec<String>,
    ) -> Result<(), ErrorReply> {
        let budget = self.config.max_watch_bytes;
        let held = self.watches.bytes(session);
        let mut paths: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let wanted: usize = data
            .iter()
            .chain(&exist)
            .chain(&child)
            .filter(|p| !self.watches.watches(session, p) && paths.insert(p.as_str()))
            .map(|p| crate::watches::watch_cost(p))
            .sum();
        if held + wanted > budget {
            return Err(too_many_watches(session, held, wanted, budget));
        }
        let now_rev = self.sm.revision();
        let (limit, mark, stats) = (self.config.max_outbound_bytes, &self.mark, &self.stats);
        let fire = |kind: EventKind, revision: u64, path: String| {
            let event = Out::Event {
                kind,
                revision,
                path: Arc::from(path),
            };
            if outbox.push(event, limit) {
                stats.events.fetch_add(1, Ordering::Relaxed);
                mark.wake_at(revision, outbox);
            }
        };
        let mut deleted = std::collections::HashSet::new();
        for path in data {
            match self.sm.node(&path) {
                None => {
                    deleted.insert(path.clone());
                    fire(EventKind::Deleted, now_rev, path);
                }
                Some(n) if n.mzxid() > since => fire(EventKind::DataChanged, n.mzxid(), path),
                Some(_) => self
                    .watches
                    .add(session, &path, Kinds::DATA, budget)
                    .map_err(|o| too_many_watches(session, o.held, o.wanted, budget))?,
            }
        }
        for path in exist {
            match self.sm.node(&path) {
                Some(n) => fire(EventKind::Created, n.czxid(), path),
                None => self
                    .watches
                    .add(session, &path, Kinds::DATA, budget)
                    .map_err(|o| too_many_watches(session, o.held, o.wanted, budget))?,
            }
        }
        for path in child {
            match self.sm.node(&path) {
                // One event per session and path, as for a live deletion:
                // a data watch on the same path already reported it.
                None if deleted.contains(&path) => {}
                None => fire(EventKind::Deleted, now_rev, path),
                Some(n) if n.pzxid() > since => fire(EventKind::ChildrenChanged, n.pzxid(), path),
                Some(_) => self
                    .watches
                    .add(session, &path, Kinds::CHILD, budget)
                    .map_err(|o| too_many_watches(session, o.held, o.wanted, budget))?,
            }
        }
        Ok(())
    }

    /// Sets again the queue watches a client held before it moved to this
    /// connection: a node that is gone reports *deleted*, one that now heads
    /// its queue (and did not before) reports *head*.
    fn set_queue_watches(
        &mut self,
        session: SessionId,
        outbox: &Arc<Outbox>,
        queue: Vec<(String, bool)>,
    ) {
        let revision = self.sm.revision();
        for (path, headed) in queue {
            let owned = self
                .sm
                .node_entry(&path)
                .filter(|(_, n)| n.owner() == Some(session))
                .map(|(k, _)| k.clone());
            let Some(node) = owned else {
                self.notify(outbox, EventKind::Deleted, revision, Arc::from(path));
                continue;
            };
            let predecessor = self
                .sm
                .predecessor(&node)
                .expect("the node exists")
                .map(|(p, _)| p.clone());
            let heads = predecessor.is_none();
            self.queues.set(session, node.clone(), predecessor);
            if heads && !headed {
                self.notify(outbox, EventKind::Head, revision, node);
            }
        }
    }

    /// Queues one event for a connection, counting it if it was queued.
    fn notify(&self, conn: &Arc<Outbox>, kind: EventKind, revision: u64, path: Arc<str>) {
        let event = Out::Event {
            kind,
            revision,
            path,
        };
        if self.push(conn, event) {
            self.stats.events.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues the events a change made by `actor` fired, one per watching
    /// session (`actor` is `None` for a session's expiry or close).
    fn dispatch(&mut self, triggers: &[Trigger], actor: Option<SessionId>) {
        let revision = self.sm.revision();
        for trigger in triggers {
            if trigger.kind == EventKind::Deleted {
                self.queues
                    .on_deleted(&trigger.path, actor, &self.sm, &mut self.queue_events);
                for (session, kind, node) in std::mem::take(&mut self.queue_events) {
                    if let Some(conn) = self.live.get(&session).and_then(|l| l.conn.as_ref()) {
                        self.notify(conn, kind, revision, node);
                    }
                }
            }
            self.fired.clear();
            self.watches
                .fire(&trigger.path, trigger.kind, &mut self.fired);
            for session in &self.fired {
                let Some(conn) = self.live.get(session).and_then(|l| l.conn.as_ref()) else {
                    continue;
                };
                self.notify(conn, trigger.kind, revision, trigger.path.clone());
            }
        }
    }

    /// Ends a session (close or expiry): deletes its ephemerals in one step,
    /// fires their watches, and closes its connection with `notice`.
    fn end_session(
        &mut self,
        id: SessionId,
        origin: Option<Origin>,
        command: Command,
        notice: Option<(ErrorCode, String)>,
    ) {
        let applied = self.apply(origin, command);
        self.watches.remove_session(id);
        self.queues.remove_session(id);
        self.dispatch(&applied.triggers, None);
        if let Some(live) = self.live.remove(&id) {
            if let (Some(conn), Some(notice)) = (live.conn, notice) {
                conn.close(Some(notice), applied.revision);
            }
        }
    }

    /// Expires every session not heard from for its whole timeout as of
    /// `now`. Returns how many expired.
    pub(crate) fn expire_due(&mut self, now: Instant) -> usize {
        let mut count = 0;
        while let Some(&(due, id)) = self.deadlines.first() {
            if due > now {
                break;
            }
            self.deadlines.pop_first();
            let (Some(live), Some(session)) = (self.live.get(&id), self.sm.session(id)) else {
                continue; // closed or expired already
            };
            let timeout_ms = u64::from(session.timeout_ms);
            let deadline = live.last_heard + Duration::from_millis(timeout_ms);
            if deadline > now {
                self.deadlines.insert((deadline, id));
                continue;
            }
            tracing::info!(session = %id, timeout_ms, "session expired");
            self.end_session(
                id,
                None,
                Command::ExpireSession { session: id },
                Some((
                    ErrorCode::SessionExpired,
                    format!("session {id} expired: nothing heard from it for {timeout_ms} ms"),
                )),
            );
            self.stats.sessions_expired.fetch_add(1, Ordering::Relaxed);
            count += 1;
        }
        count
    }

    /// Tells every attached connection that the server is stopping, and
    /// refuses new sessions from now on.
    pub(crate) fn shutdown_connections(&mut self) {
        self.shutting_down = true;
        for live in self.live.values() {
            if let Some(conn) = &live.conn {
                conn.close(
                    Some((
                        ErrorCode::ShuttingDown,
                        "the server is shutting down; resume the session when it is back".into(),
                    )),
                    0,
                );
            }
        }
    }
}

fn out_revision(out: &Out) -> u64 {
    match out {
        Out::Reply { revision, .. } | Out::Event { revision, .. } => *revision,
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
