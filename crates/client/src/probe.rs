//! The status probe: what a server says of itself, without a session.

use std::time::Duration;

use baton_proto::probe::encode_probe;
use baton_proto::{frame_codec, MAX_RESPONSE_FRAME};
use bytes::BytesMut;
use futures::StreamExt;
use tokio_util::codec::FramedRead;

use crate::error::{Error, Result};
use crate::wire::ClientTls;

/// Asks the server at `addr` to describe itself: its role (a single
/// server, or a cluster member that leads or follows, with the leader's
/// address), its counts, and in a cluster the members and their progress.
/// Any server answers, a cluster member that does not lead included.
///
/// Returns the server's JSON object as text (see docs/protocol.md,
/// "Status probe").
///
/// # Errors
/// [`Error::Connect`] if the server cannot be reached or does not answer
/// within `limit`.
/// With `tls`, connects with TLS (a server that takes TLS only answers
/// nothing else).
pub async fn probe(addr: &str, limit: Duration, tls: Option<&ClientTls>) -> Result<String> {
    probe_as(addr, limit, tls, None).await
}

/// [`probe`], naming an identity with its `token`: a server that checks
/// identities then names the locks that identity may read (and no lock to
/// a probe without one; its answer says `"locks_hidden": true`).
///
/// # Errors
/// As [`probe`].
pub async fn probe_as(
    addr: &str,
    limit: Duration,
    tls: Option<&ClientTls>,
    token: Option<&[u8]>,
) -> Result<String> {
    let failed = |reason: String| Error::connect(addr, reason);
    let ask = async {
        let (wire, read) = crate::wire::connect(addr, tls).await?;
        let mut buf = BytesMut::new();
        encode_probe(&mut buf, token);
        wire.write_all(&mut buf)
            .await
            .map_err(|e| Error::connect_because(addr, format!("sending the probe: {e}"), e))?;
        let mut frames = FramedRead::new(read, frame_codec(MAX_RESPONSE_FRAME));
        match frames.next().await {
            Some(Ok(frame)) => {
                let answer = String::from_utf8(frame.to_vec())
                    .map_err(|_| failed("the answer is not UTF-8: not a Baton server?".into()))?;
                // A server that could not answer says why.
                if let Ok(serde_json::Value::Object(o)) = serde_json::from_str(&answer) {
                    if let Some(error) = o.get("error").and_then(|e| e.as_str()) {
                        return Err(failed(error.to_owned()));
                    }
                }
                Ok(answer)
            }
            Some(Err(e)) => Err(Error::connect_because(addr, format!("reading the answer: {e}"), e)),
            None => Err(failed(
                "the server closed the connection without answering (a server too old for the probe?)".into(),
            )),
        }
    };
    match tokio::time::timeout(limit, ask).await {
        Ok(r) => r,
        Err(_) => Err(failed(format!("no answer within {} ms", limit.as_millis()))),
    }
}

/// A snapshot of a server's whole state, as [`backup`] fetched it.
#[derive(Debug)]
pub struct Backup {
    /// The revision the snapshot holds the state at.
    pub revision: u64,
    pub sessions: u64,
    pub nodes: u64,
    /// The snapshot, in the format of the server's snapshot files.
    pub bytes: Vec<u8>,
}

/// Asks the server at `addr` for a snapshot of its state as it is now (once
/// its log holds it), without a session. `limit` bounds the wait for each
/// part of the answer.
///
/// # Errors
/// [`Error::Connect`] if the server cannot be reached, does not answer
/// within `limit` or breaks off; [`Error::PermissionDenied`] (or
/// [`Error::AuthenticationFailed`]) if its identities refuse the token;
/// [`Error::NotLeader`] if it is a cluster member that does not lead a
/// majority; [`Error::Server`] if it cannot take one now (another backup
/// is under way; its log is stuck); [`Error::Protocol`] if it answers
/// something that is not a backup.
/// On a server that checks identities, `token` must name one with the
/// admin right.
pub async fn backup(
    addr: &str,
    limit: Duration,
    tls: Option<&ClientTls>,
    token: Option<&[u8]>,
) -> Result<Backup> {
    use baton_proto::probe::{encode_backup_request, BACKUP_CHUNK};
    let failed = |reason: String| Error::connect(addr, reason);
    let timed =
        |what: &'static str| move |_| failed(format!("no {what} within {} ms", limit.as_millis()));
    let (wire, read) = tokio::time::timeout(limit, crate::wire::connect(addr, tls))
        .await
        .map_err(timed("connection"))??;
    let mut buf = BytesMut::new();
    encode_backup_request(&mut buf, token);
    wire.write_all(&mut buf)
        .await
        .map_err(|e| Error::connect_because(addr, format!("sending the request: {e}"), e))?;
    let mut frames = FramedRead::new(read, frame_codec(BACKUP_CHUNK.max(MAX_RESPONSE_FRAME)));
    let mut next = async || {
        match tokio::time::timeout(limit, frames.next()).await {
        Err(_) => Err(failed(format!("no answer within {} ms", limit.as_millis()))),
        Ok(None) => Err(failed("the server closed the connection before the backup's end (a server too old for backups?)".into())),
        Ok(Some(Err(e))) => Err(Error::connect_because(addr, format!("reading the backup: {e}"), e)),
        Ok(Some(Ok(frame))) => Ok(frame),
    }
    };
    let header = next().await?;
    let header: serde_json::Value = serde_json::from_slice(&header).map_err(|e| {
        Error::Protocol(format!(
            "{addr} answered something that is not a backup: {e}"
        ))
    })?;
    if let Some(error) = header["error"].as_str() {
        if error.contains("TLS") {
            return Err(failed(error.to_owned()));
        }
        let message = format!("{addr} could not take a backup: {error}");
        return Err(
            match header["code"].as_u64().and_then(|c| u16::try_from(c).ok()) {
                Some(code) => match baton_proto::ErrorCode::from_u16(code) {
                    baton_proto::ErrorCode::NotLeader => Error::NotLeader(message),
                    code => Error::from_wire(code, message),
                },
                None => Error::Server {
                    code: baton_proto::ErrorCode::Internal,
                    message,
                },
            },
        );
    }
    let field = |name: &str| {
        header[name].as_u64().ok_or_else(|| {
            Error::Protocol(format!("{addr}'s backup header has no `{name}`: {header}"))
        })
    };
    let (revision, size, sessions, nodes) = (
        field("revision")?,
        field("bytes")?,
        field("sessions")?,
        field("nodes")?,
    );
    let mut bytes = Vec::with_capacity(size.min(1 << 30) as usize);
    loop {
        let frame = next().await?;
        if frame.is_empty() {
            break;
        }
        bytes.extend_from_slice(&frame);
        if bytes.len() as u64 > size {
            return Err(Error::Protocol(format!(
                "{addr} sent more than the {size} bytes it announced"
            )));
        }
    }
    if bytes.len() as u64 != size {
        return Err(Error::Protocol(format!(
            "{addr} announced {size} bytes and sent {}",
            bytes.len()
        )));
    }
    Ok(Backup {
        revision,
        sessions,
        nodes,
        bytes,
    })
}
