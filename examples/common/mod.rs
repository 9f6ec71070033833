//! Pieces the examples share: an in-process server, a timeline printer, the
//! line reports child processes send their parent, and freezing a process.

// Each example uses only some of these.
#![allow(dead_code)]

use std::fmt::Display;
use std::time::Duration;

use baton::server::{Config, Server, ServerHandle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

/// A Baton server running in this process on a free local port.
pub struct Embedded {
    pub addr: String,
    pub handle: ServerHandle,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Embedded {
    pub async fn start(config: Config) -> Result<Self, String> {
        let server = Server::bind("127.0.0.1:0", config)
            .await
            .map_err(|e| format!("starting the server: {e}"))?;
        let addr = server
            .local_addr()
            .map_err(|e| format!("reading the server's address: {e}"))?
            .to_string();
        let handle = server.handle();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = server.run(shutdown).await {
                eprintln!("server failed: {e}");
            }
        });
        Ok(Embedded {
            addr,
            handle,
            stop,
            task,
        })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Prints steps as `elapsed ms | who | what`.
pub struct Timeline {
    start: Instant,
}

impl Timeline {
    pub fn new() -> Self {
        Timeline {
            start: Instant::now(),
        }
    }

    pub fn say(&self, who: &str, what: impl Display) {
        println!(
            "{:>6} ms  {who:<9} {what}",
            self.start.elapsed().as_millis()
        );
    }
}

/// A child process's report to its parent: one line, `<kind> <details>`,
/// flushed at once so the parent sees it while the child carries on.
pub fn report(kind: &str, details: impl Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{kind} {details}");
    let _ = out.flush();
}

pub enum Signal {
    Stop,
    Continue,
}

/// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) a process this example started.
#[cfg(unix)]
pub fn signal(pid: u32, signal: Signal) -> Result<(), String> {
    let (number, name) = match signal {
        Signal::Stop => (libc::SIGSTOP, "SIGSTOP"),
        Signal::Continue => (libc::SIGCONT, "SIGCONT"),
    };
    let pid = libc::pid_t::try_from(pid).map_err(|_| format!("process id {pid} out of range"))?;
    // SAFETY: kill only sends a signal to a process we started.
    if unsafe { libc::kill(pid, number) } != 0 {
        return Err(format!(
            "sending {name} to process {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn signal(_pid: u32, _signal: Signal) -> Result<(), String> {
    Err("freezing a process needs SIGSTOP: run this example on a Unix system".into())
}
