use super::*;
use baton_proto::{EventKind, Stat};
use bytes::Bytes;

fn open(sm: &mut StateMachine) -> SessionId {
    match sm
        .apply(
            &Command::OpenSession {
                timeout_ms: 1000,
                secret: SessionSecret([7; 16]),
            },
            0,
        )
        .result
    {
        Ok(Outcome::SessionOpened(id)) => id,
        other => panic!("{other:?}"),
    }
}

fn create(sm: &mut StateMachine, session: SessionId, path: &str, mode: CreateMode) -> Applied {
    sm.apply(
        &Command::Create {
            session,
            path: path.into(),
            data: Bytes::from_static(b"d"),
            mode,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        },
        5,
    )
}

fn created_path(applied: Applied) -> (String, Option<u64>) {
    match applied.result {
        Ok(Outcome::Created { path, sequence, .. }) => (path.to_string(), sequence),
        other => panic!("{other:?}"),
    }
}

fn code(applied: Applied) -> ErrorCode {
    applied.result.expect_err("command should fail").code
}

#[test]
fn create_needs_an_existing_non_ephemeral_parent() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    assert_eq!(
        code(create(&mut sm, s, "/a/b", CreateMode::Persistent)),
        ErrorCode::NoNode
    );
    create(&mut sm, s, "/e", CreateMode::Ephemeral)
        .result
        .unwrap();
    assert_eq!(
        code(create(&mut sm, s, "/e/x", CreateMode::Persistent)),
        ErrorCode::NoChildrenForEphemerals
    );
    assert_eq!(
        code(create(&mut sm, s, "/e", CreateMode::Persistent)),
        ErrorCode::NodeExists
    );
    assert_eq!(
        code(create(&mut sm, s, "/", CreateMode::Persistent)),
        ErrorCode::NodeExists
    );
}

#[test]
fn failed_commands_change_nothing() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    let before = sm.revision();
    let applied = create(&mut sm, s, "/missing/child", CreateMode::Persistent);
    assert!(applied.triggers.is_empty());
    assert_eq!(applied.revision, before);
    assert_eq!(sm.revision(), before);
    assert_eq!(sm.node_count(), 1);
}

#[test]
fn sequence_numbers_grow_across_delete_and_recreate_of_the_parent() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    let mut last = 0;
    for _round in 0..3 {
        create(&mut sm, s, "/lock", CreateMode::Persistent)
            .result
            .unwrap();
        let mut made = Vec::new();
        for _ in 0..5 {
            let (path, seq) = created_path(create(
                &mut sm,
                s,
                "/lock/n-",
                CreateMode::EphemeralSequential,
            ));
            let seq = seq.unwrap();
            assert!(seq > last, "{seq} after {last}");
            assert_eq!(path, format!("/lock/n-{seq:010}"));
            assert_eq!(path::parse_sequence(path::name(&path), "n-"), Some(seq));
            last = seq;
            made.push(path);
        }
        for p in made {
            sm.apply(
                &Command::Delete {
                    path: p,
                    version: None,
                    fence: None,
                },
                0,
            )
            .result
            .unwrap();
        }
        sm.apply(
            &Command::Delete {
                path: "/lock".into(),
                version: None,
                fence: None,
            },
            0,
        )
        .result
        .unwrap();
    }
}

#[test]
fn ending_a_session_deletes_its_ephemerals_in_one_revision() {
    let mut sm = StateMachine::new();
    let a = open(&mut sm);
    let b = open(&mut sm);
    create(&mut sm, a, "/q", CreateMode::Persistent)
        .result
        .unwrap();
    create(&mut sm, a, "/q/a1", CreateMode::Ephemeral)
        .result
        .unwrap();
    create(&mut sm, a, "/q/a2", CreateMode::Ephemeral)
        .result
        .unwrap();
    create(&mut sm, b, "/q/b1", CreateMode::Ephemeral)
        .result
        .unwrap();
    let before = sm.revision();
    let applied = sm.apply(&Command::ExpireSession { session: a }, 0);
    assert_eq!(applied.revision, before + 1);
    match applied.result {
        Ok(Outcome::SessionEnded { deleted }) => {
            assert_eq!(deleted, vec![Arc::from("/q/a1"), Arc::from("/q/a2")])
        }
        other => panic!("{other:?}"),
    }
    let deleted: Vec<_> = applied
        .triggers
        .iter()
        .filter(|t| t.kind == EventKind::Deleted)
        .map(|t| t.path.to_string())
        .collect();
    assert_eq!(deleted, ["/q/a1", "/q/a2"]);
    assert!(sm.node("/q/a1").is_none() && sm.node("/q/a2").is_none());
    assert!(sm.node("/q/b1").is_some());
    assert_eq!(sm.node("/q").unwrap().pzxid, before + 1);
    assert!(sm.session(a).is_none());
    // A second end of the same session is an error and changes nothing.
    assert_eq!(
        code(sm.apply(&Command::CloseSession { session: a }, 0)),
        ErrorCode::SessionExpired
    );
    // An ended session cannot create ephemerals.
    assert_eq!(
        code(create(&mut sm, a, "/q/late", CreateMode::Ephemeral)),
        ErrorCode::SessionExpired
    );
}

