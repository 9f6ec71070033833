//! What each request does. Reads are answered from the state as it is;
//! changes are proposed, and answered when applied.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use baton_proto::{
    path, txn, ErrorCode, ErrorReply, PredecessorWatch, Reply, Request, RequestFrame, SessionId,
    TxnFailure, TxnOp,
};
use tokio::time::Instant;
use tracing::debug;

use super::{no_node, Core, Flow, Now};
use crate::outbox::Outbox;
use crate::state::queue::QueueRule;
use crate::state::{Command, Origin, Proposal};
use crate::watches::Kinds;

impl Core {
    /// Handles one request of `session` arriving on `outbox`'s connection.
    /// A read is answered at once; a change is proposed, and answered when
    /// it is applied (at once, on a single server). The events a change
    /// fires are queued before its reply.
    pub(crate) fn handle(
        &mut self,
        session: SessionId,
        frame: RequestFrame,
        outbox: &Arc<Outbox>,
        identity: Option<&crate::auth::Identity>,
        now: Now,
    ) -> Flow {
        self.now = now;
        let now = now.at;
        let RequestFrame { xid, request } = frame;
        let op = request.op() as u8;
        if let Err(flow) = self.touch(session, xid, op, outbox, now) {
            return flow;
        }
        if let Some(identity) = identity {
            let owns = |path: &str| {
                self.sm
                    .node(path)
                    .is_some_and(|n| n.owner() == Some(session))
            };
            let refused = match &request {
                // A transaction's refusal names the operation refused.
                Request::Multi { ops } => identity
                    .authorize_ops(ops, owns)
                    .map_err(|(index, error)| Ok(Reply::Multi(Err(TxnFailure { index, error })))),
                request => identity.authorize(request, owns).map_err(Err),
            };
            if let Err(answer) = refused {
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                self.answer(session, outbox, xid, op, answer);
                return Flow::Continue;
            }
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let origin = Origin { session, xid };
        let result = match request {
            Request::Create {
                path,
                data,
                mode,
                fence,
                acl,
            } => self.check_size(&data).map(|()| Command::Create {
                session,
                path,
                data,
                mode,
                fence,
                acl,
            }),
            Request::Delete {
                path,
                version,
                fence,
            } => Ok(Command::Delete {
                path,
                version,
                fence,
            }),
            Request::SetData {
                path,
                data,
                version,
                fence,
            } => self.check_size(&data).map(|()| Command::SetData {
                path,
                data,
                version,
                fence,
            }),
            Request::Multi { ops } => match self.check_txn(&ops) {
                Ok(()) => Ok(Command::Multi { session, ops }),
                Err(failure) => {
                    self.answer(session, outbox, xid, op, Ok(Reply::Multi(Err(failure))));
                    return Flow::Continue;
                }
            },
            Request::Enqueue { path, data, rule } => {
                self.check_size(&data).map(|()| Command::Enqueue {
                    session,
                    path,
                    data,
                    rule,
                })
            }
            Request::CloseSession => Ok(Command::CloseSession { session }),
            Request::LockDelay { path, delay_ms } => Ok(Command::SetLockDelay { path, delay_ms }),
            Request::SetAcl { path, acl, version } => Ok(Command::SetAcl { path, acl, version }),
            read => {
                let result = self.read(session, read, outbox, now);
                self.answer(session, outbox, xid, op, result);
                return Flow::Continue;
            }
        };
        let closes = op == baton_proto::OpCode::CloseSession as u8;
        match result {
            Ok(command) => self.change(origin, command, outbox, op),
            Err(e) => self.answer(session, outbox, xid, op, Err(e)),
        }
        if closes {
            // No request after a close is read. A single server has closed
            // the session already; a cluster does when the close is applied.
            if self.log.applies_at_once() {
                outbox.close(None, 0);
            }
            return Flow::Stop;
        }
        Flow::Continue
    }

    /// Proposes the change a request asks for, and answers it if it was
    /// applied at once or refused; otherwise the answer is owed until it is
    /// applied.
    pub(super) fn change(
        &mut self,
        origin: Origin,
        command: Command,
        outbox: &Arc<Outbox>,
        op: u8,
    ) {
        let proposal = Proposal {
            now_ms: self.now.wall_ms,
            origin: Some(origin),
            command,
        };
        match self.propose(proposal) {
            // A cluster member that cannot take the change (it stopped
            // leading, or it serves as a follower and cannot reach the
            // leader) closes the connection rather than refuse the request:
            // a copy of it sent earlier, on a connection that broke, may
            // already be in the log, and a refusal would tell the client
            // that it failed. The client resends it, with the same xid, to
            // a member that can take it, and the leader answers a copy it
            // already applied from what the session kept.
            Some(Err(e)) if e.code == ErrorCode::NotLeader && !self.log.applies_at_once() => {
                debug!(session = %origin.session, xid = origin.xid, "closing: a change this member cannot take");
                outbox.close(Some((e.code, e.message)), 0);
            }
            Some(answer) => self.answer(origin.session, outbox, origin.xid, op, answer),
            None => self.owe(origin.session, outbox, origin.xid, op),
        }
    }

    /// Answers a request that changes nothing.
    pub(super) fn read(
        &mut self,
        session: SessionId,
        request: Request,
        outbox: &Arc<Outbox>,
        now: Instant,
    ) -> Result<Reply, ErrorReply> {
        match request {
            Request::SessionStatus { session } => {
                Ok(Reply::SessionStatus(self.session_status(session, now)))
            }
            Request::Predecessor { path, watch } => self.predecessor(session, &path, watch),
            Request::CheckToken { path, token } => self
                .sm
                .child_created_at(&path, token)
                .map(|found| Reply::CheckToken(found.map(|(p, n)| (p.to_string(), n.stat())))),
            Request::RemoveWatches {
                path,
                data,
                child,
                persistent,
            } => {
                let kinds = match (data, child) {
                    (true, true) => Kinds::DATA.union(Kinds::CHILD),
                    (true, false) => Kinds::DATA,
                    (false, true) => Kinds::CHILD,
                    (false, false) => Kinds::default(),
                };
                self.watches.remove(session, &path, kinds);
                if persistent {
                    self.persistent.remove(session, &path);
                }
                Ok(Reply::RemoveWatches)
            }
            Request::Stats => Ok(Reply::Stats(
                self.stats_snapshot()
                    .counters()
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .collect(),
            )),
            Request::Exists { path, watch } => (if watch {
                self.watch(session, &path, Kinds::DATA)
            } else {
                Ok(())
            })
            .map(|()| Reply::Exists(self.sm.node(&path).map(|n| n.stat()))),
            Request::GetData { path, watch } => self.get_data(session, &path, watch),
            Request::GetChildren { path, watch } => self.get_children(session, &path, watch),
            Request::Ping => Ok(Reply::Ping),
            // The read gate held it until this member caught up.
            Request::Sync => Ok(Reply::Sync),
            Request::SetWatches {
                revision,
                data,
                exist,
                child,
                queue,
            } => self
                .set_watches(session, outbox, revision, data, exist, child)
                .map(|()| {
                    self.set_queue_watches(session, outbox, queue);
                    Reply::SetWatches
                }),
            Request::AddWatch {
                path,
                recursive,
                from,
            } => self
                .add_watch(session, outbox, &path, recursive, from)
                .map(|()| Reply::AddWatch),
            Request::Create { .. }
            | Request::Delete { .. }
            | Request::SetData { .. }
            | Request::Enqueue { .. }
            | Request::Multi { .. }
            | Request::LockDelay { .. }
            | Request::SetAcl { .. }
            | Request::CloseSession => unreachable!("changes are proposed"),
        }
    }

    /// Answers a request that could not be decoded but can be answered.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reject(
        &mut self,
        session: SessionId,
        xid: u32,
        op: u8,
        code: ErrorCode,
        message: String,
        outbox: &Arc<Outbox>,
        now: Now,
    ) -> Flow {
        self.now = now;
        let now = now.at;
        if let Err(flow) = self.touch(session, xid, op, outbox, now) {
            return flow;
        }
        self.answer(session, outbox, xid, op, Err(ErrorReply { code, message }));
        Flow::Continue
    }

