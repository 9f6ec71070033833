//! `baton watch`: print every change to a node, or to a subtree, as it
//! happens.

use std::io::Write;
use std::process::ExitCode;

use baton_client::{Client, Error, EventKind, WatchEvent};

use crate::commands::with_session;
use crate::signals::Interrupts;
use crate::CliResult;

/// Print every change to a node (or, with --recursive, to a subtree).
///
/// Each line: the kind of change, the path and the revision, then what
/// changed: the node's data as it is now (as text, at most 200
/// characters) or, for a watched node's children, the children added
/// (+name) and removed (-name). Changes are printed in revision order,
/// each once, none missed, also across a reconnect; after a long
/// disconnection, more changes than the server keeps, a `compacted` line
/// says some were missed. Runs until SIGINT (Ctrl-C), SIGTERM or SIGHUP,
/// then closes its session.
#[derive(clap::Args)]
pub struct WatchArgs {
    /// Absolute node path, such as /app/config. It need not exist yet.
    path: String,

    /// Every creation, deletion and data change of the node and of every
    /// node below it (changes to children lists are not printed: they are
    /// those creations and deletions).
    #[arg(long, short = 'r')]
    recursive: bool,

    /// Print one JSON object per change: kind, path, revision, and data
    /// (as text) where there is some.
    #[arg(long)]
    json: bool,
}

pub async fn watch(server: &str, args: WatchArgs) -> CliResult {
    let mut interrupts = Interrupts::new()?;
    with_session(server, async |client| {
        watch_until(client, &args, &mut interrupts).await
    })
    .await
}

async fn watch_until(client: &Client, args: &WatchArgs, interrupts: &mut Interrupts) -> CliResult {
    let mut changes = client.watch(&args.path, args.recursive).await?;
    // The children as last listed, to say which came and went.
    let mut children = if args.recursive {
        Vec::new()
    } else {
        list(client, &args.path).await?
    };
    eprintln!(
        "watching {}{}; Ctrl-C to stop",
        args.path,
        if args.recursive { " and below" } else { "" }
    );
    loop {
        let event = tokio::select! {
            _ = interrupts.recv() => return Ok(ExitCode::SUCCESS),
            e = changes.next() => e?,
        };
        let what = match event.kind {
            EventKind::Created | EventKind::DataChanged => match client.get_data(&event.path).await
            {
                Ok((data, _)) => Some(shown(&data)),
                Err(Error::NoNode(_)) => None,
                Err(e) => return Err(e.into()),
            },
            EventKind::ChildrenChanged => {
                let now = list(client, &event.path).await?;
                let diff = child_changes(&children, &now);
                children = now;
                Some(diff)
            }
            EventKind::Deleted if event.path == args.path => {
                children.clear();
                None
            }
            _ => None,
        };
        print_event(&event, what, args.json);
    }
}

fn print_event(event: &WatchEvent, what: Option<String>, json: bool) {
    let kind = kind_name(event.kind);
    if json {
        let mut line = serde_json::json!({
            "kind": kind,
            "path": event.path,
            "revision": event.revision,
        });
        if let Some(what) = what {
            let key = if event.kind == EventKind::ChildrenChanged {
                "children"
            } else {
                "data"
            };
            line[key] = what.into();
        }
        println!("{line}");
    } else {
        let what = what
            .filter(|w| !w.is_empty())
            .map(|w| format!(": {w}"))
            .unwrap_or_default();
        println!("{kind} {} revision {}{what}", event.path, event.revision);
    }
    let _ = std::io::stdout().flush();
}

/// The node's children, none if it does not exist.
async fn list(client: &Client, path: &str) -> Result<Vec<String>, crate::CliError> {
    match client.get_children(path).await {
        Ok((children, _)) => Ok(children),
        Err(Error::NoNode(_)) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Data as a line shows it: text (lossy), at most 200 characters.
fn shown(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    let mut out: String = text.chars().take(200).collect();
    if text.chars().count() > 200 {
        out.push('…');
    }
    out.replace('\n', "\\n")
}

/// `+added -removed` between two lists of children.
fn child_changes(before: &[String], after: &[String]) -> String {
    let added = after
        .iter()
        .filter(|c| !before.contains(c))
        .map(|c| format!("+{c}"));
    let removed = before
        .iter()
        .filter(|c| !after.contains(c))
        .map(|c| format!("-{c}"));
    added.chain(removed).collect::<Vec<_>>().join(" ")
}

fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "created",
        EventKind::Deleted => "deleted",
        EventKind::DataChanged => "data-changed",
        EventKind::ChildrenChanged => "children-changed",
        EventKind::Head => "head",
        EventKind::Compacted => "compacted",
    }
}
