//! Watchers for `baton bench reads`' fan-out that speak the wire protocol
//! (Baton's, or ZooKeeper's) on a socket of their own, with nothing between
//! the socket and the clock: each is one task reading one connection, so
//! that the time until the last watcher is told is the server's more than
//! a client library's (a library adds a session task and channels per
//! notification, and the benchmark's process shares the machine's cores
//! with the servers).

use std::time::Duration;

use baton_proto::{
    ConnectRequest, ErrorCode, ReadMode, Reply, Request, RequestFrame, ServerMessage,
};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::CliError;

/// Bytes each watcher buffers as it reads: a notification is small, and
/// there are ten thousand watchers.
const READ_BUFFER: usize = 256;

/// How long opening a session or answering a request may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// One watcher's connection.
pub(super) struct RawWatcher {
    stream: BufReader<TcpStream>,
    xid: u32,
    zookeeper: bool,
}

fn failed(what: &str, why: impl std::fmt::Display) -> CliError {
    CliError::msg(format!("raw watcher: {what}: {why}"))
}

async fn dial(addr: &str) -> Result<BufReader<TcpStream>, CliError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| failed(&format!("cannot connect to {addr}"), e))?;
    stream.set_nodelay(true).map_err(|e| failed("nodelay", e))?;
    Ok(BufReader::with_capacity(READ_BUFFER, stream))
}

async fn frame(stream: &mut BufReader<TcpStream>) -> Result<Bytes, CliError> {
    super::zk_client::read_frame(stream)
        .await
        .map_err(|e| failed("read", e))
}

async fn answer(stream: &mut BufReader<TcpStream>) -> Result<Bytes, CliError> {
    tokio::time::timeout(ANSWER_WITHIN, frame(stream))
        .await
        .map_err(|_| failed("read", format!("no answer within {ANSWER_WITHIN:?}")))?
}

impl RawWatcher {
    /// A Baton session in `mode` with `timeout`, on the member of `addrs`
    /// at `first` (mod their number) or, if that one sends its clients to
    /// the leader, on the leader it names.
    pub(super) async fn baton(
        addrs: &[String],
        first: usize,
        mode: ReadMode,
        timeout: Duration,
    ) -> Result<RawWatcher, CliError> {
        let mut addr = addrs[first % addrs.len()].clone();
        let mut refusals = Vec::new();
        for _ in 0..2 * addrs.len() {
            let mut stream = dial(&addr).await?;
            let mut buf = BytesMut::new();
            ConnectRequest {
                read_mode: mode,
                ..ConnectRequest::new(timeout.as_millis() as u32)
            }
            .encode(&mut buf);
            stream
                .write_all(&buf)
                .await
                .map_err(|e| failed("connect", e))?;
            let response = baton_proto::ConnectResponse::decode(answer(&mut stream).await?)
                .map_err(|e| failed("connect response", e))?;
            match response.result {
                Ok(_) => {
                    return Ok(RawWatcher {
                        stream,
                        xid: 0,
                        zookeeper: false,
                    })
                }
                Err((ErrorCode::NotLeader, leader)) if !leader.is_empty() => {
                    refusals.push(format!("{addr}: not the leader"));
                    addr = leader;
                }
                Err((code, message)) => {
                    refusals.push(format!("{addr}: {code}: {message}"));
                    addr = addrs[(first + refusals.len()) % addrs.len()].clone();
                }
            }
        }
        Err(failed("connect", refusals.join("; ")))
    }

    /// A ZooKeeper session with `timeout` at `addr`.
    pub(super) async fn zookeeper(addr: &str, timeout: Duration) -> Result<RawWatcher, CliError> {
        let mut stream = dial(addr).await?;
        let buf = super::zk_client::new_session_request(timeout);
        stream
            .write_all(&buf)
            .await
            .map_err(|e| failed("connect", e))?;
        let granted = baton_zk::ConnectResponse::decode(&answer(&mut stream).await?)
            .map_err(|e| failed("connect response", e))?;
        if granted.timeout_ms <= 0 {
            return Err(failed("connect", format!("{addr} refused the session")));
        }
        Ok(RawWatcher {
            stream,
            xid: 0,
            zookeeper: true,
        })
    }

    async fn send(&mut self, buf: BytesMut) -> Result<(), CliError> {
        self.stream
            .write_all(&buf)
            .await
            .map_err(|e| failed("write", e))
    }

    /// Reads `path`'s data, leaving a watch on it; returns once the read is
    /// answered.
    pub(super) async fn watch(&mut self, path: &str) -> Result<(), CliError> {
        self.xid += 1;
        let mut buf = BytesMut::new();
        if self.zookeeper {
            baton_zk::Request::GetData {
                path: path.into(),
                watch: true,
            }
            .encode(self.xid as i32, &mut buf);
        } else {
            RequestFrame {
                xid: self.xid,
                request: Request::GetData {
                    path: path.into(),
                    watch: true,
                },
            }
            .encode(&mut buf);
        }
        self.send(buf).await?;
        loop {
            let payload = answer(&mut self.stream).await?;
            if self.answers(payload)? {
                return Ok(());
            }
        }
    }

    /// Whether `payload` is the answer to the last request (an error if it
    /// refuses it); a notification left over from before is passed over.
    fn answers(&self, payload: Bytes) -> Result<bool, CliError> {
        if self.zookeeper {
            let mut r = baton_zk::jute::JuteReader::new(&payload);
            let header = baton_zk::ReplyHeader::decode(&mut r).map_err(|e| failed("reply", e))?;
            if header.xid == baton_zk::codes::xid::NOTIFICATION {
                return Ok(false);
            }
            if header.err != 0 {
                return Err(failed("get data", format!("error {}", header.err)));
            }
            return Ok(header.xid == self.xid as i32);
        }
        match ServerMessage::decode(payload).map_err(|e| failed("reply", e))? {
            ServerMessage::Reply(reply) if reply.xid == self.xid => match reply.result {
                Ok(Reply::GetData { .. }) => Ok(true),
                other => Err(failed("get data", format!("{other:?}"))),
            },
            ServerMessage::Disconnect(d) => Err(failed(
                "closed by the server",
                format!("{}: {}", d.code, d.message),
            )),
            _ => Ok(false),
        }
    }

    /// Waits for the next notification.
    pub(super) async fn changed(&mut self) -> Result<(), CliError> {
        loop {
            let payload = frame(&mut self.stream).await?;
            let event = if self.zookeeper {
                let mut r = baton_zk::jute::JuteReader::new(&payload);
                baton_zk::ReplyHeader::decode(&mut r)
                    .map_err(|e| failed("notification", e))?
                    .xid
                    == baton_zk::codes::xid::NOTIFICATION
            } else {
                match ServerMessage::decode(payload).map_err(|e| failed("notification", e))? {
                    ServerMessage::Event(_) => true,
                    ServerMessage::Disconnect(d) => {
                        return Err(failed(
                            "closed by the server",
                            format!("{}: {}", d.code, d.message),
                        ))
                    }
                    ServerMessage::Reply(_) => false,
                }
            };
            if event {
                return Ok(());
            }
        }
    }

    /// Ends the session (waiting a little for the answer).
    pub(super) async fn close(mut self) {
        self.xid += 1;
        let mut buf = BytesMut::new();
        if self.zookeeper {
            baton_zk::Request::CloseSession.encode(self.xid as i32, &mut buf);
        } else {
            RequestFrame {
                xid: self.xid,
                request: Request::CloseSession,
            }
            .encode(&mut buf);
        }
        if self.send(buf).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(1), frame(&mut self.stream)).await;
        }
    }
}
