//! The core reads no clock of its own: what it stamps on changes and when
//! it expires a session follow the time its caller gives it.

use std::time::Duration;

use baton_proto::{ConnectRequest, CreateMode, Request, RequestFrame, SessionGrant};

use super::*;
use crate::replicate::InMemory;

fn core_at(now: Now) -> Core {
    let config = Config {
        min_session_timeout: Duration::from_millis(100),
        ..Config::default()
    };
    let with = With {
        config: Arc::new(config),
        stats: Arc::new(Stats::default()),
        mark: Arc::new(DurableMark::new(0)),
        expiry_wake: Arc::new(Notify::new()),
    };
    Core::new(
        StateMachine::new(),
        Arc::new(InMemory),
        Role::Leader,
        with,
        now,
    )
}

/// A single server's core started at `wall_ms`, with one session (of
/// `timeout_ms`) open on a connection of its own.
fn with_session(wall_ms: u64, timeout_ms: u32) -> (Core, Now, Arc<Outbox>, SessionGrant) {
    let start = Now {
        at: Instant::now(),
        wall_ms,
    };
    let mut core = core_at(start);
    let outbox = Outbox::new();
    let Ok(Connecting::Done(connected)) =
        core.connect(&ConnectRequest::new(timeout_ms), &outbox, start)
    else {
        panic!("a single server opens a session at once");
    };
    (core, start, outbox, connected.grant)
}

fn later(start: Now, ms: u64, wall_ms: u64) -> Now {
    Now {
        at: start.at + Duration::from_millis(ms),
        wall_ms,
    }
}

#[test]
fn changes_are_stamped_and_sessions_expire_by_the_time_the_caller_gives() {
    // Wall-clock times far from today's, and a monotonic clock that moves
    // only when the test says: nothing the core does may depend on others.
    let (mut core, start, outbox, grant) = with_session(1_000_000, 1_000);
    let session = grant.session_id;
    assert_eq!(core.state().last_now_ms(), 1_000_000);

    let create = RequestFrame {
        xid: 1,
        request: Request::Create {
            path: "/eph".into(),
            data: bytes::Bytes::new(),
            mode: CreateMode::Ephemeral,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        },
    };
    let flow = core.handle(session, create, &outbox, None, later(start, 10, 2_000_000));
    assert_eq!(flow, Flow::Continue);
    let state = core.state();
    assert_eq!(state.node("/eph").expect("created").stat().ctime, 2_000_000);

    // Heard from at +10 ms, with a 1 s timeout: due at +1010 ms, not before.
    assert_eq!(core.expire_due(later(start, 1_009, 3_000_000)), 0);
    assert!(core.state().node("/eph").is_some());
    assert_eq!(core.expire_due(later(start, 1_010, 3_000_500)), 1);
    let state = core.state();
    assert!(state.session(session).is_none());
    assert!(state.node("/eph").is_none());
    assert_eq!(state.last_now_ms(), 3_000_500);
}

/// A lock-delay tombstone is due by the caller's wall clock: the expiry
/// timer is told when, and deletes it then, not before.
#[test]
fn the_timer_deletes_a_lock_delay_tombstone_when_it_is_due() {
    let (mut core, start, outbox, grant) = with_session(5_000_000, 1_000);
    let session = grant.session_id;
    let requests = [
        Request::Create {
            path: "/l".into(),
            data: bytes::Bytes::new(),
            mode: CreateMode::Persistent,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        },
        Request::LockDelay {
            path: "/l".into(),
            delay_ms: 2_000,
        },
        Request::Enqueue {
            path: "/l/n-".into(),
            data: bytes::Bytes::new(),
            rule: Default::default(),
        },
    ];
    for (xid, request) in requests.into_iter().enumerate() {
        let frame = RequestFrame {
            xid: xid as u32 + 1,
            request,
        };
        assert_eq!(
            core.handle(session, frame, &outbox, None, start),
            Flow::Continue
        );
    }
    // The session expires at +1000 ms: its node stays, due at +3000 ms.
    assert_eq!(core.expire_due(later(start, 1_000, 5_001_000)), 1);
    let (node, due) = {
        let state = core.state();
        let (node, due) = state
            .tombstones()
            .next()
            .map(|(p, d)| (p.clone(), d))
            .unwrap();
        (node, due)
    };
    assert_eq!(due, 5_003_000);
    let wake = core
        .next_deadline()
        .expect("the timer has a tombstone to delete");
    assert_eq!(wake, start.at + Duration::from_millis(3_000));
    core.expire_due(later(start, 2_999, 5_002_999));
    assert!(core.state().node(&node).is_some(), "not before it is due");
    core.expire_due(later(start, 3_000, 5_003_000));
    assert!(core.state().node(&node).is_none());
    assert_eq!(core.next_deadline(), None);
}

