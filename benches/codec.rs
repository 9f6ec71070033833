//! The wire codec: request frames as a client encodes them and the server
//! decodes them, and replies and watch events going the other way.
//!
//! The messages are those of a lock handover under `/locks/orders`: a
//! contender joins the queue (enqueue), the holder leaves it (delete), the
//! next contender is told that it heads the queue (a head event); and the
//! ephemeral-sequential create that a plain recipe would send instead of
//! the enqueue.
//!
//! Encoders append one frame to a buffer that is cleared and reused, as the
//! client's write buffer and the server's outbox are. Decoders take the
//! payload of one frame (without its length prefix), as the framing codec
//! hands it over; each iteration gets its own handle to the payload, made
//! outside the timing.

use baton::proto::frame::HEADER_LEN;
use baton::proto::response::{encode_event, encode_reply};
use baton::proto::{
    CreateMode, ErrorReply, EventKind, OpCode, Reply, Request, RequestFrame, ServerMessage, Stat,
};
use bytes::{Bytes, BytesMut};
use divan::{black_box, Bencher};

fn main() {
    divan::main();
}

/// The prefix a contender of session 0x4d2 asks for: the recipe's
/// `<lock>/lock-<session>-<n>-`.
const PREFIX: &str = "/locks/orders/lock-4d2-0-";
/// The node the server makes of it (the prefix and a 10-digit sequence).
const NODE: &str = "/locks/orders/lock-4d2-0-0000001234";
/// The node queued just before it.
const PREDECESSOR: &str = "/locks/orders/lock-4d1-0-0000001233";
/// What a contender stores in its node: who it is.
const IDENTITY: &[u8] = b"worker-7 pid 4242";
const XID: u32 = 17;
/// Samples per benchmark, and iterations per sample: fixed, so that a slow
/// first sample cannot leave divan timing one iteration at a time.
const SAMPLES: u32 = 500;
const ENCODES_PER_SAMPLE: u32 = 1_000;
const DECODES_PER_SAMPLE: u32 = 200;
const REVISION: u64 = 1234;

fn stat(czxid: u64, owner: u64) -> Stat {
    Stat {
        czxid,
        mzxid: czxid,
        pzxid: czxid,
        ctime: 1_767_225_600_000,
        mtime: 1_767_225_600_000,
        version: 0,
        cversion: 0,
        ephemeral_owner: owner,
        data_length: IDENTITY.len() as u32,
        num_children: 0,
    }
}

fn create_request() -> RequestFrame {
    RequestFrame {
        xid: XID,
        request: Request::Create {
            path: PREFIX.to_owned(),
            data: Bytes::from_static(IDENTITY),
            mode: CreateMode::EphemeralSequential,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        },
    }
}

fn delete_request() -> RequestFrame {
    RequestFrame {
        xid: XID,
        request: Request::Delete {
            path: NODE.to_owned(),
            version: None,
            fence: None,
        },
    }
}

fn enqueue_request() -> RequestFrame {
    RequestFrame {
        xid: XID,
        request: Request::Enqueue {
            path: PREFIX.to_owned(),
            data: Bytes::from_static(IDENTITY),
            rule: Default::default(),
        },
    }
}

fn create_reply() -> Result<Reply, ErrorReply> {
    Ok(Reply::Create {
        path: NODE.to_owned(),
        sequence: Some(REVISION),
        stat: stat(REVISION, 0x4d2),
    })
}

fn enqueue_reply() -> Result<Reply, ErrorReply> {
    Ok(Reply::Enqueue {
        path: NODE.to_owned(),
        sequence: REVISION,
        stat: stat(REVISION, 0x4d2),
        predecessor: Some((PREDECESSOR.to_owned(), stat(REVISION - 1, 0x4d1))),
    })
}

/// One encoded frame's payload, without its length prefix.
fn payload(encode: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut buf = BytesMut::new();
    encode(&mut buf);
    buf.split_off(HEADER_LEN).freeze()
}

fn encode_into(bencher: Bencher, mut encode: impl FnMut(&mut BytesMut)) {
    let mut buf = BytesMut::with_capacity(4096);
    bencher.bench_local(|| {
        buf.clear();
        encode(black_box(&mut buf));
        buf.len()
    });
}

