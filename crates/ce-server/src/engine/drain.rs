//! Workers on demand: [`Engine::drain`] runs workers of every ready consumer until their
//! open work is done (`ce worker --once`, `ce reindex`, tests), counting what they did.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ce_core::OutboxEvent;
use ce_index::worker::{IndexWorker, WorkerCallbacks};
use tracing::warn;

use super::{Engine, holds, journal, lock, ms};
use crate::error::{Result, ServerError};
use crate::flag::Flag;
use crate::status::{DrainProgress, DrainReport};

/// How often [`Engine::drain`] rechecks the outbox while others hold claims.
const DRAIN_RECHECK: Duration = Duration::from_millis(100);
/// Consecutive claim failures after which [`Engine::drain`] gives up.
const DRAIN_MAX_ERRORS: u32 = 20;

impl Engine {
    /// Runs `options.workers` workers per ready consumer until each of those consumers has
    /// nothing pending or claimed (claims of a crashed worker are waited for until their lease
    /// expires); deliveries waiting to retry are left for later. The report lists every
    /// served consumer afterwards (`options.consumers`), blocked ones included (a blocked
    /// consumer never holds the others back). `progress` is called after every batch. With no
    /// consumer ready the error says why (e.g. the model is not loaded).
    pub fn drain(&self, progress: &(dyn Fn(&DrainProgress) + Sync)) -> Result<DrainReport> {
        let _maintenance = lock(&self.maintenance);
        if lock(&self.pool).is_some() {
            return Err(ServerError::Usage(
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
        let quiet = Flag::default();
        let drained: Vec<String> = consumers.iter().map(|c| (*c).to_owned()).collect();
        let outcome: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter()
                .map(|w| {
                    let pass = Pass {
                        consumers: &drained,
                        totals: &totals,
                        quiet: &quiet,
                        started,
                        poll,
                    };
                    s.spawn(move || self.drain_one(w, &pass, progress))
                })
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
        holds::end_applied(
            self.store.as_ref(),
            &self.locks.with_wait(Duration::ZERO),
            &drained,
        );
        // What every consumer applied longer ago than the retention leaves the journal (a
        // process that only ever runs `ce worker --once` prunes too).
        journal::prune(
            self.store.as_ref(),
            self.config.index.outbox.journal_retention_seconds,
        );
        // Knowledge items whose commits are now applied complete here too.
        if let Err(e) = self.kb_settle() {
            warn!(error = %e, "knowledge items not settled");
        }
        let now = self.store.clock().now_ms();
        let served = self.served_consumers();
        let remaining = self.consumer_statuses(now, |c| served.contains(&c))?;
        Ok(DrainReport {
            progress: totals.snapshot(started),
            workers: workers.len(),
            remaining,
        })
    }

    /// Runs `w` until none of the drained consumers has anything pending or claimed: a
    /// consumer's work can append events for the others (the derive consumer's write-backs
    /// reach the vector and keyword indexes), so a worker stops only when all are done. The
    /// first worker to see them all done ends the pass for every worker (`pass.quiet`): a
    /// worker that stopped alone would leave the others waiting for its consumer's events
    /// written after it stopped (by a job running beside the drain, or another process).
    fn drain_one(
        &self,
        w: &IndexWorker,
        pass: &Pass<'_>,
        progress: &(dyn Fn(&DrainProgress) + Sync),
    ) -> Result<()> {
        let mut errors = 0u32;
        loop {
            if pass.quiet.is_set() {
                return Ok(());
            }
            match w.run_next() {
                Ok(r) if r.claimed > 0 => {
                    errors = 0;
                    pass.totals.add(&r);
                    progress(&pass.totals.snapshot(pass.started));
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
            // One indexed probe per consumer: counting every delivery here (`stats`) cost a
            // core while another worker drained a large backlog.
            if !self.store.has_unfinished(pass.consumers)? {
                pass.quiet.set();
                return Ok(());
            }
            // Work is claimed elsewhere (another of our threads, or a crashed worker whose
            // lease has not expired yet) or the worker is paused by a rate limit.
            pass.quiet
                .wait(w.paused_for().unwrap_or(pass.poll).min(DRAIN_RECHECK));
        }
    }
}

/// What the workers of one [`Engine::drain`] share.
struct Pass<'a> {
    consumers: &'a [String],
    totals: &'a DrainTotals,
    /// Set by the first worker that finds every drained consumer done: the pass ends, and
    /// the workers waiting for a recheck wake at once (without the wake-up the drain would end
    /// only when the last of them woke by itself, up to [`DRAIN_RECHECK`] after the work was
    /// done — most of a small drain's wall time).
    quiet: &'a Flag,
    started: Instant,
    poll: Duration,
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
