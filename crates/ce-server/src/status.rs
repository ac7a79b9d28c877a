//! The engine's reports: status, reindex and drain. They travel as JSON (HTTP answers, the
//! CLI's `--json`), so they deserialize too.

use ce_core::Millis;
use ce_embed::{CacheStats, ModelIdentity};
use ce_index::worker::dry_run::DryRunReport;
use ce_store::{ConsumerError, ConsumerStats, JobCount, JobState};
use serde::{Deserialize, Serialize};

/// Whether a consumer's index can apply its events here and now.
#[derive(Debug, Clone, PartialEq)]
pub enum Applier {
    /// A worker can apply them (running, or started on demand by `ce worker` / a drain).
    Ready,
    /// A required input is missing (e.g. the embedding model), with the reason.
    Blocked(String),
    /// Applying is not requested (e.g. `index.worker.enabled = false`), with the reason.
    NotRequested(String),
    /// Another process applies them: it holds the consumer's embedded index (`ce worker`,
    /// `ce serve`); seen from an observing engine, with where.
    Elsewhere(String),
    /// The consumer is in dry-run mode (`index.worker.dry_run_consumers`): events are not
    /// applied; the last dry run's report, if any.
    DryRun(Option<DryRunReport>),
}

/// Validation state of a consumer (spec "Delta Validation"; docs/indexing.md). Only
/// [`Validation::AppliedValid`] means the index holds everything the journal holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Validation {
    /// A required input is missing: the consumer cannot apply events.
    Blocked,
    /// Events are still to apply (lag), or some failed for good (dead).
    Partial,
    /// The journal holds valid events, but applying is not requested.
    DeltaValid,
    /// Dry-run mode: the last dry run computed the delta of every open event without error.
    DryRunValid,
    /// Every event was applied and nothing is dead: lag 0.
    AppliedValid,
}

impl Validation {
    /// The name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Validation::Blocked => "blocked",
            Validation::Partial => "partial",
            Validation::DeltaValid => "delta_valid",
            Validation::DryRunValid => "dry_run_valid",
            Validation::AppliedValid => "applied_valid",
        }
    }

    /// The state of a consumer with `stats` whose applier is `applier`, and why.
    pub fn of(stats: &ConsumerStats, applier: &Applier) -> (Validation, String) {
        let lag = stats.pending + stats.claimed + stats.retry_wait;
        match applier {
            Applier::Blocked(why) => (Validation::Blocked, why.clone()),
            Applier::NotRequested(why) => (Validation::DeltaValid, why.clone()),
            // In dry-run mode nothing is applied, so the open set only grows: a report that
            // examined as many events as are open examined exactly those.
            Applier::DryRun(Some(r)) if r.valid && !r.truncated && r.events == lag => (
                Validation::DryRunValid,
                format!("dry-run mode: the delta of {lag} open events is computed, not applied"),
            ),
            Applier::DryRun(Some(r)) if !r.valid => (
                Validation::Partial,
                format!(
                    "dry-run mode: the last dry run failed: {}",
                    r.errors.join("; ")
                ),
            ),
            Applier::DryRun(_) => (
                Validation::Partial,
                "dry-run mode: no dry run covers the open events yet (run `ce worker --dry-run`)"
                    .into(),
            ),
            Applier::Ready if stats.dead > 0 => (
                Validation::Partial,
                format!(
                    "{} dead deliveries (see `ce outbox list --status dead`; requeue after fixing the cause)",
                    stats.dead
                ),
            ),
            Applier::Ready if lag > 0 => (Validation::Partial, format!("{lag} events to apply")),
            Applier::Elsewhere(by) => match Validation::of(stats, &Applier::Ready) {
                (v, why) if why.is_empty() => (v, by.clone()),
                (v, why) => (v, format!("{why}, {by}")),
            },
            Applier::Ready => (Validation::AppliedValid, String::new()),
        }
    }
}

