//! Seeds of the simulation, each checked.

use super::{run_seed, seeds};

fn repro(seed: u64) -> String {
    format!("BATON_SIM_SEED={seed} cargo test -p baton-server --lib sim::tests::one_seed -- --nocapture")
}

/// Every seed keeps every promise the checkers know: `BATON_SIM_SEEDS`
/// seeds (2,000 if unset) from `BATON_SIM_FIRST` (1).
#[test]
fn every_seed_keeps_every_promise() {
    seeds::check_all(
        seeds::from_env(2_000),
        |seed| {
            let (world, findings) = run_seed(seed, false);
            (world.journal, findings)
        },
        repro,
    );
}

/// One seed, from `BATON_SIM_SEED`, with its trace and findings printed
/// (and every operation on the key `BATON_SIM_KEY` names, if set).
#[test]
fn one_seed() {
    let Some(seed) = seeds::one_from_env() else {
        return;
    };
    let (world, findings) = run_seed(seed, true);
    seeds::print(&world.journal, &findings);
    assert!(findings.is_empty(), "seed {seed} broke a promise");
}

/// The same seed makes the same run.
#[test]
fn a_seed_runs_the_same_every_time() {
    let (a, _) = run_seed(7, true);
    let (b, _) = run_seed(7, true);
    assert_eq!(a.journal.trace, b.journal.trace);
    assert_eq!(a.journal.history, b.journal.history);
}

/// A server that answers before its log has synced loses acknowledged
/// changes when it crashes: the simulation must find that in a few seeds,
/// or its clean runs prove nothing.
#[test]
fn a_server_that_answers_before_its_log_syncs_is_caught() {
    let caught = (1..=200u64).find(|seed| {
        !super::run_seed_with(*seed, false, Some(super::Defect::AnswerBeforeSync))
            .1
            .is_empty()
    });
    assert!(
        caught.is_some(),
        "200 seeds of a server that answers early found nothing"
    );
}

/// A server that expires sessions half a timeout early deletes ephemeral
/// nodes while their holders are still told their sessions live.
#[test]
fn a_server_that_expires_sessions_early_is_caught() {
    let caught = (1..=200u64).find(|seed| {
        let (_, findings) = super::run_seed_with(*seed, false, Some(super::Defect::ExpireEarly));
        findings.iter().any(|f| f.checker == "ephemeral")
    });
    assert!(
        caught.is_some(),
        "200 seeds of a server that expires early found nothing"
    );
}
