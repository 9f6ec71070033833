//! A backup: a snapshot of the state as it is now, once the log holds all
//! of it, sent in frames (see `baton_proto::probe`).

use std::io;
use std::time::Duration;

use baton_proto::ErrorCode;
use tokio::time::{sleep, timeout, Instant};
use tracing::info;

use super::Conn;

/// How long a backup waits for the log to hold the state it copied.
const BACKUP_DURABLE_WAIT: Duration = Duration::from_secs(30);

/// The answer to a backup request that is refused: the error's wire code
/// (`code`, so that a client can tell a refusal for rights or leadership
/// from a broken server) and a message that says what to do.
pub(super) fn backup_refusal(code: ErrorCode, message: &str) -> String {
    serde_json::json!({ "error": message, "code": code.to_u16() }).to_string()
}

impl Conn {
    /// Answers a backup request: a snapshot of the state as it is now, once
    /// the log holds all of it, in frames (see `baton_proto::probe`).
    pub(super) async fn send_backup(&mut self) -> io::Result<()> {
        let shared = self.shared.clone();
        let Ok(_one_at_a_time) = shared.backups.try_acquire() else {
            let error = "another backup is being taken; try again once it is done";
            return self
                .send_backup_frame(serde_json::json!({ "error": error }).to_string().as_bytes())
                .await;
        };
        // A cluster member backs up only state a majority has committed, as
        // of the request: it must lead, and prove it (a member cut off from
        // the majority, or one whose cluster never formed, would hand out
        // its own view).
        if self.shared.replicated {
            let barrier = self.shared.core().read_barrier(None);
            let limit = BACKUP_DURABLE_WAIT;
            if !matches!(timeout(limit, barrier).await, Ok(Ok(()))) {
                let (_, leader) = self.shared.core().not_leader_notice();
                let message = if leader.is_empty() {
                    "this cluster member does not lead a majority that answers (no leader is elected, or it is cut off): a backup must hold what a majority committed; take it from the leader once there is one (baton cluster status)".to_string()
                } else {
                    format!("this cluster member does not lead; take the backup from the leader, at {leader}")
                };
                info!(peer = %self.socket.peer(), "backup refused: {message}");
                let answer = backup_refusal(ErrorCode::NotLeader, &message);
                return self.send_backup_frame(answer.as_bytes()).await;
            }
        }
        let sm = self.shared.core().state();
        let revision = sm.revision();
        let deadline = Instant::now() + BACKUP_DURABLE_WAIT;
        let mark = self.shared.mark.clone();
        while mark.get() < revision {
            if Instant::now() >= deadline {
                let error = format!(
                    "the log did not become durable up to revision {revision} within {} s",
                    BACKUP_DURABLE_WAIT.as_secs()
                );
                return self
                    .send_backup_frame(
                        &serde_json::json!({ "error": error })
                            .to_string()
                            .into_bytes(),
                    )
                    .await;
            }
            mark.hurry();
            sleep(Duration::from_millis(1)).await;
        }
        let started = std::time::Instant::now();
        let encoded = tokio::task::spawn_blocking(move || {
            let mut out = std::io::Cursor::new(Vec::new());
            crate::persist::snapshot::encode(&sm, &mut out)
                .map(|()| (out.into_inner(), sm.session_count(), sm.node_count()))
        })
        .await
        .map_err(io::Error::other)?;
        let (bytes, sessions, nodes) = match encoded {
            Ok(x) => x,
            Err(e) => {
                let error = format!("encoding the snapshot failed: {e}");
                return self
                    .send_backup_frame(
                        &serde_json::json!({ "error": error })
                            .to_string()
                            .into_bytes(),
                    )
                    .await;
            }
        };
        info!(peer = %self.socket.peer(), revision, bytes = bytes.len(), ms = started.elapsed().as_millis() as u64, "sending a backup");
        let header = serde_json::json!({
            "revision": revision,
            "bytes": bytes.len(),
            "sessions": sessions,
            "nodes": nodes,
        });
        self.send_backup_frame(header.to_string().as_bytes())
            .await?;
        for chunk in bytes.chunks(baton_proto::probe::BACKUP_CHUNK) {
            self.send_backup_frame(chunk).await?;
        }
        self.send_backup_frame(&[]).await
    }

    /// Sends one frame of a backup answer, giving up on a client that takes
    /// no bytes for the write-stall timeout.
    async fn send_backup_frame(&mut self, payload: &[u8]) -> io::Result<()> {
        baton_proto::probe::encode_answer_bytes(self.socket.wbuf.get(), payload);
        let limit = self.shared.config.write_stall_timeout;
        loop {
            self.socket.write_some(&self.shared.stats)?;
            if !self.socket.unsent() {
                return Ok(());
            }
            if timeout(limit, self.socket.stream.writable()).await.is_err() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took no bytes for {} ms", limit.as_millis()),
                ));
            }
        }
    }
}
