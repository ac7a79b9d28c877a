//! The hold keeper: adopts leases handed off to background work ([`ce_store::Hold`], e.g. an
//! import's lifecycle TREE lock), keeps them renewed while the consumers apply the write that
//! recorded them, then releases them and ends the hold.
//!
//! Any engine that runs workers keeps holds; when several do, the first adopt wins and the
//! others find the lease held. A hold whose keeper died is adopted again once its lease went
//! stale (the manager re-acquires the covered paths). A hold older than [`MAX_HOLD`] is
//! released even if its events are still retrying, so a stuck consumer cannot lock a subtree
//! forever.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ce_core::{Classify as _, Clock as _, SystemClock};
use ce_lock::{Lease, LeaseRef, LockManager};
use ce_store::{Hold, HoldStore};
use tracing::{debug, info, warn};

use super::periodic::Periodic;

/// How often the keeper looks at the holds.
const TICK: Duration = Duration::from_millis(500);
/// The longest a hold keeps its lease.
pub const MAX_HOLD: Duration = Duration::from_secs(15 * 60);

/// The keeper's state between ticks: the leases it adopted, by hold id.
#[derive(Default)]
pub struct Keeper {
    held: HashMap<String, Lease>,
}

impl Keeper {
    /// One pass: adopt what is not held here, end what the consumers have applied.
    /// Returns the ids of the holds ended.
    pub fn step(
        &mut self,
        store: &dyn HoldStore,
        locks: &LockManager,
        consumers: &[String],
    ) -> Vec<String> {
        let holds = open_holds(store);
        self.held.retain(|id, _| holds.iter().any(|h| &h.id == id));
        let mut ended = Vec::new();
        for h in holds {
            if self.keep(&h, locks) && self.finished(&h, store, consumers) {
                ended.extend(self.end(&h, store));
            }
        }
        ended
    }

    /// Releases `h`'s lease (when held here) and ends the hold; its id when ended.
    fn end(&mut self, h: &Hold, store: &dyn HoldStore) -> Option<String> {
        if let Some(Err(e)) = self.held.remove(&h.id).map(Lease::release) {
            warn!(hold = %h.id, error = %e, "hold lease not released (it goes stale)");
        }
        ce_core::failpoint::hit("holds.before_end");
        match store.end_hold(&h.id) {
            Ok(_) => {
                info!(hold = %h.id, at = %h.at, "hold ended: its writes are indexed");
                Some(h.id.clone())
            }
            Err(e) => {
                warn!(hold = %h.id, error = %e, "hold not ended");
                None
            }
        }
    }

    /// Whether this keeper holds `h`'s lease (adopting it if it can).
    fn keep(&mut self, h: &Hold, locks: &LockManager) -> bool {
        if let Some(lease) = self.held.get(&h.id) {
            if lease.check().is_ok() {
                return true;
            }
            warn!(hold = %h.id, "hold lease lost; adopting it again");
            self.held.remove(&h.id);
        }
        let reference: LeaseRef = match serde_json::from_str(&h.lease) {
            Ok(r) => r,
            Err(e) => {
                // Not ours to keep: end it rather than retry a broken record forever.
                warn!(hold = %h.id, error = %e, "hold has an unreadable lease reference");
                return true;
            }
        };
        match locks.adopt(&reference) {
            Ok(lease) => {
                ce_core::failpoint::hit("holds.after_adopt");
                debug!(hold = %h.id, "hold adopted");
                self.held.insert(h.id.clone(), lease);
                true
            }
            Err(e) => {
                debug!(hold = %h.id, error = %e, retryable = e.is_retryable(), "hold kept elsewhere");
                false
            }
        }
    }

    fn finished(&self, h: &Hold, store: &dyn HoldStore, consumers: &[String]) -> bool {
        let age = SystemClock.now_ms().saturating_sub(h.created_at_ms);
        if age > MAX_HOLD.as_millis() as i64 {
            warn!(hold = %h.id, at = %h.at, "hold released after its maximum time: events still pending");
            return true;
        }
        store
            .applied_through(consumers, h.through_seq)
            .unwrap_or_else(|e| {
                warn!(hold = %h.id, error = %e, "hold progress not read");
                false
            })
    }
}

/// The open holds; none (logged) when they cannot be read — the next round tries again.
fn open_holds(store: &dyn HoldStore) -> Vec<Hold> {
    store.holds().unwrap_or_else(|e| {
        warn!(error = %e, "holds not read");
        Vec::new()
    })
}

/// Ends the holds whose writes `consumers` have applied, taking their leases over first (a
/// hold another keeper is keeping is left to it). Holds still pending are not touched.
/// Returns the ids ended.
pub fn end_applied(
    store: &dyn HoldStore,
    locks: &LockManager,
    consumers: &[String],
) -> Vec<String> {
    let holds = open_holds(store);
    let mut keeper = Keeper::default();
    let mut ended = Vec::new();
    for h in holds {
        if keeper.finished(&h, store, consumers) && keeper.keep(&h, locks) {
            ended.extend(keeper.end(&h, store));
        }
    }
    ended
}

/// Starts keeping holds for `consumers` (the ones whose workers run here); stopped with the
/// returned [`Periodic`]. Leases still held then are dropped, which releases them; their
/// holds stay recorded and the next keeper adopts them again.
pub fn start(store: Arc<dyn HoldStore>, locks: LockManager, consumers: Vec<String>) -> Periodic {
    let mut keeper = Keeper::default();
    Periodic::start("ce-holds", TICK, move || {
        keeper.step(store.as_ref(), &locks, &consumers);
        TICK
    })
}
