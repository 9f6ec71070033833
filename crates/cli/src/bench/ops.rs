//! `baton bench ops`: the cost of Baton's basic operations, next to the floor
//! the machine sets (a raw TCP round trip on loopback).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{Client, CreateMode};
use baton_proto::{
    ConnectRequest, ConnectResponse, Reply, ReplyFrame, Request, RequestFrame, ServerMessage,
};
use bytes::BytesMut;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::server::ChildServer;
use super::{progress, Summary};
use crate::sys::{cpu_time, rss_bytes};
use crate::CliError;

/// Measure ping round trips against the raw TCP floor, create+delete
/// throughput, and server memory per idle session.
///
/// Starts its own server (a `baton serve` child process on a free loopback
/// port) unless --server or BATON_SERVER names one; memory and server CPU are
/// measured only on its own server.
#[derive(clap::Args)]
pub struct OpsArgs {
    /// Round trips to time for each ping measurement.
    #[arg(long, default_value_t = 20_000)]
    pings: usize,
    /// Concurrent clients for create+delete, as a comma-separated list.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// How long each create+delete run lasts (a duration; a bare number is
    /// milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::duration::millis)]
    duration_ms: u64,
    /// Idle sessions to open for the memory measurement (0 skips it).
    /// Past the open-file limit, the others create their node and leave
    /// their connection.
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// Session timeout the memory measurement's sessions ask for (its own
    /// server allows it). Every session must outlive the whole run; by
    /// default 120 s plus 2 ms per session past the first 100,000. A
    /// duration; a bare number is milliseconds.
    #[arg(long, value_name = "DURATION", value_parser = millis_u32)]
    session_timeout_ms: Option<u32>,
    /// Print one JSON object instead of a table.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print the results as Markdown tables (as in docs/benchmarks.md).
    #[arg(long)]
    markdown: bool,
}

#[derive(Serialize)]
struct Report {
    tcp_floor_rtt: Summary,
    ping_rtt_client: Summary,
    ping_rtt_raw: Summary,
    ping_over_floor_p50: f64,
    create_delete: Vec<Throughput>,
    memory: Option<Memory>,
}

#[derive(Serialize)]
struct Throughput {
    clients: usize,
    pairs: u64,
    seconds: f64,
    pairs_per_s: f64,
    pair_latency: Summary,
    /// Server CPU time (user + system) per create+delete pair, when the
    /// benchmark runs its own server.
    server_cpu_us_per_pair: Option<f64>,
}

#[derive(Serialize)]
struct Memory {
    /// Sessions held by the server at the end.
    sessions: usize,
    /// Of those, sessions that kept their own connection.
    connected_sessions: usize,
    rss_base_bytes: u64,
    rss_sessions_bytes: u64,
    rss_sessions_nodes_bytes: u64,
    rss_all_sessions_bytes: u64,
    /// Per connected idle session, without a node.
    bytes_per_idle_session: f64,
    bytes_per_ephemeral_node: f64,
    /// Per connected idle session holding one ephemeral node.
    bytes_per_session_with_node: f64,
    /// Per session (with its node) whose connection has gone.
    bytes_per_disconnected_session_with_node: Option<f64>,
    /// Per session with its node, over all sessions held: (total - base) /
    /// sessions.
    bytes_per_session_held: f64,
    /// The session timeout the sessions were granted, in milliseconds.
    session_timeout_ms: u32,
    /// Seconds taken to open every session and create its node.
    open_seconds: f64,
    /// What the server's own counters said once every session was held:
    /// sessions, nodes and open connections (the counting client's included),
    /// and sessions expired during the measurement (none, or the count is
    /// not of live sessions).
    server_sessions: u64,
    server_nodes: u64,
    server_connections_open: u64,
    server_sessions_expired: u64,
}

/// The session timeout the memory measurement asks for by default: long
/// enough for the first session to outlive the opening of the last.
/// A duration flag in milliseconds that must fit a session timeout.
fn millis_u32(text: &str) -> Result<u32, String> {
    let ms = crate::duration::millis(text)?;
    u32::try_from(ms).map_err(|_| format!("{text:?} is longer than a session timeout can be"))
}

