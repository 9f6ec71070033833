mod common;
use baton::CreateMode;
use common::*;

#[tokio::test]
async fn smoke() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let created = c
        .create("/a", "hello", CreateMode::Persistent)
        .await
        .unwrap();
    assert_eq!(created.path, "/a");
    let (data, stat) = c.get_data("/a").await.unwrap();
    assert_eq!(&data[..], b"hello");
    assert_eq!(stat.version, 0);
    let (_, _, w) = c.get_data_watch("/a").await.unwrap();
    c.set_data("/a", "x", None).await.unwrap();
    let ev = within(5, "watch", w).await.unwrap();
    println!("{ev:?}");
    c.close().await;
    server.stop().await;
}