#[test]
fn versions_are_checked_and_counted() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/v", CreateMode::Persistent)
        .result
        .unwrap();
    let set = |sm: &mut StateMachine, version| {
        sm.apply(
            &Command::SetData {
                path: "/v".into(),
                data: Bytes::from_static(b"new"),
                version,
                fence: None,
            },
            9,
        )
    };
    assert_eq!(code(set(&mut sm, Some(3))), ErrorCode::BadVersion);
    let stat = match set(&mut sm, Some(0)).result {
        Ok(Outcome::DataSet(stat)) => stat,
        other => panic!("{other:?}"),
    };
    assert_eq!((stat.version, stat.data_length, stat.mtime), (1, 3, 9));
    assert_eq!(stat.mzxid, sm.revision());
    assert_eq!(
        code(sm.apply(
            &Command::Delete {
                path: "/v".into(),
                version: Some(0),
                fence: None
            },
            0
        )),
        ErrorCode::BadVersion
    );
    sm.apply(
        &Command::Delete {
            path: "/v".into(),
            version: Some(1),
            fence: None,
        },
        0,
    )
    .result
    .unwrap();
}

#[test]
fn delete_refuses_root_missing_and_non_empty() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/p", CreateMode::Persistent)
        .result
        .unwrap();
    create(&mut sm, s, "/p/c", CreateMode::Persistent)
        .result
        .unwrap();
    let del = |sm: &mut StateMachine, p: &str| {
        sm.apply(
            &Command::Delete {
                path: p.into(),
                version: None,
                fence: None,
            },
            0,
        )
    };
    assert_eq!(code(del(&mut sm, "/")), ErrorCode::BadArguments);
    assert_eq!(code(del(&mut sm, "/nope")), ErrorCode::NoNode);
    assert_eq!(code(del(&mut sm, "/p")), ErrorCode::NotEmpty);
    let applied = del(&mut sm, "/p/c");
    assert_eq!(
        applied.triggers,
        vec![
            Trigger {
                kind: EventKind::Deleted,
                path: "/p/c".into()
            },
            Trigger {
                kind: EventKind::ChildrenChanged,
                path: "/p".into()
            },
        ]
    );
    del(&mut sm, "/p").result.unwrap();
}

#[test]
fn explicit_delete_of_an_ephemeral_forgets_it_in_the_session() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    let (p, _) = created_path(create(&mut sm, s, "/e-", CreateMode::EphemeralSequential));
    assert!(sm.session(s).unwrap().ephemerals.contains(p.as_str()));
    sm.apply(
        &Command::Delete {
            path: p.clone(),
            version: None,
            fence: None,
        },
        0,
    )
    .result
    .unwrap();
    assert!(sm.session(s).unwrap().ephemerals.is_empty());
}

#[test]
fn children_are_listed_in_name_order() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    for p in ["/b", "/a", "/c", "/a/z", "/a/y"] {
        create(&mut sm, s, p, CreateMode::Persistent)
            .result
            .unwrap();
    }
    assert_eq!(sm.node("/").unwrap().child_names(), ["a", "b", "c"]);
    assert_eq!(sm.node("/a").unwrap().child_names(), ["y", "z"]);
    assert_eq!(sm.node("/a").unwrap().stat().num_children, 2);
}

fn fenced_set(sm: &mut StateMachine, path: &str, token: u64) -> Applied {
    sm.apply(
        &Command::SetData {
            path: path.into(),
            data: Bytes::from(token.to_string()),
            version: None,
            fence: Some(token),
        },
        0,
    )
}

#[test]
fn fenced_writes_accept_equal_and_higher_tokens_and_refuse_lower_ones() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/r", CreateMode::Persistent)
        .result
        .unwrap();
    fenced_set(&mut sm, "/r", 5).result.unwrap();
    fenced_set(&mut sm, "/r", 5).result.unwrap();
    fenced_set(&mut sm, "/r", 9).result.unwrap();
    let before = sm.revision();
    let refused = fenced_set(&mut sm, "/r", 7);
    assert_eq!(sm.revision(), before, "a refused write changes nothing");
    let e = refused.result.unwrap_err();
    assert_eq!(e.code, ErrorCode::StaleFence);
    assert!(
        e.message.contains('7') && e.message.contains('9'),
        "{}",
        e.message
    );
    assert_eq!(sm.node("/r").unwrap().data(), Bytes::from_static(b"9"));
    assert_eq!(sm.node("/r").unwrap().fence(), 9);
    // An unfenced write neither checks nor lowers the fence.
    sm.apply(
        &Command::SetData {
            path: "/r".into(),
            data: Bytes::new(),
            version: None,
            fence: None,
        },
        0,
    )
    .result
    .unwrap();
    assert_eq!(sm.node("/r").unwrap().fence(), 9);
    // Delete is fenced by the node, create by the parent.
    let del = |sm: &mut StateMachine, token| {
        sm.apply(
            &Command::Delete {
                path: "/r".into(),
                version: None,
                fence: Some(token),
            },
            0,
        )
    };
    assert_eq!(code(del(&mut sm, 8)), ErrorCode::StaleFence);
    let child = |sm: &mut StateMachine, token| {
        sm.apply(
            &Command::Create {
                session: s,
                path: "/r/c".into(),
                data: Bytes::new(),
                mode: CreateMode::Persistent,
                fence: Some(token),
                acl: baton_proto::Acl::OPEN,
            },
            0,
        )
    };
    assert_eq!(code(child(&mut sm, 3)), ErrorCode::StaleFence);
    child(&mut sm, 10).result.unwrap();
    assert_eq!(sm.node("/r").unwrap().fence(), 10);
}

fn fenced(sm: &mut StateMachine, command: Command) -> Result<Outcome, ErrorCode> {
    sm.apply(&command, 0).result.map_err(|e| e.code)
}

