//! The job queue through `JobStore` and `ContextFs::apply_batch`, on every backend: the
//! idempotency rule and the spec's trap, validation, claims by type with per-type
//! concurrency, delays, lease expiry and fencing, cancel, retry, and jobs enqueued or
//! completed inside source write transactions.

use ce_core::{Classify, Config, ErrorCode, ManualClock};
use ce_store::{
    ClaimedJob, JobClaim, JobFailure, JobFilter, JobSpec, JobState, PutRequest, SourceStore,
    StoreError, TypeSlots, WriteOp,
};
use serde_json::json;

use crate::common::{self, Backend, Place, Store, T0, assert_rejected, backend_tests, uri};

backend_tests!(
    a_job_runs_from_enqueue_to_completion,
    idempotency_keys_dedupe_by_key_alone_across_types,
    a_child_with_its_own_key_is_not_swallowed_by_its_running_parent,
    bad_specs_are_refused_by_field_and_write_nothing,
    claims_respect_each_types_concurrency,
    delayed_jobs_wait_for_their_run_at,
    an_expired_lease_hands_the_job_to_a_new_claim_and_fences_the_old_one,
    cancel_stops_waiting_jobs_at_once_and_running_ones_at_a_checkpoint,
    failures_back_off_then_die_and_dead_jobs_can_be_retried,
    an_enqueue_commits_with_its_source_write_or_not_at_all,
    a_job_completes_with_its_handlers_source_writes_or_not_at_all,
);

const LEASE_MS: i64 = 60_000;

fn store(backend: Backend) -> (Place, Store, ManualClock) {
    let mut config = Config::default();
    config.jobs.retry_jitter_ratio = 0.0;
    common::fresh(backend, config)
}

fn spec(job_type: &str, key: Option<&str>) -> JobSpec {
    JobSpec {
        job_type: job_type.into(),
        payload: json!({"n": 1}),
        idempotency_key: key.map(str::to_owned),
        run_at_ms: None,
        parent_job_id: None,
    }
}

fn slots(types: &[(&str, u32)]) -> Vec<TypeSlots> {
    types
        .iter()
        .map(|(t, c)| TypeSlots {
            job_type: (*t).into(),
            concurrency: *c,
        })
        .collect()
}

fn claim(s: &dyn SourceStore, types: &[(&str, u32)], limit: usize) -> Vec<ClaimedJob> {
    s.claim_jobs("w1", &slots(types), limit).expect("claim")
}

fn claim_one(s: &dyn SourceStore, job_type: &str) -> ClaimedJob {
    let mut got = claim(s, &[(job_type, 8)], 1);
    assert_eq!(got.len(), 1, "one runnable {job_type} job");
    got.remove(0)
}

fn state(s: &dyn SourceStore, id: &str) -> JobState {
    s.job(id).expect("job").state
}

#[track_caller]
fn assert_lost<T: std::fmt::Debug>(r: ce_store::Result<T>) {
    match r {
        Err(e @ StoreError::JobClaimConflict { .. }) => {
            assert_eq!(e.code(), ErrorCode::ClaimConflict);
            assert!(e.is_retryable(), "a lost claim is retryable");
        }
        other => panic!("expected a claim conflict, got {other:?}"),
    }
}

