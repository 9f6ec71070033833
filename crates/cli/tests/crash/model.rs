//! The model: what the load's clients were told (acknowledged, failed or
//! unknown), and the check of a restarted server against it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;
use baton_client::{Client, CreateMode, Error, Lock, SessionId, SessionState, Stat};
use bytes::Bytes;

pub const CLIENTS: usize = 6;
pub const ROUNDS: usize = 6;
pub const LOCK: &str = "/crash/lock";
pub const FENCED: &str = "/crash/fenced";

/// A sequence number or lock token some acknowledged answer carried, with
/// the server generation ("epoch": the number of kills so far) read just
/// before the request was made and just after its answer arrived.
///
/// The epoch is bumped right after a kill has reaped the old server and
/// before the next one starts, so an answer recorded at epoch `a` came from
/// a server no newer than `a`, and a request made and answered within one
/// epoch `e` was answered by server `e` itself.
pub struct Issued {
    pub seq: u64,
    pub before: usize,
    pub after: usize,
    pub what: String,
}

/// What the load shares between its clients.
pub struct Shared {
    pub epoch: AtomicUsize,
    /// Token of the current lock holder, 0 for none: two holders at once is
    /// a failure.
    pub holder: AtomicU64,
    pub stop: AtomicBool,
}

/// A node written with unconditional `set_data` by one client, one write
/// after another (or pipelined, which applies them in the same order): what
/// it may hold after a crash.
pub struct Register {
    pub path: String,
    /// The last acknowledged data and the version it was acknowledged with.
    pub acked: (Bytes, u32),
    /// Writes of unknown outcome (ConnectionLoss) since then, in order.
    pub maybe: Vec<Bytes>,
}

impl Register {
    pub fn new(path: String, data: Bytes, version: u32) -> Register {
        Register {
            path,
            acked: (data, version),
            maybe: Vec::new(),
        }
    }

    /// Records the outcome of one write; an error if it cannot be right.
    pub fn record(&mut self, data: Bytes, result: Result<Stat, Error>) -> Result<(), String> {
        match result {
            Ok(stat) => {
                // Each write of unknown outcome since the last acknowledged
                // one may have added one version, no more.
                let prev = self.acked.1;
                let most = prev + 1 + self.maybe.len() as u32;
                let verdict = if stat.version <= prev || stat.version > most {
                    Err(format!(
                        "set {} to {}: acknowledged with version {}, expected {}..={most}",
                        self.path,
                        show(&data),
                        stat.version,
                        prev + 1
                    ))
                } else {
                    Ok(())
                };
                self.acked = (data, stat.version);
                self.maybe.clear();
                verdict
            }
            Err(Error::ConnectionLoss(_)) => {
                self.maybe.push(data);
                Ok(())
            }
            Err(e) => Err(format!(
                "set {} to {}: unexpected error: {e}",
                self.path,
                show(&data)
            )),
        }
    }

    /// Checks what the node holds after a restart: the acknowledged data at
    /// its version, or whole data of a later write in flight. Then takes it
    /// as known.
    pub fn settle(&mut self, data: Bytes, version: u32) -> Result<(), String> {
        let (acked, acked_version) = &self.acked;
        let verdict = if data == acked {
            if version == *acked_version {
                Ok(())
            } else {
                Err(format!(
                    "{} holds its acknowledged data {:?} at version {version}, acknowledged at {acked_version}",
                    self.path,
                    show(&data)
                ))
            }
        } else if self.maybe.contains(&data) {
            if version > *acked_version && version <= acked_version + self.maybe.len() as u32 {
                Ok(())
            } else {
                Err(format!(
                    "{} holds in-flight data {:?} at version {version} after acknowledged version {acked_version}",
                    self.path,
                    show(&data)
                ))
            }
        } else {
            Err(format!(
                "{} holds {:?} (version {version}): neither the acknowledged {:?} (version {acked_version}) nor a write in flight since",
                self.path,
                show(&data),
                show(acked)
            ))
        };
        self.acked = (data, version);
        self.maybe.clear();
        verdict
    }
}

/// One client of the load and everything it was told.
pub struct Worker {
    pub i: usize,
    pub client: Client,
    pub session: SessionId,
    pub rng: Rng,
    pub ops: u64,
    /// Children of `/crash/c<i>` (other than `own`) known to exist: those
    /// whose create was acknowledged, and those of unknown outcome that a
    /// check found. Path -> data.
    pub nodes: BTreeMap<String, Bytes>,
    /// Creates that failed with ConnectionLoss since the last check: data,
    /// and whether the node was ephemeral.
    pub maybe: Vec<(Bytes, bool)>,
    /// `/crash/c<i>/own`.
    pub own: Register,
    pub issued: Vec<Issued>,
    /// Tokens of acknowledged and of unknown-outcome fenced writes.
    pub fence_acked: Vec<u64>,
    pub fence_maybe: Vec<u64>,
    pub acked: u64,
    pub unknown: u64,
    pub errors: Vec<String>,
}

