//! Nodes' access control lists through the `zookeeper-client` crate:
//! digest, ip, `auth` and `world` entries checked for every operation as
//! ZooKeeper checks them, set-ACL with its version, and lists that survive
//! a restart (from the log, and from a snapshot).

use std::time::Duration;

use zookeeper_client as zk;

use super::{open, zk_addr, zk_client, zk_server_with};

/// `alice:base64(sha1("alice:secret"))`, as ZooKeeper's
/// `DigestAuthenticationProvider.generateDigest("alice:secret")` gives it.
const ALICE: &str = "alice:aYXlLOpEooaV1cRAvUL1fp9Qt7E=";

fn only(perms: zk::Permission, scheme: &str, id: &str) -> Vec<zk::Acl> {
    vec![zk::Acl::new(perms, zk::AuthId::new(scheme, id))]
}

async fn client_as(server: &baton_testkit::TestServer, credential: Option<&str>) -> zk::Client {
    let c = zk_client(&zk_addr(server).to_string(), Duration::from_secs(10)).await;
    if let Some(credential) = credential {
        c.auth("digest", credential.as_bytes()).await.unwrap();
    }
    c
}

fn no_auth<T: std::fmt::Debug>(result: Result<T, zk::Error>, what: &str) {
    assert!(
        matches!(result, Err(zk::Error::NoAuth)),
        "{what}: {result:?}"
    );
}

/// A digest list lets its user do what it grants and refuses everyone else
/// `NOAUTH`, operation by operation, as ZooKeeper does: exists needs
/// nothing, creating and deleting a child need create and delete on the
/// parent, reading a list needs read or admin, setting one admin.
#[tokio::test]
async fn a_digest_list_is_enforced_operation_by_operation() {
    let dir = baton_testkit::scratch("zk-acl-digest");
    let config = || baton_server::Config {
        data_dir: Some(dir.path().to_owned()),
        ..baton_testkit::fast_config()
    };
    let server = zk_server_with(config()).await;
    let alice = client_as(&server, Some("alice:secret")).await;
    let bob = client_as(&server, Some("bob:other")).await;
    let anonymous = client_as(&server, None).await;

    let acl = only(zk::Permission::ALL, "digest", ALICE);
    let private = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
    alice.create("/private", b"p", &private).await.unwrap();
    for (who, c) in [("bob", &bob), ("anonymous", &anonymous)] {
        no_auth(c.get_data("/private").await, who);
        no_auth(c.set_data("/private", b"x", None).await, who);
        no_auth(c.list_children("/private").await, who);
        no_auth(c.get_children("/private").await, who);
        no_auth(c.get_acl("/private").await, who);
        no_auth(
            c.set_acl("/private", &zk::Acls::anyone_all(), None).await,
            who,
        );
        no_auth(
            c.create("/private/x", b"", &open(zk::CreateMode::Persistent))
                .await,
            who,
        );
        no_auth(c.count_descendants_number("/private").await, who);
        // Existence is no secret.
        assert!(c.check_stat("/private").await.unwrap().is_some(), "{who}");
        // A transaction that touches it fails there, and applies nothing.
        let mut w = c.new_multi_writer();
        w.add_create("/elsewhere", b"", &open(zk::CreateMode::Persistent))
            .unwrap();
        w.add_set_data("/private", b"x", None).unwrap();
        match w.commit().await {
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoAuth,
            }) => {}
            other => panic!("{who}: {other:?}"),
        }
        assert_eq!(c.check_stat("/elsewhere").await.unwrap(), None, "{who}");
        let mut r = c.new_multi_reader();
        r.add_get_data("/private").unwrap();
        match r.commit().await.unwrap().as_slice() {
            [zk::MultiReadResult::Error {
                err: zk::Error::NoAuth,
            }] => {}
            other => panic!("{who}: {other:?}"),
        }
    }
    // Alice does everything, children included.
    assert_eq!(alice.get_data("/private").await.unwrap().0, b"p");
    alice
        .create("/private/c", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    alice.set_data("/private", b"q", Some(0)).await.unwrap();
    let (entries, stat) = alice.get_acl("/private").await.unwrap();
    assert_eq!(entries, acl);
    assert_eq!(stat.aversion, 0);
    // The open child is open to Bob, but deleting it takes delete on
    // the parent.
    assert_eq!(bob.get_data("/private/c").await.unwrap().0, b"");
    no_auth(bob.delete("/private/c", None).await, "bob deletes a child");
    alice.delete("/private/c", None).await.unwrap();

    // Read-only for everyone: set with its ACL version, which counts.
    let read_only = only(zk::Permission::READ, "world", "anyone");
    let mut both = read_only.clone();
    both.extend(acl.clone());
    let stat = alice
        .set_acl("/private", &zk::Acls::new(&both), Some(0))
        .await
        .unwrap();
    assert_eq!(stat.aversion, 1);
    assert!(matches!(
        alice
            .set_acl("/private", &zk::Acls::new(&both), Some(0))
            .await,
        Err(zk::Error::BadVersion)
    ));
    assert_eq!(bob.get_data("/private").await.unwrap().0, b"q");
    assert_eq!(bob.get_data("/private").await.unwrap().1.aversion, 1);
    no_auth(bob.set_data("/private", b"x", None).await, "bob writes");
    drop((alice, bob, anonymous));
    server.stop().await;

    // After a restart (the log replayed), the list and its version hold.
    let server = zk_server_with(config()).await;
    let bob = client_as(&server, Some("bob:other")).await;
    let (entries, stat) = bob.get_acl("/private").await.unwrap();
    assert_eq!(entries, both);
    assert_eq!(stat.aversion, 1);
    no_auth(
        bob.set_data("/private", b"x", None).await,
        "bob after a restart",
    );
    server.stop().await;
}

