//! Running a simulation's seeds and checking each, for the single server's
//! simulation and the cluster's alike.

use std::ops::Range;

use baton_chaos::Finding;

use super::Journal;

/// The seeds a test run tries: `BATON_SIM_SEEDS` of them (`default` if
/// unset), from `BATON_SIM_FIRST` (1 if unset).
pub fn from_env(default: u64) -> Range<u64> {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = var("BATON_SIM_FIRST", 1);
    first..first + var("BATON_SIM_SEEDS", default)
}

/// The one seed `BATON_SIM_SEED` names, if it names one.
pub fn one_from_env() -> Option<u64> {
    std::env::var("BATON_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
}

/// Runs every seed of `seeds` with `run` (the run's journal and the
/// findings that break a promise), shared out among as many threads as the
/// machine has cores. Panics at the first seed that panics or breaks a
/// promise, naming `repro(seed)`: the command that runs it again alone; and
/// if the runs, on average, made too few operations or faults to mean
/// anything.
pub fn check_all<F, R>(seeds: Range<u64>, run: F, repro: R)
where
    F: Fn(u64) -> (Journal, Vec<Finding>) + Sync + std::panic::RefUnwindSafe,
    R: Fn(u64) -> String + Sync,
{
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let (run, repro) = (&run, &repro);
    let totals = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds.clone();
                scope.spawn(move || {
                    let (mut ops, mut faults) = (0, 0);
                    for seed in seeds.filter(|s| s % threads == t) {
                        let outcome = std::panic::catch_unwind(|| run(seed));
                        let Ok((journal, findings)) = outcome else {
                            panic!("seed {seed} panicked; run it alone: {}", repro(seed));
                        };
                        assert!(
                            findings.is_empty(),
                            "seed {seed} broke a promise: {findings:?}; run it alone: {}",
                            repro(seed)
                        );
                        ops += journal.history.ops.len();
                        faults += journal.history.faults.len();
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

/// Prints a traced run: its trace, its figures, each finding with the
/// operations behind it, and every operation on the key `BATON_SIM_KEY`
/// names (say `/r1`), if set.
pub fn print(journal: &Journal, findings: &[Finding]) {
    for line in &journal.trace {
        println!("{line}");
    }
    let history = &journal.history;
    println!(
        "{} operations, {} faults",
        history.ops.len(),
        history.faults.len()
    );
    if let Ok(key) = std::env::var("BATON_SIM_KEY") {
        for op in history.ops.iter().filter(|op| op.key == key) {
            println!("{op:?}");
        }
    }
    for f in findings {
        println!("{f:?}");
        for id in &f.ops {
            if let Some(op) = history.ops.iter().find(|op| op.id == *id) {
                println!("  {op:?}");
            }
        }
    }
}
