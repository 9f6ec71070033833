//! `baton serve`: run a server until SIGINT or SIGTERM.
//!
//! - `settings.rs`: the flags, variables and file, read into [`Settings`];
//! - `running.rs`: a single server, its metrics and its signals;
//! - `member.rs`: a cluster member.

mod member;
mod running;
mod settings;

pub use running::*;
pub use settings::*;

use crate::CliResult;

/// Serves with `args` until SIGINT or SIGTERM: a cluster member if they
/// name a node id, else a single server.
pub async fn run(args: Settings) -> CliResult {
    let config = args.server_config();
    if let Some(file) = &args.test_disk_faults {
        tracing::warn!(file = %file.display(), "disk faults are injected as this file says (--test-disk-faults, a flag for testing only)");
        baton_server::persist::disk_faults::arm(file.clone());
    }
    // Ports are taken (or found taken) before the data directory is
    // touched: a busy port must not leave a new directory behind.
    let metrics = bind_metrics(&args).await?;
    if let Some(id) = args.node_id {
        return member::serve_member(id, &args, config, metrics).await;
    }
    running::serve_single(&args, config, metrics).await
}
