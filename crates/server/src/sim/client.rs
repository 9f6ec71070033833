//! The simulation's clients: each speaks the protocol as the client
//! library does (a session kept alive by heartbeats, resumed on a new
//! connection when one breaks, the request in flight sent again with its
//! xid, queue watches set again) and runs one recipe, recording every
//! operation as `baton chaos` does.

use std::collections::BTreeMap;

use baton_chaos::history::{Call, Op, Outcome, Reply as Said};
use baton_proto::{
    ConnectRequest, CreateMode, ErrorCode, EventKind, Reply, Request, RequestFrame, ServerMessage,
    SessionId, SessionSecret,
};
use bytes::Bytes;

use super::{Down, Env, Rng, Up, RUN_US, SESSION_MS};
use crate::state::{Command, StateMachine};

/// The registers, the counter, the lock and the resource its holders
/// write, the ephemeral nodes' parent and the queue.
pub const REGISTERS: [&str; 3] = ["/r0", "/r1", "/r2"];
pub const COUNTER: &str = "/counter";
pub const LOCK: &str = "/lock";
pub const RESOURCE: &str = "/res";
pub const EPHEMERALS: &str = "/eph";
pub const QUEUE: &str = "/queue";

/// How long an operation may go unanswered before its outcome counts as
/// unknown.
const OP_LIMIT_US: u64 = 3_000_000;
/// How long the server may be silent, with something outstanding, before
/// the connection counts as lost (as the client library's two thirds of the
/// session timeout).
const SILENCE_US: u64 = SESSION_MS as u64 * 1_000 * 2 / 3;

/// The state the simulation starts from: the nodes the recipes use.
pub fn initial_state() -> StateMachine {
    let mut sm = StateMachine::new();
    for path in REGISTERS.iter().chain(&[COUNTER, RESOURCE]) {
        sm.apply(&create(path, "0"), 0);
    }
    sm.apply(&create(LOCK, ""), 0);
    sm.apply(&create(EPHEMERALS, ""), 0);
    sm.apply(&create(QUEUE, ""), 0);
    sm
}

fn create(path: &str, data: &'static str) -> Command {
    Command::Create {
        session: SessionId(0),
        path: path.into(),
        data: Bytes::from_static(data.as_bytes()),
        mode: CreateMode::Persistent,
        fence: None,
    }
}

/// The clients of a run: two registers, three lock takers, two counters,
/// two ephemeral holders, their observer and two queue workers.
pub const KINDS: [Kind; 12] = [
    Kind::Register,
    Kind::Register,
    Kind::Fenced,
    Kind::Fenced,
    Kind::Fenced,
    Kind::Counter,
    Kind::Counter,
    Kind::Ephemeral,
    Kind::Ephemeral,
    Kind::Observer,
    Kind::Queue,
    Kind::Queue,
];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    #[default]
    Register,
    Fenced,
    Counter,
    /// Holds an ephemeral node in its session, then closes the session or
    /// falls silent past its timeout.
    Ephemeral,
    /// Watches every ephemeral node the holders made, and notes when it
    /// finds one gone.
    Observer,
    /// Puts items on a queue (sequential nodes) and takes the one at its
    /// head (a listing, a read of the head, its delete), as `baton chaos`'s
    /// queue workers do; once the run is over, takes until a listing finds
    /// the queue empty.
    Queue,
}

/// What a reply completes.
#[derive(Clone, Debug)]
enum Purpose {
    Read {
        key: &'static str,
    },
    Write {
        key: &'static str,
        value: u64,
        version: Option<u32>,
    },
    Enqueue,
    FencedWrite {
        token: u64,
        value: u64,
    },
    Release {
        token: u64,
    },
    /// The read of an increment's compare-and-set, try `tries`.
    CountRead {
        tries: u32,
    },
    CountSet {
        tries: u32,
    },
    ReadCounter,
    Hold {
        path: String,
    },
    Close,
    /// An item put on the queue.
    Put {
        item: u64,
    },
    /// A listing of the queue, to take its head.
    List,
    /// The read of the queue's head.
    Peek {
        path: String,
    },
    /// The delete of the queue's head: the item taken.
    Take {
        item: u64,
    },
}

/// The request awaiting its reply, and the operation it is part of.
#[derive(Clone, Debug)]
struct InFlight {
    xid: u32,
    request: Request,
    purpose: Purpose,
    /// When the operation began (an increment: its first read).
    invoked_ns: u64,
}

/// Where a fenced client's lock stands.
#[derive(Clone, Debug, Default)]
enum Lock {
    #[default]
    Free,
    /// Its node waits in the queue for the head event.
    Waiting {
        node: String,
        token: u64,
        invoked_ns: u64,
    },
    /// Granted (as far as it knows): write, then let go.
    Holding {
        node: String,
        token: u64,
    },
    Written {
        node: String,
        token: u64,
    },
}

