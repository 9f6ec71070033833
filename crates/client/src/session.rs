//! The session task: the reading side of a client's connection.
//!
//! Callers write their own requests (pipelined, tagged with an xid; see
//! [`Link`](crate::link::Link)). The task matches replies to them in order,
//! dispatches watch events, finishes writes the socket did not take at once,
//! pings when the connection is quiet, and when the connection breaks it
//! resumes the session on a new one, sets the watches again, sends the
//! unanswered requests again and carries on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::{
    ConnectRequest, ErrorCode, OpCode, ReadMode, Reply, Request, ServerMessage, SessionId,
    SessionSecret, PROTOCOL_VERSION,
};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn};

use crate::connect::{open_leader, Connection};
use crate::deadline::Liveness;
use crate::error::{Error, Result};
use crate::link::{push_orphan_deletes, Link, Route};
use crate::pending::{fail_pending, Answer, Confirmed, Pending};
use crate::persistent::{PersistentRequest, PersistentTable};
use crate::queue::QueueTable;
use crate::state::SessionState;
use crate::watcher::WatchTable;
use crate::wire::{ClientTls, Wire};

/// Why [`SessionTask::serve`] returned.
enum End {
    /// The connection broke; the session may be alive.
    Lost(String),
    /// The server said the session expired.
    Expired(String),
    /// The session was closed by this client.
    Closed,
    /// Every `Client` handle was dropped: leave the session to expire.
    Dropped,
}

pub(crate) struct SessionTask {
    pub(crate) addrs: Vec<String>,
    pub(crate) connect_timeout: Duration,
    /// TLS settings, for a server that takes TLS.
    pub(crate) tls: Option<ClientTls>,
    /// The identity's token, for a server that checks identities.
    pub(crate) token: Option<baton_proto::Token>,
    /// What the session's reads promise; in the sequential mode only pings,
    /// syncs and changes move the session deadline on.
    pub(crate) read_mode: ReadMode,
    pub(crate) session: SessionId,
    pub(crate) secret: SessionSecret,
    pub(crate) timeout: Duration,
    /// The sending side, shared with every `Client` handle.
    pub(crate) link: Arc<Link>,
    pub(crate) unregister: mpsc::UnboundedReceiver<(String, u64)>,
    /// Persistent watches being set, registered before their request is
    /// written.
    pub(crate) new_persistent: mpsc::UnboundedReceiver<(String, PersistentRequest)>,
    /// Queue nodes whose answers reached calls that were dropped unread.
    pub(crate) orphaned: mpsc::UnboundedReceiver<String>,
    pub(crate) state: watch::Sender<SessionState>,
    pub(crate) liveness: Arc<Liveness>,
    pub(crate) watches: WatchTable,
    pub(crate) queues: QueueTable,
    pub(crate) persistent: PersistentTable,
    /// Nodes enqueued for callers that gave up waiting: deleted unseen.
    pub(crate) orphans: Vec<String>,
    /// Highest revision seen in any reply or event.
    pub(crate) last_revision: u64,
    /// The address of the server the session was last on, or of the leader
    /// a member that does not lead sent it to: tried first on a reconnect.
    pub(crate) leader: Option<String>,
    /// Requests a broken connection left unanswered, sent again (same xid,
    /// same order) once the session is resumed: the server answers one it
    /// had handled from the session's last reply rather than apply it twice.
    pub(crate) unanswered: VecDeque<Pending>,
}

impl Drop for SessionTask {
    /// However the task ends (its runtime shut down, say), no caller waits
    /// for it: what is pending fails, and later calls fail at once.
    fn drop(&mut self) {
        if self.link.is_ended() {
            return;
        }
        let (pending, closing) = self.link.down();
        fail_pending(pending, &Error::Closed);
        fail_pending(std::mem::take(&mut self.unanswered), &Error::Closed);
        for done in closing {
            let _ = done.send(());
        }
        self.link.end(&Error::Closed);
    }
}

/// Most connections one request is sent on before it fails with
/// `ConnectionLoss`.
const MAX_SENDS: u8 = 3;

