//! `baton barrier`: enter a double barrier with other parties, run a
//! command, and leave together.

use std::process::ExitCode;
use std::time::Duration;

use baton_client::recipes::DoubleBarrier;

use crate::lease::{exit_code, EXIT_CANNOT_RUN, EXIT_NOT_FOUND};
use crate::signals::Interrupts;
use crate::supervise::Supervised;
use crate::{CliError, CliResult};

/// Start and finish together with other parties (a double barrier).
///
/// Waits until --parties processes have entered the barrier at PATH, runs
/// CMD, then waits until every party that entered has finished its command
/// and left. Without CMD it is a rendezvous: it returns once all parties
/// have arrived (and left again).
///
/// Each party is an ephemeral node under PATH: a party whose process or
/// session ends is counted out. CMD gets BATON_BARRIER_PATH and
/// BATON_SERVER in its environment. SIGINT, SIGTERM or SIGHUP while CMD
/// runs is passed on to it (SIGKILL 10 s later if it still runs); baton then
/// exits without waiting for the others, and its party leaves with its
/// session.
///
/// Exit status: CMD's status (128+N if a signal N ended it), once every
/// party has left; 126 if CMD could not be run, 127 if it was not found;
/// 128+N if signal N arrived while waiting; 1 if baton itself failed.
#[derive(clap::Args)]
pub struct BarrierArgs {
    /// Path of the barrier, such as /barriers/nightly.
    path: String,

    /// How many parties the barrier waits for.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    parties: u32,

    /// Session timeout to ask for: how long this party stays counted after
    /// this process falls silent (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::duration::millis)]
    session_timeout: u64,

    /// The command to run and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// How long CMD has to stop after a signal passed on to it.
const KILL_GRACE: Duration = Duration::from_secs(10);

pub async fn barrier(server: &str, args: BarrierArgs) -> CliResult {
    let mut interrupts = Interrupts::new()?;
    let client = crate::client_builder(server)
        .session_timeout(Duration::from_millis(args.session_timeout))
        .connect()
        .await
        .map_err(crate::commands::connect_hint)?;
    let barrier = DoubleBarrier::new(&client, &args.path, args.parties as usize);
    let result = async {
        let entered = tokio::select! {
            entered = barrier.enter() => entered?,
            sig = interrupts.recv() => {
                eprintln!("baton: {sig} while waiting for the parties of {}", args.path);
                return Ok(ExitCode::from(128 + sig.number() as u8));
            }
        };
        let code = match args.command.split_first() {
            None => ExitCode::SUCCESS,
            Some((program, rest)) => {
                let env = [
                    ("BATON_BARRIER_PATH", args.path.clone()),
                    ("BATON_SERVER", server.to_owned()),
                ];
                match Supervised::spawn(program, rest, &env).await {
                    Ok(mut child) => tokio::select! {
                        status = child.wait() => exit_code(
                            status.map_err(|e| CliError::msg(format!("waiting for {program:?}: {e}")))?,
                        ),
                        sig = interrupts.recv() => {
                            eprintln!(
                                "baton: {sig}; passing it on to {program:?} (SIGKILL after {} s)",
                                KILL_GRACE.as_secs()
                            );
                            let kill_at = tokio::time::Instant::now() + KILL_GRACE;
                            let status = child
                                .stop(Some(sig.number()), kill_at, std::future::pending())
                                .await;
                            return Ok(exit_code(status));
                        }
                    },
                    Err(e) => {
                        eprintln!("baton: cannot run {program:?}: {e}");
                        ExitCode::from(match e.kind() {
                            std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                            _ => EXIT_CANNOT_RUN,
                        })
                    }
                }
            }
        };
        tokio::select! {
            left = entered.leave() => left?,
            sig = interrupts.recv() => {
                eprintln!("baton: {sig} while waiting for the other parties of {} to finish", args.path);
                return Ok(ExitCode::from(128 + sig.number() as u8));
            }
        }
        Ok::<_, CliError>(code)
    }
    .await;
    // Every way out ends the session, and this party's node goes with it.
    client.close().await;
    result
}
