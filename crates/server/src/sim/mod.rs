//! A deterministic simulation of a single server and the clients of its
//! recipes, from a seed.
//!
//! Everything runs on one thread, on a simulated clock, in an order the
//! seed decides: the server's core (the state machine, sessions, expiry,
//! watches, queue grants and the durability that gates every reply), a
//! write-ahead log that syncs at random moments, and clients that speak the
//! protocol: registers read, written and compare-and-set, a fenced lock
//! (join the queue, wait for the head event, write with the token, let go)
//! and a counter. Between them a network with delays, connections that
//! break, clients cut off for a while; the server crashes (losing what its
//! log had not synced, or not) and restarts from what its log kept; clients
//! pause past their session timeout. The history the clients record goes
//! to the same checkers as `baton chaos`.
//!
//! A seed runs in milliseconds, so a test runs thousands; a failing seed
//! runs again, alone and with its history printed, with
//! `BATON_SIM_SEED=<seed> cargo test -p baton-server --lib sim::one_seed -- --nocapture`.

pub mod client;
#[cfg(feature = "sim")]
pub mod door;
pub mod seeds;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_chaos::history::{Fault, History};
use baton_proto::{ConnectRequest, ErrorCode, RequestFrame, ServerMessage, SessionGrant};
use bytes::{Buf, BytesMut};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock::Now;
use crate::config::Config;
use crate::core::{Connecting, Core, With};
use crate::outbox::{Drained, Outbox};
use crate::persist::DurableMark;
use crate::replicate::{Proposed, Replicator, Role};
use crate::state::{Proposal, StateMachine};
use crate::stats::Stats;
use client::Client;

/// The wall-clock time the simulation starts at.
const WALL_BASE_MS: u64 = 1_700_000_000_000;
/// Every client's session timeout.
pub const SESSION_MS: u32 = 1_000;
/// How long a simulation runs, in simulated time.
pub const RUN_US: u64 = 4_000_000;

/// Choices, from the seed (SplitMix64).
#[derive(Clone, Debug, Default)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n` (0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// In `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// Another stream of choices, apart from this one.
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}

/// The server's write-ahead log: every change applied, in order, and how
/// many of them are synced.
#[derive(Default)]
struct Log {
    entries: Mutex<Vec<(u64, Proposal)>>,
}

impl Replicator for Log {
    fn propose(&self, _: &Proposal) -> Proposed {
        Proposed::ApplyNow
    }

