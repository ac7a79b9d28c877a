//! The job state machine (docs/jobs.md) against a `BTreeMap` model, on every backend.
//!
//! A proptest strategy generates op sequences: enqueue with and without an idempotency key
//! and with a delay, claims of type sets under per-type concurrency, heartbeat, complete,
//! retryable and permanent failures up to exhaustion, cancel (waiting, running, with an
//! ended lease) and its acknowledgement, retry of dead and cancelled jobs, clock moves onto
//! and just before every deadline. Fenced ops pick a claim from the whole history, so stale
//! claims are exercised: each must be refused and change nothing. After every step each job
//! of the store must equal the model (state, attempts, run_at, lease, cancel flag, progress,
//! last error, `updated_at`), the counts must agree, and the invariants hold:
//!
//! - JB1: at most one non-terminal job per idempotency key;
//! - JB2: no type has more running jobs with a live lease than its concurrency;
//! - JB3: a job's lease end is set exactly when it is running, and equals its `run_at`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ce_core::{Classify, Config, ErrorCode, ManualClock, Millis};
use ce_store::{Job, JobClaim, JobFailure, JobSpec, JobState, SourceStore, StoreError, TypeSlots};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::json;

use crate::common::{
    self, Advance, Backend, OpenStore as _, Place, Step, T0, backend_tests, ensure,
};

backend_tests!(jobs_match_model);

const TYPES: [&str; 3] = ["alpha", "beta", "gamma"];
const KEYS: [&str; 3] = ["kb:B:I:prepare", "kb:B:I:index", "kb:B:I:delete"];
/// Run-at offsets of an enqueue: now, in the past, soon, after a lease.
const DELAYS: [Option<Millis>; 4] = [None, Some(-1_000), Some(5_000), Some(61_000)];
const LEASE_MS: Millis = 60_000;
const BASE_S: u32 = 2;
const MAX_S: u32 = 30;

/// Per-case configuration.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    max_retries: u32,
    /// Concurrency of each of [`TYPES`].
    concurrency: [u32; 3],
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        job_type: usize,
        key: Option<usize>,
        delay: usize,
    },
    /// Claims of the types whose bit is set in `mask`.
    Claim {
        mask: u8,
        limit: usize,
    },
    /// The claim ops pick a claim from the history, counted from the newest.
    Heartbeat(usize),
    Complete(usize),
    FailRetryable(usize),
    FailPermanent(usize),
    AckCancelled(usize),
    /// The job ops pick a job by creation order, counted from the newest.
    Cancel(usize),
    Retry(usize),
    Advance(Advance),
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![Just(0u32), Just(1), Just(3)],
        [1..=3u32, 1..=3u32, 1..=3u32],
    )
        .prop_map(|(max_retries, concurrency)| Knobs {
            max_retries,
            concurrency,
        })
}

fn pick() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0..2usize, 1 => 0..32usize]
}

fn op() -> impl Strategy<Value = Op> {
    let advance = prop_oneof![
        2 => prop::sample::select(vec![1, 1_000, 2_000, 4_999, 30_000, 59_999, 60_000, 61_000])
            .prop_map(Advance::By),
        3 => Just(Advance::ToNextDeadline),
        1 => Just(Advance::JustBeforeNextDeadline),
    ];
    prop_oneof![
        4 => (0..3usize, prop::option::of(0..3usize), 0..4usize)
            .prop_map(|(job_type, key, delay)| Op::Enqueue { job_type, key, delay }),
        5 => (1..8u8, 1..=4usize).prop_map(|(mask, limit)| Op::Claim { mask, limit }),
        2 => pick().prop_map(Op::Heartbeat),
        3 => pick().prop_map(Op::Complete),
        3 => pick().prop_map(Op::FailRetryable),
        1 => pick().prop_map(Op::FailPermanent),
        1 => pick().prop_map(Op::AckCancelled),
        2 => (0..8usize).prop_map(Op::Cancel),
        1 => (0..8usize).prop_map(Op::Retry),
        4 => advance.prop_map(Op::Advance),
    ]
}

