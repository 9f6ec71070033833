//! What each ZooKeeper request becomes: a native request (its reply then
//! written in ZooKeeper's form), or an answer read from the state under the
//! core's lock (for what Baton's own protocol has no request for).

use baton_proto::acl::perms;
use baton_proto::txn::Check;
use baton_proto::{path, CreateMode, Request, SessionId, TxnOp};
use baton_zk::codes::{err, mode, op, watch};
use baton_zk::jute::{put_buffer, put_int, put_str, put_strings};
use baton_zk::request::{Create, MultiOp};
use baton_zk::Request as Zk;
use bytes::{Bytes, BytesMut};
use tracing::warn;

use super::acl::{self, Caller};
use super::answer::{failed_multi, multi_end, multi_error, multi_header, stat_of, Answer};
use crate::auth::Rights;
use crate::core::Core;
use crate::watches::Kinds;

/// What a request becomes.
pub(super) enum Plan {
    /// One native request, answered as `Answer` says.
    Native(Request, Answer),
    /// An answer read from the state now (a body, or an error code).
    Local(Result<Bytes, i32>),
    /// setWatches2: the persistent watches set again (quietly), then the
    /// one-shot watches, whose reply is the request's.
    Watches(Vec<Request>, Request),
}

/// Whether an op changes the state: a cluster member hands it on at once,
/// where a read waits for its read barrier.
pub(super) fn is_change(code: i32) -> bool {
    matches!(
        code,
        op::CREATE
            | op::CREATE2
            | op::CREATE_CONTAINER
            | op::CREATE_TTL
            | op::DELETE
            | op::SET_DATA
            | op::MULTI
            | op::CLOSE_SESSION
    )
}

/// Whether a request of this op code waits for a read barrier in every read
/// mode: a ping (its answer tells the client the leader heard from the
/// session) and a sync (the reads after it see every change committed
/// before it), as in Baton's own protocol.
pub(super) fn confirms(code: i32) -> bool {
    matches!(code, op::PING | op::SYNC)
}

/// A path, checked against Baton's path rules (which ZooKeeper's client
/// checks too): bad arguments if it breaks one.
fn checked(p: String) -> Result<String, i32> {
    match path::validate(&p) {
        Ok(()) => Ok(p),
        Err(_) => Err(err::BAD_ARGUMENTS),
    }
}

/// A version condition: -1 matches any version.
fn version(v: i32) -> Option<u32> {
    (v != -1).then_some(v as u32)
}

/// The plan for a request other than auth (which the connection handles
/// itself). `core` is locked for the whole request, so an answer read from
/// the state is the state the request sees.
pub(super) fn plan(core: &Core, session: SessionId, caller: &Caller, request: Zk) -> Plan {
    match plan_inner(core, session, caller, request) {
        Ok(plan) => plan,
        Err(code) => Plan::Local(Err(code)),
    }
}

