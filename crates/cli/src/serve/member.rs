//! Running a cluster member: `baton serve --node-id`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use baton_cluster::{ClusterMember, Member, MemberConfig};
use baton_server::Config;

use crate::{CliError, CliResult};

use super::running::{inherited, reload_on_sighup, say_listening, serve_metrics, shutdown_signal};
use super::settings::{parse_members, parse_routes, Settings};

/// How a member starts, from what its data directory holds and what its
/// command line says.
#[derive(Debug, PartialEq)]
enum Start {
    /// Its data directory's membership names it, with its addresses.
    Recorded(Member),
    /// The first start of a new cluster of these members, this one among
    /// them.
    New(BTreeMap<u64, Member>),
    /// To be added to a running cluster (its addresses, if `--peers` names
    /// them).
    Joining(Option<Member>),
}

/// Decides how member `id` starts: `stored` is the membership its data
/// directory records, `members` what `--peers` lists, `join` whether
/// `--join` was given, and `pending` whether its directory holds the
/// marker of a member being added that has not yet learnt it was.
///
/// A member being added can stop at any point of its catch-up, even after
/// the cluster committed the membership that names it but before that
/// membership reached it; it then starts joining again, from the command
/// line it was first started with or the one a new cluster's members use.
fn start_as(
    id: u64,
    stored: Option<&BTreeMap<u64, Member>>,
    members: Option<&BTreeMap<u64, Member>>,
    join: bool,
    pending: bool,
    data_dir: &std::path::Path,
) -> Result<Start, CliError> {
    if let Some(own) = stored.and_then(|m| m.get(&id)) {
        return Ok(Start::Recorded(own.clone()));
    }
    if join || pending {
        return Ok(Start::Joining(members.and_then(|m| m.get(&id)).cloned()));
    }
    match (stored, members) {
        (Some(stored), _) => Err(CliError::msg(format!(
            "member {id} is not in the membership its data directory {} records (members {}): either it was removed (to bring it back, wipe the directory, start it with --join and run `baton cluster add`), or it was being added and had not caught up (start it with --join again)",
            data_dir.display(),
            stored.keys().map(|k| k.to_string()).collect::<Vec<_>>().join(", ")
        ))),
        (None, Some(members)) => Ok(Start::New(members.clone())),
        (None, None) => Err(CliError::msg(format!(
            "{} holds no cluster membership: start a new cluster with --peers (every member, this one included), or start empty with --join and add this member with `baton cluster add`",
            data_dir.display()
        ))),
    }
}

