//! Every message type survives encode -> frame codec -> decode unchanged, and
//! arbitrary bytes never make a decoder panic.

use baton_proto::response::{encode_event, Stat};
use baton_proto::*;
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tokio_util::codec::Decoder;

fn one_frame(buf: &mut BytesMut) -> Bytes {
    let frame = frame_codec(MAX_RESPONSE_FRAME)
        .decode(buf)
        .expect("frame decodes")
        .expect("a whole frame");
    assert!(buf.is_empty(), "exactly one frame");
    frame.freeze()
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-zA-Z0-9_.é-]{1,12}", 0..5).prop_map(|segs| {
        let segs: Vec<String> = segs
            .into_iter()
            .map(|s| {
                if s == "." || s == ".." {
                    format!("{s}x")
                } else {
                    s
                }
            })
            .collect();
        format!("/{}", segs.join("/"))
    })
}

fn data() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

fn mode() -> impl Strategy<Value = CreateMode> {
    prop_oneof![
        (any::<bool>(), any::<bool>()).prop_map(|(e, s)| CreateMode::from_flags(e, s)),
        Just(CreateMode::Container),
    ]
}

/// Open half the time; otherwise one to four entries of any permissions.
fn acl() -> impl Strategy<Value = Acl> {
    let entry = (0u8..32, "[a-z]{1,8}", "[a-zA-Z0-9:+/=.]{0,40}")
        .prop_map(|(perms, scheme, id)| AclEntry { perms, scheme, id });
    prop_oneof![
        Just(Acl::OPEN),
        prop::collection::vec(entry, 1..5).prop_map(Acl::new),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (path(), data(), mode(), any::<Option<u64>>(), acl()).prop_map(
            |(path, data, mode, fence, acl)| Request::Create {
                path,
                data,
                mode,
                fence,
                acl,
            }
        ),
        (path(), acl(), any::<Option<u32>>()).prop_map(|(path, acl, version)| Request::SetAcl {
            path,
            acl,
            version
        }),
        (path(), any::<Option<u32>>(), any::<Option<u64>>()).prop_map(|(path, version, fence)| {
            Request::Delete {
                path,
                version,
                fence,
            }
        }),
        (path(), 0u8..4).prop_map(|(path, w)| Request::Predecessor {
            path,
            watch: [
                PredecessorWatch::None,
                PredecessorWatch::Predecessor,
                PredecessorWatch::Queue,
                PredecessorWatch::Standing,
            ][w as usize],
        }),
        (path(), data(), 0u32..5).prop_map(|(path, data, r)| Request::Enqueue {
            path,
            data,
            rule: match r {
                0 => QueueRule::Exclusive,
                1 => QueueRule::Shared,
                n => QueueRule::Permits(n - 2),
            },
        }),
        (path(), any::<u64>()).prop_map(|(path, token)| Request::CheckToken { path, token }),
        Just(Request::Stats),
        any::<u64>().prop_map(|s| Request::SessionStatus {
            session: baton_proto::SessionId(s)
        }),
        (path(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(path, data, child, persistent)| Request::RemoveWatches {
                path,
                data,
                child,
                persistent,
            }
        ),
        (path(), any::<u32>()).prop_map(|(path, delay_ms)| Request::LockDelay { path, delay_ms }),
        (path(), any::<bool>(), any::<u64>()).prop_map(|(path, recursive, from)| {
            Request::AddWatch {
                path,
                recursive,
                from,
            }
        }),
        (path(), any::<bool>()).prop_map(|(path, watch)| Request::Exists { path, watch }),
        (path(), any::<bool>()).prop_map(|(path, watch)| Request::GetData { path, watch }),
        (path(), any::<bool>()).prop_map(|(path, watch)| Request::GetChildren { path, watch }),
        (path(), data(), any::<Option<u32>>(), any::<Option<u64>>()).prop_map(
            |(path, data, version, fence)| Request::SetData {
                path,
                data,
                version,
                fence
            }
        ),
        Just(Request::Ping),
        Just(Request::Sync),
        Just(Request::CloseSession),
        prop::collection::vec(txn_op(), 0..6).prop_map(|ops| Request::Multi { ops }),
        (
            any::<u64>(),
            prop::collection::vec(path(), 0..4),
            prop::collection::vec(path(), 0..4),
            prop::collection::vec(path(), 0..4)
        )
            .prop_map(|(revision, data, exist, child)| Request::SetWatches {
                revision,
                queue: data.iter().map(|p| (p.clone(), p.len() % 2 == 0)).collect(),
                data,
                exist,
                child,
            }),
    ]
}

fn txn_op() -> impl Strategy<Value = TxnOp> {
    let check = prop_oneof![
        Just(Check::Exists),
        Just(Check::Absent),
        any::<u32>().prop_map(Check::Version),
        any::<u64>().prop_map(Check::Fence),
        any::<u64>().prop_map(Check::Holder),
    ];
    prop_oneof![
        (path(), data(), mode(), any::<Option<u64>>(), acl()).prop_map(
            |(path, data, mode, fence, acl)| TxnOp::Create {
                path,
                data,
                mode,
                fence,
                acl,
            }
        ),
        (path(), any::<Option<u32>>(), any::<Option<u64>>()).prop_map(|(path, version, fence)| {
            TxnOp::Delete {
                path,
                version,
                fence,
            }
        }),
        (path(), data(), any::<Option<u32>>(), any::<Option<u64>>()).prop_map(
            |(path, data, version, fence)| TxnOp::SetData {
                path,
                data,
                version,
                fence
            }
        ),
        (path(), check).prop_map(|(path, check)| TxnOp::Check { path, check }),
    ]
}

fn txn_result() -> impl Strategy<Value = TxnResult> {
    prop_oneof![
        (path(), any::<Option<u64>>(), stat()).prop_map(|(path, sequence, stat)| {
            TxnResult::Created {
                path,
                sequence,
                stat,
            }
        }),
        Just(TxnResult::Deleted),
        stat().prop_map(TxnResult::DataSet),
        Just(TxnResult::Checked),
    ]
}

fn stat() -> impl Strategy<Value = Stat> {
    (any::<[u64; 6]>(), any::<[u32; 4]>()).prop_map(|(l, s)| Stat {
        czxid: l[0],
        mzxid: l[1],
        pzxid: l[2],
        ctime: l[3],
        mtime: l[4],
        ephemeral_owner: l[5],
        version: s[0],
        cversion: s[1],
        data_length: s[2],
        num_children: s[3],
    })
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    (1u16..40).prop_map(ErrorCode::from_u16)
}

fn reply_result() -> impl Strategy<Value = Result<Reply, ErrorReply>> {
    let ok = prop_oneof![
        (path(), any::<Option<u64>>(), stat()).prop_map(|(path, sequence, stat)| Reply::Create {
            path,
            sequence,
            stat
        }),
        Just(Reply::Delete),
        proptest::option::of(stat()).prop_map(Reply::Exists),
        (stat(), data()).prop_map(|(stat, data)| Reply::GetData { stat, data }),
        (stat(), prop::collection::vec("[a-z0-9-]{1,20}", 0..20))
            .prop_map(|(stat, children)| Reply::GetChildren { stat, children }),
        stat().prop_map(Reply::SetData),
        (stat(), any::<u32>()).prop_map(|(stat, aversion)| Reply::SetAcl { stat, aversion }),
        Just(Reply::Ping),
        Just(Reply::Sync),
        Just(Reply::CloseSession),
        Just(Reply::SetWatches),
        Just(Reply::RemoveWatches),
        (
            path(),
            any::<u64>(),
            stat(),
            proptest::option::of((path(), stat()))
        )
            .prop_map(|(path, sequence, stat, predecessor)| Reply::Enqueue {
                path,
                sequence,
                stat,
                predecessor
            }),
        proptest::option::of((path(), stat())).prop_map(Reply::Predecessor),
        proptest::option::of((path(), stat())).prop_map(Reply::CheckToken),
        prop::collection::vec(("[a-z_]{1,20}", any::<u64>()), 0..10).prop_map(Reply::Stats),
        prop::collection::vec(txn_result(), 0..6).prop_map(|r| Reply::Multi(Ok(r))),
        (0u32..1024, error_code(), ".{0,40}").prop_map(|(index, code, message)| {
            Reply::Multi(Err(TxnFailure {
                index,
                error: ErrorReply { code, message },
            }))
        }),
        (0u8..4, any::<u64>(), any::<u32>()).prop_map(|(l, silent_ms, timeout_ms)| {
            Reply::SessionStatus(baton_proto::SessionStatus {
                liveness: [
                    baton_proto::Liveness::Gone,
                    baton_proto::Liveness::Connected,
                    baton_proto::Liveness::Disconnected,
                    baton_proto::Liveness::Expiring,
                ][usize::from(l)],
                silent_ms,
                timeout_ms,
            })
        }),
    ];
    prop_oneof![
        ok.prop_map(Ok),
        (error_code(), ".{0,40}").prop_map(|(code, message)| Err(ErrorReply { code, message })),
    ]
}

fn event_kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        Just(EventKind::Created),
        Just(EventKind::Deleted),
        Just(EventKind::DataChanged),
        Just(EventKind::ChildrenChanged),
        Just(EventKind::Head),
        Just(EventKind::Compacted),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(xid in any::<u32>(), request in request()) {
        let frame = RequestFrame { xid, request };
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        prop_assert_eq!(RequestFrame::decode(one_frame(&mut buf)), Ok(frame));
    }

    #[test]
    fn replies_round_trip(xid in any::<u32>(), revision in any::<u64>(), result in reply_result()) {
        let op = match &result {
            Ok(reply) => reply.op() as u8,
            Err(_) => 99,
        };
        let msg = ServerMessage::Reply(ReplyFrame { xid, op, revision, result });
        let mut buf = BytesMut::new();
        msg.encode(&mut buf);
        prop_assert_eq!(ServerMessage::decode(one_frame(&mut buf)), Ok(msg));
    }

    #[test]
    fn events_round_trip(kind in event_kind(), revision in any::<u64>(), path in path()) {
        let mut buf = BytesMut::new();
        encode_event(&mut buf, kind, revision, &path);
        let expected = ServerMessage::Event(WatchEvent { kind, revision, path });
        prop_assert_eq!(ServerMessage::decode(one_frame(&mut buf)), Ok(expected));
    }

    #[test]
    fn disconnect_round_trips(code in error_code(), message in ".{0,40}") {
        let msg = ServerMessage::Disconnect(Disconnect { code, message });
        let mut buf = BytesMut::new();
        msg.encode(&mut buf);
        prop_assert_eq!(ServerMessage::decode(one_frame(&mut buf)), Ok(msg));
    }

    #[test]
    fn handshakes_round_trip(
        version in any::<u16>(),
        timeout_ms in any::<u32>(),
        resume in proptest::option::of((1u64.., any::<[u8; 16]>())),
        grant in proptest::option::of((any::<u32>(), any::<u64>(), any::<[u8; 16]>(), any::<bool>(), any::<u32>())),
        message in ".{0,40}",
        // An empty token is sent when a client has none but needs the
        // fields after it, so it reads back as none.
        token in proptest::option::of(proptest::collection::vec(any::<u8>(), 1..64)),
        sequential in any::<bool>(),
        last_seen in prop_oneof![Just(0u64), any::<u64>()],
    ) {
        let req = ConnectRequest {
            version: PROTOCOL_VERSION,
            timeout_ms,
            resume: resume.map(|(id, s)| (SessionId(id), SessionSecret(s))),
            token: token.map(|t| Token(t.into())),
            read_mode: if sequential { ReadMode::Sequential } else { ReadMode::Linearizable },
            last_seen,
        };
        let mut buf = BytesMut::new();
        req.encode(&mut buf);
        prop_assert_eq!(ConnectRequest::decode(one_frame(&mut buf)), Ok(req));

        let result = match grant {
            Some((timeout_ms, id, secret, resumed, max_data)) => Ok(SessionGrant {
                timeout_ms,
                session_id: SessionId(id),
                secret: SessionSecret(secret),
                resumed,
                max_data,
            }),
            None => Err((ErrorCode::UnsupportedVersion, message)),
        };
        let resp = ConnectResponse { version, result };
        resp.encode(&mut buf);
        prop_assert_eq!(ConnectResponse::decode(one_frame(&mut buf)), Ok(resp));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let payload = Bytes::from(bytes);
        let _ = RequestFrame::decode(payload.clone());
        let _ = ServerMessage::decode(payload.clone());
        let _ = ConnectRequest::decode(payload.clone());
        let _ = ConnectResponse::decode(payload);
    }

    #[test]
    fn truncated_requests_are_rejected_not_misread(xid in any::<u32>(), request in request(), cut in 1usize..64) {
        let mut buf = BytesMut::new();
        RequestFrame { xid, request }.encode(&mut buf);
        let payload = one_frame(&mut buf);
        let cut = cut.min(payload.len());
        let short = payload.slice(..payload.len() - cut);
        prop_assert!(RequestFrame::decode(short).is_err());
    }
}

