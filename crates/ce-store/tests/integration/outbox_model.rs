//! The outbox delivery state machine (spec §3.2–§3.4) against a `BTreeMap` model.
//!
//! A proptest strategy generates op sequences (append, claim, renew, done alone and in
//! batches, retryable and non-retryable failure, clock moves onto and just before every
//! deadline, requeue, and the filtered dead repairs: count, requeue, force done); after every
//! step each delivery of the store must equal the model: status, retry count, visibility, the
//! live claim, the last error and `updated_at` (so a refused ack provably changed nothing),
//! plus the per-consumer stats.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use ce_core::{
    Classify, DeliveryStatus, EVENT_VERSION, ErrorCode, EventPayload, Millis, OutboxEventCreate,
    UpsertContextPayload, UpsertReason, test_cases,
};
use ce_store::model::{DeadCounts, DeadFilter, FORCED_DONE_CODE};
use ce_store::{Claim, SourceStore, StoreError};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};

use crate::common::{self, Backend, OpenStore as _, Place, T0, backend_tests};

backend_tests!(
    outbox_matches_model,
    append_refuses_payloads_it_cannot_read_back,
    list_paging_returns_every_row_once,
    consumers_added_later_get_every_event,
    a_pruned_journal_rebuilds_what_it_cannot_back_fill,
    pruning_races_appends_acknowledgements_and_registration,
);

const CONSUMERS: [&str; 2] = ["vector", "keyword"];
const WORKERS: [&str; 3] = ["w0", "w1", "w2"];

/// Per-case configuration: the outbox knobs the state machine depends on.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    max_retries: u32,
    retry_max_seconds: u32,
    dead_letter_enabled: bool,
}

#[derive(Debug, Clone, Copy)]
enum Advance {
    /// A fixed step (includes the 60 s lease and the backoff cap).
    By(Millis),
    /// Exactly onto the nearest future deadline (a visibility time or a lease end).
    ToNextDeadline,
    /// One millisecond before the nearest future deadline.
    JustBeforeNextDeadline,
}

#[derive(Debug, Clone)]
enum Op {
    Append(usize),
    Claim {
        consumer: usize,
        worker: usize,
        limit: usize,
    },
    /// The claim ops pick a claim from the history, counted from the newest (so stale
    /// claims are exercised too).
    Renew(usize),
    Done(usize),
    /// `mark_done_batch` of several picked claims (stale, repeated and live ones mixed).
    DoneBatch(Vec<usize>),
    FailRetryable(usize),
    FailNonRetryable(usize),
    Advance(Advance),
    Requeue(Option<usize>),
    /// `requeue_dead(None, [seq of the n-th event])`: only dead deliveries may move.
    RequeueSeq(usize),
    /// A worker that keeps failing: `times` × (move the clock to the next deadline when
    /// nothing is runnable, claim one, fail it retryably), each step checked on its own.
    /// Reaches the retry cap and the dead letter within a short sequence.
    FailLoop {
        consumer: usize,
        worker: usize,
        times: usize,
    },
    /// `count_dead` of a filter: changes nothing.
    CountDead(DeadPick),
    /// `requeue_dead_matching` of a filter.
    RequeueMatching(DeadPick),
    /// `force_done` of a filter.
    ForceDone(DeadPick),
    /// `prune_journal` with this retention (ms).
    Prune(Millis),
}

/// A [`DeadFilter`] in terms of the case: event indexes are taken modulo the journal.
#[derive(Debug, Clone)]
struct DeadPick {
    consumer: Option<usize>,
    /// `Some(retryable)`: the code of a retryable or of a non-retryable failure.
    code: Option<bool>,
    /// From the sequence of this event on.
    min_event: Option<usize>,
    /// Only the events appended by the op of this event (their common parent URI).
    subtree_of: Option<usize>,
    exhausted_only: bool,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![Just(3u32), Just(8)],
        prop_oneof![Just(30u32), Just(300)],
        0..4u8,
    )
        .prop_map(|(max_retries, retry_max_seconds, d)| Knobs {
            max_retries,
            retry_max_seconds,
            dead_letter_enabled: d != 0,
        })
}

fn dead_pick() -> impl Strategy<Value = DeadPick> {
    (
        prop::option::of(0..2usize),
        prop::option::of(any::<bool>()),
        prop::option::of(0..64usize),
        prop::option::of(0..64usize),
        prop_oneof![3 => Just(false), 1 => Just(true)],
    )
        .prop_map(
            |(consumer, code, min_event, subtree_of, exhausted_only)| DeadPick {
                consumer,
                code,
                min_event,
                subtree_of,
                exhausted_only,
            },
        )
}

/// The error code of a retryable (else a non-retryable) failure.
fn failure_code(retryable: bool) -> ErrorCode {
    if retryable {
        ErrorCode::EmbedTimeout
    } else {
        ErrorCode::InvalidPayload
    }
}

fn claim_index() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0..2usize, 1 => 0..64usize]
}

fn op() -> impl Strategy<Value = Op> {
    let advance = prop_oneof![
        2 => prop::sample::select(vec![
            1, 500, 999, 1_000, 2_000, 4_000, 59_999, 60_000, 60_001, 300_000, 360_001,
        ])
        .prop_map(Advance::By),
        3 => Just(Advance::ToNextDeadline),
        1 => Just(Advance::JustBeforeNextDeadline),
    ];
    prop_oneof![
        2 => (1..=4usize).prop_map(Op::Append),
        5 => (0..2usize, 0..3usize, 1..=5usize)
            .prop_map(|(consumer, worker, limit)| Op::Claim { consumer, worker, limit }),
        1 => claim_index().prop_map(Op::Renew),
        3 => claim_index().prop_map(Op::Done),
        2 => prop::collection::vec(claim_index(), 1..=4).prop_map(Op::DoneBatch),
        4 => claim_index().prop_map(Op::FailRetryable),
        1 => claim_index().prop_map(Op::FailNonRetryable),
        4 => advance.prop_map(Op::Advance),
        1 => prop::option::of(0..2usize).prop_map(Op::Requeue),
        1 => (0..64usize).prop_map(Op::RequeueSeq),
        2 => (0..2usize, 0..3usize, 1..=24usize)
            .prop_map(|(consumer, worker, times)| Op::FailLoop { consumer, worker, times }),
        1 => dead_pick().prop_map(Op::CountDead),
        1 => dead_pick().prop_map(Op::RequeueMatching),
        1 => dead_pick().prop_map(Op::ForceDone),
        2 => prop::sample::select(vec![0, 1_000, 60_000]).prop_map(Op::Prune),
    ]
}