impl SessionTask {
    pub(crate) async fn run(mut self, first: Connection) {
        let mut conn = first;
        loop {
            let end = self.serve(conn).await;
            let end = match end {
                End::Lost(reason) => {
                    info!(session = %self.session, "connection lost ({reason}); resuming the session");
                    self.state.send_replace(SessionState::Disconnected);
                    match self.reconnect().await {
                        Ok(next) => {
                            self.state.send_replace(SessionState::Reconnected);
                            conn = next;
                            continue;
                        }
                        Err(end) => end,
                    }
                }
                other => other,
            };
            match end {
                End::Expired(message) => {
                    let error = Error::SessionExpired(message);
                    fail_pending(std::mem::take(&mut self.unanswered), &error);
                    self.finish(SessionState::Expired, error)
                }
                End::Closed => {
                    fail_pending(std::mem::take(&mut self.unanswered), &Error::Closed);
                    self.finish(SessionState::Closed, Error::Closed)
                }
                End::Dropped | End::Lost(_) => {}
            }
            return;
        }
    }

    /// Whether an answer to operation `op` moves the session deadline on
    /// (if it shows the session alive at all): every answer does in the
    /// linearizable read mode, as the member that gave it confirmed with
    /// the leader first; in the sequential mode, only those of operations
    /// the leader hears of.
    fn confirms(&self, op: u8) -> bool {
        self.read_mode == ReadMode::Linearizable
            || OpCode::from_u8(op).is_some_and(OpCode::heard_by_leader)
    }

    /// When the connection's next ping is due: a third of the timeout
    /// after the last send, or in the sequential read mode after the last
    /// request the leader hears of (reads answered by the member alone do
    /// not keep the session alive).
    fn ping_due(&self, out: &crate::link::Outbound, every: Duration) -> Instant {
        match self.read_mode {
            ReadMode::Linearizable => out.last_sent + every,
            ReadMode::Sequential => out.last_heard_by_leader + every,
        }
    }

    /// Enters a terminal state and answers every later call with `error`.
    fn finish(&mut self, state: SessionState, error: Error) {
        debug!(session = %self.session, %state, "session ended");
        self.state.send_replace(state);
        self.watches.fail_all(&error);
        self.queues.fail_all(&error);
        self.persistent.fail_all(&error);
        self.link.end(&error);
    }

    /// Why the session task was kicked while disconnected, if it must stop
    /// trying: a close asked for, or every handle gone.
    fn stop_reconnecting(&self) -> Option<End> {
        let mut out = self.link.lock();
        if !out.closing.is_empty() {
            let closing = std::mem::take(&mut out.closing);
            drop(out);
            self.publish_end(&End::Closed);
            for done in closing {
                let _ = done.send(());
            }
            return Some(End::Closed);
        }
        out.dropped.then_some(End::Dropped)
    }

    /// Tries every address in turn, with backoff, until the session is resumed
    /// or the server says it is gone. Calls made meanwhile are kept.
    async fn reconnect(&mut self) -> std::result::Result<Connection, End> {
        let request = ConnectRequest {
            version: PROTOCOL_VERSION,
            timeout_ms: self.timeout.as_millis() as u32,
            resume: Some((self.session, self.secret)),
            token: self.token.clone(),
            read_mode: self.read_mode,
            // A member behind what this client saw refuses the resume.
            last_seen: self.last_revision,
        };
        let mut backoff = Duration::from_millis(20);
        loop {
            if let Some(end) = self.stop_reconnecting() {
                return Err(end);
            }
            let (hint, addrs) = (self.leader.clone(), self.addrs.clone());
            let tls = self.tls.clone();
            let opening = open_leader(
                hint.as_deref(),
                &addrs,
                &request,
                self.connect_timeout,
                tls.as_ref(),
            );
            tokio::pin!(opening);
            let link = self.link.clone();
            let result = loop {
                tokio::select! {
                    r = &mut opening => break r,
                    _ = link.kick.notified() => {
                        if let Some(end) = self.stop_reconnecting() {
                            return Err(end);
                        }
                    }
                    Some((path, id)) = self.unregister.recv() => self.unregister_watch(&path, id),
                    Some(node) = self.orphaned.recv() => self.orphan(node),
                }
            };
            match result {
                Ok((conn, addr)) => {
                    info!(session = %self.session, %addr, "session resumed");
                    self.leader = Some(addr);
                    return Ok(conn);
                }
                Err(Error::SessionExpired(message)) => return Err(End::Expired(message)),
                Err(e) => debug!(session = %self.session, "resume failed: {e}"),
            }
            let wake = Instant::now() + backoff;
            // A cluster electing a leader answers again within a few hundred
            // ms: keep the retries that close together.
            backoff = (backoff * 2).min(Duration::from_millis(250));
            loop {
                tokio::select! {
                    _ = sleep_until(wake) => break,
                    _ = link.kick.notified() => {
                        if let Some(end) = self.stop_reconnecting() {
                            return Err(end);
                        }
                    }
                    Some((path, id)) = self.unregister.recv() => self.unregister_watch(&path, id),
                    Some(node) = self.orphaned.recv() => self.orphan(node),
                }
            }
        }
    }

