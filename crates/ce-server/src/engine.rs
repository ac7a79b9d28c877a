//! The engine: one data directory's source of truth, embedder, vector index and workers,
//! wired together.
//!
//! ```text
//! writes ─► SqliteStore (+ outbox, same transaction) ─► Wakeup::notify
//!                                   │
//!                 WorkerPool: IndexWorker × N (consumer "vector")
//!                                   ▼
//!            CachedEmbedder ─► EmbeddedVectorIndex  ◄── search (ce-retrieval)
//! ```
//!
//! Readiness = the store is open (always, once [`Engine::open`] returned) + the embedding
//! model is loaded + the vector index is bound to that model. A missing model or an index
//! built with another model keeps the engine up but not ready (and without workers), with
//! the reason and the fix in [`Engine::readiness`]; node reads and writes still work.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ce_core::{
    Classify as _, Config, CtxUri, EVENT_VERSION, ErrorCode, EventPayload, IndexProjector,
    OutboxEvent, OutboxEventCreate, UpsertContextPayload, UpsertReason,
};
use ce_embed::{CachedEmbedder, Embedder, ModelIdentity};
use ce_index::vector::VectorIndex;
use ce_index::vector::embedded::EmbeddedVectorIndex;
use ce_index::worker::runner::{Wakeup, WorkerPool};
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_retrieval::{SearchRequest, SearchResponse};
use ce_store::{
    ContextFs as _, LinkRequest, OutboxStore as _, PutRequest, RelationStore as _, SourceStore,
    SqliteStore, WriteOutcome,
};
use tracing::{info, warn};

use crate::error::{Result, ServerError};
use crate::status::{Applier, ConsumerStatus, DrainProgress, DrainReport, ReindexReport, Status};

mod failpoint;
pub mod upkeep;

/// The consumer whose index this engine maintains.
pub const VECTOR_CONSUMER: &str = "vector";
/// The vector index's directory inside the data directory.
pub const VECTOR_DIR: &str = "vector";
/// Worker threads when not configured.
pub const DEFAULT_WORKERS: usize = 2;
/// Repair events appended per outbox transaction by [`Engine::reindex`].
const REQUEUE_CHUNK: usize = 1000;
/// How often [`Engine::drain`] rechecks the outbox while others hold claims.
const DRAIN_RECHECK: Duration = Duration::from_millis(100);
/// Consecutive claim failures after which [`Engine::drain`] gives up.
const DRAIN_MAX_ERRORS: u32 = 20;

/// How an engine runs its workers.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Worker threads for the vector consumer.
    pub workers: usize,
    /// Whether workers run continuously from [`Engine::open_with`] (server, `ce worker`);
    /// when false, work is done by [`Engine::drain`] on demand.
    pub run_workers: bool,
    /// Prefix of the worker ids (`{role}-{pid}-{n}`), e.g. `serve` or `worker`.
    pub role: String,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            workers: DEFAULT_WORKERS,
            run_workers: true,
            role: "serve".into(),
        }
    }
}

/// Readiness: what is missing, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Readiness {
    /// Whether the engine can index and search.
    pub ready: bool,
    /// Why not (empty when ready).
    pub reasons: Vec<String>,
}

