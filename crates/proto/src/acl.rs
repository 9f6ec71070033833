//! Access control lists of single nodes, as ZooKeeper's clients set them.
//!
//! Baton's own access control is its identities and their rights on path
//! prefixes. A node may also carry a list in ZooKeeper's form (scheme, id,
//! permissions), set when it is created or by a set-ACL request, which the
//! server checks for the ZooKeeper clients that name nodes' ACLs. A node
//! without a list ([`Acl::OPEN`]) lets everyone do everything, as
//! ZooKeeper's `world:anyone` with every permission.
//!
//! # Wire layout
//! ```text
//! acl: count u16 (1 to MAX_ENTRIES), then count entries:
//!   perms u8 (bits: 1 read, 2 write, 4 create, 8 delete, 16 admin),
//!   scheme str, id str
//! ```

use std::sync::Arc;

use bytes::BufMut;

use crate::error::DecodeError;
use crate::wire::{put_str16, Reader};

/// The permissions an ACL entry grants, as ZooKeeper numbers them.
pub mod perms {
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;
    pub const CREATE: u8 = 4;
    pub const DELETE: u8 = 8;
    pub const ADMIN: u8 = 16;
    pub const ALL: u8 = READ | WRITE | CREATE | DELETE | ADMIN;
}

/// Most entries one list may have.
pub const MAX_ENTRIES: usize = 64;

/// Longest scheme or id of an entry, in bytes.
pub const MAX_ID: usize = 1024;

/// One entry: whom (`scheme` and `id`, as `digest` and
/// `user:base64(sha1(user:password))`) and what (`perms`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AclEntry {
    pub perms: u8,
    pub scheme: String,
    pub id: String,
}

impl AclEntry {
    /// Whether the entry is `world:anyone`, whatever it grants.
    pub fn is_world(&self) -> bool {
        self.scheme == "world" && self.id == "anyone"
    }
}

/// A node's list: [`Acl::OPEN`] (no list: everyone may do everything), or
/// entries, shared by every node and log record that carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Acl(Option<Arc<[AclEntry]>>);

impl Acl {
    /// No list: everyone may do everything.
    pub const OPEN: Acl = Acl(None);

    /// A list of `entries`; none, or only `world:anyone` with every
    /// permission, is [`Acl::OPEN`].
    pub fn new(entries: Vec<AclEntry>) -> Acl {
        if entries.is_empty()
            || entries
                .iter()
                .all(|e| e.is_world() && e.perms == perms::ALL)
        {
            Acl::OPEN
        } else {
            Acl(Some(entries.into()))
        }
    }

    /// Whether this is [`Acl::OPEN`].
    pub fn is_open(&self) -> bool {
        self.0.is_none()
    }

    /// The entries (none when open).
    pub fn entries(&self) -> &[AclEntry] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// The permissions the list grants someone that `matches` the entries
    /// it says (`world:anyone` matches everyone; an open list grants all).
    pub fn granted(&self, matches: impl Fn(&AclEntry) -> bool) -> u8 {
        let Some(entries) = &self.0 else {
            return perms::ALL;
        };
        entries
            .iter()
            .filter(|e| e.is_world() || matches(e))
            .fold(0, |granted, e| granted | e.perms)
    }

    /// The bytes of the list in its wire layout.
    pub fn wire_len(&self) -> usize {
        match &self.0 {
            // Its one entry: permissions, "world" and "anyone".
            None => 2 + 1 + 7 + 8,
            Some(entries) => {
                2 + entries
                    .iter()
                    .map(|e| 5 + e.scheme.len() + e.id.len())
                    .sum::<usize>()
            }
        }
    }

    /// Appends the list in its wire layout (an open list as its one
    /// `world:anyone` entry).
    pub fn put(&self, b: &mut impl BufMut) {
        match &self.0 {
            None => {
                b.put_u16(1);
                b.put_u8(perms::ALL);
                put_str16(b, "world");
                put_str16(b, "anyone");
            }
            Some(entries) => {
                b.put_u16(entries.len() as u16);
                for e in entries.iter() {
                    b.put_u8(e.perms);
                    put_str16(b, &e.scheme);
                    put_str16(b, &e.id);
                }
            }
        }
    }

