//! A simulation of a 3-member cluster and the clients of its recipes, from
//! a seed.
//!
//! Everything runs on one thread, on tokio's paused clock: three members,
//! each openraft itself with Baton's state machine store and member wiring
//! (the proposer, the batched read barriers, the leadership watch, and in
//! three seeds of four the followers that serve clients, whose calls to
//! the leader cross the simulated network) over a Baton server's core,
//! and the same twelve clients as the single server's
//! simulation (`baton_server::sim`), whose history goes to the same
//! checkers. What is simulated is around them: the network between members
//! (delays, lost messages, links cut one way or both, a member slowed past
//! the heartbeat), each member's disk (syncs at random moments; a crash
//! loses what was not synced, or not), the clients' links (delays, breaks,
//! cuts) and pauses, and the connection front end (`baton_server::sim::door`
//! keeps the rules of a member's connection task on channels). Members
//! crash, the leader often, two at once sometimes, and restart from what
//! their disks kept.
//!
//! The seed chooses every fault, delay and client action, and each member's
//! election timeout; a failing seed runs again, alone and with its trace,
//! with `BATON_SIM_SEED=<seed> cargo test -p baton-cluster --lib
//! sim::tests::one_seed -- --nocapture`.

mod disk;
mod net;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_proto::{ErrorCode, ServerMessage};
use baton_server::sim::client::{self, Client};
use baton_server::sim::{door, Down, Env, Journal, Rng, Up, RUN_US, SESSION_MS};
use baton_server::{Applier, Config, Server};
use openraft::ServerState;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};

use crate::admin::Status;
use crate::state_machine::StateMachineStore;
use crate::types::{Member, NodeId, Raft};
use disk::{Disk, SimLog};
use net::{Links, SimNetwork};

/// Members of the simulated cluster.
const MEMBERS: u64 = 3;
/// Heartbeats, as a member's default.
const HEARTBEAT_MS: u64 = 50;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
pub(crate) enum Event {
    /// A client acts.
    Tick(usize),
    /// A client's message reaches the member it is connected to.
    ToMember(usize, u64, Up),
    /// A member's message reaches a client.
    ToClient(usize, u64, Down),
    /// A member crashes; with `lose`, what its disk had not synced is
    /// lost.
    Crash {
        pick: Pick,
        lose: bool,
        down_us: u64,
    },
    Restart(usize),
    /// A member is cut off from the others, both ways or only what it sends.
    Isolate {
        pick: Pick,
        both: bool,
        for_us: u64,
    },
    /// Every message to and from a member is slowed past the heartbeat.
    Slow {
        pick: Pick,
        for_us: u64,
    },
    /// The network breaks a client's connection.
    Break(usize),
    /// A client is cut off from the members until `until`.
    Cut(usize, u64),
    /// A client's process stops until `until`.
    Pause(usize, u64),
    /// The leader is asked to add the observer, unless the membership
    /// names it already; asked again later until it does.
    AddObserver,
    /// The leader is asked to make the observer a voter, as `baton cluster
    /// add` without `--observer` does for an observer, once it holds the
    /// membership that added it; asked again later until it votes.
    Promote,
    /// The leader is asked to make one of the voters (itself, perhaps) an
    /// observer, as `baton cluster add --observer` does for a voter;
    /// asked again later until three vote.
    Demote,
}

/// Which member a fault strikes, chosen when it strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    /// The leader, if one is known.
    Leader,
    /// A member up that does not lead, if there is one.
    Follower,
    /// Any member up.
    Any,
}

/// The events to come, shared with the connection tasks (which send the
/// members' answers), and the clients' links.
struct Queue {
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Event>>,
    seq: u64,
    rng: Rng,
    start: Instant,
    /// Per client: when its link lets messages through again, and the
    /// latest arrival each way (each way keeps its order).
    cut_until: Vec<u64>,
    up_last: Vec<u64>,
    down_last: Vec<u64>,
}

impl Queue {
    fn now_us(&self) -> u64 {
        Instant::now().duration_since(self.start).as_micros() as u64
    }

    fn at(&mut self, at_us: u64, event: Event) {
        self.seq += 1;
        let index = self.events.len();
        self.events.push(Some(event));
        self.heap.push(Reverse((at_us, self.seq, index)));
    }

