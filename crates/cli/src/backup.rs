//! `baton snapshot save` and `baton snapshot restore`: backups.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use baton_server::persist::restore::{self, RestoreError};
use baton_server::persist::snapshot;

use crate::{CliError, CliResult};

/// Back up a running server, or restore a backup into a new data directory.
///
/// A backup is one file: the server's whole state (nodes, sessions, fencing
/// tokens, sequence numbers) at one revision, in the format of its snapshot
/// files, with checksums. It is how to back up a server, and how to move
/// one: save, then restore on the new machine and start the server there.
#[derive(clap::Subcommand)]
pub enum SnapshotCommand {
    Save(SaveArgs),
    Restore(RestoreArgs),
}

/// Save a snapshot of a running server's whole state to FILE.
///
/// The snapshot is consistent: the state at one revision, taken once the
/// server's log holds every change up to it, while the server goes on
/// serving (copying the state costs it microseconds). The file is checked
/// (its checksums and structure) before it is written; it is written to
/// FILE.tmp, synced and renamed, so FILE is always a whole backup.
#[derive(clap::Args)]
pub struct SaveArgs {
    /// Where to write the snapshot (replaced if it exists).
    file: PathBuf,

    /// How long to wait for each part of the server's answer (a duration;
    /// a bare number is milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::duration::millis)]
    timeout: u64,
}

/// Restore a snapshot saved with `baton snapshot save` into a new data
/// directory.
///
/// The file's checksums and structure are verified first; nothing is
/// written if it is damaged. The data directory must not exist or be
/// empty. Then start a server on it (`baton serve --data-dir DIR`): it holds
/// the state of the snapshot, and each session in it gets a full timeout to
/// reconnect before it expires.
///
/// With --node-id (and the member's --peer-addr and --client-addr), DIR
/// becomes the first member of a restored cluster instead: start it with
/// `baton serve --node-id ID --data-dir DIR` and it leads alone; then start
/// each other member with an empty data directory and --join, and add it
/// with `baton cluster add` (it catches up from the first). Restore one
/// member only: members restored one by one could each hold a different
/// state.
///
/// The restored server never hands out a fencing token, a sequence number
/// or a revision that the saved server may have handed out after the
/// backup: its revisions skip ahead (by default a billion, plus ten
/// million for every second since the backup's latest change, by this
/// machine's clock, which a second restore of the same backup skips past
/// too; see docs/operations.md, "Restoring").
#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The snapshot to restore.
    file: PathBuf,

    /// The new server's data directory.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,

    /// Skip exactly N revisions instead of the default. Safe only if N is
    /// more than the saved server handed out after the backup (its latest
    /// revision, from `baton status`, minus the backup's).
    #[arg(long, value_name = "N")]
    bump_revision: Option<u64>,

    /// Make DIR the first member of a restored cluster, with this id.
    #[arg(long, value_name = "ID", value_parser = clap::value_parser!(u64).range(1..), requires_all = ["peer_addr", "client_addr"])]
    node_id: Option<u64>,

    /// With --node-id: where the other members will reach this one (its
    /// --peer-listen address).
    #[arg(long, value_name = "HOST:PORT", requires = "node_id")]
    peer_addr: Option<String>,

    /// With --node-id: where clients will reach this member.
    #[arg(long, value_name = "HOST:PORT", requires = "node_id")]
    client_addr: Option<String>,
}

pub async fn run(servers: &str, command: SnapshotCommand) -> CliResult {
    match command {
        SnapshotCommand::Save(args) => save(servers, args).await,
        SnapshotCommand::Restore(args) => restore(args),
    }
}

