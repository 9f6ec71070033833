//! `baton lock` and `baton locks`: run a command while holding a lock, and
//! show a lock's queue.

use std::process::ExitCode;
use std::time::Duration;

use baton_client::{Client, Lock};

use crate::lease::{hold, identity, run_under, Interrupts};
use crate::CliResult;

/// Exit status when the lock was not acquired within --timeout.
pub const EXIT_TIMEOUT: u8 = 124;

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
            c.token.get(),
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
    let what = format!("the lock {}", args.path);
    let code = if args.command.is_empty() {
        hold(&guard, &what, &mut interrupts).await
    } else {
        let env = [
            ("BATON_FENCING_TOKEN", guard.token().to_string()),
            ("BATON_LOCK_PATH", guard.node().to_owned()),
            ("BATON_SERVER", server.to_owned()),
        ];
        let grace = Duration::from_millis(args.kill_grace);
        run_under(&guard, &what, &args.command, &env, grace, &mut interrupts).await?
    };
    // Release explicitly (even after a loss: the node may still be there).
    let _ = guard.release().await;
    client.close().await;
    Ok(code)
}
