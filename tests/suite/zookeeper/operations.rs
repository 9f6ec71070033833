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