fn fenced_create(s: SessionId, path: &str, token: Option<u64>) -> Command {
    Command::Create {
        session: s,
        path: path.into(),
        data: Bytes::new(),
        mode: CreateMode::Persistent,
        fence: token,
        acl: baton_proto::Acl::OPEN,
    }
}

/// A stale holder cannot undo a newer holder's fenced delete by creating
/// the resource again, nor write to a copy someone else re-created.
#[test]
fn a_fenced_delete_raises_the_fence_so_a_stale_holder_cannot_recreate() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/res", CreateMode::Persistent)
        .result
        .unwrap();
    fenced(&mut sm, fenced_create(s, "/res/n", Some(10))).unwrap();
    let delete = |token| Command::Delete {
        path: "/res/n".into(),
        version: None,
        fence: Some(token),
    };
    fenced(&mut sm, delete(20)).unwrap();
    assert_eq!(sm.node("/res").unwrap().fence(), 20);
    let before = sm.revision();
    assert_eq!(
        fenced(&mut sm, fenced_create(s, "/res/n", Some(15))),
        Err(ErrorCode::StaleFence)
    );
    assert_eq!(sm.revision(), before);
    assert!(sm.node("/res/n").is_none());
    // Re-created without a token, the node still refuses the stale holder.
    fenced(&mut sm, fenced_create(s, "/res/n", None)).unwrap();
    assert_eq!(sm.node("/res/n").unwrap().fence(), 20);
    assert_eq!(
        code(fenced_set(&mut sm, "/res/n", 15)),
        ErrorCode::StaleFence
    );
    // A stale holder cannot delete it either, nor a sibling.
    assert_eq!(fenced(&mut sm, delete(15)), Err(ErrorCode::StaleFence));
    fenced(&mut sm, fenced_create(s, "/res/m", Some(20))).unwrap();
    let delete_m = |token| Command::Delete {
        path: "/res/m".into(),
        version: None,
        fence: Some(token),
    };
    assert_eq!(fenced(&mut sm, delete_m(19)), Err(ErrorCode::StaleFence));
    // The current holder goes on.
    fenced_set(&mut sm, "/res/n", 20).result.unwrap();
    fenced(&mut sm, delete_m(21)).unwrap();
    assert_eq!(sm.node("/res").unwrap().fence(), 21);
}

/// A node named like the next sequence number does not block sequential
/// creates (nor a lock queue): they pass over the taken names.
#[test]
fn a_sequential_create_passes_over_names_someone_else_chose() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/q", CreateMode::Persistent)
        .result
        .unwrap();
    // Squat the names the next three revisions would give (each create
    // takes a revision itself, so aim past them).
    let next = sm.revision() + 1;
    for k in 3..6 {
        let name = format!("/q/lock-{}", path::sequence_suffix(next + k));
        create(&mut sm, s, &name, CreateMode::Persistent)
            .result
            .unwrap();
    }
    let before = sm.revision();
    assert_eq!(before, next + 2);
    for mode in [
        CreateMode::PersistentSequential,
        CreateMode::EphemeralSequential,
    ] {
        let (path, sequence) = created_path(create(&mut sm, s, "/q/lock-", mode));
        let sequence = sequence.unwrap();
        assert!(sequence > before, "{sequence} after {before}");
        assert_eq!(path, format!("/q/lock-{}", path::sequence_suffix(sequence)));
        assert_eq!(sm.node(&path).unwrap().czxid(), sequence);
        assert_eq!(sm.revision(), sequence);
    }
    assert_eq!(
        sm.revision(),
        next + 7,
        "passed over the three squatted names"
    );
}

#[test]
fn predecessor_is_the_sibling_created_just_before() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/l", CreateMode::Persistent)
        .result
        .unwrap();
    let nodes: Vec<String> = (0..4)
        .map(|_| created_path(create(&mut sm, s, "/l/n-", CreateMode::EphemeralSequential)).0)
        .collect();
    let pred = |sm: &StateMachine, p: &str| sm.predecessor(p).unwrap().map(|(p, _)| p.to_string());
    assert_eq!(pred(&sm, &nodes[0]), None);
    assert_eq!(pred(&sm, &nodes[2]), Some(nodes[1].clone()));
    sm.apply(
        &Command::Delete {
            path: nodes[1].clone(),
            version: None,
            fence: None,
        },
        0,
    )
    .result
    .unwrap();
    assert_eq!(pred(&sm, &nodes[2]), Some(nodes[0].clone()));
    assert_eq!(
        sm.predecessor("/l/none").unwrap_err().code,
        ErrorCode::NoNode
    );
    let token = sm.node(&nodes[3]).unwrap().czxid();
    let (found, _) = sm.child_created_at("/l", token).unwrap().unwrap();
    assert_eq!(&**found, nodes[3].as_str());
    assert!(sm.child_created_at("/l", token + 100).unwrap().is_none());
}

