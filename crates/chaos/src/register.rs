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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct State {
    value: u64,
    version: u32,
    fence: u64,
    /// The value is one no read returned (written by an operation whose
    /// outcome is unknown): no read can follow before another write, and
    /// which such write it was makes no difference.
    blind: bool,
}

/// One operation as the search sees it.
#[derive(Clone, Debug)]
struct Entry {
    id: u64,
    call: Call,
    /// `None`: the outcome is unknown.
    reply: Option<Reply>,
    /// An unknown outcome whose value no read returned: if it took effect,
    /// nobody saw its value.
    unseen: bool,
}

/// The model's step: the state after `op` taken in `state`, if `op`'s reply
/// is what the model gives there.
fn step(state: State, op: &Entry) -> Option<State> {
    let after = model(state, op)?;
    Some(if op.unseen && after != state {
        State {
            value: 0,
            blind: true,
            ..after
        }
    } else {
        after
    })
}

fn model(state: State, op: &Entry) -> Option<State> {
    match (&op.call, &op.reply) {
        (Call::Read, Some(Reply::Value { value, version })) => {
            (!state.blind && state.value == *value && state.version == *version).then_some(state)
        }
        (Call::Write { value }, Some(Reply::Written { version })) => {
            (*version == state.version.wrapping_add(1)).then_some(State {
                value: *value,
                version: *version,
                fence: state.fence,
                blind: false,
            })
        }
        (Call::Write { value }, None) => Some(State {
            value: *value,
            version: state.version.wrapping_add(1),
            fence: state.fence,
            blind: false,
        }),
        (Call::Cas { version, value }, Some(Reply::Written { version: after })) => {
            (state.version == *version && *after == version.wrapping_add(1)).then_some(State {
                value: *value,
                version: *after,
                fence: state.fence,
                blind: false,
            })
        }
        (Call::Cas { version, .. }, Some(Reply::CasRefused)) => {
            (state.version != *version).then_some(state)
        }
        (Call::Cas { version, value }, None) => Some(if state.version == *version {
            State {
                value: *value,
                version: version.wrapping_add(1),
                fence: state.fence,
                blind: false,
            }
        } else {
            state
        }),
        (Call::FencedWrite { token, value }, Some(Reply::Written { version })) => {
            (*token >= state.fence && *version == state.version.wrapping_add(1)).then_some(State {
                value: *value,
                version: *version,
                fence: *token,
                blind: false,
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
                blind: false,
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
        let ops = || history.of(is_register).filter(|op| op.key == key);
        // The values reads returned: a write with an unknown outcome whose
        // value is not among them was seen by nobody, if it took effect.
        let read: HashSet<u64> = ops()
            .filter_map(|op| match op.outcome.reply() {
                Some(Reply::Value { value, .. }) => Some(*value),
                _ => None,
            })
            .collect();
        let mut entries = Vec::new();
        let mut times = Vec::new();
        for op in ops() {
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
            let unseen = reply.is_none()
                && matches!(op.call, Call::Write { value } | Call::Cas { value, .. } if !read.contains(&value));
            entries.push(Entry {
                id: op.id,
                call: op.call.clone(),
                reply,
                unseen,
            });
        }
        // In call order: the memo's sets of placed operations stay small.
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by_key(|&i| times[i]);
        let entries: Vec<Entry> = order.iter().map(|&i| entries[i].clone()).collect();
        let times: Vec<(u64, u64)> = order.iter().map(|&i| times[i]).collect();
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

/// The operations placed so far, by index in call order, kept small for
/// the memo: every operation below `high` is placed except those in `gaps`
/// (sorted), and none from `high` on. Only operations called before the
/// first return still to come can be placed, so the gaps are those in
/// flight then and those with an unknown outcome not placed yet: a few,
/// however long the history.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
struct Placed {
    high: u32,
    gaps: Vec<u32>,
}

impl Placed {
    fn set(&mut self, i: usize) {
        let i = i as u32;
        if i < self.high {
            if let Ok(at) = self.gaps.binary_search(&i) {
                self.gaps.remove(at);
            }
        } else {
            self.gaps.extend(self.high..i);
            self.high = i + 1;
        }
    }

    fn clear(&mut self, i: usize) {
        let i = i as u32;
        if i + 1 == self.high {
            self.high = i;
            while self.high > 0 && self.gaps.last() == Some(&(self.high - 1)) {
                self.gaps.pop();
                self.high -= 1;
            }
        } else if let Err(at) = self.gaps.binary_search(&i) {
            self.gaps.insert(at, i);
        }
    }

    /// About how many bytes a copy takes in the memo.
    fn bytes(&self) -> usize {
        std::mem::size_of::<(Placed, State)>() + 4 * self.gaps.len() + 16
    }
}

/// Most bytes the memo of one search holds. Past it the memo starts
/// again empty: it only spares the search work it did before, so the
/// answer is the same; only the budget of steps bounds the time.
const MEMO_BYTES: usize = 512 << 20;

/// Where the search stands at one depth: trying operations with a known
/// outcome at event `.0` of the list, or, once those reached the first
/// return still to come (`limit`), those with an unknown outcome from the
/// `j`-th on (of those whose value nobody saw, only `pick`).
#[derive(Clone, Copy)]
enum Cursor {
    Known(usize),
    Unknown { j: usize, limit: usize, pick: usize },
}

/// Of the operations with an unknown outcome whose value nobody saw, not
/// placed yet and called before event `limit`, the one to try in `state`
/// (or [`NIL`]). Each that would change the register here leaves the same
/// state (the next version, a value no read returned); a compare-and-set
/// is taken before a write, as it can never take effect later (the version
/// only grows) while the write still could.
fn unseen_pick(
    entries: &[Entry],
    unknown: &[(usize, usize)],
    placed: &[bool],
    state: State,
    limit: usize,
) -> usize {
    let mut write = NIL;
    for &(_, op) in unknown.iter().take_while(|(call, _)| *call < limit) {
        let entry = &entries[op];
        if placed[op] || !entry.unseen || step(state, entry) == Some(state) {
            continue;
        }
        match entry.call {
            Call::Cas { .. } => return op,
            _ if write == NIL => write = op,
            _ => {}
        }
    }
    write
}

/// The Wing-Gong-Lowe search over `entries`, whose (invocation, completion)
/// times are `times` (in call order).
///
/// At each depth it tries every operation called before the first return
/// still to come: first those with a known outcome, then those with an
/// unknown one, and of those only one that would change the register (one
/// that would not is as well placed later, or never). The order changes
/// nothing about the answer (every candidate that matters is tried before
/// the search backs off) but much about the time: a reply lost early is
/// not placed, and taken back, at every later step of a long history; it
/// is placed only where the known replies need its effect, or never (an
/// unknown outcome may be no effect at all).
fn search(entries: &[Entry], times: &[(u64, u64)], budget: u64) -> Search {
    let n = entries.len();
    // The events: each operation's call, and the return of each whose
    // outcome is known, in time order (at equal times, calls first: the
    // more permissive reading).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, (start, end)) in times.iter().enumerate() {
        events.push((*start, false, i));
        if entries[i].reply.is_some() {
            events.push((*end, true, i));
        }
    }
    events.sort();
    let total = events.len();
    // A doubly linked list over the known operations' events, with a head
    // at index `total`; the unknown ones' calls apart, in time order.
    let head = total;
    let mut next = vec![NIL; total + 1];
    let mut prev = vec![NIL; total + 1];
    let mut call_at = vec![0; n];
    let mut return_at = vec![0; n];
    let mut unknown: Vec<(usize, usize)> = Vec::new();
    let mut last = head;
    for (k, (_, is_return, op)) in events.iter().enumerate() {
        if *is_return {
            return_at[*op] = k;
        } else {
            call_at[*op] = k;
            if entries[*op].reply.is_none() {
                unknown.push((k, *op));
                continue;
            }
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

    let mut state = State::default();
    let mut placed = vec![false; n];
    let mut done = Placed::default();
    let mut seen: HashSet<(Placed, State)> = HashSet::new();
    let mut seen_bytes = 0usize;
    let mut stack: Vec<(Cursor, State)> = Vec::new();
    let mut deepest = (0usize, 0usize);
    let mut steps = 0u64;
    let mut cursor = Cursor::Known(next[head]);
    loop {
        // Every known outcome placed: the unknown ones not placed yet
        // took no effect.
        if next[head] == NIL {
            return Search::Linearizable;
        }
        steps += 1;
        if steps > budget {
            return Search::GaveUp;
        }
        // The operation to try at this depth, if any is left.
        let candidate = match cursor {
            Cursor::Known(at) if !is_return(at) => Some(op_of(at)),
            Cursor::Known(at) => {
                // The first return still to come: the operation it completes
                // could not be placed before it from here by a known one.
                if stack.len() >= deepest.0 {
                    deepest = (stack.len(), op_of(at));
                }
                let pick = unseen_pick(entries, &unknown, &placed, state, at);
                cursor = Cursor::Unknown {
                    j: 0,
                    limit: at,
                    pick,
                };
                continue;
            }
            Cursor::Unknown { j, limit, pick } => match unknown.get(j) {
                // One that would change nothing here is as well left for
                // later, or never; of those whose value nobody saw, all
                // have the same effect here, and one stands for them all.
                Some(&(call, op)) if call < limit => (!placed[op]
                    && (!entries[op].unseen || op == pick)
                    && step(state, &entries[op]) != Some(state))
                .then_some(op),
                _ => {
                    // Nothing more to try here: undo the last placement.
                    let Some((from, before)) = stack.pop() else {
                        return Search::Not { stuck: deepest.1 };
                    };
                    state = before;
                    cursor = match from {
                        Cursor::Known(at) => {
                            let op = op_of(at);
                            placed[op] = false;
                            done.clear(op);
                            relink(&mut next, &mut prev, return_at[op]);
                            relink(&mut next, &mut prev, at);
                            Cursor::Known(next[at])
                        }
                        Cursor::Unknown { j, limit, pick } => {
                            let op = unknown[j].1;
                            placed[op] = false;
                            done.clear(op);
                            Cursor::Unknown {
                                j: j + 1,
                                limit,
                                pick,
                            }
                        }
                    };
                    continue;
                }
            },
        };
        if let Some(op) = candidate {
            if let Some(after) = step(state, &entries[op]) {
                done.set(op);
                if seen_bytes > MEMO_BYTES {
                    seen = HashSet::new();
                    seen_bytes = 0;
                }
                seen_bytes += done.bytes();
                if seen.insert((done.clone(), after)) {
                    placed[op] = true;
                    stack.push((cursor, state));
                    state = after;
                    if let Cursor::Known(at) = cursor {
                        unlink(&mut next, &mut prev, at);
                        unlink(&mut next, &mut prev, return_at[op]);
                    }
                    cursor = Cursor::Known(next[head]);
                    continue;
                }
                done.clear(op);
            }
        }
        cursor = match cursor {
            Cursor::Known(at) => Cursor::Known(next[at]),
            Cursor::Unknown { j, limit, pick } => Cursor::Unknown {
                j: j + 1,
                limit,
                pick,
            },
        };
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

    /// Of two writes with lost replies whose values nobody read, the
    /// compare-and-set fills the first gap in the versions: the plain write
    /// is still free to fill a later one, which the compare-and-set could
    /// not.
    #[test]
    fn lost_writes_nobody_read_fill_the_gaps_they_can() {
        let cas = Call::Cas {
            version: 0,
            value: 8,
        };
        assert!(verdicts(vec![
            op(1, Call::Write { value: 9 }, (0, 5), unknown()),
            op(2, cas.clone(), (1, 5), unknown()),
            op(
                3,
                Call::Write { value: 1 },
                (10, 20),
                ok(Reply::Written { version: 2 })
            ),
            op(
                4,
                Call::Write { value: 2 },
                (30, 40),
                ok(Reply::Written { version: 4 })
            ),
            op(5, Call::Read, (50, 60), read(2, 4)),
        ])
        .is_empty());
        // A third gap has nothing left to fill it.
        let found = verdicts(vec![
            op(1, Call::Write { value: 9 }, (0, 5), unknown()),
            op(2, cas, (1, 5), unknown()),
            op(
                3,
                Call::Write { value: 1 },
                (10, 20),
                ok(Reply::Written { version: 2 }),
            ),
            op(
                4,
                Call::Write { value: 2 },
                (30, 40),
                ok(Reply::Written { version: 4 }),
            ),
            op(
                5,
                Call::Write { value: 3 },
                (50, 60),
                ok(Reply::Written { version: 6 }),
            ),
        ]);
        assert_eq!(found, [Verdict::Violation]);
    }

    /// A long history of `workers` on one register, linearizable by
    /// construction: each operation takes effect at a point inside its
    /// interval and the model, run along those points, gives the replies.
    /// One in `unknown_every` loses its reply: it took effect (up to 2 s
    /// after its worker gave up, as a request held by a cut link does) or
    /// never.
    pub(crate) fn long_history(ops: usize, workers: u64, unknown_every: u64, seed: u64) -> History {
        let mut rng = seed | 1;
        let mut next = move |below: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % below
        };
        let mut free = vec![0u64; workers as usize];
        let mut planned: Vec<(Option<u64>, Op)> = Vec::with_capacity(ops);
        for id in 0..ops as u64 {
            let w = next(workers) as usize;
            let start = free[w] + next(300_000);
            let lost = next(unknown_every) == 0;
            let effect_at = start + next(2_000_000);
            let (effect, end) = if lost {
                let effect = (next(2) == 0).then(|| start + next(2_000_000_000));
                (effect, start + 1_000_000)
            } else {
                (Some(effect_at), effect_at + next(2_000_000))
            };
            free[w] = end;
            let call = match next(10) {
                0..=3 => Call::Read,
                4..=6 => Call::Write { value: id + 1 },
                _ => Call::Cas {
                    version: 0,
                    value: id + 1,
                },
            };
            let outcome = if lost {
                unknown()
            } else {
                Outcome::Fail {
                    why: "not yet taken".into(),
                }
            };
            planned.push((effect, op(id, call, (start, end), outcome)));
            planned.last_mut().unwrap().1.process = w as u64;
        }
        // The model along the points of effect.
        let mut order: Vec<usize> = (0..planned.len())
            .filter(|i| planned[*i].0.is_some())
            .collect();
        order.sort_by_key(|i| planned[*i].0);
        let (mut value, mut version) = (0u64, 0u32);
        for i in order {
            let op = &mut planned[i].1;
            let reply = match &mut op.call {
                Call::Read => Reply::Value { value, version },
                Call::Write { value: v } => {
                    (value, version) = (*v, version + 1);
                    Reply::Written { version }
                }
                Call::Cas {
                    version: expected,
                    value: v,
                } => {
                    // Mostly from the version there, now and then a stale one.
                    *expected = version.saturating_sub((next(4) == 0) as u32);
                    if *expected == version {
                        (value, version) = (*v, version + 1);
                        Reply::Written { version }
                    } else {
                        Reply::CasRefused
                    }
                }
                _ => unreachable!(),
            };
            if !op.outcome.is_unknown() {
                op.outcome = ok(reply);
            }
        }
        History {
            ops: planned.into_iter().map(|(_, op)| op).collect(),
            faults: Vec::new(),
        }
    }

    /// A long history with replies lost all along is decided within the
    /// default budget: linearizable as made, and not once one read in the
    /// middle returns a value nobody wrote.
    #[test]
    fn a_long_history_with_lost_replies_is_decided() {
        let history = long_history(3_000, 12, 100, 7);
        assert!(
            history
                .ops
                .iter()
                .filter(|o| o.outcome.is_unknown())
                .count()
                > 20
        );
        assert_eq!(check(&history, DEFAULT_BUDGET), []);

        let mut broken = history;
        let middle = broken.ops.len() / 2;
        let at = (middle..broken.ops.len())
            .find(|i| broken.ops[*i].call == Call::Read && !broken.ops[*i].outcome.is_unknown())
            .unwrap();
        broken.ops[at].outcome = read(123_456_789, 1);
        let found = check(&broken, DEFAULT_BUDGET);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].verdict, Verdict::Violation, "{found:?}");
        assert!(found[0].ops.contains(&broken.ops[at].id), "{found:?}");
    }

    #[test]
    fn a_search_over_its_budget_says_it_could_not_decide() {
        // Many concurrent writes with lost replies, each value read later
        // at a version none can reach: every subset of them has to be
        // tried before the reads are judged impossible.
        let mut ops: Vec<Op> = (0..14)
            .map(|i| op(i, Call::Write { value: i }, (0, 1000), unknown()))
            .collect();
        ops.extend((0..14).map(|i| op(100 + i, Call::Read, (2000, 2001), read(i, 99))));
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
    ///
    /// `fate` 0 loses an operation's reply after it took effect, 1 loses
    /// it and the operation never takes effect; any other keeps it.
    fn linearizable_history(
        specs: Vec<(u8, u64, u64, u64, u64, u8)>,
        break_one: Option<usize>,
    ) -> History {
        let mut ops: Vec<(u64, Op)> = specs
            .iter()
            .enumerate()
            .map(|(i, (kind, a, b, pick, arg, _))| {
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
        let mut state = State::default();
        let fate = |op: &Op| specs[op.id as usize].5;
        for (_, op) in &mut ops {
            if fate(op) == 1 {
                op.outcome = Outcome::Unknown { why: "lost".into() };
                continue;
            }
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
                        blind: false,
                    };
                    Reply::Written {
                        version: state.version,
                    }
                }
                Call::FencedWrite { .. } => Reply::Stale,
                _ => unreachable!(),
            };
            op.outcome = if fate(op) == 0 {
                Outcome::Unknown { why: "lost".into() }
            } else {
                Outcome::Ok { reply }
            };
        }
        let mut ops: Vec<Op> = ops.into_iter().map(|(_, op)| op).collect();
        if let Some(i) = break_one {
            let reads: Vec<usize> = (0..ops.len())
                .filter(|j| ops[*j].call == Call::Read && !ops[*j].outcome.is_unknown())
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
            specs in prop::collection::vec((0u8..4, 0u64..40, 0u64..40, any::<u64>(), 0u64..10, 0u8..6), 1..14)
        ) {
            let history = linearizable_history(specs, None);
            let found = check(&history, DEFAULT_BUDGET);
            prop_assert!(found.is_empty(), "{found:?} in {history:?}");
        }

        #[test]
        fn a_read_of_a_value_never_written_is_caught(
            specs in prop::collection::vec((0u8..4, 0u64..40, 0u64..40, any::<u64>(), 0u64..10, 0u8..6), 1..14),
            which in any::<usize>(),
        ) {
            let history = linearizable_history(specs, Some(which));
            if history.ops.iter().any(|op| op.call == Call::Read && !op.outcome.is_unknown()) {
                let found = check(&history, DEFAULT_BUDGET);
                prop_assert_eq!(found.len(), 1, "{:?}", history);
                prop_assert_eq!(found[0].verdict, Verdict::Violation);
            }
        }
    }
}
