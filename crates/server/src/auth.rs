//! Identities and their rights on path prefixes.
//!
//! A server with identities refuses a handshake whose token names none,
//! and checks every request against the rights of the connection's
//! identity on the request's path: `read` (exists, get data, get children,
//! predecessor, check token, watches), `write` (create, delete, set data),
//! `lock` (enqueue: joining a lock's or an election's queue, and deleting
//! one's own ephemeral node there: a release), `fence` (fenced create,
//! delete and set data) and `admin` (everything, the server's counters and
//! backups). A rule's prefix covers the path itself and everything under
//! it; an identity's rights on a path are those of every rule that covers
//! it. Without identities the server is open, as it always was.

use std::sync::Arc;

use baton_proto::{CreateMode, ErrorCode, ErrorReply, Request, Token, TxnOp};
use rustls_pki_types::{CertificateDer, ServerName};

/// A set of rights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rights(u8);

impl Rights {
    pub const READ: Rights = Rights(1);
    pub const WRITE: Rights = Rights(2);
    pub const LOCK: Rights = Rights(4);
    pub const FENCE: Rights = Rights(8);
    pub const ADMIN: Rights = Rights(16);

    /// The names a config file gives rights by.
    pub const NAMES: [(&'static str, Rights); 5] = [
        ("read", Rights::READ),
        ("write", Rights::WRITE),
        ("lock", Rights::LOCK),
        ("fence", Rights::FENCE),
        ("admin", Rights::ADMIN),
    ];

    /// The right named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Rights> {
        Rights::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, r)| r)
    }

    fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }

    /// Both sets of rights.
    pub fn union_of(a: Rights, b: Rights) -> Rights {
        a.union(b)
    }

    /// Whether these rights allow what `wanted` names (admin allows all).
    pub fn allow(self, wanted: Rights) -> bool {
        self.0 & Rights::ADMIN.0 != 0 || self.0 & wanted.0 == wanted.0
    }

    fn name(self) -> &'static str {
        Rights::NAMES
            .iter()
            .find(|&&(_, r)| r == self)
            .map_or("?", |(n, _)| n)
    }
}

/// An identity: its name, its token and its rules, and the name a client
/// certificate may prove it by.
#[derive(Debug)]
pub struct Identity {
    pub name: String,
    token: Token,
    rules: Vec<(String, Rights)>,
    tls_name: Option<ServerName<'static>>,
}

impl Identity {
    /// An identity with `token` and `rules` (prefix, rights).
    pub fn new(name: String, token: Token, rules: Vec<(String, Rights)>) -> Identity {
        Identity {
            name,
            token,
            rules,
            tls_name: None,
        }
    }

    /// The same identity, which a client also proves by a certificate
    /// valid for `tls_name` (a DNS name or an address among its subject
    /// alternative names), signed by the server's client authority.
    ///
    /// # Errors
    /// `tls_name` is neither a DNS name nor an address.
    pub fn with_tls_name(mut self, tls_name: &str) -> Result<Identity, IdentityError> {
        let parsed =
            ServerName::try_from(tls_name.to_owned()).map_err(|_| IdentityError::TlsName {
                name: self.name.clone(),
                tls_name: tls_name.to_owned(),
            })?;
        self.tls_name = Some(parsed);
        Ok(self)
    }

    /// The rights this identity has on `path`.
    pub fn rights_on(&self, path: &str) -> Rights {
        self.rules
            .iter()
            .filter(|(prefix, _)| covers(prefix, path))
            .fold(Rights::default(), |all, &(_, r)| all.union(r))
    }

    /// `Ok` if this identity has `right` on `path`, else the error that
    /// names the identity, the right and the path.
    pub(crate) fn need(&self, right: Rights, path: &str) -> Result<(), ErrorReply> {
        if self.rights_on(path).allow(right) {
            return Ok(());
        }
        Err(self.refusal(right, path))
    }

    /// [`need`](Self::need) for a node whose name the server completes (a
    /// sequential create, an enqueue): the node is made beside `path`, in
    /// its parent, so the right is needed there. (A rule for `path` itself
    /// covers none of the nodes it can make.)
    fn need_in_parent(&self, right: Rights, path: &str) -> Result<(), ErrorReply> {
        if self.rights_on(parent(path)).allow(right) {
            return Ok(());
        }
        Err(self.refusal(right, path))
    }

