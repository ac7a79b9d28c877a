//! The job state machine, written once over the row primitives of [`JobTx`]: every
//! transition is decided here, each dialect only reads and writes rows. The lease fence, the
//! retry policy and the claim tokens are [`crate::queue`]'s, shared with the outbox; job
//! states map onto its [`Phase`]s (pending / delayed / failed → waiting, running → claimed,
//! completed → done, dead → dead, cancelled → cancelled).
//!
//! Due delayed and failed jobs keep their stored state until a claim takes them straight to
//! `running` (listings show them `delayed` / `failed` until then). A running job whose lease
//! ended is claimable again with its attempts unchanged; the old claim is fenced out.

use ce_core::config::{JobTypeSettings, JobsConfig, valid_job_type};
use ce_core::{CoreError, Millis};

use super::rows::{JobTx, StoredJob};
use super::{
    ClaimedJob, Enqueued, Heartbeat, Job, JobClaim, JobCount, JobFailure, JobFilter, JobSpec,
    JobState, TypeSlots,
};
use crate::error::{Result, StoreError};
use crate::queue::{self, AfterFailure, LeaseRow, Lost, Phase, RetryPolicy};

/// The largest payload, serialized.
pub const MAX_JOB_PAYLOAD_BYTES: usize = 1 << 20;
/// The longest idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 512;

/// The queue phase of a job state.
pub(crate) fn phase(state: JobState) -> Phase {
    match state {
        JobState::Pending | JobState::Delayed | JobState::Failed => Phase::Waiting,
        JobState::Running => Phase::Claimed,
        JobState::Completed => Phase::Done,
        JobState::Dead => Phase::Dead,
        JobState::Cancelled => Phase::Cancelled,
    }
}

/// The retry policy of a job type: `[jobs]` settings, always dead-lettering.
fn retry_policy(s: JobTypeSettings) -> RetryPolicy {
    RetryPolicy {
        max_retries: s.max_retries,
        base_seconds: s.retry_base_seconds,
        max_seconds: s.retry_max_seconds,
        jitter_ratio: s.retry_jitter_ratio,
        dead_letter: true,
    }
}

/// A running job's lease in milliseconds.
pub(crate) fn lease_ms(jobs: &JobsConfig) -> Millis {
    i64::from(jobs.lease_seconds) * 1000
}

fn invalid(field: &'static str, reason: String) -> StoreError {
    CoreError::InvalidField { field, reason }.into()
}

/// Checks what an enqueue can check without the store: type, payload, key.
fn check_spec(spec: &JobSpec) -> Result<()> {
    if !valid_job_type(&spec.job_type) {
        return Err(invalid(
            "job_type",
            format!(
                "{:?} is not a job type: 1 to 64 of [a-z0-9_-], starting with a letter",
                spec.job_type
            ),
        ));
    }
    if !spec.payload.is_object() {
        return Err(invalid("payload", "must be a JSON object".into()));
    }
    let len = serde_json::to_string(&spec.payload)?.len();
    if len > MAX_JOB_PAYLOAD_BYTES {
        return Err(CoreError::TooLarge {
            field: "payload",
            len,
            max: MAX_JOB_PAYLOAD_BYTES,
        }
        .into());
    }
    if let Some(key) = &spec.idempotency_key {
        let chars = key.chars().count();
        if chars == 0 || chars > MAX_IDEMPOTENCY_KEY_CHARS || key.chars().any(char::is_control) {
            return Err(invalid(
                "idempotency_key",
                format!(
                    "must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters without control characters"
                ),
            ));
        }
    }
    Ok(())
}

/// A new job id: unique and ordered by creation time.
fn new_job_id() -> String {
    format!("job-{}", uuid::Uuid::now_v7().simple())
}

