//! The engine: one data directory's source of truth, embedder, indexes and workers, wired
//! together.
//!
//! ```text
//! writes ─► Source: SQLite or PostgreSQL (+ outbox, same transaction) ─► Wakeup::notify
//!                                   │        (PostgreSQL: NOTIFY ► listener ► Wakeup::notify)
//!          WorkerPool: IndexWorker × N per consumer (one slot of the consumer registry each)
//!                    ▼                                   ▼
//!   CachedEmbedder ─► vector index                EmbeddedKeywordIndex
//!                     (embedded or pgvector)
//!                    └──────── search (ce-retrieval) ────┘
//! ```
//!
//! The source of truth is `store.url` ([`Source`]). Every consumer this build can apply is
//! registered once in [`consumers`]: an engine opens the index of each registered consumer
//! that is configured (`index.outbox.consumers`) and served here
//! ([`EngineOptions::consumers`]), and loads the embedder only when one of those embeds.
//!
//! Each configured consumer progresses on its own: a consumer whose input is missing is
//! blocked without blocking the others. The vector consumer is ready when the embedding
//! model is loaded and the vector index is bound to it; a missing model or an index built
//! with another model keeps the engine up but not ready (no vector workers, no vector
//! search), with the reason and the fix in [`Engine::readiness`]; node reads and writes,
//! keyword indexing and keyword search still work.
//!
//! One file per job: wiring and lifecycle here; [`consumers`] (the registry), `pool`
//! (continuous workers and what runs beside them), `drain` (workers on demand), `write`
//! (the write façade), `search` (the search policy), `status` (appliers and reports),
//! `reindex` (rebuilds and dry runs), [`repair`] (dead deliveries and reconcile).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ce_core::{Config, ErrorCode};
use ce_embed::CachedEmbedder;
use ce_index::keyword::embedded::EmbeddedKeywordIndex;
use ce_index::relation::embedded::EmbeddedRelationIndex;
use ce_index::vector::VectorIndex;
use ce_index::vector::embedded::EmbeddedVectorIndex;
use ce_index::worker::runner::Wakeup;
use tracing::{info, warn};

use crate::error::{Result, ServerError};
use crate::source::Source;
use consumers::{Consumer, Consumers, KeywordConsumer, Opening, RelationConsumer, VectorConsumer};

pub mod consumers;
mod drain;
mod failpoint;
pub mod holds;
pub mod journal;
pub mod listen;
pub mod owner;
pub(crate) mod periodic;
mod pool;
mod reindex;
pub mod repair;
mod search;
mod status;
pub mod upkeep;
mod write;

/// Where dry-run reports are recorded, inside the data directory.
pub const DRY_RUN_DIR: &str = "dry-run";
/// Worker threads per consumer when not configured.
pub const DEFAULT_WORKERS: usize = 2;
/// Repair events appended per outbox transaction by [`Engine::reindex`].
const REQUEUE_CHUNK: usize = 1000;

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
    /// The open consumers: the registered ones configured and served here.
    consumers: Consumers,
    /// The configured consumers whose embedded index another process holds (an observing
    /// engine only, [`Engine::observe`]).
    held: Vec<consumers::Held>,
    wake: Arc<Wakeup>,
    /// The continuous workers and what runs beside them, while they run ([`pool`]).
    pool: Mutex<Option<pool::Running>>,
    /// The scheduled repair jobs, while workers run (`index.repair.enabled`).
    repair_schedule: Mutex<Option<periodic::Periodic>>,
    /// Path locks of rm / mv / import (docs/locks.md).
    locks: ce_lock::LockManager,
    running_workers: AtomicUsize,
    options: EngineOptions,
    /// Serializes reindex and drain (both take the workers over).
    maintenance: Mutex<()>,
    /// The worker locks of the consumers this engine has run workers for ([`owner`]).
    worker_locks: Mutex<Vec<(String, owner::WorkerLock)>>,
    next_worker: AtomicU64,
    /// The job registry, and the job runner while it runs ([`crate::jobs`]).
    pub(crate) jobs: crate::jobs::Jobs,
    /// The ingestion workflow's state ([`crate::kb`]).
    pub(crate) kb: crate::kb::KbRuntime,
    /// Recent lag samples of `ce serve` ([`crate::lag_history`]).
    lag_history: crate::lag_history::LagHistory,
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

impl Engine {
    /// Opens the engine of `data_dir` with default options: two workers running.
    pub fn open(data_dir: &Path, config: Config) -> Result<Engine> {
        Self::open_with(data_dir, config, EngineOptions::default())
    }

    /// Opens the store (`store.url`), then the index of every registered consumer that is
    /// configured and served here, loads the embedder when one of them embeds and binds the
    /// indexes to its model, and starts the workers of every ready consumer when
    /// `options.run_workers` (and `index.worker.enabled`). A missing model or a model
    /// mismatch is not an error here: see [`Engine::readiness`].
    pub fn open_with(data_dir: &Path, config: Config, options: EngineOptions) -> Result<Engine> {
        Self::open_inner(data_dir, config, options, false)
    }

    /// Opens an engine that reads and reports (`ce status`, `ce kb ls|show|status`, and
    /// following knowledge-base work another process does): like [`Engine::open_with`]
    /// without running workers, except that an embedded index another process holds
    /// (`ce worker`, `ce serve`) is left to it and reported from its files, not an error.
    pub fn observe(data_dir: &Path, config: Config, options: EngineOptions) -> Result<Engine> {
        let options = EngineOptions {
            run_workers: false,
            ..options
        };
        Self::open_inner(data_dir, config, options, true)
    }

