//! `baton elect` and `baton leader`: run a command while leading an
//! election, and show (or follow) who leads.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use baton_client::recipes::Leader;
use baton_client::{Client, Election};
use futures::StreamExt;

use crate::lease::{hold, run_under, Interrupts};
use crate::{CliError, CliResult};

/// Campaign in an election, and run a command while leading it.
///
/// Joins the election at PATH with VALUE (what followers should know about
/// this leader: an address, say), waits until it leads (candidates lead in
/// the order they joined; a standby waits only for the candidate before it),
/// then runs CMD with BATON_FENCING_TOKEN (the leadership's epoch, in
/// decimal), BATON_LEADER_VALUE and BATON_SERVER in its environment. Send the
/// epoch with every write the leader makes, and have the storage refuse
/// lower ones: a deposed leader waking from a pause is then harmless.
///
/// If leadership is lost while CMD runs (the session expired, the node was
/// deleted, or the session timeout passed without word from the server),
/// CMD gets SIGTERM, then SIGKILL after --kill-grace, and baton exits with
/// status 125. When CMD exits, baton resigns and exits with CMD's status.
/// With no CMD it prints the epoch and leads until SIGINT or SIGTERM.
///
/// Exit status: CMD's status (128+N if a signal N ended it); 125 if
/// leadership was lost; 1 if baton itself failed.
#[derive(clap::Args)]
pub struct ElectArgs {
    /// Path of the election, such as /election/master.
    path: String,

    /// This candidate's value, published while it leads.
    #[arg(long)]
    value: String,

    /// Session timeout to ask for, in milliseconds: how long leadership
    /// survives this process falling silent (the failover time).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    session_timeout: u64,

    /// Time CMD gets between SIGTERM and SIGKILL when leadership is lost.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    kill_grace: u64,

    /// The command to run while leading, and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Print the current leader of an election: its value and epoch.
///
/// Prints `VALUE TOKEN` (the epoch in decimal) on one line, or `none` if
/// nobody leads. With --watch, prints a line for every change of leader until
/// interrupted.
#[derive(clap::Args)]
pub struct LeaderArgs {
    /// Path of the election.
    path: String,

    /// Keep printing changes of leader.
    #[arg(long)]
    watch: bool,
}

pub async fn elect(server: &str, args: ElectArgs) -> CliResult {
    let client = Client::builder(server)
        .session_timeout(Duration::from_millis(args.session_timeout))
        .connect()
        .await
        .map_err(crate::commands::connect_hint)?;
    let election = Election::new(&client, &args.path);
    let mut interrupts = Interrupts::new()?;
    let leadership = tokio::select! {
        r = election.campaign(args.value.clone()) => r?,
        sig = interrupts.recv() => {
            eprintln!("baton: {sig} while campaigning in {}; not leading", args.path);
            client.close().await;
            return Ok(ExitCode::from(128 + sig.number() as u8));
        }
    };
    let what = format!("leadership of {}", args.path);
    let code = if args.command.is_empty() {
        hold(&leadership, &what, &mut interrupts).await
    } else {
        eprintln!(
            "leading {} with epoch {}; running {}",
            args.path,
            leadership.token(),
            args.command[0]
        );
        let env = [
            ("BATON_FENCING_TOKEN", leadership.token().to_string()),
            ("BATON_LEADER_VALUE", args.value.clone()),
            ("BATON_SERVER", server.to_owned()),
        ];
        let grace = Duration::from_millis(args.kill_grace);
        run_under(
            &leadership,
            &what,
            &args.command,
            &env,
            grace,
            &mut interrupts,
        )
        .await?
    };
    let _ = leadership.resign().await;
    client.close().await;
    Ok(code)
}

pub async fn leader(server: &str, args: LeaderArgs) -> CliResult {
    let client = crate::commands::connect(server).await?;
    let election = Election::new(&client, &args.path);
    if !args.watch {
        let leader = election.leader().await?;
        client.close().await;
        print_leader(leader.as_ref());
        return Ok(ExitCode::SUCCESS);
    }
    let mut changes = Box::pin(election.observe());
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            change = changes.next() => match change {
                Some(Ok(leader)) => print_leader(leader.as_ref()),
                Some(Err(e)) => return Err(CliError::from(e)),
                None => break,
            },
        }
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

fn print_leader(leader: Option<&Leader>) {
    match leader {
        Some(l) => println!("{} {}", String::from_utf8_lossy(&l.value), l.token),
        None => println!("none"),
    }
    let _ = std::io::stdout().flush();
}
