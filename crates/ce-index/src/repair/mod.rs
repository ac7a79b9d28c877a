//! Repair of the derived indexes (spec §8.3.2; DESIGN.md decisions 3, 4 and 11).
//!
//! The outbox makes every index converge on the source of truth as long as every event is
//! applied. When that did not happen — an event forced done, an index restored from an old
//! snapshot, a bug — [`reconcile`] finds out by comparing the source with an index in both
//! directions, and answers with the events that make the index converge: the workers read
//! the current source for every event (spec §7.2), so a repair event only says *where* to
//! look, and a superfluous one is harmless.
//!
//! - [`reconcile`]: `repair_reconcile_index`: missing, orphan and stale records of the vector,
//!   keyword and relation indexes, through one comparison over each index's listing
//!   (`list_under`), and the events that repair them;
//!
//! The other spec job, `repair_dead_events` (requeue or force-done dead deliveries), is an
//! outbox operation: `ce_store::OutboxStore::requeue_dead_matching` and `force_done`.

pub mod reconcile;

use ce_core::{Classify, ErrorCode};
use ce_store::StoreError;

/// The delete-safety policy every derived deletion goes through (it lives in `ce-core`: the
/// import's prune applies it too).
pub use ce_core::safety::{DeleteLimit, DeleteSafety, LargeDelete};
pub use reconcile::{Finding, Findings, IndexView, Reconciler, Reconciliation, SAMPLES};

use crate::IndexError;

/// What a repair can fail with: reading the source or reading an index.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The source of truth failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
}

impl Classify for RepairError {
    fn code(&self) -> ErrorCode {
        match self {
            RepairError::Store(e) => e.code(),
            RepairError::Index(e) => e.code(),
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            RepairError::Store(e) => e.is_retryable(),
            RepairError::Index(e) => e.is_retryable(),
        }
    }
}
