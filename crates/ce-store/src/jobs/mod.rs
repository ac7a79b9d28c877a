//! Durable workflow jobs (DESIGN.md §7; docs/jobs.md): typed work items with an idempotency
//! key, a run-at time, a parent, best-effort progress, cancellation, and a lease fenced
//! exactly like an outbox delivery. The claim / lease / fence / backoff / dead rules are
//! [`crate::queue`]'s, shared with the outbox; this module holds the job vocabulary and the
//! [`JobStore`] trait each backend implements.
//!
//! States (stored as text, [`JobState::as_str`]):
//!
//! ```text
//!  enqueue ──► pending                delayed ◄── enqueue with a future run_at
//!                │  ▲                    │ claim once run_at is reached
//!        claim   │  └─ retry of a dead   │
//!                ▼     or cancelled job  ▼
//!             running ◄── claim again once the lease ended (crash; attempts unchanged)
//!                ├──complete──► completed
//!                ├──fail (retryable, retries left)──► failed ──claim once run_at is reached──► running
//!                ├──fail (permanent or out of retries)──► dead ──retry──► pending
//!                └──cancel requested, handler acknowledges──► cancelled
//!  cancel of pending / delayed / failed, or of running with an ended lease ──► cancelled
//! ```
//!
//! Due `delayed` and `failed` jobs keep that state until a claim takes them (listings show
//! them so). Terminal: `completed`, `cancelled`, `dead` (dead and cancelled jobs can be
//! retried by hand). An idempotency key is unique among non-terminal jobs, by key alone
//! across job types; the store's unique index guarantees it, also between concurrent
//! enqueues. The transitions are written once in `machine.rs` over the row primitives
//! (`rows.rs`, `JobTx`) that each backend implements.

use ce_core::{ErrorCode, Millis};
use serde::{Deserialize, Serialize};

use crate::error::Result;

pub(crate) mod machine;
pub(crate) mod rows;

pub use machine::{MAX_IDEMPOTENCY_KEY_CHARS, MAX_JOB_PAYLOAD_BYTES};

/// The lifecycle state of a job.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Runnable now.
    Pending,
    /// Runnable once its `run_at` is reached.
    Delayed,
    /// Held by a runner's claim until its lease ends.
    Running,
    /// Finished successfully (terminal).
    Completed,
    /// Failed, waiting for its retry at `run_at`.
    Failed,
    /// Stopped on request (terminal).
    Cancelled,
    /// Failed for good: not retryable, or out of retries (terminal until retried by hand).
    Dead,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Delayed,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Dead,
    ];

    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Delayed => "delayed",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Dead => "dead",
        }
    }

    /// Whether the job is finished: it no longer holds its idempotency key.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Cancelled | JobState::Dead
        )
    }
}

impl std::str::FromStr for JobState {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<JobState, String> {
        JobState::ALL
            .into_iter()
            .find(|j| j.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = JobState::ALL.iter().map(|j| j.as_str()).collect();
                format!("{s:?} is not a job state ({})", names.join(", "))
            })
    }
}

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job type (`[a-z][a-z0-9_-]{0,63}`): which handler runs it.
    pub job_type: String,
    /// The handler's input (a JSON object; the handler validates its shape at enqueue
    /// through the runner's registry, and again when it runs).
    pub payload: serde_json::Value,
    /// Deduplicates enqueues: while a non-terminal job holds this key (whatever its type),
    /// enqueueing it again returns that job.
    pub idempotency_key: Option<String>,
    /// Not before this time (`delayed` until then); `None`: now.
    pub run_at_ms: Option<Millis>,
    /// The job that enqueued this one.
    pub parent_job_id: Option<String>,
}

/// A stored job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Job {
    /// Its id: unique and ordered by creation time (`job-<uuid v7>`).
    pub id: String,
    /// Its type.
    pub job_type: String,
    /// Its input.
    pub payload: serde_json::Value,
    /// Its idempotency key.
    pub idempotency_key: Option<String>,
    /// Its state.
    pub state: JobState,
    /// Failures counted so far.
    pub attempts: u32,
    /// When it is (or was) runnable from (`pending`, `delayed`, `failed`), or its lease end
    /// (`running`); `None` once terminal.
    pub run_at_ms: Option<Millis>,
    /// The runner holding it (`running`), or that last held it.
    pub claimed_by: Option<String>,
    /// Lease end of the live claim (`running`).
    pub claimed_until_ms: Option<Millis>,
    /// The job that enqueued it.
    pub parent_job_id: Option<String>,
    /// Best-effort progress written by the handler (e.g. `{"done": 10, "total": 40,
    /// "stage": "…"}`); on completion, its result.
    pub progress: Option<serde_json::Value>,
    /// Whether a cancel was asked for while it ran.
    pub cancel_requested: bool,
    /// Code of the last failure.
    pub error_code: Option<String>,
    /// Message of the last failure.
    pub last_error: Option<String>,
    /// Creation time.
    pub created_at_ms: Millis,
    /// Last change.
    pub updated_at_ms: Millis,
    /// When the current (or last) run started.
    pub started_at_ms: Option<Millis>,
    /// When it reached a terminal state.
    pub finished_at_ms: Option<Millis>,
}

