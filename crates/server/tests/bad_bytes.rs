//! What the server reads from disk, fed bytes it never wrote: a snapshot,
//! a log segment, a logged record. Nothing panics, and damage to a real
//! snapshot is found out, never read as another state.

use baton_server::persist::{record, segment, snapshot};
use baton_server::state::{Command, StateMachine};
use proptest::prelude::*;

/// A snapshot of a small state: a few nodes and a session.
fn a_snapshot() -> Vec<u8> {
    let mut sm = StateMachine::new();
    let opened = sm.apply(
        &Command::OpenSession {
            timeout_ms: 5000,
            secret: baton_proto::SessionSecret([7; 16]),
        },
        1,
    );
    let session = baton_proto::SessionId(opened.revision);
    for (i, path) in ["/a", "/a/b", "/c"].into_iter().enumerate() {
        sm.apply(
            &Command::Create {
                session,
                path: path.into(),
                data: bytes::Bytes::from(vec![i as u8; 10]),
                mode: baton_proto::CreateMode::Persistent,
                fence: None,
                acl: baton_proto::Acl::OPEN,
            },
            2,
        );
    }
    let mut out = std::io::Cursor::new(Vec::new());
    snapshot::encode(&sm, &mut out).unwrap();
    out.into_inner()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn arbitrary_bytes_never_panic_the_readers(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = snapshot::decode(&bytes);
        let _ = segment::layout(&bytes);
        for at in [0, 1, 8, bytes.len() / 2] {
            let _ = segment::read_batch(&bytes, at.min(bytes.len()));
        }
        let _ = record::read_frame(&bytes);
        let _ = record::decode_proposal(&bytes);
    }

    #[test]
    fn a_snapshot_with_any_byte_changed_or_cut_is_refused(at in any::<usize>(), flip in 1u8..=255, cut in any::<bool>()) {
        let good = a_snapshot();
        let at = at % good.len();
        let mut bad = good.clone();
        if cut {
            bad.truncate(at);
        } else {
            bad[at] ^= flip;
        }
        prop_assert!(snapshot::decode(&bad).is_err(), "damage at byte {} went unnoticed", at);
    }
}