/// A leader hears from the sessions a follower serves through what the
/// follower sends it: their forwarded changes and the sessions it heard
/// from keep them alive past their timeout, stamped with the leader's
/// clock; a change of a session the leader does not keep alive (unknown,
/// or expiring) is refused, not proposed, and a ping of one is reported
/// unheard; and a server that does not lead proposes nothing forwarded and
/// counts nothing heard.
#[test]
fn a_leader_keeps_alive_the_sessions_a_follower_serves_and_refuses_the_rest() {
    let start = Now {
        at: Instant::now(),
        wall_ms: 1_000_000,
    };
    let mut core = core_at(start);
    // Sessions opened on a follower: the leader applies them with no
    // connection of its own.
    let opened = |core: &mut Core, secret: u8| {
        let applied = core.sm.apply(
            &Command::OpenSession {
                timeout_ms: 1_000,
                secret: baton_proto::SessionSecret([secret; 16]),
            },
            1_000_000,
        );
        let Ok(crate::state::Outcome::SessionOpened(id)) = applied.result else {
            panic!("a session opens");
        };
        core.opened(
            id,
            baton_proto::SessionSecret([secret; 16]),
            1_000,
            applied.revision,
        );
        id
    };
    let kept = opened(&mut core, 1);
    let heard = opened(&mut core, 2);
    let silent = opened(&mut core, 3);
    let create = |session: SessionId, path: &str, xid: u32| Proposal {
        now_ms: 5, // the follower's clock: the leader stamps its own
        origin: Some(Origin { session, xid }),
        command: Command::Create {
            session,
            path: path.into(),
            data: bytes::Bytes::new(),
            mode: CreateMode::Persistent,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        },
    };
    let at_900 = later(start, 900, 2_000_000);
    assert_eq!(core.forwarded(create(kept, "/kept", 1), at_900), Ok(true));
    assert_eq!(
        core.state().node("/kept").expect("created").stat().ctime,
        2_000_000
    );
    assert_eq!(core.heard_elsewhere(&[heard], at_900), Ok(vec![]));
    // At +1000 ms only the silent session is due.
    assert_eq!(core.expire_due(later(start, 1_000, 2_000_100)), 1);
    let state = core.state();
    assert!(state.session(silent).is_none());
    assert!(state.session(kept).is_some() && state.session(heard).is_some());
    // Its change, arriving late, is refused; so is one of a session never
    // heard of.
    let at_1100 = later(start, 1_100, 2_000_200);
    assert_eq!(
        core.forwarded(create(silent, "/late", 1), at_1100),
        Ok(false)
    );
    assert_eq!(
        core.forwarded(create(SessionId(999), "/stranger", 1), at_1100),
        Ok(false)
    );
    assert!(core.state().node("/late").is_none());
    assert!(core.state().node("/stranger").is_none());
    // Nor is a ping the follower heard of either counted: the follower
    // must not answer it as if the session were alive.
    assert_eq!(
        core.heard_elsewhere(&[kept, silent, SessionId(999)], at_1100),
        Ok(vec![silent, SessionId(999)])
    );
    // A follower proposes nothing forwarded to it, and counts nothing
    // heard.
    core.follow(Some("127.0.0.1:1".into()), true);
    assert_eq!(
        core.heard_elsewhere(&[kept], at_1100),
        Err(crate::replicate::NotLeading)
    );
    assert_eq!(
        core.forwarded(create(kept, "/follower", 2), at_1100),
        Err(crate::replicate::NotLeading)
    );
    assert!(core.state().node("/follower").is_none());
}