    fn refusal(&self, right: Rights, path: &str) -> ErrorReply {
        ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "identity {} has no {} right on {path}",
                self.name,
                right.name()
            ),
        )
    }

    /// Checks a transaction's operations, each as the request it stands
    /// for (a check needs the read right); the first refused is named by its
    /// index.
    pub(crate) fn authorize_ops(
        &self,
        ops: &[TxnOp],
        owns: impl Fn(&str) -> bool,
    ) -> Result<(), (u32, ErrorReply)> {
        for (index, op) in ops.iter().enumerate() {
            match op {
                TxnOp::Create {
                    path, mode, fence, ..
                } => self.may_create(path, *mode, *fence),
                TxnOp::SetData { path, fence, .. } => self.need(write_or_fence(*fence), path),
                TxnOp::Delete { path, fence, .. } => self.may_delete(path, *fence, &owns),
                TxnOp::Check { path, .. } => self.need(Rights::READ, path),
            }
            .map_err(|e| (index as u32, e))?;
        }
        Ok(())
    }

    fn may_create(
        &self,
        path: &str,
        mode: CreateMode,
        fence: Option<u64>,
    ) -> Result<(), ErrorReply> {
        let right = write_or_fence(fence);
        if mode.is_sequential() {
            self.need_in_parent(right, path)?;
        } else {
            self.need(right, path)?;
        }
        // A fenced create raises its parent's fence too.
        if fence.is_some() {
            self.need(Rights::FENCE, parent(path))?;
        }
        Ok(())
    }

    fn may_delete(
        &self,
        path: &str,
        fence: Option<u64>,
        owns: &impl Fn(&str) -> bool,
    ) -> Result<(), ErrorReply> {
        let released = fence.is_none() && self.rights_on(path).allow(Rights::LOCK) && owns(path);
        if released {
            return Ok(());
        }
        self.need(write_or_fence(fence), path)?;
        // A fenced delete raises its parent's fence too.
        if fence.is_some() {
            self.need(Rights::FENCE, parent(path))?;
        }
        Ok(())
    }

    /// Checks `request` of a session; `owns` says whether a path is an
    /// ephemeral node of that session (a lock holder may delete its own
    /// node, which is how it releases).
    pub(crate) fn authorize(
        &self,
        request: &Request,
        owns: impl Fn(&str) -> bool,
    ) -> Result<(), ErrorReply> {
        match request {
            Request::Create {
                path, fence, mode, ..
            } => self.may_create(path, *mode, *fence),
            Request::SetData { path, fence, .. } => self.need(write_or_fence(*fence), path),
            Request::Delete { path, fence, .. } => self.may_delete(path, *fence, &owns),
            Request::Multi { ops } => self.authorize_ops(ops, owns).map_err(|(index, e)| {
                ErrorReply::new(e.code, format!("operation {index}: {}", e.message))
            }),
            Request::Enqueue { path, .. } => self.need_in_parent(Rights::LOCK, path),
            Request::LockDelay { path, .. } => self.need(Rights::WRITE, path),
            Request::SetAcl { path, .. } => self.need(Rights::ADMIN, path),
            Request::Exists { path, .. }
            | Request::GetData { path, .. }
            | Request::GetChildren { path, .. }
            | Request::Predecessor { path, .. }
            | Request::AddWatch { path, .. }
            | Request::CheckToken { path, .. } => self.need(Rights::READ, path),
            Request::SetWatches {
                data,
                exist,
                child,
                queue,
                ..
            } => {
                for path in data.iter().chain(exist).chain(child) {
                    self.need(Rights::READ, path)?;
                }
                for (path, _) in queue {
                    if !self.rights_on(path).allow(Rights::LOCK) {
                        self.need(Rights::READ, path)?;
                    }
                }
                Ok(())
            }
            Request::Stats => self.need(Rights::ADMIN, "/"),
            Request::Ping
            | Request::Sync
            | Request::CloseSession
            | Request::RemoveWatches { .. }
            | Request::SessionStatus { .. } => Ok(()),
        }
    }
}

