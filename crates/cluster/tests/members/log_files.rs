//! The replicated log's files: space written ahead of the appends, segments
//! started as the log grows, and a torn last write.

use baton_cluster::log_store::LogStore;
use baton_cluster::types::{Entry, LogId};
use baton_server::persist::{segment, FsyncPolicy};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, EntryPayload};

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn blanks(range: std::ops::Range<u64>) -> Vec<Entry> {
    range
        .map(|i| Entry {
            log_id: log_id(i),
            payload: EntryPayload::Blank,
        })
        .collect()
}

/// The segment files in `dir`, oldest first.
fn segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    names.sort();
    names
}

/// Where the batches of a segment end.
fn data_end(bytes: &[u8]) -> usize {
    let mut at = segment::layout(bytes).unwrap().start;
    while let Ok((_, end)) = segment::read_batch(bytes, at) {
        at = end;
    }
    at
}

async fn indexes(log: &mut LogStore) -> Vec<u64> {
    let entries = log.try_get_log_entries(0..u64::MAX).await.unwrap();
    entries.iter().map(|e| e.log_id.index).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_last_segment_ends_in_space_written_ahead() {
    let dir_kept = tempfile::Builder::new()
        .prefix(&format!("baton-{}-", "rotate"))
        .tempdir()
        .unwrap();
    let dir = dir_kept.path().join("dir");
    {
        let mut log = LogStore::open_with_segments_of(&dir, FsyncPolicy::Always, 2048).unwrap();
        for start in (0..300).step_by(10) {
            log.blocking_append(blanks(start..start + 10))
                .await
                .unwrap();
        }
    }
    let files = segments(&dir);
    assert!(
        files.len() > 3,
        "the log was split into segments: {files:?}"
    );
    let (last, closed) = files.split_last().unwrap();
    for file in closed {
        let bytes = std::fs::read(file).unwrap();
        assert_eq!(
            data_end(&bytes),
            bytes.len(),
            "{} was cut to its data when the next segment began",
            file.display()
        );
    }
    let bytes = std::fs::read(last).unwrap();
    assert!(
        bytes.len() >= 1 << 20 && data_end(&bytes) < bytes.len(),
        "the last segment has space written ahead ({} bytes, data up to {})",
        bytes.len(),
        data_end(&bytes)
    );
    // Reopened (by the normal path), every entry is there, and the log goes on.
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(indexes(&mut log).await, (0..300).collect::<Vec<_>>());
    log.blocking_append(blanks(300..310)).await.unwrap();
    drop(log);
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(indexes(&mut log).await, (0..310).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_torn_write_in_the_space_written_ahead_is_dropped() {
    let dir_kept = tempfile::Builder::new()
        .prefix(&format!("baton-{}-", "torn"))
        .tempdir()
        .unwrap();
    let dir = dir_kept.path().join("dir");
    {
        let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
        log.blocking_append(blanks(0..50)).await.unwrap();
    }
    // A write that reached the disk only in part: the start of a batch
    // where the zeros were.
    let file = segments(&dir).pop().unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let end = data_end(&bytes);
    assert!(bytes[end..].iter().all(|b| *b == 0), "zeros after the data");
    bytes[end..end + 6].copy_from_slice(b"BTCH\0\x07");
    std::fs::write(&file, &bytes).unwrap();

    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(indexes(&mut log).await, (0..50).collect::<Vec<_>>());
    log.blocking_append(blanks(50..60)).await.unwrap();
    drop(log);
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(indexes(&mut log).await, (0..60).collect::<Vec<_>>());
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(59)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_segment_created_but_never_written_is_passed_over() {
    let dir_kept = tempfile::Builder::new()
        .prefix(&format!("baton-{}-", "empty"))
        .tempdir()
        .unwrap();
    let dir = dir_kept.path().join("dir");
    {
        let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
        log.blocking_append(blanks(0..20)).await.unwrap();
    }
    // A crash right after a rotation created the next segment: its header
    // never reached the disk. And a truncation's rewrite that was never
    // renamed into place.
    std::fs::write(dir.join("log-00000000000000000020.seg"), b"").unwrap();
    std::fs::write(
        dir.join("log-00000000000000000000.seg.tmp"),
        b"half a rewrite",
    )
    .unwrap();

    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(indexes(&mut log).await, (0..20).collect::<Vec<_>>());
    assert!(!dir.join("log-00000000000000000000.seg.tmp").exists());
    log.blocking_append(blanks(20..30)).await.unwrap();
    drop(log);
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(indexes(&mut log).await, (0..30).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncation_inside_a_batch_keeps_the_entries_before_it_across_segments() {
    let dir_kept = tempfile::Builder::new()
        .prefix(&format!("baton-{}-", "truncate"))
        .tempdir()
        .unwrap();
    let dir = dir_kept.path().join("dir");
    {
        let mut log = LogStore::open_with_segments_of(&dir, FsyncPolicy::Always, 2048).unwrap();
        for start in (0..200).step_by(10) {
            log.blocking_append(blanks(start..start + 10))
                .await
                .unwrap();
        }
        // Into the middle of a batch of an early segment: the later
        // segments go, the batch keeps 0..=4 of its ten.
        log.truncate(log_id(45)).await.unwrap();
        log.blocking_append(blanks(45..50)).await.unwrap();
    }
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(indexes(&mut log).await, (0..50).collect::<Vec<_>>());
}

fn membership_entry(index: u64, ids: &[u64]) -> Entry {
    let nodes: std::collections::BTreeMap<u64, baton_cluster::Member> = ids
        .iter()
        .map(|id| {
            (
                *id,
                baton_cluster::Member {
                    peer: format!("127.0.0.1:{}", 4190 + id),
                    client: format!("127.0.0.1:{}", 4180 + id),
                },
            )
        })
        .collect();
    let voters: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Membership(openraft::Membership::new(vec![voters], nodes)),
    }
}

/// Pins: the membership a data directory records is the newer of its log's
/// and its snapshot's (a snapshot installed past the log, the log not yet
/// purged), and reading it changes nothing on disk.
#[tokio::test(flavor = "multi_thread")]
async fn the_stored_membership_is_the_newer_of_the_log_and_the_snapshot_and_reading_it_writes_nothing(
) {
    use baton_cluster::log_store::stored_members;
    let dir_kept = tempfile::Builder::new()
        .prefix(&format!("baton-{}-", "members"))
        .tempdir()
        .unwrap();
    let dir = dir_kept.path().join("dir");
    assert_eq!(stored_members(&dir).unwrap(), None);
    {
        let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
        let mut entries = blanks(0..5);
        entries.push(membership_entry(5, &[1, 2]));
        entries.extend(blanks(6..10));
        log.blocking_append(entries).await.unwrap();
    }
    let ids = |m: Option<std::collections::BTreeMap<u64, baton_cluster::Member>>| {
        m.unwrap().keys().copied().collect::<Vec<_>>()
    };
    assert_eq!(ids(stored_members(&dir).unwrap()), [1, 2]);
    // A snapshot with a newer membership, past the log's end.
    let newer = membership_entry(40, &[1, 2, 3]);
    let EntryPayload::Membership(m) = newer.payload else {
        unreachable!()
    };
    let meta = baton_cluster::types::SnapshotMeta {
        last_log_id: Some(log_id(45)),
        last_membership: openraft::StoredMembership::new(Some(log_id(40)), m),
        snapshot_id: "t".into(),
    };
    let state = baton_state::StateMachine::new();
    baton_cluster::state_machine::write_snapshot(&dir, &meta, &state).unwrap();
    // A torn last write, which only the member itself may cut off.
    let last = segments(&dir).pop().unwrap();
    let mut bytes = std::fs::read(&last).unwrap();
    let end = data_end(&bytes);
    bytes.truncate(end);
    bytes.extend_from_slice(&[1, 2, 3, 4, 5]);
    std::fs::write(&last, &bytes).unwrap();
    let before: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().len())
        })
        .collect();
    assert_eq!(ids(stored_members(&dir).unwrap()), [1, 2, 3]);
    let after: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().len())
        })
        .collect();
    assert_eq!(
        before, after,
        "reading the membership changed the directory"
    );
}

