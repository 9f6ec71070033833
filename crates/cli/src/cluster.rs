//! Cluster mode: `baton serve --node-id`, and `baton cluster status`,
//! `add`, `remove` and `local`.

use std::process::ExitCode;
use std::time::Duration;

use baton_cluster::admin::Change;
use baton_cluster::Member;
use serde_json::Value;

use crate::{CliError, CliResult};

/// Manage a cluster: its status, its members, or a whole local one to try.
#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    Status(StatusArgs),
    Add(AddArgs),
    Remove(RemoveArgs),
    Local(crate::local::LocalArgs),
}

/// Show the cluster's members, their roles and progress.
///
/// Asks the servers given with --server (any member will do: one that does
/// not lead names the leader) and prints, for every member, its id, role,
/// addresses, applied index and how far it lags behind the leader; then the
/// leader, the term and the commit index. When no member leads, it prints
/// what each member it can reach says of itself (its role, term, applied
/// index and the leader it knows of) and exits with status 1.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print one JSON object: `leader` (member id), `term`, `commit_index`,
    /// `majority` (whether the leader reaches one) and `members`, each with
    /// `id`, `client_addr`, `peer_addr`, `role`, `voter`, `applied_index`
    /// and `lag`. Without a leader: `leader` null and `members`, each with
    /// `client_addr`, `id`, `role`, `term`, `applied_index` and `leader`.
    #[arg(long)]
    json: bool,
}

/// Add a member to the running cluster, as a voter or as an observer.
///
/// Start the new member first (`baton serve --node-id ID --join
/// --peer-listen ADDR ...`); this asks the leader to add it as a learner,
/// waits until it has caught up (by snapshot if the cluster's log is long),
/// then makes it a voter. With `--observer` it stays a learner: it serves
/// clients (reads and watches from its own copy, changes forwarded to the
/// leader) but does not vote, so it adds read capacity without making a
/// majority larger. Given a member already in the cluster, `add` makes an
/// observer a voter, and `add --observer` a voter an observer.
#[derive(clap::Args)]
pub struct AddArgs {
    /// The new member's id (unique in the cluster).
    #[arg(long, value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
    node_id: u64,
    /// Where the other members reach it (its --peer-listen address).
    #[arg(long, value_name = "HOST:PORT")]
    peer_addr: String,
    /// Where clients reach it (its --listen address).
    #[arg(long, value_name = "HOST:PORT")]
    client_addr: String,
    /// Add it as an observer: a member that serves clients but never
    /// votes (nor leads).
    #[arg(long)]
    observer: bool,
}

/// Remove a member (a voter or an observer) from the cluster; it stops
/// once it learns it.
#[derive(clap::Args)]
pub struct RemoveArgs {
    /// The member's id.
    #[arg(long, value_name = "ID")]
    node_id: u64,
}

pub async fn run(servers: &str, command: ClusterCommand) -> CliResult {
    match command {
        ClusterCommand::Status(args) => status(servers, args).await,
        ClusterCommand::Add(args) => {
            let member = Member {
                peer: args.peer_addr,
                client: args.client_addr,
            };
            change(
                servers,
                Change::Add {
                    id: args.node_id,
                    member,
                    observer: args.observer,
                },
            )
            .await
        }
        ClusterCommand::Remove(args) => change(servers, Change::Remove { id: args.node_id }).await,
        ClusterCommand::Local(args) => crate::local::run(args).await,
    }
}