fn default_session_timeout_ms(sessions: usize) -> u32 {
    let extra = sessions.saturating_sub(100_000).saturating_mul(2);
    120_000u32.saturating_add(u32::try_from(extra).unwrap_or(u32::MAX))
}

pub async fn run(target: Option<String>, args: OpsArgs) -> Result<(), CliError> {
    let session_timeout_ms = args
        .session_timeout_ms
        .unwrap_or_else(|| default_session_timeout_ms(args.sessions));
    let child = match &target {
        Some(_) => None,
        None => {
            progress("starting a server (baton serve) on a free loopback port");
            let max = session_timeout_ms.max(120_000).to_string();
            Some(ChildServer::start(&["--max-session-timeout", &max]).await?)
        }
    };
    let addr = match (&target, &child) {
        (Some(a), _) => a.clone(),
        (None, Some(c)) => c.addr.clone(),
        (None, None) => unreachable!(),
    };

    progress(format!(
        "raw TCP ping-pong floor, {} round trips",
        args.pings
    ));
    let pings = args.pings;
    let tcp_floor_rtt = tokio::task::spawn_blocking(move || tcp_floor(pings))
        .await
        .map_err(|e| CliError::msg(e.to_string()))??;

    progress(format!(
        "baton ping through the client library, {} round trips",
        args.pings
    ));
    let ping_rtt_client = client_pings(&addr, args.pings).await?;

    progress(format!(
        "baton ping over a raw blocking socket, {} round trips",
        args.pings
    ));
    let raw_addr = addr.clone();
    let ping_rtt_raw = tokio::task::spawn_blocking(move || raw_pings(&raw_addr, pings))
        .await
        .map_err(|e| CliError::msg(e.to_string()))??;

    let mut create_delete = Vec::new();
    for &clients in &args.clients {
        progress(format!(
            "create+delete of ephemeral nodes, {clients} clients, {} ms",
            args.duration_ms
        ));
        let pid = child.as_ref().and_then(ChildServer::pid);
        let cpu_before = pid.and_then(cpu_time);
        let mut run =
            create_delete_run(&addr, clients, Duration::from_millis(args.duration_ms)).await?;
        if let (Some(before), Some(after)) = (cpu_before, pid.and_then(cpu_time)) {
            run.server_cpu_us_per_pair =
                Some((after - before).as_nanos() as f64 / 1000.0 / run.pairs.max(1) as f64);
        }
        create_delete.push(run);
    }

    let memory = match (&child, args.sessions) {
        (Some(c), n) if n > 0 => Some(memory_run(&c.addr, c.pid(), n, session_timeout_ms).await?),
        _ => None,
    };

    let report = Report {
        ping_over_floor_p50: ping_rtt_raw.p50_us / tcp_floor_rtt.p50_us,
        tcp_floor_rtt,
        ping_rtt_client,
        ping_rtt_raw,
        create_delete,
        memory,
    };
    super::emit(
        &report,
        args.json,
        args.markdown,
        print_markdown,
        print_table,
    );
    Ok(())
}

