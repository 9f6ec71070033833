//! Taking a snapshot copies the state under the core lock: that copy must
//! cost the same however large the tree is, or every client waits for it.
//! Counted in allocations, not timed: the copy of a tree of 100,000 nodes
//! allocates (almost) nothing, and neither does the first change after it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use baton_proto::{CreateMode, SessionId, SessionSecret};
use baton_server::state::{Command, StateMachine};
use bytes::Bytes;

/// The system allocator, counting the bytes it hands out.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn copying_the_state_for_a_snapshot_costs_the_same_whatever_its_size() {
    let mut sm = StateMachine::new();
    sm.apply(
        &Command::OpenSession {
            timeout_ms: 10_000,
            secret: SessionSecret([1; 16]),
        },
        0,
    );
    let create = |path: String, mode| Command::Create {
        session: SessionId(1),
        path,
        data: Bytes::from_static(b"value"),
        mode,
        fence: None,
        acl: baton_proto::Acl::OPEN,
    };
    sm.apply(&create("/d".into(), CreateMode::Persistent), 0)
        .result
        .unwrap();
    for i in 0..100_000 {
        let mode = if i % 2 == 0 {
            CreateMode::Persistent
        } else {
            CreateMode::Ephemeral
        };
        sm.apply(&create(format!("/d/n{i}"), mode), 0)
            .result
            .unwrap();
    }
    let before = ALLOCATED.load(Ordering::Relaxed);
    let copy = sm.clone();
    let copied = ALLOCATED.load(Ordering::Relaxed) - before;
    assert!(
        copied < 1024,
        "copying a state of 100,000 nodes allocated {copied} bytes"
    );
    // The original goes on changing; the copy keeps its revision's state.
    // The first change after the copy, under a parent of 100,000 children,
    // copies only the path to what it changes.
    let revision = copy.revision();
    let before = ALLOCATED.load(Ordering::Relaxed);
    sm.apply(&create("/d/after".into(), CreateMode::Persistent), 0)
        .result
        .unwrap();
    let copied = ALLOCATED.load(Ordering::Relaxed) - before;
    assert!(
        copied < 64 * 1024,
        "a create after the copy allocated {copied} bytes"
    );
    sm.apply(
        &Command::CloseSession {
            session: SessionId(1),
        },
        0,
    )
    .result
    .unwrap();
    assert_eq!(copy.revision(), revision);
    assert!(copy.node("/d/after").is_none() && sm.node("/d/after").is_some());
    assert!(copy.node("/d/n1").is_some() && sm.node("/d/n1").is_none());
    assert_eq!(copy.node_count(), 100_002);
    assert_eq!(copy.session(SessionId(1)).unwrap().ephemerals.len(), 50_000);
}
