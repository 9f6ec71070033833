//! Registers read by sessions in the sequential read mode: what such a
//! session sees may be behind, but must never go back and must include its
//! own writes, a read after a sync must see every write acknowledged before
//! the sync began, and every read must return a value that was written, at
//! the version it was written at (docs/design.md, "Read modes").
//!
//! The registers are written unconditionally by those same sessions, so a
//! register's version counts its writes and names each one: two
//! observations of one version (a write's reply, or a read) with different
//! values mean the state was not one history.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{Call, History, Op, Reply};
use crate::{Finding, Verdict};

fn is_sequential(call: &Call) -> bool {
    matches!(
        call,
        Call::SequentialRead { .. } | Call::SequentialWrite { .. }
    )
}

fn violation(key: &str, detail: String, ops: Vec<u64>) -> Finding {
    Finding {
        checker: "sequential".into(),
        key: key.to_owned(),
        verdict: Verdict::Violation,
        detail,
        ops,
    }
}

/// Checks every register the sequential sessions used.
pub fn check(history: &History) -> Vec<Finding> {
    let mut found = Vec::new();
    for key in history.keys(is_sequential) {
        let ops: Vec<&Op> = history
            .of(is_sequential)
            .filter(|op| op.key == key)
            .collect();
        found.extend(check_key(&key, &ops));
    }
    found
}

