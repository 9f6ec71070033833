//! What a run records: every operation, and every fault.
//!
//! # Format
//! A history is written as JSON lines, one record per line, in the order
//! they were recorded:
//! ```text
//! {"op": {"id", "process", "key", "call", "invoked_ns", "completed_ns", "outcome"}}
//! {"fault": {"at_ns", "what"}}
//! ```
//! Times are nanoseconds on the run's own monotonic clock, from its start.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// What a worker asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum Call {
    /// Read a register: its value and its version.
    Read,
    /// Write a register unconditionally.
    Write { value: u64 },
    /// Write a register if its version is `version` (compare and set).
    Cas { version: u32, value: u64 },
    /// Read a register in a session that reads sequentially (it may be
    /// answered from a member that is behind): `session` names the session,
    /// `synced` says whether a sync came first (its invocation is this
    /// operation's).
    SequentialRead { session: u64, synced: bool },
    /// Write a register from such a session.
    SequentialWrite { session: u64, value: u64 },
    /// Take a lock (or win an election): the grant's token.
    Acquire,
    /// Let the lock go (or resign).
    Release { token: u64 },
    /// Write the lock's resource with a fencing token.
    FencedWrite { token: u64, value: u64 },
    /// Add one to a counter.
    Increment,
    /// Read a counter.
    ReadCounter,
    /// Put an item on a queue.
    Enqueue { item: u64 },
    /// Take this item off a queue (the consumer found it at the head):
    /// done if it took it, failed if another consumer had.
    Take { item: u64 },
    /// Look at a queue: empty, or the item at its head.
    Dequeue,
    /// Open a session that holds an ephemeral node at `key`.
    HoldEphemeral,
    /// The session holding `key` ended: closed by its client, or expired
    /// (as its client was told).
    SessionEnded { expired: bool },
    /// An observer saw the ephemeral node at `key` deleted.
    EphemeralGone,
}

/// What came back from a call that completed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum Reply {
    /// Done; nothing to report.
    Done,
    /// A register's value and version.
    Value { value: u64, version: u32 },
    /// A write applied: the register's version after it.
    Written { version: u32 },
    /// A compare-and-set refused: the version was another.
    CasRefused,
    /// A grant's fencing token.
    Token { token: u64 },
    /// A fenced write refused: a higher token was accepted before.
    Stale,
    /// A counter's value.
    Count { count: u64 },
    /// The item taken from a queue.
    Item { item: u64 },
    /// The queue was empty.
    Empty,
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum Outcome {
    /// It was applied (or read), with this reply.
    Ok { reply: Reply },
    /// It was certainly not applied (refused before it could be, or
    /// answered with an error that says so).
    Fail { why: String },
    /// It may or may not have been applied, at any time after it was
    /// invoked: the connection broke with it in flight, or its caller gave
    /// up waiting.
    Unknown { why: String },
}

impl Outcome {
    /// The reply, if the operation was applied.
    pub fn reply(&self) -> Option<&Reply> {
        match self {
            Outcome::Ok { reply } => Some(reply),
            _ => None,
        }
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown { .. })
    }
}

/// One operation of one worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique in its history.
    pub id: u64,
    /// The worker that made it (a worker makes one operation at a time).
    pub process: u64,
    /// The register, lock, counter, queue or ephemeral node it is about.
    pub key: String,
    pub call: Call,
    pub invoked_ns: u64,
    /// When its outcome was known (for an unknown outcome, when the worker
    /// gave up on it).
    pub completed_ns: u64,
    pub outcome: Outcome,
}

/// A fault the run injected, or another event worth showing on its
/// timeline (a leader elected, say).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub at_ns: u64,
    pub what: String,
}

/// One line of a history file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Line {
    Op(Op),
    Fault(Fault),
}

/// A run's whole record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    pub faults: Vec<Fault>,
}

impl History {
    /// The operations about `key` whose call matches `wanted`.
    pub fn of<'a>(
        &'a self,
        wanted: impl Fn(&Call) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Op> + 'a {
        self.ops.iter().filter(move |op| wanted(&op.call))
    }

    /// The keys of the operations `wanted` matches, each once, sorted.
    pub fn keys(&self, wanted: impl Fn(&Call) -> bool) -> Vec<String> {
        let mut keys: Vec<String> = self
            .ops
            .iter()
            .filter(|op| wanted(&op.call))
            .map(|op| op.key.clone())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Writes the history as JSON lines: the operations, then the faults.
    ///
    /// # Errors
    /// Those of `out`.
    pub fn write(&self, mut out: impl Write) -> std::io::Result<()> {
        for op in &self.ops {
            serde_json::to_writer(&mut out, &Line::Op(op.clone()))?;
            out.write_all(b"\n")?;
        }
        for fault in &self.faults {
            serde_json::to_writer(&mut out, &Line::Fault(fault.clone()))?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Reads a history written by [`History::write`] (or by a run, line by
    /// line as it went).
    ///
    /// # Errors
    /// A line that is not a record, naming its number; those of `input`.
    pub fn read(input: impl BufRead) -> std::io::Result<History> {
        let mut history = History::default();
        for (n, line) in input.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Line>(&line) {
                Ok(Line::Op(op)) => history.ops.push(op),
                Ok(Line::Fault(fault)) => history.faults.push(fault),
                Err(e) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("line {}: not a history record: {e}", n + 1),
                    ))
                }
            }
        }
        Ok(history)
    }

    /// One history line for `op`, for a run that writes as it goes.
    pub fn op_line(op: &Op) -> String {
        serde_json::to_string(&Line::Op(op.clone())).expect("an op serializes")
    }

    /// One history line for `fault`.
    pub fn fault_line(fault: &Fault) -> String {
        serde_json::to_string(&Line::Fault(fault.clone())).expect("a fault serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_round_trips_through_json_lines() {
        let history = History {
            ops: vec![
                Op {
                    id: 1,
                    process: 7,
                    key: "r1".into(),
                    call: Call::Cas {
                        version: 3,
                        value: 9,
                    },
                    invoked_ns: 10,
                    completed_ns: 20,
                    outcome: Outcome::Ok {
                        reply: Reply::Written { version: 4 },
                    },
                },
                Op {
                    id: 2,
                    process: 8,
                    key: "lock".into(),
                    call: Call::Acquire,
                    invoked_ns: 15,
                    completed_ns: 40,
                    outcome: Outcome::Unknown {
                        why: "connection lost".into(),
                    },
                },
            ],
            faults: vec![Fault {
                at_ns: 12,
                what: "SIGSTOP member 2".into(),
            }],
        };
        let mut bytes = Vec::new();
        history.write(&mut bytes).unwrap();
        assert_eq!(History::read(&bytes[..]).unwrap(), history);
        let err = History::read(&b"{\"op\": 3}\n"[..]).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
