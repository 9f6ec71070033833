//! Barriers: one that holds everyone until it is lifted, and a double
//! barrier that parties enter and leave together.

use super::ensure_path;
use crate::{Client, CreateMode, Error, Result};

/// A barrier at one node: while the node exists, [`wait`](Self::wait)
/// waits; removing it lets every waiter through at once. (Curator's
/// `DistributedBarrier`.)
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: &baton_client::Client) -> baton_client::Result<()> {
/// let gate = baton_client::recipes::Barrier::new(client, "/barriers/deploy");
/// gate.set().await?; // the coordinator closes the gate
/// // ... workers call gate.wait().await? and block here ...
/// gate.remove().await?; // and opens it: every worker goes on
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Barrier {
    client: Client,
    path: String,
}

impl Barrier {
    pub fn new(client: &Client, path: &str) -> Self {
        Barrier {
            client: client.clone(),
            path: path.to_owned(),
        }
    }

    /// Closes the barrier (creates its node, and any missing ancestors); a
    /// barrier closed already stays so.
    ///
    /// # Errors
    /// A session or connection error, or a path or right refused.
    ///
    /// # Cancellation safety
    ///
    /// Safe to drop: the barrier is closed or not, and calling again closes it.
    pub async fn set(&self) -> Result<()> {
        if let Some((parent, _)) = self.path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            ensure_path(&self.client, parent).await?;
        }
        match self
            .client
            .create(&self.path, "", CreateMode::Persistent)
            .await
        {
            Ok(_) | Err(Error::NodeExists(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Opens the barrier (deletes its node): every waiter goes on.
    ///
    /// # Errors
    /// [`Error::NotEmpty`] if something was created under the node; a
    /// session or connection error.
    ///
    /// # Cancellation safety
    ///
    /// Safe to drop: the barrier is open or not, and calling again opens it.
    pub async fn remove(&self) -> Result<()> {
        match self.client.delete(&self.path, None).await {
            Ok(()) | Err(Error::NoNode(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits until the barrier is open (its node does not exist); returns at
    /// once if it is open now. One watch, which the opening fires.
    ///
    /// # Errors
    /// A session or connection error.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it changes nothing.
    pub async fn wait(&self) -> Result<()> {
        loop {
            let (stat, watcher) = self.client.exists_watch(&self.path).await?;
            if stat.is_none() {
                return Ok(());
            }
            watcher.await?;
        }
    }
}

/// A double barrier for `parties` processes: [`enter`](Self::enter)
/// returns once that many have entered, and [`leave`](Entered::leave) once all
/// who entered have left, so that a computation starts together and ends
/// together. (The ZooKeeper recipe, and Curator's
/// `DistributedDoubleBarrier`.)
///
/// Each party is an ephemeral node under the barrier, so a party whose
/// session ends is counted out of both. Entering parties wait on one node,
/// `ready`, which the party that completes the count creates: one change
/// wakes them all, and only they are woken. Leaving parties wait on one
/// node each: the lowest on the highest, every other one on the lowest.
///
/// # Examples
///
/// ```no_run
/// # async fn work() {}
/// # async fn demo(client: &baton_client::Client) -> baton_client::Result<()> {
/// let barrier = baton_client::recipes::DoubleBarrier::new(client, "/barriers/job", 3);
/// let entered = barrier.enter().await?; // all 3 are in
/// work().await;
/// entered.leave().await?; // all 3 are done
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct DoubleBarrier {
    client: Client,
    path: String,
    parties: usize,
}

/// A party inside a [`DoubleBarrier`]: its node, until it leaves.
#[derive(Debug)]
#[must_use = "a party that entered leaves with leave(); dropped, its node stays until its session ends"]
pub struct Entered {
    barrier: DoubleBarrier,
    node: String,
}

const READY: &str = "ready";
const PARTY: &str = "party-";

impl DoubleBarrier {
    /// A barrier at `path` for `parties` processes (at least 1).
    pub fn new(client: &Client, path: &str, parties: usize) -> Self {
        DoubleBarrier {
            client: client.clone(),
            path: path.to_owned(),
            parties: parties.max(1),
        }
    }

    /// Joins the barrier and waits until `parties` have joined.
    ///
    /// # Errors
    /// A session or connection error, or a path or right refused.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: a party dropped while it waits stays counted
    /// (its node is there) until its session ends.
    pub async fn enter(&self) -> Result<Entered> {
        ensure_path(&self.client, &self.path).await?;
        let ready = format!("{}/{READY}", self.path);
        // Watch `ready` before joining, so that its creation cannot slip
        // between the count and the wait.
        let (mut found, mut watcher) = self.client.exists_watch(&ready).await?;
        let node = self
            .client
            .create(
                &format!("{}/{PARTY}", self.path),
                "",
                CreateMode::EphemeralSequential,
            )
            .await?
            .path;
        let entered = Entered {
            barrier: self.clone(),
            node,
        };
        if found.is_none() && self.party_nodes().await?.len() >= self.parties {
            match self.client.create(&ready, "", CreateMode::Persistent).await {
                Ok(_) | Err(Error::NodeExists(_)) => return Ok(entered),
                Err(e) => return Err(e),
            }
        }
        while found.is_none() {
            watcher.await?;
            (found, watcher) = self.client.exists_watch(&ready).await?;
        }
        Ok(entered)
    }

    /// The party nodes now, in the order they joined.
    async fn party_nodes(&self) -> Result<Vec<String>> {
        let (mut children, _) = self.client.get_children(&self.path).await?;
        children.retain(|c| c.starts_with(PARTY));
        // The sequence suffix orders them.
        children.sort_by(|a, b| a[PARTY.len()..].cmp(&b[PARTY.len()..]));
        Ok(children)
    }
}

impl Entered {
    /// This party's node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Leaves the barrier and waits until every party that entered has left;
    /// the last one out removes `ready`, so the barrier can be used again.
    ///
    /// # Errors
    /// A session or connection error.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: a party dropped while it waits may have left
    /// or not; its node goes with its session at the latest.
    pub async fn leave(self) -> Result<()> {
        let b = &self.barrier;
        let mine = self.node.rsplit('/').next().unwrap_or_default().to_owned();
        loop {
            let parties = b.party_nodes().await?;
            let Some(lowest) = parties.first() else {
                break;
            };
            let here = parties.contains(&mine);
            if parties.len() == 1 && here {
                delete_if_there(&b.client, &self.node).await?;
                break;
            }
            // The lowest waits for the highest; every other one leaves and
            // waits for the lowest.
            let awaited = if *lowest == mine {
                parties.last().expect("two or more")
            } else {
                if here {
                    delete_if_there(&b.client, &self.node).await?;
                }
                lowest
            };
            let (stat, watcher) = b
                .client
                .exists_watch(&format!("{}/{awaited}", b.path))
                .await?;
            if stat.is_some() {
                watcher.await?;
            }
        }
        match b.client.delete(&format!("{}/{READY}", b.path), None).await {
            Ok(()) | Err(Error::NoNode(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

async fn delete_if_there(client: &Client, node: &str) -> Result<()> {
    match client.delete(node, None).await {
        Ok(()) | Err(Error::NoNode(_)) => Ok(()),
        Err(e) => Err(e),
    }
}
