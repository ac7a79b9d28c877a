//! The engine: one data directory's source of truth, embedder, indexes and workers, wired
//! together.
//!
//! ```text
//! writes ─► Source: SQLite or PostgreSQL (+ outbox, same transaction) ─► Wakeup::notify
//!                                   │        (PostgreSQL: NOTIFY ► listener ► Wakeup::notify)
//!          WorkerPool: IndexWorker × N per consumer ("vector", "keyword", "relation")
//!                    ▼                                   ▼
//!   CachedEmbedder ─► vector index                EmbeddedKeywordIndex
//!                     (embedded or pgvector)
//!                    └──────── search (ce-retrieval) ────┘
//! ```
//!
//! The source of truth is `store.url` ([`Source`]); the vector index is
//! `index.vector.destination`: `embedded` (in the data directory, one process at a time,
//! with snapshots and graph rebuilds) or `pgvector` (shared by every process, so several
//! `ce worker --consumer vector` can split the work). An engine opens only the indexes of
//! the consumers it serves ([`EngineOptions::consumers`]), and the embedder only when it
//! serves the vector consumer.
//!
//! Each configured consumer (`index.outbox.consumers`) progresses on its own: a consumer
//! whose input is missing is blocked without blocking the others. The vector consumer is
//! ready when the embedding model is loaded and the vector index is bound to it; a missing
//! model or an index built with another model keeps the engine up but not ready (no vector
//! workers, no vector search), with the reason and the fix in [`Engine::readiness`]; node
//! reads and writes, keyword indexing and keyword search still work.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ce_core::{
    Classify as _, Config, CtxUri, EVENT_VERSION, ErrorCode, EventPayload, IndexProjector,
    OutboxEvent, OutboxEventCreate, RelationMode, UpsertContextPayload, UpsertReason,
    UpsertRelationPayload,
};
use ce_embed::{CachedEmbedder, Embedder, ModelIdentity};
use ce_index::keyword::KeywordIndex;
use ce_index::keyword::embedded::EmbeddedKeywordIndex;
use ce_index::relation::RelationIndex;
use ce_index::relation::embedded::EmbeddedRelationIndex;
use ce_index::vector::VectorIndex;
use ce_index::vector::embedded::EmbeddedVectorIndex;
use ce_index::vector::pgvector::PgVectorIndex;
use ce_index::worker::dry_run::DryRunReport;
use ce_index::worker::runner::{Wakeup, WorkerPool};
use ce_index::worker::target::{IndexTarget, KeywordTarget, VectorTarget};
use ce_index::worker::{IndexWorker, WorkerCallbacks, WorkerConfig};
use ce_retrieval::{
    Fusion, HierarchicalRequest, HierarchicalResponse, RelatedRequest, RelatedResponse,
    RetrievalError, Retriever, SearchRequest, SearchResponse, VectorSide,
};
use ce_store::{
    LinkRequest, PutRequest, SourceStore, WriteOutcome,
    layout::{ImportOptions, ImportReport},
};
use tracing::{info, warn};

use crate::error::{Result, ServerError};
use crate::guarded::Guarded;
use crate::source::Source;
use crate::status::{
    Applier, ConsumerStatus, DrainProgress, DrainReport, EmbedCacheStatus, HoldStatus,
    ReindexReport, Status,
};

mod failpoint;
pub mod holds;
pub mod listen;
pub mod owner;
mod periodic;
pub mod repair;
pub mod upkeep;

pub use ce_core::config::{KEYWORD_CONSUMER, RELATION_CONSUMER, VECTOR_CONSUMER};

