//! Client commands: create, get, set, ls, stat, rm (delete), watch.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;

use baton_client::{Client, CreateMode, Stat};

use crate::signals::Interrupts;
use crate::{CliError, CliResult};

/// The one argument of watch (it describes itself where it is listed).
#[derive(clap::Args)]
pub struct PathArg {
    /// Absolute node path, such as /app/config.
    path: String,
}

/// Print a node's data.
///
/// Writes the data byte for byte. On a terminal, a newline follows if the
/// data does not end with one, so that the prompt starts on a line of its
/// own; piped or redirected, the bytes are exactly as stored. With --watch,
/// prints the data again at every change (each value then ends with a
/// newline), until SIGINT (Ctrl-C), SIGTERM or SIGHUP.
#[derive(clap::Args)]
pub struct GetArgs {
    /// Absolute node path, such as /app/config.
    path: String,
    /// Keep printing the data at every change (and say when the node is
    /// deleted or created again).
    #[arg(long)]
    watch: bool,
    /// Print one JSON object per value: `path`, `data` (as text) or
    /// `data_base64` (if it is not UTF-8), `stat`; `deleted: true` when it
    /// is gone (with --watch).
    #[arg(long)]
    json: bool,
}

/// List a node's children, one name per line.
///
/// With -R, every node below it instead, one full path per line, each
/// after its parent.
#[derive(clap::Args)]
pub struct LsArgs {
    /// Absolute node path, such as /app.
    path: String,
    /// Every node below the path, by full path.
    #[arg(long, short = 'R')]
    recursive: bool,
    /// Print one JSON array: the names (with -R: the full paths).
    #[arg(long)]
    json: bool,
}

/// Print a node's metadata: revisions, versions, owner, sizes.
#[derive(clap::Args)]
pub struct StatArgs {
    /// Absolute node path.
    path: String,
    /// Print one JSON object with the same fields.
    #[arg(long)]
    json: bool,
}

/// Create a node and print its path.
///
/// With --sequential the server appends a sequence number to the name (the
/// printed path shows it). With --ephemeral the node lives only as long as
/// this command's session: the command prints the path and keeps the session
/// open until SIGINT (Ctrl-C), SIGTERM or SIGHUP, then closes it, and the node
/// disappears at once.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// Delete the node when this command's session ends.
    #[arg(long, short)]
    ephemeral: bool,
    /// Append a sequence number, strictly increasing under the parent.
    #[arg(long, short)]
    sequential: bool,
    /// Absolute path of the node (for --sequential, the prefix of its name).
    path: String,
    /// Data to store in the node (default: empty); `-` reads it from stdin,
    /// as any bytes and past the length the system allows an argument.
    #[arg(conflicts_with = "file")]
    data: Option<String>,
    /// Read the data from this file.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
}

/// Replace a node's data.
///
/// With --fence the write is fenced: the node accepts it only if TOKEN is at
/// least the highest fencing token it has accepted, which TOKEN then becomes.
/// A holder whose lock has since passed to a higher token is refused (exit
/// status 1, the data unchanged). Pass the token `baton lock` gave you in
/// BATON_FENCING_TOKEN.
#[derive(clap::Args)]
pub struct SetArgs {
    /// Absolute node path.
    path: String,
    /// The new data; `-` reads it from stdin, as any bytes and past the
    /// length the system allows an argument.
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    data: Option<String>,
    /// Read the new data from this file.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Only if the node's data version is this (optimistic concurrency).
    #[arg(long, conflicts_with = "fence")]
    version: Option<u32>,
    /// Fencing token to write with; a stale one is refused.
    #[arg(long, value_name = "TOKEN")]
    fence: Option<u64>,
    /// Print the node's metadata after the write as one JSON object
    /// (`path`, `stat`), for a script that needs the new version.
    #[arg(long)]
    json: bool,
}

/// Delete a node (it must have no children, unless -r).
#[derive(clap::Args)]
pub struct RmArgs {
    /// Absolute node path.
    path: String,
    /// Only if the node's data version is this.
    #[arg(long, conflicts_with = "recursive")]
    version: Option<u32>,
    /// Delete the node and every node below it (deepest first; nodes
    /// created below it meanwhile go too). Not for `/`.
    #[arg(long, short)]
    recursive: bool,
}

/// The data a command stores: the argument as given, all of stdin for `-`,
/// or a file's contents (`file`).
///
/// # Errors
/// If stdin or the file cannot be read; the message names which.
async fn read_data(arg: Option<String>, file: Option<PathBuf>) -> Result<Bytes, CliError> {
    let read = move || match (file, arg.as_deref()) {
        (Some(path), _) => std::fs::read(&path)
            .map_err(|e| CliError::msg(format!("cannot read {}: {e}", path.display()))),
        (None, Some("-")) => {
            let mut data = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut data)
                .map_err(|e| CliError::msg(format!("cannot read the data from stdin: {e}")))?;
            Ok(data)
        }
        (None, _) => Ok(arg.unwrap_or_default().into_bytes()),
    };
    // Reading may block for as long as the writer takes.
    tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| CliError::msg(format!("reading the data: {e}")))?
        .map(Bytes::from)
}

