//! The deterministic state machine's apply: the step every change takes on a
//! single server, and on every member of a cluster.
//!
//! Each benchmark starts from a lock, `/locks/orders`, with `waiters`
//! contenders queued on it, each its own session, as the lock recipe leaves
//! them. Changes are applied as the server applies a client's request: a
//! proposal naming the session and xid it answers.
//!
//! The state is kept at its size: a benchmarked change is taken back outside
//! the timing before the next sample (divan makes a whole sample's inputs,
//! untimed, before it times the sample), so the queue stays between
//! `waiters` and `waiters` plus one sample. Within the timing, besides the
//! apply, an iteration only notes what to take back (an `Arc` clone and a
//! push onto a reserved vector).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use baton::proto::{CreateMode, SessionId, SessionSecret};
use baton::server::state::{Applied, Command, Origin, Outcome, Proposal, StateMachine};
use bytes::Bytes;
use divan::Bencher;

fn main() {
    divan::main();
}

const LOCK: &str = "/locks/orders";
/// What a contender stores in its node: who it is.
const IDENTITY: &[u8] = b"worker-7 pid 4242";
/// The time proposals are stamped with.
const NOW_MS: u64 = 1_767_225_600_000;
/// Samples per benchmark.
const SAMPLES: u32 = 1_000;
/// Iterations in one sample: at most the number of waiters, so that one
/// sample never deletes a node joined in the same sample (see `delete`).
const SAMPLE_SIZE: u32 = 100;

/// A state machine with contenders queued on [`LOCK`], and what the
/// benchmarked changes of the current sample are to be undone with.
struct Rig {
    sm: StateMachine,
    /// The contenders' nodes and sessions, oldest first.
    queue: VecDeque<(Arc<str>, SessionId)>,
    /// A session of its own, for the benchmarked creates and enqueues.
    session: SessionId,
    /// The last xid proposed: one counter for every session, so that each
    /// session's xids grow, as a client's do.
    xid: u32,
    /// Nodes created by the current sample, to delete.
    created: Vec<Arc<str>>,
    /// Sessions opened by the current sample, to close.
    opened: Vec<SessionId>,
}

impl Rig {
    fn new(waiters: usize) -> Self {
        let mut rig = Rig {
            sm: StateMachine::new(),
            queue: VecDeque::with_capacity(waiters + SAMPLE_SIZE as usize),
            session: SessionId(0),
            xid: 0,
            created: Vec::with_capacity(SAMPLE_SIZE as usize),
            opened: Vec::with_capacity(SAMPLE_SIZE as usize),
        };
        rig.session = rig.open();
        for path in ["/locks", LOCK] {
            let create = Command::Create {
                session: rig.session,
                path: path.to_owned(),
                data: Bytes::new(),
                mode: CreateMode::Persistent,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            };
            rig.apply_ok(Some(rig.session), create);
        }
        for _ in 0..waiters {
            let session = rig.open();
            let node = rig.join(session);
            rig.queue.push_back((node, session));
        }
        rig
    }

    /// A proposal answering the next xid of `session`, or none.
    fn proposal(&mut self, session: Option<SessionId>, command: Command) -> Proposal {
        self.xid += 1;
        Proposal {
            now_ms: NOW_MS,
            origin: session.map(|session| Origin {
                session,
                xid: self.xid,
            }),
            command,
        }
    }

    fn apply_ok(&mut self, session: Option<SessionId>, command: Command) -> Outcome {
        let proposal = self.proposal(session, command);
        let applied = self.sm.apply_proposal(&proposal);
        assert!(applied.changed, "{proposal:?} changed nothing");
        applied.result.expect("applied")
    }

    fn open(&mut self) -> SessionId {
        match self.apply_ok(None, open_session_command()) {
            Outcome::SessionOpened(id) => id,
            other => panic!("{other:?}"),
        }
    }

    /// Joins the queue for `session`, as the lock recipe does.
    fn join(&mut self, session: SessionId) -> Arc<str> {
        match self.apply_ok(Some(session), enqueue_command(session)) {
            Outcome::Enqueued { path, .. } => path,
            other => panic!("{other:?}"),
        }
    }

