//! The rules a node path must follow, and helpers to take paths apart.
//!
//! A path is absolute (`/` then segments separated by `/`), has no empty
//! segment and no trailing slash (except the root `/` itself), no `.` or `..`
//! segment, no control character (NUL included), is valid UTF-8 and at most
//! [`MAX_PATH_LEN`] bytes long.

use crate::MAX_PATH_LEN;

/// Which path rule was broken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    #[error("path is empty; paths start with '/'")]
    Empty,
    #[error("path {0:?} is relative; paths start with '/'")]
    NotAbsolute(String),
    #[error("path {0:?} ends with '/'; only the root may")]
    TrailingSlash(String),
    #[error("path {0:?} has an empty segment ('//')")]
    EmptySegment(String),
    #[error("path {0:?} has a '.' or '..' segment")]
    DotSegment(String),
    #[error("path {0:?} contains a control character (NUL included)")]
    ControlCharacter(String),
    #[error("path is not valid UTF-8")]
    InvalidUtf8,
    #[error("path is {0} bytes long; the limit is {MAX_PATH_LEN}")]
    TooLong(usize),
}

/// Checks raw path bytes from the wire and returns them as a string.
///
/// # Errors
/// The first rule the path breaks, as a [`PathError`].
pub fn validate_bytes(raw: &[u8]) -> Result<&str, PathError> {
    if raw.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong(raw.len()));
    }
    let path = std::str::from_utf8(raw).map_err(|_| PathError::InvalidUtf8)?;
    validate(path)?;
    Ok(path)
}

/// Checks a path against the rules.
///
/// # Errors
/// The first rule the path breaks, as a [`PathError`].
pub fn validate(path: &str) -> Result<(), PathError> {
    if path.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong(path.len()));
    }
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute(path.to_owned()));
    }
    if path.chars().any(char::is_control) {
        return Err(PathError::ControlCharacter(path.escape_debug().to_string()));
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(PathError::TrailingSlash(path.to_owned()));
    }
    for segment in path[1..].split('/') {
        match segment {
            "" => return Err(PathError::EmptySegment(path.to_owned())),
            "." | ".." => return Err(PathError::DotSegment(path.to_owned())),
            _ => {}
        }
    }
    Ok(())
}

/// The parent of a valid path; the root has none.
pub fn parent(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

/// Whether the valid path `path` lies strictly below `ancestor` (every
/// path but the root lies below `/`).
pub fn is_within(path: &str, ancestor: &str) -> bool {
    if ancestor == "/" {
        return path != "/";
    }
    path.len() > ancestor.len()
        && path.starts_with(ancestor)
        && path.as_bytes()[ancestor.len()] == b'/'
}

/// The last segment of a valid path (empty for the root).
pub fn name(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
}

/// Joins a valid parent path and a child name.
pub fn join(parent: &str, child: &str) -> String {
    let mut out = String::with_capacity(parent.len() + 1 + child.len());
    out.push_str(parent);
    if parent != "/" {
        out.push('/');
    }
    out.push_str(child);
    out
}

/// Formats the suffix that a sequential create appends to the requested name:
/// the sequence number in decimal, zero-padded to at least 10 digits.
///
/// Numbers of 10 digits or fewer sort the same as strings and as numbers; past
/// 9,999,999,999 the suffix simply grows, so order children by the number the
/// server reports, not by comparing names.
pub fn sequence_suffix(seq: u64) -> String {
    format!("{seq:010}")
}

/// Reads the sequence number back from a sequential node's name, given the
/// prefix it was created with (the last segment of the requested path).
/// Returns `None` if the name is not that prefix followed by a suffix of at
/// least 10 digits.
pub fn parse_sequence(name: &str, prefix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?;
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_means_strictly_below() {
        assert!(is_within("/a/b", "/a"));
        assert!(is_within("/a/b/c", "/a"));
        assert!(is_within("/a", "/"));
        assert!(!is_within("/", "/"));
        assert!(!is_within("/a", "/a"));
        assert!(!is_within("/ab", "/a"));
        assert!(!is_within("/b", "/a"));
    }

    #[test]
    fn accepts_good_paths() {
        for p in ["/", "/a", "/a/b", "/locks/job-1", "/ü/ñ", "/a.b/..c"] {
            assert_eq!(validate(p), Ok(()), "{p}");
        }
    }

    #[test]
    fn rejects_each_rule() {
        assert_eq!(validate(""), Err(PathError::Empty));
        assert!(matches!(validate("a/b"), Err(PathError::NotAbsolute(_))));
        assert!(matches!(validate("/a/"), Err(PathError::TrailingSlash(_))));
        assert!(matches!(validate("/a//b"), Err(PathError::EmptySegment(_))));
        assert!(matches!(validate("/a/./b"), Err(PathError::DotSegment(_))));
        assert!(matches!(validate("/a/.."), Err(PathError::DotSegment(_))));
        assert!(matches!(
            validate("/a\0b"),
            Err(PathError::ControlCharacter(_))
        ));
        assert_eq!(validate_bytes(b"/a\xff"), Err(PathError::InvalidUtf8));
        let long = format!("/{}", "x".repeat(MAX_PATH_LEN));
        assert_eq!(validate(&long), Err(PathError::TooLong(MAX_PATH_LEN + 1)));
    }

    #[test]
    fn splits_and_joins() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(name("/a/b"), "b");
        assert_eq!(name("/"), "");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }

    #[test]
    fn sequence_suffix_round_trips() {
        assert_eq!(sequence_suffix(42), "0000000042");
        assert_eq!(parse_sequence("lock-0000000042", "lock-"), Some(42));
        let max = format!("x1{}", sequence_suffix(u64::MAX));
        assert_eq!(parse_sequence(&max, "x1"), Some(u64::MAX));
        assert_eq!(parse_sequence("x10000000005", "x1"), Some(5));
        assert_eq!(parse_sequence("lock-42", "lock-"), None);
        assert_eq!(parse_sequence("other-0000000042", "lock-"), None);
    }
}
