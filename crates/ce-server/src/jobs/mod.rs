//! Durable jobs in the engine (DESIGN.md §7; docs/jobs.md, "Runner"): the handlers of the
//! job types this build runs, and the runner that hands them the jobs it claims.
//!
//! ```text
//! Engine::enqueue_job ─► JobRegistry: known type? valid payload? ─► JobStore::enqueue ─► wake
//!
//! runner (ce serve, ce worker: woken by the workers' wake-up hints, else every
//!         [jobs].poll_interval_ms; ce worker --once and ce reindex: in the command)
//!   claim_jobs(registered types, TypeSlots of [jobs]) ─► one thread per claimed job:
//!     heartbeat every [jobs].heartbeat_seconds: lease, progress, cancel_requested
//!     JobHandler::run ─► complete │ fail (code + retryable of the error) │ ack_cancelled
//! ```
//!
//! - [`registry`]: the [`JobHandler`] trait and the one list of the job types
//! - [`heartbeat`]: the lease kept beside a running handler, and its [`JobContext`]
//! - [`runner`]: one claimed job to its outcome, the due jobs drained once, the continuous
//!   runner
//! - [`reindex`]: the `reindex` job type
//!
//! A handler that panics fails its job (retryable, `internal`); the runner goes on. A
//! process that dies leaves its jobs `running` until their leases end; the next claim after
//! that resumes them (attempts unchanged: a lost lease is not a failure).

mod heartbeat;
pub mod registry;
pub mod reindex;
mod runner;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ce_core::{Config, CoreError, ErrorCode};
use ce_store::{Enqueued, Job, JobFilter, JobSpec, JobState};
use tracing::info;

pub use self::heartbeat::JobContext;
pub use self::registry::{JobHandler, JobRegistry};
pub use self::runner::{JobsRun, RUN_LATENCY_METRIC};
use crate::engine::{Engine, EngineOptions};
use crate::error::{Result, ServerError};
use crate::status::JobsStatus;

/// Why a handler stopped at a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStop {
    /// A cancel was asked for ([`ce_store::JobStore::cancel`]).
    Cancelled,
    /// A heartbeat found the claim gone: the lease ended and another runner took the job.
    LeaseLost,
}

impl JobStop {
    /// The code of the stop: a cancelled job will not finish (`state_transition`); a lost
    /// lease means another runner has the job (`claim_conflict`).
    pub fn code(self) -> ErrorCode {
        match self {
            JobStop::Cancelled => ErrorCode::StateTransition,
            JobStop::LeaseLost => ErrorCode::ClaimConflict,
        }
    }

    /// Whether waiting may still see the job finish: only when another runner has it.
    pub fn is_retryable(self) -> bool {
        match self {
            JobStop::Cancelled => false,
            JobStop::LeaseLost => true,
        }
    }
}

impl std::fmt::Display for JobStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobStop::Cancelled => "cancelled on request",
            JobStop::LeaseLost => "its lease was lost to another runner",
        })
    }
}

/// The engine's side of the jobs: the registry, and the runner while one runs here.
pub struct Jobs {
    registry: JobRegistry,
    runner: Mutex<Option<runner::Runner>>,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs {
            registry: JobRegistry::builtin(),
            runner: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("types", &self.registry.types())
            .finish_non_exhaustive()
    }
}

/// Parses a job state argument (`--state`, `?state=`); an unknown one is `invalid_field`.
pub fn parse_state(s: &str) -> std::result::Result<JobState, CoreError> {
    s.parse().map_err(|reason| CoreError::InvalidField {
        field: "state",
        reason,
    })
}

/// The error of a job that ended without its result: dead, cancelled, or failed and waiting
/// to retry (`None` for the other states). It keeps the job's error code; only a job that
/// will run again is retryable.
pub fn job_error(job: &Job) -> Option<ServerError> {
    let failed = |retryable: bool, what: &str| ServerError::Failed {
        context: format!("job {} ({}) {what}", job.id, job.job_type),
        code: job
            .error_code
            .as_deref()
            .and_then(|c| c.parse().ok())
            .unwrap_or(ErrorCode::Internal),
        retryable,
        message: job.last_error.clone().unwrap_or_default(),
    };
    match job.state {
        JobState::Dead => Some(failed(
            false,
            &format!(
                "is dead after {} attempts (`ce jobs retry {}` runs it again)",
                job.attempts, job.id
            ),
        )),
        JobState::Failed => Some(failed(
            true,
            &format!(
                "failed (attempt {}; it runs again after its backoff)",
                job.attempts
            ),
        )),
        JobState::Cancelled => Some(ServerError::JobStopped {
            job_id: job.id.clone(),
            stop: JobStop::Cancelled,
        }),
        JobState::Pending | JobState::Delayed | JobState::Running | JobState::Completed => None,
    }
}

