//! Concurrent workers on one outbox (spec §3.4): 8 threads share one store while a
//! producer appends 20,000 events (8,000 on PostgreSQL) for two consumers and a coordinator drives a manual clock
//! (so leases expire and retries come due without sleeping). Workers claim batches and, by a
//! seeded dice roll, finish, fail retryably, fail permanently, renew, or abandon (a crash:
//! never acknowledged, the lease runs out).
//!
//! A tracker records every claim and acknowledgement per delivery and fails on:
//! two live claims of one delivery, an ack accepted for a claim that was not live, a live
//! claim refused, a claim of a finished delivery or of a retry before its backoff. At the
//! end every delivery is done or dead, and dead is exactly the injected permanent failures
//! plus retries that ran out (none lost, none extra).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ce_core::{
    Clock, DeliveryStatus, EVENT_VERSION, ErrorCode, EventPayload, ManualClock, Millis,
    OutboxEventCreate, UpsertContextPayload, UpsertReason,
};
use ce_store::{ClaimedEvent, SourceStore, StoreError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{self, Backend, OpenStore as _, T0, backend_tests};

backend_tests!(eight_workers_never_share_a_delivery_and_lose_nothing);

/// Events appended per backend: a PostgreSQL round trip costs more than a SQLite call, and
/// fewer events keep its run in CI time with the same interleavings per event.
fn events(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 20_000,
        Backend::Postgres => 8_000,
    }
}
const WORKERS: usize = 8;
const CONSUMERS: [&str; 2] = ["vector", "keyword"];
const APPEND_BATCH: usize = 250;
/// Clock step of the coordinator per real millisecond: a 15 s lease lasts ~150 ms.
const TICK_MS: Millis = 100;
/// The largest clock step at once (a coordinator scheduled late does not expire every lease).
const MAX_STEP_MS: Millis = 2_000;
/// Real time without any acknowledgement after which the run fails as stuck.
const STALL: Duration = Duration::from_secs(60);
const BASE_BACKOFF_MS: Millis = 1_000;

#[derive(Debug, Clone)]
struct Holder {
    token: String,
    claimed_at: Millis,
    until: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Done,
    Retry,
    Dead,
}

#[derive(Debug, Default)]
struct Slot {
    /// The latest claim not yet acknowledged (it may have expired).
    holder: Option<Holder>,
    /// The last accepted acknowledgement and a lower bound of the store time it ran at.
    last: Option<(Outcome, Millis)>,
    /// Whether this delivery was failed on purpose with a permanent error.
    injected_dead: bool,
    /// Whether a retryable failure ran out of retries.
    exhausted: bool,
}

struct Tracker {
    events: usize,
    slots: Vec<Mutex<Slot>>,
    clock: ManualClock,
    lease_ms: Millis,
    max_retries: u32,
    violations: Mutex<Vec<String>>,
    stop: AtomicBool,
    stats: [AtomicU64; 8],
}

// Indexes of `Tracker::stats`.
const CLAIMED: usize = 0;
const DONE: usize = 1;
const RETRIED: usize = 2;
const KILLED: usize = 3;
const ABANDONED: usize = 4;
const RENEWED: usize = 5;
const CONFLICTS: usize = 6;
const EMPTY_CLAIMS: usize = 7;

