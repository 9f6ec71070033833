//! `baton txn`: a transaction read from stdin, one operation per line.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use baton_client::{Check, CreateMode, Error, TxnOp, TxnResult};
use bytes::Bytes;

use crate::commands::{stat_json, with_session};
use crate::{CliError, CliResult};

/// Apply operations all or none, read one per line from stdin (or --file).
///
/// Each line is one operation; blank lines and lines starting with `#` are
/// skipped. DATA is the rest of the line after the path, as text (empty if
/// there is none):
///
///   create [-e] [-s] [--fence TOKEN] PATH [DATA]
///   set [--version V | --fence TOKEN] PATH [DATA]
///   rm [--version V] [--fence TOKEN] PATH
///   check exists PATH
///   check absent PATH
///   check version PATH V
///   check fence PATH TOKEN     (the node would accept a write fenced by TOKEN)
///   check holder PATH TOKEN    (the holder of TOKEN under the lock PATH holds it)
///
/// Prints one line per operation: what it did, or, when the transaction
/// failed, which operation failed and why (the others were rolled back or
/// never tried; nothing changed). Exit status 0 when it was applied, 1 when
/// it failed, 2 when a line cannot be read.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct TxnArgs {
    /// Read the operations from this file instead of stdin.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Print one JSON object: `committed`, then `results` (one per
    /// operation) or `failed` (`index`, `code`, `message`).
    #[arg(long)]
    json: bool,
}

/// A line that is not an operation: its number (from 1) and what is wrong.
#[derive(Debug, PartialEq, Eq)]
struct BadLine(usize, String);

