//! ZooKeeper's client protocol (`baton serve --zk-listen`), beside Baton's
//! own: existing ZooKeeper clients (kazoo, Curator, zkCli, the C and Rust
//! clients) and their recipes run on Baton's core unchanged.
//!
//! Each ZooKeeper request becomes the native request that does the same
//! ([`translate`]), handled by the same core, in the same order and under
//! the same guarantees (durability, linearizable reads, the read gate on a
//! cluster member); the few that Baton's protocol has no request for are
//! answered from the state under the core's lock, and carried in order by
//! a ping. Replies and events are written in ZooKeeper's form
//! ([`answer`]). A connection whose first four bytes are a four-letter
//! word gets its answer and is closed ([`words`]).
//!
//! docs/zookeeper.md lists every operation and every difference from
//! ZooKeeper's own server.

mod acl;
mod answer;
mod translate;
mod words;

use std::sync::Arc;

use baton_proto::{
    ConnectRequest as NativeConnect, ErrorCode, RequestFrame, SessionId, SessionSecret,
};
use baton_zk::codes::err;
use baton_zk::{ConnectRequest, ConnectResponse, Request, RequestError, RequestHeader};
use bytes::{Bytes, BytesMut};
use tokio::time::timeout;
use tracing::{debug, info, warn};

use self::answer::{Answer, Answers, Pending};
use self::translate::Plan;
use super::conn::{Conn, Dialect, Serving, CLOSE_GRACE};
use super::gate::{received, Gated};
use super::socket::FrameError;
use crate::clock::Now;
use crate::core::{Connected, Connecting, Core, Flow};
use crate::outbox::{Encode, Out, Outbox};
use crate::stats::Stats;

/// Most bytes of a connect request (a few fields and a 16-byte password).
const MAX_CONNECT_FRAME: usize = 1024;

/// How far a new connection's native xids start past the session's last
/// change: far enough that none can be taken for a request of an earlier
/// connection still on its way (ZooKeeper's clients send nothing twice).
const XID_GAP: u32 = 1 << 24;

/// Serves one accepted connection on the ZooKeeper port until it closes.
pub(crate) fn serve(mut conn: Box<Conn>) -> Serving<Zk> {
    Serving::after(async move {
        if let Err(e) = conn.socket.stream.set_nodelay(true) {
            debug!("cannot set TCP_NODELAY: {e}");
        }
        let outbox = Outbox::new();
        let (session, zk) = handshake(&mut conn, &outbox).await?;
        Some((*conn).serving(zk, session, outbox))
    })
}

