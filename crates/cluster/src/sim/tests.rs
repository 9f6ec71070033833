//! Seeds of the cluster's simulation, each checked.

use super::run_seed;

/// How many seeds a test run tries, from `BATON_SIM_SEEDS` (default 100),
/// starting at `BATON_SIM_FIRST` (default 1).
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = var("BATON_SIM_FIRST", 1);
    first..first + var("BATON_SIM_SEEDS", 100)
}

fn repro(seed: u64) -> String {
    format!("BATON_SIM_SEED={seed} cargo test -p baton-cluster --lib sim::tests::one_seed -- --nocapture")
}

/// Every seed keeps every promise the checkers know. The seeds are shared
/// out among as many threads as the machine has cores.
#[test]
fn every_seed_keeps_every_promise() {
    let seeds = seeds();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let totals = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds.clone();
                scope.spawn(move || {
                    let (mut ops, mut faults) = (0, 0);
                    for seed in seeds.filter(|s| s % threads == t) {
                        let outcome = std::panic::catch_unwind(|| run_seed(seed, false));
                        let Ok((world, findings)) = outcome else {
                            panic!("seed {seed} panicked; run it alone: {}", repro(seed));
                        };
                        assert!(
                            findings.is_empty(),
                            "seed {seed} broke a promise: {findings:?}; run it alone: {}",
                            repro(seed)
                        );
                        ops += world.history.ops.len();
                        faults += world.history.faults.len();
                    }
                    (ops, faults)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    // The runs did something: operations and faults in every seed, on
    // average.
    let n = seeds.count().max(1);
    assert!(totals.0 / n > 100, "{} operations in {n} seeds", totals.0);
    assert!(totals.1 / n > 2, "{} faults in {n} seeds", totals.1);
}

/// One seed, from `BATON_SIM_SEED`, with its trace and findings printed.
#[test]
fn one_seed() {
    let Some(seed) = std::env::var("BATON_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    else {
        return;
    };
    let (world, findings) = run_seed(seed, true);
    for line in &world.trace {
        println!("{line}");
    }
    println!(
        "{} operations, {} faults",
        world.history.ops.len(),
        world.history.faults.len()
    );
    for f in &findings {
        println!("{f:?}");
    }
    assert!(findings.is_empty(), "seed {seed} broke a promise");
}

/// The same seed makes the same run.
#[test]
fn a_seed_runs_the_same_every_time() {
    for seed in [7, 8] {
        let (a, _) = run_seed(seed, true);
        let (b, _) = run_seed(seed, true);
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.history, b.history, "seed {seed}");
    }
}

/// A member that tells its leader an entry is stored before its disk has
/// synced it lets a crash of that member and the leader together lose a
/// write the cluster acknowledged: the simulation must find that, or its
/// clean runs prove nothing.
#[test]
fn a_member_that_counts_unsynced_entries_as_stored_is_caught() {
    const DEFECT: super::Defect = super::Defect::StoredBeforeSync;
    let caught = (1..=300u64).find(|seed| {
        !super::run_seed_with(*seed, false, Some(DEFECT))
            .1
            .is_empty()
    });
    assert!(
        caught.is_some(),
        "300 seeds of members that count unsynced entries as stored found nothing"
    );
    let seed = caught.expect("checked above");
    let (_, findings) = super::run_seed_with(seed, false, Some(DEFECT));
    println!("seed {seed}: {findings:?}");
}

/// A leader that serves reads without proving first that it still leads
/// answers from a state the majority has already moved past, once it is
/// cut off: the register checker must find the stale read.
#[test]
fn a_leader_that_reads_without_a_barrier_is_caught() {
    const DEFECT: super::Defect = super::Defect::ReadsWithoutBarrier;
    let caught = (1..=300u64).find(|seed| {
        !super::run_seed_with(*seed, false, Some(DEFECT))
            .1
            .is_empty()
    });
    assert!(
        caught.is_some(),
        "300 seeds of a leader that reads without a barrier found nothing"
    );
    let seed = caught.expect("checked above");
    let (_, findings) = super::run_seed_with(seed, false, Some(DEFECT));
    println!("seed {seed}: {findings:?}");
}
