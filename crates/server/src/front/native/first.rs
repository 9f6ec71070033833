//! A connection's first frame: a status probe (answered, then closed), a
//! backup request (its rights checked, then sent), or a handshake that
//! opens or resumes a session.

use std::sync::Arc;

use baton_proto::{
    ConnectRequest, ConnectResponse, ErrorCode, ReadMode, SessionId, PROTOCOL_VERSION,
};
use bytes::Bytes;
use tokio::time::timeout;
use tracing::{debug, info, warn};

use super::backup::backup_refusal;
use super::{Conn, CLOSE_GRACE};
use crate::clock::Now;
use crate::core::{Connected, Connecting};
use crate::front::gate::received;
use crate::front::socket::FrameError;
use crate::outbox::Outbox;
use crate::stats::Stats;

/// Most bytes of a connection's first frame: a connect request, a status
/// probe or a backup request, each a few fields and at most a token. Until
/// it has come, nobody is trusted with room for a request of the largest
/// node data.
const MAX_FIRST_FRAME: usize = 4 * 1024;
const _: () = assert!(MAX_FIRST_FRAME >= baton_proto::handshake::MAX_TOKEN + 256);

impl Conn {
    /// Reads the connect request and answers it. Returns the session on
    /// success; on failure the reason has been logged and sent.
    pub(super) async fn handshake(&mut self, outbox: &Arc<Outbox>) -> Option<SessionId> {
        let limit = self.shared.config.handshake_timeout;
        let mut shutdown = self.shared.stopping.subscribe();
        if *shutdown.borrow_and_update() {
            return None;
        }
        let frame = tokio::select! {
            r = timeout(limit, self.first_frame()) => match r {
                Ok(Ok(Some(frame))) => frame,
                Ok(Ok(None)) => return None,
                Ok(Err(FrameError::TooLarge(len))) => {
                    warn!(peer = %self.socket.peer(), len, "closing: handshake frame of {len} bytes; not a Baton client?");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    return None;
                }
                Ok(Err(FrameError::Io(e))) if self.socket.is_tls() => {
                    info!(peer = %self.socket.peer(), "closing: {e}");
                    return None;
                }
                Ok(Err(FrameError::Io(e))) => {
                    debug!(peer = %self.socket.peer(), "connection failed before its handshake: {e}");
                    return None;
                }
                Ok(Err(FrameError::Plaintext)) => {
                    info!(peer = %self.socket.peer(), "refusing a plaintext client: this server takes TLS connections only");
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    let message = "this server takes TLS connections only: connect with TLS (baton --tls-ca FILE, or ClientBuilder::tls)".to_string();
                    // Answered in the form the client asked in: a probe or a
                    // backup request gets a JSON error, a handshake a refusal.
                    let first = timeout(limit, self.read_frame()).await;
                    match first {
                        Ok(Ok(Some(frame)))
                            if baton_proto::probe::is_probe(&frame)
                                || baton_proto::probe::is_backup_request(&frame) =>
                        {
                            let answer = serde_json::json!({ "error": message }).to_string();
                            baton_proto::probe::encode_answer(self.socket.wbuf.get(), &answer);
                            let _ = timeout(CLOSE_GRACE, self.socket.write_all(&self.shared.stats)).await;
                        }
                        _ => self.refuse(ErrorCode::TlsRequired, message).await,
                    }
                    return None;
                }
                Err(_) => {
                    info!(peer = %self.socket.peer(), "closing: no handshake within {} ms", limit.as_millis());
                    return None;
                }
            },
            _ = shutdown.changed() => return None,
        };
        if baton_proto::probe::is_probe(&frame) {
            // Lock names go to the identity the probe names, if any.
            let viewer = match &self.shared.config.identities {
                None => crate::status::Viewer::Anyone,
                Some(identities) => match baton_proto::probe::backup_token(&frame)
                    .and_then(|t| identities.find(t))
                {
                    Some(identity) => crate::status::Viewer::Identity(identity),
                    None => crate::status::Viewer::Nobody,
                },
            };
            // It reads the data directory's listing: not on a runtime thread.
            let shared = self.shared.clone();
            let answer =
                match tokio::task::spawn_blocking(move || crate::status::json(&shared, &viewer))
                    .await
                {
                    Ok(answer) => answer,
                    Err(e) => serde_json::json!({ "error": format!("the status failed: {e}") })
                        .to_string(),
                };
            baton_proto::probe::encode_answer(self.socket.wbuf.get(), &answer);
            let _ = timeout(CLOSE_GRACE, self.socket.write_all(&self.shared.stats)).await;
            return None;
        }
        if baton_proto::probe::is_backup_request(&frame) {
            if let Some(identities) = &self.shared.config.identities {
                let identity =
                    baton_proto::probe::backup_token(&frame).and_then(|t| identities.find(t));
                let refused = match identity {
                    None => Some("this server checks identities: a backup needs the token of one with the admin right".to_string()),
                    Some(id) => id.need(crate::auth::Rights::ADMIN, "/").err().map(|e| e.message),
                };
                if let Some(message) = refused {
                    info!(peer = %self.socket.peer(), "backup refused: {message}");
                    let answer = backup_refusal(ErrorCode::PermissionDenied, &message);
                    baton_proto::probe::encode_answer(self.socket.wbuf.get(), &answer);
                    let _ = timeout(CLOSE_GRACE, self.socket.write_all(&self.shared.stats)).await;
                    return None;
                }
            }
            if let Err(e) = self.send_backup().await {
                warn!(peer = %self.socket.peer(), "backup not sent: {e}");
            }
            return None;
        }
        let request = match ConnectRequest::decode(frame) {
            Ok(r) => r,
            Err(e) => {
                warn!(peer = %self.socket.peer(), "closing: bad handshake: {e}");
                Stats::add(&self.shared.stats.protocol_errors, 1);
                let message = format!("bad handshake: {e}");
                self.refuse(ErrorCode::MalformedRequest, message).await;
                return None;
            }
        };
        // A handshake of another version is refused for its version, below.
        let checked = request.version == baton_proto::PROTOCOL_VERSION;
        if let Some(identities) = self.shared.config.identities.as_ref().filter(|_| checked) {
            // A token names the identity; without one, a client
            // certificate may (an identity's tls-client name).
            let found = match &request.token {
                Some(t) => identities.find(&t.0),
                None => self
                    .socket
                    .peer_certificate()
                    .and_then(|c| identities.find_by_certificate(c)),
            };
            let Some(identity) = found else {
                let message = if request.token.is_some() {
                    "the token names no identity of this server".to_string()
                } else if self.socket.peer_certificate().is_some() {
                    "this server checks identities: the client certificate is valid for no identity's tls-client name; connect with a token (baton --token-file FILE or BATON_TOKEN, or ClientBuilder::token)".to_string()
                } else {
                    "this server checks identities: connect with a token (baton --token-file FILE or BATON_TOKEN, or ClientBuilder::token)".to_string()
                };
                info!(peer = %self.socket.peer(), "handshake refused: {message}");
                self.refuse(ErrorCode::AuthenticationFailed, message).await;
                return None;
            };
            self.socket.set_identity(identity);
        }
        // A cluster member resumes a session only once it has proven, after
        // the handshake arrived, that it still leads: a leader cut off from
        // the majority still believes it leads, and an answered resume tells
        // the client its session is alive (its lease runs from there) while
        // the majority may already be expiring it. It opens one only then
        // too: a new session it cannot commit would keep the client waiting
        // out its whole connect timeout, where `not-leader` sends it on to
        // the other members at once.
        if self.shared.replicated {
            let resuming = request.resume.map(|(id, _)| id);
            let barrier = self.shared.core().read_barrier(resuming);
            let proven = tokio::select! {
                r = timeout(limit, barrier) => matches!(r, Ok(Ok(()))),
                _ = shutdown.changed() => return None,
            };
            if !proven {
                let (code, message) = self.shared.core().not_leader_notice();
                self.refuse(code, message).await;
                return None;
            }
        }
        let connecting = self.shared.core().connect(&request, outbox, Now::real());
        let connected = match connecting {
            Ok(Connecting::Done(connected)) => Ok(connected),
            // A cluster's leader opens the session once it is committed.
            Ok(Connecting::Pending(waiting)) => {
                let limit = self.shared.config.handshake_timeout;
                tokio::select! {
                    r = timeout(limit, waiting) => match r {
                        Ok(Ok(result)) => result,
                        Ok(Err(_)) => Err(self.shared.core().not_leader_notice()),
                        Err(_) => Err((
                            ErrorCode::ShuttingDown,
                            format!("the session was not opened within {} ms; try again", limit.as_millis()),
                        )),
                    },
                    _ = shutdown.changed() => Err((
                        ErrorCode::ShuttingDown,
                        "the server is shutting down; try a server that is up".into(),
                    )),
                }
            }
            Err(refused) => Err(refused),
        };
        match connected {
            Ok(Connected { grant, revision }) => {
                let session = grant.session_id;
                if let Some(gate) = &mut self.gate {
                    gate.sequential = request.read_mode == ReadMode::Sequential;
                }
                // A new session is a change: its grant waits until it is durable.
                if !self.wait_durable(revision, outbox).await {
                    self.shared.core().detach(session, outbox);
                    return None;
                }
                debug!(peer = %self.socket.peer(), %session, resumed = grant.resumed, timeout_ms = grant.timeout_ms, "session attached");
                ConnectResponse {
                    version: PROTOCOL_VERSION,
                    result: Ok(grant),
                }
                .encode(self.socket.wbuf.get());
                match self.socket.write_all(&self.shared.stats).await {
                    Ok(()) => Some(session),
                    Err(e) => {
                        debug!(peer = %self.socket.peer(), %session, "could not send handshake answer: {e}");
                        self.shared.core().detach(session, outbox);
                        None
                    }
                }
            }
            Err((code, message)) => {
                if code == ErrorCode::NotLeader {
                    debug!(peer = %self.socket.peer(), leader = %message, "handshake sent to the leader");
                } else {
                    info!(peer = %self.socket.peer(), "handshake refused: {message}");
                }
                self.shared.core().detach(SessionId(0), outbox);
                self.refuse(code, message).await;
                None
            }
        }
    }

    /// Sends a failed handshake answer, best effort.
    async fn refuse(&mut self, code: ErrorCode, message: String) {
        ConnectResponse {
            version: PROTOCOL_VERSION,
            result: Err((code, message)),
        }
        .encode(self.socket.wbuf.get());
        let _ = timeout(CLOSE_GRACE, self.socket.write_all(&self.shared.stats)).await;
    }

    /// The first frame of a connection, after the TLS handshake if the
    /// server takes TLS only.
    async fn first_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        if let Some(config) = self.shared.tls() {
            let mut spare = 0;
            let received = received(&mut self.gate, &mut spare);
            if !self
                .socket
                .accept_tls(config, &self.shared.stats, received)
                .await?
            {
                return Ok(None);
            }
        }
        self.read_frame().await
    }

    /// Reads until the connection's first frame is buffered; `None` on a
    /// clean close. It may be at most [`MAX_FIRST_FRAME`] bytes.
    async fn read_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        let mut spare = 0;
        let received = received(&mut self.gate, &mut spare);
        self.socket.read_frame(MAX_FIRST_FRAME, received).await
    }
}
