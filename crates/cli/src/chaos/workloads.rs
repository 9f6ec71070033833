//! What a chaos run's workers do, each recording every operation.
//!
//! Workers that hold something tied to their session (a lock, a
//! leadership, an ephemeral node) run on a thread of their own, with a
//! runtime of their own: when one pauses (the `client-pause` fault) its
//! whole client stops, heartbeats included, as a process in a long garbage
//! collection would, and its lease runs out while it still believes it
//! holds it. It then writes with its old token anyway: the fence, and not
//! only the lock, is what the run tests.

use std::time::Duration;

use baton_chaos::history::{Call, Outcome, Reply};
use baton_client::{Client, CreateMode, Election, Lock, ReadMode};
use tokio::time::Instant;

use super::record::{within, Recorder, Rng};

/// A kind of workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Reads, writes and compare-and-sets of four registers (one of them
    /// with values up to 900 KiB), checked for linearizability.
    Register,
    /// Reads (some after a sync) and writes of three registers by sessions
    /// that read sequentially: what each session sees never goes back and
    /// includes its own writes, a read after a sync sees every write
    /// acknowledged before it, every value read was written.
    Sequential,
    /// Contenders take a lock and write a resource with their token
    /// (pausing between the two, with client-pause), checked for fencing
    /// and for tokens that only grow.
    Fenced,
    /// Increments by compare-and-set, and reads: no increment lost.
    Counter,
    /// Producers and consumers of one queue: every item taken once.
    Queue,
    /// Candidates of one election; leaders write with their epoch.
    Election,
    /// Sessions holding ephemeral nodes, closed or let expire: each node
    /// gone once, and only after its session ended.
    Ephemeral,
    /// `baton lock` processes around a command that writes a resource with
    /// `baton set --fence` (their clocks jumping, with client-clock):
    /// checked for fencing and for tokens that only grow.
    Supervised,
}

/// Where the workers work, and until when.
#[derive(Clone)]
pub struct Ctx {
    pub servers: String,
    pub recorder: Recorder,
    /// No new operation begins after this.
    pub until: Instant,
    /// Whether lease holders pause their own process.
    pub client_pauses: bool,
    /// The session timeout of lease holders (short, so pauses outlast it).
    pub lease_session: Duration,
}

/// The registers; the last takes large values (up to 900 KiB: appends that
/// keep a slow member's connection busy).
pub const REGISTERS: [&str; 4] = [
    "/chaos/reg/a",
    "/chaos/reg/b",
    "/chaos/reg/c",
    "/chaos/reg/large",
];
/// The registers of the sequential workload.
pub const SEQUENTIAL: [&str; 3] = ["/chaos/seq/a", "/chaos/seq/b", "/chaos/seq/c"];
/// Which of [`REGISTERS`] takes large values.
const LARGE: usize = 3;
pub const COUNTER: &str = "/chaos/counter";
pub const LOCK: &str = "/chaos/locks/fenced";
pub const FENCED: &str = "/chaos/fenced";
pub const ELECTION: &str = "/chaos/election";
pub const LEADER_RESOURCE: &str = "/chaos/leader-resource";
/// The lock the supervised holders take, and the resource they write.
pub const SUPERVISED_LOCK: &str = "/chaos/locks/supervised";
pub const SUPERVISED_RESOURCE: &str = "/chaos/supervised";
pub const QUEUE: &str = "/chaos/queue";
pub const EPHEMERALS: &str = "/chaos/ephemeral";
/// A node no workload checks, for the large writes some faults make.
pub const BALLAST: &str = "/chaos/ballast";

/// Makes the nodes the workloads use, at value 0 (version 0).
/// Where every workload's nodes are.
pub const ROOT: &str = "/chaos";

