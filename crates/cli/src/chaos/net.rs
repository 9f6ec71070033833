//! The network between the servers of a chaos run, and between them and
//! their clients: a proxy on loopback in front of every member's peer port
//! and client port, so that links can be cut or slowed.
//!
//! A cut link carries nothing, as when a switch drops the packets:
//! connections stay open, bytes in flight are held, new connections are
//! taken but get no further; whoever is on either end sees timeouts, not
//! refusals. A link may be cut one way only: bytes still go the other way
//! on connections already open (a new one needs both ways). When the cut
//! heals, what was held goes through (as TCP would retransmit it), unless
//! an end gave up meanwhile. A slow link carries everything, each byte that
//! much later.
//!
//! Which member dialed a peer connection is read from its greeting (the
//! first frame a member sends: magic, version, its id); a connection to a
//! client port comes from a client.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::CliError;

/// The clients' side of a link to a member's client port.
pub const CLIENTS: u64 = 0;
/// A dialer that is neither a client nor a member this run started (one
/// whose greeting names no member): never cut.
const OUTSIDE: u64 = u64::MAX;

/// The directions that carry nothing now, and those that carry their bytes
/// late, each as (from, to).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Links {
    cut: BTreeSet<(u64, u64)>,
    slow: BTreeMap<(u64, u64), Duration>,
}

impl Links {
    /// Whether bytes from `from` to `to` are held.
    fn blocks(&self, from: u64, to: u64) -> bool {
        self.cut.contains(&(from, to))
    }

    /// Whether a link is cut either way.
    fn blocks_either(&self, a: u64, b: u64) -> bool {
        self.blocks(a, b) || self.blocks(b, a)
    }

    /// How late bytes from `from` to `to` arrive.
    fn delay(&self, from: u64, to: u64) -> Duration {
        self.slow.get(&(from, to)).copied().unwrap_or_default()
    }
}

/// Every (x, y) with x in `a`, y in `b`, x and y different.
fn pairs<'a>(a: &'a [u64], b: &'a [u64]) -> impl Iterator<Item = (u64, u64)> + 'a {
    a.iter()
        .flat_map(move |x| b.iter().map(move |y| (*x, *y)))
        .filter(|(x, y)| x != y)
}

/// The proxies of a run, and the links cut or slowed now.
pub struct Net {
    links: watch::Sender<Links>,
    proxies: std::sync::Mutex<JoinSet<()>>,
    live: Live,
}

/// How many connections the proxies hold now.
#[derive(Clone, Default)]
struct Live(Arc<AtomicUsize>);

impl Live {
    /// One more, until the guard is dropped.
    fn count(&self) -> LiveGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        LiveGuard(self.0.clone())
    }
}

struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Net {
    pub fn new() -> Arc<Net> {
        Arc::new(Net {
            links: watch::Sender::new(Links::default()),
            proxies: std::sync::Mutex::new(JoinSet::new()),
            live: Live::default(),
        })
    }

    /// A proxy in front of member `id`'s peer port `real`; its address.
    pub fn front_peer(self: &Arc<Net>, id: u64, real: &str) -> Result<String, CliError> {
        self.front(id, real, true)
    }

    /// A proxy in front of member `id`'s client port `real`; its address.
    pub fn front_client(self: &Arc<Net>, id: u64, real: &str) -> Result<String, CliError> {
        self.front(id, real, false)
    }

    fn front(self: &Arc<Net>, id: u64, real: &str, peer: bool) -> Result<String, CliError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(TcpListener::from_std)
            .map_err(|e| CliError::msg(format!("cannot bind a proxy on loopback: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| CliError::msg(e.to_string()))?
            .to_string();
        let (real, links) = (real.to_owned(), self.links.subscribe());
        let mut proxies = self.proxies.lock().expect("not poisoned");
        proxies.spawn(accept(listener, id, real, peer, links, self.live.clone()));
        Ok(addr)
    }

    /// Cuts every link between a member of `a` and a member of `b` (ids, or
    /// [`CLIENTS`]) both ways, in addition to those cut already.
    pub fn cut(&self, a: &[u64], b: &[u64]) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Holds whatever goes from a member of `from` to a member of `to`;
    /// the other way is left as it is.
    pub fn cut_one_way(&self, from: &[u64], to: &[u64]) {
        self.links
            .send_modify(|links| links.cut.extend(pairs(from, to)));
    }

    /// Makes every link between a member of `a` and a member of `b` carry
    /// its bytes `delay` late, each way.
    pub fn slow(&self, a: &[u64], b: &[u64], delay: Duration) {
        self.links.send_modify(|links| {
            for (x, y) in pairs(a, b) {
                links.slow.insert((x, y), delay);
                links.slow.insert((y, x), delay);
            }
        });
    }

    /// Heals the links between `a` and `b`, both ways: neither cut nor slow.
    pub fn heal(&self, a: &[u64], b: &[u64]) {
        let between =
            |(x, y): &(u64, u64)| a.contains(x) && b.contains(y) || a.contains(y) && b.contains(x);
        self.links.send_modify(|links| {
            links.cut.retain(|link| !between(link));
            links.slow.retain(|link, _| !between(link));
        });
    }

    /// Heals every link.
    pub fn heal_all(&self) {
        self.links.send_modify(|links| *links = Links::default());
    }

    /// How many connections the proxies hold now, set up or waiting for
    /// a cut to heal.
    #[cfg(test)]
    fn connections(&self) -> usize {
        self.live.0.load(Ordering::Relaxed)
    }

    /// Whether any link is cut or slow now.
    pub fn any_fault(&self) -> bool {
        let links = self.links.borrow();
        !links.cut.is_empty() || !links.slow.is_empty()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Ok(proxies) = self.proxies.get_mut() {
            proxies.abort_all();
        }
    }
}

/// Takes connections to a proxy in front of member `id` and forwards each
/// to `real`.
async fn accept(
    listener: TcpListener,
    id: u64,
    real: String,
    peer: bool,
    links: watch::Receiver<Links>,
    live: Live,
) {
    let mut forwarding = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                forwarding.spawn(forward(
                    inbound,
                    id,
                    real.clone(),
                    peer,
                    links.clone(),
                    live.clone(),
                ));
            }
            Some(_) = forwarding.join_next(), if !forwarding.is_empty() => {}
        }
    }
}

/// Most bytes of a member's greeting frame.
const MAX_GREETING: usize = 64;

/// One connection through a proxy: who dialed, then bytes both ways as the
/// link between the two ends allows.
async fn forward(
    mut inbound: TcpStream,
    id: u64,
    real: String,
    peer: bool,
    mut links: watch::Receiver<Links>,
    live: Live,
) {
    let _live = live.count();
    let _ = inbound.set_nodelay(true);
    // The dialer's first bytes, already read, go on ahead of the rest.
    let (from, first) = if peer {
        match greeting(&mut inbound).await {
            Some(found) => found,
            None => return,
        }
    } else {
        (CLIENTS, Vec::new())
    };
    // A connection needs both ways: through a link cut either way, it
    // waits for the cut to heal. Its dialer may give up meanwhile, as one
    // whose connection is never set up does: then it is dropped, having
    // reached nobody (and holds no descriptor until the heal).
    let mut first = first;
    if !set_up(&mut inbound, &mut first, &mut links, |l| {
        l.blocks_either(from, id)
    })
    .await
    {
        return;
    }
    let Some(mut outbound) = dial(&mut inbound, &mut first, &real).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    if outbound.write_all(&first).await.is_err() {
        return;
    }
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let there = pump(in_read, out_write, from, id, links.clone());
    let back = pump(out_read, in_write, id, from, links);
    tokio::pin!(there, back);
    // Neither Baton's clients nor its members half-close: a dialer that
    // closed is gone. Once what it sent has gone through (after the heal,
    // on a cut link) the connection ends, and a member that does not
    // answer (paused, say) does not keep it, and two descriptors, open
    // until it does; it reads what came and the end of it all the same.
    tokio::select! {
        () = &mut there => {}
        () = &mut back => there.await,
    }
}

