//! How a node is created.

/// How a node is created: whether it lives only as long as its session, and
/// whether the server appends a sequence number to its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CreateMode {
    #[default]
    Persistent,
    Ephemeral,
    PersistentSequential,
    EphemeralSequential,
}

impl CreateMode {
    pub fn from_flags(ephemeral: bool, sequential: bool) -> Self {
        match (ephemeral, sequential) {
            (false, false) => CreateMode::Persistent,
            (true, false) => CreateMode::Ephemeral,
            (false, true) => CreateMode::PersistentSequential,
            (true, true) => CreateMode::EphemeralSequential,
        }
    }

    pub fn is_ephemeral(self) -> bool {
        matches!(
            self,
            CreateMode::Ephemeral | CreateMode::EphemeralSequential
        )
    }

    pub fn is_sequential(self) -> bool {
        matches!(
            self,
            CreateMode::PersistentSequential | CreateMode::EphemeralSequential
        )
    }

    pub(crate) fn to_u8(self) -> u8 {
        (self.is_ephemeral() as u8) | ((self.is_sequential() as u8) << 1)
    }

    pub(crate) fn from_u8(mode: u8) -> Option<Self> {
        (mode < 4).then(|| CreateMode::from_flags(mode & 1 != 0, mode & 2 != 0))
    }
}
