//! The worker unit tests' store: a real `SqliteStore` on a manual clock, and draining its
//! outbox with a worker.

use std::sync::Arc;
use std::time::Duration;

use ce_core::{Config, ManualClock};
use ce_store::{OutboxStore as _, SqliteStore};

use super::{IndexBatchResult, IndexWorker};

/// A store in a temporary directory, on a manual clock.
pub(super) struct Env {
    _dir: tempfile::TempDir,
    pub store: Arc<SqliteStore>,
    pub clock: ManualClock,
}

impl Env {
    /// A store whose outbox feeds `consumer` alone, retrying after 1 s with backoffs capped
    /// at 30 s.
    pub fn new(consumer: &str) -> Env {
        let dir = tempfile::tempdir().expect("tmp");
        let mut cfg = Config::default();
        cfg.index.outbox.consumers = vec![consumer.to_owned()];
        cfg.index.outbox.retry_base_seconds = 1;
        cfg.index.outbox.retry_max_seconds = 30;
        let clock = ManualClock::new(1_700_000_000_000);
        let store = Arc::new(
            SqliteStore::open_with_clock(dir.path(), cfg, Arc::new(clock.clone())).expect("open"),
        );
        Env {
            _dir: dir,
            store,
            clock,
        }
    }
}

/// Runs `w` until nothing is runnable, advancing the clock over backoffs; the summed results.
pub(super) fn drain(env: &Env, w: &IndexWorker) -> IndexBatchResult {
    let mut total = IndexBatchResult::default();
    for _ in 0..200 {
        let r = w.run_once(100).expect("run_once");
        total.claimed += r.claimed;
        total.succeeded += r.succeeded;
        total.failed += r.failed;
        total.retried += r.retried;
        if r.claimed == 0 {
            let open = env
                .store
                .stats()
                .expect("stats")
                .iter()
                .map(|s| s.pending + s.claimed + s.retry_wait)
                .sum::<u64>();
            if open == 0 {
                return total;
            }
            env.clock.advance(31_000);
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    panic!("outbox did not drain");
}