/// `auth` names the creator's digest credentials (Curator's and kazoo's
/// `CREATOR_ALL_ACL`): the creator's sequential ephemeral node is its own,
/// and a client without a credential cannot ask for it. `ip` entries
/// match the client's address.
#[tokio::test]
async fn auth_names_the_creator_and_ip_names_an_address() {
    let server = zk_server_with(baton_testkit::fast_config()).await;
    let alice = client_as(&server, Some("alice:secret")).await;
    let bob = client_as(&server, Some("bob:other")).await;
    let anonymous = client_as(&server, None).await;
    alice
        .create("/locks", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let mine = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::creator_all());
    let (_, seq) = alice.create("/locks/n-", b"a", &mine).await.unwrap();
    let path = format!("/locks/n-{seq}");
    let (entries, _) = alice.get_acl(&path).await.unwrap();
    assert_eq!(entries, only(zk::Permission::ALL, "digest", ALICE));
    no_auth(bob.get_data(&path).await, "bob reads alice's node");
    assert!(matches!(
        anonymous.create("/locks/n-", b"", &mine).await,
        Err(zk::Error::InvalidAcl)
    ));

    // Unknown schemes and malformed ids are refused, not ignored.
    for (scheme, id) in [
        ("sasl", "alice"),
        ("digest", "no-hash"),
        ("ip", "300.0.0.1"),
    ] {
        let entries = only(zk::Permission::ALL, scheme, id);
        let bad = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&entries));
        assert!(
            matches!(
                alice.create("/bad", b"", &bad).await,
                Err(zk::Error::InvalidAcl)
            ),
            "{scheme}:{id}"
        );
    }

    // Past the server's bounds: 65 entries, or an id of 2 KiB.
    let many: Vec<zk::Acl> = (0..65)
        .map(|i| {
            zk::Acl::new(
                zk::Permission::READ,
                zk::AuthId::new("ip", &format!("10.0.0.{i}")),
            )
        })
        .collect();
    let long = only(
        zk::Permission::READ,
        "digest",
        &format!("{}:hash", "u".repeat(2048)),
    );
    for entries in [many, long] {
        let bad = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&entries));
        assert!(matches!(
            alice.create("/big", b"", &bad).await,
            Err(zk::Error::InvalidAcl)
        ));
        assert!(matches!(
            alice
                .set_acl("/locks", &zk::Acls::new(&entries), None)
                .await,
            Err(zk::Error::InvalidAcl)
        ));
    }

    // Loopback may read; another network may not write.
    let mut by_ip = only(zk::Permission::READ, "ip", "127.0.0.0/8");
    by_ip.extend(only(zk::Permission::WRITE, "ip", "10.0.0.0/8"));
    let net = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&by_ip));
    alice.create("/net", b"n", &net).await.unwrap();
    assert_eq!(anonymous.get_data("/net").await.unwrap().0, b"n");
    no_auth(
        anonymous.set_data("/net", b"x", None).await,
        "a write from loopback",
    );

    // whoAmI names the user of a digest, not its hash.
    let users = alice.list_auth_users().await.unwrap();
    assert!(
        users
            .iter()
            .any(|u| u.scheme() == "digest" && u.user() == "alice"),
        "{users:?}"
    );
    assert!(
        users
            .iter()
            .any(|u| u.scheme() == "ip" && u.user() == "127.0.0.1"),
        "{users:?}"
    );
    server.stop().await;
}

/// Lists are written into snapshots: a server that restarts from a
/// snapshot (its log compacted) still enforces them.
#[tokio::test]
async fn lists_survive_a_snapshot() {
    let dir = baton_testkit::scratch("zk-acl-snapshot");
    let config = || baton_server::Config {
        data_dir: Some(dir.path().to_owned()),
        // A snapshot after every few changes.
        snapshot_every_bytes: 1,
        ..baton_testkit::fast_config()
    };
    let server = zk_server_with(config()).await;
    let alice = client_as(&server, Some("alice:secret")).await;
    let acl = only(zk::Permission::ALL, "digest", ALICE);
    let private = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
    alice.create("/private", b"p", &private).await.unwrap();
    alice
        .set_acl("/private", &zk::Acls::new(&acl), None)
        .await
        .unwrap();
    // More changes, so that a snapshot holds the list.
    for i in 0..20 {
        alice
            .create(&format!("/n{i}"), b"", &open(zk::CreateMode::Persistent))
            .await
            .unwrap();
    }
    // The set-ACL took the revision before /n0's creation.
    let set_at = alice.check_stat("/n0").await.unwrap().unwrap().czxid - 1;
    baton_testkit::eventually_async(20, "a snapshot past the set-ACL", || async {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| {
                n.strip_prefix("snapshot-")?
                    .strip_suffix(".snap")?
                    .parse::<i64>()
                    .ok()
            })
            .any(|revision| revision >= set_at)
    })
    .await;
    drop(alice);
    server.stop().await;

    let server = zk_server_with(config()).await;
    let bob = client_as(&server, Some("bob:other")).await;
    no_auth(bob.get_data("/private").await, "bob after a snapshot");
    let alice = client_as(&server, Some("alice:secret")).await;
    let (entries, stat) = alice.get_acl("/private").await.unwrap();
    assert_eq!((entries, stat.aversion), (acl, 1));
    server.stop().await;
}