/// What the model knows of one delivery.
#[derive(Debug, Clone)]
struct Expected {
    status: DeliveryStatus,
    retry_count: u32,
    /// Claimable from (pending, retry_wait).
    visible: Option<Millis>,
    /// The live claim (claimed): token, worker, lease end.
    claim: Option<(String, String, Millis)>,
    /// Last failure, when the model knows it.
    error: Option<(String, String)>,
    updated_at: Millis,
}

struct Model {
    knobs: Knobs,
    lease_ms: Millis,
    now: Millis,
    /// seq → (event id, created_at).
    events: BTreeMap<i64, (String, Millis)>,
    /// seq → the URI of its event.
    uris: BTreeMap<i64, String>,
    deliveries: BTreeMap<(String, i64), Expected>,
    claims: Vec<Claim>,
    /// The newest event pruned (every event is untargeted here).
    pruned_through: i64,
}

type Step = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

impl Model {
    fn pick(&self, idx: usize) -> Option<Claim> {
        let n = self.claims.len();
        (n > 0).then(|| self.claims[n - 1 - idx % n].clone())
    }

    fn key(c: &Claim) -> (String, i64) {
        (c.consumer.clone(), c.seq)
    }

    /// Whether `c` is the live claim of its delivery at `now` (the fencing rule).
    fn is_live(&self, c: &Claim) -> bool {
        self.deliveries.get(&Self::key(c)).is_some_and(|d| {
            d.status == DeliveryStatus::Claimed
                && d.claim
                    .as_ref()
                    .is_some_and(|(t, _, until)| *t == c.token && self.now < *until)
        })
    }

    fn runnable(&self, consumer: &str) -> Vec<i64> {
        self.deliveries
            .iter()
            .filter(|((c, _), _)| c == consumer)
            .filter(|(_, d)| match d.status {
                DeliveryStatus::Pending | DeliveryStatus::RetryWait => {
                    d.visible.is_some_and(|v| v <= self.now)
                }
                DeliveryStatus::Claimed => d.claim.as_ref().is_some_and(|c| c.2 <= self.now),
                _ => false,
            })
            .map(|((_, s), _)| *s)
            .collect()
    }

    fn next_deadline(&self) -> Option<Millis> {
        self.deliveries
            .values()
            .filter_map(|d| match d.status {
                DeliveryStatus::Pending | DeliveryStatus::RetryWait => d.visible,
                DeliveryStatus::Claimed => d.claim.as_ref().map(|c| c.2),
                _ => None,
            })
            .filter(|t| *t > self.now)
            .min()
    }

    /// The `mark_done` of `claim` at `now`: what the store must answer (`Ok` when the claim
    /// is live or the delivery already done, else a conflict — also when the delivery was
    /// pruned), applied to the model.
    fn done(&mut self, claim: &Claim, got: ce_store::Result<()>, what: &str) -> Step {
        let live = self.is_live(claim);
        let now = self.now;
        let Some(d) = self.deliveries.get_mut(&Self::key(claim)) else {
            // Only done deliveries are pruned: it answers as a done one does.
            return got.map_err(|e| format!("{what} repeated on a pruned delivery: {e}"));
        };
        if live {
            got.map_err(|e| format!("{what} of a live claim: {e}"))?;
            d.status = DeliveryStatus::Done;
            d.claim = None;
            d.updated_at = now;
        } else if d.status == DeliveryStatus::Done {
            got.map_err(|e| format!("{what} repeated on a done delivery: {e}"))?;
        } else {
            conflict(&format!("{what} of a dead claim"), got)?;
        }
        Ok(())
    }

    /// The filter `p` stands for in this case.
    fn dead_filter(&self, p: &DeadPick) -> DeadFilter {
        let seq_of = |i: usize| {
            self.events
                .keys()
                .nth(i % self.events.len().max(1))
                .copied()
        };
        DeadFilter {
            consumer: p.consumer.map(|c| CONSUMERS[c].to_owned()),
            error_code: p.code.map(|r| failure_code(r).as_str().to_owned()),
            min_seq: p.min_event.and_then(seq_of),
            subtree: p
                .subtree_of
                .and_then(seq_of)
                .and_then(|s| common::uri(&self.uris[&s]).parent()),
            exhausted_only: p.exhausted_only,
            ..DeadFilter::default()
        }
    }

    /// The dead deliveries `f` selects, by the model.
    fn dead_matching(&self, f: &DeadFilter) -> Result<Vec<(String, i64)>, String> {
        let mut out = Vec::new();
        for ((c, seq), d) in &self.deliveries {
            if d.status != DeliveryStatus::Dead {
                continue;
            }
            let (_, code) = d
                .error
                .as_ref()
                .ok_or("a dead delivery without its error")?;
            let uri = &self.uris[seq];
            let within = f
                .subtree
                .as_ref()
                .is_none_or(|s| uri == s.as_str() || uri.starts_with(&format!("{}/", s.as_str())));
            if f.consumer.as_ref().is_none_or(|fc| fc == c)
                && f.error_code.as_ref().is_none_or(|fc| fc == code)
                && f.min_seq.is_none_or(|m| *seq >= m)
                && (!f.exhausted_only || d.retry_count >= self.knobs.max_retries)
                && within
            {
                out.push((c.clone(), *seq));
            }
        }
        Ok(out)
    }

    /// The backoff bounds of retry `n` (1-based): `[min(base·2^(n-1), max), +jitter]`.
    fn backoff_bounds(&self, n: u32) -> (Millis, Millis) {
        let base = 2_000i64;
        let d = (base << (n - 1).min(30)).min(i64::from(self.knobs.retry_max_seconds) * 1000);
        (d, d + d / 5)
    }
}

