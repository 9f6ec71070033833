//! What `baton lock` and `baton elect` share: running a command under a
//! lease (a held lock or a leadership) and stopping it when the lease is lost.

use std::process::ExitCode;
use std::time::Duration;

use baton_client::recipes::LostReason;
use baton_client::{FencingToken, Leadership, LockGuard};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::CliError;

/// Exit status when the lease was lost while the command ran (or was held).
pub const EXIT_LOST: u8 = 125;

/// A held lock or leadership, as far as running a command under it goes.
pub trait Lease {
    fn token(&self) -> FencingToken;
    async fn lost(&self) -> LostReason;
}

impl Lease for LockGuard {
    fn token(&self) -> FencingToken {
        LockGuard::token(self)
    }

    async fn lost(&self) -> LostReason {
        LockGuard::lost(self).await
    }
}

impl Lease for Leadership {
    fn token(&self) -> FencingToken {
        Leadership::token(self)
    }

    async fn lost(&self) -> LostReason {
        Leadership::lost(self).await
    }
}

/// Holds the lease until interrupted (status 0) or lost (status 125),
/// having printed its token.
pub async fn hold(lease: &impl Lease, what: &str, interrupts: &mut Interrupts) -> ExitCode {
    println!("{}", lease.token());
    eprintln!(
        "holding {what} with fencing token {}; Ctrl-C to let go",
        lease.token()
    );
    tokio::select! {
        _ = interrupts.recv() => ExitCode::SUCCESS,
        reason = lease.lost() => {
            eprintln!("baton: lost {what}: {reason}");
            ExitCode::from(EXIT_LOST)
        }
    }
}

/// Runs `command` with `env` while the lease holds, in its own process
/// group. Returns its exit status, or 125 after stopping it (SIGTERM, then
/// SIGKILL after `grace`) because the lease was lost. SIGINT and SIGTERM are
/// passed on to it.
pub async fn run_under(
    lease: &impl Lease,
    what: &str,
    command: &[String],
    env: &[(&str, String)],
    grace: Duration,
    interrupts: &mut Interrupts,
) -> Result<ExitCode, CliError> {
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        // Its own process group, so that stopping it reaches what it spawned.
        .process_group(0)
        .spawn()
        .map_err(|e| CliError::msg(format!("cannot run {}: {e}", command[0])))?;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| CliError::msg(format!("waiting for {}: {e}", command[0])))?;
                return Ok(exit_code(status));
            }
            reason = lease.lost() => {
                eprintln!(
                    "baton: lost {what} ({reason}); stopping {} (SIGTERM, SIGKILL after {} ms)",
                    command[0], grace.as_millis()
                );
                stop(&mut child, grace).await;
                return Ok(ExitCode::from(EXIT_LOST));
            }
            sig = interrupts.recv() => signal_group(&child, sig.number()),
        }
    }
}

/// SIGTERM to the command's group, then SIGKILL if it outlives `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    signal_group(child, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        signal_group(child, libc::SIGKILL);
        let _ = child.wait().await;
    }
}

fn signal_group(child: &Child, sig: i32) {
    if let Some(pid) = child.id() {
        // SAFETY: kill has no memory effects; a negative pid names the
        // process group the child leads.
        unsafe {
            libc::kill(-(pid as i32), sig);
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(sig)) => ExitCode::from(128u8.wrapping_add(sig as u8)),
        (None, None) => ExitCode::FAILURE,
    }
}

/// What a contender stores in its node: who it is.
pub fn identity() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let host = if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown host".into()
    };
    format!("pid {} on {host}", std::process::id())
}

/// SIGINT and SIGTERM, as they arrive.
pub struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

#[derive(Clone, Copy)]
pub enum Interrupt {
    Int,
    Term,
}

impl Interrupt {
    pub fn number(self) -> i32 {
        match self {
            Interrupt::Int => libc::SIGINT,
            Interrupt::Term => libc::SIGTERM,
        }
    }
}

impl std::fmt::Display for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interrupt::Int => "SIGINT",
            Interrupt::Term => "SIGTERM",
        })
    }
}

impl Interrupts {
    pub fn new() -> Result<Self, CliError> {
        let listen = |kind| {
            signal(kind).map_err(|e| CliError::msg(format!("cannot listen for signals: {e}")))
        };
        Ok(Interrupts {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
        })
    }

    pub async fn recv(&mut self) -> Interrupt {
        tokio::select! {
            _ = self.int.recv() => Interrupt::Int,
            _ = self.term.recv() => Interrupt::Term,
        }
    }
}
