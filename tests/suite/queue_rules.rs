//! The read-write lock and the semaphore: the queue rules `shared` and
//! `permits(n)` applied by the server, under many contenders with
//! cancellations and sessions that expire while they hold, in arrival
//! order, with one wake-up per grant.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::recipes::{RwLock, Semaphore};
use baton::{Client, CreateMode, Error, Liveness, LockGuard};
use baton_testkit::*;
use tokio::sync::{mpsc, oneshot};

/// What a contender asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Reader,
    Writer,
    Permit,
}

/// Who is inside now, as the contenders saw it, and what they saw wrong.
#[derive(Default)]
struct Board {
    readers: AtomicUsize,
    writers: AtomicUsize,
    holders: AtomicUsize,
    most_readers: AtomicUsize,
    most_holders: AtomicUsize,
    wrong: Mutex<Vec<String>>,
    grants: AtomicUsize,
    expired: AtomicUsize,
}

impl Board {
    fn enter(&self, role: Role, permits: usize, who: usize) {
        let h = self.holders.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_holders.fetch_max(h, Ordering::SeqCst);
        self.grants.fetch_add(1, Ordering::SeqCst);
        let wrong = match role {
            Role::Writer => {
                let w = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
                let r = self.readers.load(Ordering::SeqCst);
                (w != 1 || r != 0)
                    .then(|| format!("writer {who} entered with {w} writers and {r} readers"))
            }
            Role::Reader => {
                let r = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_readers.fetch_max(r, Ordering::SeqCst);
                let w = self.writers.load(Ordering::SeqCst);
                (w != 0).then(|| format!("reader {who} entered with {w} writers"))
            }
            Role::Permit => {
                (h > permits).then(|| format!("permit {who} made {h} holders of {permits}"))
            }
        };
        if let Some(w) = wrong {
            self.wrong.lock().unwrap().push(w);
        }
    }

    fn leave(&self, role: Role) {
        self.holders.fetch_sub(1, Ordering::SeqCst);
        match role {
            Role::Writer => self.writers.fetch_sub(1, Ordering::SeqCst),
            Role::Reader => self.readers.fetch_sub(1, Ordering::SeqCst),
            Role::Permit => 0,
        };
    }
}

/// A small deterministic random source per contender.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

const REGISTER: &str = "/data/register";

/// While it holds, a writer writes its token to the register, fenced,
/// and a reader checks in a transaction that the register accepts its
/// token: no newer writer has written. Both must pass while they hold.
async fn use_register(client: &Client, role: Role, guard: &LockGuard, who: usize, board: &Board) {
    let token = guard.token().get();
    let result = match role {
        Role::Writer => client
            .set_data_fenced(REGISTER, token.to_string(), token)
            .await
            .map(drop),
        Role::Reader => client
            .txn()
            .check_fence(REGISTER, token)
            .commit()
            .await
            .map(drop),
        Role::Permit => client
            .check_token(guard.node().rsplit_once('/').unwrap().0, token)
            .await
            .and_then(|held| {
                held.map(drop)
                    .ok_or_else(|| Error::NoNode("not a member".into()))
            }),
    };
    if let Err(e) = result {
        board
            .wrong
            .lock()
            .unwrap()
            .push(format!("{role:?} {who} with token {token}: {e}"));
    }
}

/// Which recipe the contenders take.
#[derive(Clone, Copy)]
enum Shelf {
    Lock,
    RwLock,
    Semaphore(u32),
}