#[test]
fn invalid_paths_are_rejected_with_invalid_path() {
    for bad in ["", "rel", "/a/", "/a//b", "/./a", "/a/..", "/a\0b"] {
        let mut buf = BytesMut::new();
        RequestFrame {
            xid: 7,
            request: Request::GetData {
                path: bad.into(),
                watch: false,
            },
        }
        .encode(&mut buf);
        match RequestFrame::decode(one_frame(&mut buf)) {
            Err(RequestDecodeError::Reject {
                xid: 7,
                code: ErrorCode::InvalidPath,
                ..
            }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn unknown_op_is_answerable() {
    let payload = Bytes::from_static(&[0, 0, 0, 9, 200, 1, 2, 3]);
    match RequestFrame::decode(payload) {
        Err(RequestDecodeError::Reject {
            xid: 9,
            op: 200,
            code: ErrorCode::UnknownOperation,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        RequestFrame::decode(Bytes::from_static(&[1, 2])),
        Err(RequestDecodeError::NoHeader)
    );
}

#[test]
fn other_protocol_versions_decode_to_just_their_version() {
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[0, 0, 0, 10]);
    buf.extend_from_slice(b"BATN");
    buf.extend_from_slice(&[0, 2, 0xde, 0xad, 0xbe, 0xef]);
    let req = ConnectRequest::decode(one_frame(&mut buf)).expect("decodes");
    assert_eq!(req.version, 2);
    assert_eq!(req.resume, None);
}

/// The requests that change the state are exactly the ones proposed: a
/// front end lets them through without a read barrier, in request order.
#[test]
fn the_changes_are_the_writes_enqueues_close_multi_lock_delay_and_set_acl() {
    let changes: Vec<&str> = (0..=255u8)
        .filter_map(OpCode::from_u8)
        .filter(|op| op.is_change())
        .map(OpCode::name)
        .collect();
    assert_eq!(
        changes,
        [
            "create",
            "delete",
            "set data",
            "close session",
            "enqueue",
            "multi",
            "lock delay",
            "enqueue by rule",
            "set ACL"
        ]
    );
}

/// The bytes of docs/protocol.md's example 17.11: a recursive persistent
/// watch set again from revision 5, the events replayed, and the event a
/// compacted history sends.
#[test]
fn the_worked_example_of_a_persistent_watch_set_again_encodes_as_documented() {
    let hex = |b: &[u8]| {
        b.iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut buf = bytes::BytesMut::new();
    RequestFrame {
        xid: 3,
        request: Request::AddWatch {
            path: "/a".into(),
            recursive: true,
            from: 5,
        },
    }
    .encode(&mut buf);
    assert_eq!(
        hex(&buf),
        "00 00 00 12 00 00 00 03 11 00 02 2f 61 01 00 00 00 00 00 00 00 05"
    );
    let mut buf = bytes::BytesMut::new();
    encode_event(&mut buf, EventKind::Deleted, 7, "/a/n-0000000004");
    assert_eq!(
        hex(&buf),
        "00 00 00 1b 02 02 00 00 00 00 00 00 00 07 00 0f 2f 61 2f 6e 2d 30 30 30 30 30 30 30 30 30 34"
    );
    let mut buf = bytes::BytesMut::new();
    encode_event(&mut buf, EventKind::Compacted, 7, "/a");
    assert_eq!(
        hex(&buf),
        "00 00 00 0e 02 06 00 00 00 00 00 00 00 07 00 02 2f 61"
    );
    let mut buf = bytes::BytesMut::new();
    baton_proto::response::encode_reply(&mut buf, 3, 17, 7, &Ok(Reply::AddWatch));
    assert_eq!(
        hex(&buf),
        "00 00 00 10 01 00 00 00 03 11 00 00 00 00 00 00 00 07 00 00"
    );
}
