//! The HTTP responder: `GET /metrics` answered with a scrape.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use super::scrape::render;
use crate::ServerHandle;

/// Most bytes of an HTTP request read before it is refused.
const MAX_HTTP_REQUEST: usize = 8 << 10;
/// How long a metrics client may take to send its request.
const HTTP_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one metrics connection may last in all, reading and writing.
const HTTP_ANSWER_TIMEOUT: Duration = Duration::from_secs(15);
/// Most metrics connections served at once.
const HTTP_CONNECTIONS: usize = 64;

/// Serves `GET /metrics` on `listener` until the server behind `handle`
/// stops. Each connection gets one answer and is closed.
pub async fn serve(listener: TcpListener, handle: ServerHandle) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving metrics at http://{addr}/metrics");
    }
    let mut stopping = handle.shared().stopping.subscribe();
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stopping.wait_for(|s| *s) => return,
        };
        match accepted {
            Ok((stream, _)) => {
                // Past the limit a connection is closed unanswered.
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                let handle = handle.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HTTP_ANSWER_TIMEOUT, answer(stream, &handle)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => debug!("metrics request failed: {e}"),
                        Err(_) => debug!("metrics request abandoned: not answered within {HTTP_ANSWER_TIMEOUT:?}"),
                    }
                    drop(slot);
                });
            }
            Err(e) => {
                warn!("accepting a metrics connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads one HTTP request and answers it.
async fn answer(mut stream: TcpStream, handle: &ServerHandle) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head_read = async {
        loop {
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.len() > MAX_HTTP_REQUEST {
                return Ok::<_, std::io::Error>(true);
            }
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(false);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    match tokio::time::timeout(HTTP_READ_TIMEOUT, head_read).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => return Ok(()),
        Ok(Err(e)) => return Err(e),
    }
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = if buf.len() > MAX_HTTP_REQUEST {
        (
            "431 Request Header Fields Too Large",
            "text/plain; charset=utf-8",
            "request too large\n".to_string(),
        )
    } else if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET is served here\n".to_string(),
        )
    } else if path == "/metrics" {
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(handle),
        )
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "Baton serves its metrics at /metrics\n".to_string(),
        )
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}