fn conflict<T: std::fmt::Debug>(what: &str, got: ce_store::Result<T>) -> Step {
    match got {
        Err(e @ StoreError::ClaimConflict { .. }) => {
            ensure!(
                e.code() == ErrorCode::ClaimConflict && e.is_retryable(),
                "{what}: {e} misclassified"
            );
            Ok(())
        }
        other => Err(format!(
            "{what}: the model expects ClaimConflict, the store gave {other:?}"
        )),
    }
}

/// What the journal keeps after a prune at `m.now` with `retain` ms: done deliveries
/// changed before the cutoff go, then events appended before it that have no delivery
/// left, except the newest event. Returns (deliveries, events) removed.
fn prune_model(m: &mut Model, retain: Millis) -> (u64, u64) {
    let cutoff = m.now - retain;
    let before = m.deliveries.len();
    m.deliveries
        .retain(|_, d| !(d.status == DeliveryStatus::Done && d.updated_at < cutoff));
    let newest = m.events.keys().next_back().copied().unwrap_or(0);
    let held: std::collections::BTreeSet<i64> = m.deliveries.keys().map(|(_, q)| *q).collect();
    let gone: Vec<i64> = m
        .events
        .iter()
        .filter(|(q, (_, at))| **q < newest && *at < cutoff && !held.contains(q))
        .map(|(q, _)| *q)
        .collect();
    for q in &gone {
        m.events.remove(q);
        m.pruned_through = m.pruned_through.max(*q);
    }
    ((before - m.deliveries.len()) as u64, gone.len() as u64)
}

