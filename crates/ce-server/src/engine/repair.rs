//! The two repair jobs of spec §8.3.2 on the engine (docs/repair.md):
//!
//! - `repair_dead_events` ([`Engine::repair_dead`]): count, requeue (fresh retry budget) or
//!   force-done (without applying, after a human confirmed) the dead deliveries a
//!   [`DeadFilter`] selects;
//! - `repair_reconcile_index` ([`Engine::reconcile`]): compare each index with the source
//!   within a subtree (`ce_index::repair::Reconciler`) and, unless a dry run, append the
//!   events that converge it — for its consumer only — unless the orphan deletes fail the
//!   delete-safety check and no override was given. The refusal is all-or-nothing: when one
//!   consumer's deletes are refused, no event is appended for any consumer (a partial repair
//!   would hide the very state an operator must inspect).
//!
//! With `index.repair.enabled`, a process running workers continuously also runs both on
//! their periods ([`start_schedule`]): the dead scan requeues the deliveries that died by
//! exhausting their retries (every failure was retryable: an outage that outlasted the
//! backoff) and leaves non-retryable ones to an operator; the reconcile covers the consumers
//! whose workers run here and that are at rest (no open delivery: findings are then not
//! work in flight), never with the large-delete override.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_core::{CtxUri, IndexProjector};
use ce_embed::{Embedder as _, ModelIdentity};
use ce_index::repair::{Findings, LargeDelete, Reconciler, RepairError};
use ce_index::worker::runner::Wakeup;
use ce_store::model::{DeadCounts, DeadFilter};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::consumers::{self, Consumer};
use super::periodic::Periodic;
use super::{Engine, REQUEUE_CHUNK, lock};
use crate::error::{Result, ServerError};
use crate::source::Source;
use ce_core::clock::ms_of;

/// What [`Engine::repair_dead`] does to the selected dead deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeadAction {
    /// Count them, change nothing.
    Count,
    /// Back to pending with a fresh retry budget.
    Requeue,
    /// Done without applying them (needs `confirm`).
    ForceDone,
}

/// `POST /v1/repair/dead`: what to do to which dead deliveries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadRepairBody {
    /// The action.
    pub action: DeadAction,
    /// Which dead deliveries (default: all).
    #[serde(default, deserialize_with = "crate::wire::not_array")]
    pub filter: DeadFilter,
    /// Must be true for `force_done`: the caller confirms that the events need not be
    /// applied (a human decision, spec §8.3.2).
    #[serde(default)]
    pub confirm: bool,
}

/// What [`Engine::repair_dead`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeadRepairReport {
    /// The action.
    pub action: DeadAction,
    /// The filter applied.
    pub filter: DeadFilter,
    /// Deliveries counted or moved, per consumer.
    pub counts: DeadCounts,
    /// Their sum.
    pub total: u64,
}

/// `POST /v1/repair/reconcile`: which indexes, where, and whether to append the repairs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcileBody {
    /// Only this consumer's index (default: every configured consumer with an index).
    pub consumer: Option<String>,
    /// Only this subtree (default: everything).
    pub subtree: Option<CtxUri>,
    /// Report only; append nothing.
    pub dry_run: bool,
    /// Append orphan deletes even when they fail the delete-safety check.
    pub allow_large_delete: bool,
}

/// One index's part of a [`ReconcileReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConsumerReconcile {
    /// What was found.
    #[serde(flatten)]
    pub findings: Findings,
    /// The consumer's deliveries still open when it was compared (findings may then be work
    /// already queued; their repair is redundant, not harmful).
    pub open_deliveries: u64,
    /// Events that converge the index.
    pub events: u64,
    /// Of those, appended (0 on a dry run or a refusal).
    pub emitted: u64,
    /// The delete-safety refusal of its orphan deletes, if any (overridden when
    /// `allow_large_delete`).
    pub large_delete: Option<LargeDelete>,
}

/// What [`Engine::reconcile`] found and did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReconcileReport {
    /// The subtree compared.
    pub scope: CtxUri,
    /// Whether nothing was to be appended.
    pub dry_run: bool,
    /// Whether the delete-safety check was overridden.
    pub allow_large_delete: bool,
    /// Per index.
    pub consumers: Vec<ConsumerReconcile>,
    /// Events appended in all.
    pub emitted: u64,
    /// Duration.
    pub took_ms: f64,
}

/// Who started a repair (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Manual,
    Scheduled,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Manual => "manual",
            Trigger::Scheduled => "scheduled",
        }
    }
}

impl From<RepairError> for ServerError {
    fn from(e: RepairError) -> Self {
        match e {
            RepairError::Store(e) => ServerError::Store(e),
            RepairError::Index(e) => ServerError::Index(e),
        }
    }
}

