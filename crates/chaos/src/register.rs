//! Linearizability of versioned registers, by the Wing-Gong-Lowe search
//! (as Knossos and Porcupine check them).
//!
//! A register holds a value, a version and a fence (Baton's node data, its
//! data version, and the highest fencing token a write to it carried); it
//! starts at value 0, version 0, fence 0. Reads return the value and the
//! version; a write sets the value and moves the version on by one; a
//! compare-and-set writes only if the version is the one given (else it is
//! refused and changes nothing); a fenced write writes only if its token is
//! at least the fence, which it then becomes (else it is refused as stale):
//! so a fenced register's history is linearizable only if the fence held
//! (invariant 3). The history of each register is linearizable if its
//! operations can be put in one order, each at a point between its
//! invocation and its completion, in which every reply is the model's.
//!
//! An operation with an unknown outcome may take effect at any point after
//! its invocation, or never: it is given no completion (so it can be placed
//! last, where its effect is seen by nothing). A read with an unknown
//! outcome constrains nothing and is left out; so is an operation that
//! certainly failed.
//!
//! The search is exponential at worst; it stops after a budget of steps
//! and says it could not decide (a [`Verdict::Unknown`] finding) rather
//! than run forever.

use std::collections::HashSet;

use crate::history::{Call, History, Outcome, Reply};
use crate::{Finding, Verdict};

/// Steps of the search per register before it gives up.
pub const DEFAULT_BUDGET: u64 = 20_000_000;

/// The model's state: a register's value, version and fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct State {
    value: u64,
    version: u32,
    fence: u64,
}

/// One operation as the search sees it.
#[derive(Clone, Debug)]
struct Entry {
    id: u64,
    call: Call,
    /// `None`: the outcome is unknown.
    reply: Option<Reply>,
}

/// The model's step: the state after `op` taken in `state`, if `op`'s reply
/// is what the model gives there.
fn step(state: State, op: &Entry) -> Option<State> {
    match (&op.call, &op.reply) {
        (Call::Read, Some(Reply::Value { value, version })) => {
            (state.value == *value && state.version == *version).then_some(state)
        }
        (Call::Write { value }, Some(Reply::Written { version })) => {
            (*version == state.version.wrapping_add(1)).then_some(State {
                value: *value,
                version: *version,
                ..state
            })
        }
        (Call::Write { value }, None) => Some(State {
            value: *value,
            version: state.version.wrapping_add(1),
            ..state
        }),
        (Call::Cas { version, value }, Some(Reply::Written { version: after })) => {
            (state.version == *version && *after == version.wrapping_add(1)).then_some(State {
                value: *value,
                version: *after,
                ..state
            })
        }
        (Call::Cas { version, .. }, Some(Reply::CasRefused)) => {
            (state.version != *version).then_some(state)
        }
        (Call::Cas { version, value }, None) => Some(if state.version == *version {
            State {
                value: *value,
                version: version.wrapping_add(1),
                ..state
            }
        } else {
            state
        }),
        (Call::FencedWrite { token, value }, Some(Reply::Written { version })) => {
            (*token >= state.fence && *version == state.version.wrapping_add(1)).then_some(State {
                value: *value,
                version: *version,
                fence: *token,
            })
        }
        (Call::FencedWrite { token, .. }, Some(Reply::Stale)) => {
            (*token < state.fence).then_some(state)
        }
        (Call::FencedWrite { token, value }, None) => Some(if *token >= state.fence {
            State {
                value: *value,
                version: state.version.wrapping_add(1),
                fence: *token,
            }
        } else {
            state
        }),
        _ => None,
    }
}

fn is_register(call: &Call) -> bool {
    matches!(
        call,
        Call::Read | Call::Write { .. } | Call::Cas { .. } | Call::FencedWrite { .. }
    )
}

/// Checks every register in `history`, with at most `budget` search steps
/// each.
pub fn check(history: &History, budget: u64) -> Vec<Finding> {
    let mut found = Vec::new();
    for key in history.keys(is_register) {
        let mut entries = Vec::new();
        let mut times = Vec::new();
        for op in history.of(is_register).filter(|op| op.key == key) {
            let reply = match &op.outcome {
                Outcome::Ok { reply } => Some(reply.clone()),
                Outcome::Fail { .. } => continue,
                Outcome::Unknown { .. } if op.call == Call::Read => continue,
                Outcome::Unknown { .. } => None,
            };
            let returned = if reply.is_some() {
                op.completed_ns
            } else {
                u64::MAX
            };
            times.push((op.invoked_ns, returned));
            entries.push(Entry {
                id: op.id,
                call: op.call.clone(),
                reply,
            });
        }
        match search(&entries, &times, budget) {
            Search::Linearizable => {}
            Search::Not { stuck } => found.push(Finding {
                checker: "register".into(),
                key: key.clone(),
                verdict: Verdict::Violation,
                detail: format!(
                    "not linearizable: no order of its {} operations gives every reply; the search got furthest with operation {} unplaceable (the operations concurrent with it are listed)",
                    entries.len(),
                    entries[stuck].id
                ),
                ops: concurrent_with(&entries, &times, stuck),
            }),
            Search::GaveUp => found.push(Finding {
                checker: "register".into(),
                key: key.clone(),
                verdict: Verdict::Unknown,
                detail: format!(
                    "undecided after {budget} steps of the search over {} operations",
                    entries.len()
                ),
                ops: Vec::new(),
            }),
        }
    }
    found
}

