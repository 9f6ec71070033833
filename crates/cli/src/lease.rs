//! What `baton lock` and `baton elect` share: running a command under a
//! lease (a held lock or a leadership) and stopping it before the lease may
//! pass to someone else.
//!
//! The command must be dead before the server may expire the session. When
//! the server falls silent, the lease's `lost()` fires when the grace plus a
//! safety margin is left before the session deadline: the command gets
//! SIGTERM then, and SIGKILL when the grace is up, a margin before the
//! deadline. When the lease is already gone (its node deleted, the session
//! over), the next holder may be running, and the command gets SIGKILL at
//! once.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use baton_client::recipes::LostReason;
use baton_client::{Client, FencingToken, Leadership, LockGuard};
use tokio::time::Instant;

use crate::signals::Interrupts;
use crate::supervise::Supervised;
use crate::CliError;

/// Exit status when the lease was lost while the command ran (or was held).
pub const EXIT_LOST: u8 = 125;
/// Exit status when the command was found but could not be run.
pub const EXIT_CANNOT_RUN: u8 = 126;
/// Exit status when the command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// A held lock or leadership, as far as running a command under it goes.
pub trait Lease {
    fn token(&self) -> FencingToken;
    async fn lost(&self) -> LostReason;
}

impl Lease for LockGuard {
    fn token(&self) -> FencingToken {
        LockGuard::token(self)
    }

    async fn lost(&self) -> LostReason {
        LockGuard::lost(self).await
    }
}

impl Lease for Leadership {
    fn token(&self) -> FencingToken {
        Leadership::token(self)
    }

    async fn lost(&self) -> LostReason {
        Leadership::lost(self).await
    }
}

/// How long before the session deadline the command must be dead: room for
/// the kernel to deliver SIGKILL and for clocks that run at slightly
/// different rates.
pub fn safety_margin(session_timeout: Duration) -> Duration {
    session_timeout / 10
}

/// The grace when none is given: a fifth of the session timeout.
pub fn default_grace(session_timeout: Duration) -> Duration {
    session_timeout / 5
}

/// How long before the session deadline a holder running a command with
/// `grace` is told to stop.
pub fn stop_before(grace: Duration, session_timeout: Duration) -> Duration {
    grace + safety_margin(session_timeout)
}

/// Checks that `grace` fits in `session_timeout`: SIGTERM must come the
/// grace plus the safety margin before the session deadline, and a healthy
/// session's deadline is only about two thirds of the timeout ahead (the
/// client pings after a third of quiet), so the two may take at most half of
/// the timeout.
///
/// # Errors
/// A message saying why, and what would fit.
pub fn check_grace(grace: Duration, session_timeout: Duration) -> Result<(), CliError> {
    let margin = safety_margin(session_timeout);
    if grace + margin <= session_timeout / 2 {
        return Ok(());
    }
    let ms = |d: Duration| d.as_millis();
    let most = (session_timeout / 2).saturating_sub(margin);
    // grace + timeout/10 <= timeout/2  <=>  timeout >= 2.5 * grace
    let least_timeout = (grace.as_millis() * 5).div_ceil(2);
    Err(CliError::msg(format!(
        "--kill-grace {} ms does not fit in a session timeout of {} ms: the command must be \
         dead before the server may expire the session, so SIGTERM comes the grace plus a \
         safety margin of {} ms before the session deadline, and that may be at most half the \
         session timeout; use --kill-grace {} or less, or --session-timeout {least_timeout} or more",
        ms(grace),
        ms(session_timeout),
        ms(margin),
        ms(most),
    )))
}

/// Holds the lease until interrupted (status 0) or lost (status 125),
/// having printed its token.
pub async fn hold(lease: &impl Lease, what: &str, interrupts: &mut Interrupts) -> ExitCode {
    println!("{}", lease.token());
    eprintln!(
        "holding {what} with fencing token {}; Ctrl-C to let go",
        lease.token()
    );
    tokio::select! {
        _ = interrupts.recv() => ExitCode::SUCCESS,
        reason = lease.lost() => {
            eprintln!("baton: lost {what}: {reason}");
            ExitCode::from(EXIT_LOST)
        }
    }
}

