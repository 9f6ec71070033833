//! The faults a chaos run injects into the servers it started: members
//! paused (SIGSTOP, as a long pause or a stopped VM would), starved of the
//! CPU (stopped for a few milliseconds at a time, as a VM whose time is
//! stolen) and killed (kill -9, then started again from their data
//! directories), one at a time or two at once (a cluster without its
//! majority, then with it again), the leader chosen half the time; links
//! cut, between members and between the clients and a member (see
//! [`super::net`]); and a disk that syncs slowly or is full (the servers'
//! test-only hook in front of their logs,
//! `baton_server::persist::disk_faults`). Two schedules run at once, so
//! faults overlap.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use baton_server::persist::disk_faults::DiskFault;

use super::net::{Net, CLIENTS};
use super::record::{Recorder, Rng};
use crate::local::LocalCluster;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Nemesis {
    /// SIGSTOP a member for 0.2 to 4 s (the leader half the time).
    Pause,
    /// kill -9 a member, start it again 0.2 to 3 s later.
    Kill,
    /// Pause two members at once: a cluster loses its majority, then
    /// regains it.
    PauseTwo,
    /// Starve one member (the leader half the time) of the CPU for 1 to
    /// 5 s: stopped for 1 to 4 ms every 3 to 14 ms, as on a host whose
    /// virtual machines have their time stolen. Its timers then fire late
    /// against the work they time.
    Stutter,
    /// Kill two members at once, and start them again.
    KillTwo,
    /// Faults combined (a cluster of 3 or more): one follower paused
    /// throughout, or killed; the other paused past a few heartbeats while
    /// appends go to it (the leader starved of the CPU meanwhile, half the
    /// time), resumed, and paused again; the leader and that follower then
    /// killed together; the first follower resumed or started again, and
    /// the two killed started again. The leader must have acknowledged
    /// nothing that did not survive that.
    LagThenCrash,
    /// Workers that hold a lock, a leadership or an ephemeral node stop
    /// their own process for up to twice their session timeout (a long
    /// garbage collection): their lease runs out while they still believe
    /// they hold it.
    ClientPause,
    /// Cut one member (the leader half the time) off from the others for
    /// 0.5 to 5 s; with 5 members, half the time two off from three. Its
    /// clients still reach it: a deposed leader must not answer them as if
    /// it still led.
    Partition,
    /// One member (the leader half the time) hears nothing from the others
    /// for 0.5 to 5 s while they still hear it, or the other way round.
    OneWay,
    /// Slow the link between one member (the leader half the time) and
    /// another: each way half to twice a heartbeat late, for 1 to 5 s, so
    /// that many of the calls between them time out while their bytes
    /// still arrive.
    Slow,
    /// Faults combined (a cluster of 3 or more): one follower paused or
    /// killed; the link between the leader and the other follower slowed
    /// past the heartbeat while writes go on (the leader starved of the
    /// CPU meanwhile, half the time); that follower paused too, its late
    /// answers still on their way; then the leader and that follower
    /// killed together, the first follower resumed, the link healed, and
    /// the two killed started again.
    SlowThenCrash,
    /// Cut the clients off from one member (the leader half the time) for
    /// 0.3 to 4 s, longer than their sessions may last: they time out and
    /// look for another member while it goes on.
    CutClients,
    /// Slow one member's disk (the leader's half the time) for 1 to 5 s:
    /// each sync of its log half to eight heartbeats late.
    SlowDisk,
    /// Remove one member (the leader half the time) from the cluster under
    /// load; 0.5 to 3 s later wipe its data directory, start it empty and
    /// add it again (a learner that catches up, then a voter).
    Membership,
    /// The clocks of the supervised workload's processes (`baton lock`, its
    /// command, `baton set`) jump back by half a session timeout to three
    /// of them, or forward by 1 to 60 s, for 0.5 to 4 s (libfaketime).
    ClientClock,
    /// Fill one member's disk (the leader's half the time) for 0.3 to 3 s:
    /// its next log write puts half its bytes down and fails, which stops
    /// it; once there is room again it is started again and recovers.
    FullDisk,
    /// One member's file system (the leader's half the time) can create
    /// no file for 1 to 5 s, as one out of inodes: its log goes on being
    /// written, while a snapshot or a new log segment begun meanwhile
    /// fails (a single server goes on and tries again later; a member's
    /// consensus engine stops it, and it is started again once files can
    /// be created).
    NoNewFiles,
    /// Start one follower or observer from an old copy of its own data
    /// directory, as when a file-system backup is put back: it is killed,
    /// its directory copied and it is started again; 1 to 8 s of writes
    /// later it is killed again and started from the copy. The leader must
    /// find that its log went back and stop it; it is then removed, emptied
    /// and added again, as docs/operations.md says. One at a time, with
    /// every member running, and put back only if the leader of the copy's
    /// time still leads in the same term; not among the defaults (see
    /// docs/reliability.md: with the leader moving meanwhile, or the
    /// leader's own data put back, writes may be lost, as in any Raft
    /// cluster).
    StaleCopy,
}

/// The faults a line of the history injects, by how the line begins: the
/// fault's name, and whether it acts on the servers (not only on this
/// run's own clients). Pausing or killing two members at once is two
/// pauses or two kills; a combined round (lag or slow, then crash) counts
/// once, at its kill.
const INJECTED: &[(&str, &str, bool)] = &[
    ("pause member ", "pause", true),
    ("stutter member ", "stutter", true),
    ("kill -9 member ", "kill", true),
    ("lag then crash: kill -9 ", "lag-then-crash", true),
    ("slow then crash: kill -9 ", "slow-then-crash", true),
    ("cut member", "partition", true),
    ("cut one way: ", "one-way", true),
    ("slow the link ", "slow", true),
    ("cut clients off ", "cut-clients", true),
    ("slow disk on ", "slow-disk", true),
    ("full disk on ", "full-disk", true),
    ("no new files on ", "no-new-files", true),
    ("membership: remove member ", "membership", true),
    ("stale copy: kill -9 member ", "stale-copy", true),
    ("client clocks jump ", "client-clock", false),
    ("client ", "client-pause", false),
];

/// The fault a line of the history injected, if it injected one (not a
/// heal, a restart or another event): its name, and whether it acted on
/// the servers.
pub fn injected(what: &str) -> Option<(&'static str, bool)> {
    let (_, name, servers) = INJECTED
        .iter()
        .find(|(start, _, _)| what.starts_with(start))?;
    // Lines of the same fault that inject nothing more.
    let more = match *name {
        "stale-copy" => what.contains("put back its data directory"),
        "client-pause" => what.contains(" pauses for "),
        _ => true,
    };
    more.then_some((*name, *servers))
}

impl Nemesis {
    /// Whether it needs more than one member.
    fn needs_cluster(self) -> bool {
        matches!(
            self,
            Nemesis::PauseTwo
                | Nemesis::KillTwo
                | Nemesis::LagThenCrash
                | Nemesis::Partition
                | Nemesis::OneWay
                | Nemesis::Slow
                | Nemesis::SlowThenCrash
                | Nemesis::Membership
                | Nemesis::StaleCopy
        )
    }

    /// Whether it needs proxies in front of the servers' ports.
    pub fn needs_network(self) -> bool {
        matches!(
            self,
            Nemesis::Partition
                | Nemesis::OneWay
                | Nemesis::Slow
                | Nemesis::SlowThenCrash
                | Nemesis::CutClients
        )
    }

    /// Whether it needs the members to play disk faults.
    pub fn needs_disk_faults(self) -> bool {
        matches!(
            self,
            Nemesis::SlowDisk | Nemesis::FullDisk | Nemesis::NoNewFiles
        )
    }

