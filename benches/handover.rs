//! Lock handovers end to end, in one process: a real server on 127.0.0.1
//! (port 0, state in memory), and `contenders` clients, each its own session
//! on its own connection, contending for one lock with the lock recipe.
//!
//! Each contender loops: acquire, report the grant, wait for its turn to
//! release, release, and join the queue again. One iteration lets the holder
//! release and waits until the next contender holds the lock: the time of one
//! handover (the delete, the server's head event to the next in line, its
//! grant), with the other contenders waiting in the queue all along.
//!
//! Everything is bounded: each handover must come within 10 s, divan stops a
//! benchmark after 10 s, and the clients and the server are stopped after it.

use std::sync::Arc;
use std::time::Duration;

use baton::server::{Config, Server};
use baton::{Client, Lock};
use divan::counter::ItemsCount;
use divan::Bencher;
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::timeout;

fn main() {
    divan::main();
}

const LOCK: &str = "/locks/orders";
/// The longest any one step may take before the benchmark gives up.
const STEP_LIMIT: Duration = Duration::from_secs(10);

/// Time per handover, with `contenders` sessions queued on one lock.
#[divan::bench(args = [10, 100], sample_count = 500, sample_size = 10, max_time = 10)]
fn contenders(bencher: Bencher, contenders: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut rig = rt.block_on(Rig::start(contenders));
    bencher
        .counter(ItemsCount::new(1usize))
        .bench_local(|| rt.block_on(rig.handover()));
    rt.block_on(rig.stop());
    rt.shutdown_timeout(Duration::from_secs(5));
}

/// A server and contenders for one lock, one of which holds it and waits
/// for a permit to release.
struct Rig {
    clients: Vec<Client>,
    contenders: Vec<JoinHandle<()>>,
    /// One permit lets the holder release once.
    permits: Arc<Semaphore>,
    /// Grants so far.
    grants: watch::Receiver<u64>,
    stop_server: oneshot::Sender<()>,
    server: JoinHandle<()>,
}

impl Rig {
    async fn start(contenders: usize) -> Rig {
        let config = Config {
            data_dir: None,
            ..Config::default()
        };
        let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
        let addr = server.local_addr().expect("local address").to_string();
        let (stop_server, stopped) = oneshot::channel();
        let server = tokio::spawn(async move {
            server
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("the server ran");
        });
        let mut clients = Vec::with_capacity(contenders);
        for _ in 0..contenders {
            let client = timeout(STEP_LIMIT, Client::connect(&addr))
                .await
                .expect("connected within the limit")
                .expect("connect");
            clients.push(client);
        }
        let permits = Arc::new(Semaphore::new(0));
        let (report, grants) = watch::channel(0u64);
        let report = Arc::new(report);
        let tasks = clients
            .iter()
            .map(|c| tokio::spawn(contend(Lock::new(c, LOCK), permits.clone(), report.clone())))
            .collect();
        let mut rig = Rig {
            clients,
            contenders: tasks,
            permits,
            grants,
            stop_server,
            server,
        };
        // Every contender queued, one of them holding the lock.
        let lock = Lock::new(&rig.clients[0], LOCK);
        timeout(STEP_LIMIT, async {
            loop {
                let queued = lock.contenders().await.expect("list the contenders");
                if queued.len() == contenders {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("all contenders queued within the limit");
        timeout(STEP_LIMIT, rig.grants.wait_for(|&n| n >= 1))
            .await
            .expect("a first grant within the limit")
            .expect("contenders running");
        rig
    }

    /// Lets the holder release, and waits for the next grant.
    async fn handover(&mut self) {
        let next = *self.grants.borrow() + 1;
        self.permits.add_permits(1);
        timeout(STEP_LIMIT, self.grants.wait_for(|&n| n >= next))
            .await
            .expect("a handover within the limit")
            .expect("contenders running");
    }

    async fn stop(self) {
        self.permits.close();
        for task in &self.contenders {
            task.abort();
        }
        for task in self.contenders {
            let _ = task.await;
        }
        let closing = futures::future::join_all(self.clients.iter().map(|c| c.close()));
        timeout(STEP_LIMIT, closing)
            .await
            .expect("clients closed within the limit");
        let _ = self.stop_server.send(());
        timeout(STEP_LIMIT, self.server)
            .await
            .expect("the server stopped within the limit")
            .expect("the server task");
    }
}

/// One contender: acquire, report, wait for a permit, release, again; until
/// the permits are closed or something fails (the benchmark then sees no
/// grant and gives up).
async fn contend(lock: Lock, permits: Arc<Semaphore>, grants: Arc<watch::Sender<u64>>) {
    loop {
        let guard = match lock.acquire().await {
            Ok(guard) => guard,
            Err(e) => {
                eprintln!("a contender stopped: acquire failed: {e}");
                return;
            }
        };
        grants.send_modify(|n| *n += 1);
        match permits.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return,
        }
        if let Err(e) = guard.release().await {
            eprintln!("a contender stopped: release failed: {e}");
            return;
        }
    }
}
