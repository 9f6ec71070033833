//! The simulation's clients: each speaks the protocol as the client
//! library does (a session kept alive by heartbeats, resumed on a new
//! connection when one breaks, the request in flight sent again with its
//! xid, queue watches set again) and runs one recipe, recording every
//! operation as `baton chaos` does.
//!
//! - `choose.rs`: a client's next operation;
//! - `replies.rs`: what comes back, and the operations it settles.

mod choose;
mod replies;

use std::collections::BTreeMap;

use baton_chaos::history::{Call, Op, Outcome, Reply as Said};
use baton_proto::{ConnectRequest, CreateMode, Request, RequestFrame, SessionId, SessionSecret};
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
        acl: baton_proto::Acl::OPEN,
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
