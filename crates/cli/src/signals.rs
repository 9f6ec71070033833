//! The signals that end a long-running command: SIGINT (Ctrl-C), SIGTERM
//! (what service managers send) and SIGHUP (the terminal went away), all
//! handled alike: the command closes its session, then exits.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::CliError;

/// SIGINT, SIGTERM and SIGHUP, as they arrive. From the moment this exists
/// until the process exits, none of them ends the process by itself.
pub struct Interrupts {
    int: Signal,
    term: Signal,
    hup: Signal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    Int,
    Term,
    Hup,
}

impl Interrupt {
    pub fn number(self) -> i32 {
        match self {
            Interrupt::Int => libc::SIGINT,
            Interrupt::Term => libc::SIGTERM,
            Interrupt::Hup => libc::SIGHUP,
        }
    }
}

impl std::fmt::Display for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interrupt::Int => "SIGINT",
            Interrupt::Term => "SIGTERM",
            Interrupt::Hup => "SIGHUP",
        })
    }
}

impl Interrupts {
    /// Starts listening.
    ///
    /// # Errors
    /// If a signal handler cannot be installed.
    pub fn new() -> Result<Self, CliError> {
        let listen = |kind| {
            signal(kind).map_err(|e| CliError::msg(format!("cannot listen for signals: {e}")))
        };
        Ok(Interrupts {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next signal.
    ///
    /// # Cancellation safety
    /// Safe: a signal that arrives meanwhile waits for the next call.
    pub async fn recv(&mut self) -> Interrupt {
        tokio::select! {
            _ = self.int.recv() => Interrupt::Int,
            _ = self.term.recv() => Interrupt::Term,
            _ = self.hup.recv() => Interrupt::Hup,
        }
    }
}