    /// When a message sent now on client `c`'s link arrives.
    fn arrival(&mut self, c: usize, up: bool) -> u64 {
        let delay = if self.rng.chance(5) {
            self.rng.between(5_000, 80_000)
        } else {
            self.rng.between(50, 1_500)
        };
        let now = self.now_us();
        let cut_until = self.cut_until[c];
        let last = if up {
            &mut self.up_last[c]
        } else {
            &mut self.down_last[c]
        };
        let at = (now + delay).max(cut_until).max(*last);
        *last = at;
        at
    }
}

type SharedQueue = Arc<(Mutex<Queue>, Notify)>;

/// One life of a member.
struct Running {
    raft: Raft,
    applier: Applier,
    stop: watch::Sender<bool>,
    server_stop: watch::Sender<bool>,
    server: JoinHandle<()>,
}

struct Node {
    id: NodeId,
    disk: Arc<Mutex<Disk>>,
    /// Its election timeout, from the seed.
    election_ms: u64,
    life: u64,
    run: Option<Running>,
}

/// A client's connection to a member.
struct Conn {
    gen: u64,
    member: usize,
    ups: mpsc::UnboundedSender<Up>,
    task: JoinHandle<()>,
}

/// The simulated cluster and its clients.
pub(crate) struct World {
    rng: Rng,
    queue: SharedQueue,
    start: Instant,
    nodes: Vec<Node>,
    links: net::Shared,
    clients: Vec<Client>,
    /// The member each client connects to next.
    target: Vec<usize>,
    conns: BTreeMap<usize, Conn>,
    pub(crate) journal: Journal,
    defect: Option<Defect>,
    /// Whether followers serve clients (their reads and watches from
    /// their own state, their changes and read barriers through the
    /// leader over the simulated network), as members do by default, or
    /// send them to the leader.
    followers_serve: bool,
    /// Whether the observer, once added, is made a voter and then one of
    /// the voters an observer (half the runs with an observer).
    reshape: bool,
    /// Why no member led once the faults had ended, if none did.
    stalled: Option<String>,
    /// The client whose every message a traced run shows
    /// (`BATON_SIM_CLIENT`: its number in the trace, such as 107).
    traced_client: Option<usize>,
}

/// Defects the simulation can put in the cluster, each of which must be
/// caught: they show that a clean run means something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Defect {
    /// A member tells its leader an entry is stored before its disk has
    /// synced it.
    StoredBeforeSync,
    /// A leader serves reads from its state without proving first that it
    /// still leads.
    ReadsWithoutBarrier,
}

impl Env for World {
    fn now_us(&self) -> u64 {
        Instant::now().duration_since(self.start).as_micros() as u64
    }