/// The parent of a path (`/` for a node under the root).
/// The right a write needs: fence with a token, write without.
fn write_or_fence(fence: Option<u64>) -> Rights {
    if fence.is_some() {
        Rights::FENCE
    } else {
        Rights::WRITE
    }
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// Whether a rule for `prefix` covers `path`: the path itself, or one under
/// it (`/a` covers `/a` and `/a/b`, not `/ab`).
fn covers(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// Every identity a server knows.
/// Why a list of identities cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("identity {0}: its token is empty")]
    EmptyToken(String),
    #[error("identity {0} is given twice")]
    Twice(String),
    #[error("identities {first} and {second} have the same token")]
    SameToken { first: String, second: String },
    #[error("identity {name}: rule for {prefix:?}: {source}")]
    Rule {
        name: String,
        prefix: String,
        source: baton_proto::path::PathError,
    },
    #[error("identity {name}: tls-client {tls_name:?} is neither a DNS name nor an IP address")]
    TlsName { name: String, tls_name: String },
    #[error("identities {first} and {second} have the same tls-client name")]
    SameTlsName { first: String, second: String },
}

#[derive(Debug)]
pub struct Identities {
    list: Vec<Arc<Identity>>,
}

impl Identities {
    /// Checks that names and tokens are unique and prefixes are paths.
    ///
    /// # Errors
    /// An [`IdentityError`] naming the identity and what is wrong.
    pub fn new(list: Vec<Identity>) -> Result<Identities, IdentityError> {
        for (i, a) in list.iter().enumerate() {
            if a.token.0.is_empty() {
                return Err(IdentityError::EmptyToken(a.name.clone()));
            }
            for b in &list[..i] {
                if a.name == b.name {
                    return Err(IdentityError::Twice(a.name.clone()));
                }
                if a.token.matches(&b.token.0) {
                    return Err(IdentityError::SameToken {
                        first: b.name.clone(),
                        second: a.name.clone(),
                    });
                }
                if a.tls_name.is_some() && a.tls_name == b.tls_name {
                    return Err(IdentityError::SameTlsName {
                        first: b.name.clone(),
                        second: a.name.clone(),
                    });
                }
            }
            for (prefix, _) in &a.rules {
                baton_proto::path::validate(prefix).map_err(|source| IdentityError::Rule {
                    name: a.name.clone(),
                    prefix: prefix.clone(),
                    source,
                })?;
            }
        }
        Ok(Identities {
            list: list.into_iter().map(Arc::new).collect(),
        })
    }

    /// The identity a client certificate proves, if any: the first whose
    /// `tls-client` name the certificate is valid for. The certificate must
    /// already be verified (the TLS handshake did, against the server's
    /// client authority): this reads only its names.
    pub fn find_by_certificate(&self, cert: &CertificateDer<'_>) -> Option<Arc<Identity>> {
        let cert = webpki::EndEntityCert::try_from(cert).ok()?;
        self.list
            .iter()
            .find(|i| {
                i.tls_name
                    .as_ref()
                    .is_some_and(|n| cert.verify_is_valid_for_subject_name(n).is_ok())
            })
            .cloned()
    }

    /// The identity `token` names, if any. Every token is compared, each in
    /// time that depends on its length only, not on where they differ.
    pub fn find(&self, token: &[u8]) -> Option<Arc<Identity>> {
        let mut found = None;
        for identity in &self.list {
            if identity.token.matches(token) {
                found = Some(identity.clone());
            }
        }
        found
    }

    /// How many identities there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(rules: &[(&str, &[&str])]) -> Identity {
        let rules = rules
            .iter()
            .map(|(p, rs)| {
                let rights = rs
                    .iter()
                    .map(|r| Rights::parse(r).unwrap())
                    .fold(Rights::default(), Rights::union);
                (p.to_string(), rights)
            })
            .collect();
        Identity::new("team".into(), Token("t".into()), rules)
    }

    #[test]
    fn prefixes_cover_their_subtree_only_and_rights_add_up() {
        let id = identity(&[("/locks/a", &["lock", "fence"]), ("/", &["read"])]);
        assert!(id.rights_on("/locks/a").allow(Rights::LOCK));
        assert!(id.rights_on("/locks/a/lock-1").allow(Rights::FENCE));
        assert!(id.rights_on("/locks/a/lock-1").allow(Rights::READ));
        assert!(!id.rights_on("/locks/ab").allow(Rights::LOCK));
        assert!(!id.rights_on("/locks/b/x").allow(Rights::WRITE));
        let admin = identity(&[("/", &["admin"])]);
        assert!(admin.rights_on("/x").allow(Rights::FENCE));
    }

    #[test]
    fn requests_need_the_right_their_kind_and_path_call_for() {
        let id = identity(&[("/locks/a", &["lock", "read"])]);
        let enqueue = Request::Enqueue {
            path: "/locks/a/lock-".into(),
            data: Default::default(),
            rule: Default::default(),
        };
        assert!(id.authorize(&enqueue, |_| false).is_ok());
        let delete = |path: &str| Request::Delete {
            path: path.into(),
            version: None,
            fence: None,
        };
        // Its own node: a release. Another's: refused.
        assert!(id.authorize(&delete("/locks/a/lock-1"), |_| true).is_ok());
        let e = id
            .authorize(&delete("/locks/a/lock-2"), |_| false)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        assert!(
            e.message.contains("no write right on /locks/a/lock-2"),
            "{}",
            e.message
        );
        let fenced = Request::SetData {
            path: "/locks/a/data".into(),
            data: Default::default(),
            version: None,
            fence: Some(3),
        };
        let e = id.authorize(&fenced, |_| true).unwrap_err();
        assert!(e.message.contains("no fence right"), "{}", e.message);
        assert!(id.authorize(&Request::Stats, |_| true).is_err());
        assert!(id.authorize(&Request::Ping, |_| false).is_ok());
    }

    #[test]
    fn a_rule_for_a_name_covers_none_of_the_nodes_made_from_it() {
        // The server makes /locks/a/x0000000123 in /locks/a: a rule for
        // /locks/a/x must not let it join /locks/a's queue.
        let narrow = identity(&[("/locks/a/x", &["lock", "write"])]);
        let enqueue = Request::Enqueue {
            path: "/locks/a/x".into(),
            data: Default::default(),
            rule: Default::default(),
        };
        assert!(narrow.authorize(&enqueue, |_| false).is_err());
        let create = Request::Create {
            path: "/locks/a/x".into(),
            data: Default::default(),
            mode: baton_proto::CreateMode::PersistentSequential,
            fence: None,
            acl: baton_proto::Acl::OPEN,
        };
        assert!(narrow.authorize(&create, |_| false).is_err());
        // A rule for the queue's parent does.
        let queue = identity(&[("/locks/a", &["lock"])]);
        let join = Request::Enqueue {
            path: "/locks/a/lock-".into(),
            data: Default::default(),
            rule: Default::default(),
        };
        assert!(queue.authorize(&join, |_| false).is_ok());
    }

    #[test]
    fn a_fenced_create_or_delete_needs_fence_on_the_parent_whose_fence_it_raises() {
        let id = identity(&[("/res/data/x", &["fence"])]);
        let create = Request::Create {
            path: "/res/data/x".into(),
            data: Default::default(),
            mode: baton_proto::CreateMode::Persistent,
            fence: Some(7),
            acl: baton_proto::Acl::OPEN,
        };
        let e = id.authorize(&create, |_| false).unwrap_err();
        assert!(
            e.message.contains("no fence right on /res/data"),
            "{}",
            e.message
        );
        let wide = identity(&[("/res", &["fence"])]);
        assert!(wide.authorize(&create, |_| false).is_ok());
    }

    #[test]
    fn tokens_and_names_are_unique() {
        let t = |s: &str| Token(s.to_owned().into());
        let a = Identity::new("a".into(), t("one"), vec![]);
        let b = Identity::new("b".into(), t("one"), vec![]);
        assert!(Identities::new(vec![a, b])
            .unwrap_err()
            .to_string()
            .contains("same token"));
        let ids = Identities::new(vec![
            Identity::new("a".into(), t("one"), vec![]),
            Identity::new("b".into(), t("two"), vec![]),
        ])
        .unwrap();
        assert_eq!(ids.find(b"two").unwrap().name, "b");
        assert!(ids.find(b"three").is_none());
    }
}
