//! What comes back to a client: replies, events, a lost session, and the
//! operations settled by them.

use baton_chaos::history::{Call, Outcome, Reply as Said};
use baton_proto::{Check, ErrorCode, EventKind, Reply, Request, ServerMessage, TxnOp};
use bytes::Bytes;

use super::{
    value_of, write_call, Client, InFlight, Kind, Lock, Purpose, Watched, COUNTER, LOCK, QUEUE,
    RESOURCE,
};
use crate::sim::{Down, Env, RUN_US, SESSION_MS};

impl Client {
    /// A message from the server on connection `gen`.
    pub fn receive(&mut self, w: &mut impl Env, c: usize, gen: u64, down: Down) {
        if w.now_us() < self.paused_until {
            self.inbox.push((gen, down));
            return;
        }
        if self.conn.as_ref().is_none_or(|conn| conn.gen != gen) {
            return; // an old connection's
        }
        self.last_heard_us = w.now_us();
        self.unanswered_since = None;
        match down {
            Down::Closed => self.conn = None,
            Down::Connected(Ok(grant)) => {
                if !grant.resumed && self.session.is_some() {
                    self.session_lost(w);
                }
                self.session = Some((grant.session_id, grant.secret));
                if let Some(conn) = self.conn.as_mut() {
                    conn.open = true;
                    self.answered_sent_us = self.answered_sent_us.max(conn.sent_us);
                }
                // Nothing sent on the old connection will be answered.
                self.sent_at.clear();
                self.asks.clear();
                for state in self.watched.values_mut() {
                    *state = Watched::Unasked;
                }
                // The request in flight, again with its xid; the queue
                // watch, again.
                if let Some(op) = self.op.clone() {
                    self.send_op(w, c, &op);
                }
                if let Lock::Waiting { node, .. } = &self.lock {
                    let request = Request::SetWatches {
                        revision: self.revision,
                        data: Vec::new(),
                        exist: Vec::new(),
                        child: Vec::new(),
                        queue: vec![(node.clone(), false)],
                    };
                    self.send_untracked(w, c, request);
                }
            }
            Down::Connected(Err((code, _))) => {
                self.conn = None;
                if code == ErrorCode::SessionExpired {
                    self.session_lost(w);
                    self.session = None;
                }
            }
            Down::Frames(frames) => {
                for frame in frames {
                    match frame {
                        ServerMessage::Reply(reply) => {
                            self.revision = self.revision.max(reply.revision);
                            // As the client library: only an answer that shows the
                            // session alive moves its deadline.
                            let alive = baton_proto::response::shows_session_alive(&reply.result);
                            if let Some(sent) = self.sent_at.remove(&reply.xid) {
                                if alive {
                                    self.answered_sent_us = self.answered_sent_us.max(sent);
                                }
                            }
                            if self.op.as_ref().is_some_and(|op| op.xid == reply.xid) {
                                let op = self.op.take().expect("just seen");
                                self.complete(w, c, op, reply.result);
                            } else if let Some((path, t)) = self.asks.remove(&reply.xid) {
                                self.asked(w, path, t, reply.result);
                            }
                        }
                        ServerMessage::Event(event) => {
                            self.revision = self.revision.max(event.revision);
                            self.event(w, event.kind, &event.path);
                        }
                        ServerMessage::Disconnect(notice) => {
                            self.conn = None;
                            if notice.code == ErrorCode::SessionExpired {
                                self.session_lost(w);
                                self.session = None;
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// An observer's answer about an ephemeral node.
    pub(super) fn asked(
        &mut self,
        w: &mut impl Env,
        path: String,
        t: u64,
        result: Result<Reply, baton_proto::ErrorReply>,
    ) {
        match result {
            Ok(Reply::Exists(None)) => {
                self.watched.remove(&path);
                let done = Outcome::Ok { reply: Said::Done };
                self.record(w, &path, Call::EphemeralGone, t, done);
            }
            Ok(Reply::Exists(Some(_))) => {
                self.watched.insert(path, Watched::Watching);
            }
            _ => {
                self.watched.insert(path, Watched::Unasked);
            }
        }
    }

    pub(super) fn event(&mut self, w: &mut impl Env, kind: EventKind, path: &str) {
        if self.kind == Kind::Observer {
            // Whatever happened to it, ask again.
            if let Some(state) = self.watched.get_mut(path) {
                *state = Watched::Unasked;
            }
            return;
        }
        let Lock::Waiting {
            node,
            token,
            invoked_ns,
        } = self.lock.clone()
        else {
            return;
        };
        if path != node {
            return;
        }
        match kind {
            EventKind::Head => {
                let said = Said::Token { token };
                self.record(
                    w,
                    LOCK,
                    Call::Acquire,
                    invoked_ns,
                    Outcome::Ok { reply: said },
                );
                self.lock = Lock::Holding { node, token };
            }
            EventKind::Deleted => {
                let why = "the node was deleted while it waited".to_string();
                self.record(w, LOCK, Call::Acquire, invoked_ns, Outcome::Fail { why });
                self.lock = Lock::Free;
            }
            _ => {}
        }
    }

    /// The session ended: what was in hand can no longer complete as
    /// asked.
    pub(super) fn session_lost(&mut self, w: &mut impl Env) {
        w.note(|| format!("client {} lost its session", self.process));
        if let Some((path, _)) = self.held.take() {
            // Its end began when it asked to close, or at the deadline its
            // own clock gave it, whichever came first.
            let deadline = self.answered_sent_us + u64::from(SESSION_MS) * 1_000;
            let began = self.close_sent_us.map_or(deadline, |t| t.min(deadline));
            let expired = self.close_sent_us.is_none_or(|t| t > deadline);
            let done = Outcome::Ok { reply: Said::Done };
            self.record(
                w,
                &path,
                Call::SessionEnded { expired },
                began * 1_000,
                done,
            );
        }
        self.close_sent_us = None;
        if let Some(op) = self.op.take() {
            self.settle_unknown(w, op, "the session ended with it in flight");
        }
        if let Lock::Waiting { invoked_ns, .. } = self.lock {
            let why = "the session ended while it waited".to_string();
            self.record(w, LOCK, Call::Acquire, invoked_ns, Outcome::Fail { why });
            self.lock = Lock::Free;
        }
        // A holder does not know yet: it writes with its token, and the
        // fence must refuse it.
    }

    /// An operation whose reply will not come: unknown, as far as anyone
    /// can tell (an enqueue whose answer is lost learnt no token).
    pub(super) fn settle_unknown(&mut self, w: &mut impl Env, op: InFlight, why: &str) {
        let unknown = Outcome::Unknown { why: why.into() };
        match op.purpose {
            Purpose::Read { key } => self.record(w, key, Call::Read, op.invoked_ns, unknown),
            Purpose::Write {
                key,
                value,
                version,
            } => {
                let call = write_call(value, version);
                self.record(w, key, call, op.invoked_ns, unknown);
            }
            Purpose::Enqueue => {
                let fail = Outcome::Fail { why: why.into() };
                self.record(w, LOCK, Call::Acquire, op.invoked_ns, fail);
            }
            Purpose::FencedWrite { token, value } => {
                self.record(
                    w,
                    RESOURCE,
                    Call::FencedWrite { token, value },
                    op.invoked_ns,
                    unknown,
                );
                if let Lock::Holding { node, token } = self.lock.clone() {
                    self.lock = Lock::Written { node, token };
                }
            }
            Purpose::Release { token } => {
                self.record(w, LOCK, Call::Release { token }, op.invoked_ns, unknown);
                self.lock = Lock::Free;
            }
            Purpose::CountRead { .. } => {
                let fail = Outcome::Fail {
                    why: "the read before the increment failed".into(),
                };
                self.record(w, COUNTER, Call::Increment, op.invoked_ns, fail);
            }
            Purpose::CountSet { .. } => {
                self.record(w, COUNTER, Call::Increment, op.invoked_ns, unknown)
            }
            Purpose::ReadCounter => {
                self.record(w, COUNTER, Call::ReadCounter, op.invoked_ns, unknown)
            }
            Purpose::Hold { path } => {
                self.record(w, &path, Call::HoldEphemeral, op.invoked_ns, unknown)
            }
            // Its end is recorded when the session is found gone.
            Purpose::Close => {}
            Purpose::Put { item } => {
                self.record(w, QUEUE, Call::Enqueue { item }, op.invoked_ns, unknown)
            }
            // A look that changed nothing.
            Purpose::List | Purpose::Peek { .. } => {}
            Purpose::Take { item } => {
                self.record(w, QUEUE, Call::Take { item }, op.invoked_ns, unknown)
            }
        }
    }

    pub(super) fn give_up_op(&mut self, w: &mut impl Env) {
        if let Some(op) = self.op.take() {
            self.settle_unknown(w, op, "no answer in time");
        }
    }

    /// At the end of the run: what is still in hand is unknown.
    pub fn give_up(&mut self, w: &mut impl Env) {
        self.give_up_op(w);
        let deadline = self.answered_sent_us + u64::from(SESSION_MS) * 1_000;
        if self.held.is_some() && w.now_us() >= deadline {
            self.session_lost(w);
        }
        if let Lock::Waiting { invoked_ns, .. } = self.lock {
            let why = "the run ended while it waited".to_string();
            self.record(w, LOCK, Call::Acquire, invoked_ns, Outcome::Fail { why });
        }
    }

    /// A reply to the operation in flight.
    pub(super) fn complete(
        &mut self,
        w: &mut impl Env,
        c: usize,
        op: InFlight,
        result: Result<Reply, baton_proto::ErrorReply>,
    ) {
        let t = op.invoked_ns;
        // An increment made as a transaction (a version check, then an
        // unconditional write) that failed is answered as its failing
        // operation would be alone.
        let result = match (&op.purpose, result) {
            (Purpose::CountSet { .. }, Ok(Reply::Multi(Err(failure)))) => Err(failure.error),
            (_, result) => result,
        };
        // An error the server answered: the request changed nothing, except
        // that a lost result says nothing either way.
        let refused = |e: &baton_proto::ErrorReply| match e.code {
            ErrorCode::BadVersion => Some(Outcome::Ok {
                reply: Said::CasRefused,
            }),
            ErrorCode::StaleFence => Some(Outcome::Ok { reply: Said::Stale }),
            ErrorCode::ResultLost => None,
            _ => Some(Outcome::Fail {
                why: e.message.clone(),
            }),
        };
        let unknown = |why: &str| Outcome::Unknown { why: why.into() };
        // A write's outcome: its new version, or why not.
        let written = |result: Result<Reply, baton_proto::ErrorReply>| match result {
            Ok(Reply::SetData(stat)) => Outcome::Ok {
                reply: Said::Written {
                    version: stat.version,
                },
            },
            Err(e) => refused(&e).unwrap_or_else(|| unknown(&e.message)),
            Ok(other) => panic!("a write answered {other:?}"),
        };
        match (op.purpose.clone(), result) {
            (Purpose::Read { key }, Ok(Reply::GetData { stat, data })) => {
                let reply = Said::Value {
                    value: value_of(&data),
                    version: stat.version,
                };
                self.record(w, key, Call::Read, t, Outcome::Ok { reply });
            }
            (Purpose::Read { key }, Err(e)) => {
                let outcome = refused(&e).unwrap_or_else(|| unknown(&e.message));
                self.record(w, key, Call::Read, t, outcome);
            }
            (
                Purpose::Write {
                    key,
                    value,
                    version,
                },
                result,
            ) => {
                let outcome = written(result);
                self.record(w, key, write_call(value, version), t, outcome);
            }
            (
                Purpose::Enqueue,
                Ok(Reply::Enqueue {
                    path,
                    sequence,
                    predecessor,
                    ..
                }),
            ) => {
                if predecessor.is_none() {
                    let reply = Said::Token { token: sequence };
                    self.record(w, LOCK, Call::Acquire, t, Outcome::Ok { reply });
                    self.lock = Lock::Holding {
                        node: path,
                        token: sequence,
                    };
                } else {
                    self.lock = Lock::Waiting {
                        node: path,
                        token: sequence,
                        invoked_ns: t,
                    };
                }
            }
            (Purpose::Enqueue, Err(e)) => {
                self.record(w, LOCK, Call::Acquire, t, Outcome::Fail { why: e.message });
            }
            (Purpose::FencedWrite { token, value }, result) => {
                let outcome = written(result);
                self.record(w, RESOURCE, Call::FencedWrite { token, value }, t, outcome);
                if let Lock::Holding { node, token } = self.lock.clone() {
                    self.lock = Lock::Written { node, token };
                }
            }
            (Purpose::Release { token }, result) => {
                let outcome = match result {
                    Ok(_) => Outcome::Ok { reply: Said::Done },
                    Err(e) => refused(&e).unwrap_or_else(|| unknown(&e.message)),
                };
                self.record(w, LOCK, Call::Release { token }, t, outcome);
                self.lock = Lock::Free;
            }
            (Purpose::ReadCounter, Ok(Reply::GetData { data, .. })) => {
                let reply = Said::Count {
                    count: value_of(&data),
                };
                self.record(w, COUNTER, Call::ReadCounter, t, Outcome::Ok { reply });
            }
            (Purpose::ReadCounter, Err(e)) => {
                let outcome = refused(&e).unwrap_or_else(|| unknown(&e.message));
                self.record(w, COUNTER, Call::ReadCounter, t, outcome);
            }
            (Purpose::CountRead { tries }, Ok(Reply::GetData { data, stat })) => {
                let data = Bytes::from(value_of(&data).wrapping_add(1).to_string());
                // Every other increment is a transaction: the same
                // compare-and-set, as a check and a write applied together.
                let request = if self.rng.chance(50) {
                    Request::Multi {
                        ops: vec![
                            TxnOp::Check {
                                path: COUNTER.into(),
                                check: Check::Version(stat.version),
                            },
                            TxnOp::SetData {
                                path: COUNTER.into(),
                                data,
                                version: None,
                                fence: None,
                            },
                        ],
                    }
                } else {
                    Request::SetData {
                        path: COUNTER.into(),
                        data,
                        version: Some(stat.version),
                        fence: None,
                    }
                };
                self.start(w, c, request, Purpose::CountSet { tries }, t);
            }
            (Purpose::CountRead { .. }, Err(e)) => {
                let why = format!("the read before the increment failed: {}", e.message);
                self.record(w, COUNTER, Call::Increment, t, Outcome::Fail { why });
            }
            (Purpose::CountSet { .. }, Ok(_)) => {
                self.record(
                    w,
                    COUNTER,
                    Call::Increment,
                    t,
                    Outcome::Ok { reply: Said::Done },
                );
            }
            (Purpose::CountSet { tries }, Err(e))
                if e.code == ErrorCode::BadVersion && tries < 20 =>
            {
                let request = Request::GetData {
                    path: COUNTER.into(),
                    watch: false,
                };
                self.start(w, c, request, Purpose::CountRead { tries: tries + 1 }, t);
            }
            (Purpose::CountSet { .. }, Err(e)) => {
                let outcome = match refused(&e) {
                    Some(Outcome::Ok { .. }) | None => unknown(&e.message),
                    Some(fail) => fail,
                };
                // Twenty refusals in a row: it gave up, certainly not applied.
                let outcome = if e.code == ErrorCode::BadVersion {
                    Outcome::Fail {
                        why: "every compare-and-set refused".into(),
                    }
                } else {
                    outcome
                };
                self.record(w, COUNTER, Call::Increment, t, outcome);
            }
            (Purpose::Hold { path }, result) => {
                let outcome = match result {
                    Ok(Reply::Create { .. }) => {
                        let until = w.now_us() + self.rng.between(50_000, 500_000);
                        self.held = Some((path.clone(), until));
                        w.ephemerals().push(path.clone());
                        Outcome::Ok { reply: Said::Done }
                    }
                    Err(e) => refused(&e).unwrap_or_else(|| unknown(&e.message)),
                    Ok(other) => panic!("a create answered {other:?}"),
                };
                self.record(w, &path, Call::HoldEphemeral, t, outcome);
            }
            (Purpose::Close, _) => {
                // Closed, or refused because the session is gone already:
                // either way it has ended.
                self.session_lost(w);
                self.session = None;
                self.conn = None;
            }
            (Purpose::Put { item }, result) => {
                let outcome = match result {
                    Ok(Reply::Create { .. }) => Outcome::Ok { reply: Said::Done },
                    Err(e) => refused(&e).unwrap_or_else(|| unknown(&e.message)),
                    Ok(other) => panic!("a create answered {other:?}"),
                };
                self.record(w, QUEUE, Call::Enqueue { item }, t, outcome);
            }
            (Purpose::List, Ok(Reply::GetChildren { mut children, .. })) => {
                children.sort();
                match children.first() {
                    None => {
                        let reply = Said::Empty;
                        self.record(w, QUEUE, Call::Dequeue, t, Outcome::Ok { reply });
                        if w.now_us() > RUN_US {
                            self.drained = true;
                        }
                    }
                    Some(head) => {
                        let path = format!("{QUEUE}/{head}");
                        let request = Request::GetData {
                            path: path.clone(),
                            watch: false,
                        };
                        self.start(w, c, request, Purpose::Peek { path }, w.now_ns());
                    }
                }
            }
            (Purpose::Peek { path }, Ok(Reply::GetData { data, .. })) => {
                let item = value_of(&data);
                let request = Request::Delete {
                    path,
                    version: None,
                    fence: None,
                };
                self.start(w, c, request, Purpose::Take { item }, w.now_ns());
            }
            // Taken by another worker meanwhile, or not answered: look again.
            (Purpose::List | Purpose::Peek { .. }, Err(_)) => {}
            (Purpose::Take { item }, result) => {
                let outcome = match result {
                    Ok(_) => Outcome::Ok { reply: Said::Done },
                    Err(e) => refused(&e).unwrap_or_else(|| unknown(&e.message)),
                };
                self.record(w, QUEUE, Call::Take { item }, t, outcome);
            }
            (purpose, result) => panic!("{purpose:?} answered {result:?}"),
        }
    }
}
