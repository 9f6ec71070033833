//! The ZooKeeper listener against real ZooKeeper clients nobody here
//! wrote: the `zookeeper-client` crate here (every operation, watches,
//! sessions, multi, ACLs), kazoo's recipes in `python.rs`, and raw bytes
//! for bad input in `bad_input.rs`.

mod bad_input;
mod interplay;
mod operations;
mod secure;
mod sessions;
mod watches;
mod zkcli;

use std::net::SocketAddr;
use std::time::Duration;

use baton_server::Config;
use baton_testkit::{fast_config, within, TestServer};
use zookeeper_client as zk;

/// A server with a ZooKeeper listener on a free port.
pub(crate) async fn zk_server() -> TestServer {
    zk_server_with(fast_config()).await
}

pub(crate) async fn zk_server_with(config: Config) -> TestServer {
    TestServer::with_config(Config {
        zk_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config
    })
    .await
}

pub(crate) fn zk_addr(server: &TestServer) -> SocketAddr {
    server.zk_addr.expect("a ZooKeeper listener")
}

/// A ZooKeeper client of `addrs` (a connect string) with `timeout`.
pub(crate) async fn zk_client(addrs: &str, timeout: Duration) -> zk::Client {
    within(
        20,
        "a ZooKeeper client to connect",
        zk::Client::connector()
            .with_session_timeout(timeout)
            .connect(addrs),
    )
    .await
    .expect("a ZooKeeper session")
}

/// Everyone may do everything (`world:anyone`, all permissions).
pub(crate) fn open(mode: zk::CreateMode) -> zk::CreateOptions<'static> {
    mode.with_acls(zk::Acls::anyone_all())
}