/// Enqueues `spec` at `now`: a new job (`pending`, or `delayed` until a future `run_at`), or
/// the non-terminal job that already holds its idempotency key.
pub(crate) fn enqueue(tx: &mut dyn JobTx, spec: JobSpec, now: Millis) -> Result<Enqueued> {
    check_spec(&spec)?;
    if let Some(parent) = &spec.parent_job_id
        && tx.job(parent)?.is_none()
    {
        return Err(invalid("parent_job_id", format!("no job {parent:?}")));
    }
    let run_at = spec.run_at_ms.unwrap_or(now);
    let new = StoredJob {
        token: None,
        job: Job {
            id: new_job_id(),
            job_type: spec.job_type,
            payload: spec.payload,
            idempotency_key: spec.idempotency_key,
            state: if run_at > now {
                JobState::Delayed
            } else {
                JobState::Pending
            },
            attempts: 0,
            run_at_ms: Some(run_at),
            claimed_by: None,
            claimed_until_ms: None,
            parent_job_id: spec.parent_job_id,
            progress: None,
            cancel_requested: false,
            error_code: None,
            last_error: None,
            created_at_ms: now,
            updated_at_ms: now,
            started_at_ms: None,
            finished_at_ms: None,
        },
    };
    // Each turn either inserts, or finds the holder of the key; it finds none only when the
    // holder finished between the two statements (a concurrent transaction on PostgreSQL),
    // and then the next insert no longer conflicts with it.
    loop {
        if tx.insert_job(&new)? {
            return Ok(Enqueued {
                job: new.job,
                created: true,
            });
        }
        let key = new.job.idempotency_key.as_deref().ok_or_else(|| {
            StoreError::Corrupt("a job without idempotency key conflicted on insert".into())
        })?;
        if let Some(held) = tx.job_by_key(key)? {
            return Ok(Enqueued {
                job: held.job,
                created: false,
            });
        }
    }
}

/// Claims up to `limit` runnable jobs of `types` for `worker_id` at `now`, oldest (`run_at`,
/// then id) first, never bringing a type above its concurrency: only running jobs with a
/// live lease take a slot. Types are locked in name order, so concurrent claimers of
/// overlapping sets cannot deadlock; a type listed twice gets the smaller concurrency.
pub(crate) fn claim(
    tx: &mut dyn JobTx,
    worker_id: &str,
    types: &[TypeSlots],
    limit: usize,
    lease_ms: Millis,
    now: Millis,
) -> Result<Vec<ClaimedJob>> {
    let mut slots: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    for t in types {
        let c = slots.entry(t.job_type.as_str()).or_insert(t.concurrency);
        *c = (*c).min(t.concurrency);
    }
    let mut candidates = Vec::new();
    for (job_type, concurrency) in slots {
        if limit == 0 {
            break;
        }
        tx.lock_type(job_type)?;
        let running = tx.running_count(job_type, now)?;
        let free = u64::from(concurrency).saturating_sub(running);
        let n = usize::try_from(free).unwrap_or(usize::MAX).min(limit);
        if n > 0 {
            candidates.extend(tx.claim_candidates(job_type, now, n)?);
        }
    }
    candidates.sort_by(|a, b| (a.job.run_at_ms, &a.job.id).cmp(&(b.job.run_at_ms, &b.job.id)));
    candidates.truncate(limit);
    let until = now + lease_ms;
    let mut out = Vec::with_capacity(candidates.len());
    for mut c in candidates {
        let token = queue::new_claim_token();
        let j = &mut c.job;
        j.state = JobState::Running;
        j.run_at_ms = Some(until);
        j.claimed_by = Some(worker_id.to_owned());
        j.claimed_until_ms = Some(until);
        j.started_at_ms = Some(now);
        j.updated_at_ms = now;
        c.token = Some(token.clone());
        tx.update_job(&c)?;
        out.push(ClaimedJob {
            claim: JobClaim {
                job_id: c.job.id.clone(),
                worker_id: worker_id.to_owned(),
                token,
                claimed_until_ms: until,
            },
            job: c.job,
        });
    }
    Ok(out)
}

/// What the fence says of a claim's job.
enum Fenced {
    /// The claim is live: the job, locked.
    Live(StoredJob),
    /// The job is completed already (accepted only where a repeat is harmless).
    Done(StoredJob),
}