    /// Whether it acts on the servers' processes, disks or links (not only
    /// on this run's own clients).
    pub fn acts_on_members(self) -> bool {
        !matches!(self, Nemesis::ClientPause | Nemesis::ClientClock)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    Paused,
    Down,
    /// Down because starting it again failed, or ended on its own while
    /// counted as running: the next step of a schedule, or the heal, starts
    /// it again.
    Stranded,
    /// Out of the cluster's membership, to be added again.
    Removed,
    /// Removed and started empty, but not added again (no leader answered
    /// in time): the next step of a schedule, or the heal, tries again.
    Unadded,
}

/// The servers under test, the state each is in, and the network in
/// front of them.
pub struct Target {
    pub cluster: LocalCluster,
    state: BTreeMap<u64, State>,
    net: Arc<Net>,
    /// How often the members' leader heartbeats (and so how long it waits
    /// for each call to a follower).
    heartbeat: Duration,
    /// The members whose disk plays a fault now.
    faulty_disks: BTreeSet<u64>,
    /// The member being started from an old copy of its data now, if any
    /// (it is to stop on its own, and the fault then handles it).
    copying: Option<u64>,
    /// The leader that must stay while a member is started from an old
    /// copy: the network's faults leave its links alone meanwhile (a
    /// claim keeps only the faults of processes and disks off it).
    steady: Option<u64>,
    /// The members a fault of several steps holds until its last step.
    claims: Claims,
    /// Members counted as running that the leader's membership left out,
    /// since when (see [`Unlisted`]).
    unlisted: Unlisted,
    /// The members added as observers (they never vote): one removed is
    /// added back as an observer, and the faults that are about the
    /// majority leave them out.
    observers: BTreeSet<u64>,
}

/// How long a member counted as running may be missing from the leader's
/// membership before the run takes it for removed.
const UNLISTED_FOR: Duration = Duration::from_secs(30);

/// Members counted as running, and held by no fault, that the leader's
/// membership has left out, since when they were first seen missing. A
/// removal whose answer was lost (its connection closed, say) may have
/// been made all the same, then or later: the membership fault, told it
/// failed, counts the member as running while the cluster goes on
/// without it.
#[derive(Default)]
struct Unlisted {
    since: BTreeMap<u64, Instant>,
    /// When the membership was last read.
    read: Option<Instant>,
}

impl Unlisted {
    /// Notes what the leader listed at `now` of the members in `running`;
    /// the members missing from it for [`UNLISTED_FOR`] or more (each
    /// returned once).
    fn overdue(&mut self, running: &[u64], listed: &[u64], now: Instant) -> Vec<u64> {
        self.since.retain(|id, _| running.contains(id));
        let mut overdue = Vec::new();
        for id in running {
            if listed.contains(id) {
                self.since.remove(id);
                continue;
            }
            let since = *self.since.entry(*id).or_insert(now);
            if now.duration_since(since) >= UNLISTED_FOR {
                self.since.remove(id);
                overdue.push(*id);
            }
        }
        overdue
    }
}

/// The members held by faults of several steps (a round of lag or slow
/// then crash, a put-back copy): no other fault picks them meanwhile. A
/// round once picked a leader just as another schedule removed it from the
/// membership, then killed it and started it again from its data as a
/// running member; the removal's wipe and add, seeing it running, left it
/// out, and the run went on with two voters.
#[derive(Clone, Default)]
struct Claims(Arc<std::sync::Mutex<BTreeSet<u64>>>);

/// Members held, until dropped.
struct Claim {
    claims: Claims,
    ids: Vec<u64>,
}

impl Claims {
    fn held(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn contains(&self, id: u64) -> bool {
        self.held().contains(&id)
    }

    /// Holds `ids`, unless one is held already.
    fn claim(&self, ids: &[u64]) -> Option<Claim> {
        let mut held = self.held();
        if ids.iter().any(|id| held.contains(id)) {
            return None;
        }
        held.extend(ids.iter().copied());
        Some(Claim {
            claims: self.clone(),
            ids: ids.to_vec(),
        })
    }
}

impl Claim {
    /// Lets go of every member held but `keep`.
    fn keep_only(&mut self, keep: &[u64]) {
        let mut held = self.claims.held();
        self.ids.retain(|id| {
            let kept = keep.contains(id);
            if !kept {
                held.remove(id);
            }
            kept
        });
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = self.claims.held();
        for id in &self.ids {
            held.remove(id);
        }
    }
}

impl Target {
    pub fn new(
        cluster: LocalCluster,
        net: Arc<Net>,
        heartbeat: Duration,
        observers: BTreeSet<u64>,
    ) -> Target {
        let state = cluster
            .members
            .keys()
            .map(|id| (*id, State::Running))
            .collect();
        Target {
            cluster,
            state,
            net,
            heartbeat,
            faulty_disks: BTreeSet::new(),
            copying: None,
            steady: None,
            claims: Claims::default(),
            unlisted: Unlisted::default(),
            observers,
        }
    }

    /// Whether member `id` was added as an observer.
    fn observes(&self, id: u64) -> bool {
        self.observers.contains(&id)
    }

    /// Sets the disk fault member `id` plays (`None`: none).
    fn disk_fault(&mut self, id: u64, fault: Option<DiskFault>, recorder: &Recorder) {
        if let Err(e) = self.cluster.disk_fault(id, fault) {
            recorder.fault(format!("the disk fault of member {id} was not set: {e}"));
        }
        if fault.is_some() {
            self.faulty_disks.insert(id);
        } else {
            self.faulty_disks.remove(&id);
        }
    }

    /// Each member's id and client address.
    pub fn addrs(&self) -> Vec<(u64, String)> {
        self.cluster
            .members
            .values()
            .map(|m| (m.id, m.client.clone()))
            .collect()
    }

    /// The members' own client addresses, comma-separated: the membership
    /// is changed there, around the network's faults.
    fn real_clients(&self) -> String {
        self.addrs()
            .into_iter()
            .map(|(_, a)| a)
            .collect::<Vec<_>>()
            .join(",")
    }

    fn signal(&self, id: u64, sig: i32) {
        let pid = self.cluster.members[&id].pid;
        if pid > 0 {
            // SAFETY: kill(2) on a member process this run started.
            unsafe {
                libc::kill(pid as i32, sig);
            }
        }
    }

    /// Whether member `id`, started empty to be added again, still runs
    /// (or, once it has ended, was started empty again): one started while
    /// its disk could create no file stops at once, and an add would wait
    /// for it in vain.
    async fn started_to_join(&mut self, id: u64, recorder: &Recorder) -> bool {
        if !self.cluster.exited(id) {
            return true;
        }
        recorder.fault(format!("member {id}, to be added again, had ended"));
        rejoin(self, id, recorder, "again").await
    }

    /// Whether member `id` runs and no fault of several steps holds it.
    fn free(&self, id: u64) -> bool {
        self.state.get(&id) == Some(&State::Running) && !self.claims.contains(id)
    }

    /// Members counted as running whose process has ended (stopped by a
    /// file it could not create, say): noted, and stranded, to be started
    /// again at the next step of a schedule or at the heal. Not a member
    /// whose disk plays a fault now: that fault starts it again once it
    /// heals (a member out of inodes stops when a snapshot cannot be
    /// made, as it says).
    fn ended_on_their_own(&mut self, recorder: &Recorder) {
        let running: Vec<u64> = self
            .state
            .iter()
            .filter(|(id, s)| {
                **s == State::Running
                    && self.copying != Some(**id)
                    && !self.claims.contains(**id)
                    && !self.faulty_disks.contains(*id)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            if self.cluster.exited(id) {
                recorder.fault(format!("member {id} had ended on its own"));
                self.state.insert(id, State::Stranded);
            }
        }
    }

    /// Every link healed, every member paused resumed and every member
    /// down started again.
    pub async fn heal(&mut self, recorder: &Recorder) {
        if self.net.any_fault() {
            self.net.heal_all();
            recorder.fault("heal: every link");
        }
        for id in std::mem::take(&mut self.faulty_disks) {
            self.disk_fault(id, None, recorder);
            recorder.fault(format!("heal: the disk of member {id}"));
        }
        self.ended_on_their_own(recorder);
        let ids: Vec<u64> = self.state.keys().copied().collect();
        for id in ids {
            match self.state[&id] {
                State::Paused => {
                    self.signal(id, libc::SIGCONT);
                    recorder.fault(format!("heal: resume member {id}"));
                }
                State::Down | State::Stranded => {
                    for _ in 0..HEAL_RESTARTS {
                        if restart(self, id, recorder, "heal").await {
                            break;
                        }
                    }
                    continue;
                }
                State::Removed => {
                    if rejoin(self, id, recorder, "heal").await {
                        self.add_back(id, recorder).await;
                    }
                }
                State::Unadded => {
                    if self.started_to_join(id, recorder).await {
                        self.add_back(id, recorder).await;
                    }
                }
                State::Running => {}
            }
            self.state.insert(id, State::Running);
        }
        self.whole_membership(recorder).await;
    }

    /// At the heal of a cluster: every member in the membership again. A
    /// member left out of it (by faults that raced, as once happened) is
    /// named in the history, wiped and added again, so that the run's end
    /// is checked on the cluster it began with, and the defect shows.
    async fn whole_membership(&mut self, recorder: &Recorder) {
        if self.state.len() < 2 {
            return;
        }
        let servers = self.real_clients();
        let mut listed = Err(crate::CliError::msg("not asked"));
        for _ in 0..10 {
            listed = crate::cluster::member_ids(&servers).await;
            if listed.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) => {
                recorder.fault(format!("heal: the membership could not be read: {e}"));
                return;
            }
        };
        let ids: Vec<u64> = self.state.keys().copied().collect();
        for id in ids {
            if listed.contains(&id) {
                continue;
            }
            recorder.fault(format!(
                "heal: member {id} is not in the cluster's membership; it is wiped and added again"
            ));
            if rejoin(self, id, recorder, "heal").await {
                self.add_back(id, recorder).await;
            }
        }
    }

