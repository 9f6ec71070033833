//! Restoring a backup: the state a snapshot file holds, with its revision
//! moved past everything the server it was taken from can have handed out
//! since.
//!
//! A backup is the state at one revision, but the server it came from may
//! have gone on for hours after it, handing out sequence numbers and
//! fencing tokens that storage has since accepted. A server restored at the
//! backup's revision would hand the same numbers out again: storage would
//! refuse its legitimate holders (their tokens look stale), and two
//! holders could carry equal tokens. So a restore skips revisions (as
//! etcd's `snapshot restore --bump-revision` does): by default a billion,
//! plus ten million for every second since the backup's latest change, by
//! this machine's clock (counted in milliseconds). No server hands out ten
//! million revisions a second (one change is at least one pass through the
//! state machine, and a pass costs more than a tenth of a microsecond), so
//! the default skips past anything the old server can have handed out, if
//! the two clocks agree within the billion's worth (at least 100 s). The
//! same holds for a second restore of the same backup: the skip has grown
//! since the first faster than the first restored server can hand
//! revisions out.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::state::StateMachine;

/// Revisions a restore skips at the least.
pub const SKIP_FLOOR: u64 = 1_000_000_000;
/// Revisions a restore skips for every second since the backup's latest
/// change (counted in milliseconds): more than any server hands out in a
/// second.
pub const SKIP_PER_SECOND: u64 = 10_000_000;
/// Revisions a restore skips when the backup does not say when its latest
/// change was made (a backup in snapshot format 1, or one of a server that
/// never made a change), or says a time later than this machine's clock (a
/// clock that jumped ahead on the saved server, or this one behind): ten
/// million a second for three years.
pub const SKIP_UNDATED: u64 = 1_000_000_000_000_000;
/// The highest revision a restore may leave: 2^62, so that even the
/// longest skip leaves a server room for 4.6e18 more changes, and a token
/// fits any signed 64-bit column that storage keeps it in.
pub const REVISION_CEILING: u64 = 1 << 62;

/// How many revisions a restore skips by default, for a backup whose latest
/// change was stamped `last_now_ms`, at `now_ms` (both milliseconds since
/// the Unix epoch).
pub fn default_skip(last_now_ms: u64, now_ms: u64) -> u64 {
    if last_now_ms == 0 || last_now_ms > now_ms {
        return SKIP_UNDATED;
    }
    let elapsed_ms = now_ms.saturating_sub(last_now_ms);
    SKIP_FLOOR.saturating_add(elapsed_ms.saturating_mul(SKIP_PER_SECOND / 1000))
}

/// A backup's state, ready to be written out as a restored server's (or
/// cluster's) first snapshot.
#[derive(Debug)]
pub struct Restored {
    /// The state, its revision moved on.
    pub state: StateMachine,
    /// The revision the backup was taken at.
    pub saved_revision: u64,
    /// Revisions skipped: the restored server's next change takes revision
    /// `saved_revision + skipped + 1`.
    pub skipped: u64,
}

/// Why a backup cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The bytes are not a whole snapshot: `at` is the byte where that was
    /// found.
    #[error("not a whole Baton snapshot (at byte {at}: {why})")]
    Damaged { at: usize, why: String },
    /// The revision cannot move that far on.
    #[error(transparent)]
    Skip(#[from] SkipError),
}

/// Why a restored state's revision cannot move on as far as asked.
#[derive(Debug, thiserror::Error)]
pub enum SkipError {
    #[error("skipping {skipped} revisions from revision {from} would pass {REVISION_CEILING} (2^62), leaving too little room for the revisions, sequence numbers and tokens to come")]
    PastCeiling { from: u64, skipped: u64 },
    #[error(transparent)]
    Overflow(#[from] crate::state::RevisionOverflow),
}

/// The state `backup` (a snapshot file's bytes) holds, checked, with its
/// revision moved on by `skip` (or by [`default_skip`] at this machine's
/// time, if `None`).
///
/// # Errors
/// [`RestoreError`]: the bytes are damaged, or the skip too large.
pub fn prepare(backup: &[u8], skip: Option<u64>) -> Result<Restored, RestoreError> {
    let mut state = super::snapshot::decode(backup).map_err(|c| RestoreError::Damaged {
        at: c.offset,
        why: c.what,
    })?;
    let saved_revision = state.revision();
    let skipped = skip.unwrap_or_else(|| default_skip(state.last_now_ms(), wall_clock_ms()));
    if saved_revision.saturating_add(skipped) > REVISION_CEILING {
        return Err(SkipError::PastCeiling {
            from: saved_revision,
            skipped,
        }
        .into());
    }
    state.skip_revisions(skipped).map_err(SkipError::from)?;
    Ok(Restored {
        state,
        saved_revision,
        skipped,
    })
}

fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_skip_grows_with_the_time_since_the_backup() {
        let t = 1_700_000_000_000;
        assert_eq!(default_skip(t, t), SKIP_FLOOR);
        assert_eq!(default_skip(t, t + 1), SKIP_FLOOR + SKIP_PER_SECOND / 1000);
        assert_eq!(default_skip(t, t + 1000), SKIP_FLOOR + SKIP_PER_SECOND);
        assert_eq!(
            default_skip(t, t + 3_600_000),
            SKIP_FLOOR + 3600 * SKIP_PER_SECOND
        );
        // A clock behind the backup's (or the backup's ahead): undated.
        assert_eq!(default_skip(t, t - 50_000), SKIP_UNDATED);
        // An undated backup.
        assert_eq!(default_skip(0, t), SKIP_UNDATED);
        // Centuries later, still a number of revisions.
        assert!(default_skip(t, u64::MAX) > SKIP_FLOOR);
    }

    #[test]
    fn a_restored_state_continues_past_the_skipped_revisions() {
        use crate::state::{Command, Proposal};
        let mut sm = StateMachine::new();
        let create = |path: &str| Proposal {
            now_ms: 1_700_000_000_000,
            origin: None,
            command: Command::Create {
                session: baton_proto::SessionId(0),
                path: path.into(),
                data: bytes::Bytes::new(),
                mode: baton_proto::CreateMode::PersistentSequential,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            },
        };
        sm.apply_proposal(&create("/a-"));
        let mut bytes = std::io::Cursor::new(Vec::new());
        super::super::snapshot::encode(&sm, &mut bytes).unwrap();
        let restored = prepare(bytes.get_ref(), Some(500)).unwrap();
        assert_eq!(restored.saved_revision, 1);
        assert_eq!(restored.skipped, 500);
        let mut state = restored.state;
        let applied = state.apply_proposal(&create("/a-"));
        assert_eq!(applied.revision, 502);
        assert!(matches!(
            prepare(bytes.get_ref(), Some(u64::MAX)),
            Err(RestoreError::Skip(_))
        ));
        // Not so near the end of the numbers that they would wrap soon.
        assert!(matches!(
            prepare(bytes.get_ref(), Some(u64::MAX - 5)),
            Err(RestoreError::Skip(_))
        ));
        assert!(prepare(bytes.get_ref(), Some(REVISION_CEILING - 1)).is_ok());
        assert!(matches!(
            prepare(&bytes.get_ref()[..20], None),
            Err(RestoreError::Damaged { .. })
        ));
    }
}
