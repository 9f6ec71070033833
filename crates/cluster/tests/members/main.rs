//! Cluster members in one process, on loopback: the replicated path end to
//! end, the log's files, observers, read modes, the storage suite and a
//! wiped voter. One file per concern, all in one test binary so that the
//! suite is compiled and linked once (`no_new_files`, which arms a disk
//! fault for its whole process, keeps a binary of its own).

#[path = "../common/mod.rs"]
mod common;

mod in_process;
mod log_files;
mod observers;
mod read_modes;
mod storage_suite;
mod wiped_voter;