fn apply(
    store: &dyn SourceStore,
    clock: &ce_core::ManualClock,
    m: &mut Model,
    op: &Op,
    step: usize,
) -> Step {
    match *op {
        Op::Append(n) => {
            let batch = (0..n)
                .map(|i| OutboxEventCreate {
                    payload: EventPayload::UpsertContext(UpsertContextPayload {
                        event_version: EVENT_VERSION,
                        uri: common::uri(&format!("ctx://m/s{step}/e{i}")),
                        expected_node_version: 1,
                        reason: UpsertReason::Create,
                        trace_id: format!("t{step}"),
                    }),
                })
                .collect();
            let got = store
                .append_batch(batch)
                .map_err(|e| format!("append: {e}"))?;
            ensure!(
                got.len() == n,
                "append returned {} events for {n}",
                got.len()
            );
            let mut last = m.events.keys().next_back().copied().unwrap_or(0);
            for e in got {
                ensure!(e.seq > last, "append: seq {} not above {last}", e.seq);
                last = e.seq;
                m.events.insert(e.seq, (e.event_id.clone(), m.now));
                m.uris.insert(e.seq, e.uri.as_str().to_owned());
                for c in CONSUMERS {
                    m.deliveries.insert(
                        (c.to_owned(), e.seq),
                        Expected {
                            status: DeliveryStatus::Pending,
                            retry_count: 0,
                            visible: Some(m.now),
                            claim: None,
                            error: None,
                            updated_at: m.now,
                        },
                    );
                }
            }
        }
        Op::Claim {
            consumer,
            worker,
            limit,
        } => {
            let (c, w) = (CONSUMERS[consumer], WORKERS[worker]);
            let mut expected = m.runnable(c);
            expected.truncate(limit);
            let got = store
                .claim_batch(c, w, limit)
                .map_err(|e| format!("claim: {e}"))?;
            let seqs: Vec<i64> = got.iter().map(|ce| ce.claim.seq).collect();
            ensure!(
                seqs == expected,
                "claim {c} limit {limit}: got seqs {seqs:?}, model {expected:?}"
            );
            let until = m.now + m.lease_ms;
            for ce in &got {
                let key = (c.to_owned(), ce.claim.seq);
                let d = m
                    .deliveries
                    .get_mut(&key)
                    .ok_or("claim of an unknown delivery")?;
                ensure!(
                    ce.claim.token == got[0].claim.token,
                    "one batch, several tokens"
                );
                ensure!(
                    d.claim.as_ref().is_none_or(|old| old.0 != ce.claim.token),
                    "re-claim of {key:?} reused the old token"
                );
                ensure!(
                    ce.claim.claimed_until_ms == until,
                    "lease ends {} not {until}",
                    ce.claim.claimed_until_ms
                );
                ensure!(
                    ce.retry_count == d.retry_count,
                    "claim says retry_count {}, model {}",
                    ce.retry_count,
                    d.retry_count
                );
                ensure!(
                    ce.claim.worker_id == w && ce.claim.consumer == c,
                    "claim names {ce:?}"
                );
                ensure!(
                    ce.event.event_id == m.events[&ce.claim.seq].0,
                    "claim handed another event"
                );
                ensure!(
                    ce.claim.event_id == ce.event.event_id,
                    "claim and event ids differ"
                );
                d.status = DeliveryStatus::Claimed;
                d.visible = None;
                d.claim = Some((ce.claim.token.clone(), w.to_owned(), until));
                d.updated_at = m.now;
                m.claims.push(ce.claim.clone());
            }
        }
        Op::Renew(i) => {
            let Some(claim) = m.pick(i) else {
                return Ok(());
            };
            let got = store.renew(&claim);
            if m.is_live(&claim) {
                let until = got.map_err(|e| format!("renew of a live claim: {e}"))?;
                ensure!(
                    until == m.now + m.lease_ms,
                    "renew until {until}, want {}",
                    m.now + m.lease_ms
                );
                let d = m
                    .deliveries
                    .get_mut(&Model::key(&claim))
                    .ok_or("unknown delivery")?;
                if let Some(c) = d.claim.as_mut() {
                    c.2 = until;
                }
                d.updated_at = m.now;
            } else {
                conflict("renew of a dead claim", got)?;
            }
        }
        Op::Done(i) => {
            let Some(claim) = m.pick(i) else {
                return Ok(());
            };
            let got = store.mark_done(&claim);
            m.done(&claim, got, "mark_done")?;
        }
        Op::DoneBatch(ref picks) => {
            let claims: Vec<Claim> = picks.iter().filter_map(|&i| m.pick(i)).collect();
            if claims.is_empty() {
                return Ok(());
            }
            let got = store
                .mark_done_batch(&claims)
                .map_err(|e| format!("mark_done_batch: {e}"))?;
            ensure!(
                got.len() == claims.len(),
                "mark_done_batch answered {} of {} claims",
                got.len(),
                claims.len()
            );
            // One answer per claim, as if each were acknowledged alone in the given order.
            for (claim, answer) in claims.iter().zip(got) {
                m.done(claim, answer, "mark_done_batch")?;
            }
        }
        Op::FailRetryable(i) | Op::FailNonRetryable(i) => {
            let retryable = matches!(op, Op::FailRetryable(_));
            let Some(claim) = m.pick(i) else {
                return Ok(());
            };
            let live = m.is_live(&claim);
            let (msg, code) = (format!("boom {step}"), failure_code(retryable));
            let got = store.mark_failed(&claim, &common::failure(&msg, code, retryable));
            if !live {
                return conflict("mark_failed of a dead claim", got);
            }
            let status = got.map_err(|e| format!("mark_failed of a live claim: {e}"))?;
            let k = m.knobs;
            let now = m.now;
            let key = Model::key(&claim);
            let count = m.deliveries[&key].retry_count;
            let exhausted = count >= k.max_retries;
            let want = if !retryable || (exhausted && k.dead_letter_enabled) {
                DeliveryStatus::Dead
            } else {
                DeliveryStatus::RetryWait
            };
            ensure!(
                status == want,
                "mark_failed(retryable={retryable}) at retry_count {count} gave {status}, want {want}"
            );
            let new_count = if want == DeliveryStatus::Dead {
                count
            } else {
                (count + 1).min(k.max_retries)
            };
            let mut visible = None;
            if want == DeliveryStatus::RetryWait {
                let (_, rows) = store
                    .show(&claim.event_id)
                    .map_err(|e| format!("show: {e}"))?;
                let row = rows
                    .iter()
                    .find(|r| r.consumer == claim.consumer)
                    .ok_or("no delivery row")?;
                let at = row
                    .next_visible_at_ms
                    .ok_or("retry_wait without next_visible_at")?;
                let (lo, hi) = m.backoff_bounds(new_count);
                ensure!(
                    (now + lo..=now + hi).contains(&at),
                    "retry {new_count}: next_visible_at is now+{} ms, want within [{lo}, {hi}]",
                    at - now
                );
                visible = Some(at);
            }
            let d = m.deliveries.get_mut(&key).ok_or("unknown delivery")?;
            d.status = want;
            d.retry_count = new_count;
            d.visible = visible;
            d.claim = None;
            d.error = Some((msg, code.as_str().to_owned()));
            d.updated_at = now;
        }
        Op::Advance(a) => {
            let to = match a {
                Advance::By(ms) => Some(m.now + ms),
                Advance::ToNextDeadline => m.next_deadline(),
                Advance::JustBeforeNextDeadline => m.next_deadline().map(|t| t - 1),
            };
            if let Some(t) = to.filter(|t| *t > m.now) {
                clock.advance(t - m.now);
                m.now = t;
            }
        }
        Op::Requeue(consumer) => {
            let c = consumer.map(|i| CONSUMERS[i]);
            let n = store
                .requeue_dead(c, None)
                .map_err(|e| format!("requeue: {e}"))?;
            let now = m.now;
            let mut want = 0;
            for ((dc, _), d) in m.deliveries.iter_mut() {
                if d.status == DeliveryStatus::Dead && c.is_none_or(|c| c == dc) {
                    want += 1;
                    requeued(d, now);
                }
            }
            ensure!(n == want, "requeue({c:?}) moved {n}, want {want}");
        }
        Op::RequeueSeq(i) => {
            let Some(&seq) = m.events.keys().nth(i % m.events.len().max(1)) else {
                return Ok(());
            };
            let n = store
                .requeue_dead(None, Some(&[seq]))
                .map_err(|e| format!("requeue: {e}"))?;
            let now = m.now;
            let mut want = 0;
            for ((_, s), d) in m.deliveries.iter_mut() {
                if *s == seq && d.status == DeliveryStatus::Dead {
                    want += 1;
                    requeued(d, now);
                }
            }
            ensure!(n == want, "requeue(seq {seq}) moved {n}, want {want}");
        }
        Op::FailLoop {
            consumer,
            worker,
            times,
        } => {
            for _ in 0..times {
                if m.runnable(CONSUMERS[consumer]).is_empty() {
                    apply_checked(store, clock, m, &Op::Advance(Advance::ToNextDeadline), step)?;
                }
                let before = m.claims.len();
                apply_checked(
                    store,
                    clock,
                    m,
                    &Op::Claim {
                        consumer,
                        worker,
                        limit: 1,
                    },
                    step,
                )?;
                if m.claims.len() == before {
                    break;
                }
                apply_checked(store, clock, m, &Op::FailRetryable(0), step)?;
            }
        }
        Op::CountDead(ref p) => {
            let f = m.dead_filter(p);
            let got = store
                .count_dead(&f)
                .map_err(|e| format!("count_dead: {e}"))?;
            let want = counts(&m.dead_matching(&f)?);
            ensure!(got == want, "count_dead({f:?}): {got:?}, model {want:?}");
        }
        Op::RequeueMatching(ref p) => {
            let f = m.dead_filter(p);
            let got = store
                .requeue_dead_matching(&f)
                .map_err(|e| format!("requeue_dead_matching: {e}"))?;
            let matching = m.dead_matching(&f)?;
            let want = counts(&matching);
            ensure!(
                got == want,
                "requeue_dead_matching({f:?}): {got:?}, model {want:?}"
            );
            let now = m.now;
            for key in matching {
                let d = m.deliveries.get_mut(&key).ok_or("unknown delivery")?;
                let error = d.error.clone();
                requeued(d, now);
                // This repair keeps the last error for inspection.
                d.error = error;
            }
        }
        Op::ForceDone(ref p) => {
            let f = m.dead_filter(p);
            let got = store
                .force_done(&f)
                .map_err(|e| format!("force_done: {e}"))?;
            let matching = m.dead_matching(&f)?;
            let want = counts(&matching);
            ensure!(got == want, "force_done({f:?}): {got:?}, model {want:?}");
            let now = m.now;
            for key in matching {
                let d = m.deliveries.get_mut(&key).ok_or("unknown delivery")?;
                let (msg, code) = d.error.take().ok_or("a dead delivery without its error")?;
                let said: String =
                    format!("forced done without applying (dead with {code}: {msg})")
                        .chars()
                        .take(4096)
                        .collect();
                d.status = DeliveryStatus::Done;
                d.visible = None;
                d.claim = None;
                d.error = Some((said, FORCED_DONE_CODE.to_owned()));
                d.updated_at = now;
            }
        }
        Op::Prune(retain) => {
            // A small chunk, so that a prune takes several transactions.
            let got = store
                .prune_journal(retain, 3)
                .map_err(|e| format!("prune_journal: {e}"))?;
            let want = prune_model(m, retain);
            ensure!(
                (got.deliveries, got.events) == want,
                "prune_journal({retain}) removed {got:?}, model {want:?}"
            );
        }
    }
    Ok(())
}