/// What the repair jobs need of an engine, shareable with the schedule's thread.
#[derive(Clone)]
struct Repairer {
    store: Source,
    /// The open consumers.
    consumers: Vec<Arc<dyn Consumer>>,
    /// The configured embedding model, when loaded.
    model: Option<ModelIdentity>,
    projector: IndexProjector,
    wake: Arc<Wakeup>,
}

impl Repairer {
    fn dead(
        &self,
        action: DeadAction,
        filter: &DeadFilter,
        trigger: Trigger,
    ) -> Result<DeadCounts> {
        let counts = match action {
            DeadAction::Count => self.store.count_dead(filter)?,
            DeadAction::Requeue => self.store.requeue_dead_matching(filter)?,
            DeadAction::ForceDone => self.store.force_done(filter)?,
        };
        for (consumer, n) in &counts {
            let c = consumer.clone();
            match action {
                DeadAction::Count => {}
                DeadAction::Requeue => {
                    metrics::counter!("index_repair_requeued_total", "consumer" => c).increment(*n);
                }
                DeadAction::ForceDone => {
                    metrics::counter!("index_repair_forced_done_total", "consumer" => c)
                        .increment(*n);
                }
            }
        }
        let total: u64 = counts.values().sum();
        if action == DeadAction::Requeue && total > 0 {
            self.wake.notify();
        }
        if action != DeadAction::Count {
            info!(action = ?action, trigger = trigger.as_str(), total, counts = ?counts, "dead deliveries repaired");
        }
        Ok(counts)
    }

    /// Compares `consumers`' indexes with the source within `body.subtree`, checks the
    /// deletes, then appends (unless a dry run or refused).
    fn reconcile(
        &self,
        consumers: &[&str],
        body: &ReconcileBody,
        trigger: Trigger,
    ) -> Result<ReconcileReport> {
        let started = Instant::now();
        let scope = body.subtree.clone().unwrap_or_else(CtxUri::root);
        let trace_id = format!("repair-{}", uuid::Uuid::now_v7());
        let open: BTreeMap<String, u64> = self
            .store
            .stats()?
            .into_iter()
            .map(|s| (s.consumer, s.pending + s.claimed + s.retry_wait))
            .collect();
        let mut reconciler =
            Reconciler::new(self.store.as_ref(), &self.projector, &scope, &trace_id)?;
        let mut parts = Vec::new();
        for c in consumers {
            let Some(view) = self
                .consumers
                .iter()
                .find(|s| s.registration().name == *c)
                .and_then(|slot| slot.view(self.model.as_ref()))
            else {
                continue;
            };
            let r = reconciler.reconcile(c, view)?;
            let large_delete = r.findings.delete_safety().err();
            parts.push((r, large_delete));
        }
        let refused: Vec<String> = parts
            .iter()
            .filter_map(|(r, l)| l.map(|l| format!("{} {l}", r.findings.consumer)))
            .collect();
        let mut consumers_out = Vec::new();
        let blocked = !refused.is_empty() && !body.allow_large_delete;
        let mut emitted_all = 0;
        for (r, large_delete) in parts {
            let f = &r.findings;
            for (kind, finding) in [
                ("missing", &f.missing),
                ("orphan", &f.orphan),
                ("stale", &f.stale),
            ] {
                if finding.records > 0 {
                    metrics::counter!("index_repair_reconcile_findings_total", "consumer" => f.consumer.clone(), "kind" => kind, "trigger" => trigger.as_str()).increment(finding.records);
                }
            }
            if large_delete.is_some() {
                metrics::counter!("index_repair_large_delete_refused_total", "consumer" => f.consumer.clone(), "overridden" => if body.allow_large_delete { "true" } else { "false" }).increment(1);
            }
            let mut emitted = 0;
            if !body.dry_run && !blocked && !r.events.is_empty() {
                ce_core::failpoint::hit("reconcile.mid");
                let only = [f.consumer.clone()];
                for chunk in r.events.chunks(REQUEUE_CHUNK) {
                    emitted += self.store.append_batch_for(&only, chunk.to_vec())?.len() as u64;
                }
                metrics::counter!("index_repair_reconcile_events_total", "consumer" => f.consumer.clone()).increment(emitted);
            }
            emitted_all += emitted;
            consumers_out.push(ConsumerReconcile {
                open_deliveries: open.get(&f.consumer).copied().unwrap_or(0),
                events: r.events.len() as u64,
                emitted,
                large_delete,
                findings: r.findings,
            });
        }
        metrics::counter!("index_repair_runs_total", "job" => "reconcile", "trigger" => trigger.as_str()).increment(1);
        if emitted_all > 0 {
            self.wake.notify();
        }
        let report = ReconcileReport {
            scope,
            dry_run: body.dry_run,
            allow_large_delete: body.allow_large_delete,
            consumers: consumers_out,
            emitted: emitted_all,
            took_ms: ms_of(started.elapsed()),
        };
        info!(trigger = trigger.as_str(), scope = %report.scope, dry_run = body.dry_run, emitted = emitted_all, refused = refused.len(), "reconcile");
        if blocked && !body.dry_run {
            return Err(ServerError::LargeDelete {
                reason: format!(
                    "reconcile of {}: {}; nothing was appended for any index. Check that the source of truth is complete (a restored or partial source looks exactly like this), then rerun with --allow-large-delete (HTTP: \"allow_large_delete\": true)",
                    report.scope,
                    refused.join("; ")
                ),
            });
        }
        Ok(report)
    }