/// What the model knows of one job.
#[derive(Debug, Clone, PartialEq)]
struct Expected {
    job_type: usize,
    key: Option<usize>,
    state: JobState,
    attempts: u32,
    run_at: Option<Millis>,
    /// The claim that holds or last held it: token, lease end while running.
    token: Option<String>,
    until: Option<Millis>,
    cancel_requested: bool,
    progress: Option<serde_json::Value>,
    /// Last failure: code, message.
    error: Option<(String, String)>,
    updated_at: Millis,
    finished_at: Option<Millis>,
}

impl Expected {
    fn live(&self, token: &str, now: Millis) -> bool {
        self.state == JobState::Running
            && self.token.as_deref() == Some(token)
            && self.until.is_some_and(|u| now < u)
    }

    fn finish(&mut self, state: JobState, now: Millis) {
        self.state = state;
        self.run_at = None;
        self.until = None;
        self.updated_at = now;
        if state.is_terminal() {
            self.finished_at = Some(now);
        }
    }
}

struct Model {
    knobs: Knobs,
    now: Millis,
    /// By id (ids sort by creation, as the store orders claims and lists).
    jobs: BTreeMap<String, Expected>,
    /// Every claim handed out, oldest first.
    claims: Vec<JobClaim>,
}

/// What an op must answer when it is refused.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Refusal {
    Lost,
    Transition,
}

impl Model {
    fn backoff_ms(n: u32) -> Millis {
        let exp = n.saturating_sub(1).min(30);
        (i64::from(BASE_S) * 1000 * (1i64 << exp)).min(i64::from(MAX_S) * 1000)
    }

    fn holder(&self, key: usize) -> Option<&String> {
        self.jobs
            .iter()
            .find(|(_, e)| e.key == Some(key) && !e.state.is_terminal())
            .map(|(id, _)| id)
    }

    fn claim(&self, i: usize) -> Option<JobClaim> {
        let n = self.claims.len();
        (n > 0).then(|| self.claims[n - 1 - i % n].clone())
    }

    fn job_id(&self, i: usize) -> Option<String> {
        let n = self.jobs.len();
        (n > 0).then(|| self.jobs.keys().nth(n - 1 - i % n).cloned())?
    }

    fn live_running(&self, t: usize) -> u32 {
        self.jobs
            .values()
            .filter(|e| {
                e.job_type == t
                    && e.state == JobState::Running
                    && e.until.is_some_and(|u| self.now < u)
            })
            .count() as u32
    }

    /// The ids a claim of `mask` up to `limit` takes, in order.
    fn expected_claim(&self, mask: u8, limit: usize) -> Vec<String> {
        let mut picked: Vec<(Millis, String)> = Vec::new();
        for t in 0..TYPES.len() {
            if mask & (1 << t) == 0 {
                continue;
            }
            let free = self.knobs.concurrency[t].saturating_sub(self.live_running(t)) as usize;
            let mut runnable: Vec<(Millis, String)> = self
                .jobs
                .iter()
                .filter(|(_, e)| {
                    e.job_type == t
                        && !e.state.is_terminal()
                        && e.run_at.is_some_and(|r| r <= self.now)
                })
                .map(|(id, e)| (e.run_at.unwrap_or_default(), id.clone()))
                .collect();
            runnable.sort();
            picked.extend(runnable.into_iter().take(free.min(limit)));
        }
        picked.sort();
        picked.truncate(limit);
        picked.into_iter().map(|(_, id)| id).collect()
    }

    fn next_deadline(&self) -> Option<Millis> {
        self.jobs
            .values()
            .filter_map(|e| e.run_at)
            .filter(|t| *t > self.now)
            .min()
    }
}

/// Checks a refused op's error: its class, and that it is classified as such.
fn refused<T: std::fmt::Debug>(got: ce_store::Result<T>, want: Refusal) -> Step {
    let e = match got {
        Ok(v) => return Err(format!("expected a refusal ({want:?}), got Ok({v:?})")),
        Err(e) => e,
    };
    let ok = match want {
        Refusal::Lost => {
            matches!(e, StoreError::JobClaimConflict { .. })
                && e.code() == ErrorCode::ClaimConflict
                && e.is_retryable()
        }
        Refusal::Transition => {
            matches!(e, StoreError::JobTransition { .. })
                && e.code() == ErrorCode::StateTransition
                && !e.is_retryable()
        }
    };
    ensure!(ok, "expected {want:?}, got {e} ({})", e.code());
    Ok(())
}