    /// Registers the persistent watches being set.
    fn take_persistent(&mut self) {
        while let Ok((path, request)) = self.new_persistent.try_recv() {
            self.persistent.add(&path, request);
        }
    }

    fn unregister_watch(&mut self, path: &str, id: u64) {
        self.take_persistent();
        self.watches.remove(path, id);
        self.queues.remove(path, id);
        if self.persistent.remove(path, id) {
            // The last persistent watch on the path: the server's goes too.
            let request = Request::RemoveWatches {
                path: path.to_owned(),
                data: false,
                child: false,
                persistent: true,
            };
            let mut out = self.link.lock();
            out.push(request, None, None);
            self.link.flush(&mut out);
        }
    }

    /// Puts a connection to use: watches set again, unanswered requests
    /// sent again and the requests kept meanwhile sent, in that order,
    /// before any new request.
    fn go_up(&mut self, writer: &Arc<Wire>) {
        // After a resume the server holds none of our watches: set them again
        // before anything else, relative to the last revision we saw.
        let [data, exist, child] = self.watches.paths();
        let queue = self.queues.entries();
        self.take_persistent();
        let resumed = self.persistent.resume(self.last_revision);
        let mut out = self.link.lock();
        if !(data.is_empty() && exist.is_empty() && child.is_empty() && queue.is_empty()) {
            let request = Request::SetWatches {
                revision: self.last_revision,
                data,
                exist,
                child,
                queue,
            };
            out.push(request, None, None);
        }
        // Persistent watches, each from the revision it had reached: the
        // server replays what they missed.
        for request in resumed {
            out.push(request, None, None);
        }
        out.resend(std::mem::take(&mut self.unanswered));
        while let Some(d) = out.deferred.pop_front() {
            out.push(d.request, Some(d.reply), d.watch);
        }
        push_orphan_deletes(&mut out, &mut self.orphans);
        if !out.closing.is_empty() {
            // Asked for while the connection was being opened.
            out.push(Request::CloseSession, None, None);
        }
        out.route = Route::Up(writer.clone());
        out.last_sent = Instant::now();
        self.link.flush(&mut out);
    }

