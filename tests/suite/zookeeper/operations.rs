//! Every operation through the `zookeeper-client` crate.

use std::time::Duration;

use zookeeper_client as zk;

use super::{open, zk_addr, zk_client, zk_server};

#[tokio::test]
async fn create_read_update_and_delete() {
    let server = zk_server().await;
    let c = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;

    let (stat, _) = c
        .create("/app", b"v1", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    assert!(stat.czxid > 0 && stat.czxid == stat.mzxid, "{stat:?}");
    assert_eq!(stat.version, 0);
    let (data, got) = c.get_data("/app").await.unwrap();
    assert_eq!(data, b"v1");
    assert_eq!(got, stat);

    let stat2 = c.set_data("/app", b"v2", Some(0)).await.unwrap();
    assert_eq!(stat2.version, 1);
    assert!(stat2.mzxid > stat.mzxid);
    assert!(matches!(
        c.set_data("/app", b"v3", Some(0)).await,
        Err(zk::Error::BadVersion)
    ));
    assert!(matches!(
        c.create("/app", b"", &open(zk::CreateMode::Persistent))
            .await,
        Err(zk::Error::NodeExists)
    ));
    assert!(matches!(
        c.get_data("/missing").await,
        Err(zk::Error::NoNode)
    ));
    assert_eq!(c.check_stat("/missing").await.unwrap(), None);

    let (_, s1) = c
        .create(
            "/app/job-",
            b"",
            &open(zk::CreateMode::PersistentSequential),
        )
        .await
        .unwrap();
    let (_, s2) = c
        .create("/app/job-", b"", &open(zk::CreateMode::EphemeralSequential))
        .await
        .unwrap();
    assert!(s2.into_i64() > s1.into_i64(), "{s1} then {s2}");
    let mut children = c.list_children("/app").await.unwrap();
    children.sort();
    assert_eq!(children, vec![format!("job-{s1}"), format!("job-{s2}")]);
    assert_eq!(format!("{s1}").len(), 10, "ZooKeeper's 10-digit suffix");
    let (children, parent) = c.get_children("/app").await.unwrap();
    assert_eq!(children.len(), 2);
    assert_eq!(parent.num_children, 2);
    assert_eq!(c.count_descendants_number("/").await.unwrap(), 3);
    assert_eq!(
        c.list_ephemerals("/").await.unwrap(),
        vec![format!("/app/job-{s2}")]
    );

    assert!(matches!(
        c.delete("/app", None).await,
        Err(zk::Error::NotEmpty)
    ));
    c.delete(&format!("/app/job-{s1}"), Some(0)).await.unwrap();
    c.delete(&format!("/app/job-{s2}"), None).await.unwrap();
    c.delete("/app", None).await.unwrap();
    assert_eq!(c.check_stat("/app").await.unwrap(), None);
    c.sync("/").await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn multi_is_all_or_nothing_and_multi_read_reads_each() {
    let server = zk_server().await;
    let c = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;
    c.create("/m", b"0", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();

    let mut w = c.new_multi_writer();
    w.add_check_version("/m", 0).unwrap();
    w.add_create("/m/a", b"a", &open(zk::CreateMode::Persistent))
        .unwrap();
    w.add_set_data("/m", b"1", Some(0)).unwrap();
    w.add_create("/m/s-", b"", &open(zk::CreateMode::PersistentSequential))
        .unwrap();
    let results = w.commit().await.unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0], zk::MultiWriteResult::Check);
    let zk::MultiWriteResult::Create { path, stat } = &results[1] else {
        panic!("{results:?}")
    };
    assert_eq!(path, "/m/a");
    let zk::MultiWriteResult::SetData { stat: set } = &results[2] else {
        panic!("{results:?}")
    };
    assert_eq!(set.version, 1);
    // Each operation that changes the tree takes a zxid of its own, in
    // order (ZooKeeper gives a multi one zxid: docs/zookeeper.md).
    assert!(set.mzxid > stat.czxid, "{set:?} after {stat:?}");
    let zk::MultiWriteResult::Create { path: seq, .. } = &results[3] else {
        panic!("{results:?}")
    };
    assert!(
        seq.starts_with("/m/s-") && seq.len() == "/m/s-".len() + 10,
        "{seq}"
    );

    // A failing check in the middle: nothing of it is applied.
    let mut w = c.new_multi_writer();
    w.add_create("/m/b", b"", &open(zk::CreateMode::Persistent))
        .unwrap();
    w.add_check_version("/m", 0).unwrap();
    w.add_delete("/m/a", None).unwrap();
    match w.commit().await {
        Err(zk::MultiWriteError::OperationFailed {
            index: 1,
            source: zk::Error::BadVersion,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.check_stat("/m/b").await.unwrap(),
        None,
        "the create before the failure was not applied"
    );
    assert!(
        c.check_stat("/m/a").await.unwrap().is_some(),
        "the delete after it was not applied"
    );

    let mut r = c.new_multi_reader();
    r.add_get_data("/m").unwrap();
    r.add_get_children("/m").unwrap();
    r.add_get_data("/nothing").unwrap();
    let results = r.commit().await.unwrap();
    match &results[0] {
        zk::MultiReadResult::Data { data, stat } => {
            assert_eq!(data, b"1");
            assert_eq!(stat.version, 1);
        }
        other => panic!("{other:?}"),
    }
    match &results[1] {
        zk::MultiReadResult::Children { children } => assert_eq!(children.len(), 2),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(
            &results[2],
            zk::MultiReadResult::Error {
                err: zk::Error::NoNode
            }
        ),
        "{:?}",
        results[2]
    );
    server.stop().await;
}

/// Containers go once their last child has gone and they have stood empty
/// for the container grace, as ZooKeeper deletes them (kept across a
/// restart, the log replayed); one that never had a child stays, and so
/// does one with children. TTL nodes are unimplemented.
#[tokio::test]
async fn containers_go_when_emptied_and_ttl_nodes_are_unimplemented() {
    let dir = baton_testkit::scratch("zk-containers");
    let config = |grace| baton_server::Config {
        data_dir: Some(dir.path().to_owned()),
        container_grace: grace,
        ..baton_testkit::fast_config()
    };
    let server = super::zk_server_with(config(Duration::from_secs(3600))).await;
    let c = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;
    for path in ["/never", "/emptied", "/busy", "/before"] {
        c.create(path, b"", &open(zk::CreateMode::Container))
            .await
            .unwrap();
    }
    for path in ["/emptied/a", "/busy/a", "/before/a"] {
        c.create(path, b"", &open(zk::CreateMode::Persistent))
            .await
            .unwrap();
    }
    // Emptied before the restart, within its (long) grace.
    c.delete("/before/a", None).await.unwrap();
    let ttl = open(zk::CreateMode::Persistent).with_ttl(Duration::from_secs(5));
    assert!(matches!(
        c.create("/ttl", b"", &ttl).await,
        Err(zk::Error::Unimplemented)
    ));
    drop(c);
    server.stop().await;

    // After a restart, the containers are still containers, and one that
    // stood empty goes once the (now short) grace has passed again.
    let server = super::zk_server_with(config(Duration::from_millis(200))).await;
    let c = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;
    baton_testkit::eventually_async(
        20,
        "the container emptied before the restart to go",
        || async { c.check_stat("/before").await.unwrap().is_none() },
    )
    .await;
    let (_, watcher) = c.check_and_watch_stat("/emptied").await.unwrap();
    c.delete("/emptied/a", None).await.unwrap();
    let event = baton_testkit::within(20, "the emptied container to go", watcher.changed()).await;
    assert_eq!(event.event_type, zk::EventType::NodeDeleted);
    assert_eq!(event.path, "/emptied");
    assert!(
        c.check_stat("/never").await.unwrap().is_some(),
        "never had a child"
    );
    assert!(
        c.check_stat("/busy").await.unwrap().is_some(),
        "has a child"
    );
    assert_eq!(
        c.list_children("/busy").await.unwrap(),
        vec!["a".to_string()]
    );
    server.stop().await;
}
