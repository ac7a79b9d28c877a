//! Workers on demand: [`Engine::drain`] runs workers of every ready consumer until their
//! open work is done (`ce worker --once`, `ce reindex`, tests), counting what they did.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ce_core::OutboxEvent;
use ce_index::worker::{IndexWorker, WorkerCallbacks};
use tracing::warn;

use super::{Engine, holds, journal, lock};
use crate::error::{Result, ServerError};
use crate::status::{DrainProgress, DrainReport};
use ce_core::clock::ms_of;

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
        let beacon = Beacon::default();
        let drained: Vec<String> = consumers.iter().map(|c| (*c).to_owned()).collect();
        let outcome: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter()
                .map(|w| {
                    let pass = Pass {
                        consumers: &drained,
                        totals: &totals,
                        beacon: &beacon,
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
    /// first worker to see them all done ends the pass for every worker (`pass.beacon`): a
    /// worker that stopped alone would leave the others waiting for its consumer's events
    /// written after it stopped (by a job running beside the drain, or another process).
    /// An idle worker rechecks when a worker whose consumer writes back to the store
    /// finishes a batch (the events it appended are work for the others), else after
    /// [`DRAIN_RECHECK`].
    fn drain_one(
        &self,
        w: &IndexWorker,
        pass: &Pass<'_>,
        progress: &(dyn Fn(&DrainProgress) + Sync),
    ) -> Result<()> {
        let mut errors = 0u32;
        loop {
            if pass.beacon.is_quiet() {
                return Ok(());
            }
            // Read before the claim: a write-back after it wakes the wait below at once.
            let seen = pass.beacon.write_backs();
            match w.run_next() {
                Ok(r) if r.claimed > 0 => {
                    errors = 0;
                    if w.writes_back() {
                        pass.beacon.wrote_back();
                    }
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
                pass.beacon.set_quiet();
                return Ok(());
            }
            // Work is claimed elsewhere (another of our threads, or a crashed worker whose
            // lease has not expired yet) or the worker is paused by a rate limit.
            let paused = w.paused_for();
            let wait = paused.unwrap_or(pass.poll).min(DRAIN_RECHECK);
            // A paused worker sleeps its pause out, write-backs or not.
            pass.beacon.wait(paused.is_none().then_some(seen), wait);
        }
    }
}

/// What the workers of one [`Engine::drain`] share.
struct Pass<'a> {
    consumers: &'a [String],
    totals: &'a DrainTotals,
    /// What idle workers wait on: the pass's end and the write-backs (see [`Beacon`]).
    beacon: &'a Beacon,
    started: Instant,
    poll: Duration,
}

/// What the idle workers of one [`Engine::drain`] wait on.
///
/// - **Quiet**: set by the first worker that finds every drained consumer done; the pass
///   ends, and the workers waiting for a recheck wake at once (without the wake-up the drain
///   would end only when the last of them woke by itself, up to [`DRAIN_RECHECK`] after the
///   work was done — most of a small drain's wall time).
/// - **Write-backs**: counted after every batch of a worker whose consumer writes to the
///   store (`derive`: a folder's roll-up appends the events that index it). A waiting worker
///   rechecks at once instead of at its next recheck: after a 1 % edit in a folder of 10,000
///   children the index workers slept up to 100 ms on the drain's critical path.
#[derive(Debug, Default)]
struct Beacon {
    state: Mutex<BeaconState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct BeaconState {
    quiet: bool,
    write_backs: u64,
}

impl Beacon {
    fn state(&self) -> std::sync::MutexGuard<'_, BeaconState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_quiet(&self) -> bool {
        self.state().quiet
    }

    /// Ends the pass and wakes every waiter.
    fn set_quiet(&self) {
        self.state().quiet = true;
        self.changed.notify_all();
    }

    /// The write-backs counted so far.
    fn write_backs(&self) -> u64 {
        self.state().write_backs
    }

    /// Counts a batch that wrote back to the store and wakes every waiter.
    fn wrote_back(&self) {
        self.state().write_backs += 1;
        self.changed.notify_all();
    }

    /// Waits up to `d`, until the pass is quiet or (with `Some(seen)`) the write-backs
    /// counted are no longer `seen`.
    fn wait(&self, seen: Option<u64>, d: Duration) {
        let _woken = self
            .changed
            .wait_timeout_while(self.state(), d, |s| {
                !s.quiet && seen.is_none_or(|n| s.write_backs == n)
            })
            .unwrap_or_else(PoisonError::into_inner);
    }
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
            elapsed_ms: ms_of(started.elapsed()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Waits on `beacon` in a thread (having seen `seen` write-backs, up to `d`) while `act`
    /// runs on this one after the waiter most likely started; how long the waiter waited.
    fn waited(beacon: &Beacon, seen: Option<u64>, d: Duration, act: impl FnOnce()) -> Duration {
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let t = Instant::now();
                beacon.wait(seen, d);
                t.elapsed()
            });
            std::thread::sleep(Duration::from_millis(50));
            act();
            waiter.join().expect("waiter")
        })
    }

    #[test]
    fn an_idle_worker_wakes_at_a_write_back_or_the_end_of_the_pass() {
        let long = Duration::from_secs(120);
        let beacon = Beacon::default();
        let seen = beacon.write_backs();
        // A write-back after the waiter's claim wakes it.
        assert!(waited(&beacon, Some(seen), long, || beacon.wrote_back()) < long);
        assert_eq!(beacon.write_backs(), seen + 1);
        // One that came before the wait: no wait at all.
        let t = Instant::now();
        beacon.wait(Some(seen), long);
        assert!(t.elapsed() < long);
        // A paused worker (no `seen`) sleeps through write-backs...
        let short = Duration::from_millis(300);
        assert!(waited(&beacon, None, short, || beacon.wrote_back()) >= short);
        // ...but not through the end of the pass, which wakes every waiter.
        let seen = beacon.write_backs();
        assert!(waited(&beacon, None, long, || beacon.set_quiet()) < long);
        assert!(beacon.is_quiet());
        assert!(waited(&beacon, Some(seen), long, || ()) < long);
    }
}
