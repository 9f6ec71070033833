//! The one error type of the client.

use baton_proto::ErrorCode;

/// Everything a client call can fail with. Variants named after a wire code
/// carry the server's message, which names the path and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("no node: {0}")]
    NoNode(String),
    #[error("node exists: {0}")]
    NodeExists(String),
    #[error("bad version: {0}")]
    BadVersion(String),
    #[error("not empty: {0}")]
    NotEmpty(String),
    #[error("no children for ephemerals: {0}")]
    NoChildrenForEphemerals(String),
    #[error("invalid path: {0}")]
    InvalidPath(String),
    #[error("value too large: {0}")]
    ValueTooLarge(String),
    /// The session is gone: expired on the server, or closed. Every later call
    /// fails the same way; open a new [`Client`](crate::Client).
    #[error("session expired: {0}")]
    SessionExpired(String),
    /// The client was closed with [`Client::close`](crate::Client::close).
    #[error("the client was closed")]
    Closed,
    /// The request's outcome is unknown: it may or may not have been applied.
    /// Requests in flight when a connection breaks are sent again once the
    /// session is resumed; this is what one gets whose reply the server no
    /// longer keeps (it was handled, and was not applied again), or a request
    /// of a session that could not be resumed in time.
    #[error("connection lost: {0}")]
    ConnectionLoss(String),
    /// No server could be reached to open the session. `reason` says why
    /// in words (the cause's own words included); `cause`, when there is
    /// one, is the error underneath (an [`std::io::Error`] whose kind a
    /// program can test, say), also given by `source()`.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        addr: String,
        reason: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The cluster member reached does not lead, and no member that leads
    /// could be reached (or none leads right now, during an election).
    #[error("no cluster member that leads could be reached: {0}")]
    NotLeader(String),
    #[error("server is shutting down: {0}")]
    ShuttingDown(String),
    #[error("server refused: too many connections: {0}")]
    TooManyConnections(String),
    #[error("bad arguments: {0}")]
    BadArguments(String),
    /// A fenced write carried a token lower than one the node has already
    /// accepted: the writer's lock or leadership was lost. Nothing changed.
    #[error("stale fencing token: {0}")]
    StaleFence(String),
    /// The server and the client disagree about the protocol: a bug on one
    /// side, or a peer that is not a Baton server.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server checks identities and did not accept this client's: no
    /// token, or one that names no identity.
    #[error("authentication failed: {0}")]
    AuthenticationFailed(String),
    /// The client's identity lacks the right the request needs; the message
    /// names the identity, the right and the path. Nothing was done.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// TLS settings that cannot be used: a file that cannot be read, or a
    /// certificate and key that do not go together. `reason` names the file
    /// and what is wrong; `cause`, when there is one, is the error
    /// underneath (rustls's, say).
    #[error("TLS settings: {reason}")]
    Tls {
        reason: String,
        #[source]
        cause: Option<Cause>,
    },
    /// A transaction changed nothing: its operation at `index` (from 0)
    /// failed with `error`; the operations before it were rolled back, those
    /// after it never tried.
    #[error("operation {index} of the transaction failed, so nothing was applied: {error}")]
    TxnFailed { index: u32, error: Box<Error> },
    /// A transaction holds more operations than one may.
    #[error("too many operations: {0}")]
    TooManyOperations(String),
    /// Any other error code the server sent.
    #[error("{code}: {message}")]
    Server { code: ErrorCode, message: String },
}