impl Engine {
    /// Opens the engine ([`Engine::open_with`]) shared behind an `Arc`, with the job runner
    /// running when `options.run_workers` (and `[jobs].enabled`): `ce serve`, `ce worker`.
    pub fn open_shared(
        data_dir: &Path,
        config: Config,
        options: EngineOptions,
    ) -> Result<Arc<Engine>> {
        let run = options.run_workers;
        let engine = Arc::new(Engine::open_with(data_dir, config, options)?);
        if run {
            engine.start_jobs();
        }
        Ok(engine)
    }

    /// Starts the job runner unless `[jobs].enabled` is false or it already runs.
    pub fn start_jobs(self: &Arc<Self>) {
        if !self.config().jobs.enabled {
            info!("jobs.enabled is false: no job runner");
            return;
        }
        let mut slot = self
            .jobs
            .runner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(runner::Runner::start(self));
            drop(slot);
            crate::kb::start_background(self);
        }
    }

    /// Stops the job runner: no new claim, and the running handlers finish first.
    pub(crate) fn stop_jobs(&self) {
        let runner = self
            .jobs
            .runner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(r) = runner {
            crate::kb::stop_background(self);
            r.stop();
        }
    }

    /// Whether the job runner runs in this process.
    pub fn job_runner_running(&self) -> bool {
        self.jobs
            .runner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The job types this build runs.
    pub fn job_registry(&self) -> &JobRegistry {
        &self.jobs.registry
    }

    /// Enqueues a job of a registered type whose payload its handler accepts (else
    /// `invalid_field`), then wakes the runner.
    pub fn enqueue_job(&self, spec: JobSpec) -> Result<Enqueued> {
        self.jobs.registry.validate(&spec.job_type, &spec.payload)?;
        let enqueued = self.store().jobs().enqueue(spec)?;
        self.wakeup().notify();
        Ok(enqueued)
    }

    /// One job.
    pub fn job(&self, job_id: &str) -> Result<Job> {
        Ok(self.store().jobs().job(job_id)?)
    }

    /// The jobs `filter` selects, newest first.
    pub fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        Ok(self.store().jobs().list_jobs(filter)?)
    }

    /// Cancels a job (a running one stops at its handler's next checkpoint).
    pub fn cancel_job(&self, job_id: &str) -> Result<Job> {
        Ok(self.store().jobs().cancel(job_id)?)
    }

    /// Puts a dead or cancelled job back to pending, then wakes the runner.
    pub fn retry_job(&self, job_id: &str) -> Result<Job> {
        let job = self.store().jobs().retry(job_id)?;
        self.wakeup().notify();
        Ok(job)
    }

    /// Job counts by state (every state) and by type, and whether a runner runs here.
    pub fn jobs_status(&self) -> Result<JobsStatus> {
        let counts = self.store().jobs().job_counts()?;
        let mut by_state: BTreeMap<JobState, u64> =
            JobState::ALL.into_iter().map(|s| (s, 0)).collect();
        for c in &counts {
            *by_state.entry(c.state).or_default() += c.count;
        }
        Ok(JobsStatus {
            enabled: self.config().jobs.enabled,
            runner: self.job_runner_running(),
            types: self
                .jobs
                .registry
                .types()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            by_state,
            counts,
        })
    }

    /// Waits until job `job_id` is completed, dead, cancelled or failed (waiting to retry),
    /// and returns it; `on_change` sees it each time its state or progress changes. When
    /// `run_here`, this call runs the due jobs itself meanwhile (a command without a server:
    /// `ce reindex`); else another runner must (`ce serve`'s).
    pub fn follow_job(
        &self,
        job_id: &str,
        run_here: bool,
        on_change: &dyn Fn(&Job),
    ) -> Result<Job> {
        follow(
            || self.job(job_id),
            || Ok(run_here && self.run_claimable_jobs()?.ran > 0),
            Duration::from_millis(self.config().jobs.poll_interval_ms),
            on_change,
        )
    }
}

/// Reads a job with `fetch` until it is completed, dead, cancelled or failed (waiting to
/// retry) and returns it, calling `on_change` each time its state or progress changes, and
/// `work` between reads (when it did something, the next read comes at once, else after
/// `poll`). Shared by the engine and the CLI's `--server` mode.
pub fn follow<E>(
    mut fetch: impl FnMut() -> std::result::Result<Job, E>,
    mut work: impl FnMut() -> std::result::Result<bool, E>,
    poll: Duration,
    on_change: &dyn Fn(&Job),
) -> std::result::Result<Job, E> {
    let mut seen: Option<(JobState, Option<serde_json::Value>)> = None;
    loop {
        let job = fetch()?;
        let now = (job.state, job.progress.clone());
        if seen.as_ref() != Some(&now) {
            on_change(&job);
            seen = Some(now);
        }
        if job.state.is_terminal() || job.state == JobState::Failed {
            return Ok(job);
        }
        if !work()? {
            std::thread::sleep(poll);
        }
    }
}