/// A follower that serves clients and installs a snapshot closes their
/// connections: the changes the snapshot passed over fired no watch there,
/// and the clients resume and set their watches again. A follower that
/// becomes leader closes them too.
#[test]
fn a_serving_follower_sends_its_clients_to_resume_after_a_snapshot_or_when_it_leads() {
    let (mut core, start, first, grant) = with_session(1_000_000, 1_000);
    core.follow(Some("127.0.0.1:1".into()), true);
    assert_eq!(first.status(), crate::outbox::Status::Closing);
    let resume = |core: &mut Core, outbox: &Arc<Outbox>| {
        let mut request = ConnectRequest::new(1_000);
        request.resume = Some((grant.session_id, grant.secret));
        assert!(matches!(
            core.connect(&request, outbox, start),
            Ok(Connecting::Done(_))
        ));
        assert_eq!(outbox.status(), crate::outbox::Status::Open);
    };
    let second = Outbox::new();
    resume(&mut core, &second);
    assert_eq!(core.attached_sessions(), 1);
    core.install(core.state(), start);
    assert_eq!(second.status(), crate::outbox::Status::Closing);

    let third = Outbox::new();
    resume(&mut core, &third);
    core.lead(start);
    assert_eq!(third.status(), crate::outbox::Status::Closing);
    assert_eq!(core.attached_sessions(), 0);
}

/// A cluster member that cannot take a change (here a serving follower
/// with no way to the leader) closes the connection with the not-leader
/// notice instead of refusing the request: an earlier copy of it may be in
/// the log already, and the client sends it again, with the same xid, to a
/// member that can take it.
#[test]
fn a_change_that_cannot_reach_the_leader_closes_the_connection_unanswered() {
    let (mut core, start, _first, grant) = with_session(1_000_000, 1_000);
    core.set_log(Arc::new(crate::replicate::NoLogYet));
    core.follow(Some("127.0.0.1:1".into()), true);
    let mut request = ConnectRequest::new(1_000);
    request.resume = Some((grant.session_id, grant.secret));
    let second = Outbox::new();
    assert!(matches!(
        core.connect(&request, &second, start),
        Ok(Connecting::Done(_))
    ));
    let create = RequestFrame {
        xid: 7,
        request: Request::Create {
            path: "/n".into(),
            data: bytes::Bytes::new(),
            mode: CreateMode::Persistent,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        },
    };
    core.handle(grant.session_id, create, &second, None, start);
    assert!(!second.has_queued(), "no answer to the change");
    assert_eq!(second.status(), crate::outbox::Status::Closing);
    let mut buf = bytes::BytesMut::new();
    assert_eq!(
        second.drain_into(&mut buf, 1 << 16, 0),
        crate::outbox::Drained::Close
    );
    let notice = baton_proto::ServerMessage::decode(buf.split_off(4).freeze()).expect("a frame");
    assert_eq!(
        notice,
        baton_proto::ServerMessage::Disconnect(baton_proto::response::Disconnect {
            code: ErrorCode::NotLeader,
            message: "127.0.0.1:1".into(),
        })
    );
    assert!(core.state().node("/n").is_none());
}

/// A container that empties and fills again many times within its grace
/// leaves no more than a bounded number of stale entries behind, and is
/// still deleted once it has stood empty for the grace.
#[test]
fn a_container_that_keeps_emptying_leaves_a_bounded_trail() {
    let (mut core, start, outbox, grant) = with_session(1_000_000, 60_000);
    let session = grant.session_id;
    let mut xid = 0;
    let mut send = |core: &mut Core, request: Request| {
        xid += 1;
        core.handle(session, RequestFrame { xid, request }, &outbox, None, start);
    };
    let create = |path: &str, mode| Request::Create {
        path: path.into(),
        data: bytes::Bytes::new(),
        mode,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    };
    send(&mut core, create("/c", CreateMode::Container));
    for _ in 0..10_000 {
        send(&mut core, create("/c/x", CreateMode::Persistent));
        send(
            &mut core,
            Request::Delete {
                path: "/c/x".into(),
                version: None,
                fence: None,
            },
        );
        assert!(core.emptied_order.len() <= 2 + super::sessions::STALE_EMPTIED + 1);
    }
    assert!(core.state().node("/c").is_some());
    core.expire_due(later(start, 59_000, 1_059_000));
    assert!(core.state().node("/c").is_some(), "not before its grace");
    core.expire_due(later(start, 60_001, 1_060_001));
    assert!(core.state().node("/c").is_none(), "deleted after its grace");
}