/// One data directory's engine (see the module docs). Share it behind an `Arc`.
pub struct Engine {
    data_dir: PathBuf,
    config: Config,
    store: Arc<SqliteStore>,
    embedder: std::result::Result<Arc<CachedEmbedder>, String>,
    index: Arc<EmbeddedVectorIndex>,
    wake: Arc<Wakeup>,
    /// `None` when the index is bound to the embedder's model, else why not.
    binding_error: Mutex<Option<String>>,
    pool: Mutex<Option<WorkerPool>>,
    /// Snapshots and graph rebuilds of the vector index, while workers run.
    upkeep: Mutex<Option<upkeep::Upkeep>>,
    running_workers: AtomicUsize,
    options: EngineOptions,
    /// Serializes reindex and drain (both take the workers over).
    maintenance: Mutex<()>,
    next_worker: AtomicU64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("data_dir", &self.data_dir)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Engine {
    /// Opens the engine of `data_dir` with default options: two workers running.
    pub fn open(data_dir: &Path, config: Config) -> Result<Engine> {
        Self::open_with(data_dir, config, EngineOptions::default())
    }

    /// Opens the store, loads the embedder, opens and binds the vector index, and starts the
    /// workers when `options.run_workers` (and `index.worker.enabled`) and the engine is
    /// ready. A missing model or a model mismatch is not an error here: see
    /// [`Engine::readiness`].
    pub fn open_with(data_dir: &Path, config: Config, options: EngineOptions) -> Result<Engine> {
        let store = Arc::new(SqliteStore::open(data_dir, config.clone())?);
        let embedder = ce_embed::build_cached(&config.index.embedding, data_dir).map_err(|e| {
            warn!(error = %e, "embedding model not loaded");
            e.to_string()
        });
        let index = Arc::new(
            EmbeddedVectorIndex::open(&data_dir.join(VECTOR_DIR)).map_err(|e| match e.code() {
                ErrorCode::Unavailable => ServerError::NotReady {
                    reason: format!(
                        "{e} (is `ce serve` or `ce worker` running on this data directory? send commands to it with --server URL)"
                    ),
                    code: ErrorCode::Unavailable,
                },
                _ => ServerError::Index(e),
            })?,
        );
        let engine = Engine {
            data_dir: data_dir.to_owned(),
            config,
            store,
            embedder,
            index,
            wake: Wakeup::new(),
            binding_error: Mutex::new(None),
            pool: Mutex::new(None),
            upkeep: Mutex::new(None),
            running_workers: AtomicUsize::new(0),
            options,
            maintenance: Mutex::new(()),
            next_worker: AtomicU64::new(0),
        };
        engine.bind()?;
        if engine.options.run_workers {
            engine.start_pool()?;
        }
        Ok(engine)
    }

    /// Binds the index to the embedder's model, recording a mismatch as not-ready.
    fn bind(&self) -> Result<()> {
        let Ok(embedder) = &self.embedder else {
            return Ok(());
        };
        let identity = embedder.identity();
        let err = match self.index.bind_model(identity) {
            Ok(()) => None,
            Err(e) if e.code() == ErrorCode::SchemaMismatch => {
                let bound = self
                    .index
                    .model()
                    .ok()
                    .flatten()
                    .map_or_else(|| "another model".to_owned(), |m| m.key());
                let reason = format!(
                    "the vector index was built with {bound} but the configured model is {identity}: run `ce reindex --consumer vector` to rebuild it"
                );
                warn!(%reason, "vector index not bound");
                Some(reason)
            }
            Err(e) => return Err(e.into()),
        };
        *lock(&self.binding_error) = err;
        Ok(())
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The source of truth (reads; writes should go through the engine so workers wake up).
    pub fn store(&self) -> &Arc<SqliteStore> {
        &self.store
    }

    /// The vector index.
    pub fn index(&self) -> &Arc<EmbeddedVectorIndex> {
        &self.index
    }

    /// The embedder, or why it is not loaded.
    pub fn embedder(&self) -> std::result::Result<&Arc<CachedEmbedder>, &str> {
        self.embedder.as_ref().map_err(String::as_str)
    }

    /// The wake-up hint workers wait on.
    pub fn wakeup(&self) -> &Arc<Wakeup> {
        &self.wake
    }

    /// Whether the engine can index and search, and if not why.
    pub fn readiness(&self) -> Readiness {
        let mut reasons = Vec::new();
        if let Err(e) = &self.embedder {
            reasons.push(format!("embedding model not loaded: {e}"));
        }
        if let Some(e) = lock(&self.binding_error).as_ref() {
            reasons.push(e.clone());
        }
        Readiness {
            ready: reasons.is_empty(),
            reasons,
        }
    }

    fn not_ready(&self) -> ServerError {
        let code = if self.embedder.is_ok() {
            ErrorCode::SchemaMismatch
        } else {
            ErrorCode::Unavailable
        };
        ServerError::NotReady {
            reason: self.readiness().reasons.join("; "),
            code,
        }
    }

    fn ready_embedder(&self) -> Result<Arc<CachedEmbedder>> {
        match &self.embedder {
            Ok(e) => Ok(e.clone()),
            Err(_) => Err(self.not_ready()),
        }
    }

    /// Number of worker threads currently running.
    pub fn running_workers(&self) -> usize {
        self.running_workers.load(Ordering::SeqCst)
    }

    /// Whether the vector consumer is configured in `index.outbox.consumers`.
    fn vector_configured(&self) -> bool {
        self.store.consumers().iter().any(|c| c == VECTOR_CONSUMER)
    }

    /// `n` workers for the vector consumer (the engine must be ready).
    fn make_workers(&self, n: usize) -> Result<Vec<Arc<IndexWorker>>> {
        if !self.readiness().ready {
            return Err(self.not_ready());
        }
        if !self.vector_configured() {
            return Err(ServerError::UnsupportedConsumer {
                name: VECTOR_CONSUMER.into(),
                reason: "it is not listed in index.outbox.consumers".into(),
            });
        }
        let embedder: Arc<dyn Embedder> = failpoint::worker_embedder(self.ready_embedder()?);
        let source: Arc<dyn SourceStore> = self.store.clone();
        let index: Arc<dyn VectorIndex> = self.index.clone();
        (0..n.max(1))
            .map(|_| {
                let k = self.next_worker.fetch_add(1, Ordering::SeqCst);
                let id = format!("{}-{}-{k}", self.options.role, std::process::id());
                let w = IndexWorker::new(
                    WorkerConfig::from_config(&self.config, &id, VECTOR_CONSUMER),
                    source.clone(),
                    embedder.clone(),
                    index.clone(),
                    IndexProjector::new(self.config.projector),
                )?;
                Ok(Arc::new(w))
            })
            .collect()
    }

    /// Starts the continuous workers if configured, enabled and ready (else logs why not).
    fn start_pool(&self) -> Result<()> {
        let mut pool = lock(&self.pool);
        if pool.is_some() || self.options.workers == 0 {
            return Ok(());
        }
        if !self.config.index.worker.enabled {
            info!("index.worker.enabled is false: no workers");
            return Ok(());
        }
        if !self.vector_configured() {
            warn!("the vector consumer is not configured: no workers");
            return Ok(());
        }
        let readiness = self.readiness();
        if !readiness.ready {
            warn!(reasons = ?readiness.reasons, "not ready: workers not started");
            return Ok(());
        }
        let workers = self.make_workers(self.options.workers)?;
        let n = workers.len();
        let poll = Duration::from_millis(self.config.index.worker.poll_interval_ms);
        *pool = Some(WorkerPool::start(workers, self.wake.clone(), poll));
        self.running_workers.store(n, Ordering::SeqCst);
        *lock(&self.upkeep) = Some(upkeep::Upkeep::start(
            self.index.clone(),
            upkeep::UpkeepPolicy::from_config(&self.config),
        ));
        info!(workers = n, consumer = VECTOR_CONSUMER, "workers started");
        Ok(())
    }

    /// Stops the continuous workers; each finishes its batch first, so no claim is left.
    fn stop_pool(&self) {
        if let Some(u) = lock(&self.upkeep).take() {
            u.stop();
        }
        let pool = lock(&self.pool).take();
        if let Some(p) = pool {
            p.shutdown();
            self.running_workers.store(0, Ordering::SeqCst);
            info!("workers stopped");
        }
    }

    /// Stops the workers and writes the vector index's snapshot (also done on drop).
    pub fn shutdown(&self) {
        self.stop_pool();
        if let Err(e) = self.index.flush() {
            warn!(error = %e, "vector index snapshot not written (the next start rebuilds it)");
        }
    }

    // --- writes: commit, then wake the workers -------------------------------------------

    fn woke<T>(&self, r: ce_store::Result<T>) -> Result<T> {
        let v = r?;
        self.wake.notify();
        Ok(v)
    }

    /// `ContextFs::put`, then a wake-up.
    pub fn put(&self, uri: &CtxUri, req: PutRequest) -> Result<WriteOutcome> {
        self.woke(self.store.put(uri, req))
    }

    /// `ContextFs::rm`, then a wake-up.
    pub fn rm(
        &self,
        uri: &CtxUri,
        recursive: bool,
        expect_version: Option<u64>,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        self.woke(self.store.rm(uri, recursive, expect_version, trace_id))
    }

    /// `ContextFs::mv`, then a wake-up.
    pub fn mv(&self, from: &CtxUri, to: &CtxUri, trace_id: Option<String>) -> Result<WriteOutcome> {
        self.woke(self.store.mv(from, to, trace_id))
    }

    /// `RelationStore::link`, then a wake-up.
    pub fn link(&self, req: LinkRequest) -> Result<WriteOutcome> {
        self.woke(self.store.link(req))
    }

    /// `RelationStore::unlink`, then a wake-up.
    pub fn unlink(
        &self,
        from: &CtxUri,
        to: &CtxUri,
        relation_type: &str,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        self.woke(self.store.unlink(from, to, relation_type, trace_id))
    }

    /// `OutboxStore::append` (admin / repair), then a wake-up.
    pub fn append_event(&self, event: OutboxEventCreate) -> Result<OutboxEvent> {
        self.woke(self.store.append(event))
    }

    // --- search, status, maintenance -------------------------------------------------------

    /// Searches the vector index and hydrates the hits (see `ce-retrieval`).
    pub fn search(&self, req: &SearchRequest) -> Result<SearchResponse> {
        let embedder = self.ready_embedder()?;
        Ok(ce_retrieval::search(
            self.store.as_ref(),
            embedder.as_ref(),
            self.index.as_ref(),
            req,
        )?)
    }

    /// Whether `consumer`'s events can be applied by this build and configuration.
    fn applier(&self, consumer: &str) -> Applier {
        if consumer != VECTOR_CONSUMER {
            return Applier::Blocked(format!(
                "no index for consumer {consumer:?} in this build yet: its events wait in the journal"
            ));
        }
        let readiness = self.readiness();
        if !readiness.ready {
            return Applier::Blocked(readiness.reasons.join("; "));
        }
        if !self.config.index.worker.enabled {
            return Applier::NotRequested("index.worker.enabled is false".into());
        }
        Applier::Ready
    }

    /// Outbox progress and lag per consumer, index size, model and readiness.
    pub fn status(&self) -> Result<Status> {
        let now = self.store.clock().now_ms();
        let consumers = self
            .store
            .stats()?
            .into_iter()
            .map(|s| {
                let applier = self.applier(&s.consumer);
                ConsumerStatus::new(s, now, &applier)
            })
            .collect();
        let readiness = self.readiness();
        Ok(Status {
            ready: readiness.ready,
            not_ready: readiness.reasons,
            data_dir: self.data_dir.display().to_string(),
            model: self.embedder.as_ref().ok().map(|e| e.identity().clone()),
            index_model: self.index.model()?,
            index_records: self.index.count()?,
            consumers,
            workers: self.running_workers(),
            worker_consumer: VECTOR_CONSUMER.into(),
            embed_cache: self.embedder.as_ref().ok().map(|e| e.stats().into()),
        })
    }

    /// Rebuilds `consumer`'s index from the source of truth: stops the workers, appends one
    /// `UPSERT_CONTEXT` (reason `repair`) per node with text, clears the index and binds it
    /// to the configured model, then restarts the workers. The repair events come first, so
    /// a crash at any point leaves either the old index or work that a rerun completes.
    /// Re-embedding is cheap: unchanged texts come from the embedding cache.
    pub fn reindex(&self, consumer: &str) -> Result<ReindexReport> {
        if consumer != VECTOR_CONSUMER {
            return Err(ServerError::UnsupportedConsumer {
                name: consumer.into(),
                reason: format!("only the {VECTOR_CONSUMER:?} consumer has an index here"),
            });
        }
        if !self.vector_configured() {
            return Err(ServerError::UnsupportedConsumer {
                name: consumer.into(),
                reason: "it is not listed in index.outbox.consumers".into(),
            });
        }
        let embedder = self.ready_embedder()?;
        let _maintenance = lock(&self.maintenance);
        let started = Instant::now();
        self.stop_pool();
        let result = self.requeue_and_clear(embedder.identity());
        // Workers come back even if the rebuild failed half-way (a rerun finishes it).
        if let Err(e) = self.bind() {
            warn!(error = %e, "rebinding the vector index failed");
        }
        if self.options.run_workers {
            self.start_pool()?;
        }
        self.wake.notify();
        let (requeued, cleared) = result?;
        metrics::counter!("index_repair_requeued_total", "consumer" => VECTOR_CONSUMER)
            .increment(requeued);
        info!(consumer, requeued, cleared, "reindex queued");
        Ok(ReindexReport {
            consumer: consumer.into(),
            cleared_records: cleared,
            requeued,
            model: embedder.identity().clone(),
            took_ms: ms(started.elapsed()),
        })
    }

    fn requeue_and_clear(&self, model: &ModelIdentity) -> Result<(u64, u64)> {
        let trace_id = format!("reindex-{}", uuid::Uuid::now_v7());
        let mut requeued = 0u64;
        for account in self.store.ls(&CtxUri::root())? {
            let mut batch = Vec::new();
            for n in self.store.tree(&account.uri, None)? {
                if n.layer_bytes.iter().all(|&b| b == 0) {
                    continue;
                }
                batch.push(OutboxEventCreate {
                    payload: EventPayload::UpsertContext(UpsertContextPayload {
                        event_version: EVENT_VERSION,
                        uri: n.uri,
                        expected_node_version: n.version,
                        reason: UpsertReason::Repair,
                        trace_id: trace_id.clone(),
                    }),
                });
                if batch.len() >= REQUEUE_CHUNK {
                    requeued += self.store.append_batch(std::mem::take(&mut batch))?.len() as u64;
                }
            }
            if !batch.is_empty() {
                requeued += self.store.append_batch(batch)?.len() as u64;
            }
        }
        let cleared = self.index.count()?;
        self.index.clear()?;
        self.index.bind_model(model)?;
        Ok((requeued, cleared))
    }

    /// Runs `options.workers` workers until the vector consumer has nothing pending or
    /// claimed (claims of a crashed worker are waited for until their lease expires);
    /// deliveries waiting to retry are left for later and reported. `progress` is called
    /// after every batch.
    pub fn drain(&self, progress: &(dyn Fn(&DrainProgress) + Sync)) -> Result<DrainReport> {
        let _maintenance = lock(&self.maintenance);
        if lock(&self.pool).is_some() {
            return Err(ServerError::Internal(
                "drain needs the workers: this engine runs them continuously".into(),
            ));
        }
        let workers = self.make_workers(self.options.workers)?;
        let started = Instant::now();
        let totals = DrainTotals::default();
        let poll = Duration::from_millis(self.config.index.worker.poll_interval_ms);
        let outcome: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter()
                .map(|w| s.spawn(|| self.drain_one(w, &totals, started, poll, progress)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(ServerError::Internal("a worker panicked".into())))
                })
                .collect()
        });
        outcome.into_iter().collect::<Result<Vec<()>>>()?;
        let now = self.store.clock().now_ms();
        let remaining = self
            .store
            .stats()?
            .into_iter()
            .find(|s| s.consumer == VECTOR_CONSUMER)
            .map(|s| ConsumerStatus::new(s, now, &self.applier(VECTOR_CONSUMER)));
        Ok(DrainReport {
            progress: totals.snapshot(started),
            workers: workers.len(),
            remaining,
        })
    }

    fn drain_one(
        &self,
        w: &IndexWorker,
        totals: &DrainTotals,
        started: Instant,
        poll: Duration,
        progress: &(dyn Fn(&DrainProgress) + Sync),
    ) -> Result<()> {
        let mut errors = 0u32;
        loop {
            match w.run_once(w.config().claim_limit) {
                Ok(r) if r.claimed > 0 => {
                    errors = 0;
                    totals.add(&r);
                    progress(&totals.snapshot(started));
                    continue;
                }
                Ok(_) => errors = 0,
                Err(e) => {
                    errors += 1;
                    warn!(error = %e, errors, "claim failed");
                    if errors >= DRAIN_MAX_ERRORS {
                        return Err(ServerError::Internal(format!(
                            "the worker gave up after {errors} failed claims: {e}"
                        )));
                    }
                }
            }
            let stats = self.store.stats()?;
            let open = stats
                .iter()
                .find(|s| s.consumer == VECTOR_CONSUMER)
                .is_some_and(|s| s.pending + s.claimed > 0);
            if !open {
                return Ok(());
            }
            // Work is claimed elsewhere (another of our threads, or a crashed worker whose
            // lease has not expired yet) or the worker is paused by a rate limit.
            std::thread::sleep(w.paused_for().unwrap_or(poll).min(DRAIN_RECHECK));
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_pool();
    }
}

/// Counters shared by the draining threads.
#[derive(Default)]
struct DrainTotals {
    batches: AtomicU64,
    claimed: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
}

impl DrainTotals {
    fn add(&self, r: &ce_index::worker::IndexBatchResult) {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.claimed.fetch_add(r.claimed as u64, Ordering::SeqCst);
        self.succeeded
            .fetch_add(r.succeeded as u64, Ordering::SeqCst);
        self.failed.fetch_add(r.failed as u64, Ordering::SeqCst);
        self.retried.fetch_add(r.retried as u64, Ordering::SeqCst);
    }

    fn snapshot(&self, started: Instant) -> DrainProgress {
        DrainProgress {
            batches: self.batches.load(Ordering::SeqCst),
            claimed: self.claimed.load(Ordering::SeqCst),
            succeeded: self.succeeded.load(Ordering::SeqCst),
            failed: self.failed.load(Ordering::SeqCst),
            retried: self.retried.load(Ordering::SeqCst),
            elapsed_ms: ms(started.elapsed()),
        }
    }
}

#[cfg(test)]
mod tests;
