//! The keyword consumer: BM25 over each node's text, in the embedded keyword index of the
//! data directory (owned by one index instance). It needs no model, so it is ready as soon
//! as its index opens.

use std::sync::Arc;

use ce_core::config::KEYWORD_CONSUMER;
use ce_core::{EventPayload, IndexProjector};
use ce_embed::{Embedder, ModelIdentity};
use ce_index::keyword::KeywordIndex;
use ce_index::keyword::embedded::EmbeddedKeywordIndex;
use ce_index::repair::IndexView;
use ce_index::worker::target::{IndexTarget, KeywordTarget};
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::{NodeStat, SourceStore};

use super::{Consumer, Opening, Registration, context_repair, target_worker};
use crate::error::Result;
use crate::status::Status;

/// The keyword index's directory inside the data directory.
pub const KEYWORD_DIR: &str = "keyword";

pub(super) const REGISTRATION: Registration = Registration {
    name: KEYWORD_CONSUMER,
    needs_embedder: false,
    embedded: |_| true,
    open: |o: &Opening<'_>| {
        let index = EmbeddedKeywordIndex::open(&o.data_dir.join(KEYWORD_DIR))?;
        Ok(Arc::new(KeywordConsumer(Arc::new(index))))
    },
};

/// The open keyword index.
pub struct KeywordConsumer(Arc<EmbeddedKeywordIndex>);

impl KeywordConsumer {
    /// Its name in `index.outbox.consumers`.
    pub const NAME: &'static str = REGISTRATION.name;

    /// The index.
    pub fn index(&self) -> &Arc<EmbeddedKeywordIndex> {
        &self.0
    }

    fn target(&self) -> Arc<dyn IndexTarget> {
        let index: Arc<dyn KeywordIndex> = self.0.clone();
        Arc::new(KeywordTarget(index))
    }
}

impl Consumer for KeywordConsumer {
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
        target_worker(self.target(), cfg, source, embedder, projector)
    }

    fn dry_run_target(&self) -> Option<Arc<dyn IndexTarget>> {
        Some(self.target())
    }

    fn repair_event(&self, node: NodeStat, trace_id: &str) -> Option<EventPayload> {
        context_repair(node, trace_id)
    }

    fn clear(&self, _model: Option<&ModelIdentity>) -> Result<u64> {
        let cleared = self.0.count()?;
        self.0.clear()?;
        Ok(cleared)
    }

    fn view<'a>(&'a self, _model: Option<&'a ModelIdentity>) -> Option<IndexView<'a>> {
        Some(IndexView::Keyword(self.0.as_ref()))
    }

    fn report(&self, status: &mut Status) -> Result<()> {
        status.keyword_records = Some(self.0.count()?);
        Ok(())
    }
}
