//! Counters: no acknowledged increment lost, none invented.
//!
//! A read of a counter must count at least every increment acknowledged
//! before the read began, and at most every increment begun before the read
//! completed (acknowledged or with an unknown outcome).

use crate::history::{Call, History, Outcome, Reply};
use crate::{Finding, Verdict};

/// Checks every counter in `history`.
pub fn check(history: &History) -> Vec<Finding> {
    let mut found = Vec::new();
    let counters = history.keys(|c| matches!(c, Call::Increment | Call::ReadCounter));
    for key in counters {
        // Increments: (invoked, completed, acknowledged?), failed ones left out.
        let mut increments: Vec<(u64, u64, bool)> = Vec::new();
        let mut reads: Vec<(u64, u64, u64, u64)> = Vec::new(); // invoked, completed, count, id
        for op in history.ops.iter().filter(|op| op.key == key) {
            match (&op.call, &op.outcome) {
                (Call::Increment, Outcome::Ok { .. }) => {
                    increments.push((op.invoked_ns, op.completed_ns, true))
                }
                (Call::Increment, Outcome::Unknown { .. }) => {
                    increments.push((op.invoked_ns, op.completed_ns, false))
                }
                (
                    Call::ReadCounter,
                    Outcome::Ok {
                        reply: Reply::Count { count },
                    },
                ) => reads.push((op.invoked_ns, op.completed_ns, *count, op.id)),
                _ => {}
            }
        }
        for (invoked, completed, count, id) in reads {
            let at_least = increments
                .iter()
                .filter(|(_, done, acked)| *acked && *done < invoked)
                .count() as u64;
            let at_most = increments
                .iter()
                .filter(|(begun, _, _)| *begun < completed)
                .count() as u64;
            let detail = if count < at_least {
                format!("read {count}, but {at_least} increments were acknowledged before the read began: increments lost")
            } else if count > at_most {
                format!("read {count}, but only {at_most} increments had begun by the time it completed")
            } else {
                continue;
            };
            found.push(Finding {
                checker: "counter".into(),
                key: key.clone(),
                verdict: Verdict::Violation,
                detail,
                ops: vec![id],
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Op;

    fn op(id: u64, call: Call, t: (u64, u64), outcome: Outcome) -> Op {
        Op {
            id,
            process: id,
            key: "c".into(),
            call,
            invoked_ns: t.0,
            completed_ns: t.1,
            outcome,
        }
    }

    #[test]
    fn a_lost_or_invented_increment_is_a_violation() {
        let done = || Outcome::Ok { reply: Reply::Done };
        let count = |count| Outcome::Ok {
            reply: Reply::Count { count },
        };
        let unknown = || Outcome::Unknown { why: "lost".into() };
        let history = |read| History {
            ops: vec![
                op(1, Call::Increment, (0, 10), done()),
                op(2, Call::Increment, (0, 10), unknown()),
                op(3, Call::ReadCounter, (20, 30), count(read)),
            ],
            faults: Vec::new(),
        };
        assert!(check(&history(1)).is_empty());
        assert!(check(&history(2)).is_empty());
        assert_eq!(check(&history(0))[0].verdict, Verdict::Violation);
        assert_eq!(check(&history(3))[0].verdict, Verdict::Violation);
    }
}
