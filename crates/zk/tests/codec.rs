//! The jute codec: every request a client encodes decodes to itself, and no
//! input (cut short, lying about its lengths, random) makes the decoder
//! panic or allocate what the input only claims.

use baton_zk::codes::op;
use baton_zk::records::framed;
use baton_zk::{Acl, ConnectRequest, ConnectResponse, Create, MultiOp, Request, RequestError};
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

fn path() -> impl Strategy<Value = String> {
    "(/[a-z0-9_-]{1,8}){1,3}"
}

fn data() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
}

fn acl() -> impl Strategy<Value = Vec<Acl>> {
    proptest::collection::vec(
        (0..32i32, "[a-z]{1,6}", "[a-z:]{0,10}").prop_map(|(perms, scheme, id)| Acl {
            perms,
            scheme,
            id,
        }),
        0..3,
    )
}

fn create() -> impl Strategy<Value = Create> {
    (
        path(),
        data(),
        acl(),
        0..7i32,
        prop_oneof![
            Just(op::CREATE),
            Just(op::CREATE2),
            Just(op::CREATE_CONTAINER),
            Just(op::CREATE_TTL)
        ],
        any::<i64>(),
    )
        .prop_map(|(path, data, acl, flags, code, ttl)| Create {
            path,
            data,
            acl,
            flags,
            ttl: (code == op::CREATE_TTL).then_some(ttl),
            op: code,
        })
}

fn multi_op() -> impl Strategy<Value = MultiOp> {
    prop_oneof![
        create().prop_map(MultiOp::Create),
        (path(), any::<i32>()).prop_map(|(path, version)| MultiOp::Delete { path, version }),
        (path(), data(), any::<i32>()).prop_map(|(path, data, version)| MultiOp::SetData {
            path,
            data,
            version
        }),
        (path(), any::<i32>()).prop_map(|(path, version)| MultiOp::Check { path, version }),
    ]
}

fn read_op() -> impl Strategy<Value = MultiOp> {
    prop_oneof![
        path().prop_map(|path| MultiOp::GetData { path }),
        path().prop_map(|path| MultiOp::GetChildren { path }),
    ]
}

fn strings() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(path(), 0..3)
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        create().prop_map(Request::Create),
        (path(), any::<i32>()).prop_map(|(path, version)| Request::Delete { path, version }),
        (path(), any::<bool>()).prop_map(|(path, watch)| Request::Exists { path, watch }),
        (path(), any::<bool>()).prop_map(|(path, watch)| Request::GetData { path, watch }),
        (path(), data(), any::<i32>()).prop_map(|(path, data, version)| Request::SetData {
            path,
            data,
            version
        }),
        path().prop_map(|path| Request::GetAcl { path }),
        (path(), acl(), any::<i32>()).prop_map(|(path, acl, version)| Request::SetAcl {
            path,
            acl,
            version
        }),
        (path(), any::<bool>(), any::<bool>())
            .prop_map(|(path, watch, stat)| Request::GetChildren { path, watch, stat }),
        path().prop_map(|path| Request::Sync { path }),
        Just(Request::Ping),
        proptest::collection::vec(multi_op(), 0..4)
            .prop_map(|ops| Request::Multi { ops, read: false }),
        proptest::collection::vec(read_op(), 0..4)
            .prop_map(|ops| Request::Multi { ops, read: true }),
        (path(), 1..6i32).prop_map(|(path, kind)| Request::CheckWatches { path, kind }),
        (path(), 1..6i32).prop_map(|(path, kind)| Request::RemoveWatches { path, kind }),
        ("[a-z]{1,6}", data()).prop_map(|(scheme, auth)| Request::Auth { scheme, auth }),
        (
            any::<i64>(),
            strings(),
            strings(),
            strings(),
            strings(),
            strings()
        )
            .prop_map(
                |(relative_zxid, data, exist, child, persistent, recursive)| Request::SetWatches {
                    relative_zxid,
                    data,
                    exist,
                    child,
                    persistent,
                    recursive
                }
            ),
        "/?[a-z/]{0,8}".prop_map(|prefix| Request::GetEphemerals { prefix }),
        path().prop_map(|path| Request::GetAllChildrenNumber { path }),
        (path(), 0..2i32).prop_map(|(path, mode)| Request::AddWatch { path, mode }),
        Just(Request::WhoAmI),
        Just(Request::CloseSession),
    ]
}

/// A request's frame, without its length.
fn frame_of(request: &Request, xid: i32) -> Bytes {
    let mut buf = BytesMut::new();
    request.encode(xid, &mut buf);
    buf.split_off(4).freeze()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn every_request_decodes_to_itself(request in request(), xid in any::<i32>()) {
        let (header, decoded) = Request::decode(&frame_of(&request, xid)).unwrap();
        prop_assert_eq!(header.xid, xid);
        prop_assert_eq!(header.op, request.op());
        prop_assert_eq!(decoded, request);
    }

    /// A body cut anywhere fails to decode (or, where the missing part was
    /// an optional trailing field, decodes), and never panics.
    #[test]
    fn a_body_cut_short_fails_cleanly(request in request(), cut in any::<prop::sample::Index>()) {
        let frame = frame_of(&request, 7);
        let at = cut.index(frame.len());
        let short = frame.slice(..at);
        match Request::decode(&short) {
            Ok(_) | Err(RequestError::Malformed { .. }) => {}
            Err(RequestError::NoHeader(n)) => prop_assert!(n < 8),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let frame = Bytes::from(bytes);
        let _ = Request::decode(&frame);
        let _ = ConnectRequest::decode(&frame);
        let _ = ConnectResponse::decode(&frame);
    }
}

#[test]
fn a_length_that_lies_fails_before_allocating() {
    // A vector of 2^31-1 strings in a few bytes.
    let mut body = BytesMut::new();
    framed(&mut body, |b| {
        b.extend_from_slice(&1i32.to_be_bytes());
        b.extend_from_slice(&op::SET_WATCHES.to_be_bytes());
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&i32::MAX.to_be_bytes());
    });
    let frame = body.split_off(4).freeze();
    assert!(matches!(
        Request::decode(&frame),
        Err(RequestError::Malformed { .. })
    ));
}

#[test]
fn connect_requests_of_old_and_new_clients_decode() {
    let new = ConnectRequest {
        protocol_version: 0,
        last_zxid_seen: 42,
        timeout_ms: 30_000,
        session_id: 0x1234,
        passwd: Bytes::from_static(&[9; 16]),
        read_only: Some(false),
    };
    let mut buf = BytesMut::new();
    new.encode(&mut buf);
    assert_eq!(
        ConnectRequest::decode(&buf.clone().split_off(4).freeze()).unwrap(),
        new
    );
    // Clients before 3.4 send no read-only flag.
    let old = ConnectRequest {
        read_only: None,
        ..new
    };
    let mut buf = BytesMut::new();
    old.encode(&mut buf);
    assert_eq!(
        ConnectRequest::decode(&buf.split_off(4).freeze()).unwrap(),
        old
    );
}
