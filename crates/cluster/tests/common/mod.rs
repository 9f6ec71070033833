//! What the in-process cluster tests share.

use std::collections::BTreeMap;

use baton_cluster::Member;
use tokio::net::TcpListener;

/// Client and peer listeners on loopback for members `1..=n`, and the
/// addresses the members are to know each other by.
pub async fn bind_members(
    n: u64,
) -> (
    BTreeMap<u64, (TcpListener, TcpListener)>,
    BTreeMap<u64, Member>,
) {
    let mut listeners = BTreeMap::new();
    let mut initial = BTreeMap::new();
    for id in 1..=n {
        let clients = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peers = TcpListener::bind("127.0.0.1:0").await.unwrap();
        initial.insert(
            id,
            Member {
                peer: peers.local_addr().unwrap().to_string(),
                client: clients.local_addr().unwrap().to_string(),
            },
        );
        listeners.insert(id, (clients, peers));
    }
    (listeners, initial)
}

/// A session on the cluster whose members serve clients at `addrs`.
#[allow(dead_code)] // not every test that shares this module uses it
pub async fn client_of(addrs: &[String]) -> baton_client::Client {
    baton_client::Client::builder(&addrs.join(","))
        .session_timeout(std::time::Duration::from_secs(5))
        .connect_timeout(std::time::Duration::from_secs(10))
        .connect()
        .await
        .expect("a session on the cluster")
}
