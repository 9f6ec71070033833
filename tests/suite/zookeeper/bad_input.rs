//! Bad input on the ZooKeeper port, in raw bytes: each gets ZooKeeper's
//! error code or closes that connection only, and everyone else is served.

use std::time::Duration;

use baton_testkit::{assert_server_healthy, within};
use baton_zk::codes::{err, op};
use baton_zk::jute::JuteReader;
use baton_zk::{ConnectRequest, ConnectResponse, ReplyHeader, Request};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zookeeper_client as zk;

use super::{open, zk_addr, zk_client, zk_server};

async fn read_frame(s: &mut TcpStream) -> Option<Bytes> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(Bytes::from(body))
}

/// The server closes the connection without answering.
async fn expect_closed(s: &mut TcpStream) {
    let mut rest = Vec::new();
    let read = within(
        10,
        "the server to close the connection",
        s.read_to_end(&mut rest),
    )
    .await;
    // A reset is a close too; a clean close must come with no answer.
    if read.is_ok() {
        assert!(rest.is_empty(), "answered before closing: {rest:?}");
    }
}

/// A raw session: connected, its connect response read.
async fn raw_session(addr: &str, session_id: i64, passwd: Bytes) -> (TcpStream, ConnectResponse) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = BytesMut::new();
    ConnectRequest {
        protocol_version: 0,
        last_zxid_seen: 0,
        timeout_ms: 10_000,
        session_id,
        passwd,
        read_only: Some(false),
    }
    .encode(&mut buf);
    s.write_all(&buf).await.unwrap();
    let frame = within(10, "the connect response", read_frame(&mut s))
        .await
        .expect("a connect response");
    (s, ConnectResponse::decode(&frame).unwrap())
}

/// Sends a request (`body`: its op code and fields) and reads its reply.
async fn call(s: &mut TcpStream, xid: i32, body: &[u8]) -> (ReplyHeader, Bytes) {
    let mut frame = BytesMut::new();
    frame.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    frame.extend_from_slice(&xid.to_be_bytes());
    frame.extend_from_slice(body);
    s.write_all(&frame).await.unwrap();
    let reply = within(10, "a reply", read_frame(s)).await.expect("a reply");
    let mut r = JuteReader::new(&reply);
    let header = ReplyHeader::decode(&mut r).unwrap();
    (header, reply.slice(ReplyHeader::LEN..))
}