fn spec_of(m: &Model, job_type: usize, key: Option<usize>, delay: usize) -> JobSpec {
    JobSpec {
        job_type: TYPES[job_type].into(),
        payload: json!({"type": job_type}),
        idempotency_key: key.map(|k| KEYS[k].to_owned()),
        run_at_ms: DELAYS[delay].map(|d| m.now + d),
        parent_job_id: None,
    }
}

fn apply(s: &dyn SourceStore, clock: &ManualClock, m: &mut Model, op: &Op, step: usize) -> Step {
    let now = m.now;
    match *op {
        Op::Enqueue {
            job_type,
            key,
            delay,
        } => {
            let got = s
                .enqueue(spec_of(m, job_type, key, delay))
                .map_err(|e| format!("enqueue: {e}"))?;
            if let Some(holder) = key.and_then(|k| m.holder(k)) {
                ensure!(!got.created, "a held key created a job");
                ensure!(
                    &got.job.id == holder,
                    "returned {} not the holder {holder}",
                    got.job.id
                );
                return Ok(());
            }
            ensure!(got.created, "a free key did not create a job");
            let run_at = DELAYS[delay].map_or(now, |d| now + d);
            m.jobs.insert(
                got.job.id.clone(),
                Expected {
                    job_type,
                    key,
                    state: if run_at > now {
                        JobState::Delayed
                    } else {
                        JobState::Pending
                    },
                    attempts: 0,
                    run_at: Some(run_at),
                    token: None,
                    until: None,
                    cancel_requested: false,
                    progress: None,
                    error: None,
                    updated_at: now,
                    finished_at: None,
                },
            );
        }
        Op::Claim { mask, limit } => {
            let types: Vec<TypeSlots> = (0..TYPES.len())
                .filter(|t| mask & (1 << t) != 0)
                .map(|t| TypeSlots {
                    job_type: TYPES[t].into(),
                    concurrency: m.knobs.concurrency[t],
                })
                .collect();
            let want = m.expected_claim(mask, limit);
            let worker = format!("w{step}");
            let got = s
                .claim_jobs(&worker, &types, limit)
                .map_err(|e| format!("claim: {e}"))?;
            let ids: Vec<&String> = got.iter().map(|c| &c.job.id).collect();
            ensure!(
                ids == want.iter().collect::<Vec<_>>(),
                "claimed {ids:?}, model {want:?}"
            );
            for c in got {
                ensure!(c.claim.claimed_until_ms == now + LEASE_MS, "lease end");
                ensure!(c.claim.worker_id == worker, "worker id");
                let e = m.jobs.get_mut(&c.job.id).ok_or("claimed an unknown job")?;
                e.state = JobState::Running;
                e.run_at = Some(now + LEASE_MS);
                e.until = Some(now + LEASE_MS);
                e.token = Some(c.claim.token.clone());
                e.updated_at = now;
                m.claims.push(c.claim);
            }
        }
        Op::Heartbeat(i) => {
            let Some(claim) = m.claim(i) else {
                return Ok(());
            };
            let progress = json!({"step": step});
            let got = s.heartbeat(&claim, Some(progress.clone()));
            let e = m.jobs.get_mut(&claim.job_id).ok_or("unknown job")?;
            if !e.live(&claim.token, now) {
                return refused(got, Refusal::Lost);
            }
            let hb = got.map_err(|e| format!("heartbeat: {e}"))?;
            ensure!(hb.claimed_until_ms == now + LEASE_MS, "renewed lease end");
            ensure!(hb.cancel_requested == e.cancel_requested, "cancel flag");
            e.run_at = Some(now + LEASE_MS);
            e.until = Some(now + LEASE_MS);
            e.progress = Some(progress);
            e.updated_at = now;
        }
        Op::Complete(i) => {
            let Some(claim) = m.claim(i) else {
                return Ok(());
            };
            let result = json!({"result": step});
            let got = s.complete(&claim, Some(result.clone()));
            let e = m.jobs.get_mut(&claim.job_id).ok_or("unknown job")?;
            if e.state == JobState::Completed {
                let j = got.map_err(|e| format!("repeated complete: {e}"))?;
                ensure!(
                    j.updated_at_ms == e.updated_at,
                    "a repeated complete changed the job"
                );
                return Ok(());
            }
            if !e.live(&claim.token, now) {
                return refused(got, Refusal::Lost);
            }
            let j = got.map_err(|e| format!("complete: {e}"))?;
            ensure!(j.state == JobState::Completed, "completed state");
            e.finish(JobState::Completed, now);
            e.progress = Some(result);
        }
        Op::FailRetryable(i) | Op::FailPermanent(i) => {
            let Some(claim) = m.claim(i) else {
                return Ok(());
            };
            let retryable = matches!(op, Op::FailRetryable(_));
            let message = format!("boom {step}");
            let code = if retryable {
                ErrorCode::Unavailable
            } else {
                ErrorCode::InvalidField
            };
            let got = s.fail(
                &claim,
                &JobFailure {
                    code,
                    retryable,
                    message: &message,
                },
            );
            let max = m.knobs.max_retries;
            let e = m.jobs.get_mut(&claim.job_id).ok_or("unknown job")?;
            if !e.live(&claim.token, now) {
                return refused(got, Refusal::Lost);
            }
            let state = got.map_err(|e| format!("fail: {e}"))?;
            if !retryable || e.attempts >= max {
                e.finish(JobState::Dead, now);
            } else {
                e.finish(JobState::Failed, now);
                e.attempts += 1;
                e.run_at = Some(now + Model::backoff_ms(e.attempts));
            }
            e.error = Some((code.as_str().to_owned(), message));
            ensure!(
                state == e.state,
                "fail answered {state:?}, model {:?}",
                e.state
            );
        }
        Op::AckCancelled(i) => {
            let Some(claim) = m.claim(i) else {
                return Ok(());
            };
            let got = s.ack_cancelled(&claim);
            let e = m.jobs.get_mut(&claim.job_id).ok_or("unknown job")?;
            if !e.live(&claim.token, now) {
                return refused(got, Refusal::Lost);
            }
            if !e.cancel_requested {
                return refused(got, Refusal::Transition);
            }
            got.map_err(|e| format!("ack_cancelled: {e}"))?;
            e.finish(JobState::Cancelled, now);
        }
        Op::Cancel(i) => {
            let Some(id) = m.job_id(i) else { return Ok(()) };
            let got = s.cancel(&id);
            let e = m.jobs.get_mut(&id).ok_or("unknown job")?;
            match e.state {
                JobState::Running if e.until.is_some_and(|u| now < u) => {
                    got.map_err(|e| format!("cancel: {e}"))?;
                    if !e.cancel_requested {
                        e.cancel_requested = true;
                        e.updated_at = now;
                    }
                }
                JobState::Pending | JobState::Delayed | JobState::Failed | JobState::Running => {
                    got.map_err(|e| format!("cancel: {e}"))?;
                    e.finish(JobState::Cancelled, now);
                }
                JobState::Completed | JobState::Cancelled | JobState::Dead => {
                    return refused(got, Refusal::Transition);
                }
            }
        }
        Op::Retry(i) => {
            let Some(id) = m.job_id(i) else { return Ok(()) };
            let got = s.retry(&id);
            let e = &m.jobs[&id];
            let key_held = e
                .key
                .and_then(|k| m.holder(k))
                .is_some_and(|holder| *holder != id);
            if !matches!(e.state, JobState::Dead | JobState::Cancelled) || key_held {
                return refused(got, Refusal::Transition);
            }
            got.map_err(|e| format!("retry: {e}"))?;
            let e = m.jobs.get_mut(&id).ok_or("unknown job")?;
            e.state = JobState::Pending;
            e.attempts = 0;
            e.run_at = Some(now);
            e.until = None;
            e.cancel_requested = false;
            e.finished_at = None;
            e.updated_at = now;
        }
        Op::Advance(a) => {
            if let Some(t) = a.target(now, m.next_deadline()) {
                clock.advance(t - now);
                m.now = t;
            }
        }
    }
    Ok(())
}