/// The ids of the operations whose intervals overlap operation `at`'s, and
/// its own.
fn concurrent_with(entries: &[Entry], times: &[(u64, u64)], at: usize) -> Vec<u64> {
    let (start, end) = times[at];
    let mut ids: Vec<u64> = entries
        .iter()
        .zip(times)
        .filter(|(_, (s, e))| *s <= end && *e >= start)
        .map(|(e, _)| e.id)
        .take(20)
        .collect();
    if !ids.contains(&entries[at].id) {
        ids.push(entries[at].id);
    }
    ids
}

enum Search {
    Linearizable,
    /// Not linearizable; the index of the operation the deepest attempt
    /// could not place before its completion.
    Not {
        stuck: usize,
    },
    GaveUp,
}

const NIL: usize = usize::MAX;

/// A set of operations, by index.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

/// The Wing-Gong-Lowe search over `entries`, whose (invocation, completion)
/// times are `times`.
fn search(entries: &[Entry], times: &[(u64, u64)], budget: u64) -> Search {
    let n = entries.len();
    // The event list: each operation's call and its return, in time order
    // (at equal times, calls first: the more permissive reading).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, (start, end)) in times.iter().enumerate() {
        events.push((*start, false, i));
        events.push((*end, true, i));
    }
    events.sort();
    // A doubly linked list over the events, with a head at index 2n.
    let head = 2 * n;
    let mut next = vec![NIL; 2 * n + 1];
    let mut prev = vec![NIL; 2 * n + 1];
    let mut call_at = vec![0; n];
    let mut return_at = vec![0; n];
    let mut last = head;
    for (k, (_, is_return, op)) in events.iter().enumerate() {
        if *is_return {
            return_at[*op] = k;
        } else {
            call_at[*op] = k;
        }
        next[last] = k;
        prev[k] = last;
        last = k;
    }
    let op_of = |k: usize| events[k].2;
    let is_return = |k: usize| events[k].1;
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, k: usize| {
        let (p, q) = (prev[k], next[k]);
        next[p] = q;
        if q != NIL {
            prev[q] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, k: usize| {
        let (p, q) = (prev[k], next[k]);
        next[p] = k;
        if q != NIL {
            prev[q] = k;
        }
    };

    let mut state = State {
        value: 0,
        version: 0,
        fence: 0,
    };
    let mut done = Bits::new(n);
    let mut seen: HashSet<(Bits, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut deepest = (0usize, 0usize);
    let mut steps = 0u64;
    let mut at = next[head];
    loop {
        if next[head] == NIL {
            return Search::Linearizable;
        }
        steps += 1;
        if steps > budget {
            return Search::GaveUp;
        }
        if at != NIL && !is_return(at) {
            let op = op_of(at);
            if let Some(after) = step(state, &entries[op]) {
                done.set(op);
                if seen.insert((done.clone(), after)) {
                    stack.push((at, state));
                    state = after;
                    unlink(&mut next, &mut prev, at);
                    unlink(&mut next, &mut prev, return_at[op]);
                    at = next[head];
                    continue;
                }
                done.clear(op);
            }
            at = next[at];
            continue;
        }
        // A return reached (or the end): the operation it completes could
        // not be placed before it; undo the last placement.
        if at != NIL && stack.len() >= deepest.0 {
            deepest = (stack.len(), op_of(at));
        }
        let Some((call, before)) = stack.pop() else {
            return Search::Not { stuck: deepest.1 };
        };
        let op = op_of(call);
        state = before;
        done.clear(op);
        relink(&mut next, &mut prev, return_at[op]);
        relink(&mut next, &mut prev, call_at[op]);
        at = next[call];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Op;

    /// An operation on register "r".
    fn op(id: u64, call: Call, t: (u64, u64), outcome: Outcome) -> Op {
        Op {
            id,
            process: id,
            key: "r".into(),
            call,
            invoked_ns: t.0,
            completed_ns: t.1,
            outcome,
        }
    }

    fn ok(reply: Reply) -> Outcome {
        Outcome::Ok { reply }
    }

    fn unknown() -> Outcome {
        Outcome::Unknown { why: "lost".into() }
    }

    fn verdicts(ops: Vec<Op>) -> Vec<Verdict> {
        let history = History {
            ops,
            faults: Vec::new(),
        };
        check(&history, DEFAULT_BUDGET)
            .iter()
            .map(|f| f.verdict)
            .collect()
    }

    fn read(value: u64, version: u32) -> Outcome {
        ok(Reply::Value { value, version })
    }

    #[test]
    fn sequential_and_concurrent_histories_that_fit_the_model_pass() {
        // Sequential.
        assert!(verdicts(vec![
            op(
                1,
                Call::Write { value: 5 },
                (0, 10),
                ok(Reply::Written { version: 1 })
            ),
            op(2, Call::Read, (20, 30), read(5, 1)),
            op(
                3,
                Call::Cas {
                    version: 1,
                    value: 6
                },
                (40, 50),
                ok(Reply::Written { version: 2 })
            ),
            op(
                4,
                Call::Cas {
                    version: 1,
                    value: 7
                },
                (60, 70),
                ok(Reply::CasRefused)
            ),
            op(5, Call::Read, (80, 90), read(6, 2)),
        ])
        .is_empty());
        // Two writes at once, a read of either order's result.
        assert!(verdicts(vec![
            op(
                1,
                Call::Write { value: 1 },
                (0, 100),
                ok(Reply::Written { version: 2 })
            ),
            op(
                2,
                Call::Write { value: 2 },
                (0, 100),
                ok(Reply::Written { version: 1 })
            ),
            op(3, Call::Read, (50, 150), read(1, 2)),
        ])
        .is_empty());
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_a_violation() {
        let found = verdicts(vec![
            op(
                1,
                Call::Write { value: 5 },
                (0, 10),
                ok(Reply::Written { version: 1 }),
            ),
            op(2, Call::Read, (20, 30), read(0, 0)),
        ]);
        assert_eq!(found, [Verdict::Violation]);
        // Two successful compare-and-sets from the same version: one lost.
        let found = verdicts(vec![
            op(
                1,
                Call::Cas {
                    version: 0,
                    value: 1,
                },
                (0, 50),
                ok(Reply::Written { version: 1 }),
            ),
            op(
                2,
                Call::Cas {
                    version: 0,
                    value: 2,
                },
                (0, 50),
                ok(Reply::Written { version: 1 }),
            ),
        ]);
        assert_eq!(found, [Verdict::Violation]);
    }

    #[test]
    fn an_unknown_write_may_have_happened_or_not() {
        // Seen by a later read: it happened.
        assert!(verdicts(vec![
            op(1, Call::Write { value: 5 }, (0, 10), unknown()),
            op(2, Call::Read, (20, 30), read(5, 1)),
        ])
        .is_empty());
        // Not seen: it may still come (or never).
        assert!(verdicts(vec![
            op(1, Call::Write { value: 5 }, (0, 10), unknown()),
            op(2, Call::Read, (20, 30), read(0, 0)),
            op(3, Call::Read, (40, 50), read(5, 1)),
        ])
        .is_empty());
        // But not before it was invoked.
        let found = verdicts(vec![
            op(1, Call::Read, (0, 10), read(5, 1)),
            op(2, Call::Write { value: 5 }, (20, 30), unknown()),
        ]);
        assert_eq!(found, [Verdict::Violation]);
        // A failed write never happened.
        let found = verdicts(vec![
            op(
                1,
                Call::Write { value: 5 },
                (0, 10),
                Outcome::Fail {
                    why: "refused".into(),
                },
            ),
            op(2, Call::Read, (20, 30), read(5, 1)),
        ]);
        assert_eq!(found, [Verdict::Violation]);
    }

    #[test]
    fn a_fenced_write_with_a_token_below_the_fence_cannot_be_accepted() {
        let fenced = |token, value| Call::FencedWrite { token, value };
        // Token 9, then 5 refused, then 9 again: fine.
        assert!(verdicts(vec![
            op(1, fenced(9, 1), (0, 10), ok(Reply::Written { version: 1 })),
            op(2, fenced(5, 2), (20, 30), ok(Reply::Stale)),
            op(3, fenced(9, 3), (40, 50), ok(Reply::Written { version: 2 })),
            op(4, Call::Read, (60, 70), read(3, 2)),
        ])
        .is_empty());
        // A stale holder's write accepted after a higher token's.
        let found = verdicts(vec![
            op(1, fenced(9, 1), (0, 10), ok(Reply::Written { version: 1 })),
            op(2, fenced(5, 2), (20, 30), ok(Reply::Written { version: 2 })),
        ]);
        assert_eq!(found, [Verdict::Violation]);
        // Refused with no higher token anywhere before it.
        let found = verdicts(vec![op(1, fenced(5, 2), (20, 30), ok(Reply::Stale))]);
        assert_eq!(found, [Verdict::Violation]);
    }

    #[test]
    fn a_search_over_its_budget_says_it_could_not_decide() {
        // Many concurrent writes of one value: every order has to be tried
        // before the impossible read is judged.
        let mut ops: Vec<Op> = (0..14)
            .map(|i| op(i, Call::Write { value: 1 }, (0, 1000), unknown()))
            .collect();
        ops.push(op(99, Call::Read, (2000, 2001), read(7, 99)));
        let history = History {
            ops,
            faults: Vec::new(),
        };
        let found = check(&history, 1000);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].verdict, Verdict::Unknown);
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::history::Op;
    use proptest::prelude::*;

    /// A history made linearizable by construction: each operation gets a
    /// random interval and a random point inside it; the model, applied in
    /// the order of the points, gives the replies.
    fn linearizable_history(
        specs: Vec<(u8, u64, u64, u64, u64)>,
        break_one: Option<usize>,
    ) -> History {
        let mut ops: Vec<(u64, Op)> = specs
            .iter()
            .enumerate()
            .map(|(i, (kind, a, b, pick, arg))| {
                let (start, end) = (a.min(b) * 10, a.max(b) * 10 + 5);
                let point = start + pick % (end - start + 1);
                let call = match kind % 4 {
                    0 => Call::Read,
                    1 => Call::Write { value: *arg },
                    2 => Call::Cas {
                        version: (*arg % 4) as u32,
                        value: *arg,
                    },
                    _ => Call::FencedWrite {
                        token: *arg % 8,
                        value: *arg,
                    },
                };
                let op = Op {
                    id: i as u64,
                    process: i as u64,
                    key: "r".into(),
                    call,
                    invoked_ns: start,
                    completed_ns: end,
                    outcome: Outcome::Fail { why: String::new() },
                };
                (point, op)
            })
            .collect();
        ops.sort_by_key(|(point, op)| (*point, op.id));
        let mut state = State {
            value: 0,
            version: 0,
            fence: 0,
        };
        for (_, op) in &mut ops {
            let reply = match op.call {
                Call::Read => Reply::Value {
                    value: state.value,
                    version: state.version,
                },
                Call::Write { value } => {
                    state = State {
                        value,
                        version: state.version + 1,
                        ..state
                    };
                    Reply::Written {
                        version: state.version,
                    }
                }
                Call::Cas { version, value } if version == state.version => {
                    state = State {
                        value,
                        version: state.version + 1,
                        ..state
                    };
                    Reply::Written {
                        version: state.version,
                    }
                }
                Call::Cas { .. } => Reply::CasRefused,
                Call::FencedWrite { token, value } if token >= state.fence => {
                    state = State {
                        value,
                        version: state.version + 1,
                        fence: token,
                    };
                    Reply::Written {
                        version: state.version,
                    }
                }
                Call::FencedWrite { .. } => Reply::Stale,
                _ => unreachable!(),
            };
            op.outcome = Outcome::Ok { reply };
        }
        let mut ops: Vec<Op> = ops.into_iter().map(|(_, op)| op).collect();
        if let Some(i) = break_one {
            let reads: Vec<usize> = (0..ops.len())
                .filter(|j| ops[*j].call == Call::Read)
                .collect();
            if let Some(j) = reads.get(i % reads.len().max(1)) {
                if let Outcome::Ok {
                    reply: Reply::Value { value, .. },
                } = &mut ops[*j].outcome
                {
                    // A value no write ever wrote.
                    *value += 1_000_000;
                }
            }
        }
        History {
            ops,
            faults: Vec::new(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn histories_linearizable_by_construction_pass(
            specs in prop::collection::vec((0u8..4, 0u64..40, 0u64..40, any::<u64>(), 0u64..10), 1..14)
        ) {
            let history = linearizable_history(specs, None);
            let found = check(&history, DEFAULT_BUDGET);
            prop_assert!(found.is_empty(), "{found:?} in {history:?}");
        }

        #[test]
        fn a_read_of_a_value_never_written_is_caught(
            specs in prop::collection::vec((0u8..4, 0u64..40, 0u64..40, any::<u64>(), 0u64..10), 1..14),
            which in any::<usize>(),
        ) {
            let history = linearizable_history(specs, Some(which));
            if history.ops.iter().any(|op| op.call == Call::Read) {
                let found = check(&history, DEFAULT_BUDGET);
                prop_assert_eq!(found.len(), 1, "{:?}", history);
                prop_assert_eq!(found[0].verdict, Verdict::Violation);
            }
        }
    }
}
