//! `baton __reap`: the small process between `baton lock` (or `baton
//! elect`) and the command it runs, which makes every descendant of the
//! command die with the run, however `baton` ends.
//!
//! ```text
//! baton ──(socket pair)── reaper ──> command, in a process group of its own
//!                           └──────> whatever the command leaves behind
//! ```
//!
//! - The reaper is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a process
//!   the command started whose parent then exits becomes the reaper's child,
//!   not init's, so a daemon that double-forks and calls `setsid` stays
//!   within reach.
//! - It holds one end of a socket pair whose other end only `baton` holds.
//!   When that end closes (`baton` ended the run, or died in any way,
//!   SIGKILL and the OOM killer included: the kernel closes its
//!   descriptors), the reaper kills every descendant with SIGKILL, reaps
//!   them all, and exits.
//! - When the command exits, the reaper kills whatever it left running the
//!   same way, then exits with the command's status (by the same signal, if
//!   a signal ended it), so `baton` sees the command's status as its own
//!   child's.
//! - The signals `baton` passes on (TERM, INT, HUP, QUIT, USR1, USR2) it
//!   forwards to the command's process group; the same signals from anyone
//!   else (a service manager signalling every process of its group, which
//!   reaches the command directly) are not forwarded a second time.
//! - It first tells `baton`, on the socket, whether the command started:
//!   its pid, or the error number of the failure.
//!
//! It runs no async runtime and allocates nothing after the command starts
//! but what reading `/proc` takes: it must keep working whatever the
//! command does.

use std::ffi::OsString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicI32, Ordering};

/// The hidden subcommand that makes `baton` a reaper.
pub const SUBCOMMAND: &str = "__reap";
/// The descriptor a reaper finds its end of the socket pair at.
pub const CONTROL_FD: RawFd = 3;
/// Bytes of the report a reaper sends first: a tag (0 started, 1 failed)
/// and a big-endian `i32` (the command's pid, or the error number).
pub const REPORT_LEN: usize = 5;

/// The signals a reaper forwards to the command's process group.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// The write end of the pipe the signal handler wakes the loop through.
static WAKE: AtomicI32 = AtomicI32::new(-1);
/// `baton`, the only sender whose signals are forwarded.
static PARENT: AtomicI32 = AtomicI32::new(0);

/// How long the reaper goes on killing what will not die (a process of
/// another user, one stuck in the kernel) before it gives up and says so.
const KILL_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let from = unsafe { (*info).si_pid() };
    if sig != libc::SIGCHLD && from != PARENT.load(Ordering::Relaxed) {
        return;
    }
    let fd = WAKE.load(Ordering::Relaxed);
    let byte = sig as u8;
    // SAFETY: write(2) is async-signal-safe; a full pipe drops the byte,
    // and the loop reaps and forwards on every wake-up anyway.
    unsafe {
        libc::write(fd, (&byte as *const u8).cast(), 1);
    }
}

/// Runs a reaper for `args` (the program and its arguments) and exits as
/// the command did. Never returns.
pub fn run(args: Vec<OsString>) -> ! {
    let Some((program, rest)) = args.split_first() else {
        eprintln!("baton {SUBCOMMAND}: no command given (this subcommand is baton's own)");
        std::process::exit(2);
    };
    // SAFETY: plain system calls on descriptors and settings of this
    // process; the handler installed only writes to a pipe.
    unsafe {
        libc::fcntl(CONTROL_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        PARENT.store(libc::getppid(), Ordering::Relaxed);
        #[cfg(target_os = "linux")]
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
        let mut pipe = [0; 2];
        if libc::pipe(pipe.as_mut_ptr()) != 0 {
            fail_to_start(io::Error::last_os_error());
        }
        for fd in pipe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK);
        }
        WAKE.store(pipe[1], Ordering::Relaxed);
        for sig in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP | libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(*sig, &action, std::ptr::null_mut());
        }
        let command = start(program, rest);
        let mut status = None;
        wait_for_end(command, pipe[0], &mut status);
        kill_all(command, pipe[0], &mut status);
        mirror(status)
    }
}

