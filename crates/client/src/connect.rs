//! Opening a connection: the handshake with one server, and the search of
//! a cluster's members for one that serves the session.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::{
    frame_codec, ConnectRequest, ConnectResponse, ErrorCode, SessionGrant, MAX_RESPONSE_FRAME,
};
use bytes::BytesMut;
use futures::StreamExt;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

use crate::error::{Error, Result};
use crate::wire::{ClientTls, ReadSide, Wire};

/// An open connection with its session granted.
pub(crate) struct Connection {
    pub(crate) reader: FramedRead<ReadSide, LengthDelimitedCodec>,
    pub(crate) writer: Arc<Wire>,
    pub(crate) grant: SessionGrant,
    /// When the handshake was sent.
    pub(crate) sent: Instant,
}

/// Opens a connection to `addr` and performs the handshake.
pub(crate) async fn open(
    addr: &str,
    request: &ConnectRequest,
    connect_timeout: Duration,
    tls: Option<&ClientTls>,
) -> Result<Connection> {
    let failed = |reason: String| Error::connect(addr, reason);
    let sent = Instant::now();
    let attempt = async {
        let (writer, read) = crate::wire::connect(addr, tls).await?;
        let mut buf = BytesMut::new();
        request.encode(&mut buf);
        writer
            .write_all(&mut buf)
            .await
            .map_err(|e| Error::connect_because(addr, format!("sending the handshake: {e}"), e))?;
        let mut reader = FramedRead::new(read, frame_codec(MAX_RESPONSE_FRAME));
        let frame = match reader.next().await {
            Some(Ok(frame)) => frame.freeze(),
            Some(Err(e)) => {
                return Err(Error::connect_because(
                    addr,
                    format!("reading the handshake answer: {e}"),
                    e,
                ))
            }
            None => {
                return Err(failed(
                    "the server closed the connection during the handshake".into(),
                ))
            }
        };
        let response = ConnectResponse::decode(frame).map_err(|e| {
            Error::connect_because(
                addr,
                format!("not a Baton server? bad handshake answer: {e}"),
                e,
            )
        })?;
        match response.result {
            Ok(grant) => Ok(Connection {
                reader,
                writer,
                grant,
                sent,
            }),
            Err((code, message)) => Err(match code {
                ErrorCode::SessionExpired | ErrorCode::TooManyConnections => {
                    Error::from_wire(code, message)
                }
                // The message is the leader's client address, if known.
                ErrorCode::NotLeader => Error::NotLeader(message),
                ErrorCode::TlsRequired => failed(message),
                ErrorCode::AuthenticationFailed => Error::AuthenticationFailed(message),
                _ => failed(format!("{code}: {message}")),
            }),
        }
    };
    match timeout(connect_timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(failed(format!(
            "no answer within {} ms",
            connect_timeout.as_millis()
        ))),
    }
}

/// Most redirects followed in one attempt to reach the leader.
const MAX_REDIRECTS: usize = 3;

/// How long an attempt on one member goes unanswered before the next member
/// is tried alongside it: a paused member (a stopped VM, a long pause)
/// accepts a connection in its kernel and never answers, and must not cost
/// every connect its whole timeout.
pub(crate) const STAGGER: Duration = Duration::from_millis(250);