    fn open_inner(
        data_dir: &Path,
        config: Config,
        options: EngineOptions,
        observer: bool,
    ) -> Result<Engine> {
        let store = Source::open(data_dir, &config)?;
        let locks = ce_lock::LockManager::from_config(&config.lock, data_dir)?;
        let wants = |c: &str| {
            config.index.outbox.consumers.iter().any(|x| x == c)
                && (options.consumers.is_empty() || options.consumers.iter().any(|x| x == c))
        };
        // Only consumers that embed need a model: without them no provider is opened.
        let embedder = if consumers::REGISTRY
            .iter()
            .any(|r| r.needs_embedder && wants(r.name))
        {
            ce_embed::build_cached(&config.index.embedding, data_dir).map_err(|e| {
                warn!(error = %e, "embedding model not loaded");
                e.to_string()
            })
        } else {
            Err("no embedder: no consumer that embeds is configured and served here".to_owned())
        };
        let opening = Opening {
            data_dir,
            config: &config,
            observer,
        };
        let (consumers, held) = Consumers::open(&opening, wants)?;
        for h in &held {
            info!(consumer = h.name, reason = %h.reason, "index held by another process: reported, not opened");
        }
        let engine = Engine {
            data_dir: data_dir.to_owned(),
            config,
            store,
            embedder,
            consumers,
            held,
            wake: Wakeup::new(),
            pool: Mutex::new(None),
            repair_schedule: Mutex::new(None),
            locks,
            running_workers: AtomicUsize::new(0),
            options,
            maintenance: Mutex::new(()),
            worker_locks: Mutex::new(Vec::new()),
            next_worker: AtomicU64::new(0),
            jobs: crate::jobs::Jobs::default(),
            kb: crate::kb::KbRuntime::default(),
            lag_history: crate::lag_history::LagHistory::default(),
        };
        engine.bind()?;
        if !observer {
            engine.queue_rebuilds();
        }
        if engine.options.run_workers {
            engine.start_pool()?;
        }
        Ok(engine)
    }

    /// Binds every open index to the embedder's model, recording a mismatch as not-ready.
    fn bind(&self) -> Result<()> {
        let embedder = self.embedder.as_deref().ok();
        self.consumers.iter().try_for_each(|c| c.bind(embedder))
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
        self.consumers
            .get::<VectorConsumer>()
            .map(VectorConsumer::index)
    }

    /// The embedded vector index, when it is the configured destination and open here.
    pub fn embedded_vector_index(&self) -> Option<&Arc<EmbeddedVectorIndex>> {
        self.consumers
            .get::<VectorConsumer>()
            .and_then(VectorConsumer::embedded)
    }

    /// The keyword index, when its consumer is configured.
    pub fn keyword_index(&self) -> Option<&Arc<EmbeddedKeywordIndex>> {
        self.consumers
            .get::<KeywordConsumer>()
            .map(KeywordConsumer::index)
    }

    /// The relation index, when its consumer is configured.
    pub fn relation_index(&self) -> Option<&Arc<EmbeddedRelationIndex>> {
        self.consumers
            .get::<RelationConsumer>()
            .map(RelationConsumer::index)
    }

    /// The embedder, or why it is not loaded.
    pub fn embedder(&self) -> std::result::Result<&Arc<CachedEmbedder>, &str> {
        self.embedder.as_ref().map_err(String::as_str)
    }

    /// The wake-up hint workers wait on.
    pub fn wakeup(&self) -> &Arc<Wakeup> {
        &self.wake
    }

    /// Whether every open consumer can apply its events and serve searches, and if not why
    /// (an engine that serves no consumer that embeds needs no model and is ready).
    pub fn readiness(&self) -> Readiness {
        let reasons: Vec<String> = self
            .consumers
            .iter()
            .flat_map(|c| self.blockers(c.as_ref()))
            .collect();
        Readiness {
            ready: reasons.is_empty(),
            reasons,
        }
    }

    /// What keeps `consumer`'s events from being applied here (empty: nothing).
    fn blockers(&self, consumer: &dyn Consumer) -> Vec<String> {
        consumer.blockers(self.embedder.as_deref().map_err(String::as_str))
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
            Err(_) if self.consumers.need_embedder() => Err(self.not_ready()),
            Err(reason) => Err(ServerError::NotReady {
                reason: reason.clone(),
                code: ErrorCode::Unavailable,
            }),
        }
    }

    /// Whether `consumer` is configured in `index.outbox.consumers`.
    fn configured(&self, consumer: &str) -> bool {
        self.store.consumers().iter().any(|c| c == consumer)
    }

    /// The open consumer `consumer`, or why its index is not open here: unknown to this
    /// build, not configured, or not served by this engine.
    fn consumer(&self, consumer: &str) -> Result<&Arc<dyn Consumer>> {
        self.consumers.find(consumer).ok_or_else(|| {
            if consumers::registration(consumer).is_none() {
                consumers::unknown(consumer)
            } else {
                self.no_index(consumer)
            }
        })
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

    /// Stops the workers and writes what the indexes keep in memory, e.g. the embedded
    /// vector index's snapshot (also done on drop).
    pub fn shutdown(&self) {
        self.stop_jobs();
        self.stop_pool();
        for c in self.consumers.iter() {
            c.flush();
        }
    }
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

#[cfg(test)]
mod tests;
