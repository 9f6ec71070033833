//! Client commands: create, get, set, ls, stat, rm, watch.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;

use baton_client::{Client, CreateMode, EventKind, Stat, Watcher};

use crate::signals::Interrupts;
use crate::{CliError, CliResult};

/// The one argument of get, ls, stat and watch (each describes itself where
/// it is listed).
#[derive(clap::Args)]
pub struct PathArg {
    /// Absolute node path, such as /app/config.
    path: String,
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
}

/// Delete a node (it must have no children).
#[derive(clap::Args)]
pub struct RmArgs {
    /// Absolute node path.
    path: String,
    /// Only if the node's data version is this.
    #[arg(long)]
    version: Option<u32>,
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

pub async fn get(server: &str, args: PathArg) -> CliResult {
    let (data, _) = with_session(server, async |client| {
        Ok(client.get_data(&args.path).await?)
    })
    .await?;
    let mut out = std::io::stdout().lock();
    // On a terminal the prompt should not land after the data; piped, the
    // bytes are exactly as stored.
    let newline = out.is_terminal() && !data.ends_with(b"\n");
    out.write_all(&data)
        .and_then(|()| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| out.flush())
        .map_err(|e| CliError::msg(format!("writing to stdout: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

pub async fn set(server: &str, args: SetArgs) -> CliResult {
    let data = read_data(args.data, args.file).await?;
    with_session(server, async |client| {
        match args.fence {
            Some(token) => client.set_data_fenced(&args.path, data, token).await?,
            None => client.set_data(&args.path, data, args.version).await?,
        };
        Ok(ExitCode::SUCCESS)
    })
    .await
}

pub async fn ls(server: &str, args: PathArg) -> CliResult {
    let (children, _) = with_session(server, async |client| {
        Ok(client.get_children(&args.path).await?)
    })
    .await?;
    for child in children {
        println!("{child}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn stat(server: &str, args: PathArg) -> CliResult {
    let stat = with_session(server, async |client| Ok(client.exists(&args.path).await?))
        .await?
        .ok_or_else(|| CliError::msg(format!("no node: {} does not exist", args.path)))?;
    print_stat(&stat);
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
    with_session(server, async |client| {
        client.delete(&args.path, args.version).await?;
        Ok(ExitCode::SUCCESS)
    })
    .await
}

/// Prints every change at a path (its data, its existence, its children)
/// until SIGINT, SIGTERM or SIGHUP. Each line: event kind, path, revision.
pub async fn watch(server: &str, args: PathArg) -> CliResult {
    let mut interrupts = Interrupts::new()?;
    with_session(server, async |client| {
        watch_until(client, &args.path, &mut interrupts).await
    })
    .await
}

async fn watch_until(client: &Client, path: &str, interrupts: &mut Interrupts) -> CliResult {
    let mut node = Some(arm_node(client, path).await?);
    let mut children = arm_children(client, path).await?;
    eprintln!("watching {path}; Ctrl-C to stop");
    // A deletion fires both watches with the same event: print it once.
    let mut last: Option<(EventKind, u64)> = None;
    loop {
        let event = tokio::select! {
            _ = interrupts.recv() => return Ok(ExitCode::SUCCESS),
            e = async { node.as_mut().expect("armed").await }, if node.is_some() => {
                node = None;
                e?
            }
            e = async { children.as_mut().expect("armed").await }, if children.is_some() => {
                children = None;
                e?
            }
        };
        if last != Some((event.kind, event.revision)) {
            println!(
                "{} {} revision {}",
                kind_name(event.kind),
                event.path,
                event.revision
            );
            let _ = std::io::stdout().flush();
        }
        last = Some((event.kind, event.revision));
        if node.is_none() {
            node = Some(arm_node(client, path).await?);
        }
        if children.is_none() {
            children = arm_children(client, path).await?;
        }
    }
}

async fn arm_node(client: &Client, path: &str) -> Result<Watcher, CliError> {
    Ok(client.exists_watch(path).await?.1)
}

/// A child watch, if the node exists (there is nothing to list otherwise).
async fn arm_children(client: &Client, path: &str) -> Result<Option<Watcher>, CliError> {
    match client.get_children_watch(path).await {
        Ok((_, _, w)) => Ok(Some(w)),
        Err(baton_client::Error::NoNode(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "created",
        EventKind::Deleted => "deleted",
        EventKind::DataChanged => "data-changed",
        EventKind::ChildrenChanged => "children-changed",
        EventKind::Head => "head",
    }
}