impl Tracker {
    fn slot(&self, consumer: usize, seq: i64) -> MutexGuard<'_, Slot> {
        let i = consumer * (self.events + 1) + usize::try_from(seq).expect("positive seq");
        self.slots[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn violation(&self, v: String) {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(v);
        self.stop.store(true, Ordering::SeqCst);
    }

    fn bump(&self, i: usize, n: u64) {
        self.stats[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Records a claim the store handed out, checking it against what came before.
    fn on_claim(&self, c: usize, ce: &ClaimedEvent) {
        let claim = &ce.claim;
        let at = claim.claimed_until_ms - self.lease_ms;
        let mut slot = self.slot(c, claim.seq);
        let key = format!("{}/{}", CONSUMERS[c], claim.seq);
        match (&slot.holder, slot.last) {
            (Some(h), _) if h.claimed_at <= at => {
                if h.until > at {
                    self.violation(format!(
                        "{key}: claimed at {at} while claim {} holds it until {}",
                        h.token, h.until
                    ));
                }
            }
            (Some(h), _) => {
                // Our claim was recorded late: it must have ended before the newer one began.
                if claim.claimed_until_ms > h.claimed_at {
                    self.violation(format!(
                        "{key}: overlapping claims {} and {}",
                        claim.token, h.token
                    ));
                }
                return;
            }
            // Our claim was recorded late, after a newer claim was acknowledged (a worker
            // stalled between its claim and this call): it must have ended before that
            // acknowledgement (the newer claim began after it ended, and before the ack).
            (None, Some((_, acked_at))) if claim.claimed_until_ms <= acked_at => return,
            (None, Some((Outcome::Done | Outcome::Dead, acked_at))) => {
                self.violation(format!(
                    "{key}: claimed at {at} (until {}) after it finished at {acked_at} ({:?})",
                    claim.claimed_until_ms, slot.last
                ));
            }
            (None, Some((Outcome::Retry, failed_at))) => {
                if at < failed_at + BASE_BACKOFF_MS {
                    self.violation(format!(
                        "{key}: retried at {at}, before the backoff after {failed_at}"
                    ));
                }
            }
            (None, None) => {}
        }
        slot.holder = Some(Holder {
            token: claim.token.clone(),
            claimed_at: at,
            until: claim.claimed_until_ms,
        });
    }

    /// Runs one acknowledgement under the delivery's lock and checks the store's verdict.
    fn ack(&self, store: &dyn SourceStore, c: usize, ce: &ClaimedEvent, action: Action) {
        let claim = &ce.claim;
        let mut slot = self.slot(c, claim.seq);
        let key = format!("{}/{}", CONSUMERS[c], claim.seq);
        let lower = self.clock.now_ms();
        let res: Result<Verdict, StoreError> = match action {
            Action::Done => store
                .mark_done(claim)
                .map(|()| Verdict::Finished(Outcome::Done)),
            Action::Retry | Action::Kill => {
                let retryable = action == Action::Retry;
                let code = if retryable {
                    ErrorCode::EmbedTimeout
                } else {
                    ErrorCode::InvalidPayload
                };
                store
                    .mark_failed(claim, &common::failure("injected", code, retryable))
                    .map(|s| match s {
                        DeliveryStatus::RetryWait => Verdict::Finished(Outcome::Retry),
                        DeliveryStatus::Dead => Verdict::Finished(Outcome::Dead),
                        other => Verdict::Odd(other),
                    })
            }
            Action::Renew => store.renew(claim).map(Verdict::Renewed),
            Action::Abandon => return,
        };
        let upper = self.clock.now_ms();
        let ours = slot
            .holder
            .as_ref()
            .filter(|h| h.token == claim.token)
            .cloned();
        let verdict = match res {
            Ok(v) => v,
            Err(StoreError::ClaimConflict { .. }) => {
                self.bump(CONFLICTS, 1);
                if let Some(h) = ours
                    && upper < h.until
                {
                    self.violation(format!(
                        "{key}: {action:?} refused a live claim (until {}, now ≤{upper})",
                        h.until
                    ));
                }
                return;
            }
            Err(e) => return self.violation(format!("{key}: {action:?} failed: {e}")),
        };
        // mark_done repeated on a delivery someone finished is accepted unchanged.
        let repeat = matches!(verdict, Verdict::Finished(Outcome::Done))
            && slot.holder.is_none()
            && matches!(slot.last, Some((Outcome::Done, _)));
        if repeat {
            return;
        }
        match &ours {
            None => {
                return self.violation(format!(
                    "{key}: {action:?} accepted from {} without the claim",
                    claim.token
                ));
            }
            Some(h) if lower >= h.until => {
                return self.violation(format!(
                    "{key}: {action:?} accepted at ≥{lower} after the lease ended at {}",
                    h.until
                ));
            }
            Some(_) => {}
        }
        let outcome = match verdict {
            Verdict::Odd(s) => return self.violation(format!("{key}: mark_failed returned {s}")),
            Verdict::Renewed(until) => {
                if until < lower + self.lease_ms || until > upper + self.lease_ms {
                    self.violation(format!(
                        "{key}: renewed until {until}, now in [{lower}, {upper}]"
                    ));
                }
                if let Some(h) = slot.holder.as_mut() {
                    h.until = until;
                }
                return;
            }
            Verdict::Finished(o) => o,
        };
        slot.holder = None;
        slot.last = Some((outcome, lower));
        match (action, outcome) {
            (Action::Kill, Outcome::Dead) => slot.injected_dead = true,
            (Action::Kill, other) => {
                self.violation(format!("{key}: permanent failure gave {other:?}"))
            }
            (Action::Retry, Outcome::Dead) => {
                if ce.retry_count < self.max_retries {
                    self.violation(format!("{key}: dead after {} retries", ce.retry_count));
                }
                slot.exhausted = true;
            }
            (Action::Retry, Outcome::Retry) if ce.retry_count >= self.max_retries => {
                self.violation(format!(
                    "{key}: retried beyond max_retries ({})",
                    ce.retry_count
                ));
            }
            _ => {}
        }
        let stat = match outcome {
            Outcome::Done => DONE,
            Outcome::Retry => RETRIED,
            Outcome::Dead => KILLED,
        };
        self.bump(stat, 1);
    }
}

/// What an accepted acknowledgement did.
enum Verdict {
    Finished(Outcome),
    Renewed(Millis),
    Odd(DeliveryStatus),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Done,
    Retry,
    Kill,
    Renew,
    Abandon,
}

fn worker(store: &dyn SourceStore, t: &Tracker, id: usize, seed: u64, producer_done: &AtomicBool) {
    let mut rng = StdRng::seed_from_u64(seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let name = format!("w{id}");
    while !t.stop.load(Ordering::SeqCst) {
        let c = rng.random_range(0..CONSUMERS.len());
        let batch = match store.claim_batch(CONSUMERS[c], &name, rng.random_range(1..=32)) {
            Ok(b) => b,
            Err(e) => return t.violation(format!("claim_batch failed: {e}")),
        };
        if batch.is_empty() {
            t.bump(EMPTY_CLAIMS, 1);
            std::thread::sleep(Duration::from_micros(
                if producer_done.load(Ordering::SeqCst) {
                    500
                } else {
                    100
                },
            ));
            continue;
        }
        t.bump(CLAIMED, batch.len() as u64);
        if batch.windows(2).any(|w| w[0].claim.seq >= w[1].claim.seq) {
            t.violation(format!(
                "batch not in seq order: {:?}",
                batch.iter().map(|b| b.claim.seq).collect::<Vec<_>>()
            ));
        }
        for ce in &batch {
            t.on_claim(c, ce);
        }
        if rng.random_bool(0.01) {
            // The worker crashes holding the whole batch.
            t.bump(ABANDONED, batch.len() as u64);
            continue;
        }
        for ce in &batch {
            // A few deliveries are flaky and fail retryably most of the time (they run out).
            let flaky = ce.claim.seq % 211 == 0;
            let action = match rng.random_range(0..1000) {
                _ if flaky => {
                    if rng.random_bool(0.9) {
                        Action::Retry
                    } else {
                        Action::Done
                    }
                }
                0..20 => Action::Abandon,
                20..25 => Action::Kill,
                25..105 => Action::Retry,
                _ => Action::Done,
            };
            if action == Action::Abandon {
                t.bump(ABANDONED, 1);
                continue;
            }
            if rng.random_bool(0.05) {
                t.ack(store, c, ce, Action::Renew);
                t.bump(RENEWED, 1);
            }
            t.ack(store, c, ce, action);
        }
    }
}

fn eight_workers_never_share_a_delivery_and_lose_nothing(backend: Backend) {
    let seed = common::seed("eight_workers_never_share_a_delivery_and_lose_nothing");
    let mut config = common::two_consumers();
    config.index.worker.lease_seconds = 15;
    config.index.worker.heartbeat_seconds = 5;
    config.index.outbox.retry_base_seconds = 1;
    config.index.outbox.retry_max_seconds = 30;
    let max_retries = config.index.outbox.max_retries;
    let events = events(backend);
    let place = backend.place();
    let clock = ManualClock::new(T0);
    let store = place.open(config, Arc::new(clock.clone()));
    let tracker = Arc::new(Tracker {
        events,
        slots: (0..CONSUMERS.len() * (events + 1))
            .map(|_| Mutex::new(Slot::default()))
            .collect(),
        clock: clock.clone(),
        lease_ms: 15_000,
        max_retries,
        violations: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        stats: Default::default(),
    });
    let producer_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    std::thread::scope(|scope| {
        scope.spawn(|| {
            for chunk in 0..events / APPEND_BATCH {
                let batch = (0..APPEND_BATCH)
                    .map(|i| OutboxEventCreate {
                        payload: EventPayload::UpsertContext(UpsertContextPayload {
                            event_version: EVENT_VERSION,
                            uri: common::uri(&format!("ctx://load/c{chunk}/e{i}")),
                            expected_node_version: 1,
                            reason: UpsertReason::Create,
                            trace_id: String::new(),
                        }),
                    })
                    .collect();
                let appended = store.append_batch(batch).expect("append");
                assert!(
                    appended
                        .iter()
                        .all(|e| (1..=events as i64).contains(&e.seq)),
                    "unexpected seq"
                );
            }
            producer_done.store(true, Ordering::SeqCst);
        });
        for id in 0..WORKERS {
            let (store, t, done) = (store.as_ref(), &tracker, &producer_done);
            scope.spawn(move || worker(store, t, id, seed, done));
        }
        // The coordinator: moves time, and stops everyone once every delivery is terminal.
        // The clock follows real time (TICK_MS per real millisecond, however late this thread
        // is scheduled on a busy machine); the run fails when acknowledgements stop, not after
        // a fixed time (how fast a loaded CI machine drains is not what this test checks).
        let mut last_check = Instant::now();
        let mut last_tick = Instant::now();
        let mut progress = (0, Instant::now());
        while !tracker.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
            let real_ms = Millis::try_from(last_tick.elapsed().as_millis()).unwrap_or(Millis::MAX);
            if real_ms > 0 {
                last_tick = Instant::now();
                clock.advance(real_ms.min(MAX_STEP_MS / TICK_MS) * TICK_MS);
            }
            let acks = [DONE, RETRIED, KILLED].map(|i| tracker.stats[i].load(Ordering::Relaxed));
            let acks: u64 = acks.iter().sum();
            if acks != progress.0 {
                progress = (acks, Instant::now());
            } else if progress.1.elapsed() > STALL {
                tracker.violation(format!(
                    "no acknowledgement for {STALL:?} before the outbox drained ({acks} so far)"
                ));
            }
            if producer_done.load(Ordering::SeqCst)
                && last_check.elapsed() > Duration::from_millis(50)
            {
                last_check = Instant::now();
                let stats = store.stats().expect("stats");
                if stats
                    .iter()
                    .all(|s| s.pending + s.claimed + s.retry_wait == 0)
                {
                    tracker.stop.store(true, Ordering::SeqCst);
                }
            }
        }
    });

    let violations = tracker
        .violations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let stat = |i: usize| tracker.stats[i].load(Ordering::Relaxed);
    eprintln!(
        "{:?}: claimed {} done {} retried {} dead {} abandoned {} renewed {} conflicts {} empty claims {}, clock +{} s",
        started.elapsed(),
        stat(CLAIMED),
        stat(DONE),
        stat(RETRIED),
        stat(KILLED),
        stat(ABANDONED),
        stat(RENEWED),
        stat(CONFLICTS),
        stat(EMPTY_CLAIMS),
        (clock.now_ms() - T0) / 1000
    );
    assert!(
        violations.is_empty(),
        "CE_SEED={seed}: {} violations:\n  {}",
        violations.len(),
        violations[..violations.len().min(20)].join("\n  ")
    );

    let rows = common::all_deliveries(store.as_ref());
    assert_eq!(
        rows.len(),
        events * CONSUMERS.len(),
        "deliveries == events × consumers"
    );
    let mut dead = BTreeSet::new();
    let mut expected_dead = BTreeSet::new();
    for r in &rows {
        let c = CONSUMERS
            .iter()
            .position(|c| *c == r.delivery.consumer)
            .expect("known consumer");
        let slot = tracker.slot(c, r.delivery.seq);
        let key = (c, r.delivery.seq);
        match r.delivery.status {
            DeliveryStatus::Done => {
                assert_eq!(
                    slot.last.map(|l| l.0),
                    Some(Outcome::Done),
                    "{key:?} done without our ack"
                );
            }
            DeliveryStatus::Dead => {
                dead.insert(key);
                assert_eq!(
                    r.delivery.error_code.as_deref(),
                    Some(if slot.injected_dead {
                        "invalid_payload"
                    } else {
                        "embed_timeout"
                    })
                );
            }
            other => panic!("{key:?} is {other} after the drain"),
        }
        if slot.injected_dead || slot.exhausted {
            expected_dead.insert(key);
        }
    }
    assert_eq!(
        dead, expected_dead,
        "dead deliveries are exactly the injected permanent failures and exhausted retries"
    );
    // The maintained done counts (in shards per server process on PostgreSQL) add up to the
    // done rows after eight workers acknowledged concurrently.
    for s in store.stats().expect("stats") {
        let done_rows = rows
            .iter()
            .filter(|r| r.delivery.consumer == s.consumer)
            .filter(|r| r.delivery.status == DeliveryStatus::Done)
            .count() as u64;
        assert_eq!(s.done, done_rows, "done count of {}", s.consumer);
    }
    assert!(
        expected_dead
            .iter()
            .any(|k| tracker.slot(k.0, k.1).exhausted),
        "no delivery ran out of retries"
    );
    assert!(
        stat(ABANDONED) > 0 && stat(KILLED) > 0 && stat(RETRIED) > 0,
        "every fault was injected"
    );
}