    /// Checks a transaction's limits before it is proposed
    /// ([`txn::check_limits`], with the server's `max_data`).
    fn check_txn(&self, ops: &[TxnOp]) -> Result<(), TxnFailure> {
        txn::check_limits(ops, self.config.max_data).map_err(|(index, code, message)| TxnFailure {
            index,
            error: ErrorReply::new(code, message),
        })
    }

    pub(super) fn check_size(&self, data: &[u8]) -> Result<(), ErrorReply> {
        if data.len() > self.config.max_data {
            return Err(ErrorReply::new(
                ErrorCode::ValueTooLarge,
                format!(
                    "data of {} bytes exceeds the server's limit of {} bytes",
                    data.len(),
                    self.config.max_data
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn get_data(
        &mut self,
        session: SessionId,
        path: &str,
        watch: bool,
    ) -> Result<Reply, ErrorReply> {
        let node = self.sm.node(path).ok_or_else(|| no_node(path))?;
        let reply = Reply::GetData {
            stat: node.stat(),
            data: node.data(),
        };
        if watch {
            self.watch(session, path, Kinds::DATA)?;
        }
        Ok(reply)
    }

    /// The node's predecessor among its siblings (with a queue watch, the
    /// member it waits on under its queue's rule), with a watch if asked:
    /// looked up and watched in one step, so that its deletion cannot slip
    /// between the two.
    pub(super) fn predecessor(
        &mut self,
        session: SessionId,
        path: &str,
        watch: PredecessorWatch,
    ) -> Result<Reply, ErrorReply> {
        let found = match watch {
            PredecessorWatch::None | PredecessorWatch::Predecessor => self
                .sm
                .predecessor(path)?
                .map(|(p, n)| (p.clone(), n.stat())),
            // With a queue watch, the member the node waits on under its
            // queue's rule (none once it heads): the watch waits there, and
            // the client reads from the reply whether the node heads.
            PredecessorWatch::Queue | PredecessorWatch::Standing => self
                .sm
                .standing(path)?
                .waits_on()
                .map(|(p, n)| (p.clone(), n.stat())),
        };
        match watch {
            PredecessorWatch::None | PredecessorWatch::Standing => {}
            PredecessorWatch::Predecessor => {
                if let Some((p, _)) = &found {
                    self.watch(session, p, Kinds::DATA)?;
                }
            }
            PredecessorWatch::Queue => {
                let (node, owner, czxid) = {
                    let (k, n) = self.sm.node_entry(path).ok_or_else(|| no_node(path))?;
                    (k.clone(), n.owner(), n.czxid())
                };
                if owner != Some(session) {
                    return Err(ErrorReply::new(
                        ErrorCode::BadArguments,
                        format!("{path} is not an ephemeral node of this session; a queue watch is set on one's own place in a queue"),
                    ));
                }
                let standing = self.sm.standing(path)?.map(|(p, _)| p.clone());
                self.queues.set(session, node, czxid, standing);
            }
        }
        Ok(Reply::Predecessor(
            found.map(|(p, stat)| (p.to_string(), stat)),
        ))
    }

    /// Sets the queue watch of a node its session just enqueued (or, for an
    /// enqueue sent again, enqueued before) and answers with the node's
    /// predecessor as it is now, which is what the watch starts from.
    pub(super) fn queue_up(
        &mut self,
        session: SessionId,
        path: &Arc<str>,
        sequence: u64,
        stat: baton_proto::Stat,
    ) -> Result<Reply, ErrorReply> {
        let (node, exclusive, standing) = match self.sm.node_entry(path) {
            Some((k, n)) if n.owner() == Some(session) => (
                k.clone(),
                self.sm.rule(path) == QueueRule::Exclusive,
                self.sm.standing(path)?.map(|(p, n)| (p.clone(), n.stat())),
            ),
            _ => {
                return Err(ErrorReply::new(
                    ErrorCode::NoNode,
                    format!("{path}, this session's place in the queue, was deleted since"),
                ))
            }
        };
        if standing.heads() {
            self.locks
                .granted(&node, exclusive, sequence, stat.ctime, self.now);
        }
        self.queues.set(
            session,
            node,
            stat.czxid,
            standing.clone().map(|(p, _)| p.clone()),
        );
        // The reply names the member this one waits on, none if it heads:
        // the client reads the server's decision from it.
        let predecessor = standing.waits_on();
        Ok(Reply::Enqueue {
            path: path.to_string(),
            sequence,
            stat,
            predecessor: predecessor.map(|(p, stat)| (p.to_string(), stat)),
        })
    }

    pub(super) fn get_children(
        &mut self,
        session: SessionId,
        path: &str,
        watch: bool,
    ) -> Result<Reply, ErrorReply> {
        let node = self.sm.node(path).ok_or_else(|| no_node(path))?;
        // Checked before the list is built (and before a watch is set).
        let size: usize = node.children().map(|p| path::name(p).len() + 2).sum();
        if size + 1024 > self.max_reply() {
            return Err(ErrorReply::new(
                ErrorCode::ResponseTooLarge,
                format!(
                    "{path} has {} children; listing them takes {size} bytes, over the server's {} byte limit for one reply",
                    node.child_count(),
                    self.max_reply()
                ),
            ));
        }
        let reply = Reply::GetChildren {
            stat: node.stat(),
            children: node.child_names().into_iter().map(str::to_owned).collect(),
        };
        if watch {
            self.watch(session, path, Kinds::CHILD)?;
        }
        Ok(reply)
    }
}