    fn send_up(&mut self, c: usize, gen: u64, up: Up) {
        let mut q = lock(&self.queue.0);
        let at = q.arrival(c, true);
        q.at(at, Event::ToMember(c, gen, up));
    }

    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

/// A member's client address, as the membership names it (and a
/// not-leader answer names the leader by).
fn address(id: NodeId) -> String {
    format!("member-{id}")
}

/// The observer's id, in a run with one.
const OBSERVER: NodeId = MEMBERS + 1;

/// Asks `raft` for membership change `change` (with `retain`, voters it
/// removes stay as learners) in a task of its own; a refusal (not the
/// leader, another change under way) is left for the next ask.
fn ask_for(raft: Raft, change: openraft::ChangeMembers<NodeId, Member>, retain: bool) {
    tokio::spawn(async move {
        let _ = raft.change_membership(change, retain).await;
    });
}

impl World {
    async fn new(seed: u64, keep_trace: bool, defect: Option<Defect>, observer: bool) -> World {
        let mut rng = Rng::new(seed);
        let start = Instant::now();
        let n = client::KINDS.len();
        let queue = Queue {
            heap: BinaryHeap::new(),
            events: Vec::new(),
            seq: 0,
            rng: rng.fork(),
            start,
            cut_until: vec![0; n],
            up_last: vec![0; n],
            down_last: vec![0; n],
        };
        let links = Links {
            up: BTreeMap::new(),
            cut: BTreeMap::new(),
            slow: BTreeMap::new(),
            rng: rng.fork(),
            start,
            loss: if rng.chance(50) { 0 } else { 50 },
        };
        let followers_serve = !rng.chance(4);
        let mut world = World {
            rng: rng.fork(),
            queue: Arc::new((Mutex::new(queue), Notify::new())),
            start,
            nodes: Vec::new(),
            links: Arc::new(Mutex::new(links)),
            clients: Vec::new(),
            target: Vec::new(),
            conns: BTreeMap::new(),
            journal: Journal::new(keep_trace),
            defect,
            followers_serve,
            reshape: false,
            stalled: None,
            traced_client: keep_trace
                .then(|| {
                    std::env::var("BATON_SIM_CLIENT")
                        .ok()?
                        .parse::<usize>()
                        .ok()
                })
                .flatten()
                .and_then(|process| process.checked_sub(100)),
        };
        world.fault(format!(
            "followers {}",
            if followers_serve {
                "serve clients"
            } else {
                "send clients to the leader"
            }
        ));
        for i in 0..MEMBERS as usize {
            let election_ms = world.rng.between(150, 300);
            let disk = Disk::new(defect == Some(Defect::StoredBeforeSync));
            world.nodes.push(Node {
                id: i as u64 + 1,
                disk: Arc::new(Mutex::new(disk)),
                election_ms,
                life: 0,
                run: None,
            });
        }
        if observer {
            // Not in the first membership: it waits, empty, to be added.
            world.nodes.push(Node {
                id: OBSERVER,
                disk: Arc::new(Mutex::new(Disk::new(
                    defect == Some(Defect::StoredBeforeSync),
                ))),
                election_ms: 300,
                life: 0,
                run: None,
            });
            world.fault(format!("member {OBSERVER} is to be added as an observer"));
            world.reshape = world.rng.chance(50);
            if world.reshape {
                world.fault(format!(
                    "member {OBSERVER} is then to vote, and a voter to become an observer"
                ));
            }
        }
        for node in &world.nodes {
            tokio::spawn(sync_now_and_then(node.disk.clone(), world.rng.fork()));
        }
        for i in 0..world.nodes.len() {
            world.boot(i, (i as u64) < MEMBERS).await;
        }
        if observer {
            let at = world.rng.between(50_000, 400_000);
            world.at(at, Event::AddObserver);
        }
        for (i, kind) in client::KINDS.into_iter().enumerate() {
            world
                .clients
                .push(Client::new(100 + i as u64, kind, rng.fork()));
            world
                .target
                .push(world.rng.below(world.nodes.len() as u64) as usize);
            let at = world.rng.between(0, 2_000);
            world.at(at, Event::Tick(i));
        }
        world
    }

    fn at(&self, at_us: u64, event: Event) {
        lock(&self.queue.0).at(at_us, event);
    }

    fn after(&self, us: u64, event: Event) {
        self.at(self.now_us() + us, event);
    }

    /// Starts member `m` over what its disk holds; a new cluster's members
    /// start it together.
    async fn boot(&mut self, m: usize, new_cluster: bool) {
        let node = &mut self.nodes[m];
        node.life += 1;
        let id = node.id;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let config = Config {
            min_session_timeout: Duration::from_millis(u64::from(SESSION_MS)),
            ..Config::default()
        };
        let (server, applier) = Server::member(listener, config).expect("a member's server");
        applier.install(client::initial_state());
        // The simulation takes no snapshots: none is ever read.
        let no_snapshots = std::env::temp_dir().join("baton-sim-takes-no-snapshots");
        let sm = StateMachineStore::open(&no_snapshots, applier.clone(), None)
            .expect("no snapshot to read");
        let raft_config = openraft::Config {
            cluster_name: "baton".into(),
            // One timeout per member, from the seed (openraft would draw
            // one from the thread's random numbers).
            election_timeout_min: node.election_ms,
            election_timeout_max: node.election_ms + 1,
            heartbeat_interval: HEARTBEAT_MS,
            install_snapshot_timeout: 10_000,
            max_payload_entries: 64,
            snapshot_policy: openraft::SnapshotPolicy::Never,
            ..Default::default()
        };
        let raft_config = Arc::new(raft_config.validate().expect("a valid configuration"));
        let network = SimNetwork {
            from: id,
            links: self.links.clone(),
        };
        let log = SimLog::open(node.disk.clone());
        let raft = Raft::new(id, raft_config, network, log, sm.clone())
            .await
            .expect("openraft starts");
        let (stop, stopped) = watch::channel(false);
        let status = Status::new(raft.clone(), id, None);
        let dialing = self.followers_serve.then(|| net::SimDial {
            from: id,
            links: self.links.clone(),
        });
        let side = crate::member::serve_through(
            raft.clone(),
            applier.clone(),
            sm,
            status,
            id,
            dialing,
            stopped,
        );
        let (server_stop, mut server_stopped) = watch::channel(false);
        let server = tokio::spawn(async move {
            let _ = server
                .run(async move {
                    let _ = server_stopped.changed().await;
                })
                .await;
        });
        lock(&self.links).up.insert(
            id,
            net::UpMember {
                life: node.life,
                raft: raft.clone(),
                side,
            },
        );
        node.run = Some(Running {
            raft: raft.clone(),
            applier,
            stop,
            server_stop,
            server,
        });
        if new_cluster {
            let members: BTreeMap<NodeId, Member> = (1..=MEMBERS)
                .map(|id| {
                    let member = Member {
                        peer: address(id),
                        client: address(id),
                    };
                    (id, member)
                })
                .collect();
            if !raft.is_initialized().await.unwrap_or(true) {
                let _ = raft.initialize(members).await;
            }
        }
    }

