//! A real server on 127.0.0.1, port 0, for one test.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use baton::server::{Config, Server, ServerHandle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub addr: SocketAddr,
    pub handle: ServerHandle,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with_config(fast_config()).await
    }

    pub async fn with_config(config: Config) -> Self {
        let server = Server::bind("127.0.0.1:0", config).await.expect("bind");
        let addr = server.local_addr().unwrap();
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
            handle,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    pub async fn client(&self) -> baton::Client {
        baton::Client::connect(&self.addr()).await.expect("connect")
    }

    pub async fn client_with_timeout(&self, timeout: Duration) -> baton::Client {
        baton::Client::builder(&self.addr())
            .session_timeout(timeout)
            .connect()
            .await
            .expect("connect")
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
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

/// Waits for `fut`, failing the test if it takes longer than `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs} s waiting for {what}"),
    }
}

/// Polls `check` until it returns true, failing after `secs` seconds.
pub async fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    within(secs, what, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}