/// Deliveries per consumer, as a repair reports them.
fn counts(keys: &[(String, i64)]) -> DeadCounts {
    let mut out = DeadCounts::new();
    for (c, _) in keys {
        *out.entry(c.clone()).or_default() += 1;
    }
    out
}

fn apply_checked(
    store: &dyn SourceStore,
    clock: &ce_core::ManualClock,
    m: &mut Model,
    op: &Op,
    step: usize,
) -> Step {
    apply(store, clock, m, op, step)
        .and_then(|()| compare(store, m))
        .map_err(|e| format!("in {op:?}: {e}"))
}

fn requeued(d: &mut Expected, now: Millis) {
    d.status = DeliveryStatus::Pending;
    d.retry_count = 0;
    d.visible = Some(now);
    // Whether requeue keeps the last error is not specified: stop comparing it.
    d.error = None;
    d.updated_at = now;
}

fn compare(store: &dyn SourceStore, m: &Model) -> Step {
    let rows = common::all_deliveries(store);
    ensure!(
        rows.len() == m.deliveries.len(),
        "{} deliveries, model {}",
        rows.len(),
        m.deliveries.len()
    );
    let journal = store.journal().map_err(|e| format!("journal: {e}"))?;
    let want = ce_store::model::JournalExtent {
        events: m.events.len() as u64,
        deliveries: m.deliveries.len() as u64,
        oldest_seq: m.events.keys().next().copied(),
        newest_seq: m.events.keys().next_back().copied(),
        pruned_through: m.pruned_through,
    };
    ensure!(journal == want, "journal {journal:?}, model {want:?}");
    for r in &rows {
        let d = &r.delivery;
        let key = (d.consumer.clone(), d.seq);
        let e = m
            .deliveries
            .get(&key)
            .ok_or_else(|| format!("store has an unknown delivery {key:?}"))?;
        ensure!(
            r.event.event_id == m.events[&d.seq].0,
            "{key:?}: event id changed"
        );
        ensure!(
            d.status != DeliveryStatus::Failed,
            "{key:?}: failed observed at rest"
        );
        ensure!(
            d.status == e.status,
            "{key:?}: status {} model {}",
            d.status,
            e.status
        );
        ensure!(
            d.retry_count == e.retry_count,
            "{key:?}: retry_count {} model {}",
            d.retry_count,
            e.retry_count
        );
        ensure!(
            d.updated_at_ms == e.updated_at,
            "{key:?}: updated_at moved ({} vs model {})",
            d.updated_at_ms,
            e.updated_at
        );
        match e.status {
            DeliveryStatus::Pending | DeliveryStatus::RetryWait => {
                ensure!(
                    d.next_visible_at_ms == e.visible,
                    "{key:?}: next_visible_at {:?} model {:?}",
                    d.next_visible_at_ms,
                    e.visible
                );
            }
            DeliveryStatus::Claimed => {
                let (t, w, until) = e.claim.as_ref().ok_or("model claimed without claim")?;
                ensure!(
                    d.claim_token.as_ref() == Some(t),
                    "{key:?}: claim token differs"
                );
                ensure!(
                    d.claimed_by.as_ref() == Some(w),
                    "{key:?}: claimed_by {:?} model {w}",
                    d.claimed_by
                );
                ensure!(
                    d.claimed_until_ms == Some(*until),
                    "{key:?}: claimed_until {:?} model {until}",
                    d.claimed_until_ms
                );
            }
            DeliveryStatus::Done | DeliveryStatus::Dead | DeliveryStatus::Failed => {
                ensure!(
                    d.next_visible_at_ms.is_none(),
                    "{key:?}: terminal but visible at {:?}",
                    d.next_visible_at_ms
                );
            }
        }
        if let Some((msg, code)) = &e.error {
            ensure!(
                d.last_error.as_ref() == Some(msg),
                "{key:?}: last_error {:?} model {msg:?}",
                d.last_error
            );
            ensure!(
                d.error_code.as_ref() == Some(code),
                "{key:?}: error_code {:?} model {code:?}",
                d.error_code
            );
        }
    }
    // `done` is the maintained count (every transition into done and every prune counts),
    // checked against the model's, whose rows the checks above compared one by one.
    let stats = store.stats().map_err(|e| format!("stats: {e}"))?;
    let all: Vec<String> = stats.iter().map(|s| s.consumer.clone()).collect();
    let any = store
        .has_unfinished(&all)
        .map_err(|e| format!("has_unfinished: {e}"))?;
    ensure!(
        any == stats.iter().any(|s| s.pending + s.claimed > 0),
        "has_unfinished of every consumer: {any}, stats {stats:?}"
    );
    for s in &stats {
        let mine: Vec<(&i64, &Expected)> = m
            .deliveries
            .iter()
            .filter(|((c, _), _)| *c == s.consumer)
            .map(|((_, q), e)| (q, e))
            .collect();
        let count = |st| mine.iter().filter(|(_, e)| e.status == st).count() as u64;
        let got = [s.pending, s.claimed, s.retry_wait, s.done, s.dead];
        let want = [
            count(DeliveryStatus::Pending),
            count(DeliveryStatus::Claimed),
            count(DeliveryStatus::RetryWait),
            count(DeliveryStatus::Done),
            count(DeliveryStatus::Dead),
        ];
        ensure!(
            got == want,
            "stats of {}: {got:?}, model {want:?}",
            s.consumer
        );
        let unfinished = store
            .has_unfinished(std::slice::from_ref(&s.consumer))
            .map_err(|e| format!("has_unfinished: {e}"))?;
        ensure!(
            unfinished == (want[0] + want[1] > 0),
            "has_unfinished of {}: {unfinished}, model {want:?}",
            s.consumer
        );
        let low = mine
            .iter()
            .find(|(_, e)| !e.status.is_terminal())
            .map(|(q, _)| **q);
        ensure!(
            s.low_watermark_seq == low,
            "low watermark of {}: {:?} model {low:?}",
            s.consumer,
            s.low_watermark_seq
        );
        let oldest = low.map(|q| m.events[&q].1);
        ensure!(
            s.oldest_pending_created_at_ms == oldest,
            "oldest pending of {}",
            s.consumer
        );
    }
    Ok(())
}

