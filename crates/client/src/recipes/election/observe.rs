//! Following an election's leaders from the events of a persistent watch.
//!
//! The observer reads the candidates once (their names carry their tokens)
//! with the revision of that read (the election node's `pzxid`: every
//! change to its children up to it is in the list), then sets a recursive
//! persistent watch from that revision. Each candidate's creation and
//! deletion then arrives in order, so the observer knows the queue, and
//! its head, after every change: no leadership goes unseen, however short.

use std::collections::BTreeMap;

use baton_proto::path;
use bytes::Bytes;
use futures::Stream;

use super::{Election, Leader};
use crate::recipes::{ensure_path, FencingToken};
use crate::{Error, EventKind, PersistentWatch, Result, SessionId, WatchEvent};

/// What an observer knows.
struct Observer {
    election: Election,
    /// Set once the candidates were read.
    watch: Option<PersistentWatch>,
    /// The candidates, by token (creation revision), with their nodes.
    queue: BTreeMap<u64, String>,
    /// The token of the leader last reported, once one report was made.
    shown: Option<Option<u64>>,
    /// An event read ahead while gathering the events of one change.
    ahead: Option<WatchEvent>,
}

pub(super) fn observe(
    election: Election,
) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
    let observer = Observer {
        election,
        watch: None,
        queue: BTreeMap::new(),
        shown: None,
        ahead: None,
    };
    futures::stream::unfold(observer, |mut o| async move {
        let next = o.next().await;
        Some((next, o))
    })
}

/// The token in a candidate's name (`candidate-<session>-<n>-<sequence>`).
fn token_in(name: &str) -> Option<u64> {
    let (_, digits) = name.rsplit_once('-')?;
    (digits.len() >= 10 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The session in a candidate's name.
fn session_in(name: &str) -> Option<SessionId> {
    let rest = name.strip_prefix("candidate-")?;
    let (hex, _) = rest.split_once('-')?;
    u64::from_str_radix(hex, 16).ok().map(SessionId)
}

impl Observer {
    /// The next change of leader.
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if self.watch.is_none() {
                self.read_candidates().await?;
            }
            let head = self.queue.first_key_value().map(|(t, n)| (*t, n.clone()));
            let token = head.as_ref().map(|(t, _)| *t);
            if self.shown != Some(token) {
                self.shown = Some(token);
                return match head {
                    None => Ok(None),
                    Some((token, node)) => self.leader(token, node).await.map(Some),
                };
            }
            self.follow_one_change().await?;
        }
    }

    /// Reads the candidates, and watches every change after that read.
    async fn read_candidates(&mut self) -> Result<()> {
        let client = self.election.client.clone();
        let path = self.election.path.clone();
        self.election.candidates().check_path()?;
        // The election's node may be deleted between its creation and the
        // read: tried again a few times, not for ever.
        let mut tries = 0;
        loop {
            ensure_path(&client, &path).await?;
            let (names, stat) = match client.get_children(&path).await {
                Ok(listed) => listed,
                Err(Error::NoNode(_)) if tries < 5 => {
                    tries += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.queue.clear();
            for name in names {
                let node = path::join(&path, &name);
                let token = match token_in(&name) {
                    Some(t) => Some(t),
                    None => client.exists(&node).await?.map(|s| s.czxid),
                };
                if let Some(t) = token {
                    self.queue.insert(t, node);
                }
            }
            self.ahead = None;
            self.watch = Some(client.watch_from(&path, true, stat.pzxid).await?);
            return Ok(());
        }
    }

    /// Applies the events of the next change to the candidates.
    async fn follow_one_change(&mut self) -> Result<()> {
        let watch = self.watch.as_mut().expect("read first");
        let first = match self.ahead.take() {
            Some(e) => e,
            None => watch.next().await?,
        };
        // The events of one change arrive together: take those that have
        // arrived, so that a head the change removes in the same step (a
        // session's end deleting two of its candidates) is not reported.
        let mut events = vec![first];
        while let Some(e) = watch.try_next() {
            let e = e?;
            if e.revision != events[0].revision {
                self.ahead = Some(e);
                break;
            }
            events.push(e);
        }
        for e in events {
            self.apply(e);
            if self.watch.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn apply(&mut self, e: WatchEvent) {
        let path = &self.election.path;
        match e.kind {
            // Changes were missed: read the candidates afresh.
            EventKind::Compacted => self.watch = None,
            EventKind::Created if path::parent(&e.path) == Some(path) => {
                let token = token_in(path::name(&e.path)).unwrap_or(e.revision);
                self.queue.insert(token, e.path);
            }
            EventKind::Deleted if path::parent(&e.path) == Some(path) => {
                match token_in(path::name(&e.path)) {
                    Some(t) => {
                        self.queue.remove(&t);
                    }
                    None => self.queue.retain(|_, n| *n != e.path),
                }
            }
            EventKind::Deleted if e.path == *path => self.queue.clear(),
            _ => {}
        }
    }

    /// The leader whose candidate node is `node`, with its value if it can
    /// still be read.
    async fn leader(&self, token: u64, node: String) -> Result<Leader> {
        match self.election.client.get_data(&node).await {
            Ok((value, stat)) if stat.czxid == token => Ok(Leader {
                value,
                token: FencingToken(token),
                session: stat.owner(),
                node,
            }),
            Ok(_) | Err(Error::NoNode(_)) => Ok(Leader {
                value: Bytes::new(),
                token: FencingToken(token),
                session: session_in(path::name(&node)),
                node,
            }),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_names_carry_their_token_and_session() {
        assert_eq!(token_in("candidate-1f-3-0000000042"), Some(42));
        assert_eq!(
            session_in("candidate-1f-3-0000000042"),
            Some(SessionId(0x1f))
        );
        assert_eq!(token_in("plain"), None);
        assert_eq!(token_in("x-42"), None);
        assert_eq!(session_in("lock-1f-3-0000000042"), None);
    }
}