impl Worker {
    pub async fn run(mut self, shared: Arc<Shared>) -> Worker {
        while !shared.stop.load(Ordering::SeqCst) && self.errors.is_empty() {
            match self.rng.below(100) {
                0..=44 => self.create(&shared).await,
                45..=79 => self.set_own().await,
                _ => self.lock_cycle(&shared).await,
            }
            // Pacing between operations, not a wait for anything.
            let pause = self.rng.below(3);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        self
    }

    pub async fn create(&mut self, shared: &Shared) {
        self.ops += 1;
        let ephemeral = self.rng.below(4) == 0;
        let (prefix, mode) = if ephemeral {
            ("e-", CreateMode::EphemeralSequential)
        } else {
            ("n-", CreateMode::PersistentSequential)
        };
        let path = format!("/crash/c{}/{prefix}", self.i);
        let data = payload(self.i, self.ops);
        let before = shared.epoch.load(Ordering::SeqCst);
        let what = format!("client {}: create {path} ({})", self.i, show(&data));
        match bounded(&what, self.client.create(&path, data.clone(), mode)).await {
            Err(hang) => self.errors.push(hang),
            Ok(Ok(created)) => {
                let after = shared.epoch.load(Ordering::SeqCst);
                let Some(seq) = created.sequence else {
                    self.errors
                        .push(format!("{what}: no sequence number in {created:?}"));
                    return;
                };
                if !created.path.starts_with(&path) {
                    self.errors
                        .push(format!("{what}: created {} instead", created.path));
                }
                self.issued.push(Issued {
                    seq,
                    before,
                    after,
                    what: format!("create {}", created.path),
                });
                self.nodes.insert(created.path, data);
                self.acked += 1;
            }
            Ok(Err(Error::ConnectionLoss(_))) => {
                self.maybe.push((data, ephemeral));
                self.unknown += 1;
            }
            Ok(Err(e)) => self.errors.push(format!("{what}: unexpected error: {e}")),
        }
    }

    /// Writes the client's own node: usually once, sometimes a burst of
    /// pipelined writes, so that many are in flight when the kill comes.
    pub async fn set_own(&mut self) {
        let n = if self.rng.below(4) == 0 { 16 } else { 1 };
        let values: Vec<Bytes> = (0..n)
            .map(|_| {
                self.ops += 1;
                payload(self.i, self.ops)
            })
            .collect();
        match pipelined_writes(&self.client, &self.own.path, &values).await {
            Ok(results) => {
                for (data, result) in values.into_iter().zip(results) {
                    match &result {
                        Ok(_) => self.acked += 1,
                        Err(_) => self.unknown += 1,
                    }
                    if let Err(e) = self.own.record(data, result) {
                        self.errors.push(format!("client {}: {e}", self.i));
                    }
                }
            }
            Err(hang) => self.errors.push(hang),
        }
    }

    /// Acquires the shared lock, makes a fenced write with its token, and
    /// releases it.
    pub async fn lock_cycle(&mut self, shared: &Shared) {
        let what = format!("client {}: acquire {LOCK}", self.i);
        let before = shared.epoch.load(Ordering::SeqCst);
        let guard = match bounded(&what, Lock::new(&self.client, LOCK).acquire()).await {
            Err(hang) => return self.errors.push(hang),
            Ok(Ok(guard)) => guard,
            Ok(Err(Error::ConnectionLoss(_))) => {
                self.unknown += 1;
                return;
            }
            Ok(Err(e)) => return self.errors.push(format!("{what}: unexpected error: {e}")),
        };
        let after = shared.epoch.load(Ordering::SeqCst);
        let token = guard.token().0;
        self.issued.push(Issued {
            seq: token,
            before,
            after,
            what: format!("lock token of {}", guard.node()),
        });
        self.acked += 1;
        let other = shared.holder.swap(token, Ordering::SeqCst);
        if other != 0 {
            self.errors.push(format!(
                "client {}: granted {LOCK} with token {token} while token {other} held it",
                self.i
            ));
        }

        let data = format!("fence-{token}");
        let what = format!("client {}: fenced set {FENCED} to {data}", self.i);
        match bounded(&what, self.client.set_data_fenced(FENCED, data, token)).await {
            Err(hang) => self.errors.push(hang),
            Ok(Ok(_)) => {
                self.fence_acked.push(token);
                self.acked += 1;
            }
            Ok(Err(Error::ConnectionLoss(_))) => {
                self.fence_maybe.push(token);
                self.unknown += 1;
            }
            Ok(Err(e)) => self.errors.push(format!("{what}: unexpected error: {e}")),
        }

        let node = guard.node().to_owned();
        let _ = shared
            .holder
            .compare_exchange(token, 0, Ordering::SeqCst, Ordering::SeqCst);
        let what = format!("client {}: release {node}", self.i);
        match bounded(&what, guard.release()).await {
            Err(hang) => self.errors.push(hang),
            Ok(Ok(())) => {}
            // The delete may not have happened: make sure it does, or the
            // node (of a live session) would block the lock for good.
            Ok(Err(Error::ConnectionLoss(_))) => loop {
                match bounded(&what, self.client.delete(&node, None)).await {
                    Err(hang) => break self.errors.push(hang),
                    Ok(Ok(())) | Ok(Err(Error::NoNode(_))) => break,
                    Ok(Err(Error::ConnectionLoss(_))) => continue,
                    Ok(Err(e)) => break self.errors.push(format!("{what}: {e}")),
                }
            },
            Ok(Err(e)) => self.errors.push(format!("{what}: unexpected error: {e}")),
        }
    }
}

/// Checks what the restarted server holds against what the clients were
/// told, then settles every unknown outcome to what was found.
pub async fn verify(
    round: usize,
    checker: &Client,
    workers: &mut [Worker],
    fence_floor: &mut u64,
) -> Vec<String> {
    let mut errors = Vec::new();
    for w in workers.iter_mut() {
        let i = w.i;
        // The session survived and this client resumed it.
        if w.client.session_id() != w.session {
            errors.push(format!(
                "client {i}: session {} is now {}",
                w.session,
                w.client.session_id()
            ));
        }
        if w.client.state() != SessionState::Reconnected {
            errors.push(format!(
                "client {i}: state {} after the restart, not reconnected",
                w.client.state()
            ));
        }
        if let Err(e) = bounded("ping", w.client.ping())
            .await
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            errors.push(format!("client {i}: ping after the restart: {e}"));
        }
        let marker = format!("/crash/eph/c{i}");
        match bounded("exists", checker.exists(&marker)).await {
            Ok(Ok(Some(stat))) if stat.owner() == Some(w.session) => {}
            other => errors.push(format!(
                "client {i}: its ephemeral {marker} (session {}) is not there as acknowledged: {other:?}",
                w.session
            )),
        }

        // Sequential children: every acknowledged one with its data, and
        // nothing that was never written.
        let parent = format!("/crash/c{i}");
        let names = match bounded("list", checker.get_children(&parent)).await {
            Ok(Ok((names, _))) => names,
            other => {
                errors.push(format!("list {parent}: {other:?}"));
                continue;
            }
        };
        let paths: Vec<String> = names
            .iter()
            .filter(|n| *n != "own")
            .map(|n| format!("{parent}/{n}"))
            .collect();
        let reads = futures::future::join_all(paths.iter().map(|p| checker.get_data(p)));
        let reads = match bounded("read children", reads).await {
            Ok(reads) => reads,
            Err(hang) => {
                errors.push(hang);
                continue;
            }
        };
        let mut maybe: HashMap<Bytes, bool> = w.maybe.drain(..).collect();
        for (path, read) in paths.iter().zip(reads) {
            let (data, stat) = match read {
                Ok(found) => found,
                Err(e) => {
                    errors.push(format!("read {path}: {e}"));
                    continue;
                }
            };
            let ephemeral = path.contains("/e-");
            if let Some(acked) = w.nodes.get(path) {
                if *acked != data {
                    errors.push(format!(
                        "round {round}: {path} holds {:?}, its acknowledged create wrote {:?}",
                        show(&data),
                        show(acked)
                    ));
                }
            } else if maybe.get(&data) == Some(&ephemeral) {
                // A create of unknown outcome happened: from now on it is
                // known.
                maybe.remove(&data);
                w.nodes.insert(path.clone(), data.clone());
            } else {
                errors.push(format!(
                    "round {round}: {path} holds {:?}, which no create in flight or acknowledged wrote",
                    show(&data)
                ));
            }
            if stat.version != 0 {
                errors.push(format!(
                    "round {round}: {path} has version {}, but nothing changed it",
                    stat.version
                ));
            }
            let owner = stat.owner();
            if ephemeral && owner != Some(w.session) || !ephemeral && owner.is_some() {
                errors.push(format!(
                    "round {round}: {path} is owned by {owner:?}, expected {}",
                    if ephemeral {
                        format!("session {}", w.session)
                    } else {
                        "no session".into()
                    }
                ));
            }
        }
        // Creates of unknown outcome not found now never happened; if one
        // showed up later it would be flagged above.
        for (path, data) in &w.nodes {
            if !paths.contains(path) {
                errors.push(format!(
                    "round {round}: acknowledged {path} ({}) is gone",
                    show(data)
                ));
            }
        }

        // The client's own node: the acknowledged value, or a later write
        // in flight, whole.
        match bounded("read own", checker.get_data(&w.own.path)).await {
            Ok(Ok((data, stat))) => {
                if let Err(e) = w.own.settle(data, stat.version) {
                    errors.push(format!("round {round}: {e}"));
                }
            }
            other => errors.push(format!("read {}: {other:?}", w.own.path)),
        }
    }

