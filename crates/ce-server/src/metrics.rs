//! Prometheus metrics (spec §12.2): the worker records its histograms and counters through
//! the `metrics` facade; this module installs the recorder and, on every scrape, refreshes
//! the gauges that come from stored state (outbox counts and lag per consumer, index size,
//! readiness, embedding-cache counters, jobs per type and state).

use std::sync::{Mutex, PoisonError};

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing::warn;

use crate::engine::Engine;
use crate::error::{Result, ServerError};

/// The gauge of jobs per type and state.
pub const JOBS_METRIC: &str = "ce_jobs_total";

/// Histogram buckets for every latency, in milliseconds.
const LATENCY_BUCKETS_MS: [f64; 14] = [
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
];

static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// The process's Prometheus recorder.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Installs the global recorder (once per process; later calls share it). Install it
    /// before the engine starts so that no early measurement is lost.
    pub fn install() -> Result<Metrics> {
        let mut slot = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = slot.as_ref() {
            return Ok(Metrics { handle: h.clone() });
        }
        let handle = PrometheusBuilder::new()
            .set_buckets(&LATENCY_BUCKETS_MS)
            .and_then(PrometheusBuilder::install_recorder)
            .map_err(|e| ServerError::Internal(format!("installing the metrics recorder: {e}")))?;
        describe();
        *slot = Some(handle.clone());
        Ok(Metrics { handle })
    }

    /// Refreshes the state gauges from `engine` and renders the Prometheus text.
    pub fn render(&self, engine: &Engine) -> String {
        refresh(engine);
        self.handle.render()
    }

    /// Drains histogram data so memory stays bounded (run every few seconds).
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }
}

fn describe() {
    describe_gauge!(
        "index_outbox_pending_total",
        "Pending outbox deliveries, per consumer"
    );
    describe_gauge!(
        "index_outbox_claimed_total",
        "Claimed outbox deliveries, per consumer"
    );
    describe_gauge!(
        "index_outbox_dead_total",
        "Dead outbox deliveries, per consumer"
    );
    describe_gauge!(
        "index_outbox_retry_wait_total",
        "Deliveries waiting to retry, per consumer"
    );
    describe_gauge!(
        "index_outbox_lag_events",
        "Pending + claimed + retry_wait, per consumer"
    );
    describe_gauge!(
        "index_outbox_lag_seconds",
        Unit::Seconds,
        "Age of the oldest delivery not yet done or dead, per consumer"
    );
    describe_gauge!("index_vector_records", "Records in the vector index");
    describe_gauge!(
        "index_workers_running",
        "Worker threads running in this process"
    );
    describe_gauge!(
        "index_worker_claim_size",
        "Deliveries a consumer's worker claims next (claim_limit, more while a deep queue's rounds are fast), per consumer"
    );
    describe_gauge!("ce_ready", "1 when the engine can index and search");
    describe_histogram!(
        "index_worker_run_once_latency_ms",
        Unit::Milliseconds,
        "Latency of one worker batch"
    );
    describe_histogram!(
        "index_embed_latency_ms",
        Unit::Milliseconds,
        "Latency of one embedding call"
    );
    describe_histogram!(
        "index_vector_upsert_latency_ms",
        Unit::Milliseconds,
        "Latency of one batched vector index write"
    );
    describe_histogram!(
        "index_keyword_upsert_latency_ms",
        Unit::Milliseconds,
        "Latency of one batched keyword index write"
    );
    describe_histogram!(
        "index_relation_upsert_latency_ms",
        Unit::Milliseconds,
        "Latency of one batched relation index write"
    );
    describe_counter!(
        "index_worker_event_success_total",
        "Events indexed, per event type"
    );
    describe_counter!(
        "index_worker_event_failed_total",
        "Event failures, per event type and error code"
    );
    describe_counter!(
        "index_repair_requeued_total",
        "Events requeued by reindex or repair"
    );
    describe_counter!(
        crate::engine::journal::PRUNED_METRIC,
        "Journal rows pruned once every consumer applied them and the retention passed, per kind (deliveries, events)"
    );
    describe_counter!(
        "index_repair_forced_done_total",
        "Dead deliveries marked done without applying them, per consumer"
    );
    describe_counter!(
        "index_repair_reconcile_findings_total",
        "Index records found missing, orphan or stale by reconcile, per consumer and kind"
    );
    describe_counter!(
        "index_repair_reconcile_events_total",
        "Repair events appended by reconcile, per consumer"
    );
    describe_counter!(
        "index_repair_large_delete_refused_total",
        "Derived deletions over the delete-safety limits, per consumer (overridden or not)"
    );
    describe_counter!(
        "index_repair_runs_total",
        "Repair job runs, per job and trigger"
    );
    describe_counter!(
        "index_embed_cache_hits_total",
        "Texts answered by the embedding cache"
    );
    describe_counter!(
        "index_embed_cache_misses_total",
        "Texts sent to the embedding model"
    );
    describe_counter!(
        "index_embed_provider_calls_total",
        "Calls made to the embedding model"
    );
    describe_counter!("index_embed_texts_total", "Texts embedded by the model");
    describe_counter!(
        "index_worker_changes_total",
        "Index changes a worker made or skipped, per consumer and action (e.g. embed, payload, unchanged, delete, stale, superseded)"
    );
    describe_counter!(
        "index_worker_split_calls_total",
        "Extra calls made splitting a permanently refused batch to isolate the refused items, per consumer and call (embed, write)"
    );
    describe_gauge!(
        JOBS_METRIC,
        "Jobs in the store (every process's) per job type and state, read at each scrape"
    );
    describe_histogram!(
        crate::jobs::RUN_LATENCY_METRIC,
        Unit::Milliseconds,
        "Time from claim to acknowledgement of one job run in this process, per job type"
    );
    describe_counter!(
        crate::engine::listen::NOTIFICATIONS_METRIC,
        "Commit notifications (LISTEN ce_outbox) received from PostgreSQL; each wakes the workers"
    );
}

