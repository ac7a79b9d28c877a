//! Running jobs. [`run_claimed`] takes one claimed job to its outcome: the heartbeat beside
//! the handler, then the acknowledgement its result calls for. [`Engine::run_due_jobs`]
//! drains the due jobs once (`ce worker --once`); [`Runner`] claims continuously (`ce serve`,
//! `ce worker`), one thread per job, up to the sum of the types' concurrency.
//!
//! Every runner of a process claims as `{role}-jobs-{pid}`; each claim has its own token, so
//! the store fences each job's acknowledgement by its claim, not by the runner's name.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ce_core::{Classify as _, ErrorCode};
use ce_index::worker::runner::Wakeup;
use ce_store::{ClaimedJob, Job, JobClaim, JobFailure, JobState, JobStore, TypeSlots};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};

use super::JobStop;
use super::heartbeat::{Beat, JobContext};
use crate::engine::Engine;
use crate::error::{Result, ServerError};
use crate::status::DrainReport;

/// The histogram of job run times, per job type.
pub const RUN_LATENCY_METRIC: &str = "ce_job_run_latency_ms";

/// What a run of jobs did, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsRun {
    /// Jobs claimed and run.
    pub ran: u64,
    /// Completed.
    pub completed: u64,
    /// Failed, waiting to retry.
    pub failed: u64,
    /// Failed for good.
    pub dead: u64,
    /// Stopped on a cancel.
    pub cancelled: u64,
    /// Whose claim was lost before the acknowledgement (another runner has them).
    pub lost: u64,
}

impl JobsRun {
    fn count(&mut self, outcome: Outcome) {
        self.ran += 1;
        match outcome {
            Outcome::Completed => self.completed += 1,
            Outcome::Failed(JobState::Dead) => self.dead += 1,
            Outcome::Failed(_) => self.failed += 1,
            Outcome::Cancelled => self.cancelled += 1,
            Outcome::Lost => self.lost += 1,
        }
    }

    fn absorb(&mut self, other: JobsRun) {
        self.ran += other.ran;
        self.completed += other.completed;
        self.failed += other.failed;
        self.dead += other.dead;
        self.cancelled += other.cancelled;
        self.lost += other.lost;
    }
}

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Completed,
    /// `fail` answered this state (`failed` or `dead`).
    Failed(JobState),
    Cancelled,
    Lost,
}

/// The claimant name of this process's runners.
fn worker_id(engine: &Engine) -> String {
    format!("{}-jobs-{}", engine.options().role, std::process::id())
}

/// Fault injection for black-box tests (debug builds only): with
/// `CE_FAILPOINT_JOB_PARK_MS=N`, every claimed job waits N ms before its handler starts,
/// stopping early at a cancel or a lost lease, so a test can kill the process mid-job.
#[cfg(debug_assertions)]
pub const PARK_VAR: &str = "CE_FAILPOINT_JOB_PARK_MS";

