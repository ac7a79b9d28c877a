//! Rebuilding one consumer's index from the source of truth ([`Engine::reindex`]), taking a
//! consumer over from another index instance, and dry runs ([`Engine::dry_run`]).

use std::path::PathBuf;
use std::time::Instant;

use ce_core::{CtxUri, IndexProjector, OutboxEventCreate};
use ce_embed::{Embedder as _, ModelIdentity};
use ce_index::worker::WorkerConfig;
use ce_index::worker::dry_run::DryRunReport;
use tracing::{info, warn};

use super::consumers::{self, Consumer};
use super::{DRY_RUN_DIR, Engine, REQUEUE_CHUNK, lock, not_listed, owner};
use crate::error::{Result, ServerError};
use crate::status::ReindexReport;
use ce_core::clock::ms_of;

impl Engine {
    /// Makes this data directory the owner of `consumer` when its index is embedded, whoever
    /// owned it before (see [`owner`]); follow with [`Engine::reindex`]: the index here lacks
    /// what the previous owner applied. Stop the previous owner's processes first.
    pub fn take_over(&self, consumer: &str) -> Result<()> {
        if !self.configured(consumer) {
            return Err(not_listed(consumer));
        }
        owner::claim(&self.store, &self.config, &self.data_dir, consumer, true)
    }

    /// Rebuilds `consumer`'s index from the source of truth: stops the workers, appends one
    /// repair event per node the index holds records of (`UPSERT_CONTEXT` with reason
    /// `repair` for node text, `UPSERT_RELATION` for edges) — delivered to `consumer` only,
    /// the other indexes are left alone — clears the index (and binds it to the configured
    /// model when it embeds), then restarts the workers. The repair events come first, so a
    /// crash at any point leaves either the old index or work that a rerun completes.
    /// Re-embedding is cheap: unchanged texts come from the embedding cache.
    pub fn reindex(&self, consumer: &str) -> Result<ReindexReport> {
        let Some(registration) = consumers::registration(consumer) else {
            return Err(consumers::unknown(consumer));
        };
        if !self.configured(consumer) {
            return Err(not_listed(consumer));
        }
        let model = if registration.needs_embedder {
            Some(self.ready_embedder()?.identity().clone())
        } else {
            None
        };
        let slot = self.consumer(consumer)?.clone();
        // Rebuilding an index that another instance owns would feed the wrong index.
        owner::claim(&self.store, &self.config, &self.data_dir, consumer, false)?;
        let _maintenance = lock(&self.maintenance);
        let started = Instant::now();
        self.stop_pool();
        let result = self.requeue_and_clear(slot.as_ref(), model.as_ref());
        // Workers come back even if the rebuild failed half-way (a rerun finishes it).
        if let Err(e) = self.bind() {
            warn!(error = %e, "rebinding the indexes failed");
        }
        if self.options.run_workers {
            self.start_pool()?;
        }
        self.wake.notify();
        let (requeued, cleared) = result?;
        // The repair events cover what the journal no longer held for it, if anything.
        if self.store.rebuild_queued(consumer)? {
            info!(
                consumer,
                "the rebuild the journal's retention called for is queued"
            );
        }
        metrics::counter!("index_repair_requeued_total", "consumer" => consumer.to_owned())
            .increment(requeued);
        info!(consumer, requeued, cleared, "reindex queued");
        Ok(ReindexReport {
            consumer: consumer.into(),
            cleared_records: cleared,
            requeued,
            model,
            took_ms: ms_of(started.elapsed()),
        })
    }

    fn requeue_and_clear(
        &self,
        slot: &dyn Consumer,
        model: Option<&ModelIdentity>,
    ) -> Result<(u64, u64)> {
        let trace_id = format!("reindex-{}", uuid::Uuid::now_v7());
        let only = [slot.registration().name.to_owned()];
        slot.reindex_marks(self.store.shared().as_ref())?;
        let mut requeued = 0u64;
        for account in self.store.ls(&CtxUri::root())? {
            let mut batch = Vec::new();
            for n in self.store.tree(&account.uri, None)? {
                let Some(payload) = slot.repair_event(n, &trace_id) else {
                    continue;
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
        let cleared = slot.clear(model)?;
        Ok((requeued, cleared))
    }

    /// The served consumers that have a dry run.
    pub fn dry_run_consumers(&self) -> Vec<&'static str> {
        self.consumers
            .iter()
            .filter(|c| c.has_dry_run())
            .map(|c| c.registration().name)
            .collect()
    }

    pub(super) fn in_dry_run_mode(&self, consumer: &str) -> bool {
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
    pub(super) fn last_dry_run(&self, consumer: &str) -> Option<DryRunReport> {
        let text = std::fs::read(self.dry_run_path(consumer)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Computes the delta `consumer`'s first `limit` open events would apply to its index,
    /// without claiming, embedding, writing or acknowledging anything (see
    /// `ce_index::worker::dry_run`); works while the model is missing. For the derive
    /// consumer: what a drain would derive and the tokens it would spend (docs/derive.md,
    /// "Dry run"). The report is recorded
    /// in the data directory: in dry-run mode (`index.worker.dry_run_consumers`) status
    /// reports `dry_run_valid` from it.
    pub fn dry_run(&self, consumer: &str, limit: usize) -> Result<DryRunReport> {
        let slot = self
            .consumers
            .find(consumer)
            .filter(|_| self.configured(consumer))
            .ok_or_else(|| ServerError::UnsupportedConsumer {
                name: consumer.into(),
                reason: format!(
                    "it must be listed in index.outbox.consumers and be one of {:?}",
                    consumers::names()
                ),
            })?;
        let report = match slot.own_dry_run(&self.store.shared(), limit) {
            Some(report) => report?,
            None => {
                let target =
                    slot.dry_run_target()
                        .ok_or_else(|| ServerError::UnsupportedConsumer {
                            name: consumer.into(),
                            reason: format!(
                                "dry runs cover the consumers {:?}",
                                self.dry_run_consumers()
                            ),
                        })?;
                let cfg = WorkerConfig::from_config(&self.config, "dry-run", consumer);
                ce_index::worker::dry_run::dry_run(
                    &cfg,
                    self.store.as_ref(),
                    target.as_ref(),
                    &IndexProjector::new(self.config.projector),
                    limit,
                )
                .map_err(|e| ServerError::failed(format!("dry run of {consumer}"), &e))?
            }
        };
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
}
