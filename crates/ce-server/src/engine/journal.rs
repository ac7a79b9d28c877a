//! Journal retention on the engine (docs/store.md "Journal retention"): pruning what every
//! consumer has applied — on a period beside the continuous workers, and once at the end of
//! a drain — and queueing the rebuild of a consumer the journal can no longer back-fill.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_store::SourceStore;
use tracing::{info, warn};

use super::periodic::Periodic;
use super::{Engine, consumers};
use crate::jobs::reindex::ReindexPayload;

/// How often the workers' companion prunes (at most; a prune that found a full chunk goes on
/// in the same step).
const TICK: Duration = Duration::from_secs(60);
/// Rows per prune transaction: short enough that writers and claims interleave.
pub const PRUNE_CHUNK: usize = 5_000;
/// The counter of rows pruned, labelled `kind` = `deliveries` | `events`.
pub const PRUNED_METRIC: &str = "index_outbox_pruned_total";

/// Prunes the journal once with the configured retention (nothing when it is 0); errors are
/// logged, never raised: pruning is upkeep, the next round retries.
pub(super) fn prune(store: &dyn SourceStore, retention_seconds: u32) {
    if retention_seconds == 0 {
        return;
    }
    let started = Instant::now();
    match store.prune_journal(i64::from(retention_seconds) * 1000, PRUNE_CHUNK) {
        Ok(p) => {
            metrics::counter!(PRUNED_METRIC, "kind" => "deliveries").increment(p.deliveries);
            metrics::counter!(PRUNED_METRIC, "kind" => "events").increment(p.events);
            if p.deliveries + p.events > 0 {
                info!(
                    deliveries = p.deliveries,
                    events = p.events,
                    took_ms = started.elapsed().as_millis() as u64,
                    "journal pruned"
                );
            }
        }
        Err(e) => warn!(error = %e, "pruning the journal failed (retried on the next round)"),
    }
}

/// Starts the periodic prune beside the workers (`None` when retention is off).
pub(super) fn start(store: Arc<dyn SourceStore>, retention_seconds: u32) -> Option<Periodic> {
    (retention_seconds > 0).then(|| {
        Periodic::start("ce-journal", Duration::ZERO, move || {
            prune(store.as_ref(), retention_seconds);
            TICK
        })
    })
}

impl Engine {
    /// Queues a `reindex` job for each configured consumer the store flagged for a rebuild
    /// (the journal no longer holds events it missed); the job clears the flag once its
    /// repair events are appended. Failures are logged: the flag stays, the next open
    /// retries.
    pub(super) fn queue_rebuilds(&self) {
        let flagged = match self.store.rebuilds_needed() {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, "cannot read the consumers flagged for a rebuild");
                return;
            }
        };
        for c in flagged.iter().filter(|c| self.configured(c)) {
            if consumers::registration(c).is_none() {
                warn!(consumer = %c, "flagged for a rebuild, but this build has no index for it");
                continue;
            }
            let queued = ReindexPayload::new(c, false).and_then(|p| self.enqueue_job(p.spec()));
            match queued {
                // Logged once: a later open finds the same job by its idempotency key.
                Ok(q) if q.created => {
                    info!(consumer = %c, job = %q.job.id, "rebuild from the source queued: the journal no longer holds events this consumer missed")
                }
                Ok(_) => {}
                Err(e) => warn!(consumer = %c, error = %e, "cannot queue the rebuild"),
            }
        }
    }
}