/// Sets the gauges that mirror stored state.
fn refresh(engine: &Engine) {
    let status = match engine.status_for_gauges() {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "metrics: status unavailable");
            return;
        }
    };
    for c in &status.consumers {
        let consumer = c.consumer.clone();
        metrics::gauge!("index_outbox_pending_total", "consumer" => consumer.clone())
            .set(c.pending as f64);
        metrics::gauge!("index_outbox_claimed_total", "consumer" => consumer.clone())
            .set(c.claimed as f64);
        metrics::gauge!("index_outbox_dead_total", "consumer" => consumer.clone())
            .set(c.dead as f64);
        metrics::gauge!("index_outbox_retry_wait_total", "consumer" => consumer.clone())
            .set(c.retry_wait as f64);
        metrics::gauge!("index_outbox_lag_events", "consumer" => consumer.clone())
            .set(c.lag_events as f64);
        metrics::gauge!("index_outbox_lag_seconds", "consumer" => consumer).set(c.lag_seconds);
    }
    metrics::gauge!("index_vector_records").set(status.index_records as f64);
    if let Some(n) = status.keyword_records {
        metrics::gauge!("index_keyword_records").set(n as f64);
    }
    metrics::gauge!("index_workers_running").set(status.workers as f64);
    // Every registered type in every state, zeros included: a state that empties reads 0.
    let types = status
        .jobs
        .types
        .iter()
        .chain(status.jobs.counts.iter().map(|c| &c.job_type));
    for t in types {
        for state in ce_store::JobState::ALL {
            let n = status
                .jobs
                .counts
                .iter()
                .find(|c| &c.job_type == t && c.state == state)
                .map_or(0, |c| c.count);
            metrics::gauge!(JOBS_METRIC, "type" => t.clone(), "state" => state.as_str())
                .set(n as f64);
        }
    }
    metrics::gauge!("ce_ready").set(if status.ready { 1.0 } else { 0.0 });
    if let Some(c) = status.embed_cache.and_then(|c| c.counters) {
        metrics::counter!("index_embed_cache_hits_total").absolute(c.hits);
        metrics::counter!("index_embed_cache_misses_total").absolute(c.misses);
        metrics::counter!("index_embed_provider_calls_total").absolute(c.provider_calls);
        metrics::counter!("index_embed_texts_total").absolute(c.texts_embedded);
    }
}
