//! Lease holders that are processes of their own, and the clock jumps
//! they suffer.
//!
//! The `supervised` workload runs `baton lock` around a shell command, as
//! a user would: the command waits a moment, then writes the resource with
//! `baton set --fence $BATON_FENCING_TOKEN`. `baton lock` must stop the
//! command before the lock can pass on; where it cannot know in time, the
//! fence must refuse the late write.
//!
//! The `client-clock` fault makes those processes' clocks jump, backwards
//! (as a suspended virtual machine's monotonic clock lags when it wakes:
//! the holder's timers stall, its heartbeats stop, and it believes its
//! lease still runs) and forwards (its deadlines come early), through
//! libfaketime: every process of the workload starts with it preloaded,
//! reading the offset from a file this fault rewrites. The members'
//! clocks, and the run's own, stay true.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use baton_chaos::history::{Call, Outcome, Reply};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

use super::record::{Recorder, Rng};
use super::workloads::Ctx;

use super::workloads::{SUPERVISED_LOCK as LOCK, SUPERVISED_RESOURCE as RESOURCE};

/// What the held command does: prints the token, waits, writes the
/// resource with it and prints the outcome. Arguments: the `baton`
/// binary, the servers, the resource, the value, the wait in seconds.
const SCRIPT: &str = r#"echo "token $BATON_FENCING_TOKEN"
sleep "$5"
out=$("$1" --server "$2" set --json --fence "$BATON_FENCING_TOKEN" "$3" "$4" 2>&1)
echo "write $? $out""#;

/// The longest one round (waiting, holding, writing) may take before its
/// processes are killed.
const ROUND_LIMIT: Duration = Duration::from_secs(30);

/// libfaketime, and the file its offset is read from.
#[derive(Clone, Debug)]
pub struct ClientClock {
    pub library: PathBuf,
    pub file: PathBuf,
}