fn plan_inner(core: &Core, session: SessionId, caller: &Caller, request: Zk) -> Result<Plan, i32> {
    let native = |r| Ok(Plan::Native(r, Answer::Plain));
    // What is answered here rather than by the core is checked here: the
    // identity needs `right` on the path (native requests: in the core).
    let may = |right: Rights, path: &str| caller.may(right, path);
    // And every request as ZooKeeper checks it against nodes' lists.
    let check = |path: &str, wanted: u8| caller.check(core, path, wanted);
    match request {
        Zk::Create(c) => {
            let (path, data, mode, acl) = create(c, core.revision(), false, caller)?;
            check(parent_of(&path), perms::CREATE)?;
            native(Request::Create {
                path,
                data,
                mode,
                fence: None,
                acl,
            })
        }
        Zk::Delete { path, version: v } => {
            let path = checked(path)?;
            check(parent_of(&path), perms::DELETE)?;
            native(Request::Delete {
                path,
                version: version(v),
                fence: None,
            })
        }
        // As ZooKeeper: exists needs no permission.
        Zk::Exists { path, watch } => native(Request::Exists {
            path: checked(path)?,
            watch,
        }),
        Zk::GetData { path, watch } => {
            let path = checked(path)?;
            check(&path, perms::READ)?;
            native(Request::GetData { path, watch })
        }
        Zk::SetData {
            path,
            data,
            version: v,
        } => {
            let path = checked(path)?;
            check(&path, perms::WRITE)?;
            native(Request::SetData {
                path,
                data,
                version: version(v),
                fence: None,
            })
        }
        // Without a watch (the lock recipes' listing), the names are
        // written straight from the state: no copy of each name on the way.
        Zk::GetChildren {
            path,
            watch: false,
            stat,
        } => {
            let path = checked(path)?;
            may(Rights::READ, &path)?;
            let node = core.sm().node(&path).ok_or(err::NO_NODE)?;
            check(&path, perms::READ)?;
            let names = node.child_names();
            let mut b =
                BytesMut::with_capacity(8 + names.iter().map(|n| 4 + n.len()).sum::<usize>());
            put_strings(&mut b, names.iter());
            if stat {
                stat_of(&node.stat(), core.sm().acl(&path).1).encode(&mut b);
            }
            Ok(Plan::Local(Ok(b.freeze())))
        }
        Zk::GetChildren { path, watch, .. } => {
            let path = checked(path)?;
            check(&path, perms::READ)?;
            native(Request::GetChildren { path, watch })
        }
        Zk::Sync { path } => Ok(Plan::Native(Request::Ping, Answer::Sync(checked(path)?))),
        Zk::Ping => native(Request::Ping),
        Zk::CloseSession => native(Request::CloseSession),
        Zk::Multi { ops, read: false } => multi(core, caller, ops),
        Zk::Multi { ops, read: true } => Ok(Plan::Local(Ok(multi_read(core, caller, ops)))),
        Zk::GetAcl { path } => {
            let path = checked(path)?;
            may(Rights::READ, &path)?;
            let node = core.sm().node(&path).ok_or(err::NO_NODE)?;
            // As ZooKeeper: reading a list takes read or admin.
            check(&path, perms::READ | perms::ADMIN)?;
            let (acl, aversion) = core.sm().acl(&path);
            let mut b = BytesMut::new();
            baton_zk::Acl::encode_list(&acl::to_zk(acl), &mut b);
            stat_of(&node.stat(), aversion).encode(&mut b);
            Ok(Plan::Local(Ok(b.freeze())))
        }
        Zk::SetAcl {
            path,
            acl,
            version: v,
        } => {
            let path = checked(path)?;
            let acl = caller.acl(acl)?;
            check(&path, perms::ADMIN)?;
            native(Request::SetAcl {
                path,
                acl,
                version: version(v),
            })
        }
        Zk::CheckWatches { path, kind } => {
            let path = checked(path)?;
            may(Rights::READ, &path)?;
            watched(core, session, &path, kind)?;
            Ok(Plan::Local(Ok(Bytes::new())))
        }
        Zk::RemoveWatches { path, kind } => {
            let path = checked(path)?;
            let (data, child, persistent) = watched(core, session, &path, kind)?;
            native(Request::RemoveWatches {
                path,
                data,
                child,
                persistent,
            })
        }
        Zk::AddWatch { path, mode } => {
            let recursive = match mode {
                watch::MODE_PERSISTENT => false,
                watch::MODE_PERSISTENT_RECURSIVE => true,
                _ => return Err(err::BAD_ARGUMENTS),
            };
            let path = checked(path)?;
            check(&path, perms::READ)?;
            native(Request::AddWatch {
                path,
                recursive,
                from: 0,
            })
        }
        Zk::SetWatches {
            relative_zxid,
            data,
            exist,
            child,
            persistent,
            recursive,
        } => {
            let all =
                |list: Vec<String>| list.into_iter().map(checked).collect::<Result<Vec<_>, _>>();
            let (data, exist, child) = (all(data)?, all(exist)?, all(child)?);
            let mut again = Vec::with_capacity(persistent.len() + recursive.len());
            for (list, recursive) in [(persistent, false), (recursive, true)] {
                for path in list {
                    again.push(Request::AddWatch {
                        path: checked(path)?,
                        recursive,
                        // As ZooKeeper does: set again, without replaying
                        // what changed meanwhile.
                        from: 0,
                    });
                }
            }
            Ok(Plan::Watches(
                again,
                Request::SetWatches {
                    revision: relative_zxid.max(0) as u64,
                    data,
                    exist,
                    child,
                    queue: Vec::new(),
                },
            ))
        }
        Zk::GetEphemerals { prefix } => {
            // A session's own nodes: no right is needed to list them.
            let mut paths: Vec<&str> = core
                .sm()
                .session(session)
                .map(|s| {
                    s.ephemerals
                        .iter()
                        .map(|p| &**p)
                        .filter(|p| p.starts_with(&prefix))
                        .collect()
                })
                .unwrap_or_default();
            paths.sort_unstable();
            let mut b = BytesMut::new();
            put_strings(&mut b, paths.iter());
            Ok(Plan::Local(Ok(b.freeze())))
        }
        Zk::GetAllChildrenNumber { path } => {
            let path = checked(path)?;
            may(Rights::READ, &path)?;
            check(&path, perms::READ)?;
            let count = descendants(core, &path).ok_or(err::NO_NODE)?;
            let mut b = BytesMut::new();
            put_int(&mut b, count.min(i32::MAX as usize) as i32);
            Ok(Plan::Local(Ok(b.freeze())))
        }
        Zk::Reconfig => Err(err::RECONFIG_DISABLED),
        // A server configured without SASL: ZooKeeper's client reports the
        // authentication failed.
        Zk::Sasl => Err(err::AUTH_FAILED),
        // ZooKeeper's own server sends this one to itself.
        Zk::DeleteContainer { .. } => Err(err::UNIMPLEMENTED),
        Zk::WhoAmI | Zk::Auth { .. } => unreachable!("the connection answers these itself"),
    }
}

