//! A member being added to a running cluster does not stand for election
//! until the cluster has added it.
//!
//! A member that joins starts with an empty log and catches up from the
//! leader's, oldest entries first. Those entries hold every membership the
//! cluster went through, and openraft goes by the latest one in the log,
//! committed or not. A member id used before (a member removed, wiped and
//! added again, as `baton cluster add` allows) is named a voter by some of
//! those old memberships: halfway through its catch-up, the newest one it
//! holds may even name it the only voter, and openraft lets the only voter
//! elect itself at once. It would lead with half the state, and the
//! cluster would lose every write after that point.
//!
//! So a member that starts with no membership and no initial member list
//! (it can only be joining) writes a `JOINING` marker in its log's
//! directory before anything else, and starts with elections off. It
//! cannot tell from the memberships alone which one added it (a member
//! removed and added more than once was a learner before, too): the
//! leader tells it. Once the learner has caught up, and before it is made
//! a voter, the leader sends it the log index of the membership that added
//! it; the member keeps that index in its marker, and once its state
//! machine has applied (or installed with a snapshot) a membership at that
//! index or later, it stands for election as any other, and the marker
//! goes. A restart halfway through finds the marker (and the index, if it
//! was told) and starts with elections off again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::types::NodeId;

/// The marker's name, in the log's directory.
const MARKER: &str = "JOINING";

/// Why the joining state could not be kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoiningError {
    /// An I/O error on the marker or its directory, named with what was
    /// being done to it ("reading", "syncing", ...).
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The leader's word was meant for another member.
    #[error("this is member {this}, not member {id}")]
    OtherMember { this: NodeId, id: NodeId },
}

impl JoiningError {
    fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        JoiningError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    }
}

/// A member that is being added, until it learns it was.
#[derive(Debug)]
pub struct Joining {
    id: NodeId,
    marker: PathBuf,
    /// One more than the log index of the membership that added it, once
    /// the leader has said it (0: not yet).
    told: AtomicU64,
    /// One more than the log index of the latest membership applied.
    applied: AtomicU64,
    /// The member is in and its marker is gone.
    finished: AtomicBool,
}

impl Joining {
    /// The joining state of member `id` whose log is in `dir`: with
    /// `fresh` (no membership stored, none given), it is joining from now
    /// on; otherwise it is still joining if a start before found it so
    /// and it had not yet been added. `None`: not joining.
    ///
    /// # Errors
    /// The marker cannot be written or read.
    pub fn open(dir: &Path, id: NodeId, fresh: bool) -> Result<Option<Arc<Joining>>, JoiningError> {
        let marker = dir.join(MARKER);
        if fresh && !marker.exists() {
            std::fs::create_dir_all(dir).map_err(|e| JoiningError::io("creating", dir, e))?;
            write_synced(&marker, "waiting to be added to the cluster\n")?;
        }
        let text = match std::fs::read_to_string(&marker) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(JoiningError::io("reading", &marker, e)),
        };
        let told = text
            .lines()
            .find_map(|l| l.strip_prefix("added at log index "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .map_or(0, |n| n + 1);
        Ok(Some(Arc::new(Joining {
            id,
            marker,
            told: AtomicU64::new(told),
            applied: AtomicU64::new(0),
            finished: AtomicBool::new(false),
        })))
    }

    /// Whether a member whose log is in `dir` was being added when it last
    /// ran and had not yet learnt that it was: its marker is there. Such a
    /// member starts joining again, whatever its command line says of a
    /// first start (`--peers`, no `--join`), and whichever membership its
    /// log holds so far (one from before it was named, or none).
    pub fn pending(dir: &Path) -> bool {
        dir.join(MARKER).exists()
    }

    /// The leader says the membership at log index `at` added member `id`.
    /// Once the member is in, the word changes nothing (an observer being
    /// made a voter is told again): the marker stays gone.
    ///
    /// # Errors
    /// Another member's id, or the marker cannot be written.
    pub fn told(&self, id: NodeId, at: u64) -> Result<(), JoiningError> {
        if id != self.id {
            return Err(JoiningError::OtherMember { this: self.id, id });
        }
        if self.finished.load(Ordering::Acquire) {
            return Ok(());
        }
        write_synced(
            &self.marker,
            &format!("waiting to be added to the cluster\nadded at log index {at}\n"),
        )?;
        self.told.fetch_max(at + 1, Ordering::AcqRel);
        Ok(())
    }

    /// The member applied (or installed) the membership at log `index`.
    pub fn applied(&self, index: Option<u64>) {
        if let Some(index) = index {
            self.applied.fetch_max(index + 1, Ordering::AcqRel);
        }
    }

    /// Whether the cluster has added the member: it was told so, and has
    /// applied the membership that did.
    pub fn added(&self) -> bool {
        let told = self.told.load(Ordering::Acquire);
        told > 0 && self.applied.load(Ordering::Acquire) >= told
    }

    /// The member is in: the marker goes.
    ///
    /// # Errors
    /// The marker cannot be removed (the member then stays out of
    /// elections until a restart finds it added again).
    pub fn finish(&self) -> Result<(), JoiningError> {
        match std::fs::remove_file(&self.marker) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(JoiningError::io("removing", &self.marker, e)),
        }
        sync_parent(&self.marker)?;
        self.finished.store(true, Ordering::Release);
        Ok(())
    }
}

