//! Who heads a queue: one rule, applied by the server, that decides which
//! members of a queue may proceed and whom each of the others waits for.
//!
//! A queue is the children of one node, in the order they were created (a
//! lock's contenders, an election's candidates). Each member joined under a
//! [`QueueRule`]. [`standing`] is a pure function of that rule and of the
//! members ahead of one, nearest first: it says whether the member heads
//! (may proceed) or else which member's leaving is the next that can let it
//! proceed, so that a waiter is woken only when the rule lets it go, and
//! each waiter watches one member only.

/// How the members of a queue share what it guards, as a member's enqueue
/// carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QueueRule {
    /// One member at a time, in order: a member heads once nobody is ahead
    /// of it, and waits for the member just ahead of it until then.
    #[default]
    Exclusive,
}

/// Where a member of a queue stands under its rule; `M` names a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing<M> {
    /// It may proceed.
    Heads,
    /// It waits; `on` is the member whose leaving is the next that can let
    /// it proceed.
    Waits { on: M },
}

impl<M> Standing<M> {
    /// Whether the member may proceed.
    pub fn heads(&self) -> bool {
        matches!(self, Standing::Heads)
    }

    /// The member it waits on, if it waits.
    pub fn waits_on(self) -> Option<M> {
        match self {
            Standing::Heads => None,
            Standing::Waits { on } => Some(on),
        }
    }

    /// The same standing, its member named another way.
    pub fn map<N>(self, f: impl FnOnce(M) -> N) -> Standing<N> {
        match self {
            Standing::Heads => Standing::Heads,
            Standing::Waits { on } => Standing::Waits { on: f(on) },
        }
    }
}

/// Where a member stands under `rule`, given the members ahead of it,
/// nearest first. The iterator is read only as far as the rule needs (for
/// [`QueueRule::Exclusive`], one member), so a long queue costs nothing.
pub fn standing<M>(rule: QueueRule, mut ahead: impl Iterator<Item = M>) -> Standing<M> {
    match rule {
        QueueRule::Exclusive => match ahead.next() {
            None => Standing::Heads,
            Some(on) => Standing::Waits { on },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_member_heads_alone_and_otherwise_waits_for_the_one_just_ahead() {
        assert_eq!(
            standing(QueueRule::Exclusive, std::iter::empty::<u32>()),
            Standing::Heads
        );
        assert_eq!(
            standing(QueueRule::Exclusive, [7, 3, 1].into_iter()),
            Standing::Waits { on: 7 }
        );
    }

    #[test]
    fn an_exclusive_member_reads_no_further_than_the_one_just_ahead() {
        let mut read = 0;
        let ahead = (0..1_000_000u32).inspect(|_| read += 1);
        assert_eq!(
            standing(QueueRule::Exclusive, ahead),
            Standing::Waits { on: 0 }
        );
        assert_eq!(read, 1);
    }

    #[test]
    fn a_standing_says_whether_it_heads_and_whom_it_waits_on() {
        let heads: Standing<&str> = Standing::Heads;
        assert!(heads.heads());
        assert_eq!(heads.waits_on(), None);
        let waits = Standing::Waits { on: "/q/n-1" };
        assert!(!waits.heads());
        assert_eq!(waits.map(str::len).waits_on(), Some(6));
    }
}
