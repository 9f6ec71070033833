//! Ephemeral nodes: each gone exactly once, and only once its session has
//! ended (invariants 4 and 6).
//!
//! A holder records `HoldEphemeral` when its node exists, and
//! `SessionEnded` when its client closed the session or was told it was
//! lost (the client is told before the server may expire the session: a
//! margin taken from its own deadline). An observer records `EphemeralGone`
//! when it sees the node deleted. The node must be seen gone at most once,
//! and not before its session's end began: a holder still told its session
//! was alive would otherwise have lost its node behind its back. A holder
//! whose record ends before it could be told (a history cut off, a run
//! interrupted) leaves that undecided, not broken.

use crate::history::{Call, History, Outcome};
use crate::{Finding, Verdict};

/// Checks every ephemeral node in `history`.
pub fn check(history: &History) -> Vec<Finding> {
    let mut found = Vec::new();
    for key in history.keys(|c| *c == Call::HoldEphemeral) {
        let ops: Vec<_> = history.ops.iter().filter(|op| op.key == key).collect();
        let gone: Vec<_> = ops
            .iter()
            .filter(|op| op.call == Call::EphemeralGone && matches!(op.outcome, Outcome::Ok { .. }))
            .collect();
        if gone.len() > 1 {
            found.push(violation(
                &key,
                format!("seen deleted {} times", gone.len()),
                gone.iter().map(|op| op.id).collect(),
            ));
        }
        let ended = ops
            .iter()
            .filter(|op| matches!(op.call, Call::SessionEnded { .. }))
            .map(|op| (op.invoked_ns, op.id))
            .min();
        for g in gone {
            match ended {
                Some((at, _)) if at <= g.completed_ns => {}
                Some((_, id)) => found.push(violation(
                    &key,
                    "deleted while its holder was still told its session was alive".into(),
                    vec![id, g.id],
                )),
                None => {
                    let holder = ops
                        .iter()
                        .find(|op| op.call == Call::HoldEphemeral)
                        .map(|op| op.process);
                    let told_more = history
                        .ops
                        .iter()
                        .any(|op| Some(op.process) == holder && op.invoked_ns > g.completed_ns);
                    found.push(if told_more {
                        violation(
                            &key,
                            "deleted, and its holder was never told its session ended".into(),
                            vec![g.id],
                        )
                    } else {
                        Finding {
                            checker: "ephemeral".into(),
                            key: key.clone(),
                            verdict: Verdict::Unknown,
                            detail: "deleted, and its holder's record ends before it was told its session ended (a history cut off?)".into(),
                            ops: vec![g.id],
                        }
                    })
                }
            }
        }
    }
    found
}

fn violation(key: &str, detail: String, ops: Vec<u64>) -> Finding {
    Finding {
        checker: "ephemeral".into(),
        key: key.into(),
        verdict: Verdict::Violation,
        detail,
        ops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Op, Reply};

    fn op(id: u64, call: Call, t: (u64, u64)) -> Op {
        Op {
            id,
            process: 1,
            key: "/e/1".into(),
            call,
            invoked_ns: t.0,
            completed_ns: t.1,
            outcome: Outcome::Ok { reply: Reply::Done },
        }
    }

    #[test]
    fn a_node_gone_before_its_session_ended_is_a_violation() {
        let hold = op(1, Call::HoldEphemeral, (0, 10));
        let ended = op(2, Call::SessionEnded { expired: true }, (100, 100));
        let fine = History {
            ops: vec![
                hold.clone(),
                ended.clone(),
                op(3, Call::EphemeralGone, (90, 110)),
            ],
            faults: Vec::new(),
        };
        assert!(check(&fine).is_empty());
        let early = History {
            ops: vec![hold, ended, op(3, Call::EphemeralGone, (40, 50))],
            faults: Vec::new(),
        };
        assert!(check(&early)[0].detail.contains("still told"));
    }

    /// A node deleted whose holder then went on without being told is a
    /// violation; one whose holder's record ends first is undecided.
    #[test]
    fn a_holder_never_told_breaks_the_promise_unless_its_record_ends_first() {
        let hold = op(1, Call::HoldEphemeral, (0, 10));
        let gone = op(2, Call::EphemeralGone, (40, 50));
        let cut = History {
            ops: vec![hold.clone(), gone.clone()],
            faults: Vec::new(),
        };
        assert_eq!(check(&cut)[0].verdict, Verdict::Unknown);
        let went_on = History {
            ops: vec![hold, gone, op(3, Call::HoldEphemeral, (60, 70))],
            faults: Vec::new(),
        };
        let found = check(&went_on);
        assert!(found
            .iter()
            .any(|f| f.verdict == Verdict::Violation && f.detail.contains("never told")));
    }
}