/// Delivery counts, lag and validation of one consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The most recent failure among deliveries not done.
    pub last_error: Option<ConsumerError>,
    /// Validation state.
    pub validation: Validation,
    /// Why the state is not `applied_valid` (empty when it is).
    pub validation_reason: String,
    /// True only in state `applied_valid`.
    pub applied: bool,
}

impl ConsumerStatus {
    /// The status of a consumer with `s` (as of `now`) whose applier is `applier`.
    pub fn new(s: ConsumerStats, now: Millis, applier: &Applier) -> Self {
        let lag_seconds = s
            .oldest_pending_created_at_ms
            .map_or(0.0, |t| (now - t).max(0) as f64 / 1e3);
        let (validation, validation_reason) = Validation::of(&s, applier);
        ConsumerStatus {
            lag_events: s.pending + s.claimed + s.retry_wait,
            lag_seconds,
            validation,
            validation_reason,
            applied: validation == Validation::AppliedValid,
            consumer: s.consumer,
            pending: s.pending,
            claimed: s.claimed,
            retry_wait: s.retry_wait,
            done: s.done,
            dead: s.dead,
            low_watermark_seq: s.low_watermark_seq,
            oldest_pending_created_at_ms: s.oldest_pending_created_at_ms,
            last_error: s.last_error,
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
            last_error: self.last_error.clone(),
        }
    }
}

/// The embedding cache: what it holds (from the cache file, whichever process asks), and the
/// counters of the process that serves (`ce serve`, `ce worker`; with `--server`, the
/// server's) — a one-shot local `ce status` embeds nothing, so it has none.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct EmbedCacheStatus {
    /// Vectors stored for the configured model.
    #[serde(default)]
    pub entries: u64,
    /// Vectors stored for every model (older models' entries stay until deleted).
    #[serde(default)]
    pub all_entries: u64,
    /// The cache file's size in bytes.
    #[serde(default)]
    pub bytes: u64,
    /// This process's counters since it started (absent when it does not run workers).
    #[serde(flatten)]
    pub counters: Option<EmbedCacheCounters>,
}

/// Counters of the embedding cache since the engine started.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct EmbedCacheCounters {
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