    /// At the heal: adds member `id`, started empty, to the cluster again,
    /// as what it was (a voter or an observer).
    async fn add_back(&mut self, id: u64, recorder: &Recorder) {
        let servers = self.real_clients();
        let (member, observer) = (self.cluster.member(id), self.observes(id));
        add_again(&servers, member, id, observer, recorder, "heal").await;
    }
}

/// Starts again each member whose restart failed earlier, and adds again
/// each whose adding failed (once each; not holding the servers meanwhile,
/// since a membership change may take long).
async fn retry_failed(target: &Arc<Mutex<Target>>, recorder: &Recorder) {
    left_out(target, recorder).await;
    let unadded: Vec<(u64, String, baton_cluster::Member, bool, Claim)> = {
        let mut t = target.lock().await;
        t.ended_on_their_own(recorder);
        let stranded: Vec<u64> = t
            .state
            .iter()
            .filter(|(_, s)| **s == State::Stranded)
            .map(|(id, _)| *id)
            .collect();
        for id in stranded {
            restart(&mut t, id, recorder, "again").await;
        }
        let ids: Vec<u64> = t
            .state
            .iter()
            .filter(|(_, s)| **s == State::Unadded)
            .map(|(id, _)| *id)
            .collect();
        let mut unadded = Vec::new();
        for id in ids {
            // One schedule at a time adds it (another's add may be under
            // way, and take up to two minutes).
            let Some(claim) = t.claims.claim(&[id]) else {
                continue;
            };
            if !t.started_to_join(id, recorder).await {
                continue;
            }
            unadded.push((
                id,
                t.real_clients(),
                t.cluster.member(id),
                t.observes(id),
                claim,
            ));
        }
        unadded
    };
    for (id, servers, member, observer, _claim) in unadded {
        if add_again_tries(&servers, member, id, observer, recorder, "again", 1).await {
            let mut t = target.lock().await;
            if t.state.get(&id) == Some(&State::Unadded) {
                t.state.insert(id, State::Running);
            }
        }
    }
}

/// Members counted as running that the cluster has gone on without (see
/// [`Unlisted`]) for [`UNLISTED_FOR`], as the leader's committed
/// membership says: wiped and started empty, to be
/// added again (at once, by the caller, or at a later step). The
/// membership is read at most every 2 s, without holding the servers.
async fn left_out(target: &Arc<Mutex<Target>>, recorder: &Recorder) {
    let servers = {
        let mut t = target.lock().await;
        let now = Instant::now();
        let recent = t
            .unlisted
            .read
            .is_some_and(|read| now.duration_since(read) < Duration::from_secs(2));
        if t.state.len() < 2 || recent {
            return;
        }
        t.unlisted.read = Some(now);
        t.real_clients()
    };
    let Ok(Some(listed)) = crate::cluster::committed_member_ids(&servers).await else {
        return;
    };
    let mut t = target.lock().await;
    let running: Vec<u64> = t.state.keys().copied().filter(|id| t.free(*id)).collect();
    for id in t.unlisted.overdue(&running, &listed, Instant::now()) {
        recorder.fault(format!(
            "member {id} is not in the cluster's membership, though no fault removed it (a removal \
             whose answer was lost was made after all); it is wiped and added again"
        ));
        t.state.insert(id, State::Unadded);
        rejoin(&mut t, id, recorder, "again").await;
    }
}

/// Runs one schedule of faults until `until`.
pub async fn schedule(
    target: Arc<Mutex<Target>>,
    kinds: Vec<Nemesis>,
    recorder: Recorder,
    mut rng: Rng,
    until: Instant,
) {
    let members = target.lock().await.state.len();
    let kinds: Vec<Nemesis> = kinds
        .into_iter()
        .filter(|k| k.acts_on_members() && (members > 1 || !k.needs_cluster()))
        .collect();
    if kinds.is_empty() {
        return;
    }
    loop {
        let wait = rng.between(Duration::from_millis(300), Duration::from_millis(2500));
        if Instant::now() + wait >= until {
            return;
        }
        tokio::time::sleep(wait).await;
        retry_failed(&target, &recorder).await;
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        match kind {
            Nemesis::LagThenCrash => {
                lag_then_crash(&target, &recorder, &mut rng, until).await;
                continue;
            }
            Nemesis::Partition | Nemesis::OneWay | Nemesis::Slow | Nemesis::CutClients => {
                cut(&target, kind, &recorder, &mut rng, until).await;
                continue;
            }
            Nemesis::SlowThenCrash => {
                slow_then_crash(&target, &recorder, &mut rng, until).await;
                continue;
            }
            Nemesis::SlowDisk | Nemesis::FullDisk | Nemesis::NoNewFiles => {
                disk(&target, kind, &recorder, &mut rng, until).await;
                continue;
            }
            Nemesis::Membership => {
                membership(&target, &recorder, &mut rng).await;
                continue;
            }
            Nemesis::StaleCopy => {
                stale_copy(&target, &recorder, &mut rng, until).await;
                continue;
            }
            _ => {}
        }
        let count = if kind.needs_cluster() { 2 } else { 1 };
        let chosen = choose(&target, count, &mut rng).await;
        if chosen.len() < count {
            continue; // every member is under a fault already
        }
        match kind {
            Nemesis::Stutter => {
                let (id, role) = chosen[0];
                let length = rng.between(Duration::from_millis(1000), Duration::from_millis(5000));
                let Some(stutter) =
                    Stutter::start(&target, id, false, Rng::new(rng.next()), until).await
                else {
                    continue; // taken by another fault since it was chosen
                };
                recorder.fault(format!(
                    "stutter member {id}{role} for {} ms: stopped 1 to 4 ms every 3 to 14 ms",
                    length.as_millis()
                ));
                tokio::time::sleep(length.min(until.saturating_duration_since(Instant::now())))
                    .await;
                stutter.end(&target).await;
                recorder.fault(format!("member {id} runs smoothly again"));
            }
            Nemesis::Pause | Nemesis::PauseTwo => {
                let hold = rng.between(Duration::from_millis(200), Duration::from_millis(4000));
                let mut paused = Vec::new();
                {
                    let mut t = target.lock().await;
                    for (id, role) in &chosen {
                        // Taken by another fault since it was chosen.
                        if !t.free(*id) {
                            continue;
                        }
                        t.signal(*id, libc::SIGSTOP);
                        t.state.insert(*id, State::Paused);
                        paused.push(*id);
                        recorder.fault(format!(
                            "pause member {id}{role} for {} ms",
                            hold.as_millis()
                        ));
                    }
                }
                tokio::time::sleep(hold.min(until.saturating_duration_since(Instant::now()))).await;
                let mut t = target.lock().await;
                for id in &paused {
                    if t.state[id] == State::Paused {
                        t.signal(*id, libc::SIGCONT);
                        t.state.insert(*id, State::Running);
                        recorder.fault(format!("resume member {id}"));
                    }
                }
            }
            Nemesis::Kill | Nemesis::KillTwo => {
                let down = rng.between(Duration::from_millis(200), Duration::from_millis(3000));
                let mut killed = Vec::new();
                {
                    let mut t = target.lock().await;
                    for (id, role) in &chosen {
                        if !t.free(*id) {
                            continue;
                        }
                        t.cluster.kill9(*id).await;
                        t.state.insert(*id, State::Down);
                        killed.push(*id);
                        recorder.fault(format!("kill -9 member {id}{role}"));
                    }
                }
                tokio::time::sleep(down.min(until.saturating_duration_since(Instant::now()))).await;
                restart_down(&mut *target.lock().await, &killed, &recorder, "kill").await;
            }
            Nemesis::ClientPause
            | Nemesis::LagThenCrash
            | Nemesis::Partition
            | Nemesis::OneWay
            | Nemesis::Slow
            | Nemesis::SlowThenCrash
            | Nemesis::CutClients
            | Nemesis::SlowDisk
            | Nemesis::ClientClock
            | Nemesis::Membership
            | Nemesis::StaleCopy
            | Nemesis::FullDisk
            | Nemesis::NoNewFiles => {}
        }
    }
}

/// [`Nemesis::SlowDisk`], [`Nemesis::FullDisk`] or [`Nemesis::NoNewFiles`]
/// on one member whose disk is sound.
async fn disk(
    target: &Arc<Mutex<Target>>,
    kind: Nemesis,
    recorder: &Recorder,
    rng: &mut Rng,
    until: Instant,
) {
    let chosen = choose(target, 1, rng).await;
    let Some(&(id, role)) = chosen.first() else {
        return;
    };
    let hold = if kind == Nemesis::FullDisk {
        rng.between(Duration::from_millis(300), Duration::from_millis(3000))
    } else {
        rng.between(Duration::from_secs(1), Duration::from_secs(5))
    };
    {
        let mut t = target.lock().await;
        // A disk that stops the member (full, or no new files) is not
        // played on one another fault of several steps holds.
        let stops = kind != Nemesis::SlowDisk;
        if t.faulty_disks.contains(&id)
            || t.state.get(&id) != Some(&State::Running)
            || (stops && t.claims.contains(id))
        {
            return;
        }
        if kind == Nemesis::SlowDisk {
            let late = rng.between(t.heartbeat / 2, t.heartbeat * 8);
            t.disk_fault(id, Some(DiskFault::Slow(late)), recorder);
            recorder.fault(format!(
                "slow disk on member {id}{role}: each sync {} ms late, for {} ms",
                late.as_millis(),
                hold.as_millis()
            ));
        } else if kind == Nemesis::NoNewFiles {
            t.disk_fault(id, Some(DiskFault::NoNewFiles), recorder);
            recorder.fault(format!(
                "no new files on member {id}{role} for {} ms",
                hold.as_millis()
            ));
        } else {
            t.disk_fault(id, Some(DiskFault::Full), recorder);
            // It stops at its next write: counted as down until it is
            // started again.
            t.state.insert(id, State::Down);
            recorder.fault(format!(
                "full disk on member {id}{role} for {} ms",
                hold.as_millis()
            ));
        }
    }
    tokio::time::sleep(hold.min(until.saturating_duration_since(Instant::now()))).await;
    let mut t = target.lock().await;
    if !t.faulty_disks.contains(&id) {
        return; // healed meanwhile
    }
    t.disk_fault(id, None, recorder);
    if kind == Nemesis::SlowDisk {
        recorder.fault(format!("the disk of member {id} is fast again"));
        return;
    }
    if kind == Nemesis::NoNewFiles {
        // A snapshot or a new segment that failed meanwhile may have
        // stopped it.
        let ended = t.cluster.exited(id);
        recorder.fault(format!(
            "files can be created on member {id} again (its process {})",
            if ended { "had ended" } else { "runs on" }
        ));
        if ended && t.state.get(&id) == Some(&State::Running) {
            t.state.insert(id, State::Down);
            restart_down(&mut t, &[id], recorder, "no new files").await;
        }
        return;
    }
    let ended = t.cluster.exited(id);
    recorder.fault(format!(
        "the disk of member {id} has room again (its process {})",
        if ended { "had ended" } else { "had not ended" }
    ));
    restart_down(&mut t, &[id], recorder, "full disk").await;
}

/// [`Nemesis::Partition`], [`Nemesis::OneWay`], [`Nemesis::Slow`] or
/// [`Nemesis::CutClients`]; one network fault at a time (another
/// schedule's under way: none).
async fn cut(
    target: &Arc<Mutex<Target>>,
    kind: Nemesis,
    recorder: &Recorder,
    rng: &mut Rng,
    until: Instant,
) {
    let (net, ids, steady) = {
        let t = target.lock().await;
        let ids = t.state.keys().copied().collect::<Vec<_>>();
        (t.net.clone(), ids, t.steady)
    };
    if net.any_fault() {
        return;
    }
    let leader = if rng.chance(50) {
        let addrs = target.lock().await.addrs();
        leader_among(&addrs).await
    } else {
        None
    };
    let first = leader.unwrap_or_else(|| ids[rng.below(ids.len() as u64) as usize]);
    // The links of a leader that must stay (see `Target::steady`) are left
    // alone; cutting its clients off moves no leadership.
    if kind != Nemesis::CutClients && steady == Some(first) {
        return;
    }
    let ids: Vec<u64> = ids
        .into_iter()
        .filter(|id| Some(*id) != steady || *id == first)
        .collect();
    if ids.len() < 2 {
        return;
    }
    let role = if leader.is_some() {
        " (the leader)"
    } else {
        ""
    };
    if kind == Nemesis::Slow {
        let others: Vec<u64> = ids.iter().copied().filter(|id| *id != first).collect();
        let other = others[rng.below(others.len() as u64) as usize];
        let heartbeat = target.lock().await.heartbeat;
        let delay = rng.between(heartbeat / 2, heartbeat * 2);
        let hold = rng.between(Duration::from_millis(1000), Duration::from_millis(5000));
        net.slow(&[first], &[other], delay);
        recorder.fault(format!(
            "slow the link between members {first}{role} and {other}: {} ms late each way, for {} ms",
            delay.as_millis(),
            hold.as_millis()
        ));
        tokio::time::sleep(hold.min(until.saturating_duration_since(Instant::now()))).await;
        net.heal(&[first], &[other]);
        recorder.fault(format!("heal the link between members {first} and {other}"));
        return;
    }
    if kind == Nemesis::OneWay {
        let rest: Vec<u64> = ids.iter().copied().filter(|id| *id != first).collect();
        let hold = rng.between(Duration::from_millis(500), Duration::from_millis(5000));
        let what = if rng.chance(50) {
            net.cut_one_way(&rest, &[first]);
            format!(
                "cut one way: member {first}{role} hears nothing from members {} for {} ms",
                list(&rest),
                hold.as_millis()
            )
        } else {
            net.cut_one_way(&[first], &rest);
            format!(
                "cut one way: members {} hear nothing from member {first}{role} for {} ms",
                list(&rest),
                hold.as_millis()
            )
        };
        recorder.fault(what);
        tokio::time::sleep(hold.min(until.saturating_duration_since(Instant::now()))).await;
        net.heal(&[first], &rest);
        recorder.fault(format!("heal the cut of member {first}"));
        return;
    }
    let (side, other, hold, what): (Vec<u64>, Vec<u64>, Duration, String) = match kind {
        Nemesis::Partition => {
            let mut side = vec![first];
            let mut rest: Vec<u64> = ids.iter().copied().filter(|id| *id != first).collect();
            if ids.len() >= 5 && rng.chance(50) {
                side.push(rest.remove(rng.below(rest.len() as u64) as usize));
            }
            let hold = rng.between(Duration::from_millis(500), Duration::from_millis(5000));
            let what = format!(
                "cut member{} {}{role} off from members {} for {} ms",
                if side.len() > 1 { "s" } else { "" },
                list(&side),
                list(&rest),
                hold.as_millis()
            );
            (side, rest, hold, what)
        }
        _ => {
            let hold = rng.between(Duration::from_millis(300), Duration::from_millis(4000));
            let what = format!(
                "cut clients off from member {first}{role} for {} ms",
                hold.as_millis()
            );
            (vec![first], vec![CLIENTS], hold, what)
        }
    };
    net.cut(&side, &other);
    recorder.fault(what);
    tokio::time::sleep(hold.min(until.saturating_duration_since(Instant::now()))).await;
    net.heal(&side, &other);
    recorder.fault(format!(
        "heal the cut of member{} {}",
        if side.len() > 1 { "s" } else { "" },
        list(&side)
    ));
}

/// `1, 2 and 3`.
fn list(ids: &[u64]) -> String {
    let names: Vec<String> = ids.iter().map(u64::to_string).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// [`Nemesis::LagThenCrash`]: every step on members not under another
/// fault; given up if the leader is unknown or the followers are busy.
async fn lag_then_crash(
    target: &Arc<Mutex<Target>>,
    recorder: &Recorder,
    rng: &mut Rng,
    until: Instant,
) {
    let Some((leader, followers, mut claim)) = leader_and_followers(target).await else {
        return;
    };
    if followers.len() < 2 || Instant::now() + Duration::from_secs(4) > until {
        return;
    }
    let (slow, other) = if rng.chance(50) {
        (followers[0], followers[1])
    } else {
        (followers[1], followers[0])
    };
    claim.keep_only(&[leader, slow, other]);
    let step = |low: u64, high: u64, rng: &mut Rng| {
        rng.between(Duration::from_millis(low), Duration::from_millis(high))
    };
    let set = |t: &mut Target, ids: &[u64], sig: i32, state: State| {
        for id in ids {
            t.signal(*id, sig);
            t.state.insert(*id, state);
        }
    };
    let first = FirstFollower::take_out(target, other, rng, recorder, "lag then crash").await;
    tokio::time::sleep(step(500, 2000, rng)).await;
    let stutter =
        starve_half_the_time(target, leader, rng, until, recorder, "lag then crash").await;
    recorder.fault(format!(
        "lag then crash: pause member {slow} (the other follower) while large appends go to it"
    ));
    set(
        &mut *target.lock().await,
        &[slow],
        libc::SIGSTOP,
        State::Paused,
    );
    // Large appends meanwhile: sixteen writes of 900 KiB at once, so that a
    // batch of entries takes more than a heartbeat to go out.
    let servers = target
        .lock()
        .await
        .addrs()
        .into_iter()
        .map(|(_, a)| a)
        .collect::<Vec<_>>()
        .join(",");
    let mut ballast = tokio::spawn(async move {
        let Ok(client) = baton_client::Client::builder(&servers)
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
        else {
            return;
        };
        let writes = (0..16)
            .map(|_| client.set_data(super::workloads::BALLAST, vec![b' '; 900 * 1024], None));
        let _ =
            tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(writes)).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
    });
    tokio::time::sleep(step(150, 400, rng)).await;
    set(
        &mut *target.lock().await,
        &[slow],
        libc::SIGCONT,
        State::Running,
    );
    recorder.fault(format!("lag then crash: resume member {slow}"));
    // Paused again half the time once the large writes are acknowledged
    // (the follower has caught up, answering calls the leader may have
    // given up on), otherwise while it may still be taking them in.
    if rng.chance(50) {
        let _ = tokio::time::timeout(Duration::from_secs(3), &mut ballast).await;
        tokio::time::sleep(step(0, 60, rng)).await;
    } else {
        tokio::time::sleep(step(20, 300, rng)).await;
    }
    ballast.abort();
    set(
        &mut *target.lock().await,
        &[slow],
        libc::SIGSTOP,
        State::Paused,
    );
    recorder.fault(format!(
        "lag then crash: pause member {slow} again (both followers paused)"
    ));
    tokio::time::sleep(step(100, 400, rng)).await;
    if let Some(stutter) = stutter {
        stutter.end(target).await;
    }
    {
        let mut t = target.lock().await;
        for id in [leader, slow] {
            t.cluster.kill9(id).await;
            t.state.insert(id, State::Down);
        }
    }
    recorder.fault(format!(
        "lag then crash: kill -9 members {leader} (the leader) and {slow} (the follower that lagged)"
    ));
    tokio::time::sleep(step(100, 300, rng)).await;
    first
        .bring_back(target, leader, slow, rng, recorder, "lag then crash")
        .await;
}

/// [`Nemesis::SlowThenCrash`]: as [`lag_then_crash`], with a slow link in
/// place of the paused follower that lags; given up if the leader is
/// unknown, the followers are busy or another network fault is on.
async fn slow_then_crash(
    target: &Arc<Mutex<Target>>,
    recorder: &Recorder,
    rng: &mut Rng,
    until: Instant,
) {
    let Some((leader, followers, mut claim)) = leader_and_followers(target).await else {
        return;
    };
    let (net, heartbeat) = {
        let t = target.lock().await;
        if t.net.any_fault() {
            return;
        }
        (t.net.clone(), t.heartbeat)
    };
    if followers.len() < 2 || Instant::now() + Duration::from_secs(6) > until {
        return;
    }
    let (slow, other) = if rng.chance(50) {
        (followers[0], followers[1])
    } else {
        (followers[1], followers[0])
    };
    claim.keep_only(&[leader, slow, other]);
    let first = FirstFollower::take_out(target, other, rng, recorder, "slow then crash").await;
    let stutter =
        starve_half_the_time(target, leader, rng, until, recorder, "slow then crash").await;
    let delay = rng.between(heartbeat / 2, heartbeat * 2);
    net.slow(&[leader], &[slow], delay);
    recorder.fault(format!(
        "slow then crash: slow the link between members {leader} (the leader) and {slow}: {} ms late each way",
        delay.as_millis()
    ));
    tokio::time::sleep(rng.between(Duration::from_millis(300), Duration::from_millis(1500))).await;
    // Paused too: what it sent before is still on its way, late.
    {
        let mut t = target.lock().await;
        t.signal(slow, libc::SIGSTOP);
        t.state.insert(slow, State::Paused);
    }
    recorder.fault(format!(
        "slow then crash: pause member {slow} too (both followers paused)"
    ));
    tokio::time::sleep(rng.between(Duration::from_millis(50), Duration::from_millis(400))).await;
    if let Some(stutter) = stutter {
        stutter.end(target).await;
    }
    {
        let mut t = target.lock().await;
        for id in [leader, slow] {
            t.cluster.kill9(id).await;
            t.state.insert(id, State::Down);
        }
    }
    recorder.fault(format!(
        "slow then crash: kill -9 members {leader} (the leader) and {slow} (behind the slow link)"
    ));
    tokio::time::sleep(rng.between(Duration::from_millis(100), Duration::from_millis(300))).await;
    net.heal(&[leader], &[slow]);
    recorder.fault(format!(
        "slow then crash: heal the link between members {leader} and {slow}"
    ));
    first
        .bring_back(target, leader, slow, rng, recorder, "slow then crash")
        .await;
}

/// A member starved of the CPU: stopped for 1 to 4 ms every 3 to 14 ms
/// until [`Stutter::end`] (or the end of the run's faults). Counted as
/// paused meanwhile, unless the fault that starts it holds it already (see
/// [`Claims`]), so that no other fault takes it.
struct Stutter {
    id: u64,
    held: bool,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Stutter {
    /// Starts on member `id` if it runs and (unless `held`, by the
    /// caller) no fault holds it.
    async fn start(
        target: &Arc<Mutex<Target>>,
        id: u64,
        held: bool,
        rng: Rng,
        until: Instant,
    ) -> Option<Stutter> {
        let pid = {
            let mut t = target.lock().await;
            let running = t.state.get(&id) == Some(&State::Running);
            if !running || (!held && !t.free(id)) {
                return None;
            }
            if !held {
                t.state.insert(id, State::Paused);
            }
            t.cluster.members[&id].pid as i32
        };
        let done = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(starve(pid, done.clone(), rng, until));
        Some(Stutter {
            id,
            held,
            done,
            task,
        })
    }

    /// Lets the member run smoothly again.
    async fn end(self, target: &Arc<Mutex<Target>>) {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let mut t = target.lock().await;
        t.signal(self.id, libc::SIGCONT);
        if !self.held {
            t.state.insert(self.id, State::Running);
        }
    }
}

/// Stops process `pid` for 1 to 4 ms every 3 to 14 ms until `done` is set
/// or `until` has passed, and leaves it running.
async fn starve(pid: i32, done: Arc<AtomicBool>, mut rng: Rng, until: Instant) {
    let mut between =
        |low: u64, high: u64| rng.between(Duration::from_millis(low), Duration::from_millis(high));
    while !done.load(Ordering::Relaxed) && Instant::now() < until {
        // SAFETY: kill(2) on a process this run started, which no other
        // fault signals or kills meanwhile.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        tokio::time::sleep(between(1, 4)).await;
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        tokio::time::sleep(between(2, 10)).await;
    }
}

/// Half the time, starves `leader` (held by the caller's round `fault`)
/// of the CPU until the stutter returned ends.
async fn starve_half_the_time(
    target: &Arc<Mutex<Target>>,
    leader: u64,
    rng: &mut Rng,
    until: Instant,
    recorder: &Recorder,
    fault: &str,
) -> Option<Stutter> {
    if !rng.chance(50) {
        return None;
    }
    let stutter = Stutter::start(target, leader, true, Rng::new(rng.next()), until).await?;
    recorder.fault(format!(
        "{fault}: starve member {leader} (the leader) of the CPU meanwhile: stopped 1 to 4 ms every 3 to 14 ms"
    ));
    Some(stutter)
}

/// The follower that a crash round ([`Nemesis::LagThenCrash`],
/// [`Nemesis::SlowThenCrash`]) takes out first, before it makes the other
/// one lag. Paused, it still takes in what the leader sends it, and stores
/// it once it runs again; killed (half the time), it holds none of it, and
/// the next leader is chosen from what the lagging follower stored alone.
struct FirstFollower {
    id: u64,
    killed: bool,
}

impl FirstFollower {
    async fn take_out(
        target: &Arc<Mutex<Target>>,
        id: u64,
        rng: &mut Rng,
        recorder: &Recorder,
        fault: &str,
    ) -> FirstFollower {
        let killed = rng.chance(50);
        let mut t = target.lock().await;
        if killed {
            t.cluster.kill9(id).await;
            t.state.insert(id, State::Down);
            recorder.fault(format!(
                "{fault}: crash member {id} (a follower) with kill -9"
            ));
        } else {
            t.signal(id, libc::SIGSTOP);
            t.state.insert(id, State::Paused);
            recorder.fault(format!(
                "{fault}: pause member {id} (a follower) throughout"
            ));
        }
        FirstFollower { id, killed }
    }