/// Opens a session, explaining the likely cause when no server answers.
pub async fn connect(server: &str) -> Result<Client, CliError> {
    crate::client_builder(server)
        .connect()
        .await
        .map_err(connect_hint)
}

/// Opens a session, runs `body` with it, and closes the session whatever
/// the outcome, so that a failed command leaves nothing open behind it.
///
/// # Errors
/// Those of connecting, and of `body`.
pub async fn with_session<T>(
    server: &str,
    body: impl AsyncFnOnce(&Client) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let client = connect(server).await?;
    let result = body(&client).await;
    client.close().await;
    result
}

/// A connection failure, with the likely cause.
pub fn connect_hint(e: baton_client::Error) -> CliError {
    match e {
        // The server answered: the message says what to do.
        baton_client::Error::Connect { ref reason, .. } if reason.contains("TLS") => e.into(),
        baton_client::Error::Connect { .. } => CliError::msg(format!(
            "{e}; is `baton serve` running there? (choose the server with --server or BATON_SERVER)"
        )),
        other => other.into(),
    }
}

pub async fn create(server: &str, args: CreateArgs) -> CliResult {
    // Listening before the node exists: a signal from then on ends the
    // session rather than the process.
    let mut interrupts = if args.ephemeral {
        Some(Interrupts::new()?)
    } else {
        None
    };
    let data = read_data(args.data, args.file).await?;
    with_session(server, async |client| {
        let mode = CreateMode::from_flags(args.ephemeral, args.sequential);
        let created = client.create(&args.path, data, mode).await?;
        println!("{}", created.path);
        let Some(interrupts) = interrupts.as_mut() else {
            return Ok(ExitCode::SUCCESS);
        };
        let _ = std::io::stdout().flush();
        eprintln!("holding the session (the ephemeral node lives until Ctrl-C)");
        tokio::select! {
            _ = interrupts.recv() => Ok(ExitCode::SUCCESS),
            state = client.ended() => {
                Err(CliError::msg(format!("session {state}; {} is gone", created.path)))
            }
        }
    })
    .await
}

pub async fn get(server: &str, args: GetArgs) -> CliResult {
    if args.watch {
        let mut interrupts = Interrupts::new()?;
        return with_session(server, async |client| {
            get_watching(client, &args, &mut interrupts).await
        })
        .await;
    }
    let (data, stat) = with_session(server, async |client| {
        Ok(client.get_data(&args.path).await?)
    })
    .await?;
    if args.json {
        println!("{}", value_json(&args.path, &data, &stat));
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    // On a terminal the prompt should not land after the data; piped, the
    // bytes are exactly as stored.
    let newline = out.is_terminal() && !data.ends_with(b"\n");
    write_out(&mut out, &data, newline)?;
    Ok(ExitCode::SUCCESS)
}

fn write_out(out: &mut impl Write, data: &[u8], newline: bool) -> Result<(), CliError> {
    out.write_all(data)
        .and_then(|()| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| out.flush())
        .map_err(|e| CliError::msg(format!("writing to stdout: {e}")))
}

/// `get --watch`: the data now and at every change, until a signal.
async fn get_watching(client: &Client, args: &GetArgs, interrupts: &mut Interrupts) -> CliResult {
    let path = &args.path;
    loop {
        let watcher = match client.get_data_watch(path).await {
            Ok((data, stat, watcher)) => {
                if args.json {
                    println!("{}", value_json(path, &data, &stat));
                } else {
                    let newline = !data.ends_with(b"\n");
                    write_out(&mut std::io::stdout().lock(), &data, newline)?;
                }
                watcher
            }
            Err(baton_client::Error::NoNode(_)) => {
                let (stat, watcher) = client.exists_watch(path).await?;
                if stat.is_some() {
                    continue; // created meanwhile
                }
                if args.json {
                    println!("{}", serde_json::json!({ "path": path, "deleted": true }));
                } else {
                    eprintln!("{path} does not exist; waiting for it");
                }
                watcher
            }
            Err(e) => return Err(e.into()),
        };
        let _ = std::io::stdout().flush();
        tokio::select! {
            _ = interrupts.recv() => return Ok(ExitCode::SUCCESS),
            event = watcher => { event?; }
        }
    }
}

/// A node's data as JSON: text if it is UTF-8, else base64.
fn data_json(data: &[u8]) -> (&'static str, serde_json::Value) {
    use base64::Engine;
    match std::str::from_utf8(data) {
        Ok(text) => ("data", text.into()),
        Err(_) => (
            "data_base64",
            base64::engine::general_purpose::STANDARD
                .encode(data)
                .into(),
        ),
    }
}

fn value_json(path: &str, data: &[u8], stat: &Stat) -> serde_json::Value {
    let (key, value) = data_json(data);
    let mut object = serde_json::json!({ "path": path, "stat": stat_json(stat) });
    object[key] = value;
    object
}

pub(crate) fn stat_json(s: &Stat) -> serde_json::Value {
    serde_json::json!({
        "czxid": s.czxid,
        "mzxid": s.mzxid,
        "pzxid": s.pzxid,
        "ctime": s.ctime,
        "mtime": s.mtime,
        "version": s.version,
        "cversion": s.cversion,
        "ephemeralOwner": s.ephemeral_owner,
        "dataLength": s.data_length,
        "numChildren": s.num_children,
    })
}

pub async fn set(server: &str, args: SetArgs) -> CliResult {
    let data = read_data(args.data, args.file).await?;
    with_session(server, async |client| {
        let stat = match args.fence {
            Some(token) => client.set_data_fenced(&args.path, data, token).await?,
            None => client.set_data(&args.path, data, args.version).await?,
        };
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "path": args.path, "stat": stat_json(&stat) })
            );
        }
        Ok(ExitCode::SUCCESS)
    })
    .await
}