/// Reads a member's greeting from `inbound`: the id it names (or
/// [`OUTSIDE`]) and the bytes read.
async fn greeting(inbound: &mut TcpStream) -> Option<(u64, Vec<u8>)> {
    let mut head = [0u8; 4];
    inbound.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes(head) as usize;
    let mut first = head.to_vec();
    if len > MAX_GREETING {
        return Some((OUTSIDE, first));
    }
    let mut body = vec![0u8; len];
    inbound.read_exact(&mut body).await.ok()?;
    first.extend_from_slice(&body);
    // magic (8 bytes), version (u16), the member's id (u64, little-endian)
    let from = match body.get(..18) {
        Some(b) if &b[..8] == b"BATNPEER" => {
            u64::from_le_bytes(b[10..18].try_into().expect("8 bytes"))
        }
        _ => OUTSIDE,
    };
    Some((if from == CLIENTS { OUTSIDE } else { from }, first))
}

/// Most bytes a connection not yet set up takes from its dialer before
/// the link heals.
const MAX_EARLY: usize = 64 * 1024;

/// Waits until `blocked` says no, taking into `first` what the dialer
/// sends meanwhile (up to [`MAX_EARLY`] bytes); false once the run is over
/// or if the dialer closed its end first.
async fn set_up(
    inbound: &mut TcpStream,
    first: &mut Vec<u8>,
    links: &mut watch::Receiver<Links>,
    blocked: impl Fn(&Links) -> bool,
) -> bool {
    dialer_waits(inbound, first, open(links, blocked)).await == Some(true)
}

/// How long the proxy still tries to reach a member for a dialer that
/// closed its end, having sent something, while the proxy connected: a
/// member that takes connections is reached at once (on loopback the
/// kernel completes the handshake), and the bytes go through as over a
/// connection set up at once; one whose queue of connections not yet
/// taken is full would not have let the dialer connect at all. Clients
/// dial a paused member some hundreds of times a second, each attempt
/// holding two descriptors here meanwhile: kept short.
const QUEUE_FULL: Duration = Duration::from_millis(250);

/// Connects to the member at `real` while the dialer waits, taking into
/// `first` what it sends meanwhile; `None` if the member cannot be reached
/// or the dialer is gone. A member whose queue of connections not yet
/// taken is full (one paused for seconds, with every client and member
/// dialing it again and again) leaves a connect pending for minutes: the
/// proxy must not hold the dialer's end, and two descriptors, that long
/// after the dialer gave up.
async fn dial(inbound: &mut TcpStream, first: &mut Vec<u8>, real: &str) -> Option<TcpStream> {
    let connect = TcpStream::connect(real);
    tokio::pin!(connect);
    match dialer_waits(inbound, first, &mut connect).await {
        Some(connected) => connected.ok(),
        None if !first.is_empty() => tokio::time::timeout(QUEUE_FULL, connect).await.ok()?.ok(),
        None => None,
    }
}

/// Runs `until` while the dialer at `inbound` waits for the connection to
/// be set up, taking into `first` what it sends meanwhile (up to
/// [`MAX_EARLY`] bytes); `None` if the dialer closed its end first.
async fn dialer_waits<T>(
    inbound: &mut TcpStream,
    first: &mut Vec<u8>,
    until: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(until);
    let mut buf = [0u8; 4096];
    loop {
        tokio::select! {
            done = &mut until => return Some(done),
            read = inbound.read(&mut buf), if first.len() < MAX_EARLY => match read {
                Ok(0) | Err(_) => return None,
                Ok(n) => first.extend_from_slice(&buf[..n]),
            },
        }
    }
}