fn check_key(key: &str, ops: &[&Op]) -> Vec<Finding> {
    let mut found = Vec::new();
    // Every value some write tried, whatever its outcome; the register
    // starts at value 0, version 0.
    let tried: HashSet<u64> = ops
        .iter()
        .filter_map(|op| match op.call {
            Call::SequentialWrite { value, .. } => Some(value),
            _ => None,
        })
        .chain([0])
        .collect();
    // What each version was seen to hold, and by which operation.
    let mut at: HashMap<u32, (u64, u64)> = HashMap::from([(0, (0, 0))]);
    for op in ops {
        let (value, version) = match (&op.call, op.outcome.reply()) {
            (_, Some(Reply::Value { value, version })) => (*value, *version),
            (Call::SequentialWrite { value, .. }, Some(Reply::Written { version })) => {
                (*value, *version)
            }
            _ => continue,
        };
        if !tried.contains(&value) {
            found.push(violation(
                key,
                format!(
                    "operation {} read value {value}, which no write tried",
                    op.id
                ),
                vec![op.id],
            ));
            continue; // said once: it holds no other value
        }
        match at.get(&version) {
            Some(&(other, by)) if other != value => found.push(violation(
                key,
                format!(
                    "version {version} held {other} (operation {by}) and {value} (operation {})",
                    op.id
                ),
                vec![by, op.id],
            )),
            Some(_) => {}
            None => {
                at.insert(version, (value, op.id));
            }
        }
    }
    // Each session's operations in the order it made them (one at a time):
    // what it saw never goes back, its own writes included.
    let mut sessions: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        let session = match op.call {
            Call::SequentialRead { session, .. } | Call::SequentialWrite { session, .. } => session,
            _ => continue,
        };
        sessions.entry(session).or_default().push(op);
    }
    for (session, mut mine) in sessions {
        mine.sort_by_key(|op| op.invoked_ns);
        let mut floor: Option<(u32, u64)> = None;
        for op in mine {
            let version = match op.outcome.reply() {
                Some(Reply::Value { version, .. } | Reply::Written { version }) => *version,
                _ => continue,
            };
            if let (Call::SequentialRead { .. }, Some((seen, by))) = (&op.call, floor) {
                if version < seen {
                    found.push(violation(
                        key,
                        format!(
                            "session {session} read version {version} (operation {}) after it had seen version {seen} (operation {by}): its view went back",
                            op.id
                        ),
                        vec![by, op.id],
                    ));
                }
            }
            if floor.is_none_or(|(seen, _)| version > seen) {
                floor = Some((version, op.id));
            }
        }
    }
    // A read after a sync sees every write acknowledged before the sync
    // began.
    let mut acknowledged: Vec<(u64, u32, u64)> = ops
        .iter()
        .filter_map(|op| match op.outcome.reply() {
            Some(Reply::Written { version }) => Some((op.completed_ns, *version, op.id)),
            _ => None,
        })
        .collect();
    acknowledged.sort();
    for op in ops {
        let (Call::SequentialRead { synced: true, .. }, Some(Reply::Value { version, .. })) =
            (&op.call, op.outcome.reply())
        else {
            continue;
        };
        let before = acknowledged.partition_point(|&(done, _, _)| done < op.invoked_ns);
        if let Some(&(_, needed, by)) = acknowledged[..before].iter().max_by_key(|w| w.1) {
            if *version < needed {
                found.push(violation(
                    key,
                    format!(
                        "operation {} read version {version} after a sync, but version {needed} was acknowledged (operation {by}) before the sync began",
                        op.id
                    ),
                    vec![by, op.id],
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Outcome;

    fn op(id: u64, call: Call, at: (u64, u64), reply: Option<Reply>) -> Op {
        Op {
            id,
            process: 1,
            key: "/r".into(),
            call,
            invoked_ns: at.0,
            completed_ns: at.1,
            outcome: match reply {
                Some(reply) => Outcome::Ok { reply },
                None => Outcome::Unknown { why: "lost".into() },
            },
        }
    }

    fn read(session: u64, synced: bool) -> Call {
        Call::SequentialRead { session, synced }
    }

    fn write(session: u64, value: u64) -> Call {
        Call::SequentialWrite { session, value }
    }

    fn value(value: u64, version: u32) -> Option<Reply> {
        Some(Reply::Value { value, version })
    }

    fn written(version: u32) -> Option<Reply> {
        Some(Reply::Written { version })
    }

    fn verdicts(ops: Vec<Op>) -> Vec<String> {
        let history = History {
            ops,
            ..History::default()
        };
        check(&history).into_iter().map(|f| f.detail).collect()
    }

    #[test]
    fn a_stale_read_from_another_session_is_allowed() {
        // Session 2 writes; session 1 still reads the old value: allowed
        // without a sync.
        let found = verdicts(vec![
            op(1, write(2, 7), (0, 10), written(1)),
            op(2, read(1, false), (20, 30), value(0, 0)),
            op(3, read(1, false), (40, 50), value(7, 1)),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_view_that_goes_back_or_misses_its_own_write_is_a_violation() {
        let found = verdicts(vec![
            op(1, write(2, 7), (0, 10), written(1)),
            op(2, read(1, false), (20, 30), value(7, 1)),
            op(3, read(1, false), (40, 50), value(0, 0)),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("went back"), "{found:?}");
        let found = verdicts(vec![
            op(1, write(1, 7), (0, 10), written(1)),
            op(2, read(1, false), (20, 30), value(0, 0)),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn a_read_after_a_sync_must_see_what_was_acknowledged_before_it() {
        let found = verdicts(vec![
            op(1, write(2, 7), (0, 10), written(1)),
            op(2, read(1, true), (20, 30), value(0, 0)),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("after a sync"), "{found:?}");
        // A write still under way when the sync began need not be seen.
        let found = verdicts(vec![
            op(1, write(2, 7), (0, 25), written(1)),
            op(2, read(1, true), (20, 30), value(0, 0)),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_value_never_written_or_two_values_at_one_version_are_violations() {
        let found = verdicts(vec![op(1, read(1, false), (0, 10), value(9, 1))]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("no write tried"), "{found:?}");
        let found = verdicts(vec![
            op(1, write(2, 7), (0, 10), None),
            op(2, write(3, 8), (0, 10), written(1)),
            op(3, read(1, false), (20, 30), value(7, 1)),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("version 1 held"), "{found:?}");
    }
}
