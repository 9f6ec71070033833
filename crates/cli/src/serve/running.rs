//! Running a server: until SIGINT or SIGTERM, with its metrics, and TLS
//! reloaded on SIGHUP.

use std::process::ExitCode;

use baton_server::{Config, Server};
use tokio::signal::unix::{signal, SignalKind};

use crate::{CliError, CliResult};

use super::settings::Settings;

/// Serves as a single server with `config` (made from `args`) until
/// SIGINT or SIGTERM.
pub(super) async fn serve_single(
    args: &Settings,
    config: Config,
    metrics: Option<tokio::net::TcpListener>,
) -> CliResult {
    let server = match args.listen_fd {
        Some(fd) => Server::new(inherited(fd, "--listen-fd")?, config)?,
        None => {
            let listen = args.listen.as_deref().unwrap_or(crate::DEFAULT_SERVER);
            // The server binds after recovering its log (clients that come
            // meanwhile are refused, not kept waiting); whether it can is
            // found out now.
            std::net::TcpListener::bind(listen)
                .map_err(|e| CliError::msg(format!("cannot listen on {listen} (listen): {e}")))?;
            Server::bind(listen, config).await?
        }
    };
    let addr = server
        .local_addr()
        .map_err(|e| CliError::msg(e.to_string()))?;
    serve_metrics(metrics, server.handle());
    reload_on_sighup(args, server.handle())?;
    if args.identities.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "this server is open to anyone who can reach {addr}: no identity is configured ([[identity]] in the config file; docs/operations.md)");
    }
    tracing::info!(%addr, tls = args.tls.is_some(), "baton server ready; stop with Ctrl-C or SIGTERM");
    say_listening(&addr.to_string());
    server.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// On SIGHUP, reads the TLS certificate and key again (renewed ones, say):
/// new connections use them. If they do not load, the old ones stay.
pub fn reload_on_sighup(
    settings: &Settings,
    handle: baton_server::ServerHandle,
) -> Result<(), CliError> {
    let mut hangups = signal(SignalKind::hangup())
        .map_err(|e| CliError::msg(format!("cannot listen for SIGHUP: {e}")))?;
    let files = settings.tls_files.clone();
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let Some(files) = &files else {
                tracing::info!("SIGHUP: nothing to reload (no TLS)");
                continue;
            };
            // Reads files: not on a runtime thread.
            let read = files.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                baton_server::tls::server_config(&read).map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(format!("reading the files failed: {e}")));
            match loaded {
                Ok(config) => {
                    handle.reload_tls(config);
                    tracing::info!(cert = %files.cert.display(), "SIGHUP: TLS certificate reloaded; new connections use it");
                }
                Err(e) => {
                    tracing::error!("SIGHUP: TLS certificate not reloaded, the one loaded before stays in use: {e}")
                }
            }
        }
    });
    Ok(())
}

/// The metrics endpoint's listener, if `--metrics-listen` asks for one.
pub async fn bind_metrics(
    settings: &Settings,
) -> Result<Option<tokio::net::TcpListener>, CliError> {
    let Some(addr) = &settings.metrics_listen else {
        return Ok(None);
    };
    tokio::net::TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|e| {
            CliError::msg(format!(
                "cannot listen for metrics on {addr} (metrics-listen): {e}"
            ))
        })
}

/// Serves the metrics endpoint on `listener`, if there is one.
pub fn serve_metrics(
    listener: Option<tokio::net::TcpListener>,
    handle: baton_server::ServerHandle,
) {
    if let Some(listener) = listener {
        tokio::spawn(baton_server::metrics::serve(listener, handle));
    }
}

/// Prints `listening on ADDR` on stdout, for scripts and supervisors (and
/// for a port 0 to be found out).
pub fn say_listening(addr: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {addr}").and_then(|()| out.flush());
}

/// A listener inherited as file descriptor `fd`.
pub fn inherited(fd: i32, flag: &str) -> Result<tokio::net::TcpListener, CliError> {
    use std::os::fd::FromRawFd;
    // SAFETY: the descriptor was passed to this process to be used as its
    // listener and is used by nothing else.
    let std = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    std.set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(std))
        .map_err(|e| CliError::msg(format!("{flag} {fd} is not a listening socket: {e}")))
}

pub async fn shutdown_signal() {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}
