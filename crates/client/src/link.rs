//! The sending side of a session, shared by the session task and every
//! [`Client`](crate::Client) handle.
//!
//! A caller writes its own request: it encodes the frame into the write
//! buffer, remembers it as pending and writes the buffer to the socket
//! without waiting, all under one short lock. Only what the socket does not
//! take at once is left to the session task, which waits for the socket to
//! drain. A request therefore costs no wake-up of another task on its way
//! out; the session task wakes for what comes back.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use baton_proto::{Request, RequestFrame};
use bytes::BytesMut;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::error::Error;
use crate::pending::{Pending, Registration, ReplySlot};
use crate::wire::Wire;

/// Most bytes buffered for writing before new requests wait.
pub(crate) const WRITE_LIMIT: usize = 4 << 20;

pub(crate) struct Link {
    out: Mutex<Outbound>,
    /// Wakes the session task: bytes are left for it to write, a write
    /// failed, a close was asked for while disconnected, or every handle is
    /// gone.
    pub(crate) kick: Notify,
    /// Wakes the first caller in line for room in the write buffer.
    room: Notify,
    /// The line of callers waiting for room, first come first served.
    line: tokio::sync::Mutex<()>,
}

/// A caller's place in the line for room; given up when its call is.
struct InLine<'a>(&'a Link);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.lock().queued -= 1;
    }
}

/// Where requests go now.
pub(crate) enum Route {
    /// Written to this connection.
    Up(Arc<Wire>),
    /// Kept until the session is resumed on a new connection.
    Down,
    /// Refused: the session is over.
    Ended(Error),
}

/// A request made while disconnected.
pub(crate) struct Deferred {
    pub(crate) request: Request,
    pub(crate) reply: ReplySlot,
    pub(crate) watch: Option<Registration>,
}

pub(crate) struct Outbound {
    pub(crate) route: Route,
    /// Encoded frames the socket has not taken yet.
    pub(crate) wbuf: BytesMut,
    /// Requests written and not yet answered, in the order written.
    pub(crate) pending: VecDeque<Pending>,
    /// Requests made while disconnected, sent once reconnected.
    pub(crate) deferred: VecDeque<Deferred>,
    next_xid: u32,
    /// When bytes last went to the socket.
    pub(crate) last_sent: Instant,
    /// When the last request that the leader hears of (a change, a ping, a
    /// sync: [`OpCode::heard_by_leader`](baton_proto::OpCode)) was written.
    pub(crate) last_heard_by_leader: Instant,
    /// Whether output waits for the socket (plaintext, or TLS records).
    pub(crate) unsent: bool,
    /// Callers of `close`: once any is here, the close is under way (sent if
    /// connected) and new requests are refused.
    pub(crate) closing: Vec<oneshot::Sender<()>>,
    /// Why a write failed; the session task ends the connection.
    pub(crate) broken: Option<String>,
    /// Every `Client` handle is gone: leave the session to expire.
    pub(crate) dropped: bool,
    /// Callers in line for room: a new call goes behind them.
    queued: usize,
}

