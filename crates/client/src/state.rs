//! The session's state as the client sees it.

/// Where the session stands, published on a watch channel by the session task
/// (see [`Client::state_changes`](crate::Client::state_changes)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SessionState {
    /// Connected on the first connection.
    Connected,
    /// The connection broke; the session may still be alive and the client is
    /// trying to resume it. Calls made now wait for the reconnect.
    Disconnected,
    /// Connected again on a new connection, with the same session: ephemeral
    /// nodes and watches survived.
    Reconnected,
    /// The server expired the session. Terminal: every call fails with
    /// [`Error::SessionExpired`](crate::Error::SessionExpired).
    Expired,
    /// The client closed the session. Terminal.
    Closed,
}

impl SessionState {
    /// True when requests go straight to the server.
    pub fn is_connected(self) -> bool {
        matches!(self, SessionState::Connected | SessionState::Reconnected)
    }

    /// True once the session is gone for good.
    pub fn is_terminal(self) -> bool {
        matches!(self, SessionState::Expired | SessionState::Closed)
    }
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SessionState::Connected => "connected",
            SessionState::Disconnected => "disconnected",
            SessionState::Reconnected => "reconnected",
            SessionState::Expired => "expired",
            SessionState::Closed => "closed",
        })
    }
}
