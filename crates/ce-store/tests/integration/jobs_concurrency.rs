//! Concurrent runners on one job queue: each thread opens its own store on one place (as
//! separate processes do) and claims and completes jobs of two types with concurrency 2
//! and 3. Every job must complete exactly once, no job may be held by two live claims at
//! once, and no type may run above its concurrency — checked by counters around the
//! "work", between the claim's commit and the completion. Concurrent enqueues of one
//! idempotency key must create exactly one job.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use ce_core::{Config, SystemClock};
use ce_store::{JobSpec, JobState, TypeSlots};
use serde_json::json;

use crate::common::{self, Backend, OpenStore as _, backend_tests};

backend_tests!(
    runners_never_share_a_job_nor_exceed_a_types_concurrency,
    concurrent_enqueues_of_one_key_create_one_job,
);

const TYPES: [(&str, u32); 2] = [("left", 2), ("right", 3)];
const RUNNERS: usize = 6;
const JOBS_PER_TYPE: usize = 150;

fn config() -> Config {
    let mut c = Config::default();
    for (t, concurrency) in TYPES {
        c.jobs.types.insert(
            t.into(),
            ce_core::config::JobTypeConfig {
                concurrency: Some(concurrency),
                ..Default::default()
            },
        );
    }
    c
}

fn runners_never_share_a_job_nor_exceed_a_types_concurrency(backend: Backend) {
    let place = backend.place();
    let open = || place.open(config(), Arc::new(SystemClock));
    let setup = open();
    let total = JOBS_PER_TYPE * TYPES.len();
    for i in 0..total {
        let (t, _) = TYPES[i % TYPES.len()];
        setup
            .enqueue(JobSpec {
                job_type: t.into(),
                payload: json!({"i": i}),
                idempotency_key: Some(format!("job-{i}")),
                run_at_ms: None,
                parent_job_id: None,
            })
            .expect("enqueue");
    }
    // The slots each runner asks for come from the configuration, as the runner's do.
    let slots: Vec<TypeSlots> = TYPES
        .iter()
        .map(|(t, _)| TypeSlots {
            job_type: (*t).into(),
            concurrency: config().jobs.settings(t).concurrency,
        })
        .collect();
    let running: Vec<AtomicU32> = TYPES.iter().map(|_| AtomicU32::new(0)).collect();
    let completions: Vec<AtomicU32> = (0..total).map(|_| AtomicU32::new(0)).collect();
    let held: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
    let violations: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let done = AtomicUsize::new(0);
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|scope| {
        for r in 0..RUNNERS {
            let store = open();
            let (slots, running, completions, held, violations, done) =
                (&slots, &running, &completions, &held, &violations, &done);
            scope.spawn(move || {
                let worker = format!("runner-{r}");
                while done.load(Ordering::SeqCst) < total && Instant::now() < deadline {
                    let claimed = store.claim_jobs(&worker, slots, 2).expect("claim");
                    if claimed.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    for c in &claimed {
                        let t = TYPES
                            .iter()
                            .position(|(t, _)| *t == c.job.job_type)
                            .expect("a known type");
                        let now = running[t].fetch_add(1, Ordering::SeqCst) + 1;
                        if now > TYPES[t].1 {
                            violations.lock().expect("lock").push(format!(
                                "{} running {now} jobs at once (concurrency {})",
                                TYPES[t].0, TYPES[t].1
                            ));
                        }
                        let previous = held
                            .lock()
                            .expect("lock")
                            .insert(c.job.id.clone(), worker.clone());
                        if let Some(other) = previous {
                            violations.lock().expect("lock").push(format!(
                                "{} claimed by {worker} while {other} held it",
                                c.job.id
                            ));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    for c in claimed {
                        let t = TYPES
                            .iter()
                            .position(|(t, _)| *t == c.job.job_type)
                            .expect("a known type");
                        // The slot is given back before the completion commits (another
                        // claim may take it at once), the job only after.
                        running[t].fetch_sub(1, Ordering::SeqCst);
                        let job = store
                            .complete(&c.claim, None)
                            .expect("complete a live claim");
                        held.lock().expect("lock").remove(&c.job.id);
                        assert_eq!(job.state, JobState::Completed);
                        let i = c.job.payload["i"].as_u64().expect("i") as usize;
                        completions[i].fetch_add(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    let violations = violations.into_inner().expect("lock");
    assert!(violations.is_empty(), "{violations:#?}");
    let twice: Vec<usize> = (0..total)
        .filter(|i| completions[*i].load(Ordering::SeqCst) != 1)
        .collect();
    assert!(
        twice.is_empty(),
        "jobs not completed exactly once: {twice:?}"
    );
    let jobs = common::all_jobs(setup.as_ref());
    assert_eq!(jobs.len(), total);
    assert!(jobs.iter().all(|j| j.state == JobState::Completed));
}

fn concurrent_enqueues_of_one_key_create_one_job(backend: Backend) {
    let place = backend.place();
    let threads = 8;
    let stores: Vec<_> = (0..threads)
        .map(|_| place.open(config(), Arc::new(SystemClock)))
        .collect();
    for round in 0..10 {
        let barrier = Barrier::new(threads);
        let key = format!("kb:B:I{round}:index");
        let answers: Vec<(String, bool)> = std::thread::scope(|scope| {
            let handles: Vec<_> = stores
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let (barrier, key) = (&barrier, &key);
                    scope.spawn(move || {
                        barrier.wait();
                        let e = s
                            .enqueue(JobSpec {
                                job_type: TYPES[i % 2].0.into(),
                                payload: json!({"by": i}),
                                idempotency_key: Some(key.clone()),
                                run_at_ms: None,
                                parent_job_id: None,
                            })
                            .expect("enqueue");
                        (e.job.id, e.created)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("enqueuer"))
                .collect()
        });
        let created = answers.iter().filter(|(_, c)| *c).count();
        assert_eq!(created, 1, "round {round}: {answers:?}");
        assert!(
            answers.iter().all(|(id, _)| *id == answers[0].0),
            "round {round}: every enqueue returns the one job: {answers:?}"
        );
    }
    assert_eq!(common::all_jobs(stores[0].as_ref()).len(), 10);
}
