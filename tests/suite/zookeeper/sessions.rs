//! ZooKeeper sessions on Baton: expiry deletes ephemerals and the client is
//! told its session expired; a session resumes on a new connection with its
//! id and password; close deletes at once.

use std::time::Duration;

use baton_testkit::{eventually_async, within, Proxy};
use zookeeper_client as zk;

use super::{open, zk_addr, zk_client, zk_server};

#[tokio::test]
async fn an_expired_session_loses_its_ephemerals_and_is_told() {
    let server = zk_server().await;
    let proxy = Proxy::start(zk_addr(&server)).await;
    let c = zk_client(&proxy.addr(), Duration::from_millis(1_000)).await;
    let observer = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;
    c.create("/e", b"", &open(zk::CreateMode::Ephemeral))
        .await
        .unwrap();
    let (_, _, gone) = observer.get_and_watch_data("/e").await.unwrap();
    let mut states = c.state_watcher();

    proxy.block();
    proxy.sever();
    let e = within(10, "the server to expire the session", gone.changed()).await;
    assert_eq!(e.event_type, zk::EventType::NodeDeleted);
    proxy.unblock();
    within(10, "the client to learn its session expired", async {
        while states.changed().await != zk::SessionState::Expired {}
    })
    .await;
    assert!(matches!(
        c.get_data("/").await,
        Err(zk::Error::SessionExpired)
    ));
    server.stop().await;
}

#[tokio::test]
async fn a_session_resumes_with_its_id_and_password_and_a_closed_one_is_expired() {
    let server = zk_server().await;
    let addr = zk_addr(&server).to_string();
    // Detached: dropping it leaves the session open.
    let c = zk::Client::connector()
        .with_detached()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&addr)
        .await
        .unwrap();
    c.create("/s", b"", &open(zk::CreateMode::Ephemeral))
        .await
        .unwrap();
    let session = c.session().clone();
    let id = c.session_id();
    drop(c);

    let again = within(
        10,
        "the session to resume",
        zk::Client::connector()
            .with_session(session.clone())
            .connect(&addr),
    )
    .await
    .expect("resumed");
    assert_eq!(again.session_id(), id);
    let (_, stat) = again.get_data("/s").await.unwrap();
    assert_eq!(stat.ephemeral_owner, id.0, "still its node");

    // Dropping the client closes its session (closeSession), which deletes
    // the session's ephemerals at once.
    let observer = zk_client(&addr, Duration::from_secs(10)).await;
    drop(again);
    eventually_async(
        10,
        "the ephemeral to go with its closed session",
        || async { observer.check_stat("/s").await.unwrap().is_none() },
    )
    .await;

    // A closed session cannot be resumed: it is reported expired.
    let refused = within(
        10,
        "a resume of a closed session to be answered",
        zk::Client::connector().with_session(session).connect(&addr),
    )
    .await;
    assert!(
        matches!(refused, Err(zk::Error::SessionExpired)),
        "{refused:?}"
    );
    server.stop().await;
}

/// A sequential create named by its parent and a slash (`/jobs/`), as
/// ZooKeeper allows: the node is named by its number alone, and it is
/// recovered from the log like any other.
#[tokio::test]
async fn a_sequential_node_named_by_its_number_alone_survives_a_restart() {
    let dir = baton_testkit::scratch("zk-seq-slash");
    let config = || baton_server::Config {
        data_dir: Some(dir.path().to_owned()),
        ..baton_testkit::fast_config()
    };
    let server = super::zk_server_with(config()).await;
    let c = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;
    c.create("/jobs", b"", &open(zk::CreateMode::Persistent))
        .await
        .unwrap();
    let (_, seq) = c
        .create(
            "/jobs/",
            b"job",
            &open(zk::CreateMode::PersistentSequential),
        )
        .await
        .unwrap();
    let name = format!("{seq}");
    assert_eq!(c.list_children("/jobs").await.unwrap(), vec![name.clone()]);
    drop(c);
    server.stop().await;

    let server = super::zk_server_with(config()).await;
    let c = zk_client(&zk_addr(&server).to_string(), Duration::from_secs(10)).await;
    assert_eq!(
        c.get_data(&format!("/jobs/{name}")).await.unwrap().0,
        b"job"
    );
    server.stop().await;
}