pub async fn txn(server: &str, args: TxnArgs) -> CliResult {
    // Reading a pipe or a file blocks: not on a runtime thread.
    let file = args.file.clone();
    let text = tokio::task::spawn_blocking(move || read_text(file.as_ref()))
        .await
        .map_err(|e| CliError::msg(format!("reading the operations failed: {e}")))??;
    let ops = match parse(&text) {
        Ok(ops) => ops,
        Err(BadLine(line, why)) => {
            eprintln!("baton: line {line}: {why}");
            return Ok(ExitCode::from(2));
        }
    };
    let names: Vec<String> = ops.iter().map(describe).collect();
    let outcome = with_session(server, async |client| {
        let txn = ops.into_iter().fold(client.txn(), |txn, op| txn.op(op));
        match txn.commit().await {
            Ok(results) => Ok(Ok(results)),
            Err(Error::TxnFailed { index, error }) => Ok(Err((index, *error))),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    match outcome {
        Ok(results) => {
            if args.json {
                let results: Vec<_> = results.iter().map(result_json).collect();
                println!(
                    "{}",
                    serde_json::json!({ "committed": true, "results": results })
                );
            } else {
                for (name, result) in names.iter().zip(&results) {
                    println!("ok    {name}{}", result_text(result));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err((index, error)) => {
            let index = index as usize;
            if args.json {
                let code = error.code().map(|c| c.to_string());
                println!(
                    "{}",
                    serde_json::json!({
                        "committed": false,
                        "failed": { "index": index, "code": code, "message": error.to_string() },
                    })
                );
            } else {
                for (i, name) in names.iter().enumerate() {
                    match i.cmp(&index) {
                        std::cmp::Ordering::Less => println!("undone {name}"),
                        std::cmp::Ordering::Equal => println!("FAILED {name}: {error}"),
                        std::cmp::Ordering::Greater => println!("not tried {name}"),
                    }
                }
                if index >= names.len() {
                    println!("FAILED: {error}");
                }
            }
            eprintln!(
                "baton: the transaction failed at operation {} and changed nothing",
                index + 1
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

fn read_text(file: Option<&PathBuf>) -> Result<String, CliError> {
    match file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| CliError::msg(format!("cannot read {}: {e}", path.display()))),
        None => {
            let mut text = String::new();
            std::io::stdin()
                .lock()
                .read_to_string(&mut text)
                .map_err(|e| {
                    CliError::msg(format!("cannot read the operations from stdin: {e}"))
                })?;
            Ok(text)
        }
    }
}

/// The operations of `text`, one per line.
fn parse(text: &str) -> Result<Vec<TxnOp>, BadLine> {
    let mut ops = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        ops.push(parse_line(line).map_err(|why| BadLine(n + 1, why))?);
    }
    if ops.is_empty() {
        return Err(BadLine(
            0,
            "no operations: give one per line (see baton txn --help)".into(),
        ));
    }
    Ok(ops)
}

/// Splits the next word off `rest`; what follows it starts after one space.
fn word<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start();
    if s.is_empty() {
        return None;
    }
    let (w, after) = s.split_once(' ').unwrap_or((s, ""));
    *rest = after;
    Some(w)
}

fn number<T: std::str::FromStr>(what: &str, w: Option<&str>) -> Result<T, String> {
    let w = w.ok_or_else(|| format!("{what} is missing"))?;
    w.parse()
        .map_err(|_| format!("{what} {w:?} is not a number"))
}

fn parse_line(line: &str) -> Result<TxnOp, String> {
    let mut rest = line;
    let op = word(&mut rest).expect("not empty");
    match op {
        "create" | "set" | "rm" => {
            let (mut ephemeral, mut sequential) = (false, false);
            let (mut version, mut fence) = (None, None);
            let path = loop {
                match word(&mut rest) {
                    Some("-e" | "--ephemeral") if op == "create" => ephemeral = true,
                    Some("-s" | "--sequential") if op == "create" => sequential = true,
                    Some("--version") if op != "create" => {
                        version = Some(number("--version", word(&mut rest))?)
                    }
                    Some("--fence") => fence = Some(number("--fence", word(&mut rest))?),
                    Some(flag) if flag.starts_with('-') => {
                        return Err(format!("{op} takes no option {flag}"))
                    }
                    Some(path) => break path.to_owned(),
                    None => return Err(format!("{op} needs a path")),
                }
            };
            if op == "set" && version.is_some() && fence.is_some() {
                return Err("set takes --version or --fence, not both".into());
            }
            let data = Bytes::from(rest.to_owned());
            Ok(match op {
                "create" => TxnOp::Create {
                    path,
                    data,
                    mode: CreateMode::from_flags(ephemeral, sequential),
                    fence,
                    acl: baton_proto::Acl::OPEN,
                },
                "set" => TxnOp::SetData {
                    path,
                    data,
                    version,
                    fence,
                },
                _ if !rest.trim().is_empty() => {
                    return Err(format!(
                        "rm takes only a path; {:?} follows it",
                        rest.trim()
                    ))
                }
                _ => TxnOp::Delete {
                    path,
                    version,
                    fence,
                },
            })
        }
        "check" => {
            let kind = word(&mut rest)
                .ok_or("check needs a kind: exists, absent, version, fence or holder")?;
            let path = word(&mut rest)
                .ok_or_else(|| format!("check {kind} needs a path"))?
                .to_owned();
            let check = match kind {
                "exists" => Check::Exists,
                "absent" => Check::Absent,
                "version" => Check::Version(number("the version", word(&mut rest))?),
                "fence" => Check::Fence(number("the token", word(&mut rest))?),
                "holder" => Check::Holder(number("the token", word(&mut rest))?),
                other => {
                    return Err(format!(
                        "unknown check {other:?}: expected exists, absent, version, fence or holder"
                    ))
                }
            };
            if let Some(extra) = word(&mut rest) {
                return Err(format!(
                    "check {kind} takes nothing after its arguments; {extra:?} follows"
                ));
            }
            Ok(TxnOp::Check { path, check })
        }
        other => Err(format!(
            "unknown operation {other:?}: expected create, set, rm or check"
        )),
    }
}

/// An operation in a line of output.
fn describe(op: &TxnOp) -> String {
    match op {
        TxnOp::Create { path, .. } => format!("create {path}"),
        TxnOp::SetData { path, .. } => format!("set {path}"),
        TxnOp::Delete { path, .. } => format!("rm {path}"),
        TxnOp::Check { path, check } => match check {
            Check::Exists => format!("check exists {path}"),
            Check::Absent => format!("check absent {path}"),
            Check::Version(v) => format!("check version {path} {v}"),
            Check::Fence(t) => format!("check fence {path} {t}"),
            Check::Holder(t) => format!("check holder {path} {t}"),
        },
    }
}

fn result_text(result: &TxnResult) -> String {
    match result {
        TxnResult::Created { path, .. } => format!(" -> {path}"),
        TxnResult::DataSet(stat) => format!(" (version {})", stat.version),
        TxnResult::Deleted | TxnResult::Checked => String::new(),
    }
}

fn result_json(result: &TxnResult) -> serde_json::Value {
    match result {
        TxnResult::Created {
            path,
            sequence,
            stat,
        } => {
            serde_json::json!({ "op": "create", "path": path, "sequence": sequence, "stat": stat_json(stat) })
        }
        TxnResult::DataSet(stat) => serde_json::json!({ "op": "set", "stat": stat_json(stat) }),
        TxnResult::Deleted => serde_json::json!({ "op": "rm" }),
        TxnResult::Checked => serde_json::json!({ "op": "check" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_reads_from_its_line() {
        let ops = parse(
            "# move job 42\n\
             check holder /locks/jobs 17\n\
             check version /jobs/42 3\n\
             rm --version 3 /jobs/42\n\
             create -s --fence 17 /done/job- result: two words\n\
             set --fence 17 /state\n\
             \n\
             check absent /jobs/43\n",
        )
        .unwrap();
        assert_eq!(
            ops,
            [
                TxnOp::Check {
                    path: "/locks/jobs".into(),
                    check: Check::Holder(17)
                },
                TxnOp::Check {
                    path: "/jobs/42".into(),
                    check: Check::Version(3)
                },
                TxnOp::Delete {
                    path: "/jobs/42".into(),
                    version: Some(3),
                    fence: None
                },
                TxnOp::Create {
                    path: "/done/job-".into(),
                    data: Bytes::from_static(b"result: two words"),
                    mode: CreateMode::PersistentSequential,
                    fence: Some(17),
                    acl: baton_proto::Acl::OPEN,
                },
                TxnOp::SetData {
                    path: "/state".into(),
                    data: Bytes::new(),
                    version: None,
                    fence: Some(17)
                },
                TxnOp::Check {
                    path: "/jobs/43".into(),
                    check: Check::Absent
                },
            ]
        );
    }

    #[test]
    fn a_bad_line_is_named_with_what_is_wrong() {
        for (text, line, says) in [
            ("create /a\nmove /a /b\n", 2, "unknown operation \"move\""),
            ("check version /a x\n", 1, "\"x\" is not a number"),
            ("check size /a\n", 1, "unknown check \"size\""),
            ("set --version 1 --fence 2 /a\n", 1, "not both"),
            ("rm /a extra\n", 1, "rm takes only a path"),
            ("create -x /a\n", 1, "no option -x"),
            ("create\n", 1, "needs a path"),
            ("# nothing\n\n", 0, "no operations"),
        ] {
            let BadLine(n, why) = parse(text).unwrap_err();
            assert_eq!(n, line, "{text:?}: {why}");
            assert!(why.contains(says), "{text:?}: {why}");
        }
    }
}