/// A log that commits later: it keeps what is proposed, for the test to
/// apply as committed.
#[derive(Default)]
struct CommitsLater(std::sync::Mutex<Vec<Proposal>>);

impl crate::replicate::Replicator for CommitsLater {
    fn propose(&self, proposal: &Proposal) -> crate::replicate::Proposed {
        self.0.lock().unwrap().push(proposal.clone());
        crate::replicate::Proposed::Later
    }

    fn applies_at_once(&self) -> bool {
        false
    }
}

/// Records the order in which connections are woken.
struct WakeOrder(&'static str, Arc<std::sync::Mutex<Vec<&'static str>>>);

impl std::task::Wake for WakeOrder {
    fn wake(self: Arc<Self>) {
        self.1.lock().unwrap().push(self.0);
    }
}

/// On a cluster member, the answer to a committed change is queued (and
/// its connection woken) before the watch events it fires for other
/// sessions, which are queued before the core is let go: a change that
/// fires many watches is not answered only after all their connections.
#[test]
fn a_committed_change_is_answered_before_other_sessions_events() {
    let (mut core, start, writer_box, writer) = with_session(1_000_000, 10_000);
    let watcher_box = Outbox::new();
    let Ok(Connecting::Done(watcher)) =
        core.connect(&ConnectRequest::new(10_000), &watcher_box, start)
    else {
        panic!("a session opens");
    };
    let watcher = watcher.grant.session_id;
    let create = Request::Create {
        path: "/x".into(),
        data: bytes::Bytes::new(),
        mode: CreateMode::Persistent,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    };
    core.handle(
        writer.session_id,
        RequestFrame {
            xid: 1,
            request: create,
        },
        &writer_box,
        None,
        start,
    );
    let read = Request::GetData {
        path: "/x".into(),
        watch: true,
    };
    core.handle(
        watcher,
        RequestFrame {
            xid: 9,
            request: read,
        },
        &watcher_box,
        None,
        start,
    );
    let log = Arc::new(CommitsLater::default());
    core.set_log(log.clone());
    let set = Request::SetData {
        path: "/x".into(),
        data: bytes::Bytes::from_static(b"v"),
        version: None,
        fence: None,
    };
    core.handle(
        writer.session_id,
        RequestFrame {
            xid: 10,
            request: set,
        },
        &writer_box,
        None,
        start,
    );
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    for (name, outbox) in [("writer", &writer_box), ("watcher", &watcher_box)] {
        let mut buf = bytes::BytesMut::new();
        outbox.drain_into(&mut buf, 1 << 16, u64::MAX);
        let waker = std::task::Waker::from(Arc::new(WakeOrder(name, order.clone())));
        let mut cx = std::task::Context::from_waker(&waker);
        while outbox.poll_woken(&mut cx).is_ready() {}
    }
    let proposed = std::mem::take(&mut *log.0.lock().unwrap());
    assert_eq!(proposed.len(), 1);
    core.apply_committed(&proposed[0], start);
    assert_eq!(*order.lock().unwrap(), ["writer", "watcher"]);
    let frames = |outbox: &Arc<Outbox>| {
        let mut buf = bytes::BytesMut::new();
        outbox.drain_into(&mut buf, 1 << 16, u64::MAX);
        let mut frames = Vec::new();
        while buf.len() >= 4 {
            let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
            let frame = buf.split_to(4 + len).split_off(4).freeze();
            frames.push(baton_proto::ServerMessage::decode(frame).unwrap());
        }
        frames
    };
    let mine = frames(&writer_box);
    assert!(
        matches!(&mine[..], [baton_proto::ServerMessage::Reply(r)] if r.xid == 10),
        "{mine:?}"
    );
    let theirs = frames(&watcher_box);
    assert!(
        matches!(&theirs[..], [baton_proto::ServerMessage::Event(_)]),
        "{theirs:?}"
    );
}

/// What the core keeps per session, side by side in its ordered maps: the
/// live-session entry (32 bytes a session, where an `Instant` took 40) and
/// the deadline (16, where it took 24). A field added carelessly shows up
/// here first (docs/benchmarks.md's memory per session rests on these).
#[test]
fn per_session_entries_stay_small() {
    use std::mem::size_of;
    assert!(size_of::<(SessionId, super::Live)>() <= 32);
    assert!(size_of::<(super::Stamp, SessionId)>() <= 16);
}