/// Starts the command in a process group of its own, set to die if the
/// reaper does, and reports how that went to `baton`.
fn start(program: &OsString, args: &[OsString]) -> libc::pid_t {
    let mut command = std::process::Command::new(program);
    command.args(args).process_group(0);
    // SAFETY: getpid in this process; in the forked child, prctl and
    // getppid, which are async-signal-safe.
    let reaper = unsafe { libc::getpid() };
    unsafe {
        command.pre_exec(move || {
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            // The reaper may have died before the request was made.
            if libc::getppid() != reaper {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    match command.spawn() {
        Ok(child) => {
            let pid = child.id() as libc::pid_t;
            report(0, pid);
            // The child is waited for with waitpid below, not through std.
            std::mem::forget(child);
            pid
        }
        Err(e) => fail_to_start(e),
    }
}

fn fail_to_start(e: io::Error) -> ! {
    report(1, e.raw_os_error().unwrap_or(libc::EIO));
    std::process::exit(127);
}

fn report(tag: u8, value: i32) {
    let mut message = [0u8; REPORT_LEN];
    message[0] = tag;
    message[1..].copy_from_slice(&value.to_be_bytes());
    // SAFETY: writes from a local buffer; a baton that is gone reads
    // nothing, and the reaper then finds the socket closed.
    unsafe {
        libc::write(CONTROL_FD, message.as_ptr().cast(), REPORT_LEN);
    }
}

/// Waits until the command exits (its wait status goes to `status`) or
/// `baton`'s end of the socket closes, forwarding signals meanwhile.
///
/// # Safety
/// `wake` is the read end of the handler's pipe.
unsafe fn wait_for_end(command: libc::pid_t, wake: RawFd, status: &mut Option<libc::c_int>) {
    loop {
        reap_exited(command, status);
        if status.is_some() {
            return;
        }
        let mut fds = [
            libc::pollfd {
                fd: CONTROL_FD,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
            continue; // EINTR
        }
        if fds[1].revents != 0 {
            let mut signals = [0u8; 64];
            let n = libc::read(wake, signals.as_mut_ptr().cast(), signals.len());
            for &sig in &signals[..n.max(0) as usize] {
                let sig = libc::c_int::from(sig);
                if sig != libc::SIGCHLD && status.is_none() {
                    // The group is named by the command's pid, which is
                    // not reaped yet (reap_exited stops the loop first).
                    libc::kill(-command, sig);
                }
            }
        }
        if fds[0].revents != 0 {
            let mut byte = 0u8;
            let n = libc::read(CONTROL_FD, (&mut byte as *mut u8).cast(), 1);
            if n <= 0 {
                // baton closed its end, or is gone.
                return;
            }
        }
    }
}

/// Reaps every child that has exited, noting the command's status.
///
/// # Safety
/// Plain system calls.
unsafe fn reap_exited(command: libc::pid_t, status: &mut Option<libc::c_int>) {
    loop {
        let mut st = 0;
        let pid = libc::waitpid(-1, &mut st, libc::WNOHANG);
        if pid <= 0 {
            return;
        }
        if pid == command {
            *status = Some(st);
        }
    }
}

/// Kills every descendant with SIGKILL and reaps them all: the command's
/// process group while the command is not reaped (its pid still names the
/// group), and every child of the reaper, round after round, since each
/// process killed hands its own children over to the reaper. Gives up,
/// saying so, after [`KILL_LIMIT`] (a process of another user, one stuck in
/// the kernel, or no `/proc` to find the orphans in).
///
/// # Safety
/// Plain system calls; `wake` is the read end of the handler's pipe.
unsafe fn kill_all(command: libc::pid_t, wake: RawFd, status: &mut Option<libc::c_int>) {
    let deadline = std::time::Instant::now() + KILL_LIMIT;
    loop {
        if status.is_none() {
            libc::kill(-command, libc::SIGKILL);
        }
        for child in children_of(libc::getpid()) {
            libc::kill(child, libc::SIGKILL);
        }
        loop {
            let mut st = 0;
            let pid = libc::waitpid(-1, &mut st, libc::WNOHANG);
            if pid == command {
                status.get_or_insert(st);
            }
            if pid > 0 {
                continue;
            }
            if pid < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
                return; // nothing is left
            }
            break; // children remain, none exited yet (or EINTR)
        }
        if std::time::Instant::now() >= deadline {
            eprintln!(
                "baton: processes the command started did not die within {} s of SIGKILL (another user's, stuck in the kernel, or out of sight without /proc); going on without them",
                KILL_LIMIT.as_secs()
            );
            return;
        }
        // Until a child exits (SIGCHLD wakes the pipe), or 10 ms.
        let mut fds = [libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        }];
        if libc::poll(fds.as_mut_ptr(), 1, 10) > 0 {
            let mut drain = [0u8; 64];
            libc::read(wake, drain.as_mut_ptr().cast(), drain.len());
        }
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// A process's parent, from `/proc/PID/stat` (the fourth field, after the
/// parenthesised name, which may itself hold spaces and parentheses).
fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Ends the reaper as the command ended: with its exit code, or by the
/// signal that ended it (without a core dump of the reaper's own); SIGKILL
/// if the command was killed before it was reaped or never reaped.
///
/// # Safety
/// Plain system calls.
unsafe fn mirror(status: Option<libc::c_int>) -> ! {
    let sig = match status {
        Some(st) if libc::WIFEXITED(st) => std::process::exit(libc::WEXITSTATUS(st)),
        Some(st) if libc::WIFSIGNALED(st) => libc::WTERMSIG(st),
        _ => libc::SIGKILL,
    };
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    libc::setrlimit(libc::RLIMIT_CORE, &no_core);
    libc::signal(sig, libc::SIG_DFL);
    let mut set: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    libc::sigaddset(&mut set, sig);
    libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    libc::kill(libc::getpid(), sig);
    std::process::exit(128 + sig)
}
