//! Helpers shared by the integration tests: a real server on 127.0.0.1 (port
//! 0), a TCP proxy that can cut or stall connections, a raw protocol client
//! for feeding the server bytes by hand, and deadline-bounded waits.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use baton::proto::frame::HEADER_LEN;
use baton::proto::{
    ConnectRequest, ConnectResponse, Disconnect, ErrorCode, ErrorReply, OpCode, Reply, ReplyFrame,
    Request, RequestFrame, ServerMessage, SessionGrant, WatchEvent, MAX_RESPONSE_FRAME,
};
use baton::server::{Config, Server, ServerHandle};
use baton::{Client, SessionState};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub struct TestServer {
    pub addr: SocketAddr,
    pub handle: ServerHandle,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with_config(fast_config()).await
    }

    pub async fn with_config(config: Config) -> Self {
        Self::at("127.0.0.1:0", config).await
    }

    /// A server on `addr` (a fixed port, to restart a server where its
    /// clients look for it).
    pub async fn at(addr: &str, config: Config) -> Self {
        count_panics();
        let server = Server::bind(addr, config).await.expect("bind");
        let addr = server.local_addr().unwrap();
        let handle = server.handle();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            server
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("server ran");
        });
        TestServer {
            addr,
            handle,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    pub fn stats(&self) -> baton::server::StatsSnapshot {
        self.handle.stats()
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.addr()).await.expect("connect")
    }

    pub async fn client_with_timeout(&self, timeout: Duration) -> Client {
        connect_with_timeout(&self.addr(), timeout).await
    }

    /// True while the server's task is still running (it did not panic or
    /// return).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the server and waits for it to finish; panics if it panicked.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            within(30, "the server to stop", task)
                .await
                .expect("server task");
        }
    }
}

/// Session timeouts allowed down to 100 ms, so expiry tests take moments.
pub fn fast_config() -> Config {
    Config {
        min_session_timeout: Duration::from_millis(100),
        ..Config::default()
    }
}

pub async fn connect_with_timeout(addr: &str, timeout: Duration) -> Client {
    Client::builder(addr)
        .session_timeout(timeout)
        .connect()
        .await
        .expect("connect")
}

/// Polls the async `check` until it returns true, failing after `secs`
/// seconds.
pub async fn eventually_async<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    within(secs, what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Waits for `fut`, failing the test if it takes longer than `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs} s waiting for {what}"),
    }
}

/// Polls `check` until it returns true, failing after `secs` seconds.
pub async fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    within(secs, what, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Waits until `client`'s session is in state `want`.
pub async fn wait_state(client: &Client, want: SessionState) {
    let mut rx = client.state_changes();
    within(
        10,
        &format!("session state {want}"),
        rx.wait_for(|s| *s == want),
    )
    .await
    .expect("the session task published its state");
}

// ---------------------------------------------------------------------------
// Panics: a server task that panics is caught by tokio and simply vanishes, so
// tests count panics themselves. A `#[tokio::test]` runs the server's tasks on
// the test's own thread, which is named after the test: counting panics per
// thread name tells one test's server panics from everything else.

static PANICS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);
static HOOK: Once = Once::new();

fn thread_key() -> String {
    let t = std::thread::current();
    t.name()
        .map_or_else(|| format!("{:?}", t.id()), str::to_owned)
}

fn count_panics() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let mut map = PANICS.lock().unwrap_or_else(|e| e.into_inner());
            *map.get_or_insert_with(HashMap::new)
                .entry(thread_key())
                .or_default() += 1;
            drop(map);
            previous(info);
        }));
    });
}

/// Panics seen so far on this test's thread (where a current-thread runtime
/// runs the server's connection tasks).
pub fn panics_on_this_thread() -> usize {
    let map = PANICS.lock().unwrap_or_else(|e| e.into_inner());
    map.as_ref()
        .and_then(|m| m.get(&thread_key()).copied())
        .unwrap_or(0)
}