/// The vector index's directory inside the data directory.
pub const VECTOR_DIR: &str = "vector";
/// The keyword index's directory inside the data directory.
pub const KEYWORD_DIR: &str = "keyword";
/// The relation index's directory inside the data directory.
pub const RELATION_DIR: &str = "relation";
/// The consumers this build has an index for.
pub const INDEXED_CONSUMERS: [&str; 3] = [VECTOR_CONSUMER, KEYWORD_CONSUMER, RELATION_CONSUMER];
/// The consumers [`Engine::dry_run`] covers (the relation index has no dry run yet).
pub const DRY_RUN_CONSUMERS: [&str; 2] = [VECTOR_CONSUMER, KEYWORD_CONSUMER];
/// Where dry-run reports are recorded, inside the data directory.
pub const DRY_RUN_DIR: &str = "dry-run";
/// Worker threads per consumer when not configured.
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
    /// Worker threads per consumer.
    pub workers: usize,
    /// Whether workers run continuously from [`Engine::open_with`] (server, `ce worker`);
    /// when false, work is done by [`Engine::drain`] on demand.
    pub run_workers: bool,
    /// Prefix of the worker ids (`{role}-{consumer}-{pid}-{n}`), e.g. `serve` or `worker`.
    pub role: String,
    /// The consumers whose workers run here; empty: every configured consumer with an index.
    /// When set, only these consumers' indexes are opened (so `ce worker --consumer keyword`
    /// leaves the embedded vector index to another process).
    pub consumers: Vec<String>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            workers: DEFAULT_WORKERS,
            run_workers: true,
            role: "serve".into(),
            consumers: Vec::new(),
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
    store: Source,
    embedder: std::result::Result<Arc<CachedEmbedder>, String>,
    /// The vector index, when the vector consumer is configured and served here.
    index: Option<Arc<dyn VectorIndex>>,
    /// The same index when it is the embedded one (`index.vector.destination = "embedded"`):
    /// its snapshots and graph rebuilds are this process's job.
    embedded_vector: Option<Arc<EmbeddedVectorIndex>>,
    /// The keyword index, when the keyword consumer is configured.
    keyword: Option<Arc<EmbeddedKeywordIndex>>,
    /// The relation index, when the relation consumer is configured.
    relations: Option<Arc<EmbeddedRelationIndex>>,
    wake: Arc<Wakeup>,
    /// `None` when the index is bound to the embedder's model, else why not.
    binding_error: Mutex<Option<String>>,
    pool: Mutex<Option<WorkerPool>>,
    /// The consumers the pool's workers serve.
    pool_consumers: Mutex<Vec<String>>,
    /// Snapshots and graph rebuilds of the vector index, while workers run.
    upkeep: Mutex<Option<periodic::Periodic>>,
    /// The scheduled repair jobs, while workers run (`index.repair.enabled`).
    repair_schedule: Mutex<Option<periodic::Periodic>>,
    /// Path locks of rm / mv / import (docs/locks.md).
    locks: ce_lock::LockManager,
    /// Keeps the leases handed off to background work, while workers run.
    holds: Mutex<Option<periodic::Periodic>>,
    /// Wakes the workers on PostgreSQL's commit notifications, while workers run.
    listener: Mutex<Option<listen::Listener>>,
    running_workers: AtomicUsize,
    options: EngineOptions,
    /// Serializes reindex and drain (both take the workers over).
    maintenance: Mutex<()>,
    /// The worker locks of the consumers this engine has run workers for ([`owner`]).
    worker_locks: Mutex<Vec<(String, owner::WorkerLock)>>,
    next_worker: AtomicU64,
    /// The job registry, and the job runner while it runs ([`crate::jobs`]).
    pub(crate) jobs: crate::jobs::Jobs,
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

    /// Opens the store (`store.url`), loads the embedder, opens and binds the vector index
    /// (`index.vector.destination`), opens the keyword and relation indexes, each only when
    /// its consumer is configured and served here, and starts the workers of every ready
    /// consumer when `options.run_workers` (and `index.worker.enabled`). A missing model or a
    /// model mismatch is not an error here: see [`Engine::readiness`].
    pub fn open_with(data_dir: &Path, config: Config, options: EngineOptions) -> Result<Engine> {
        let store = Source::open(data_dir, &config)?;
        let locks = ce_lock::LockManager::from_config(&config.lock, data_dir)?;
        let wants = |c: &str| {
            config.index.outbox.consumers.iter().any(|x| x == c)
                && (options.consumers.is_empty() || options.consumers.iter().any(|x| x == c))
        };
        // Only the vector side embeds: without it no model is loaded and no provider opened.
        let embedder = if wants(VECTOR_CONSUMER) {
            ce_embed::build_cached(&config.index.embedding, data_dir).map_err(|e| {
                warn!(error = %e, "embedding model not loaded");
                e.to_string()
            })
        } else {
            Err(format!(
                "no embedder: the {VECTOR_CONSUMER} consumer is not configured or not served here"
            ))
        };
        let (index, embedded_vector) = if wants(VECTOR_CONSUMER) {
            open_vector_index(data_dir, &config)?
        } else {
            (None, None)
        };
        let keyword = if wants(KEYWORD_CONSUMER) {
            Some(Arc::new(EmbeddedKeywordIndex::open(
                &data_dir.join(KEYWORD_DIR),
            )?))
        } else {
            None
        };
        let relations = if wants(RELATION_CONSUMER) {
            Some(Arc::new(EmbeddedRelationIndex::open(
                &data_dir.join(RELATION_DIR),
            )?))
        } else {
            None
        };
        let engine = Engine {
            data_dir: data_dir.to_owned(),
            config,
            store,
            embedder,
            index,
            embedded_vector,
            keyword,
            relations,
            wake: Wakeup::new(),
            binding_error: Mutex::new(None),
            pool: Mutex::new(None),
            pool_consumers: Mutex::new(Vec::new()),
            upkeep: Mutex::new(None),
            repair_schedule: Mutex::new(None),
            locks,
            holds: Mutex::new(None),
            listener: Mutex::new(None),
            running_workers: AtomicUsize::new(0),
            options,
            maintenance: Mutex::new(()),
            worker_locks: Mutex::new(Vec::new()),
            next_worker: AtomicU64::new(0),
            jobs: crate::jobs::Jobs::default(),
        };
        engine.bind()?;
        if engine.options.run_workers {
            engine.start_pool()?;
        }
        Ok(engine)
    }

    /// Binds the index to the embedder's model, recording a mismatch as not-ready.
    fn bind(&self) -> Result<()> {
        let (Ok(embedder), Some(index)) = (&self.embedder, &self.index) else {
            return Ok(());
        };
        let identity = embedder.identity();
        let err = match index.bind_model(identity) {
            Ok(()) => None,
            Err(e) if e.code() == ErrorCode::SchemaMismatch => {
                let bound = index
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

    /// How this engine runs its workers.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The source of truth (reads; writes should go through the engine so workers wake up).
    pub fn store(&self) -> &Source {
        &self.store
    }

    /// The vector index, when the vector consumer is configured and served here.
    pub fn index(&self) -> Option<&Arc<dyn VectorIndex>> {
        self.index.as_ref()
    }

    /// The embedded vector index, when it is the configured destination and open here.
    pub fn embedded_vector_index(&self) -> Option<&Arc<EmbeddedVectorIndex>> {
        self.embedded_vector.as_ref()
    }

    /// Commit notifications received from PostgreSQL by the running listener (0 on SQLite
    /// or while no workers run).
    pub fn notifications_received(&self) -> u64 {
        lock(&self.listener)
            .as_ref()
            .map_or(0, listen::Listener::received)
    }

    /// The keyword index, when its consumer is configured.
    pub fn keyword_index(&self) -> Option<&Arc<EmbeddedKeywordIndex>> {
        self.keyword.as_ref()
    }

    /// The relation index, when its consumer is configured.
    pub fn relation_index(&self) -> Option<&Arc<EmbeddedRelationIndex>> {
        self.relations.as_ref()
    }

    /// The embedder, or why it is not loaded.
    pub fn embedder(&self) -> std::result::Result<&Arc<CachedEmbedder>, &str> {
        self.embedder.as_ref().map_err(String::as_str)
    }

    /// The wake-up hint workers wait on.
    pub fn wakeup(&self) -> &Arc<Wakeup> {
        &self.wake
    }

    /// Whether the vector consumer can index and search, and if not why (an engine that does
    /// not serve it needs no model and is ready).
    pub fn readiness(&self) -> Readiness {
        let mut reasons = Vec::new();
        if let Err(e) = &self.embedder
            && self.index.is_some()
        {
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

    /// The code of the not-ready error: `schema_mismatch` when the model is loaded but the
    /// index holds another model's vectors, else `unavailable` (retryable: the model may
    /// appear).
    pub fn not_ready_code(&self) -> ErrorCode {
        if self.embedder.is_ok() {
            ErrorCode::SchemaMismatch
        } else {
            ErrorCode::Unavailable
        }
    }

    fn not_ready(&self) -> ServerError {
        ServerError::NotReady {
            reason: self.readiness().reasons.join("; "),
            code: self.not_ready_code(),
        }
    }

    fn ready_embedder(&self) -> Result<Arc<CachedEmbedder>> {
        match &self.embedder {
            Ok(e) => Ok(e.clone()),
            Err(_) if self.index.is_some() => Err(self.not_ready()),
            Err(reason) => Err(ServerError::NotReady {
                reason: reason.clone(),
                code: ErrorCode::Unavailable,
            }),
        }
    }

    /// Number of worker threads currently running.
    pub fn running_workers(&self) -> usize {
        self.running_workers.load(Ordering::SeqCst)
    }

    /// Whether `consumer` is configured in `index.outbox.consumers`.
    fn configured(&self, consumer: &str) -> bool {
        self.store.consumers().iter().any(|c| c == consumer)
    }

    /// The consumers this engine runs workers for (`options.consumers`, else all with an
    /// index) that are configured.
    fn served_consumers(&self) -> Vec<&'static str> {
        let only = &self.options.consumers;
        INDEXED_CONSUMERS
            .into_iter()
            .filter(|c| self.configured(c) && (only.is_empty() || only.iter().any(|o| o == c)))
            .collect()
    }

    /// The served consumers whose events this engine can apply now.
    fn ready_consumers(&self) -> Vec<&'static str> {
        self.served_consumers()
            .into_iter()
            .filter(|c| self.applier(c) == Applier::Ready)
            .collect()
    }

    /// `n` workers for `consumer`, which must be configured and ready, and owned by this
    /// data directory when its index is embedded ([`owner`]), each also reporting to
    /// `observer` when given. The first workers of a consumer take its worker lock, releasing
    /// the claims a crashed predecessor left.
    fn make_workers(
        &self,
        consumer: &str,
        n: usize,
        observer: Option<&Arc<dyn WorkerCallbacks>>,
    ) -> Result<Vec<Arc<IndexWorker>>> {
        if !self.configured(consumer) {
            return Err(not_listed(consumer));
        }
        owner::claim(&self.store, &self.config, &self.data_dir, consumer, false)?;
        {
            let mut held = lock(&self.worker_locks);
            if !held.iter().any(|(c, _)| c == consumer) {
                let taken = owner::worker_lock(&self.store, &self.data_dir, consumer)?;
                held.push((consumer.to_owned(), taken));
            }
        }
        let source: Arc<dyn SourceStore> = self.store.shared();
        let cfg = |k: u64| {
            let id = format!(
                "{}-{consumer}-{}-{k}",
                self.options.role,
                std::process::id()
            );
            WorkerConfig::from_config(&self.config, &id, consumer)
        };
        let next = || self.next_worker.fetch_add(1, Ordering::SeqCst);
        let observed = |w: IndexWorker| match observer {
            Some(o) => Arc::new(w.with_callback(o.clone())),
            None => Arc::new(w),
        };
        let (target, embedder): (Arc<dyn IndexTarget>, Option<Arc<dyn Embedder>>) = match consumer {
            VECTOR_CONSUMER => {
                if !self.readiness().ready {
                    return Err(self.not_ready());
                }
                let index = self.vector_or_unsupported()?.clone();
                (
                    Arc::new(VectorTarget(index)),
                    Some(failpoint::worker_embedder(self.ready_embedder()?)),
                )
            }
            KEYWORD_CONSUMER => {
                let index: Arc<dyn KeywordIndex> = self.keyword_or_unsupported()?.clone();
                (Arc::new(KeywordTarget(index)), None)
            }
            RELATION_CONSUMER => {
                let index: Arc<dyn RelationIndex> = self.relations_or_unsupported()?.clone();
                return (0..n.max(1))
                    .map(|_| {
                        let w =
                            IndexWorker::for_relations(cfg(next()), source.clone(), index.clone())?;
                        Ok(observed(w))
                    })
                    .collect();
            }
            other => {
                return Err(ServerError::UnsupportedConsumer {
                    name: other.into(),
                    reason: format!("this build has indexes for {INDEXED_CONSUMERS:?} only"),
                });
            }
        };
        (0..n.max(1))
            .map(|_| {
                let w = IndexWorker::for_target(
                    cfg(next()),
                    source.clone(),
                    target.clone(),
                    embedder.clone(),
                    IndexProjector::new(self.config.projector),
                )?;
                Ok(observed(w))
            })
            .collect()
    }

    /// Why `consumer`'s index is not open: not configured, or not served by this engine.
    fn no_index(&self, consumer: &str) -> ServerError {
        if self.configured(consumer) {
            ServerError::UnsupportedConsumer {
                name: consumer.into(),
                reason: format!(
                    "this process does not open its index: it serves {:?} only",
                    self.options.consumers
                ),
            }
        } else {
            not_listed(consumer)
        }
    }

    fn vector_or_unsupported(&self) -> Result<&Arc<dyn VectorIndex>> {
        self.index
            .as_ref()
            .ok_or_else(|| self.no_index(VECTOR_CONSUMER))
    }

    fn keyword_or_unsupported(&self) -> Result<&Arc<EmbeddedKeywordIndex>> {
        self.keyword
            .as_ref()
            .ok_or_else(|| self.no_index(KEYWORD_CONSUMER))
    }

    fn relations_or_unsupported(&self) -> Result<&Arc<EmbeddedRelationIndex>> {
        self.relations
            .as_ref()
            .ok_or_else(|| self.no_index(RELATION_CONSUMER))
    }

    /// Starts the continuous workers of every ready consumer if enabled (else logs why not).
    fn start_pool(&self) -> Result<()> {
        let mut pool = lock(&self.pool);
        if pool.is_some() || self.options.workers == 0 {
            return Ok(());
        }
        if !self.config.index.worker.enabled {
            info!("index.worker.enabled is false: no workers");
            return Ok(());
        }
        for c in self.served_consumers() {
            if let Applier::Blocked(why) = self.applier(c) {
                warn!(consumer = c, reason = %why, "consumer blocked: no workers for it");
            }
        }
        let consumers = self.ready_consumers();
        let mut workers = Vec::new();
        for c in &consumers {
            workers.extend(self.make_workers(c, self.options.workers, None)?);
        }
        if workers.is_empty() {
            return Ok(());
        }
        let n = workers.len();
        let poll = Duration::from_millis(self.config.index.worker.poll_interval_ms);
        *pool = Some(WorkerPool::start(workers, self.wake.clone(), poll));
        self.running_workers.store(n, Ordering::SeqCst);
        if let Some(embedded) = &self.embedded_vector
            && consumers.contains(&VECTOR_CONSUMER)
        {
            *lock(&self.upkeep) = Some(upkeep::start(
                embedded.clone(),
                upkeep::UpkeepPolicy::from_config(&self.config),
            ));
        }
        if let Some(pg) = self.store.postgres() {
            *lock(&self.listener) = Some(listen::Listener::start(pg.clone(), self.wake.clone()));
        }
        self.start_repair_schedule(&consumers);
        *lock(&self.pool_consumers) = consumers.iter().map(|c| (*c).to_owned()).collect();
        *lock(&self.holds) = Some(holds::start(
            self.store.shared(),
            // A hold adopted elsewhere is simply tried again on the next round.
            self.locks.with_wait(Duration::ZERO),
            consumers.iter().map(|c| (*c).to_owned()).collect(),
        ));
        info!(workers = n, consumers = ?consumers, "workers started");
        Ok(())
    }

    /// Stops the continuous workers; each finishes its batch first, so no claim is left.
    fn stop_pool(&self) {
        self.stop_repair_schedule();
        if let Some(u) = lock(&self.upkeep).take() {
            u.stop();
        }
        if let Some(h) = lock(&self.holds).take() {
            h.stop();
        }
        if let Some(l) = lock(&self.listener).take() {
            l.stop();
        }
        let pool = lock(&self.pool).take();
        if let Some(p) = pool {
            p.shutdown();
            self.running_workers.store(0, Ordering::SeqCst);
            lock(&self.pool_consumers).clear();
            info!("workers stopped");
        }
    }

    /// Stops the workers and writes the embedded vector index's snapshot (also done on
    /// drop).
    pub fn shutdown(&self) {
        self.stop_jobs();
        self.stop_pool();
        if let Some(embedded) = &self.embedded_vector
            && let Err(e) = embedded.flush()
        {
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

    /// The path locks of this engine's multi-step writes.
    pub fn locks(&self) -> &ce_lock::LockManager {
        &self.locks
    }

    fn guarded(&self) -> Guarded<'_> {
        Guarded {
            store: self.store.as_ref(),
            locks: &self.locks,
        }
    }

    /// `rm` under its path lock ([`Guarded::rm`]), then a wake-up.
    pub fn rm(
        &self,
        uri: &CtxUri,
        recursive: bool,
        expect_version: Option<u64>,
        trace_id: Option<String>,
    ) -> Result<WriteOutcome> {
        let r = self.guarded().rm(uri, recursive, expect_version, trace_id);
        // A refused rm of a missing node still queued its index cleanup.
        self.wake.notify();
        r
    }

    /// `mv` under its path locks ([`Guarded::mv`]), then a wake-up.
    pub fn mv(&self, from: &CtxUri, to: &CtxUri, trace_id: Option<String>) -> Result<WriteOutcome> {
        let r = self.guarded().mv(from, to, trace_id)?;
        self.wake.notify();
        Ok(r)
    }

    /// `import` under its lifecycle lock ([`Guarded::import`]), then a wake-up.
    pub fn import(
        &self,
        dir: &Path,
        into: &CtxUri,
        options: ImportOptions,
    ) -> Result<(ImportReport, Option<String>)> {
        let r = self.guarded().import(dir, into, options)?;
        self.wake.notify();
        Ok(r)
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

    /// Searches the indexes and hydrates the hits (see `ce-retrieval`). Without a mode the
    /// configured default runs (`retrieval.default_mode`; `auto`: hybrid when both the vector
    /// and keyword indexes serve, else the one that does). When the vector side is not ready,
    /// `auto` falls back to keyword search with a notice in the answer; a named mode that
    /// needs vectors gets the not-ready error. Keyword search works without the model.
    pub fn search(&self, req: &SearchRequest) -> Result<SearchResponse> {
        let readiness = self.readiness();
        let embedder = self.ready_embedder().ok().filter(|_| readiness.ready);
        let vector = embedder
            .as_deref()
            .filter(|_| self.configured(VECTOR_CONSUMER))
            .zip(self.index.as_deref())
            .map(|(e, index)| VectorSide {
                embedder: e as &dyn Embedder,
                index,
            });
        let why = readiness.reasons.join("; ");
        let retriever = Retriever {
            source: self.store.as_ref(),
            vector,
            keyword: self.keyword.as_deref().map(|k| k as &dyn KeywordIndex),
            fusion: Fusion::from_config(&self.config.retrieval),
            vector_unavailable: (vector.is_none() && self.configured(VECTOR_CONSUMER))
                .then_some(why.as_str()),
        };
        match retriever.search(req) {
            Err(RetrievalError::VectorUnavailable { .. }) => Err(self.not_ready()),
            r => Ok(r?),
        }
    }

    /// Hierarchical search (see `ce_retrieval::hierarchical_search`); needs the vector side.
    pub fn hierarchical(&self, req: &HierarchicalRequest) -> Result<HierarchicalResponse> {
        if !self.readiness().ready {
            return Err(self.not_ready());
        }
        let embedder = self.ready_embedder()?;
        Ok(ce_retrieval::hierarchical_search(
            self.store.as_ref(),
            embedder.as_ref(),
            self.vector_or_unsupported()?.as_ref(),
            req,
        )?)
    }

    /// The edges of a node from the relation index, each checked against the source of
    /// truth (see `ce_retrieval::related`).
    pub fn related(&self, req: &RelatedRequest) -> Result<RelatedResponse> {
        let index = self.relations_or_unsupported()?;
        Ok(ce_retrieval::related(
            self.store.as_ref(),
            index.as_ref(),
            req,
        )?)
    }

    /// Whether `consumer`'s events can be applied by this build and configuration.
    fn applier(&self, consumer: &str) -> Applier {
        if self.has_index(consumer) && self.in_dry_run_mode(consumer) {
            return Applier::DryRun(self.last_dry_run(consumer));
        }
        let ready = match consumer {
            VECTOR_CONSUMER if self.index.is_some() => {
                let readiness = self.readiness();
                if readiness.ready {
                    Ok(())
                } else {
                    Err(readiness.reasons.join("; "))
                }
            }
            KEYWORD_CONSUMER if self.keyword.is_some() => Ok(()),
            RELATION_CONSUMER if self.relations.is_some() => Ok(()),
            c if INDEXED_CONSUMERS.contains(&c) && self.configured(c) => {
                Err(self.no_index(c).to_string())
            }
            _ => Err(format!(
                "no index for consumer {consumer:?} in this build yet: its events wait in the journal"
            )),
        };
        if let Err(why) = ready {
            return Applier::Blocked(why);
        }
        if !self.config.index.worker.enabled {
            return Applier::NotRequested("index.worker.enabled is false".into());
        }
        Applier::Ready
    }

    fn has_index(&self, consumer: &str) -> bool {
        match consumer {
            VECTOR_CONSUMER => self.index.is_some(),
            KEYWORD_CONSUMER => self.keyword.is_some(),
            RELATION_CONSUMER => self.relations.is_some(),
            _ => false,
        }
    }

    fn in_dry_run_mode(&self, consumer: &str) -> bool {
        self.config
            .index
            .worker
            .dry_run_consumers
            .iter()
            .any(|c| c == consumer)
    }

    fn dry_run_path(&self, consumer: &str) -> PathBuf {
        self.data_dir
            .join(DRY_RUN_DIR)
            .join(format!("{consumer}.json"))
    }

    /// The last dry run of `consumer` recorded in the data directory, if readable.
    fn last_dry_run(&self, consumer: &str) -> Option<DryRunReport> {
        let text = std::fs::read(self.dry_run_path(consumer)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Computes the delta `consumer`'s first `limit` open events would apply to its index,
    /// without claiming, embedding, writing or acknowledging anything (see
    /// `ce_index::worker::dry_run`); works while the model is missing. The report is recorded
    /// in the data directory: in dry-run mode (`index.worker.dry_run_consumers`) status
    /// reports `dry_run_valid` from it.
    pub fn dry_run(&self, consumer: &str, limit: usize) -> Result<DryRunReport> {
        if !self.configured(consumer) || !self.has_index(consumer) {
            return Err(ServerError::UnsupportedConsumer {
                name: consumer.into(),
                reason: format!(
                    "it must be listed in index.outbox.consumers and be one of {INDEXED_CONSUMERS:?}"
                ),
            });
        }
        let target: Arc<dyn IndexTarget> = match consumer {
            VECTOR_CONSUMER => Arc::new(VectorTarget(self.vector_or_unsupported()?.clone())),
            KEYWORD_CONSUMER => Arc::new(KeywordTarget(self.keyword_or_unsupported()?.clone())),
            _ => {
                return Err(ServerError::UnsupportedConsumer {
                    name: consumer.into(),
                    reason: format!("dry runs cover the consumers {DRY_RUN_CONSUMERS:?}"),
                });
            }
        };
        let cfg = WorkerConfig::from_config(&self.config, "dry-run", consumer);
        let report = ce_index::worker::dry_run::dry_run(
            &cfg,
            self.store.as_ref(),
            target.as_ref(),
            &IndexProjector::new(self.config.projector),
            limit,
        )
        .map_err(|e| ServerError::failed(format!("dry run of {consumer}"), &e))?;
        let path = self.dry_run_path(consumer);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().unwrap_or(&self.data_dir))?;
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&report)?)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            warn!(error = %e, path = %path.display(), "dry-run report not recorded");
        }
        info!(
            consumer,
            events = report.events,
            valid = report.valid,
            "dry run"
        );
        Ok(report)
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
            store_backend: self.store.backend().to_owned(),
            store_location: self.store.location(),
            vector_destination: self.config.index.vector.destination.clone(),
            model: self.embedder.as_ref().ok().map(|e| e.identity().clone()),
            index_model: self
                .index
                .as_ref()
                .map(|i| i.model())
                .transpose()?
                .flatten(),
            index_records: self
                .index
                .as_ref()
                .map(|i| i.count())
                .transpose()?
                .unwrap_or(0),
            keyword_records: self.keyword.as_ref().map(|k| k.count()).transpose()?,
            relation_records: self.relations.as_ref().map(|r| r.count()).transpose()?,
            consumers,
            workers: self.running_workers(),
            worker_consumers: lock(&self.pool_consumers).clone(),
            embed_cache: self.embed_cache_status(),
            holds: self
                .store
                .holds()?
                .into_iter()
                .map(|h| HoldStatus {
                    age_seconds: u64::try_from((now - h.created_at_ms) / 1000).unwrap_or(0),
                    id: h.id,
                    at: h.at.to_string(),
                    through_seq: h.through_seq,
                })
                .collect(),
            jobs: self.jobs_status()?,
        })
    }

    /// Makes this data directory the owner of `consumer` when its index is embedded, whoever
    /// owned it before (see [`owner`]); follow with [`Engine::reindex`]: the index here lacks
    /// what the previous owner applied. Stop the previous owner's processes first.
    pub fn take_over(&self, consumer: &str) -> Result<()> {
        if !self.configured(consumer) {
            return Err(not_listed(consumer));
        }
        owner::claim(&self.store, &self.config, &self.data_dir, consumer, true)
    }

    /// The embedding cache's totals, and this process's counters when it runs workers.
    fn embed_cache_status(&self) -> Option<EmbedCacheStatus> {
        let embedder = self.embedder.as_ref().ok()?;
        let totals = embedder.totals().unwrap_or_else(|e| {
            warn!(error = %e, "embedding cache totals not read");
            ce_embed::CacheTotals::default()
        });
        Some(EmbedCacheStatus {
            entries: totals.model_entries,
            all_entries: totals.entries,
            bytes: totals.file_bytes,
            counters: self.options.run_workers.then(|| embedder.stats().into()),
        })
    }

    /// Rebuilds `consumer`'s index from the source of truth: stops the workers, appends one
    /// `UPSERT_CONTEXT` (reason `repair`) per node with text — delivered to `consumer` only,
    /// the other indexes are left alone — clears the index (and binds the vector index to the
    /// configured model), then restarts the workers. The repair events come first, so a crash
    /// at any point leaves either the old index or work that a rerun completes. Re-embedding
    /// is cheap: unchanged texts come from the embedding cache.
    pub fn reindex(&self, consumer: &str) -> Result<ReindexReport> {
        if !INDEXED_CONSUMERS.contains(&consumer) {
            return Err(ServerError::UnsupportedConsumer {
                name: consumer.into(),
                reason: format!("this build has indexes for {INDEXED_CONSUMERS:?} only"),
            });
        }
        if !self.configured(consumer) {
            return Err(ServerError::UnsupportedConsumer {
                name: consumer.into(),
                reason: "it is not listed in index.outbox.consumers".into(),
            });
        }
        let model = match consumer {
            VECTOR_CONSUMER => Some(self.ready_embedder()?.identity().clone()),
            _ => None,
        };
        // Rebuilding an index that another instance owns would feed the wrong index.
        owner::claim(&self.store, &self.config, &self.data_dir, consumer, false)?;
        let _maintenance = lock(&self.maintenance);
        let started = Instant::now();
        self.stop_pool();
        let result = self.requeue_and_clear(consumer, model.as_ref());
        // Workers come back even if the rebuild failed half-way (a rerun finishes it).
        if let Err(e) = self.bind() {
            warn!(error = %e, "rebinding the vector index failed");
        }
        if self.options.run_workers {
            self.start_pool()?;
        }
        self.wake.notify();
        let (requeued, cleared) = result?;
        metrics::counter!("index_repair_requeued_total", "consumer" => consumer.to_owned())
            .increment(requeued);
        info!(consumer, requeued, cleared, "reindex queued");
        Ok(ReindexReport {
            consumer: consumer.into(),
            cleared_records: cleared,
            requeued,
            model,
            took_ms: ms(started.elapsed()),
        })
    }

    fn requeue_and_clear(
        &self,
        consumer: &str,
        model: Option<&ModelIdentity>,
    ) -> Result<(u64, u64)> {
        let trace_id = format!("reindex-{}", uuid::Uuid::now_v7());
        let only = [consumer.to_owned()];
        let mut requeued = 0u64;
        for account in self.store.ls(&CtxUri::root())? {
            let mut batch = Vec::new();
            for n in self.store.tree(&account.uri, None)? {
                let payload = if consumer == RELATION_CONSUMER {
                    // Only nodes whose edges ever changed can own edges.
                    if n.relation_version == 0 {
                        continue;
                    }
                    EventPayload::UpsertRelation(UpsertRelationPayload {
                        event_version: EVENT_VERSION,
                        uri: n.uri,
                        relation_version: n.relation_version,
                        mode: RelationMode::Replace,
                        trace_id: trace_id.clone(),
                    })
                } else {
                    if n.layer_bytes.iter().all(|&b| b == 0) {
                        continue;
                    }
                    EventPayload::UpsertContext(UpsertContextPayload {
                        event_version: EVENT_VERSION,
                        uri: n.uri,
                        expected_node_version: n.version,
                        reason: UpsertReason::Repair,
                        trace_id: trace_id.clone(),
                    })
                };
                batch.push(OutboxEventCreate { payload });
                if batch.len() >= REQUEUE_CHUNK {
                    requeued += self
                        .store
                        .append_batch_for(&only, std::mem::take(&mut batch))?
                        .len() as u64;
                }
            }
            if !batch.is_empty() {
                requeued += self.store.append_batch_for(&only, batch)?.len() as u64;
            }
        }
        let cleared = match consumer {
            VECTOR_CONSUMER => {
                let index = self.vector_or_unsupported()?;
                let cleared = index.count()?;
                index.clear()?;
                if let Some(m) = model {
                    index.bind_model(m)?;
                }
                cleared
            }
            KEYWORD_CONSUMER => {
                let k = self.keyword_or_unsupported()?;
                let cleared = k.count()?;
                k.clear()?;
                cleared
            }
            _ => {
                let r = self.relations_or_unsupported()?;
                let cleared = r.count()?;
                r.clear()?;
                cleared
            }
        };
        Ok((requeued, cleared))
    }

    /// Runs `options.workers` workers per ready consumer until each of those consumers has
    /// nothing pending or claimed (claims of a crashed worker are waited for until their lease
    /// expires); deliveries waiting to retry are left for later. The report lists every
    /// served consumer afterwards (`options.consumers`), blocked ones included (a blocked
    /// consumer never holds the others back). `progress` is called after every batch. With no
    /// consumer ready the error says why (e.g. the model is not loaded).
    pub fn drain(&self, progress: &(dyn Fn(&DrainProgress) + Sync)) -> Result<DrainReport> {
        let _maintenance = lock(&self.maintenance);
        if lock(&self.pool).is_some() {
            return Err(ServerError::Internal(
                "drain needs the workers: this engine runs them continuously".into(),
            ));
        }
        let consumers = self.ready_consumers();
        if consumers.is_empty() {
            return Err(self.not_ready());
        }
        let totals = DrainTotals::default();
        let observer: Arc<dyn WorkerCallbacks> = totals.events.clone();
        let mut workers = Vec::new();
        for c in &consumers {
            workers.extend(self.make_workers(c, self.options.workers, Some(&observer))?);
        }
        let started = Instant::now();
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
        // The holds whose writes these consumers have now applied end here too (a one-shot
        // `ce worker --once` after a `ce import` frees the subtree without a server).
        let consumers: Vec<String> = consumers.iter().map(|c| (*c).to_owned()).collect();
        holds::end_applied(
            self.store.as_ref(),
            &self.locks.with_wait(Duration::ZERO),
            &consumers,
        );
        let now = self.store.clock().now_ms();
        let served = self.served_consumers();
        let remaining = self
            .store
            .stats()?
            .into_iter()
            .filter(|s| served.contains(&s.consumer.as_str()))
            .map(|s| {
                let applier = self.applier(&s.consumer);
                ConsumerStatus::new(s, now, &applier)
            })
            .collect();
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
                        return Err(ServerError::failed(
                            format!("the worker gave up after {errors} failed claims"),
                            &e,
                        ));
                    }
                }
            }
            let stats = self.store.stats()?;
            let open = stats
                .iter()
                .find(|s| s.consumer == w.config().consumer)
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

