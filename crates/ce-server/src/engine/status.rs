//! What each consumer can do here ([`Applier`]) and the engine's status report.

use ce_core::Millis;
use ce_embed::Embedder as _;
use tracing::warn;

use super::Engine;
use crate::error::Result;
use crate::status::{Applier, ConsumerStatus, EmbedCacheStatus, HoldStatus, Status};

impl Engine {
    /// The consumers this engine runs workers for: the open ones (configured, and in
    /// `options.consumers` when set).
    pub(super) fn served_consumers(&self) -> Vec<&'static str> {
        self.consumers.names()
    }

    /// The served consumers whose events this engine can apply now.
    pub(super) fn ready_consumers(&self) -> Vec<&'static str> {
        self.served_consumers()
            .into_iter()
            .filter(|c| self.applier(c) == Applier::Ready)
            .collect()
    }

    /// Whether `consumer`'s events can be applied by this build and configuration.
    pub(super) fn applier(&self, consumer: &str) -> Applier {
        let slot = self.consumers.find(consumer);
        if slot.is_some() && self.in_dry_run_mode(consumer) {
            return Applier::DryRun(self.last_dry_run(consumer));
        }
        if let Some(h) = self.held.iter().find(|h| h.name == consumer) {
            return Applier::Elsewhere(format!(
                "applied by the process that holds its index ({})",
                h.reason
            ));
        }
        let blockers = match slot {
            Some(s) => self.blockers(s.as_ref()),
            None if super::consumers::registration(consumer).is_some()
                && self.configured(consumer) =>
            {
                vec![self.no_index(consumer).to_string()]
            }
            None => vec![format!(
                "no index for consumer {consumer:?} in this build yet: its events wait in the journal"
            )],
        };
        if !blockers.is_empty() {
            return Applier::Blocked(blockers.join("; "));
        }
        if !self.config.index.worker.enabled {
            return Applier::NotRequested("index.worker.enabled is false".into());
        }
        Applier::Ready
    }

    /// The status of every consumer the store has stats for, as of `now`, restricted to
    /// `keep`.
    pub(super) fn consumer_statuses(
        &self,
        now: Millis,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<ConsumerStatus>> {
        Ok(self.statuses_of(self.store.stats()?, now, keep))
    }

    fn statuses_of(
        &self,
        stats: Vec<ce_store::ConsumerStats>,
        now: Millis,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<ConsumerStatus> {
        stats
            .into_iter()
            .filter(|s| keep(&s.consumer))
            .map(|s| {
                let applier = self.applier(&s.consumer);
                ConsumerStatus::new(s, now, &applier)
            })
            .collect()
    }

    /// Records every consumer's lag now in the recent samples ([`crate::lag_history`]).
    pub fn sample_lag(&self) -> Result<()> {
        let now = self.store.clock().now_ms();
        let consumers = self.consumer_statuses(now, |_| true)?;
        self.lag_history.record(now, &consumers);
        Ok(())
    }

    /// The recent lag samples, oldest first.
    pub fn lag_history(&self) -> crate::lag_history::LagHistoryAnswer {
        self.lag_history.answer()
    }

    /// Outbox progress and lag per consumer, index sizes, model and readiness.
    pub fn status(&self) -> Result<Status> {
        self.status_of(StatusScope::Full)
    }

    /// [`Self::status`] for the metrics' gauges, refreshed at every scrape: without the
    /// journal's extent (left empty), which counts every event and delivery the journal
    /// holds.
    pub fn status_for_gauges(&self) -> Result<Status> {
        self.status_of(StatusScope::Gauges)
    }

    fn status_of(&self, scope: StatusScope) -> Result<Status> {
        let now = self.store.clock().now_ms();
        let full = scope == StatusScope::Full;
        let readiness = self.readiness();
        let mut status = Status {
            ready: readiness.ready,
            not_ready: readiness.reasons,
            data_dir: self.data_dir.display().to_string(),
            store_backend: self.store.backend().to_owned(),
            store_location: self.store.location(),
            vector_destination: self.config.index.vector.destination.clone(),
            model: self.embedder.as_ref().ok().map(|e| e.identity().clone()),
            index_model: None,
            index_records: 0,
            keyword_records: None,
            relation_records: None,
            consumers: self.consumer_statuses(now, |_| true)?,
            workers: self.running_workers(),
            worker_consumers: self.worker_consumers(),
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
            kb: Default::default(),
            journal: crate::status::JournalStatus {
                extent: if full {
                    self.store.journal()?
                } else {
                    ce_store::model::JournalExtent::default()
                },
                retention_seconds: self.config.index.outbox.journal_retention_seconds,
                rebuilds_needed: self.store.rebuilds_needed()?,
            },
            derive: None,
            sessions: {
                let off = self.config.extraction_off();
                crate::status::SessionsStatus {
                    extraction: off.is_none(),
                    model: off.is_none().then(|| self.config.derive.llm.model.clone()),
                    extraction_off: off.unwrap_or_default(),
                    keep_last: self.config.sessions.keep_last,
                    merge_rule: {
                        let s = self.sessions();
                        s.sameness_note(&s.semantic())
                    },
                }
            },
        };
        status.kb = self.kb_report(&status.jobs.counts)?;
        for c in self.consumers.iter() {
            c.report(&mut status)?;
        }
        if self
            .held
            .iter()
            .any(|h| h.name == super::consumers::VectorConsumer::NAME)
        {
            super::consumers::VectorConsumer::report_held(&self.data_dir, &mut status)?;
        }
        if let Some(d) = &mut status.derive {
            d.dirty = self.store.count_dirty()?;
            d.today = self.store.derive_usage(now)?;
            d.over_budget = d.max_tokens_per_day > 0 && d.today.tokens() >= d.max_tokens_per_day;
        }
        Ok(status)
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
}

/// How much [`Engine::status_of`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusScope {
    /// Everything (`ce status`, `GET /v1/status`).
    Full,
    /// What the metrics' gauges show (see [`Engine::status_for_gauges`]).
    Gauges,
}