impl From<CacheStats> for EmbedCacheCounters {
    fn from(s: CacheStats) -> Self {
        EmbedCacheCounters {
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Status {
    /// Whether the engine can index and search.
    pub ready: bool,
    /// Why not, with the fix (empty when ready).
    pub not_ready: Vec<String>,
    /// The data directory.
    pub data_dir: String,
    /// The source of truth's backend: `sqlite` or `postgres` (`store.url`).
    #[serde(default)]
    pub store_backend: String,
    /// Where it lives: the database file, or the URL without its password.
    #[serde(default)]
    pub store_location: String,
    /// Where vectors live: `embedded` or `pgvector` (`index.vector.destination`).
    #[serde(default)]
    pub vector_destination: String,
    /// The configured embedding model, when loaded.
    pub model: Option<ModelIdentity>,
    /// The model the vector index is bound to, if any.
    pub index_model: Option<ModelIdentity>,
    /// Records in the vector index.
    pub index_records: u64,
    /// Records in the keyword index (`None`: the keyword consumer is not configured).
    pub keyword_records: Option<u64>,
    /// Edges in the relation index (`None`: the relation consumer is not configured).
    pub relation_records: Option<u64>,
    /// Outbox progress and lag per consumer.
    pub consumers: Vec<ConsumerStatus>,
    /// Worker threads running in this process.
    pub workers: usize,
    /// The consumers those workers serve.
    pub worker_consumers: Vec<String>,
    /// The embedding cache, when the model is loaded.
    pub embed_cache: Option<EmbedCacheStatus>,
    /// Subtrees locked until their import is indexed (docs/store.md, "Holds"), oldest first.
    pub holds: Vec<HoldStatus>,
    /// The durable jobs (docs/jobs.md).
    #[serde(default)]
    pub jobs: JobsStatus,
    /// Derived layers (`None`: the derive consumer is not configured; docs/derive.md).
    #[serde(default)]
    pub derive: Option<DeriveStatus>,
    /// Session commits and memory extraction (docs/sessions.md).
    #[serde(default)]
    pub sessions: SessionsStatus,
    /// Knowledge bases and their jobs (docs/ingestion.md).
    #[serde(default)]
    pub kb: KnowledgeStatus,
    /// The outbox journal: what it holds and how long (docs/store.md "Journal retention").
    #[serde(default)]
    pub journal: JournalStatus,
}

/// `Status::journal`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JournalStatus {
    /// Events and deliveries held, the sequences they span, the newest event pruned.
    #[serde(flatten)]
    pub extent: ce_store::model::JournalExtent,
    /// How long what every consumer applied is kept (`index.outbox.journal_retention_seconds`;
    /// 0: forever).
    pub retention_seconds: u32,
    /// Consumers whose index is to be rebuilt from the source: the journal no longer held
    /// events they missed (a `reindex` job is queued for each).
    pub rebuilds_needed: Vec<String>,
}

/// `Status::kb`: every knowledge base's items by status with its latest failures, and the
/// knowledge-base jobs under way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KnowledgeStatus {
    /// Every base, by name: items by status, and its most recent failures (at most
    /// [`crate::kb::STATUS_FAILURES`], newest first).
    pub bases: Vec<ce_store::KbOverview>,
    /// Knowledge-base jobs not ended (pending, delayed, running, waiting to retry) per job
    /// type, every type listed.
    pub active_jobs: std::collections::BTreeMap<String, u64>,
}

/// `Status::sessions`: whether Phase 2 extracts memories, and why not.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionsStatus {
    /// Whether memory extraction runs.
    pub extraction: bool,
    /// Why it does not (empty when it does).
    pub extraction_off: String,
    /// The model that extracts, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Messages a commit leaves live.
    pub keep_last: u32,
    /// The rule by which the merge takes two memories to say the same (docs/sessions.md,
    /// "Merge"), as the memory diffs state it.
    pub merge_rule: String,
}

/// The derived layers of `Status::derive`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeriveStatus {
    /// The configured generator's identity key (`extractive:1`, `llm:1:gpt-4o-mini`).
    pub generator: String,
    /// The context types that are derived.
    pub types: Vec<String>,
    /// Nodes whose derivation is due (dirty keys), every process's.
    pub dirty: u64,
    /// Today's (UTC) usage, every process's: tokens in / out, write-backs applied and
    /// discarded by coalescing.
    pub today: ce_store::derive::DeriveUsage,
    /// `derive.max_tokens_per_day` (0: unlimited).
    pub max_tokens_per_day: u64,
    /// Whether today's budget is spent (the extractive generator serves until midnight UTC).
    pub over_budget: bool,
    /// What this process's derive workers did since it started (`None`: none run here).
    pub workers: Option<ce_derive::DeriveCounters>,
    /// The configured generator's last permanent refusal in this process (the node kept
    /// the extractive result).
    pub last_refusal: Option<String>,
}

/// The jobs of `Status::jobs`: counts from the store (every process's jobs), and whether a
/// runner runs in the answering process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobsStatus {
    /// `[jobs].enabled`: whether `ce serve` and `ce worker` run due jobs.
    pub enabled: bool,
    /// Whether a job runner runs in this process.
    pub runner: bool,
    /// The job types this build runs.
    pub types: Vec<String>,
    /// Jobs per state, every state listed.
    pub by_state: std::collections::BTreeMap<JobState, u64>,
    /// Jobs per type and state (states with no job of the type omitted).
    pub counts: Vec<JobCount>,
}

/// One open hold of `Status::holds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HoldStatus {
    /// The hold's id (an import's `hold` in its report).
    pub id: String,
    /// The subtree it keeps locked.
    pub at: String,
    /// The last journal sequence its write appended.
    pub through_seq: i64,
    /// Seconds since it was recorded.
    pub age_seconds: u64,
}

