//! Transactions: operations applied in order, all or none.

use baton_proto::{Check, ErrorCode, ErrorReply, SessionId, TxnOp};

use crate::change::{check_fence, check_version};
use crate::{err, Outcome, StateMachine, Trigger};

impl StateMachine {
    /// Applies `ops` in order as one change: one record in the log, one
    /// entry in a replicated log, one answer, its events sent together. Each
    /// operation that changes the tree takes the next revision, as it would
    /// outside a transaction, so every node created has a creation revision
    /// of its own (its fencing token, and its place in its parent's
    /// creation order). No one sees a revision inside the transaction: the
    /// state moves from before it to after it. If any operation fails, the
    /// state is put back exactly as it was (nodes, fences, sessions, the
    /// revision and so every sequence counter) and the outcome names the
    /// failing operation.
    pub(crate) fn multi(
        &mut self,
        session: SessionId,
        ops: &[TxnOp],
        now_ms: u64,
        triggers: &mut Vec<Trigger>,
    ) -> Outcome {
        // O(1): the tree's nodes are shared until one of the operations
        // changes them, and then only the path to what it changes is copied.
        let saved = self.clone();
        let mut fired = Vec::new();
        let mut outcomes = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let result = match op {
                TxnOp::Create {
                    path,
                    data,
                    mode,
                    fence,
                    acl,
                } => self.create(
                    session,
                    path,
                    data,
                    (*mode, crate::queue::QueueRule::Exclusive, acl),
                    *fence,
                    now_ms,
                    &mut fired,
                ),
                TxnOp::Delete {
                    path,
                    version,
                    fence,
                } => self.delete(path, *version, *fence, &mut fired),
                TxnOp::SetData {
                    path,
                    data,
                    version,
                    fence,
                } => self.set_data(path, data, *version, *fence, now_ms, &mut fired),
                TxnOp::Check { path, check } => self.check(path, *check).map(|()| Outcome::Checked),
            };
            match result {
                Ok(outcome) => outcomes.push(outcome),
                Err(error) => {
                    *self = saved;
                    return Outcome::MultiFailed {
                        index: index as u32,
                        error,
                    };
                }
            }
        }
        triggers.append(&mut fired);
        Outcome::Multi(outcomes)
    }

    /// Whether `check` holds of the node at `path` now.
    fn check(&self, path: &str, check: Check) -> Result<(), ErrorReply> {
        let node = self.nodes.get(path);
        match (check, node) {
            (Check::Absent, None) => Ok(()),
            (Check::Absent, Some(_)) => Err(err(ErrorCode::NodeExists, format!("{path} exists"))),
            (_, None) => Err(err(ErrorCode::NoNode, format!("{path} does not exist"))),
            (Check::Exists, Some(_)) => Ok(()),
            (Check::Version(version), Some(node)) => check_version(path, node, Some(version)),
            (Check::Fence(token), Some(node)) => check_fence(path, node, Some(token)),
            (Check::Holder(token), Some(node)) => match node.child_created_at(token) {
                Some(_) => Ok(()),
                None => Err(err(
                    ErrorCode::StaleFence,
                    format!("fencing token {token} no longer holds {path}: no child of it created at revision {token} is left"),
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Cursor;

    use baton_proto::{CreateMode, EventKind, SessionSecret, TxnOp};
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::format::{record, snapshot};
    use crate::{Command, Origin, Proposal};

    fn open(sm: &mut StateMachine) -> SessionId {
        match sm.apply(
            &Command::OpenSession {
                timeout_ms: 1000,
                secret: SessionSecret([1; 16]),
            },
            0,
        ) {
            crate::Applied {
                result: Ok(Outcome::SessionOpened(id)),
                ..
            } => id,
            other => panic!("{other:?}"),
        }
    }

    fn create(path: &str, mode: CreateMode) -> TxnOp {
        TxnOp::Create {
            path: path.into(),
            data: Bytes::from_static(b"c"),
            mode,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        }
    }

    fn set(path: &str, data: &'static [u8], fence: Option<u64>) -> TxnOp {
        TxnOp::SetData {
            path: path.into(),
            data: Bytes::from_static(data),
            version: None,
            fence,
        }
    }

    fn check(path: &str, check: Check) -> TxnOp {
        TxnOp::Check {
            path: path.into(),
            check,
        }
    }

    fn multi(sm: &mut StateMachine, session: SessionId, ops: Vec<TxnOp>) -> crate::Applied {
        sm.apply(&Command::Multi { session, ops }, 10)
    }

    fn image(sm: &StateMachine) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        snapshot::encode(sm, &mut out).unwrap();
        out.into_inner()
    }

    /// A tree with /q (a queue), /f (fenced at 40) and /x.
    fn tree() -> (StateMachine, SessionId) {
        let mut sm = StateMachine::new();
        let s = open(&mut sm);
        let setup = vec![
            create("/q", CreateMode::Persistent),
            create("/f", CreateMode::Persistent),
            create("/x", CreateMode::Persistent),
            set("/f", b"f", Some(40)),
        ];
        assert!(matches!(
            multi(&mut sm, s, setup).result,
            Ok(Outcome::Multi(_))
        ));
        (sm, s)
    }

    #[test]
    fn a_transaction_applies_every_operation_as_one_change() {
        let (mut sm, s) = tree();
        let before = sm.revision();
        let applied = multi(
            &mut sm,
            s,
            vec![
                check("/x", Check::Version(0)),
                create("/x/a", CreateMode::Persistent),
                set("/x", b"new", Some(41)),
                check("/f", Check::Fence(40)),
                TxnOp::Delete {
                    path: "/x/a".into(),
                    version: Some(0),
                    fence: None,
                },
                check("/x/a", Check::Absent),
            ],
        );
        // Three operations change the tree: three revisions, one change.
        assert!(applied.changed);
        assert_eq!(applied.revision, before + 3);
        let Ok(Outcome::Multi(outcomes)) = applied.result else {
            panic!("{:?}", applied.result)
        };
        assert_eq!(outcomes.len(), 6);
        assert!(matches!(outcomes[0], Outcome::Checked));
        let Outcome::Created { stat, .. } = &outcomes[1] else {
            panic!("{outcomes:?}")
        };
        assert_eq!(stat.czxid, before + 1);
        let Outcome::DataSet(stat) = &outcomes[2] else {
            panic!("{outcomes:?}")
        };
        assert_eq!((stat.mzxid, stat.version), (before + 2, 1));
        assert!(matches!(outcomes[4], Outcome::Deleted));
        let x = sm.node("/x").unwrap();
        assert_eq!((x.data().as_ref(), x.fence()), (&b"new"[..], 41));
        assert_eq!(x.pzxid(), before + 3);
        // Every event, in the operations' order.
        let kinds: Vec<_> = applied
            .triggers
            .iter()
            .map(|t| (t.kind, t.path.to_string()))
            .collect();
        assert_eq!(
            kinds,
            [
                (EventKind::Created, "/x/a".to_string()),
                (EventKind::ChildrenChanged, "/x".into()),
                (EventKind::DataChanged, "/x".into()),
                (EventKind::Deleted, "/x/a".into()),
                (EventKind::ChildrenChanged, "/x".into()),
            ]
        );
    }

    #[test]
    fn a_transaction_that_fails_in_its_last_operation_changes_nothing() {
        let (mut sm, s) = tree();
        let before = image(&sm);
        let revision = sm.revision();
        let applied = multi(
            &mut sm,
            s,
            vec![
                create("/q/n-", CreateMode::EphemeralSequential),
                set("/f", b"late", Some(90)),
                TxnOp::Delete {
                    path: "/x".into(),
                    version: None,
                    fence: None,
                },
                create("/new", CreateMode::Persistent),
                check("/f", Check::Version(7)),
            ],
        );
        assert!(!applied.changed);
        assert!(applied.triggers.is_empty());
        assert_eq!(applied.revision, revision);
        let Ok(Outcome::MultiFailed { index, error }) = applied.result else {
            panic!("{:?}", applied.result)
        };
        assert_eq!((index, error.code), (4, ErrorCode::BadVersion));
        // Not a fence, not a sequence counter, not a byte of data moved.
        assert_eq!(image(&sm), before);
        assert_eq!(sm.node("/f").unwrap().fence(), 40);
        let Ok(Outcome::Multi(outcomes)) = multi(
            &mut sm,
            s,
            vec![create("/q/n-", CreateMode::EphemeralSequential)],
        )
        .result
        else {
            panic!()
        };
        assert!(
            matches!(&outcomes[0], Outcome::Created { sequence: Some(seq), .. } if *seq == revision + 1)
        );
    }

    #[test]
    fn sequential_creates_in_one_transaction_get_distinct_names_in_order() {
        let (mut sm, s) = tree();
        let before = sm.revision();
        let ops = (0..3)
            .map(|_| create("/q/n-", CreateMode::EphemeralSequential))
            .chain([create("/x/s-", CreateMode::PersistentSequential)])
            .collect();
        let applied = multi(&mut sm, s, ops);
        let Ok(Outcome::Multi(outcomes)) = applied.result else {
            panic!("{:?}", applied.result)
        };
        let created: Vec<(String, u64, u64)> = outcomes
            .iter()
            .map(|o| match o {
                Outcome::Created {
                    path,
                    sequence: Some(seq),
                    stat,
                } => (path.to_string(), *seq, stat.czxid),
                other => panic!("{other:?}"),
            })
            .collect();
        let r = before + 1;
        assert_eq!(
            created,
            [
                (format!("/q/n-{r:010}"), r, r),
                (format!("/q/n-{:010}", r + 1), r + 1, r + 1),
                (format!("/q/n-{:010}", r + 2), r + 2, r + 2),
                (format!("/x/s-{:010}", r + 3), r + 3, r + 3),
            ]
        );
        // What comes next is above every sequence number it handed out.
        assert_eq!(applied.revision, r + 3);
        let next = sm.apply(
            &Command::Create {
                session: s,
                path: "/q/n-".into(),
                data: Bytes::new(),
                mode: CreateMode::EphemeralSequential,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            },
            20,
        );
        assert!(
            matches!(next.result, Ok(Outcome::Created { sequence: Some(seq), .. }) if seq == r + 4)
        );
    }

    #[test]
    fn fences_only_rise_inside_a_transaction() {
        let (mut sm, s) = tree();
        let applied = multi(
            &mut sm,
            s,
            vec![set("/f", b"a", Some(50)), set("/f", b"b", Some(45))],
        );
        let Ok(Outcome::MultiFailed { index: 1, error }) = applied.result else {
            panic!("{:?}", applied.result)
        };
        assert_eq!(error.code, ErrorCode::StaleFence);
        assert_eq!(sm.node("/f").unwrap().fence(), 40);
        // An equal token passes, as outside a transaction; a check raises
        // nothing.
        let applied = multi(
            &mut sm,
            s,
            vec![
                check("/f", Check::Fence(40)),
                set("/f", b"a", Some(50)),
                set("/f", b"b", Some(50)),
                check("/f", Check::Fence(50)),
            ],
        );
        assert!(matches!(applied.result, Ok(Outcome::Multi(_))));
        assert_eq!(sm.node("/f").unwrap().fence(), 50);
        let applied = multi(&mut sm, s, vec![check("/f", Check::Fence(49))]);
        assert!(matches!(
            applied.result,
            Ok(Outcome::MultiFailed { index: 0, .. })
        ));
    }

    #[test]
    fn a_holder_check_passes_while_the_token_s_node_is_left() {
        let (mut sm, s) = tree();
        let Ok(Outcome::Multi(outcomes)) = multi(
            &mut sm,
            s,
            vec![create("/q/n-", CreateMode::EphemeralSequential)],
        )
        .result
        else {
            panic!()
        };
        let Outcome::Created { path, stat, .. } = &outcomes[0] else {
            panic!()
        };
        let token = stat.czxid;
        let holds = |sm: &mut StateMachine| {
            matches!(
                multi(sm, s, vec![check("/q", Check::Holder(token))]).result,
                Ok(Outcome::Multi(_))
            )
        };
        assert!(holds(&mut sm));
        let deleted = multi(
            &mut sm,
            s,
            vec![TxnOp::Delete {
                path: path.to_string(),
                version: None,
                fence: None,
            }],
        );
        assert!(matches!(deleted.result, Ok(Outcome::Multi(_))));
        assert!(!holds(&mut sm));
    }

    #[test]
    fn a_resent_transaction_gets_its_first_answer_and_is_not_applied_twice() {
        let (mut sm, s) = tree();
        let propose = |sm: &mut StateMachine, xid: u32, ops: Vec<TxnOp>| {
            sm.apply_proposal(&Proposal {
                now_ms: 30,
                origin: Some(Origin { session: s, xid }),
                command: Command::Multi { session: s, ops },
            })
        };
        let ops = vec![create("/q/n-", CreateMode::EphemeralSequential)];
        let first = propose(&mut sm, 7, ops.clone());
        let again = propose(&mut sm, 7, ops);
        assert!(first.changed && !again.changed);
        assert_eq!(first.result, again.result);
        assert_eq!(sm.node("/q").unwrap().child_count(), 1);
        // A failed transaction is kept as a refusal is, and survives a
        // snapshot like the committed one.
        let failed = propose(&mut sm, 8, vec![check("/nothing", Check::Exists)]);
        assert!(matches!(
            failed.result,
            Ok(Outcome::MultiFailed { index: 0, .. })
        ));
        let restored = snapshot::decode(&image(&sm)).unwrap();
        assert_eq!(
            restored.session(s).unwrap().last_reply(s).unwrap().reply,
            failed.result
        );
        let mut sm2 = restored;
        let again = propose(&mut sm2, 8, vec![]);
        assert_eq!(again.result, failed.result);
        let committed = snapshot::decode(&{
            let mut sm3 = sm.clone();
            propose(
                &mut sm3,
                9,
                vec![
                    check("/q", Check::Exists),
                    create("/x/y", CreateMode::Persistent),
                ],
            );
            image(&sm3)
        })
        .unwrap();
        let kept = committed.session(s).unwrap().last_reply(s).unwrap().reply;
        assert!(
            matches!(kept, Ok(Outcome::Multi(ref o)) if o.len() == 2),
            "{kept:?}"
        );
    }

    #[test]
    fn a_transaction_survives_the_log_record_format() {
        let proposal = Proposal {
            now_ms: 5,
            origin: Some(Origin {
                session: SessionId(3),
                xid: 9,
            }),
            command: Command::Multi {
                session: SessionId(3),
                ops: vec![
                    create("/a-", CreateMode::PersistentSequential),
                    set("/b", b"x", Some(4)),
                    check("/c", Check::Holder(8)),
                ],
            },
        };
        let mut out = Vec::new();
        record::encode_proposal(&mut out, &proposal);
        assert_eq!(record::decode_proposal(&out).unwrap(), proposal);
    }

    /// A model of the tree: persistent nodes with data and version.
    #[derive(Clone, Debug, Default)]
    struct Model(BTreeMap<String, (Vec<u8>, u32)>);

    impl Model {
        fn apply(&mut self, op: &TxnOp) -> Result<(), ErrorCode> {
            let parent = |p: &str| match p.rfind('/') {
                Some(0) => "/".to_string(),
                Some(i) => p[..i].to_string(),
                None => unreachable!(),
            };
            let has = |m: &Model, p: &str| p == "/" || m.0.contains_key(p);
            match op {
                TxnOp::Create { path, data, .. } => {
                    if has(self, path) {
                        return Err(ErrorCode::NodeExists);
                    }
                    if !has(self, &parent(path)) {
                        return Err(ErrorCode::NoNode);
                    }
                    self.0.insert(path.clone(), (data.to_vec(), 0));
                }
                TxnOp::Delete { path, version, .. } => {
                    let Some((_, v)) = self.0.get(path) else {
                        return Err(ErrorCode::NoNode);
                    };
                    if version.is_some_and(|e| e != *v) {
                        return Err(ErrorCode::BadVersion);
                    }
                    let prefix = format!("{path}/");
                    if self.0.keys().any(|k| k.starts_with(&prefix)) {
                        return Err(ErrorCode::NotEmpty);
                    }
                    self.0.remove(path);
                }
                TxnOp::SetData {
                    path,
                    data,
                    version,
                    ..
                } => {
                    let Some((d, v)) = self.0.get_mut(path) else {
                        return Err(ErrorCode::NoNode);
                    };
                    if version.is_some_and(|e| e != *v) {
                        return Err(ErrorCode::BadVersion);
                    }
                    *d = data.to_vec();
                    *v += 1;
                }
                TxnOp::Check { path, check } => match (check, self.0.get(path)) {
                    (Check::Absent, None) => {}
                    (Check::Absent, Some(_)) => return Err(ErrorCode::NodeExists),
                    (_, None) => return Err(ErrorCode::NoNode),
                    (Check::Version(e), Some((_, v))) if e != v => {
                        return Err(ErrorCode::BadVersion)
                    }
                    _ => {}
                },
            }
            Ok(())
        }
    }

    fn op() -> impl Strategy<Value = TxnOp> {
        let path = prop::sample::select(vec!["/a", "/b", "/a/c", "/a/d", "/b/e"]);
        let data = prop::collection::vec(any::<u8>(), 0..3).prop_map(Bytes::from);
        let version = prop::option::of(0u32..3);
        prop_oneof![
            (path.clone(), data.clone()).prop_map(|(p, data)| TxnOp::Create {
                path: p.into(),
                data,
                mode: CreateMode::Persistent,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            }),
            (path.clone(), version.clone()).prop_map(|(p, version)| TxnOp::Delete {
                path: p.into(),
                version,
                fence: None,
            }),
            (path.clone(), data, version).prop_map(|(p, data, version)| TxnOp::SetData {
                path: p.into(),
                data,
                version,
                fence: None,
            }),
            (path, 0u8..3, 0u32..3).prop_map(|(p, kind, v)| TxnOp::Check {
                path: p.into(),
                check: [Check::Exists, Check::Absent, Check::Version(v)][usize::from(kind)],
            }),
        ]
    }

    proptest! {
        /// Transactions against a model of the tree: each is applied whole
        /// or not at all, fails at the operation the model fails at, with
        /// its code, and leaves the same tree.
        #[test]
        fn transactions_match_a_model_of_the_tree(
            txns in prop::collection::vec(prop::collection::vec(op(), 0..6), 1..12)
        ) {
            let mut sm = StateMachine::new();
            let s = open(&mut sm);
            let mut model = Model::default();
            for ops in txns {
                let mut next = model.clone();
                let expected = ops
                    .iter()
                    .enumerate()
                    .find_map(|(i, op)| next.apply(op).err().map(|code| (i as u32, code)));
                let revision = sm.revision();
                let applied = multi(&mut sm, s, ops.clone());
                match (expected, applied.result) {
                    (None, Ok(Outcome::Multi(outcomes))) => {
                        prop_assert_eq!(outcomes.len(), ops.len());
                        model = next;
                        let changes = ops.iter().filter(|op| !matches!(op, TxnOp::Check { .. }));
                        prop_assert_eq!(applied.revision, revision + changes.count() as u64);
                    }
                    (Some((index, code)), Ok(Outcome::MultiFailed { index: i, error })) => {
                        prop_assert_eq!((i, error.code), (index, code));
                        prop_assert_eq!(applied.revision, revision);
                    }
                    (expected, got) => prop_assert!(false, "model {:?}, state machine {:?}", expected, got),
                }
                let tree: BTreeMap<String, (Vec<u8>, u32)> = sm
                    .nodes_parent_first()
                    .filter(|n| n.path != "/")
                    .map(|n| (n.path.clone(), (n.data.to_vec(), n.version)))
                    .collect();
                prop_assert_eq!(&tree, &model.0);
            }
        }
    }
}
