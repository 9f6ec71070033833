//! A raw protocol client, for feeding the server bytes by hand.

use std::net::SocketAddr;

use baton_proto::frame::HEADER_LEN;
use baton_proto::{
    ConnectRequest, ConnectResponse, Disconnect, ErrorCode, ErrorReply, Reply, ReplyFrame, Request,
    RequestFrame, ServerMessage, SessionGrant, WatchEvent, MAX_RESPONSE_FRAME,
};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::within;

/// A client that speaks the protocol by hand, frame by frame, so tests can
/// send what a real client never would and read exactly what comes back.
pub struct Raw {
    pub stream: TcpStream,
    rbuf: BytesMut,
    next_xid: u32,
    /// The session granted by [`Raw::open`] or a successful handshake.
    pub grant: Option<SessionGrant>,
    /// Watch events read while waiting for replies.
    pub events: Vec<WatchEvent>,
}

impl Raw {
    /// A TCP connection, no handshake yet.
    pub async fn connect(addr: &str) -> Raw {
        let stream = within(10, "raw connect", TcpStream::connect(addr))
            .await
            .expect("raw connect");
        Raw::from_stream(stream)
    }

    /// A TCP connection whose receive buffer is as small as the kernel allows,
    /// so that a client that does not read stops absorbing bytes early.
    pub async fn connect_small_buffer(addr: &str) -> Raw {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let addr: SocketAddr = addr.parse().expect("socket address");
        let stream = within(10, "raw connect", socket.connect(addr))
            .await
            .expect("raw connect");
        Raw::from_stream(stream)
    }

    fn from_stream(stream: TcpStream) -> Raw {
        let _ = stream.set_nodelay(true);
        Raw {
            stream,
            rbuf: BytesMut::new(),
            next_xid: 0,
            grant: None,
            events: Vec::new(),
        }
    }

    /// Connects and opens a new session with `timeout_ms`.
    pub async fn open(addr: &str, timeout_ms: u32) -> Raw {
        let mut raw = Raw::connect(addr).await;
        let response = raw.handshake(&ConnectRequest::new(timeout_ms)).await;
        raw.grant = Some(response.result.expect("handshake accepted"));
        raw
    }

    /// Connects and resumes the session of `grant`.
    pub async fn resume(addr: &str, grant: &SessionGrant) -> (Raw, ConnectResponse) {
        let mut raw = Raw::connect(addr).await;
        let mut request = ConnectRequest::new(grant.timeout_ms);
        request.resume = Some((grant.session_id, grant.secret));
        let response = raw.handshake(&request).await;
        if let Ok(g) = &response.result {
            raw.grant = Some(g.clone());
        }
        (raw, response)
    }

    pub fn grant(&self) -> &SessionGrant {
        self.grant.as_ref().expect("a session was granted")
    }

    /// Sends a connect request and reads the answer.
    pub async fn handshake(&mut self, request: &ConnectRequest) -> ConnectResponse {
        let mut buf = BytesMut::new();
        request.encode(&mut buf);
        self.write(&buf).await;
        let frame = self
            .read_frame()
            .await
            .expect("a handshake answer before the connection closed");
        ConnectResponse::decode(frame).expect("a decodable handshake answer")
    }

    /// Writes bytes as they are.
    pub async fn write(&mut self, bytes: &[u8]) {
        within(10, "a raw write", self.stream.write_all(bytes))
            .await
            .expect("raw write");
    }

    /// Writes one frame: a length prefix and `payload`.
    pub async fn write_frame(&mut self, payload: &[u8]) {
        let mut buf = BytesMut::with_capacity(payload.len() + HEADER_LEN);
        buf.put_u32(payload.len() as u32);
        buf.put_slice(payload);
        self.write(&buf).await;
    }

    pub fn next_xid(&mut self) -> u32 {
        self.next_xid += 1;
        self.next_xid
    }

    /// Encodes a request with a fresh xid; returns the xid.
    pub fn encode(&mut self, request: Request, buf: &mut BytesMut) -> u32 {
        let xid = self.next_xid();
        RequestFrame { xid, request }.encode(buf);
        xid
    }

    /// Sends a request with a fresh xid and returns the xid.
    pub async fn send(&mut self, request: Request) -> u32 {
        let mut buf = BytesMut::new();
        let xid = self.encode(request, &mut buf);
        self.write(&buf).await;
        xid
    }

    /// Sends a request and waits for its reply; events read on the way are
    /// kept in `events`.
    pub async fn call(&mut self, request: Request) -> Result<Reply, ErrorReply> {
        let xid = self.send(request).await;
        self.reply_to(xid).await.result
    }

    /// Reads until the reply to `xid`, keeping events; panics on anything
    /// else.
    pub async fn reply_to(&mut self, xid: u32) -> ReplyFrame {
        loop {
            match self.next_message().await {
                Some(ServerMessage::Reply(r)) => {
                    assert_eq!(r.xid, xid, "replies come in request order");
                    return r;
                }
                Some(ServerMessage::Event(e)) => self.events.push(e),
                Some(ServerMessage::Disconnect(d)) => {
                    panic!("disconnected while waiting for xid {xid}: {d:?}")
                }
                None => panic!("connection closed while waiting for xid {xid}"),
            }
        }
    }

    /// The next frame, decoded; `None` once the server closed the connection.
    pub async fn next_message(&mut self) -> Option<ServerMessage> {
        let frame = self.read_frame().await?;
        Some(ServerMessage::decode(frame).expect("a decodable server frame"))
    }

    /// Expects a disconnect notice next (events before it are kept), then the
    /// end of the connection; returns the notice.
    pub async fn expect_disconnect(&mut self) -> Disconnect {
        loop {
            match self.next_message().await {
                Some(ServerMessage::Disconnect(d)) => {
                    self.expect_closed().await;
                    return d;
                }
                Some(ServerMessage::Event(e)) => self.events.push(e),
                Some(ServerMessage::Reply(r)) => {
                    panic!("expected a disconnect notice, got a reply {r:?}")
                }
                None => panic!("connection closed without a disconnect notice"),
            }
        }
    }

    /// Expects the server to close the connection without sending anything.
    pub async fn expect_closed(&mut self) {
        if let Some(frame) = self.read_frame().await {
            panic!("expected the connection to close, got a frame {frame:?}");
        }
    }

    /// The next frame's payload; `None` at end of stream or on a reset.
    /// Panics if nothing happens for 10 s.
    pub async fn read_frame(&mut self) -> Option<Bytes> {
        within(10, "a frame from the server", async {
            loop {
                if self.rbuf.len() >= HEADER_LEN {
                    let len =
                        u32::from_be_bytes(self.rbuf[..HEADER_LEN].try_into().unwrap()) as usize;
                    assert!(len <= MAX_RESPONSE_FRAME, "server frame of {len} bytes");
                    if self.rbuf.len() >= HEADER_LEN + len {
                        self.rbuf.advance(HEADER_LEN);
                        return Some(self.rbuf.split_to(len).freeze());
                    }
                }
                match self.stream.read_buf(&mut self.rbuf).await {
                    Ok(0) | Err(_) => {
                        assert!(
                            self.rbuf.is_empty(),
                            "connection closed inside a frame ({} bytes left)",
                            self.rbuf.len()
                        );
                        return None;
                    }
                    Ok(_) => {}
                }
            }
        })
        .await
    }
}

/// The code of a failed reply; panics on success.
pub fn error_code(result: Result<Reply, ErrorReply>) -> ErrorCode {
    match result {
        Ok(reply) => panic!("expected an error reply, got {reply:?}"),
        Err(e) => e.code,
    }
}