/// Requests, as the client encodes them and the server decodes them.
mod request {
    use super::*;

    #[divan::bench_group(sample_count = SAMPLES, sample_size = ENCODES_PER_SAMPLE)]
    mod encode {
        use super::*;

        #[divan::bench]
        fn create(bencher: Bencher) {
            let frame = create_request();
            encode_into(bencher, |buf| black_box(&frame).encode(buf));
        }

        #[divan::bench]
        fn delete(bencher: Bencher) {
            let frame = delete_request();
            encode_into(bencher, |buf| black_box(&frame).encode(buf));
        }

        #[divan::bench]
        fn enqueue(bencher: Bencher) {
            let frame = enqueue_request();
            encode_into(bencher, |buf| black_box(&frame).encode(buf));
        }
    }

    #[divan::bench_group(sample_count = SAMPLES, sample_size = DECODES_PER_SAMPLE)]
    mod decode {
        use super::*;

        fn decode(bencher: Bencher, frame: RequestFrame) {
            let bytes = payload(|buf| frame.encode(buf));
            assert_eq!(RequestFrame::decode(bytes.clone()), Ok(frame));
            bencher
                .with_inputs(|| bytes.clone())
                .bench_local_values(|p| RequestFrame::decode(black_box(p)));
        }

        #[divan::bench]
        fn create(bencher: Bencher) {
            decode(bencher, create_request());
        }

        #[divan::bench]
        fn delete(bencher: Bencher) {
            decode(bencher, delete_request());
        }

        #[divan::bench]
        fn enqueue(bencher: Bencher) {
            decode(bencher, enqueue_request());
        }
    }
}

/// Replies and a watch event, as the server encodes them and the client
/// decodes them.
mod response {
    use super::*;

    #[divan::bench_group(sample_count = SAMPLES, sample_size = ENCODES_PER_SAMPLE)]
    mod encode {
        use super::*;

        #[divan::bench]
        fn create(bencher: Bencher) {
            let reply = create_reply();
            encode_into(bencher, |buf| {
                encode_reply(buf, XID, OpCode::Create as u8, REVISION, black_box(&reply))
            });
        }

        #[divan::bench]
        fn delete(bencher: Bencher) {
            let reply = Ok(Reply::Delete);
            encode_into(bencher, |buf| {
                encode_reply(buf, XID, OpCode::Delete as u8, REVISION, black_box(&reply))
            });
        }

        #[divan::bench]
        fn enqueue(bencher: Bencher) {
            let reply = enqueue_reply();
            encode_into(bencher, |buf| {
                encode_reply(buf, XID, OpCode::Enqueue as u8, REVISION, black_box(&reply))
            });
        }

        #[divan::bench]
        fn event_head(bencher: Bencher) {
            encode_into(bencher, |buf| {
                encode_event(buf, EventKind::Head, REVISION, black_box(NODE))
            });
        }
    }

    #[divan::bench_group(sample_count = SAMPLES, sample_size = DECODES_PER_SAMPLE)]
    mod decode {
        use super::*;

        fn decode(bencher: Bencher, encode: impl FnOnce(&mut BytesMut)) {
            let bytes = payload(encode);
            ServerMessage::decode(bytes.clone()).expect("a valid server message");
            bencher
                .with_inputs(|| bytes.clone())
                .bench_local_values(|p| ServerMessage::decode(black_box(p)));
        }

        #[divan::bench]
        fn create(bencher: Bencher) {
            decode(bencher, |buf| {
                encode_reply(buf, XID, OpCode::Create as u8, REVISION, &create_reply())
            });
        }

        #[divan::bench]
        fn delete(bencher: Bencher) {
            decode(bencher, |buf| {
                encode_reply(buf, XID, OpCode::Delete as u8, REVISION, &Ok(Reply::Delete))
            });
        }

        #[divan::bench]
        fn enqueue(bencher: Bencher) {
            decode(bencher, |buf| {
                encode_reply(buf, XID, OpCode::Enqueue as u8, REVISION, &enqueue_reply())
            });
        }

        #[divan::bench]
        fn event_head(bencher: Bencher) {
            decode(bencher, |buf| {
                encode_event(buf, EventKind::Head, REVISION, NODE)
            });
        }
    }
}
