//! Proposals, and how a request that is sent again is answered once.
//!
//! A client whose connection breaks with requests unanswered sends them
//! again, with the same xids, once its session is resumed (on the same
//! server, or on a new leader after a failover). Each session keeps the
//! reply to its latest request that changed the state, so that a request
//! sent again is answered rather than applied twice. The reply is part of
//! the state: it is in every snapshot and rebuilt by every replay, so every
//! server that applies the same proposals answers a resent request alike.

use baton_proto::{ErrorCode, ErrorReply, SessionId};

use super::{Command, Outcome, StateMachine};

/// The client request a change answers: its session and xid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    pub session: SessionId,
    pub xid: u32,
}

/// A change as it is logged and replicated: the command, the time it is
/// stamped with (chosen by whoever proposes it, so that every server applies
/// it alike), and the request it answers, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    pub now_ms: u64,
    pub origin: Option<Origin>,
    pub command: Command,
}

/// A session's latest request that changed the state, and what it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastReply {
    pub xid: u32,
    pub outcome: Outcome,
}

/// Whether `xid` comes after `last` in a session's sequence of xids, which
/// wraps around after `u32::MAX`.
fn after(xid: u32, last: u32) -> bool {
    (xid.wrapping_sub(last) as i32) > 0
}

impl StateMachine {
    /// The answer to a request its session made before, if it did: its reply
    /// if it was the session's latest change, `result-lost` if it came
    /// earlier (it was handled, as a change or a refusal, and must not be
    /// applied again; its reply is gone).
    pub(super) fn answered(&self, origin: Origin) -> Option<Result<Outcome, ErrorReply>> {
        let last = self.sessions.get(&origin.session)?.last.as_deref()?;
        if after(origin.xid, last.xid) {
            return None;
        }
        Some(if origin.xid == last.xid {
            Ok(last.outcome.clone())
        } else {
            Err(ErrorReply::new(
                ErrorCode::ResultLost,
                format!(
                    "request {} of session {} was handled before the connection broke, and its reply is lost",
                    origin.xid, origin.session
                ),
            ))
        })
    }

    /// Keeps the reply to a request that changed the state, for its session.
    pub(super) fn remember(&mut self, origin: Origin, outcome: &Outcome) {
        if let Some(session) = self.sessions.get_mut(&origin.session) {
            let last = LastReply {
                xid: origin.xid,
                outcome: outcome.clone(),
            };
            match &mut session.last {
                Some(kept) => **kept = last,
                None => session.last = Some(Box::new(last)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_proto::{CreateMode, SessionSecret};
    use bytes::Bytes;

    fn proposal(origin: Option<Origin>, command: Command) -> Proposal {
        Proposal {
            now_ms: 1,
            origin,
            command,
        }
    }

    #[test]
    fn xids_compare_across_the_wrap() {
        assert!(after(2, 1));
        assert!(!after(1, 1));
        assert!(!after(1, 2));
        assert!(after(0, u32::MAX));
        assert!(after(5, u32::MAX - 5));
    }

    /// A resent request is answered, not applied again; an earlier one of
    /// the same session is reported lost; a later one is applied.
    #[test]
    fn a_request_sent_again_is_applied_at_most_once() {
        let mut sm = StateMachine::new();
        sm.apply(
            &Command::OpenSession {
                timeout_ms: 1000,
                secret: SessionSecret([1; 16]),
            },
            0,
        );
        let session = SessionId(1);
        let create = |path: &str| Command::Create {
            session,
            path: path.into(),
            data: Bytes::new(),
            mode: CreateMode::PersistentSequential,
            fence: None,
        };
        let at = |xid| Some(Origin { session, xid });
        let first = sm.apply_proposal(&proposal(at(7), create("/a-")));
        assert!(first.changed);
        let revision = sm.revision();
        let again = sm.apply_proposal(&proposal(at(7), create("/a-")));
        assert!(!again.changed && again.triggers.is_empty());
        assert_eq!(again.result, first.result);
        assert_eq!(sm.revision(), revision);
        assert_eq!(sm.node_count(), 2, "created once");

        let next = sm.apply_proposal(&proposal(at(8), create("/b-")));
        assert!(next.changed);
        let lost = sm.apply_proposal(&proposal(at(7), create("/a-")));
        assert_eq!(lost.result.unwrap_err().code, ErrorCode::ResultLost);
        assert_eq!(sm.node_count(), 3);

        // A refused request is not remembered: sent again, it is tried again.
        let refused = sm.apply_proposal(&proposal(at(9), create("/missing/c-")));
        assert!(!refused.changed);
        let parent = Command::Create {
            session,
            path: "/missing".into(),
            data: Bytes::new(),
            mode: CreateMode::Persistent,
            fence: None,
        };
        assert!(sm.apply_proposal(&proposal(at(10), parent)).changed);
        let retried = sm.apply_proposal(&proposal(at(11), create("/missing/c-")));
        assert!(retried.changed);
    }
}
