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
    /// Remove the data directory on drop (it was made for this server).
    owns_dir: bool,
}

impl ChildServer {
    /// Starts `baton serve` on a free loopback port with `extra` arguments and
    /// waits until it accepts connections.
    pub async fn start(extra: &[&str]) -> Result<Self, CliError> {
        let dir = std::env::temp_dir().join(format!(
            "baton-bench-{}-{}",
            std::process::id(),
            free_port()?
        ));
        let mut server = Self::start_in(&dir, extra).await?;
        server.owns_dir = true;
        Ok(server)
    }

    /// Starts `baton serve` on `data_dir` (kept on drop).
    pub async fn start_in(data_dir: &std::path::Path, extra: &[&str]) -> Result<Self, CliError> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::msg(format!("cannot find the baton binary: {e}")))?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let data_dir = data_dir.to_owned();
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
            owns_dir: false,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while TcpStream::connect(&server.addr).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                return Err(CliError::msg(format!(
                    "the benchmark server did not start listening on {} within 300 s",
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

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

fn free_port() -> Result<u16, CliError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| CliError::msg(format!("cannot find a free port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?
        .port())
}
