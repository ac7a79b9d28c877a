//! Acknowledging a batch: `mark_done` for every event whose operations all succeeded (one
//! transaction for the batch), `mark_failed` with the spec §8.4 class for the others.
//!
//! An acknowledgement that fails because the store cannot be reached for a moment (a
//! dropped connection, a database restarting) is sent again after a short pause
//! ([`ACK_PAUSES`]): the work is done, and without a second try its events would wait out
//! their lease (`index.worker.lease_seconds`) to be claimed and done again. Sending one
//! twice is harmless: `mark_done` on a done delivery succeeds, and a `mark_failed` that
//! landed the first time is refused as a lost claim.

use std::time::{Duration, Instant};

use ce_core::{Classify, ErrorCode};
use ce_store::{ClaimedEvent, Failure, StoreError};
use tracing::{info, info_span, warn};

use super::compact::Plan;
use super::{IndexBatchResult, IndexWorker, WorkError, each_callback};

/// Acknowledges `claimed` given the outcome of each operation of `plan` (`results`, by
/// operation index).
pub(super) fn acknowledge(
    w: &IndexWorker,
    claimed: &[ClaimedEvent],
    plan: &Plan,
    results: &[Result<(), WorkError>],
    started: Instant,
    result: &mut IndexBatchResult,
) {
    let mut done = Vec::new();
    let mut failures: Vec<(&ClaimedEvent, &WorkError)> = Vec::new();
    for (c, needs) in claimed.iter().zip(&plan.needs) {
        match needs.iter().find_map(|&i| results[i].as_ref().err()) {
            None => done.push(c),
            Some(e) => failures.push((c, e)),
        }
    }
    let worker_id = w.cfg.worker_id.as_str();
    let latency_ms = started.elapsed().as_millis() as u64;

    let _s = info_span!("index.outbox_mark_done", worker_id, events = done.len()).entered();
    let claims: Vec<_> = done.iter().map(|c| c.claim.clone()).collect();
    match resend_while_unavailable(worker_id, || w.source.mark_done_batch(&claims)) {
        Ok(outcomes) => {
            for (c, outcome) in done.iter().zip(outcomes) {
                let e = &c.event;
                match outcome {
                    Ok(()) => {
                        result.succeeded += 1;
                        info!(trace_id = %e.payload.trace_id(), event_id = %e.event_id, event_type = %e.event_type, uri = %e.uri, worker_id, retry_count = c.retry_count, "event indexed");
                        metrics::counter!("index_worker_event_success_total", "event_type" => e.event_type.as_str()).increment(1);
                        each_callback(&w.callbacks, "on_event_success", |cb| {
                            cb.on_event_success(e, latency_ms)
                        });
                    }
                    Err(err) => {
                        // The lease was lost: the new holder redoes the (idempotent) work.
                        result.retried += 1;
                        warn!(event_id = %e.event_id, uri = %e.uri, worker_id, error = %err, "ack refused: claim lost");
                    }
                }
            }
        }
        Err(err) => {
            result.retried += done.len();
            warn!(worker_id, error = %err, events = done.len(), "mark_done failed: events will be redelivered after their lease");
        }
    }

    ce_core::failpoint::hit("worker.mid_ack");
    for (c, err) in failures {
        let e = &c.event;
        if err.is_rate_limit() {
            w.paused
                .extend(err.retry_after.unwrap_or(w.cfg.default_rate_limit_pause));
        }
        metrics::counter!("index_worker_event_failed_total", "event_type" => e.event_type.as_str(), "error_code" => err.code().as_str()).increment(1);
        let failure = Failure {
            code: err.code(),
            retryable: err.is_retryable(),
            message: &err.message,
        };
        match resend_while_unavailable(worker_id, || w.source.mark_failed(&c.claim, &failure)) {
            Ok(status) => {
                if status == ce_core::DeliveryStatus::Dead {
                    result.failed += 1;
                } else {
                    result.retried += 1;
                }
                warn!(trace_id = %e.payload.trace_id(), event_id = %e.event_id, event_type = %e.event_type, uri = %e.uri, worker_id, retry_count = c.retry_count, error_code = %err.code(), status = %status, error = %err, "event failed");
            }
            Err(ack_err) => {
                result.retried += 1;
                warn!(event_id = %e.event_id, worker_id, error = %ack_err, "mark_failed refused: claim lost or store unavailable");
            }
        }
        each_callback(&w.callbacks, "on_event_failure", |cb| {
            cb.on_event_failure(e, err, err.is_retryable())
        });
    }
}

/// The pauses before each new try of an acknowledgement the store could not take (about 3 s
/// in all, well within a lease).
const ACK_PAUSES: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(800),
    Duration::from_secs(2),
];

/// Runs `ack`, and again after each of [`ACK_PAUSES`] while it fails with the store
/// unavailable; any other outcome is returned at once.
fn resend_while_unavailable<T>(
    worker_id: &str,
    mut ack: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    for pause in ACK_PAUSES {
        match ack() {
            Err(e) if e.code() == ErrorCode::Unavailable => {
                warn!(worker_id, error = %e, retry_in_ms = pause.as_millis() as u64, "acknowledgement not stored: sending it again");
                std::thread::sleep(pause);
            }
            out => return out,
        }
    }
    ack()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use ce_core::{Classify as _, ErrorCode};
    use ce_store::StoreError;

    use super::{ACK_PAUSES, resend_while_unavailable};

    #[test]
    fn only_an_unavailable_store_gets_the_acknowledgement_again_and_only_so_often() {
        let unavailable = || StoreError::PgUnavailable("connection closed".into());
        // Unavailable twice, then stored: three tries, the answer of the third.
        let tries = Cell::new(0);
        let out = resend_while_unavailable("w", || {
            tries.set(tries.get() + 1);
            if tries.get() < 3 {
                Err(unavailable())
            } else {
                Ok(7)
            }
        });
        assert_eq!((out.ok(), tries.get()), (Some(7), 3));
        // Never stored: one try plus one per pause, then the error.
        tries.set(0);
        let out: Result<(), _> = resend_while_unavailable("w", || {
            tries.set(tries.get() + 1);
            Err(unavailable())
        });
        assert_eq!(out.map_err(|e| e.code()), Err(ErrorCode::Unavailable));
        assert_eq!(tries.get(), ACK_PAUSES.len() + 1);
        // A lost claim is an answer, not an outage: not sent again.
        tries.set(0);
        let out: Result<(), _> = resend_while_unavailable("w", || {
            tries.set(tries.get() + 1);
            Err(StoreError::ClaimConflict {
                event_id: "evt-1".into(),
                consumer: "vector".into(),
                state: "the lease expired".into(),
            })
        });
        assert_eq!(out.map_err(|e| e.code()), Err(ErrorCode::ClaimConflict));
        assert_eq!(tries.get(), 1);
    }
}
