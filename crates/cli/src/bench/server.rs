//! A `baton serve` child process for benchmarks.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::CliError;

/// A server process started for a benchmark, killed and cleaned up on drop.
pub struct ChildServer {
    child: Child,
    pub addr: String,
    data_dir: PathBuf,
}

impl ChildServer {
    /// Starts `baton serve` on a free loopback port with `extra` arguments and
    /// waits until it accepts connections.
    pub async fn start(extra: &[&str]) -> Result<Self, CliError> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::msg(format!("cannot find the baton binary: {e}")))?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let data_dir =
            std::env::temp_dir().join(format!("baton-bench-{}-{port}", std::process::id()));
        let child = Command::new(exe)
            .arg("serve")
            .arg("--listen")
            .arg(&addr)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("BATON_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::msg(format!("cannot start the benchmark server: {e}")))?;
        let server = ChildServer {
            child,
            addr,
            data_dir,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&server.addr).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                return Err(CliError::msg(format!(
                    "the benchmark server did not start listening on {} within 10 s",
                    server.addr
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

fn free_port() -> Result<u16, CliError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| CliError::msg(format!("cannot find a free port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?
        .port())
}