impl Link {
    pub(crate) fn new() -> Self {
        Link {
            out: Mutex::new(Outbound {
                route: Route::Down,
                wbuf: BytesMut::new(),
                pending: VecDeque::new(),
                deferred: VecDeque::new(),
                next_xid: 0,
                last_sent: Instant::now(),
                last_heard_by_leader: Instant::now(),
                unsent: false,
                closing: Vec::new(),
                broken: None,
                dropped: false,
                queued: 0,
            }),
            kick: Notify::new(),
            room: Notify::new(),
            line: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Outbound> {
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a caller's request, or keeps it while disconnected, or answers
    /// it at once if the session is over or closing. Waits only while the
    /// write buffer is full, and then in line: requests go out in the order
    /// their calls were made.
    pub(crate) async fn submit(
        &self,
        request: Request,
        reply: ReplySlot,
        watch: Option<Registration>,
    ) {
        let mut job = Some((request, reply, watch));
        {
            let mut out = self.lock();
            if out.queued == 0 && self.admit(&mut out, &mut job) {
                return;
            }
            out.queued += 1;
        }
        let _place = InLine(self);
        let _turn = self.line.lock().await;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            // Registered before the buffer is looked at: a drain in between
            // still wakes this caller.
            room.as_mut().enable();
            if self.admit(&mut self.lock(), &mut job) {
                return;
            }
            room.await;
        }
    }

    /// Takes the request in `job` unless it must wait for room.
    fn admit(
        &self,
        out: &mut Outbound,
        job: &mut Option<(Request, ReplySlot, Option<Registration>)>,
    ) -> bool {
        let full = matches!(out.route, Route::Up(_)) && out.wbuf.len() >= WRITE_LIMIT;
        if full && out.closing.is_empty() {
            return false;
        }
        let Some((request, reply, watch)) = job.take() else {
            return true;
        };
        if !out.closing.is_empty() {
            let _ = reply.send(Err(Error::Closed));
            return true;
        }
        match &out.route {
            Route::Ended(error) => {
                let _ = reply.send(Err(error.clone()));
            }
            Route::Down => out.deferred.push_back(Deferred {
                request,
                reply,
                watch,
            }),
            Route::Up(_) => {
                out.push(request, Some(reply), watch);
                self.flush(out);
            }
        }
        true
    }

    /// Ends the session: sends the close if connected (the session task
    /// answers `done` once the server has), or has the session task give up
    /// the reconnect. `done` is answered at once if the session is over.
    pub(crate) fn close(&self, done: oneshot::Sender<()>) {
        let mut out = self.lock();
        match out.route {
            Route::Ended(_) => {
                let _ = done.send(());
                return;
            }
            Route::Up(_) if out.closing.is_empty() => {
                out.push(Request::CloseSession, None, None);
                self.flush(&mut out);
            }
            Route::Up(_) | Route::Down => {}
        }
        out.closing.push(done);
        drop(out);
        self.kick.notify_one();
        // Callers waiting for room are answered now: no request goes after
        // a close.
        self.room.notify_waiters();
    }

    /// Whether the session is over for this client.
    pub(crate) fn is_ended(&self) -> bool {
        matches!(self.lock().route, Route::Ended(_))
    }

    /// Every `Client` handle is gone.
    pub(crate) fn handles_dropped(&self) {
        self.lock().dropped = true;
        self.kick.notify_one();
    }

    /// Writes what the socket takes now. Leaves the rest, or a failure, to
    /// the session task, and wakes callers waiting for room.
    pub(crate) fn flush(&self, out: &mut Outbound) {
        let Route::Up(writer) = &out.route else {
            return;
        };
        let full = out.wbuf.len() >= WRITE_LIMIT;
        if out.broken.is_none() {
            let before = out.wbuf.len();
            let writer = writer.clone();
            match writer.write_now(&mut out.wbuf) {
                Ok(done) => out.unsent = !done,
                Err(e) => out.broken = Some(format!("write failed: {e}")),
            }
            if out.wbuf.len() < before {
                out.last_sent = Instant::now();
            }
        }
        if out.unsent || out.broken.is_some() {
            self.kick.notify_one();
        }
        if full && out.wbuf.len() < WRITE_LIMIT {
            self.room.notify_waiters();
        }
    }

    /// Takes the connection away: requests wait for the next one. Returns
    /// the requests it left unanswered and the callers of `close`.
    pub(crate) fn down(&self) -> (VecDeque<Pending>, Vec<oneshot::Sender<()>>) {
        let mut out = self.lock();
        out.route = Route::Down;
        out.wbuf.clear();
        out.unsent = false;
        out.broken = None;
        let taken = (
            std::mem::take(&mut out.pending),
            std::mem::take(&mut out.closing),
        );
        drop(out);
        // Callers waiting for room now keep their requests for later.
        self.room.notify_waiters();
        taken
    }

    /// Ends the session for good: every request kept, and every later
    /// one, is answered with `error`.
    pub(crate) fn end(&self, error: &Error) {
        let mut out = self.lock();
        out.route = Route::Ended(error.clone());
        let deferred = std::mem::take(&mut out.deferred);
        let closing = std::mem::take(&mut out.closing);
        drop(out);
        self.room.notify_waiters();
        for d in deferred {
            let _ = d.reply.send(Err(error.clone()));
        }
        for done in closing {
            let _ = done.send(());
        }
    }
}

impl Outbound {
    fn next_xid(&mut self) -> u32 {
        self.next_xid = self.next_xid.wrapping_add(1);
        self.next_xid
    }

    /// Encodes a request into the write buffer and remembers it. A request
    /// with no reply slot is the session's own (a ping, a watch reset, a
    /// close, the delete of an orphan); only the last is sent again after a
    /// broken connection.
    pub(crate) fn push(
        &mut self,
        request: Request,
        reply: Option<ReplySlot>,
        watch: Option<Registration>,
    ) {
        let xid = self.next_xid();
        let frame = RequestFrame { xid, request };
        frame.encode(&mut self.wbuf);
        self.written(&frame.request);
        let again = reply.is_some() || matches!(frame.request, Request::Delete { .. });
        self.pending.push_back(Pending {
            xid,
            sent: Instant::now(),
            request: again.then_some(frame.request),
            sends: 1,
            reply,
            watch,
        });
    }

    /// Notes a request written.
    fn written(&mut self, request: &Request) {
        if request.op().heard_by_leader() {
            self.last_heard_by_leader = Instant::now();
        }
    }

    /// Sends again, with their own xids, the requests the last connection
    /// left unanswered.
    pub(crate) fn resend(&mut self, unanswered: VecDeque<Pending>) {
        for mut p in unanswered {
            let Some(request) = p.request.take() else {
                continue;
            };
            let frame = RequestFrame {
                xid: p.xid,
                request,
            };
            frame.encode(&mut self.wbuf);
            self.written(&frame.request);
            p.request = Some(frame.request);
            p.sent = Instant::now();
            p.sends += 1;
            self.pending.push_back(p);
        }
    }
}

/// Queues the deletes of orphaned queue nodes: a node nobody waits with
/// would block its queue until the session ends.
pub(crate) fn push_orphan_deletes(out: &mut Outbound, orphans: &mut Vec<String>) {
    for path in orphans.drain(..) {
        let delete = Request::Delete {
            path,
            version: None,
            fence: None,
        };
        out.push(delete, None, None);
    }
}
