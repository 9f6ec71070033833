//! Running a command so that it dies with `baton`.
//!
//! What is covered, and how:
//!
//! - The command runs in its own process group, so that stopping it reaches
//!   what it started, and a signal from the terminal reaches only `baton`,
//!   which decides what the command gets.
//! - Before it executes, the command asks the kernel for SIGKILL when its
//!   parent goes (`PR_SET_PDEATHSIG`), so a `baton` that dies without
//!   running any code of its own (SIGKILL, the OOM killer, an abort) takes
//!   the command with it. The kernel sends that signal when the *thread*
//!   that forked the command ends, so commands are forked from one thread
//!   that lives as long as the process. A `baton` that died before the
//!   request was made is caught by checking the parent's pid right after it.
//! - On every path where `baton` itself ends the run (the command exited,
//!   the lease was lost, a signal, a panic that unwinds), the whole process
//!   group gets SIGKILL before the lease is let go, so nothing the command
//!   left running in the background outlives the lease.
//!
//! Not covered: when `baton` dies without running code, the parent-death
//! signal reaches the command alone, not the processes it started; and a
//! process that leaves the command's process group (`setsid`, `setpgid`)
//! is out of reach on every path. Run under a service manager that kills
//! the whole control group, and have shell wrappers `exec` the real program,
//! where that matters.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::sync::OnceLock;

use tokio::process::{Child, Command};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::{sleep_until, Instant};

/// A command running under supervision. Dropping it kills its process
/// group, unless that was done already.
pub struct Supervised {
    child: Child,
    /// The process group, named by its leader's pid.
    group: i32,
    /// The leader's exit status, once reaped.
    status: Option<ExitStatus>,
    /// The group has had its final SIGKILL.
    finished: bool,
}

/// A command to fork, and where to say how it went.
struct Job {
    command: Command,
    runtime: Handle,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// The thread commands are forked from: it never ends before the process
/// does (its channel's sender lives in a static), which is what the
/// parent-death signal needs.
fn spawner() -> io::Result<&'static mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    if let Some(tx) = SPAWNER.get() {
        return Ok(tx);
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("baton-spawner".into())
        .spawn(move || {
            for mut job in rx {
                let _runtime = job.runtime.enter();
                if let Err(Ok(child)) = job.reply.send(job.command.spawn()) {
                    // Nobody waits for it any more: it must not run alone.
                    if let Some(pid) = child.id() {
                        // SAFETY: kill has no memory effects.
                        unsafe {
                            libc::kill(-(pid as i32), libc::SIGKILL);
                        }
                    }
                }
            }
        })?;
    Ok(SPAWNER.get_or_init(|| tx))
}

impl Supervised {
    /// Starts `program` with `args` and `env`, in its own process group,
    /// set to die with this process.
    ///
    /// # Errors
    /// The reason it could not be started.
    pub async fn spawn(program: &str, args: &[String], env: &[(&str, String)]) -> io::Result<Self> {
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .process_group(0);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec, and
        // makes only async-signal-safe calls (prctl, getppid) and builds
        // errors without allocating.
        unsafe {
            command.pre_exec(move || {
                #[cfg(target_os = "linux")]
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before the request was made.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            command,
            runtime: Handle::current(),
            reply,
        };
        spawner()?
            .send(job)
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        let child = answer
            .await
            .map_err(|_| io::Error::other("the spawner thread is gone"))??;
        let group = child.id().map_or(0, |pid| pid as i32);
        Ok(Supervised {
            child,
            group,
            status: None,
            finished: false,
        })
    }

    /// Waits for the command (the group's leader) to exit, then kills what
    /// is left of its group.
    ///
    /// # Cancellation safety
    /// Safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.status = Some(status);
        self.finish();
        Ok(status)
    }

    /// Sends `sig` to the command's process group.
    pub fn signal(&self, sig: i32) {
        if self.group > 0 && !self.finished {
            // SAFETY: kill has no memory effects; a negative pid names the
            // process group the command leads.
            unsafe {
                libc::kill(-self.group, sig);
            }
        }
    }

    /// Stops the command: sends `first` (if any) to its group, waits for it
    /// until `kill_at` or until `urgent` resolves, then sends SIGKILL to the
    /// group. Returns the command's status.
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
        // SIGKILL cannot be refused; this wait is for the kernel only.
        self.wait()
            .await
            .unwrap_or_else(|_| ExitStatus::from_raw(libc::SIGKILL))
    }

    /// The final SIGKILL to the group. Right after the leader is reaped, so
    /// its pid (the group's id) has had no time to be given out again.
    fn finish(&mut self) {
        self.signal(libc::SIGKILL);
        self.finished = true;
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}