pub async fn set_up(servers: &str) -> baton_client::Result<()> {
    let client = connect(servers, Duration::from_secs(10), Duration::from_secs(10)).await?;
    for path in [
        ROOT,
        "/chaos/reg",
        "/chaos/seq",
        SEQUENTIAL[0],
        SEQUENTIAL[1],
        SEQUENTIAL[2],
        "/chaos/locks",
        QUEUE,
        EPHEMERALS,
        REGISTERS[0],
        REGISTERS[1],
        REGISTERS[2],
        REGISTERS[3],
        COUNTER,
        FENCED,
        LEADER_RESOURCE,
        BALLAST,
        SUPERVISED_RESOURCE,
    ] {
        let data = if path.starts_with("/chaos/reg/")
            || path.starts_with("/chaos/seq/")
            || [COUNTER, FENCED, LEADER_RESOURCE, SUPERVISED_RESOURCE].contains(&path)
        {
            "0"
        } else {
            ""
        };
        client.create(path, data, CreateMode::Persistent).await?;
    }
    client.close().await;
    Ok(())
}

async fn connect(
    servers: &str,
    session: Duration,
    limit: Duration,
) -> baton_client::Result<Client> {
    connect_reading(servers, session, limit, ReadMode::Linearizable).await
}

async fn connect_reading(
    servers: &str,
    session: Duration,
    limit: Duration,
    mode: ReadMode,
) -> baton_client::Result<Client> {
    // Each session starts from the next member in turn: where followers
    // serve clients, the sessions spread over every member.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let list: Vec<&str> = servers.split(',').collect();
    let start = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % list.len();
    let rotated = [&list[start..], &list[..start]].concat().join(",");
    Client::builder(&rotated)
        .session_timeout(session)
        .connect_timeout(limit)
        .read_mode(mode)
        .connect()
        .await
}

/// A worker's session: opened when needed, and again once it has ended.
struct Session {
    servers: String,
    timeout: Duration,
    mode: ReadMode,
    client: Option<Client>,
}

impl Session {
    fn new(ctx: &Ctx, timeout: Duration) -> Session {
        Session {
            servers: ctx.servers.clone(),
            timeout,
            mode: ReadMode::Linearizable,
            client: None,
        }
    }

    /// The client, if one could be had within a few seconds.
    async fn get(&mut self) -> Option<Client> {
        if let Some(c) = &self.client {
            if !c.state().is_terminal() {
                return Some(c.clone());
            }
        }
        let limit = Duration::from_secs(3);
        match connect_reading(&self.servers, self.timeout, limit, self.mode).await {
            Ok(c) => {
                self.client = Some(c.clone());
                Some(c)
            }
            Err(_) => {
                self.client = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        }
    }

    async fn close(&mut self) {
        if let Some(c) = self.client.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
        }
    }
}

/// The number a node's data holds (after it, spaces may pad the data).
pub fn value_of(data: &[u8]) -> u64 {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim_end().parse().ok())
        .unwrap_or(u64::MAX)
}

/// Reads, writes and compare-and-sets of the registers.
pub async fn register(ctx: Ctx, process: u64, mut rng: Rng) {
    let rec = &ctx.recorder;
    let mut session = Session::new(&ctx, Duration::from_secs(10));
    let mut seen = [0u32; 4];
    while Instant::now() < ctx.until {
        let Some(client) = session.get().await else {
            continue;
        };
        let k = if rng.chance(3) {
            LARGE
        } else {
            rng.below(3) as usize
        };
        let key = REGISTERS[k];
        let t = rec.now();
        let roll = rng.below(10);
        let (call, outcome) = if roll < 4 {
            let outcome = match within(client.get_data(key)).await {
                Ok((data, stat)) => {
                    seen[k] = stat.version;
                    Outcome::Ok {
                        reply: Reply::Value {
                            value: value_of(&data),
                            version: stat.version,
                        },
                    }
                }
                Err(o) => o,
            };
            (Call::Read, outcome)
        } else {
            let value = rec.unique();
            let version = (roll >= 7).then_some(seen[k]);
            let mut data = value.to_string();
            if k == LARGE {
                let pad = 300 * 1024 + rng.below(600 * 1024) as usize;
                data.extend(std::iter::repeat_n(' ', pad));
            }
            let outcome = match within(client.set_data(key, data, version)).await {
                Ok(stat) => Outcome::Ok {
                    reply: Reply::Written {
                        version: stat.version,
                    },
                },
                Err(o) => o,
            };
            let call = match version {
                Some(version) => Call::Cas { version, value },
                None => Call::Write { value },
            };
            (call, outcome)
        };
        rec.op(process, key, call, t, outcome);
    }
    session.close().await;
}