fn print_table(r: &Report) {
    println!("round trips (microseconds)         p50       p99       max");
    for (name, s) in [
        ("raw TCP ping-pong (floor)", &r.tcp_floor_rtt),
        ("baton ping, raw socket", &r.ping_rtt_raw),
        ("baton ping, client library", &r.ping_rtt_client),
    ] {
        println!(
            "  {name:<30} {:>8.1}  {:>8.1}  {:>8.1}",
            s.p50_us, s.p99_us, s.max_us
        );
    }
    println!("  baton ping / floor (p50): {:.2}x", r.ping_over_floor_p50);
    println!();
    println!("create+delete of an ephemeral node");
    println!("  clients     pairs/s   pair p50 us   pair p99 us   server CPU us/pair");
    for t in &r.create_delete {
        let cpu = t
            .server_cpu_us_per_pair
            .map_or_else(|| "-".to_string(), |c| format!("{c:.1}"));
        println!(
            "  {:>7}  {:>10.0}  {:>12.1}  {:>12.1}   {:>18}",
            t.clients, t.pairs_per_s, t.pair_latency.p50_us, t.pair_latency.p99_us, cpu
        );
    }
    if let Some(m) = &r.memory {
        let mib = |b: u64| b as f64 / 1048576.0;
        println!();
        println!(
            "server memory (RSS), {} connected idle sessions",
            m.connected_sessions
        );
        println!(
            "  base                          {:>8.1} MiB",
            mib(m.rss_base_bytes)
        );
        println!(
            "  with the sessions             {:>8.1} MiB",
            mib(m.rss_sessions_bytes)
        );
        println!(
            "  each with an ephemeral node   {:>8.1} MiB",
            mib(m.rss_sessions_nodes_bytes)
        );
        println!(
            "  per idle session              {:>8.0} bytes",
            m.bytes_per_idle_session
        );
        println!(
            "  per ephemeral node            {:>8.0} bytes",
            m.bytes_per_ephemeral_node
        );
        println!(
            "  per idle session with a node  {:>8.0} bytes",
            m.bytes_per_session_with_node
        );
        if let Some(d) = m.bytes_per_disconnected_session_with_node {
            println!("server memory (RSS), {} sessions held in all", m.sessions);
            println!(
                "  total                         {:>8.1} MiB",
                mib(m.rss_all_sessions_bytes)
            );
            println!("  per session without its connection, with a node {d:>6.0} bytes");
            println!(
                "  per session with a node, over all held   {:>8.0} bytes",
                m.bytes_per_session_held
            );
        }
        println!(
            "  the server's counters: {} sessions, {} nodes, {} connections open, {} sessions expired",
            m.server_sessions, m.server_nodes, m.server_connections_open, m.server_sessions_expired
        );
        println!(
            "  {} sessions opened in {:.0} s, session timeout {} ms",
            m.sessions, m.open_seconds, m.session_timeout_ms
        );
    }
}

fn print_markdown(r: &Report) {
    println!("| round trip | p50 µs | p99 µs | p50 / floor |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, s) in [
        ("raw TCP ping-pong (the floor)", &r.tcp_floor_rtt),
        ("baton ping, raw socket", &r.ping_rtt_raw),
        ("baton ping, client library", &r.ping_rtt_client),
    ] {
        println!(
            "| {name} | {:.1} | {:.1} | {:.2}x |",
            s.p50_us,
            s.p99_us,
            s.p50_us / r.tcp_floor_rtt.p50_us
        );
    }
    println!();
    println!("| create+delete of an ephemeral node | pairs/s | pair p50 µs | pair p99 µs | server CPU µs/pair |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for t in &r.create_delete {
        let cpu = t
            .server_cpu_us_per_pair
            .map_or_else(|| "-".to_string(), |c| format!("{c:.1}"));
        println!(
            "| {} client{} | {:.0} | {:.1} | {:.1} | {cpu} |",
            t.clients,
            if t.clients == 1 { "" } else { "s" },
            t.pairs_per_s,
            t.pair_latency.p50_us,
            t.pair_latency.p99_us
        );
    }
    if let Some(m) = &r.memory {
        println!();
        println!("| server memory (RSS) | bytes |");
        println!("| --- | ---: |");
        println!(
            "| per idle session, {} connected | {:.0} |",
            m.connected_sessions, m.bytes_per_idle_session
        );
        println!("| per ephemeral node | {:.0} |", m.bytes_per_ephemeral_node);
        println!(
            "| per idle session holding one ephemeral node | {:.0} |",
            m.bytes_per_session_with_node
        );
        if let Some(d) = m.bytes_per_disconnected_session_with_node {
            println!("| per session with its node, after its connection left | {d:.0} |");
            println!(
                "| per session holding one ephemeral node, over all {} held | {:.0} |",
                m.sessions, m.bytes_per_session_held
            );
            println!(
                "| total with {} sessions held | {:.1} MiB |",
                m.sessions,
                m.rss_all_sessions_bytes as f64 / 1048576.0
            );
        }
        println!();
        println!(
            "Counted by the server once all were held: {} sessions (the counting client's included), {} nodes, {} connections open, {} sessions expired during the run; {} sessions opened in {:.0} s with a {} ms timeout.",
            m.server_sessions,
            m.server_nodes,
            m.server_connections_open,
            m.server_sessions_expired,
            m.sessions,
            m.open_seconds,
            m.session_timeout_ms
        );
    }
}

