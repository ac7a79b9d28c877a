//! The memory provider against the suite, and its threads excluding each other.

use std::sync::Arc;

use ce_lock::LockProvider;
use ce_lock::memory::MemoryProvider;

use crate::suite::Fixture;

fn make() -> Option<Fixture> {
    let provider: Arc<dyn LockProvider> = Arc::new(MemoryProvider::new());
    Some(Fixture {
        second: Arc::clone(&provider),
        provider,
        keep: None,
    })
}

conformance_tests!(make);

/// Four threads, one manager each on one provider, 50 critical sections each on one path:
/// nobody ever sees another inside.
#[test]
fn threads_exclude_each_other() {
    let provider: Arc<dyn LockProvider> = Arc::new(MemoryProvider::new());
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    crate::suite::write_state(&state, false, 0);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let provider = Arc::clone(&provider);
            let state = state.clone();
            std::thread::spawn(move || crate::suite::critical_sections(provider, &state, 50))
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    assert!(!crate::suite::read_state(&state).0);
}