pub async fn ls(server: &str, args: LsArgs) -> CliResult {
    let json = args.json;
    let listed = with_session(server, async |client| {
        if !args.recursive {
            return Ok(client.get_children(&args.path).await?.0);
        }
        // Each node after its parent; printed as found unless it is JSON.
        let mut found = Vec::new();
        let mut queue = std::collections::VecDeque::from([args.path.clone()]);
        while let Some(parent) = queue.pop_front() {
            let children = match client.get_children(&parent).await {
                Ok((children, _)) => children,
                // Deleted since its parent was listed.
                Err(baton_client::Error::NoNode(_)) if parent != args.path => continue,
                Err(e) => return Err(e.into()),
            };
            for name in children {
                let full = child_path(&parent, &name);
                if json {
                    found.push(full.clone());
                } else {
                    println!("{full}");
                }
                queue.push_back(full);
            }
        }
        Ok(found)
    })
    .await?;
    if json {
        println!("{}", serde_json::Value::from(listed));
    } else {
        for name in listed {
            println!("{name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The full path of `name` under `parent`.
fn child_path(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

pub async fn stat(server: &str, args: StatArgs) -> CliResult {
    let stat = with_session(server, async |client| Ok(client.exists(&args.path).await?))
        .await?
        .ok_or_else(|| CliError::msg(format!("no node: {} does not exist", args.path)))?;
    if args.json {
        println!("{}", stat_json(&stat));
    } else {
        print_stat(&stat);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_stat(s: &Stat) {
    println!("czxid           {}", s.czxid);
    println!("mzxid           {}", s.mzxid);
    println!("pzxid           {}", s.pzxid);
    println!("ctime           {}", s.ctime);
    println!("mtime           {}", s.mtime);
    println!("version         {}", s.version);
    println!("cversion        {}", s.cversion);
    match s.owner() {
        Some(owner) => println!("ephemeralOwner  {owner}"),
        None => println!("ephemeralOwner  0 (persistent)"),
    }
    println!("dataLength      {}", s.data_length);
    println!("numChildren     {}", s.num_children);
}

pub async fn rm(server: &str, args: RmArgs) -> CliResult {
    if args.recursive && args.path == "/" {
        return Err(CliError::msg(
            "refusing to delete every node: name a node below / (its children go with it)",
        ));
    }
    with_session(server, async |client| {
        if args.recursive {
            delete_tree(client, &args.path).await?;
        } else {
            client.delete(&args.path, args.version).await?;
        }
        Ok(ExitCode::SUCCESS)
    })
    .await
}

/// Deletes `path` and every node below it, deepest first. A node that gains
/// a child meanwhile is listed again (a bounded number of times: a tree
/// someone keeps growing is reported, not chased forever).
async fn delete_tree(client: &Client, path: &str) -> Result<(), CliError> {
    const ATTEMPTS: usize = 10;
    // Paths to delete, each after all of its descendants: a stack of
    // (path, children listed?).
    let mut stack = vec![(path.to_owned(), false, 0usize)];
    while let Some((node, listed, attempts)) = stack.pop() {
        if !listed {
            stack.push((node.clone(), true, attempts));
            match client.get_children(&node).await {
                Ok((children, _)) => {
                    for name in children {
                        stack.push((child_path(&node, &name), false, 0));
                    }
                }
                Err(baton_client::Error::NoNode(_)) => {
                    stack.pop();
                }
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        match client.delete(&node, None).await {
            Ok(()) | Err(baton_client::Error::NoNode(_)) => {}
            Err(baton_client::Error::NotEmpty(_)) if attempts < ATTEMPTS => {
                stack.push((node, false, attempts + 1));
            }
            Err(baton_client::Error::NotEmpty(_)) => {
                return Err(CliError::msg(format!(
                    "{node} keeps gaining children while it is deleted ({ATTEMPTS} attempts); stop what creates them and try again"
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
