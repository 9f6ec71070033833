//! The status probe: what a server says of itself, without a session.

use std::time::Duration;

use baton_proto::probe::encode_probe;
use baton_proto::{frame_codec, MAX_RESPONSE_FRAME};
use bytes::BytesMut;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use crate::error::{Error, Result};

/// Asks the server at `addr` to describe itself: its role (a single
/// server, or a cluster member that leads or follows, with the leader's
/// address), its counts, and in a cluster the members and their progress.
/// Any server answers, a cluster member that does not lead included.
///
/// Returns the server's JSON object as text (see docs/protocol.md,
/// "Status probe").
///
/// # Errors
/// [`Error::Connect`] if the server cannot be reached or does not answer
/// within `limit`.
pub async fn probe(addr: &str, limit: Duration) -> Result<String> {
    let failed = |reason: String| Error::Connect {
        addr: addr.to_owned(),
        reason,
    };
    let ask = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut buf = BytesMut::new();
        encode_probe(&mut buf);
        stream
            .write_all(&buf)
            .await
            .map_err(|e| failed(format!("sending the probe: {e}")))?;
        let (read, _write) = stream.into_split();
        let mut frames = FramedRead::new(read, frame_codec(MAX_RESPONSE_FRAME));
        match frames.next().await {
            Some(Ok(frame)) => String::from_utf8(frame.to_vec())
                .map_err(|_| failed("the answer is not UTF-8: not a Baton server?".into())),
            Some(Err(e)) => Err(failed(format!("reading the answer: {e}"))),
            None => Err(failed(
                "the server closed the connection without answering (a server too old for the probe?)".into(),
            )),
        }
    };
    match tokio::time::timeout(limit, ask).await {
        Ok(r) => r,
        Err(_) => Err(failed(format!("no answer within {} ms", limit.as_millis()))),
    }
}
