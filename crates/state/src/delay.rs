//! Lock-delay (as Chubby's): a lock whose holder's session expires, rather
//! than releasing, is not granted to anyone else for a while, for the
//! resources a stale holder may still be writing to that cannot check a
//! fencing token.
//!
//! A lock (a queue's node) gets its delay by
//! [`Command::SetLockDelay`](crate::Command::SetLockDelay).
//! When a session expires, each of its nodes that heads a queue with a
//! delay is not deleted but kept as a *tombstone*: owned by no session,
//! still in its place in the queue, until the expiry's time plus the
//! delay. The waiters go on waiting on it exactly as they waited on the
//! holder (no rule changes), and the leader deletes it
//! ([`Command::DeleteTombstone`](crate::Command::DeleteTombstone)) once it
//! is due. A holder that releases,
//! or whose session is closed, leaves no tombstone.

use std::sync::Arc;

use baton_proto::{path, ErrorCode, ErrorReply};

use crate::pmap::PMap;
use crate::{err, Outcome, StateMachine, Trigger};

/// The longest lock-delay a lock may have: ten minutes.
pub const MAX_LOCK_DELAY_MS: u32 = 600_000;

/// Lock-delays and the tombstones they keep.
#[derive(Clone, Debug, Default)]
pub(crate) struct Delays {
    /// Lock (queue) path, with its delay in ms.
    locks: PMap<Arc<str>, u32>,
    /// Tombstone path, with the time (ms) it is due for deletion.
    tombstones: PMap<Arc<str>, u64>,
}

impl Delays {
    pub(crate) fn is_empty(&self) -> bool {
        self.locks.is_empty() && self.tombstones.is_empty()
    }

    /// The node at `path` is gone: whatever it kept goes with it.
    pub(crate) fn forget(&mut self, path: &str) {
        self.locks.remove(path);
        self.tombstones.remove(path);
    }

    /// Restores a node's entries from a snapshot.
    pub(crate) fn restore(&mut self, path: &Arc<str>, delay_ms: u32, tombstone_until: u64) {
        if delay_ms > 0 {
            self.locks.insert(path.clone(), delay_ms);
        }
        if tombstone_until > 0 {
            self.tombstones.insert(path.clone(), tombstone_until);
        }
    }
}

impl StateMachine {
    /// The lock-delay of the lock at `path`, in ms, if it has one.
    pub fn lock_delay(&self, path: &str) -> Option<u32> {
        self.delays.locks.get(path).copied()
    }

    /// When the tombstone at `path` is due for deletion (ms), if the node
    /// there is one.
    pub fn tombstone_until(&self, path: &str) -> Option<u64> {
        self.delays.tombstones.get(path).copied()
    }

    /// Every tombstone, with the time it is due.
    pub fn tombstones(&self) -> impl Iterator<Item = (&Arc<str>, u64)> {
        self.delays.tombstones.iter().map(|(p, t)| (p, *t))
    }

    pub(crate) fn set_lock_delay(
        &mut self,
        target: &str,
        delay_ms: u32,
    ) -> Result<Outcome, ErrorReply> {
        if target == "/" {
            return Err(err(
                ErrorCode::BadArguments,
                "the root cannot be a lock; give the lock's own node".into(),
            ));
        }
        if delay_ms > MAX_LOCK_DELAY_MS {
            return Err(err(
                ErrorCode::BadArguments,
                format!("a lock-delay of {delay_ms} ms is longer than the most allowed, {MAX_LOCK_DELAY_MS} ms"),
            ));
        }
        let Some((key, _)) = self.nodes.get_key_value(target) else {
            return Err(err(ErrorCode::NoNode, format!("{target} does not exist")));
        };
        let key = key.clone();
        self.revision += 1;
        if delay_ms == 0 {
            self.delays.locks.remove(target);
        } else {
            self.delays.locks.insert(key, delay_ms);
        }
        Ok(Outcome::LockDelaySet)
    }

    pub(crate) fn delete_tombstone(
        &mut self,
        target: &str,
        triggers: &mut Vec<Trigger>,
    ) -> Result<Outcome, ErrorReply> {
        let Some((key, _)) = self.delays.tombstones.get_key_value(target) else {
            return Err(err(
                ErrorCode::NoNode,
                format!("{target} is not a lock-delay tombstone (deleted already?)"),
            ));
        };
        let key = key.clone();
        self.revision += 1;
        self.unlink(&key, triggers);
        Ok(Outcome::Deleted)
    }

