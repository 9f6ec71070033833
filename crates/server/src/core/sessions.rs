//! Sessions as this server sees them: handshakes, liveness and expiry, and
//! what changes when this server starts or stops leading.
//!
//! Only the server that serves clients (a single server, or a cluster's
//! leader) tracks when each session was last heard from; heartbeats are
//! never logged. Expiry is a change like any other, proposed when a session
//! has been silent for its whole timeout and applied everywhere at once. A
//! server that starts to lead gives every session a full, fresh timeout.

use std::sync::Arc;
use std::time::Duration;

use baton_proto::{
    ConnectRequest, ErrorCode, ErrorReply, Liveness, SessionGrant, SessionId, SessionSecret,
    SessionStatus, PROTOCOL_VERSION,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Core, Flow, Live, Now, Opening, Stamp};
use crate::outbox::Outbox;
use crate::replicate::Role;
use crate::state::{Applied, Command, Proposal};

/// A successful handshake.
#[derive(Debug)]
pub(crate) struct Connected {
    pub(crate) grant: SessionGrant,
    /// The answer may be sent once this revision is durable.
    pub(crate) revision: u64,
}

/// Where a handshake stands.
pub(crate) enum Connecting {
    Done(Connected),
    /// The new session is on its way through the replicated log.
    Pending(oneshot::Receiver<Result<Connected, (ErrorCode, String)>>),
}

fn expired(id: SessionId) -> (ErrorCode, String) {
    (
        ErrorCode::SessionExpired,
        format!("session {id} has expired or was closed; open a new session"),
    )
}

/// Stale entries (of containers that filled again) the queue of emptied
/// containers may hold beyond twice the live ones before it drops them.
pub(super) const STALE_EMPTIED: usize = 1024;

impl Core {
    /// `at` as the core keeps it per session.
    fn stamp(&self, at: Instant) -> Stamp {
        Stamp(at.saturating_duration_since(self.origin).as_nanos() as u64)
    }

    /// The time `stamp` stands for.
    fn instant(&self, stamp: Stamp) -> Instant {
        self.origin + Duration::from_nanos(stamp.0)
    }