/// Round trips of 16-byte messages between two threads over loopback with
/// blocking sockets: what the machine allows.
pub(super) fn tcp_floor(n: usize) -> Result<Summary, CliError> {
    let io = |e: std::io::Error| CliError::msg(format!("TCP floor: {e}"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 16];
        loop {
            if s.read_exact(&mut buf).is_err() {
                return Ok(());
            }
            s.write_all(&buf)?;
        }
    });
    let mut s = std::net::TcpStream::connect(addr).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let mut buf = [7u8; 16];
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&buf).map_err(io)?;
        s.read_exact(&mut buf).map_err(io)?;
        samples.push(t.elapsed());
    }
    drop(s);
    let _ = echo.join();
    Ok(Summary::of(&mut samples))
}

async fn client_pings(addr: &str, n: usize) -> Result<Summary, CliError> {
    let client = Client::connect(addr).await?;
    for _ in 0..100.min(n) {
        client.ping().await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client.ping().await?;
        samples.push(t.elapsed());
    }
    client.close().await;
    Ok(Summary::of(&mut samples))
}

/// Pings over a blocking socket speaking the protocol directly: the server's
/// share of a round trip, without the client library's task hops.
fn raw_pings(addr: &str, n: usize) -> Result<Summary, CliError> {
    let io = |e: std::io::Error| CliError::msg(format!("raw ping: {e}"));
    let mut s = std::net::TcpStream::connect(addr).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let mut buf = BytesMut::new();
    ConnectRequest::new(30_000).encode(&mut buf);
    s.write_all(&buf).map_err(io)?;
    let frame = read_frame_blocking(&mut s).map_err(io)?;
    ConnectResponse::decode(frame.into())
        .map_err(|e| CliError::msg(format!("raw ping handshake: {e}")))?
        .result
        .map_err(|(c, m)| CliError::msg(format!("raw ping handshake: {c}: {m}")))?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 100 {
        buf.clear();
        RequestFrame {
            xid: i as u32,
            request: Request::Ping,
        }
        .encode(&mut buf);
        let t = Instant::now();
        s.write_all(&buf).map_err(io)?;
        read_frame_blocking(&mut s).map_err(io)?;
        if i >= 100 {
            samples.push(t.elapsed());
        }
    }
    // Closed, so that it does not expire during a later measurement.
    buf.clear();
    RequestFrame {
        xid: (n + 100) as u32,
        request: Request::CloseSession,
    }
    .encode(&mut buf);
    s.write_all(&buf).map_err(io)?;
    read_frame_blocking(&mut s).map_err(io)?;
    Ok(Summary::of(&mut samples))
}

fn read_frame_blocking(s: &mut std::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut frame)?;
    Ok(frame)
}

async fn create_delete_run(
    addr: &str,
    clients: usize,
    duration: Duration,
) -> Result<Throughput, CliError> {
    let setup = Client::connect(addr).await?;
    for p in ["/bench", "/bench/ops"] {
        match setup.create(p, "", CreateMode::Persistent).await {
            Ok(_) | Err(baton_client::Error::NodeExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    setup.close().await;
    let mut sessions = Vec::with_capacity(clients);
    for _ in 0..clients {
        sessions.push(Client::connect(addr).await?);
    }
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(clients);
    for (i, c) in sessions.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let path = format!("/bench/ops/c{i}");
            // Bounded by time and by count.
            while Instant::now() < deadline && samples.len() < 10_000_000 {
                let t = Instant::now();
                c.create(&path, "", CreateMode::Ephemeral).await?;
                c.delete(&path, None).await?;
                samples.push(t.elapsed());
            }
            c.close().await;
            Ok::<_, baton_client::Error>(samples)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| CliError::msg(e.to_string()))??);
    }
    let seconds = start.elapsed().as_secs_f64();
    let pairs = all.len() as u64;
    Ok(Throughput {
        clients,
        pairs,
        seconds,
        pairs_per_s: pairs as f64 / seconds,
        pair_latency: Summary::of(&mut all),
        server_cpu_us_per_pair: None,
    })
}