    /// Serves one connection until it breaks or the session ends.
    async fn serve(&mut self, conn: Connection) -> End {
        let Connection {
            mut reader,
            writer,
            sent,
            ..
        } = conn;
        self.liveness.answered(sent);
        self.go_up(&writer);
        let link = self.link.clone();

        let ping_every = self.timeout / 3;
        let silence_limit = self.timeout * 2 / 3;
        let mut last_heard = Instant::now();
        // Whether bytes wait for the socket to drain. Callers write what
        // the socket takes at once and kick this task for the rest.
        let mut draining = false;
        // One timer for the connection, re-armed only when it fires: sends
        // and answers move the last send and `last_heard` forward, so the
        // armed time is never later than the time due. (A timer made anew
        // for every frame costs a timer-wheel insertion and removal per
        // frame, on a wheel that every session of the runtime shares.)
        let tick = tokio::time::sleep_until(
            self.ping_due(&self.link.lock(), ping_every)
                .min(last_heard + silence_limit),
        );
        tokio::pin!(tick);
        let end = loop {
            tokio::select! {
                biased;
                r = writer.writable(), if draining => {
                    if let Err(e) = r {
                        break End::Lost(format!("write failed: {e}"));
                    }
                    let mut out = link.lock();
                    link.flush(&mut out);
                    if let Some(reason) = out.broken.clone() {
                        break End::Lost(reason);
                    }
                    draining = out.unsent;
                }
                _ = link.kick.notified() => {
                    let out = link.lock();
                    if let Some(reason) = out.broken.clone() {
                        break End::Lost(reason);
                    }
                    if out.dropped {
                        break End::Dropped;
                    }
                    draining = out.unsent;
                }
                frame = reader.next() => {
                    last_heard = Instant::now();
                    let frame = match frame {
                        Some(Ok(frame)) => frame.freeze(),
                        Some(Err(e)) => break End::Lost(format!("read failed: {e}")),
                        None => break End::Lost("the server closed the connection".into()),
                    };
                    if let Some(end) = self.on_frame(frame) {
                        break end;
                    }
                    self.delete_orphans();
                }
                Some((path, id)) = self.unregister.recv() => self.unregister_watch(&path, id),
                Some(node) = self.orphaned.recv() => {
                    self.orphan(node);
                    self.delete_orphans();
                }
                _ = &mut tick => {
                    let now = Instant::now();
                    if now >= last_heard + silence_limit {
                        break End::Lost(format!(
                            "no answer from the server for {} ms",
                            silence_limit.as_millis()
                        ));
                    }
                    let mut out = link.lock();
                    if now >= self.ping_due(&out, ping_every) && out.wbuf.is_empty() {
                        out.push(Request::Ping, None, None);
                        link.flush(&mut out);
                    }
                    // Not before 10 ms from now: a ping that waits for the
                    // socket leaves the last send behind meanwhile.
                    let due = self.ping_due(&out, ping_every).min(last_heard + silence_limit);
                    tick.as_mut().reset(due.max(now + Duration::from_millis(10)));
                }
            }
        };
        let (pending, closing) = self.link.down();
        match &end {
            End::Lost(reason) => {
                let error = Error::ConnectionLoss(reason.clone());
                if !closing.is_empty() {
                    // The close may not have reached the server; the session
                    // then expires on its own. Either way this client is done
                    // with it.
                    self.publish_end(&End::Closed);
                    for done in closing {
                        let _ = done.send(());
                    }
                    fail_pending(pending, &error);
                    return End::Closed;
                }
                // Sent again once the session is resumed; the server answers
                // each at most once. A request that broke every connection it
                // was sent on is not sent again: it fails, as its outcome is
                // unknown, rather than break connections forever.
                let (again, given_up): (VecDeque<Pending>, VecDeque<Pending>) = pending
                    .into_iter()
                    .filter(|p| p.request.is_some())
                    .partition(|p| p.sends < MAX_SENDS);
                fail_pending(given_up, &error);
                self.unanswered = again;
            }
            End::Expired(message) => {
                self.publish_end(&end);
                fail_pending(pending, &Error::SessionExpired(message.clone()));
            }
            End::Closed => {
                self.publish_end(&end);
                fail_pending(pending, &Error::Closed);
            }
            End::Dropped => {}
        }
        end
    }

    /// Takes a queue node whose caller is gone out of its queue: it would
    /// block the queue until the session ends. Its queue watch goes too
    /// (the caller's, dropped unseen, could not name the node).
    fn orphan(&mut self, node: String) {
        self.queues.forget(&node);
        self.orphans.push(node);
    }

    /// Sends the deletes of the orphaned queue nodes.
    fn delete_orphans(&mut self) {
        if !self.orphans.is_empty() {
            let mut out = self.link.lock();
            push_orphan_deletes(&mut out, &mut self.orphans);
            self.link.flush(&mut out);
        }
    }

    /// Publishes the terminal state an end leads to, before any caller is
    /// answered, so that a caller that sees the error also sees the state.
    fn publish_end(&self, end: &End) {
        match end {
            End::Expired(_) => {
                self.state.send_replace(SessionState::Expired);
            }
            End::Closed => {
                self.state.send_replace(SessionState::Closed);
            }
            End::Lost(_) | End::Dropped => {}
        }
    }

