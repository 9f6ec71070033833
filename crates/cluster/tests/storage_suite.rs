//! openraft's own test suite for log and state-machine storage, run against
//! the member's on-disk log and its Baton state machine.

#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicU32, Ordering};

use baton_cluster::log_store::LogStore;
use baton_cluster::state_machine::StateMachineStore;
use baton_cluster::types::{StorageError, TypeConfig};
use baton_server::persist::FsyncPolicy;
use baton_server::{Config, Server};
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
        let sm = StateMachineStore::open(&dir, applier).expect("open the state machine");
        Ok((Scratch(dir), log, sm))
    }
}

#[test]
fn the_log_and_state_machine_pass_openraft_s_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(Builder)
}
