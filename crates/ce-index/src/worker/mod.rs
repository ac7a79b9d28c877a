//! `IndexWorker` (spec §5): one consumer's loop from the outbox to an index.
//!
//! `run_once` is the whole pipeline, one step per file:
//! 1. claim a batch of the consumer's runnable deliveries (`OutboxStore::claim_batch`);
//! 2. [`compact`] it into distinct operations (spec §9.2);
//! 3. [`apply`] them: read the current source state, project, classify each level, embed
//!    only changed text (batched, capped; a call refused for good is split to find the
//!    refused texts, [`bisect`]), write versioned node records — while a heartbeat renews the
//!    claims' leases;
//! 4. `ack` each event: `mark_done` when all its operations succeeded, else `mark_failed`
//!    classified per spec §8.4 (rate limits also pause the worker; a provider's own pause
//!    after a `Retry-After` holds back every worker that shares it).
//!
//! The relation consumer shares claim, heartbeat and ack; its batch is compacted into owner
//! syncs ([`compact::compact_relations`]) and applied by [`relation`]: read each owner's
//! current edges and write its whole edge set, versioned (no projection to text, no
//! embedding).
//!
//! The worker keeps no durable state of its own: a crash anywhere means the claims expire
//! and another worker redoes the idempotent work.

mod ack;
pub mod apply;
mod bisect;
pub mod claim_size;
pub mod compact;
pub mod dry_run;
mod error;
mod fanout;
mod heartbeat;
pub mod relation;
pub mod runner;
pub mod target;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_core::{IndexProjector, OutboxEvent};
use ce_embed::{Embedder, RateLimitPause};
use ce_store::SourceStore;
use serde::Serialize;
use tracing::{info_span, warn};

pub use apply::ChangeCounts;
pub use claim_size::ClaimSize;
pub use error::WorkError;
pub use relation::RelationCounts;
pub use target::{IndexKind, IndexTarget, KeywordTarget, VectorTarget};

use crate::relation::RelationIndex;
use crate::vector::VectorIndex;

/// Worker settings (spec §12.1 `index.worker`, `index.embedding`, `index.vector`).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This worker's id, recorded as `claimed_by`.
    pub worker_id: String,
    /// The consumer it serves.
    pub consumer: String,
    /// Events per claim: the first claim, and the least ([`ClaimSize`]).
    pub claim_limit: usize,
    /// Upper bound on events in flight: claims are capped by it, and a worker facing a deep
    /// queue of cheap rounds grows its claims up to it ([`ClaimSize`]).
    pub max_inflight_events: usize,
    /// Lease renewal period while a batch runs.
    pub heartbeat: Duration,
    /// Texts per embedding call.
    pub embed_batch_size: usize,
    /// Text bytes per embedding call (spec §1.5: 1 MB).
    pub max_batch_text_bytes: usize,
    /// Timeout of one embedding call.
    pub embed_timeout: Duration,
    /// Records per index write transaction (`index.vector.upsert_batch_size`); a node's
    /// records are never split across writes.
    pub vector_upsert_batch_size: usize,
    /// Whether `UPSERT_RELATION` needs work from this consumer.
    pub relation_index_enabled: bool,
    /// Pause after a rate limit without `Retry-After`.
    pub default_rate_limit_pause: Duration,
}

impl WorkerConfig {
    /// Settings from the configuration file for `consumer`.
    pub fn from_config(cfg: &ce_core::Config, worker_id: &str, consumer: &str) -> Self {
        let w = &cfg.index.worker;
        WorkerConfig {
            worker_id: worker_id.to_owned(),
            consumer: consumer.to_owned(),
            claim_limit: w.claim_limit as usize,
            max_inflight_events: w.max_inflight_events as usize,
            heartbeat: Duration::from_secs(u64::from(w.heartbeat_seconds)),
            embed_batch_size: cfg.index.embedding.batch_size as usize,
            max_batch_text_bytes: 1 << 20,
            embed_timeout: Duration::from_secs(u64::from(cfg.index.embedding.timeout_seconds)),
            vector_upsert_batch_size: cfg.index.vector.upsert_batch_size as usize,
            relation_index_enabled: cfg.index.vector.relation_index_enabled,
            default_rate_limit_pause: Duration::from_secs(u64::from(
                cfg.index.outbox.retry_base_seconds,
            )),
        }
    }
}