/// Where an observer stands with one ephemeral node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watched {
    /// To be asked about (again).
    Unasked,
    Asked,
    /// It exists, and a watch on it is set.
    Watching,
}

#[derive(Clone, Debug)]
struct Conn {
    gen: u64,
    open: bool,
    sent_us: u64,
}

#[derive(Default)]
pub struct Client {
    process: u64,
    kind: Kind,
    rng: Rng,
    session: Option<(SessionId, SessionSecret)>,
    conn: Option<Conn>,
    next_gen: u64,
    next_xid: u32,
    op: Option<InFlight>,
    lock: Lock,
    last_heard_us: u64,
    last_sent_us: u64,
    /// The highest revision it has seen.
    revision: u64,
    paused_until: u64,
    /// The token it last paused holding (once per grant).
    paused_holding: u64,
    /// Since when it has waited for the server to answer anything it sent.
    unanswered_since: Option<u64>,
    /// When each request still unanswered was sent, by xid.
    sent_at: BTreeMap<u32, u64>,
    /// When the latest request the server answered was sent: the server
    /// heard the session no earlier, so it expires it no sooner than a
    /// session timeout after this.
    answered_sent_us: u64,
    /// An ephemeral holder's node, and until when it holds it.
    held: Option<(String, u64)>,
    /// When it asked to close its session, if it did.
    close_sent_us: Option<u64>,
    /// An observer: how many of the world's ephemeral nodes it knows of,
    /// and where each of those not yet seen gone stands.
    known: usize,
    watched: BTreeMap<String, Watched>,
    asks: BTreeMap<u32, (String, u64)>,
    /// What arrived while it was paused, for when it resumes.
    inbox: Vec<(u64, Down)>,
    /// A queue worker: whether a listing after the run found the queue
    /// empty.
    drained: bool,
}

impl Client {
    pub fn new(process: u64, kind: Kind, rng: Rng) -> Client {
        Client {
            process,
            kind,
            rng,
            next_xid: 1,
            ..Client::default()
        }
    }

    pub fn pause_until(&mut self, until: u64) {
        self.paused_until = self.paused_until.max(until);
    }

    fn record(&self, w: &mut impl Env, key: &str, call: Call, invoked_ns: u64, outcome: Outcome) {
        let id = w.unique();
        let completed_ns = w.now_ns().max(invoked_ns);
        w.note(|| format!("client {} {key} {call:?}: {outcome:?}", self.process));
        w.history().ops.push(Op {
            id,
            process: self.process,
            key: key.into(),
            call,
            invoked_ns,
            completed_ns,
            outcome,
        });
    }

    fn xid(&mut self) -> u32 {
        self.next_xid += 1;
        self.next_xid
    }

    /// Sends a request that nothing waits for (a heartbeat, watches set
    /// again).
    fn send_untracked(&mut self, w: &mut impl Env, c: usize, request: Request) {
        let Some(gen) = self.conn.as_ref().filter(|c| c.open).map(|c| c.gen) else {
            return;
        };
        let xid = self.xid();
        self.sent(w.now_us(), xid);
        if let Request::Exists { path, .. } = &request {
            self.asks.insert(xid, (path.clone(), w.now_ns()));
        }
        w.send_up(c, gen, Up::Request(RequestFrame { xid, request }));
    }

    /// Starts the request of an operation.
    fn start(
        &mut self,
        w: &mut impl Env,
        c: usize,
        request: Request,
        purpose: Purpose,
        invoked_ns: u64,
    ) {
        let xid = self.xid();
        let op = InFlight {
            xid,
            request,
            purpose,
            invoked_ns,
        };
        self.send_op(w, c, &op);
        self.op = Some(op);
    }

    fn send_op(&mut self, w: &mut impl Env, c: usize, op: &InFlight) {
        if let Some(conn) = self.conn.as_ref().filter(|c| c.open) {
            let gen = conn.gen;
            self.sent(w.now_us(), op.xid);
            w.send_up(
                c,
                gen,
                Up::Request(RequestFrame {
                    xid: op.xid,
                    request: op.request.clone(),
                }),
            );
        }
    }

    fn sent(&mut self, now: u64, xid: u32) {
        self.last_sent_us = now;
        self.unanswered_since.get_or_insert(now);
        self.sent_at.insert(xid, now);
    }