/// Locks the job `claim` names and passes it through [`queue::fence`].
fn fenced(tx: &mut dyn JobTx, claim: &JobClaim, now: Millis, done_is_ok: bool) -> Result<Fenced> {
    let row = tx.lock_job(&claim.job_id)?;
    let lease = row.as_ref().map(|r| LeaseRow {
        phase: phase(r.job.state),
        status: r.job.state.as_str(),
        token: r.token.clone(),
        until: r.job.claimed_until_ms,
        attempts: r.job.attempts,
    });
    match (
        queue::fence(lease.as_ref(), &claim.token, now, done_is_ok),
        row,
    ) {
        (Ok(Some(_)), Some(r)) => Ok(Fenced::Live(r)),
        (Ok(None), Some(r)) => Ok(Fenced::Done(r)),
        (Err(Lost::Conflict(state)), _) => Err(StoreError::JobClaimConflict {
            job_id: claim.job_id.clone(),
            state,
        }),
        (Err(Lost::Missing), _) | (Ok(_), None) => Err(StoreError::JobNotFound {
            job_id: claim.job_id.clone(),
        }),
    }
}

/// The live job of `claim`, refusing a repeat on a completed one.
fn live(tx: &mut dyn JobTx, claim: &JobClaim, now: Millis) -> Result<StoredJob> {
    match fenced(tx, claim, now, false)? {
        Fenced::Live(j) => Ok(j),
        Fenced::Done(j) => Err(StoreError::JobClaimConflict {
            job_id: j.job.id,
            state: "status is completed".into(),
        }),
    }
}

/// Ends a job's run in `state` at `now` (its lease goes; who held it stays on record).
fn finish(j: &mut Job, state: JobState, now: Millis) {
    j.state = state;
    j.run_at_ms = None;
    j.claimed_until_ms = None;
    j.updated_at_ms = now;
    if state.is_terminal() {
        j.finished_at_ms = Some(now);
    }
}

/// Extends the live claim's lease to `now + lease_ms`, recording `progress` when given.
pub(crate) fn heartbeat(
    tx: &mut dyn JobTx,
    claim: &JobClaim,
    progress: Option<serde_json::Value>,
    lease_ms: Millis,
    now: Millis,
) -> Result<Heartbeat> {
    let mut j = live(tx, claim, now)?;
    let until = now + lease_ms;
    j.job.run_at_ms = Some(until);
    j.job.claimed_until_ms = Some(until);
    if progress.is_some() {
        j.job.progress = progress;
    }
    j.job.updated_at_ms = now;
    tx.update_job(&j)?;
    Ok(Heartbeat {
        claimed_until_ms: until,
        cancel_requested: j.job.cancel_requested,
    })
}

/// Completes the live claim's job with `result` as its progress when given; a completed
/// job is returned unchanged (a repeated acknowledgement). `changed` says which.
pub(crate) fn complete(
    tx: &mut dyn JobTx,
    claim: &JobClaim,
    result: Option<serde_json::Value>,
    now: Millis,
) -> Result<(Job, bool)> {
    let mut j = match fenced(tx, claim, now, true)? {
        Fenced::Live(j) => j,
        Fenced::Done(j) => return Ok((j.job, false)),
    };
    finish(&mut j.job, JobState::Completed, now);
    if result.is_some() {
        j.job.progress = result;
    }
    tx.update_job(&j)?;
    Ok((j.job, true))
}

/// Records the live claim's failure: `failed` until a backoff passes, or `dead` when not
/// retryable or out of retries (`[jobs]` settings of its type).
pub(crate) fn fail(
    tx: &mut dyn JobTx,
    claim: &JobClaim,
    failure: &JobFailure<'_>,
    jobs: &JobsConfig,
    now: Millis,
) -> Result<JobState> {
    let mut j = live(tx, claim, now)?;
    let policy = retry_policy(jobs.settings(&j.job.job_type));
    match policy.after_failure(j.job.attempts, failure.retryable, now) {
        AfterFailure::Retry {
            attempts,
            visible_at,
        } => {
            finish(&mut j.job, JobState::Failed, now);
            j.job.attempts = attempts;
            j.job.run_at_ms = Some(visible_at);
        }
        AfterFailure::Dead { attempts } => {
            finish(&mut j.job, JobState::Dead, now);
            j.job.attempts = attempts;
        }
    }
    j.job.error_code = Some(failure.code.as_str().to_owned());
    j.job.last_error = Some(queue::stored_error(failure.message));
    tx.update_job(&j)?;
    Ok(j.job.state)
}