    /// The faults of the run, chosen up front (which member a fault
    /// strikes is chosen when it strikes: the leader then, often).
    fn plan_faults(&mut self) {
        let mut t = 200_000;
        loop {
            t += self.rng.between(50_000, 500_000);
            if t >= RUN_US - 500_000 {
                break;
            }
            let c = self.rng.below(self.clients.len() as u64) as usize;
            let pick = if self.rng.chance(60) {
                Pick::Leader
            } else {
                Pick::Any
            };
            match self.rng.below(14) {
                0..=2 => {
                    let lose = self.rng.chance(50);
                    let down_us = self.rng.between(20_000, 1_500_000);
                    self.at(
                        t,
                        Event::Crash {
                            pick,
                            lose,
                            down_us,
                        },
                    );
                    if self.rng.chance(30) {
                        // A second member down while the first is: the
                        // quorum lost, then regained. Half the time both go
                        // at once (the leader and a follower together).
                        let second = if self.rng.chance(50) {
                            t
                        } else {
                            t + self.rng.between(0, down_us)
                        };
                        let down_us = self.rng.between(20_000, 800_000);
                        let lose = self.rng.chance(50);
                        self.at(
                            second,
                            Event::Crash {
                                pick: Pick::Any,
                                lose,
                                down_us,
                            },
                        );
                    }
                }
                3 | 4 => {
                    let both = self.rng.chance(60);
                    let for_us = self.rng.between(100_000, 1_500_000);
                    self.at(t, Event::Isolate { pick, both, for_us });
                }
                5 => {
                    let for_us = self.rng.between(300_000, 2_000_000);
                    self.at(t, Event::Slow { pick, for_us });
                }
                6..=8 => self.at(t, Event::Break(c)),
                9 | 10 => {
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

    /// The member that leads and has proven it, if any.
    fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| {
            n.run.as_ref().is_some_and(|r| {
                let m = r.raft.metrics().borrow().clone();
                m.state == ServerState::Leader && m.current_leader == Some(n.id)
            })
        })
    }

    /// The member a fault strikes, as `pick` asks if it can be found,
    /// else one that is up, chosen by the seed.
    fn pick(&mut self, pick: Pick) -> Option<usize> {
        let leader = self.leader();
        if pick == Pick::Leader && leader.is_some() {
            return leader;
        }
        let up: Vec<usize> = (0..self.nodes.len())
            .filter(|m| self.nodes[*m].run.is_some())
            .collect();
        let followers: Vec<usize> = up.iter().copied().filter(|m| Some(*m) != leader).collect();
        let from = if pick == Pick::Follower && !followers.is_empty() {
            followers
        } else {
            up
        };
        if from.is_empty() {
            return None;
        }
        Some(from[self.rng.below(from.len() as u64) as usize])
    }

    /// Runs until the end of the simulated time, then heals everything and
    /// lets the clients finish.
    pub(crate) async fn run(&mut self) {
        let end = RUN_US + 3_000_000;
        let mut steps = 0u64;
        loop {
            let next = lock(&self.queue.0).heap.peek().map(|Reverse(e)| *e);
            let Some((at, _, index)) = next else { break };
            if at > end {
                break;
            }
            let due = self.start + Duration::from_micros(at);
            if Instant::now() < due {
                let queue = self.queue.clone();
                tokio::select! {
                    biased;
                    () = queue.1.notified() => continue,
                    () = sleep_until(due) => {}
                }
                continue; // something may have come before it meanwhile
            }
            lock(&self.queue.0).heap.pop();
            steps += 1;
            assert!(steps < 5_000_000, "the simulation does not settle");
            let event = lock(&self.queue.0).events[index]
                .take()
                .expect("each event once");
            self.step(event).await;
        }
        self.finish().await;
    }

    async fn step(&mut self, event: Event) {
        let fault = !matches!(
            event,
            Event::Tick(_) | Event::ToMember(..) | Event::ToClient(..)
        );
        self.handle(event).await;
        if fault && self.journal.keep_trace() {
            let line = self.members_line();
            self.note(|| line);
        }
    }

    /// Each member's role, term and log, for the trace.
    fn members_line(&self) -> String {
        let mut line = String::from("members:");
        for node in &self.nodes {
            match &node.run {
                None => line += &format!(" {} down;", node.id),
                Some(run) => {
                    let m = run.raft.metrics().borrow().clone();
                    line += &format!(
                        " {} {:?} term {} last {:?} applied {:?}",
                        node.id,
                        m.state,
                        m.current_term,
                        m.last_log_index,
                        m.last_applied.map(|l| l.index)
                    );
                    if let Some(replication) = &m.replication {
                        let matched: Vec<_> = replication
                            .iter()
                            .map(|(id, l)| (*id, l.map(|l| l.index)))
                            .collect();
                        line += &format!(" matched {matched:?}");
                    }
                    line += ";";
                }
            }
        }
        line
    }

    async fn handle(&mut self, event: Event) {
        match event {
            Event::Tick(c) => {
                let mut client = std::mem::take(&mut self.clients[c]);
                let next = client.tick(self, c);
                self.clients[c] = client;
                if let Some(us) = next {
                    self.after(us, Event::Tick(c));
                }
            }
            Event::ToMember(c, gen, up) => {
                self.trace_message(c, gen, "to its member", &up);
                self.at_member(c, gen, up)
            }
            Event::ToClient(c, gen, down) => {
                self.trace_message(c, gen, "from its member", &down);
                self.route(c, gen, &down);
                let mut client = std::mem::take(&mut self.clients[c]);
                client.receive(self, c, gen, down);
                self.clients[c] = client;
            }
            Event::Crash {
                pick,
                lose,
                down_us,
            } => {
                let Some(m) = self.pick(pick) else { return };
                self.crash(m, lose).await;
                self.after(down_us, Event::Restart(m));
            }
            Event::Restart(m) => {
                if self.nodes[m].run.is_none() {
                    let held = lock(&self.nodes[m].disk).last_index();
                    self.fault(format!(
                        "member {} restarts, its log holding up to {held:?}",
                        self.nodes[m].id
                    ));
                    self.boot(m, false).await;
                }
            }
            Event::Isolate { pick, both, for_us } => {
                let Some(m) = self.pick(pick) else { return };
                let id = self.nodes[m].id;
                let until = self.now_us() + for_us;
                self.fault(format!(
                    "member {id} is cut off from the others{} for {} ms",
                    if both { "" } else { " (what it sends is lost)" },
                    for_us / 1_000
                ));
                let mut links = lock(&self.links);
                for other in 1..=self.nodes.len() as u64 {
                    if other != id {
                        links.cut.insert((id, other), until);
                        if both {
                            links.cut.insert((other, id), until);
                        }
                    }
                }
            }
            Event::Slow { pick, for_us } => {
                let Some(m) = self.pick(pick) else { return };
                let id = self.nodes[m].id;
                self.fault(format!(
                    "member {id}'s links are slowed past the heartbeat for {} ms",
                    for_us / 1_000
                ));
                let until = self.now_us() + for_us;
                lock(&self.links).slow.insert(id, until);
            }
            Event::Break(c) => {
                if let Some(conn) = self.conns.remove(&c) {
                    self.fault(format!("the network breaks client {c}'s connection"));
                    self.send_down(c, conn.gen, Down::Closed);
                }
            }
            Event::Cut(c, until) => {
                self.fault(format!(
                    "client {c} is cut off for {} ms",
                    until.saturating_sub(self.now_us()) / 1_000
                ));
                let mut q = lock(&self.queue.0);
                q.cut_until[c] = q.cut_until[c].max(until);
            }
            Event::Pause(c, until) => {
                self.fault(format!(
                    "client {c} pauses for {} ms",
                    until.saturating_sub(self.now_us()) / 1_000
                ));
                self.clients[c].pause_until(until);
            }
            Event::AddObserver => self.add_observer(),
            Event::Promote => self.promote(),
            Event::Demote => self.demote(),
        }
    }

    /// Asks the leader, if one is known, to add the observer as a learner,
    /// as `baton cluster add --observer` does, unless the leader's
    /// membership names it already; and asks again later until it does.
    fn add_observer(&mut self) {
        let Some(l) = self.leader() else {
            self.after(100_000, Event::AddObserver);
            return;
        };
        let raft = self.nodes[l]
            .run
            .as_ref()
            .expect("leads, so up")
            .raft
            .clone();
        let named = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&OBSERVER)
            .is_some();
        if named {
            self.fault(format!("member {OBSERVER} is an observer"));
            if self.reshape {
                let at = self.rng.between(200_000, 2_000_000);
                self.after(at, Event::Promote);
            }
            return;
        }
        self.fault(format!(
            "member {} is asked to add member {OBSERVER} as an observer",
            self.nodes[l].id
        ));
        let member = Member {
            peer: address(OBSERVER),
            client: address(OBSERVER),
        };
        tokio::spawn(async move {
            let _ = raft.add_learner(OBSERVER, member, false).await;
        });
        self.after(500_000, Event::AddObserver);
    }

    /// The leader, if one is known, and its membership.
    fn leader_membership(&self) -> Option<(Raft, crate::types::Metrics)> {
        let l = self.leader()?;
        let raft = self.nodes[l]
            .run
            .as_ref()
            .expect("leads, so up")
            .raft
            .clone();
        let metrics = raft.metrics().borrow().clone();
        Some((raft, metrics))
    }

    /// Asks the leader to make the observer a voter once the observer holds
    /// the membership that added it (as `baton cluster add` waits for),
    /// unless it votes already; asks again later until it does.
    fn promote(&mut self) {
        let Some((raft, m)) = self.leader_membership() else {
            self.after(100_000, Event::Promote);
            return;
        };
        let membership = m.membership_config.membership();
        if membership.voter_ids().any(|v| v == OBSERVER) {
            self.fault(format!("member {OBSERVER} votes"));
            let at = self.rng.between(200_000, 2_000_000);
            self.after(at, Event::Demote);
            return;
        }
        let added = m.membership_config.log_id().map(|l| l.index);
        let caught_up = self.nodes.iter().any(|n| {
            n.id == OBSERVER
                && n.run.as_ref().is_some_and(|r| {
                    r.raft
                        .metrics()
                        .borrow()
                        .membership_config
                        .log_id()
                        .map(|l| l.index)
                        >= added
                })
        });
        if caught_up {
            self.fault(format!(
                "member {} is asked to make member {OBSERVER} a voter",
                m.id
            ));
            ask_for(
                raft,
                openraft::ChangeMembers::AddVoterIds([OBSERVER].into()),
                false,
            );
        }
        self.after(500_000, Event::Promote);
    }

    /// Asks the leader to make one of four voters, chosen by the seed, an
    /// observer; asks again later until three vote.
    fn demote(&mut self) {
        let Some((raft, m)) = self.leader_membership() else {
            self.after(100_000, Event::Demote);
            return;
        };
        let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
        if voters.len() <= MEMBERS as usize {
            self.fault(format!("voters {voters:?}"));
            return;
        }
        let id = voters[self.rng.below(voters.len() as u64) as usize];
        self.fault(format!(
            "member {} is asked to make member {id} an observer",
            m.id
        ));
        ask_for(
            raft,
            openraft::ChangeMembers::RemoveVoters([id].into()),
            true,
        );
        self.after(500_000, Event::Demote);
    }

    /// Member `m`'s process dies; with `lose`, its disk loses what it had
    /// not synced. Its clients' connections close.
    async fn crash(&mut self, m: usize, lose: bool) {
        let Some(run) = self.nodes[m].run.take() else {
            return;
        };
        let id = self.nodes[m].id;
        self.fault(format!(
            "member {id} crashes{}",
            if lose {
                ", losing what its disk had not synced"
            } else {
                ""
            }
        ));
        lock(&self.links).up.remove(&id);
        lock(&self.nodes[m].disk).crash(lose);
        // A process that dies answers nothing more: its connections go
        // first, before its tasks are told to stop (a connection still
        // served while they stop would answer from a member half gone).
        let gone: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, conn)| conn.member == m)
            .map(|(c, _)| *c)
            .collect();
        for c in gone {
            let conn = self.conns.remove(&c).expect("listed above");
            conn.task.abort();
            self.send_down(c, conn.gen, Down::Closed);
        }
        run.server.abort();
        let _ = run.stop.send(true);
        let _ = run.server_stop.send(true);
        let _ = run.raft.shutdown().await;
    }