/// What a connection's first bytes asked for.
enum First {
    Word(&'static str),
    Connect(Bytes),
}

/// Reads the first frame (after TLS, if the server takes TLS only): a
/// four-letter word or a connect request.
async fn first(conn: &mut Conn) -> Result<Option<First>, FrameError> {
    let mut spare = 0;
    if let Some(config) = conn.shared.tls() {
        let count = received(&mut conn.gate, &mut spare);
        if !conn
            .socket
            .accept_tls(config, &conn.shared.stats, count)
            .await?
        {
            return Ok(None);
        }
    }
    let count = received(&mut conn.gate, &mut spare);
    if !conn
        .socket
        .read_at_least(4, count)
        .await
        .map_err(FrameError::Io)?
    {
        return Ok(None);
    }
    let head: [u8; 4] = conn.socket.rbuf.bytes()[..4].try_into().expect("4 bytes");
    if let Some(word) = baton_zk::words::word(head) {
        return Ok(Some(First::Word(word)));
    }
    let count = received(&mut conn.gate, &mut spare);
    Ok(conn
        .socket
        .read_frame(MAX_CONNECT_FRAME, count)
        .await?
        .map(First::Connect))
}

/// Answers a four-letter word or a connect request. Returns the session and
/// the connection's protocol state once a session is attached.
async fn handshake(conn: &mut Conn, outbox: &Arc<Outbox>) -> Option<(SessionId, Zk)> {
    let limit = conn.shared.config.handshake_timeout;
    let mut shutdown = conn.shared.stopping.subscribe();
    if *shutdown.borrow_and_update() {
        return None;
    }
    let frame = tokio::select! {
        r = timeout(limit, first(conn)) => match r {
            Ok(Ok(Some(First::Connect(frame)))) => frame,
            Ok(Ok(Some(First::Word(word)))) => {
                words::answer(conn, word).await;
                return None;
            }
            Ok(Ok(None)) => return None,
            Ok(Err(FrameError::TooLarge(len))) => {
                warn!(peer = %conn.socket.peer(), len, "closing: ZooKeeper connect request of {len} bytes; not a ZooKeeper client?");
                Stats::add(&conn.shared.stats.protocol_errors, 1);
                return None;
            }
            Ok(Err(FrameError::Plaintext)) => {
                info!(peer = %conn.socket.peer(), "refusing a plaintext ZooKeeper client: this server takes TLS connections only (ZooKeeper clients: zookeeper.client.secure=true)");
                Stats::add(&conn.shared.stats.protocol_errors, 1);
                return None;
            }
            Ok(Err(FrameError::Io(e))) => {
                debug!(peer = %conn.socket.peer(), "ZooKeeper connection failed before its handshake: {e}");
                return None;
            }
            Err(_) => {
                info!(peer = %conn.socket.peer(), "closing: no ZooKeeper connect request within {} ms", limit.as_millis());
                return None;
            }
        },
        _ = shutdown.changed() => return None,
    };
    let request = match ConnectRequest::decode(&frame) {
        Ok(r) => r,
        Err(e) => {
            warn!(peer = %conn.socket.peer(), "closing: bad ZooKeeper connect request: {e}");
            Stats::add(&conn.shared.stats.protocol_errors, 1);
            return None;
        }
    };
    // A cluster member serves only while it leads or serves as a follower,
    // and confirms it first (as for Baton's own handshake); one that does
    // not closes the connection, and the client tries the next server of
    // its connect string.
    if conn.shared.replicated {
        let resuming = (request.session_id != 0).then_some(SessionId(request.session_id as u64));
        let barrier = conn.shared.core().read_barrier(resuming);
        let proven = tokio::select! {
            r = timeout(limit, barrier) => matches!(r, Ok(Ok(()))),
            _ = shutdown.changed() => return None,
        };
        if !proven {
            debug!(peer = %conn.socket.peer(), "ZooKeeper client sent on: this member does not lead");
            return None;
        }
    }
    let resume = match request.session_id {
        0 => None,
        id => match <[u8; 16]>::try_from(&request.passwd[..]) {
            Ok(secret) => Some((SessionId(id as u64), SessionSecret(secret))),
            Err(_) => {
                expired(conn, "a password that is not 16 bytes").await;
                return None;
            }
        },
    };
    let native = NativeConnect {
        version: baton_proto::PROTOCOL_VERSION,
        timeout_ms: request.timeout_ms.max(0) as u32,
        resume,
        token: None,
        // As the server is configured: linearizably (every read waits for a
        // barrier), or sequentially, as ZooKeeper's followers read. Either
        // way the zxid they saw is refused as ZooKeeper refuses it when this
        // server is behind it, and they try another server.
        read_mode: conn.shared.config.zk_read_mode,
        last_seen: request.last_zxid_seen.max(0) as u64,
    };
    let connecting = conn.shared.core().connect(&native, outbox, Now::real());
    let connected = match connecting {
        Ok(Connecting::Done(connected)) => Ok(connected),
        Ok(Connecting::Pending(waiting)) => tokio::select! {
            r = timeout(limit, waiting) => match r {
                Ok(Ok(result)) => result,
                _ => Err((ErrorCode::NotLeader, String::new())),
            },
            _ = shutdown.changed() => return None,
        },
        Err(refused) => Err(refused),
    };
    let Connected { grant, revision } = match connected {
        Ok(connected) => connected,
        Err((ErrorCode::SessionExpired, message)) => {
            conn.shared.core().detach(SessionId(0), outbox);
            expired(conn, &message).await;
            return None;
        }
        Err((code, message)) => {
            debug!(peer = %conn.socket.peer(), %code, "ZooKeeper session refused: {message}");
            conn.shared.core().detach(SessionId(0), outbox);
            return None;
        }
    };
    let session = grant.session_id;
    if let Some(gate) = &mut conn.gate {
        gate.sequential = native.read_mode == baton_proto::ReadMode::Sequential;
    }
    if !conn.wait_durable(revision, outbox).await {
        conn.shared.core().detach(session, outbox);
        return None;
    }
    let last_xid = conn
        .shared
        .core()
        .sm()
        .session(session)
        .and_then(|s| s.last_reply(session))
        .map_or(0, |last| last.xid);
    debug!(peer = %conn.socket.peer(), %session, resumed = grant.resumed, timeout_ms = grant.timeout_ms, "ZooKeeper session attached");
    ConnectResponse {
        protocol_version: 0,
        timeout_ms: grant.timeout_ms as i32,
        session_id: session.0 as i64,
        passwd: Bytes::copy_from_slice(&grant.secret.0),
        read_only: false,
    }
    .encode(conn.socket.wbuf.get());
    if let Err(e) = conn.socket.write_all(&conn.shared.stats).await {
        debug!(peer = %conn.socket.peer(), %session, "could not send the ZooKeeper connect response: {e}");
        conn.shared.core().detach(session, outbox);
        return None;
    }
    let peer_ip = conn
        .socket
        .stream
        .peer_addr()
        .map_or_else(|_| String::new(), |a| a.ip().to_string());
    let mut ids = vec![("ip".into(), peer_ip)];
    // A client certificate an identity's tls-client name is valid for
    // proves that identity, as ZooKeeper's x509 authentication does: no
    // addAuth needed, and ACL entries `x509:NAME` name it.
    let by_certificate = conn
        .shared
        .config
        .identities
        .as_ref()
        .and_then(|identities| {
            let cert = conn.socket.peer_certificate()?;
            identities.find_by_certificate(cert)
        });
    if let Some(identity) = by_certificate {
        debug!(peer = %conn.socket.peer(), identity = %identity.name, "ZooKeeper client proved an identity by its certificate");
        ids.push(("x509".into(), identity.name.clone()));
        conn.socket.set_identity(identity);
    }
    Some((
        session,
        Zk(Box::new(State {
            answers: Answers::default(),
            next_xid: last_xid.wrapping_add(XID_GAP),
            ids,
        })),
    ))
}

/// Tells a client its session is gone (a connect response with timeout 0),
/// best effort, and logs why.
async fn expired(conn: &mut Conn, why: &str) {
    debug!(peer = %conn.socket.peer(), "ZooKeeper session expired: {why}");
    ConnectResponse::expired().encode(conn.socket.wbuf.get());
    let _ = timeout(CLOSE_GRACE, conn.socket.write_all(&conn.shared.stats)).await;
}

/// A ZooKeeper connection's protocol state.
pub(crate) struct Zk(Box<State>);

struct State {
    /// Requests handled and not yet answered.
    answers: Answers,
    /// The native xid of the next request.
    next_xid: u32,
    /// Who the client is, for nodes' lists and whoAmI: its address, then
    /// what it proved with addAuth (`digest` and its digest id).
    ids: Vec<(String, String)>,
}

impl Encode for Zk {
    fn frame(&mut self, out: &Out, buf: &mut BytesMut) {
        self.0.answers.frame(out, buf);
    }