#[tokio::test]
async fn bad_requests_get_zookeepers_errors_and_the_connection_goes_on() {
    let server = zk_server().await;
    let addr = zk_addr(&server).to_string();
    let (mut s, granted) = raw_session(&addr, 0, Bytes::from_static(&[0; 16])).await;
    assert!(granted.timeout_ms > 0 && granted.session_id != 0 && granted.passwd.len() == 16);

    // An unknown op code: unimplemented.
    let mut body = 999i32.to_be_bytes().to_vec();
    body.extend_from_slice(b"whatever");
    let (h, _) = call(&mut s, 1, &body).await;
    assert_eq!((h.xid, h.err), (1, err::UNIMPLEMENTED));
    // A body cut short: a marshalling error.
    let mut body = op::GET_DATA.to_be_bytes().to_vec();
    body.extend_from_slice(&100i32.to_be_bytes()); // a path of 100 bytes, absent
    let (h, _) = call(&mut s, 2, &body).await;
    assert_eq!((h.xid, h.err), (2, err::MARSHALLING_ERROR));
    // An invalid path: bad arguments.
    let mut buf = BytesMut::new();
    Request::GetData {
        path: "no-slash".into(),
        watch: false,
    }
    .encode(3, &mut buf);
    let (h, _) = call(&mut s, 3, &buf[8..]).await;
    assert_eq!((h.xid, h.err), (3, err::BAD_ARGUMENTS));
    // Reconfig and SASL: clear refusals.
    let (h, _) = call(&mut s, 4, &op::RECONFIG.to_be_bytes()).await;
    assert_eq!(h.err, err::RECONFIG_DISABLED);
    let (h, _) = call(&mut s, 5, &op::SASL.to_be_bytes()).await;
    assert_eq!(h.err, err::AUTH_FAILED);
    // addWatch's reply carries an error response of 0, as ZooKeeper's
    // (Java's client reads it, and reconnects if it is missing).
    let mut buf = BytesMut::new();
    Request::AddWatch {
        path: "/".into(),
        mode: 1,
    }
    .encode(7, &mut buf);
    let (h, body) = call(&mut s, 7, &buf[8..]).await;
    assert_eq!((h.xid, h.err, &body[..]), (7, err::OK, &[0u8, 0, 0, 0][..]));
    // The connection still serves.
    let mut buf = BytesMut::new();
    Request::Exists {
        path: "/".into(),
        watch: false,
    }
    .encode(6, &mut buf);
    let (h, body) = call(&mut s, 6, &buf[8..]).await;
    assert_eq!((h.xid, h.err), (6, err::OK));
    assert_eq!(body.len(), baton_zk::Stat::LEN);

    // A frame shorter than its header, then one larger than the limit: those
    // connections close, and only those.
    s.write_all(&[0, 0, 0, 2, 0, 1]).await.unwrap();
    expect_closed(&mut s).await;
    let (mut s, _) = raw_session(&addr, 0, Bytes::from_static(&[0; 16])).await;
    s.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    expect_closed(&mut s).await;
    // Garbage instead of a connect request.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&[0, 0, 0, 3, 1, 2, 3]).await.unwrap();
    expect_closed(&mut s).await;

    // A resume with a wrong password: expired (timeout 0), as ZooKeeper does.
    let (_s, answer) = raw_session(&addr, granted.session_id, Bytes::from_static(&[7; 16])).await;
    assert_eq!(answer.timeout_ms, 0, "{answer:?}");

    let c = zk_client(&addr, Duration::from_secs(10)).await;
    c.create("/fine", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    assert_server_healthy(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn four_letter_words_answer_only_from_the_list() {
    let server = zk_server().await;
    let addr = zk_addr(&server).to_string();
    let word = |w: &'static str| {
        let addr = addr.clone();
        async move {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(w.as_bytes()).await.unwrap();
            let mut out = String::new();
            within(
                10,
                "a four-letter word's answer",
                s.read_to_string(&mut out),
            )
            .await
            .unwrap();
            out
        }
    };
    assert_eq!(word("ruok").await, "imok");
    assert_eq!(word("isro").await, "rw");
    let srvr = word("srvr").await;
    assert!(
        srvr.contains("Mode: standalone") && srvr.contains("Zxid: 0x"),
        "{srvr}"
    );
    let mntr = word("mntr").await;
    assert!(
        mntr.contains("zk_server_state\tstandalone") && mntr.contains("zk_znode_count\t"),
        "{mntr}"
    );
    // Not in the default list: refused as ZooKeeper refuses it.
    assert_eq!(
        word("envi").await,
        "envi is not executed because it is not in the whitelist.\n"
    );
    server.stop().await;
}

/// setWatches2 on a resumed session, in raw bytes: the persistent watches
/// it names are set again (reporting changes from then on, as ZooKeeper's),
/// and a data watch whose node changed after the client's zxid fires at
/// once.
#[tokio::test]
async fn set_watches2_sets_persistent_watches_again() {
    let server = zk_server().await;
    let addr = zk_addr(&server).to_string();
    let c = zk_client(&addr, Duration::from_secs(10)).await;
    c.create("/q", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let (first, granted) = raw_session(&addr, 0, Bytes::from_static(&[0; 16])).await;
    drop(first);
    let seen = c.check_stat("/q").await.unwrap().unwrap().mzxid;
    c.set_data("/q", b"changed", None).await.unwrap();

    let (mut s, again) = raw_session(&addr, granted.session_id, granted.passwd.clone()).await;
    assert_eq!(again.session_id, granted.session_id, "resumed");
    let mut buf = BytesMut::new();
    Request::SetWatches {
        relative_zxid: seen,
        data: vec!["/q".into()],
        exist: vec![],
        child: vec![],
        persistent: vec![],
        recursive: vec!["/q".into()],
    }
    .encode(baton_zk::codes::xid::SET_WATCHES, &mut buf);
    s.write_all(&buf).await.unwrap();
    // The data watch fires at once (its node changed after `seen`), then the
    // reply.
    let mut frames = Vec::new();
    for _ in 0..2 {
        let f = within(10, "a frame", read_frame(&mut s))
            .await
            .expect("a frame");
        let mut r = JuteReader::new(&f);
        let h = ReplyHeader::decode(&mut r).unwrap();
        let event = (h.xid == -1).then(|| {
            (
                r.int("type").unwrap(),
                r.int("state").unwrap(),
                r.ustring("path").unwrap(),
            )
        });
        frames.push((h.xid, h.err, event));
    }
    assert_eq!(
        frames[0],
        (-1, 0, Some((3, 3, "/q".to_string()))),
        "{frames:?}"
    );
    assert_eq!(
        frames[1],
        (baton_zk::codes::xid::SET_WATCHES, 0, None),
        "{frames:?}"
    );
    // The recursive watch reports what changes from now on.
    c.create("/q/new", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let f = within(10, "the persistent watch's event", read_frame(&mut s))
        .await
        .expect("a frame");
    let mut r = JuteReader::new(&f);
    let h = ReplyHeader::decode(&mut r).unwrap();
    assert_eq!(h.xid, -1);
    let event = (
        r.int("type").unwrap(),
        r.int("state").unwrap(),
        r.ustring("path").unwrap(),
    );
    assert_eq!(
        event,
        (1, 3, "/q/new".to_string()),
        "node created, connected"
    );
    server.stop().await;
}

/// As ZooKeeper does, a server that has not applied the zxid a client has
/// seen closes the connection unanswered (the client tries another server),
/// and serves a client that saw no later zxid.
#[tokio::test]
async fn a_client_that_saw_a_later_zxid_is_not_served() {
    let server = zk_server().await;
    let addr = zk_addr(&server).to_string();
    let revision = server.client().await.sync().await.unwrap() as i64;
    for (seen, served) in [(revision + 5, false), (revision, true)] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut buf = BytesMut::new();
        ConnectRequest {
            protocol_version: 0,
            last_zxid_seen: seen,
            timeout_ms: 10_000,
            session_id: 0,
            passwd: Bytes::from_static(&[0; 16]),
            read_only: Some(false),
        }
        .encode(&mut buf);
        s.write_all(&buf).await.unwrap();
        if served {
            let frame = within(10, "the connect response", read_frame(&mut s))
                .await
                .expect("a connect response");
            assert!(ConnectResponse::decode(&frame).unwrap().session_id != 0);
        } else {
            expect_closed(&mut s).await;
        }
    }
    assert_server_healthy(&server).await;
    server.stop().await;
}
