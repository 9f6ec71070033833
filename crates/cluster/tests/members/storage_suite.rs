//! openraft's own test suite for log and state-machine storage, run against
//! the member's on-disk log and its Baton state machine.

#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicU32, Ordering};

use baton_cluster::log_store::LogStore;
use baton_cluster::state_machine::StateMachineStore;
use baton_cluster::types::{StorageError, TypeConfig};
use baton_server::{Config, Server};
use baton_state::format::FsyncPolicy;
use openraft::testing::{StoreBuilder, Suite};

/// A scratch directory, removed when the suite's store is dropped.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, Scratch> for Builder {
    async fn build(&self) -> Result<(Scratch, LogStore, StateMachineStore), StorageError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("baton-suite-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = LogStore::open(&dir, FsyncPolicy::Always).expect("open the log");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_server, applier) = Server::member(listener, Config::default()).unwrap();
        let sm = StateMachineStore::open(&dir, applier, None).expect("open the state machine");
        Ok((Scratch(dir), log, sm))
    }
}

#[test]
fn the_log_and_state_machine_pass_openraft_s_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(Builder)
}

/// What the log store keeps survives reopening it: entries, vote,
/// committed and purged ids, and a cut made by a truncation.
#[test]
fn the_log_store_reopens_with_what_it_kept() {
    use baton_cluster::types::{Entry, LogId};
    use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, EntryPayload, Vote};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = std::env::temp_dir().join(format!("baton-reopen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log_id = |index| LogId::new(CommittedLeaderId::new(3, 1), index);
    rt.block_on(async {
        let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
        let entries: Vec<Entry> = (0..100)
            .map(|i| Entry {
                log_id: log_id(i),
                payload: EntryPayload::Blank,
            })
            .collect();
        for chunk in entries.chunks(7) {
            log.blocking_append(chunk.to_vec()).await.unwrap();
        }
        log.save_vote(&Vote::new(3, 1)).await.unwrap();
        log.save_committed(Some(log_id(80))).await.unwrap();
        log.purge(log_id(9)).await.unwrap();
        // Cuts the batch holding 90 (84 to 90) after 89.
        log.truncate(log_id(90)).await.unwrap();
        log.blocking_append(vec![Entry {
            log_id: LogId::new(CommittedLeaderId::new(4, 2), 90),
            payload: EntryPayload::Blank,
        }])
        .await
        .unwrap();
    });
    rt.block_on(async {
        let mut log = LogStore::open(&dir, FsyncPolicy::Always).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(9)));
        assert_eq!(
            state.last_log_id,
            Some(LogId::new(CommittedLeaderId::new(4, 2), 90))
        );
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 1)));
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(80)));
        let kept = log.try_get_log_entries(0..200).await.unwrap();
        let indexes: Vec<u64> = kept.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, (10..=90).collect::<Vec<_>>());
    });
    let _ = std::fs::remove_dir_all(&dir);
}