/// Writes `text` to `path` through a file beside it, synced, then renamed
/// over it.
fn write_synced(path: &Path, text: &str) -> Result<(), JoiningError> {
    let next = path.with_extension("next");
    std::fs::write(&next, text)
        .and_then(|()| std::fs::File::open(&next)?.sync_all())
        .and_then(|()| std::fs::rename(&next, path))
        .map_err(|e| JoiningError::io("writing", path, e))?;
    sync_parent(path)
}

fn sync_parent(path: &Path) -> Result<(), JoiningError> {
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JoiningError::io("syncing", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memberships_before_the_one_that_added_it_do_not_count() {
        let dir_kept = tempfile::Builder::new()
            .prefix(&format!("baton-{}-", "old"))
            .tempdir()
            .unwrap();
        let dir = dir_kept.path().join("dir");
        let j = Joining::open(&dir, 3, true).unwrap().expect("joining");
        // Memberships of its earlier times in the cluster, a learner once,
        // then the only voter: not its addition.
        j.applied(Some(5));
        j.applied(Some(40));
        assert!(!j.added());
        // The leader says the membership at 90 added it; until the member
        // has applied that far, it is not added.
        assert!(j.told(4, 90).is_err(), "another member's word");
        j.told(3, 90).unwrap();
        j.applied(Some(60));
        assert!(!j.added());
        j.applied(Some(90));
        assert!(j.added());
        j.finish().unwrap();
        assert!(Joining::open(&dir, 3, false).unwrap().is_none());
        // Told again once in (an observer made a voter): still in.
        j.told(3, 120).unwrap();
        assert!(!Joining::pending(&dir));
        assert!(Joining::open(&dir, 3, false).unwrap().is_none());
    }

    #[test]
    fn a_restart_halfway_through_the_catch_up_is_still_joining_and_remembers_what_it_was_told() {
        let dir_kept = tempfile::Builder::new()
            .prefix(&format!("baton-{}-", "restart"))
            .tempdir()
            .unwrap();
        let dir = dir_kept.path().join("dir");
        assert!(!Joining::pending(&dir));
        let first = Joining::open(&dir, 4, true).unwrap().expect("joining");
        assert!(Joining::pending(&dir));
        // Started again, now with a membership stored: the marker says it.
        let again = Joining::open(&dir, 4, false)
            .unwrap()
            .expect("still joining");
        assert!(!again.added());
        first.told(4, 17).unwrap();
        let third = Joining::open(&dir, 4, false)
            .unwrap()
            .expect("still joining");
        third.applied(Some(16));
        assert!(!third.added());
        third.applied(Some(17));
        assert!(third.added());
        third.finish().unwrap();
        assert!(!Joining::pending(&dir));
        // A member that never joined is not joining.
        let other_kept = tempfile::Builder::new()
            .prefix(&format!("baton-{}-", "other"))
            .tempdir()
            .unwrap();
        let other = other_kept.path().join("dir");
        assert!(Joining::open(&other, 5, false).unwrap().is_none());
    }
}