/// `baton serve --node-id ID ...`: runs a cluster member.
pub async fn serve_member(
    id: u64,
    args: &Settings,
    mut server: Config,
    metrics: Option<tokio::net::TcpListener>,
) -> CliResult {
    let members = args.peers.as_deref().map(parse_members).transpose()?;
    if members.as_ref().is_some_and(|m| !m.contains_key(&id)) {
        return Err(CliError::msg(format!(
            "--peers does not list member {id} itself; list every member of the new cluster, this one included"
        )));
    }
    // A member started before: its data directory knows the membership
    // (--peers and --join are for the first start only), and so where this
    // member listens.
    let raft = args.data_dir.join("raft");
    let stored = baton_cluster::log_store::stored_members(&raft).map_err(|e| {
        CliError::msg(format!(
            "cannot read the membership in {}: {e}",
            raft.display()
        ))
    })?;
    let pending = baton_cluster::joining::Joining::pending(&raft);
    let start = start_as(
        id,
        stored.as_ref(),
        members.as_ref(),
        args.join,
        pending,
        &args.data_dir,
    )?;
    let own = match &start {
        Start::Recorded(own) => {
            if members.is_some() || args.join {
                tracing::info!(
                    "the data directory records the membership: --peers and --join are for a member's first start, and are ignored"
                );
            }
            Some(own.clone())
        }
        Start::New(members) => members.get(&id).cloned(),
        Start::Joining(own) => {
            if pending && !args.join {
                tracing::info!(
                    "member {id} was being added to the cluster when it stopped (its data directory {} says so): it waits to be added, as with --join{}",
                    args.data_dir.display(),
                    if members.is_some() { "; --peers is ignored" } else { "" }
                );
            }
            own.clone()
        }
    };
    let clients = match (args.listen_fd, &args.listen, &own) {
        (Some(fd), _, _) => inherited(fd, "--listen-fd")?,
        (None, Some(addr), _) => bind(addr, "clients").await?,
        (None, None, Some(own)) => bind(&own.client, "clients").await?,
        (None, None, None) => {
            return Err(CliError::msg(
                "give the address to listen on for clients with --listen",
            ))
        }
    };
    let peers = match (args.peer_listen_fd, &args.peer_listen, &own) {
        (Some(fd), _, _) => inherited(fd, "--peer-listen-fd")?,
        (None, Some(addr), _) => bind(addr, "the other members").await?,
        (None, None, Some(own)) => bind(&own.peer, "the other members").await?,
        (None, None, None) => {
            return Err(CliError::msg(
                "give the address to listen on for the other members with --peer-listen",
            ))
        }
    };
    let election = Duration::from_millis(args.election_timeout);
    // A session must outlive a failover: the longest election, twice over,
    // and the client's reconnect.
    let floor = election * 4 + Duration::from_millis(500);
    if server.min_session_timeout < floor {
        tracing::warn!(
            "--min-session-timeout {} ms is short for an election timeout of {} ms: sessions may expire during a failover (at least {} ms is advised)",
            server.min_session_timeout.as_millis(),
            election.as_millis(),
            floor.as_millis()
        );
    }
    server.data_dir = None;
    let mut config = MemberConfig::new(id, args.data_dir.clone());
    config.initial = match start {
        Start::New(members) => Some(members),
        Start::Recorded(_) | Start::Joining(_) => None,
    };
    config.fsync = args.fsync;
    config.election_timeout = election;
    config.heartbeat = (election / 3).max(Duration::from_millis(10));
    config.snapshot_every = args.snapshot_entries.max(1);
    config.followers_serve = args.followers_serve;
    config.routes = args
        .route
        .as_deref()
        .map(parse_routes)
        .transpose()?
        .unwrap_or_default();
    config.server = server;
    config.peer_tls = args.peer_tls.clone();
    let peer_addr = peers
        .local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?;
    let member = ClusterMember::start(config, clients, peers)
        .await
        .map_err(|e| CliError::msg(format!("member {id} cannot start: {e}")))?;
    let addr = member
        .client_addr()
        .map_err(|e| CliError::msg(e.to_string()))?;
    serve_metrics(metrics, member.handle());
    reload_on_sighup(args, member.handle())?;
    tracing::info!(member = id, %addr, peer = %peer_addr, "cluster member ready; stop with Ctrl-C or SIGTERM");
    say_listening(&addr.to_string());
    member.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn bind(addr: &str, whom: &str) -> Result<tokio::net::TcpListener, CliError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::msg(format!("cannot listen for {whom} on {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::parse_members;

    /// Pins: a member whose directory holds the marker of a member being
    /// added starts joining again, though its command line is a new
    /// cluster's first start and its log holds a membership from before it
    /// was named (it was stopped after the cluster had added it, before
    /// that membership reached it); without the marker, such a directory is
    /// refused as before.
    #[test]
    fn a_member_stopped_while_being_added_starts_joining_again() {
        let dir = std::path::Path::new("/data/3");
        let all = parse_members("1=h:1/h:11,2=h:2/h:12,3=h:3/h:13").unwrap();
        let before = parse_members("1=h:1/h:11,2=h:2/h:12").unwrap();
        let start =
            |stored, members, join, pending| start_as(3, stored, members, join, pending, dir);
        // Its log holds a membership from before it was named.
        assert_eq!(
            start(Some(&before), Some(&all), false, true).unwrap(),
            Start::Joining(Some(all[&3].clone()))
        );
        assert_eq!(
            start(Some(&before), None, false, true).unwrap(),
            Start::Joining(None)
        );
        // Stopped before any entry reached it: not a new cluster's start.
        assert_eq!(
            start(None, Some(&all), false, true).unwrap(),
            Start::Joining(Some(all[&3].clone()))
        );
        // Once named, its directory's membership says where it listens.
        assert_eq!(
            start(Some(&all), None, false, true).unwrap(),
            Start::Recorded(all[&3].clone())
        );
        assert_eq!(
            start(Some(&all), None, false, false).unwrap(),
            Start::Recorded(all[&3].clone())
        );
        // Without the marker: a first start, --join, or a refusal.
        assert_eq!(
            start(None, Some(&all), false, false).unwrap(),
            Start::New(all.clone())
        );
        assert_eq!(
            start(Some(&before), None, true, false).unwrap(),
            Start::Joining(None)
        );
        let removed = start(Some(&before), Some(&all), false, false)
            .unwrap_err()
            .to_string();
        assert!(
            removed.contains("member 3 is not in the membership") && removed.contains("--join"),
            "{removed}"
        );
        let empty = start(None, None, false, false).unwrap_err().to_string();
        assert!(empty.contains("holds no cluster membership"), "{empty}");
    }
}