impl ClientClock {
    /// libfaketime where Debian and a source build put it (or at
    /// `BATON_LIBFAKETIME`), the offset file in `dir`, at no offset.
    pub fn find(dir: &Path) -> Result<ClientClock, String> {
        let candidates: Vec<PathBuf> = match std::env::var_os("BATON_LIBFAKETIME") {
            Some(path) => vec![path.into()],
            None => [
                "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
                "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
                "/usr/lib/faketime/libfaketimeMT.so.1",
                "/usr/local/lib/faketime/libfaketimeMT.so.1",
            ]
            .into_iter()
            .map(PathBuf::from)
            .collect(),
        };
        let Some(library) = candidates.iter().find(|p| p.is_file()) else {
            return Err(format!(
                "the client-clock fault needs libfaketime (Debian: apt-get install faketime), not found at {}; or set BATON_LIBFAKETIME to its path",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        let clock = ClientClock {
            library: library.clone(),
            file: dir.join("client-clock"),
        };
        clock.set(0)?;
        Ok(clock)
    }

    /// Sets the clients' clocks `offset_ms` away from true time.
    fn set(&self, offset_ms: i64) -> Result<(), String> {
        let next = self.file.with_extension("next");
        let text = format!("{:+.3}s", offset_ms as f64 / 1000.0);
        std::fs::write(&next, text)
            .and_then(|()| std::fs::rename(&next, &self.file))
            .map_err(|e| format!("cannot write {}: {e}", self.file.display()))
    }
}

/// The `client-clock` fault until `until`: every 0.3 to 2.5 s the clients'
/// clocks jump back by half a session timeout to three of them, or (two
/// times in five) forward by 1 to 60 s; 0.5 to 4 s later they are true
/// again (a jump the other way).
pub async fn jump_clocks(
    clock: ClientClock,
    session: Duration,
    recorder: Recorder,
    mut rng: Rng,
    until: Instant,
) {
    loop {
        let wait = rng.between(Duration::from_millis(300), Duration::from_millis(2500));
        if Instant::now() + wait >= until {
            break;
        }
        tokio::time::sleep(wait).await;
        let offset = if rng.chance(60) {
            -(rng.between(session / 2, session * 3).as_millis() as i64)
        } else {
            rng.between(Duration::from_secs(1), Duration::from_secs(60))
                .as_millis() as i64
        };
        let hold = rng.between(Duration::from_millis(500), Duration::from_millis(4000));
        match clock.set(offset) {
            Ok(()) => recorder.fault(format!(
                "client clocks jump {} by {} ms, for {} ms",
                if offset < 0 { "back" } else { "forward" },
                offset.unsigned_abs(),
                hold.as_millis()
            )),
            Err(e) => recorder.fault(format!("client clocks did not jump: {e}")),
        }
        tokio::time::sleep(hold.min(until.saturating_duration_since(Instant::now()))).await;
        match clock.set(0) {
            Ok(()) => recorder.fault("client clocks true again"),
            Err(e) => recorder.fault(format!("client clocks stay off: {e}")),
        }
    }
    let _ = clock.set(0);
}

/// One supervised holder: rounds of `baton lock` around the writing
/// command until the run ends.
pub async fn supervised(ctx: Ctx, process: u64, mut rng: Rng, clock: Option<ClientClock>) {
    let rec = ctx.recorder.clone();
    let baton = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => {
            rec.fault(format!("supervised holder {process}: no baton binary: {e}"));
            return;
        }
    };
    while Instant::now() < ctx.until {
        let value = rec.unique();
        let wait = rng.between(Duration::ZERO, Duration::from_millis(300));
        let started = Instant::now();
        let granted = round(&ctx, process, &baton, clock.as_ref(), value, wait).await;
        if !granted && started.elapsed() < Duration::from_millis(100) {
            // Refused at once (no server): not in a tight loop.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One `baton lock` round, recorded: the grant, the write, the release.
/// Whether it was granted.
async fn round(
    ctx: &Ctx,
    process: u64,
    baton: &Path,
    clock: Option<&ClientClock>,
    value: u64,
    wait: Duration,
) -> bool {
    let rec = &ctx.recorder;
    let session_ms = ctx.lease_session.as_millis().to_string();
    let mut command = tokio::process::Command::new(baton);
    command
        .args(["--server", &ctx.servers, "lock", LOCK])
        .args(["--session-timeout", &session_ms, "--timeout", "5s", "--"])
        .args(["sh", "-c", SCRIPT, "sh"])
        .arg(baton)
        .args([&ctx.servers, RESOURCE, &value.to_string()])
        .arg(format!("{:.3}", wait.as_secs_f64()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(clock) = clock {
        command
            .env("LD_PRELOAD", &clock.library)
            .env("FAKETIME_TIMESTAMP_FILE", &clock.file)
            .env("FAKETIME_NO_CACHE", "1");
    }
    // Invoked before the process starts: the grant, and the write after
    // it, happen no sooner.
    let t = rec.now();
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            rec.op(
                process,
                LOCK,
                Call::Acquire,
                t,
                Outcome::Fail {
                    why: format!("cannot start baton lock: {e}"),
                },
            );
            return false;
        }
    };
    let Some(stdout) = child.stdout.take() else {
        return false;
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut token = None;
    let mut written = None;
    let mut section_end = None;
    let deadline = Instant::now() + ROUND_LIMIT;
    loop {
        let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(_) => break,
            Err(_) => {
                rec.fault(format!(
                    "supervised holder {process}: a round outlived {} s; its processes are killed",
                    ROUND_LIMIT.as_secs()
                ));
                let _ = child.start_kill();
                break;
            }
        };
        if let Some(t_text) = line.strip_prefix("token ") {
            if let Ok(n) = t_text.trim().parse::<u64>() {
                rec.op(
                    process,
                    LOCK,
                    Call::Acquire,
                    t,
                    Outcome::Ok {
                        reply: Reply::Token { token: n },
                    },
                );
                token = Some(n);
            }
        } else if let Some(rest) = line.strip_prefix("write ") {
            written = Some(write_outcome(rest));
            section_end = Some(rec.now());
        }
    }
    let (released, status) = match child.wait().await {
        Ok(s) => (s.success(), s.to_string()),
        Err(e) => (false, format!("no exit status: {e}")),
    };
    let Some(token) = token else {
        // 124: not granted within --timeout; 125: the session was lost
        // while it waited.
        rec.op(
            process,
            LOCK,
            Call::Acquire,
            t,
            Outcome::Fail {
                why: format!("baton lock ended without a grant ({status})"),
            },
        );
        return false;
    };
    let section_end = section_end.unwrap_or_else(|| rec.now());
    let outcome = match written {
        Some(outcome) => outcome,
        // The command was stopped: perhaps in the middle of its write.
        None => Outcome::Unknown {
            why: "the command was stopped before it said how its write went".into(),
        },
    };
    rec.op(
        process,
        RESOURCE,
        Call::FencedWrite { token, value },
        t,
        outcome,
    );
    let outcome = if released {
        Outcome::Ok { reply: Reply::Done }
    } else {
        Outcome::Unknown {
            why: format!("baton lock ended with {status}"),
        }
    };
    rec.op(process, LOCK, Call::Release { token }, section_end, outcome);
    true
}

/// The outcome the command printed for its write: `STATUS OUTPUT`, the
/// output on one line (`baton set` prints its JSON and its errors so).
fn write_outcome(rest: &str) -> Outcome {
    let (status, out) = rest.split_once(' ').unwrap_or((rest, ""));
    if status == "0" {
        match serde_json::from_str::<serde_json::Value>(out)
            .ok()
            .and_then(|v| v["stat"]["version"].as_u64())
        {
            Some(version) => Outcome::Ok {
                reply: Reply::Written {
                    version: version as u32,
                },
            },
            None => Outcome::Unknown {
                why: format!("baton set printed {out:?}"),
            },
        }
    } else if out.contains("stale fencing token") {
        Outcome::Ok {
            reply: Reply::Stale,
        }
    } else {
        Outcome::Unknown {
            why: format!("baton set: {out}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_report_is_read_as_the_checkers_need_it() {
        let ok = write_outcome(r#"0 {"path":"/chaos/supervised","stat":{"version":7}}"#);
        assert_eq!(
            ok,
            Outcome::Ok {
                reply: Reply::Written { version: 7 }
            }
        );
        let stale = write_outcome("1 baton: stale fencing token: 3 < 5 at /chaos/supervised");
        assert_eq!(
            stale,
            Outcome::Ok {
                reply: Reply::Stale
            }
        );
        for unknown in ["1 baton: cannot connect", "0 ", "137 "] {
            assert!(
                matches!(write_outcome(unknown), Outcome::Unknown { .. }),
                "{unknown}"
            );
        }
    }
}