/// Runs one case on a store opened in `place`, emptied first (cases share one place: a
/// database per case would cost more than the case on PostgreSQL).
fn run_case(place: &mut Place, knobs: Knobs, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut config = common::two_consumers();
    config.index.outbox.max_retries = knobs.max_retries;
    config.index.outbox.retry_max_seconds = knobs.retry_max_seconds;
    config.index.outbox.dead_letter_enabled = knobs.dead_letter_enabled;
    let lease_ms = i64::from(config.index.worker.lease_seconds) * 1000;
    assert_eq!(
        config.index.outbox.retry_base_seconds, 2,
        "the model assumes the default base"
    );
    place.reset();
    let clock = ce_core::ManualClock::new(T0);
    let store = place.open(config, Arc::new(clock.clone()));
    let mut m = Model {
        knobs,
        lease_ms,
        now: T0,
        events: BTreeMap::new(),
        uris: BTreeMap::new(),
        deliveries: BTreeMap::new(),
        claims: Vec::new(),
        pruned_through: 0,
    };
    for (step, op) in ops.iter().enumerate() {
        apply(store.as_ref(), &clock, &mut m, op, step)
            .and_then(|()| compare(store.as_ref(), &m))
            .map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
    }
    Ok(())
}

fn outbox_matches_model(backend: Backend) {
    let seed = common::seed("outbox_matches_model");
    let mut runner = ce_testkit::seeded_runner(seed, test_cases(64), 4096);
    let strategy = (knobs(), prop::collection::vec(op(), 1..=48));
    let place = RefCell::new(backend.place());
    match runner.run(&strategy, |(k, ops)| {
        run_case(&mut place.borrow_mut(), k, &ops)
    }) {
        Ok(()) => {}
        Err(TestError::Fail(why, (k, ops))) => panic!(
            "outbox model test failed (replay with CE_SEED={seed}): {why}\nknobs {k:?}\nminimal ops:\n{ops:#?}"
        ),
        Err(e) => panic!("outbox model test aborted (CE_SEED={seed}): {e}"),
    }
}

// Outbox behaviour outside the state machine: appends, paging and consumer registration.

fn upsert_event(u: &str) -> OutboxEventCreate {
    OutboxEventCreate {
        payload: EventPayload::UpsertContext(UpsertContextPayload {
            event_version: EVENT_VERSION,
            uri: common::uri(u),
            expected_node_version: 1,
            reason: UpsertReason::Create,
            trace_id: String::new(),
        }),
    }
}

/// `append` must refuse a payload that the store itself refuses to read back: one such
/// event would make every `list` and every `claim_batch` of every consumer fail for good.
fn append_refuses_payloads_it_cannot_read_back(backend: Backend) {
    let bad = [
        EventPayload::UpsertContext(UpsertContextPayload {
            event_version: EVENT_VERSION,
            uri: ce_core::CtxUri::root(),
            expected_node_version: 1,
            reason: UpsertReason::Create,
            trace_id: String::new(),
        }),
        EventPayload::UpsertContext(UpsertContextPayload {
            event_version: 2,
            uri: common::uri("ctx://acc/x"),
            expected_node_version: 1,
            reason: UpsertReason::Create,
            trace_id: String::new(),
        }),
        EventPayload::MoveContext(ce_core::MoveContextPayload {
            event_version: EVENT_VERSION,
            from_uri: common::uri("ctx://acc/x"),
            to_uri: common::uri("ctx://acc/y/z"),
            recursive: true,
            old_parent_uri: common::uri("ctx://acc"),
            new_parent_uri: common::uri("ctx://acc"),
            trace_id: String::new(),
        }),
    ];
    for payload in bad {
        let (_d, s, _c) = common::fresh(backend, common::two_consumers());
        let s = s.as_ref();
        s.append(upsert_event("ctx://acc/ok")).expect("append");
        let before = common::all_deliveries(s);
        let got = s.append(OutboxEventCreate {
            payload: payload.clone(),
        });
        let after = s.list(&ce_store::OutboxFilter {
            limit: Some(u32::MAX),
            ..Default::default()
        });
        assert!(
            matches!(&got, Err(e) if e.code() == ErrorCode::InvalidPayload && !e.is_retryable()),
            "append({payload:?}) gave {got:?}; the outbox now lists as {:?}",
            after.as_ref().map(Vec::len)
        );
        assert_eq!(after.expect("list still works"), before);
        let claimed = s.claim_batch("vector", "w", 10).expect("claim still works");
        assert_eq!(claimed.len(), 1);
    }
}

/// Paging with `after_seq` = the last row's sequence must not skip rows: with several
/// consumers one event has several rows, and a page may end between them.
fn list_paging_returns_every_row_once(backend: Backend) {
    let (_d, s, _c) = common::fresh(backend, common::two_consumers());
    let s = s.as_ref();
    s.append_batch(
        (0..5)
            .map(|i| upsert_event(&format!("ctx://acc/e{i}")))
            .collect(),
    )
    .expect("append");
    let all = common::all_deliveries(s);
    assert_eq!(all.len(), 10);
    let mut paged = Vec::new();
    let mut after = None;
    let mut after_consumer = None;
    loop {
        let page = s
            .list(&ce_store::OutboxFilter {
                after_seq: after,
                after_consumer: after_consumer.clone(),
                limit: Some(3),
                ..Default::default()
            })
            .expect("page");
        let Some(last) = page.last() else { break };
        after = Some(last.event.seq);
        after_consumer = Some(last.delivery.consumer.clone());
        paged.extend(page);
    }
    let key = |r: &ce_store::DeliveryRow| (r.event.seq, r.delivery.consumer.clone());
    assert_eq!(
        paged.iter().map(key).collect::<Vec<_>>(),
        all.iter().map(key).collect::<Vec<_>>(),
        "paging by after_seq lost or repeated rows"
    );
}

