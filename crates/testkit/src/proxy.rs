//! A TCP proxy between a client and a server that can cut or stall connections.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use baton_client::Client;
use baton_proto::frame::HEADER_LEN;
use baton_proto::OpCode;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub(crate) struct ProxyConn {
    cut: Option<oneshot::Sender<()>>,
    /// Holds the bytes going to the server.
    hold_up: watch::Sender<bool>,
    /// Holds the bytes coming from the server.
    hold_down: watch::Sender<bool>,
}

#[derive(Default)]
pub(crate) struct ProxyShared {
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
) -> Vec<JoinHandle<baton_client::Result<baton_proto::Stat>>> {
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
