//! A `baton serve` child process for benchmarks.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
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
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("baton-bench-{}-{n}", std::process::id()));
        let mut server = Self::start_in(&dir, extra).await?;
        server.owns_dir = true;
        Ok(server)
    }

    /// Starts `baton serve` on `data_dir` (kept on drop), on a port of its
    /// choosing, and waits until it says where it accepts connections.
    pub async fn start_in(data_dir: &std::path::Path, extra: &[&str]) -> Result<Self, CliError> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::msg(format!("cannot find the baton binary: {e}")))?;
        let data_dir = data_dir.to_owned();
        let mut child = Command::new(exe)
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("BATON_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::msg(format!("cannot start the benchmark server: {e}")))?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        // Recovery of a long log comes first: give it time.
        let line = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
            .await
            .map_err(|_| {
                CliError::msg("the benchmark server did not start listening within 300 s")
            })?
            .map_err(|e| CliError::msg(format!("reading the benchmark server's output: {e}")))?
            .unwrap_or_default();
        let addr = line
            .strip_prefix("listening on ")
            .ok_or_else(|| {
                CliError::msg(format!(
                    "the benchmark server exited instead of listening (it said {line:?})"
                ))
            })?
            .to_owned();
        Ok(ChildServer {
            child,
            addr,
            data_dir,
            owns_dir: false,
        })
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
