//! The relation consumer: each node's typed edges, in the embedded relation index of the
//! data directory (owned by one index instance). Its workers apply `UPSERT_RELATION`
//! events with the relation store as input; it has no dry run yet.

use std::sync::Arc;

use ce_core::config::RELATION_CONSUMER;
use ce_core::{EVENT_VERSION, EventPayload, IndexProjector, RelationMode, UpsertRelationPayload};
use ce_embed::{Embedder, ModelIdentity};
use ce_index::relation::RelationIndex as _;
use ce_index::relation::embedded::EmbeddedRelationIndex;
use ce_index::repair::IndexView;
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::{NodeStat, SourceStore};

use super::{Consumer, Opening, Registration};
use crate::error::Result;
use crate::status::Status;

/// The relation index's directory inside the data directory.
pub const RELATION_DIR: &str = "relation";

pub(super) const REGISTRATION: Registration = Registration {
    name: RELATION_CONSUMER,
    needs_embedder: false,
    embedded: |_| true,
    open: |o: &Opening<'_>| {
        let index = EmbeddedRelationIndex::open(&o.data_dir.join(RELATION_DIR))?;
        Ok(Arc::new(RelationConsumer(Arc::new(index))))
    },
};

/// The open relation index.
pub struct RelationConsumer(Arc<EmbeddedRelationIndex>);

impl RelationConsumer {
    /// Its name in `index.outbox.consumers`.
    pub const NAME: &'static str = REGISTRATION.name;

    /// The index.
    pub fn index(&self) -> &Arc<EmbeddedRelationIndex> {
        &self.0
    }
}

impl Consumer for RelationConsumer {
    fn registration(&self) -> &'static Registration {
        &REGISTRATION
    }

    fn worker(
        &self,
        cfg: WorkerConfig,
        source: Arc<dyn SourceStore>,
        _embedder: Option<Arc<dyn Embedder>>,
        _projector: IndexProjector,
    ) -> Result<IndexWorker> {
        Ok(IndexWorker::for_relations(cfg, source, self.0.clone())?)
    }

    fn repair_event(&self, node: NodeStat, trace_id: &str) -> Option<EventPayload> {
        // Only nodes whose edges ever changed can own edges.
        (node.relation_version != 0).then(|| {
            EventPayload::UpsertRelation(UpsertRelationPayload {
                event_version: EVENT_VERSION,
                uri: node.uri,
                relation_version: node.relation_version,
                mode: RelationMode::Replace,
                trace_id: trace_id.to_owned(),
            })
        })
    }

    fn clear(&self, _model: Option<&ModelIdentity>) -> Result<u64> {
        let cleared = self.0.count()?;
        self.0.clear()?;
        Ok(cleared)
    }

    fn view<'a>(&'a self, _model: Option<&'a ModelIdentity>) -> Option<IndexView<'a>> {
        Some(IndexView::Relations(self.0.as_ref()))
    }

    fn report(&self, status: &mut Status) -> Result<()> {
        status.relation_records = Some(self.0.count()?);
        Ok(())
    }
}