/// The standing of a queue's members under the exclusive rule: the first
/// heads, each other waits on the member just ahead of it, and a member that
/// leaves the middle hands its waiter on to the one ahead of it.
#[test]
fn in_an_exclusive_queue_the_first_heads_and_each_other_waits_on_the_one_ahead() {
    use crate::queue::Standing;
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/q", CreateMode::Persistent)
        .result
        .unwrap();
    let nodes: Vec<String> = (0..3)
        .map(|_| created_path(create(&mut sm, s, "/q/n-", CreateMode::EphemeralSequential)).0)
        .collect();
    let standing =
        |sm: &StateMachine, p: &str| sm.standing(p).unwrap().map(|(on, _)| on.to_string());
    assert_eq!(standing(&sm, &nodes[0]), Standing::Heads);
    assert_eq!(
        standing(&sm, &nodes[2]),
        Standing::Waits {
            on: nodes[1].clone()
        }
    );
    sm.apply(
        &Command::Delete {
            path: nodes[1].clone(),
            version: None,
            fence: None,
        },
        0,
    )
    .result
    .unwrap();
    assert_eq!(
        standing(&sm, &nodes[2]),
        Standing::Waits {
            on: nodes[0].clone()
        }
    );
    assert_eq!(sm.standing("/q/none").unwrap_err().code, ErrorCode::NoNode);
    assert_eq!(sm.standing("/").unwrap_err().code, ErrorCode::BadArguments);
}

#[test]
fn a_restored_state_machine_equals_the_original() {
    let mut sm = StateMachine::new();
    let a = open(&mut sm);
    let b = open(&mut sm);
    create(&mut sm, a, "/p", CreateMode::Persistent)
        .result
        .unwrap();
    create(&mut sm, a, "/p/e-", CreateMode::EphemeralSequential)
        .result
        .unwrap();
    create(&mut sm, b, "/p/f", CreateMode::Ephemeral)
        .result
        .unwrap();
    fenced_set(&mut sm, "/p", 12).result.unwrap();
    let sessions: Vec<_> = sm
        .sessions()
        .map(|(id, s)| SessionImage {
            id,
            timeout_ms: s.timeout_ms,
            secret: s.secret,
            last: s.last_reply(id),
        })
        .collect();
    let images: Vec<NodeImage> = sm.nodes_parent_first().collect();
    assert_eq!(images[0].path, "/");
    let mut restored =
        StateMachine::restore(sm.revision(), sm.last_now_ms(), sessions, images.clone()).unwrap();
    assert_eq!(restored.nodes_parent_first().collect::<Vec<_>>(), images);
    assert_eq!(restored.revision(), sm.revision());
    assert_eq!(restored.session(a).unwrap().ephemerals.len(), 1);
    // Both go on identically.
    let expire = Command::ExpireSession { session: a };
    let x = sm.apply(&expire, 0);
    let y = restored.apply(&expire, 0);
    assert_eq!(x.triggers, y.triggers);
    assert_eq!(x.revision, y.revision);
}

/// A command that reaches the state machine without its request's checks
/// (from another protocol, or a log) still cannot name a node with an
/// invalid path: it is refused with `invalid-path` and changes nothing.
#[test]
fn a_create_with_an_invalid_path_is_refused_by_the_state_machine() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    let revision = sm.revision();
    for (bad, mode) in [
        ("/\0", CreateMode::PersistentSequential),
        ("/a\nb", CreateMode::Persistent),
        ("relative", CreateMode::Persistent),
        ("/a/../b", CreateMode::Ephemeral),
        ("/x/", CreateMode::Persistent),
    ] {
        let applied = create(&mut sm, s, bad, mode);
        match applied.result {
            Err(e) => assert_eq!(e.code, ErrorCode::InvalidPath, "{bad:?}: {}", e.message),
            Ok(o) => panic!("{bad:?} created: {o:?}"),
        }
    }
    assert_eq!(sm.revision(), revision);
    assert_eq!(sm.node_count(), 1);
    // A sequential create under a parent, named by the parent and a slash,
    // is still a valid name.
    create(&mut sm, s, "/q", CreateMode::Persistent)
        .result
        .unwrap();
    let made = create(&mut sm, s, "/q/", CreateMode::PersistentSequential);
    assert!(
        matches!(made.result, Ok(Outcome::Created { .. })),
        "{:?}",
        made.result
    );
}

mod determinism {
    use super::*;
    use proptest::prelude::*;

    fn command() -> impl Strategy<Value = Command> {
        let path = prop::sample::select(vec!["/a", "/b", "/a/x", "/a/y", "/b/z", "/a/x/q"]);
        prop_oneof![
            Just(Command::OpenSession {
                timeout_ms: 100,
                secret: SessionSecret([1; 16])
            }),
            (1u64..6).prop_map(|s| Command::ExpireSession {
                session: SessionId(s)
            }),
            (1u64..6, path.clone(), 0u8..4).prop_map(|(s, p, m)| Command::Create {
                session: SessionId(s),
                path: p.into(),
                data: Bytes::new(),
                mode: CreateMode::from_flags(m & 1 != 0, m & 2 != 0),
                fence: None,
                acl: baton_proto::Acl::OPEN,
            }),
            (path.clone(), proptest::option::of(0u64..20)).prop_map(|(p, fence)| Command::Delete {
                path: p.into(),
                version: None,
                fence,
            }),
            (path, proptest::option::of(0u64..20)).prop_map(|(p, fence)| Command::SetData {
                path: p.into(),
                data: Bytes::from_static(b"x"),
                version: None,
                fence,
            }),
        ]
    }