/// The invariants of the module documentation over the store's own jobs.
fn invariant_violations(jobs: &[Job], knobs: &Knobs, now: Millis) -> Vec<String> {
    let mut bad = Vec::new();
    let mut keys = BTreeSet::new();
    for j in jobs.iter().filter(|j| !j.state.is_terminal()) {
        if let Some(k) = &j.idempotency_key
            && !keys.insert(k)
        {
            bad.push(format!("JB1: two non-terminal jobs hold {k}"));
        }
    }
    for (t, name) in TYPES.iter().enumerate() {
        let live = jobs
            .iter()
            .filter(|j| {
                j.job_type == *name
                    && j.state == JobState::Running
                    && j.claimed_until_ms.is_some_and(|u| now < u)
            })
            .count() as u32;
        if live > knobs.concurrency[t] {
            bad.push(format!(
                "JB2: {live} live {name} jobs over {}",
                knobs.concurrency[t]
            ));
        }
    }
    for j in jobs {
        let running = j.state == JobState::Running;
        if running != j.claimed_until_ms.is_some() || (running && j.claimed_until_ms != j.run_at_ms)
        {
            bad.push(format!(
                "JB3: {} is {:?} with lease {:?}",
                j.id, j.state, j.claimed_until_ms
            ));
        }
    }
    bad
}

