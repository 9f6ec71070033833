//! What the in-process cluster tests share.

use std::collections::BTreeMap;

use baton_cluster::{ClusterMember, Member, MemberConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

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

/// A member running in this process until stopped.
#[allow(dead_code)] // not every test that shares this module uses it
pub struct Running {
    pub client: String,
    /// The member's ZooKeeper listener.
    pub zk: std::net::SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts a member with `config` (which must give it a ZooKeeper listener)
/// on `clients` and `peers`; it runs until its `stop` is sent or dropped.
#[allow(dead_code)] // not every test that shares this module uses it
pub async fn run_member(config: MemberConfig, clients: TcpListener, peers: TcpListener) -> Running {
    let member = ClusterMember::start(config, clients, peers).await.unwrap();
    let client = member.client_addr().unwrap().to_string();
    let zk = member.zk_addr().expect("a ZooKeeper listener");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = member
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    Running {
        client,
        zk,
        stop: Some(stop),
        task,
    }
}
