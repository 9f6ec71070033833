//! A small ZooKeeper client for `baton bench zookeeper` and `baton bench
//! reads`: what the lock recipes and the reads need (connect, create, get
//! children, exists and get data with a watch, set data, delete, ping), over `baton-zk`'s records, so that one client drives
//! Baton's ZooKeeper listener and a ZooKeeper server alike.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_zk::codes::{err, mode, op, xid};
use baton_zk::jute::JuteReader;
use baton_zk::{Acl, ConnectRequest, ConnectResponse, Create, ReplyHeader, Request};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::CliError;

/// A reply: its error code (0 for none) and body.
type Reply = (i32, Bytes);

/// Requests sent and not yet answered, in order, with where each answer
/// goes.
type Pending = Arc<Mutex<VecDeque<(i32, oneshot::Sender<Reply>)>>>;

/// A watch notification: its event type and path.
pub struct Event {
    pub kind: i32,
    pub path: String,
}

/// One ZooKeeper session on one connection.
///
/// Requests are encoded whole and handed to a writer task, so that a call
/// dropped while it waits (a run stopping) never leaves half a frame on the
/// connection that later calls go on using.
pub struct ZkClient {
    outgoing: Mutex<Outgoing>,
    pending: Pending,
    events: tokio::sync::Mutex<mpsc::UnboundedReceiver<Event>>,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
    pinger: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The next xid, and where whole frames go to be written (in xid order:
/// both are taken under one lock with the pending list).
struct Outgoing {
    next_xid: i32,
    frames: mpsc::UnboundedSender<Bytes>,
}

fn io(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::msg(format!("ZooKeeper client: {what}: {e}"))
}

/// Largest frame the benchmarks' clients take from a server: a node's data
/// is at most 64 MiB, with room for what frames it.
const MAX_FRAME: usize = 65 << 20;

/// One length-prefixed frame (ZooKeeper's framing, and Baton's): its
/// body. A length past [`MAX_FRAME`] is refused before anything is
/// allocated for it.
pub(super) async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Bytes> {
    let len = r.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the server sent a frame of {len} bytes, over the {MAX_FRAME} a benchmark client takes"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Bytes::from(body))
}

/// A ZooKeeper handshake asking for a new session with `timeout`, framed.
pub(super) fn new_session_request(timeout: Duration) -> BytesMut {
    let mut buf = BytesMut::new();
    ConnectRequest {
        protocol_version: 0,
        last_zxid_seen: 0,
        timeout_ms: timeout.as_millis() as i32,
        session_id: 0,
        passwd: Bytes::from_static(&[0; 16]),
        read_only: Some(false),
    }
    .encode(&mut buf);
    buf
}

impl ZkClient {
    /// Opens a session at `addr` with `timeout`.
    pub async fn connect(addr: &str, timeout: Duration) -> Result<Arc<ZkClient>, CliError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| io(&format!("cannot connect to {addr}"), e))?;
        stream.set_nodelay(true).map_err(|e| io("nodelay", e))?;
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        let buf = new_session_request(timeout);
        write.write_all(&buf).await.map_err(|e| io("connect", e))?;
        let answer = tokio::time::timeout(Duration::from_secs(30), read_frame(&mut read))
            .await
            .map_err(|_| io("connect", "no answer within 30 s"))?
            .map_err(|e| io("connect", e))?;
        let granted = ConnectResponse::decode(&answer).map_err(|e| io("connect response", e))?;
        if granted.timeout_ms <= 0 {
            return Err(io("connect", "the server refused the session"));
        }
        let pending: Pending = Arc::default();
        let (events_tx, events) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_loop(read, pending.clone(), events_tx));
        // At most one request per contender and its pings wait here.
        let (frames, to_write) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_loop(write, to_write));
        let client = Arc::new(ZkClient {
            outgoing: Mutex::new(Outgoing {
                next_xid: 1,
                frames,
            }),
            pending,
            events: tokio::sync::Mutex::new(events),
            reader,
            writer,
            pinger: Mutex::new(None),
        });
        // Pings keep the session alive while the client waits on a watch.
        let weak = Arc::downgrade(&client);
        let every = Duration::from_millis(granted.timeout_ms as u64 / 3);
        let pinger = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(client) = weak.upgrade() else { return };
                if client.send(xid::PING, &Request::Ping).is_err() {
                    return;
                }
            }
        });
        *client.pinger.lock().unwrap_or_else(|e| e.into_inner()) = Some(pinger);
        Ok(client)
    }

    /// Sends a request (whole, at once); returns where its reply comes.
    fn send(
        &self,
        fixed_xid: i32,
        request: &Request,
    ) -> Result<oneshot::Receiver<Reply>, CliError> {
        if self.reader.is_finished() {
            return Err(io("send", "the connection closed"));
        }
        let (tx, rx) = oneshot::channel();
        let mut out = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        let xid = if fixed_xid != 0 {
            fixed_xid
        } else {
            out.next_xid += 1;
            out.next_xid
        };
        let mut buf = BytesMut::new();
        request.encode(xid, &mut buf);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((xid, tx));
        out.frames
            .send(buf.freeze())
            .map_err(|_| io("send", "the connection closed"))?;
        Ok(rx)
    }

    async fn call(&self, request: &Request) -> Result<Reply, CliError> {
        let rx = self.send(0, request)?;
        rx.await
            .map_err(|_| io(op::name(request.op()), "the connection closed"))
    }

    /// Creates `path` with ZooKeeper create mode `flags`; the path made.
    pub async fn create(&self, path: &str, flags: i32) -> Result<String, CliError> {
        let request = Request::Create(Create {
            path: path.into(),
            data: Bytes::new(),
            acl: vec![Acl::open()],
            flags,
            ttl: None,
            op: op::CREATE,
        });
        match self.call(&request).await? {
            (0, body) => JuteReader::new(&body)
                .ustring("path")
                .map_err(|e| io("create", e)),
            (code, _) => Err(io("create", format!("error {code}"))),
        }
    }

    /// Creates a persistent node, or finds it there.
    pub async fn ensure(&self, path: &str) -> Result<(), CliError> {
        match self.create(path, mode::PERSISTENT).await {
            Ok(_) => Ok(()),
            Err(e)
                if e.to_string()
                    .contains(&format!("error {}", err::NODE_EXISTS)) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub async fn children(&self, path: &str, watch: bool) -> Result<Vec<String>, CliError> {
        let request = Request::GetChildren {
            path: path.into(),
            watch,
            stat: false,
        };
        match self.call(&request).await? {
            (0, body) => JuteReader::new(&body)
                .strings("children")
                .map_err(|e| io("get children", e)),
            (code, _) => Err(io("get children", format!("error {code}"))),
        }
    }

    /// Whether `path` exists, leaving a watch on it if `watch`.
    pub async fn exists(&self, path: &str, watch: bool) -> Result<bool, CliError> {
        let request = Request::Exists {
            path: path.into(),
            watch,
        };
        match self.call(&request).await? {
            (0, _) => Ok(true),
            (err::NO_NODE, _) => Ok(false),
            (code, _) => Err(io("exists", format!("error {code}"))),
        }
    }

    /// Reads `path`'s data (its length), leaving a watch on it if `watch`.
    pub async fn get_data(&self, path: &str, watch: bool) -> Result<usize, CliError> {
        let request = Request::GetData {
            path: path.into(),
            watch,
        };
        match self.call(&request).await? {
            (0, body) => JuteReader::new(&body)
                .buffer("data")
                .map(|d| d.len())
                .map_err(|e| io("get data", e)),
            (code, _) => Err(io("get data", format!("error {code}"))),
        }
    }

    /// Sets `path`'s data, whatever its version.
    pub async fn set_data(&self, path: &str, data: Bytes) -> Result<(), CliError> {
        let request = Request::SetData {
            path: path.into(),
            data,
            version: -1,
        };
        match self.call(&request).await? {
            (0, _) => Ok(()),
            (code, _) => Err(io("set data", format!("error {code}"))),
        }
    }

    pub async fn delete(&self, path: &str) -> Result<(), CliError> {
        let request = Request::Delete {
            path: path.into(),
            version: -1,
        };
        match self.call(&request).await? {
            (0, _) => Ok(()),
            (code, _) => Err(io("delete", format!("error {code}"))),
        }
    }

    /// The next watch notification.
    pub async fn event(&self) -> Option<Event> {
        self.events.lock().await.recv().await
    }

    /// Closes the session (its ephemeral nodes go with it).
    pub async fn close(&self) {
        if let Ok(rx) = self.send(0, &Request::CloseSession) {
            let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
        }
        if let Some(pinger) = self.pinger.lock().unwrap_or_else(|e| e.into_inner()).take() {
            pinger.abort();
        }
        self.reader.abort();
        self.writer.abort();
    }
}

async fn write_loop(mut half: OwnedWriteHalf, mut frames: mpsc::UnboundedReceiver<Bytes>) {
    while let Some(frame) = frames.recv().await {
        if half.write_all(&frame).await.is_err() {
            return;
        }
    }
}

async fn read_loop(
    mut read: BufReader<tokio::net::tcp::OwnedReadHalf>,
    pending: Pending,
    events: mpsc::UnboundedSender<Event>,
) {
    answer_all(&mut read, &pending, &events).await;
    // The connection is gone: calls waiting for replies fail rather than
    // wait for ever.
    pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

async fn answer_all(
    read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    pending: &Pending,
    events: &mpsc::UnboundedSender<Event>,
) {
    while let Ok(frame) = read_frame(read).await {
        let mut r = JuteReader::new(&frame);
        let Ok(header) = ReplyHeader::decode(&mut r) else {
            return;
        };
        if header.xid == xid::NOTIFICATION {
            let (Ok(kind), Ok(_state), Ok(path)) =
                (r.int("type"), r.int("state"), r.ustring("path"))
            else {
                return;
            };
            let _ = events.send(Event { kind, path });
            continue;
        }
        let waiter = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        match waiter {
            Some((x, tx)) if x == header.xid => {
                let _ = tx.send((header.err, frame.slice(ReplyHeader::LEN..)));
            }
            _ => return, // out of order: the connection is not usable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame is read whole; a length past the bound is refused before
    /// anything is allocated for it, naming what came.
    #[tokio::test]
    async fn a_frame_is_read_whole_and_an_oversized_one_refused() {
        let mut ok: &[u8] = &[0, 0, 0, 3, b'a', b'b', b'c'];
        assert_eq!(
            read_frame(&mut ok).await.unwrap(),
            Bytes::from_static(b"abc")
        );
        let mut huge: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        let e = read_frame(&mut huge).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("4294967295 bytes"), "{e}");
    }
}
