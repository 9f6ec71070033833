//! `baton lock` and `baton locks`: run a command while holding a lock, and
//! show a lock's queue.

use std::process::ExitCode;
use std::time::Duration;

use baton_client::{Client, Lock, LockGuard};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::{CliError, CliResult};

/// Exit status when the lock was not acquired within --timeout.
pub const EXIT_TIMEOUT: u8 = 124;
/// Exit status when the lock was lost while the command ran (or was held).
pub const EXIT_LOST: u8 = 125;

/// Run a command while holding a lock (or, with no command, hold it).
///
/// Waits for the lock at PATH (fair: waiters are served in arrival order),
/// then runs CMD with BATON_FENCING_TOKEN (the grant's fencing token, in
/// decimal), BATON_LOCK_PATH (this holder's node) and BATON_SERVER in its
/// environment, and releases the lock when CMD exits. Pass the token along
/// with every write CMD makes, and have the storage refuse lower tokens.
///
/// If the lock is lost while CMD runs (the session expired, the node was
/// deleted, or the session timeout passed without word from the server),
/// CMD gets SIGTERM, then SIGKILL after --kill-grace, and baton exits with
/// status 125. SIGINT and SIGTERM sent to baton are passed on to CMD.
///
/// With no CMD, prints the token and holds the lock until SIGINT or SIGTERM.
///
/// Exit status: CMD's status (128+N if a signal N ended it); 124 if the lock
/// was not acquired within --timeout; 125 if the lock was lost; 1 if baton
/// itself failed.
#[derive(clap::Args)]
pub struct LockArgs {
    /// Path of the lock, such as /locks/nightly-report.
    path: String,

    /// Give up waiting after this many milliseconds (exit status 124).
    #[arg(long, value_name = "MS")]
    timeout: Option<u64>,

    /// Session timeout to ask for, in milliseconds: how long the lock
    /// survives this process falling silent.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    session_timeout: u64,

    /// Time CMD gets between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    kill_grace: u64,

    /// The command to run and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Show a lock's holder and queue.
///
/// One line per contender, in order: the holder first, then the waiters.
/// Each line shows the position, the fencing token, the owning session, the
/// node and what the contender stored in it (for `baton lock`, its process
/// id and host).
#[derive(clap::Args)]
pub struct LocksArgs {
    /// Path of the lock.
    path: String,
}

pub async fn locks(server: &str, args: LocksArgs) -> CliResult {
    let client = crate::commands::connect(server).await?;
    let queue = Lock::new(&client, &args.path).contenders().await?;
    client.close().await;
    if queue.is_empty() {
        println!("{} is free: no holder, no waiters", args.path);
    }
    for (i, c) in queue.iter().enumerate() {
        let role = if i == 0 {
            "holder".to_string()
        } else {
            format!("waiter {i}")
        };
        let owner = c.owner.map_or_else(|| "-".into(), |o| o.to_string());
        println!(
            "{role:<10} token {:<12} session {owner:<10} {}  {}",
            c.token,
            c.node,
            String::from_utf8_lossy(&c.identity)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn lock(server: &str, args: LockArgs) -> CliResult {
    let client = Client::builder(server)
        .session_timeout(Duration::from_millis(args.session_timeout))
        .connect()
        .await
        .map_err(crate::commands::connect_hint)?;
    let lock = Lock::new(&client, &args.path).with_identity(identity());
    let mut interrupts = Interrupts::new()?;
    let acquired = tokio::select! {
        r = async {
            match args.timeout {
                Some(ms) => lock.acquire_timeout(Duration::from_millis(ms)).await,
                None => lock.acquire().await.map(Some),
            }
        } => r?,
        sig = interrupts.recv() => {
            eprintln!("baton: {sig} while waiting for {}; not acquired", args.path);
            client.close().await;
            return Ok(ExitCode::from(128 + sig.number() as u8));
        }
    };
    let Some(guard) = acquired else {
        eprintln!(
            "baton: timed out after {} ms waiting for lock {}",
            args.timeout.unwrap_or_default(),
            args.path
        );
        client.close().await;
        return Ok(ExitCode::from(EXIT_TIMEOUT));
    };
    let code = if args.command.is_empty() {
        hold(&guard, &args.path, &mut interrupts).await
    } else {
        run_command(&guard, server, &args, &mut interrupts).await?
    };
    // Release explicitly (even after a loss: the node may still be there).
    let _ = guard.release().await;
    client.close().await;
    Ok(code)
}

/// Holds the lock until interrupted or lost.
async fn hold(guard: &LockGuard, path: &str, interrupts: &mut Interrupts) -> ExitCode {
    println!("{}", guard.token());
    eprintln!(
        "holding {path} with fencing token {}; Ctrl-C to release",
        guard.token()
    );
    tokio::select! {
        _ = interrupts.recv() => ExitCode::SUCCESS,
        reason = guard.lost() => {
            eprintln!("baton: lost the lock {path}: {reason}");
            ExitCode::from(EXIT_LOST)
        }
    }
}

/// Runs the command under the lock; stops it if the lock is lost.
async fn run_command(
    guard: &LockGuard,
    server: &str,
    args: &LockArgs,
    interrupts: &mut Interrupts,
) -> Result<ExitCode, CliError> {
    let mut child = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("BATON_FENCING_TOKEN", guard.token().to_string())
        .env("BATON_LOCK_PATH", guard.node())
        .env("BATON_SERVER", server)
        // Its own process group, so that stopping it reaches what it spawned.
        .process_group(0)
        .spawn()
        .map_err(|e| CliError::msg(format!("cannot run {}: {e}", args.command[0])))?;
    let grace = Duration::from_millis(args.kill_grace);
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| CliError::msg(format!("waiting for {}: {e}", args.command[0])))?;
                return Ok(exit_code(status));
            }
            reason = guard.lost() => {
                eprintln!(
                    "baton: lost the lock {} ({reason}); stopping {} (SIGTERM, SIGKILL after {} ms)",
                    args.path, args.command[0], grace.as_millis()
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
fn identity() -> String {
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
struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

#[derive(Clone, Copy)]
enum Interrupt {
    Int,
    Term,
}

impl Interrupt {
    fn number(self) -> i32 {
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
    fn new() -> Result<Self, CliError> {
        let listen = |kind| {
            signal(kind).map_err(|e| CliError::msg(format!("cannot listen for signals: {e}")))
        };
        Ok(Interrupts {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) -> Interrupt {
        tokio::select! {
            _ = self.int.recv() => Interrupt::Int,
            _ = self.term.recv() => Interrupt::Term,
        }
    }
}
