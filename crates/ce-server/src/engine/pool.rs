//! The continuous workers: one pool of `IndexWorker`s for every ready consumer, and what runs
//! beside them while they run (index upkeep, the PostgreSQL listener, the hold keeper, the
//! repair schedule). [`Engine::start_pool`] starts all of it, [`Engine::stop_pool`] stops it
//! in reverse; background work that should live exactly as long as the workers starts and
//! stops there too.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ce_index::worker::runner::WorkerPool;
use ce_index::worker::{IndexWorker, WorkerCallbacks, WorkerConfig};
use ce_store::SourceStore;
use tracing::{info, warn};

use super::periodic::Periodic;
use super::{Engine, failpoint, holds, journal, listen, lock, owner};
use crate::error::Result;
use crate::status::Applier;

/// The continuous workers and their companions, while they run.
pub(super) struct Running {
    workers: WorkerPool,
    /// The consumers the workers serve.
    pub(super) consumers: Vec<String>,
    /// The indexes' upkeep (e.g. the embedded vector index's snapshots).
    upkeep: Vec<Periodic>,
    /// Wakes the workers on PostgreSQL's commit notifications.
    pub(super) listener: Option<listen::Listener>,
    /// Keeps the leases handed off to background work.
    holds: Periodic,
    /// Prunes the journal (`None`: retention off).
    journal: Option<Periodic>,
}

impl Engine {
    /// Commit notifications received from PostgreSQL by the running listener (0 on SQLite
    /// or while no workers run).
    pub fn notifications_received(&self) -> u64 {
        lock(&self.pool)
            .as_ref()
            .and_then(|r| r.listener.as_ref())
            .map_or(0, listen::Listener::received)
    }

    /// Number of worker threads currently running.
    pub fn running_workers(&self) -> usize {
        self.running_workers.load(Ordering::SeqCst)
    }

    /// The consumers the running workers serve (empty while none run).
    pub fn worker_consumers(&self) -> Vec<String> {
        lock(&self.pool)
            .as_ref()
            .map(|r| r.consumers.clone())
            .unwrap_or_default()
    }

    /// Starts the continuous workers of every ready consumer if enabled (else logs why not),
    /// and what runs beside them.
    pub(super) fn start_pool(&self) -> Result<()> {
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
        let workers = WorkerPool::start(workers, self.wake.clone(), poll);
        self.running_workers.store(n, Ordering::SeqCst);
        let upkeep = self
            .consumers
            .iter()
            .filter(|c| consumers.contains(&c.registration().name))
            .filter_map(|c| c.start_upkeep(&self.config))
            .collect();
        let listener = self
            .store
            .postgres()
            .map(|pg| listen::Listener::start(pg.clone(), self.wake.clone()));
        self.start_repair_schedule(&consumers);
        let consumers: Vec<String> = consumers.iter().map(|c| (*c).to_owned()).collect();
        let holds = holds::start(
            self.store.shared(),
            // A hold adopted elsewhere is simply tried again on the next round.
            self.locks.with_wait(Duration::ZERO),
            consumers.clone(),
        );
        let journal = journal::start(
            self.store.shared(),
            self.config.index.outbox.journal_retention_seconds,
        );
        info!(workers = n, consumers = ?consumers, "workers started");
        *pool = Some(Running {
            workers,
            consumers,
            upkeep,
            listener,
            holds,
            journal,
        });
        Ok(())
    }

    /// Stops the continuous workers, after what runs beside them; each worker finishes its
    /// batch first, so no claim is left.
    pub(super) fn stop_pool(&self) {
        self.stop_repair_schedule();
        let running = lock(&self.pool).take();
        if let Some(r) = running {
            for u in r.upkeep {
                u.stop();
            }
            r.holds.stop();
            if let Some(j) = r.journal {
                j.stop();
            }
            if let Some(l) = r.listener {
                l.stop();
            }
            r.workers.shutdown();
            self.running_workers.store(0, Ordering::SeqCst);
            info!("workers stopped");
        }
    }

    /// `n` workers for `consumer`, which must be configured and ready, and owned by this
    /// data directory when its index is embedded ([`owner`]), each also reporting to
    /// `observer` when given. The first workers of a consumer take its worker lock, releasing
    /// the claims a crashed predecessor left.
    pub(super) fn make_workers(
        &self,
        consumer: &str,
        n: usize,
        observer: Option<&Arc<dyn WorkerCallbacks>>,
    ) -> Result<Vec<Arc<IndexWorker>>> {
        if !self.configured(consumer) {
            return Err(super::not_listed(consumer));
        }
        let slot = self.consumer(consumer)?;
        owner::claim(&self.store, &self.config, &self.data_dir, consumer, false)?;
        {
            let mut held = lock(&self.worker_locks);
            if !held.iter().any(|(c, _)| c == consumer) {
                let taken = owner::worker_lock(&self.store, &self.data_dir, consumer)?;
                held.push((consumer.to_owned(), taken));
            }
        }
        if !self.blockers(slot.as_ref()).is_empty() {
            return Err(self.not_ready());
        }
        let embedder = if slot.registration().needs_embedder {
            Some(failpoint::worker_embedder(self.ready_embedder()?))
        } else {
            None
        };
        let source: Arc<dyn SourceStore> = self.store.shared();
        (0..n.max(1))
            .map(|_| {
                let k = self.next_worker.fetch_add(1, Ordering::SeqCst);
                let id = format!(
                    "{}-{consumer}-{}-{k}",
                    self.options.role,
                    std::process::id()
                );
                let cfg = WorkerConfig::from_config(&self.config, &id, consumer);
                let w = slot.worker(
                    cfg,
                    source.clone(),
                    embedder.clone(),
                    ce_core::IndexProjector::new(self.config.projector),
                )?;
                Ok(Arc::new(match observer {
                    Some(o) => w.with_callback(o.clone()),
                    None => w,
                }))
            })
            .collect()
    }
}
