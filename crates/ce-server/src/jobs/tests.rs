//! The runner on a real store (SQLite in a temporary data directory) with test handlers: a
//! model of the outcomes checked after every step of random operation sequences, panics,
//! cancellation at a checkpoint, progress through the heartbeat, and the continuous runner.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ce_core::{Classify as _, Config, CoreError, ErrorCode};
use ce_store::{Job, JobSpec, JobState};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::engine::EngineOptions;

const TEST_JOB: &str = "test-job";

/// What the test handler does, from its payload `{"do": ...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Does {
    Succeed,
    FailRetryable,
    FailPermanently,
    Panic,
}

impl Does {
    fn name(self) -> &'static str {
        match self {
            Does::Succeed => "succeed",
            Does::FailRetryable => "fail_retryable",
            Does::FailPermanently => "fail_permanently",
            Does::Panic => "panic",
        }
    }
}

/// Runs `test-job` jobs as their payload says; `wait-cancel` jobs report progress and wait at
/// checkpoints until they are stopped.
#[derive(Default)]
struct TestHandler {
    runs: AtomicU32,
}

impl JobHandler for Arc<TestHandler> {
    fn job_type(&self) -> &'static str {
        TEST_JOB
    }

    fn validate(&self, payload: &Value) -> crate::Result<()> {
        match payload["do"].as_str() {
            Some("succeed" | "fail_retryable" | "fail_permanently" | "panic" | "wait_cancel") => {
                Ok(())
            }
            _ => Err(CoreError::InvalidField {
                field: "payload",
                reason: format!("unknown test action in {payload}"),
            }
            .into()),
        }
    }

    fn runs_on(&self, _: &Engine) -> bool {
        true
    }

    fn run(&self, _: &Engine, job: &Job, ctx: &JobContext<'_>) -> crate::Result<Option<Value>> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        match job.payload["do"].as_str().unwrap_or_default() {
            "succeed" => Ok(Some(json!({"ok": job.id}))),
            "fail_retryable" => Err(ServerError::Failed {
                context: "the test handler".into(),
                code: ErrorCode::Upstream,
                retryable: true,
                message: "flaky".into(),
            }),
            "fail_permanently" => Err(CoreError::InvalidField {
                field: "payload",
                reason: "refused for good".into(),
            }
            .into()),
            "panic" => panic!("the test handler panics"),
            _ => {
                let started = Instant::now();
                loop {
                    ctx.report(json!({"stage": "waiting"}));
                    ctx.checkpoint()?;
                    assert!(started.elapsed() < Duration::from_secs(60), "never stopped");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

fn engine(dir: &std::path::Path, handler: &Arc<TestHandler>) -> Engine {
    let config = Config::from_toml(
        "[index.embedding]\nprovider = \"hash\"\n\
         [jobs]\nlease_seconds = 15\nheartbeat_seconds = 1\npoll_interval_ms = 20\n\
         max_retries = 3\nretry_base_seconds = 600\nretry_max_seconds = 600\n",
    )
    .expect("config");
    let options = EngineOptions {
        workers: 1,
        run_workers: false,
        role: "test".into(),
        consumers: Vec::new(),
    };
    let mut e = Engine::open_with(dir, config, options).expect("engine");
    e.jobs = Jobs {
        registry: JobRegistry::of(vec![Box::new(handler.clone())]),
        runner: std::sync::Mutex::new(None),
    };
    e
}

fn spec(does: &str) -> JobSpec {
    JobSpec {
        job_type: TEST_JOB.into(),
        payload: json!({ "do": does }),
        idempotency_key: None,
        run_at_ms: None,
        parent_job_id: None,
    }
}

#[test]
fn enqueue_refuses_unknown_types_and_bad_payloads_and_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = engine(dir.path(), &Arc::default());
    let mut unknown = spec("succeed");
    unknown.job_type = "summarize".into();
    for bad in [unknown, spec("explode")] {
        let err = e.enqueue_job(bad).expect_err("refused");
        assert_eq!(err.code(), ErrorCode::InvalidField, "{err}");
    }
    assert!(e.store().jobs().job_counts().expect("counts").is_empty());
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    Enqueue(Does),
    /// Cancels the n-th enqueued job (modulo their number).
    Cancel(usize),
    /// Retries the n-th enqueued job.
    Retry(usize),
    RunDue,
}

fn op() -> impl Strategy<Value = Op> {
    let does = prop_oneof![
        Just(Does::Succeed),
        Just(Does::FailRetryable),
        Just(Does::FailPermanently),
        Just(Does::Panic),
    ];
    prop_oneof![
        4 => does.prop_map(Op::Enqueue),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::Retry),
        2 => Just(Op::RunDue),
    ]
}

/// The model: each job's behaviour, state and failures.
#[derive(Debug, Clone)]
struct Modeled {
    does: Does,
    state: JobState,
    attempts: u32,
}

/// Checks the model against the store: every job's state and attempts.
fn check(e: &Engine, model: &BTreeMap<String, Modeled>) -> Result<(), TestCaseError> {
    for (id, m) in model {
        let j = e.job(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            (j.state, j.attempts),
            (m.state, m.attempts),
            "{}: {:?}",
            id,
            m
        );
        if j.state == JobState::Completed {
            prop_assert_eq!(j.progress, Some(json!({"ok": id})));
        }
        if matches!(j.state, JobState::Failed | JobState::Dead) {
            let code = match m.does {
                Does::FailPermanently => "invalid_field",
                Does::Panic => "internal",
                Does::FailRetryable | Does::Succeed => "upstream",
            };
            prop_assert_eq!(j.error_code.as_deref(), Some(code));
        }
    }
    Ok(())
}

#[test]
fn the_runner_acknowledges_each_outcome_as_the_model_says() {
    let seed = ce_testkit::seed("the_runner_acknowledges_each_outcome_as_the_model_says");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(12), 50);
    let ops = proptest::collection::vec(op(), 1..24);
    runner
        .run(&ops, |ops| {
            let dir = tempfile::tempdir().expect("tempdir");
            let handler = Arc::<TestHandler>::default();
            let e = engine(dir.path(), &handler);
            let mut model: BTreeMap<String, Modeled> = BTreeMap::new();
            let mut order: Vec<String> = Vec::new();
            for op in ops {
                match op {
                    Op::Enqueue(does) => {
                        let q = e.enqueue_job(spec(does.name())).expect("enqueue");
                        prop_assert!(q.created);
                        order.push(q.job.id.clone());
                        let m = Modeled {
                            does,
                            state: JobState::Pending,
                            attempts: 0,
                        };
                        model.insert(q.job.id, m);
                    }
                    Op::Cancel(n) if !order.is_empty() => {
                        let id = &order[n % order.len()];
                        let m = model.get_mut(id).expect("modeled");
                        match e.cancel_job(id) {
                            Ok(j) => {
                                prop_assert!(!m.state.is_terminal(), "{:?}", m);
                                m.state = JobState::Cancelled;
                                prop_assert_eq!(j.state, JobState::Cancelled);
                            }
                            Err(err) => {
                                prop_assert!(m.state.is_terminal(), "{:?}: {}", m, err);
                                prop_assert_eq!(err.code(), ErrorCode::StateTransition);
                            }
                        }
                    }
                    Op::Retry(n) if !order.is_empty() => {
                        let id = &order[n % order.len()];
                        let m = model.get_mut(id).expect("modeled");
                        match e.retry_job(id) {
                            Ok(j) => {
                                prop_assert!(
                                    matches!(m.state, JobState::Dead | JobState::Cancelled),
                                    "{:?}",
                                    m
                                );
                                m.state = JobState::Pending;
                                m.attempts = 0;
                                prop_assert_eq!(j.state, JobState::Pending);
                            }
                            Err(err) => {
                                prop_assert!(
                                    !matches!(m.state, JobState::Dead | JobState::Cancelled),
                                    "{:?}: {}",
                                    m,
                                    err
                                );
                                prop_assert_eq!(err.code(), ErrorCode::StateTransition);
                            }
                        }
                    }
                    Op::Cancel(_) | Op::Retry(_) => {}
                    Op::RunDue => {
                        let runs_before = handler.runs.load(Ordering::SeqCst);
                        let mut expected = JobsRun::default();
                        for m in model.values_mut().filter(|m| m.state == JobState::Pending) {
                            expected.ran += 1;
                            match m.does {
                                Does::Succeed => {
                                    m.state = JobState::Completed;
                                    expected.completed += 1;
                                }
                                // Attempts count retries: a permanent failure adds none.
                                Does::FailPermanently => {
                                    m.state = JobState::Dead;
                                    expected.dead += 1;
                                }
                                // 3 retries allowed: the backoff (600 s) keeps it waiting.
                                Does::FailRetryable | Does::Panic => {
                                    m.state = JobState::Failed;
                                    m.attempts += 1;
                                    expected.failed += 1;
                                }
                            }
                        }
                        let run = e.run_due_jobs().expect("run due jobs");
                        prop_assert_eq!(run, expected);
                        prop_assert_eq!(
                            u64::from(handler.runs.load(Ordering::SeqCst) - runs_before),
                            expected.ran
                        );
                    }
                }
                check(&e, &model)?;
            }
            Ok(())
        })
        .unwrap_or_else(|f| panic!("seed {seed}: {f}"));
}

