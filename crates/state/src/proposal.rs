//! Proposals, and how a request that is sent again is answered once.
//!
//! A client whose connection breaks with requests unanswered sends them
//! again, with the same xids, once its session is resumed (on the same
//! server, or on a new leader after a failover). Each session keeps the
//! reply to its latest change request (what it changed, or why it was
//! refused), so that a request sent again is answered rather than applied
//! twice. The reply is part of the state: it is in every snapshot and
//! rebuilt by every replay of a replicated log, so every member that
//! applies the same proposals answers a resent request alike.
//!
//! A refusal is kept too. In a cluster, a request and its resent copy can
//! both reach the log (the first proposed by a leader that then lost its
//! connection or its leadership, the copy by the next): were the first's
//! refusal forgotten, the copy would be applied once the state let it,
//! after the client was told "refused". A single server does not log the
//! requests it refuses, so after a restart it tries a resent refused
//! request again; it changed nothing the first time, and the client never
//! saw that refusal (the reply went with the connection).

use std::sync::Arc;

use baton_proto::{ErrorCode, ErrorReply, SessionId, Stat};

use super::{Command, Outcome, StateMachine};

/// The longest refusal message a session keeps, in bytes.
pub const KEPT_MESSAGE: usize = 1024;

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

/// A session's latest change request, and what it got: what it changed, or
/// why it was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastReply {
    pub xid: u32,
    pub reply: Result<Outcome, ErrorReply>,
}

/// The outcome of a session's latest change as the session keeps it (the
/// session keeps its xid), laid out small: every session that has made a
/// change keeps one. The outcome of a create or an enqueue (the changes a
/// session most often makes last) is kept as the few numbers the stat of a
/// node just created is made of, rather than whole.
#[derive(Clone, Debug)]
pub enum Kept {
    /// A node the session created (owned by the session if `ephemeral`);
    /// its sequence number, if `sequential`, is its creation revision.
    Created {
        path: Arc<str>,
        czxid: u64,
        ctime: u64,
        data_len: u32,
        ephemeral: bool,
        sequential: bool,
    },
    /// A queue joined: the node the session created (an ephemeral
    /// sequential node), and the node created just before it, if any.
    Enqueued {
        path: Arc<str>,
        czxid: u64,
        ctime: u64,
        data_len: u32,
        predecessor: Option<Box<(Arc<str>, Fresh)>>,
    },
    Deleted,
    /// Any other outcome, whole.
    Other(Box<Outcome>),
    /// The request was refused, for this reason.
    Refused(Box<ErrorReply>),
}

/// A refusal with its message cut to [`KEPT_MESSAGE`] bytes.
fn shortened(e: &ErrorReply) -> ErrorReply {
    let mut end = e.message.len().min(KEPT_MESSAGE);
    while !e.message.is_char_boundary(end) {
        end -= 1;
    }
    ErrorReply::new(e.code, &e.message[..end])
}

/// The stat of a node as created (not changed since, no children): its
/// creation revision and time, data length and owner (0 if persistent).
#[derive(Clone, Debug)]
pub struct Fresh {
    czxid: u64,
    ctime: u64,
    owner: u64,
    data_len: u32,
}

impl Fresh {
    fn of(stat: &Stat) -> Option<Fresh> {
        let fresh = Fresh {
            czxid: stat.czxid,
            ctime: stat.ctime,
            owner: stat.ephemeral_owner,
            data_len: stat.data_length,
        };
        (fresh.stat() == *stat).then_some(fresh)
    }

    fn stat(&self) -> Stat {
        Stat {
            czxid: self.czxid,
            mzxid: self.czxid,
            pzxid: self.czxid,
            ctime: self.ctime,
            mtime: self.ctime,
            version: 0,
            cversion: 0,
            ephemeral_owner: self.owner,
            data_length: self.data_len,
            num_children: 0,
        }
    }
}