    fn fingerprint(sm: &StateMachine) -> Vec<(String, Stat)> {
        let mut v: Vec<_> = sm
            .nodes
            .iter()
            .map(|(p, n)| (p.to_string(), n.stat()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    proptest! {
        #[test]
        fn same_commands_same_state_and_events(cmds in prop::collection::vec(command(), 1..60)) {
            let mut one = StateMachine::new();
            let mut two = StateMachine::new();
            for (i, cmd) in cmds.into_iter().enumerate() {
                let a = one.apply(&cmd, i as u64);
                let b = two.apply(&cmd, i as u64);
                prop_assert_eq!(a.result, b.result);
                prop_assert_eq!(a.triggers, b.triggers);
            }
            prop_assert_eq!(fingerprint(&one), fingerprint(&two));
            // Every child link points at a node and every ephemeral is owned by a live session.
            for (p, n) in &one.nodes {
                for c in n.children() {
                    prop_assert!(one.nodes.contains_key(c));
                    prop_assert_eq!(path::parent(c), Some(&**p));
                }
                if let Some(owner) = n.owner() {
                    prop_assert!(one.sessions.get(&owner).unwrap().ephemerals.contains(p));
                }
            }
        }
    }
}

/// Commands of every kind, on valid and invalid paths, applied at random:
/// nothing panics, a failed command changes nothing, and the state holds
/// exactly what the successful outcomes said (nothing acknowledged lost,
/// nothing appears that no outcome reported), fences never go back, and a
/// snapshot of it reads back the same.
mod apply_fuzz {
    use super::*;
    use crate::queue::QueueRule;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn path() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => prop::sample::select(vec!["/", "/a", "/b", "/a/x", "/a/y", "/b/z", "/a/x/q", "/q"])
                .prop_map(str::to_owned),
            1 => "[a-z/.]{0,8}",
            1 => ".{0,6}",
        ]
    }

    fn data() -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from)
    }

    fn command() -> impl Strategy<Value = Command> {
        let session = (0u64..12).prop_map(SessionId);
        let fence = proptest::option::of(0u64..30);
        let version = proptest::option::of(0u32..4);
        prop_oneof![
            2 => (1u32..100_000).prop_map(|timeout_ms| Command::OpenSession {
                timeout_ms,
                secret: SessionSecret([3; 16]),
            }),
            1 => session.clone().prop_map(|session| Command::CloseSession { session }),
            1 => session.clone().prop_map(|session| Command::ExpireSession { session }),
            6 => (session.clone(), path(), data(), 0u8..4, fence.clone()).prop_map(
                |(session, path, data, m, fence)| Command::Create {
                    session,
                    path,
                    data,
                    mode: CreateMode::from_flags(m & 1 != 0, m & 2 != 0),
                    fence, acl: baton_proto::Acl::OPEN,
                }
            ),
            2 => (session, path(), data(), 0u32..4).prop_map(|(session, path, data, r)| {
                Command::Enqueue {
                    session,
                    path,
                    data,
                    rule: match r {
                        0 => QueueRule::Exclusive,
                        1 => QueueRule::Shared,
                        n => QueueRule::Permits(n - 2),
                    },
                }
            }),
            3 => (path(), version.clone(), fence.clone()).prop_map(|(path, version, fence)| {
                Command::Delete { path, version, fence }
            }),
            4 => (path(), data(), version, fence).prop_map(|(path, data, version, fence)| {
                Command::SetData { path, data, version, fence }
            }),
        ]
    }

    /// Every node with its data and stat.
    fn image(sm: &StateMachine) -> Vec<(String, Bytes, Stat)> {
        sm.nodes_parent_first()
            .map(|n| {
                let node = sm.node(&n.path).expect("listed");
                (n.path.to_string(), node.data(), node.stat())
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn apply_keeps_exactly_what_it_acknowledged(cmds in prop::collection::vec(command(), 1..120)) {
            let mut sm = StateMachine::new();
            // What the outcomes said each node holds: data and version.
            let mut acknowledged: BTreeMap<String, (Bytes, u32)> = image(&sm)
                .into_iter()
                .map(|(p, d, s)| (p, (d, s.version)))
                .collect();
            // The highest token each node accepted.
            let mut fences: BTreeMap<String, u64> = BTreeMap::new();
            for (i, cmd) in cmds.iter().enumerate() {
                let (before, revision) = (image(&sm), sm.revision());
                let applied = sm.apply(cmd, i as u64);
                match &applied.result {
                    Err(_) => {
                        prop_assert!(!applied.changed);
                        prop_assert_eq!(applied.revision, revision);
                        prop_assert!(applied.triggers.is_empty());
                        prop_assert_eq!(image(&sm), before, "a failed {:?} changed the state", cmd);
                        continue;
                    }
                    Ok(_) => {
                        prop_assert!(applied.changed);
                        prop_assert!(applied.revision > revision);
                    }
                }
                let fence = match cmd {
                    Command::Create { fence, .. }
                    | Command::Delete { fence, .. }
                    | Command::SetData { fence, .. } => *fence,
                    _ => None,
                };
                match (cmd, applied.result.unwrap()) {
                    (Command::Create { data, .. }, Outcome::Created { path, stat, .. })
                    | (Command::Enqueue { data, .. }, Outcome::Enqueued { path, stat, .. }) => {
                        prop_assert!(!acknowledged.contains_key(&*path), "{} created twice", path);
                        prop_assert!(baton_proto::path::validate(&path).is_ok(), "{:?} created", path);
                        acknowledged.insert(path.to_string(), (data.clone(), stat.version));
                        if let (Some(token), Some(parent)) = (fence, path::parent(&path)) {
                            let f = fences.entry(parent.to_owned()).or_default();
                            *f = (*f).max(token);
                        }
                    }
                    (Command::SetData { path, data, .. }, Outcome::DataSet(stat)) => {
                        acknowledged.insert(path.clone(), (data.clone(), stat.version));
                        if let Some(token) = fence {
                            let f = fences.entry(path.clone()).or_default();
                            *f = (*f).max(token);
                        }
                    }
                    (Command::Delete { path, .. }, Outcome::Deleted) => {
                        prop_assert!(acknowledged.remove(path).is_some(), "{} deleted but never created", path);
                        fences.remove(path);
                        if let (Some(token), Some(parent)) = (fence, path::parent(path)) {
                            let f = fences.entry(parent.to_owned()).or_default();
                            *f = (*f).max(token);
                        }
                    }
                    (Command::CloseSession { .. } | Command::ExpireSession { .. }, Outcome::SessionEnded { deleted }) => {
                        for p in deleted {
                            prop_assert!(acknowledged.remove(&*p).is_some(), "{} went with a session but never came", p);
                            fences.remove(&*p);
                        }
                    }
                    (Command::OpenSession { .. }, Outcome::SessionOpened(_)) => {}
                    (cmd, outcome) => prop_assert!(false, "{:?} answered {:?}", cmd, outcome),
                }
                // The state is exactly what was acknowledged.
                let now: BTreeMap<String, (Bytes, u32)> = image(&sm)
                    .into_iter()
                    .map(|(p, d, s)| (p, (d, s.version)))
                    .collect();
                prop_assert_eq!(&now, &acknowledged, "after {:?}", cmd);
                for (p, token) in &fences {
                    if let Some(node) = sm.node(p) {
                        prop_assert!(node.fence() >= *token, "{}'s fence went back below {}", p, token);
                    }
                }
            }
            // A snapshot of the end state reads back the same.
            let mut out = std::io::Cursor::new(Vec::new());
            crate::format::snapshot::encode(&sm, &mut out).unwrap();
            let back = crate::format::snapshot::decode(out.get_ref()).unwrap();
            prop_assert_eq!(image(&back), image(&sm));
            prop_assert_eq!(back.revision(), sm.revision());
        }
    }
}

/// Queues of mixed rules under random joins, leaves, session ends and
/// multi deletes: for every member, the state machine's answer (which uses
/// its index of exclusive members and its shortcut for the newest permit
/// holder) is the pure rule's over the members ahead, and a state restored
/// from its snapshot answers the same.
mod queue_rules {
    use super::*;
    use crate::queue::{standing, QueueRule, Standing};
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Step {
        Open,
        Join {
            session: u64,
            queue: usize,
            rule: QueueRule,
        },
        /// A plain create of an exclusive member (no enqueue).
        Create {
            session: u64,
            queue: usize,
        },
        Leave {
            pick: usize,
        },
        End {
            session: u64,
        },
        Restore,
        /// Gives a queue a lock-delay (expired holders stay as tombstones).
        Delay {
            queue: usize,
        },
        /// Deletes the tombstones that are due.
        Release,
    }

    fn step() -> impl Strategy<Value = Step> {
        let rule = prop_oneof![
            Just(QueueRule::Exclusive),
            Just(QueueRule::Shared),
            (1u32..4).prop_map(QueueRule::Permits),
        ];
        prop_oneof![
            1 => Just(Step::Open),
            8 => (1u64..6, 0usize..3, rule).prop_map(|(session, queue, rule)| Step::Join { session, queue, rule }),
            2 => (1u64..6, 0usize..3).prop_map(|(session, queue)| Step::Create { session, queue }),
            5 => any::<usize>().prop_map(|pick| Step::Leave { pick }),
            1 => (1u64..6).prop_map(|session| Step::End { session }),
            1 => Just(Step::Restore),
            1 => (0usize..3).prop_map(|queue| Step::Delay { queue }),
            1 => Just(Step::Release),
        ]
    }

    const QUEUES: [&str; 3] = ["/q0", "/q1", "/q2"];

    fn check(sm: &StateMachine) -> Result<(), TestCaseError> {
        for q in QUEUES {
            let members: Vec<(Arc<str>, QueueRule)> = sm
                .node(q)
                .unwrap()
                .children()
                .map(|p| (p.clone(), sm.rule(p)))
                .collect();
            for (i, (p, rule)) in members.iter().enumerate() {
                let ahead = members[..i].iter().rev().map(|(p, r)| (p.clone(), *r));
                let want = standing(*rule, ahead);
                let got = sm.standing(p).unwrap().map(|(p, _)| p.clone());
                prop_assert_eq!(&got, &want, "{} ({}) in {:?}", p, rule, members);
            }
            // The rules of one queue agree.
            let ruled: Vec<QueueRule> = members
                .iter()
                .map(|(_, r)| *r)
                .filter(|r| *r != QueueRule::Exclusive)
                .collect();
            prop_assert!(ruled.windows(2).all(|w| w[0] == w[1]), "{:?}", ruled);
        }
        Ok(())
    }

    fn restored(sm: &StateMachine) -> StateMachine {
        let mut bytes = std::io::Cursor::new(Vec::new());
        crate::format::snapshot::encode(sm, &mut bytes).unwrap();
        crate::format::snapshot::decode(bytes.get_ref()).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn the_state_machine_answers_as_the_rule_does(steps in prop::collection::vec(step(), 1..80)) {
            let mut sm = StateMachine::new();
            let s = open(&mut sm);
            for q in QUEUES {
                create(&mut sm, s, q, CreateMode::Persistent).result.unwrap();
            }
            for (i, step) in steps.into_iter().enumerate() {
                let now = i as u64;
                match step {
                    Step::Open => { open(&mut sm); }
                    Step::Join { session, queue, rule } => {
                        let applied = sm.apply(&Command::Enqueue {
                            session: SessionId(session),
                            path: format!("{}/m-", QUEUES[queue]),
                            data: Bytes::new(),
                            rule,
                        }, now);
                        if let Err(e) = &applied.result {
                            prop_assert!(matches!(e.code, ErrorCode::BadArguments | ErrorCode::SessionExpired), "{e:?}");
                        }
                    }
                    Step::Create { session, queue } => {
                        let _ = create(&mut sm, SessionId(session), &format!("{}/c-", QUEUES[queue]), CreateMode::EphemeralSequential);
                    }
                    Step::Leave { pick } => {
                        let all: Vec<Arc<str>> = QUEUES.iter().flat_map(|q| sm.node(q).unwrap().children().cloned().collect::<Vec<_>>()).collect();
                        if !all.is_empty() {
                            let path = all[pick % all.len()].to_string();
                            // Every other leave is a transaction's.
                            let command = if pick % 2 == 0 {
                                Command::Delete { path, version: None, fence: None }
                            } else {
                                Command::Multi { session: s, ops: vec![baton_proto::TxnOp::Delete { path, version: None, fence: None }] }
                            };
                            sm.apply(&command, now).result.unwrap();
                        }
                    }
                    Step::End { session } => {
                        let _ = sm.apply(&Command::ExpireSession { session: SessionId(session) }, now);
                    }
                    Step::Restore => sm = restored(&sm),
                    Step::Delay { queue } => {
                        let delay = Command::SetLockDelay { path: QUEUES[queue].into(), delay_ms: 50 };
                        sm.apply(&delay, now).result.unwrap();
                    }
                    Step::Release => {
                        let due: Vec<String> = sm.tombstones().map(|(p, _)| p.to_string()).collect();
                        for path in due {
                            let release = Command::DeleteTombstone { path };
                            prop_assert!(sm.apply(&release, now).result.is_ok());
                        }
                    }
                }
                // A tombstone is owned by no session and is due after the
                // expiry that made it.
                for (p, until) in sm.tombstones() {
                    prop_assert_eq!(sm.node(p).unwrap().owner(), None);
                    prop_assert!(until <= sm.last_now_ms() + 50);
                }
                check(&sm)?;
            }
            check(&restored(&sm))?;
        }
    }

    /// A thousand readers behind one writer all head once it leaves, and a
    /// writer behind them waits on the last of them.
    #[test]
    fn readers_head_together_and_a_writer_waits_for_all_of_them() {
        let mut sm = StateMachine::new();
        let s = open(&mut sm);
        create(&mut sm, s, "/rw", CreateMode::Persistent)
            .result
            .unwrap();
        let join = |sm: &mut StateMachine, rule| match sm
            .apply(
                &Command::Enqueue {
                    session: s,
                    path: "/rw/m-".into(),
                    data: Bytes::new(),
                    rule,
                },
                0,
            )
            .result
        {
            Ok(Outcome::Enqueued {
                path, predecessor, ..
            }) => (path, predecessor.map(|(p, _)| p)),
            other => panic!("{other:?}"),
        };
        let (writer, none) = join(&mut sm, QueueRule::Exclusive);
        assert_eq!(none, None);
        let readers: Vec<Arc<str>> = (0..1000)
            .map(|_| {
                let (r, on) = join(&mut sm, QueueRule::Shared);
                assert_eq!(on.as_ref(), Some(&writer), "a reader waits for the writer");
                r
            })
            .collect();
        let (last_writer, on) = join(&mut sm, QueueRule::Exclusive);
        assert_eq!(on.as_ref(), Some(&readers[999]));
        sm.apply(
            &Command::Delete {
                path: writer.to_string(),
                version: None,
                fence: None,
            },
            0,
        )
        .result
        .unwrap();
        assert!(readers.iter().all(|r| sm.standing(r).unwrap().heads()));
        assert!(matches!(
            sm.standing(&last_writer).unwrap(),
            Standing::Waits { .. }
        ));
        let (late_reader, on) = join(&mut sm, QueueRule::Shared);
        assert_eq!(
            on,
            Some(last_writer),
            "FIFO: a reader queues behind a waiting writer"
        );
        assert!(!sm.standing(&late_reader).unwrap().heads());
    }
}

fn reader_acl() -> Acl {
    Acl::new(vec![baton_proto::AclEntry {
        perms: baton_proto::acl::perms::READ,
        scheme: "digest".into(),
        id: "ann:hash".into(),
    }])
}

fn create_with_acl(sm: &mut StateMachine, s: SessionId, path: &str, mode: CreateMode) -> Applied {
    let command = Command::Create {
        session: s,
        path: path.into(),
        data: Bytes::new(),
        mode,
        fence: None,
        acl: reader_acl(),
    };
    sm.apply(&command, 5)
}

fn set_acl(sm: &mut StateMachine, path: &str, acl: Acl, version: Option<u32>) -> Applied {
    let command = Command::SetAcl {
        path: path.into(),
        acl,
        version,
    };
    sm.apply(&command, 6)
}

/// A node keeps the list it was created with, a sequential one included,
/// and loses it with the node: a node created again at the path is open.
#[test]
fn a_node_keeps_its_acl_until_it_goes() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create_with_acl(&mut sm, s, "/a", CreateMode::Persistent)
        .result
        .unwrap();
    let (seq, _) = created_path(create_with_acl(
        &mut sm,
        s,
        "/q-",
        CreateMode::EphemeralSequential,
    ));
    let (eph, _) = created_path(create_with_acl(&mut sm, s, "/e", CreateMode::Ephemeral));
    for path in ["/a", seq.as_str(), eph.as_str()] {
        assert_eq!(sm.acl(path), (&reader_acl(), 0), "{path}");
    }
    assert_eq!(sm.acl("/"), (&Acl::OPEN, 0));
    let deleted = Command::Delete {
        path: "/a".into(),
        version: None,
        fence: None,
    };
    sm.apply(&deleted, 7).result.unwrap();
    create(&mut sm, s, "/a", CreateMode::Persistent)
        .result
        .unwrap();
    assert_eq!(sm.acl("/a"), (&Acl::OPEN, 0));
    // The session's end takes its ephemerals' lists with them.
    sm.apply(&Command::CloseSession { session: s }, 8)
        .result
        .unwrap();
    assert_eq!(sm.acl(&seq), (&Acl::OPEN, 0));
    assert_eq!(sm.acl(&eph), (&Acl::OPEN, 0));
    assert!(sm.acls.is_empty(), "{:?}", sm.acls);
}