/// Acknowledges a requested cancel: the live claim's job becomes `cancelled`.
pub(crate) fn ack_cancelled(tx: &mut dyn JobTx, claim: &JobClaim, now: Millis) -> Result<Job> {
    let mut j = live(tx, claim, now)?;
    if !j.job.cancel_requested {
        return Err(transition(&j.job, "no cancel was requested"));
    }
    finish(&mut j.job, JobState::Cancelled, now);
    tx.update_job(&j)?;
    Ok(j.job)
}

fn transition(j: &Job, reason: &'static str) -> StoreError {
    StoreError::JobTransition {
        job_id: j.id.clone(),
        state: j.state,
        reason,
    }
}

fn locked(tx: &mut dyn JobTx, job_id: &str) -> Result<StoredJob> {
    tx.lock_job(job_id)?.ok_or_else(|| StoreError::JobNotFound {
        job_id: job_id.to_owned(),
    })
}

/// Cancels a job at `now`: a waiting one (pending, delayed, failed) at once; a running one
/// with a live lease gets `cancel_requested` (its handler stops and acknowledges); a running
/// one whose lease ended has no live handler and is cancelled at once.
pub(crate) fn cancel(tx: &mut dyn JobTx, job_id: &str, now: Millis) -> Result<Job> {
    let mut j = locked(tx, job_id)?;
    match j.job.state {
        JobState::Running if j.job.claimed_until_ms.is_some_and(|u| now < u) => {
            if j.job.cancel_requested {
                return Ok(j.job);
            }
            j.job.cancel_requested = true;
            j.job.updated_at_ms = now;
        }
        JobState::Pending | JobState::Delayed | JobState::Failed | JobState::Running => {
            finish(&mut j.job, JobState::Cancelled, now);
        }
        JobState::Completed | JobState::Cancelled | JobState::Dead => {
            return Err(transition(&j.job, "the job is finished"));
        }
    }
    tx.update_job(&j)?;
    Ok(j.job)
}

/// Puts a dead or cancelled job back to `pending` at `now` with a fresh retry budget (its
/// last error stays on record); refused while another non-terminal job holds its key.
/// The first string after every string that starts with `prefix` (non-empty ASCII): the
/// exclusive end of its key range.
pub(crate) fn prefix_end(prefix: &str) -> Result<String> {
    match prefix.as_bytes().split_last() {
        Some((&last, head)) if prefix.is_ascii() && last < 0x7f => {
            let mut end = head.to_vec();
            end.push(last + 1);
            Ok(String::from_utf8_lossy(&end).into_owned())
        }
        _ => Err(ce_core::CoreError::InvalidField {
            field: "prefix",
            reason: format!("{prefix:?} is not a non-empty ASCII key prefix"),
        }
        .into()),
    }
}

pub(crate) fn retry(tx: &mut dyn JobTx, job_id: &str, now: Millis) -> Result<Job> {
    let mut j = locked(tx, job_id)?;
    if !matches!(j.job.state, JobState::Dead | JobState::Cancelled) {
        return Err(transition(
            &j.job,
            "only dead or cancelled jobs can be retried",
        ));
    }
    if let Some(key) = &j.job.idempotency_key
        && tx.job_by_key(key)?.is_some()
    {
        return Err(transition(
            &j.job,
            "another unfinished job holds its idempotency key",
        ));
    }
    let job = &mut j.job;
    job.state = JobState::Pending;
    job.attempts = 0;
    job.run_at_ms = Some(now);
    job.cancel_requested = false;
    job.claimed_until_ms = None;
    job.finished_at_ms = None;
    job.updated_at_ms = now;
    tx.update_job(&j)?;
    Ok(j.job)
}