/// Reads, reads after a sync, and writes of the sequential registers, by
/// sessions that read sequentially.
pub async fn sequential(ctx: Ctx, process: u64, mut rng: Rng) {
    let rec = &ctx.recorder;
    let mut session = Session::new(&ctx, Duration::from_secs(10));
    session.mode = ReadMode::Sequential;
    while Instant::now() < ctx.until {
        let Some(client) = session.get().await else {
            continue;
        };
        let id = client.session_id().0;
        let key = SEQUENTIAL[rng.below(SEQUENTIAL.len() as u64) as usize];
        let t = rec.now();
        let roll = rng.below(10);
        let (call, outcome) = if roll < 7 {
            let synced = roll >= 5;
            let read = async {
                if synced {
                    client.sync().await?;
                }
                client.get_data(key).await
            };
            let outcome = match within(read).await {
                Ok((data, stat)) => Outcome::Ok {
                    reply: Reply::Value {
                        value: value_of(&data),
                        version: stat.version,
                    },
                },
                Err(o) => o,
            };
            let call = Call::SequentialRead {
                session: id,
                synced,
            };
            (call, outcome)
        } else {
            let value = rec.unique();
            let outcome = match within(client.set_data(key, value.to_string(), None)).await {
                Ok(stat) => Outcome::Ok {
                    reply: Reply::Written {
                        version: stat.version,
                    },
                },
                Err(o) => o,
            };
            let call = Call::SequentialWrite { session: id, value };
            (call, outcome)
        };
        rec.op(process, key, call, t, outcome);
    }
    session.close().await;
}

/// Increments by read and compare-and-set, and reads of the counter.
pub async fn counter(ctx: Ctx, process: u64, reader: bool, mut rng: Rng) {
    let rec = &ctx.recorder;
    let mut session = Session::new(&ctx, Duration::from_secs(10));
    while Instant::now() < ctx.until {
        let Some(client) = session.get().await else {
            continue;
        };
        let t = rec.now();
        if reader {
            let outcome = match within(client.get_data(COUNTER)).await {
                Ok((data, _)) => Outcome::Ok {
                    reply: Reply::Count {
                        count: value_of(&data),
                    },
                },
                Err(o) => o,
            };
            rec.op(process, COUNTER, Call::ReadCounter, t, outcome);
            tokio::time::sleep(Duration::from_millis(10 + rng.below(30))).await;
            continue;
        }
        let mut outcome = Outcome::Fail {
            why: "every compare-and-set refused".into(),
        };
        for _ in 0..20 {
            let (data, stat) = match within(client.get_data(COUNTER)).await {
                Ok(x) => x,
                Err(_) => {
                    outcome = Outcome::Fail {
                        why: "the read before the increment failed".into(),
                    };
                    break;
                }
            };
            let next = value_of(&data).wrapping_add(1).to_string();
            match within(client.set_data(COUNTER, next, Some(stat.version))).await {
                Ok(_) => {
                    outcome = Outcome::Ok { reply: Reply::Done };
                    break;
                }
                Err(Outcome::Ok {
                    reply: Reply::CasRefused,
                }) => continue,
                Err(o) => {
                    outcome = o;
                    break;
                }
            }
        }
        rec.op(process, COUNTER, Call::Increment, t, outcome);
    }
    session.close().await;
}