    // The lock's queue drains: no contender node was orphaned by a crash.
    let drained = poll(Duration::from_secs(15), || async {
        match checker.get_children(LOCK).await {
            Ok((names, _)) if names.is_empty() => Some(Ok(())),
            Err(Error::NoNode(_)) => Some(Ok(())),
            Ok(_) | Err(Error::ConnectionLoss(_)) => None,
            Err(e) => Some(Err(e.to_string())),
        }
    })
    .await;
    match drained {
        Some(Ok(())) => {}
        Some(Err(e)) => errors.push(format!("list {LOCK}: {e}")),
        None => {
            let left = checker.get_children(LOCK).await;
            errors.push(format!(
                "round {round}: the queue of {LOCK} did not drain within 15 s with every client idle: {left:?}"
            ));
        }
    }

    // The fenced node holds the token of an acknowledged or in-flight
    // fenced write, no lower than any acknowledged one.
    let acked: HashSet<u64> = workers
        .iter()
        .flat_map(|w| w.fence_acked.iter().copied())
        .collect();
    let written: HashSet<u64> = workers
        .iter()
        .flat_map(|w| w.fence_maybe.iter().copied())
        .chain(acked.iter().copied())
        .chain([0])
        .collect();
    let floor = acked.iter().copied().max().unwrap_or(0).max(*fence_floor);
    match bounded("read fenced", checker.get_data(FENCED)).await {
        Ok(Ok((data, _))) => {
            let text = String::from_utf8_lossy(&data).into_owned();
            match text.strip_prefix("fence-").and_then(|t| t.parse::<u64>().ok()) {
                Some(t) if t >= floor && written.contains(&t) => *fence_floor = t,
                _ => errors.push(format!(
                    "round {round}: {FENCED} holds {text:?}; expected the data of a fenced write with a token of at least {floor}"
                )),
            }
        }
        other => errors.push(format!("read {FENCED}: {other:?}")),
    }