impl Kept {
    /// The outcome of a change of `session`, kept small where that loses
    /// nothing: [`outcome`](Self::outcome) gives back exactly `outcome`.
    pub(super) fn new(session: SessionId, outcome: &Outcome) -> Kept {
        let own = |stat: &Stat| Fresh::of(stat).filter(|f| f.owner == 0 || f.owner == session.0);
        let small = match outcome {
            Outcome::Created {
                path,
                sequence,
                stat,
            } => own(stat).map(|f| Kept::Created {
                path: path.clone(),
                czxid: f.czxid,
                ctime: f.ctime,
                data_len: f.data_len,
                ephemeral: f.owner != 0,
                sequential: sequence.is_some(),
            }),
            Outcome::Enqueued {
                path,
                stat,
                predecessor,
                ..
            } => {
                let predecessor = match predecessor {
                    None => Some(None),
                    Some((p, stat)) => Fresh::of(stat).map(|f| Some(Box::new((p.clone(), f)))),
                };
                own(stat)
                    .zip(predecessor)
                    .map(|(f, predecessor)| Kept::Enqueued {
                        path: path.clone(),
                        czxid: f.czxid,
                        ctime: f.ctime,
                        data_len: f.data_len,
                        predecessor,
                    })
            }
            Outcome::Deleted => Some(Kept::Deleted),
            _ => None,
        };
        match small {
            // What a create or an enqueue gives; anything else is kept whole.
            Some(kept) if kept.reply(session).as_ref() == Ok(outcome) => kept,
            _ => Kept::Other(Box::new(outcome.clone())),
        }
    }

    /// The reply of a request of `session`, kept small where that loses
    /// nothing: [`reply`](Self::reply) gives back exactly `reply`.
    ///
    /// A refusal's message is kept to its first [`KEPT_MESSAGE`] bytes.
    pub(super) fn of(session: SessionId, reply: &Result<Outcome, ErrorReply>) -> Kept {
        match reply {
            Ok(Outcome::MultiFailed { index, error }) => {
                Kept::Other(Box::new(Outcome::MultiFailed {
                    index: *index,
                    error: shortened(error),
                }))
            }
            Ok(outcome) => Kept::new(session, outcome),
            Err(e) => Kept::Refused(Box::new(shortened(e))),
        }
    }