    /// One scheduled dead scan of `consumers`: requeues what died of exhausted retries,
    /// logs what is left for an operator.
    fn scheduled_dead_scan(&self, consumers: &[String]) -> Result<()> {
        metrics::counter!("index_repair_runs_total", "job" => "dead_scan", "trigger" => "scheduled").increment(1);
        for c in consumers {
            let exhausted = DeadFilter {
                consumer: Some(c.clone()),
                exhausted_only: true,
                ..DeadFilter::default()
            };
            self.dead(DeadAction::Requeue, &exhausted, Trigger::Scheduled)?;
            let all = DeadFilter {
                consumer: Some(c.clone()),
                ..DeadFilter::default()
            };
            let left: u64 = self.store.count_dead(&all)?.values().sum();
            if left > 0 {
                warn!(consumer = %c, dead = left, "dead deliveries need an operator: `ce repair dead --requeue` or `--force-done` (docs/repair.md)");
            }
        }
        Ok(())
    }

    /// One scheduled reconcile of the consumers among `consumers` that are at rest.
    fn scheduled_reconcile(&self, consumers: &[String]) -> Result<()> {
        let stats = self.store.stats()?;
        let at_rest: Vec<&str> = consumers
            .iter()
            .filter(|c| {
                stats
                    .iter()
                    .find(|s| &s.consumer == *c)
                    .is_some_and(|s| s.pending + s.claimed + s.retry_wait == 0)
            })
            .map(String::as_str)
            .collect();
        if at_rest.is_empty() {
            info!("scheduled reconcile skipped: every consumer has work in flight");
            return Ok(());
        }
        self.reconcile(&at_rest, &ReconcileBody::default(), Trigger::Scheduled)
            .map(|_| ())
    }
}

impl Engine {
    fn repairer(&self) -> Repairer {
        Repairer {
            store: self.store.clone(),
            consumers: self.consumers.iter().cloned().collect(),
            model: self.embedder.as_ref().ok().map(|e| e.identity().clone()),
            projector: IndexProjector::new(self.config.projector),
            wake: self.wake.clone(),
        }
    }

    /// The consumers reconcile covers: `only` (which must be configured and have an index
    /// here), else every configured consumer with an index.
    fn reconcile_consumers(&self, only: Option<&str>) -> Result<Vec<&'static str>> {
        let all: Vec<&'static str> = self
            .served_consumers()
            .into_iter()
            .filter(|c| self.configured(c))
            .collect();
        match only {
            None => Ok(all),
            Some(c) => all
                .into_iter()
                .find(|x| *x == c)
                .map(|c| vec![c])
                .ok_or_else(|| ServerError::UnsupportedConsumer {
                    name: c.to_owned(),
                    reason: format!(
                        "it must be listed in index.outbox.consumers and be one of {:?}",
                        consumers::names()
                    ),
                }),
        }
    }

    /// `repair_dead_events` (spec §8.3.2): counts, requeues or force-dones the dead
    /// deliveries `body.filter` selects. `force_done` needs `body.confirm`.
    pub fn repair_dead(&self, body: &DeadRepairBody) -> Result<DeadRepairReport> {
        if body.action == DeadAction::ForceDone && !body.confirm {
            return Err(ce_core::CoreError::InvalidField {
                field: "confirm",
                reason: "force_done marks dead deliveries done without applying them: set \"confirm\": true (ce: --yes or answer the prompt)".into(),
            }
            .into());
        }
        let counts = self
            .repairer()
            .dead(body.action, &body.filter, Trigger::Manual)?;
        Ok(DeadRepairReport {
            action: body.action,
            filter: body.filter.clone(),
            total: counts.values().sum(),
            counts,
        })
    }

    /// `repair_reconcile_index` (spec §8.3.2): see the module documentation. A refused
    /// large delete is [`ServerError::LargeDelete`] (nothing appended); on a dry run the
    /// refusal is only reported.
    pub fn reconcile(&self, body: &ReconcileBody) -> Result<ReconcileReport> {
        let consumers = self.reconcile_consumers(body.consumer.as_deref())?;
        let _maintenance = lock(&self.maintenance);
        self.repairer().reconcile(&consumers, body, Trigger::Manual)
    }

    /// Starts the scheduled repair jobs for the pool's consumers when `index.repair.enabled`.
    pub(super) fn start_repair_schedule(&self, consumers: &[&str]) {
        let r = &self.config.index.repair;
        if !r.enabled || consumers.is_empty() {
            return;
        }
        let mut slot = lock(&self.repair_schedule);
        if slot.is_none() {
            let minutes = |m: u32| Duration::from_secs(u64::from(m) * 60);
            *slot = Some(start_schedule(
                self.repairer(),
                consumers.iter().map(|c| (*c).to_owned()).collect(),
                minutes(r.dead_event_scan_interval_minutes),
                minutes(r.reconcile_interval_minutes),
            ));
        }
    }

    /// Stops the scheduled repair jobs (a run in progress finishes first).
    pub(super) fn stop_repair_schedule(&self) {
        if let Some(s) = lock(&self.repair_schedule).take() {
            s.stop();
        }
    }
}

