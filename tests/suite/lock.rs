//! The fair, herd-free lock and its fencing tokens, against a real server.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::proto::OpCode;
use baton::recipes::{LeaseState, LostReason};
use baton::{Client, CreateMode, Error, FencingToken, Lock, SessionState};
use baton_testkit::*;
use futures::FutureExt;

/// Opens `n` sessions on the server.
async fn sessions(server: &TestServer, n: usize) -> Vec<Client> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(server.client().await);
    }
    clients
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_contenders_never_overlap() {
    let server = TestServer::start().await;
    let clients = sessions(&server, 200).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let lock = Lock::new(c, "/locks/mutex");
            let (inside, overlaps, tokens) = (inside.clone(), overlaps.clone(), tokens.clone());
            tokio::spawn(async move {
                let guard = lock.acquire().await.expect("acquire");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokens.lock().unwrap().push(guard.token());
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            })
        })
        .collect();
    within(60, "200 contenders to finish", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "critical sections overlapped"
    );
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 200);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "each grant's token is greater than the one before"
    );
    for c in clients {
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_arrival_order_with_one_notification_per_handover() {
    let server = TestServer::start().await;
    let holder = server.client().await;
    let first = Lock::new(&holder, "/locks/fifo").acquire().await.unwrap();
    const WAITERS: usize = 50;
    let clients = sessions(&server, WAITERS).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let lock = Lock::new(c, "/locks/fifo");
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            order.lock().unwrap().push((i, guard.token()));
            guard.release().await.unwrap();
        }));
        // The next waiter arrives only once this one is queued.
        let queued = 2 + i;
        let lock = Lock::new(&holder, "/locks/fifo");
        within(10, "the waiter to queue", async {
            while lock.contenders().await.unwrap().len() < queued {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }
    let events_before = server.stats().watch_events;
    first.release().await.unwrap();
    within(30, "every waiter to be served", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    let order = order.lock().unwrap().clone();
    let arrival: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        arrival,
        (0..WAITERS).collect::<Vec<_>>(),
        "grants in arrival order"
    );
    // Each handover wakes the next waiter alone: one watch event each.
    let events = server.stats().watch_events - events_before;
    assert_eq!(
        events, WAITERS as u64,
        "watch events for {WAITERS} handovers"
    );
    holder.close().await;
    for c in clients {
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn try_acquire_takes_a_free_lock_and_leaves_no_node_when_busy() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let b = server.client().await;
    let held = Lock::new(&a, "/locks/try")
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(Lock::new(&b, "/locks/try")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let queue = within(5, "the refused contender to leave", async {
        loop {
            let queue = Lock::new(&a, "/locks/try").contenders().await.unwrap();
            if queue.len() == 1 {
                return queue;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(queue[0].node, held.node());
    assert_eq!(queue[0].owner, Some(a.session_id()));
    assert_eq!(queue[0].token, held.token());
    a.close().await;
    b.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_cancelled_acquire_leaves_no_node() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let b = server.client().await;
    let _held = Lock::new(&a, "/locks/cancel").acquire().await.unwrap();
    let waiting = Lock::new(&b, "/locks/cancel");
    assert!(waiting
        .acquire_timeout(Duration::from_millis(100))
        .await
        .unwrap()
        .is_none());
    // Dropping an acquire at once, while its create may still be in flight.
    for _ in 0..20 {
        let fut = Box::pin(waiting.acquire());
        drop(futures::FutureExt::now_or_never(fut));
    }
    let lock = Lock::new(&a, "/locks/cancel");
    eventually_async(10, "the cancelled contenders to leave", || async {
        lock.contenders().await.unwrap().len() == 1
    })
    .await;
    a.close().await;
    b.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_cancelled_acquire_does_not_keep_a_dropped_client_alive() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    observer
        .create("/res", "", CreateMode::Persistent)
        .await
        .unwrap();
    let proxy = Proxy::start(server.addr).await;
    let client = connect_with_timeout(&proxy.addr(), Duration::from_secs(3)).await;
    client
        .create("/alive", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    // Nothing gets through: the enqueue and the write wait unanswered.
    proxy.hold();
    let lock = Lock::new(&client, "/locks/abandoned");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), lock.acquire())
            .await
            .is_err()
    );
    let write = client.set_data("/res", "stale", None);
    assert!(tokio::time::timeout(Duration::from_millis(100), write)
        .await
        .is_err());
    // The application gives the session up: it must expire, and nothing it
    // left unanswered may be sent again on a new connection.
    drop(lock);
    drop(client);
    proxy.sever();
    eventually_async(10, "the session to expire", || async {
        observer.exists("/alive").await.unwrap().is_none()
    })
    .await;
    assert_eq!(&observer.get_data("/res").await.unwrap().0[..], b"");
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn tokens_keep_increasing_after_the_lock_node_is_deleted_and_recreated() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let mut last = FencingToken(0);
    for _ in 0..3 {
        let guard = Lock::new(&c, "/locks/recreated/l").acquire().await.unwrap();
        assert!(guard.token() > last, "{} after {last}", guard.token());
        last = guard.token();
        guard.release().await.unwrap();
        c.delete("/locks/recreated/l", None).await.unwrap();
        c.delete("/locks/recreated", None).await.unwrap();
    }
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn lost_fires_when_the_session_expires_and_when_the_node_is_deleted() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let short = server.client_with_timeout(Duration::from_millis(300)).await;
    let guard = Lock::new(&short, "/locks/lost").acquire().await.unwrap();
    assert_eq!(guard.state(), LeaseState::Held);
    admin.delete(guard.node(), None).await.unwrap();
    assert_eq!(
        within(5, "lost", guard.lost()).await,
        LostReason::NodeDeleted
    );
    assert!(guard.is_lost());

    let proxy = Proxy::start(server.addr).await;
    let cut = connect_with_timeout(&proxy.addr(), Duration::from_millis(300)).await;
    let guard = Lock::new(&cut, "/locks/lost").acquire().await.unwrap();
    // The network fails: the connection goes silent and no new one gets
    // through. The lease must end by the client's own clock, without a word
    // from the server.
    proxy.hold();
    proxy.block();
    let reason = within(5, "lost without the server", guard.lost()).await;
    assert!(
        matches!(
            reason,
            LostReason::DeadlinePassed | LostReason::SessionExpired
        ),
        "{reason:?}"
    );
    assert!(guard.is_lost());
    // The server expires the session and the next contender gets the lock.
    let next = within(
        10,
        "the next holder",
        Lock::new(&admin, "/locks/lost").acquire(),
    )
    .await
    .unwrap();
    assert!(next.token() > guard.token());
    short.close().await;
    admin.close().await;
    server.stop().await;
}

#[tokio::test]
async fn lost_fires_before_the_server_may_expire_the_session() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let timeout = Duration::from_millis(1000);
    let client = connect_with_timeout(&proxy.addr(), timeout).await;
    let guard = Lock::new(&client, "/locks/early").acquire().await.unwrap();
    proxy.hold();
    proxy.block();
    let reason = within(10, "the lease to run out", guard.lost()).await;
    let now = tokio::time::Instant::now();
    assert_eq!(reason, LostReason::DeadlinePassed);
    // By default the holder is told a tenth of the session timeout before
    // the server may expire its session.
    let deadline = client.session_deadline();
    assert!(
        now < deadline,
        "told {:?} after the deadline",
        now - deadline
    );
    assert!(deadline - now <= timeout / 10, "{:?} early", deadline - now);
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn lost_fires_the_chosen_margin_before_the_session_deadline() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = connect_with_timeout(&proxy.addr(), Duration::from_millis(1000)).await;
    let margin = Duration::from_millis(400);
    let guard = Lock::new(&client, "/locks/margin")
        .stop_before(margin)
        .acquire()
        .await
        .unwrap();
    proxy.hold();
    proxy.block();
    let reason = within(10, "the lease to run out", guard.lost()).await;
    let now = tokio::time::Instant::now();
    assert_eq!(reason, LostReason::DeadlinePassed);
    let left = client.session_deadline() - now;
    // Told when the margin was left, give or take the wake-up.
    assert!(left <= margin, "{left:?} left");
    assert!(left >= margin - Duration::from_millis(100), "{left:?} left");
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_margin_over_half_the_session_timeout_is_refused() {
    let server = TestServer::start().await;
    let client = server
        .client_with_timeout(Duration::from_millis(1000))
        .await;
    let refused = Lock::new(&client, "/locks/wide")
        .stop_before(Duration::from_millis(600))
        .acquire()
        .await;
    match refused {
        Err(Error::BadArguments(message)) => {
            assert!(message.contains("600 ms"), "{message}");
            assert!(message.contains("1000 ms"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(Lock::new(&client, "/locks/wide")
        .contenders()
        .await
        .unwrap()
        .is_empty());
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_lost_lock_stays_lost_when_a_late_answer_moves_the_deadline() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.addr).await;
    let client = connect_with_timeout(&proxy.addr(), Duration::from_secs(2)).await;
    let guard = Lock::new(&client, "/locks/late").acquire().await.unwrap();
    // The server hears every request, the resume's handshake included, so
    // the session lives on; the client hears nothing back, so by its own
    // clock the lease runs out.
    proxy.hold_replies_everywhere();
    let reason = within(10, "the lease to run out", guard.lost()).await;
    assert_eq!(reason, LostReason::DeadlinePassed);
    assert!(guard.is_lost());
    // The held answers arrive late; the resume's answer moves the session
    // deadline on, but what was lost stays lost.
    proxy.release();
    wait_state(&client, SessionState::Reconnected).await;
    assert!(
        client.session_deadline() > tokio::time::Instant::now(),
        "the late answer moved the deadline on"
    );
    assert!(guard.is_lost(), "lost, then not lost");
    assert_eq!(guard.state(), LeaseState::Lost(LostReason::DeadlinePassed));
    assert_eq!(
        guard.lost().now_or_never(),
        Some(LostReason::DeadlinePassed)
    );
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn an_acquire_in_progress_fails_when_its_session_expires() {
    let server = TestServer::start().await;
    let holder = server.client().await;
    let _held = Lock::new(&holder, "/locks/expire").acquire().await.unwrap();
    let proxy = Proxy::start(server.addr).await;
    let waiter = connect_with_timeout(&proxy.addr(), Duration::from_millis(300)).await;
    let lock = Lock::new(&waiter, "/locks/expire");
    let acquiring = tokio::spawn(async move { lock.acquire().await.map(|g| g.token()) });
    within(5, "the waiter to queue", async {
        while Lock::new(&holder, "/locks/expire")
            .contenders()
            .await
            .unwrap()
            .len()
            < 2
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    proxy.sever();
    proxy.block();
    // The server expires the silent session, which takes the waiter's node;
    // once the network is back the client hears so.
    eventually(10, "the server to expire the waiter's session", || {
        server.stats().sessions_expired >= 1
    })
    .await;
    proxy.unblock();
    let result = within(10, "the acquire to fail", acquiring).await.unwrap();
    assert!(
        matches!(result, Err(Error::SessionExpired(_))),
        "{result:?}"
    );
    holder.close().await;
    server.stop().await;
}

#[tokio::test]
async fn fenced_writes_refuse_a_deposed_holder() {
    let server = TestServer::start().await;
    let store = server.client().await;
    store
        .create("/data", "", CreateMode::Persistent)
        .await
        .unwrap();
    let a = server.client_with_timeout(Duration::from_millis(300)).await;
    let b = server.client().await;
    let first = Lock::new(&a, "/locks/fenced").acquire().await.unwrap();
    store
        .set_data_fenced("/data", "from a", first.token().get())
        .await
        .unwrap();
    // a's lease runs out (its session is closed here); b takes over.
    let old = first.token();
    a.close().await;
    let second = Lock::new(&b, "/locks/fenced").acquire().await.unwrap();
    assert!(second.token() > old);
    store
        .set_data_fenced("/data", "from b", second.token().get())
        .await
        .unwrap();
    // a's late write, with its old token, is refused and changes nothing.
    let late = store.set_data_fenced("/data", "late a", old.get()).await;
    match late {
        Err(Error::StaleFence(message)) => {
            assert!(message.contains(&old.to_string()), "{message}");
            assert!(message.contains(&second.token().to_string()), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(&store.get_data("/data").await.unwrap().0[..], b"from b");
    // check token: only the live holder's token names a node.
    let live = store
        .check_token("/locks/fenced", second.token().get())
        .await
        .unwrap();
    assert_eq!(live.map(|(p, _)| p), Some(second.node().to_owned()));
    assert!(store
        .check_token("/locks/fenced", old.get())
        .await
        .unwrap()
        .is_none());
    b.close().await;
    store.close().await;
    server.stop().await;
}

/// Cuts the waiter's connection while its create is in flight, either
/// before the server sees it (`requests_held`) or after the server applied it
/// but before the reply arrived; either way the waiter ends with one node.
async fn cut_during_create(requests_held: bool) {
    let server = TestServer::start().await;
    let observer = server.client().await;
    let holder = server.client().await;
    let held = Lock::new(&holder, "/locks/orphan").acquire().await.unwrap();
    let proxy = Proxy::start(server.addr).await;
    let waiter = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    let lock = Lock::new(&observer, "/locks/orphan");
    let mine = |queue: &[baton::recipes::Contender]| {
        queue
            .iter()
            .filter(|c| c.owner == Some(waiter.session_id()))
            .count()
    };
    if requests_held {
        proxy.hold_requests();
    } else {
        proxy.hold_replies();
    }
    let waiting = Lock::new(&waiter, "/locks/orphan");
    let acquiring = tokio::spawn(async move { waiting.acquire().await });
    if requests_held {
        tokio::task::yield_now().await;
    } else {
        eventually_async(10, "the create to be applied", || async {
            mine(&lock.contenders().await.unwrap()) == 1
        })
        .await;
    }
    proxy.sever();
    // After the resume the waiter has exactly one node in the queue.
    eventually_async(10, "the waiter to be queued once", || async {
        mine(&lock.contenders().await.unwrap()) == 1
    })
    .await;
    held.release().await.unwrap();
    let guard = within(10, "the waiter to get the lock", acquiring)
        .await
        .unwrap()
        .unwrap();
    let queue = lock.contenders().await.unwrap();
    assert_eq!(queue.len(), 1, "{queue:?}");
    assert_eq!(queue[0].node, guard.node());
    guard.release().await.unwrap();
    observer.close().await;
    holder.close().await;
    waiter.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_connection_cut_before_the_create_arrives_leaves_no_orphan() {
    cut_during_create(true).await;
}

#[tokio::test]
async fn a_connection_cut_after_the_create_was_applied_leaves_no_orphan() {
    cut_during_create(false).await;
}

#[tokio::test]
async fn acquire_gives_up_when_the_connection_breaks_at_every_enqueue() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    let proxy = Proxy::start(server.addr).await;
    proxy.cut_at(OpCode::Enqueue);
    let client = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    let result = within(
        10,
        "the acquire to give up",
        Lock::new(&client, "/locks/cut").acquire(),
    )
    .await;
    match result {
        Err(Error::ConnectionLoss(message)) => {
            assert!(message.contains("/locks/cut"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The session lives on, and nothing was left in the queue.
    within(10, "the client to work again", client.ping())
        .await
        .unwrap();
    let queue = Lock::new(&observer, "/locks/cut")
        .contenders()
        .await
        .unwrap();
    assert!(queue.is_empty(), "{queue:?}");
    client.close().await;
    observer.close().await;
    server.stop().await;
}

/// Records that a future polled by hand was woken.
struct Woken(AtomicBool);

impl std::task::Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `fut` once and waits until it is woken (its answer has reached it),
/// without polling it again; returns it unread, to be dropped as when the
/// other branch of a `select!` wins on the same wake-up.
async fn answered_unread<F: Future>(fut: F) -> impl Sized {
    let woken = Arc::new(Woken(AtomicBool::new(false)));
    let waker = std::task::Waker::from(woken.clone());
    let mut fut = Box::pin(tokio::task::unconstrained(fut));
    let first = fut
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&waker));
    assert!(first.is_pending());
    eventually(10, "the answer to reach the call", || {
        woken.0.load(Ordering::SeqCst)
    })
    .await;
    fut
}

#[tokio::test]
async fn an_enqueue_dropped_with_its_answer_unread_leaves_no_node() {
    let server = TestServer::start().await;
    let client = server.client().await;
    client
        .create("/queue", "", CreateMode::Persistent)
        .await
        .unwrap();
    let enqueue = answered_unread(client.enqueue("/queue/n-", "")).await;
    assert_eq!(client.get_children("/queue").await.unwrap().0.len(), 1);
    drop(enqueue);
    eventually_async(10, "the dropped node to go", || async {
        client.get_children("/queue").await.unwrap().0.is_empty()
    })
    .await;
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn an_acquire_dropped_with_its_answer_unread_leaves_no_node() {
    let server = TestServer::start().await;
    let holder = server.client().await;
    let waiter = server.client().await;
    let _held = Lock::new(&holder, "/locks/late").acquire().await.unwrap();
    let lock = Lock::new(&waiter, "/locks/late");
    let acquire = answered_unread(lock.acquire()).await;
    assert_eq!(lock.contenders().await.unwrap().len(), 2);
    drop(acquire);
    eventually_async(10, "the dropped contender to leave", || async {
        lock.contenders().await.unwrap().len() == 1
    })
    .await;
    holder.close().await;
    waiter.close().await;
    server.stop().await;
}

#[tokio::test]
async fn an_acquire_cancelled_while_its_enqueue_outcome_is_unknown_leaves_no_node() {
    let server = TestServer::start().await;
    let observer = server.client().await;
    observer
        .create("/locks", "", CreateMode::Persistent)
        .await
        .unwrap();
    observer
        .create("/locks/lost", "", CreateMode::Persistent)
        .await
        .unwrap();
    let (_, before) = observer.get_data("/locks").await.unwrap();
    let proxy = Proxy::start(server.addr).await;
    let waiter = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    // The enqueue is applied, but its answer stays in the proxy.
    proxy.hold_replies();
    let cancelled = Lock::new(&waiter, "/locks/lost");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), cancelled.acquire())
            .await
            .is_err()
    );
    // A later change from the same session: the server then keeps its reply
    // only, so the enqueue, sent again after the resume, is answered "result
    // lost": its outcome is unknown to the client.
    let setter = waiter.clone();
    let set = tokio::spawn(async move { setter.set_data("/locks", "", None).await });
    eventually_async(10, "the later change to be applied", || async {
        observer.get_data("/locks").await.unwrap().1.version > before.version
    })
    .await;
    proxy.sever();
    within(10, "the later change to be answered", set)
        .await
        .unwrap()
        .unwrap();
    let lock = Lock::new(&observer, "/locks/lost");
    eventually_async(10, "the cancelled contender to leave", || async {
        lock.contenders().await.unwrap().is_empty()
    })
    .await;
    waiter.close().await;
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_release_cancelled_while_waiting_for_room_still_releases() {
    let server = TestServer::start().await;
    let other = server.client().await;
    let proxy = Proxy::start(server.addr).await;
    let holder = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    holder
        .create("/big", "", CreateMode::Persistent)
        .await
        .unwrap();
    let guard = Lock::new(&holder, "/locks/stalled")
        .acquire()
        .await
        .unwrap();
    let writes = stall_behind_big_writes(&holder, &proxy, "/big").await;
    // The release's delete waits in line behind the writes; the caller
    // gives up on it there.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), guard.release())
            .await
            .is_err()
    );
    proxy.release();
    let lock = Lock::new(&other, "/locks/stalled");
    eventually_async(10, "the lock to be free", || async {
        match lock.try_acquire().await.unwrap() {
            Some(guard) => {
                guard.release().await.unwrap();
                true
            }
            None => false,
        }
    })
    .await;
    for write in writes {
        within(10, "the writes to be answered", write)
            .await
            .unwrap()
            .unwrap();
    }
    holder.close().await;
    other.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_release_whose_delete_is_lost_with_the_connection_still_releases() {
    let server = TestServer::start().await;
    let other = server.client().await;
    let proxy = Proxy::start(server.addr).await;
    proxy.cut_at(OpCode::Delete);
    let holder = connect_with_timeout(&proxy.addr(), Duration::from_secs(10)).await;
    let guard = Lock::new(&holder, "/locks/unsure").acquire().await.unwrap();
    // Every connection the delete is sent on breaks: its outcome is unknown.
    let released = within(10, "the release to give up", guard.release()).await;
    assert!(
        matches!(released, Err(Error::ConnectionLoss(_))),
        "{released:?}"
    );
    proxy.stop_cutting();
    let lock = Lock::new(&other, "/locks/unsure");
    eventually_async(10, "the lock to be free", || async {
        match lock.try_acquire().await.unwrap() {
            Some(guard) => {
                guard.release().await.unwrap();
                true
            }
            None => false,
        }
    })
    .await;
    holder.close().await;
    other.close().await;
    server.stop().await;
}