/// Opens the vector index `index.vector.destination` names; the embedded one is also
/// returned as such (its upkeep runs here).
#[allow(
    clippy::type_complexity,
    reason = "a private pair: the index, and the same index when embedded"
)]
fn open_vector_index(
    data_dir: &Path,
    config: &Config,
) -> Result<(
    Option<Arc<dyn VectorIndex>>,
    Option<Arc<EmbeddedVectorIndex>>,
)> {
    if let Some(url) = config.pgvector_url() {
        // Shared by every process: no lock on the data directory is taken.
        let index: Arc<dyn VectorIndex> = open_pgvector(url)?;
        return Ok((Some(index), None));
    }
    let embedded = Arc::new(
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
    let index: Arc<dyn VectorIndex> = embedded.clone();
    Ok((Some(index), Some(embedded)))
}

/// The pgvector index at `url` (`index.vector.destination = "pgvector"`).
fn open_pgvector(url: &str) -> Result<Arc<dyn VectorIndex>> {
    Ok(Arc::new(PgVectorIndex::open(url)?))
}

/// The error for a consumer missing from `index.outbox.consumers`.
fn not_listed(consumer: &str) -> ServerError {
    ServerError::UnsupportedConsumer {
        name: consumer.into(),
        reason: "it is not listed in index.outbox.consumers".into(),
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_jobs();
        self.stop_pool();
    }
}

/// The distinct events whose deliveries a drain claimed (an event has one delivery per
/// consumer, so `claimed` alone counts each event once per consumer).
#[derive(Default)]
struct EventTally(Mutex<HashSet<i64>>);

impl WorkerCallbacks for EventTally {
    fn on_event_start(&self, event: &OutboxEvent) -> std::result::Result<(), String> {
        lock(&self.0).insert(event.seq);
        Ok(())
    }
}

/// Counters shared by the draining threads.
#[derive(Default)]
struct DrainTotals {
    events: Arc<EventTally>,
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
            events: lock(&self.events.0).len() as u64,
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