/// Setting a list takes a revision, counts the ACL version, checks it when
/// asked, fires no watch, and leaves the node's stat as it was.
#[test]
fn setting_an_acl_counts_its_version_and_changes_nothing_else() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/a", CreateMode::Persistent)
        .result
        .unwrap();
    let stat = sm.node("/a").unwrap().stat();
    let before = sm.revision();
    let set = set_acl(&mut sm, "/a", reader_acl(), Some(0));
    assert_eq!(set.result, Ok(Outcome::AclSet { stat, aversion: 1 }));
    assert!(set.triggers.is_empty());
    assert_eq!(sm.revision(), before + 1);
    assert_eq!(sm.node("/a").unwrap().stat(), stat);
    assert_eq!(sm.acl("/a"), (&reader_acl(), 1));
    // The version it was at is no longer the version it is at.
    let stale = set_acl(&mut sm, "/a", Acl::OPEN, Some(0));
    assert_eq!(code(stale), ErrorCode::BadVersion);
    assert_eq!(sm.revision(), before + 1);
    // Open again, and still counted.
    set_acl(&mut sm, "/a", Acl::OPEN, None).result.unwrap();
    assert_eq!(sm.acl("/a"), (&Acl::OPEN, 2));
    assert_eq!(
        code(set_acl(&mut sm, "/none", Acl::OPEN, None)),
        ErrorCode::NoNode
    );
}

