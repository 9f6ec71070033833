//! Panics counted per thread, so that a test can tell a server task panicked.

use std::collections::HashMap;
use std::sync::{Mutex, Once};

// Panics: a server task that panics is caught by tokio and simply vanishes, so
// tests count panics themselves. A `#[tokio::test]` runs the server's tasks on
// the test's own thread, which is named after the test: counting panics per
// thread name tells one test's server panics from everything else.

static PANICS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);
static HOOK: Once = Once::new();

pub(crate) fn thread_key() -> String {
    let t = std::thread::current();
    t.name()
        .map_or_else(|| format!("{:?}", t.id()), str::to_owned)
}

pub(crate) fn count_panics() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let mut map = PANICS.lock().unwrap_or_else(|e| e.into_inner());
            *map.get_or_insert_with(HashMap::new)
                .entry(thread_key())
                .or_default() += 1;
            drop(map);
            previous(info);
        }));
    });
}

/// Panics seen so far on this test's thread (where a current-thread runtime
/// runs the server's connection tasks).
pub fn panics_on_this_thread() -> usize {
    let map = PANICS.lock().unwrap_or_else(|e| e.into_inner());
    map.as_ref()
        .and_then(|m| m.get(&thread_key()).copied())
        .unwrap_or(0)
}
