//! Queues: every acknowledged item taken exactly once.
//!
//! An item is taken at most once, and only if it was put on the queue
//! (acknowledged, or with an unknown outcome). If the run drained the queue
//! at its end (a look that found it empty, begun after every put
//! completed), every acknowledged item was taken by a take begun before
//! that look ended (the take may have been applied first and answered
//! after), or by a take whose outcome is unknown.

use std::collections::HashMap;

use crate::history::{Call, History, Outcome, Reply};
use crate::{Finding, Verdict};

fn is_queue(call: &Call) -> bool {
    matches!(
        call,
        Call::Enqueue { .. } | Call::Take { .. } | Call::Dequeue
    )
}

/// Checks every queue in `history`.
pub fn check(history: &History) -> Vec<Finding> {
    let mut found = Vec::new();
    for key in history.keys(is_queue) {
        let ops: Vec<_> = history.ops.iter().filter(|op| op.key == key).collect();
        // item -> (acknowledged, id)
        let mut put: HashMap<u64, (bool, u64)> = HashMap::new();
        let mut last_put = 0;
        for op in &ops {
            if let Call::Enqueue { item } = op.call {
                match op.outcome {
                    Outcome::Ok { .. } => {
                        put.insert(item, (true, op.id));
                    }
                    Outcome::Unknown { .. } => {
                        put.entry(item).or_insert((false, op.id));
                    }
                    Outcome::Fail { .. } => continue,
                }
                last_put = last_put.max(op.completed_ns);
            }
        }
        // item -> (id, invoked)
        let mut taken: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut maybe_taken: Vec<u64> = Vec::new();
        let mut drained_at: Option<u64> = None;
        for op in &ops {
            match (&op.call, &op.outcome) {
                (Call::Take { item }, Outcome::Ok { .. }) => {
                    if let Some((other, _)) = taken.insert(*item, (op.id, op.invoked_ns)) {
                        found.push(violation(
                            &key,
                            format!("item {item} was taken twice"),
                            vec![other, op.id],
                        ));
                    }
                    if !put.contains_key(item) {
                        found.push(violation(
                            &key,
                            format!("item {item} was taken but never put"),
                            vec![op.id],
                        ));
                    }
                }
                (Call::Take { item }, Outcome::Unknown { .. }) => maybe_taken.push(*item),
                (
                    Call::Dequeue,
                    Outcome::Ok {
                        reply: Reply::Empty,
                    },
                ) if op.invoked_ns > last_put => {
                    drained_at =
                        Some(drained_at.map_or(op.completed_ns, |d| d.min(op.completed_ns)));
                }
                _ => {}
            }
        }
        if let Some(drained) = drained_at {
            for (item, (acked, id)) in &put {
                let gone = taken.get(item).is_some_and(|(_, at)| *at <= drained)
                    || maybe_taken.contains(item);
                if *acked && !gone {
                    found.push(violation(
                        &key,
                        format!(
                            "item {item} was acknowledged but never taken, and the queue was found empty"
                        ),
                        vec![*id],
                    ));
                }
            }
        }
    }
    found
}

fn violation(key: &str, detail: String, ops: Vec<u64>) -> Finding {
    Finding {
        checker: "queue".into(),
        key: key.into(),
        verdict: Verdict::Violation,
        detail,
        ops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Op;

    fn op(id: u64, call: Call, t: (u64, u64), reply: Reply) -> Op {
        Op {
            id,
            process: id,
            key: "q".into(),
            call,
            invoked_ns: t.0,
            completed_ns: t.1,
            outcome: Outcome::Ok { reply },
        }
    }

    #[test]
    fn an_item_taken_twice_or_lost_is_a_violation() {
        let put = |id, item| op(id, Call::Enqueue { item }, (0, 10), Reply::Done);
        let take = |id, item, t| op(id, Call::Take { item }, t, Reply::Done);
        let empty = |id, t| op(id, Call::Dequeue, t, Reply::Empty);
        let fine = History {
            ops: vec![
                put(1, 7),
                put(2, 8),
                take(3, 7, (20, 30)),
                take(4, 8, (20, 30)),
                empty(5, (40, 50)),
            ],
            faults: Vec::new(),
        };
        assert!(check(&fine).is_empty());
        let twice = History {
            ops: vec![put(1, 7), take(3, 7, (20, 30)), take(4, 7, (20, 30))],
            faults: Vec::new(),
        };
        assert!(check(&twice)[0].detail.contains("twice"));
        let lost = History {
            ops: vec![
                put(1, 7),
                put(2, 8),
                take(3, 7, (20, 30)),
                empty(5, (40, 50)),
            ],
            faults: Vec::new(),
        };
        assert!(check(&lost)[0].detail.contains("never taken"));
        // A take applied before another worker's look found the queue
        // empty, and answered after that look ended, took its item.
        let answered_late = History {
            ops: vec![put(1, 7), take(3, 7, (20, 60)), empty(5, (40, 50))],
            faults: Vec::new(),
        };
        assert!(check(&answered_late).is_empty());
        // One begun after the look ended could not have emptied it.
        let begun_late = History {
            ops: vec![put(1, 7), take(3, 7, (55, 60)), empty(5, (40, 50))],
            faults: Vec::new(),
        };
        assert!(check(&begun_late)[0].detail.contains("never taken"));
    }
}