/// One job.
pub(crate) fn job(tx: &mut dyn JobTx, job_id: &str) -> Result<Job> {
    tx.job(job_id)?
        .map(|j| j.job)
        .ok_or_else(|| StoreError::JobNotFound {
            job_id: job_id.to_owned(),
        })
}

/// The jobs `filter` selects, newest first.
pub(crate) fn list(tx: &mut dyn JobTx, filter: &JobFilter) -> Result<Vec<Job>> {
    crate::model::check_list_limit(Some(u32::try_from(filter.limit).unwrap_or(u32::MAX)))?;
    Ok(tx.list_jobs(filter)?.into_iter().map(|j| j.job).collect())
}

/// Counts by type and state.
pub(crate) fn counts(tx: &mut dyn JobTx) -> Result<Vec<JobCount>> {
    tx.job_counts()
}

/// Implements [`super::JobStore`] for a backend type that has a `config: Config` field and
/// `fn write_jobs<T>(&self, durable: bool, f: impl FnOnce(&mut dyn JobTx, Millis) -> Result<T>)
/// -> Result<T>` (a write transaction, synced at commit when `durable`) and
/// `fn read_jobs<T>(&self, f: impl FnOnce(&mut dyn JobTx) -> Result<T>) -> Result<T>`.
/// Enqueue, cancel and retry are acknowledged to a person or a caller and commit durably;
/// claim, heartbeat and acknowledgements are bookkeeping that replays safely (a lost commit
/// only runs a job again, handlers are idempotent).
macro_rules! impl_job_store {
    ($store:ty) => {
        impl $crate::jobs::JobStore for $store {
            fn enqueue(
                &self,
                spec: $crate::jobs::JobSpec,
            ) -> $crate::Result<$crate::jobs::Enqueued> {
                self.write_jobs(true, |tx, now| {
                    $crate::jobs::machine::enqueue(tx, spec, now)
                })
            }

            fn claim_jobs(
                &self,
                worker_id: &str,
                types: &[$crate::jobs::TypeSlots],
                limit: usize,
            ) -> $crate::Result<Vec<$crate::jobs::ClaimedJob>> {
                let lease = $crate::jobs::machine::lease_ms(&self.config.jobs);
                self.write_jobs(false, |tx, now| {
                    $crate::jobs::machine::claim(tx, worker_id, types, limit, lease, now)
                })
            }

            fn heartbeat(
                &self,
                claim: &$crate::jobs::JobClaim,
                progress: Option<serde_json::Value>,
            ) -> $crate::Result<$crate::jobs::Heartbeat> {
                let lease = $crate::jobs::machine::lease_ms(&self.config.jobs);
                self.write_jobs(false, |tx, now| {
                    $crate::jobs::machine::heartbeat(tx, claim, progress, lease, now)
                })
            }

            fn complete(
                &self,
                claim: &$crate::jobs::JobClaim,
                result: Option<serde_json::Value>,
            ) -> $crate::Result<$crate::jobs::Job> {
                self.write_jobs(false, |tx, now| {
                    $crate::jobs::machine::complete(tx, claim, result, now).map(|(j, _)| j)
                })
            }

            fn fail(
                &self,
                claim: &$crate::jobs::JobClaim,
                failure: &$crate::jobs::JobFailure<'_>,
            ) -> $crate::Result<$crate::jobs::JobState> {
                let jobs = &self.config.jobs;
                self.write_jobs(false, |tx, now| {
                    $crate::jobs::machine::fail(tx, claim, failure, jobs, now)
                })
            }

            fn ack_cancelled(
                &self,
                claim: &$crate::jobs::JobClaim,
            ) -> $crate::Result<$crate::jobs::Job> {
                self.write_jobs(false, |tx, now| {
                    $crate::jobs::machine::ack_cancelled(tx, claim, now)
                })
            }

            fn cancel(&self, job_id: &str) -> $crate::Result<$crate::jobs::Job> {
                self.write_jobs(true, |tx, now| {
                    $crate::jobs::machine::cancel(tx, job_id, now)
                })
            }

            fn retry(&self, job_id: &str) -> $crate::Result<$crate::jobs::Job> {
                self.write_jobs(true, |tx, now| {
                    $crate::jobs::machine::retry(tx, job_id, now)
                })
            }

            fn job(&self, job_id: &str) -> $crate::Result<$crate::jobs::Job> {
                self.read_jobs(|tx| $crate::jobs::machine::job(tx, job_id))
            }

            fn list_jobs(
                &self,
                filter: &$crate::jobs::JobFilter,
            ) -> $crate::Result<Vec<$crate::jobs::Job>> {
                self.read_jobs(|tx| $crate::jobs::machine::list(tx, filter))
            }

            fn job_counts(&self) -> $crate::Result<Vec<$crate::jobs::JobCount>> {
                self.read_jobs($crate::jobs::machine::counts)
            }

            fn live_job(&self, key: &str) -> $crate::Result<Option<$crate::jobs::Job>> {
                self.read_jobs(|tx| Ok(tx.job_by_key(key)?.map(|s| s.job)))
            }

            fn live_keys(&self, prefix: &str) -> $crate::Result<Vec<String>> {
                let to = $crate::jobs::machine::prefix_end(prefix)?;
                self.read_jobs(|tx| tx.live_keys(prefix, &to))
            }
        }
    };
}
pub(crate) use impl_job_store;

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(payload: serde_json::Value) -> JobSpec {
        JobSpec {
            job_type: "reindex".into(),
            payload,
            idempotency_key: None,
            run_at_ms: None,
            parent_job_id: None,
        }
    }

    fn field_of(r: Result<()>) -> &'static str {
        match r {
            Err(StoreError::Core(
                CoreError::InvalidField { field, .. } | CoreError::TooLarge { field, .. },
            )) => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn specs_are_checked_field_by_field() {
        let ok = spec(serde_json::json!({"a": 1}));
        assert!(check_spec(&ok).is_ok());
        for bad_type in ["", "Reindex", "1x", "re index", &"x".repeat(65)] {
            let s = JobSpec {
                job_type: bad_type.into(),
                ..ok.clone()
            };
            assert_eq!(field_of(check_spec(&s)), "job_type", "{bad_type:?}");
        }
        for bad in [
            serde_json::json!([1]),
            serde_json::json!("x"),
            serde_json::Value::Null,
        ] {
            assert_eq!(field_of(check_spec(&spec(bad))), "payload");
        }
        let big = serde_json::json!({"x": "y".repeat(MAX_JOB_PAYLOAD_BYTES)});
        assert_eq!(field_of(check_spec(&spec(big))), "payload");
        let fits = serde_json::json!({"x": "y".repeat(MAX_JOB_PAYLOAD_BYTES - 8)});
        assert!(check_spec(&spec(fits)).is_ok());
        for (key, good) in [
            (String::new(), false),
            ("k".repeat(MAX_IDEMPOTENCY_KEY_CHARS), true),
            ("é".repeat(MAX_IDEMPOTENCY_KEY_CHARS), true),
            ("k".repeat(MAX_IDEMPOTENCY_KEY_CHARS + 1), false),
            ("a\nb".into(), false),
            ("kb:B:I:index".into(), true),
        ] {
            let s = JobSpec {
                idempotency_key: Some(key.clone()),
                ..ok.clone()
            };
            if good {
                assert!(check_spec(&s).is_ok(), "{key:?}");
            } else {
                assert_eq!(field_of(check_spec(&s)), "idempotency_key", "{key:?}");
            }
        }
    }

    #[test]
    fn job_states_map_onto_queue_phases() {
        let phases: Vec<Phase> = JobState::ALL.into_iter().map(phase).collect();
        assert_eq!(
            phases,
            [
                Phase::Waiting,
                Phase::Waiting,
                Phase::Claimed,
                Phase::Done,
                Phase::Waiting,
                Phase::Cancelled,
                Phase::Dead
            ]
        );
        for s in JobState::ALL {
            assert_eq!(
                s.is_terminal(),
                matches!(phase(s), Phase::Done | Phase::Dead | Phase::Cancelled),
                "{s:?}"
            );
        }
    }
}