    /// Of the nodes of a session that expired at `now_ms`, those to keep as
    /// tombstones (each heads a queue that has a lock-delay), made so; the
    /// others are left in `nodes` to delete.
    pub(crate) fn keep_tombstones(&mut self, nodes: &mut Vec<Arc<str>>, now_ms: u64) {
        if self.delays.locks.is_empty() {
            return;
        }
        let kept: Vec<(Arc<str>, u32)> = nodes
            .iter()
            .filter_map(|p| {
                let delay = self.delays.locks.get(path::parent(p)?)?;
                let heads = self.standing(p).ok()?.heads();
                heads.then(|| (p.clone(), *delay))
            })
            .collect();
        for (p, delay) in &kept {
            if let Some(node) = self.nodes.get_mut(&**p) {
                node.disown();
            }
            self.delays
                .tombstones
                .insert(p.clone(), now_ms.saturating_add(u64::from(*delay)));
        }
        nodes.retain(|p| !kept.iter().any(|(k, _)| k == p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use baton_proto::{CreateMode, QueueRule, SessionId, SessionSecret};
    use bytes::Bytes;

    fn open(sm: &mut StateMachine) -> SessionId {
        match sm
            .apply(
                &Command::OpenSession {
                    timeout_ms: 1000,
                    secret: SessionSecret([1; 16]),
                },
                0,
            )
            .result
        {
            Ok(Outcome::SessionOpened(id)) => id,
            other => panic!("{other:?}"),
        }
    }

    fn join(sm: &mut StateMachine, s: SessionId) -> Arc<str> {
        match sm
            .apply(
                &Command::Enqueue {
                    session: s,
                    path: "/l/lock-".into(),
                    data: Bytes::new(),
                    rule: QueueRule::Exclusive,
                },
                0,
            )
            .result
        {
            Ok(Outcome::Enqueued { path, .. }) => path,
            other => panic!("{other:?}"),
        }
    }

    fn snapshot_round_trip(sm: &StateMachine) -> StateMachine {
        let mut bytes = std::io::Cursor::new(Vec::new());
        crate::format::snapshot::encode(sm, &mut bytes).unwrap();
        crate::format::snapshot::decode(bytes.get_ref()).unwrap()
    }

    #[test]
    fn an_expired_holder_of_a_delayed_lock_stays_as_a_tombstone_until_it_is_deleted() {
        let mut sm = StateMachine::new();
        let (a, b, c) = (open(&mut sm), open(&mut sm), open(&mut sm));
        sm.apply(
            &Command::Create {
                session: a,
                path: "/l".into(),
                data: Bytes::new(),
                mode: CreateMode::Persistent,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            },
            0,
        );
        let set = sm.apply(
            &Command::SetLockDelay {
                path: "/l".into(),
                delay_ms: 5_000,
            },
            0,
        );
        assert_eq!(set.result, Ok(Outcome::LockDelaySet));
        let (held, waits, later) = (join(&mut sm, a), join(&mut sm, b), join(&mut sm, c));
        // The waiter in the middle expires: it held nothing, so it goes.
        let ended = sm.apply(&Command::ExpireSession { session: b }, 1_000);
        assert_eq!(
            ended.result,
            Ok(Outcome::SessionEnded {
                deleted: vec![waits.clone()]
            })
        );
        // The holder expires: its node stays, owned by nobody, due at 7,000.
        let ended = sm.apply(&Command::ExpireSession { session: a }, 2_000);
        assert_eq!(ended.result, Ok(Outcome::SessionEnded { deleted: vec![] }));
        assert!(ended.triggers.is_empty(), "{:?}", ended.triggers);
        assert_eq!(sm.node(&held).unwrap().owner(), None);
        assert_eq!(sm.tombstone_until(&held), Some(7_000));
        assert!(!sm.standing(&later).unwrap().heads(), "the next waits");
        // A snapshot keeps both.
        let copy = snapshot_round_trip(&sm);
        assert_eq!(copy.tombstone_until(&held), Some(7_000));
        assert_eq!(copy.lock_delay("/l"), Some(5_000));
        // Deleted when due: the next heads.
        let gone = sm.apply(
            &Command::DeleteTombstone {
                path: held.to_string(),
            },
            7_000,
        );
        assert_eq!(gone.result, Ok(Outcome::Deleted));
        assert!(sm.standing(&later).unwrap().heads());
        assert_eq!(sm.tombstones().count(), 0);
        // A second delete of it is refused; a holder whose session is
        // closed leaves no tombstone.
        let again = sm.apply(
            &Command::DeleteTombstone {
                path: held.to_string(),
            },
            7_000,
        );
        assert_eq!(again.result.unwrap_err().code, ErrorCode::NoNode);
        let ended = sm.apply(&Command::CloseSession { session: c }, 8_000);
        assert_eq!(
            ended.result,
            Ok(Outcome::SessionEnded {
                deleted: vec![later]
            })
        );
    }

    #[test]
    fn a_lock_delay_is_checked_and_goes_with_its_node() {
        let mut sm = StateMachine::new();
        let s = open(&mut sm);
        let delay = |sm: &mut StateMachine, path: &str, delay_ms| {
            sm.apply(
                &Command::SetLockDelay {
                    path: path.into(),
                    delay_ms,
                },
                0,
            )
            .result
        };
        assert_eq!(
            delay(&mut sm, "/", 10).unwrap_err().code,
            ErrorCode::BadArguments
        );
        assert_eq!(
            delay(&mut sm, "/x", 10).unwrap_err().code,
            ErrorCode::NoNode
        );
        sm.apply(
            &Command::Create {
                session: s,
                path: "/x".into(),
                data: Bytes::new(),
                mode: CreateMode::Persistent,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            },
            0,
        );
        assert_eq!(
            delay(&mut sm, "/x", MAX_LOCK_DELAY_MS + 1)
                .unwrap_err()
                .code,
            ErrorCode::BadArguments
        );
        delay(&mut sm, "/x", 10).unwrap();
        assert_eq!(sm.lock_delay("/x"), Some(10));
        delay(&mut sm, "/x", 0).unwrap();
        assert_eq!(sm.lock_delay("/x"), None);
        delay(&mut sm, "/x", 10).unwrap();
        sm.apply(
            &Command::Delete {
                path: "/x".into(),
                version: None,
                fence: None,
            },
            0,
        )
        .result
        .unwrap();
        assert_eq!(sm.lock_delay("/x"), None);
    }
}