    fn send_down(&self, c: usize, gen: u64, down: Down) {
        let mut q = lock(&self.queue.0);
        let at = q.arrival(c, false);
        q.at(at, Event::ToClient(c, gen, down));
    }

    /// In a traced run, a message to or from the client
    /// `BATON_SIM_CLIENT` names, with the member its connection reaches.
    fn trace_message(&mut self, c: usize, gen: u64, way: &str, message: &impl std::fmt::Debug) {
        if self.traced_client != Some(c) {
            return;
        }
        let member = self
            .conns
            .get(&c)
            .filter(|conn| conn.gen == gen)
            .map(|conn| self.nodes[conn.member].id);
        let mut text = format!("{message:?}");
        if text.len() > 300 {
            let end = (0..=300)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            text.truncate(end);
            text.push_str("...");
        }
        let process = c + 100;
        self.note(|| match member {
            Some(m) => format!("client {process} connection {gen} {way} (member {m}): {text}"),
            None => format!("client {process} connection {gen} {way} (not connected): {text}"),
        });
    }

    /// A client's message at the member it is connected to (a handshake
    /// opens a connection to the member the client tries next).
    fn at_member(&mut self, c: usize, gen: u64, up: Up) {
        match up {
            Up::Connect(request) => {
                // A new connection replaces the old one, which closes.
                if let Some(old) = self.conns.remove(&c) {
                    drop(old.ups);
                }
                let m = self.target[c];
                let Some(run) = &self.nodes[m].run else {
                    // Nobody listens: the connection is refused.
                    self.target[c] = (m + 1) % self.nodes.len();
                    self.send_down(c, gen, Down::Closed);
                    return;
                };
                let (tx, rx) = mpsc::unbounded_channel();
                let applier = run.applier.clone();
                let queue = self.queue.clone();
                let barriers = self.defect != Some(Defect::ReadsWithoutBarrier);
                let task = tokio::spawn(async move {
                    door::serve(
                        &applier,
                        rx,
                        move |down| {
                            let mut q = lock(&queue.0);
                            let at = q.arrival(c, false);
                            q.at(at, Event::ToClient(c, gen, down));
                            drop(q);
                            queue.1.notify_one();
                        },
                        barriers,
                    )
                    .await;
                });
                let _ = tx.send(Up::Connect(request));
                self.conns.insert(
                    c,
                    Conn {
                        gen,
                        member: m,
                        ups: tx,
                        task,
                    },
                );
            }
            Up::Request(frame) => {
                if let Some(conn) = self.conns.get(&c).filter(|conn| conn.gen == gen) {
                    let _ = conn.ups.send(Up::Request(frame));
                }
            }
        }
    }