    fn notice(&mut self, code: ErrorCode, message: &str, buf: &mut BytesMut) {
        self.0.answers.notice(code, message, buf);
    }
}

impl Dialect for Zk {
    const NAME: &'static str = "ZooKeeper connection";

    fn handle_buffered(
        &mut self,
        conn: &mut Conn,
        session: SessionId,
        outbox: &Arc<Outbox>,
    ) -> bool {
        while !conn.backlogged(outbox) {
            // The header: xid, then the op code (4 bytes each). Pings and
            // syncs wait for a barrier in every read mode (a sync's answer
            // promises the reads after it are up to date, and a ping's that
            // the leader heard from the session).
            if !conn.gate_open(outbox, 8, |h| {
                let code = i32::from_be_bytes(h[4..8].try_into().expect("4 bytes"));
                if translate::is_change(code) {
                    Gated::Change
                } else if translate::confirms(code) {
                    Gated::Confirm
                } else {
                    Gated::Read
                }
            }) {
                return false;
            }
            let frame = match conn.socket.next_frame(conn.max_frame()) {
                Ok(Some(frame)) => frame,
                Ok(None) => return false,
                Err(FrameError::TooLarge(len)) => {
                    warn!(peer = %conn.socket.peer(), %session, "closing: ZooKeeper frame of {len} bytes exceeds the server's limit of {} bytes", conn.max_frame());
                    Stats::add(&conn.shared.stats.protocol_errors, 1);
                    outbox.close(None, 0);
                    return true;
                }
                Err(FrameError::Io(e)) => {
                    warn!(peer = %conn.socket.peer(), %session, "closing: unreadable ZooKeeper frame: {e}");
                    Stats::add(&conn.shared.stats.protocol_errors, 1);
                    outbox.close(None, 0);
                    return true;
                }
                Err(FrameError::Plaintext) => unreachable!("only the first frame is checked"),
            };
            Stats::add(&conn.shared.stats.bytes_in, frame.len() as u64 + 4);
            let started = std::time::Instant::now();
            let flow = match Request::decode(&frame) {
                Ok((header, request)) => self.handle(conn, session, outbox, header, request),
                Err(RequestError::NoHeader(len)) => {
                    warn!(peer = %conn.socket.peer(), %session, "closing: ZooKeeper request of {len} bytes, shorter than its header");
                    Stats::add(&conn.shared.stats.protocol_errors, 1);
                    outbox.close(None, 0);
                    Flow::Stop
                }
                Err(e @ RequestError::UnknownOp { header, .. }) => {
                    info!(peer = %conn.socket.peer(), %session, "refused a ZooKeeper request: {e}");
                    Stats::add(&conn.shared.stats.protocol_errors, 1);
                    self.local(conn, session, outbox, header, Err(err::UNIMPLEMENTED))
                }
                Err(e @ RequestError::Malformed { header, .. }) => {
                    info!(peer = %conn.socket.peer(), %session, "refused a ZooKeeper request: {e}");
                    Stats::add(&conn.shared.stats.protocol_errors, 1);
                    self.local(conn, session, outbox, header, Err(err::MARSHALLING_ERROR))
                }
            };
            let took = started.elapsed();
            Stats::add(&conn.shared.stats.handle_ns, took.as_nanos() as u64);
            conn.shared.stats.metrics.handle.observe_duration(took);
            if flow == Flow::Stop {
                return true;
            }
        }
        false
    }
}

impl Zk {
    fn handle(
        &mut self,
        conn: &mut Conn,
        session: SessionId,
        outbox: &Arc<Outbox>,
        header: RequestHeader,
        request: Request,
    ) -> Flow {
        match request {
            Request::Auth { scheme, auth } => {
                let result = self.auth(conn, &scheme, &auth);
                return self.local(conn, session, outbox, header, result.map(|()| Bytes::new()));
            }
            Request::WhoAmI => {
                let body = translate::who_am_i(&self.0.ids);
                return self.local(conn, session, outbox, header, Ok(body));
            }
            _ => {}
        }
        let identity = conn.socket.identity();
        if conn.shared.config.identities.is_some()
            && identity.is_none()
            && !matches!(request, Request::Ping | Request::CloseSession)
        {
            // Not authenticated yet on a server that checks identities.
            let mut core = conn.shared.core();
            return self.send(
                &mut core,
                session,
                outbox,
                None,
                header,
                baton_proto::Request::Ping,
                Answer::Local(Err(err::NO_AUTH)),
            );
        }
        let mut core = conn.shared.core();
        let caller = acl::Caller {
            identity,
            ids: &self.0.ids,
        };
        match translate::plan(&core, session, &caller, request) {
            Plan::Native(request, answer) => self.send(
                &mut core, session, outbox, identity, header, request, answer,
            ),
            Plan::Local(result) => self.send(
                &mut core,
                session,
                outbox,
                identity,
                header,
                baton_proto::Request::Ping,
                Answer::Local(result),
            ),
            Plan::Watches(again, set) => {
                for request in again {
                    if self.send(
                        &mut core,
                        session,
                        outbox,
                        identity,
                        header,
                        request,
                        Answer::Quiet,
                    ) == Flow::Stop
                    {
                        return Flow::Stop;
                    }
                }
                self.send(
                    &mut core,
                    session,
                    outbox,
                    identity,
                    header,
                    set,
                    Answer::Plain,
                )
            }
        }
    }