/// The parent of a checked path (a sequential create's `parent/` names
/// `parent`).
fn parent_of(p: &str) -> &str {
    match p.strip_suffix('/') {
        Some(parent) if !parent.is_empty() => parent,
        _ => path::parent(p).unwrap_or("/"),
    }
}

/// The last sequence number that fits ZooKeeper's 10-digit suffix.
const LAST_TEN_DIGIT_SEQUENCE: u64 = 9_999_999_999;

/// How far below it sequential creates through this protocol stop: changes
/// proposed and not yet applied take revisions before this one's turn.
const SEQUENCE_MARGIN: u64 = 1 << 20;

/// A create's path, data, mode and list (`caller` gives `auth` entries
/// their ids). `revision` is the state's: a sequence
/// number is the creation's revision, and ZooKeeper's clients need it in 10
/// digits (kazoo's recipes find their nodes by exactly 10), so past that a
/// sequential create is refused rather than given a name they misread. A
/// sequential create may name its parent with a trailing slash
/// (`/jobs/`: the node is named by its number alone), as ZooKeeper allows,
/// except in a multi, whose operations are logged with paths that must
/// follow the path rules.
fn create(
    c: Create,
    revision: u64,
    in_multi: bool,
    caller: &Caller,
) -> Result<(String, Bytes, CreateMode, baton_proto::Acl), i32> {
    if c.op == op::CREATE_TTL {
        return Err(err::UNIMPLEMENTED);
    }
    let acl = caller.acl(c.acl)?;
    let mode = match c.flags {
        mode::PERSISTENT => CreateMode::Persistent,
        mode::CONTAINER => CreateMode::Container,
        mode::EPHEMERAL => CreateMode::Ephemeral,
        mode::PERSISTENT_SEQUENTIAL => CreateMode::PersistentSequential,
        mode::EPHEMERAL_SEQUENTIAL => CreateMode::EphemeralSequential,
        mode::PERSISTENT_WITH_TTL | mode::PERSISTENT_SEQUENTIAL_WITH_TTL => {
            return Err(err::UNIMPLEMENTED)
        }
        _ => return Err(err::BAD_ARGUMENTS),
    };
    let sequential = matches!(
        mode,
        CreateMode::PersistentSequential | CreateMode::EphemeralSequential
    );
    if sequential && revision.saturating_add(SEQUENCE_MARGIN) > LAST_TEN_DIGIT_SEQUENCE {
        warn!(
            revision,
            "refused a sequential create through the ZooKeeper port: its number would pass 10 digits, which ZooKeeper's clients cannot read (docs/zookeeper.md)"
        );
        return Err(err::SYSTEM_ERROR);
    }
    let path = if sequential && !in_multi && c.path.len() > 1 && c.path.ends_with('/') {
        checked(format!("{}0", c.path))?;
        c.path
    } else {
        checked(c.path)?
    };
    Ok((path, c.data, mode, acl))
}

