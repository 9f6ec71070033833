//! Hostile and broken input from the network (DESIGN.md invariants 10 and
//! 11): the server answers what it can, closes what it must, never panics,
//! never buffers without bound, and other clients do not notice.

use std::time::Duration;

use baton::proto::{
    ConnectRequest, CreateMode, ErrorCode, Reply, Request, SessionId, SessionSecret, MAX_PATH_LEN,
    PROTOCOL_VERSION,
};
use baton::server::Config;
use baton::{Client, Error, EventKind, SessionState};
use baton_testkit::*;
use bytes::{BufMut, BytesMut};
use tokio::io::AsyncWriteExt;

/// A request frame's payload built by hand: xid, op, then `body`.
fn request(xid: u32, op: u8, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(5 + body.len());
    b.put_u32(xid);
    b.put_u8(op);
    b.put_slice(body);
    b
}

/// A string field: u16 length, then the raw bytes.
fn str16(raw: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + raw.len());
    b.put_u16(raw.len() as u16);
    b.put_slice(raw);
    b
}

/// Sends a hand-built request and returns the reply's error code, checking
/// that the reply echoes the xid and op.
async fn rejected(raw: &mut Raw, op: u8, body: &[u8]) -> ErrorCode {
    let xid = raw.next_xid();
    raw.write_frame(&request(xid, op, body)).await;
    let reply = raw.reply_to(xid).await;
    assert_eq!(reply.op, op, "the reply echoes the op");
    error_code(reply.result)
}

async fn ping_works(raw: &mut Raw) {
    assert_eq!(raw.call(Request::Ping).await, Ok(Reply::Ping));
}

/// Waits until only `open` connections remain: the server closed the others
/// and their tasks ended (a panicking task would never get here).
async fn connections_drop_to(server: &TestServer, open: u64) {
    eventually(10, "connections to close", || {
        server.stats().connections_open == open
    })
    .await;
}