async fn save(servers: &str, args: SaveArgs) -> CliResult {
    let limit = Duration::from_millis(args.timeout);
    let mut last = String::from("no server address given");
    let mut fetched = None;
    for addr in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        use baton_client::Error;
        match baton_client::backup(addr, limit, crate::tls(), crate::token()).await {
            Ok(backup) => {
                fetched = Some((addr.to_owned(), backup));
                break;
            }
            // Another member may lead, or answer.
            Err(e @ (Error::Connect { .. } | Error::NotLeader(_))) => last = e.to_string(),
            // The same refusal everywhere.
            Err(e) => return Err(e.into()),
        }
    }
    let Some((addr, backup)) = fetched else {
        return Err(CliError::msg(format!(
            "no server could take the backup; the last said: {last}"
        )));
    };
    snapshot::decode(&backup.bytes).map_err(|c| {
        CliError::msg(format!(
            "{addr} sent a snapshot that does not check out ({c}); nothing was written"
        ))
    })?;
    write_durably(&args.file, &backup.bytes)?;
    println!(
        "saved revision {} of {addr} ({} sessions, {} nodes, {} bytes) to {}",
        backup.revision,
        backup.sessions,
        backup.nodes,
        backup.bytes.len(),
        args.file.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn restore(args: RestoreArgs) -> CliResult {
    let file = &args.file;
    let bytes = std::fs::read(file)
        .map_err(|e| CliError::msg(format!("cannot read {}: {e}", file.display())))?;
    let restored = restore::prepare(&bytes, args.bump_revision).map_err(|e| match e {
        RestoreError::Damaged { .. } => CliError::msg(format!(
            "{} is {e}: damaged or cut short? Nothing was restored",
            file.display()
        )),
        RestoreError::Skip(why) => CliError::msg(format!("{why}; nothing was restored")),
    })?;
    let sm = &restored.state;
    // ZooKeeper's clients read a sequential node's number in 10 digits.
    if sm.revision() > 9_999_999_999 - (1 << 20) {
        eprintln!(
            "note: the restored state starts at revision {}: its sequence numbers need more than 10 digits, so sequential creates through a ZooKeeper port (--zk-listen) will be refused (docs/zookeeper.md); if ZooKeeper clients use this server, restore with a smaller --bump-revision",
            sm.revision()
        );
    }
    let dir = &args.data_dir;
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(CliError::msg(format!(
                    "{} is not empty: restore into a new directory (move the old data directory away first)",
                    dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)
                .map_err(|e| CliError::msg(format!("cannot create {}: {e}", dir.display())))?;
        }
        Err(e) => return Err(CliError::msg(format!("cannot read {}: {e}", dir.display()))),
    }
    let start = match (args.node_id, args.peer_addr, args.client_addr) {
        (Some(id), Some(peer), Some(client)) => {
            let member = baton_cluster::Member { peer, client };
            let raft = dir.join("raft");
            baton_cluster::state_machine::write_seed(&raft, id, member, sm)
                .map_err(|e| CliError::msg(e.to_string()))?;
            format!(
                "start it with: baton serve --node-id {id} --data-dir {} (it leads alone), then start each other member with an empty data directory and --join, and add it with baton cluster add",
                dir.display()
            )
        }
        _ => {
            let mut out = std::io::Cursor::new(Vec::with_capacity(bytes.len()));
            snapshot::encode(sm, &mut out)
                .map_err(|e| CliError::msg(format!("encoding the restored state: {e}")))?;
            let target = dir.join(snapshot::file_name(sm.revision()));
            write_durably(&target, out.get_ref())?;
            format!(
                "start the server with: baton serve --data-dir {}",
                dir.display()
            )
        }
    };
    println!(
        "restored revision {} ({} sessions, {} nodes) into {}; the restored {} continues from revision {} ({} revisions skipped{}); {start}",
        restored.saved_revision,
        sm.session_count(),
        sm.node_count(),
        dir.display(),
        if args.node_id.is_some() { "cluster" } else { "server" },
        sm.revision() + 1,
        restored.skipped,
        if args.bump_revision.is_some() {
            ", as --bump-revision asked"
        } else {
            ": past anything the saved server can have handed out since"
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to `path` through a temporary file beside it, synced and
/// renamed into place, and syncs the directory.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let failed =
        |what: &str, e: std::io::Error| CliError::msg(format!("{what} {}: {e}", path.display()));
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    // Readable by its owner only: a backup holds every node's data and the
    // sessions' secrets.
    let mut out = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
    }
    .map_err(|e| failed("cannot create a file beside", e))?;
    out.write_all(bytes)
        .and_then(|()| out.sync_all())
        .map_err(|e| failed("cannot write", e))?;
    drop(out);
    std::fs::rename(&tmp, path).map_err(|e| failed("cannot rename the temporary file to", e))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| failed("cannot sync the directory of", e))
}