    /// Reads a list.
    ///
    /// # Errors
    /// A [`DecodeError`] if it is cut short, has no entries or more than
    /// [`MAX_ENTRIES`], grants a permission ZooKeeper has no bit for, or has
    /// a scheme or id longer than [`MAX_ID`] or not UTF-8.
    pub fn read(r: &mut Reader) -> Result<Acl, DecodeError> {
        let count = r.u16("ACL entries")?;
        if count == 0 || usize::from(count) > MAX_ENTRIES {
            return Err(DecodeError::BadValue {
                what: "ACL entries",
                value: count.into(),
            });
        }
        let mut entries = Vec::with_capacity(count.into());
        for _ in 0..count {
            let perms = r.u8("ACL permissions")?;
            if perms & !perms::ALL != 0 {
                return Err(DecodeError::BadValue {
                    what: "ACL permissions",
                    value: perms.into(),
                });
            }
            let scheme = r.str16("ACL scheme")?;
            let id = r.str16("ACL id")?;
            for (what, s) in [("ACL scheme", &scheme), ("ACL id", &id)] {
                if s.len() > MAX_ID {
                    return Err(DecodeError::BadValue {
                        what,
                        value: s.len() as u64,
                    });
                }
            }
            entries.push(AclEntry { perms, scheme, id });
        }
        Ok(Acl::new(entries))
    }
}

/// The mode byte's bit that says an ACL follows a create's other fields.
pub const MODE_WITH_ACL: u8 = 0x80;

/// Appends a create's mode byte: with [`MODE_WITH_ACL`] set unless `acl`
/// is open (then the layout is the one without ACLs).
pub fn put_create_mode(b: &mut impl BufMut, mode: u8, acl: &Acl) {
    b.put_u8(if acl.is_open() {
        mode
    } else {
        mode | MODE_WITH_ACL
    });
}

/// Appends what follows a create's other fields: the ACL, unless open.
pub fn put_create_acl(b: &mut impl BufMut, acl: &Acl) {
    if !acl.is_open() {
        acl.put(b);
    }
}

/// Splits a create's mode byte into the mode and whether an ACL follows.
pub fn split_create_mode(raw: u8) -> (u8, bool) {
    (raw & !MODE_WITH_ACL, raw & MODE_WITH_ACL != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};

    fn entry(perms: u8, scheme: &str, id: &str) -> AclEntry {
        AclEntry {
            perms,
            scheme: scheme.into(),
            id: id.into(),
        }
    }

    #[test]
    fn world_with_every_permission_is_open_and_anything_else_is_kept() {
        assert!(Acl::new(vec![]).is_open());
        assert!(Acl::new(vec![entry(perms::ALL, "world", "anyone")]).is_open());
        let read_only = Acl::new(vec![entry(perms::READ, "world", "anyone")]);
        assert!(!read_only.is_open());
        assert_eq!(read_only.granted(|_| false), perms::READ);
    }

    #[test]
    fn matching_entries_grant_together_and_others_grant_nothing() {
        let acl = Acl::new(vec![
            entry(perms::READ, "digest", "ann:x"),
            entry(perms::WRITE, "ip", "127.0.0.1"),
        ]);
        let ann = |e: &AclEntry| e.id == "ann:x" || e.id == "127.0.0.1";
        assert_eq!(acl.granted(ann), perms::READ | perms::WRITE);
        assert_eq!(acl.granted(|e| e.scheme == "ip"), perms::WRITE);
        assert_eq!(acl.granted(|_| false), 0);
        assert_eq!(Acl::OPEN.granted(|_| false), perms::ALL);
    }

    #[test]
    fn a_list_reads_back_and_bad_lists_fail_cleanly() {
        let acl = Acl::new(vec![
            entry(perms::ALL, "digest", "ann:x"),
            entry(perms::READ, "world", "anyone"),
        ]);
        for a in [acl, Acl::OPEN] {
            let mut b = BytesMut::new();
            a.put(&mut b);
            let frozen = b.freeze();
            let mut r = Reader::new(&frozen);
            assert_eq!(Acl::read(&mut r).unwrap(), a);
            assert!(r.at_end());
        }
        for bad in [
            &[0u8, 0][..],                    // no entries
            &[0, 1, 32, 0, 0, 0, 0][..],      // an unknown permission bit
            &[0, 1, 1, 0, 5, b'w'][..],       // cut short
            &[0, 1, 1, 0, 1, 0xff, 0, 0][..], // not UTF-8
            &[0xff, 0xff][..],                // too many entries
        ] {
            let frozen = Bytes::copy_from_slice(bad);
            assert!(Acl::read(&mut Reader::new(&frozen)).is_err(), "{bad:?}");
        }
    }
}
