//! Local copies of a node or a subtree, kept current by a persistent watch.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use tokio::sync::broadcast;

use crate::{Client, Error, EventKind, PersistentWatch, Result, Stat};

/// A change a cache applied, as its [`changes`](TreeCache::changes) stream
/// reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// A node appeared in the cache, with its data.
    Added { path: String, data: Bytes },
    /// A node's data changed.
    Updated { path: String, data: Bytes },
    /// A node left the cache.
    Removed { path: String },
    /// The cache was read afresh (after a disconnection longer than the
    /// server's watch history): compare with what you had.
    Reset,
}

type Nodes = BTreeMap<String, (Bytes, Stat)>;

/// A local, always-current copy of the subtree under a path (the node and
/// every node below it, with data and metadata), for configuration and
/// service discovery: reads come from memory, and a stream tells of every
/// change.
///
/// It sets a recursive persistent watch first, then reads the subtree;
/// each change the watch reports is read again from the server, so the copy
/// converges to the server's state and follows it, change by change, in
/// order, across reconnects (the watch replays what a disconnection
/// missed; after one longer than the server's watch history the cache
/// reads everything afresh and reports [`CacheEvent::Reset`]). The copy
/// lags the server by the time a change takes to arrive and be read.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> baton_client::Result<()> {
/// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
/// let config = baton_client::recipes::TreeCache::start(&client, "/config").await?;
/// if let Some((data, _stat)) = config.get("/config/feature-x") {
///     println!("feature-x = {}", String::from_utf8_lossy(&data));
/// }
/// let mut changes = config.changes();
/// while let Ok(change) = changes.recv().await {
///     println!("{change:?}");
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Cancellation safety
///
/// [`start`](Self::start) is cancellation safe: dropping it leaves no
/// watch. Reads never wait. Dropping the cache stops following.
pub struct TreeCache {
    nodes: Arc<RwLock<Nodes>>,
    events: broadcast::Sender<CacheEvent>,
    task: tokio::task::JoinHandle<()>,
}

/// A local, always-current copy of one node: [`TreeCache`] for a node
/// alone (its children are not followed).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> baton_client::Result<()> {
/// let client = baton_client::Client::connect("127.0.0.1:4181").await?;
/// let leader = baton_client::recipes::NodeCache::start(&client, "/service/leader").await?;
/// println!("{:?}", leader.get().map(|(data, _)| data));
/// # Ok(())
/// # }
/// ```
///
/// # Cancellation safety
///
/// As [`TreeCache`].
pub struct NodeCache {
    path: String,
    tree: TreeCache,
}

/// Events kept for a slow reader of [`TreeCache::changes`] before it is told
/// it lagged.
const EVENTS: usize = 1024;

impl TreeCache {
    /// Starts following the subtree at `path` (which need not exist yet),
    /// and returns once it has been read.
    ///
    /// # Errors
    /// [`Error::InvalidPath`], and the errors of the watch and the reads.
    pub async fn start(client: &Client, path: &str) -> Result<TreeCache> {
        Self::follow(client, path, true).await
    }

    async fn follow(client: &Client, path: &str, recursive: bool) -> Result<TreeCache> {
        let watch = client.watch(path, recursive).await?;
        let mut cache = Follower {
            client: client.clone(),
            root: path.to_owned(),
            recursive,
            nodes: Arc::new(RwLock::new(BTreeMap::new())),
            events: broadcast::channel(EVENTS).0,
        };
        cache.read_all().await?;
        let (nodes, events) = (cache.nodes.clone(), cache.events.clone());
        let task = tokio::spawn(cache.run(watch));
        Ok(TreeCache {
            nodes,
            events,
            task,
        })
    }