    /// The timed step: applies a benchmarked change, checks that it was made
    /// (a refused one would be measured as a cheap no-op) and notes what to
    /// take back after the sample.
    fn timed(&mut self, proposal: &Proposal) -> Applied {
        let applied = self.sm.apply_proposal(proposal);
        assert!(applied.changed, "{:?}", applied.result);
        match &applied.result {
            Ok(Outcome::Created { path, .. } | Outcome::Enqueued { path, .. }) => {
                self.created.push(path.clone())
            }
            Ok(Outcome::SessionOpened(id)) => self.opened.push(*id),
            _ => {}
        }
        applied
    }

    /// Takes back what the last sample did.
    fn undo(&mut self) {
        for node in std::mem::take(&mut self.created) {
            let delete = Command::Delete {
                path: node.to_string(),
                version: None,
                fence: None,
            };
            self.apply_ok(Some(self.session), delete);
        }
        for session in std::mem::take(&mut self.opened) {
            self.apply_ok(None, Command::CloseSession { session });
        }
    }
}

fn open_session_command() -> Command {
    Command::OpenSession {
        timeout_ms: 10_000,
        secret: SessionSecret([7; 16]),
    }
}

/// The recipe's queue entry: `<lock>/lock-<session>-<n>-` plus a sequence.
fn enqueue_command(session: SessionId) -> Command {
    Command::Enqueue {
        session,
        path: format!("{LOCK}/lock-{:x}-0-", session.0),
        data: Bytes::from_static(IDENTITY),
        rule: Default::default(),
    }
}

/// An ephemeral sequential node created under the lock (the plain form of a
/// contender joining), by one session.
#[divan::bench(args = [1_000], sample_count = SAMPLES, sample_size = SAMPLE_SIZE)]
fn create(bencher: Bencher, waiters: usize) {
    let rig = RefCell::new(Rig::new(waiters));
    bencher
        .with_inputs(|| {
            let mut rig = rig.borrow_mut();
            rig.undo();
            let session = rig.session;
            let create = Command::Create {
                session,
                path: format!("{LOCK}/lock-{:x}-0-", session.0),
                data: Bytes::from_static(IDENTITY),
                mode: CreateMode::EphemeralSequential,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            };
            rig.proposal(Some(session), create)
        })
        .bench_local_refs(|proposal| rig.borrow_mut().timed(proposal));
}

/// A contender joining the queue: create and predecessor in one step.
#[divan::bench(args = [1_000], sample_count = SAMPLES, sample_size = SAMPLE_SIZE)]
fn enqueue(bencher: Bencher, waiters: usize) {
    let rig = RefCell::new(Rig::new(waiters));
    bencher
        .with_inputs(|| {
            let mut rig = rig.borrow_mut();
            rig.undo();
            let session = rig.session;
            rig.proposal(Some(session), enqueue_command(session))
        })
        .bench_local_refs(|proposal| rig.borrow_mut().timed(proposal));
}

/// The holder releasing the lock: its node, at the head of the queue, is
/// deleted. For each head deleted, its session joins again at the tail
/// (outside the timing), so the queue keeps its length.
#[divan::bench(args = [1_000], sample_count = SAMPLES, sample_size = SAMPLE_SIZE)]
fn delete_head(bencher: Bencher, waiters: usize) {
    assert!(waiters >= SAMPLE_SIZE as usize);
    let rig = RefCell::new(Rig::new(waiters));
    bencher
        .with_inputs(|| {
            let mut rig = rig.borrow_mut();
            let (head, session) = rig.queue.pop_front().expect("a queued contender");
            let node = rig.join(session);
            rig.queue.push_back((node, session));
            // Proposed after the join: a session's xids only grow.
            let delete = Command::Delete {
                path: head.to_string(),
                version: None,
                fence: None,
            };
            rig.proposal(Some(session), delete)
        })
        .bench_local_refs(|proposal| rig.borrow_mut().timed(proposal));
}

/// A new session, beside the contenders' sessions.
#[divan::bench(args = [1_000], sample_count = SAMPLES, sample_size = SAMPLE_SIZE)]
fn open_session(bencher: Bencher, waiters: usize) {
    let rig = RefCell::new(Rig::new(waiters));
    bencher
        .with_inputs(|| {
            let mut rig = rig.borrow_mut();
            rig.undo();
            rig.proposal(None, open_session_command())
        })
        .bench_local_refs(|proposal| rig.borrow_mut().timed(proposal));
}
