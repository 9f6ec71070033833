//! The types the replicated log is made of.

use std::fmt;
use std::io::Cursor;

use baton_server::persist::record::{decode_proposal, encode_proposal};
use baton_server::state::Proposal;
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

/// A proposal as the replicated log carries it: serialized in Baton's own
/// binary form (the body of a log record), whatever serde format carries
/// the entry around it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change(pub Proposal);

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0.command)
    }
}

impl Serialize for Change {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::new();
        encode_proposal(&mut bytes, &self.0);
        s.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for Change {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: serde_bytes_like::Bytes = Deserialize::deserialize(d)?;
        decode_proposal(&bytes.0)
            .map(Change)
            .map_err(serde::de::Error::custom)
    }
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
