//! Answering other members: the peer listener and one task per connection.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tracing::{debug, info};

use crate::joining::JoiningError;
use crate::types::{LogId, NodeId, Raft};

use super::answering::Answering;
use super::tls::PeerIo;
use super::wire::*;

/// A leader's word that this member's log went back, refused: the log
/// holds the index the leader says it lost.
#[derive(Debug, thiserror::Error)]
#[error("this member's log holds index {held} (it ends at {last})")]
pub(super) struct StillHeld {
    held: u64,
    last: u64,
}

/// The leader says this member held the log up to `held` and now lacks
/// entries at or below it: if its log indeed ends before `held`, it stops.
pub(super) fn went_back(answering: &Answering, held: LogId) -> Result<(), StillHeld> {
    let last = answering.raft.metrics().borrow().last_log_index;
    if let Some(last) = last.filter(|last| *last >= held.index) {
        return Err(StillHeld {
            held: held.index,
            last,
        });
    }
    let id = raft_id(&answering.raft);
    let why = format!(
        "this member's data went back: it had told the leader it held the log up to {held}, and its log now ends at {}. It was started from an old copy of its data directory (a backup or a disk snapshot put back), and entries the cluster acknowledged may rest on what it lost. It must not take part again as it is: remove it (baton cluster remove {id}), empty its data directory, start it with --join and add it again (baton cluster add {id} ...); see docs/operations.md",
        last.map_or("nothing".to_string(), |l| format!("index {l}"))
    );
    tracing::error!("{why}");
    answering.went_back.send_replace(Some(why));
    Ok(())
}

/// Answers other members on `listener` until `stop` is set.
pub async fn serve(listener: TcpListener, answering: Answering, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(answer(
                    stream,
                    peer.to_string(),
                    answering.clone(),
                    stop.clone(),
                ));
            }
            Err(e) => {
                debug!("peer accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

pub(super) fn raft_id(raft: &Raft) -> NodeId {
    raft.metrics().borrow().id
}

/// Answers one member's connection.
pub(super) async fn answer(
    stream: TcpStream,
    peer: String,
    answering: Answering,
    mut stop: watch::Receiver<bool>,
) {
    let raft = &answering.raft;
    let io: Box<dyn PeerIo> = match &answering.tls {
        None => Box::new(stream),
        Some(tls) => {
            let shake = tls.acceptor.accept(stream);
            match tokio::time::timeout(Duration::from_secs(5), shake).await {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(e)) => {
                    info!(%peer, "closing a peer connection: TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    info!(%peer, "closing a peer connection: no TLS handshake within 5 s");
                    return;
                }
            }
        }
    };
    let greeting = LengthDelimitedCodec::builder()
        .max_frame_length(MAX_HELLO_FRAME)
        .new_codec();
    let mut framed = Framed::new(io, greeting);
    let hello = match tokio::time::timeout(Duration::from_secs(5), framed.next()).await {
        Ok(Some(Ok(frame))) => bincode::deserialize::<Hello>(&frame).ok(),
        _ => None,
    };
    let Some(hello) = hello.filter(|h| h.magic == MAGIC) else {
        info!(%peer, "closing a peer connection that did not greet like a Baton member");
        return;
    };
    if hello.version != VERSION {
        info!(%peer, version = hello.version, "closing a peer connection of another protocol version");
        return;
    }
    framed.codec_mut().set_max_frame_length(MAX_FRAME);
    loop {
        let frame = tokio::select! {
            f = framed.next() => f,
            _ = stop.changed() => return,
        };
        let Some(Ok(frame)) = frame else { return };
        let Some((id, Ok(request))) =
            split_call(&frame).map(|(id, rest)| (id, bincode::deserialize::<Request>(rest)))
        else {
            info!(%peer, from = hello.from, "closing a peer connection: undecodable request");
            return;
        };
        let response = match request {
            Request::Append(r) => Response::Append(raft.append_entries(r).await),
            Request::Vote(r) => Response::Vote(raft.vote(r).await),
            Request::Snapshot(r) => Response::Snapshot(raft.install_snapshot(r).await),
            Request::Status => Response::Status(MemberStatus::of(raft)),
            // The answers carry the errors' messages.
            Request::Change(change) => Response::Changed(
                crate::admin::change(&answering, change)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            Request::Serve {
                change,
                heard,
                confirm,
                applied,
            } => Response::Served(match &answering.leader_side {
                Some(side) => side.serve(change, heard, confirm, applied).await,
                None => Err("this member does not serve followers".into()),
            }),
            Request::WentBack { held } => {
                Response::WentBack(went_back(&answering, held).map_err(|e| e.to_string()))
            }
            Request::Added { id, at } => Response::Added(
                match &answering.joining {
                    Some(joining) => joining.told(id, at),
                    // Already in: a word repeated by a leader that retried.
                    None if id == raft_id(raft) => Ok(()),
                    None => Err(JoiningError::OtherMember {
                        this: raft_id(raft),
                        id,
                    }),
                }
                .map_err(|e| e.to_string()),
            ),
        };
        let mut bytes = match encode_call(&response) {
            Ok(b) => b,
            Err(e) => {
                info!(%peer, "cannot encode an answer: {e}");
                return;
            }
        };
        bytes[..CALL_ID].copy_from_slice(&id.to_be_bytes());
        if framed.send(bytes.freeze()).await.is_err() {
            return;
        }
    }
}