/// Waits until `blocked` says no; false once the run is over.
async fn open(links: &mut watch::Receiver<Links>, blocked: impl Fn(&Links) -> bool) -> bool {
    loop {
        if !blocked(&links.borrow_and_update()) {
            return true;
        }
        if links.changed().await.is_err() {
            return false;
        }
    }
}

/// Chunks read and not yet written, per direction of a connection.
const IN_FLIGHT: usize = 64;

/// Copies `from` to `to` (bytes going from end `a` to end `b`): each chunk
/// as late as that way was slow when it was read, and nothing while that
/// way is cut (what was read by then is held).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    a: u64,
    b: u64,
    links: watch::Receiver<Links>,
) {
    let blocked = move |l: &Links| l.blocks(a, b);
    let (chunks, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let mut read_links = links.clone();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if !open(&mut read_links, blocked).await {
                return;
            }
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                // A cut while waiting: wait for it to heal before reading on.
                changed = read_links.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let at = Instant::now() + read_links.borrow().delay(a, b);
            // The writer gone (its end closed): nothing more to carry.
            if chunks.send((at, buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let mut write_links = links;
    let write = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if !open(&mut write_links, blocked).await || to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // The reader saw its end close: so does the other end, once what
        // was read before has gone through.
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Waits (up to 10 s) until the proxy holds `n` connections.
    async fn connections_fall_to(net: &Net, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while net.connections() != n {
            assert!(
                Instant::now() < deadline,
                "{} connections held",
                net.connections()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    fn hello(from: u64) -> Vec<u8> {
        let mut body = b"BATNPEER".to_vec();
        body.extend_from_slice(&2u16.to_le_bytes());
        body.extend_from_slice(&from.to_le_bytes());
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend(body);
        out
    }

    async fn echoes(conn: &mut TcpStream, what: &[u8]) -> bool {
        conn.write_all(what).await.unwrap();
        let mut got = vec![0u8; what.len()];
        tokio::time::timeout(Duration::from_millis(300), conn.read_exact(&mut got))
            .await
            .is_ok_and(|r| r.is_ok() && got == what)
    }

    /// A cut holds the bytes of a link that is open and of one opened
    /// during it, both ways, and only between the two ends cut; healing
    /// lets what was held through.
    #[tokio::test]
    async fn a_cut_holds_bytes_only_between_its_ends_until_it_heals() {
        let net = Net::new();
        let real = echo_server().await;
        let front = net.front_peer(2, &real).unwrap();
        let clients = net.front_client(2, &real).unwrap();
        let mut from1 = TcpStream::connect(&front).await.unwrap();
        let greeting1 = hello(1);
        assert!(echoes(&mut from1, &greeting1).await);
        let mut from3 = TcpStream::connect(&front).await.unwrap();
        assert!(echoes(&mut from3, &hello(3)).await);
        let mut client = TcpStream::connect(&clients).await.unwrap();
        assert!(echoes(&mut client, b"ping").await);

        net.cut(&[1], &[2]);
        assert!(net.any_fault());
        // Held, not lost: the echo comes after the heal.
        from1.write_all(b"held").await.unwrap();
        let mut got = [0u8; 4];
        let early = tokio::time::timeout(Duration::from_millis(300), from1.read_exact(&mut got));
        assert!(early.await.is_err(), "bytes crossed a cut link");
        // A connection opened during the cut gets nowhere either.
        let mut late = TcpStream::connect(&front).await.unwrap();
        assert!(!echoes(&mut late, &hello(1)).await);
        // Other links carry on.
        assert!(echoes(&mut from3, b"free").await);
        assert!(echoes(&mut client, b"free").await);
        net.cut(&[CLIENTS], &[2]);
        assert!(!echoes(&mut client, b"cut").await);

        net.heal_all();
        assert!(!net.any_fault());
        tokio::time::timeout(Duration::from_secs(5), from1.read_exact(&mut got))
            .await
            .expect("the held bytes after the heal")
            .unwrap();
        assert_eq!(&got, b"held");
        let mut held = vec![0u8; hello(1).len()];
        tokio::time::timeout(Duration::from_secs(5), late.read_exact(&mut held))
            .await
            .expect("the late connection's greeting after the heal")
            .unwrap();
        assert_eq!(held, hello(1));
        let mut cut_echo = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut cut_echo))
            .await
            .expect("the client's held bytes after the heal")
            .unwrap();
        assert_eq!(&cut_echo, b"cut");
    }

    #[test]
    fn healing_some_links_leaves_the_others_cut() {
        let net = Net::new();
        net.cut(&[1], &[2, 3]);
        net.cut(&[CLIENTS], &[2]);
        net.cut_one_way(&[4], &[5]);
        net.heal(&[2], &[1]);
        let cuts = net.links.borrow().clone();
        assert!(!cuts.blocks_either(1, 2));
        assert!(cuts.blocks(3, 1) && cuts.blocks(1, 3));
        assert!(cuts.blocks(2, CLIENTS) && cuts.blocks(CLIENTS, 2));
        assert!(cuts.blocks(4, 5) && !cuts.blocks(5, 4));
    }

    /// A slow link carries everything, late by its delay each way, and a
    /// stream of chunks keeps its order; healed, it is prompt again.
    #[tokio::test]
    async fn a_slow_link_delivers_everything_late_and_in_order() {
        let net = Net::new();
        let real = echo_server().await;
        let front = net.front_peer(2, &real).unwrap();
        let mut conn = TcpStream::connect(&front).await.unwrap();
        assert!(echoes(&mut conn, &hello(1)).await);
        let delay = Duration::from_millis(150);
        net.slow(&[1], &[2], delay);
        assert!(net.any_fault());
        let started = std::time::Instant::now();
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (mut read, mut write) = conn.into_split();
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(1000) {
                write.write_all(piece).await.unwrap();
            }
            (write, sent)
        });
        let mut got = vec![0u8; 200_000];
        tokio::time::timeout(Duration::from_secs(10), read.read_exact(&mut got))
            .await
            .expect("everything through the slow link")
            .unwrap();
        assert!(started.elapsed() >= 2 * delay, "{:?}", started.elapsed());
        let (write, sent) = writer.await.unwrap();
        assert_eq!(got, sent);
        net.heal(&[2], &[1]);
        assert!(!net.any_fault());
        let mut conn = read.reunite(write).unwrap();
        assert!(echoes(&mut conn, b"prompt").await);
    }

    /// A connection opened through a cut link and given up by its client
    /// before the heal is dropped at once, reaching nobody: clients that
    /// keep dialing through a long cut do not pile up descriptors.
    #[tokio::test]
    async fn a_connection_given_up_during_a_cut_is_dropped_at_once() {
        let net = Net::new();
        let real = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = net
            .front_client(2, &real.local_addr().unwrap().to_string())
            .unwrap();
        net.cut(&[CLIENTS], &[2]);
        let mut kept = TcpStream::connect(&front).await.unwrap();
        kept.write_all(b"kept").await.unwrap();
        for _ in 0..20 {
            let mut given_up = TcpStream::connect(&front).await.unwrap();
            given_up.write_all(b"hello").await.unwrap();
        }
        connections_fall_to(&net, 1).await;
        net.heal_all();
        let (mut member, _) = tokio::time::timeout(Duration::from_secs(5), real.accept())
            .await
            .expect("the connection kept open, after the heal")
            .unwrap();
        let mut got = [0u8; 4];
        member.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"kept");
        let none = tokio::time::timeout(Duration::from_millis(300), real.accept());
        assert!(
            none.await.is_err(),
            "a connection given up reached the member"
        );
    }

    /// A dialer that closes its connection to a member that does not answer
    /// (paused) does not leave the proxy holding it until the member does:
    /// the member still gets what was sent, and the end.
    #[tokio::test]
    async fn a_connection_its_dialer_closed_ends_though_the_member_is_silent() {
        let net = Net::new();
        let real = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = net
            .front_client(2, &real.local_addr().unwrap().to_string())
            .unwrap();
        for _ in 0..20 {
            let mut dialer = TcpStream::connect(&front).await.unwrap();
            dialer.write_all(b"hello").await.unwrap();
        }
        // The member takes the connections and reads nothing yet.
        let mut silent = Vec::new();
        for _ in 0..20 {
            let (member, _) = tokio::time::timeout(Duration::from_secs(5), real.accept())
                .await
                .expect("each connection reaches the member")
                .unwrap();
            silent.push(member);
        }
        connections_fall_to(&net, 0).await;
        // What was sent, and then the end, are there for it.
        for mut member in silent {
            let mut got = Vec::new();
            member.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"hello");
        }
    }

    /// A dialer that gives up on a member whose queue of connections not
    /// yet taken is full (a paused member that everyone dials again and
    /// again) is dropped at once, though the proxy's own connect to the
    /// member is still pending: in a 3-member run such connects, each
    /// holding two descriptors, once ran the run's own process out of open
    /// files within seconds.
    #[tokio::test]
    async fn a_dialer_that_gives_up_on_a_member_that_takes_no_connection_is_dropped() {
        let net = Net::new();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let real = socket.listen(1).unwrap();
        let addr = real.local_addr().unwrap().to_string();
        // Fill the member's queue: it takes no connection.
        let mut queued = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(&addr)).await
            {
                Ok(Ok(stream)) => queued.push(stream),
                Ok(Err(e)) => panic!("connecting to the silent member: {e}"),
                Err(_) => break,
            }
            assert!(queued.len() < 64, "the queue of connections never filled");
        }
        let front = net.front_client(2, &addr).unwrap();
        for _ in 0..20 {
            let mut dialer = TcpStream::connect(&front).await.unwrap();
            dialer.write_all(b"hello").await.unwrap();
        }
        connections_fall_to(&net, 0).await;
        drop(real);
    }

    /// A link cut one way still carries the other way on a connection
    /// already open; a new connection waits for the heal.
    #[tokio::test]
    async fn a_one_way_cut_holds_only_its_own_way() {
        let net = Net::new();
        let real = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = net
            .front_peer(2, &real.local_addr().unwrap().to_string())
            .unwrap();
        let mut dialer = TcpStream::connect(&front).await.unwrap();
        dialer.write_all(&hello(1)).await.unwrap();
        let (mut member, _) = real.accept().await.unwrap();
        let mut greeting = vec![0u8; hello(1).len()];
        member.read_exact(&mut greeting).await.unwrap();

        // 1 hears nothing from 2; 2 still hears 1.
        net.cut_one_way(&[2], &[1]);
        dialer.write_all(b"to 2").await.unwrap();
        let mut got = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), member.read_exact(&mut got))
            .await
            .expect("1 to 2 still goes")
            .unwrap();
        assert_eq!(&got, b"to 2");
        member.write_all(b"to 1").await.unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), dialer.read_exact(&mut got));
        assert!(early.await.is_err(), "bytes crossed the cut way");
        let mut late = TcpStream::connect(&front).await.unwrap();
        late.write_all(&hello(1)).await.unwrap();
        let no_connection = tokio::time::timeout(Duration::from_millis(300), real.accept());
        assert!(
            no_connection.await.is_err(),
            "a connection through a cut link"
        );

        net.heal(&[1], &[2]);
        tokio::time::timeout(Duration::from_secs(5), dialer.read_exact(&mut got))
            .await
            .expect("the held bytes after the heal")
            .unwrap();
        assert_eq!(&got, b"to 1");
        tokio::time::timeout(Duration::from_secs(5), real.accept())
            .await
            .expect("the late connection after the heal")
            .unwrap();
    }
}