    /// Acts; returns when to act next (none: done).
    pub fn tick(&mut self, w: &mut impl Env, c: usize) -> Option<u64> {
        if w.now_us() < self.paused_until {
            return Some(self.paused_until - w.now_us());
        }
        // What came while it was paused, in order.
        for (gen, down) in std::mem::take(&mut self.inbox) {
            self.receive(w, c, gen, down);
        }
        let now = w.now_us();
        // Past the deadline its own clock gives the session (a timeout after
        // the latest request the server answered was sent), the session is
        // over as far as this client knows, as the client library tells it.
        if self.session.is_some() && now >= self.answered_sent_us + u64::from(SESSION_MS) * 1_000 {
            self.session_lost(w);
            self.session = None;
            self.conn = None;
        }
        if let Some(op) = &self.op {
            if now.saturating_sub(op.invoked_ns / 1_000) > OP_LIMIT_US {
                self.give_up_op(w);
            }
        }
        match self.conn.clone() {
            None => {
                if now > RUN_US && self.op.is_none() && self.held.is_none() && !self.draining() {
                    return None;
                }
                self.next_gen += 1;
                let gen = self.next_gen;
                self.conn = Some(Conn {
                    gen,
                    open: false,
                    sent_us: now,
                });
                let mut request = ConnectRequest::new(SESSION_MS);
                request.resume = self.session;
                w.send_up(c, gen, Up::Connect(request));
                Some(self.rng.between(5_000, 30_000))
            }
            Some(conn) if !conn.open => {
                if now - conn.sent_us > SILENCE_US {
                    self.conn = None; // no answer: try again
                }
                Some(self.rng.between(5_000, 30_000))
            }
            Some(_) => {
                if self.unanswered_since.is_some_and(|t| now - t > SILENCE_US) {
                    // The server fell silent: another connection.
                    w.note(|| format!("client {} gives up on its connection", self.process));
                    self.conn = None;
                    self.unanswered_since = None;
                    return Some(self.rng.between(1_000, 20_000));
                }
                if self.op.is_none()
                    && (now <= RUN_US || self.kind == Kind::Observer || self.draining())
                {
                    self.next_op(w, c);
                    if w.now_us() < self.paused_until {
                        return Some(self.paused_until - w.now_us());
                    }
                }
                if now.saturating_sub(self.last_sent_us) > u64::from(SESSION_MS) * 1_000 / 3 {
                    self.send_untracked(w, c, Request::Ping);
                }
                let watching = self.kind == Kind::Observer && !self.watched.is_empty();
                if now > RUN_US
                    && self.op.is_none()
                    && matches!(self.lock, Lock::Free)
                    && self.held.is_none()
                    && !watching
                    && !self.draining()
                {
                    return None;
                }
                Some(self.rng.between(1_000, 25_000))
            }
        }
    }

    /// A queue worker whose run is over and which has not yet found the
    /// queue empty.
    fn draining(&self) -> bool {
        self.kind == Kind::Queue && !self.drained
    }

