//! Running a command so that it, and everything it starts, dies with
//! `baton`.
//!
//! The command runs under a reaper (`crate::reaper`): a small `baton`
//! process of its own between this one and the command, which is a child
//! subreaper and holds one end of a socket pair whose other end only this
//! process holds. What is covered, and how:
//!
//! - The command runs in its own process group, so that a signal from the
//!   terminal reaches only `baton`, which decides what the command gets;
//!   signals it passes on go to the reaper, which forwards them to that
//!   group.
//! - When the run ends on any path (the command exited, the lease was lost,
//!   a signal, a panic that unwinds, or `baton` dying without running any
//!   code of its own: SIGKILL, the OOM killer, an abort), this process's end
//!   of the socket closes, and the reaper kills every descendant of the
//!   command with SIGKILL: its process group, and every process that left
//!   it (`setsid`, a double fork), since an orphaned descendant becomes the
//!   reaper's child. Then it exits, and only then does the lease go.
//! - If the reaper itself is killed, the kernel kills the command
//!   (`PR_SET_PDEATHSIG`); what the command started is then out of reach,
//!   as it is for a process that escapes to another supervisor altogether.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::time::{sleep_until, Instant};

use crate::reaper;

/// A command running under supervision. Dropping it ends the run: the
/// reaper kills every descendant of the command.
pub struct Supervised {
    /// The reaper, whose exit status is the command's.
    child: Child,
    /// The reaper's pid, while it is not reaped.
    reaper: Option<i32>,
    /// This process's end of the socket pair: closing it ends the run.
    control: Option<UnixStream>,
    /// The command's exit status, once the reaper has exited.
    status: Option<ExitStatus>,
}

impl Supervised {
    /// Starts `program` with `args` and `env` under a reaper, in its own
    /// process group, set to die (with everything it starts) with this
    /// process.
    ///
    /// # Errors
    /// The reason it could not be started.
    pub async fn spawn(program: &str, args: &[String], env: &[(&str, String)]) -> io::Result<Self> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let theirs = OwnedFd::from(theirs);
        let fd = theirs.as_raw_fd();
        let mut command = Command::new(own_executable());
        command
            .arg(reaper::SUBCOMMAND)
            .arg(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and makes
        // only async-signal-safe calls (dup2, which also clears the new
        // descriptor's close-on-exec flag).
        unsafe {
            command.pre_exec(move || {
                if fd == reaper::CONTROL_FD {
                    // dup2 onto itself keeps close-on-exec: clear it.
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, reaper::CONTROL_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|e| {
            io::Error::other(format!(
                "cannot start baton's reaper ({}), which runs the command: {e}",
                own_executable().display()
            ))
        })?;
        drop(theirs);
        let pid = child.id().map(|pid| pid as i32);
        ours.set_nonblocking(true)?;
        let mut control = UnixStream::from_std(ours)?;
        let mut report = [0u8; reaper::REPORT_LEN];
        if control.read_exact(&mut report).await.is_err() {
            let status = child.wait().await?;
            return Err(io::Error::other(format!(
                "its reaper ended before starting it ({status})"
            )));
        }
        let value = i32::from_be_bytes(report[1..].try_into().expect("4 bytes"));
        if report[0] != 0 {
            let _ = child.wait().await;
            return Err(io::Error::from_raw_os_error(value));
        }
        Ok(Supervised {
            child,
            reaper: pid,
            control: Some(control),
            status: None,
        })
    }

    /// Waits for the command to exit and for the reaper to have killed
    /// whatever it left running.
    ///
    /// # Cancellation safety
    /// Safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.status = Some(status);
        self.reaper = None;
        self.control = None;
        Ok(status)
    }

    /// Sends `sig` to the command's process group (through the reaper);
    /// SIGKILL ends the run: everything the command started dies.
    pub fn signal(&mut self, sig: i32) {
        if sig == libc::SIGKILL {
            self.control = None;
        } else if let Some(pid) = self.reaper {
            // SAFETY: kill has no memory effects; the reaper is this
            // process's child and not reaped, so its pid is its own.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// Stops the command: sends `first` (if any) to its group, waits for it
    /// until `kill_at` or until `urgent` resolves, then kills it and every
    /// process it started. Returns the command's status.
    pub async fn stop(
        &mut self,
        first: Option<i32>,
        kill_at: Instant,
        urgent: impl std::future::Future<Output = ()>,
    ) -> ExitStatus {
        if let Some(sig) = first {
            self.signal(sig);
        }
        tokio::select! {
            status = self.wait() => if let Ok(status) = status {
                return status;
            },
            _ = sleep_until(kill_at) => {}
            _ = urgent => {}
        }
        self.signal(libc::SIGKILL);
        // SIGKILL cannot be refused; this wait is for the kernel and the
        // reaper's rounds only.
        self.wait()
            .await
            .unwrap_or_else(|_| ExitStatus::from_raw(libc::SIGKILL))
    }
}

impl Drop for Supervised {
    /// Ends the run, and waits (a bounded while) for the reaper to have
    /// killed everything: the lease this process holds is let go after the
    /// drop (a panic unwinding, an error returned), and must not be while
    /// anything the command started still runs.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        self.control = None;
        let deadline = std::time::Instant::now() + REAPER_WAIT;
        while std::time::Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(1)),
                _ => return,
            }
        }
        eprintln!(
            "baton: the command's reaper had not finished within {} s; going on",
            REAPER_WAIT.as_secs()
        );
    }
}

/// How long a dropped run waits for the reaper to finish.
const REAPER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// This program, to run as a reaper: the running executable itself, even if
/// its file was replaced since it started.
fn own_executable() -> std::path::PathBuf {
    if cfg!(target_os = "linux") {
        "/proc/self/exe".into()
    } else {
        std::env::current_exe().unwrap_or_else(|_| "baton".into())
    }
}