fn compare(s: &dyn SourceStore, m: &Model) -> Step {
    let jobs = common::all_jobs(s);
    let bad = invariant_violations(&jobs, &m.knobs, m.now);
    ensure!(bad.is_empty(), "invariants: {bad:?}");
    ensure!(
        jobs.len() == m.jobs.len(),
        "{} jobs, model {}",
        jobs.len(),
        m.jobs.len()
    );
    for j in &jobs {
        let e = m
            .jobs
            .get(&j.id)
            .ok_or_else(|| format!("unknown job {}", j.id))?;
        let got = (
            j.job_type.as_str(),
            j.idempotency_key.as_deref(),
            j.state,
            j.attempts,
            j.run_at_ms,
            j.claimed_until_ms,
            j.cancel_requested,
            &j.progress,
            j.updated_at_ms,
            j.finished_at_ms,
        );
        let want = (
            TYPES[e.job_type],
            e.key.map(|k| KEYS[k]),
            e.state,
            e.attempts,
            e.run_at,
            e.until,
            e.cancel_requested,
            &e.progress,
            e.updated_at,
            e.finished_at,
        );
        ensure!(got == want, "{}: {got:?}, model {want:?}", j.id);
        let error = (j.error_code.clone(), j.last_error.clone());
        let want_error = e
            .error
            .clone()
            .map_or((None, None), |(c, msg)| (Some(c), Some(msg)));
        ensure!(
            error == want_error,
            "{}: error {error:?}, model {want_error:?}",
            j.id
        );
    }
    let mut want_counts: BTreeMap<(String, JobState), u64> = BTreeMap::new();
    for e in m.jobs.values() {
        *want_counts
            .entry((TYPES[e.job_type].to_owned(), e.state))
            .or_default() += 1;
    }
    let counts: BTreeMap<(String, JobState), u64> = s
        .job_counts()
        .map_err(|e| format!("counts: {e}"))?
        .into_iter()
        .map(|c| ((c.job_type, c.state), c.count))
        .collect();
    ensure!(
        counts == want_counts,
        "counts {counts:?}, model {want_counts:?}"
    );
    Ok(())
}

/// Runs one case on a store opened in `place`, emptied first.
fn run_case(place: &mut Place, knobs: Knobs, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut config = Config::default();
    config.jobs.max_retries = knobs.max_retries;
    config.jobs.retry_base_seconds = BASE_S;
    config.jobs.retry_max_seconds = MAX_S;
    config.jobs.retry_jitter_ratio = 0.0;
    assert_eq!(i64::from(config.jobs.lease_seconds) * 1000, LEASE_MS);
    place.reset();
    let clock = ManualClock::new(T0);
    let store = place.open(config, Arc::new(clock.clone()));
    let mut m = Model {
        knobs,
        now: T0,
        jobs: BTreeMap::new(),
        claims: Vec::new(),
    };
    common::check_steps(ops, |step, op| {
        apply(store.as_ref(), &clock, &mut m, op, step).and_then(|()| compare(store.as_ref(), &m))
    })
}

fn jobs_match_model(backend: Backend) {
    let strategy = (knobs(), prop::collection::vec(op(), 1..=48));
    common::run_model(
        "jobs_match_model",
        backend,
        32,
        strategy,
        |place, (k, ops)| run_case(place, k, &ops),
    );
}