/// A multi: one native transaction, or (an operation refused on its form)
/// the answer that it failed there.
///
/// Each operation is checked against the list of the node it needs a
/// permission on as the state is now, as ZooKeeper checks a multi's
/// operations before any is applied (a node an earlier operation of the
/// same multi creates is checked as absent: open).
fn multi(core: &Core, caller: &Caller, ops: Vec<MultiOp>) -> Result<Plan, i32> {
    let revision = core.revision();
    let check = |path: &str, wanted: u8| caller.check(core, path, wanted);
    let aversion = |path: &str| core.sm().acl(path).1;
    let count = ops.len();
    let mut codes = Vec::with_capacity(count);
    let mut txn = Vec::with_capacity(count);
    for (i, o) in ops.into_iter().enumerate() {
        let (code, converted) = match o {
            MultiOp::Create(c) => (
                c.op,
                create(c, revision, true, caller).and_then(|(path, data, mode, acl)| {
                    check(parent_of(&path), perms::CREATE)?;
                    Ok(TxnOp::Create {
                        path,
                        data,
                        mode,
                        fence: None,
                        acl,
                    })
                }),
            ),
            MultiOp::Delete { path, version: v } => (
                op::DELETE,
                checked(path).and_then(|path| {
                    check(parent_of(&path), perms::DELETE)?;
                    Ok(TxnOp::Delete {
                        path,
                        version: version(v),
                        fence: None,
                    })
                }),
            ),
            MultiOp::SetData {
                path,
                data,
                version: v,
            } => (
                op::SET_DATA,
                checked(path).and_then(|path| {
                    check(&path, perms::WRITE)?;
                    Ok(TxnOp::SetData {
                        path,
                        data,
                        version: version(v),
                        fence: None,
                    })
                }),
            ),
            MultiOp::Check { path, version: v } => (
                op::CHECK,
                checked(path).and_then(|path| {
                    check(&path, perms::READ)?;
                    Ok(TxnOp::Check {
                        path,
                        check: version(v).map_or(Check::Exists, Check::Version),
                    })
                }),
            ),
            // Reads belong in a multiRead.
            MultiOp::GetData { .. } | MultiOp::GetChildren { .. } => {
                (op::GET_DATA, Err(err::BAD_ARGUMENTS))
            }
        };
        match converted {
            Ok(t) => {
                codes.push((code, aversion(t.path())));
                txn.push(t);
            }
            Err(code) => {
                let mut b = BytesMut::new();
                failed_multi(&mut b, count, i, code);
                multi_end(&mut b);
                return Ok(Plan::Local(Ok(b.freeze())));
            }
        }
    }
    if txn.is_empty() {
        let mut b = BytesMut::new();
        multi_end(&mut b);
        return Ok(Plan::Local(Ok(b.freeze())));
    }
    Ok(Plan::Native(
        Request::Multi { ops: txn },
        Answer::Multi(codes.into_boxed_slice()),
    ))
}

/// A multiRead's results, read from the state at once: each operation's
/// data or children, or its error.
fn multi_read(core: &Core, caller: &Caller, ops: Vec<MultiOp>) -> Bytes {
    let node = |path: String| {
        let path = checked(path)?;
        caller.may(Rights::READ, &path)?;
        let node = core.sm().node(&path).ok_or(err::NO_NODE)?;
        caller.check(core, &path, perms::READ)?;
        Ok((node, core.sm().acl(&path).1))
    };
    let mut b = BytesMut::new();
    for o in ops {
        match o {
            MultiOp::GetData { path } => match node(path) {
                Ok((node, aversion)) => {
                    multi_header(&mut b, op::GET_DATA, err::OK);
                    put_buffer(&mut b, &node.data());
                    stat_of(&node.stat(), aversion).encode(&mut b);
                }
                Err(e) => multi_error(&mut b, e),
            },
            MultiOp::GetChildren { path } => match node(path) {
                Ok((node, _)) => {
                    multi_header(&mut b, op::GET_CHILDREN, err::OK);
                    put_strings(&mut b, node.child_names().iter());
                }
                Err(e) => multi_error(&mut b, e),
            },
            _ => multi_error(&mut b, err::BAD_ARGUMENTS),
        }
    }
    multi_end(&mut b);
    b.freeze()
}

