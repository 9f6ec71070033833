//! What Baton's tests share, so that each test file holds tests only:
//!
//! - [`TestServer`]: a real server on 127.0.0.1, port 0 (or a given one);
//! - [`Proxy`]: a TCP proxy between a client and a server that can cut or
//!   stall connections;
//! - [`Raw`]: a raw protocol client, for feeding the server bytes by hand;
//! - waits bounded by a deadline ([`within`], [`eventually`]), never a bare
//!   sleep;
//! - [`scratch`]: a fresh directory, removed when dropped; [`Evidence`]: one
//!   kept (and named) when its test fails;
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

/// A scratch directory for a test's data directories and server logs:
/// removed when the test passes, kept and named on stderr when it fails
/// (the guard is dropped while the test panics), so what the servers wrote
/// can be read after the run.
pub struct Evidence {
    dir: Option<TempDir>,
}

impl Evidence {
    /// A fresh, empty directory named after `name`.
    pub fn new(name: &str) -> Evidence {
        Evidence {
            dir: Some(scratch(name)),
        }
    }

    pub fn path(&self) -> &std::path::Path {
        self.dir.as_ref().expect("held until dropped").path()
    }

    /// `name` inside the directory.
    pub fn join(&self, name: impl AsRef<std::path::Path>) -> std::path::PathBuf {
        self.path().join(name)
    }
}

impl Drop for Evidence {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        if std::thread::panicking() {
            let kept = dir.keep();
            eprintln!(
                "keeping {} (data directories and server logs) for inspection",
                kept.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Evidence;

    #[test]
    fn evidence_is_removed_when_its_test_passes_and_kept_when_it_fails() {
        let passed = Evidence::new("passes");
        let path = passed.path().to_path_buf();
        std::fs::write(passed.join("log"), "served").unwrap();
        drop(passed);
        assert!(!path.exists(), "{} outlived a passing test", path.display());

        let failed = std::thread::spawn(|| {
            let evidence = Evidence::new("fails");
            std::fs::write(evidence.join("log"), "served").unwrap();
            let path = evidence.path().to_path_buf();
            // Dropped while this thread unwinds, as a failing test's guard is.
            std::panic::panic_any(path);
        })
        .join()
        .expect_err("the thread panics");
        let path = failed.downcast::<std::path::PathBuf>().unwrap();
        let kept = std::fs::read_to_string(path.join("log"));
        std::fs::remove_dir_all(&*path).unwrap();
        assert_eq!(kept.unwrap(), "served");
    }
}
