//! Tests of the peer network.

use super::dial::*;
use super::wire::*;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use tokio::net::TcpListener;
use tokio_util::codec::Framed;

use crate::types::{LogId, Member, TypeConfig, Vote};

use crate::types::{Change, Entry};
use baton_state::{Command, Proposal};
use openraft::{CommittedLeaderId, EntryPayload};

fn entry(index: u64, data: usize) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Change(vec![Proposal {
            now_ms: 1,
            origin: None,
            command: Command::SetData {
                path: "/a".into(),
                data: vec![7u8; data].into(),
                version: None,
                fence: None,
            },
        }])),
    }
}

/// `response` as the answer to `request` (a frame with its call id).
fn answer_to(request: &[u8], response: &Response) -> bytes::Bytes {
    let (id, _) = split_call(request).expect("a call id");
    let mut answer = encode_call(response).unwrap();
    answer[..CALL_ID].copy_from_slice(&id.to_be_bytes());
    answer.freeze()
}

/// A stand-in member that answers every request with its status,
/// counting connections; with `close_after_answer` it hangs up after
/// each answer.
async fn fake_member(close_after_answer: bool) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut framed = Framed::new(stream, codec());
                let _hello = framed.next().await;
                while let Some(Ok(request)) = framed.next().await {
                    let answer = answer_to(&request, &Response::Status(MemberStatus::default()));
                    if framed.send(answer).await.is_err() || close_after_answer {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

async fn ask(network: &mut Network, addr: &str) -> Result<Response, Failed> {
    let member = Member {
        peer: addr.to_owned(),
        client: String::new(),
    };
    let mut peer = network.new_client(2, &member).await;
    peer.call(&Request::Status, Duration::from_secs(5)).await
}

#[tokio::test]
async fn short_lived_clients_share_one_connection() {
    let (addr, accepted) = fake_member(false).await;
    let mut network = Network::new(1, BTreeMap::new(), None);
    for _ in 0..20 {
        assert!(matches!(
            ask(&mut network, &addr).await,
            Ok(Response::Status(_))
        ));
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_idle_connection_the_other_side_closed_is_replaced() {
    let (addr, accepted) = fake_member(true).await;
    let mut network = Network::new(1, BTreeMap::new(), None);
    for _ in 0..5 {
        assert!(matches!(
            ask(&mut network, &addr).await,
            Ok(Response::Status(_))
        ));
    }
    // Each call after the first found its idle connection closed and
    // dialed again.
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
}

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

/// What a member held counts only for appends sent with the same vote,
/// never goes back, and is forgotten when the member is added again.
#[test]
fn how_far_a_member_held_the_log_counts_within_one_leadership() {
    let held = Held::default();
    let (term1, term2) = (Vote::new_committed(1, 1), Vote::new_committed(2, 1));
    held.record(2, term1, log_id(10));
    held.record(2, term1, log_id(7));
    assert_eq!(held.of(2, &term1), Some(log_id(10)));
    assert_eq!(held.of(3, &term1), None);
    assert_eq!(held.of(2, &term2), None);
    held.record(2, term2, log_id(4));
    assert_eq!(held.of(2, &term2), Some(log_id(4)));
    assert_eq!(held.of(2, &term1), None);
    held.forget(2);
    assert_eq!(held.of(2, &term2), None);
}

/// A stand-in member that answers its `n`th request (from 1, over all
/// its connections) with a status whose id is `n` (or, to an append,
/// with entries up to index `n` taken), after 300 ms for those in
/// `slow`.
async fn numbering_member(slow: &'static [u64]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let counter = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut framed = Framed::new(stream, codec());
                let _hello = framed.next().await;
                while let Some(Ok(request)) = framed.next().await {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    if slow.contains(&n) {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    let response = match split_call(&request)
                        .and_then(|(_, r)| bincode::deserialize::<Request>(r).ok())
                    {
                        Some(Request::Append(_)) => Response::Append(Ok(
                            AppendEntriesResponse::PartialSuccess(Some(log_id(n))),
                        )),
                        _ => Response::Status(MemberStatus {
                            id: n,
                            ..MemberStatus::default()
                        }),
                    };
                    let answer = answer_to(&request, &response);
                    if framed.send(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The number a [`numbering_member`] gave the request answered.
fn numbered(answer: Result<Response, Failed>) -> u64 {
    match answer {
        Ok(Response::Status(s)) => s.id,
        Ok(_) => panic!("an answer of another kind"),
        Err(e) => panic!("no answer: {e}"),
    }
}

/// A status call that its caller gives up on (as openraft's own
/// timeout does) after its request went out, before its answer came.
async fn given_up(peer: &mut Peer) {
    let call = peer.call(&Request::Status, Duration::from_secs(5));
    let given_up = tokio::time::timeout(Duration::from_millis(100), call).await;
    assert!(given_up.is_err(), "the call should have been cut short");
}

#[tokio::test]
async fn a_call_given_up_after_its_request_went_out_never_lends_its_answer_to_the_next() {
    // Requests 1 and 3 are answered late.
    let addr = numbering_member(&[1, 3]).await;
    let mut network = Network::new(1, BTreeMap::new(), None);
    let member = Member {
        peer: addr.clone(),
        client: String::new(),
    };
    let mut peer = network.new_client(2, &member).await;
    given_up(&mut peer).await;
    // The next call on the same client gets its own answer.
    let second = numbered(peer.call(&Request::Status, Duration::from_secs(5)).await);
    assert_eq!(second, 2, "the second call read another call's answer");
    // Its connection, clean, goes to the idle ones with the client; the
    // next client takes it and is given up on the same way.
    drop(peer);
    let mut peer = network.new_client(2, &member).await;
    given_up(&mut peer).await;
    drop(peer);
    // Nothing half read was left among the idle connections.
    let mut asked = Vec::new();
    for _ in 0..3 {
        let mut peer = network.new_client(2, &member).await;
        asked.push(numbered(
            peer.call(&Request::Status, Duration::from_secs(5)).await,
        ));
    }
    assert_eq!(
        asked,
        [4, 5, 6],
        "answers read by calls that did not ask for them"
    );
}

#[tokio::test]
async fn an_append_given_up_by_openraft_is_not_answered_by_its_late_reply() {
    let addr = numbering_member(&[1]).await;
    let mut network = Network::new(1, BTreeMap::new(), None);
    let member = Member {
        peer: addr,
        client: String::new(),
    };
    let mut peer = network.new_client(2, &member).await;
    let append = || AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(1, 1),
        prev_log_id: None,
        leader_commit: None,
        entries: vec![entry(1, 10)],
    };
    // openraft wraps each call in a timeout of its own, as long as the
    // one it passes in, started earlier: here, a shorter one.
    let ttl = Duration::from_millis(200);
    let first = tokio::time::timeout(
        Duration::from_millis(100),
        peer.append_entries(append(), RPCOption::new(ttl)),
    )
    .await;
    assert!(
        first.is_err(),
        "the first append should have been cut short"
    );
    let second = peer
        .append_entries(append(), RPCOption::new(ttl))
        .await
        .expect("an answer");
    assert_eq!(
        second,
        AppendEntriesResponse::PartialSuccess(Some(log_id(2))),
        "the second append took the first one's answer"
    );
}

#[tokio::test]
async fn an_answer_to_another_call_or_of_another_kind_ends_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicU64::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut framed = Framed::new(stream, codec());
                let _hello = framed.next().await;
                while let Some(Ok(request)) = framed.next().await {
                    let answer = match n {
                        // An answer to a call never made.
                        0 => {
                            let mut a =
                                encode_call(&Response::Status(MemberStatus::default())).unwrap();
                            a[..CALL_ID].copy_from_slice(&u64::MAX.to_be_bytes());
                            a.freeze()
                        }
                        // An answer of another kind.
                        1 => answer_to(&request, &Response::Changed(Ok("done".into()))),
                        _ => answer_to(&request, &Response::Status(MemberStatus::default())),
                    };
                    if framed.send(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut network = Network::new(1, BTreeMap::new(), None);
    for expected in ["call", "Change answer"] {
        let e = ask(&mut network, &addr).await.err().expect("refused");
        assert!(e.0.contains(expected), "{e}");
    }
    assert!(matches!(
        ask(&mut network, &addr).await,
        Ok(Response::Status(_))
    ));
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "each refused answer ended its connection"
    );
}

#[test]
fn entries_are_sent_as_many_as_fit_and_never_none() {
    let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1000)).collect();
    let one = bincode::serialized_size(&entries[0]).unwrap() as usize;
    assert_eq!(entries_that_fit(&entries, 10 * one), 10);
    assert_eq!(entries_that_fit(&entries, 3 * one + one / 2), 3);
    // One entry larger than the budget still goes, alone.
    assert_eq!(entries_that_fit(&entries, one / 2), 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// Whatever bytes come as a frame, reading them as a greeting, a
    /// request or an answer is an error or a value, never a panic.
    #[test]
    fn arbitrary_frames_never_panic_the_decoders(frame in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let _ = bincode::deserialize::<Hello>(&frame);
        if let Some((_, rest)) = split_call(&frame) {
            let _ = bincode::deserialize::<Request>(rest);
            let _ = bincode::deserialize::<Response>(rest);
        }
    }

    /// A real append request with one byte changed or the frame cut
    /// short: still no panic.
    #[test]
    fn a_damaged_append_never_panics_the_decoder(at in proptest::prelude::any::<usize>(), flip in 1u8..=255, cut in proptest::prelude::any::<bool>()) {
        let request = Request::Append(AppendEntriesRequest::<TypeConfig> {
            vote: openraft::Vote::new_committed(3, 2),
            prev_log_id: Some(log_id(4)),
            leader_commit: Some(log_id(4)),
            entries: vec![entry(5, 20), entry(6, 3)],
        });
        let mut frame = encode_call(&request).unwrap().to_vec();
        let at = at % frame.len();
        if cut {
            frame.truncate(at);
        } else {
            frame[at] ^= flip;
        }
        if let Some((_, rest)) = split_call(&frame) {
            let _ = bincode::deserialize::<Request>(rest);
        }
    }
}
