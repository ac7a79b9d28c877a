//! The vector consumer: embeds each node's L0/L1/L2 and writes the vectors to the index
//! `index.vector.destination` names — `embedded` (in the data directory, owned by one index
//! instance, with snapshots and graph rebuilds run here) or `pgvector` (shared by every
//! process). It is ready when the embedding model is loaded and the index is bound to it.

use std::sync::{Arc, Mutex};

use ce_core::config::VECTOR_CONSUMER;
use ce_core::{Classify as _, Config, ErrorCode, EventPayload, IndexProjector};
use ce_embed::{CachedEmbedder, Embedder, ModelIdentity};
use ce_index::IndexError;
use ce_index::repair::IndexView;
use ce_index::vector::VectorIndex;
use ce_index::vector::embedded::EmbeddedVectorIndex;
use ce_index::vector::pgvector::PgVectorIndex;
use ce_index::worker::target::{IndexTarget, VectorTarget};
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::{NodeStat, SourceStore};
use tracing::warn;

use super::{Consumer, Opening, Registration, context_repair, target_worker};
use crate::engine::periodic::Periodic;
use crate::engine::{lock, upkeep};
use crate::error::{Result, ServerError};
use crate::status::Status;

/// The vector index's directory inside the data directory.
pub const VECTOR_DIR: &str = "vector";

pub(super) const REGISTRATION: Registration = Registration {
    name: VECTOR_CONSUMER,
    needs_embedder: true,
    embedded: |config| config.pgvector_url().is_none(),
    open: |o| Ok(Arc::new(VectorConsumer::open(o)?)),
};

/// The open vector index.
pub struct VectorConsumer {
    index: Arc<dyn VectorIndex>,
    /// The same index when it is the embedded one: its upkeep is this process's job.
    embedded: Option<Arc<EmbeddedVectorIndex>>,
    /// `None` when the index is bound to the embedder's model, else why not.
    binding_error: Mutex<Option<String>>,
}

impl VectorConsumer {
    /// Its name in `index.outbox.consumers`.
    pub const NAME: &'static str = REGISTRATION.name;

    fn open(o: &Opening<'_>) -> Result<VectorConsumer> {
        let (index, embedded): (Arc<dyn VectorIndex>, _) = match o.config.pgvector_url() {
            // Shared by every process: no lock on the data directory is taken.
            Some(url) => (Arc::new(PgVectorIndex::open(url)?), None),
            None => {
                let embedded = Arc::new(
                    EmbeddedVectorIndex::open(&o.data_dir.join(VECTOR_DIR)).map_err(|e| {
                        match e.code() {
                            // An observer reports a held index instead of failing.
                            _ if o.observer && matches!(e, IndexError::Held(_)) => {
                                ServerError::Index(e)
                            }
                            ErrorCode::Unavailable => ServerError::NotReady {
                                reason: format!(
                                    "{e} (is `ce serve` or `ce worker` running on this data directory? send commands to `ce serve` with --server URL, or stop the worker)"
                                ),
                                code: ErrorCode::Unavailable,
                            },
                            _ => ServerError::Index(e),
                        }
                    })?,
                );
                (embedded.clone(), Some(embedded))
            }
        };
        Ok(VectorConsumer {
            index,
            embedded,
            binding_error: Mutex::new(None),
        })
    }

    /// The index.
    pub fn index(&self) -> &Arc<dyn VectorIndex> {
        &self.index
    }

    /// Fills its part of `status` when another process holds the embedded index in
    /// `data_dir`, from the index's files.
    pub fn report_held(data_dir: &std::path::Path, status: &mut Status) -> Result<()> {
        if let Some(p) = EmbeddedVectorIndex::peek(&data_dir.join(VECTOR_DIR))? {
            status.index_model = p.model;
            status.index_records = p.records;
        }
        Ok(())
    }

    /// The index when it is the embedded one.
    pub fn embedded(&self) -> Option<&Arc<EmbeddedVectorIndex>> {
        self.embedded.as_ref()
    }
}

impl Consumer for VectorConsumer {
    fn registration(&self) -> &'static Registration {
        &REGISTRATION
    }

    fn worker(
        &self,
        cfg: WorkerConfig,
        source: Arc<dyn SourceStore>,
        embedder: Option<Arc<dyn Embedder>>,
        projector: IndexProjector,
    ) -> Result<IndexWorker> {
        let target = Arc::new(VectorTarget(self.index.clone()));
        target_worker(target, cfg, source, embedder, projector)
    }

    fn dry_run_target(&self) -> Option<Arc<dyn IndexTarget>> {
        Some(Arc::new(VectorTarget(self.index.clone())))
    }

    fn repair_event(&self, node: NodeStat, trace_id: &str) -> Option<EventPayload> {
        context_repair(node, trace_id)
    }

    fn clear(&self, model: Option<&ModelIdentity>) -> Result<u64> {
        let cleared = self.index.count()?;
        self.index.clear()?;
        if let Some(m) = model {
            self.index.bind_model(m)?;
        }
        Ok(cleared)
    }

    fn view<'a>(&'a self, model: Option<&'a ModelIdentity>) -> Option<IndexView<'a>> {
        Some(IndexView::Vector {
            index: self.index.as_ref(),
            model,
        })
    }

    fn report(&self, status: &mut Status) -> Result<()> {
        status.index_model = self.index.model()?;
        status.index_records = self.index.count()?;
        Ok(())
    }

    fn bind(&self, embedder: Option<&CachedEmbedder>) -> Result<()> {
        let Some(embedder) = embedder else {
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
                    "the vector index was built with {bound} but the configured model is {identity}: run `ce reindex --consumer {VECTOR_CONSUMER}` to rebuild it"
                );
                warn!(%reason, "vector index not bound");
                Some(reason)
            }
            Err(e) => return Err(e.into()),
        };
        *lock(&self.binding_error) = err;
        Ok(())
    }

    fn blockers(&self, embedder: std::result::Result<&CachedEmbedder, &str>) -> Vec<String> {
        let mut reasons = Vec::new();
        if let Err(e) = embedder {
            reasons.push(format!("embedding model not loaded: {e}"));
        }
        reasons.extend(lock(&self.binding_error).clone());
        reasons
    }

    fn start_upkeep(&self, config: &Config) -> Option<Periodic> {
        let embedded = self.embedded.as_ref()?;
        Some(upkeep::start(
            embedded.clone(),
            upkeep::UpkeepPolicy::from_config(config),
        ))
    }

    fn flush(&self) {
        if let Some(embedded) = &self.embedded
            // The graph as it is, a running insertion stopped: fresh vectors are read back
            // from the database at the next start, so a short-lived `ce` command does not wait
            // for graph insertion (not even for a first build of the whole graph).
            && let Err(e) = embedded.close_graph()
        {
            warn!(error = %e, "vector index snapshot not written (the next start rebuilds it)");
        }
    }
}
