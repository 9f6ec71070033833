//! A client's operations on nodes: create, read, watch, change and delete,
//! plain and fenced.

use baton_proto::{CreateMode, Reply, Request, Stat};
use bytes::Bytes;

use super::{unexpected, Client, Created};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::watcher::Watcher;

impl Client {
    /// Creates a node. With a sequential `mode` the server appends a
    /// 10-digit (or longer) sequence number to `path`'s last segment.
    ///
    /// # Errors
    /// [`Error::NodeExists`], [`Error::NoNode`] (no parent),
    /// [`Error::NoChildrenForEphemerals`], [`Error::InvalidPath`],
    /// [`Error::ValueTooLarge`], or a session or connection error.
    pub async fn create(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        mode: CreateMode,
    ) -> Result<Created> {
        self.create_inner(path, data.into(), mode, None).await
    }

    async fn create_inner(
        &self,
        path: &str,
        data: Bytes,
        mode: CreateMode,
        fence: Option<u64>,
    ) -> Result<Created> {
        self.check(path, Some(&data))?;
        let request = Request::Create {
            path: path.to_owned(),
            data,
            mode,
            fence,
            acl: baton_proto::Acl::OPEN,
        };
        match self.call(request, None).await?.reply {
            Reply::Create {
                path,
                sequence,
                stat,
            } => Ok(Created {
                path,
                sequence,
                stat,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes a node, if its version is `version` (any version if `None`).
    ///
    /// # Errors
    /// [`Error::NoNode`], [`Error::BadVersion`], [`Error::NotEmpty`], or a
    /// session or connection error.
    pub async fn delete(&self, path: &str, version: Option<u32>) -> Result<()> {
        self.check(path, None)?;
        let request = Request::Delete {
            path: path.to_owned(),
            version,
            fence: None,
        };
        self.call(request, None).await.map(|_| ())
    }

    /// The node's metadata, or `None` if it does not exist.
    ///
    /// # Errors
    /// A session or connection error.
    pub async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        self.exists_inner(path, false).await.map(|(s, _)| s)
    }

    /// Like [`exists`](Self::exists), and leaves a watch that fires when the
    /// node is created (if absent), or changes or is deleted (if present).
    ///
    /// # Errors
    /// A session or connection error.
    pub async fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watcher)> {
        self.exists_inner(path, true)
            .await
            .map(|(s, w)| (s, w.expect("watch requested")))
    }

    async fn exists_inner(
        &self,
        path: &str,
        watch: bool,
    ) -> Result<(Option<Stat>, Option<Watcher>)> {
        self.check(path, None)?;
        let request = Request::Exists {
            path: path.to_owned(),
            watch,
        };
        let (answer, watcher) = self.call_watch(path, request, watch).await?;
        match answer.reply {
            Reply::Exists(stat) => Ok((stat, watcher)),
            other => Err(unexpected(other)),
        }
    }

    /// The node's data and metadata.
    ///
    /// # Errors
    /// [`Error::NoNode`], or a session or connection error.
    pub async fn get_data(&self, path: &str) -> Result<(Bytes, Stat)> {
        self.get_data_inner(path, false)
            .await
            .map(|(d, s, _)| (d, s))
    }

    /// Like [`get_data`](Self::get_data), and leaves a watch that fires when
    /// the data changes or the node is deleted.
    ///
    /// # Errors
    /// [`Error::NoNode`] (no watch is left), or a session or connection error.
    pub async fn get_data_watch(&self, path: &str) -> Result<(Bytes, Stat, Watcher)> {
        self.get_data_inner(path, true)
            .await
            .map(|(d, s, w)| (d, s, w.expect("watch requested")))
    }

    async fn get_data_inner(
        &self,
        path: &str,
        watch: bool,
    ) -> Result<(Bytes, Stat, Option<Watcher>)> {
        self.check(path, None)?;
        let request = Request::GetData {
            path: path.to_owned(),
            watch,
        };
        let (answer, watcher) = self.call_watch(path, request, watch).await?;
        match answer.reply {
            Reply::GetData { stat, data } => Ok((data, stat, watcher)),
            other => Err(unexpected(other)),
        }
    }

    /// The names of the node's children, sorted, and the node's metadata.
    ///
    /// # Errors
    /// [`Error::NoNode`], or a session or connection error.
    pub async fn get_children(&self, path: &str) -> Result<(Vec<String>, Stat)> {
        self.get_children_inner(path, false)
            .await
            .map(|(c, s, _)| (c, s))
    }

    /// Like [`get_children`](Self::get_children), and leaves a watch that
    /// fires when a child is added or removed, or the node is deleted.
    ///
    /// # Errors
    /// [`Error::NoNode`] (no watch is left), or a session or connection error.
    pub async fn get_children_watch(&self, path: &str) -> Result<(Vec<String>, Stat, Watcher)> {
        self.get_children_inner(path, true)
            .await
            .map(|(c, s, w)| (c, s, w.expect("watch requested")))
    }

    async fn get_children_inner(
        &self,
        path: &str,
        watch: bool,
    ) -> Result<(Vec<String>, Stat, Option<Watcher>)> {
        self.check(path, None)?;
        let request = Request::GetChildren {
            path: path.to_owned(),
            watch,
        };
        let (answer, watcher) = self.call_watch(path, request, watch).await?;
        match answer.reply {
            Reply::GetChildren { stat, children } => Ok((children, stat, watcher)),
            other => Err(unexpected(other)),
        }
    }

    /// Replaces the node's data, if its version is `version` (any if `None`).
    ///
    /// # Errors
    /// [`Error::NoNode`], [`Error::BadVersion`], [`Error::ValueTooLarge`], or
    /// a session or connection error.
    pub async fn set_data(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        version: Option<u32>,
    ) -> Result<Stat> {
        let data = data.into();
        self.check(path, Some(&data))?;
        let request = Request::SetData {
            path: path.to_owned(),
            data,
            version,
            fence: None,
        };
        match self.call(request, None).await?.reply {
            Reply::SetData(stat) => Ok(stat),
            other => Err(unexpected(other)),
        }
    }

    /// Like [`set_data`](Self::set_data), fenced: applied only if `token` is at
    /// least the highest fencing token the node has accepted, which it then
    /// becomes. A holder whose lock passed on to a higher token is refused.
    ///
    /// # Errors
    /// [`Error::StaleFence`] naming both tokens (nothing changed), and the
    /// errors of [`set_data`](Self::set_data).
    pub async fn set_data_fenced(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        token: u64,
    ) -> Result<Stat> {
        let data = data.into();
        self.check(path, Some(&data))?;
        let request = Request::SetData {
            path: path.to_owned(),
            data,
            version: None,
            fence: Some(token),
        };
        match self.call(request, None).await?.reply {
            Reply::SetData(stat) => Ok(stat),
            other => Err(unexpected(other)),
        }
    }

    /// Like [`create`](Self::create), fenced by the parent: applied only if
    /// `token` is at least the highest token the parent has accepted.
    ///
    /// # Errors
    /// [`Error::StaleFence`], and the errors of [`create`](Self::create).
    pub async fn create_fenced(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        mode: CreateMode,
        token: u64,
    ) -> Result<Created> {
        self.create_inner(path, data.into(), mode, Some(token))
            .await
    }

    /// Like [`delete`](Self::delete), fenced by the node itself.
    ///
    /// # Errors
    /// [`Error::StaleFence`], and the errors of [`delete`](Self::delete).
    pub async fn delete_fenced(&self, path: &str, token: u64) -> Result<()> {
        self.check(path, None)?;
        let request = Request::Delete {
            path: path.to_owned(),
            version: None,
            fence: Some(token),
        };
        self.call(request, None).await.map(|_| ())
    }
}