#[test]
fn a_running_job_reports_progress_and_stops_at_its_checkpoint_when_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handler = Arc::<TestHandler>::default();
    let e = engine(dir.path(), &handler);
    let id = e.enqueue_job(spec("wait_cancel")).expect("enqueue").job.id;
    std::thread::scope(|s| {
        let run = s.spawn(|| e.run_due_jobs().expect("run"));
        let progressed = (0..300).find_map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            let j = e.job(&id).expect("job");
            (j.progress == Some(json!({"stage": "waiting"}))).then_some(j)
        });
        let j = progressed.expect("the heartbeat never stored the progress");
        assert_eq!(j.state, JobState::Running, "{j:?}");
        let asked = e.cancel_job(&id).expect("cancel");
        assert!(
            asked.cancel_requested && asked.state == JobState::Running,
            "{asked:?}"
        );
        let run = run.join().expect("runner thread");
        assert_eq!(
            (run.ran, run.cancelled),
            (1, 1),
            "the handler stopped at a checkpoint: {run:?}"
        );
    });
    let j = e.job(&id).expect("job");
    assert_eq!((j.state, j.attempts), (JobState::Cancelled, 0), "{j:?}");
    let stopped = job_error(&j).expect("a cancelled job is an error to its follower");
    assert_eq!(
        (stopped.code(), stopped.is_retryable()),
        (ErrorCode::StateTransition, false)
    );
}

