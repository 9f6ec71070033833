//! `baton`'s commands end to end: each test runs the built binary as a
//! child process (with a server it starts, on 127.0.0.1 port 0, where it
//! needs one). One file per command or concern, all in one test binary so
//! that the suite is compiled and linked once.

#[path = "../common/mod.rs"]
mod common;

mod backup;
mod chaos;
mod cli;
mod config;
mod elect;
mod lock;
mod signals;
mod supervision;
mod tls;
