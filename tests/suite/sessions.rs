//! Sessions: expiry after silence, explicit close, what a client sees once its
//! session is gone, and timeout negotiation (DESIGN.md invariants 4 and 6).

use std::time::Duration;

use baton::proto::{ConnectRequest, ErrorCode, Request};
use baton::server::Config;
use baton::{CreateMode, Error, EventKind, SessionState};
use baton_testkit::*;
use futures::FutureExt;

#[tokio::test]
async fn expired_session_deletes_its_ephemeral_nodes() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    let doomed = server.client_with_timeout(Duration::from_millis(300)).await;
    doomed
        .create("/eph", "x", CreateMode::Ephemeral)
        .await
        .unwrap();
    doomed
        .create("/persistent", "x", CreateMode::Persistent)
        .await
        .unwrap();
    let (stat, deleted) = observer.exists_watch("/eph").await.unwrap();
    assert_eq!(stat.unwrap().owner(), Some(doomed.session_id()));

    // Dropping the client without closing stops its heartbeats, as if the
    // process had died.
    drop(doomed);

    let event = within(10, "the ephemeral's Deleted event", deleted)
        .await
        .unwrap();
    assert_eq!(event.kind, EventKind::Deleted);
    assert_eq!(event.path, "/eph");
    assert_eq!(observer.exists("/eph").await.unwrap(), None);
    assert!(observer.exists("/persistent").await.unwrap().is_some());
    let stats = server.stats();
    assert_eq!(stats.sessions_expired, 1);
    assert_eq!(stats.sessions, 1, "only the observer's session is left");
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_detached_handle_does_not_keep_its_session() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    let doomed = server.client_with_timeout(Duration::from_millis(300)).await;
    let detached = doomed.detached();
    detached
        .create("/eph", "x", CreateMode::Ephemeral)
        .await
        .unwrap();
    let (stat, deleted) = observer.exists_watch("/eph").await.unwrap();
    assert_eq!(stat.unwrap().owner(), Some(doomed.session_id()));
    drop(doomed);
    let event = within(10, "the ephemeral's Deleted event", deleted)
        .await
        .unwrap();
    assert_eq!(event.kind, EventKind::Deleted);
    let ping = within(10, "a call on the detached handle", detached.ping()).await;
    assert!(matches!(ping, Err(Error::Closed)), "{ping:?}");
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn silent_connection_gets_a_session_expired_notice_and_its_ephemerals_go() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    // A raw client does the handshake, creates an ephemeral node, then sends
    // nothing more while keeping the connection open.
    let mut raw = Raw::open(&server.addr(), 200).await;
    assert_eq!(raw.grant().timeout_ms, 200);
    raw.call(Request::Create {
        path: "/silent".into(),
        data: "x".into(),
        mode: CreateMode::EphemeralSequential,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    })
    .await
    .unwrap();
    let (children, _) = observer.get_children("/").await.unwrap();
    let name = children
        .iter()
        .find(|c| c.starts_with("silent"))
        .expect("the raw client's node")
        .clone();
    let path = format!("/{name}");
    let (_, deleted) = observer.exists_watch(&path).await.unwrap();

    let notice = raw.expect_disconnect().await;
    assert_eq!(notice.code, ErrorCode::SessionExpired);

    let event = within(10, "the Deleted event", deleted).await.unwrap();
    assert_eq!(
        (event.kind, event.path.as_str()),
        (EventKind::Deleted, &*path)
    );
    assert_eq!(observer.exists(&path).await.unwrap(), None);
    assert_eq!(server.stats().sessions_expired, 1);
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn close_deletes_ephemeral_nodes_at_once() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    let closing = server.client().await;
    closing
        .create("/c1", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let seq = closing
        .create("/c2-", "", CreateMode::EphemeralSequential)
        .await
        .unwrap();
    closing
        .create("/kept", "", CreateMode::Persistent)
        .await
        .unwrap();
    let (_, mut deleted) = observer.exists_watch("/c1").await.unwrap();

    closing.close().await;

    // No waiting: close returns once the server has ended the session, and
    // the observer's next reply comes after the events of that change.
    assert_eq!(observer.exists("/c1").await.unwrap(), None);
    assert_eq!(observer.exists(&seq.path).await.unwrap(), None);
    assert!(observer.exists("/kept").await.unwrap().is_some());
    let event = (&mut deleted)
        .now_or_never()
        .expect("the Deleted event came before the reply")
        .unwrap();
    assert_eq!(event.kind, EventKind::Deleted);

    assert_eq!(closing.state(), SessionState::Closed);
    assert_eq!(closing.ended().await, SessionState::Closed);
    assert_eq!(closing.get_data("/kept").await, Err(Error::Closed));
    let stats = server.stats();
    assert_eq!(stats.sessions_expired, 0, "closed, not expired");
    assert_eq!(stats.sessions, 1);
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn client_whose_session_expired_sees_expired_and_every_call_fails() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let observer = server.client().await;
    observer
        .create("/stable", "s", CreateMode::Persistent)
        .await
        .unwrap();
    let client = connect_with_timeout(&proxy.addr(), Duration::from_millis(600)).await;
    client
        .create("/mine", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let (_, _, watcher) = client.get_data_watch("/stable").await.unwrap();
    let (_, gone) = observer.exists_watch("/mine").await.unwrap();

    // Cut the network for longer than the session timeout.
    proxy.block();
    proxy.sever();
    wait_state(&client, SessionState::Disconnected).await;
    // A call made while disconnected waits for the reconnect.
    let mut deferred = Box::pin(client.get_data("/stable"));
    assert!(futures::poll!(&mut deferred).is_pending());
    let event = within(10, "the server to expire the session", gone)
        .await
        .unwrap();
    assert_eq!(event.kind, EventKind::Deleted);
    proxy.unblock();

    let ended = within(10, "the client to learn of the expiry", client.ended()).await;
    assert_eq!(ended, SessionState::Expired);
    assert_eq!(client.state(), SessionState::Expired);
    let is_expired = |r: Result<(), Error>| matches!(r, Err(Error::SessionExpired(_)));
    assert!(is_expired(deferred.await.map(drop)), "deferred call");
    assert!(matches!(
        within(10, "the watcher", watcher).await,
        Err(Error::SessionExpired(_))
    ));
    assert!(is_expired(
        client
            .create("/x", "", CreateMode::Persistent)
            .await
            .map(drop)
    ));
    assert!(is_expired(client.delete("/stable", None).await));
    assert!(is_expired(client.exists("/stable").await.map(drop)));
    assert!(is_expired(client.exists_watch("/stable").await.map(drop)));
    assert!(is_expired(client.get_data("/stable").await.map(drop)));
    assert!(is_expired(client.get_data_watch("/stable").await.map(drop)));
    assert!(is_expired(client.get_children("/").await.map(drop)));
    assert!(is_expired(client.get_children_watch("/").await.map(drop)));
    assert!(is_expired(
        client.set_data("/stable", "", None).await.map(drop)
    ));
    assert!(is_expired(client.ping().await));
    // Closing an expired client is harmless and leaves it expired.
    client.close().await;
    assert_eq!(client.state(), SessionState::Expired);
    assert_eq!(observer.get_data("/stable").await.unwrap().0, "s");
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn heartbeating_session_outlives_its_timeout() {
    let server = TestServer::start().await;
    let timeout = Duration::from_secs(1);
    let alive = server.client_with_timeout(timeout).await;
    alive
        .create("/alive", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let observer = server.client().await;
    // The clock: sessions with the same timeout that stop heartbeating. When
    // each expires, `alive` has been idle for at least one more timeout.
    for round in 0..2 {
        let clock = server.client_with_timeout(timeout).await;
        let path = format!("/clock{round}");
        clock
            .create(&path, "", CreateMode::Ephemeral)
            .await
            .unwrap();
        let (_, gone) = observer.exists_watch(&path).await.unwrap();
        drop(clock);
        within(10, "a silent session to expire", gone)
            .await
            .unwrap();
    }
    assert_eq!(
        server.stats().sessions_expired,
        2,
        "only the clocks expired"
    );
    // (Under heavy load the client may have resumed on a new connection; the
    // session is what must live on.)
    assert!(alive.state().is_connected(), "{}", alive.state());
    let stat = observer
        .exists("/alive")
        .await
        .unwrap()
        .expect("still there");
    assert_eq!(stat.owner(), Some(alive.session_id()));
    alive.close().await;
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn negotiated_timeout_is_clamped_to_the_server_bounds() {
    let config = Config {
        min_session_timeout: Duration::from_millis(200),
        max_session_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let server = TestServer::with_config(config).await;
    let granted = |ms: u64| {
        let addr = server.addr();
        async move {
            let c = connect_with_timeout(&addr, Duration::from_millis(ms)).await;
            let t = c.session_timeout();
            c.close().await;
            t
        }
    };
    assert_eq!(
        granted(50).await,
        Duration::from_millis(200),
        "raised to min"
    );
    assert_eq!(granted(200).await, Duration::from_millis(200));
    assert_eq!(granted(700).await, Duration::from_millis(700), "kept");
    assert_eq!(granted(2_000).await, Duration::from_secs(2));
    assert_eq!(
        granted(30_000).await,
        Duration::from_secs(2),
        "lowered to max"
    );

    for (asked, expected) in [(0, 200), (1, 200), (u32::MAX, 2_000)] {
        let mut raw = Raw::connect(&server.addr()).await;
        let grant = raw
            .handshake(&ConnectRequest::new(asked))
            .await
            .result
            .unwrap();
        assert_eq!(grant.timeout_ms, expected, "asked for {asked} ms");
    }
    server.stop().await;
}

#[tokio::test]
async fn expired_session_cannot_be_resumed() {
    let server = TestServer::start().await;
    let mut raw = Raw::open(&server.addr(), 150).await;
    let grant = raw.grant().clone();
    assert_eq!(
        raw.expect_disconnect().await.code,
        ErrorCode::SessionExpired
    );
    let (_, response) = Raw::resume(&server.addr(), &grant).await;
    let (code, _) = response.result.unwrap_err();
    assert_eq!(code, ErrorCode::SessionExpired);
    server.stop().await;
}

#[tokio::test]
async fn closed_session_cannot_be_resumed() {
    let server = TestServer::start().await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    let grant = raw.grant().clone();
    assert!(matches!(
        raw.call(Request::CloseSession).await,
        Ok(baton::proto::Reply::CloseSession)
    ));
    raw.expect_closed().await;
    let (_, response) = Raw::resume(&server.addr(), &grant).await;
    assert_eq!(response.result.unwrap_err().0, ErrorCode::SessionExpired);
    assert_eq!(server.stats().sessions, 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_closed_once_close_returns() {
    let server = TestServer::start().await;
    for round in 0..50 {
        let c = server.client().await;
        c.close().await;
        assert_eq!(c.state(), SessionState::Closed, "round {round}");
        assert_eq!(c.ping().await, Err(Error::Closed));
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_when_the_session_expires_fail_with_session_expired() {
    const WATCHED: usize = 200;
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let writer = server.client().await;
    for i in 0..WATCHED {
        writer
            .create(&format!("/f{i}"), "", CreateMode::Persistent)
            .await
            .unwrap();
    }
    let client = connect_with_timeout(&proxy.addr(), Duration::from_secs(1)).await;
    let mut watchers = Vec::new();
    for i in 0..WATCHED {
        watchers.push(client.get_data_watch(&format!("/f{i}")).await.unwrap().2);
    }
    // The server stops hearing from the client, which still hears the
    // server: a steady stream of watch events keeps its connection looking
    // alive, so it learns of the expiry from the server's notice while its
    // calls are still unanswered.
    proxy.hold_requests();
    // Callers that run the moment their call is answered, as a caller on an
    // idle thread may.
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let client = client.clone();
            poll_when_woken(async move { client.get_data("/f0").await })
        })
        .collect();
    let feeder = {
        let (writer, client) = (writer.clone(), client.clone());
        tokio::spawn(async move {
            for i in 0..WATCHED {
                if client.state().is_terminal() {
                    return;
                }
                writer.set_data(&format!("/f{i}"), "x", None).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("the session outlived {WATCHED} changes");
        })
    };
    for call in calls {
        let result = within(20, "a call in flight", call).await.unwrap();
        assert!(
            matches!(result, Err(Error::SessionExpired(_))),
            "{result:?}"
        );
    }
    assert_eq!(client.ended().await, SessionState::Expired);
    within(20, "the feeder", feeder).await.unwrap();
    assert_eq!(server.stats().sessions_expired, 1);
    writer.close().await;
    server.stop().await;
}

/// A client whose session task is gone (its runtime was shut down) fails
/// every call and returns from close at once, instead of waiting forever.
#[test]
fn calls_fail_at_once_when_the_session_task_is_gone() {
    let server_rt = tokio::runtime::Runtime::new().unwrap();
    let server = server_rt.block_on(TestServer::start());
    let addr = server.addr();
    let client_rt = tokio::runtime::Runtime::new().unwrap();
    let client = client_rt.block_on(async { baton::Client::connect(&addr).await.unwrap() });
    drop(client_rt);
    let other = tokio::runtime::Runtime::new().unwrap();
    other.block_on(async {
        let result = within(5, "the call", client.exists("/")).await;
        assert!(matches!(result, Err(baton::Error::Closed)), "{result:?}");
        within(5, "close", client.close()).await;
    });
    server_rt.block_on(server.stop());
}

/// A replicated log stand-in that commits proposals in order on a task of
/// its own, and holds them back while `held` is set, noting each one.
struct HeldLog {
    tx: tokio::sync::mpsc::UnboundedSender<baton::server::state::Proposal>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<baton::server::state::Command>>>,
}

impl baton::server::replicate::Replicator for HeldLog {
    fn propose(
        &self,
        proposal: &baton::server::state::Proposal,
    ) -> baton::server::replicate::Proposed {
        self.seen.lock().unwrap().push(proposal.command.clone());
        let _ = self.tx.send(proposal.clone());
        baton::server::replicate::Proposed::Later
    }

    fn applies_at_once(&self) -> bool {
        false
    }
}

/// Pins: a session whose expiry has been proposed, and is waiting to be
/// committed, is not answered as alive: a ping from it then does not move
/// its client's deadline past the moment its lock passes on.
#[tokio::test]
async fn a_session_whose_expiry_is_proposed_is_not_answered_as_alive() {
    use baton::server::state::Command;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut config = fast_config();
    config.min_session_timeout = Duration::from_millis(300);
    let (server, applier) = baton::server::Server::member(listener, config).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let held = Arc::new(AtomicBool::new(false));
    let released = Arc::new(tokio::sync::Notify::new());
    applier.set_log(Arc::new(HeldLog {
        tx,
        seen: seen.clone(),
    }));
    let committer = {
        let (applier, held, released) = (applier.clone(), held.clone(), released.clone());
        tokio::spawn(async move {
            while let Some(proposal) = rx.recv().await {
                while held.load(Ordering::SeqCst) {
                    released.notified().await;
                }
                applier.apply(&[proposal]);
            }
        })
    };
    applier.lead();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let mut raw = Raw::open(&addr, 300).await;
    let session = raw.grant().session_id;
    // The log stops committing; the session falls silent past its timeout,
    // so the server proposes its expiry, which waits.
    held.store(true, Ordering::SeqCst);
    eventually(10, "the session's expiry to be proposed", || {
        seen.lock()
            .unwrap()
            .iter()
            .any(|c| matches!(c, Command::ExpireSession { session: s } if *s == session))
    })
    .await;
    // The client, waking from a pause, pings.
    let answer = within(10, "an answer to the ping", raw.call(Request::Ping)).await;
    assert_eq!(
        answer.map_err(|e| e.code),
        Err(ErrorCode::SessionExpired),
        "a session whose expiry was proposed was answered as alive"
    );
    held.store(false, Ordering::SeqCst);
    released.notify_one();
    let _ = stop.send(());
    let _ = within(10, "the server to stop", serving).await;
    committer.abort();
}

/// A replicated log stand-in that commits proposals in order on a task of
/// its own, and whose read barriers prove leadership while `leads` is set
/// and find it lost otherwise.
struct ProvedLog {
    tx: tokio::sync::mpsc::UnboundedSender<baton::server::state::Proposal>,
    leads: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl baton::server::replicate::Replicator for ProvedLog {
    fn propose(
        &self,
        proposal: &baton::server::state::Proposal,
    ) -> baton::server::replicate::Proposed {
        let _ = self.tx.send(proposal.clone());
        baton::server::replicate::Proposed::Later
    }

    fn applies_at_once(&self) -> bool {
        false
    }

    fn read_barrier(&self) -> baton::server::replicate::Barrier {
        let leads = self.leads.clone();
        Box::pin(async move {
            if leads.load(std::sync::atomic::Ordering::SeqCst) {
                Ok(())
            } else {
                Err(baton::server::replicate::NotLeading)
            }
        })
    }
}

/// Pins the stale read `baton chaos` found (a deposed leader, cut off from
/// the other members, answered reads from its old state for a second): a
/// read barrier covers the requests received before it began, and the
/// connection counted what it had received from its first byte but where a
/// request starts from the first request after the handshake, so a read
/// sent after a barrier began, shorter than the handshake, counted as
/// covered by it and was answered with no proof that the server still led.
#[tokio::test]
async fn a_read_sent_after_a_leadership_proof_began_waits_for_a_proof_of_its_own() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (server, applier) = baton::server::Server::member(listener, fast_config()).unwrap();
    let leads = Arc::new(AtomicBool::new(true));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    applier.set_log(Arc::new(ProvedLog {
        tx,
        leads: leads.clone(),
    }));
    let committer = {
        let applier = applier.clone();
        tokio::spawn(async move {
            while let Some(proposal) = rx.recv().await {
                applier.apply(&[proposal]);
            }
        })
    };
    applier.lead();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    // A handshake far longer than a read: a token (this server checks no
    // identities, and ignores it).
    let mut raw = Raw::connect(&addr).await;
    let mut hello = ConnectRequest::new(5_000);
    hello.token = Some(baton::proto::handshake::Token(
        vec![b't'; baton::proto::handshake::MAX_TOKEN].into(),
    ));
    let granted = raw.handshake(&hello).await;
    assert!(granted.result.is_ok(), "{granted:?}");
    let exists = || Request::Exists {
        path: "/".into(),
        watch: false,
    };
    // Proven: answered.
    let first = within(10, "the first read", raw.call(exists())).await;
    assert!(first.is_ok(), "{first:?}");
    // Deposed now: the next read must wait for a proof, which fails.
    leads.store(false, Ordering::SeqCst);
    raw.send(exists()).await;
    let notice = within(10, "the connection to end", raw.expect_disconnect()).await;
    assert_eq!(
        notice.code,
        ErrorCode::NotLeader,
        "a read was answered with no proof that the server leads"
    );
    let _ = stop.send(());
    let _ = within(10, "the server to stop", serving).await;
    committer.abort();
}