    /// Handles one frame from the server; returns how the connection ends,
    /// if it does.
    fn on_frame(&mut self, frame: Bytes) -> Option<End> {
        let message = match ServerMessage::decode(frame) {
            Ok(m) => m,
            Err(e) => {
                warn!(session = %self.session, "undecodable frame from server: {e}");
                return Some(End::Lost(format!("undecodable frame from server: {e}")));
            }
        };
        match message {
            ServerMessage::Reply(reply) => {
                self.last_revision = self.last_revision.max(reply.revision);
                let Some(p) = self.link.lock().pending.pop_front() else {
                    return Some(End::Lost(format!(
                        "unexpected reply with xid {}",
                        reply.xid
                    )));
                };
                if p.xid != reply.xid {
                    return Some(End::Lost(format!(
                        "reply for xid {} while xid {} was next",
                        reply.xid, p.xid
                    )));
                }
                if reply.op == OpCode::CloseSession as u8 {
                    let end = match reply.result {
                        Err(e) if e.code == ErrorCode::SessionExpired => End::Expired(e.message),
                        // Closed, or refused for a reason that leaves nothing
                        // more to do: the session is over for this client.
                        _ => End::Closed,
                    };
                    // The state says so before `close()` returns.
                    self.publish_end(&end);
                    let closing = std::mem::take(&mut self.link.lock().closing);
                    for done in closing {
                        let _ = done.send(());
                    }
                    return Some(end);
                }
                if shows_session_alive(&reply.result) && self.confirms(reply.op) {
                    self.liveness.answered(p.sent);
                }
                let (result, confirmed) = match reply.result {
                    Ok(r) => {
                        let confirmed = p.watch.and_then(|w| w.confirmed(&r));
                        let revision = reply.revision;
                        (Ok(Answer { reply: r, revision }), confirmed)
                    }
                    Err(e) => (Err(Error::from_wire(e.code, e.message)), None),
                };
                // (The session's own requests have no caller to answer.)
                let slot = p.reply?;
                match slot.send(result) {
                    // Registered only once the caller has the answer: the
                    // entry of a caller gone before (its watch dropped
                    // unseen) would stay until a reconnect.
                    Ok(()) => match confirmed {
                        Some(Confirmed::Watch(path, kind, w)) => self.watches.add(&path, kind, w),
                        Some(Confirmed::Queue(node, heads, q)) => self.queues.add(&node, heads, q),
                        None => {}
                    },
                    Err(Ok(Answer {
                        reply: Reply::Enqueue { path, .. },
                        ..
                    })) => self.orphan(path),
                    Err(_) => {}
                }
                None
            }
            ServerMessage::Event(event) => {
                self.last_revision = self.last_revision.max(event.revision);
                // A persistent watch is registered before its request is
                // written, so before any event it brings back arrives.
                self.take_persistent();
                self.watches.fire(&event);
                self.queues.fire(&event);
                self.persistent.fire(&event);
                None
            }
            ServerMessage::Disconnect(d) => match d.code {
                ErrorCode::SessionExpired => Some(End::Expired(d.message)),
                ErrorCode::NotLeader => {
                    info!(session = %self.session, leader = %d.message, "the server stopped leading; following the leader");
                    self.leader = (!d.message.is_empty()).then(|| d.message.clone());
                    Some(End::Lost(format!(
                        "the server does not lead any more (leader: {})",
                        if d.message.is_empty() {
                            "unknown"
                        } else {
                            &d.message
                        }
                    )))
                }
                _ => {
                    if !matches!(d.code, ErrorCode::ShuttingDown | ErrorCode::SessionMoved) {
                        warn!(session = %self.session, "server closed the connection: {}: {}", d.code, d.message);
                    }
                    Some(End::Lost(format!("{}: {}", d.code, d.message)))
                }
            },
        }
    }
}