    /// The reply kept by `session`.
    pub fn reply(&self, session: SessionId) -> Result<Outcome, ErrorReply> {
        let own = |czxid, ctime, data_len, ephemeral: bool| {
            Fresh {
                czxid,
                ctime,
                owner: if ephemeral { session.0 } else { 0 },
                data_len,
            }
            .stat()
        };
        Ok(match self {
            Kept::Created {
                path,
                czxid,
                ctime,
                data_len,
                ephemeral,
                sequential,
            } => Outcome::Created {
                path: path.clone(),
                sequence: sequential.then_some(*czxid),
                stat: own(*czxid, *ctime, *data_len, *ephemeral),
            },
            Kept::Enqueued {
                path,
                czxid,
                ctime,
                data_len,
                predecessor,
            } => Outcome::Enqueued {
                path: path.clone(),
                sequence: *czxid,
                stat: own(*czxid, *ctime, *data_len, true),
                predecessor: predecessor.as_deref().map(|(p, f)| (p.clone(), f.stat())),
            },
            Kept::Deleted => Outcome::Deleted,
            Kept::Other(outcome) => (**outcome).clone(),
            Kept::Refused(e) => return Err((**e).clone()),
        })
    }
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
        let session = self.sessions.get(&origin.session)?;
        let last = session.last.as_deref()?;
        if after(origin.xid, session.last_xid) {
            return None;
        }
        Some(if origin.xid == session.last_xid {
            last.reply(origin.session)
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

    /// Keeps the reply to a change request, for its session.
    pub(super) fn remember(&mut self, origin: Origin, reply: &Result<Outcome, ErrorReply>) {
        if let Some(session) = self.sessions.get_mut(&origin.session) {
            let last = Kept::of(origin.session, reply);
            session.last_xid = origin.xid;
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

    /// A state machine with one session open, and that session.
    fn one_session() -> (StateMachine, SessionId) {
        let mut sm = StateMachine::new();
        let opened = sm.apply(
            &Command::OpenSession {
                timeout_ms: 1000,
                secret: SessionSecret([1; 16]),
            },
            0,
        );
        (sm, SessionId(opened.revision))
    }

    /// A persistent sequential node under `path`, made by `session`.
    fn sequential(session: SessionId, path: &str) -> Command {
        Command::Create {
            session,
            path: path.into(),
            data: Bytes::new(),
            mode: CreateMode::PersistentSequential,
            fence: None,
            acl: baton_proto::Acl::OPEN,
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
        let (mut sm, session) = one_session();
        let create = |path: &str| sequential(session, path);
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
    }

    /// A request and its resent copy can both reach a cluster's log (the
    /// first proposed by a leader that then lost the connection or its
    /// leadership, the copy by the next). When the first is refused, the
    /// copy gets the same refusal, even once the state would let it pass:
    /// applied, it would change what the client was told was refused.
    #[test]
    fn a_refused_request_and_its_copy_both_in_the_log_apply_at_most_once() {
        let (mut sm, session) = one_session();
        let create = |path: &str| sequential(session, path);
        let at = |xid| Some(Origin { session, xid });
        let refused = sm.apply_proposal(&proposal(at(9), create("/missing/c-")));
        assert!(!refused.changed);
        assert_eq!(refused.result.as_ref().unwrap_err().code, ErrorCode::NoNode);
        // Another session makes the missing parent.
        let other = SessionId(
            sm.apply(
                &Command::OpenSession {
                    timeout_ms: 1000,
                    secret: SessionSecret([9; 16]),
                },
                0,
            )
            .revision,
        );
        let parent = Command::Create {
            session: other,
            path: "/missing".into(),
            data: Bytes::new(),
            mode: CreateMode::Persistent,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        };
        let parent_made = Proposal {
            origin: Some(Origin {
                session: other,
                xid: 1,
            }),
            ..proposal(None, parent)
        };
        assert!(sm.apply_proposal(&parent_made).changed);
        let nodes = sm.node_count();
        let copy = sm.apply_proposal(&proposal(at(9), create("/missing/c-")));
        assert!(!copy.changed);
        assert_eq!(copy.result, refused.result);
        assert_eq!(sm.node_count(), nodes, "the copy created nothing");
        // A request made after it is applied.
        let retried = sm.apply_proposal(&proposal(at(10), create("/missing/c-")));
        assert!(retried.changed);
    }

    /// Every session that has made a change keeps its reply: a create's or
    /// an enqueue's is kept in a few numbers, and gives back exactly the
    /// outcome the change had, as does any other.
    #[test]
    fn kept_replies_are_small_and_exact() {
        assert!(std::mem::size_of::<Kept>() <= 48);
        let mut sm = StateMachine::new();
        let open = |sm: &mut StateMachine, n: u8| {
            let applied = sm.apply(
                &Command::OpenSession {
                    timeout_ms: 1000,
                    secret: SessionSecret([n; 16]),
                },
                0,
            );
            SessionId(applied.revision)
        };
        let (a, b) = (open(&mut sm, 1), open(&mut sm, 2));
        let mut xid = 0;
        let mut change = |sm: &mut StateMachine, session, command| {
            xid += 1;
            let origin = Origin { session, xid };
            let first = sm.apply_proposal(&proposal(Some(origin), command));
            let outcome = first.result.clone().expect("applied");
            let kept = sm
                .session(session)
                .unwrap()
                .last
                .as_deref()
                .unwrap()
                .clone();
            assert_eq!(kept.reply(session), Ok(outcome.clone()));
            assert_eq!(sm.answered(origin), Some(Ok(outcome)));
            kept
        };
        let create = |path: &str, data: &'static [u8], mode| Command::Create {
            session: a,
            path: path.into(),
            data: Bytes::from_static(data),
            mode,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        };
        for (path, data, mode) in [
            ("/q", &b""[..], CreateMode::Persistent),
            ("/e", &b"x"[..], CreateMode::Ephemeral),
            ("/q/s-", &b""[..], CreateMode::PersistentSequential),
            ("/q/t-", &b"yz"[..], CreateMode::EphemeralSequential),
        ] {
            let kept = change(&mut sm, a, create(path, data, mode));
            assert!(matches!(kept, Kept::Created { .. }), "{path}: {kept:?}");
        }
        let enqueue = |session| Command::Enqueue {
            session,
            path: "/q/w-".into(),
            data: Bytes::from_static(b"me"),
            rule: baton_proto::QueueRule::Exclusive,
        };
        for session in [a, b] {
            let kept = change(&mut sm, session, enqueue(session));
            assert!(matches!(kept, Kept::Enqueued { .. }), "{kept:?}");
        }
        // Other outcomes are kept whole, as is an enqueue whose predecessor
        // changed since its creation.
        let set = Command::SetData {
            path: "/q/w-0000000008".into(),
            data: Bytes::from_static(b"changed"),
            version: None,
            fence: None,
        };
        let kept = change(&mut sm, a, set);
        assert!(matches!(kept, Kept::Other(_)), "{kept:?}");
        let kept = change(&mut sm, a, enqueue(a));
        assert!(matches!(kept, Kept::Other(_)), "{kept:?}");
        let delete = Command::Delete {
            path: "/e".into(),
            version: None,
            fence: None,
        };
        let kept = change(&mut sm, a, delete);
        assert!(matches!(kept, Kept::Deleted), "{kept:?}");
    }
}