/// Checks that the server still serves: no panic so far, its task runs, and a
/// fresh client can write, read and close.
pub async fn assert_server_healthy(server: &TestServer) {
    assert_eq!(panics_on_this_thread(), 0, "a task panicked");
    assert!(server.is_running(), "the server task ended");
    let c = within(10, "a fresh client to connect", server.client()).await;
    let path = format!("/health-{}", c.session_id().0);
    within(10, "a fresh client to work", async {
        c.create(&path, "ok", baton::CreateMode::Ephemeral)
            .await
            .expect("create");
        let (data, _) = c.get_data(&path).await.expect("get");
        assert_eq!(&data[..], b"ok");
        c.close().await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// Proxy

struct ProxyConn {
    cut: Option<oneshot::Sender<()>>,
    /// Holds the bytes going to the server.
    hold_up: watch::Sender<bool>,
    /// Holds the bytes coming from the server.
    hold_down: watch::Sender<bool>,
}

#[derive(Default)]
struct ProxyShared {
    blocked: AtomicBool,
    /// New connections start with their replies held.
    hold_new_replies: AtomicBool,
    /// New connections are cut when a request with this operation code
    /// comes along (0: never).
    cut_at: std::sync::atomic::AtomicU8,
    conns: Mutex<Vec<ProxyConn>>,
}

/// A TCP proxy in front of a server. It can sever every current connection,
/// stall them (hold their bytes in both directions), and refuse new ones
/// (accept and close at once), to imitate a network that fails.
pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<ProxyShared>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(ProxyShared::default());
        let task = tokio::spawn(accept_loop(listener, upstream, shared.clone()));
        Proxy { addr, shared, task }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Closes every connection open now, on both sides.
    pub fn sever(&self) {
        let conns = std::mem::take(&mut *self.shared.conns.lock().unwrap());
        for mut c in conns {
            if let Some(cut) = c.cut.take() {
                let _ = cut.send(());
            }
        }
    }

    /// Stops forwarding on every connection open now: bytes wait in the
    /// proxy, and neither end hears from the other. New connections are not
    /// affected.
    pub fn hold(&self) {
        for c in self.shared.conns.lock().unwrap().iter() {
            c.hold_up.send_replace(true);
            c.hold_down.send_replace(true);
        }
    }

    /// Like [`hold`](Self::hold), in one direction only: the server hears
    /// nothing from its clients, while they still hear from it.
    pub fn hold_requests(&self) {
        for c in self.shared.conns.lock().unwrap().iter() {
            c.hold_up.send_replace(true);
        }
    }

    /// Like [`hold`](Self::hold), in one direction only: clients hear nothing
    /// from the server, while it still hears them.
    pub fn hold_replies(&self) {
        for c in self.shared.conns.lock().unwrap().iter() {
            c.hold_down.send_replace(true);
        }
    }

    /// Like [`hold_replies`](Self::hold_replies), and new connections start
    /// out the same way: the server hears every request (a resume's handshake
    /// included) while its clients hear nothing, until
    /// [`release`](Self::release).
    pub fn hold_replies_everywhere(&self) {
        self.shared.hold_new_replies.store(true, Ordering::SeqCst);
        self.hold_replies();
    }

    /// Lets every held byte through, in both directions, and stops holding
    /// new connections' replies.
    pub fn release(&self) {
        self.shared.hold_new_replies.store(false, Ordering::SeqCst);
        for c in self.shared.conns.lock().unwrap().iter() {
            c.hold_up.send_replace(false);
            c.hold_down.send_replace(false);
        }
    }

    /// From now on, a new connection is cut (on both sides) as soon as the
    /// client sends a request for `op`, before the server sees it: the same
    /// request fails with a connection loss however often it is retried.
    pub fn cut_at(&self, op: OpCode) {
        self.shared.cut_at.store(op as u8, Ordering::SeqCst);
    }

    /// Undoes [`cut_at`](Self::cut_at) for connections made from now on.
    pub fn stop_cutting(&self) {
        self.shared.cut_at.store(0, Ordering::SeqCst);
    }

    /// From now on new connections are accepted and closed at once.
    pub fn block(&self) {
        self.shared.blocked.store(true, Ordering::SeqCst);
    }

    pub fn unblock(&self) {
        self.shared.blocked.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.sever();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<ProxyShared>) {
    loop {
        let Ok((down, _)) = listener.accept().await else {
            return;
        };
        if shared.blocked.load(Ordering::SeqCst) {
            drop(down);
            continue;
        }
        let (cut_tx, cut_rx) = oneshot::channel();
        let (hold_up, hold_up_rx) = watch::channel(false);
        let (hold_down, hold_down_rx) =
            watch::channel(shared.hold_new_replies.load(Ordering::SeqCst));
        shared.conns.lock().unwrap().push(ProxyConn {
            cut: Some(cut_tx),
            hold_up,
            hold_down,
        });
        let cut_at = shared.cut_at.load(Ordering::SeqCst);
        tokio::spawn(async move {
            let Ok(up) = TcpStream::connect(upstream).await else {
                return;
            };
            let (down_r, down_w) = down.into_split();
            let (up_r, up_w) = up.into_split();
            let requests = async move {
                if cut_at == 0 {
                    pump(down_r, up_w, hold_up_rx).await
                } else {
                    pump_requests(down_r, up_w, hold_up_rx, cut_at).await
                }
            };
            tokio::select! {
                _ = requests => {}
                _ = pump(up_r, down_w, hold_down_rx) => {}
                _ = cut_rx => {}
            }
        });
    }
}

/// Copies requests frame by frame until either side closes, or until one for
/// operation `cut_at` comes (it is not passed on). The first frame, the
/// handshake, always passes.
async fn pump_requests(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut hold: watch::Receiver<bool>,
    cut_at: u8,
) {
    let mut buf = BytesMut::new();
    let mut handshake = true;
    loop {
        while buf.len() >= HEADER_LEN {
            let len = u32::from_be_bytes(buf[..HEADER_LEN].try_into().unwrap()) as usize;
            if buf.len() < HEADER_LEN + len {
                break;
            }
            let frame = buf.split_to(HEADER_LEN + len);
            // A request's payload starts with its xid (4 bytes), then its op.
            if !handshake && frame.get(HEADER_LEN + 4) == Some(&cut_at) {
                return;
            }
            handshake = false;
            if hold.wait_for(|held| !*held).await.is_err() || to.write_all(&frame).await.is_err() {
                return;
            }
        }
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Copies bytes one way until either side closes; while `hold` is true,
/// nothing moves.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut hold: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if hold.wait_for(|held| !*held).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if hold.wait_for(|held| !*held).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Stalls `client`'s connection through `proxy` with writes waiting in
/// line: the proxy holds every byte, and 32 writes of 1 MiB to `path` (an
/// existing node) fill the socket and then the client's write buffer, so a
/// request made next waits for room. Each write is polled once here, in
/// order, so that all of them are in (or sent ahead of) the line before this
/// returns; they then go on in tasks of their own, returned to be awaited
/// after [`Proxy::release`].
pub async fn stall_behind_big_writes(
    client: &Client,
    proxy: &Proxy,
    path: &str,
) -> Vec<JoinHandle<baton::Result<baton::Stat>>> {
    proxy.hold();
    let data = Bytes::from(vec![0u8; 1 << 20]);
    let mut writes: Vec<_> = (0..32)
        .map(|_| {
            let (client, data, path) = (client.clone(), data.clone(), path.to_owned());
            Box::pin(tokio::task::unconstrained(async move {
                client.set_data(&path, data, None).await
            }))
        })
        .collect();
    for write in &mut writes {
        assert!(futures::poll!(write.as_mut()).is_pending());
    }
    writes.into_iter().map(tokio::spawn).collect()
}

// ---------------------------------------------------------------------------
// Raw protocol client

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

/// Runs client calls concurrently, but makes each call in the order given:
/// every future is polled once, in order, before any is awaited. A client
/// call hands its request to the session task on its first poll, unless
/// tokio's cooperative budget runs out first, so the calls run unconstrained;
/// `join_all` alone would not poll them in order. At most 1,024 calls per
/// client (its queue's capacity). Returns the outputs in the same order.
pub async fn join_in_order<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs
        .into_iter()
        .map(|f| Box::pin(futures::future::maybe_done(tokio::task::unconstrained(f))))
        .collect();
    for f in &mut futs {
        let _ = futures::poll!(f.as_mut());
    }
    futures::future::join_all(futs.iter_mut().map(|f| f.as_mut())).await;
    futs.into_iter()
        .map(|mut f| f.as_mut().take_output().expect("every call finished"))
        .collect()
}

/// Runs `fut` like a caller that is never late: it is polled once now, and
/// after that from inside its own waker, at the very moment it is woken (on
/// whichever thread wakes it). This makes races between "a call is answered"
/// and "the client publishes its state" deterministic: the call's result is
/// computed exactly when the answer is released. Await the receiver for the
/// output.
pub fn poll_when_woken<F>(fut: F) -> oneshot::Receiver<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let eager = Arc::new(Eager {
        state: Mutex::new(EagerState {
            fut: Some(Box::pin(tokio::task::unconstrained(fut))),
            tx: Some(tx),
            polling: false,
            again: false,
        }),
    });
    eager.run();
    rx
}

struct Eager<F: Future> {
    state: Mutex<EagerState<F>>,
}

struct EagerState<F: Future> {
    fut: Option<std::pin::Pin<Box<tokio::task::Unconstrained<F>>>>,
    tx: Option<oneshot::Sender<F::Output>>,
    /// A poll is under way (a wake from inside it asks for another).
    polling: bool,
    again: bool,
}

impl<F: Future> Eager<F>
where
    F: Send + 'static,
    F::Output: Send + 'static,
{
    fn run(self: &Arc<Self>) {
        let waker = std::task::Waker::from(self.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut st = self.state.lock().unwrap();
        if st.polling {
            st.again = true;
            return;
        }
        st.polling = true;
        loop {
            st.again = false;
            let Some(mut fut) = st.fut.take() else { break };
            drop(st);
            let poll = fut.as_mut().poll(&mut cx);
            st = self.state.lock().unwrap();
            match poll {
                std::task::Poll::Ready(output) => {
                    if let Some(tx) = st.tx.take() {
                        let _ = tx.send(output);
                    }
                    break;
                }
                std::task::Poll::Pending => {
                    st.fut = Some(fut);
                    if !st.again {
                        break;
                    }
                }
            }
        }
        st.polling = false;
    }
}

impl<F: Future> std::task::Wake for Eager<F>
where
    F: Send + 'static,
    F::Output: Send + 'static,
{
    fn wake(self: Arc<Self>) {
        self.run();
    }
}

// ---------------------------------------------------------------------------
// Data directories

/// A fresh data directory under the system's temporary directory, removed
/// on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("baton-test-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A durable server configuration on `dir`.
pub fn durable_config(dir: &std::path::Path) -> Config {
    Config {
        data_dir: Some(dir.to_owned()),
        ..fast_config()
    }
}
