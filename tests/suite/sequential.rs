//! Sequential nodes: the numbers behind fencing tokens (DESIGN.md invariant 1).

use std::collections::HashSet;

use baton::proto::path::{name, parse_sequence};
use baton::proto::MAX_PATH_LEN;
use baton::{Client, CreateMode, Created, Error};
use baton_testkit::*;

/// Creates a sequential node at `prefix` and checks the name it got: the
/// requested path followed by the sequence number in 10 zero-padded digits.
async fn create_seq(client: &Client, prefix: &str, mode: CreateMode) -> u64 {
    let created = client.create(prefix, "", mode).await.unwrap();
    check_name(prefix, &created)
}

fn check_name(prefix: &str, created: &Created) -> u64 {
    let seq = created.sequence.expect("a sequential node has a number");
    let suffix = created
        .path
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{} does not start with {prefix}", created.path));
    assert_eq!(suffix.len(), 10, "suffix of {}", created.path);
    assert!(
        suffix.bytes().all(|b| b.is_ascii_digit()),
        "{}",
        created.path
    );
    assert_eq!(suffix, format!("{seq:010}"));
    assert_eq!(parse_sequence(name(&created.path), name(prefix)), Some(seq));
    seq
}

#[tokio::test]
async fn sequence_numbers_strictly_increase_under_one_parent() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let other = server.client().await;
    c.create("/q", "", CreateMode::Persistent).await.unwrap();
    c.create("/other", "", CreateMode::Persistent)
        .await
        .unwrap();

    let mut seen = Vec::new();
    for i in 0..30 {
        let mode = if i % 2 == 0 {
            CreateMode::PersistentSequential
        } else {
            CreateMode::EphemeralSequential
        };
        // Interleave other changes, other parents and another session.
        let creator = if i % 3 == 0 { &other } else { &c };
        seen.push(create_seq(creator, "/q/item-", mode).await);
        create_seq(&other, "/other/x-", CreateMode::PersistentSequential).await;
        c.set_data("/q", format!("{i}"), None).await.unwrap();
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "not strictly increasing: {seen:?}"
    );
    // The children list (sorted by name) is in the same order.
    let (children, _) = c.get_children("/q").await.unwrap();
    let listed: Vec<u64> = children
        .iter()
        .map(|n| parse_sequence(n, "item-").unwrap())
        .collect();
    assert_eq!(listed, seen);
    c.close().await;
    other.close().await;
    server.stop().await;
}

#[tokio::test]
async fn sequence_numbers_keep_increasing_across_delete_and_recreate_of_the_parent() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let mut highest = 0;
    for round in 0..4 {
        c.create("/p", "", CreateMode::Persistent).await.unwrap();
        for mode in [
            CreateMode::PersistentSequential,
            CreateMode::EphemeralSequential,
        ] {
            let seq = create_seq(&c, "/p/n-", mode).await;
            assert!(seq > highest, "round {round}: {seq} after {highest}");
            highest = seq;
        }
        let (children, _) = c.get_children("/p").await.unwrap();
        for child in children {
            c.delete(&format!("/p/{child}"), None).await.unwrap();
        }
        c.delete("/p", None).await.unwrap();
    }
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn sequential_suffix_is_ten_zero_padded_digits() {
    let server = TestServer::start().await;
    let c = server.client().await;
    c.create("/s", "", CreateMode::Persistent).await.unwrap();
    for (prefix, mode) in [
        ("/s/lock-", CreateMode::EphemeralSequential),
        ("/s/n", CreateMode::PersistentSequential),
        ("/top-", CreateMode::PersistentSequential),
    ] {
        let created = c.create(prefix, "data", mode).await.unwrap();
        let seq = check_name(prefix, &created);
        assert!(seq < 1_000_000, "a fresh server's numbers are small: {seq}");
        assert!(created.path.ends_with(&format!("{seq}")));
        assert!(
            created.path[prefix.len()..].starts_with("00000"),
            "{} is zero padded",
            created.path
        );
        let (data, stat) = c.get_data(&created.path).await.unwrap();
        assert_eq!(&data[..], b"data");
        assert_eq!(stat, created.stat);
    }
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn ephemeral_sequential_nodes_go_with_their_session_and_persistent_ones_stay() {
    let server = TestServer::start().await;
    let owner = server.client().await;
    let observer = server.client().await;
    let eph = owner
        .create("/e-", "", CreateMode::EphemeralSequential)
        .await
        .unwrap();
    let per = owner
        .create("/p-", "", CreateMode::PersistentSequential)
        .await
        .unwrap();
    assert_eq!(eph.stat.owner(), Some(owner.session_id()));
    assert_eq!(per.stat.owner(), None);
    owner.close().await;
    assert_eq!(observer.exists(&eph.path).await.unwrap(), None);
    assert!(observer.exists(&per.path).await.unwrap().is_some());
    // A later number under the same parent is still higher.
    let next = create_seq(&observer, "/e-", CreateMode::EphemeralSequential).await;
    assert!(next > eph.sequence.unwrap().max(per.sequence.unwrap()));
    observer.close().await;
    server.stop().await;
}

#[tokio::test]
async fn concurrent_sequential_creates_get_distinct_increasing_numbers() {
    let server = TestServer::start().await;
    let setup = server.client().await;
    setup
        .create("/race", "", CreateMode::Persistent)
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.client().await);
    }
    let creates = clients.iter().flat_map(|c| {
        (0..25).map(move |i| {
            let mode = if i % 2 == 0 {
                CreateMode::EphemeralSequential
            } else {
                CreateMode::PersistentSequential
            };
            c.create("/race/r-", "", mode)
        })
    });
    let results = within(30, "200 concurrent creates", join_in_order(creates)).await;
    let mut seqs = Vec::new();
    for created in results {
        let created = created.unwrap();
        seqs.push(check_name("/race/r-", &created));
    }
    let distinct: HashSet<u64> = seqs.iter().copied().collect();
    assert_eq!(distinct.len(), 200, "every create got its own number");
    // Within one session, requests are applied in order, so each client's
    // numbers grow in the order it made its calls.
    for chunk in seqs.chunks(25) {
        assert!(chunk.windows(2).all(|w| w[0] < w[1]), "{chunk:?}");
    }
    let (children, _) = setup.get_children("/race").await.unwrap();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    let listed: Vec<u64> = children
        .iter()
        .map(|n| parse_sequence(n, "r-").unwrap())
        .collect();
    assert_eq!(listed, sorted);
    for c in &clients {
        c.close().await;
    }
    setup.close().await;
    server.stop().await;
}

#[tokio::test]
async fn sequential_name_longer_than_the_path_limit_is_rejected() {
    let server = TestServer::start().await;
    let c = server.client().await;
    // Valid as requested, too long once the 10-digit suffix is appended.
    let prefix = format!("/{}", "x".repeat(MAX_PATH_LEN - 5));
    let result = c
        .create(&prefix, "", CreateMode::PersistentSequential)
        .await;
    assert!(
        matches!(result, Err(Error::InvalidPath(_))),
        "got {result:?}"
    );
    // The same name without the flag fits and is created.
    c.create(&prefix, "", CreateMode::Persistent).await.unwrap();
    c.close().await;
    server.stop().await;
}