    fn logged(&self, revision: u64, proposal: &Proposal, _: &StateMachine) {
        lock(&self.entries).push((revision, proposal.clone()));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A message from a client to the server.
#[derive(Debug)]
pub enum Up {
    Connect(ConnectRequest),
    Request(RequestFrame),
}

/// What reaches a client from the server.
#[derive(Debug)]
pub enum Down {
    /// The answer to its handshake.
    Connected(Result<SessionGrant, (ErrorCode, String)>),
    /// Replies and events, in order.
    Frames(Vec<ServerMessage>),
    /// The connection is gone (the server closed it, crashed, or the network
    /// broke it).
    Closed,
}

#[derive(Debug)]
enum Event {
    /// A client acts: its next operation, a heartbeat, a reconnection.
    Tick(usize),
    /// A client's message reaches the server, on connection `gen`.
    ToServer(usize, u64, Up),
    /// The server's answer reaches a client, on connection `gen`.
    ToClient(usize, u64, Down),
    /// The server looks for sessions to expire.
    Expire,
    /// The log syncs what it has written.
    Sync,
    /// The server crashes; with `lose`, what its log had not synced is lost.
    Crash {
        lose: bool,
    },
    Restart,
    /// The network breaks a client's connection.
    Break(usize),
    /// A client is cut off from the server (both ways) until `until`.
    Cut(usize, u64),
    /// A client's process stops (a long pause) until `until`.
    Pause(usize, u64),
}

/// What a run records: the clients' history (operations and faults), the
/// trace, if one is kept, and the ephemeral nodes the holders made (for the
/// observer).
#[derive(Debug, Default)]
pub struct Journal {
    pub history: History,
    pub trace: Vec<String>,
    pub ephemerals: Vec<String>,
    keep_trace: bool,
    /// The last value a write used.
    last_value: u64,
}

impl Journal {
    pub fn new(keep_trace: bool) -> Journal {
        Journal {
            keep_trace,
            last_value: 1,
            ..Journal::default()
        }
    }

    /// Whether the run keeps a trace.
    pub fn keep_trace(&self) -> bool {
        self.keep_trace
    }
}

/// What a simulated client sees of the world it runs in: the clock, the
/// network it sends on, and the journal it records in. The single server's
/// world and a cluster's both provide it, so the same clients run on each.
pub trait Env {
    /// Simulated microseconds since the run began.
    fn now_us(&self) -> u64;

    fn now_ns(&self) -> u64 {
        self.now_us() * 1_000
    }

    /// Client `c` sends `up` on its connection `gen`.
    fn send_up(&mut self, c: usize, gen: u64, up: Up);

    fn journal(&mut self) -> &mut Journal;

    /// A value no write has used.
    fn unique(&mut self) -> u64 {
        let journal = self.journal();
        journal.last_value += 1;
        journal.last_value
    }

    fn history(&mut self) -> &mut History {
        &mut self.journal().history
    }

    fn ephemerals(&mut self) -> &mut Vec<String> {
        &mut self.journal().ephemerals
    }

    /// Notes `what` in the trace, if one is kept.
    fn note(&mut self, what: impl FnOnce() -> String) {
        let now = self.now_us();
        let journal = self.journal();
        if journal.keep_trace {
            journal.trace.push(format!("{now:>9} us  {}", what()));
        }
    }

    /// Records a fault, in the history and the trace.
    fn fault(&mut self, what: String) {
        self.note(|| format!("fault: {what}"));
        let at_ns = self.now_ns();
        self.history().faults.push(Fault { at_ns, what });
    }
}

impl Env for World {
    fn now_us(&self) -> u64 {
        self.now_us
    }

    fn send_up(&mut self, c: usize, gen: u64, up: Up) {
        let at = self.arrival(c, true);
        self.at(at, Event::ToServer(c, gen, up));
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

/// The server's side of one client's connection.
struct Link {
    gen: u64,
    outbox: Arc<Outbox>,
    session: Option<baton_proto::SessionId>,
    /// The grant, until the revision that opened it is durable.
    handshake: Option<(SessionGrant, u64)>,
}

/// The simulated world: the server, its clients, the network and the clock.
pub struct World {
    rng: Rng,
    start: Instant,
    now_us: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Event>>,
    seq: u64,
    core: Option<Core>,
    /// The state before the first change the log holds.
    base: StateMachine,
    log: Arc<Log>,
    mark: Arc<DurableMark>,
    /// The highest revision the log has synced.
    synced: u64,
    links: BTreeMap<usize, Link>,
    clients: Vec<Client>,
    /// Per client: when the network lets its messages through again, and
    /// when the last message each way arrives (each way keeps its order).
    cut_until: Vec<u64>,
    up_last: Vec<u64>,
    down_last: Vec<u64>,
    pub journal: Journal,
    /// A defect put in on purpose, to show the checkers find it.
    pub(crate) defect: Option<Defect>,
}

/// Defects the simulation can put in the server, each of which must be
/// caught: they show that a clean run means something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// Replies leave before the log has synced the change they report.
    AnswerBeforeSync,
    /// Sessions expire half a timeout early.
    ExpireEarly,
}

impl World {
    pub fn new(seed: u64, keep_trace: bool) -> World {
        let mut rng = Rng::new(seed);
        let start = Instant::now();
        let mut world = World {
            rng: rng.fork(),
            start,
            now_us: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            seq: 0,
            core: None,
            base: client::initial_state(),
            log: Arc::new(Log::default()),
            mark: Arc::new(DurableMark::new(0)),
            synced: 0,
            links: BTreeMap::new(),
            clients: Vec::new(),
            cut_until: Vec::new(),
            up_last: Vec::new(),
            down_last: Vec::new(),
            journal: Journal::new(keep_trace),
            defect: None,
        };
        world.boot(world.base.clone());
        for (i, kind) in client::KINDS.into_iter().enumerate() {
            world
                .clients
                .push(Client::new(100 + i as u64, kind, rng.fork()));
            world.cut_until.push(0);
            world.up_last.push(0);
            world.down_last.push(0);
            let at = world.rng.between(0, 2_000);
            world.at(at, Event::Tick(i));
        }
        world.at(1_000, Event::Sync);
        world.plan_faults();
        world
    }

    /// The time now, on both clocks.
    pub(crate) fn now(&self) -> Now {
        Now {
            at: self.start + Duration::from_micros(self.now_us),
            wall_ms: WALL_BASE_MS + self.now_us / 1_000,
        }
    }

    fn at(&mut self, at_us: u64, event: Event) {
        self.seq += 1;
        let index = self.events.len();
        self.events.push(Some(event));
        self.queue.push(Reverse((at_us, self.seq, index)));
    }

    fn after(&mut self, us: u64, event: Event) {
        self.at(self.now_us + us, event);
    }

    /// Starts the server over `sm` (the state its log recovered).
    fn boot(&mut self, sm: StateMachine) {
        let config = Config {
            min_session_timeout: Duration::from_millis(u64::from(SESSION_MS)),
            ..Config::default()
        };
        self.synced = sm.revision();
        self.mark = Arc::new(DurableMark::new(self.synced));
        let with = With {
            config: Arc::new(config),
            stats: Arc::new(Stats::default()),
            mark: self.mark.clone(),
            expiry_wake: Arc::new(Notify::new()),
        };
        let now = self.now();
        self.core = Some(Core::new(sm, self.log.clone(), Role::Leader, with, now));
        self.schedule_expiry();
    }

    /// The faults of the run, chosen up front.
    fn plan_faults(&mut self) {
        let mut t = 0;
        loop {
            t += self.rng.between(50_000, 600_000);
            if t >= RUN_US - 500_000 {
                break;
            }
            let c = self.rng.below(self.clients.len() as u64) as usize;
            match self.rng.below(10) {
                0 | 1 => {
                    let lose = self.rng.chance(50);
                    self.at(t, Event::Crash { lose });
                    let down = self.rng.between(1_000, 300_000);
                    self.at(t + down, Event::Restart);
                    t += down;
                }
                2..=4 => self.at(t, Event::Break(c)),
                5 | 6 => {
                    let until = t + self.rng.between(50_000, 1_500_000);
                    self.at(t, Event::Cut(c, until));
                }
                _ => {
                    let until = t + self.rng.between(100_000, 2_500_000);
                    self.at(t, Event::Pause(c, until));
                }
            }
        }
    }

    fn schedule_expiry(&mut self) {
        let Some(core) = &self.core else { return };
        if let Some(due) = core.next_deadline() {
            let mut us = due.saturating_duration_since(self.start).as_micros() as u64;
            if self.defect == Some(Defect::ExpireEarly) {
                us = us.saturating_sub(u64::from(SESSION_MS) * 500);
            }
            self.at(us.max(self.now_us), Event::Expire);
        }
    }

    /// Runs until the end of the simulated time, then lets the clients
    /// finish what they have in hand.
    pub fn run(&mut self) {
        let end = RUN_US + 3_000_000;
        let mut steps = 0u64;
        while let Some(Reverse((at, _, index))) = self.queue.pop() {
            if at > end {
                break;
            }
            steps += 1;
            assert!(steps < 5_000_000, "the simulation does not settle");
            self.now_us = at;
            let event = self.events[index].take().expect("each event once");
            self.step(event);
            self.deliver();
        }
        self.finish();
    }

    fn step(&mut self, event: Event) {
        match event {
            Event::Tick(c) => {
                let mut client = std::mem::take(&mut self.clients[c]);
                let next = client.tick(self, c);
                self.clients[c] = client;
                if let Some(us) = next {
                    self.after(us, Event::Tick(c));
                }
            }
            Event::ToServer(c, gen, up) => self.at_server(c, gen, up),
            Event::ToClient(c, gen, down) => {
                let mut client = std::mem::take(&mut self.clients[c]);
                client.receive(self, c, gen, down);
                self.clients[c] = client;
            }
            Event::Expire => {
                let mut now = self.now();
                if self.defect == Some(Defect::ExpireEarly) {
                    now.at += Duration::from_millis(u64::from(SESSION_MS) / 2);
                }
                if let Some(core) = self.core.as_mut() {
                    let n = core.expire_due(now);
                    if n > 0 {
                        self.note(|| format!("{n} session(s) expired"));
                    }
                }
                self.schedule_expiry();
            }
            Event::Sync => {
                if self.core.is_some() {
                    let entries = lock(&self.log.entries);
                    let synced = entries.last().map_or(self.synced, |(r, _)| *r);
                    drop(entries);
                    self.synced = self.synced.max(synced);
                    self.mark.advance(self.synced);
                }
                let next = if self.rng.chance(10) {
                    self.rng.between(5_000, 60_000) // a slow disk
                } else {
                    self.rng.between(200, 3_000)
                };
                self.after(next, Event::Sync);
            }
            Event::Crash { lose } => {
                if self.core.take().is_none() {
                    return;
                }
                self.fault(format!(
                    "the server crashes{}",
                    if lose {
                        ", losing what its log had not synced"
                    } else {
                        ""
                    }
                ));
                let links = std::mem::take(&mut self.links);
                for (c, link) in links {
                    self.send_down(c, link.gen, Down::Closed);
                }
                let mut entries = lock(&self.log.entries);
                if lose {
                    let synced = self.synced;
                    entries.retain(|(r, _)| *r <= synced);
                }
            }
            Event::Restart => {
                if self.core.is_some() {
                    return;
                }
                // What the log kept, applied again in order.
                let mut sm = self.base.clone();
                for (revision, proposal) in lock(&self.log.entries).iter() {
                    let applied = sm.apply_proposal(proposal);
                    assert_eq!(
                        applied.revision, *revision,
                        "the log replays as it was applied"
                    );
                }
                let revision = sm.revision();
                self.fault(format!("the server restarts at revision {revision}"));
                self.boot(sm);
            }
            Event::Break(c) => {
                if let Some(link) = self.links.remove(&c) {
                    self.fault(format!("the network breaks client {c}'s connection"));
                    if let (Some(core), Some(session)) = (self.core.as_mut(), link.session) {
                        core.detach(session, &link.outbox);
                    }
                    self.send_down(c, link.gen, Down::Closed);
                }
            }
            Event::Cut(c, until) => {
                self.fault(format!(
                    "client {c} is cut off for {} ms",
                    (until - self.now_us) / 1_000
                ));
                self.cut_until[c] = self.cut_until[c].max(until);
            }
            Event::Pause(c, until) => {
                self.fault(format!(
                    "client {c} pauses for {} ms",
                    (until - self.now_us) / 1_000
                ));
                self.clients[c].pause_until(until);
            }
        }
    }

    /// When a message sent now on client `c`'s link arrives, keeping the
    /// order of the messages before it; `last` is that way's latest arrival.
    fn arrival(&mut self, c: usize, up: bool) -> u64 {
        let delay = if self.rng.chance(5) {
            self.rng.between(5_000, 80_000)
        } else {
            self.rng.between(50, 1_500)
        };
        let last = if up {
            self.up_last[c]
        } else {
            self.down_last[c]
        };
        let at = (self.now_us + delay).max(self.cut_until[c]).max(last);
        if up {
            self.up_last[c] = at;
        } else {
            self.down_last[c] = at;
        }
        at
    }

    fn send_down(&mut self, c: usize, gen: u64, down: Down) {
        let at = self.arrival(c, false);
        self.at(at, Event::ToClient(c, gen, down));
    }

    /// A client's message at the server.
    fn at_server(&mut self, c: usize, gen: u64, up: Up) {
        let now = self.now();
        let Some(core) = self.core.as_mut() else {
            return; // down: nobody reads it
        };
        match up {
            Up::Connect(request) => {
                // A new connection replaces the client's old one.
                if let Some(old) = self.links.remove(&c) {
                    if let Some(session) = old.session {
                        core.detach(session, &old.outbox);
                    }
                }
                let outbox = Outbox::new();
                match core.connect(&request, &outbox, now) {
                    Ok(Connecting::Done(connected)) => {
                        let session = connected.grant.session_id;
                        self.links.insert(
                            c,
                            Link {
                                gen,
                                outbox,
                                session: Some(session),
                                handshake: Some((connected.grant, connected.revision)),
                            },
                        );
                    }
                    Ok(Connecting::Pending(_)) => unreachable!("a single server opens at once"),
                    Err(refused) => self.send_down(c, gen, Down::Connected(Err(refused))),
                }
            }
            Up::Request(frame) => {
                let Some(link) = self.links.get(&c).filter(|l| l.gen == gen) else {
                    return; // the connection is gone
                };
                let (Some(session), None) = (link.session, &link.handshake) else {
                    return;
                };
                // A request that stops the connection (a close) has its
                // outbox closed; the connection goes once that is drained.
                let outbox = link.outbox.clone();
                core.handle(session, frame, &outbox, None, now);
            }
        }
        self.schedule_expiry();
    }

    /// Sends every connection what its outbox holds that is durable, and
    /// each handshake whose session is durable.
    fn deliver(&mut self) {
        let synced = if self.defect == Some(Defect::AnswerBeforeSync) {
            u64::MAX
        } else {
            self.synced
        };
        let mut sends = Vec::new();
        let mut gone = Vec::new();
        for (c, link) in self.links.iter_mut() {
            if let Some((grant, revision)) = link.handshake.clone() {
                if revision > synced {
                    continue;
                }
                link.handshake = None;
                sends.push((*c, link.gen, Down::Connected(Ok(grant))));
            }
            let mut buf = BytesMut::new();
            let drained = link.outbox.drain_into(&mut buf, usize::MAX, synced);
            let frames = frames_of(&mut buf);
            if !frames.is_empty() {
                sends.push((*c, link.gen, Down::Frames(frames)));
            }
            match drained {
                Drained::Close | Drained::Overflowed => gone.push(*c),
                _ => {}
            }
        }
        for (c, gen, down) in sends {
            self.send_down(c, gen, down);
        }
        for c in gone {
            if let Some(link) = self.links.remove(&c) {
                if let (Some(core), Some(session)) = (self.core.as_mut(), link.session) {
                    core.detach(session, &link.outbox);
                }
                self.send_down(c, link.gen, Down::Closed);
            }
        }
    }

    /// After the run: every client records what it still had in hand, and
    /// one last read of each register and of the counter.
    fn finish(&mut self) {
        let clients = std::mem::take(&mut self.clients);
        for mut client in clients {
            client.give_up(self);
        }
        if self.core.is_none() {
            self.step(Event::Restart);
        }
        let sm = self.core.as_ref().expect("up").state();
        client::final_reads(self, &sm);
    }
}

/// The whole frames in `buf`, decoded.
fn frames_of(buf: &mut BytesMut) -> Vec<ServerMessage> {
    let mut frames = Vec::new();
    while buf.len() >= 4 {
        let len = (&buf[..4]).get_u32() as usize;
        buf.advance(4);
        let payload = buf.split_to(len).freeze();
        frames.push(ServerMessage::decode(payload).expect("the server encodes what it decodes"));
    }
    frames
}

/// Runs `seed` and checks its history; the findings that break a promise.
pub fn run_seed(seed: u64, keep_trace: bool) -> (World, Vec<baton_chaos::Finding>) {
    run_seed_with(seed, keep_trace, None)
}

/// [`run_seed`], with `defect` put in the server.
pub fn run_seed_with(
    seed: u64,
    keep_trace: bool,
    defect: Option<Defect>,
) -> (World, Vec<baton_chaos::Finding>) {
    let mut world = World::new(seed, keep_trace);
    world.defect = defect;
    world.run();
    let findings = baton_chaos::check(&world.journal.history)
        .into_iter()
        .filter(|f| f.verdict == baton_chaos::Verdict::Violation)
        .collect();
    (world, findings)
}

#[cfg(test)]
mod tests;