fn vote(term: u64) -> openraft::Vote<u64> {
    let mut vote = openraft::Vote::new(term, 1);
    vote.commit();
    vote
}

/// The vote is kept in two slots written in turn: every vote reads back
/// after a restart, and a vote whose slot write was torn leaves the vote
/// before it (that save never completed, so nothing acted on it).
#[tokio::test]
async fn votes_are_written_in_turn_and_a_torn_one_leaves_the_one_before() {
    let dir_kept = tempfile::Builder::new()
        .prefix(&format!("baton-{}-", "votes"))
        .tempdir()
        .unwrap();
    let dir = dir_kept.path().join("dir");
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), None);
    for term in 1..=5 {
        log.save_vote(&vote(term)).await.unwrap();
    }
    drop(log);
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(5)));
    log.save_vote(&vote(6)).await.unwrap();
    drop(log);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"votes".to_string()), "{names:?}");
    assert!(!names.contains(&"vote".to_string()), "{names:?}");

    // The slot of vote 6 torn half way: vote 5 it is.
    let path = dir.join("votes");
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 128);
    // Vote 6 has sequence number 6 (the file began with 0): slot 6 % 2.
    let newer = 0;
    for b in &mut bytes[newer + 20..newer + 64] {
        *b = 0;
    }
    std::fs::write(&path, &bytes).unwrap();
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(5)));
    // The next vote goes over the torn slot, and counts.
    log.save_vote(&vote(7)).await.unwrap();
    drop(log);
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(7)));
    drop(log);

    // Both slots damaged: the member refuses to start, naming the file.
    std::fs::write(&path, [7u8; 128]).unwrap();
    let refused = LogStore::open(&dir, FsyncPolicy::Always)
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("votes") && refused.contains("damaged"),
        "{refused}"
    );
}

/// A member's directory from before the vote had slots (one `vote` file,
/// a framed record of the vote) is read, and its vote moved into `votes`.
#[tokio::test]
async fn a_vote_kept_the_earlier_way_is_read_and_moved_into_slots() {
    let dir_kept = tempfile::Builder::new()
        .prefix(&format!("baton-{}-", "old-vote"))
        .tempdir()
        .unwrap();
    let dir = dir_kept.path().join("dir");
    std::fs::create_dir_all(&dir).unwrap();
    let payload = bincode::serialize(&vote(3)).unwrap();
    let mut framed = Vec::new();
    baton_state::format::record::frame(&mut framed, |o| o.extend_from_slice(&payload));
    std::fs::write(dir.join("vote"), &framed).unwrap();
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(3)));
    assert!(dir.join("votes").exists() && !dir.join("vote").exists());
    drop(log);
    let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote(3)));
}