/// The claim a runner acknowledges a job with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobClaim {
    /// The job.
    pub job_id: String,
    /// The runner that claimed it.
    pub worker_id: String,
    /// The token of this claim; a later claim of the same job gets another.
    pub token: String,
    /// Lease end.
    pub claimed_until_ms: Millis,
}

/// A job handed to a runner.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    /// The job as claimed (state `running`).
    pub job: Job,
    /// The claim to acknowledge with.
    pub claim: JobClaim,
}

/// The answer to an enqueue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Enqueued {
    /// The job: new, or the non-terminal one already holding the idempotency key.
    pub job: Job,
    /// Whether this enqueue created it.
    pub created: bool,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// The new lease end.
    pub claimed_until_ms: Millis,
    /// Whether a cancel was asked for: the handler should stop at this checkpoint and
    /// acknowledge with [`JobStore::ack_cancelled`].
    pub cancel_requested: bool,
}

/// A failure as the handler classified it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobFailure<'a> {
    /// The error's code.
    pub code: ErrorCode,
    /// Whether running it again may succeed.
    pub retryable: bool,
    /// The error's message (stored truncated to 4096 characters).
    pub message: &'a str,
}

/// How many running jobs of one type a claim may bring to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeSlots {
    /// The job type.
    pub job_type: String,
    /// Running jobs of this type at once, across every runner.
    pub concurrency: u32,
}

/// Which jobs to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only this state.
    pub state: Option<JobState>,
    /// Only this type.
    pub job_type: Option<String>,
    /// Only children of this job.
    pub parent_job_id: Option<String>,
    /// At most this many (1..=[`crate::MAX_LIST_LIMIT`]), newest first.
    pub limit: usize,
}

/// How many jobs of one type are in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobCount {
    /// The job type.
    pub job_type: String,
    /// The state.
    pub state: JobState,
    /// How many.
    pub count: u64,
}

/// The durable job queue of a backend.
pub trait JobStore: Send + Sync {
    /// Enqueues a job in its own transaction (inside a source write, use
    /// [`crate::WriteOp::Enqueue`]); returns the existing job when a non-terminal one holds
    /// the idempotency key.
    fn enqueue(&self, spec: JobSpec) -> Result<Enqueued>;
    /// Claims up to `limit` runnable jobs of the given types for `worker_id`, oldest first:
    /// pending ones, delayed and failed ones whose `run_at` is reached, running ones whose
    /// lease expired — never bringing a type above its concurrency (only running jobs
    /// count).
    fn claim_jobs(
        &self,
        worker_id: &str,
        types: &[TypeSlots],
        limit: usize,
    ) -> Result<Vec<ClaimedJob>>;
    /// Extends a live claim's lease and records `progress` when given; says whether a cancel
    /// was asked for.
    fn heartbeat(&self, claim: &JobClaim, progress: Option<serde_json::Value>)
    -> Result<Heartbeat>;
    /// Marks a claimed job completed, with its result in `progress` when given; repeating it
    /// on a completed job succeeds unchanged.
    fn complete(&self, claim: &JobClaim, result: Option<serde_json::Value>) -> Result<Job>;
    /// Records a failure: `failed` with a backoff before the next run, or `dead` when not
    /// retryable or out of retries (`[jobs]` settings of its type). Returns the new state.
    fn fail(&self, claim: &JobClaim, failure: &JobFailure<'_>) -> Result<JobState>;
    /// Acknowledges a requested cancel: the running job becomes `cancelled`.
    fn ack_cancelled(&self, claim: &JobClaim) -> Result<Job>;
    /// Cancels a job: pending, delayed or failed ones at once; a running one gets
    /// `cancel_requested` (its handler stops at its next checkpoint). A terminal job is a
    /// state-transition error.
    fn cancel(&self, job_id: &str) -> Result<Job>;
    /// Puts a dead (or cancelled) job back to pending with a fresh retry budget; refused
    /// when another non-terminal job holds its idempotency key.
    fn retry(&self, job_id: &str) -> Result<Job>;
    /// One job.
    fn job(&self, job_id: &str) -> Result<Job>;
    /// Jobs `filter` selects, newest first.
    fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>>;
    /// Counts by type and state (states with no job omitted).
    fn job_counts(&self) -> Result<Vec<JobCount>>;
    /// The non-terminal job holding idempotency key `key`, if any.
    fn live_job(&self, key: &str) -> Result<Option<Job>>;
    /// Every idempotency key starting with `prefix` (non-empty ASCII) that a non-terminal job
    /// holds, in one read: what a scan over many keys asks instead of [`JobStore::live_job`]
    /// per key.
    fn live_keys(&self, prefix: &str) -> Result<Vec<String>>;
}
