//! Who heads a queue: one rule, applied by the server, that decides which
//! members of a queue may proceed and whom each of the others waits for.
//!
//! A queue is the children of one node, in the order they were created (a
//! lock's contenders, an election's candidates, a semaphore's holders). Each
//! member joined under a [`QueueRule`], kept with its node. [`standing`] is
//! a pure function of a member's rule and of the members ahead of it,
//! nearest first: it says whether the member heads (may proceed) or else
//! what it waits for, so that a waiter is woken only when the rule lets it
//! go, and each waiter waits for one thing only.
//!
//! The rules of one queue must agree: shared members (readers) queue with
//! exclusive ones (writers), permit holders only with exclusive members and
//! holders of as many permits. The state machine refuses an enqueue that
//! breaks this, so that the waiters a change can let through are always the
//! first ones, and the server never has to look past a waiter that stays.

use std::sync::Arc;

pub use baton_proto::QueueRule;
use baton_proto::{ErrorCode, ErrorReply};

use crate::pmap::PMap;

/// Where a member of a queue stands under its rule; `M` names a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing<M> {
    /// It may proceed.
    Heads,
    /// It waits; `on` is the member whose leaving is the next that can let
    /// it proceed (nothing else ahead of it can).
    Waits { on: M },
    /// It waits for a permit: any member ahead of it leaving can let it
    /// proceed. `behind` is the member just ahead of it.
    Queued { behind: M },
}

impl<M> Standing<M> {
    /// Whether the member may proceed.
    pub fn heads(&self) -> bool {
        matches!(self, Standing::Heads)
    }

    /// The member it waits on (for [`Standing::Queued`], the one just ahead
    /// of it), if it waits.
    pub fn waits_on(self) -> Option<M> {
        match self {
            Standing::Heads => None,
            Standing::Waits { on } => Some(on),
            Standing::Queued { behind } => Some(behind),
        }
    }

    /// The same standing, its member named another way.
    pub fn map<N>(self, f: impl FnOnce(M) -> N) -> Standing<N> {
        match self {
            Standing::Heads => Standing::Heads,
            Standing::Waits { on } => Standing::Waits { on: f(on) },
            Standing::Queued { behind } => Standing::Queued { behind: f(behind) },
        }
    }
}

/// Where a member that joined by `rule` stands, given the members ahead of
/// it, nearest first, each with the rule it joined by. The iterator is read
/// only as far as the rule needs: one member for [`QueueRule::Exclusive`],
/// up to `n` for [`QueueRule::Permits`], up to the nearest exclusive member
/// for [`QueueRule::Shared`] (the state machine answers that one from an
/// index instead).
pub fn standing<M>(
    rule: QueueRule,
    mut ahead: impl Iterator<Item = (M, QueueRule)>,
) -> Standing<M> {
    match rule {
        QueueRule::Exclusive => match ahead.next() {
            None => Standing::Heads,
            Some((on, _)) => Standing::Waits { on },
        },
        QueueRule::Shared => match ahead.find(|(_, r)| *r != QueueRule::Shared) {
            None => Standing::Heads,
            Some((on, _)) => Standing::Waits { on },
        },
        QueueRule::Permits(n) => {
            let Some((behind, _)) = ahead.next() else {
                return Standing::Heads;
            };
            // `behind` is one member ahead; the permit is free while fewer
            // than n are.
            let more = (n as usize).saturating_sub(1);
            if ahead.take(more).count() < more {
                Standing::Heads
            } else {
                Standing::Queued { behind }
            }
        }
    }
}

/// The queues some of whose members joined by a rule other than
/// [`QueueRule::Exclusive`], by the queue's path: which members joined by
/// that rule (every other member is exclusive), what the rule of a new
/// member must agree with, and, for queues with shared members, the
/// exclusive members in order, so that a shared member finds the nearest
/// one ahead of it in one lookup however many share the lock with it.
///
/// The rules live here rather than in the nodes, so a node costs not a
/// byte more for them; a queue of exclusive members only, the common case,
/// has no entry and costs nothing. A snapshot stores each node's rule, and
/// this is rebuilt as the nodes are restored.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ruled(PMap<Arc<str>, RuledQueue>);

