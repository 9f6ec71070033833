//! How a node is created.

/// How a node is created: whether it lives only as long as its session, and
/// whether the server appends a sequence number to its name; or a
/// container, a persistent node the server deletes once the last of its
/// children is gone (ZooKeeper's container nodes, for recipes' parents).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CreateMode {
    #[default]
    Persistent,
    Ephemeral,
    PersistentSequential,
    EphemeralSequential,
    Container,
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

    pub fn is_container(self) -> bool {
        self == CreateMode::Container
    }

    /// The mode's number: bit 0 ephemeral, bit 1 sequential; 4 a container.
    pub fn to_u8(self) -> u8 {
        match self {
            CreateMode::Container => 4,
            _ => (self.is_ephemeral() as u8) | ((self.is_sequential() as u8) << 1),
        }
    }

    /// The mode numbered `mode`, if there is one.
    pub fn from_u8(mode: u8) -> Option<Self> {
        match mode {
            0..=3 => Some(CreateMode::from_flags(mode & 1 != 0, mode & 2 != 0)),
            4 => Some(CreateMode::Container),
            _ => None,
        }
    }
}

/// How a member of a queue shares what the queue guards: the rule an
/// enqueue carries, by which the server decides when the member heads its
/// queue (see the protocol's section on queue watches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QueueRule {
    /// One member at a time, in order (a lock, a writer): a member heads once
    /// nobody is ahead of it.
    #[default]
    Exclusive,
    /// With the other shared members (readers): a member heads once no
    /// member ahead of it is exclusive. Consecutive shared members head
    /// together.
    Shared,
    /// One of `n` permits (a semaphore): a member heads while fewer than `n`
    /// members are ahead of it. `n` is at least 1.
    Permits(u32),
}

impl std::fmt::Display for QueueRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueRule::Exclusive => f.write_str("exclusive"),
            QueueRule::Shared => f.write_str("shared"),
            QueueRule::Permits(1) => f.write_str("1 permit"),
            QueueRule::Permits(n) => write!(f, "{n} permits"),
        }
    }
}

impl QueueRule {
    /// Writes the rule: `kind u8` (0 exclusive, 1 shared, 2 permits), then
    /// `permits u32` for kind 2.
    pub fn put(self, b: &mut impl bytes::BufMut) {
        match self {
            QueueRule::Exclusive => b.put_u8(0),
            QueueRule::Shared => b.put_u8(1),
            QueueRule::Permits(n) => {
                b.put_u8(2);
                b.put_u32(n);
            }
        }
    }

    /// Reads a rule written by [`put`](Self::put).
    ///
    /// # Errors
    /// A kind above 2, or a truncated field.
    pub fn read(r: &mut crate::wire::Reader<'_>) -> Result<Self, crate::DecodeError> {
        match r.u8("rule")? {
            0 => Ok(QueueRule::Exclusive),
            1 => Ok(QueueRule::Shared),
            2 => Ok(QueueRule::Permits(r.u32("permits")?)),
            other => Err(crate::DecodeError::BadValue {
                what: "rule",
                value: other.into(),
            }),
        }
    }
}
