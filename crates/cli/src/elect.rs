//! `baton elect` and `baton leader`: run a command while leading an
//! election, and show (or follow) who leads.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use baton_client::recipes::Leader;
use baton_client::{Client, Election};
use futures::StreamExt;

use crate::commands::with_session;
use crate::lease::{check_grace, hold, run_under, stop_before, Run};
use crate::lock::granted_grace;
use crate::signals::Interrupts;
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
/// CMD is stopped before another candidate can lead. If the server falls
/// silent, CMD gets SIGTERM --kill-grace plus a safety margin (a tenth of
/// the session timeout) before the server may expire the session, and
/// SIGKILL when the grace is up; if leadership is gone already (its node was
/// deleted, the session expired), CMD gets SIGKILL at once. Either way baton
/// exits with status 125. SIGINT, SIGTERM and SIGHUP sent to baton are
/// passed on to CMD, which gets SIGKILL if it outlives the grace. When CMD
/// exits, everything it left running gets SIGKILL; if baton itself dies, CMD
/// and everything it started die too. When CMD exits, baton resigns and exits
/// with CMD's status.
///
/// With no CMD it prints the epoch and leads until SIGINT, SIGTERM or
/// SIGHUP. Whatever the way out, baton closes its session before it exits,
/// so the next candidate leads at once.
///
/// Exit status: CMD's status (128+N if a signal N ended it); 125 if
/// leadership was lost; 126 if CMD could not be run, 127 if it was not
/// found; 1 if baton itself failed.
#[derive(clap::Args)]
pub struct ElectArgs {
    /// Path of the election, such as /election/master.
    path: String,

    /// This candidate's value, published while it leads.
    #[arg(long)]
    value: String,

    /// Session timeout to ask for: how long leadership survives this
    /// process falling silent (the failover time). A duration; a bare
    /// number is milliseconds.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::duration::millis)]
    session_timeout: u64,

    /// Time CMD gets between SIGTERM and SIGKILL [default: a fifth of the
    /// session timeout]. SIGTERM comes this long, plus a safety margin of a
    /// tenth of the session timeout, before the server may expire the
    /// session, so the two must fit in half the session timeout. A
    /// duration; a bare number is milliseconds.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::millis)]
    kill_grace: Option<u64>,

    /// The command to run while leading, and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Print the current leader of an election: its value and epoch.
///
/// Prints `VALUE TOKEN` (the epoch in decimal) on one line, or `none` if
/// nobody leads. With --watch, prints a line for every change of leader until
/// SIGINT, SIGTERM or SIGHUP.
#[derive(clap::Args)]
pub struct LeaderArgs {
    /// Path of the election.
    path: String,

    /// Keep printing changes of leader.
    #[arg(long)]
    watch: bool,

    /// Print JSON: `{"value", "epoch", "node", "session"}`, or `null` when
    /// nobody leads (one per line with --watch).
    #[arg(long)]
    json: bool,
}

pub async fn elect(server: &str, args: ElectArgs) -> CliResult {
    let requested = Duration::from_millis(args.session_timeout);
    if let (Some(ms), false) = (args.kill_grace, args.command.is_empty()) {
        check_grace(Duration::from_millis(ms), requested)?;
    }
    let mut interrupts = Interrupts::new()?;
    let client = crate::client_builder(server)
        .session_timeout(requested)
        .connect()
        .await
        .map_err(crate::commands::connect_hint)?;
    let result = elect_with(&client, server, &args, &mut interrupts).await;
    // Every way out ends the session, and the candidate's node goes with it.
    client.close().await;
    result
}

async fn elect_with(
    client: &Client,
    server: &str,
    args: &ElectArgs,
    interrupts: &mut Interrupts,
) -> CliResult {
    let mut election = Election::new(client, &args.path);
    let grace = granted_grace(client, args.kill_grace, !args.command.is_empty())?;
    if let Some(grace) = grace {
        election = election.stop_before(stop_before(grace, client.session_timeout()));
    }
    let leadership = tokio::select! {
        r = election.campaign(args.value.clone()) => r?,
        sig = interrupts.recv() => {
            eprintln!("baton: {sig} while campaigning in {}; not leading", args.path);
            return Ok(ExitCode::from(128 + sig.number() as u8));
        }
    };
    let what = format!("leadership of {}", args.path);
    let Some(grace) = grace else {
        return Ok(hold(&leadership, &what, interrupts).await);
    };
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
    let run = Run {
        client,
        what: &what,
        command: &args.command,
        env: &env,
        grace,
    };
    run_under(&leadership, &run, interrupts).await
}

pub async fn leader(server: &str, args: LeaderArgs) -> CliResult {
    if !args.watch {
        let leader = with_session(server, async |client| {
            Ok(Election::new(client, &args.path).leader().await?)
        })
        .await?;
        print_leader(leader.as_ref(), args.json);
        return Ok(ExitCode::SUCCESS);
    }
    let mut interrupts = Interrupts::new()?;
    with_session(server, async |client| {
        let mut changes = Box::pin(Election::new(client, &args.path).observe());
        loop {
            tokio::select! {
                _ = interrupts.recv() => return Ok(ExitCode::SUCCESS),
                change = changes.next() => match change {
                    Some(Ok(leader)) => print_leader(leader.as_ref(), args.json),
                    Some(Err(e)) => return Err(CliError::from(e)),
                    None => return Ok(ExitCode::SUCCESS),
                },
            }
        }
    })
    .await
}

fn print_leader(leader: Option<&Leader>, json: bool) {
    match (leader, json) {
        (Some(l), false) => println!("{} {}", String::from_utf8_lossy(&l.value), l.token),
        (None, false) => println!("none"),
        (Some(l), true) => println!(
            "{}",
            serde_json::json!({
                "value": String::from_utf8_lossy(&l.value),
                "epoch": l.token.get(),
                "node": l.node,
                "session": l.session.map(|s| s.0),
            })
        ),
        (None, true) => println!("null"),
    }
    let _ = std::io::stdout().flush();
}