    /// What the client library does with a member's answer: a not-leader
    /// answer names the leader to try next; a closed connection is gone.
    fn route(&mut self, c: usize, gen: u64, down: &Down) {
        let not_leader = match down {
            Down::Connected(Err((ErrorCode::NotLeader, leader))) => Some(leader.clone()),
            Down::Frames(frames) => frames.iter().find_map(|f| match f {
                ServerMessage::Disconnect(n) if n.code == ErrorCode::NotLeader => {
                    Some(n.message.clone())
                }
                _ => None,
            }),
            _ => None,
        };
        if let Some(leader) = not_leader {
            let named = (0..self.nodes.len()).find(|m| address(self.nodes[*m].id) == leader);
            self.target[c] = named.unwrap_or((self.target[c] + 1) % self.nodes.len());
        }
        if matches!(down, Down::Closed) && self.conns.get(&c).is_some_and(|conn| conn.gen == gen) {
            self.conns.remove(&c);
        }
    }

    /// After the run: the network heals, every member is up again, the
    /// clients record what they still had in hand, and the registers and
    /// the counter are read from the leader once it has proven it leads.
    async fn finish(&mut self) {
        {
            let mut links = lock(&self.links);
            links.cut.clear();
            links.slow.clear();
            links.loss = 0;
        }
        for m in 0..self.nodes.len() {
            if self.nodes[m].run.is_none() {
                self.boot(m, false).await;
            }
        }
        let clients = std::mem::take(&mut self.clients);
        for mut client in clients {
            client.give_up(self);
        }
        for conn in std::mem::take(&mut self.conns).into_values() {
            conn.task.abort();
        }
        // Disks keep syncing while a leader is found.
        let deadline = Instant::now() + Duration::from_secs(30);
        let sm = loop {
            for node in &self.nodes {
                lock(&node.disk).sync();
            }
            if let Some(l) = self.leader() {
                let run = self.nodes[l].run.as_ref().expect("leads, so up");
                if run.raft.ensure_linearizable().await.is_ok() {
                    break Some(run.applier.state());
                }
            }
            if Instant::now() >= deadline {
                break None;
            }
            sleep(Duration::from_millis(1)).await;
        };
        match sm {
            Some(sm) => client::final_reads(self, &sm),
            None => {
                // Each member's replicated log, and why it stopped if it
                // did (openraft stops on a broken invariant, such as a
                // follower's log that went back).
                let members: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|node| match &node.run {
                        None => format!("member {} down", node.id),
                        Some(run) => {
                            let m = run.raft.metrics().borrow().clone();
                            match &m.running_state {
                                Ok(()) => format!(
                                    "member {} {:?} in term {}",
                                    node.id, m.state, m.current_term
                                ),
                                Err(e) => format!("member {} stopped: {e}", node.id),
                            }
                        }
                    })
                    .collect();
                self.stalled = Some(format!(
                    "no member leads 30 s after the faults ended: {}",
                    members.join("; ")
                ));
            }
        }
        for node in &mut self.nodes {
            if let Some(run) = node.run.take() {
                let _ = run.stop.send(true);
                let _ = run.server_stop.send(true);
                let _ = run.raft.shutdown().await;
                run.server.abort();
            }
        }
    }
}

