//! Many requests in flight on one connection, and many sessions at once.

use std::collections::HashSet;
use std::time::Duration;

use baton::{Client, CreateMode, Created, SessionState, Stat};
use baton_testkit::*;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

/// What one of the pipelined calls returned.
#[derive(Debug)]
enum Answer {
    Created(Created),
    Got(Bytes, Stat),
    Set(Stat),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_pipelined_requests_are_answered_in_order() {
    let server = TestServer::start().await;
    let c = server.client().await;
    c.create("/pipe", "", CreateMode::Persistent).await.unwrap();
    c.create("/seq", "", CreateMode::Persistent).await.unwrap();
    let requests_before = server.stats().requests;

    // 250 rounds of four requests, each depending on the ones before it: a
    // create, a read of what it created, a write conditional on version 0,
    // and a sequential create whose number shows the order of application.
    let mut calls: Vec<BoxFuture<'_, baton::Result<Answer>>> = Vec::new();
    let client = &c;
    for i in 0..250 {
        let path = format!("/pipe/n{i}");
        let p = path.clone();
        calls.push(
            async move {
                let created = client.create(&p, format!("v{i}"), CreateMode::Persistent);
                created.await.map(Answer::Created)
            }
            .boxed(),
        );
        let p = path.clone();
        calls
            .push(async move { client.get_data(&p).await.map(|(d, s)| Answer::Got(d, s)) }.boxed());
        calls.push(
            async move {
                let set = client.set_data(&path, format!("w{i}"), Some(0));
                set.await.map(Answer::Set)
            }
            .boxed(),
        );
        calls.push(
            client
                .create("/seq/s-", "", CreateMode::PersistentSequential)
                .map(|r| r.map(Answer::Created))
                .boxed(),
        );
    }
    assert_eq!(calls.len(), 1000);
    let answers = within(60, "1,000 pipelined answers", join_in_order(calls)).await;

    let mut last_seq = 0;
    for (i, round) in answers.chunks(4).enumerate() {
        let [created, got, set, seq] = round else {
            unreachable!()
        };
        let Ok(Answer::Created(created)) = created else {
            panic!("round {i}: create: {created:?}")
        };
        assert_eq!(created.path, format!("/pipe/n{i}"));
        let Ok(Answer::Got(data, stat)) = got else {
            panic!("round {i}: get: {got:?}")
        };
        assert_eq!(*data, format!("v{i}"), "round {i}");
        assert_eq!(stat.version, 0);
        assert_eq!(stat.czxid, created.stat.czxid);
        let Ok(Answer::Set(stat)) = set else {
            panic!("round {i}: set: {set:?}")
        };
        assert_eq!(stat.version, 1, "round {i}");
        let Ok(Answer::Created(seq)) = seq else {
            panic!("round {i}: sequential create: {seq:?}")
        };
        let n = seq.sequence.unwrap();
        assert!(n > last_seq, "round {i}: {n} after {last_seq}");
        assert!(n > stat.mzxid, "applied after the set of its round");
        last_seq = n;
    }
    assert_eq!(server.stats().requests - requests_before, 1000);
    assert_eq!(server.stats().connections_accepted, 1, "one connection");
    assert_eq!(c.state(), SessionState::Connected);

    let (children, _) = c.get_children("/pipe").await.unwrap();
    assert_eq!(children.len(), 250);
    let (data, _) = c.get_data("/pipe/n249").await.unwrap();
    assert_eq!(data, "w249");
    c.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_large_replies_in_flight_are_all_delivered() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let data = Bytes::from(vec![7u8; 64 * 1024]);
    c.create("/big", data.clone(), CreateMode::Persistent)
        .await
        .unwrap();
    // 64 MiB of replies: far more than the server queues for one connection
    // (half of max_outbound_bytes), so it must keep draining its queue while
    // it holds back the requests it has not handled yet.
    let reads = (0..1000).map(|_| c.get_data("/big"));
    let results = within(60, "1,000 large replies", join_in_order(reads)).await;
    for result in results {
        let (got, stat) = result.unwrap();
        assert_eq!(got, data);
        assert_eq!(stat.data_length as usize, data.len());
    }
    c.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_sessions_with_an_ephemeral_node_each() {
    const N: usize = 1000;
    let server = TestServer::start().await;
    let observer = server.client().await;
    observer
        .create("/sessions", "", CreateMode::Persistent)
        .await
        .unwrap();
    let (_, _, emptied) = observer.get_children_watch("/sessions").await.unwrap();
    let addr = server.addr();

    let clients: Vec<Client> = within(
        60,
        "1,000 sessions to open",
        futures::stream::iter(0..N)
            .map(|_| connect_with_timeout(&addr, Duration::from_secs(30)))
            .buffer_unordered(200)
            .collect(),
    )
    .await;
    let ids: HashSet<_> = clients.iter().map(Client::session_id).collect();
    assert_eq!(ids.len(), N, "every client has its own session");
    let stats = server.stats();
    assert_eq!(stats.sessions as usize, N + 1);
    assert_eq!(stats.connections_open as usize, N + 1);

    let creates = clients.iter().enumerate().map(|(i, c)| async move {
        let path = format!("/sessions/s{i}");
        let created = c.create(&path, "", CreateMode::Ephemeral).await.unwrap();
        assert_eq!(created.stat.owner(), Some(c.session_id()));
    });
    within(60, "1,000 creates", futures::future::join_all(creates)).await;
    let (children, stat) = observer.get_children("/sessions").await.unwrap();
    assert_eq!(children.len(), N);
    assert_eq!(stat.num_children as usize, N);
    within(5, "the child watch", emptied).await.unwrap();

    within(
        60,
        "1,000 sessions to close",
        futures::future::join_all(clients.iter().map(Client::close)),
    )
    .await;
    for c in &clients {
        assert_eq!(
            within(10, "the closed state", c.ended()).await,
            SessionState::Closed
        );
    }
    let (children, _) = observer.get_children("/sessions").await.unwrap();
    assert!(children.is_empty(), "{} left", children.len());
    let stats = server.stats();
    assert_eq!(stats.sessions, 1);
    assert_eq!(stats.sessions_expired, 0);
    drop(clients);
    eventually(30, "the closed connections to go", || {
        server.stats().connections_open == 1
    })
    .await;
    observer.close().await;
    server.stop().await;
}
