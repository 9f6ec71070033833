//! The types the replicated log is made of.

use std::fmt;
use std::io::Cursor;

use baton_state::format::record::{decode_proposal, encode_proposal};
use baton_state::Proposal;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A member's id in the cluster, chosen by the operator (`--node-id`).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// Baton's replicated log: entries carry proposals, stamped by the
    /// leader; applying one answers with the revision it produced.
    pub TypeConfig:
        D = Change,
        R = Applied,
        NodeId = NodeId,
        Node = Member,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Metrics = openraft::RaftMetrics<NodeId, Member>;

/// Where a member can be reached: its peer address (the replicated log's
/// traffic) and its client address (what clients are sent to).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub peer: String,
    pub client: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.peer, self.client)
    }
}

/// The proposals of one entry of the replicated log, in the order they were
/// made: the leader puts every proposal made while the entries before it
/// were being written into one entry. Serialized in Baton's own binary form
/// (for each proposal its length, a u32, then the body of a log record),
/// whatever serde format carries the entry around it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change(pub Vec<Proposal>);

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{:?}", one.command),
            many => write!(f, "{} changes", many.len()),
        }
    }
}

impl Serialize for Change {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::new();
        for proposal in &self.0 {
            let at = bytes.len();
            bytes.extend_from_slice(&[0; 4]);
            encode_proposal(&mut bytes, proposal);
            let len = u32::try_from(bytes.len() - at - 4).map_err(serde::ser::Error::custom)?;
            bytes[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
        s.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for Change {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: serde_bytes_like::Bytes = Deserialize::deserialize(d)?;
        decode_change(&bytes.0)
            .map(Change)
            .map_err(serde::de::Error::custom)
    }
}

/// Why the bytes of an entry are not a [`Change`].
#[derive(Debug, thiserror::Error)]
enum ChangeDecodeError {
    #[error("an entry ends inside a proposal's length")]
    EndsInLength,
    #[error("an entry ends inside a proposal")]
    EndsInProposal,
    #[error(transparent)]
    Proposal(#[from] baton_proto::DecodeError),
}

fn decode_change(mut bytes: &[u8]) -> Result<Vec<Proposal>, ChangeDecodeError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes
            .split_first_chunk::<4>()
            .ok_or(ChangeDecodeError::EndsInLength)?;
        let len = u32::from_be_bytes(*len) as usize;
        if rest.len() < len {
            return Err(ChangeDecodeError::EndsInProposal);
        }
        let (body, rest) = rest.split_at(len);
        out.push(decode_proposal(body)?);
        bytes = rest;
    }
    Ok(out)
}

/// What applying an entry gave: the state's revision after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub revision: u64,
}

/// Deserializes a byte string (from `serialize_bytes`) in any serde format.
mod serde_bytes_like {
    use serde::de::{Deserializer, Error, SeqAccess, Visitor};

    pub struct Bytes(pub Vec<u8>);

    impl<'de> serde::Deserialize<'de> for Bytes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Bytes;

                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a byte string")
                }

                fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
                    Ok(Bytes(v.to_vec()))
                }

                fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                    Ok(Bytes(v))
                }

                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                    while let Some(b) = seq.next_element()? {
                        out.push(b);
                    }
                    Ok(Bytes(out))
                }
            }
            d.deserialize_byte_buf(V)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_proto::SessionId;
    use baton_state::{Command, Origin};

    #[test]
    fn a_change_of_several_proposals_round_trips_and_damage_is_refused() {
        let change = Change(vec![
            Proposal {
                now_ms: 7,
                origin: Some(Origin {
                    session: SessionId(3),
                    xid: 9,
                }),
                command: Command::SetData {
                    path: "/a".into(),
                    data: bytes::Bytes::from_static(b"value"),
                    version: Some(2),
                    fence: Some(40),
                },
            },
            Proposal {
                now_ms: 8,
                origin: None,
                command: Command::ExpireSession {
                    session: SessionId(3),
                },
            },
        ]);
        let bytes = bincode::serialize(&change).unwrap();
        let back: Change = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, change);
        assert_eq!(change.to_string(), "2 changes");

        let empty: Change =
            bincode::deserialize(&bincode::serialize(&Change(vec![])).unwrap()).unwrap();
        assert!(empty.0.is_empty());

        // Cut anywhere inside, the entry does not decode.
        let mut cut = bytes.clone();
        cut.truncate(bytes.len() - 3);
        let len = (cut.len() - 8) as u64;
        cut[..8].copy_from_slice(&len.to_le_bytes());
        assert!(bincode::deserialize::<Change>(&cut).is_err());
    }
}