/// A member's disk, syncing what was written every 0.2 to 3 ms, and now
/// and then only after up to 60 ms (a slow disk), for as long as the run.
async fn sync_now_and_then(disk: Arc<Mutex<Disk>>, mut rng: Rng) {
    loop {
        let us = if rng.chance(10) {
            rng.between(5_000, 60_000)
        } else {
            rng.between(200, 3_000)
        };
        sleep(Duration::from_micros(us)).await;
        lock(&disk).sync();
    }
}

/// Runs `seed` on a runtime of its own (one thread, paused clock) and
/// checks its history; the findings that break a promise.
pub(crate) fn run_seed(seed: u64, keep_trace: bool) -> (World, Vec<baton_chaos::Finding>) {
    run_seed_with(seed, keep_trace, None)
}

/// [`run_seed`], with `defect` put in the cluster.
pub(crate) fn run_seed_with(
    seed: u64,
    keep_trace: bool,
    defect: Option<Defect>,
) -> (World, Vec<baton_chaos::Finding>) {
    run(seed, keep_trace, defect, None, false)
}

/// [`run_seed`], with an observer added to the cluster early in the run.
pub(crate) fn run_seed_observed(seed: u64, keep_trace: bool) -> (World, Vec<baton_chaos::Finding>) {
    run(seed, keep_trace, None, None, true)
}