fn a_job_runs_from_enqueue_to_completion(backend: Backend) {
    let (_p, s, clock) = store(backend);
    let s = s.as_ref();
    let e = s.enqueue(spec("reindex", None)).expect("enqueue");
    assert!(e.created);
    let j = &e.job;
    assert!(j.id.starts_with("job-"), "{}", j.id);
    assert_eq!(
        (j.state, j.attempts, j.run_at_ms),
        (JobState::Pending, 0, Some(T0))
    );
    assert_eq!(
        s.job(&j.id).expect("job"),
        e.job,
        "what enqueue returns is stored"
    );

    let c = claim_one(s, "reindex");
    assert_eq!(c.job.id, j.id);
    assert_eq!(c.job.state, JobState::Running);
    assert_eq!(c.claim.claimed_until_ms, T0 + LEASE_MS);
    assert_eq!(
        s.job(&j.id).expect("job"),
        c.job,
        "what claim returns is stored"
    );
    assert!(
        claim(s, &[("reindex", 8)], 10).is_empty(),
        "a running job is not claimable"
    );

    clock.advance(1_000);
    let hb = s
        .heartbeat(&c.claim, Some(json!({"done": 1, "total": 2})))
        .expect("heartbeat");
    assert_eq!(hb.claimed_until_ms, T0 + 1_000 + LEASE_MS);
    assert!(!hb.cancel_requested);
    assert_eq!(
        s.job(&j.id).expect("job").progress,
        Some(json!({"done": 1, "total": 2}))
    );

    let done = s
        .complete(&c.claim, Some(json!({"events": 3})))
        .expect("complete");
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.progress, Some(json!({"events": 3})));
    assert_eq!(done.finished_at_ms, Some(T0 + 1_000));
    assert_eq!(done.run_at_ms, None);
    // A repeated acknowledgement succeeds and changes nothing.
    assert_eq!(s.complete(&c.claim, None).expect("repeat"), done);
    assert_eq!(s.job(&j.id).expect("job"), done);
    // Other transitions of a completed job are refused.
    assert_lost(s.heartbeat(&c.claim, None));
    let counts = s.job_counts().expect("counts");
    assert_eq!(counts.len(), 1);
    assert_eq!(
        (
            counts[0].job_type.as_str(),
            counts[0].state,
            counts[0].count
        ),
        ("reindex", JobState::Completed, 1)
    );
    let missing = s.job("job-nope").expect_err("no such job");
    assert_eq!(
        (missing.code(), missing.is_retryable()),
        (ErrorCode::NotFound, false)
    );
}

fn idempotency_keys_dedupe_by_key_alone_across_types(backend: Backend) {
    let (_p, s, _clock) = store(backend);
    let s = s.as_ref();
    let first = s.enqueue(spec("import", Some("k1"))).expect("enqueue");
    assert!(first.created);
    // Same key, another type: the existing job is returned.
    let again = s
        .enqueue(spec("reindex", Some("k1")))
        .expect("enqueue again");
    assert!(!again.created);
    assert_eq!(again.job, first.job);
    // Another key is another job.
    assert!(s.enqueue(spec("import", Some("k2"))).expect("k2").created);
    // Held while running too.
    let c = claim_one(s, "import");
    assert_eq!(c.job.id, first.job.id);
    let held = s.enqueue(spec("import", Some("k1"))).expect("held");
    assert!(!held.created);
    assert_eq!(held.job.id, first.job.id);
    assert_eq!(held.job.state, JobState::Running);
    // A finished job releases its key.
    s.complete(&c.claim, None).expect("complete");
    let next = s
        .enqueue(spec("import", Some("k1")))
        .expect("after completion");
    assert!(next.created);
    assert_ne!(next.job.id, first.job.id);
    assert_eq!(common::all_jobs(s).len(), 3);
    // The live keys of a prefix, in one read: k1 (again) and k2, not the completed k1 job's
    // twice, nor keys outside the prefix or a bad prefix.
    assert!(s.enqueue(spec("import", Some("l1"))).expect("l1").created);
    let mut live = s.live_keys("k").expect("live keys");
    live.sort();
    assert_eq!(live, ["k1", "k2"]);
    assert_eq!(s.live_keys("k2").expect("k2"), ["k2"]);
    assert!(s.live_keys("m").expect("none").is_empty());
    assert!(s.live_keys("").is_err());
}