    /// After `leader` and `lagging` were killed together: a paused first
    /// follower is resumed, and the two started again a moment later; a
    /// killed one is started again with `lagging`, and `leader` only once
    /// those two have chosen a leader (or 10 s have passed), so that what
    /// it alone holds must give way.
    async fn bring_back(
        self,
        target: &Arc<Mutex<Target>>,
        leader: u64,
        lagging: u64,
        rng: &mut Rng,
        recorder: &Recorder,
        fault: &str,
    ) {
        let id = self.id;
        if self.killed {
            restart_down(&mut *target.lock().await, &[id, lagging], recorder, fault).await;
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let addrs = target.lock().await.addrs();
                if leader_among(&addrs).await.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            let mut t = target.lock().await;
            t.signal(id, libc::SIGCONT);
            t.state.insert(id, State::Running);
            recorder.fault(format!("{fault}: resume member {id}"));
        }
        tokio::time::sleep(rng.between(Duration::from_millis(300), Duration::from_millis(1500)))
            .await;
        restart_down(
            &mut *target.lock().await,
            &[leader, lagging],
            recorder,
            fault,
        )
        .await;
    }
}

/// [`Nemesis::Membership`]: one member out of the cluster and in again.
async fn membership(target: &Arc<Mutex<Target>>, recorder: &Recorder, rng: &mut Rng) {
    let chosen = choose(target, 1, rng).await;
    let Some(&(id, role)) = chosen.first() else {
        return;
    };
    let out = rng.between(Duration::from_millis(500), Duration::from_millis(3000));
    out_and_in(target, id, role, out, recorder, "membership", false).await;
}

/// Removes member `id` from the cluster, and `out` later starts it empty
/// and adds it again, noting each step in the history as one of `fault`;
/// `held`: the caller holds the member (see [`Claims`]), which it must
/// not be otherwise.
async fn out_and_in(
    target: &Arc<Mutex<Target>>,
    id: u64,
    role: &str,
    out: Duration,
    recorder: &Recorder,
    fault: &str,
    held: bool,
) {
    let servers = {
        let mut t = target.lock().await;
        if t.state.get(&id) != Some(&State::Running) || (!held && t.claims.contains(id)) {
            return;
        }
        // Left alone by the other faults meanwhile.
        t.state.insert(id, State::Removed);
        t.real_clients()
    };
    recorder.fault(format!(
        "{fault}: remove member {id}{role} from the cluster"
    ));
    let removed =
        crate::cluster::change_membership(&servers, baton_cluster::admin::Change::Remove { id })
            .await;
    if let Err(e) = removed {
        // Perhaps made all the same: only a member the leader no longer
        // lists may have its data wiped.
        // Only a committed membership without it counts: one proposed may
        // wait for a paused member, or be undone by the next leader.
        let listed = crate::cluster::committed_member_ids(&servers).await;
        if !matches!(&listed, Ok(Some(ids)) if !ids.contains(&id)) {
            recorder.fault(format!("{fault}: member {id} was not removed: {e}"));
            let mut t = target.lock().await;
            if t.state.get(&id) == Some(&State::Removed) {
                t.state.insert(id, State::Running);
            }
            return;
        }
    }
    recorder.fault(format!("{fault}: member {id} removed"));
    tokio::time::sleep(out).await;
    let (member, observer) = {
        let mut t = target.lock().await;
        if t.state.get(&id) != Some(&State::Removed) || !rejoin(&mut t, id, recorder, fault).await {
            return;
        }
        (t.cluster.member(id), t.observes(id))
    };
    let added = add_again(&servers, member, id, observer, recorder, fault).await;
    let mut t = target.lock().await;
    if t.state.get(&id) == Some(&State::Removed) {
        t.state.insert(
            id,
            if added {
                State::Running
            } else {
                State::Unadded
            },
        );
    }
}

/// [`Nemesis::StaleCopy`]: one member started from an old copy of its
/// data directory.
async fn stale_copy(
    target: &Arc<Mutex<Target>>,
    recorder: &Recorder,
    rng: &mut Rng,
    until: Instant,
) {
    let Some((leader, followers, mut claim)) = leader_and_followers(target).await else {
        return;
    };
    // The term it leads in: the copy is put back only if it still leads in
    // that term then.
    let addrs = target.lock().await.addrs();
    let Some((l, term)) = leader_and_term(&addrs).await else {
        return;
    };
    if l != leader {
        return;
    }
    let (id, _observer_claim) = {
        let mut t = target.lock().await;
        // Observers too: one put back from an old copy loses no
        // acknowledged write (it never counted towards one), but it must
        // not serve a client its older state.
        let observers: Vec<u64> = t
            .state
            .iter()
            .filter(|(id, s)| **s == State::Running && t.observes(**id) && !t.claims.contains(**id))
            .map(|(id, _)| *id)
            .collect();
        let pool: Vec<u64> = followers.iter().chain(&observers).copied().collect();
        if t.copying.is_some() || pool.is_empty() || t.state.values().any(|s| *s != State::Running)
        {
            return;
        }
        let id = pool[rng.below(pool.len() as u64) as usize];
        let observer_claim = if t.observes(id) {
            match t.claims.claim(&[id]) {
                Some(c) => Some(c),
                None => return,
            }
        } else {
            None
        };
        t.copying = Some(id);
        t.steady = Some(leader);
        (id, observer_claim)
    };
    // The leader stays while the member is put back (see the fault).
    claim.keep_only(&[leader, id]);
    put_back_a_copy(target, id, (leader, term), recorder, rng, until).await;
    let mut t = target.lock().await;
    t.copying = None;
    t.steady = None;
}

/// The member that says it leads and its term; of several (a deposed
/// leader may not know yet), the one in the highest term.
async fn leader_and_term(addrs: &[(u64, String)]) -> Option<(u64, u64)> {
    let asks = addrs.iter().map(|(id, addr)| async move {
        let answer = baton_client::probe(addr, Duration::from_millis(300), None)
            .await
            .ok()?;
        let status: serde_json::Value = serde_json::from_str(&answer).ok()?;
        let term = status["cluster"]["term"].as_u64()?;
        (status["role"].as_str() == Some("leader")).then_some((*id, term))
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .max_by_key(|(_, term)| *term)
}

/// [`stale_copy`] of follower (or observer) `id`, under `leader` in
/// `term`.
async fn put_back_a_copy(
    target: &Arc<Mutex<Target>>,
    id: u64,
    (leader, term): (u64, u64),
    recorder: &Recorder,
    rng: &mut Rng,
    until: Instant,
) {
    let (data, copy) = {
        let mut t = target.lock().await;
        if t.state.get(&id) != Some(&State::Running) {
            return;
        }
        let data = t.cluster.data_dir(id);
        let copy = data.with_extension("old");
        t.cluster.kill9(id).await;
        t.state.insert(id, State::Down);
        let copied = {
            let (data, copy) = (data.clone(), copy.clone());
            tokio::task::spawn_blocking(move || {
                let _ = std::fs::remove_dir_all(&copy);
                copy_tree(&data, &copy)
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        };
        if let Err(e) = copied {
            recorder.fault(format!("stale copy: member {id} not copied: {e}"));
            restart(&mut t, id, recorder, "stale copy").await;
            return;
        }
        let role = if t.observes(id) {
            "an observer"
        } else {
            "a follower"
        };
        recorder.fault(format!(
            "stale copy: kill -9 member {id} ({role}), copy its data directory"
        ));
        restart(&mut t, id, recorder, "stale copy").await;
        (data, copy)
    };
    let hold = rng.between(Duration::from_secs(1), Duration::from_secs(8));
    tokio::time::sleep(hold.min(until.saturating_duration_since(Instant::now()))).await;
    // What the fault promises holds only while the leader stays: with
    // leadership moved since the copy (another fault cut the leader off,
    // say), the member put back may have acknowledged entries of a term its
    // copy does not know, or lead itself, and any Raft cluster can lose
    // writes then. Not put back.
    let addrs = target.lock().await.addrs();
    let now = leader_and_term(&addrs).await;
    if now != Some((leader, term)) {
        let now = match now {
            Some((l, t)) => format!("member {l} leads in term {t}"),
            None => "no member says it leads".to_string(),
        };
        recorder.fault(format!(
            "stale copy: member {id} not put back: member {leader} led in term {term} when it was copied, now {now}"
        ));
        let _ = std::fs::remove_dir_all(&copy);
        return;
    }
    let mut t = target.lock().await;
    if t.state.get(&id) != Some(&State::Running) {
        let _ = std::fs::remove_dir_all(&copy);
        return;
    }
    t.cluster.kill9(id).await;
    t.state.insert(id, State::Down);
    let put_back = std::fs::remove_dir_all(&data).and_then(|()| std::fs::rename(&copy, &data));
    match put_back {
        Ok(()) => recorder.fault(format!(
            "stale copy: kill -9 member {id}, put back its data directory of {} ms before",
            hold.as_millis()
        )),
        Err(e) => recorder.fault(format!("stale copy: member {id} not put back: {e}")),
    }
    if !restart(&mut t, id, recorder, "stale copy").await {
        return;
    }
    drop(t);
    // A leader that had its acknowledgements finds its log went back and
    // tells it, and it stops. (A leader elected since it was copied does
    // not know what it acknowledged: it catches up as any member behind.)
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        {
            let mut t = target.lock().await;
            if t.state.get(&id) != Some(&State::Running) {
                return; // under another fault now
            }
            if t.cluster.exited(id) {
                break;
            }
        }
        if Instant::now() >= deadline {
            recorder.fault(format!(
                "stale copy: member {id} runs on (no leader knew how far it had held the log)"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    recorder.fault(format!(
        "stale copy: member {id} stopped, its log behind what it had acknowledged"
    ));
    // What the operator does then.
    out_and_in(target, id, "", Duration::ZERO, recorder, "stale copy", true).await;
}

/// Copies directory `from` to `to` (made), with everything under it.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Starts removed member `id` empty, to be added again; whether it started.
async fn rejoin(t: &mut Target, id: u64, recorder: &Recorder, fault: &str) -> bool {
    match t.cluster.rejoin(id).await {
        Ok(()) => {
            recorder.fault(format!("{fault}: start member {id} again, empty"));
            true
        }
        Err(e) => {
            recorder.fault(format!("{fault}: member {id} did not start: {e}"));
            false
        }
    }
}

/// Adds member `id` to the cluster again (a few tries), as a voter or as
/// an `observer`; whether it was.
async fn add_again(
    servers: &str,
    member: baton_cluster::Member,
    id: u64,
    observer: bool,
    recorder: &Recorder,
    fault: &str,
) -> bool {
    add_again_tries(servers, member, id, observer, recorder, fault, 5).await
}

/// [`add_again`], with at most `tries` tries.
async fn add_again_tries(
    servers: &str,
    member: baton_cluster::Member,
    id: u64,
    observer: bool,
    recorder: &Recorder,
    fault: &str,
    tries: usize,
) -> bool {
    let mut last = String::new();
    for _ in 0..tries {
        let change = baton_cluster::admin::Change::Add {
            id,
            member: member.clone(),
            observer,
        };
        match crate::cluster::change_membership(servers, change).await {
            Ok(_) => {
                recorder.fault(format!("{fault}: member {id} added again"));
                return true;
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    recorder.fault(format!("{fault}: member {id} was not added again: {last}"));
    false
}

/// Starts again each of `ids` that is still down, noting it in the history
/// as a step of `fault`.
async fn restart_down(t: &mut Target, ids: &[u64], recorder: &Recorder, fault: &str) {
    for &id in ids {
        if t.state.get(&id) == Some(&State::Down) {
            restart(t, id, recorder, fault).await;
        }
    }
}

/// How many times the heal tries to start a member that is down.
const HEAL_RESTARTS: usize = 3;

/// Starts member `id` again, noting it in the history as a step of
/// `fault`: running if it started, stranded (to be tried again) if not.
async fn restart(t: &mut Target, id: u64, recorder: &Recorder, fault: &str) -> bool {
    match t.cluster.restart(id).await {
        Ok(()) => {
            recorder.fault(format!("{fault}: restart member {id}"));
            t.state.insert(id, State::Running);
            true
        }
        Err(e) => {
            recorder.fault(format!("{fault}: member {id} did not restart: {e}"));
            t.state.insert(id, State::Stranded);
            false
        }
    }
}

/// `count` running members, the leader first half the time; each with a
/// note of whether it leads, for the history. Two or more are faults
/// about the majority: voters only.
async fn choose(
    target: &Arc<Mutex<Target>>,
    count: usize,
    rng: &mut Rng,
) -> Vec<(u64, &'static str)> {
    let leader = if rng.chance(50) {
        let addrs = target.lock().await.addrs();
        leader_among(&addrs).await
    } else {
        None
    };
    let t = target.lock().await;
    let mut running: Vec<u64> = t
        .state
        .iter()
        .filter(|(id, s)| **s == State::Running && !t.claims.contains(**id))
        .map(|(id, _)| *id)
        .filter(|id| count < 2 || !t.observes(*id))
        .collect();
    let mut chosen = Vec::new();
    if let Some(l) = leader.filter(|l| running.contains(l)) {
        running.retain(|id| *id != l);
        chosen.push((l, " (the leader)"));
    }
    while chosen.len() < count && !running.is_empty() {
        let i = rng.below(running.len() as u64) as usize;
        chosen.push((running.remove(i), ""));
    }
    chosen
}

/// The member that says it leads and the running voters that follow it,
/// held (see [`Claims`]) until the claim is dropped; `None` if no member
/// says it leads, or the leader is under a fault. Observers are left out:
/// the faults that ask for these are about the majority.
async fn leader_and_followers(target: &Arc<Mutex<Target>>) -> Option<(u64, Vec<u64>, Claim)> {
    let addrs = target.lock().await.addrs();
    let leader = leader_among(&addrs).await?;
    let t = target.lock().await;
    let free = |id: &u64, s: &State| *s == State::Running && !t.claims.contains(*id);
    if !t.state.get(&leader).is_some_and(|s| free(&leader, s)) {
        return None;
    }
    let followers: Vec<u64> = t
        .state
        .iter()
        .filter(|(id, s)| **id != leader && free(id, s) && !t.observes(**id))
        .map(|(id, _)| *id)
        .collect();
    let mut all = followers.clone();
    all.push(leader);
    let claim = t.claims.claim(&all)?;
    Some((leader, followers, claim))
}

/// The member that says it leads (or the single server), asking each
/// briefly: a paused member does not hold the question up for long.
pub async fn leader_among(addrs: &[(u64, String)]) -> Option<u64> {
    let asks = addrs.iter().map(|(id, addr)| async move {
        let answer = baton_client::probe(addr, Duration::from_millis(300), None)
            .await
            .ok()?;
        let status: serde_json::Value = serde_json::from_str(&answer).ok()?;
        matches!(status["role"].as_str(), Some("leader" | "single")).then_some(*id)
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .next()
}

/// Notes in the history each time another member leads, until `until`.
pub async fn follow_leader(target: Arc<Mutex<Target>>, recorder: Recorder, until: Instant) {
    let mut last = None;
    while Instant::now() < until {
        let addrs = target.lock().await.addrs();
        let now = leader_among(&addrs).await;
        if now != last && now.is_some() {
            recorder.fault(format!("member {} leads", now.unwrap_or(0)));
            last = now;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state of process `pid` in /proc (`T` when stopped).
    fn process_state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // After the command's name, in parentheses.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.chars().next().unwrap()
    }

    /// A starved process is stopped again and again while the stutter
    /// lasts, and left running once it ends.
    #[tokio::test]
    async fn a_starved_process_stops_in_bursts_and_runs_again_after() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let done = Arc::new(AtomicBool::new(false));
        let until = Instant::now() + Duration::from_secs(30);
        let task = tokio::spawn(starve(pid as i32, done.clone(), Rng::new(7), until));
        let (mut stopped, mut running) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        while stopped < 5 || running < 5 {
            assert!(
                Instant::now() < deadline,
                "seen stopped {stopped} and running {running} times"
            );
            match process_state(pid) {
                'T' => stopped += 1,
                _ => running += 1,
            }
            tokio::time::sleep(Duration::from_micros(700)).await;
        }
        done.store(true, Ordering::Relaxed);
        task.await.unwrap();
        for _ in 0..50 {
            assert_ne!(process_state(pid), 'T', "left stopped");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A member counted as running is taken for removed only once the
    /// leader has left it out for 30 s, seen at least twice; listed again
    /// meanwhile, or no longer counted as running, it starts over.
    #[test]
    fn a_member_left_out_of_the_membership_for_long_is_taken_for_removed() {
        let mut unlisted = Unlisted::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let running = [1, 2, 3];
        assert!(unlisted.overdue(&running, &[2, 3], at(0)).is_empty());
        assert!(unlisted.overdue(&running, &[2, 3], at(29)).is_empty());
        // Listed again: starts over.
        assert!(unlisted.overdue(&running, &[1, 2, 3], at(30)).is_empty());
        assert!(unlisted.overdue(&running, &[2, 3], at(31)).is_empty());
        assert!(unlisted.overdue(&running, &[2, 3], at(60)).is_empty());
        assert_eq!(unlisted.overdue(&running, &[2, 3], at(61)), vec![1]);
        // Returned once, then timed again.
        assert!(unlisted.overdue(&running, &[2, 3], at(62)).is_empty());
        // Under a fault meanwhile (not counted as running): starts over.
        assert!(unlisted.overdue(&[2, 3], &[2, 3], at(63)).is_empty());
        assert!(unlisted.overdue(&running, &[2, 3], at(70)).is_empty());
        assert_eq!(unlisted.overdue(&running, &[3], at(100)), vec![1]);
        assert!(unlisted.overdue(&running, &[3], at(129)).is_empty());
        assert_eq!(unlisted.overdue(&running, &[3], at(130)), vec![2]);
    }

    /// A member held by a fault of several steps is not held again until
    /// that fault lets it go, narrowing its hold or ending.
    #[test]
    fn a_member_held_by_one_fault_is_not_given_to_another() {
        let claims = Claims::default();
        let mut round = claims.claim(&[1, 2, 3]).expect("nothing held yet");
        assert!(claims.claim(&[3]).is_none());
        assert!(claims.contains(2));
        round.keep_only(&[1, 3]);
        assert!(!claims.contains(2));
        let other = claims.claim(&[2]).expect("let go of");
        assert!(claims.claim(&[1, 2]).is_none());
        drop(round);
        assert!(!claims.contains(1) && !claims.contains(3));
        assert!(claims.contains(2));
        drop(other);
        assert!(claims.claim(&[1, 2, 3]).is_some());
    }

    /// Lines as the faults write them: each injected fault is named once,
    /// and what follows it (heals, restarts, leaders) is not a fault.
    #[test]
    fn each_injected_fault_is_counted_once_by_name() {
        let lines = [
            ("pause member 2 (the leader) for 440 ms", Some(("pause", true))),
            ("resume member 2", None),
            ("kill -9 member 3", Some(("kill", true))),
            ("kill: restart member 3", None),
            (
                "lag then crash: pause member 1 (a follower) throughout",
                None,
            ),
            (
                "lag then crash: kill -9 members 2 (the leader) and 3 (the follower that lagged)",
                Some(("lag-then-crash", true)),
            ),
            (
                "slow then crash: slow the link between members 3 (the leader) and 2: 51 ms late each way",
                None,
            ),
            (
                "slow then crash: kill -9 members 3 (the leader) and 2 (behind the slow link)",
                Some(("slow-then-crash", true)),
            ),
            (
                "cut member 1 off from members 2 and 3 for 1334 ms",
                Some(("partition", true)),
            ),
            (
                "cut members 1 and 2 off from members 3, 4 and 5 for 900 ms",
                Some(("partition", true)),
            ),
            ("heal the cut of member 1", None),
            (
                "cut one way: member 1 hears nothing from members 2 and 3 for 800 ms",
                Some(("one-way", true)),
            ),
            (
                "slow the link between members 1 and 3: 30 ms late each way, for 1436 ms",
                Some(("slow", true)),
            ),
            (
                "cut clients off from member 1 for 708 ms",
                Some(("cut-clients", true)),
            ),
            (
                "slow disk on member 2 (the leader): each sync 51 ms late, for 4882 ms",
                Some(("slow-disk", true)),
            ),
            ("the disk of member 2 is fast again", None),
            (
                "full disk on member 2 (the leader) for 2199 ms",
                Some(("full-disk", true)),
            ),
            ("full disk: restart member 2", None),
            (
                "no new files on member 1 for 3000 ms",
                Some(("no-new-files", true)),
            ),
            ("files can be created on member 1 again (its process runs on)", None),
            (
                "membership: remove member 3 (the leader) from the cluster",
                Some(("membership", true)),
            ),
            ("membership: member 3 removed", None),
            ("membership: start member 3 again, empty", None),
            (
                "stale copy: kill -9 member 2 (a follower), copy its data directory",
                None,
            ),
            (
                "stale copy: kill -9 member 2, put back its data directory of 3000 ms before",
                Some(("stale-copy", true)),
            ),
            ("client 603 pauses for 2098 ms", Some(("client-pause", false))),
            (
                "client clocks jump forward by 40220 ms, for 3647 ms",
                Some(("client-clock", false)),
            ),
            ("client clocks true again", None),
            ("client clocks stay off: cannot write x", None),
            (
                "stutter member 2 (the leader) for 3100 ms: stopped 1 to 4 ms every 3 to 14 ms",
                Some(("stutter", true)),
            ),
            ("member 2 runs smoothly again", None),
            (
                "slow then crash: starve member 1 (the leader) of the CPU meanwhile: stopped 1 to 4 ms every 3 to 14 ms",
                None,
            ),
            (
                "lag then crash: crash member 3 (a follower) with kill -9",
                None,
            ),
            ("member 2 leads", None),
            ("member 1 had ended on its own", None),
            ("run begins: seed 1, 3 member(s), 30 s", None),
        ];
        for (line, want) in lines {
            assert_eq!(injected(line), want, "{line}");
        }
    }
}
