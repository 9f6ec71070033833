//! `baton status`: one server at a glance, from its status probe.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use crate::{CliError, CliResult};

/// Show a server at a glance: version, uptime, role, sessions, nodes,
/// watches, log and snapshot sizes, fsync policy and recent fsync latency.
///
/// Asks the first address given with --server that answers, without
/// opening a session (any cluster member answers, not only the leader).
/// Exits 0 once a server has answered and 1 if none did, so it serves as a
/// health check.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print the server's answer as one JSON object (with at least
    /// `version`, `role`, `uptime_ms`, `sessions`, `nodes`, `watches`,
    /// `connections`, `fsync`, `recent_syncs` and `storage`; see
    /// docs/protocol.md, "Status probe") instead of a table.
    #[arg(long)]
    json: bool,

    /// How long to wait for an answer (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = crate::duration::millis)]
    timeout: u64,
}

pub async fn status(servers: &str, args: StatusArgs) -> CliResult {
    let limit = Duration::from_millis(args.timeout);
    let (addr, status) = probe_first(servers, limit).await?;
    if args.json {
        println!("{status}");
    } else {
        print!("{}", render(&addr, &status));
    }
    Ok(ExitCode::SUCCESS)
}

/// The status of the first of `servers` (comma-separated) that answers.
pub async fn probe_any(servers: &str, limit: Duration) -> Result<Value, CliError> {
    probe_first(servers, limit).await.map(|(_, status)| status)
}

async fn probe_first(servers: &str, limit: Duration) -> Result<(String, Value), CliError> {
    let mut last = String::from("no server address given");
    for addr in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let answer = match baton_client::probe_as(addr, limit, crate::tls(), crate::token()).await {
            Ok(answer) => answer,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        let status: Value = serde_json::from_str(&answer).map_err(|e| {
            CliError::msg(format!("{addr} answered something that is not JSON: {e}"))
        })?;
        return Ok((addr.to_owned(), status));
    }
    if last.contains("TLS") {
        return Err(CliError::msg(format!("no server answered: {last}")));
    }
    Err(CliError::msg(format!(
        "no server answered: {last} (is `baton serve` running there? give the address with --server or BATON_SERVER)"
    )))
}

/// A time in seconds, in the unit that reads best.
pub fn seconds(s: f64) -> String {
    micros((s * 1e6).round() as u64)
}

/// The table `baton status` prints.
fn render(addr: &str, s: &Value) -> String {
    let n = |key: &str| s[key].as_u64().unwrap_or(0);
    let mut out = String::new();
    let role = match s["role"].as_str().unwrap_or("?") {
        "single" => "a single server".to_string(),
        "leader" => "cluster leader".to_string(),
        "follower" => match s["leader"].as_str() {
            Some(leader) => format!("cluster follower (leader at {leader})"),
            None => "cluster follower (no leader known)".to_string(),
        },
        other => other.to_string(),
    };
    out += &format!(
        "baton {} at {addr}: {role}, up {}\n",
        s["version"].as_str().unwrap_or("?"),
        duration(n("uptime_ms"))
    );
    out += &format!(
        "sessions     {:<12} ({} expired since start)\n",
        n("sessions"),
        n("sessions_expired")
    );
    out += &format!("connections  {} (this one included)\n", n("connections"));
    out += &format!("nodes        {}\n", n("nodes"));
    out += &format!("watches      {}\n", n("watches"));
    out += &format!("revision     {}\n", n("revision"));
    let syncs = &s["recent_syncs"];
    let latency = if syncs.is_null() {
        "no sync yet".to_string()
    } else {
        let us = |k: &str| micros(syncs[k].as_u64().unwrap_or(0));
        format!(
            "latest {} syncs: p50 {}, p99 {}, max {}",
            syncs["syncs"].as_u64().unwrap_or(0),
            us("p50_us"),
            us("p99_us"),
            us("max_us")
        )
    };
    out += &format!(
        "fsync        {}; {latency}\n",
        s["fsync"].as_str().unwrap_or("?")
    );
    let storage = &s["storage"];
    if !storage.is_null() {
        let files = storage["log_files"].as_u64().unwrap_or(0);
        out += &format!(
            "storage      {}: log {} in {files} file{}, snapshots {}\n",
            storage["data_dir"].as_str().unwrap_or("?"),
            bytes(storage["log_bytes"].as_u64().unwrap_or(0)),
            if files == 1 { "" } else { "s" },
            bytes(storage["snapshot_bytes"].as_u64().unwrap_or(0)),
        );
    }
    let locks = s["locks"].as_array().map(Vec::as_slice).unwrap_or_default();
    for (i, l) in locks.iter().take(5).enumerate() {
        out += &format!(
            "{:<12} {} (queue {}, {} grant{})\n",
            if i == 0 { "busiest" } else { "" },
            l["lock"].as_str().unwrap_or("?"),
            l["queue"].as_u64().unwrap_or(0),
            l["grants"].as_u64().unwrap_or(0),
            if l["grants"].as_u64() == Some(1) {
                ""
            } else {
                "s"
            },
        );
    }
    let cluster = &s["cluster"];
    if !cluster.is_null() {
        let show = |v: &Value| match v {
            Value::Null => "-".to_string(),
            other => other.to_string(),
        };
        out += &format!(
            "cluster      member {}, leader {}, term {}, commit index {}, applied index {}\n",
            show(&cluster["id"]),
            show(&cluster["leader"]),
            show(&cluster["term"]),
            show(&cluster["commit_index"]),
            show(&cluster["applied_index"]),
        );
    }
    out
}

fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86400, s % 86400 / 3600),
    }
}

fn micros(us: u64) -> String {
    if us < 10_000 {
        format!("{us} µs")
    } else if us < 10_000_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{:.1} s", us as f64 / 1e6)
    }
}

fn bytes(b: u64) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", b as f64 / 1_048_576.0),
        _ => format!("{:.2} GiB", b as f64 / 1_073_741_824.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_naturally() {
        assert_eq!(duration(59_999), "59s");
        assert_eq!(duration(61_000), "1m 01s");
        assert_eq!(duration(7_380_000), "2h 03m");
        assert_eq!(duration(90_000_000), "1d 01h");
        assert_eq!(micros(180), "180 µs");
        assert_eq!(micros(12_345), "12.3 ms");
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }
}