    /// The next step of the recipe, if it has one to take now.
    fn next_op(&mut self, w: &mut impl Env, c: usize) {
        let now_ns = w.now_ns();
        match self.kind {
            Kind::Queue if w.now_us() <= RUN_US && self.rng.chance(50) => {
                let item = w.unique();
                let request = Request::Create {
                    path: format!("{QUEUE}/q-"),
                    data: Bytes::from(item.to_string()),
                    mode: CreateMode::PersistentSequential,
                    fence: None,
                };
                self.start(w, c, request, Purpose::Put { item }, now_ns);
            }
            Kind::Queue => {
                let request = Request::GetChildren {
                    path: QUEUE.into(),
                    watch: false,
                };
                self.start(w, c, request, Purpose::List, now_ns);
            }
            Kind::Register => {
                let key = REGISTERS[self.rng.below(3) as usize];
                let roll = self.rng.below(10);
                if roll < 4 {
                    let request = Request::GetData {
                        path: key.into(),
                        watch: false,
                    };
                    self.start(w, c, request, Purpose::Read { key }, now_ns);
                } else {
                    let value = w.unique();
                    let version = (roll >= 7).then(|| self.rng.below(4) as u32);
                    let request = Request::SetData {
                        path: key.into(),
                        data: Bytes::from(value.to_string()),
                        version,
                        fence: None,
                    };
                    self.start(
                        w,
                        c,
                        request,
                        Purpose::Write {
                            key,
                            value,
                            version,
                        },
                        now_ns,
                    );
                }
            }
            Kind::Counter if self.process.is_multiple_of(2) => {
                let request = Request::GetData {
                    path: COUNTER.into(),
                    watch: false,
                };
                self.start(w, c, request, Purpose::ReadCounter, now_ns);
            }
            Kind::Counter => {
                let request = Request::GetData {
                    path: COUNTER.into(),
                    watch: false,
                };
                self.start(w, c, request, Purpose::CountRead { tries: 0 }, now_ns);
            }
            Kind::Ephemeral => match self.held.clone() {
                None => {
                    let path = format!("{EPHEMERALS}/p{}-{}", self.process, w.unique());
                    let request = Request::Create {
                        path: path.clone(),
                        data: Bytes::new(),
                        mode: CreateMode::Ephemeral,
                        fence: None,
                    };
                    self.start(w, c, request, Purpose::Hold { path }, now_ns);
                }
                Some((_, until)) if w.now_us() < until => {}
                Some((path, _)) => {
                    if self.rng.chance(40) {
                        // Silent past its timeout: the server expires it.
                        let until = w.now_us() + self.rng.between(1_000_000, 3_000_000);
                        w.fault(format!(
                            "client {} falls silent holding {path} for {} ms",
                            self.process,
                            (until - w.now_us()) / 1_000
                        ));
                        self.held = Some((path, until + 10_000));
                        self.pause_until(until);
                    } else {
                        self.close_sent_us = Some(w.now_us());
                        self.start(w, c, Request::CloseSession, Purpose::Close, now_ns);
                    }
                }
            },
            Kind::Observer => {
                while self.known < w.ephemerals().len() {
                    self.watched
                        .insert(w.ephemerals()[self.known].clone(), Watched::Unasked);
                    self.known += 1;
                }
                let unasked: Vec<String> = self
                    .watched
                    .iter()
                    .filter(|(_, s)| **s == Watched::Unasked)
                    .map(|(p, _)| p.clone())
                    .collect();
                for path in unasked {
                    self.watched.insert(path.clone(), Watched::Asked);
                    self.send_untracked(w, c, Request::Exists { path, watch: true });
                }
            }
            Kind::Fenced => match self.lock.clone() {
                Lock::Free => {
                    let request = Request::Enqueue {
                        path: format!("{LOCK}/n"),
                        data: Bytes::new(),
                    };
                    self.start(w, c, request, Purpose::Enqueue, now_ns);
                }
                Lock::Waiting { .. } => {}
                Lock::Holding { token, .. } => {
                    // Sometimes its process stops here, past its session;
                    // the write comes after the pause, with the old token.
                    if self.paused_holding != token && self.rng.chance(15) {
                        self.paused_holding = token;
                        let until = w.now_us() + self.rng.between(200_000, 2_500_000);
                        w.fault(format!(
                            "client {} pauses holding token {token} for {} ms",
                            self.process,
                            (until - w.now_us()) / 1_000
                        ));
                        self.pause_until(until);
                        return;
                    }
                    let value = w.unique();
                    let request = Request::SetData {
                        path: RESOURCE.into(),
                        data: Bytes::from(value.to_string()),
                        version: None,
                        fence: Some(token),
                    };
                    self.start(w, c, request, Purpose::FencedWrite { token, value }, now_ns);
                }
                Lock::Written { node, token } => {
                    let request = Request::Delete {
                        path: node,
                        version: None,
                        fence: None,
                    };
                    self.start(w, c, request, Purpose::Release { token }, now_ns);
                }
            },
        }
    }

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
                            let alive = reply
                                .result
                                .as_ref()
                                .map_or_else(|e| e.code.shows_session_alive(), |_| true);
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
    fn asked(
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

    fn event(&mut self, w: &mut impl Env, kind: EventKind, path: &str) {
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
    fn session_lost(&mut self, w: &mut impl Env) {
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
    fn settle_unknown(&mut self, w: &mut impl Env, op: InFlight, why: &str) {
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

    fn give_up_op(&mut self, w: &mut impl Env) {
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
    fn complete(
        &mut self,
        w: &mut impl Env,
        c: usize,
        op: InFlight,
        result: Result<Reply, baton_proto::ErrorReply>,
    ) {
        let t = op.invoked_ns;
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
                let request = Request::SetData {
                    path: COUNTER.into(),
                    data: Bytes::from(value_of(&data).wrapping_add(1).to_string()),
                    version: Some(stat.version),
                    fence: None,
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

/// A register write's call: compare-and-set if it names a version.
fn write_call(value: u64, version: Option<u32>) -> Call {
    match version {
        Some(version) => Call::Cas { version, value },
        None => Call::Write { value },
    }
}

/// The number a node's data holds.
pub fn value_of(data: &[u8]) -> u64 {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

/// After the run: each register and the counter read from the final state,
/// so that nothing acknowledged can hide.
pub fn final_reads(w: &mut impl Env, sm: &StateMachine) {
    let reader = Client::new(1, Kind::Register, Rng::default());
    let t = w.now_ns();
    for key in REGISTERS {
        let node = sm.node(key).expect("registers are never deleted");
        let reply = Said::Value {
            value: value_of(&node.data()),
            version: node.stat().version,
        };
        reader.record(w, key, Call::Read, t, Outcome::Ok { reply });
    }
    let count = value_of(&sm.node(COUNTER).expect("the counter").data());
    let reply = Said::Count { count };
    reader.record(w, COUNTER, Call::ReadCounter, t, Outcome::Ok { reply });
}