/// The spec's trap (knowledge-workflow, "idempotencyKey"): a running parent keyed
/// `kb:B:I:fp-check` enqueues its next stage. With its own key the child exists beside the
/// parent; with the parent's key it would be swallowed — the enqueue returns the parent.
fn a_child_with_its_own_key_is_not_swallowed_by_its_running_parent(backend: Backend) {
    let (_p, s, _clock) = store(backend);
    let s = s.as_ref();
    let parent = s
        .enqueue(spec("fp-check", Some("kb:B:I:fp-check")))
        .expect("parent")
        .job;
    let running = claim_one(s, "fp-check");
    assert_eq!(running.job.id, parent.id);
    let child = s
        .enqueue(JobSpec {
            parent_job_id: Some(parent.id.clone()),
            ..spec("index", Some("kb:B:I:index"))
        })
        .expect("child");
    assert!(child.created, "the next stage is created");
    assert_eq!(child.job.parent_job_id.as_deref(), Some(parent.id.as_str()));
    let children = s
        .list_jobs(&JobFilter {
            parent_job_id: Some(parent.id.clone()),
            limit: 10,
            ..JobFilter::default()
        })
        .expect("children");
    assert_eq!(children, vec![child.job.clone()]);

    let swallowed = s
        .enqueue(JobSpec {
            parent_job_id: Some(parent.id.clone()),
            ..spec("index", Some("kb:B:I:fp-check"))
        })
        .expect("same key as the parent");
    assert!(
        !swallowed.created,
        "a shared key dedupes against the running parent"
    );
    assert_eq!(swallowed.job.id, parent.id);
    assert_eq!(swallowed.job.job_type, "fp-check");
    assert_eq!(common::all_jobs(s).len(), 2, "no third job");
}

fn bad_specs_are_refused_by_field_and_write_nothing(backend: Backend) {
    let (_p, s, _clock) = store(backend);
    let s = s.as_ref();
    s.enqueue(spec("ok", None)).expect("a good one");
    let cases = [
        ("job_type", spec("Bad Type", None)),
        (
            "payload",
            JobSpec {
                payload: json!([1, 2]),
                ..spec("ok", None)
            },
        ),
        (
            "payload",
            JobSpec {
                payload: json!({"x": "y".repeat(ce_store::MAX_JOB_PAYLOAD_BYTES)}),
                ..spec("ok", None)
            },
        ),
        ("idempotency_key", spec("ok", Some(""))),
        ("idempotency_key", spec("ok", Some("a\u{7}b"))),
        (
            "idempotency_key",
            spec(
                "ok",
                Some(&"k".repeat(ce_store::MAX_IDEMPOTENCY_KEY_CHARS + 1)),
            ),
        ),
        (
            "parent_job_id",
            JobSpec {
                parent_job_id: Some("job-missing".into()),
                ..spec("ok", None)
            },
        ),
    ];
    for (field, bad) in cases {
        let code = if bad.payload.to_string().len() > ce_store::MAX_JOB_PAYLOAD_BYTES {
            ErrorCode::PayloadTooLarge
        } else {
            ErrorCode::InvalidField
        };
        let err = assert_rejected(s, code, false, |s| s.enqueue(bad.clone()));
        assert!(err.to_string().contains(field), "{field}: {err}");
        let in_batch = assert_rejected(s, code, false, |s| {
            s.apply_batch(vec![WriteOp::Enqueue(bad.clone())])
        });
        assert!(in_batch.to_string().contains(field), "{field}: {in_batch}");
    }
}

fn claims_respect_each_types_concurrency(backend: Backend) {
    let (_p, s, clock) = store(backend);
    let s = s.as_ref();
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(s.enqueue(spec("a", None)).expect("a").job.id);
        clock.advance(1);
        if i < 3 {
            ids.push(s.enqueue(spec("b", None)).expect("b").job.id);
            clock.advance(1);
        }
    }
    s.enqueue(spec("c", None)).expect("c");
    // Oldest first across the types, each up to its concurrency; c is not asked for.
    let got = claim(s, &[("b", 1), ("a", 2)], 10);
    let got_ids: Vec<&str> = got.iter().map(|c| c.job.id.as_str()).collect();
    assert_eq!(got_ids, [ids[0].as_str(), ids[1].as_str(), ids[2].as_str()]);
    assert!(
        claim(s, &[("a", 2), ("b", 1)], 10).is_empty(),
        "every slot is taken"
    );
    // A larger concurrency (another runner's configuration) leaves room for more.
    assert_eq!(claim(s, &[("a", 3)], 10).len(), 1);
    // A finished job frees its slot; the limit caps the claim.
    s.complete(&got[0].claim, None).expect("complete");
    let more = claim(s, &[("a", 3), ("b", 5)], 1);
    assert_eq!(more.len(), 1);
    assert_eq!(more[0].job.id, ids[3], "the oldest runnable one");
    assert!(claim(s, &[("a", 3), ("b", 5)], 0).is_empty());
    let running = |t: &str| {
        s.list_jobs(&JobFilter {
            state: Some(JobState::Running),
            job_type: Some(t.into()),
            limit: 100,
            ..JobFilter::default()
        })
        .expect("list")
        .len()
    };
    assert_eq!((running("a"), running("b"), running("c")), (2, 2, 0));
}

