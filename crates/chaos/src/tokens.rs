//! Tokens of grants: distinct, and growing with real time (invariants 1
//! and 2), across failovers and restarts.
//!
//! For each lock (or election), every grant carries its own token, and a
//! grant that completed before another was asked for carries the lower one.

use std::collections::HashMap;

use crate::history::{Call, History, Reply};
use crate::{Finding, Verdict};

/// Checks the grants of every lock in `history`.
pub fn check(history: &History) -> Vec<Finding> {
    let mut found = Vec::new();
    for key in history.keys(|c| *c == Call::Acquire) {
        // (invoked, completed, token, id)
        let mut grants: Vec<(u64, u64, u64, u64)> = history
            .of(|c| *c == Call::Acquire)
            .filter(|op| op.key == key)
            .filter_map(|op| match op.outcome.reply() {
                Some(Reply::Token { token }) => {
                    Some((op.invoked_ns, op.completed_ns, *token, op.id))
                }
                _ => None,
            })
            .collect();
        let mut by_token: HashMap<u64, u64> = HashMap::new();
        for g in &grants {
            if let Some(other) = by_token.insert(g.2, g.3) {
                found.push(Finding {
                    checker: "tokens".into(),
                    key: key.clone(),
                    verdict: Verdict::Violation,
                    detail: format!("token {} was granted twice", g.2),
                    ops: vec![other, g.3],
                });
            }
        }
        // Each grant against the highest token of the grants completed
        // before it was invoked.
        let mut completions: Vec<(u64, u64, u64)> =
            grants.iter().map(|g| (g.1, g.2, g.3)).collect();
        completions.sort();
        grants.sort();
        let mut highest: Option<(u64, u64)> = None;
        let mut next = 0;
        for (invoked, _, token, id) in grants {
            while next < completions.len() && completions[next].0 < invoked {
                let (_, t, i) = completions[next];
                if highest.is_none_or(|(h, _)| t > h) {
                    highest = Some((t, i));
                }
                next += 1;
            }
            if let Some((h, hid)) = highest {
                if token <= h && hid != id {
                    found.push(Finding {
                        checker: "tokens".into(),
                        key: key.clone(),
                        verdict: Verdict::Violation,
                        detail: format!(
                            "token {token} was granted after token {h} had been (tokens must only grow)"
                        ),
                        ops: vec![hid, id],
                    });
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Op, Outcome};

    fn grant(id: u64, t: (u64, u64), token: u64) -> Op {
        Op {
            id,
            process: id,
            key: "lock".into(),
            call: Call::Acquire,
            invoked_ns: t.0,
            completed_ns: t.1,
            outcome: Outcome::Ok {
                reply: Reply::Token { token },
            },
        }
    }

    #[test]
    fn a_token_granted_twice_or_going_back_is_a_violation() {
        let fine = History {
            ops: vec![
                grant(1, (0, 10), 5),
                grant(2, (5, 30), 4),
                grant(3, (40, 50), 9),
            ],
            faults: Vec::new(),
        };
        // 2 ran alongside 1: either order may be the server's.
        assert!(check(&fine).is_empty());
        let twice = History {
            ops: vec![grant(1, (0, 10), 5), grant(2, (20, 30), 5)],
            faults: Vec::new(),
        };
        let found = check(&twice);
        assert!(
            found.iter().any(|f| f.detail.contains("granted twice")),
            "{found:?}"
        );
        let back = History {
            ops: vec![grant(1, (0, 10), 25), grant(2, (20, 30), 11)],
            faults: Vec::new(),
        };
        let found = check(&back);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].ops, [1, 2]);
    }
}
