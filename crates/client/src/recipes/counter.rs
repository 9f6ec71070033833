//! A shared counter: atomic adds by a versioned write.

use super::ensure_path;
use crate::{Client, CreateMode, Error, Result};

/// A 64-bit signed counter kept in one node, as decimal text (so that
/// `baton get` shows it and any client can read it).
///
/// [`add`](Self::add) reads the value and its version and writes the sum
/// only if the version is still the one read; if another add came first it
/// reads again. Each add is applied exactly once, and returns the value it
/// produced: no two adds that return see the same result, and the values
/// returned follow the order in which the adds were applied. Like every
/// optimistic update it makes progress for the system as a whole (one add
/// in each round of contenders succeeds), not for each caller.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> baton_client::Result<()> {
/// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
/// let jobs = baton_client::recipes::Counter::new(&client, "/counters/jobs");
/// let id = jobs.add(1).await?; // a job id no one else gets
/// assert!(id >= 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Counter {
    client: Client,
    path: String,
}

impl Counter {
    /// The counter at `path`; the node is created by the first add (with
    /// any missing ancestors), and a missing node reads as 0.
    pub fn new(client: &Client, path: &str) -> Self {
        Counter {
            client: client.clone(),
            path: path.to_owned(),
        }
    }

    /// The counter's node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The value now (0 if the node does not exist yet, or is empty).
    ///
    /// # Errors
    /// [`Error::BadArguments`] if the node holds something other than a
    /// decimal number; a session or connection error.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn get(&self) -> Result<i64> {
        match self.client.get_data(&self.path).await {
            Ok((data, _)) => self.parse(&data),
            Err(Error::NoNode(_)) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Adds `delta` (which may be negative) and returns the value it made.
    ///
    /// # Errors
    /// [`Error::BadArguments`] if the node holds something other than a
    /// decimal number, or the sum would leave the range of `i64` (nothing
    /// changes); the errors of [`Client::set_data`] other than a version
    /// that moved on, which is retried.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: a write sent is applied whether or not this
    /// future is still awaited, so an add dropped after its write was sent
    /// may have counted. A caller that must know retries
    /// [`get`](Self::get) and reconciles.
    pub async fn add(&self, delta: i64) -> Result<i64> {
        loop {
            let read = match self.client.get_data(&self.path).await {
                Ok((data, stat)) => Some((self.parse(&data)?, stat.version)),
                Err(Error::NoNode(_)) => None,
                Err(e) => return Err(e),
            };
            let old = read.map_or(0, |(value, _)| value);
            let new = old.checked_add(delta).ok_or_else(|| {
                Error::BadArguments(format!(
                    "adding {delta} to counter {} at {old} would leave the range of a 64-bit signed integer; nothing changed",
                    self.path
                ))
            })?;
            let written = match read {
                Some((_, version)) => self
                    .client
                    .set_data(&self.path, new.to_string(), Some(version))
                    .await
                    .map(drop),
                None => self.create(new).await,
            };
            match written {
                Ok(()) => return Ok(new),
                // Another add (or the first create) came first: read again.
                Err(Error::BadVersion(_) | Error::NodeExists(_) | Error::NoNode(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Creates the node holding `value`, and its missing ancestors.
    async fn create(&self, value: i64) -> Result<()> {
        if let Some((parent, _)) = self.path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            ensure_path(&self.client, parent).await?;
        }
        self.client
            .create(&self.path, value.to_string(), CreateMode::Persistent)
            .await
            .map(drop)
    }

    /// The value `data` holds; an empty node (made by hand, say) holds 0.
    fn parse(&self, data: &[u8]) -> Result<i64> {
        std::str::from_utf8(data)
            .ok()
            .map(str::trim)
            .and_then(|text| if text.is_empty() { Some(0) } else { text.parse().ok() })
            .ok_or_else(|| {
                Error::BadArguments(format!(
                    "{} holds {:?}, not a counter (decimal text); write a number there or use another node",
                    self.path,
                    String::from_utf8_lossy(&data[..data.len().min(40)])
                ))
            })
    }
}