fn delayed_jobs_wait_for_their_run_at(backend: Backend) {
    let (_p, s, clock) = store(backend);
    let s = s.as_ref();
    let later = s
        .enqueue(JobSpec {
            run_at_ms: Some(T0 + 5_000),
            ..spec("a", None)
        })
        .expect("delayed")
        .job;
    assert_eq!(
        (later.state, later.run_at_ms),
        (JobState::Delayed, Some(T0 + 5_000))
    );
    let past = s
        .enqueue(JobSpec {
            run_at_ms: Some(T0 - 5_000),
            ..spec("a", None)
        })
        .expect("due already")
        .job;
    assert_eq!(past.state, JobState::Pending);
    assert_eq!(claim_one(s, "a").job.id, past.id);
    clock.advance(4_999);
    assert!(
        claim(s, &[("a", 8)], 10).is_empty(),
        "not before its run_at"
    );
    assert_eq!(state(s, &later.id), JobState::Delayed);
    clock.advance(1);
    assert_eq!(claim_one(s, "a").job.id, later.id);
}

fn an_expired_lease_hands_the_job_to_a_new_claim_and_fences_the_old_one(backend: Backend) {
    let (_p, s, clock) = store(backend);
    let s = s.as_ref();
    let id = s.enqueue(spec("a", None)).expect("enqueue").job.id;
    let old = claim_one(s, "a");
    clock.advance(LEASE_MS - 1);
    assert!(
        claim(s, &[("a", 8)], 10).is_empty(),
        "the lease is still live"
    );
    clock.advance(1);
    // The old runner is presumed dead: its slot is free and its job claimable again.
    let new = claim_one(s, "a");
    assert_eq!(new.job.id, id);
    assert_eq!(new.job.attempts, 0, "a lost lease is not a failure");
    assert_ne!(new.claim.token, old.claim.token);
    let before = s.job(&id).expect("job");
    assert_lost(s.heartbeat(&old.claim, Some(json!({"stale": true}))));
    assert_lost(s.complete(&old.claim, None));
    let failure = JobFailure {
        code: ErrorCode::Internal,
        retryable: true,
        message: "stale",
    };
    assert_lost(s.fail(&old.claim, &failure));
    assert_lost(s.ack_cancelled(&old.claim));
    assert_eq!(
        s.job(&id).expect("job"),
        before,
        "stale claims change nothing"
    );
    // A claim naming no job at all.
    let ghost = JobClaim {
        job_id: "job-ghost".into(),
        ..old.claim.clone()
    };
    let err = s.complete(&ghost, None).expect_err("no such job");
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert_eq!(
        s.complete(&new.claim, None).expect("live").state,
        JobState::Completed
    );
}