/// Puts items on the queue (a producer) or takes them off (a consumer).
pub async fn queue(ctx: Ctx, process: u64, producer: bool, mut rng: Rng) {
    let rec = ctx.recorder.clone();
    let mut session = Session::new(&ctx, Duration::from_secs(10));
    while Instant::now() < ctx.until {
        let Some(client) = session.get().await else {
            continue;
        };
        if producer {
            let item = rec.unique();
            let t = rec.now();
            let prefix = format!("{QUEUE}/item-");
            let outcome = match within(client.create(
                &prefix,
                item.to_string(),
                CreateMode::PersistentSequential,
            ))
            .await
            {
                Ok(_) => Outcome::Ok { reply: Reply::Done },
                Err(o) => o,
            };
            rec.op(process, QUEUE, Call::Enqueue { item }, t, outcome);
            tokio::time::sleep(Duration::from_millis(5 + rng.below(20))).await;
        } else if take_one(&client, &rec, process).await == Some(false) {
            tokio::time::sleep(Duration::from_millis(10 + rng.below(20))).await;
        }
    }
    session.close().await;
}

/// Looks at the queue and takes the item at its head: `Some(true)` if it
/// took one, `Some(false)` if the queue was empty, `None` if it could not
/// tell.
pub async fn take_one(client: &Client, rec: &Recorder, process: u64) -> Option<bool> {
    let t = rec.now();
    let mut names = match within(client.get_children(QUEUE)).await {
        Ok((names, _)) => names,
        Err(_) => return None,
    };
    names.sort();
    let Some(head) = names.first() else {
        rec.op(
            process,
            QUEUE,
            Call::Dequeue,
            t,
            Outcome::Ok {
                reply: Reply::Empty,
            },
        );
        return Some(false);
    };
    let path = format!("{QUEUE}/{head}");
    let Ok((data, _)) = within(client.get_data(&path)).await else {
        return None;
    };
    let item = value_of(&data);
    let t = rec.now();
    let outcome = match within(client.delete(&path, None)).await {
        Ok(()) => Outcome::Ok { reply: Reply::Done },
        Err(o) => o,
    };
    rec.op(process, QUEUE, Call::Take { item }, t, outcome);
    Some(true)
}

/// Takers at once when the queue is drained at the end of a run.
const DRAINERS: usize = 16;

/// Takes every item left on the queue, [`DRAINERS`] at a time (processes
/// `first` on, one each), listing it again until a listing finds it empty
/// (recorded as a look at an empty queue, which is what the queue checker
/// needs to count everything not taken as lost); at most 100 listings.
/// Returns whether it found the queue empty.
pub async fn drain(client: &Client, rec: &Recorder, first: u64) -> bool {
    for _ in 0..100 {
        let t = rec.now();
        let Ok((mut names, _)) = within(client.get_children(QUEUE)).await else {
            return false;
        };
        if names.is_empty() {
            let reply = Reply::Empty;
            rec.op(first, QUEUE, Call::Dequeue, t, Outcome::Ok { reply });
            return true;
        }
        names.sort();
        let takers = (0..DRAINERS).map(|k| {
            let mine: Vec<&String> = names.iter().skip(k).step_by(DRAINERS).collect();
            async move {
                for name in mine {
                    let path = format!("{QUEUE}/{name}");
                    let Ok((data, _)) = within(client.get_data(&path)).await else {
                        continue;
                    };
                    let item = value_of(&data);
                    let t = rec.now();
                    let outcome = match within(client.delete(&path, None)).await {
                        Ok(()) => Outcome::Ok { reply: Reply::Done },
                        Err(o) => o,
                    };
                    rec.op(first + k as u64, QUEUE, Call::Take { item }, t, outcome);
                }
            }
        });
        futures::future::join_all(takers).await;
    }
    false
}

