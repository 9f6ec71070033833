//! Baton's own protocol, one task per client connection: the first frame
//! (a handshake, a status probe or a backup request; `first.rs`), then
//! requests in and frames out (here), or a backup (`backup.rs`).
//!
//! The request loop itself is every front end's ([`super::conn`]); this
//! protocol's part is reading its frames ([`Native`]).

mod backup;
mod first;

use std::sync::Arc;

use baton_proto::{ErrorCode, RequestDecodeError, RequestFrame, SessionId};
use bytes::BytesMut;
use tracing::{debug, info, warn};

pub(crate) use super::conn::Conn;
use super::conn::{Dialect, Serving, CLOSE_GRACE};
use super::gate::Gated;
use super::socket::FrameError;
use crate::clock::Now;
use crate::core::Flow;
use crate::outbox::{Encode, NativeFrames, Out, Outbox};
use crate::stats::Stats;

/// What a request of wire operation `op` asks of the read gate.
pub(crate) fn gated(op: u8) -> Gated {
    use baton_proto::OpCode;
    match OpCode::from_u8(op) {
        Some(op) if op.is_change() => Gated::Change,
        Some(op) if op.heard_by_leader() => Gated::Confirm,
        _ => Gated::Read,
    }
}

/// Serves one accepted connection until it closes.
pub(crate) fn serve(mut conn: Box<Conn>) -> Serving<Native> {
    // Boxed (by `after`): the handshake's timers and buffers are freed once
    // it is done, instead of sizing every connection's task for them.
    Serving::after(async move {
        if let Err(e) = conn.socket.stream.set_nodelay(true) {
            debug!("cannot set TCP_NODELAY: {e}");
        }
        let outbox = Outbox::new();
        let session = conn.handshake(&outbox).await?;
        Some((*conn).serving(Native, session, outbox))
    })
}

/// Baton's own protocol, as a connection speaks it once its handshake is
/// done.
pub(crate) struct Native;

impl Encode for Native {
    fn frame(&mut self, out: &Out, buf: &mut BytesMut) {
        NativeFrames.frame(out, buf);
    }

    fn notice(&mut self, code: ErrorCode, message: &str, buf: &mut BytesMut) {
        NativeFrames.notice(code, message, buf);
    }
}

impl Dialect for Native {
    const NAME: &'static str = "connection";

    /// Handles every complete request frame in the read buffer, unless the
    /// client falls behind. Returns true when no more requests must be read.
    fn handle_buffered(
        &mut self,
        conn: &mut Conn,
        session: SessionId,
        outbox: &Arc<Outbox>,
    ) -> bool {
        let this = conn;
        while !this.backlogged(outbox) {
            // The header: xid (4 bytes), then the op code.
            if !this.gate_open(outbox, 5, |h| gated(h[4])) {
                return false;
            }
            let frame = match this.socket.next_frame(this.max_frame()) {
                Ok(Some(frame)) => frame,
                Ok(None) => return false,
                Err(FrameError::TooLarge(len)) => {
                    let message = format!(
                        "frame of {len} bytes exceeds the server's limit of {} bytes",
                        this.max_frame()
                    );
                    warn!(peer = %this.socket.peer(), %session, "closing: {message}");
                    Stats::add(&this.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::FrameTooLarge, message)), 0);
                    return true;
                }
                Err(FrameError::Io(e)) => {
                    warn!(peer = %this.socket.peer(), %session, "closing: unreadable frame: {e}");
                    Stats::add(&this.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::MalformedRequest, e.to_string())), 0);
                    return true;
                }
                Err(FrameError::Plaintext) => unreachable!("only the first frame is checked"),
            };
            Stats::add(&this.shared.stats.bytes_in, frame.len() as u64 + 4);
            let started = std::time::Instant::now();
            let flow = match RequestFrame::decode(frame) {
                Ok(request) => {
                    let flow = this.shared.core().handle(
                        session,
                        request,
                        outbox,
                        this.socket.identity(),
                        Now::real(),
                    );
                    let took = started.elapsed();
                    let stats = &this.shared.stats;
                    Stats::add(&stats.handle_ns, took.as_nanos() as u64);
                    stats.metrics.handle.observe_duration(took);
                    flow
                }
                Err(RequestDecodeError::NoHeader) => {
                    let message = "request frame shorter than its 5-byte header".to_string();
                    warn!(peer = %this.socket.peer(), %session, "closing: {message}");
                    Stats::add(&this.shared.stats.protocol_errors, 1);
                    outbox.close(Some((ErrorCode::MalformedRequest, message)), 0);
                    Flow::Stop
                }
                Err(RequestDecodeError::Reject {
                    xid,
                    op,
                    code,
                    message,
                }) => {
                    info!(peer = %this.socket.peer(), %session, xid, op, "rejected request: {code}: {message}");
                    Stats::add(&this.shared.stats.protocol_errors, 1);
                    this.shared
                        .core()
                        .reject(session, xid, op, code, message, outbox, Now::real())
                }
            };
            if flow == Flow::Stop {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod size_tests {
    /// An idle connection costs its task, which holds what it keeps between
    /// wake-ups (tokio rounds a task up to a multiple of 128 bytes; with
    /// `tokio_unstable` a future of at most 144 bytes keeps it at 256), and
    /// its outbox (48 bytes, in jemalloc's 64-byte class with its reference
    /// counts); each session and node is kept in a table, side by side in
    /// leaves of 32 (a node's entry of 96 bytes fills a 3,072-byte leaf
    /// exactly, one of 104 took a 3,584-byte one). These bounds are what
    /// docs/benchmarks.md's memory per session rests on: a field added
    /// carelessly shows up here first.
    #[test]
    fn idle_connection_and_state_stay_small() {
        fn size_of_fut<F: std::future::Future>(_: &F) -> usize {
            std::mem::size_of::<F>()
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let server = crate::Server::new(l, crate::Config::default()).unwrap();
            let conn = super::Conn::new(server.shared_for_test(), s);
            let fut = super::serve(conn);
            let zk = std::mem::size_of::<crate::front::conn::Serving<crate::front::zk::Zk>>();
            let sizes = [
                ("connection future", size_of_fut(&fut), 144),
                ("ZooKeeper connection future", zk, 144),
                ("connection state", std::mem::size_of::<super::Conn>(), 80),
                ("outbox", std::mem::size_of::<crate::outbox::Outbox>(), 48),
                ("node", std::mem::size_of::<crate::state::Node>(), 80),
                ("session", std::mem::size_of::<crate::state::Session>(), 48),
            ];
            for (what, size, most) in sizes {
                assert!(size <= most, "{what}: {size} bytes, more than {most}");
            }
        });
    }
}
