//! Checks of the workspace's shape, read from its sources.
//!
//! No crate's module graph has a cycle, so every crate reads bottom up. An
//! edge runs from a module to each module its code names through a
//! `crate::` or `super::` path (in `use` items and in expressions alike);
//! test modules and `#[cfg(test)]` items are left out, and a name a module
//! re-exports (`pub use config::Config;`) leads on to where it is defined.
//!
//! No source file of the core crates holds more than [`MAX_LINES`] lines
//! before its tests; and the state machine's crate names no clock, file,
//! socket, thread or process (its dependencies hold no async runtime
//! either: see its Cargo.toml), so that it stays deterministic and I/O-free.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Lines a source file of a core crate may hold before its tests.
const MAX_LINES: usize = 800;

/// The crates whose files [`MAX_LINES`] bounds.
const CORE_CRATES: &[&str] = &["proto", "zk", "state", "server", "client", "cluster"];

/// Each module's re-exports: the name brought in, and the absolute path of
/// what it names.
type Reexports = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// One crate's modules: each module's path (`""` for the root, `"core::requests"`)
/// and its source with comments, strings and test items removed.
struct Crate {
    modules: BTreeMap<String, String>,
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn crate_dirs() -> Vec<(String, PathBuf)> {
    let mut dirs = vec![("baton".to_string(), workspace().join("src"))];
    for entry in fs::read_dir(workspace().join("crates")).expect("crates/ lists") {
        let dir = entry.expect("crates/ entry").path();
        if dir.join("src").is_dir() {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            dirs.push((name, dir.join("src")));
        }
    }
    dirs.sort();
    dirs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("source directory lists") {
        let path = entry.expect("source entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file holds: `lib.rs` and `main.rs` the root, `a/mod.rs` and
/// `a.rs` the module `a`, `a/b.rs` the module `a::b`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "lib" | "main" | "mod") {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut modules = BTreeMap::new();
        for file in files {
            let module = module_of(src, &file);
            // A second binary's root (src/bin/x.rs) or a test module is not
            // part of the library's graph.
            if module.starts_with("bin") || module.split("::").any(|m| m == "tests") {
                continue;
            }
            let text = fs::read_to_string(&file).expect("source file reads");
            modules.insert(module, strip_tests(&strip_comments_and_strings(&text)));
        }
        Crate { modules }
    }

    /// The deepest module of this crate that `path` (absolute, from the
    /// root) names, following re-exports (`pub use a::Name;` in the module
    /// that path reaches leads on to `a`).
    fn resolve(&self, path: &[String], reexports: &Reexports, hops: usize) -> String {
        let mut depth = 0;
        while depth < path.len() && self.modules.contains_key(&path[..=depth].join("::")) {
            depth += 1;
        }
        let best = path[..depth].join("::");
        if let Some(name) = path.get(depth) {
            if let Some(target) = reexports.get(&best).and_then(|r| r.get(name)) {
                // (A re-export of a re-export, a few deep at most.)
                if hops < 8 {
                    let mut next = target.clone();
                    next.extend(path[depth + 1..].iter().cloned());
                    return self.resolve(&next, reexports, hops + 1);
                }
            }
        }
        best
    }

    /// Each module's re-exports (`pub use`, `pub(crate) use`), by the name
    /// they bring in, as absolute paths within the crate.
    fn reexports(&self) -> Reexports {
        let mut out = BTreeMap::new();
        for (module, text) in &self.modules {
            let here: Vec<String> = if module.is_empty() {
                Vec::new()
            } else {
                module.split("::").map(str::to_string).collect()
            };
            let mut names = BTreeMap::new();
            for item in ["pub use ", "pub(crate) use ", "pub(super) use "] {
                let mut rest = text.as_str();
                while let Some(at) = rest.find(item) {
                    rest = &rest[at + item.len()..];
                    let end = rest.find(';').unwrap_or(rest.len());
                    for path in expand(&rest[..end]) {
                        let Some(name) = path.last().cloned() else {
                            continue;
                        };
                        let absolute = match path.first().map(String::as_str) {
                            Some("crate" | "super") => absolute(&path, &here),
                            Some("self") => {
                                let mut p = here.clone();
                                p.extend(path[1..].iter().cloned());
                                Some(p)
                            }
                            // A child module's item (an outside crate's is
                            // left out: it names no module of this one).
                            Some(first) => {
                                let mut p = here.clone();
                                p.push(first.to_string());
                                self.modules.contains_key(&p.join("::")).then(|| {
                                    let mut p = here.clone();
                                    p.extend(path.iter().cloned());
                                    p
                                })
                            }
                            None => None,
                        };
                        if let Some(absolute) = absolute {
                            names.insert(name, absolute);
                        }
                    }
                    rest = &rest[end..];
                }
            }
            out.insert(module.clone(), names);
        }
        out
    }

    /// Each module's set of modules it names through `crate::`/`super::`.
    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let reexports = self.reexports();
        let mut edges = BTreeMap::new();
        for (module, text) in &self.modules {
            let here: Vec<String> = if module.is_empty() {
                Vec::new()
            } else {
                module.split("::").map(str::to_string).collect()
            };
            let mut targets = BTreeSet::new();
            for path in crate_paths(text, &here) {
                let target = self.resolve(&path, &reexports, 0);
                if &target != module && !target.is_empty() {
                    targets.insert(target);
                }
            }
            edges.insert(module.clone(), targets);
        }
        edges
    }
}

/// Every path that starts with `crate::` or `super::` in `text`, made absolute
/// for a module at `here`; a `use` group (`crate::{a, b::c}`) gives one path
/// per member.
fn crate_paths(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = ["crate::", "super::"]
            .iter()
            .any(|p| text[i..].starts_with(p));
        let boundary = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        if starts && boundary {
            let end = path_end(text, i);
            for path in expand(&text[i..end]) {
                if let Some(abs) = absolute(&path, here) {
                    out.push(abs);
                }
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Where the path starting at `start` ends: after its last segment, or after
/// the group's closing brace.
fn path_end(text: &str, start: usize) -> usize {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = start;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'{' => depth += 1,
            b'}' => {
                if depth == 0 {
                    return i;
                }
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ if depth > 0 => {}
            _ if c.is_ascii_alphanumeric() || c == b'_' || c == b':' => {}
            _ => return i,
        }
        i += 1;
    }
    i
}

/// A path with groups expanded: `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str) -> Vec<Vec<String>> {
    let path = path.trim();
    let Some(open) = path.find('{') else {
        let path = path.split(" as ").next().unwrap_or_default();
        let segments: Vec<String> = path
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        return vec![segments];
    };
    let prefix = &path[..open];
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let mut members = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                members.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    members.push(&inner[start..]);
    let mut out = Vec::new();
    for member in members.into_iter().filter(|m| !m.trim().is_empty()) {
        let member = member.trim();
        let member = if member == "self" { "" } else { member };
        out.extend(expand(&format!("{prefix}{member}")));
    }
    out
}

fn absolute(path: &[String], here: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = here.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// `text` with comments and the contents of string and char literals blanked.
fn strip_comments_and_strings(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if text[i..].starts_with("//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with("/*") {
            let mut depth = 0;
            while i < bytes.len() {
                if text[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if text[i..].starts_with("*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if bytes[i] == b'r' && (text[i..].starts_with("r\"") || text[i..].starts_with("r#"))
        {
            let hashes = text[i + 1..].bytes().take_while(|b| *b == b'#').count();
            if text[i + 1 + hashes..].starts_with('"') {
                let close = format!("\"{}", "#".repeat(hashes));
                let body = i + 2 + hashes;
                let end = text[body..]
                    .find(&close)
                    .map_or(bytes.len(), |e| body + e + close.len());
                out.push_str("\"\"");
                i = end;
            } else {
                out.push('r');
                i += 1;
            }
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if bytes[i] == b'\'' && char_literal_len(&bytes[i..]).is_some() {
            out.push_str("' '");
            i += char_literal_len(&bytes[i..]).unwrap();
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of a char literal at the start of `bytes` (`'a'`, `'\n'`,
/// `'\u{..}'`), or `None` for a lifetime.
fn char_literal_len(bytes: &[u8]) -> Option<usize> {
    if bytes.get(1) == Some(&b'\\') {
        let close = bytes[2..].iter().position(|b| *b == b'\'')?;
        return Some(close + 3);
    }
    let width = std::str::from_utf8(&bytes[1..bytes.len().min(5)])
        .ok()
        .or_else(|| std::str::from_utf8(&bytes[1..bytes.len().min(2)]).ok())?
        .chars()
        .next()?
        .len_utf8();
    (bytes.get(1 + width) == Some(&b'\'')).then_some(2 + width)
}

/// `text` without its `#[cfg(test)]` items (a module, a function, a `use`).
fn strip_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        // The item ends at its first `;` outside braces, or at the brace
        // that closes its body.
        let mut depth = 0usize;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The cycles (strongly connected components of more than one module) of a
/// module graph, each sorted, by Tarjan's algorithm.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// The lines of `text` before its first `#[cfg(test)]` item at the top level
/// (a file's tests come last).
fn lines_before_tests(text: &str) -> usize {
    let mut count = 0;
    for line in text.lines() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        count += 1;
    }
    count
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for (name, src) in crate_dirs() {
        let krate = Crate::read(&src);
        let edges = krate.edges();
        for cycle in cycles(&edges) {
            // The edges inside the cycle, which are the ones to cut.
            let inside: Vec<String> = cycle
                .iter()
                .flat_map(|from| {
                    edges[from]
                        .iter()
                        .filter(|to| cycle.contains(to))
                        .map(move |to| format!("{from} -> {to}"))
                })
                .collect();
            found.push(format!("{name}: {}", inside.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "modules that depend on each other, through `crate::` or `super::` paths \
         (move what they share into a module of its own):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn no_core_source_file_is_longer_than_the_bound_before_its_tests() {
    let mut long = Vec::new();
    for (name, src) in crate_dirs() {
        if !CORE_CRATES.contains(&name.as_str()) {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        // A file of tests only (`tests.rs`) is all tests.
        for file in files.into_iter().filter(|f| !f.ends_with("tests.rs")) {
            let lines = lines_before_tests(&fs::read_to_string(&file).unwrap());
            if lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "source files longer than {MAX_LINES} lines before their tests (split them by job):\n  {}",
        long.join("\n  ")
    );
}

/// What the state machine's crate must not name: clocks, the file system,
/// sockets, threads, processes, the environment, randomness.
const NOT_IN_STATE: &[&str] = &[
    "std::fs",
    "std::net",
    "std::thread",
    "std::process",
    "std::env",
    "Instant",
    "SystemTime",
    "tokio",
    "getrandom",
];

#[test]
fn the_state_crate_reads_no_clock_and_does_no_io() {
    let src = workspace().join("crates/state/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let text = strip_comments_and_strings(&fs::read_to_string(&file).unwrap());
        for name in NOT_IN_STATE {
            if text.contains(name) {
                found.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the state machine reads no clock and does no I/O; its callers pass time and bytes in:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_checker_sees_a_cycle_through_super_and_a_group() {
    let mut edges = BTreeMap::new();
    let a = strip_tests(
        "use crate::{b::{Thing, Other as O}, c};\n#[cfg(test)]\nmod tests { use crate::d; }\n",
    );
    let paths = crate_paths(&a, &["a".to_string()]);
    assert_eq!(
        paths,
        vec![
            vec!["b".to_string(), "Thing".to_string()],
            vec!["b".to_string(), "Other".to_string()],
            vec!["c".to_string()],
        ]
    );
    let b = crate_paths("fn f() { super::a::run() }", &["b".to_string()]);
    assert_eq!(b, vec![vec!["a".to_string(), "run".to_string()]]);
    edges.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    edges.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    edges.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycles(&edges), vec![vec!["a".to_string(), "b".to_string()]]);
    assert_eq!(
        strip_comments_and_strings("let s = \"crate::x\"; // crate::y\nlet c = 'a'; fn f<'a>() {}"),
        "let s = \"\"; \nlet c = ' '; fn f<'a>() {}"
    );
}