/// What one `run_once` did (spec `IndexBatchResult`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IndexBatchResult {
    /// Events claimed.
    pub claimed: usize,
    /// Events marked done.
    pub succeeded: usize,
    /// Events marked dead (non-retryable or out of retries).
    pub failed: usize,
    /// Events sent to retry_wait.
    pub retried: usize,
}

/// Observation hooks (spec §11.6). Their panics and errors are swallowed and logged; they
/// must not write the source of truth.
pub trait WorkerCallbacks: Send + Sync {
    /// An event starts processing.
    fn on_event_start(&self, _event: &OutboxEvent) -> Result<(), String> {
        Ok(())
    }
    /// An event was marked done.
    fn on_event_success(&self, _event: &OutboxEvent, _latency_ms: u64) -> Result<(), String> {
        Ok(())
    }
    /// An event failed.
    fn on_event_failure(
        &self,
        _event: &OutboxEvent,
        _error: &WorkError,
        _retryable: bool,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// Runs `f` on every callback, swallowing (and logging) errors and panics.
fn each_callback(
    callbacks: &[Arc<dyn WorkerCallbacks>],
    hook: &str,
    f: impl Fn(&dyn WorkerCallbacks) -> Result<(), String>,
) {
    for cb in callbacks {
        match catch_unwind(AssertUnwindSafe(|| f(cb.as_ref()))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(hook, error = %e, "worker callback failed"),
            Err(_) => warn!(hook, "worker callback panicked"),
        }
    }
}

/// The URIs of `purged` that the source now holds live. A purge removes what an index holds
/// for a URI the source had never stored when the worker read it, whatever the versions: if
/// the URI was created since and another worker applied its event before the purge landed,
/// the purge removed that worker's write, and only a sync by the purging worker restores it
/// (found by the convergence simulation: a `purge_missing` of a URI, delayed by retries,
/// applied just after the URI's creation was).
fn live_now(
    source: &dyn SourceStore,
    purged: Vec<ce_core::CtxUri>,
) -> Result<Vec<ce_core::CtxUri>, WorkError> {
    if purged.is_empty() {
        return Ok(purged);
    }
    let now = source.versions(&purged)?;
    Ok(purged
        .into_iter()
        .zip(now)
        .filter(|(_, v)| matches!(v, ce_store::UriVersion::Live(_)))
        .map(|(u, _)| u)
        .collect())
}

/// What a worker writes to, and how a batch is applied to it.
enum Sink {
    /// Node records (vector, keyword): project, embed when the target uses vectors, write
    /// versioned node records ([`apply`]).
    Records {
        /// `None` for targets without vectors.
        embedder: Option<Arc<dyn Embedder>>,
        target: Arc<dyn IndexTarget>,
    },
    /// Relation records: write each owner's whole edge set, versioned ([`relation`]).
    Relations(Arc<dyn RelationIndex>),
    /// A consumer that plans and applies its own operations ([`OpHandler`]).
    Ops(Arc<dyn OpHandler>),
}

/// A consumer whose work is not an index write — the `derive` consumer (docs/derive.md),
/// which writes derived layers back to the source. It plans its own batch and applies its
/// own operations; claiming, lease renewal and acknowledgement stay the worker's, so it
/// gets retries, dead letters, lag and repair like every other consumer.
pub trait OpHandler: Send + Sync {
    /// The distinct operations `events` need, and which ones each event needs.
    fn compact(&self, events: &[ce_store::ClaimedEvent]) -> compact::Plan;
    /// Applies `ops`: one outcome per operation, and the `index_worker_changes_total`
    /// actions with their counts.
    fn apply(&self, ops: &[compact::Op]) -> OpOutcomes;
    /// How long the handler is still paused (a provider's rate limit).
    fn paused_for(&self) -> Option<Duration> {
        None
    }
}

/// What an [`OpHandler`] did with a batch.
#[derive(Debug, Default)]
pub struct OpOutcomes {
    /// Each operation's outcome, by index.
    pub results: Vec<Result<(), WorkError>>,
    /// `index_worker_changes_total` actions and their counts.
    pub actions: Vec<(&'static str, u64)>,
}

/// What applying a batch did: each operation's outcome (by index), and the
/// `index_worker_changes_total` actions with their counts.
struct Outcomes {
    results: Vec<Result<(), WorkError>>,
    actions: Vec<(&'static str, u64)>,
}

/// One consumer's worker.
pub struct IndexWorker {
    cfg: WorkerConfig,
    source: Arc<dyn SourceStore>,
    sink: Sink,
    projector: IndexProjector,
    callbacks: Vec<Arc<dyn WorkerCallbacks>>,
    /// This worker's own pause after a rate limit (the provider's shared pause, when it has
    /// one, is [`Embedder::paused_for`]).
    paused: RateLimitPause,
    /// Its next claim ([`IndexWorker::run_next`]).
    claim_size: ClaimSize,
}

impl IndexWorker {
    /// A worker of the vector index; binds the index to the embedder's model (a different
    /// model already stored is a non-retryable schema mismatch: run `ce reindex --consumer
    /// vector`).
    pub fn new(
        cfg: WorkerConfig,
        source: Arc<dyn SourceStore>,
        embedder: Arc<dyn Embedder>,
        index: Arc<dyn VectorIndex>,
        projector: IndexProjector,
    ) -> crate::Result<Self> {
        Self::for_target(
            cfg,
            source,
            Arc::new(VectorTarget(index)),
            Some(embedder),
            projector,
        )
    }

    /// A worker of any target; `embedder` is required when the target uses vectors (it is
    /// then bound to the target).
    pub fn for_target(
        cfg: WorkerConfig,
        source: Arc<dyn SourceStore>,
        target: Arc<dyn IndexTarget>,
        embedder: Option<Arc<dyn Embedder>>,
        projector: IndexProjector,
    ) -> crate::Result<Self> {
        match (&embedder, target.uses_vectors()) {
            (Some(e), true) => target.bind_model(e.identity())?,
            (None, true) => {
                return Err(crate::IndexError::Core(ce_core::CoreError::InvalidConfig {
                    key: "index.embedding".into(),
                    reason: format!(
                        "the {:?} consumer's index stores vectors: its worker needs an embedder",
                        cfg.consumer
                    ),
                }));
            }
            (_, false) => {}
        }
        let claim_size = ClaimSize::of(&cfg);
        Ok(IndexWorker {
            cfg,
            source,
            sink: Sink::Records {
                embedder: embedder.filter(|_| target.uses_vectors()),
                target,
            },
            projector,
            callbacks: Vec::new(),
            paused: RateLimitPause::default(),
            claim_size,
        })
    }

    /// A worker of the relation index: it claims `cfg.consumer`'s deliveries (normally
    /// `relation`) and keeps `index` equal to the source's edges — after the outbox drains,
    /// every owner's records in the index are exactly its edges in the source (see
    /// [`relation`]). Of the settings, the embedding and vector ones are unused.
    pub fn for_relations(
        cfg: WorkerConfig,
        source: Arc<dyn SourceStore>,
        index: Arc<dyn RelationIndex>,
    ) -> crate::Result<Self> {
        let claim_size = ClaimSize::of(&cfg);
        Ok(IndexWorker {
            cfg,
            source,
            sink: Sink::Relations(index),
            projector: IndexProjector::default(),
            callbacks: Vec::new(),
            paused: RateLimitPause::default(),
            claim_size,
        })
    }

    /// A worker whose operations `handler` plans and applies (claims `cfg.consumer`'s
    /// deliveries; of the settings, the embedding and vector ones are unused).
    pub fn for_ops(
        cfg: WorkerConfig,
        source: Arc<dyn SourceStore>,
        handler: Arc<dyn OpHandler>,
    ) -> Self {
        let claim_size = ClaimSize::of(&cfg);
        IndexWorker {
            cfg,
            source,
            sink: Sink::Ops(handler),
            projector: IndexProjector::default(),
            callbacks: Vec::new(),
            paused: RateLimitPause::default(),
            claim_size,
        }
    }

    /// Adds an observation hook.
    pub fn with_callback(mut self, cb: Arc<dyn WorkerCallbacks>) -> Self {
        self.callbacks.push(cb);
        self
    }

    /// Replaces how the worker sizes its claims (tests: round times that do not depend on the
    /// machine).
    pub fn with_claim_size(mut self, claim_size: ClaimSize) -> Self {
        self.claim_size = claim_size;
        self
    }

    /// The worker's settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// How long the worker is still paused by a rate limit: its own pause, or the pause of
    /// the provider it embeds with (shared by every worker using that provider).
    pub fn paused_for(&self) -> Option<Duration> {
        let provider = match &self.sink {
            Sink::Records {
                embedder: Some(e), ..
            } => e.paused_for(),
            Sink::Ops(h) => h.paused_for(),
            _ => None,
        };
        self.paused.remaining().max(provider)
    }

    /// Whether the worker's consumer writes to the source of truth (an [`OpHandler`]: the
    /// `derive` consumer's write-backs), so that its batches can append events for the
    /// others; index consumers never do.
    pub fn writes_back(&self) -> bool {
        matches!(self.sink, Sink::Ops(_))
    }

    /// One round of a running worker: [`Self::run_once`] with the claim its earlier rounds
    /// call for ([`ClaimSize`]: `claim_limit`, more while the queue is deep and rounds are
    /// fast, up to `max_inflight_events`).
    pub fn run_next(&self) -> Result<IndexBatchResult, WorkError> {
        let limit = self.claim_size.next();
        let started = Instant::now();
        let result = self.run_once(limit)?;
        if result.claimed > 0 {
            self.claim_size
                .observe(limit, result.claimed, started.elapsed());
            let next = self.claim_size.next();
            if next != limit {
                metrics::gauge!("index_worker_claim_size", "consumer" => self.cfg.consumer.clone())
                    .set(next as f64);
            }
        }
        Ok(result)
    }

    /// Claims, applies and acknowledges up to `limit` events (spec §5.1).
    pub fn run_once(&self, limit: usize) -> Result<IndexBatchResult, WorkError> {
        let started = Instant::now();
        if self.paused_for().is_some() {
            return Ok(IndexBatchResult::default());
        }
        let limit = limit.min(self.cfg.max_inflight_events).max(1);
        let claimed = {
            let _s = info_span!("index.claim_batch", worker_id = %self.cfg.worker_id, consumer = %self.cfg.consumer).entered();
            self.source
                .claim_batch(&self.cfg.consumer, &self.cfg.worker_id, limit)?
        };
        let mut result = IndexBatchResult {
            claimed: claimed.len(),
            ..IndexBatchResult::default()
        };
        if claimed.is_empty() {
            self.finish_bulk();
            return Ok(result);
        }
        for c in &claimed {
            each_callback(&self.callbacks, "on_event_start", |cb| {
                cb.on_event_start(&c.event)
            });
        }
        let claims: Vec<_> = claimed.iter().map(|c| c.claim.clone()).collect();
        let plan = match &self.sink {
            Sink::Records { .. } => compact::compact(&claimed, self.cfg.relation_index_enabled),
            Sink::Relations(_) => compact::compact_relations(&claimed),
            Sink::Ops(h) => h.compact(&claimed),
        };
        let Outcomes { results, actions } = {
            let _s = info_span!("index.handle_event", worker_id = %self.cfg.worker_id, events = claimed.len(), ops = plan.ops.len(), folded = plan.folded()).entered();
            self.apply(&plan.ops, &claims)
        };
        ack::acknowledge(self, &claimed, &plan, &results, started, &mut result);
        ce_core::failpoint::hit("worker.after_ack");
        metrics::histogram!("index_worker_run_once_latency_ms")
            .record(started.elapsed().as_secs_f64() * 1e3);
        let consumer = self.cfg.consumer.clone();
        for (action, n) in actions {
            if n > 0 {
                metrics::counter!("index_worker_changes_total", "consumer" => consumer.clone(), "action" => action).increment(n);
            }
        }
        Ok(result)
    }

    /// Ends a bulk load of the target once the consumer has nothing pending or claimed (an
    /// index that deferred work while loaded from empty builds it:
    /// [`VectorIndex::finish_bulk`]). An empty claim alone is not the end: other workers may
    /// hold the rest of the queue. A failure leaves the index correct (searches scan
    /// exactly) and is retried at the next empty claim.
    fn finish_bulk(&self) {
        let Sink::Records { target, .. } = &self.sink else {
            return;
        };
        if !target.bulk_pending() {
            return;
        }
        let open = match self
            .source
            .has_unfinished(std::slice::from_ref(&self.cfg.consumer))
        {
            Ok(open) => open,
            Err(e) => {
                warn!(worker_id = %self.cfg.worker_id, consumer = %self.cfg.consumer, error = %e, "bulk load not finished: the outbox was not read");
                return;
            }
        };
        if open {
            return;
        }
        if let Err(e) = target.finish_bulk() {
            warn!(worker_id = %self.cfg.worker_id, consumer = %self.cfg.consumer, error = %e, "bulk load not finished");
        }
    }

    /// Applies `ops` to the sink while a heartbeat renews `claims`; returns each operation's
    /// outcome and the `index_worker_changes_total` actions.
    fn apply(&self, ops: &[compact::Op], claims: &[ce_store::Claim]) -> Outcomes {
        let source = self.source.as_ref();
        match &self.sink {
            Sink::Records { embedder, target } => {
                let applier = apply::NodeApplier {
                    source,
                    embedder: embedder.as_deref(),
                    target: target.as_ref(),
                    projector: &self.projector,
                    cfg: &self.cfg,
                };
                let applied = heartbeat::with_heartbeat(source, claims, self.cfg.heartbeat, || {
                    applier.apply(ops)
                });
                let c = applied.counts;
                let actions = vec![
                    ("embed", c.embedded),
                    ("payload", c.payload_only),
                    ("text", c.rewritten),
                    ("unchanged", c.unchanged),
                    ("delete", c.removed),
                    ("stale", c.stale),
                    ("reuse", c.reused),
                    ("superseded", c.superseded),
                ];
                Outcomes {
                    results: applied.results,
                    actions,
                }
            }
            Sink::Relations(index) => {
                let applier = relation::RelationApplier {
                    consumer: &self.cfg.consumer,
                    source,
                    index: index.as_ref(),
                    projector: &self.projector,
                };
                let applied = heartbeat::with_heartbeat(source, claims, self.cfg.heartbeat, || {
                    applier.apply(ops)
                });
                Outcomes {
                    results: applied.results,
                    actions: applied.counts.actions().to_vec(),
                }
            }
            Sink::Ops(handler) => {
                let applied = heartbeat::with_heartbeat(source, claims, self.cfg.heartbeat, || {
                    handler.apply(ops)
                });
                Outcomes {
                    results: applied.results,
                    actions: applied.actions,
                }
            }
        }
    }
}

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;