/// Whether an answer shows that the session was alive after its request
/// was sent: a success, or a refusal that says so
/// ([`ErrorCode::shows_session_alive`]).
fn shows_session_alive(result: &Result<Reply, baton_proto::ErrorReply>) -> bool {
    baton_proto::response::shows_session_alive(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pending::{Registration, ReplySlot};
    use crate::queue::QueueWatch;
    use crate::watcher::Watcher;
    use baton_proto::frame::HEADER_LEN;
    use baton_proto::{ErrorReply, ReplyFrame, Stat};
    use bytes::BytesMut;
    use tokio::sync::oneshot;

    /// A session task with no connection, fed frames by hand.
    fn task() -> SessionTask {
        let (_, unregister) = mpsc::unbounded_channel();
        let (_, orphaned) = mpsc::unbounded_channel();
        let (_, new_persistent) = mpsc::unbounded_channel();
        let timeout = Duration::from_secs(10);
        SessionTask {
            addrs: Vec::new(),
            connect_timeout: timeout,
            tls: None,
            token: None,
            read_mode: ReadMode::Linearizable,
            session: SessionId(1),
            secret: SessionSecret([0; 16]),
            timeout,
            link: Arc::new(Link::new()),
            unregister,
            new_persistent,
            orphaned,
            state: watch::channel(SessionState::Connected).0,
            liveness: Arc::new(Liveness::new(Instant::now(), timeout)),
            watches: WatchTable::default(),
            queues: QueueTable::default(),
            persistent: Default::default(),
            orphans: Vec::new(),
            last_revision: 0,
            leader: None,
            unanswered: VecDeque::new(),
        }
    }

    /// Writes a request as a caller would; returns its xid.
    fn call(
        task: &SessionTask,
        request: Request,
        reply: ReplySlot,
        watch: Option<Registration>,
    ) -> u32 {
        let mut out = task.link.lock();
        out.push(request, Some(reply), watch);
        out.pending.back().expect("just pushed").xid
    }

    /// The payload of the frame that answers `xid` with `reply`.
    fn answer(xid: u32, reply: Reply) -> Bytes {
        let mut buf = BytesMut::new();
        let op = reply.op() as u8;
        ServerMessage::Reply(ReplyFrame {
            xid,
            op,
            revision: 7,
            result: Ok(reply),
        })
        .encode(&mut buf);
        buf.split_off(HEADER_LEN).freeze()
    }

    fn enqueued(node: &str) -> Reply {
        Reply::Enqueue {
            path: node.into(),
            sequence: 7,
            stat: Stat::default(),
            predecessor: Some(("/q/n-0000000003".into(), Stat::default())),
        }
    }

    #[test]
    fn an_answer_for_a_caller_gone_registers_no_watch() {
        let mut task = task();
        let (unregister, _) = mpsc::unbounded_channel();
        // Each caller made its request and was dropped, its watch with it.
        let (watch, queue) = QueueWatch::new("/q/n-".into(), 1, unregister.clone());
        drop(watch);
        let (slot, _) = oneshot::channel();
        let request = Request::Enqueue {
            path: "/q/n-".into(),
            data: Bytes::new(),
            rule: Default::default(),
        };
        let enqueue = call(
            &task,
            request,
            slot,
            Some(Registration::Queue("/q/n-".into(), queue)),
        );
        let (watcher, data) = Watcher::new("/d".into(), 2, unregister);
        drop(watcher);
        let (slot, _) = oneshot::channel();
        let request = Request::GetData {
            path: "/d".into(),
            watch: true,
        };
        let get = call(
            &task,
            request,
            slot,
            Some(Registration::Watch("/d".into(), data)),
        );
        assert!(task
            .on_frame(answer(enqueue, enqueued("/q/n-0000000007")))
            .is_none());
        let got = Reply::GetData {
            stat: Stat::default(),
            data: Bytes::new(),
        };
        assert!(task.on_frame(answer(get, got)).is_none());
        assert_eq!(task.queues.len(), 0);
        assert_eq!(task.watches.len(), 0);
        assert_eq!(task.orphans, ["/q/n-0000000007"]);
    }

    #[test]
    fn a_queue_node_whose_answer_was_dropped_unread_loses_its_queue_watch() {
        let mut task = task();
        let (unregister, _) = mpsc::unbounded_channel();
        let (watch, queue) = QueueWatch::new("/q/n-".into(), 1, unregister);
        let (slot, mut rx) = oneshot::channel();
        let request = Request::Enqueue {
            path: "/q/n-".into(),
            data: Bytes::new(),
            rule: Default::default(),
        };
        let xid = call(
            &task,
            request,
            slot,
            Some(Registration::Queue("/q/n-".into(), queue)),
        );
        assert!(task
            .on_frame(answer(xid, enqueued("/q/n-0000000007")))
            .is_none());
        assert_eq!(task.queues.len(), 1);
        // The call is dropped with the answer unread: its watch never
        // learnt the node's name, and the node is handed back.
        drop(watch);
        assert!(rx.try_recv().is_ok());
        task.orphan("/q/n-0000000007".into());
        assert_eq!(task.queues.len(), 0);
        assert_eq!(task.orphans, ["/q/n-0000000007"]);
    }

    /// Answers in turn a read, a ping and a change, each sent a second
    /// after the one before; returns the deadline after each answer.
    async fn deadlines_after_a_read_a_ping_and_a_change(task: &mut SessionTask) -> [Instant; 3] {
        let requests = [
            (
                Request::GetData {
                    path: "/d".into(),
                    watch: false,
                },
                Reply::GetData {
                    stat: Stat::default(),
                    data: Bytes::new(),
                },
            ),
            (Request::Ping, Reply::Ping),
            (
                Request::SetData {
                    path: "/d".into(),
                    data: Bytes::new(),
                    version: None,
                    fence: None,
                },
                Reply::SetData(Stat::default()),
            ),
        ];
        let mut deadlines = Vec::new();
        for (request, reply) in requests {
            tokio::time::advance(Duration::from_secs(1)).await;
            let (slot, _rx) = oneshot::channel();
            let xid = call(task, request, slot, None);
            assert!(task.on_frame(answer(xid, reply)).is_none());
            deadlines.push(task.liveness.deadline());
        }
        deadlines.try_into().expect("three")
    }

    #[tokio::test(start_paused = true)]
    async fn a_sequential_session_counts_only_what_the_leader_hears_of_toward_its_deadline() {
        let start = Instant::now();
        let timeout = Duration::from_secs(10);
        let second = Duration::from_secs(1);
        let mut linearizable = task();
        assert_eq!(
            deadlines_after_a_read_a_ping_and_a_change(&mut linearizable).await,
            [start + second, start + second * 2, start + second * 3].map(|at| at + timeout)
        );
        let start = Instant::now();
        let mut sequential = task();
        sequential.read_mode = ReadMode::Sequential;
        // The read was answered by the member alone: it shows nothing.
        assert_eq!(
            deadlines_after_a_read_a_ping_and_a_change(&mut sequential).await,
            [start, start + second * 2, start + second * 3].map(|at| at + timeout)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sequential_session_pings_on_time_however_many_reads_it_sends() {
        let every = Duration::from_secs(3);
        for mode in [ReadMode::Linearizable, ReadMode::Sequential] {
            let mut task = task();
            task.read_mode = mode;
            let (slot, _rx) = oneshot::channel();
            call(&task, Request::Ping, slot, None);
            let pinged = Instant::now();
            for _ in 0..5 {
                tokio::time::advance(Duration::from_secs(1)).await;
                let (slot, _rx) = oneshot::channel();
                let read = Request::Exists {
                    path: "/d".into(),
                    watch: false,
                };
                call(&task, read, slot, None);
                task.link.lock().last_sent = Instant::now();
            }
            let due = task.ping_due(&task.link.lock(), every);
            match mode {
                // Any answer moves the deadline on: ping when quiet.
                ReadMode::Linearizable => assert_eq!(due, Instant::now() + every),
                // Reads do not: ping a third of the timeout after the last
                // ping, reads or not.
                ReadMode::Sequential => assert_eq!(due, pinged + every),
            }
        }
    }

    #[test]
    fn only_successes_and_refusals_from_the_state_show_a_session_alive() {
        assert!(shows_session_alive(&Ok(Reply::Ping)));
        let alive: Vec<u16> = (0..=30)
            .filter(|code| {
                let reply = ErrorReply::new(ErrorCode::from_u16(*code), String::new());
                shows_session_alive(&Err(reply))
            })
            .collect();
        // no node, node exists, bad version, not empty, no children for
        // ephemerals, stale fence, result lost.
        assert_eq!(alive, [1, 2, 3, 4, 5, 19, 21]);
    }

    #[test]
    fn a_failed_transaction_shows_a_session_alive_only_as_its_failing_operation_would() {
        let failed = |code| {
            Ok(Reply::Multi(Err(baton_proto::TxnFailure {
                index: 2,
                error: ErrorReply::new(code, String::new()),
            })))
        };
        assert!(shows_session_alive(&Ok(Reply::Multi(Ok(vec![])))));
        assert!(shows_session_alive(&failed(ErrorCode::BadVersion)));
        assert!(shows_session_alive(&failed(ErrorCode::StaleFence)));
        // Refused on its form, answered at once by whoever was reached.
        assert!(!shows_session_alive(&failed(ErrorCode::TooManyOperations)));
        assert!(!shows_session_alive(&failed(ErrorCode::ValueTooLarge)));
        assert!(!shows_session_alive(&failed(ErrorCode::PermissionDenied)));
        assert!(!shows_session_alive(&failed(ErrorCode::NotLeader)));
    }
}