/// A transaction's create gives its node its list, and one that fails
/// leaves no list behind.
#[test]
fn a_transactions_create_sets_the_acl_all_or_nothing() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    let create_op = |path: &str| baton_proto::TxnOp::Create {
        path: path.into(),
        data: Bytes::new(),
        mode: CreateMode::Persistent,
        fence: None,
        acl: reader_acl(),
    };
    let failed = sm.apply(
        &Command::Multi {
            session: s,
            ops: vec![create_op("/x"), create_op("/missing/y")],
        },
        5,
    );
    assert!(matches!(
        failed.result,
        Ok(Outcome::MultiFailed { index: 1, .. })
    ));
    assert_eq!(sm.acl("/x"), (&Acl::OPEN, 0));
    let applied = sm.apply(
        &Command::Multi {
            session: s,
            ops: vec![create_op("/x")],
        },
        5,
    );
    assert!(matches!(applied.result, Ok(Outcome::Multi(_))));
    assert_eq!(sm.acl("/x"), (&reader_acl(), 0));
}

/// A container is deleted by its own command only once it has had
/// children and has none left; it is a container across a snapshot.
#[test]
fn a_container_is_deleted_only_once_emptied() {
    let mut sm = StateMachine::new();
    let s = open(&mut sm);
    create(&mut sm, s, "/c", CreateMode::Container)
        .result
        .unwrap();
    let reap = |sm: &mut StateMachine| sm.apply(&Command::DeleteContainer { path: "/c".into() }, 9);
    assert!(sm.is_container("/c"));
    assert!(!sm.is_empty_container("/c"));
    assert_eq!(
        code(reap(&mut sm)),
        ErrorCode::BadArguments,
        "never had a child"
    );
    create(&mut sm, s, "/c/x", CreateMode::Ephemeral)
        .result
        .unwrap();
    assert_eq!(code(reap(&mut sm)), ErrorCode::NotEmpty);
    // Its child goes with its session: now it stands empty.
    sm.apply(&Command::CloseSession { session: s }, 8)
        .result
        .unwrap();
    assert_eq!(
        sm.empty_containers().map(|p| &**p).collect::<Vec<_>>(),
        ["/c"]
    );
    let mut out = std::io::Cursor::new(Vec::new());
    crate::format::snapshot::encode(&sm, &mut out).unwrap();
    let mut back = crate::format::snapshot::decode(out.get_ref()).unwrap();
    assert!(back.is_empty_container("/c"));
    let applied = reap(&mut back);
    assert_eq!(applied.result, Ok(Outcome::Deleted));
    assert!(applied
        .triggers
        .iter()
        .any(|t| t.kind == EventKind::Deleted));
    assert!(back.node("/c").is_none() && !back.is_container("/c"));
    // A plain node is no container.
    let s = open(&mut back);
    create(&mut back, s, "/c", CreateMode::Persistent)
        .result
        .unwrap();
    assert_eq!(code(reap(&mut back)), ErrorCode::BadArguments);
}