    /// The earliest time a session may expire or, on the leader, a
    /// lock-delay tombstone is due, for the expiry timer.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let session = self.deadlines.first().map(|((t, _), ())| self.instant(*t));
        // Tombstones whose deletion is proposed already wait for that, not
        // for the timer (which would otherwise spin until it is applied).
        let tombstone = (self.role == Role::Leader)
            .then(|| {
                self.sm
                    .tombstones()
                    .filter(|(p, _)| !self.releasing.contains(*p))
                    .map(|(_, due)| due)
                    .min()
            })
            .flatten()
            .map(|due_ms| {
                let wait = due_ms.saturating_sub(self.now.wall_ms);
                self.now.at + Duration::from_millis(wait)
            });
        let container = self
            .emptied_order
            .front()
            .map(|(since, _)| *since + self.config.container_grace);
        [session, tombstone, container].into_iter().flatten().min()
    }

    /// On the leader, after a change to `path`'s children (or its
    /// deletion): notes when a container starts to stand empty, or that it
    /// no longer does.
    pub(super) fn container_changed(&mut self, path: &Arc<str>) {
        if self.role != Role::Leader || !self.sm.is_empty_container(path) {
            if !self.emptied.is_empty() {
                self.emptied.remove(path);
            }
        } else if !self.emptied.contains_key(path) {
            let now = self.now.at;
            self.emptied.insert(path.clone(), now);
            self.emptied_order.push_back((now, path.clone()));
            // A container that empties and fills again and again (the
            // parent of a lock's queue) leaves an entry each time, stale
            // once it fills: dropped here when they outnumber the live
            // ones, so that the queue stays within twice the containers
            // standing empty (and a few), however fast they change.
            if self.emptied_order.len() > 2 * self.emptied.len() + STALE_EMPTIED {
                // One entry per container standing empty, since it emptied
                // (several may carry the same time).
                let emptied = &self.emptied;
                let mut kept = std::collections::HashSet::new();
                self.emptied_order.retain(|(since, path)| {
                    emptied.get(path) == Some(since) && kept.insert(path.clone())
                });
            }
            self.expiry_wake.notify_one();
        }
    }

    /// On the leader: proposes the deletion of the containers that have
    /// stood empty for the container grace (each once).
    fn reap_empty_containers(&mut self) {
        if self.role != Role::Leader {
            return;
        }
        let grace = self.config.container_grace;
        while let Some((since, path)) = self.emptied_order.front().cloned() {
            if since + grace > self.now.at {
                break;
            }
            self.emptied_order.pop_front();
            if self.emptied.get(&path) != Some(&since) {
                continue; // stale: it had children again, or went
            }
            self.emptied.remove(&path);
            tracing::info!(%path, "deleting a container whose children are all gone");
            self.propose(Proposal {
                now_ms: self.now.wall_ms,
                origin: None,
                command: Command::DeleteContainer {
                    path: path.to_string(),
                },
            });
        }
    }

    /// Notes a session's deadline, waking the expiry timer if it is the
    /// earliest.
    fn add_deadline(&mut self, deadline: Instant, id: SessionId) {
        let deadline = self.stamp(deadline);
        if self
            .deadlines
            .first()
            .is_none_or(|((t, _), ())| deadline < *t)
        {
            self.expiry_wake.notify_one();
        }
        self.deadlines.insert((deadline, id), ());
    }

    /// Opens or resumes a session for a new connection, attaching it to
    /// `outbox`.
    pub(crate) fn connect(
        &mut self,
        req: &ConnectRequest,
        outbox: &Arc<Outbox>,
        now: Now,
    ) -> Result<Connecting, (ErrorCode, String)> {
        self.now = now;
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
        if !self.serves_clients() {
            return Err(self.not_leader_notice());
        }
        let revision = self.sm.revision();
        if req.last_seen > revision {
            // Serving the client would show it the state going back. A
            // member that is behind answers `not-leader` naming nobody, so
            // that the client tries the next member (a cluster member proves
            // it is up to date before it gets here, so this is a member
            // whose state went back, or a client that saw another cluster).
            tracing::info!(
                client_revision = req.last_seen,
                revision,
                "refusing a session: the client has seen a later revision than this server has applied; it must try another server"
            );
            return Err((ErrorCode::NotLeader, String::new()));
        }
        match req.resume {
            None => self.open(req, outbox),
            Some((id, secret)) => self
                .resume(id, secret, outbox, now.at)
                .map(Connecting::Done),
        }
    }

    fn open(
        &mut self,
        req: &ConnectRequest,
        outbox: &Arc<Outbox>,
    ) -> Result<Connecting, (ErrorCode, String)> {
        let timeout_ms = self.config.negotiate_timeout(req.timeout_ms);
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| {
            (
                ErrorCode::Internal,
                format!("no randomness for a session secret: {e}"),
            )
        })?;
        let secret = SessionSecret(secret);
        let (done, mut waiting) = oneshot::channel();
        self.opening.insert(
            secret,
            Opening {
                outbox: outbox.clone(),
                done,
            },
        );
        let proposal = Proposal {
            now_ms: self.now.wall_ms,
            origin: None,
            command: Command::OpenSession { timeout_ms, secret },
        };
        if let Some(Err(e)) = self.propose(proposal) {
            self.opening.remove(&secret);
            return Err((e.code, e.message));
        }
        // Opened at once (a single server), or later, when applied.
        Ok(match waiting.try_recv() {
            Ok(result) => Connecting::Done(result?),
            Err(_) => Connecting::Pending(waiting),
        })
    }

    /// A session was opened: the connection that asked for it (here, if it
    /// was asked here) gets it.
    pub(super) fn opened(
        &mut self,
        id: SessionId,
        secret: SessionSecret,
        timeout_ms: u32,
        revision: u64,
    ) {
        let now = self.now.at;
        let Some(Opening { outbox, done }) = self.opening.remove(&secret) else {
            // Asked elsewhere, or here by a handshake that gave up before it
            // was committed: the session lives with no connection, and the
            // leader must still see it expire.
            if self.role == Role::Leader && !self.live.contains_key(&id) {
                self.live.insert(id, Live::new(None, self.stamp(now)));
                self.add_deadline(now + Duration::from_millis(timeout_ms.into()), id);
            }
            return;
        };
        self.live
            .insert(id, Live::new(Some(outbox), self.stamp(now)));
        if self.role == Role::Leader {
            self.add_deadline(now + Duration::from_millis(timeout_ms.into()), id);
        }
        let _ = done.send(Ok(Connected {
            grant: SessionGrant {
                timeout_ms,
                session_id: id,
                secret,
                resumed: false,
                max_data: self.config.max_data as u32,
            },
            revision,
        }));
    }

    fn resume(
        &mut self,
        id: SessionId,
        secret: SessionSecret,
        outbox: &Arc<Outbox>,
        now: Instant,
    ) -> Result<Connected, (ErrorCode, String)> {
        let session = self.sm.session(id).ok_or_else(|| expired(id))?;
        if session.secret != secret {
            return Err((
                ErrorCode::SessionExpired,
                format!("wrong secret for session {id}; open a new session"),
            ));
        }
        if self.expiring.contains_key(&id) {
            return Err(expired(id));
        }
        let timeout_ms = session.timeout_ms;
        if self.role != Role::Leader && !self.live.contains_key(&id) {
            // A follower tracks only the sessions it serves: the leader
            // keeps the session alive, and has just heard of it (the
            // handshake's barrier told it).
            self.live.insert(id, Live::new(None, self.stamp(now)));
        }
        let heard = self.stamp(now);
        let live = self.live.get_mut(&id).ok_or_else(|| expired(id))?;
        live.last_heard = heard;
        // Replies owed to the old connection go with it: the client sends
        // those requests again.
        live.replies = None;
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
        self.persistent.remove_session(id);
        self.stats
            .metrics
            .sessions_resumed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Connected {
            grant: SessionGrant {
                timeout_ms,
                session_id: id,
                secret,
                resumed: true,
                max_data: self.config.max_data as u32,
            },
            revision: self.sm.revision(),
        })
    }

    /// A connection went away; its session lives on until it expires.
    pub(crate) fn detach(&mut self, id: SessionId, outbox: &Arc<Outbox>) {
        if let Some(live) = self.live.get_mut(&id) {
            if live.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, outbox)) {
                live.conn = None;
                live.replies = None;
                self.watches.remove_session(id);
                self.queues.remove_session(id);
                self.persistent.remove_session(id);
            }
        }
        // A handshake given up on before its session opened.
        self.opening.retain(|_, o| !Arc::ptr_eq(&o.outbox, outbox));
    }

    /// Records that `session` was heard from on `outbox`'s connection. Fails
    /// if the session has ended or its expiry is on its way (the request is
    /// answered, the connection closed) or moved to another connection.
    pub(super) fn touch(
        &mut self,
        session: SessionId,
        xid: u32,
        op: u8,
        outbox: &Arc<Outbox>,
        now: Instant,
    ) -> Result<(), Flow> {
        // A session whose expiry is proposed is as good as gone: answering
        // it as alive would move its client's deadline past the moment its
        // ephemerals (its place in a lock) go to someone else.
        let heard = self.stamp(now);
        let live = self
            .live
            .get_mut(&session)
            .filter(|_| !self.expiring.contains_key(&session));
        match live {
            Some(live) if live.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, outbox)) => {
                live.last_heard = heard;
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

    /// Whether `id` is alive as this server sees it, and for how long it has
    /// been silent.
    pub(super) fn session_status(&self, id: SessionId, now: Instant) -> SessionStatus {
        let (Some(session), Some(live)) = (self.sm.session(id), self.live.get(&id)) else {
            return SessionStatus {
                liveness: Liveness::Gone,
                silent_ms: 0,
                timeout_ms: 0,
            };
        };
        let liveness = if self.expiring.contains_key(&id) {
            Liveness::Expiring
        } else if live.conn.is_some() {
            Liveness::Connected
        } else {
            Liveness::Disconnected
        };
        SessionStatus {
            liveness,
            silent_ms: now
                .saturating_duration_since(self.instant(live.last_heard))
                .as_millis() as u64,
            timeout_ms: session.timeout_ms,
        }
    }

    /// A session ended (closed or expired): its watches go, the events of
    /// its ephemerals' deletion fire, and an expired session's connection is
    /// told and closed.
    pub(super) fn ended(&mut self, id: SessionId, command: &Command, applied: &Applied) {
        let timeout_ms = self.expiring.remove(&id);
        self.watches.remove_session(id);
        self.queues.remove_session(id);
        self.persistent.remove_session(id);
        self.dispatch(&applied.triggers, None);
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        if let (Command::ExpireSession { .. }, Some(conn)) = (command, live.conn) {
            let silence =
                timeout_ms.map_or_else(|| "its whole timeout".to_string(), |t| format!("{t} ms"));
            conn.close(
                Some((
                    ErrorCode::SessionExpired,
                    format!("session {id} expired: nothing heard from it for {silence}"),
                )),
                applied.revision,
            );
        }
    }

    /// Expires every session not heard from for its whole timeout as of
    /// `now`: proposes its expiry (applied at once on a single server).
    /// Returns how many were proposed.
    pub(crate) fn expire_due(&mut self, now: Now) -> usize {
        self.now = now;
        let now = self.stamp(now.at);
        let mut count = 0;
        while let Some((&(due, id), ())) = self.deadlines.first() {
            if due > now {
                break;
            }
            self.deadlines.pop_first();
            let (Some(live), Some(session)) = (self.live.get(&id), self.sm.session(id)) else {
                continue; // closed or expired already
            };
            let timeout_ms = session.timeout_ms;
            let deadline = live
                .last_heard
                .after(Duration::from_millis(timeout_ms.into()));
            if deadline > now {
                self.deadlines.insert((deadline, id), ());
                continue;
            }
            if self.expiring.insert(id, timeout_ms).is_some() {
                continue;
            }
            tracing::info!(session = %id, timeout_ms, "session expired");
            let proposal = Proposal {
                now_ms: self.now.wall_ms,
                origin: None,
                command: Command::ExpireSession { session: id },
            };
            self.propose(proposal);
            self.stats
                .sessions_expired
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            count += 1;
        }
        self.release_due_tombstones();
        self.reap_empty_containers();
        count
    }

    /// On the leader: proposes the deletion of the lock-delay tombstones
    /// that are due (each once), so that their queues move on.
    fn release_due_tombstones(&mut self) {
        if self.role != Role::Leader {
            return;
        }
        let now_ms = self.now.wall_ms;
        let sm = &self.sm;
        self.releasing.retain(|p| sm.tombstone_until(p).is_some());
        let due: Vec<Arc<str>> = self
            .sm
            .tombstones()
            .filter(|(p, until)| *until <= now_ms && !self.releasing.contains(*p))
            .map(|(p, _)| p.clone())
            .collect();
        for path in due {
            tracing::info!(%path, "lock-delay over: deleting the expired holder's node");
            self.releasing.insert(path.clone());
            self.propose(Proposal {
                now_ms,
                origin: None,
                command: Command::DeleteTombstone {
                    path: path.to_string(),
                },
            });
        }
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
        self.opening.clear();
    }

    /// This server now leads (it has proven it, and applied everything
    /// committed): it serves clients, and every session gets a full timeout
    /// from `now` to be heard from.
    pub(crate) fn lead(&mut self, now: Now) {
        self.now = now;
        let now = now.at;
        // Clients it served as a follower resume (here, or at the first
        // member of their list that answers: the notice names no leader):
        // what it kept for them was a follower's (no deadlines, replies
        // owed by another leader).
        self.close_all(&(ErrorCode::NotLeader, String::new()));
        self.role = Role::Leader;
        self.live.clear();
        self.deadlines.clear();
        self.expiring.clear();
        self.releasing.clear();
        let sessions: Vec<(SessionId, u32)> = self
            .sm
            .sessions()
            .map(|(id, s)| (id, s.timeout_ms))
            .collect();
        for (id, timeout_ms) in sessions {
            self.live.insert(id, Live::new(None, self.stamp(now)));
            self.add_deadline(now + Duration::from_millis(timeout_ms.into()), id);
        }
        if self.sm.tombstones().next().is_some() {
            // Lock-delays under way: the timer deletes their tombstones.
            self.expiry_wake.notify_one();
        }
        // Containers standing empty: their grace starts now.
        self.emptied.clear();
        self.emptied_order.clear();
        let empty: Vec<Arc<str>> = self.sm.empty_containers().cloned().collect();
        for path in empty {
            self.container_changed(&path);
        }
    }

    /// This server does not lead (any more), or the leader changed: every
    /// client connected now is sent to `leader` (its client address, if
    /// known), or, if `serving` (this member serves clients), told to
    /// resume, here or elsewhere; and what only a leader keeps goes.
    ///
    /// A change of leader ends the connections a follower serves too: the
    /// changes they forwarded to the old leader may never be applied, and
    /// their clients send them again once resumed.
    pub(crate) fn follow(&mut self, leader: Option<String>, serving: bool) {
        let serving = serving && leader.is_some();
        self.role = Role::Follower {
            leader: leader.clone(),
            serving,
        };
        let notice = if serving {
            (
                ErrorCode::NotLeader,
                String::new(), // no leader named: the client tries its list
            )
        } else {
            self.not_leader_notice()
        };
        self.close_all(&notice);
        self.live.clear();
        self.deadlines.clear();
        self.expiring.clear();
        self.releasing.clear();
        self.emptied.clear();
        self.emptied_order.clear();
        self.opening.clear();
        self.watches = Default::default();
        self.queues = Default::default();
    }

    /// Closes the connections of `sessions`, whose changes were lost on
    /// their way to the leader: their clients resume and send them again.
    pub(crate) fn lost(&mut self, sessions: &[SessionId]) {
        for id in sessions {
            if let Some(conn) = self.live.get(id).and_then(|l| l.conn.as_ref()) {
                conn.close(
                    Some((
                        ErrorCode::NotLeader,
                        String::new(), // no leader named: the client tries its list
                    )),
                    0,
                );
            }
        }
    }

    /// Closes every client connection with `notice`.
    pub(super) fn close_all(&self, notice: &(ErrorCode, String)) {
        for live in self.live.values() {
            if let Some(conn) = &live.conn {
                conn.close(Some(notice.clone()), 0);
            }
        }
    }

    /// Sessions attached to a connection of this server.
    pub(crate) fn attached_sessions(&self) -> usize {
        self.live.values().filter(|l| l.conn.is_some()).count()
    }

    /// Whether this server takes client sessions: it leads, or it is a
    /// follower that serves clients.
    pub(crate) fn serves_clients(&self) -> bool {
        matches!(
            self.role,
            Role::Leader | Role::Follower { serving: true, .. }
        )
    }

    /// On the leader: a follower heard from these sessions (it serves
    /// them), so they are as alive as if they had sent a request here.
    /// Returns those it could not count as heard: a session whose expiry
    /// is proposed stays expiring, and one that ended (or that this leader
    /// never opened) stays gone. The follower must not tell their clients
    /// that they are alive: a ping answered there would move the client's
    /// deadline past the moment this leader expires the session.
    ///
    /// # Errors
    /// [`NotLeading`](crate::replicate::NotLeading) if this server does not
    /// serve as the leader (none is counted).
    pub(crate) fn heard_elsewhere(
        &mut self,
        sessions: &[SessionId],
        now: Now,
    ) -> Result<Vec<SessionId>, crate::replicate::NotLeading> {
        self.now = now;
        if self.role != Role::Leader {
            return Err(crate::replicate::NotLeading);
        }
        let heard = self.stamp(now.at);
        let mut unheard = Vec::new();
        for id in sessions {
            let live = match self.live.get_mut(id) {
                Some(live) if !self.expiring.contains_key(id) => live,
                _ => {
                    unheard.push(*id);
                    continue;
                }
            };
            live.last_heard = heard;
        }
        Ok(unheard)
    }

    /// On the leader: proposes a change a follower forwarded for a client
    /// it serves, stamped with this server's clock; the follower answers it
    /// once applied. `Ok(false)`: refused, not proposed, because its session
    /// is not one this leader keeps alive: it ended, its expiry is proposed,
    /// or it was opened by a change this leader has not applied yet. The
    /// follower then closes the session's connection; its client resumes
    /// (or learns that the session is gone) and sends the change again.
    /// Fails if this server does not lead.
    pub(crate) fn forwarded(
        &mut self,
        mut proposal: Proposal,
        now: Now,
    ) -> Result<bool, crate::replicate::NotLeading> {
        self.now = now;
        if self.role != Role::Leader {
            return Err(crate::replicate::NotLeading);
        }
        if let Some(origin) = proposal.origin {
            if self.expiring.contains_key(&origin.session) {
                return Ok(false);
            }
            let heard = self.stamp(now.at);
            let Some(live) = self.live.get_mut(&origin.session) else {
                return Ok(false);
            };
            live.last_heard = heard;
        }
        proposal.now_ms = now.wall_ms;
        match self.propose(proposal) {
            Some(Err(_)) => Err(crate::replicate::NotLeading),
            _ => Ok(true),
        }
    }

    /// What a client of a server that does not lead is told: `not-leader`,
    /// with the leader's client address as the message (empty if unknown).
    pub(crate) fn not_leader_notice(&self) -> (ErrorCode, String) {
        let leader = match &self.role {
            Role::Follower { leader, .. } => leader.clone().unwrap_or_default(),
            Role::Leader => String::new(),
        };
        (ErrorCode::NotLeader, leader)
    }
}