/// Starts the thread running the two repair jobs on their periods (stopped with the
/// returned [`Periodic`]).
fn start_schedule(
    repairer: Repairer,
    consumers: Vec<String>,
    dead_every: Duration,
    reconcile_every: Duration,
) -> Periodic {
    info!(consumers = ?consumers, dead_every_s = dead_every.as_secs(), reconcile_every_s = reconcile_every.as_secs(), "scheduled repair on");
    let mut next_dead = Instant::now() + dead_every;
    let mut next_reconcile = Instant::now() + reconcile_every;
    Periodic::start("ce-repair", dead_every.min(reconcile_every), move || {
        let now = Instant::now();
        if now >= next_dead {
            if let Err(e) = repairer.scheduled_dead_scan(&consumers) {
                warn!(error = %e, "scheduled dead scan failed");
            }
            next_dead = Instant::now() + dead_every;
        }
        if now >= next_reconcile {
            if let Err(e) = repairer.scheduled_reconcile(&consumers) {
                warn!(error = %e, "scheduled reconcile refused or failed");
            }
            next_reconcile = Instant::now() + reconcile_every;
        }
        next_dead
            .min(next_reconcile)
            .saturating_duration_since(Instant::now())
    })
}

#[cfg(test)]
mod tests {
    use ce_core::{Config, CtxUri};
    use ce_store::PutRequest;

    use super::*;
    use crate::engine::EngineOptions;

    /// The scheduled dead scan leaves a delivery killed by a non-retryable error to an
    /// operator (which deliveries count as exhausted is the store's `exhausted_only` filter,
    /// tested there); the scheduled reconcile of a consumer at rest repairs it without the
    /// large-delete override.
    #[test]
    fn scheduled_jobs_leave_non_retryable_deaths_and_reconcile_at_rest() {
        let dir = tempfile::tempdir().expect("tmp");
        let cfg = Config::from_toml("[index.embedding]\nprovider = \"hash\"\n").expect("cfg");
        let options = EngineOptions {
            workers: 1,
            run_workers: false,
            role: "test".into(),
            consumers: Vec::new(),
        };
        let e = Engine::open_with(dir.path(), cfg, options).expect("engine");
        let req = PutRequest {
            content: Some("text".into()),
            ..PutRequest::default()
        };
        e.put(&CtxUri::parse("ctx://acc/a").expect("uri"), req)
            .expect("put");
        let store = e.store();
        let claimed = store.claim_batch("keyword", "w", 10).expect("claim");
        assert_eq!(claimed.len(), 2);
        store.mark_done(&claimed[0].claim).expect("done");
        let bad = ce_store::Failure {
            code: ce_core::ErrorCode::InvalidPayload,
            retryable: false,
            message: "bad",
        };
        store.mark_failed(&claimed[1].claim, &bad).expect("dead");
        let r = e.repairer();
        let keyword = ["keyword".to_owned()];
        r.scheduled_dead_scan(&keyword).expect("scan");
        let dead = store.count_dead(&DeadFilter::default()).expect("count");
        assert_eq!(
            dead.get("keyword"),
            Some(&1),
            "a non-retryable death stays dead"
        );
        // The keyword index never got ctx://acc/a: at rest, the scheduled reconcile repairs it.
        r.scheduled_reconcile(&keyword).expect("reconcile");
        let open = store
            .stats()
            .expect("stats")
            .into_iter()
            .find(|s| s.consumer == "keyword")
            .expect("keyword");
        assert_eq!(open.pending, 1, "one UPSERT_CONTEXT (repair) appended");
    }
}