/// The leader's description of the cluster, found from any of `servers`.
async fn leader_view(servers: &str) -> Result<Value, CliError> {
    let limit = Duration::from_secs(3);
    let mut queue: Vec<String> = servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    queue.reverse();
    let mut seen = std::collections::BTreeSet::new();
    let mut last = String::from("no server address given");
    while let Some(addr) = queue.pop() {
        if !seen.insert(addr.clone()) {
            continue;
        }
        let answer = match baton_client::probe(&addr, limit, crate::tls()).await {
            Ok(a) => a,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        let status: Value = serde_json::from_str(&answer).map_err(|e| {
            CliError::msg(format!("{addr} answered something that is not JSON: {e}"))
        })?;
        match status["role"].as_str() {
            Some("leader") => return Ok(status),
            Some("single") => {
                return Err(CliError::msg(format!(
                    "{addr} is a single server, not a cluster member"
                )))
            }
            _ => {}
        }
        match status["leader"].as_str() {
            Some(leader) if !leader.is_empty() => queue.push(leader.to_owned()),
            _ => {
                last =
                    format!("{addr} does not lead and knows of no leader right now (an election?)")
            }
        }
    }
    Err(CliError::msg(format!("no leader found: {last}")))
}

/// What every member that answers says of itself: the given addresses,
/// and the members they name, asked at once. For a cluster without a
/// leader, where no member can describe the others' progress.
async fn every_member(servers: &str) -> Vec<(String, Option<Value>)> {
    let limit = Duration::from_secs(2);
    let mut asked: Vec<(String, Option<Value>)> = Vec::new();
    let mut next: Vec<String> = servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    // Two rounds: the addresses given, then members they name.
    for _ in 0..2 {
        next.retain(|a| !asked.iter().any(|(b, _)| a == b));
        next.dedup();
        let answers = futures::future::join_all(next.iter().map(|addr| async move {
            let answer = baton_client::probe(addr, limit, crate::tls()).await.ok();
            answer.and_then(|a| serde_json::from_str::<Value>(&a).ok())
        }))
        .await;
        let mut named = Vec::new();
        for (addr, answer) in next.drain(..).zip(answers) {
            for m in answer.as_ref().map_or(&[][..], |a| {
                a["cluster"]["members"]
                    .as_array()
                    .map_or(&[][..], |v| &v[..])
            }) {
                if let Some(client) = m["client_addr"].as_str() {
                    named.push(client.to_owned());
                }
            }
            asked.push((addr, answer));
        }
        next = named;
    }
    asked
}

/// `baton cluster status` when no member leads: each member's own view.
fn print_without_leader(why: &str, views: &[(String, Option<Value>)], json: bool) -> CliResult {
    let own = |v: &Value| {
        let id = v["cluster"]["id"].clone();
        let me = v["cluster"]["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["id"] == id).cloned())
            .unwrap_or(Value::Null);
        (
            id,
            me["role"].clone(),
            v["cluster"]["term"].clone(),
            v["cluster"]["applied_index"].clone(),
            v["cluster"]["leader"].clone(),
        )
    };
    if json {
        let members: Vec<Value> = views
            .iter()
            .map(|(addr, view)| match view {
                Some(v) => {
                    let (id, role, term, applied, leader) = own(v);
                    serde_json::json!({"client_addr": addr, "id": id, "role": role, "term": term, "applied_index": applied, "leader": leader})
                }
                None => serde_json::json!({"client_addr": addr, "role": "unreachable"}),
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "leader": null, "members": members })
        );
    } else {
        let show = |v: &Value| match v {
            Value::Null => "-".to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        println!("no leader: {why}");
        println!(
            "{:<4} {:<12} {:<22} {:>8} {:>10} {:>8}",
            "id", "role", "client", "term", "applied", "leader"
        );
        for (addr, view) in views {
            let (id, role, term, applied, leader) = match view {
                Some(v) => own(v),
                None => (
                    Value::Null,
                    "unreachable".into(),
                    Value::Null,
                    Value::Null,
                    Value::Null,
                ),
            };
            println!(
                "{:<4} {:<12} {:<22} {:>8} {:>10} {:>8}",
                show(&id),
                show(&role),
                addr,
                show(&term),
                show(&applied),
                show(&leader)
            );
        }
    }
    eprintln!("baton: no member leads: a majority of the members must be up and reach each other");
    Ok(ExitCode::FAILURE)
}

async fn status(servers: &str, args: StatusArgs) -> CliResult {
    let leader = match leader_view(servers).await {
        Ok(leader) => leader,
        Err(e) => {
            let views = every_member(servers).await;
            if views.iter().all(|(_, v)| v.is_none())
                || views
                    .iter()
                    .any(|(_, v)| v.as_ref().is_some_and(|v| v["role"] == "single"))
            {
                return Err(e);
            }
            let why = e.to_string();
            let why = why.strip_prefix("no leader found: ").unwrap_or(&why);
            return print_without_leader(why, &views, args.json);
        }
    };
    let cluster = &leader["cluster"];
    let members = cluster["members"].as_array().cloned().unwrap_or_default();
    // A leader that reaches no majority still calls itself leader (until
    // it hears of a later term) but commits nothing.
    let voters: Vec<&Value> = members
        .iter()
        .filter(|m| m["voter"] != Value::Bool(false))
        .collect();
    let reached = voters.iter().filter(|m| m["role"] != "unreachable").count();
    let without_majority = reached * 2 <= voters.len();
    if args.json {
        let out = serde_json::json!({
            "leader": cluster["leader"],
            "term": cluster["term"],
            "commit_index": cluster["commit_index"],
            "members": members.iter().map(|m| serde_json::json!({
                "id": m["id"],
                "client_addr": m["client_addr"],
                "peer_addr": m["peer_addr"],
                "role": m["role"],
                "voter": m["voter"],
                "applied_index": m["applied_index"],
                "lag": m["lag"],
            })).collect::<Vec<_>>(),
            "majority": !without_majority,
        });
        println!("{out}");
        return Ok(if without_majority {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        });
    }
    let show = |v: &Value| match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    println!(
        "leader {}, term {}, commit index {}",
        show(&cluster["leader"]),
        show(&cluster["term"]),
        show(&cluster["commit_index"])
    );
    println!(
        "{:<4} {:<12} {:<22} {:<22} {:>10} {:>8}",
        "id", "role", "client", "peer", "applied", "lag"
    );
    for m in &members {
        // A learner is an observer, or a voter being added that has not
        // caught up yet.
        let role = if m["voter"] == Value::Bool(false) && m["role"] == "learner" {
            "observer".to_string()
        } else if m["voter"] == Value::Bool(false) {
            format!("{} (observer)", show(&m["role"]))
        } else {
            show(&m["role"])
        };
        println!(
            "{:<4} {:<12} {:<22} {:<22} {:>10} {:>8}",
            show(&m["id"]),
            role,
            show(&m["client_addr"]),
            show(&m["peer_addr"]),
            show(&m["applied_index"]),
            show(&m["lag"])
        );
    }
    if without_majority {
        eprintln!(
            "baton: the leader reaches {reached} of {} voting members, not a majority: it commits nothing until more are back",
            voters.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

async fn change(servers: &str, change: Change) -> CliResult {
    println!("{}", change_membership(servers, change).await?);
    Ok(ExitCode::SUCCESS)
}

/// Asks the leader (found from any of `servers`) to make `change`, and
/// waits until it is made: what the leader says of it.
pub async fn change_membership(servers: &str, change: Change) -> Result<String, CliError> {
    let leader = leader_view(servers).await?;
    let cluster = &leader["cluster"];
    let leader_id = cluster["leader"].as_u64();
    let peer = cluster["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["id"].as_u64() == leader_id))
        .and_then(|m| m["peer_addr"].as_str())
        .ok_or_else(|| {
            CliError::msg(
                "the leader does not list itself among the members yet (it has just started?); try again",
            )
        })?
        .to_owned();
    let peer_tls = crate::peer_tls()?;
    baton_cluster::network::ask_change(&peer, change, Duration::from_secs(120), peer_tls.as_ref())
        .await
        .map_err(|e| CliError::msg(e.to_string()))
}

/// The ids of the members (voters and learners) the leader lists, found
/// from any of `servers`.
pub async fn member_ids(servers: &str) -> Result<Vec<u64>, CliError> {
    let leader = leader_view(servers).await?;
    ids_of(&leader["cluster"]).ok_or_else(|| {
        CliError::msg(
            "the leader does not list itself among the members yet (it has just started?); try again",
        )
    })
}

/// The ids of the members of the leader's latest membership once it is
/// committed (the leader has applied it); `None` while a change is under
/// way (the leader lists the membership it has proposed, committed or
/// not), or while the leader cannot describe the cluster yet.
pub async fn committed_member_ids(servers: &str) -> Result<Option<Vec<u64>>, CliError> {
    let leader = leader_view(servers).await?;
    Ok(committed_ids(&leader["cluster"]))
}

/// The members a leader's description of the cluster lists; `None` if it
/// does not list the leader itself: a leader that has just started has no
/// description yet, and its empty list says nothing of who is a member.
fn ids_of(cluster: &Value) -> Option<Vec<u64>> {
    let ids: Vec<u64> = cluster["members"]
        .as_array()
        .map(|ms| ms.iter().filter_map(|m| m["id"].as_u64()).collect())
        .unwrap_or_default();
    cluster["leader"]
        .as_u64()
        .is_some_and(|l| ids.contains(&l))
        .then_some(ids)
}

/// [`committed_member_ids`] of a leader's description of the cluster.
fn committed_ids(cluster: &Value) -> Option<Vec<u64>> {
    let applied = cluster["applied_index"].as_u64()?;
    let membership = cluster["membership_index"].as_u64().unwrap_or(0);
    if applied < membership {
        return None;
    }
    ids_of(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A membership the leader has proposed but not yet applied is not
    /// taken for the cluster's, nor an empty list from a leader that has
    /// no description of the cluster yet (which once had a member wiped
    /// while it was still a voter).
    #[test]
    fn only_a_membership_the_leader_has_applied_counts_as_committed() {
        let cluster = |applied: u64, membership: Option<u64>| {
            serde_json::json!({
                "leader": 2,
                "applied_index": applied,
                "membership_index": membership,
                "members": [{"id": 2}, {"id": 3}],
            })
        };
        assert_eq!(committed_ids(&cluster(10, Some(10))), Some(vec![2, 3]));
        assert_eq!(committed_ids(&cluster(12, Some(10))), Some(vec![2, 3]));
        assert_eq!(committed_ids(&cluster(9, Some(10))), None);
        assert_eq!(committed_ids(&cluster(0, None)), Some(vec![2, 3]));
        // A leader that has applied nothing yet says nothing committed.
        let nothing = serde_json::json!({"leader": 2, "applied_index": null, "membership_index": 3, "members": []});
        assert_eq!(committed_ids(&nothing), None);
        // Nor does one that has no description of the cluster yet (its
        // list is empty), or does not list itself.
        assert_eq!(committed_ids(&serde_json::Value::Null), None);
        assert_eq!(ids_of(&serde_json::Value::Null), None);
        let without_itself = serde_json::json!({"leader": 1, "applied_index": 9, "membership_index": 3, "members": [{"id": 2}, {"id": 3}]});
        assert_eq!(committed_ids(&without_itself), None);
    }
}