    errors.extend(check_sequences(workers));
    errors
}

/// Sequence numbers and lock tokens are distinct, and every one handed out
/// by a restarted server is greater than every one handed out before.
pub fn check_sequences(workers: &[Worker]) -> Vec<String> {
    let mut errors = Vec::new();
    let all: Vec<&Issued> = workers.iter().flat_map(|w| &w.issued).collect();
    let mut seen: HashMap<u64, &str> = HashMap::new();
    for issued in &all {
        if let Some(first) = seen.insert(issued.seq, &issued.what) {
            errors.push(format!(
                "sequence number {} handed out twice: {first} and {}",
                issued.seq, issued.what
            ));
        }
    }
    let epochs = all.iter().map(|x| x.after).max().unwrap_or(0);
    for epoch in 1..=epochs {
        // Answered by a server older than `epoch`, for certain.
        let older = all.iter().filter(|x| x.after < epoch).max_by_key(|x| x.seq);
        // Asked and answered while server `epoch` was the only one up.
        let newer = all
            .iter()
            .filter(|x| x.before == epoch && x.after == epoch)
            .min_by_key(|x| x.seq);
        if let (Some(old), Some(new)) = (older, newer) {
            if new.seq <= old.seq {
                errors.push(format!(
                    "after restart {epoch}, {} got {}, not above {} of {} before it",
                    new.what, new.seq, old.seq, old.what
                ));
            }
        }
    }
    errors
}