/// Opens a connection to whichever member leads: `first` (the leader last
/// heard of) if given, then each address in turn, following a member's
/// answer that another leads. An address that has not answered within
/// [`STAGGER`] (or that failed) has the next one tried alongside it, and the
/// first to grant the session wins; the whole search is bounded by
/// `connect_timeout`. Returns the connection and its address.
///
/// # Errors
/// [`Error::SessionExpired`] or [`Error::AuthenticationFailed`] at once;
/// otherwise, once every address has failed or the time is up, one error
/// saying what each member answered: [`Error::NotLeader`] if any answered
/// that it does not lead, else [`Error::Connect`] (the address's own error
/// if only one was given).
///
/// # Cancellation safety
/// Dropping it drops the attempts under way. One that a leader had already
/// granted leaves a new session with nothing in it, which expires; a
/// resume is simply not made.
pub(crate) async fn open_leader(
    first: Option<&str>,
    addrs: &[String],
    request: &ConnectRequest,
    connect_timeout: Duration,
    tls: Option<&ClientTls>,
) -> Result<(Connection, String)> {
    use futures::stream::FuturesUnordered;
    let deadline = Instant::now() + connect_timeout;
    let mut queue: VecDeque<String> = first
        .map(str::to_owned)
        .into_iter()
        .chain(addrs.iter().cloned())
        .collect();
    // Every address started, in order, and when.
    let mut tried: Vec<(String, Instant)> = Vec::new();
    let mut answers: Vec<(String, Error)> = Vec::new();
    let mut running = FuturesUnordered::new();
    let mut redirects = 0;
    let mut next_start = Instant::now();
    loop {
        let now = Instant::now();
        if running.is_empty() || now >= next_start {
            if let Some(addr) = queue.pop_front() {
                if !tried.iter().any(|(a, _)| *a == addr) {
                    tried.push((addr.clone(), now));
                    let left = deadline.saturating_duration_since(now);
                    running.push(async move {
                        let result = open(&addr, request, left, tls).await;
                        (addr, result)
                    });
                    next_start = now + STAGGER;
                }
                continue;
            }
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            Some((addr, result)) = running.next() => {
                let error = match result {
                    Ok(conn) => return Ok((conn, addr)),
                    Err(e @ (Error::SessionExpired(_) | Error::AuthenticationFailed(_))) => {
                        return Err(e)
                    }
                    Err(Error::NotLeader(leader)) => {
                        let known = tried.iter().any(|(a, _)| *a == leader);
                        if !leader.is_empty() && !known && redirects < MAX_REDIRECTS {
                            redirects += 1;
                            queue.push_front(leader.clone());
                        }
                        Error::NotLeader(if leader.is_empty() {
                            "does not lead and knows of no leader".into()
                        } else {
                            format!("does not lead; the leader is at {leader}")
                        })
                    }
                    Err(e) => e,
                };
                answers.push((addr, error));
                // A failure frees its turn: the next address at once.
                next_start = Instant::now();
            }
            _ = sleep_until(next_start), if !queue.is_empty() => {}
            _ = sleep_until(deadline) => {
                // Still unanswered: the first attempt's own limit came too.
                break;
            }
        }
    }
    for (addr, started) in &tried {
        if !answers.iter().any(|(a, _)| a == addr) {
            let waited = deadline.saturating_duration_since(*started);
            answers.push((
                addr.clone(),
                Error::connect(addr, format!("no answer within {} ms", waited.as_millis())),
            ));
        }
    }
    Err(summary(answers))
}

/// One error for a search that found no leader, saying what each address
/// answered.
fn summary(mut answers: Vec<(String, Error)>) -> Error {
    if answers.len() == 1 {
        let (addr, e) = answers.pop().expect("one");
        return match e {
            Error::NotLeader(why) => Error::NotLeader(format!("{addr} {why}")),
            e => e,
        };
    }
    if answers.is_empty() {
        return Error::connect("", "no server address given");
    }
    let said = |e: &Error| match e {
        Error::NotLeader(why) => why.clone(),
        Error::Connect { reason, .. } => reason.clone(),
        other => other.to_string(),
    };
    let each = answers
        .iter()
        .map(|(addr, e)| format!("{addr}: {}", said(e)))
        .collect::<Vec<_>>()
        .join("; ");
    if answers
        .iter()
        .any(|(_, e)| matches!(e, Error::NotLeader(_)))
    {
        Error::NotLeader(format!(
            "no member leads right now, or the one named does not answer (an election under way, fewer than a majority of members up, or the leader paused); each member said: {each}"
        ))
    } else {
        Error::connect(&format!("any of the {} servers", answers.len()), each)
    }
}
