//! Acknowledging a batch: `mark_done` for every event whose operations all succeeded (one
//! transaction for the batch), `mark_failed` with the spec §8.4 class for the others.

use std::time::Instant;

use ce_core::Classify;
use ce_store::{ClaimedEvent, Failure};
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
    match w.source.mark_done_batch(&claims) {
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
        match w.source.mark_failed(&c.claim, &failure) {
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
