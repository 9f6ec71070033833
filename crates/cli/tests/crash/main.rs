//! Crash tests of `baton serve` as a child process: SIGKILL at random
//! moments under a concurrent load, a data directory that cannot be written,
//! a full disk, and SIGKILL while snapshots replace the log.
//!
//! Every restart runs the real binary on the same port and data directory,
//! so recovery is exactly what an operator gets. The test process holds the
//! clients, records every acknowledged result, and checks it against what
//! the restarted server holds.
//!
//! - [`harness`]: the server child, its log, clients and bounded waits;
//! - [`model`]: what the clients were told, checked against a restarted server;
//! - one file per fault family: [`kill9`], [`unwritable`], [`full_disk`],
//!   [`storm`].

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod model;

mod full_disk;
mod kill9;
mod storm;
mod unwritable;
