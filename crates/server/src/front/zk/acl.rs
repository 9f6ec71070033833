//! Nodes' access control lists for ZooKeeper's clients: who a client is
//! (its address and the digest credentials it proved), the lists it may
//! give nodes, and the checks ZooKeeper makes before each operation.
//!
//! The lists live in the state ([`baton_state::StateMachine::acl`]), set by
//! a create or a set-ACL through the log like any change. The checks are
//! made here, under the core lock, against the state the request sees; a
//! Baton identity with the `admin` right on a path passes them there, as
//! ZooKeeper's super user does. Baton's own protocol is governed by
//! identities and their rights alone.

use std::net::IpAddr;

use base64::Engine;
use baton_proto::acl::perms;
use baton_proto::{Acl, AclEntry};
use baton_zk::codes::err;

use crate::auth::{Identity, Rights};
use crate::core::Core;

/// The digest id ZooKeeper gives `user` proving `password`:
/// `user:base64(sha1(user:password))`, what a `digest` ACL entry names.
pub(super) fn digest_id(user: &str, password: &str) -> String {
    let hash = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{user}:{password}").as_bytes(),
    );
    let encoded = base64::engine::general_purpose::STANDARD.encode(hash.as_ref());
    format!("{user}:{encoded}")
}

/// Who sends a request: its Baton identity (rights on path prefixes), and
/// what it proved for nodes' lists: `ip` and its address, `x509` and the
/// identity its certificate proved, then one `digest` and its digest id
/// per credential it added.
pub(super) struct Caller<'a> {
    pub identity: Option<&'a Identity>,
    pub ids: &'a [(String, String)],
}

impl Caller<'_> {
    /// The identity's `right` on `path`, for what is answered here rather
    /// than by the core (which checks its own requests).
    pub fn may(&self, right: Rights, path: &str) -> Result<(), i32> {
        match self.identity {
            Some(id) if !id.rights_on(path).allow(right) => Err(err::NO_AUTH),
            _ => Ok(()),
        }
    }

    /// ZooKeeper's check of `wanted` (one permission, or several of which
    /// any will do, as getACL's read-or-admin) on the node at `path`:
    /// `NOAUTH` unless its list grants it. A node that does not exist has
    /// no list: the operation then fails on its own terms.
    pub fn check(&self, core: &Core, path: &str, wanted: u8) -> Result<(), i32> {
        let (acl, _) = core.sm().acl(path);
        if acl.is_open() {
            return Ok(());
        }
        if self
            .identity
            .is_some_and(|id| id.rights_on(path).allow(Rights::ADMIN))
        {
            return Ok(());
        }
        if acl.granted(|e| self.matches(e)) & wanted != 0 {
            Ok(())
        } else {
            Err(err::NO_AUTH)
        }
    }

    /// Whether the client is whom `entry` names.
    fn matches(&self, entry: &AclEntry) -> bool {
        self.ids.iter().any(|(scheme, id)| {
            *scheme == entry.scheme
                && (*id == entry.id || (scheme == "ip" && ip_matches(&entry.id, id)))
        })
    }

    /// The list a create or set-ACL asks for, as the state keeps it:
    /// `world:anyone`, `digest:user:hash`, `ip:address[/bits]`,
    /// `x509:IDENTITY` (a client whose certificate proved that Baton
    /// identity), and `auth`, which names every credential the client
    /// proved, digest or certificate (and is refused if it proved none), as
    /// ZooKeeper takes them; anything else, an empty list, or unknown
    /// permission bits: `INVALIDACL`.
    pub fn acl(&self, asked: Vec<baton_zk::Acl>) -> Result<Acl, i32> {
        if asked.is_empty() || asked.len() > baton_proto::acl::MAX_ENTRIES {
            return Err(err::INVALID_ACL);
        }
        let mut entries = Vec::with_capacity(asked.len());
        for a in asked {
            let Ok(perms) = u8::try_from(a.perms) else {
                return Err(err::INVALID_ACL);
            };
            if perms & !perms::ALL != 0
                || a.scheme.len() > baton_proto::acl::MAX_ID
                || a.id.len() > baton_proto::acl::MAX_ID
            {
                return Err(err::INVALID_ACL);
            }
            let valid = match a.scheme.as_str() {
                "world" => a.id == "anyone",
                "digest" => {
                    a.id.split_once(':')
                        .is_some_and(|(u, h)| !u.is_empty() && !h.is_empty())
                }
                "ip" => ip_entry(&a.id).is_some(),
                "x509" => !a.id.is_empty(),
                "auth" => {
                    let mut any = false;
                    let proved = |s: &str| s == "digest" || s == "x509";
                    for (scheme, id) in self.ids.iter().filter(|(s, _)| proved(s)) {
                        any = true;
                        entries.push(AclEntry {
                            perms,
                            scheme: scheme.clone(),
                            id: id.clone(),
                        });
                    }
                    if !any {
                        return Err(err::INVALID_ACL);
                    }
                    continue;
                }
                _ => false,
            };
            if !valid {
                return Err(err::INVALID_ACL);
            }
            entries.push(AclEntry {
                perms,
                scheme: a.scheme,
                id: a.id,
            });
        }
        if entries.len() > baton_proto::acl::MAX_ENTRIES {
            return Err(err::INVALID_ACL);
        }
        Ok(Acl::new(entries))
    }
}

