//! Transactions: operations applied all or none.

use baton_proto::{path, Check, CreateMode, Reply, Request, TxnOp, TxnResult};
use bytes::Bytes;

use super::{unexpected, Client};
use crate::error::{Error, Result};

/// A transaction being built: operations applied in order, all or none, as
/// one change. Made by [`Client::txn`]; nothing is sent until
/// [`commit`](Self::commit).
///
/// Each operation that changes the tree takes the next revision, as it
/// would alone, so every node created has a creation revision (a fencing
/// token) of its own; no one sees the tree between two operations. Fenced
/// operations pass the same fence as they would alone, and raise it the
/// same way: fences only rise, inside a transaction as outside. A
/// transaction that fails changes nothing at all: no node, no fence, no
/// sequence number.
///
/// # Examples
///
/// Move a job from one queue to another only if the job is still at the
/// version this worker read and this worker still holds its lock:
///
/// ```no_run
/// # async fn demo(client: &baton_client::Client, token: u64) -> baton_client::Result<()> {
/// use baton_client::CreateMode;
/// let results = client
///     .txn()
///     .check_holder("/locks/jobs", token)
///     .check_version("/jobs/todo/42", 3)
///     .delete("/jobs/todo/42", None)
///     .create("/jobs/done/42", "result", CreateMode::Persistent)
///     .commit()
///     .await?;
/// assert_eq!(results.len(), 4);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a transaction does nothing until it is committed"]
pub struct Txn<'a> {
    client: &'a Client,
    ops: Vec<TxnOp>,
}

impl Client {
    /// Starts a transaction (see [`Txn`]).
    pub fn txn(&self) -> Txn<'_> {
        Txn {
            client: self,
            ops: Vec::new(),
        }
    }
}

impl<'a> Txn<'a> {
    /// Adds an operation built by hand.
    pub fn op(mut self, op: TxnOp) -> Self {
        self.ops.push(op);
        self
    }

    /// Creates a node, as [`Client::create`].
    pub fn create(self, path: &str, data: impl Into<Bytes>, mode: CreateMode) -> Self {
        self.op(TxnOp::Create {
            path: path.to_owned(),
            data: data.into(),
            mode,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        })
    }

    /// Creates a node fenced by its parent, as [`Client::create_fenced`].
    pub fn create_fenced(
        self,
        path: &str,
        data: impl Into<Bytes>,
        mode: CreateMode,
        token: u64,
    ) -> Self {
        self.op(TxnOp::Create {
            path: path.to_owned(),
            data: data.into(),
            mode,
            fence: Some(token),
            acl: baton_proto::Acl::OPEN,
        })
    }

    /// Deletes a node at `version` (any if `None`), as [`Client::delete`].
    pub fn delete(self, path: &str, version: Option<u32>) -> Self {
        self.op(TxnOp::Delete {
            path: path.to_owned(),
            version,
            fence: None,
        })
    }

    /// Deletes a node fenced by `token`, as [`Client::delete_fenced`].
    pub fn delete_fenced(self, path: &str, version: Option<u32>, token: u64) -> Self {
        self.op(TxnOp::Delete {
            path: path.to_owned(),
            version,
            fence: Some(token),
        })
    }

    /// Sets a node's data at `version` (any if `None`), as
    /// [`Client::set_data`].
    pub fn set_data(self, path: &str, data: impl Into<Bytes>, version: Option<u32>) -> Self {
        self.op(TxnOp::SetData {
            path: path.to_owned(),
            data: data.into(),
            version,
            fence: None,
        })
    }

    /// Sets a node's data fenced by `token`, as [`Client::set_data_fenced`].
    pub fn set_data_fenced(self, path: &str, data: impl Into<Bytes>, token: u64) -> Self {
        self.op(TxnOp::SetData {
            path: path.to_owned(),
            data: data.into(),
            version: None,
            fence: Some(token),
        })
    }

    /// Requires the node to exist.
    pub fn check_exists(self, path: &str) -> Self {
        self.check(path, Check::Exists)
    }

    /// Requires the node not to exist.
    pub fn check_absent(self, path: &str) -> Self {
        self.check(path, Check::Absent)
    }

    /// Requires the node to be at data version `version`.
    pub fn check_version(self, path: &str, version: u32) -> Self {
        self.check(path, Check::Version(version))
    }

    /// Requires the node to accept fencing token `token` (a fenced write
    /// with it would pass); raises nothing.
    pub fn check_fence(self, path: &str, token: u64) -> Self {
        self.check(path, Check::Fence(token))
    }

    /// Requires the holder of fencing token `token` under the lock or
    /// election at `path` to still hold its place: a child of `path`
    /// created at revision `token` is still there (as [`Client::check_token`]).
    pub fn check_holder(self, path: &str, token: u64) -> Self {
        self.check(path, Check::Holder(token))
    }

    fn check(self, path: &str, check: Check) -> Self {
        self.op(TxnOp::Check {
            path: path.to_owned(),
            check,
        })
    }

    /// The operations so far.
    pub fn ops(&self) -> &[TxnOp] {
        &self.ops
    }

    /// Sends the transaction and waits for its outcome: one result per
    /// operation, in order.
    ///
    /// # Errors
    /// [`Error::TxnFailed`] naming the operation that failed and why (no
    /// operation was applied); checked here before anything is sent, an
    /// invalid path, more than [`MAX_TXN_OPS`](crate::MAX_TXN_OPS) operations
    /// ([`Error::TooManyOperations`]) or more data in all than the server
    /// takes in one node ([`Error::ValueTooLarge`]), each as a
    /// [`Error::TxnFailed`] too; or a session or connection error, after
    /// which the outcome is unknown as for any change.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe, as no change is: once sent, a transaction is
    /// applied whole or not at all whether or not this future is still
    /// awaited, and dropping it only loses the answer.
    pub async fn commit(self) -> Result<Vec<TxnResult>> {
        let client = self.client;
        let ops = self.ops;
        check_ops(&ops, client.inner.max_data)?;
        let count = ops.len();
        match client.call(Request::Multi { ops }, None).await?.reply {
            Reply::Multi(Ok(results)) if results.len() == count => Ok(results),
            Reply::Multi(Err(failure)) => Err(Error::TxnFailed {
                index: failure.index,
                error: Box::new(Error::from_wire(failure.error.code, failure.error.message)),
            }),
            other => Err(unexpected(other)),
        }
    }
}

/// What the client can tell of a transaction before it is sent.
fn check_ops(ops: &[TxnOp], max_data: usize) -> Result<()> {
    let failed = |index: u32, error: Error| Error::TxnFailed {
        index,
        error: Box::new(error),
    };
    baton_proto::txn::check_limits(ops, max_data)
        .map_err(|(index, code, message)| failed(index, Error::from_wire(code, message)))?;
    for (index, op) in ops.iter().enumerate() {
        path::validate(op.path())
            .map_err(|e| failed(index as u32, Error::InvalidPath(e.to_string())))?;
    }
    Ok(())
}
