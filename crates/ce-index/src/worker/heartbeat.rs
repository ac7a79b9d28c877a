//! Lease renewal while a batch runs: every `period`, the claims' leases are extended, so a
//! long batch (slow model, big texts) is not taken over by another worker mid-way.

use std::sync::mpsc;
use std::time::Duration;

use ce_store::{Claim, OutboxStore};
use tracing::warn;

/// Runs `f` while a helper thread renews `claims` every `period`.
pub(super) fn with_heartbeat<T>(
    outbox: &dyn OutboxStore,
    claims: &[Claim],
    period: Duration,
    f: impl FnOnce() -> T,
) -> T {
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                for c in claims {
                    if let Err(e) = outbox.renew(c) {
                        warn!(event_id = %c.event_id, consumer = %c.consumer, error = %e, "lease renewal failed");
                    }
                }
            }
        });
        let out = f();
        drop(stop);
        out
    })
}