fn park(ctx: &JobContext<'_>) -> Result<()> {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var(PARK_VAR)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        warn!(ms, "failpoint: the job is parked before its handler");
        let until = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < until {
            ctx.checkpoint()?;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    ctx.checkpoint()
}

/// Runs one claimed job with its heartbeat and acknowledges the outcome.
fn run_claimed(engine: &Engine, claimed: ClaimedJob) -> Outcome {
    let ClaimedJob { job, claim } = claimed;
    let jobs = engine.store().jobs();
    let every = Duration::from_secs(engine.config().jobs.heartbeat_seconds.into());
    let started = Instant::now();
    info!(job_id = %job.id, job_type = %job.job_type, attempts = job.attempts, "job started");
    let beat = Beat::default();
    let result = std::thread::scope(|s| {
        s.spawn(|| beat.keep(jobs, &claim, every));
        let result = dispatch(engine, &job, &JobContext::new(&job.id, &beat));
        beat.stop();
        result
    });
    let outcome = acknowledge(jobs, &job, &claim, result);
    let took = started.elapsed().as_secs_f64() * 1e3;
    metrics::histogram!(RUN_LATENCY_METRIC, "type" => job.job_type.clone()).record(took);
    info!(job_id = %job.id, job_type = %job.job_type, outcome = ?outcome, ms = took, "job ended");
    outcome
}

/// Checks the payload again and runs the handler; a panic is a retryable internal error.
fn dispatch(engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>> {
    let handler = engine.job_registry().handler(&job.job_type)?;
    handler.validate(&job.payload)?;
    park(ctx)?;
    std::panic::catch_unwind(AssertUnwindSafe(|| handler.run(engine, job, ctx))).unwrap_or_else(
        |panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            // Unlike an internal error returned by the code, a panic may come from a state
            // that passes (a poisoned lock, a race): the job's retry budget bounds it.
            Err(ServerError::Failed {
                context: format!("the {} handler", job.job_type),
                code: ErrorCode::Internal,
                retryable: true,
                message: format!("panicked: {what}"),
            })
        },
    )
}

/// Records `result`: complete, ack_cancelled or fail (classified by the error). A refused
/// acknowledgement means the claim is gone: another runner has the job.
fn acknowledge(
    jobs: &dyn JobStore,
    job: &Job,
    claim: &JobClaim,
    result: Result<Option<Value>>,
) -> Outcome {
    let acked = match result {
        Ok(value) => jobs.complete(claim, value).map(|_| Outcome::Completed),
        Err(ServerError::JobStopped {
            stop: JobStop::Cancelled,
            ..
        }) => jobs.ack_cancelled(claim).map(|_| Outcome::Cancelled),
        Err(ServerError::JobStopped {
            stop: JobStop::LeaseLost,
            ..
        }) => return Outcome::Lost,
        Err(e) => {
            warn!(job_id = %job.id, code = %e.code(), retryable = e.is_retryable(), error = %e, "job failed");
            let message = e.to_string();
            let failure = JobFailure {
                code: e.code(),
                retryable: e.is_retryable(),
                message: &message,
            };
            jobs.fail(claim, &failure).map(Outcome::Failed)
        }
    };
    acked.unwrap_or_else(|e| {
        warn!(job_id = %job.id, error = %e, "job outcome not recorded: its claim is gone");
        Outcome::Lost
    })
}

impl Engine {
    /// The claim slots of the registered types this engine runs, and their total.
    fn job_slots(&self) -> (Vec<TypeSlots>, usize) {
        let slots = self.job_registry().slots(self, &self.config().jobs);
        let capacity = slots.iter().map(|s| s.concurrency as usize).sum();
        (slots, capacity)
    }

    /// Claims the due jobs once (up to the types' concurrency) and runs them, each on its
    /// own thread, until all of them end.
    pub(crate) fn run_claimable_jobs(&self) -> Result<JobsRun> {
        let (slots, capacity) = self.job_slots();
        let mut run = JobsRun::default();
        if capacity == 0 {
            return Ok(run);
        }
        let claimed = self
            .store()
            .jobs()
            .claim_jobs(&worker_id(self), &slots, capacity)?;
        std::thread::scope(|s| {
            let runs: Vec<_> = claimed
                .into_iter()
                .map(|c| s.spawn(move || run_claimed(self, c)))
                .collect();
            for r in runs {
                run.count(r.join().unwrap_or(Outcome::Lost));
            }
        });
        Ok(run)
    }

    /// Runs due jobs until none can be claimed and none of the types this engine runs is
    /// running elsewhere (a runner that died holds its jobs until their leases end: they are
    /// waited for and resumed here). Jobs waiting for their `run_at` (delayed, or failed
    /// and backing off) are left for later.
    pub fn run_due_jobs(&self) -> Result<JobsRun> {
        let poll = Duration::from_millis(self.config().jobs.poll_interval_ms);
        let mut total = JobsRun::default();
        loop {
            let run = self.run_claimable_jobs()?;
            total.absorb(run);
            if run.ran > 0 {
                continue;
            }
            let (slots, _) = self.job_slots();
            let running = self.store().jobs().job_counts()?.into_iter().any(|c| {
                c.state == JobState::Running && slots.iter().any(|s| s.job_type == c.job_type)
            });
            if !running {
                return Ok(total);
            }
            std::thread::sleep(poll);
        }
    }

    /// `ce worker --once`: the due jobs (when `[jobs].enabled`), then a drain of the
    /// deliveries ([`Engine::drain`]), again until a round finds neither (a job may append
    /// events; the events of later job types may enqueue jobs). The report adds up the
    /// rounds; `remaining` is the last round's.
    pub fn drain_jobs_and_deliveries(
        &self,
        progress: &(dyn Fn(&crate::status::DrainProgress) + Sync),
    ) -> Result<(DrainReport, JobsRun)> {
        let mut jobs = JobsRun::default();
        let mut before = crate::status::DrainProgress::default();
        loop {
            let ran = if self.config().jobs.enabled {
                self.run_due_jobs()?
            } else {
                JobsRun::default()
            };
            jobs.absorb(ran);
            let mut report = self.drain(&|p: &crate::status::DrainProgress| {
                progress(&sum(&before, p));
            })?;
            let drained = report.progress.claimed;
            report.progress = sum(&before, &report.progress);
            if ran.ran == 0 && (drained == 0 || !self.config().jobs.enabled) {
                return Ok((report, jobs));
            }
            before = report.progress;
        }
    }
}

/// Totals of two drain rounds (the second's clock started later, so times add up).
fn sum(
    a: &crate::status::DrainProgress,
    b: &crate::status::DrainProgress,
) -> crate::status::DrainProgress {
    crate::status::DrainProgress {
        events: a.events + b.events,
        batches: a.batches + b.batches,
        claimed: a.claimed + b.claimed,
        succeeded: a.succeeded + b.succeeded,
        failed: a.failed + b.failed,
        retried: a.retried + b.retried,
        elapsed_ms: a.elapsed_ms + b.elapsed_ms,
    }
}

thread_local! {
    /// Set on the threads that run a job of the continuous runner.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// Jobs running on the continuous runner's threads.
#[derive(Default)]
struct Active {
    count: Mutex<usize>,
    idle: Condvar,
}

impl Active {
    fn count(&self) -> usize {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enter(&self) {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    }

    fn leave(&self) {
        let mut n = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        *n = n.saturating_sub(1);
        self.idle.notify_all();
    }

    fn wait_idle(&self) {
        let n = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let _idle = self
            .idle
            .wait_while(n, |n| *n > 0)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// The continuous runner: a dispatcher thread that claims while slots are free and waits for
/// a wake-up hint (or the poll interval) when none is; each claimed job runs on its own
/// thread. It holds the engine weakly, so dropping the engine ends it.
pub(super) struct Runner {
    stop: Arc<AtomicBool>,
    wake: Arc<Wakeup>,
    active: Arc<Active>,
    thread: Option<JoinHandle<()>>,
}

impl Runner {
    /// Starts the dispatcher of `engine`.
    pub(super) fn start(engine: &Arc<Engine>) -> Runner {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = engine.wakeup().clone();
        let active = Arc::new(Active::default());
        let (weak, s, w, a) = (
            Arc::downgrade(engine),
            stop.clone(),
            wake.clone(),
            active.clone(),
        );
        let poll = Duration::from_millis(engine.config().jobs.poll_interval_ms);
        let thread = std::thread::Builder::new()
            .name("ce-jobs".into())
            .spawn(move || dispatch_loop(&weak, &s, &w, &a, poll))
            .map_err(|e| warn!(error = %e, "cannot start the job runner"))
            .ok();
        info!(types = ?engine.job_slots().0, "job runner started");
        Runner {
            stop,
            wake,
            active,
            thread,
        }
    }

    /// Stops claiming and waits for the running jobs to end.
    pub(super) fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify();
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
        // A job thread that drops the last handle of the engine stops the runner itself:
        // it must not wait for its own end.
        if !IN_JOB.get() {
            self.active.wait_idle();
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.halt();
    }
}

fn dispatch_loop(
    engine: &Weak<Engine>,
    stop: &AtomicBool,
    wake: &Arc<Wakeup>,
    active: &Arc<Active>,
    poll: Duration,
) {
    while !stop.load(Ordering::SeqCst) {
        let seen = wake.current();
        let Some(e) = engine.upgrade() else { return };
        let (slots, capacity) = e.job_slots();
        let free = capacity.saturating_sub(active.count());
        let claimed = if free == 0 {
            Vec::new()
        } else {
            e.store()
                .jobs()
                .claim_jobs(&worker_id(&e), &slots, free)
                .unwrap_or_else(|err| {
                    warn!(error = %err, "job claim failed");
                    Vec::new()
                })
        };
        let any = !claimed.is_empty();
        for c in claimed {
            spawn_job(&e, c, active, wake);
        }
        drop(e);
        if !any {
            wake.wait(seen, poll);
        }
    }
}

/// Runs `c` on a thread of its own; its end wakes the dispatcher (a slot is free).
fn spawn_job(engine: &Arc<Engine>, c: ClaimedJob, active: &Arc<Active>, wake: &Arc<Wakeup>) {
    active.enter();
    let job_id = c.job.id.clone();
    let (engine, done, wake) = (engine.clone(), active.clone(), wake.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("ce-job-{job_id}"))
        .spawn(move || {
            IN_JOB.set(true);
            run_claimed(&engine, c);
            drop(engine);
            done.leave();
            wake.notify();
        });
    if let Err(e) = spawned {
        // The job stays claimed until its lease ends; then any runner resumes it.
        warn!(%job_id, error = %e, "cannot start a job thread");
        active.leave();
    }
}