#[tokio::test]
async fn garbage_instead_of_a_handshake_closes_the_connection() {
    let server = TestServer::start().await;
    let mut raw = Raw::connect(&server.addr()).await;
    // "GET " read as a length is about 1.2 GB: far over the frame limit.
    raw.write(b"GET / HTTP/1.1\r\nHost: baton\r\n\r\n").await;
    raw.expect_closed().await;
    assert_eq!(server.stats().protocol_errors, 1);
    assert_eq!(server.stats().sessions, 0);
    connections_drop_to(&server, 0).await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

/// A first frame longer than any handshake is refused as soon as its
/// length is read: the server sets aside no room for it, even when it is
/// within the limit for requests, and does not wait for the handshake
/// timeout.
#[tokio::test]
async fn a_first_frame_longer_than_a_handshake_closes_the_connection_at_once() {
    let server = TestServer::with_config(Config {
        handshake_timeout: Duration::from_secs(600),
        ..fast_config()
    })
    .await;
    let mut raw = Raw::connect(&server.addr()).await;
    raw.write(&(64u32 << 10).to_be_bytes()).await;
    raw.expect_closed().await;
    assert_eq!(server.stats().protocol_errors, 1);
    connections_drop_to(&server, 0).await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn malformed_handshakes_are_refused_as_malformed_requests() {
    let server = TestServer::start().await;
    let mut good = BytesMut::new();
    ConnectRequest::new(1_000).encode(&mut good);
    let good = good[4..].to_vec();
    let mut wrong_magic = good.clone();
    wrong_magic[..4].copy_from_slice(b"HTTP");
    let mut trailing = good.clone();
    trailing.push(0);
    let short = good[..20].to_vec();
    for (name, payload) in [
        ("wrong magic", wrong_magic),
        ("trailing bytes", trailing),
        ("too short", short),
        ("empty", Vec::new()),
    ] {
        let mut raw = Raw::connect(&server.addr()).await;
        raw.write_frame(&payload).await;
        let frame = raw.read_frame().await.expect("a handshake answer");
        let response = baton::proto::ConnectResponse::decode(frame).unwrap();
        assert_eq!(response.version, PROTOCOL_VERSION);
        let (code, message) = response.result.expect_err(name);
        assert_eq!(code, ErrorCode::MalformedRequest, "{name}: {message}");
        raw.expect_closed().await;
    }
    assert_eq!(server.stats().sessions, 0);
    connections_drop_to(&server, 0).await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn truncated_handshake_then_eof_closes_the_connection() {
    let server = TestServer::start().await;
    let mut raw = Raw::connect(&server.addr()).await;
    let mut hello = BytesMut::new();
    ConnectRequest::new(1_000).encode(&mut hello);
    raw.write(&hello[..10]).await;
    raw.stream.shutdown().await.unwrap();
    raw.expect_closed().await;
    assert_eq!(server.stats().sessions, 0);
    connections_drop_to(&server, 0).await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn connection_without_a_handshake_is_closed_after_the_handshake_timeout() {
    let server = TestServer::with_config(Config {
        handshake_timeout: Duration::from_millis(200),
        ..fast_config()
    })
    .await;
    let mut raw = Raw::connect(&server.addr()).await;
    raw.expect_closed().await;
    connections_drop_to(&server, 0).await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn handshake_with_an_unsupported_version_is_refused() {
    let server = TestServer::start().await;
    for version in [0, PROTOCOL_VERSION + 1, u16::MAX] {
        let mut raw = Raw::connect(&server.addr()).await;
        let request = ConnectRequest {
            version,
            ..ConnectRequest::new(1_000)
        };
        let response = raw.handshake(&request).await;
        assert_eq!(response.version, PROTOCOL_VERSION);
        let (code, _) = response.result.unwrap_err();
        assert_eq!(code, ErrorCode::UnsupportedVersion, "version {version}");
        raw.expect_closed().await;
    }
    assert_eq!(server.stats().sessions, 0);
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn resume_with_a_wrong_secret_is_refused_as_session_expired() {
    let server = TestServer::start().await;
    let mut owner = Raw::open(&server.addr(), 10_000).await;
    let grant = owner.grant().clone();
    let mut wrong = grant.secret;
    wrong.0[0] ^= 1;
    for (id, secret) in [
        (grant.session_id, wrong),
        (grant.session_id, SessionSecret::default()),
        (SessionId(grant.session_id.0 + 1000), grant.secret),
    ] {
        let mut raw = Raw::connect(&server.addr()).await;
        let mut request = ConnectRequest::new(1_000);
        request.resume = Some((id, secret));
        let (code, _) = raw.handshake(&request).await.result.unwrap_err();
        assert_eq!(code, ErrorCode::SessionExpired);
        raw.expect_closed().await;
    }
    // The attempts did not touch the real session or its connection.
    ping_works(&mut owner).await;
    let (_, response) = Raw::resume(&server.addr(), &grant).await;
    assert!(response.result.expect("the owner resumes").resumed);
    assert_eq!(
        owner.expect_disconnect().await.code,
        ErrorCode::SessionMoved
    );
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn oversized_request_frame_gets_frame_too_large_then_close() {
    let config = fast_config();
    let limit = config.max_request_frame();
    let server = TestServer::with_config(config).await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    let grant = raw.grant().clone();
    ping_works(&mut raw).await;
    // Only the length prefix: the server must not wait for the body.
    raw.write(&((limit + 1) as u32).to_be_bytes()).await;
    let notice = raw.expect_disconnect().await;
    assert_eq!(notice.code, ErrorCode::FrameTooLarge);
    assert!(server.stats().protocol_errors >= 1);
    // Only the connection ended; the session can be resumed.
    let (mut again, response) = Raw::resume(&server.addr(), &grant).await;
    assert!(response.result.unwrap().resumed);
    ping_works(&mut again).await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn truncated_request_frame_then_eof_closes_only_that_connection() {
    let server = TestServer::start().await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    let grant = raw.grant().clone();
    let mut partial = BytesMut::new();
    partial.put_u32(100);
    partial.put_slice(&[1; 10]);
    raw.write(&partial).await;
    raw.stream.shutdown().await.unwrap();
    raw.expect_closed().await;
    connections_drop_to(&server, 0).await;
    assert_eq!(server.stats().sessions, 1, "the session lives on");
    let (mut again, response) = Raw::resume(&server.addr(), &grant).await;
    assert!(response.result.unwrap().resumed);
    ping_works(&mut again).await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn unknown_operation_gets_an_error_reply_and_the_connection_keeps_working() {
    let server = TestServer::start().await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    for op in [0u8, baton_proto::OpCode::LAST + 1, 42, 200, 255] {
        let code = rejected(&mut raw, op, b"whatever body").await;
        assert_eq!(code, ErrorCode::UnknownOperation, "op {op}");
        ping_works(&mut raw).await;
    }
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn malformed_request_bodies_get_an_error_reply_and_the_connection_keeps_working() {
    let server = TestServer::start().await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    let path = str16(b"/m");
    let cases: Vec<(&str, u8, Vec<u8>)> = vec![
        ("watch flag 2", 4, [path.clone(), vec![2]].concat()),
        (
            "create mode 7",
            1,
            [path.clone(), vec![7], vec![0; 4]].concat(),
        ),
        ("create without data", 1, [path.clone(), vec![0]].concat()),
        (
            "data length beyond the frame",
            6,
            [path.clone(), vec![0, 0, 1, 0], vec![0]].concat(),
        ),
        ("version presence 5", 2, [path.clone(), vec![5]].concat()),
        ("ping with a body", 7, vec![1, 2, 3]),
        ("trailing bytes", 3, [path.clone(), vec![0, 9]].concat()),
        ("path length beyond the frame", 4, vec![0, 50, b'/']),
        ("empty body", 5, Vec::new()),
        (
            "set watches with a lying count",
            9,
            [vec![0; 8], vec![0xff, 0xff, 0xff, 0xff]].concat(),
        ),
        ("predecessor watch 4", 10, [path.clone(), vec![4]].concat()),
        (
            "enqueue by rule, rule 3",
            19,
            [str16(b"/m/n-"), vec![0; 4], vec![3]].concat(),
        ),
        (
            "enqueue by rule, permits cut short",
            19,
            [str16(b"/m/n-"), vec![0; 4], vec![2, 0, 0]].concat(),
        ),
        (
            "add watch mode 2",
            17,
            [path.clone(), vec![2], vec![0; 8]].concat(),
        ),
        (
            "add watch without from",
            17,
            [path.clone(), vec![0]].concat(),
        ),
        (
            "remove watches kinds 8",
            13,
            [path.clone(), vec![8]].concat(),
        ),
        (
            "enqueue by rule with a byte after its permits",
            19,
            [str16(b"/m/n-"), vec![0; 4], vec![2, 0, 0, 0, 1, 0]].concat(),
        ),
    ];
    for (name, op, body) in cases {
        let code = rejected(&mut raw, op, &body).await;
        assert_eq!(code, ErrorCode::MalformedRequest, "{name}");
        ping_works(&mut raw).await;
    }
    // Nothing was created by the broken requests.
    let reply = raw
        .call(Request::Exists {
            path: "/m".into(),
            watch: false,
        })
        .await;
    assert_eq!(reply, Ok(Reply::Exists(None)));
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn frame_shorter_than_a_request_header_ends_the_connection_with_a_notice() {
    let server = TestServer::start().await;
    for payload in [&[][..], &[0, 0, 0, 1][..]] {
        let mut raw = Raw::open(&server.addr(), 10_000).await;
        ping_works(&mut raw).await;
        raw.write_frame(payload).await;
        let notice = raw.expect_disconnect().await;
        assert_eq!(notice.code, ErrorCode::MalformedRequest);
    }
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn invalid_paths_are_rejected_with_invalid_path() {
    let server = TestServer::start().await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    let too_long = [b"/".as_slice(), &[b'x'; MAX_PATH_LEN]].concat();
    let paths: Vec<&[u8]> = vec![
        b"relative",
        b"a/b",
        b"",
        b"//",
        b"/a//b",
        b"/a/",
        b"/.",
        b"/a/.",
        b"/a/..",
        b"/./a",
        b"/../a",
        b"/a\0b",
        b"/\0",
        b"/a\nb",
        b"/a\x7f",
        b"/a\xff",
        b"/\xc3",
        b"/\xed\xa0\x80",
        &too_long,
    ];
    for path in paths {
        let shown = String::from_utf8_lossy(path).into_owned();
        let field = str16(path);
        let body = |tail: &[u8]| [field.clone(), tail.to_vec()].concat();
        // get data, create, delete, set data, get children, set watches
        let requests = [
            (4, body(&[0])),
            (1, body(&[0, 0, 0, 0, 0])),
            (2, body(&[0])),
            (6, body(&[0, 0, 0, 0, 0])),
            (5, body(&[1])),
            (
                9,
                [vec![0; 8], vec![0, 0, 0, 1], field.clone(), vec![0; 8]].concat(),
            ),
        ];
        for (op, body) in requests {
            let code = rejected(&mut raw, op, &body).await;
            assert_eq!(code, ErrorCode::InvalidPath, "op {op} path {shown:?}");
        }
    }
    ping_works(&mut raw).await;
    assert_eq!(server.stats().watches, 0, "no watch was set");
    assert_eq!(server.stats().nodes, 1, "only the root");

    // The client library checks paths before sending them.
    let client = server.client().await;
    for path in ["relative", "", "//", "/a/", "/a/.", "/a/../b", "/a\0b"] {
        let result = client.create(path, "", CreateMode::Persistent).await;
        assert!(matches!(result, Err(Error::InvalidPath(_))), "{path:?}");
        let result = client.get_data_watch(path).await;
        assert!(matches!(result, Err(Error::InvalidPath(_))), "{path:?}");
    }
    client.ping().await.unwrap();
    assert_eq!(client.state(), SessionState::Connected);
    client.close().await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn data_over_the_limit_is_rejected_with_value_too_large() {
    const MAX: usize = 1024;
    let server = TestServer::with_config(Config {
        max_data: MAX,
        ..fast_config()
    })
    .await;
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    assert_eq!(raw.grant().max_data as usize, MAX);
    let create = |data: Vec<u8>| Request::Create {
        path: "/v".into(),
        data: data.into(),
        mode: CreateMode::Persistent,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    };
    let set = |data: Vec<u8>| Request::SetData {
        path: "/v".into(),
        data: data.into(),
        version: None,
        fence: None,
    };
    assert_eq!(
        error_code(raw.call(create(vec![1; MAX + 1])).await),
        ErrorCode::ValueTooLarge
    );
    let absent = raw
        .call(Request::Exists {
            path: "/v".into(),
            watch: false,
        })
        .await;
    assert_eq!(absent, Ok(Reply::Exists(None)), "the node was not created");
    assert!(raw.call(create(vec![1; MAX])).await.is_ok(), "at the limit");
    assert_eq!(
        error_code(raw.call(set(vec![2; MAX + 1])).await),
        ErrorCode::ValueTooLarge
    );
    match raw
        .call(Request::GetData {
            path: "/v".into(),
            watch: false,
        })
        .await
    {
        Ok(Reply::GetData { data, stat }) => {
            assert_eq!(data.len(), MAX);
            assert_eq!(stat.version, 0, "the oversized set changed nothing");
        }
        other => panic!("{other:?}"),
    }
    ping_works(&mut raw).await;

    // The client library knows the limit from the handshake.
    let client = server.client().await;
    let result = client.set_data("/v", vec![0; MAX + 1], None).await;
    assert!(matches!(result, Err(Error::ValueTooLarge(_))), "{result:?}");
    client.set_data("/v", vec![0; MAX], None).await.unwrap();
    client.close().await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn largest_legal_request_is_accepted() {
    let config = fast_config();
    let max_data = config.max_data;
    let server = TestServer::with_config(config).await;
    let client = server.client().await;
    let long = format!("/{}", "p".repeat(MAX_PATH_LEN - 1));
    let created = client
        .create(&long, vec![9; max_data], CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(created.path, long);
    let (data, _) = client.get_data(&long).await.unwrap();
    assert_eq!(data.len(), max_data);
    client.close().await;
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn connections_over_the_limit_are_refused() {
    let server = TestServer::with_config(Config {
        max_connections: 2,
        ..fast_config()
    })
    .await;
    let first = Raw::open(&server.addr(), 10_000).await;
    let _second = Raw::open(&server.addr(), 10_000).await;
    let mut third = Raw::connect(&server.addr()).await;
    let (code, _) = third
        .handshake(&ConnectRequest::new(1_000))
        .await
        .result
        .unwrap_err();
    assert_eq!(code, ErrorCode::TooManyConnections);
    let result = Client::connect(&server.addr()).await;
    assert!(
        matches!(result, Err(Error::TooManyConnections(_))),
        "{result:?}"
    );
    assert!(server.stats().connections_refused >= 2);
    drop(first);
    connections_drop_to(&server, 1).await;
    let client = server.client().await;
    client.ping().await.unwrap();
    client.close().await;
    server.stop().await;
}

#[tokio::test]
async fn bad_input_leaves_other_clients_unaffected() {
    let config = Config {
        max_data: 1024,
        ..fast_config()
    };
    let limit = config.max_request_frame();
    let server = TestServer::with_config(config).await;
    let bystander = server.client().await;
    bystander
        .create("/bystander", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let (_, _, mut watch) = bystander.get_data_watch("/bystander").await.unwrap();
    let mut states = bystander.state_changes();
    states.borrow_and_update();

    // Garbage before a handshake.
    let mut raw = Raw::connect(&server.addr()).await;
    raw.write(&[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]).await;
    raw.expect_closed().await;
    // A bad version.
    let mut raw = Raw::connect(&server.addr()).await;
    let request = ConnectRequest {
        version: 9,
        ..ConnectRequest::new(1_000)
    };
    assert!(raw.handshake(&request).await.result.is_err());
    // Bad requests on a live session, then an oversized frame.
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    assert_eq!(
        rejected(&mut raw, 99, &[]).await,
        ErrorCode::UnknownOperation
    );
    assert_eq!(
        rejected(&mut raw, 4, &[0, 1, b'x', 0]).await,
        ErrorCode::InvalidPath
    );
    assert_eq!(
        rejected(&mut raw, 4, &[0, 1]).await,
        ErrorCode::MalformedRequest
    );
    let big = Request::Create {
        path: "/big".into(),
        data: vec![0; 2048].into(),
        mode: CreateMode::Persistent,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    };
    assert_eq!(error_code(raw.call(big).await), ErrorCode::ValueTooLarge);
    raw.write(&((limit + 1) as u32).to_be_bytes()).await;
    assert_eq!(raw.expect_disconnect().await.code, ErrorCode::FrameTooLarge);
    // A truncated frame and a vanished peer.
    let mut raw = Raw::open(&server.addr(), 10_000).await;
    raw.write(&[0, 0, 0, 50, 1, 2]).await;
    drop(raw);

    connections_drop_to(&server, 1).await;
    // The bystander saw nothing: still connected, never disconnected, its
    // watch not fired, its node in place, and it works.
    assert!(!states.has_changed().unwrap(), "{:?}", *states.borrow());
    assert_eq!(bystander.state(), SessionState::Connected);
    bystander.ping().await.unwrap();
    assert!(futures::poll!(&mut watch).is_pending());
    bystander.set_data("/bystander", "x", None).await.unwrap();
    let event = within(5, "the bystander's watch", watch).await.unwrap();
    assert_eq!(event.kind, EventKind::DataChanged);
    assert_eq!(server.stats().sessions_expired, 0);
    assert_server_healthy(&server).await;
    bystander.close().await;
    server.stop().await;
}

// --- Slow clients -----------------------------------------------------------

/// Small buffers, so that slow-client limits are reached quickly.
fn slow_client_config() -> Config {
    let max_data = 256 * 1024;
    Config {
        max_data,
        // The least Config::validate allows: two of the largest replies.
        max_outbound_bytes: 2 * (max_data + baton::proto::REQUEST_OVERHEAD),
        // A client that takes no bytes for this long is disconnected.
        write_stall_timeout: std::time::Duration::from_millis(500),
        // Room for the thousands of watches on long paths these tests set.
        max_watch_bytes: 64 << 20,
        ..fast_config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_flooding_requests_without_reading_is_disconnected() {
    let config = slow_client_config();
    let max_data = config.max_data;
    let server = TestServer::with_config(config).await;
    let writer = server.client().await;
    writer
        .create("/big", vec![5; max_data], CreateMode::Persistent)
        .await
        .unwrap();

    // 2,000 reads of the big node would be 500 MiB of replies; the client
    // sends them all and reads nothing.
    const FLOOD: u64 = 2_000;
    let mut raw = Raw::connect_small_buffer(&server.addr()).await;
    let grant = raw
        .handshake(&ConnectRequest::new(60_000))
        .await
        .result
        .unwrap();
    raw.grant = Some(grant);
    let requests_before = server.stats().requests;
    let mut flood = BytesMut::new();
    for _ in 0..FLOOD {
        raw.encode(
            Request::GetData {
                path: "/big".into(),
                watch: false,
            },
            &mut flood,
        );
    }
    raw.write(&flood).await;

    eventually(10, "the server to disconnect the flooding client", || {
        server.stats().slow_client_disconnects >= 1
    })
    .await;
    connections_drop_to(&server, 1).await;
    let handled = server.stats().requests - requests_before;
    assert!(
        handled < FLOOD,
        "the server stopped reading: {handled} handled"
    );
    writer.get_data("/big").await.unwrap();
    writer.close().await;
    drop(raw);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_flooding_requests_without_reading_is_throttled() {
    let config = slow_client_config();
    let max_data = config.max_data;
    let limit = config.max_outbound_bytes;
    let server = TestServer::with_config(config).await;
    let writer = server.client().await;
    writer
        .create("/big", vec![5; max_data], CreateMode::Persistent)
        .await
        .unwrap();

    const FLOOD: u64 = 2_000;
    let mut raw = Raw::connect_small_buffer(&server.addr()).await;
    let grant = raw
        .handshake(&ConnectRequest::new(60_000))
        .await
        .result
        .unwrap();
    raw.grant = Some(grant);
    let requests_before = server.stats().requests;
    let mut flood = BytesMut::new();
    for _ in 0..FLOOD {
        raw.encode(
            Request::GetData {
                path: "/big".into(),
                watch: false,
            },
            &mut flood,
        );
    }
    raw.write(&flood).await;

    // The clock: a silent session that expires after a second. Unthrottled,
    // the server would have handled the whole flood (already in its socket)
    // in a small fraction of that.
    let clock = connect_with_timeout(&server.addr(), Duration::from_secs(1)).await;
    clock
        .create("/clock", "", CreateMode::Ephemeral)
        .await
        .unwrap();
    let (_, tick) = writer.exists_watch("/clock").await.unwrap();
    drop(clock);
    within(10, "the clock session to expire", tick)
        .await
        .unwrap();

    let handled = server.stats().requests - requests_before;
    // What the server may have answered: its queue, plus what the kernel
    // buffers hold (a few MiB on loopback).
    let bound = ((limit + (8 << 20)) / max_data) as u64;
    assert!(
        handled < bound,
        "{handled} of {FLOOD} requests handled; at most {bound} expected"
    );
    writer.get_data("/big").await.unwrap();
    writer.close().await;
    drop(raw);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_clients_connection_is_closed_once_its_session_expired() {
    let config = slow_client_config();
    let max_data = config.max_data;
    let server = TestServer::with_config(config).await;
    let writer = server.client().await;
    writer
        .create("/big", vec![5; max_data], CreateMode::Persistent)
        .await
        .unwrap();
    let mut raw = Raw::connect_small_buffer(&server.addr()).await;
    let grant = raw
        .handshake(&ConnectRequest::new(300))
        .await
        .result
        .unwrap();
    raw.grant = Some(grant);
    let mut flood = BytesMut::new();
    for _ in 0..2_000 {
        raw.encode(
            Request::GetData {
                path: "/big".into(),
                watch: false,
            },
            &mut flood,
        );
    }
    raw.write(&flood).await;
    // The server reads no more of its requests, so it hears nothing from
    // the session, which expires.
    eventually(10, "the flooding session to expire", || {
        server.stats().sessions_expired == 1
    })
    .await;
    // The server then gives the client a few seconds to take its last
    // frames, and closes the connection whether or not it did.
    eventually(
        12,
        "the server to close the expired session's connection",
        || server.stats().connections_open == 1,
    )
    .await;
    writer.get_data("/big").await.unwrap();
    writer.close().await;
    drop(raw);
    server.stop().await;
}

/// A raw client watching `n` nodes with long names, which then stops
/// reading. Returns the client and the names.
async fn watching_client(server: &TestServer, writer: &Client, n: usize) -> (Raw, Vec<String>) {
    writer
        .create("/flood", "", CreateMode::Persistent)
        .await
        .unwrap();
    let stem = "n".repeat(3_900);
    let paths: Vec<String> = (0..n).map(|i| format!("/flood/{stem}{i}")).collect();
    let creates = paths
        .iter()
        .map(|p| writer.create(p, "", CreateMode::Ephemeral));
    for created in within(60, "the nodes", join_in_order(creates)).await {
        created.unwrap();
    }
    let mut raw = Raw::connect_small_buffer(&server.addr()).await;
    let grant = raw
        .handshake(&ConnectRequest::new(60_000))
        .await
        .result
        .unwrap();
    raw.grant = Some(grant);
    let mut batch = BytesMut::new();
    let mut last = 0;
    for p in &paths {
        last = raw.encode(
            Request::Exists {
                path: p.clone(),
                watch: true,
            },
            &mut batch,
        );
    }
    raw.write(&batch).await;
    // Read every reply, so the watches are all set.
    let mut xid = 0;
    while xid != last {
        xid = raw.reply_to(xid + 1).await.xid;
    }
    assert_eq!(server.stats().watches as usize, n);
    (raw, paths)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_not_reading_a_burst_of_events_is_disconnected() {
    let server = TestServer::with_config(slow_client_config()).await;
    let writer = server.client().await;
    let owner = server.client().await;
    let (raw, _) = watching_client(&server, &owner, 3_000).await;
    // Closing the owner deletes its 3,000 ephemerals in one step: 12 MB of
    // events for a client that reads nothing.
    owner.close().await;
    eventually(10, "the server to disconnect the slow client", || {
        server.stats().slow_client_disconnects >= 1
    })
    .await;
    connections_drop_to(&server, 1).await;
    writer.ping().await.unwrap();
    writer.close().await;
    drop(raw);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_not_reading_a_stream_of_events_is_disconnected() {
    let server = TestServer::with_config(slow_client_config()).await;
    let writer = server.client().await;
    let (raw, paths) = watching_client(&server, &writer, 3_000).await;
    // One change at a time: the server sends events as they come until the
    // client's socket is full, then queues them until its limit.
    let mut changes = paths.iter().map(|p| writer.set_data(p, "x", None));
    within(60, "3,000 changes", async {
        for set in &mut changes {
            set.await.unwrap();
            if server.stats().slow_client_disconnects >= 1 {
                break;
            }
        }
    })
    .await;
    eventually(10, "the server to disconnect the slow client", || {
        server.stats().slow_client_disconnects >= 1
    })
    .await;
    connections_drop_to(&server, 1).await;
    writer.ping().await.unwrap();
    writer.close().await;
    drop(raw);
    server.stop().await;
}

/// A reply too large for the connection's outbox (a child list past the
/// outbound limit, but within the response frame limit) gets a typed
/// `response-too-large` error; the connection and session go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_too_large_for_the_outbox_is_an_error_not_a_disconnect() {
    let config = Config {
        max_data: 1024,
        max_outbound_bytes: 64 * 1024,
        ..fast_config()
    };
    let server = TestServer::with_config(config).await;
    let c = server.client().await;
    let states = c.state_changes();
    c.create("/big", "", CreateMode::Persistent).await.unwrap();
    let name = "n".repeat(100);
    let creates = (0..1000).map(|i| {
        let c = c.clone();
        let path = format!("/big/{name}{i:04}");
        async move { c.create(&path, "", CreateMode::Persistent).await }
    });
    for created in futures::future::join_all(creates).await {
        created.unwrap();
    }
    let listed = c.get_children("/big").await;
    match listed {
        Err(Error::Server {
            code: ErrorCode::ResponseTooLarge,
            ref message,
        }) => {
            assert!(message.contains("1000 children"), "{message}");
        }
        other => panic!("expected response-too-large, got {other:?}"),
    }
    // The same connection goes on: nothing was lost, nothing reconnected.
    c.ping().await.unwrap();
    assert_eq!(c.exists("/big").await.unwrap().unwrap().num_children, 1000);
    assert!(
        !states.has_changed().unwrap(),
        "the session's connection was not cut: {:?}",
        *states.borrow()
    );
    assert_eq!(server.handle.stats().slow_client_disconnects, 0);
    c.close().await;
    server.stop().await;
}

/// One session cannot grow the server without bound by watching paths that
/// do not exist: past its watch budget a watch is refused with a typed
/// error, the read is not answered with a watch it does not hold, and
/// watches that fire give their room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_past_the_per_session_budget_are_refused() {
    let budget = 100 * (4000 + 64);
    let config = Config {
        max_watch_bytes: budget,
        ..fast_config()
    };
    let server = TestServer::with_config(config).await;
    let c = server.client().await;
    let long = |i: usize| format!("/{}{i:05}", "w".repeat(3994));
    let mut watchers = Vec::new();
    for i in 0..100 {
        let (stat, w) = c.exists_watch(&long(i)).await.unwrap();
        assert!(stat.is_none());
        watchers.push(w);
    }
    let refused = c.exists_watch(&long(100)).await;
    match refused {
        Err(Error::Server { code, message }) => {
            assert_eq!(code, ErrorCode::TooManyWatches, "{message}");
            assert!(message.contains("--max-watch-bytes"), "{message}");
        }
        other => panic!("expected too-many-watches, got {other:?}"),
    }
    assert!(matches!(
        c.get_data_watch("/").await,
        Err(Error::Server {
            code: ErrorCode::TooManyWatches,
            ..
        })
    ));
    // A read without a watch still works, and another session has its own
    // budget.
    c.get_data("/").await.unwrap();
    let other = server.client().await;
    let (_, _others) = other.exists_watch(&long(100)).await.unwrap();
    assert_eq!(server.handle.stats().watches, 101);
    // A watch that fires gives its room back.
    other
        .create(&long(0), "", CreateMode::Persistent)
        .await
        .unwrap();
    let fired = tokio::time::timeout(Duration::from_secs(5), watchers.swap_remove(0))
        .await
        .expect("the watch fired")
        .unwrap();
    assert_eq!(fired.kind, EventKind::Created);
    let (_, _again) = c.exists_watch(&long(101)).await.unwrap();
    c.close().await;
    other.close().await;
    server.stop().await;
}
