//! Fenced writes and critical sections.
//!
//! The register checker already proves each fenced resource linearizable
//! against a model with a fence; this checker says the same in the terms of
//! invariant 3, with the operations named: in the order the resource
//! accepted them (its versions), fenced writes carry tokens that never go
//! down. It also reports, as a note, holders of one lock whose critical
//! sections overlapped in real time (a paused holder, a lost lease): that
//! is what fencing exists for, and what the fence must then catch.

use std::collections::BTreeMap;

use crate::history::{Call, History, Reply};
use crate::{Finding, Verdict};

/// Checks every fenced resource and every lock in `history`.
pub fn check(history: &History) -> Vec<Finding> {
    let mut found = Vec::new();
    for key in history.keys(|c| matches!(c, Call::FencedWrite { .. })) {
        // Accepted writes by the version they made.
        let mut accepted: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for op in history.of(|c| matches!(c, Call::FencedWrite { .. })) {
            if op.key != key {
                continue;
            }
            let (Call::FencedWrite { token, .. }, Some(Reply::Written { version })) =
                (&op.call, op.outcome.reply())
            else {
                continue;
            };
            if let Some((other, _)) = accepted.insert(*version, (*token, op.id)) {
                found.push(violation(
                    &key,
                    format!("two accepted writes made version {version}"),
                    vec![other, op.id],
                ));
            }
        }
        let mut highest: Option<(u64, u64, u32)> = None;
        for (version, (token, id)) in &accepted {
            match highest {
                Some((top, top_id, top_version)) if *token < top => found.push(violation(
                    &key,
                    format!(
                        "a write with token {token} was accepted (version {version}) after one with token {top} (version {top_version})"
                    ),
                    vec![top_id, *id],
                )),
                _ => highest = Some((*token, *id, *version)),
            }
        }
    }
    found.extend(overlaps(history));
    found
}

fn violation(key: &str, detail: String, ops: Vec<u64>) -> Finding {
    Finding {
        checker: "fence".into(),
        key: key.into(),
        verdict: Verdict::Violation,
        detail,
        ops,
    }
}

/// Critical sections of one lock that overlapped: a grant's completion to
/// its release's invocation (or, if never released, to the end of the
/// run), per process and token.
fn overlaps(history: &History) -> Vec<Finding> {
    let end = history
        .ops
        .iter()
        .map(|op| op.completed_ns)
        .max()
        .unwrap_or(0);
    let mut found = Vec::new();
    for key in history.keys(|c| *c == Call::Acquire) {
        let mut sections: Vec<(u64, u64, u64, u64)> = Vec::new(); // start, end, token, id
        for op in history
            .of(|c| *c == Call::Acquire)
            .filter(|op| op.key == key)
        {
            let Some(Reply::Token { token }) = op.outcome.reply() else {
                continue;
            };
            let released = history
                .of(|c| matches!(c, Call::Release { token: t } if t == token))
                .filter(|r| r.key == key && r.process == op.process)
                .map(|r| r.invoked_ns)
                .min()
                .unwrap_or(end);
            sections.push((op.completed_ns, released, *token, op.id));
        }
        sections.sort();
        let mut count = 0;
        let mut longest = 0u64;
        let mut example = Vec::new();
        let mut open: Option<(u64, u64, u64, u64)> = None;
        for s in sections {
            if let Some(o) = open {
                if s.0 < o.1 {
                    count += 1;
                    let overlap = o.1.min(s.1) - s.0;
                    if overlap > longest {
                        longest = overlap;
                        example = vec![o.3, s.3];
                    }
                }
                if s.1 > o.1 {
                    open = Some(s);
                }
            } else {
                open = Some(s);
            }
        }
        if count > 0 {
            found.push(Finding {
                checker: "fence".into(),
                key,
                verdict: Verdict::Note,
                detail: format!(
                    "{count} critical sections overlapped another (the longest by {:.1} ms): holders whose lease ran out while they believed they held it; the fence must have refused their late writes",
                    longest as f64 / 1e6
                ),
                ops: example,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Op, Outcome};

    fn op(id: u64, process: u64, key: &str, call: Call, t: (u64, u64), reply: Reply) -> Op {
        Op {
            id,
            process,
            key: key.into(),
            call,
            invoked_ns: t.0,
            completed_ns: t.1,
            outcome: Outcome::Ok { reply },
        }
    }

    #[test]
    fn tokens_going_down_in_the_resources_order_are_a_violation() {
        let fenced = |token| Call::FencedWrite { token, value: 0 };
        let history = History {
            ops: vec![
                op(
                    1,
                    1,
                    "res",
                    fenced(9),
                    (0, 10),
                    Reply::Written { version: 1 },
                ),
                op(
                    2,
                    2,
                    "res",
                    fenced(9),
                    (20, 30),
                    Reply::Written { version: 2 },
                ),
                op(3, 3, "res", fenced(5), (40, 50), Reply::Stale),
                op(
                    4,
                    3,
                    "res",
                    fenced(5),
                    (60, 70),
                    Reply::Written { version: 3 },
                ),
            ],
            faults: Vec::new(),
        };
        let found = check(&history);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].verdict, Verdict::Violation);
        assert_eq!(found[0].ops, [2, 4]);
    }

    #[test]
    fn overlapping_critical_sections_are_a_note() {
        let history = History {
            ops: vec![
                op(
                    1,
                    1,
                    "lock",
                    Call::Acquire,
                    (0, 10),
                    Reply::Token { token: 3 },
                ),
                op(
                    2,
                    2,
                    "lock",
                    Call::Acquire,
                    (5, 50),
                    Reply::Token { token: 4 },
                ),
                op(
                    3,
                    1,
                    "lock",
                    Call::Release { token: 3 },
                    (80, 90),
                    Reply::Done,
                ),
                op(
                    4,
                    2,
                    "lock",
                    Call::Release { token: 4 },
                    (95, 99),
                    Reply::Done,
                ),
            ],
            faults: Vec::new(),
        };
        let found = check(&history);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].verdict, Verdict::Note);
        assert_eq!(found[0].ops, [1, 2]);
    }
}