/// Measures the server's memory: first `connected` idle sessions, each on
/// its own connection, before and after each gets one ephemeral node; then
/// more sessions up to `total`, each creating its node and leaving its
/// connection (the server keeps the session until its timeout), to show the
/// state of `total` sessions held by one server. The server's own counters
/// then confirm that it holds every session and node, with only the
/// connected sessions' connections open.
async fn memory_run(
    addr: &str,
    pid: Option<u32>,
    total: usize,
    timeout_ms: u32,
) -> Result<Memory, CliError> {
    let pid = pid.ok_or_else(|| CliError::msg("the benchmark server has no pid"))?;
    let setup = Client::connect(addr).await?;
    for p in ["/bench", "/bench/mem"] {
        match setup.create(p, "", CreateMode::Persistent).await {
            Ok(_) | Err(baton_client::Error::NodeExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let before = setup.server_stats().await?;
    setup.close().await;
    let counter = |stats: &std::collections::BTreeMap<String, u64>, name: &str| {
        stats.get(name).copied().unwrap_or(0)
    };
    let server: SocketAddr = addr
        .parse()
        .map_err(|e| CliError::msg(format!("memory run needs an IP:port address: {e}")))?;
    // Each connected session costs a descriptor here and one in the server.
    let fd_limit = crate::sys::fd_limit();
    let connected = total.min(fd_limit.saturating_sub(1_000) as usize);
    if connected < total {
        progress(format!(
            "the open-file limit is {fd_limit}: {connected} sessions stay connected, the other {} leave their connection after creating their node",
            total - connected
        ));
    }
    let rss_base = settled_rss(pid).await?;

    let (phase_tx, phase_rx) = watch::channel(Phase::Open);
    let counters = Arc::new(Counters::default());
    let connecting = Arc::new(Semaphore::new(256));
    let session = SessionSpec { server, timeout_ms };

    progress(format!(
        "opening {connected} idle sessions, each on its own connection (timeout {timeout_ms} ms)"
    ));
    let started = Instant::now();
    let mut tasks = (0..connected)
        .map(|i| {
            let (phase_rx, counters, connecting) =
                (phase_rx.clone(), counters.clone(), connecting.clone());
            tokio::spawn(async move {
                if idle_session(session, i, true, phase_rx, &counters, &connecting)
                    .await
                    .is_err()
                {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect::<Vec<_>>();
    let give_up = Instant::now() + Duration::from_secs(300);
    wait_for(&counters, |c| &c.opened, connected, "opened", pid, give_up).await?;
    let rss_sessions = settled_rss(pid).await?;
    progress(format!(
        "creating one ephemeral node per session ({connected})"
    ));
    let _ = phase_tx.send(Phase::Create);
    let give_up = Instant::now() + Duration::from_secs(300);
    wait_for(
        &counters,
        |c| &c.created,
        connected,
        "created their node",
        pid,
        give_up,
    )
    .await?;
    let rss_nodes = settled_rss(pid).await?;

    let held = total - connected;
    let mut rss_held = rss_nodes;
    if held > 0 {
        progress(format!(
            "opening {held} more sessions that create a node and leave"
        ));
        // A bounded number of workers, each opening one session at a time:
        // a task per session would cost this process more than the server.
        let next = Arc::new(AtomicUsize::new(connected));
        for _ in 0..held.min(128) {
            let (phase_rx, counters, connecting, next) = (
                phase_rx.clone(),
                counters.clone(),
                connecting.clone(),
                next.clone(),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total || counters.failed.load(Ordering::Relaxed) > 0 {
                        return;
                    }
                    if idle_session(session, i, false, phase_rx.clone(), &counters, &connecting)
                        .await
                        .is_err()
                    {
                        counters.failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }));
        }
        // The first of these sessions must still be alive when the last is
        // counted: give up while there is time left to measure.
        let alive_for = Duration::from_millis(timeout_ms.into());
        let give_up = Instant::now()
            + alive_for
                .saturating_sub(Duration::from_secs(45))
                .max(Duration::from_secs(10));
        wait_for(
            &counters,
            |c| &c.created,
            total,
            "created their node",
            pid,
            give_up,
        )
        .await?;
        rss_held = settled_rss(pid).await?;
    }
    let open_seconds = started.elapsed().as_secs_f64();

    // What the server says it holds (this client adds a session and a
    // connection, after the RSS was read).
    let counting = Client::connect(addr).await?;
    let after = counting.server_stats().await?;
    counting.close().await;
    let server_sessions = counter(&after, "sessions");
    let server_nodes = counter(&after, "nodes");
    let server_connections_open = counter(&after, "connections_open");
    let server_sessions_expired =
        counter(&after, "sessions_expired") - counter(&before, "sessions_expired");
    progress(format!(
        "the server holds {server_sessions} sessions and {server_nodes} nodes, with {server_connections_open} connections open; {server_sessions_expired} sessions expired meanwhile"
    ));
    if server_sessions_expired > 0 || server_sessions < total as u64 + 1 {
        return Err(CliError::msg(format!(
            "the server holds {server_sessions} sessions of the {total} opened ({server_sessions_expired} expired): the measurement took longer than the sessions' {timeout_ms} ms timeout (raise --session-timeout-ms)"
        )));
    }
    if server_nodes < total as u64 {
        return Err(CliError::msg(format!(
            "the server holds {server_nodes} nodes, fewer than the {total} sessions' ephemerals"
        )));
    }

    let _ = phase_tx.send(Phase::Stop);
    for t in tasks {
        let _ = t.await;
    }
    let per = |a: u64, b: u64, n: usize| (a as f64 - b as f64) / n.max(1) as f64;
    Ok(Memory {
        sessions: total,
        connected_sessions: connected,
        rss_base_bytes: rss_base,
        rss_sessions_bytes: rss_sessions,
        rss_sessions_nodes_bytes: rss_nodes,
        rss_all_sessions_bytes: rss_held,
        bytes_per_idle_session: per(rss_sessions, rss_base, connected),
        bytes_per_ephemeral_node: per(rss_nodes, rss_sessions, connected),
        bytes_per_session_with_node: per(rss_nodes, rss_base, connected),
        bytes_per_disconnected_session_with_node: (held > 0)
            .then(|| per(rss_held, rss_nodes, held)),
        bytes_per_session_held: per(rss_held, rss_base, total),
        session_timeout_ms: timeout_ms,
        open_seconds,
        server_sessions,
        server_nodes,
        server_connections_open,
        server_sessions_expired,
    })
}

/// The server's RSS once memory freed by a burst (buffers of the requests
/// just handled) has gone back to the system: the allocator returns it
/// after about ten seconds, so this waits for RSS to stop falling, up to
/// 30 s.
async fn settled_rss(pid: u32) -> Result<u64, CliError> {
    let read = || rss_bytes(pid).ok_or_else(|| CliError::msg("cannot read the server's RSS"));
    let started = Instant::now();
    let mut last = read()?;
    let mut steady = 0;
    progress("letting the server's memory settle after the burst");
    while started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = read()?;
        steady = if now.abs_diff(last) < 64 * 1024 {
            steady + 1
        } else {
            0
        };
        last = now;
        if steady >= 4 && started.elapsed() >= Duration::from_secs(12) {
            break;
        }
    }
    progress(format!("server RSS {:.1} MiB", last as f64 / 1048576.0));
    Ok(last)
}

#[derive(Default)]
struct Counters {
    opened: AtomicUsize,
    created: AtomicUsize,
    failed: AtomicUsize,
}

/// Waits (until `give_up`, reporting progress and the server's RSS every
/// 5 s) until `counter` reaches `n`.
async fn wait_for(
    counters: &Counters,
    counter: impl Fn(&Counters) -> &AtomicUsize,
    n: usize,
    what: &str,
    pid: u32,
    give_up: Instant,
) -> Result<(), CliError> {
    let started = Instant::now();
    let from = counter(counters).load(Ordering::Relaxed);
    let mut last_report = Instant::now();
    loop {
        let done = counter(counters).load(Ordering::Relaxed);
        let bad = counters.failed.load(Ordering::Relaxed);
        if bad > 0 {
            return Err(CliError::msg(format!(
                "{bad} sessions failed ({done} {what})"
            )));
        }
        if done >= n {
            return Ok(());
        }
        if Instant::now() > give_up {
            return Err(CliError::msg(format!(
                "only {done} of {n} sessions {what} after {:.0} s",
                started.elapsed().as_secs_f64()
            )));
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            let rate = (done - from) as f64 / started.elapsed().as_secs_f64();
            let rss = rss_bytes(pid).unwrap_or(0) as f64 / 1048576.0;
            progress(format!(
                "{done}/{n} sessions {what} ({rate:.0}/s), server RSS {rss:.1} MiB"
            ));
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Open,
    Create,
    Stop,
}

/// Where the memory measurement's sessions connect, and the timeout they
/// ask for.
#[derive(Clone, Copy)]
struct SessionSpec {
    server: SocketAddr,
    timeout_ms: u32,
}

/// One idle session over a raw connection: handshake, then one ephemeral
/// node (when told, if `keep`, else at once), with a ping every 20 s to keep
/// it alive. Without `keep` it leaves its connection after creating the node.
async fn idle_session(
    SessionSpec { server, timeout_ms }: SessionSpec,
    i: usize,
    keep: bool,
    mut phase: watch::Receiver<Phase>,
    counters: &Counters,
    connecting: &Semaphore,
) -> std::io::Result<()> {
    let mut stream = {
        let _permit = connecting.acquire().await.map_err(std::io::Error::other)?;
        // Loopback offers about 28,000 ephemeral ports per source address:
        // spread the sessions over 127.0.0.2, 127.0.0.3, ... Each session
        // gets its own address and port, named here: left to the kernel, a
        // port is found by a search that grows slow as the ports of the
        // connections already left linger (TIME_WAIT).
        let source = IpAddr::V4(Ipv4Addr::new(
            127,
            0,
            (i / 20_000 / 250) as u8,
            2 + (i / 20_000 % 250) as u8,
        ));
        let port = 20_000 + (i % 20_000) as u16;
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        if socket.bind(SocketAddr::new(source, port)).is_err() {
            // Taken (by another program): any free port will do.
            socket.bind(SocketAddr::new(source, 0))?;
        }
        let mut stream = socket.connect(server).await?;
        stream.set_nodelay(true)?;
        let mut buf = BytesMut::new();
        ConnectRequest::new(timeout_ms).encode(&mut buf);
        stream.write_all(&buf).await?;
        let frame = read_frame(&mut stream).await?;
        ConnectResponse::decode(frame.into())
            .map_err(std::io::Error::other)?
            .result
            .map_err(|(c, m)| std::io::Error::other(format!("{c}: {m}")))?;
        stream
    };
    counters.opened.fetch_add(1, Ordering::Relaxed);
    let mut xid = 0u32;
    let mut request = |stream_req: Request| {
        xid += 1;
        let mut buf = BytesMut::new();
        RequestFrame {
            xid,
            request: stream_req,
        }
        .encode(&mut buf);
        buf
    };
    let create = Request::Create {
        path: format!("/bench/mem/s{i}"),
        data: Default::default(),
        mode: CreateMode::Ephemeral,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    };
    if !keep {
        stream.write_all(&request(create)).await?;
        created(read_frame(&mut stream).await?)?;
        counters.created.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    loop {
        tokio::select! {
            changed = phase.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let now = *phase.borrow();
                match now {
                    Phase::Create => {
                        stream.write_all(&request(create.clone())).await?;
                        created(read_frame(&mut stream).await?)?;
                        counters.created.fetch_add(1, Ordering::Relaxed);
                    }
                    Phase::Stop => return Ok(()),
                    Phase::Open => {}
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(20)) => {
                stream.write_all(&request(Request::Ping)).await?;
                read_frame(&mut stream).await?;
            }
        }
    }
}

/// Checks that a reply says the node was created.
fn created(frame: Vec<u8>) -> std::io::Result<()> {
    match ServerMessage::decode(frame.into()).map_err(std::io::Error::other)? {
        ServerMessage::Reply(ReplyFrame {
            result: Ok(Reply::Create { .. }),
            ..
        }) => Ok(()),
        other => Err(std::io::Error::other(format!(
            "a create was answered with {other:?}"
        ))),
    }
}

async fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = stream.read_u32().await? as usize;
    let mut frame = vec![0u8; len];
    stream.read_exact(&mut frame).await?;
    Ok(frame)
}