/// Runs `seed` with the faults of `script` (each at its time, in µs)
/// instead of those the seed would choose.
pub(crate) fn run_script(
    seed: u64,
    script: Vec<(u64, Event)>,
) -> (World, Vec<baton_chaos::Finding>) {
    run(seed, false, None, Some(script), false)
}

fn run(
    seed: u64,
    keep_trace: bool,
    defect: Option<Defect>,
    script: Option<Vec<(u64, Event)>>,
    observer: bool,
) -> (World, Vec<baton_chaos::Finding>) {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().start_paused(true);
    // Which ready branch of a `select!` goes first, from the seed too.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let runtime = builder.build().expect("a runtime");
    let world = runtime.block_on(async {
        let mut world = World::new(seed, keep_trace, defect, observer).await;
        match script {
            None => world.plan_faults(),
            Some(faults) => {
                for (at, fault) in faults {
                    world.at(at, fault);
                }
            }
        }
        world.run().await;
        world
    });
    let mut findings: Vec<baton_chaos::Finding> = world
        .stalled
        .iter()
        .map(|why| baton_chaos::Finding {
            checker: "liveness".into(),
            key: String::new(),
            verdict: baton_chaos::Verdict::Violation,
            detail: why.clone(),
            ops: Vec::new(),
        })
        .collect();
    findings.extend(
        baton_chaos::check(&world.journal.history)
            .into_iter()
            .filter(|f| f.verdict == baton_chaos::Verdict::Violation),
    );
    (world, findings)
}