/// A list in ZooKeeper's records (an open one as `world:anyone` with every
/// permission).
pub(super) fn to_zk(acl: &Acl) -> Vec<baton_zk::Acl> {
    if acl.is_open() {
        return vec![baton_zk::Acl::open()];
    }
    acl.entries()
        .iter()
        .map(|e| baton_zk::Acl {
            perms: e.perms.into(),
            scheme: e.scheme.clone(),
            id: e.id.clone(),
        })
        .collect()
}

/// An `ip` entry's address and prefix length (the whole address if none).
fn ip_entry(id: &str) -> Option<(IpAddr, u32)> {
    let (addr, bits) = match id.split_once('/') {
        Some((a, b)) => (a, Some(b.parse::<u32>().ok()?)),
        None => (id, None),
    };
    let addr: IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(max);
    (bits <= max).then_some((addr, bits))
}

/// Whether the client's address `client` lies in the `ip` entry `entry`.
fn ip_matches(entry: &str, client: &str) -> bool {
    let (Some((net, bits)), Ok(client)) = (ip_entry(entry), client.parse::<IpAddr>()) else {
        return false;
    };
    let prefix = |a: u128, width: u32| {
        if bits == 0 {
            0
        } else {
            a >> (width - bits)
        }
    };
    match (net, client) {
        (IpAddr::V4(n), IpAddr::V4(c)) => {
            prefix(u32::from(n).into(), 32) == prefix(u32::from(c).into(), 32)
        }
        (IpAddr::V6(n), IpAddr::V6(c)) => prefix(u128::from(n), 128) == prefix(u128::from(c), 128),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// base64 of the SHA-1 of `super:test`, as ZooKeeper's
    /// `DigestAuthenticationProvider.generateDigest` computes it.
    #[test]
    fn digest_ids_are_zookeepers() {
        assert_eq!(
            digest_id("super", "test"),
            "super:D/InIHSb7yEEbrWz8b9l71RjZJU="
        );
    }

    #[test]
    fn ip_entries_match_their_networks() {
        assert!(ip_matches("127.0.0.1", "127.0.0.1"));
        assert!(!ip_matches("127.0.0.1", "127.0.0.2"));
        assert!(ip_matches("10.1.0.0/16", "10.1.200.3"));
        assert!(!ip_matches("10.1.0.0/16", "10.2.0.1"));
        assert!(ip_matches("0.0.0.0/0", "192.168.1.1"));
        assert!(ip_matches("::1", "::1"));
        assert!(ip_matches("fd00::/8", "fd12::1"));
        assert!(!ip_matches("10.0.0.0/8", "::1"));
        assert!(!ip_matches("10.0.0.0/33", "10.0.0.1"));
        assert!(!ip_matches("not an address", "10.0.0.1"));
    }

    fn zk(perms: i32, scheme: &str, id: &str) -> baton_zk::Acl {
        baton_zk::Acl {
            perms,
            scheme: scheme.into(),
            id: id.into(),
        }
    }

    #[test]
    fn auth_names_every_digest_credential_and_bad_lists_are_invalid() {
        let ids = [
            ("ip".to_string(), "127.0.0.1".to_string()),
            ("digest".to_string(), "ann:x".to_string()),
            ("digest".to_string(), "bob:y".to_string()),
        ];
        let caller = Caller {
            identity: None,
            ids: &ids,
        };
        let acl = caller.acl(vec![zk(31, "auth", "")]).unwrap();
        let named: Vec<&str> = acl.entries().iter().map(|e| e.id.as_str()).collect();
        assert_eq!(named, ["ann:x", "bob:y"]);
        assert!(caller
            .acl(vec![zk(31, "world", "anyone")])
            .unwrap()
            .is_open());
        assert!(!caller
            .acl(vec![zk(1, "world", "anyone")])
            .unwrap()
            .is_open());
        let anonymous = Caller {
            identity: None,
            ids: &ids[..1],
        };
        for bad in [
            vec![],
            vec![zk(31, "auth", "")],
            vec![zk(31, "world", "someone")],
            vec![zk(31, "digest", "no-hash")],
            vec![zk(31, "ip", "300.1.1.1")],
            vec![zk(31, "sasl", "ann")],
            vec![zk(64, "world", "anyone")],
            vec![zk(-1, "world", "anyone")],
        ] {
            assert_eq!(anonymous.acl(bad.clone()), Err(err::INVALID_ACL), "{bad:?}");
        }
    }
}