    /// The data and metadata of the node at `path`, if the cache holds it.
    pub fn get(&self, path: &str) -> Option<(Bytes, Stat)> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()
    }

    /// The names of the children of the node at `path` the cache holds.
    pub fn children(&self, path: &str) -> Vec<String> {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        nodes
            .keys()
            .filter(|p| baton_proto::path::parent(p) == Some(path))
            .map(|p| baton_proto::path::name(p).to_owned())
            .collect()
    }

    /// Every node the cache holds, by path.
    pub fn snapshot(&self) -> BTreeMap<String, (Bytes, Stat)> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The changes the cache applies from now on, in order. A reader that
    /// falls more than 1,024 changes behind is told it lagged
    /// (`RecvError::Lagged`): read [`snapshot`](Self::snapshot) again.
    pub fn changes(&self) -> broadcast::Receiver<CacheEvent> {
        self.events.subscribe()
    }

    /// Whether the cache still follows the server (false once its session
    /// ended).
    pub fn is_following(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for TreeCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodeCache {
    /// Starts following the node at `path` (which need not exist yet).
    ///
    /// # Errors
    /// As [`TreeCache::start`].
    pub async fn start(client: &Client, path: &str) -> Result<NodeCache> {
        Ok(NodeCache {
            path: path.to_owned(),
            tree: TreeCache::follow(client, path, false).await?,
        })
    }

    /// The node's data and metadata, if it exists.
    pub fn get(&self) -> Option<(Bytes, Stat)> {
        self.tree.get(&self.path)
    }

    /// The changes of the node from now on, in order.
    pub fn changes(&self) -> broadcast::Receiver<CacheEvent> {
        self.tree.changes()
    }
}

/// The task that keeps a cache current.
struct Follower {
    client: Client,
    root: String,
    recursive: bool,
    nodes: Arc<RwLock<Nodes>>,
    events: broadcast::Sender<CacheEvent>,
}

impl Follower {
    async fn run(mut self, mut watch: PersistentWatch) {
        while let Ok(event) = watch.next().await {
            let applied = match event.kind {
                EventKind::Compacted => self.read_all().await.map(|()| Some(CacheEvent::Reset)),
                EventKind::Created | EventKind::DataChanged | EventKind::Deleted => {
                    self.read_one(&event.path).await
                }
                _ => Ok(None),
            };
            match applied {
                Ok(Some(change)) => {
                    let _ = self.events.send(change);
                }
                Ok(None) => {}
                // The session ended: the cache stops following.
                Err(_) => return,
            }
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Nodes> {
        self.nodes.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the node at `path` again, and records what changed.
    async fn read_one(&mut self, path: &str) -> Result<Option<CacheEvent>> {
        match self.client.get_data(path).await {
            Ok((data, stat)) => {
                let old = self.write().insert(path.to_owned(), (data.clone(), stat));
                Ok(match old {
                    None => Some(CacheEvent::Added {
                        path: path.to_owned(),
                        data,
                    }),
                    Some((_, before)) if before.mzxid == stat.mzxid => None,
                    Some(_) => Some(CacheEvent::Updated {
                        path: path.to_owned(),
                        data,
                    }),
                })
            }
            Err(Error::NoNode(_)) => Ok(self.write().remove(path).map(|_| CacheEvent::Removed {
                path: path.to_owned(),
            })),
            Err(e) => Err(e),
        }
    }

    /// Reads the whole node or subtree again.
    async fn read_all(&mut self) -> Result<()> {
        let mut fresh = BTreeMap::new();
        let mut pending = vec![self.root.clone()];
        while let Some(path) = pending.pop() {
            match self.client.get_data(&path).await {
                Ok((data, stat)) => {
                    if self.recursive && stat.num_children > 0 {
                        match self.client.get_children(&path).await {
                            Ok((names, _)) => pending
                                .extend(names.iter().map(|n| baton_proto::path::join(&path, n))),
                            Err(Error::NoNode(_)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    fresh.insert(path, (data, stat));
                }
                // Gone meanwhile: its deletion is an event to come.
                Err(Error::NoNode(_)) => {}
                Err(e) => return Err(e),
            }
        }
        *self.write() = fresh;
        Ok(())
    }
}