#[derive(Clone, Debug)]
struct RuledQueue {
    /// The members that joined by `rule`, by creation revision.
    members: PMap<u64, ()>,
    /// [`QueueRule::Shared`] or [`QueueRule::Permits`].
    rule: QueueRule,
    /// With shared members: the other members (exclusive ones), by creation
    /// revision.
    unshared: PMap<u64, Arc<str>>,
}

impl Ruled {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a member may join the queue at `queue` by `rule`.
    pub(crate) fn check(&self, queue: &str, rule: QueueRule) -> Result<(), ErrorReply> {
        if rule == QueueRule::Exclusive {
            return Ok(());
        }
        if rule == QueueRule::Permits(0) {
            return Err(ErrorReply::new(
                ErrorCode::BadArguments,
                "a semaphore needs at least 1 permit",
            ));
        }
        match self.0.get(queue) {
            Some(q) if q.rule != rule => Err(ErrorReply::new(
                ErrorCode::BadArguments,
                format!(
                    "{queue} is a queue of members that joined by {}; a member cannot join it by {rule} (use another path, or the same rule)",
                    q.rule
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The member at `path`, created at `czxid`, joined the queue at
    /// `queue` by `rule`; `others` are the queue's other members, in any
    /// order (read only when the queue gets its entry).
    pub(crate) fn joined<'a>(
        &mut self,
        queue: &str,
        czxid: u64,
        path: &Arc<str>,
        rule: QueueRule,
        others: impl Iterator<Item = (u64, &'a Arc<str>)>,
    ) {
        if let Some(q) = self.0.get_mut(queue) {
            if rule == QueueRule::Exclusive {
                if q.rule == QueueRule::Shared {
                    q.unshared.insert(czxid, path.clone());
                }
            } else {
                debug_assert_eq!(q.rule, rule, "checked before the member joined");
                q.members.insert(czxid, ());
            }
            return;
        }
        if rule == QueueRule::Exclusive {
            return;
        }
        // No member of the queue joined by another rule before this one:
        // every other member is exclusive.
        let mut unshared = PMap::new();
        if rule == QueueRule::Shared {
            for (c, p) in others.filter(|(c, _)| *c != czxid) {
                unshared.insert(c, p.clone());
            }
        }
        let mut members = PMap::new();
        members.insert(czxid, ());
        self.0.insert(
            Arc::from(queue),
            RuledQueue {
                members,
                rule,
                unshared,
            },
        );
    }

    /// The member created at `czxid` left the queue at `queue`.
    pub(crate) fn left(&mut self, queue: &str, czxid: u64) {
        let Some(q) = self.0.get_mut(queue) else {
            return;
        };
        if q.members.remove(&czxid).is_none() {
            q.unshared.remove(&czxid);
            return;
        }
        if q.members.is_empty() {
            self.0.remove(queue);
        }
    }

    /// The rule by which the member created at `czxid` joined the queue at
    /// `queue`.
    pub(crate) fn rule(&self, queue: &str, czxid: u64) -> QueueRule {
        match self.0.get(queue) {
            Some(q) if q.members.contains_key(&czxid) => q.rule,
            _ => QueueRule::Exclusive,
        }
    }

    /// The nearest exclusive member ahead of the one created at `czxid` in
    /// the queue at `queue`, which has shared members.
    pub(crate) fn nearest_exclusive(&self, queue: &str, czxid: u64) -> Option<&Arc<str>> {
        self.0
            .get(queue)?
            .unshared
            .last_below(&czxid)
            .map(|(_, p)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QueueRule::{Exclusive as X, Permits, Shared as S};

    fn ahead(rules: &[QueueRule]) -> impl Iterator<Item = (usize, QueueRule)> + '_ {
        rules.iter().copied().enumerate()
    }

    #[test]
    fn an_exclusive_member_heads_alone_and_otherwise_waits_for_the_one_just_ahead() {
        assert_eq!(standing(X, ahead(&[])), Standing::Heads);
        assert_eq!(standing(X, ahead(&[S, S, X])), Standing::Waits { on: 0 });
    }

    #[test]
    fn a_shared_member_heads_behind_shared_ones_and_waits_for_the_nearest_exclusive_one() {
        assert_eq!(standing(S, ahead(&[])), Standing::Heads);
        assert_eq!(standing(S, ahead(&[S, S, S])), Standing::Heads);
        assert_eq!(
            standing(S, ahead(&[S, S, X, S, X])),
            Standing::Waits { on: 2 }
        );
        assert_eq!(standing(S, ahead(&[X])), Standing::Waits { on: 0 });
    }

    #[test]
    fn a_permit_is_free_while_fewer_than_n_are_ahead() {
        let p3 = Permits(3);
        assert_eq!(standing(p3, ahead(&[])), Standing::Heads);
        assert_eq!(standing(p3, ahead(&[p3, p3])), Standing::Heads);
        assert_eq!(
            standing(p3, ahead(&[p3, p3, p3])),
            Standing::Queued { behind: 0 }
        );
        assert_eq!(
            standing(p3, ahead(&[p3; 9])),
            Standing::Queued { behind: 0 }
        );
        assert_eq!(standing(Permits(1), ahead(&[])), Standing::Heads);
        assert_eq!(
            standing(Permits(1), ahead(&[Permits(1)])),
            Standing::Queued { behind: 0 }
        );
    }

    #[test]
    fn a_rule_reads_no_further_than_it_needs() {
        for (rule, needed) in [(X, 1), (Permits(5), 5), (S, 3)] {
            let mut read = 0;
            let members = (0..1_000_000u32).map(|i| (i, if i == 2 { X } else { S }));
            let _ = standing(rule, members.inspect(|_| read += 1));
            assert_eq!(read, needed, "{rule}");
        }
    }

    #[test]
    fn a_standing_says_whether_it_heads_and_whom_it_waits_on() {
        let heads: Standing<&str> = Standing::Heads;
        assert!(heads.heads());
        assert_eq!(heads.waits_on(), None);
        let waits = Standing::Waits { on: "/q/n-1" };
        assert!(!waits.heads());
        assert_eq!(waits.map(str::len).waits_on(), Some(6));
        assert_eq!(Standing::Queued { behind: 4 }.waits_on(), Some(4));
    }

    #[test]
    fn rules_of_one_queue_must_agree() {
        let mut ruled = Ruled::default();
        let a: Arc<str> = Arc::from("/q/a");
        assert!(ruled.check("/q", Permits(0)).is_err());
        ruled.joined("/q", 5, &a, Permits(2), std::iter::empty());
        assert!(ruled.check("/q", Permits(2)).is_ok());
        assert!(ruled.check("/q", X).is_ok());
        let e = ruled.check("/q", Permits(3)).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadArguments);
        assert!(e.message.contains("joined by 2 permits"), "{}", e.message);
        assert!(ruled.check("/q", S).is_err());
        assert_eq!(ruled.rule("/q", 5), Permits(2));
        assert_eq!(ruled.rule("/q", 6), X);
        ruled.left("/q", 5);
        assert!(ruled.is_empty());
        assert!(ruled.check("/q", S).is_ok());
    }

    #[test]
    fn the_exclusive_members_of_a_shared_queue_are_indexed() {
        let mut ruled = Ruled::default();
        let p: Vec<Arc<str>> = (0..5).map(|i| Arc::from(format!("/q/{i}"))).collect();
        // An exclusive member before any shared one: found once the first
        // shared member joins.
        ruled.joined("/q", 1, &p[1], X, std::iter::empty());
        assert!(ruled.is_empty());
        ruled.joined("/q", 2, &p[2], S, [(1, &p[1]), (2, &p[2])].into_iter());
        ruled.joined("/q", 3, &p[3], X, std::iter::empty());
        ruled.joined("/q", 4, &p[4], S, std::iter::empty());
        assert_eq!(ruled.nearest_exclusive("/q", 4), Some(&p[3]));
        assert_eq!(ruled.nearest_exclusive("/q", 3), Some(&p[1]));
        assert_eq!(ruled.nearest_exclusive("/q", 1), None);
        ruled.left("/q", 3);
        assert_eq!(ruled.nearest_exclusive("/q", 4), Some(&p[1]));
        assert_eq!((ruled.rule("/q", 4), ruled.rule("/q", 1)), (S, X));
        ruled.left("/q", 2);
        ruled.left("/q", 4);
        assert!(ruled.is_empty());
    }
}
