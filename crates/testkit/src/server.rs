//! A real server on 127.0.0.1 for a test, and the settings tests start it with.

use std::net::SocketAddr;
use std::time::Duration;

use baton_client::Client;
use baton_server::{Config, Server, ServerHandle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::panics::{count_panics, panics_on_this_thread};
use crate::within;

pub struct TestServer {
    pub addr: SocketAddr,
    /// The ZooKeeper listener's address, if the config asked for one.
    pub zk_addr: Option<SocketAddr>,
    pub handle: ServerHandle,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with_config(fast_config()).await
    }

    pub async fn with_config(config: Config) -> Self {
        Self::at("127.0.0.1:0", config).await
    }

    /// A server on `addr` (a fixed port, to restart a server where its
    /// clients look for it).
    pub async fn at(addr: &str, config: Config) -> Self {
        count_panics();
        let server = Server::bind(addr, config).await.expect("bind");
        let addr = server.local_addr().unwrap();
        let zk_addr = server.zk_addr();
        let handle = server.handle();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            server
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("server ran");
        });
        TestServer {
            addr,
            zk_addr,
            handle,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    pub fn stats(&self) -> baton_server::StatsSnapshot {
        self.handle.stats()
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.addr()).await.expect("connect")
    }

    pub async fn client_with_timeout(&self, timeout: Duration) -> Client {
        connect_with_timeout(&self.addr(), timeout).await
    }

    /// True while the server's task is still running (it did not panic or
    /// return).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the server and waits for it to finish; panics if it panicked.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            within(30, "the server to stop", task)
                .await
                .expect("server task");
        }
    }
}

/// Session timeouts allowed down to 100 ms, so expiry tests take moments.
pub fn fast_config() -> Config {
    Config {
        min_session_timeout: Duration::from_millis(100),
        ..Config::default()
    }
}

pub async fn connect_with_timeout(addr: &str, timeout: Duration) -> Client {
    Client::builder(addr)
        .session_timeout(timeout)
        .connect()
        .await
        .expect("connect")
}

/// Checks that the server still serves: no panic so far, its task runs, and a
/// fresh client can write, read and close.
pub async fn assert_server_healthy(server: &TestServer) {
    assert_eq!(panics_on_this_thread(), 0, "a task panicked");
    assert!(server.is_running(), "the server task ended");
    let c = within(10, "a fresh client to connect", server.client()).await;
    let path = format!("/health-{}", c.session_id().0);
    within(10, "a fresh client to work", async {
        c.create(&path, "ok", baton_client::CreateMode::Ephemeral)
            .await
            .expect("create");
        let (data, _) = c.get_data(&path).await.expect("get");
        assert_eq!(&data[..], b"ok");
        c.close().await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// Proxy

/// A durable server configuration on `dir`.
pub fn durable_config(dir: &std::path::Path) -> Config {
    Config {
        data_dir: Some(dir.to_owned()),
        ..fast_config()
    }
}
