//! `baton semaphore`: run a command while holding one of a semaphore's
//! permits.

use baton_client::recipes::Semaphore;

use crate::lock::HoldArgs;
use crate::CliResult;

/// Run a command while holding one of N permits (or, with no command, hold
/// one).
///
/// Up to --permits processes hold the semaphore at PATH at once; the others
/// wait, and are served in arrival order: when a holder leaves, exactly the
/// first waiter is woken. Otherwise it behaves as `baton lock`: CMD gets
/// BATON_FENCING_TOKEN (its permit's fencing token, greater than that of
/// every permit granted before it), BATON_LOCK_PATH (this holder's node)
/// and BATON_SERVER in its environment, is stopped before its permit can
/// pass to anyone else, and the permit is returned when CMD exits.
///
/// Every holder and waiter of one semaphore must give the same --permits:
/// the server refuses to queue one that asks for another number while
/// others are queued.
///
/// Exit status: CMD's status (128+N if a signal N ended it); 124 if no
/// permit was granted within --timeout; 125 if the permit was lost; 126 if
/// CMD could not be run, 127 if it was not found; 1 if baton itself failed.
#[derive(clap::Args)]
pub struct SemaphoreArgs {
    /// How many holders the semaphore admits at once.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: u32,

    #[command(flatten)]
    hold: HoldArgs,
}

pub async fn semaphore(server: &str, args: SemaphoreArgs) -> CliResult {
    let permits = args.permits;
    crate::lock::hold_while(server, &args.hold, "semaphore", |client, path| {
        Semaphore::new(client, path, permits).as_lock().clone()
    })
    .await
}
