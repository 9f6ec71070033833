//! The replicated log on a file system that can create no file (one out of
//! inodes). The disk fault hook is armed for the whole process, so this
//! test has its binary to itself.

use baton_cluster::log_store::LogStore;
use baton_cluster::types::{Entry, LogId};
use baton_server::persist::{disk_faults, FsyncPolicy};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, EntryPayload};

fn blank_entries(from: u64, count: u64) -> Vec<Entry> {
    (from..from + count)
        .map(|index| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        })
        .collect()
}

fn segment_count(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        })
        .count()
}

/// Pins: a segment past its size whose successor cannot be made takes the
/// appends until one can (a member once stopped there: a failed rotation
/// costs only disk space), and every entry reads back after a restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_segment_whose_successor_cannot_be_made_takes_the_appends() {
    let dir = std::env::temp_dir().join(format!("baton-no-new-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let control = dir.join("disk-faults");
    std::fs::write(&control, "").unwrap();
    disk_faults::arm(control.clone());
    let raft = dir.join("raft");
    let mut log = LogStore::open_with_segments_of(&raft, FsyncPolicy::Always, 2048).unwrap();
    for from in (0..60).step_by(10) {
        log.blocking_append(blank_entries(from, 10)).await.unwrap();
    }
    let before = segment_count(&raft);
    assert!(before > 1, "the log was split into segments");
    std::fs::write(&control, "no-new-files").unwrap();
    for from in (60..160).step_by(10) {
        log.blocking_append(blank_entries(from, 10))
            .await
            .expect("an append while no segment can be made");
    }
    assert_eq!(segment_count(&raft), before, "a segment was made");
    // A vote needs no new file either (it goes into a slot of `votes`).
    let mut vote = openraft::Vote::new(2, 1);
    vote.commit();
    log.save_vote(&vote)
        .await
        .expect("a vote while no file can be made");
    std::fs::write(&control, "").unwrap();
    for from in (160..200).step_by(10) {
        log.blocking_append(blank_entries(from, 10)).await.unwrap();
    }
    assert!(
        segment_count(&raft) > before,
        "no segment made once one can be"
    );
    drop(log);
    let mut log = LogStore::open(&raft, FsyncPolicy::Always).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    let entries = log.try_get_log_entries(0..u64::MAX).await.unwrap();
    let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, (0..200).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}