/// The error underneath another, kept so that [`Error`] stays `Clone`: two
/// causes are equal when they say the same.
#[derive(Clone)]
pub struct Cause(std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl Cause {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Cause(std::sync::Arc::new(error))
    }

    /// The error underneath, to downcast (`cause.get().downcast_ref::<std::io::Error>()`).
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

impl Error {
    /// A connection failure at `addr`, for `reason`, with no error under it.
    pub(crate) fn connect(addr: &str, reason: impl Into<String>) -> Self {
        Error::Connect {
            addr: addr.to_owned(),
            reason: reason.into(),
            cause: None,
        }
    }

    /// A connection failure at `addr`, said as `reason`, because of
    /// `cause` (kept, and named in the reason by the caller).
    pub(crate) fn connect_because(
        addr: &str,
        reason: String,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Connect {
            addr: addr.to_owned(),
            reason,
            cause: Some(Cause::new(cause)),
        }
    }

    /// A PEM file that does not give the certificates or key asked for.
    pub(crate) fn pem(e: baton_proto::pem::PemError) -> Self {
        Error::tls_because(e.to_string(), e)
    }

    /// Unusable TLS settings, said as `reason`, because of `cause`.
    pub(crate) fn tls_because(
        reason: String,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Tls {
            reason,
            cause: Some(Cause::new(cause)),
        }
    }

    /// The error for a code and message received from the server.
    pub fn from_wire(code: ErrorCode, message: String) -> Self {
        match code {
            ErrorCode::NoNode => Error::NoNode(message),
            ErrorCode::NodeExists => Error::NodeExists(message),
            ErrorCode::BadVersion => Error::BadVersion(message),
            ErrorCode::NotEmpty => Error::NotEmpty(message),
            ErrorCode::NoChildrenForEphemerals => Error::NoChildrenForEphemerals(message),
            ErrorCode::InvalidPath => Error::InvalidPath(message),
            ErrorCode::ValueTooLarge => Error::ValueTooLarge(message),
            ErrorCode::SessionExpired => Error::SessionExpired(message),
            ErrorCode::ShuttingDown => Error::ShuttingDown(message),
            ErrorCode::TooManyConnections => Error::TooManyConnections(message),
            ErrorCode::BadArguments => Error::BadArguments(message),
            ErrorCode::StaleFence => Error::StaleFence(message),
            ErrorCode::AuthenticationFailed => Error::AuthenticationFailed(message),
            ErrorCode::PermissionDenied => Error::PermissionDenied(message),
            ErrorCode::TooManyOperations => Error::TooManyOperations(message),
            // Handled before a connection broke, its reply lost: its outcome
            // is as unknown as that of a request cut off in flight.
            ErrorCode::ResultLost => Error::ConnectionLoss(message),
            ErrorCode::UnknownOperation
            | ErrorCode::MalformedRequest
            | ErrorCode::UnsupportedVersion
            | ErrorCode::FrameTooLarge => Error::Protocol(format!("{code}: {message}")),
            code => Error::Server { code, message },
        }
    }

    /// The wire code this error mirrors, if it came from the server.
    pub fn code(&self) -> Option<ErrorCode> {
        Some(match self {
            Error::NoNode(_) => ErrorCode::NoNode,
            Error::NodeExists(_) => ErrorCode::NodeExists,
            Error::BadVersion(_) => ErrorCode::BadVersion,
            Error::NotEmpty(_) => ErrorCode::NotEmpty,
            Error::NoChildrenForEphemerals(_) => ErrorCode::NoChildrenForEphemerals,
            Error::InvalidPath(_) => ErrorCode::InvalidPath,
            Error::ValueTooLarge(_) => ErrorCode::ValueTooLarge,
            Error::SessionExpired(_) => ErrorCode::SessionExpired,
            Error::ShuttingDown(_) => ErrorCode::ShuttingDown,
            Error::TooManyConnections(_) => ErrorCode::TooManyConnections,
            Error::BadArguments(_) => ErrorCode::BadArguments,
            Error::StaleFence(_) => ErrorCode::StaleFence,
            Error::AuthenticationFailed(_) => ErrorCode::AuthenticationFailed,
            Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Error::TooManyOperations(_) => ErrorCode::TooManyOperations,
            Error::TxnFailed { error, .. } => return error.code(),
            Error::Server { code, .. } => *code,
            _ => return None,
        })
    }

    /// True if trying again later may succeed: the connection broke or the
    /// server was busy or stopping. Errors about the request itself, and a
    /// lost session, are not retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::ConnectionLoss(_)
                | Error::ShuttingDown(_)
                | Error::TooManyConnections(_)
                | Error::Connect { .. }
                | Error::NotLeader(_)
        )
    }

    /// True if the session is gone for good (expired or closed).
    pub fn is_session_gone(&self) -> bool {
        matches!(self, Error::SessionExpired(_) | Error::Closed)
    }
}

/// Shorthand for results of client calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused connection keeps the operating system's error under it, so
    /// that a program can tell a refusal from a timeout by its kind.
    #[tokio::test]
    async fn a_refused_connection_keeps_its_io_error_as_the_cause() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let Err(e) = crate::wire::connect(&addr, None).await else {
            panic!("connected to a closed port");
        };
        let Error::Connect {
            cause: Some(ref cause),
            ref reason,
            ..
        } = e
        else {
            panic!("{e:?}");
        };
        let io = cause
            .get()
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        assert_eq!(reason, &io.to_string());
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), io.to_string());
        // Still Clone and comparable, cause and all.
        assert_eq!(e.clone(), e);
    }
}