fn cancel_stops_waiting_jobs_at_once_and_running_ones_at_a_checkpoint(backend: Backend) {
    let (_p, s, clock) = store(backend);
    let s = s.as_ref();
    let waiting = s.enqueue(spec("a", Some("w"))).expect("waiting").job;
    let cancelled = s.cancel(&waiting.id).expect("cancel");
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert_eq!(cancelled.finished_at_ms, Some(T0));
    assert!(s.enqueue(spec("a", Some("w"))).expect("key free").created);
    let err = assert_rejected(s, ErrorCode::StateTransition, false, |s| {
        s.cancel(&waiting.id)
    });
    assert!(
        matches!(
            err,
            StoreError::JobTransition {
                state: JobState::Cancelled,
                ..
            }
        ),
        "{err}"
    );

    let run = claim_one(s, "a");
    // The handler has asked for no cancel: acknowledging one is refused.
    assert_rejected(s, ErrorCode::StateTransition, false, |s| {
        s.ack_cancelled(&run.claim)
    });
    let asked = s.cancel(&run.job.id).expect("cancel running");
    assert_eq!(
        (asked.state, asked.cancel_requested),
        (JobState::Running, true)
    );
    assert_eq!(
        s.cancel(&run.job.id).expect("again"),
        asked,
        "asking twice changes nothing"
    );
    let hb = s.heartbeat(&run.claim, None).expect("checkpoint");
    assert!(hb.cancel_requested);
    let done = s.ack_cancelled(&run.claim).expect("ack");
    assert_eq!(done.state, JobState::Cancelled);

    // A running job whose lease ended has no live handler: cancelled at once.
    s.enqueue(spec("b", None)).expect("b");
    let orphan = claim_one(s, "b");
    clock.advance(LEASE_MS);
    assert_eq!(
        s.cancel(&orphan.job.id).expect("cancel").state,
        JobState::Cancelled
    );
    assert_lost(s.ack_cancelled(&orphan.claim));
    let missing = s.cancel("job-none").expect_err("missing");
    assert_eq!(missing.code(), ErrorCode::NotFound);
}

fn failures_back_off_then_die_and_dead_jobs_can_be_retried(backend: Backend) {
    let mut config = Config::default();
    config.jobs.retry_jitter_ratio = 0.0;
    config.jobs.types.insert(
        "flaky".into(),
        ce_core::config::JobTypeConfig {
            max_retries: Some(1),
            retry_base_seconds: Some(3),
            ..Default::default()
        },
    );
    let (_p, s, clock) = common::fresh(backend, config);
    let s = s.as_ref();
    let id = s.enqueue(spec("flaky", Some("f"))).expect("enqueue").job.id;
    let retryable = JobFailure {
        code: ErrorCode::Unavailable,
        retryable: true,
        message: "try later",
    };
    let c = claim_one(s, "flaky");
    assert_eq!(
        s.fail(&c.claim, &retryable).expect("fail"),
        JobState::Failed
    );
    let j = s.job(&id).expect("job");
    assert_eq!((j.attempts, j.run_at_ms), (1, Some(T0 + 3_000)));
    assert_eq!(j.error_code.as_deref(), Some("unavailable"));
    assert_eq!(j.last_error.as_deref(), Some("try later"));
    assert!(
        !s.enqueue(spec("flaky", Some("f"))).expect("held").created,
        "failed holds its key"
    );
    clock.advance(2_999);
    assert!(claim(s, &[("flaky", 8)], 10).is_empty(), "backing off");
    clock.advance(1);
    let c = claim_one(s, "flaky");
    assert_eq!(c.job.attempts, 1);
    // Out of retries (max_retries 1 for this type): dead.
    assert_eq!(s.fail(&c.claim, &retryable).expect("fail"), JobState::Dead);
    let dead = s.job(&id).expect("job");
    assert_eq!(
        (dead.attempts, dead.run_at_ms, dead.finished_at_ms),
        (1, None, Some(T0 + 3_000))
    );

    // A retry while another job holds the key is refused; once it is free, it succeeds.
    let other = s.enqueue(spec("a", Some("f"))).expect("other");
    assert!(other.created, "a dead job releases its key");
    assert_rejected(s, ErrorCode::StateTransition, false, |s| s.retry(&id));
    s.cancel(&other.job.id).expect("cancel other");
    let back = s.retry(&id).expect("retry");
    assert_eq!(
        (back.state, back.attempts, back.run_at_ms),
        (JobState::Pending, 0, Some(T0 + 3_000))
    );
    assert_eq!(
        back.last_error.as_deref(),
        Some("try later"),
        "history stays"
    );
    assert_rejected(s, ErrorCode::StateTransition, false, |s| s.retry(&id));

    // A permanent failure dies at once, whatever the budget.
    let c = claim_one(s, "flaky");
    let permanent = JobFailure {
        code: ErrorCode::InvalidField,
        retryable: false,
        message: "bad input",
    };
    assert_eq!(s.fail(&c.claim, &permanent).expect("fail"), JobState::Dead);
    assert_eq!(s.job(&id).expect("job").attempts, 0);
}

