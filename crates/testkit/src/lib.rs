//! What Baton's tests share, so that each test file holds tests only:
//!
//! - [`TestServer`]: a real server on 127.0.0.1, port 0 (or a given one);
//! - [`Proxy`]: a TCP proxy between a client and a server that can cut or
//!   stall connections;
//! - [`Raw`]: a raw protocol client, for feeding the server bytes by hand;
//! - waits bounded by a deadline ([`within`], [`eventually`]), never a bare
//!   sleep;
//! - [`scratch`]: a fresh directory, removed when dropped;
//! - [`pki`]: test certificates.

mod panics;
pub mod pki;
mod proxy;
mod raw;
mod server;
mod wait;

pub use panics::*;
pub use proxy::*;
pub use raw::*;
pub use server::*;
pub use wait::*;

pub use tempfile::TempDir;

/// A fresh, empty directory for one test's files, named after `name` under
/// the system's temporary directory; removed when the guard is dropped.
pub fn scratch(name: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("baton-test-{name}-"))
        .tempdir()
        .expect("a scratch directory")
}