#[test]
fn the_continuous_runner_runs_jobs_as_they_come_and_stops_with_the_engine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handler = Arc::<TestHandler>::default();
    let e = Arc::new(engine(dir.path(), &handler));
    e.start_jobs();
    assert!(e.job_runner_running());
    assert!(e.jobs_status().expect("status").runner);
    let ids: Vec<String> = (0..4)
        .map(|_| e.enqueue_job(spec("succeed")).expect("enqueue").job.id)
        .collect();
    let follow = |id: &str| e.follow_job(id, false, &|_| {}).expect("follow");
    for id in &ids {
        assert_eq!(follow(id).state, JobState::Completed);
    }
    // A panic fails its job; the runner goes on with the next one.
    let boom = e.enqueue_job(spec("panic")).expect("enqueue").job.id;
    let failed = follow(&boom);
    assert_eq!(
        (failed.state, failed.error_code.as_deref()),
        (JobState::Failed, Some("internal"))
    );
    assert!(
        failed
            .last_error
            .as_deref()
            .is_some_and(|m| m.contains("panicked")),
        "{failed:?}"
    );
    let after = e.enqueue_job(spec("succeed")).expect("enqueue").job.id;
    assert_eq!(follow(&after).state, JobState::Completed);
    assert_eq!(handler.runs.load(Ordering::SeqCst), 6);
    e.shutdown();
    assert!(!e.job_runner_running());
    let late = e.enqueue_job(spec("succeed")).expect("enqueue").job.id;
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(e.job(&late).expect("job").state, JobState::Pending);
    let status = e.jobs_status().expect("status");
    assert_eq!(
        (
            status.by_state[&JobState::Completed],
            status.by_state[&JobState::Pending]
        ),
        (5, 1),
        "{status:?}"
    );
}