/// Which of `session`'s watches on `path` a check or remove watches of
/// ZooKeeper's watcher type `kind` names (data, child, persistent); no
/// watcher if it holds none of them.
fn watched(
    core: &Core,
    session: SessionId,
    path: &str,
    kind: i32,
) -> Result<(bool, bool, bool), i32> {
    let (kinds, persistent) = core.watches_on(session, path);
    let data = kinds.contains(Kinds::DATA);
    let child = kinds.contains(Kinds::CHILD);
    let wanted = match kind {
        watch::CHILDREN => (false, child, false),
        watch::DATA => (data, false, false),
        watch::ANY => (data, child, persistent),
        watch::PERSISTENT | watch::PERSISTENT_RECURSIVE => (false, false, persistent),
        _ => return Err(err::BAD_ARGUMENTS),
    };
    if wanted == (false, false, false) {
        return Err(err::NO_WATCHER);
    }
    Ok(wanted)
}

/// How many nodes lie below `path` (none if it does not exist).
fn descendants(core: &Core, path: &str) -> Option<usize> {
    let sm = core.sm();
    let mut stack = vec![sm.node(path)?];
    let mut count = 0usize;
    while let Some(node) = stack.pop() {
        for child in node.children() {
            count += 1;
            stack.extend(sm.node(child));
        }
    }
    Some(count)
}

/// A whoAmI's answer: the client's identities, ZooKeeper's way
/// (`ClientInfo` records of scheme and user).
pub(super) fn who_am_i(ids: &[(String, String)]) -> Bytes {
    let mut b = BytesMut::new();
    put_int(&mut b, ids.len() as i32);
    for (scheme, id) in ids {
        put_str(&mut b, scheme);
        // A digest id names its user before the hash, as ZooKeeper shows it.
        let user = match scheme.as_str() {
            "digest" => id.split_once(':').map_or(id.as_str(), |(user, _)| user),
            _ => id,
        };
        put_str(&mut b, user);
    }
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOBODY: Caller = Caller {
        identity: None,
        ids: &[],
    };

    fn sequential(path: &str) -> Create {
        Create {
            path: path.into(),
            data: Bytes::new(),
            acl: vec![baton_zk::Acl::open()],
            flags: mode::EPHEMERAL_SEQUENTIAL,
            ttl: None,
            op: op::CREATE2,
        }
    }

    /// kazoo finds its lock nodes by a suffix of exactly 10 digits: a
    /// sequential create whose number could need 11 is refused, never
    /// answered with a name the client misreads (its lock would then let
    /// everyone in).
    #[test]
    fn sequential_creates_stop_before_the_suffix_needs_11_digits() {
        let last_safe = LAST_TEN_DIGIT_SEQUENCE - SEQUENCE_MARGIN;
        assert!(create(sequential("/l/n-"), last_safe, false, &NOBODY).is_ok());
        assert_eq!(
            create(sequential("/l/n-"), last_safe + 1, false, &NOBODY).err(),
            Some(err::SYSTEM_ERROR)
        );
        assert_eq!(
            create(sequential("/l/n-"), u64::MAX, true, &NOBODY).err(),
            Some(err::SYSTEM_ERROR)
        );
        // Plain creates are not numbered: no limit.
        let plain = Create {
            flags: mode::PERSISTENT,
            ..sequential("/l/x")
        };
        assert!(create(plain, u64::MAX, false, &NOBODY).is_ok());
    }

    #[test]
    fn a_sequential_create_may_name_its_parent_with_a_slash_outside_a_multi() {
        let (path, _, _, _) = create(sequential("/jobs/"), 5, false, &NOBODY).unwrap();
        assert_eq!(path, "/jobs/");
        assert_eq!(
            create(sequential("/jobs/"), 5, true, &NOBODY).err(),
            Some(err::BAD_ARGUMENTS)
        );
        let plain = Create {
            flags: mode::PERSISTENT,
            ..sequential("/jobs/")
        };
        assert_eq!(
            create(plain, 5, false, &NOBODY).err(),
            Some(err::BAD_ARGUMENTS)
        );
    }
}