/// `POST /v1/reindex`, `ce reindex`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReindexReport {
    /// The consumer rebuilt.
    pub consumer: String,
    /// Records removed from the index.
    pub cleared_records: u64,
    /// Repair events appended (one per node with text).
    pub requeued: u64,
    /// The model the index is now bound to (indexes of vectors only).
    pub model: Option<ModelIdentity>,
    /// Time to queue the rebuild (the workers then do it).
    pub took_ms: f64,
}

/// Totals of a drain so far. An outbox event has one delivery per consumer: `events` counts
/// events, the other counters count deliveries (with three consumers, 10,000 events are
/// 30,000 deliveries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DrainProgress {
    /// Distinct outbox events whose deliveries were claimed.
    #[serde(default)]
    pub events: u64,
    /// Batches run.
    pub batches: u64,
    /// Deliveries claimed.
    pub claimed: u64,
    /// Deliveries marked done.
    pub succeeded: u64,
    /// Deliveries marked dead.
    pub failed: u64,
    /// Deliveries sent to retry.
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
    /// The state afterwards of every consumer this engine applies, and of those it could not
    /// (blocked); retry_wait deliveries are left for later.
    pub remaining: Vec<ConsumerStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(pending: u64, retry_wait: u64, dead: u64) -> ConsumerStats {
        ConsumerStats {
            consumer: "vector".into(),
            pending,
            retry_wait,
            dead,
            done: 7,
            ..ConsumerStats::default()
        }
    }

    #[test]
    fn only_a_ready_consumer_without_lag_or_dead_is_applied_valid() {
        let ready = Applier::Ready;
        let state = |s: ConsumerStats, a: &Applier| Validation::of(&s, a).0;
        assert_eq!(state(stats(0, 0, 0), &ready), Validation::AppliedValid);
        assert_eq!(state(stats(3, 0, 0), &ready), Validation::Partial);
        assert_eq!(state(stats(0, 2, 0), &ready), Validation::Partial);
        assert_eq!(state(stats(0, 0, 1), &ready), Validation::Partial);
        let blocked = Applier::Blocked("model not loaded".into());
        assert_eq!(state(stats(0, 0, 0), &blocked), Validation::Blocked);
        let off = Applier::NotRequested("workers disabled".into());
        assert_eq!(state(stats(5, 0, 0), &off), Validation::DeltaValid);
        let report = |events: u64, valid: bool, truncated: bool| {
            Applier::DryRun(Some(DryRunReport {
                events,
                valid,
                truncated,
                ..DryRunReport::default()
            }))
        };
        assert_eq!(
            state(stats(5, 0, 0), &report(5, true, false)),
            Validation::DryRunValid
        );
        // Events arrived since, the report was cut short, failed, or none was made.
        assert_eq!(
            state(stats(6, 0, 0), &report(5, true, false)),
            Validation::Partial
        );
        assert_eq!(
            state(stats(5, 0, 0), &report(5, true, true)),
            Validation::Partial
        );
        assert_eq!(
            state(stats(5, 0, 0), &report(5, false, false)),
            Validation::Partial
        );
        assert_eq!(
            state(stats(5, 0, 0), &Applier::DryRun(None)),
            Validation::Partial
        );
        let s = ConsumerStatus::new(stats(0, 0, 0), 0, &ready);
        assert!(s.applied && s.validation_reason.is_empty());
        let s = ConsumerStatus::new(stats(1, 0, 0), 0, &blocked);
        assert!(!s.applied);
        assert_eq!(s.validation_reason, "model not loaded");
        for v in [
            Validation::Blocked,
            Validation::Partial,
            Validation::DeltaValid,
            Validation::DryRunValid,
            Validation::AppliedValid,
        ] {
            assert_eq!(serde_json::to_value(v).expect("json"), v.as_str());
        }
    }
}
