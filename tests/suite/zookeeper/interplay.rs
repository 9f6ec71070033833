//! The two protocols on one state: a lock taken with Baton's recipe is seen
//! by a ZooKeeper client, whose fencing token is the lock node's czxid, and
//! a ZooKeeper client makes a fenced write with a multi that checks its own
//! lock node.

use std::time::Duration;

use baton_client::Lock;
use zookeeper_client as zk;

use super::{open, zk_addr, zk_client, zk_server};

#[tokio::test]
async fn a_baton_lock_is_seen_and_fenced_through_zookeeper() {
    let server = zk_server().await;
    let native = server.client().await;
    let z = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;

    // Baton's lock, seen by ZooKeeper: its node, and its token as the
    // node's czxid (and sequence suffix).
    let guard = Lock::new(&native, "/locks/res").acquire().await.unwrap();
    let token = guard.token();
    let children = z.list_children("/locks/res").await.unwrap();
    assert_eq!(children.len(), 1);
    let node = format!("/locks/res/{}", children[0]);
    assert_eq!(node, guard.node());
    let (_, stat) = z.get_data(&node).await.unwrap();
    assert_eq!(stat.czxid as u64, token.0, "the fencing token is the czxid");
    assert!(children[0].ends_with(&format!("{:010}", token.0)));
    assert_eq!(stat.ephemeral_owner as u64, native.session_id().0);

    // A node made through ZooKeeper is read and watched natively.
    z.create("/shared", b"from zk", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let (data, _) = native.get_data("/shared").await.unwrap();
    assert_eq!(&data[..], b"from zk");

    // A ZooKeeper holder's fenced write: check its own lock node, write, in
    // one multi. It succeeds while the node exists...
    z.mkdir("/locks/zk", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let (_, seq) = z
        .create(
            "/locks/zk/lock-",
            b"",
            &open(zk::CreateMode::EphemeralSequential),
        )
        .await
        .unwrap();
    let mine = format!("/locks/zk/lock-{seq}");
    let fenced_write = |data: &'static [u8]| {
        let mut w = z.new_multi_writer();
        w.add_check_version(&mine, -1).unwrap();
        w.add_set_data("/shared", data, None).unwrap();
        w.commit()
    };
    fenced_write(b"holder 1").await.unwrap();
    // ...and fails, writing nothing, once it is gone (its session expired,
    // or an operator deleted it): the holder's lease ran out.
    native.delete(&mine, None).await.unwrap();
    match fenced_write(b"stale").await {
        Err(zk::MultiWriteError::OperationFailed {
            index: 0,
            source: zk::Error::NoNode,
        }) => {}
        other => panic!("{other:?}"),
    }
    let (data, _) = native.get_data("/shared").await.unwrap();
    assert_eq!(&data[..], b"holder 1");

    // The native lock's release is seen through ZooKeeper.
    guard.release().await.unwrap();
    assert!(z.list_children("/locks/res").await.unwrap().is_empty());
    server.stop().await;
}