fn an_enqueue_commits_with_its_source_write_or_not_at_all(backend: Backend) {
    let (_p, s, _clock) = store(backend);
    let s = s.as_ref();
    let put = |u: &str, expect_version| WriteOp::Put {
        uri: uri(u),
        req: PutRequest {
            content: Some("x".into()),
            expect_version,
            ..PutRequest::default()
        },
    };
    let out = s
        .apply_batch(vec![
            put("ctx://acc/a", None),
            WriteOp::Enqueue(spec("index", Some("k"))),
        ])
        .expect("batch");
    let id = out[1]
        .job_id
        .clone()
        .expect("the enqueue's outcome names its job");
    assert!(out[1].changed && out[0].job_id.is_none());
    assert_eq!(s.job(&id).expect("job").state, JobState::Pending);
    // The same key again in a batch returns the holder.
    let again = s
        .apply_batch(vec![WriteOp::Enqueue(spec("other", Some("k")))])
        .expect("again");
    assert_eq!(
        (again[0].job_id.as_deref(), again[0].changed),
        (Some(id.as_str()), false)
    );
    // A later op that fails rolls the job back with the write.
    assert_rejected(s, ErrorCode::VersionConflict, false, |s| {
        s.apply_batch(vec![
            WriteOp::Enqueue(spec("index", Some("k2"))),
            put("ctx://acc/b", Some(7)),
        ])
    });
    assert!(
        s.enqueue(spec("index", Some("k2"))).expect("k2").created,
        "no job was left behind"
    );
}

fn a_job_completes_with_its_handlers_source_writes_or_not_at_all(backend: Backend) {
    let (_p, s, clock) = store(backend);
    let s = s.as_ref();
    let put = |u: &str| WriteOp::Put {
        uri: uri(u),
        req: PutRequest {
            content: Some("derived".into()),
            ..PutRequest::default()
        },
    };
    s.enqueue(spec("derive", None)).expect("enqueue");
    let c = claim_one(s, "derive");
    let out = s
        .apply_batch(vec![
            put("ctx://acc/out1"),
            WriteOp::CompleteJob {
                claim: c.claim.clone(),
                result: Some(json!({"wrote": 1})),
            },
        ])
        .expect("batch");
    assert_eq!(out[1].job_id.as_deref(), Some(c.job.id.as_str()));
    assert!(out[1].changed);
    let done = s.job(&c.job.id).expect("job");
    assert_eq!(
        (done.state, done.progress),
        (JobState::Completed, Some(json!({"wrote": 1})))
    );
    assert!(s.read_node(&uri("ctx://acc/out1")).expect("read").is_some());

    // A handler whose lease ended (and whose job another claim took) writes nothing.
    s.enqueue(spec("derive", None)).expect("enqueue");
    let stale = claim_one(s, "derive");
    clock.advance(LEASE_MS);
    let live = claim_one(s, "derive");
    let err = assert_rejected(s, ErrorCode::ClaimConflict, true, |s| {
        s.apply_batch(vec![
            put("ctx://acc/out2"),
            WriteOp::CompleteJob {
                claim: stale.claim.clone(),
                result: None,
            },
        ])
    });
    assert!(matches!(err, StoreError::JobClaimConflict { .. }), "{err}");
    assert!(s.read_node(&uri("ctx://acc/out2")).expect("read").is_none());
    assert_eq!(state(s, &live.job.id), JobState::Running);
}