/// The store of `place` with `names` as its consumers.
fn open_with(
    place: &Place,
    clock: &std::sync::Arc<dyn ce_core::Clock>,
    names: &[&str],
) -> common::Store {
    let mut c = common::two_consumers();
    c.index.outbox.consumers = names.iter().map(|n| (*n).to_owned()).collect();
    place.open(c, clock.clone())
}

/// The deliveries `consumer` has in the journal.
fn count(s: &dyn SourceStore, consumer: &str) -> usize {
    s.list(&ce_store::OutboxFilter {
        consumer: Some(consumer.into()),
        limit: Some(u32::MAX),
        ..Default::default()
    })
    .expect("list")
    .len()
}

/// A consumer added to the configuration gets a delivery for every event already in the
/// journal; one that was removed and is added back gets the events appended meanwhile;
/// events appended for other consumers only (a rebuild's) it never gets.
fn consumers_added_later_get_every_event(backend: Backend) {
    let place = backend.place();
    let clock: std::sync::Arc<dyn ce_core::Clock> =
        std::sync::Arc::new(ce_core::ManualClock::new(T0));
    let with = |names: &[&str]| open_with(&place, &clock, names);

    let s = with(&["vector"]);
    s.append(upsert_event("ctx://acc/e1")).expect("append");
    drop(s);
    let s = with(&["vector", "keyword"]);
    assert_eq!(
        count(s.as_ref(), "keyword"),
        1,
        "back-fill of a new consumer"
    );
    drop(s);

    // keyword is switched off for a while, then back on.
    let s = with(&["vector"]);
    s.append(upsert_event("ctx://acc/e2")).expect("append");
    drop(s);
    let s = with(&["vector", "keyword"]);
    assert_eq!(count(s.as_ref(), "vector"), 2);
    assert_eq!(
        count(s.as_ref(), "keyword"),
        2,
        "a re-enabled consumer never gets the events appended while it was off"
    );

    // A rebuild's repair events for one consumer are never handed to another by a later
    // back-fill, even with no event of the other consumer after them.
    s.append_batch_for(&["keyword".to_owned()], vec![upsert_event("ctx://acc/e1")])
        .expect("targeted append");
    drop(s);
    let s = with(&["vector", "keyword"]);
    assert_eq!(
        (count(s.as_ref(), "vector"), count(s.as_ref(), "keyword")),
        (2, 3),
        "a targeted event was back-filled into another consumer"
    );
    // Switched off and on again, the other consumer still gets the untargeted events only.
    drop(s);
    let s = with(&["keyword"]);
    s.append(upsert_event("ctx://acc/e3")).expect("append");
    drop(s);
    let s = with(&["vector", "keyword"]);
    assert_eq!(
        (count(s.as_ref(), "vector"), count(s.as_ref(), "keyword")),
        (3, 4)
    );
}

/// Once the journal pruned events a consumer never got, it cannot be back-filled: it is
/// flagged for a rebuild from the source instead (and gets no partial back-fill), and the
/// flag holds across opens until the rebuild is queued. A consumer that applied what was
/// pruned is neither flagged nor handed its pruned deliveries again; pruning a targeted event
/// does not count against the consumers it was not meant for.
fn a_pruned_journal_rebuilds_what_it_cannot_back_fill(backend: Backend) {
    let place = backend.place();
    let clock = ce_core::ManualClock::new(T0);
    let shared: std::sync::Arc<dyn ce_core::Clock> = std::sync::Arc::new(clock.clone());
    let with = |names: &[&str]| open_with(&place, &shared, names);
    let apply_all = |s: &dyn SourceStore, c: &str| {
        let claimed = s.claim_batch(c, "w", 1_000).expect("claim");
        let claims: Vec<Claim> = claimed.into_iter().map(|ce| ce.claim).collect();
        for answer in s.mark_done_batch(&claims).expect("done") {
            answer.expect("a live claim is marked done");
        }
    };
    let prune_all = |s: &dyn SourceStore| {
        clock.advance(10_000);
        s.prune_journal(1_000, 2).expect("prune")
    };

    let s = with(&["vector"]);
    let e1 = s.append(upsert_event("ctx://acc/e1")).expect("append");
    let e2 = s.append(upsert_event("ctx://acc/e2")).expect("append");
    apply_all(s.as_ref(), "vector");
    let pruned = prune_all(s.as_ref());
    assert_eq!(
        (pruned.deliveries, pruned.events),
        (2, 1),
        "the newest event stays"
    );
    let j = s.journal().expect("journal");
    assert_eq!(
        (j.events, j.oldest_seq, j.pruned_through),
        (1, Some(e2.seq), e1.seq)
    );
    drop(s);

    // keyword never got e1, which is gone: a rebuild, no back-fill of what is left.
    let s = with(&["vector", "keyword"]);
    assert_eq!(
        s.rebuilds_needed().expect("flags"),
        vec!["keyword".to_owned()]
    );
    assert_eq!(count(s.as_ref(), "keyword"), 0, "no partial back-fill");
    assert_eq!(
        count(s.as_ref(), "vector"),
        0,
        "vector applied e2 already: its pruned delivery is not handed back"
    );
    drop(s);
    let s = with(&["vector", "keyword"]);
    assert_eq!(
        s.rebuilds_needed().expect("flags"),
        vec!["keyword".to_owned()],
        "the flag holds until the rebuild is queued"
    );
    assert_eq!(count(s.as_ref(), "keyword"), 0);
    assert!(s.rebuild_queued("keyword").expect("clear"));
    assert!(!s.rebuild_queued("keyword").expect("clear again"));
    assert!(s.rebuilds_needed().expect("flags").is_empty());

    // From here on both get every new event.
    s.append(upsert_event("ctx://acc/e3")).expect("append");
    assert_eq!(
        (count(s.as_ref(), "vector"), count(s.as_ref(), "keyword")),
        (1, 1)
    );
    // A targeted event pruned does not count against keyword.
    s.append_batch_for(&["vector".to_owned()], vec![upsert_event("ctx://acc/e1")])
        .expect("targeted append");
    s.append(upsert_event("ctx://acc/e4")).expect("append");
    apply_all(s.as_ref(), "vector");
    apply_all(s.as_ref(), "keyword");
    let before = s.journal().expect("journal").pruned_through;
    prune_all(s.as_ref());
    let j = s.journal().expect("journal");
    assert_eq!(
        (j.events, j.deliveries),
        (1, 0),
        "only the newest event is left"
    );
    assert!(j.pruned_through > before, "e3 was pruned");
    drop(s);
    let s = with(&["vector", "keyword"]);
    assert!(
        s.rebuilds_needed().expect("flags").is_empty(),
        "a consumer that applied everything pruned is not rebuilt"
    );
    assert_eq!(
        (count(s.as_ref(), "vector"), count(s.as_ref(), "keyword")),
        (0, 0)
    );

    // keyword switched off: the events appended meanwhile have no delivery of it; once they
    // are pruned, switching it back on calls for a rebuild. An event it still has to apply
    // keeps its place in the journal.
    let pending = s.append(upsert_event("ctx://acc/e5")).expect("append");
    apply_all(s.as_ref(), "vector");
    drop(s);
    let s = with(&["vector"]);
    s.append(upsert_event("ctx://acc/e6")).expect("append");
    s.append(upsert_event("ctx://acc/e7")).expect("append");
    apply_all(s.as_ref(), "vector");
    prune_all(s.as_ref());
    let j = s.journal().expect("journal");
    assert_eq!(
        (j.events, j.oldest_seq),
        (2, Some(pending.seq)),
        "keyword's pending e5 and the newest event are kept"
    );
    drop(s);
    let s = with(&["vector", "keyword"]);
    assert_eq!(
        s.rebuilds_needed().expect("flags"),
        vec!["keyword".to_owned()]
    );
    assert_eq!(
        count(s.as_ref(), "keyword"),
        1,
        "its own pending delivery stays"
    );
}

