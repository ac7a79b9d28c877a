//! The engine's reports: status, reindex and drain. They travel as JSON (HTTP answers, the
//! CLI's `--json`), so they deserialize too.

use ce_core::Millis;
use ce_embed::{CacheStats, ModelIdentity};
use ce_store::ConsumerStats;
use serde::{Deserialize, Serialize};

/// Delivery counts and lag of one consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerStatus {
    /// Consumer name.
    pub consumer: String,
    /// Pending deliveries.
    pub pending: u64,
    /// Claimed deliveries.
    pub claimed: u64,
    /// Deliveries waiting to retry.
    pub retry_wait: u64,
    /// Done deliveries.
    pub done: u64,
    /// Dead deliveries.
    pub dead: u64,
    /// Lowest sequence not yet done or dead.
    pub low_watermark_seq: Option<i64>,
    /// Append time of the oldest delivery not yet done or dead.
    pub oldest_pending_created_at_ms: Option<Millis>,
    /// Lag in events: pending + claimed + retry_wait.
    pub lag_events: u64,
    /// Lag in seconds: now − `oldest_pending_created_at_ms` (0 without lag).
    pub lag_seconds: f64,
}

impl ConsumerStatus {
    /// Adds the lag (as of `now`) to the store's counts.
    pub fn from_stats(s: ConsumerStats, now: Millis) -> Self {
        let lag_seconds = s
            .oldest_pending_created_at_ms
            .map_or(0.0, |t| (now - t).max(0) as f64 / 1e3);
        ConsumerStatus {
            lag_events: s.pending + s.claimed + s.retry_wait,
            lag_seconds,
            consumer: s.consumer,
            pending: s.pending,
            claimed: s.claimed,
            retry_wait: s.retry_wait,
            done: s.done,
            dead: s.dead,
            low_watermark_seq: s.low_watermark_seq,
            oldest_pending_created_at_ms: s.oldest_pending_created_at_ms,
        }
    }

    /// Back to the store's form (for rendering).
    pub fn to_stats(&self) -> ConsumerStats {
        ConsumerStats {
            consumer: self.consumer.clone(),
            pending: self.pending,
            claimed: self.claimed,
            retry_wait: self.retry_wait,
            done: self.done,
            dead: self.dead,
            low_watermark_seq: self.low_watermark_seq,
            oldest_pending_created_at_ms: self.oldest_pending_created_at_ms,
        }
    }
}

/// Counters of the embedding cache since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbedCacheStatus {
    /// Texts answered from the cache.
    pub hits: u64,
    /// Texts sent to the model.
    pub misses: u64,
    /// Texts answered by an identical text of the same call.
    pub duplicates: u64,
    /// Calls made to the model.
    pub provider_calls: u64,
    /// Texts the model embedded.
    pub texts_embedded: u64,
    /// Cache reads or writes that failed.
    pub cache_errors: u64,
}

impl From<CacheStats> for EmbedCacheStatus {
    fn from(s: CacheStats) -> Self {
        EmbedCacheStatus {
            hits: s.hits,
            misses: s.misses,
            duplicates: s.duplicates,
            provider_calls: s.provider_calls,
            texts_embedded: s.texts_embedded,
            cache_errors: s.cache_errors,
        }
    }
}

/// `GET /v1/status`, `ce status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Whether the engine can index and search.
    pub ready: bool,
    /// Why not, with the fix (empty when ready).
    pub not_ready: Vec<String>,
    /// The data directory.
    pub data_dir: String,
    /// The configured embedding model, when loaded.
    pub model: Option<ModelIdentity>,
    /// The model the vector index is bound to, if any.
    pub index_model: Option<ModelIdentity>,
    /// Records in the vector index.
    pub index_records: u64,
    /// Outbox progress and lag per consumer.
    pub consumers: Vec<ConsumerStatus>,
    /// Worker threads running in this process.
    pub workers: usize,
    /// The consumer those workers serve.
    pub worker_consumer: String,
    /// Embedding cache counters of this process, when the model is loaded.
    pub embed_cache: Option<EmbedCacheStatus>,
}

/// `POST /v1/reindex`, `ce reindex`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReindexReport {
    /// The consumer rebuilt.
    pub consumer: String,
    /// Records removed from the index.
    pub cleared_records: u64,
    /// Repair events appended (one per node with text).
    pub requeued: u64,
    /// The model the index is now bound to.
    pub model: ModelIdentity,
    /// Time to queue the rebuild (the workers then do it).
    pub took_ms: f64,
}

/// Totals of a drain so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DrainProgress {
    /// Batches run.
    pub batches: u64,
    /// Events claimed.
    pub claimed: u64,
    /// Events marked done.
    pub succeeded: u64,
    /// Events marked dead.
    pub failed: u64,
    /// Events sent to retry.
    pub retried: u64,
    /// Time since the drain started.
    pub elapsed_ms: f64,
}

/// What `ce worker --once` (and the demo) did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainReport {
    /// Totals.
    pub progress: DrainProgress,
    /// Worker threads used.
    pub workers: usize,
    /// The vector consumer's state afterwards (retry_wait deliveries are left for later).
    pub remaining: Option<ConsumerStatus>,
}