/// `contenders` contenders, each on its own session, take `path` four
/// times each by `shelf`'s recipe: one in eight acquires is cancelled
/// after a random moment, and one contender in ten holds a grant while its
/// process stops (its connection is frozen) until its session expires.
/// Returns the board.
async fn contend(path: &'static str, shelf: Shelf, contenders: usize) -> Arc<Board> {
    let permits = match shelf {
        Shelf::Semaphore(n) => Some(n),
        _ => None,
    };
    let server = TestServer::with_config(fast_config()).await;
    let store = server.client().await;
    store
        .create("/data", "", CreateMode::Persistent)
        .await
        .unwrap();
    store
        .create(REGISTER, "0", CreateMode::Persistent)
        .await
        .unwrap();
    let board = Arc::new(Board::default());
    let mut tasks = Vec::new();
    let mut proxies = Vec::new();
    for who in 0..contenders {
        let pauses = who % 10 == 9;
        let (client, proxy) = if pauses {
            let proxy = Arc::new(Proxy::start(server.addr().parse().unwrap()).await);
            proxies.push(proxy.clone());
            let client = connect_with_timeout(&proxy.addr(), Duration::from_millis(600)).await;
            (client, Some(proxy))
        } else {
            (server.client().await, None)
        };
        let (board, store) = (board.clone(), store.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(who as u64 + 1);
            let rw = RwLock::new(&client, path);
            let lock = baton::Lock::new(&client, path);
            let sem = permits.map(|n| Semaphore::new(&client, path, n));
            for round in 0..4 {
                let role = match shelf {
                    Shelf::Semaphore(_) => Role::Permit,
                    Shelf::Lock => Role::Writer,
                    Shelf::RwLock if rng.next(3) == 0 => Role::Writer,
                    Shelf::RwLock => Role::Reader,
                };
                let acquire = async {
                    match (&sem, shelf, role) {
                        (Some(s), _, _) => s.acquire().await,
                        (None, Shelf::Lock, _) => lock.acquire().await,
                        (None, _, Role::Writer) => rw.write().await,
                        (None, _, _) => rw.read().await,
                    }
                };
                // (A contender that will pause is never cancelled.)
                let guard = if proxy.is_none() && rng.next(8) == 0 {
                    let moment = Duration::from_micros(rng.next(3_000));
                    match tokio::time::timeout(moment, acquire).await {
                        Ok(guard) => guard.unwrap(),
                        Err(_) => continue, // cancelled: withdrawn in the background
                    }
                } else {
                    acquire.await.unwrap()
                };
                board.enter(role, permits.unwrap_or(0) as usize, who);
                use_register(&client, role, &guard, who, &board).await;
                if let (Some(proxy), 1) = (&proxy, round) {
                    // The process stops while it holds. Its guard says when
                    // to stop acting (before the server may expire the
                    // session); then the session expires and the next
                    // contenders go on.
                    proxy.block();
                    proxy.hold();
                    within(
                        10,
                        "the paused holder to learn its lease is lost",
                        guard.lost(),
                    )
                    .await;
                    board.leave(role);
                    let session = client.session_id();
                    eventually_async(10, "the paused holder's session to expire", || {
                        let store = store.clone();
                        async move {
                            store.session_status(session).await.unwrap().liveness == Liveness::Gone
                        }
                    })
                    .await;
                    board.expired.fetch_add(1, Ordering::SeqCst);
                    drop(guard);
                    return;
                }
                for _ in 0..rng.next(20) {
                    tokio::task::yield_now().await;
                }
                board.leave(role);
                guard.release().await.unwrap();
            }
            client.close().await;
        }));
    }
    for t in tasks {
        within(120, "the contenders", t).await.unwrap();
    }
    // Cancelled acquires leave nothing behind once withdrawn.
    eventually_async(10, "the queue to empty", || {
        let store = store.clone();
        async move { store.get_children(path).await.unwrap().0.is_empty() }
    })
    .await;
    let wrong = board.wrong.lock().unwrap().clone();
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(board.expired.load(Ordering::SeqCst), contenders / 10);
    for p in proxies {
        p.release();
    }
    store.close().await;
    server.stop().await;
    board
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_readers_share_and_writers_exclude_under_sixty_contenders_with_cancellations_and_expiries(
) {
    let board = contend("/locks/rw", Shelf::RwLock, 60).await;
    assert!(
        board.most_readers.load(Ordering::SeqCst) > 1,
        "readers never shared the lock"
    );
    assert!(board.grants.load(Ordering::SeqCst) >= 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_never_grants_more_than_its_permits_under_sixty_contenders_with_cancellations_and_expiries(
) {
    let board = contend("/semaphores/s", Shelf::Semaphore(3), 60).await;
    assert_eq!(
        board.most_holders.load(Ordering::SeqCst),
        3,
        "the permits were never all in use at once"
    );
}

/// The plain lock under the same faults: writers only, one at a time, each
/// write fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_excludes_under_sixty_contenders_with_cancellations_and_expiries() {
    let board = contend("/locks/plain", Shelf::Lock, 60).await;
    assert_eq!(board.most_holders.load(Ordering::SeqCst), 1);
    assert!(board.grants.load(Ordering::SeqCst) >= 60);
}

/// A contender that reports its grant and holds until told to release.
struct Held {
    granted: mpsc::UnboundedReceiver<usize>,
    release: Vec<Option<oneshot::Sender<()>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    clients: Vec<Client>,
}

impl Held {
    fn new() -> (Self, mpsc::UnboundedSender<usize>) {
        let (tx, granted) = mpsc::unbounded_channel();
        (
            Held {
                granted,
                release: Vec::new(),
                tasks: Vec::new(),
                clients: Vec::new(),
            },
            tx,
        )
    }

    /// Queues contender `who` (`acquire` on `client`), and returns once its
    /// node is in the queue at `path`, so that arrival order is known.
    async fn queue<F>(
        &mut self,
        client: Client,
        granted: &mpsc::UnboundedSender<usize>,
        path: &str,
        acquire: impl FnOnce(Client) -> F,
    ) where
        F: std::future::Future<Output = baton::Result<LockGuard>> + Send + 'static,
    {
        let who = self.release.len();
        let (tx, rx) = oneshot::channel();
        self.release.push(Some(tx));
        let granted = granted.clone();
        let acquiring = acquire(client.clone());
        self.tasks.push(tokio::spawn(async move {
            let guard = acquiring.await.unwrap();
            granted.send(who).unwrap();
            let _ = rx.await;
            guard.release().await.unwrap();
        }));
        let before = self.clients.len();
        self.clients.push(client.clone());
        within(10, "the contender to queue", async {
            loop {
                let n = client.get_children(path).await.map_or(0, |(c, _)| c.len());
                if n > before {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
    }

    /// The contenders granted next, as a set, once `n` of them are.
    async fn next_granted(&mut self, n: usize) -> BTreeSet<usize> {
        let mut got = BTreeSet::new();
        while got.len() < n {
            got.insert(within(10, "a grant", self.granted.recv()).await.unwrap());
        }
        got
    }

    fn release(&mut self, who: usize) {
        self.release[who].take().unwrap().send(()).unwrap();
    }

    async fn finish(self, server: TestServer) {
        for t in self.tasks {
            within(10, "the contenders to finish", t).await.unwrap();
        }
        for c in self.clients {
            c.close().await;
        }
        server.stop().await;
    }
}

/// Readers and writers are served in arrival order: readers that arrived
/// together share the lock, a writer waits for the readers ahead of it and
/// readers behind it wait for it; every contender is woken exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_serves_readers_and_writers_in_arrival_order_with_one_wakeup_each() {
    let server = TestServer::start().await;
    let (mut held, granted) = Held::new();
    // W R R W R R R W: contender 0 takes it first.
    let roles = ["w", "r", "r", "w", "r", "r", "r", "w"];
    for role in roles {
        let client = server.client().await;
        let writes = role == "w";
        held.queue(client, &granted, "/locks/fifo", move |c| async move {
            let lock = RwLock::new(&c, "/locks/fifo");
            if writes {
                lock.write().await
            } else {
                lock.read().await
            }
        })
        .await;
        if held.release.len() == 1 {
            assert_eq!(held.next_granted(1).await, BTreeSet::from([0]));
        }
    }
    let events_before = server.stats().watch_events;
    held.release(0);
    assert_eq!(
        held.next_granted(2).await,
        BTreeSet::from([1, 2]),
        "two readers share"
    );
    held.release(1);
    assert!(
        held.granted.try_recv().is_err(),
        "the writer waits for the second reader"
    );
    held.release(2);
    assert_eq!(held.next_granted(1).await, BTreeSet::from([3]));
    held.release(3);
    assert_eq!(
        held.next_granted(3).await,
        BTreeSet::from([4, 5, 6]),
        "three readers share"
    );
    for who in [5, 4, 6] {
        held.release(who);
    }
    assert_eq!(held.next_granted(1).await, BTreeSet::from([7]));
    held.release(7);
    // One head event per contender granted after the first.
    let events = server.stats().watch_events - events_before;
    assert_eq!(events, 7, "wake-ups for 7 grants");
    held.finish(server).await;
}

/// With 3 permits, 3 holders and 12 waiters: each permit that comes free
/// goes to the first waiter, in arrival order, waking it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_grants_permits_in_arrival_order_with_one_wakeup_each() {
    let server = TestServer::start().await;
    let (mut held, granted) = Held::new();
    for who in 0..15 {
        let client = server.client().await;
        held.queue(client, &granted, "/semaphores/fifo", |c| async move {
            Semaphore::new(&c, "/semaphores/fifo", 3).acquire().await
        })
        .await;
        if who < 3 {
            assert_eq!(held.next_granted(1).await, BTreeSet::from([who]));
        }
    }
    let events_before = server.stats().watch_events;
    // Release the holders in an order of their own: each time the first
    // waiter, and only it, gets the permit.
    let mut holding = vec![1usize, 0, 2];
    for next in 3..15 {
        held.release(holding.remove(0));
        assert_eq!(held.next_granted(1).await, BTreeSet::from([next]));
        holding.push(next);
    }
    for who in holding {
        held.release(who);
    }
    assert_eq!(server.stats().watch_events - events_before, 12);
    held.finish(server).await;
}

/// The members of one queue must agree on their rule: a semaphore of
/// another size, or readers in a semaphore's queue, are refused with a
/// clear error, and 0 permits are refused.
#[tokio::test]
async fn a_queue_refuses_members_whose_rules_disagree() {
    let server = TestServer::start().await;
    let a = server.client().await;
    let b = server.client().await;
    let permit = Semaphore::new(&a, "/semaphores/mixed", 2)
        .acquire()
        .await
        .unwrap();
    match Semaphore::new(&b, "/semaphores/mixed", 5).acquire().await {
        Err(Error::BadArguments(m)) => {
            assert!(m.contains("2 permits") && m.contains("5 permits"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    match RwLock::new(&b, "/semaphores/mixed").read().await {
        Err(Error::BadArguments(m)) => assert!(m.contains("shared"), "{m}"),
        other => panic!("{other:?}"),
    }
    match Semaphore::new(&b, "/semaphores/none", 0).acquire().await {
        Err(Error::BadArguments(m)) => assert!(m.contains("at least 1 permit"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Once the last permit holder leaves, the path takes another rule.
    permit.release().await.unwrap();
    let reader = RwLock::new(&b, "/semaphores/mixed").read().await.unwrap();
    reader.release().await.unwrap();
    a.close().await;
    b.close().await;
    server.stop().await;
}

/// `contenders` lists who holds and who waits as the server decides it.
#[tokio::test]
async fn contenders_say_who_holds_by_the_rule() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let rw = RwLock::new(&c, "/locks/list");
    let r1 = rw.read().await.unwrap();
    let r2 = rw.read().await.unwrap();
    let writer = {
        let rw = rw.clone();
        tokio::spawn(async move { rw.write().await.unwrap() })
    };
    let listed = within(10, "the writer to queue", async {
        loop {
            let list = rw.reader().contenders().await.unwrap();
            if list.len() == 3 {
                break list;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let seen: Vec<(&str, bool)> = listed.iter().map(|c| (c.kind.as_str(), c.holds)).collect();
    assert_eq!(seen, [("read", true), ("read", true), ("write", false)]);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = within(10, "the writer", writer).await.unwrap();
    w.release().await.unwrap();
    c.close().await;
    server.stop().await;
}

/// Lock-delay: a holder whose session expires keeps the lock for the
/// delay (its node stays, owned by no session), then the next waiter is
/// granted it; a holder that releases leaves no such node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_keeps_a_delayed_lock_for_its_delay_and_a_release_is_not_delayed() {
    use baton::Lock;
    let server = TestServer::with_config(fast_config()).await;
    let proxy = Proxy::start(server.addr().parse().unwrap()).await;
    let holder = connect_with_timeout(&proxy.addr(), Duration::from_millis(400)).await;
    let waiter = server.client().await;
    let store = server.client().await;
    let delay = Duration::from_secs(2);
    let held = Lock::new(&holder, "/locks/delayed")
        .lock_delay(delay)
        .acquire()
        .await
        .unwrap();
    let waiting = {
        let w = waiter.clone();
        tokio::spawn(async move { Lock::new(&w, "/locks/delayed").acquire().await })
    };
    eventually_async(10, "the waiter to queue", || {
        let s = store.clone();
        async move { s.get_children("/locks/delayed").await.unwrap().0.len() == 2 }
    })
    .await;
    // The holder's process stops: its session expires.
    proxy.block();
    proxy.hold();
    let session = holder.session_id();
    let alive_until = within(10, "the holder's session to expire", async {
        let mut alive = std::time::Instant::now();
        loop {
            if store.session_status(session).await.unwrap().liveness == Liveness::Gone {
                break alive;
            }
            alive = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Its node is still there, owned by no session, and holds the lock
    // (unless the whole delay has passed since, on a very slow machine).
    let kept = store.exists(held.node()).await.unwrap();
    if alive_until.elapsed() < delay {
        let stat = kept.expect("the expired holder's node is kept for the lock-delay");
        assert_eq!(stat.ephemeral_owner, 0);
        assert!(!waiting.is_finished(), "granted during the lock-delay");
    }
    let granted = within(10, "the grant after the lock-delay", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(store.exists(held.node()).await.unwrap().is_none());
    assert!(granted.token() > held.token());
    // A release leaves nothing behind: no delay for the next.
    let node = granted.node().to_owned();
    granted.release().await.unwrap();
    assert!(store.exists(&node).await.unwrap().is_none());
    drop(held);
    proxy.release();
    waiter.close().await;
    store.close().await;
    server.stop().await;
}