    /// Hands one native request to the core, noting how its reply is to be
    /// written.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        core: &mut Core,
        session: SessionId,
        outbox: &Arc<Outbox>,
        identity: Option<&crate::auth::Identity>,
        header: RequestHeader,
        request: baton_proto::Request,
        answer: Answer,
    ) -> Flow {
        let native = self.0.next_xid;
        self.0.next_xid = native.wrapping_add(1);
        let aversion = request.path().map_or(0, |p| core.sm().acl(p).1);
        self.0.answers.pending.push_back(Pending {
            native,
            xid: header.xid,
            op: header.op,
            answer,
            aversion,
        });
        core.handle(
            session,
            RequestFrame {
                xid: native,
                request,
            },
            outbox,
            identity,
            Now::real(),
        )
    }

    /// Answers a request with `result` (a body or an error code), in order.
    fn local(
        &mut self,
        conn: &Conn,
        session: SessionId,
        outbox: &Arc<Outbox>,
        header: RequestHeader,
        result: Result<Bytes, i32>,
    ) -> Flow {
        let mut core = conn.shared.core();
        self.send(
            &mut core,
            session,
            outbox,
            conn.socket.identity(),
            header,
            baton_proto::Request::Ping,
            Answer::Local(result),
        )
    }

    /// addAuth: a `digest` credential `user:password` names the identity
    /// `user` whose token is `password`, on a server that checks
    /// identities; on one that does not, it is taken as it is (it only
    /// shows in whoAmI). Other schemes fail.
    fn auth(&mut self, conn: &mut Conn, scheme: &str, auth: &[u8]) -> Result<(), i32> {
        let peer = conn.socket.peer();
        let refuse = |why: &str| {
            info!(%peer, scheme, "ZooKeeper authentication failed: {why}");
            Err(err::AUTH_FAILED)
        };
        if scheme != "digest" {
            return refuse("Baton takes the digest scheme only (user:password)");
        }
        let Some((user, password)) = std::str::from_utf8(auth)
            .ok()
            .and_then(|a| a.split_once(':'))
        else {
            return refuse("a digest credential is user:password");
        };
        if let Some(identities) = &conn.shared.config.identities {
            match identities.find(password.as_bytes()) {
                Some(identity) if identity.name == user => conn.socket.set_identity(identity),
                _ => return refuse(&format!("no identity {user} with that token")),
            }
        }
        let id = acl::digest_id(user, password);
        if !self.0.ids.iter().any(|(s, i)| s == "digest" && *i == id) {
            self.0.ids.push(("digest".into(), id));
        }
        Ok(())
    }
}
