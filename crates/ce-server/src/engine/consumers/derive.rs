//! The derive consumer (docs/derive.md): L0 / L1 of the nodes that lack a client's, written
//! back to the source by [`DeriveHandler`]. It has no index of its own — its "index" is the
//! source's derived layers and dirty keys — so it has no owner and nothing for the
//! reconciler to compare, and its dry run counts what a drain would derive and spend; a reindex marks every derived node dirty, and a derivation
//! whose input hash is current is then a no-op, so only a changed generator, model, prompt
//! or limit re-derives.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ce_core::config::DERIVE_CONSUMER;
use ce_core::{Clock, EventPayload, IndexProjector, SystemClock};
use ce_derive::{DeriveHandler, DeriveSettings, Generator};
use ce_embed::{Embedder, ModelIdentity};
use ce_index::repair::IndexView;
use ce_index::worker::dry_run::DryRunReport;
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::{NodeStat, SourceStore};

use super::{Consumer, Opening, Registration, context_repair};
use crate::error::{Result, ServerError};
use crate::status::{DeriveStatus, Status};

pub(super) const REGISTRATION: Registration = Registration {
    name: DERIVE_CONSUMER,
    needs_embedder: false,
    embedded: |_| false,
    open: |o: &Opening<'_>| {
        let generator = ce_derive::from_config(&o.config.derive)?;
        let d = &o.config.derive;
        let settings = DeriveSettings {
            budget: o.config.projector.into(),
            batch_size: d.batch_size as usize,
            timeout: Duration::from_secs(u64::from(d.timeout_seconds)),
            max_tokens_per_day: d.max_tokens_per_day,
            types: d.derived_types(),
        };
        Ok(Arc::new(DeriveConsumer {
            generator,
            settings,
            projector: IndexProjector::new(o.config.projector),
            handler: OnceLock::new(),
        }))
    },
};

/// The open derive consumer.
pub struct DeriveConsumer {
    generator: Arc<dyn Generator>,
    settings: DeriveSettings,
    projector: IndexProjector,
    /// Shared by this process's derive workers (their counters add up), made with the first.
    handler: OnceLock<Arc<DeriveHandler>>,
}

impl DeriveConsumer {
    /// Its name in `index.outbox.consumers`.
    pub const NAME: &'static str = REGISTRATION.name;

    fn handler(&self, source: Arc<dyn SourceStore>) -> Arc<DeriveHandler> {
        self.handler
            .get_or_init(|| {
                let clock: Arc<dyn Clock> = Arc::new(SystemClock);
                Arc::new(DeriveHandler::new(
                    source,
                    self.generator.clone(),
                    self.settings.clone(),
                    self.projector.clone(),
                    clock,
                ))
            })
            .clone()
    }
}

impl Consumer for DeriveConsumer {
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
        let handler = self.handler(source.clone());
        Ok(IndexWorker::for_ops(cfg, source, handler))
    }

    fn own_dry_run(
        &self,
        source: &Arc<dyn SourceStore>,
        limit: usize,
    ) -> Option<Result<DryRunReport>> {
        Some(
            self.handler(source.clone())
                .dry_run(limit)
                .map_err(|e| ServerError::failed("dry run of derive", &e)),
        )
    }

    fn has_dry_run(&self) -> bool {
        true
    }

    fn repair_event(&self, node: NodeStat, trace_id: &str) -> Option<EventPayload> {
        context_repair(node, trace_id)
    }

    fn clear(&self, _model: Option<&ModelIdentity>) -> Result<u64> {
        // Nothing to empty: a reindex re-derives what changed (see `reindex_marks`).
        Ok(0)
    }

    fn reindex_marks(&self, source: &dyn SourceStore) -> Result<u64> {
        Ok(source.dirty_all()?)
    }

    fn view<'a>(&'a self, _model: Option<&'a ModelIdentity>) -> Option<IndexView<'a>> {
        None
    }

    fn report(&self, status: &mut Status) -> Result<()> {
        let handler = self.handler.get();
        status.derive = Some(DeriveStatus {
            generator: self.generator.identity().key(),
            types: self
                .settings
                .types
                .iter()
                .map(|t| t.as_str().to_owned())
                .collect(),
            dirty: 0,
            today: ce_store::derive::DeriveUsage::default(),
            max_tokens_per_day: self.settings.max_tokens_per_day,
            over_budget: false,
            workers: handler.map(|h| h.counters()),
            last_refusal: handler.and_then(|h| h.last_refusal()),
        });
        Ok(())
    }
}