/// Runs `work` on a thread and runtime of its own, so that a pause of it
/// stops its client entirely; returns when it is done.
pub async fn on_own_thread<F, Fut>(work: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (done, finished) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("baton-chaos-worker".into())
        .spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(work());
            }
            let _ = done.send(());
        });
    if spawned.is_ok() {
        let _ = finished.await;
    }
}

/// A pause of this whole thread (and so of its client), if client pauses
/// are on and the dice say so: up to twice the lease session's timeout.
fn maybe_pause(ctx: &Ctx, rng: &mut Rng, process: u64) {
    if ctx.client_pauses && rng.chance(30) {
        let pause = rng.between(Duration::ZERO, ctx.lease_session * 2);
        ctx.recorder.fault(format!(
            "client {process} pauses for {} ms",
            pause.as_millis()
        ));
        std::thread::sleep(pause);
    }
}

/// The outcome of a wait for a grant that failed: whatever the reason, it
/// learnt no token, so nothing of it can show later.
fn learnt_no_token(o: Outcome) -> Outcome {
    match o {
        Outcome::Unknown { why } => Outcome::Fail { why },
        o => o,
    }
}

/// Takes the lock, writes the resource with the grant's token (after a
/// pause, sometimes), lets the lock go.
pub async fn fenced(ctx: Ctx, process: u64, mut rng: Rng) {
    let rec = ctx.recorder.clone();
    let mut session = Session::new(&ctx, ctx.lease_session);
    while Instant::now() < ctx.until {
        let Some(client) = session.get().await else {
            continue;
        };
        let t = rec.now();
        let guard = match within(Lock::new(&client, LOCK).acquire()).await {
            Ok(guard) => {
                let token = guard.token().get();
                rec.op(
                    process,
                    LOCK,
                    Call::Acquire,
                    t,
                    Outcome::Ok {
                        reply: Reply::Token { token },
                    },
                );
                guard
            }
            Err(o) => {
                rec.op(process, LOCK, Call::Acquire, t, learnt_no_token(o));
                continue;
            }
        };
        let token = guard.token().get();
        maybe_pause(&ctx, &mut rng, process);
        let value = rec.unique();
        let t = rec.now();
        let outcome = match within(client.set_data_fenced(FENCED, value.to_string(), token)).await {
            Ok(stat) => Outcome::Ok {
                reply: Reply::Written {
                    version: stat.version,
                },
            },
            Err(o) => o,
        };
        rec.op(
            process,
            FENCED,
            Call::FencedWrite { token, value },
            t,
            outcome,
        );
        let t = rec.now();
        let outcome = match within(guard.release()).await {
            Ok(()) => Outcome::Ok { reply: Reply::Done },
            Err(o) => o,
        };
        rec.op(process, LOCK, Call::Release { token }, t, outcome);
    }
    session.close().await;
}

/// Stands for election; as leader, writes with its epoch a few times, then
/// resigns.
pub async fn election(ctx: Ctx, process: u64, mut rng: Rng) {
    let rec = ctx.recorder.clone();
    let mut session = Session::new(&ctx, ctx.lease_session);
    while Instant::now() < ctx.until {
        let Some(client) = session.get().await else {
            continue;
        };
        let t = rec.now();
        let leadership =
            match within(Election::new(&client, ELECTION).campaign(process.to_string())).await {
                Ok(l) => l,
                Err(o) => {
                    rec.op(process, ELECTION, Call::Acquire, t, learnt_no_token(o));
                    continue;
                }
            };
        let epoch = leadership.token().get();
        rec.op(
            process,
            ELECTION,
            Call::Acquire,
            t,
            Outcome::Ok {
                reply: Reply::Token { token: epoch },
            },
        );
        for _ in 0..1 + rng.below(3) {
            maybe_pause(&ctx, &mut rng, process);
            let value = rec.unique();
            let t = rec.now();
            let outcome =
                match within(client.set_data_fenced(LEADER_RESOURCE, value.to_string(), epoch))
                    .await
                {
                    Ok(stat) => Outcome::Ok {
                        reply: Reply::Written {
                            version: stat.version,
                        },
                    },
                    Err(o) => o,
                };
            rec.op(
                process,
                LEADER_RESOURCE,
                Call::FencedWrite {
                    token: epoch,
                    value,
                },
                t,
                outcome,
            );
        }
        let t = rec.now();
        let outcome = match within(leadership.resign()).await {
            Ok(()) => Outcome::Ok { reply: Reply::Done },
            Err(o) => o,
        };
        rec.op(
            process,
            ELECTION,
            Call::Release { token: epoch },
            t,
            outcome,
        );
    }
    session.close().await;
}