/// Pruning races everything else that touches the journal: a producer appending, a worker
/// per consumer claiming and acknowledging, a pruner with no retention at all, and a second
/// store (another process on PostgreSQL) opening meanwhile with a third consumer, whose
/// registration back-fills from the events the pruner is deleting. No delivery may outlive
/// its event (a back-fill of an event being pruned, or a prune of an event with a delivery
/// still to apply), the newcomer is either back-filled or flagged for a rebuild, and once
/// every delivery is applied a last prune leaves only the newest event.
fn pruning_races_appends_acknowledgements_and_registration(backend: Backend) {
    let place = backend.place();
    let clock = ce_core::ManualClock::new(T0);
    let shared: Arc<dyn ce_core::Clock> = Arc::new(clock.clone());
    let s = open_with(&place, &shared, &["vector", "keyword"]);
    let producing = std::sync::atomic::AtomicBool::new(true);
    let (batches, per_batch) = (40, 25);
    let newcomer = std::thread::scope(|scope| {
        scope.spawn(|| {
            for b in 0..batches {
                let batch = (0..per_batch)
                    .map(|i| upsert_event(&format!("ctx://race/b{b}/e{i}")))
                    .collect();
                s.append_batch(batch).expect("append");
                clock.advance(10);
            }
            producing.store(false, std::sync::atomic::Ordering::SeqCst);
        });
        for c in ["vector", "keyword"] {
            let s = &s;
            let producing = &producing;
            scope.spawn(move || {
                loop {
                    let done = !producing.load(std::sync::atomic::Ordering::SeqCst);
                    let claimed = s.claim_batch(c, "w", 20).expect("claim");
                    if claimed.is_empty() && done {
                        return;
                    }
                    let claims: Vec<Claim> = claimed.into_iter().map(|ce| ce.claim).collect();
                    for answer in s.mark_done_batch(&claims).expect("done") {
                        answer.expect("a live claim is marked done");
                    }
                }
            });
        }
        scope.spawn(|| {
            while producing.load(std::sync::atomic::Ordering::SeqCst) {
                s.prune_journal(0, 50).expect("prune");
            }
        });
        let opened = scope.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            open_with(&place, &shared, &["vector", "keyword", "relation"])
        });
        opened.join().expect("the second store opens")
    });
    // The newcomer's configuration names every consumer, so its list shows every delivery
    // that still has its event (the list joins them); the journal counts the rows themselves.
    let orphans = |st: &dyn SourceStore| {
        let held = st.journal().expect("journal").deliveries;
        let listed = common::all_deliveries(st).len() as u64;
        assert_eq!(held, listed, "deliveries without their event");
    };
    orphans(newcomer.as_ref());
    let flagged = newcomer.rebuilds_needed().expect("flags");
    let relation = count(newcomer.as_ref(), "relation");
    let j = newcomer.journal().expect("journal");
    eprintln!("newcomer: flagged {flagged:?}, {relation} relation deliveries; journal {j:?}");
    assert!(
        flagged == vec!["relation".to_owned()] || relation > 0 || flagged.is_empty(),
        "{flagged:?}"
    );
    // The newcomer's deliveries (if it was back-filled) are applied too; then nothing is left
    // but the newest event.
    loop {
        let claimed = newcomer.claim_batch("relation", "w", 100).expect("claim");
        if claimed.is_empty() {
            break;
        }
        let claims: Vec<Claim> = claimed.into_iter().map(|ce| ce.claim).collect();
        for answer in newcomer.mark_done_batch(&claims).expect("done") {
            answer.expect("done");
        }
    }
    clock.advance(10);
    newcomer.prune_journal(0, 50).expect("last prune");
    let j = newcomer.journal().expect("journal");
    assert_eq!((j.events, j.deliveries), (1, 0), "{j:?}");
    assert_eq!(j.newest_seq, Some((batches * per_batch) as i64), "{j:?}");
    orphans(newcomer.as_ref());
}
