//! The stat structure: a node's metadata, as every reply that describes a
//! node carries it.

use bytes::BufMut;

use crate::error::DecodeError;
use crate::wire::Reader;
use crate::SessionId;

/// A node's metadata.
///
/// Revisions are positions in the server's single history of changes: every
/// change gets the next revision. A sequential node's sequence number is its
/// creation revision, which is why it only ever grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Stat {
    /// Revision of the change that created the node.
    pub czxid: u64,
    /// Revision of the change that last set the node's data (or created it).
    pub mzxid: u64,
    /// Revision of the last change to the node's list of children.
    pub pzxid: u64,
    /// Creation time, milliseconds since the Unix epoch, from the server's clock.
    pub ctime: u64,
    /// Time of the last data change, milliseconds since the Unix epoch.
    pub mtime: u64,
    /// Number of data changes since creation.
    pub version: u32,
    /// Number of changes to the list of children since creation.
    pub cversion: u32,
    /// Session that owns the node if it is ephemeral, else 0.
    pub ephemeral_owner: u64,
    pub data_length: u32,
    pub num_children: u32,
}

impl Stat {
    /// Encoded size in bytes.
    pub const LEN: usize = 64;

    pub fn encode(&self, b: &mut impl BufMut) {
        b.put_u64(self.czxid);
        b.put_u64(self.mzxid);
        b.put_u64(self.pzxid);
        b.put_u64(self.ctime);
        b.put_u64(self.mtime);
        b.put_u32(self.version);
        b.put_u32(self.cversion);
        b.put_u64(self.ephemeral_owner);
        b.put_u32(self.data_length);
        b.put_u32(self.num_children);
    }

    pub(crate) fn decode(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Stat {
            czxid: r.u64("stat")?,
            mzxid: r.u64("stat")?,
            pzxid: r.u64("stat")?,
            ctime: r.u64("stat")?,
            mtime: r.u64("stat")?,
            version: r.u32("stat")?,
            cversion: r.u32("stat")?,
            ephemeral_owner: r.u64("stat")?,
            data_length: r.u32("stat")?,
            num_children: r.u32("stat")?,
        })
    }

    /// The owning session of an ephemeral node.
    pub fn owner(&self) -> Option<SessionId> {
        (self.ephemeral_owner != 0).then_some(SessionId(self.ephemeral_owner))
    }
}