/// Holds an ephemeral node in a session of its own, then closes the
/// session, or (with client pauses) falls silent past its timeout; the
/// node's path goes to `watch` so that an observer sees it go.
pub async fn ephemeral(
    ctx: Ctx,
    process: u64,
    mut rng: Rng,
    watch: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let rec = ctx.recorder.clone();
    while Instant::now() < ctx.until {
        let Ok(client) = connect(&ctx.servers, ctx.lease_session, Duration::from_secs(3)).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let path = format!("{EPHEMERALS}/node-{}", rec.unique());
        let t = rec.now();
        match within(client.create(&path, "", CreateMode::Ephemeral)).await {
            Ok(_) => {
                rec.op(
                    process,
                    &path,
                    Call::HoldEphemeral,
                    t,
                    Outcome::Ok { reply: Reply::Done },
                );
                let _ = watch.send(path.clone());
            }
            Err(o) => {
                rec.op(process, &path, Call::HoldEphemeral, t, o);
                client.close().await;
                continue;
            }
        }
        tokio::time::sleep(rng.between(Duration::from_millis(50), Duration::from_millis(500)))
            .await;
        if ctx.client_pauses && rng.chance(40) {
            let pause = rng.between(ctx.lease_session, ctx.lease_session * 3);
            rec.fault(format!(
                "client {process} pauses for {} ms",
                pause.as_millis()
            ));
            std::thread::sleep(pause);
        }
        // Where the session stands: past its deadline, the client counts it
        // as ended from then (the server may expire it no sooner).
        let deadline = client.session_deadline().into_std();
        if deadline <= std::time::Instant::now() {
            let at = rec.at(deadline);
            rec.op(
                process,
                &path,
                Call::SessionEnded { expired: true },
                at,
                Outcome::Ok { reply: Reply::Done },
            );
            client.close().await;
        } else {
            let t = rec.now();
            rec.op(
                process,
                &path,
                Call::SessionEnded { expired: false },
                t,
                Outcome::Ok { reply: Reply::Done },
            );
            client.close().await;
        }
    }
}

/// Watches each ephemeral node `paths` names, noting when it is seen gone.
pub async fn observe_ephemerals(
    ctx: Ctx,
    process: u64,
    mut paths: tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let rec = ctx.recorder.clone();
    let Ok(client) = connect(
        &ctx.servers,
        Duration::from_secs(30),
        Duration::from_secs(10),
    )
    .await
    else {
        return;
    };
    let mut watching = tokio::task::JoinSet::new();
    while let Some(path) = paths.recv().await {
        let (client, rec) = (client.clone(), rec.clone());
        watching.spawn(async move {
            // Bounded: a node outlives no session by long.
            for _ in 0..30 {
                let t = rec.now();
                match within(client.exists_watch(&path)).await {
                    Ok((None, _)) => {
                        rec.op(
                            process,
                            &path,
                            Call::EphemeralGone,
                            t,
                            Outcome::Ok { reply: Reply::Done },
                        );
                        return;
                    }
                    Ok((Some(_), watcher)) => {
                        let _ = tokio::time::timeout(Duration::from_secs(10), watcher).await;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
    }
    while watching.join_next().await.is_some() {}
    let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
}
