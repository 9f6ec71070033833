//! `baton cluster local`: a whole cluster on this machine, one process per
//! member, for trying cluster mode out.
//!
//! The listeners are bound here, on free loopback ports, and handed to each
//! member process as inherited file descriptors, so no port can be taken in
//! between. A member that dies is reported, not restarted.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::cluster::LocalArgs;
use crate::{CliError, CliResult};

struct Running {
    id: u64,
    child: Child,
    pid: u32,
}

pub async fn run(args: LocalArgs) -> CliResult {
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| CliError::msg(format!("cannot create {}: {e}", args.data_dir.display())))?;
    let bind = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| CliError::msg(format!("cannot bind a loopback port: {e}")))
    };
    let mut listeners = BTreeMap::new();
    for id in 1..=args.members {
        listeners.insert(id, (bind()?, bind()?));
    }
    let addr = |l: &std::net::TcpListener| {
        l.local_addr()
            .map(|a| a.to_string())
            .map_err(|e| CliError::msg(e.to_string()))
    };
    let mut peers = Vec::new();
    for (id, (client, peer)) in &listeners {
        peers.push(format!("{id}={}/{}", addr(peer)?, addr(client)?));
    }
    let peers = peers.join(",");
    let exe = std::env::current_exe()
        .map_err(|e| CliError::msg(format!("cannot find the baton binary: {e}")))?;
    let mut running = Vec::new();
    for (id, (client, peer)) in &listeners {
        let dir = args.data_dir.join(format!("member-{id}"));
        let log_path = args.data_dir.join(format!("member-{id}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| CliError::msg(format!("cannot open {}: {e}", log_path.display())))?;
        let (client_fd, peer_fd) = (client.as_raw_fd(), peer.as_raw_fd());
        let mut command = Command::new(&exe);
        command
            .args(["serve", "--node-id", &id.to_string(), "--peers", &peers])
            .args(["--election-timeout", &args.election_timeout.to_string()])
            .arg("--data-dir")
            .arg(&dir)
            .args(["--listen-fd", &client_fd.to_string()])
            .args(["--peer-listen-fd", &peer_fd.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| CliError::msg(e.to_string()))?)
            .stderr(log);
        // SAFETY: fcntl only changes the flags of the two descriptors this
        // member is to inherit; nothing is allocated in the child.
        unsafe {
            command.pre_exec(move || {
                for fd in [client_fd, peer_fd] {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| CliError::msg(format!("cannot start member {id}: {e}")))?;
        let pid = child.id().unwrap_or(0);
        println!(
            "member {id} client {} peer {} pid {pid}",
            addr(client)?,
            addr(peer)?
        );
        running.push(Running {
            id: *id,
            child,
            pid,
        });
    }
    // The members hold the listeners now.
    drop(listeners);
    let clients: Vec<String> = peers
        .split(',')
        .filter_map(|m| m.split('/').nth(1).map(str::to_owned))
        .collect();
    let clients = clients.join(",");
    println!(
        "cluster of {} running; logs in {}/member-N.log; try: baton --server {clients} cluster status",
        args.members,
        args.data_dir.display()
    );
    match wait_for_leader(&clients).await {
        Some(leader) => println!("member {leader} leads"),
        None => println!("no member leads yet; see the members' logs"),
    }
    supervise(running).await
}

/// The id of the leader, once one leads (within ten seconds).
async fn wait_for_leader(clients: &str) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        for addr in clients.split(',') {
            if let Ok(answer) = baton_client::probe(addr, Duration::from_millis(500)).await {
                let status: serde_json::Value = serde_json::from_str(&answer).ok()?;
                if status["role"] == "leader" {
                    return status["cluster"]["id"].as_u64();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Waits for Ctrl-C (or SIGTERM, SIGHUP), reporting members that exit
/// meanwhile; then stops the rest.
async fn supervise(mut running: Vec<Running>) -> CliResult {
    let listen =
        |kind| signal(kind).map_err(|e| CliError::msg(format!("cannot listen for signals: {e}")));
    let (mut int, mut term, mut hup) = (
        listen(SignalKind::interrupt())?,
        listen(SignalKind::terminate())?,
        listen(SignalKind::hangup())?,
    );
    while !running.is_empty() {
        let exited = {
            let exits = running
                .iter_mut()
                .enumerate()
                .map(|(i, r)| Box::pin(async move { (i, r.child.wait().await) }));
            tokio::select! {
                ((i, status), _, _) = futures::future::select_all(exits) => Some((i, status)),
                _ = int.recv() => None,
                _ = term.recv() => None,
                _ = hup.recv() => None,
            }
        };
        match exited {
            None => break,
            Some((i, status)) => {
                let gone = running.remove(i);
                let how = match status {
                    Ok(s) if s.signal().is_some() => {
                        format!("was killed by signal {}", s.signal().unwrap_or(0))
                    }
                    Ok(s) => format!("exited with status {}", s.code().unwrap_or(-1)),
                    Err(e) => format!("could not be waited for: {e}"),
                };
                println!("member {} (pid {}) {how}; not restarted", gone.id, gone.pid);
            }
        }
    }
    println!("stopping the cluster");
    for r in &running {
        // SAFETY: kill has no memory effects; the child is not reaped yet.
        unsafe {
            libc::kill(r.pid as i32, libc::SIGTERM);
        }
    }
    for mut r in running {
        if tokio::time::timeout(Duration::from_secs(10), r.child.wait())
            .await
            .is_err()
        {
            let _ = r.child.kill().await;
        }
    }
    Ok(ExitCode::SUCCESS)
}