/// How a command runs under a lease.
pub struct Run<'a> {
    /// The client whose session holds the lease.
    pub client: &'a Client,
    /// What is held, for messages ("the lock /x").
    pub what: &'a str,
    /// The program and its arguments.
    pub command: &'a [String],
    pub env: &'a [(&'a str, String)],
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// Runs the command while the lease holds, in its own process group and set
/// to die with this process. Returns its exit status (128+N if signal N
/// ended it), 125 after stopping it because the lease was lost, or 126/127
/// if it could not be started. SIGINT, SIGTERM and SIGHUP are passed on to
/// it, and it gets SIGKILL if it outlives the grace.
///
/// # Errors
/// If waiting for the command fails.
pub async fn run_under(
    lease: &impl Lease,
    run: &Run<'_>,
    interrupts: &mut Interrupts,
) -> Result<ExitCode, CliError> {
    let program = &run.command[0];
    let mut panic_hook = test_hook::panic_on_sigusr1();
    let mut child = match Supervised::spawn(program, &run.command[1..], run.env).await {
        Ok(child) => child,
        Err(e) => {
            eprintln!("baton: cannot run {program:?}: {e}");
            let code = match e.kind() {
                io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_RUN,
            };
            return Ok(ExitCode::from(code));
        }
    };
    // The command must be dead this long before the session deadline.
    let margin = safety_margin(run.client.session_timeout());
    let kill_by = || run.client.session_deadline() - margin;
    tokio::select! {
        status = child.wait() => {
            let status = status
                .map_err(|e| CliError::msg(format!("waiting for {program:?}: {e}")))?;
            Ok(exit_code(status))
        }
        reason = lease.lost() => {
            if reason == LostReason::DeadlinePassed {
                eprintln!(
                    "baton: losing {} ({reason}); stopping {program:?} before the server may \
                     expire the session (SIGTERM, SIGKILL after {} ms)",
                    run.what,
                    run.grace.as_millis()
                );
                let kill_at = (Instant::now() + run.grace).min(kill_by());
                child.stop(Some(libc::SIGTERM), kill_at, std::future::pending()).await;
            } else {
                eprintln!(
                    "baton: lost {} ({reason}); the next holder may be running already: \
                     killing {program:?} (SIGKILL)",
                    run.what
                );
                child.stop(None, Instant::now(), std::future::pending()).await;
            }
            Ok(ExitCode::from(EXIT_LOST))
        }
        sig = interrupts.recv() => {
            eprintln!(
                "baton: {sig}; passing it on to {program:?} (SIGKILL after {} ms)",
                run.grace.as_millis()
            );
            let kill_at = (Instant::now() + run.grace).min(kill_by());
            let status = child.stop(Some(sig.number()), kill_at, gone(lease)).await;
            Ok(exit_code(status))
        }
        _ = &mut panic_hook => panic!("panicking on request (BATON_TEST_PANIC_ON_SIGUSR1)"),
    }
}

/// Resolves when the lease is gone for good (not merely near its deadline,
/// which the caller's kill time covers): the next holder may be running.
async fn gone(lease: &impl Lease) {
    if lease.lost().await == LostReason::DeadlinePassed {
        std::future::pending::<()>().await;
    }
}

pub fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(sig)) => ExitCode::from(128u8.wrapping_add(sig as u8)),
        (None, None) => ExitCode::FAILURE,
    }
}

/// What a contender stores in its node: who it is.
pub fn identity() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let host = if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown host".into()
    };
    format!("pid {} on {host}", std::process::id())
}

/// For tests only: a way to make `baton` panic while it supervises a
/// command, to check that the command dies with it. Exists in debug builds
/// only, and only when BATON_TEST_PANIC_ON_SIGUSR1 is set: the future then
/// resolves on SIGUSR1. Otherwise it never resolves.
mod test_hook {
    use std::future::Future;
    use std::pin::Pin;

    pub fn panic_on_sigusr1() -> Pin<Box<dyn Future<Output = ()> + Send>> {
        #[cfg(debug_assertions)]
        if std::env::var_os("BATON_TEST_PANIC_ON_SIGUSR1").is_some() {
            use tokio::signal::unix::{signal, SignalKind};
            if let Ok(mut usr1) = signal(SignalKind::user_defined1()) {
                return Box::pin(async move {
                    usr1.recv().await;
                });
            }
        }
        Box::pin(std::future::pending())
    }
}
