//! Durable jobs through the real binary (docs/jobs.md): `ce reindex` runs as a `reindex` job
//! (`--no-wait` only enqueues it, idempotently), `ce worker --once` runs due jobs, `ce jobs
//! list|show|cancel|retry` locally and over `--server`, a job whose runner is killed -9 is
//! resumed by another process after its lease, exactly once, and several runner processes on
//! one PostgreSQL store never run a job twice.

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use ce_testkit::pg::TestDb;
use serde_json::{Value, json};

use super::harness::{Ce, Server, eventually, failure, hit_uris, success};

/// Failpoint of the runner: every claimed job waits this long before its handler.
const PARK: &str = "CE_FAILPOINT_JOB_PARK_MS";
/// The shortest lease the configuration allows, a quick heartbeat and poll.
const FAST_JOBS: &str =
    "[jobs]\nlease_seconds = 15\nheartbeat_seconds = 1\npoll_interval_ms = 50\n";
/// Derivation off, for the tests that count the keyword repairs of the three documents (a
/// server deriving the folders' roll-ups meanwhile would add two, or not yet).
const NO_DERIVE: &str = "[index.outbox]\nconsumers = [\"vector\", \"keyword\", \"relation\"]\n";

const NODES: [(&str, &str); 3] = [
    ("ctx://acc/docs/a", "alpha beta gamma"),
    ("ctx://acc/docs/b", "delta epsilon zeta"),
    ("ctx://acc/docs/c", "eta theta iota"),
];

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn put_nodes(ce: &Ce) {
    for (uri, text) in NODES {
        ce.put(uri, text);
    }
}

fn array(v: &Value) -> &Vec<Value> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}"))
}

/// The keyword deliveries of repair events (one per node a reindex requeued).
fn keyword_repairs(ce: &Ce, store: &[&str]) -> usize {
    let mut args = store.to_vec();
    args.extend([
        "outbox",
        "list",
        "--consumer",
        "keyword",
        "--type",
        "UPSERT_CONTEXT",
        "--limit",
        "10000",
    ]);
    array(&ce.json(&args))
        .iter()
        .filter(|r| r["event"]["payload"]["reason"] == "repair")
        .count()
}

#[test]
fn reindex_runs_as_a_job_and_no_wait_only_enqueues_it() {
    let ce = Ce::hash(&format!("{FAST_JOBS}{NO_DERIVE}"));
    put_nodes(&ce);
    ce.json(&["worker", "--once"]);

    let r = ce.json(&["reindex", "--consumer", "keyword"]);
    let id = r["job_id"].as_str().expect("job_id").to_owned();
    assert!(id.starts_with("job-"), "{r}");
    assert_eq!(
        (r["consumer"].as_str(), r["requeued"].as_u64()),
        (Some("keyword"), Some(3)),
        "{r}"
    );
    let remaining = array(&r["drain"]["remaining"]);
    assert!(remaining.iter().all(|c| c["pending"] == 0), "{r}");
    assert_eq!(keyword_repairs(&ce, &[]), 3);
    let k = ce.json(&["search", "delta epsilon", "--mode", "keyword"]);
    assert_eq!(hit_uris(&k), ["ctx://acc/docs/b"], "{k}");
    // The other indexes are left alone, also once the store is opened again (a back-fill
    // never hands them the keyword index's repair events).
    let status = ce.json(&["status"]);
    for c in array(&status["consumers"]) {
        assert_eq!(
            (c["lag_events"].as_u64(), c["validation"].as_str()),
            (Some(0), Some("applied_valid")),
            "{c}"
        );
    }

    let listed = ce.json(&["jobs", "list"]);
    let jobs = array(&listed);
    assert_eq!(jobs.len(), 1, "{listed}");
    let job = &jobs[0];
    assert_eq!(
        (
            job["id"].as_str(),
            job["job_type"].as_str(),
            job["state"].as_str(),
            job["attempts"].as_u64(),
            job["idempotency_key"].as_str(),
        ),
        (
            Some(id.as_str()),
            Some("reindex"),
            Some("completed"),
            Some(0),
            Some("reindex:keyword")
        ),
        "{job}"
    );
    let shown = ce.json(&["jobs", "show", &id]);
    assert_eq!(shown["progress"]["requeued"], 3, "{shown}");
    assert!(ce.ok(&["jobs", "list"]).contains(&id));
    let human = ce.ok(&["jobs", "show", &id]);
    assert!(
        human.contains("completed") && human.contains("result"),
        "{human}"
    );

    // --no-wait: the job is queued and the command returns; a second request shares it.
    let started = Instant::now();
    let q = ce.json(&["reindex", "--consumer", "keyword", "--no-wait"]);
    assert!(started.elapsed() < Duration::from_secs(20));
    let queued = q["job_id"].as_str().expect("job_id").to_owned();
    assert_ne!(queued, id);
    assert_eq!(
        (q["created"].as_bool(), q["job"]["state"].as_str()),
        (Some(true), Some("pending")),
        "{q}"
    );
    let again = ce.json(&["reindex", "--consumer", "keyword", "--no-wait"]);
    assert_eq!(
        (again["job_id"].as_str(), again["created"].as_bool()),
        (Some(queued.as_str()), Some(false)),
        "{again}"
    );
    assert_eq!(keyword_repairs(&ce, &[]), 3, "nothing ran yet");
    let status = ce.json(&["status"]);
    assert_eq!(status["jobs"]["by_state"]["pending"], 1, "{status}");
    assert_eq!(status["jobs"]["by_state"]["completed"], 1, "{status}");
    assert_eq!(status["jobs"]["runner"], false, "{status}");
    let per_type = array(&status["jobs"]["counts"]);
    assert!(
        per_type
            .iter()
            .any(|c| c["job_type"] == "reindex" && c["state"] == "pending" && c["count"] == 1),
        "{status}"
    );
    let human = ce.ok(&["status"]);
    assert!(human.contains("1 pending, 1 completed"), "{human}");

    // `ce worker --once` runs it, then applies its events.
    let once = ce.json(&["worker", "--once"]);
    assert_eq!(
        (
            once["jobs"]["ran"].as_u64(),
            once["jobs"]["completed"].as_u64()
        ),
        (Some(1), Some(1)),
        "{once}"
    );
    assert!(once["progress"]["succeeded"].as_u64() >= Some(3), "{once}");
    assert_eq!(ce.json(&["jobs", "show", &queued])["state"], "completed");
    assert_eq!(keyword_repairs(&ce, &[]), 6);
    let completed = ce.json(&["jobs", "list", "--state", "completed", "--type", "reindex"]);
    assert_eq!(array(&completed).len(), 2, "{completed}");
    assert_eq!(
        array(&ce.json(&["jobs", "list", "--state", "pending"])).len(),
        0
    );
    // Bad arguments are refused before anything is opened.
    assert_eq!(
        ce.fail(&["jobs", "list", "--state", "finished"], 2).error["code"],
        "invalid_field"
    );
    assert_eq!(
        ce.fail(&["jobs", "list", "--limit", "0"], 2).error["code"],
        "invalid_field"
    );
    assert_eq!(
        ce.fail(&["jobs", "show", "job-nope"], 3).error["code"],
        "not_found"
    );
    assert_eq!(
        ce.fail(&["jobs", "show", "a/b"], 2).error["code"],
        "invalid_field"
    );
}

#[test]
fn a_pending_job_is_cancelled_at_once_and_a_running_one_at_its_checkpoint() {
    let ce = Ce::hash(&format!("{FAST_JOBS}{NO_DERIVE}"));
    put_nodes(&ce);
    let q = ce.json(&["reindex", "--consumer", "keyword", "--no-wait"]);
    let id = q["job_id"].as_str().expect("job_id").to_owned();
    let c = ce.json(&["jobs", "cancel", &id]);
    assert_eq!(c["state"], "cancelled", "{c}");
    // A finished job cannot be cancelled again; nothing ran.
    assert_eq!(
        ce.fail(&["jobs", "cancel", &id], 4).error["code"],
        "state_transition"
    );
    assert_eq!(ce.json(&["worker", "--once"])["jobs"]["ran"], 0);
    assert_eq!(keyword_repairs(&ce, &[]), 0);

    // A running job: its runner is parked at its checkpoints until the cancel is seen.
    let runner = ce
        .command(&["--json", "reindex", "--consumer", "keyword"])
        .env(PARK, "600000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ce reindex starts");
    let running = eventually(Duration::from_secs(20), || {
        array(&ce.json(&["jobs", "list", "--state", "running"]))
            .first()
            .cloned()
    })
    .expect("the job never ran");
    let rid = running["id"].as_str().expect("id").to_owned();
    assert_ne!(rid, id, "a cancelled job frees its key");
    let asked = ce.json(&["jobs", "cancel", &rid]);
    assert_eq!(
        (asked["state"].as_str(), asked["cancel_requested"].as_bool()),
        (Some("running"), Some(true)),
        "{asked}"
    );
    let out = runner.wait_with_output().expect("ce reindex exits");
    let f = failure(&["reindex"], &out);
    assert_eq!(
        (f.exit, f.error["code"].as_str()),
        (4, Some("state_transition")),
        "{:?}",
        f.error
    );
    assert_eq!(ce.json(&["jobs", "show", &rid])["state"], "cancelled");
    assert_eq!(
        keyword_repairs(&ce, &[]),
        0,
        "the handler stopped before its work"
    );
}

#[test]
fn a_job_that_failed_for_good_is_dead_until_retried() {
    let ce = Ce::hash(&format!(
        "{FAST_JOBS}[index.outbox]\nconsumers = [\"vector\", \"keyword\"]\n"
    ));
    put_nodes(&ce);
    // The relation consumer is not configured: the handler's error is permanent.
    let f = ce.fail(&["reindex", "--consumer", "relation"], 2);
    assert_eq!(f.error["code"], "invalid_field", "{:?}", f.error);
    let message = f.error["message"].as_str().expect("message");
    assert!(
        message.contains("dead") && message.contains("ce jobs retry"),
        "{message}"
    );
    let dead = ce.json(&["jobs", "list", "--state", "dead"]);
    let job = &array(&dead)[0];
    let id = job["id"].as_str().expect("id").to_owned();
    assert_eq!(
        (job["attempts"].as_u64(), job["error_code"].as_str()),
        (Some(0), Some("invalid_field")),
        "{job}"
    );
    assert_eq!(
        ce.fail(&["jobs", "retry", "job-nope"], 3).error["code"],
        "not_found"
    );

    // Fixed: the retried job runs again with a fresh budget.
    ce.write_config(&format!(
        "{}{FAST_JOBS}{NO_DERIVE}",
        super::harness::HASH_EMBEDDER
    ));
    let r = ce.json(&["jobs", "retry", &id]);
    assert_eq!(
        (r["state"].as_str(), r["attempts"].as_u64()),
        (Some("pending"), Some(0)),
        "{r}"
    );
    let once = ce.json(&["worker", "--once"]);
    assert_eq!(once["jobs"]["completed"], 1, "{once}");
    let done = ce.json(&["jobs", "show", &id]);
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(
        ce.fail(&["jobs", "retry", &id], 4).error["code"],
        "state_transition"
    );
}

#[test]
fn a_job_of_a_killed_process_is_resumed_after_its_lease_exactly_once() {
    let ce = Ce::hash(&format!("{FAST_JOBS}{NO_DERIVE}"));
    put_nodes(&ce);
    ce.json(&["worker", "--once"]);
    let mut parked = KillOnDrop(
        ce.command(&["reindex", "--consumer", "keyword"])
            .env(PARK, "600000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ce reindex starts"),
    );
    let pid = parked.0.id();
    let job = eventually(Duration::from_secs(20), || {
        array(&ce.json(&["jobs", "list", "--state", "running"]))
            .first()
            .cloned()
    })
    .expect("the job never ran");
    let id = job["id"].as_str().expect("id").to_owned();
    assert_eq!(
        job["claimed_by"].as_str(),
        Some(format!("reindex-jobs-{pid}").as_str()),
        "{job}"
    );
    parked.0.kill().expect("kill -9");
    parked.0.wait().expect("reaped");
    assert_eq!(ce.json(&["jobs", "show", &id])["state"], "running");

    // Another process waits for the lease, then runs the job and applies its events.
    let started = Instant::now();
    let once = ce.json(&["worker", "--once"]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(45), "took {took:?}");
    assert_eq!(
        (
            once["jobs"]["ran"].as_u64(),
            once["jobs"]["completed"].as_u64()
        ),
        (Some(1), Some(1)),
        "{once}"
    );
    let done = ce.json(&["jobs", "show", &id]);
    assert_eq!(
        (done["state"].as_str(), done["attempts"].as_u64()),
        (Some("completed"), Some(0)),
        "a lost lease is not a failure: {done}"
    );
    let by = done["claimed_by"].as_str().expect("claimed_by");
    assert!(
        by.starts_with("worker-jobs-") && !by.ends_with(&format!("-{pid}")),
        "{done}"
    );
    assert_eq!(done["progress"]["requeued"], 3, "{done}");
    assert_eq!(keyword_repairs(&ce, &[]), 3, "the work was done once");
    let k = ce.json(&["search", "eta theta", "--mode", "keyword"]);
    assert_eq!(hit_uris(&k), ["ctx://acc/docs/c"], "{k}");
}

#[test]
fn several_runner_processes_on_postgres_never_run_a_job_twice() {
    let db = TestDb::create("cli_jobs_runners");
    let vectors = ce_testkit::pgvector::test_db("cli_jobs_runners");
    let config = format!(
        "{FAST_JOBS}[index.outbox]\nconsumers = [\"vector\"]\n\
         [index.worker]\npoll_interval_ms = 50\n\
         [index.vector]\ndestination = \"pgvector\"\npgvector_url = \"{}\"\n",
        vectors.url()
    );
    let url = db.url();
    let client = Ce::hash(&config);
    for (uri, text) in NODES {
        client.json(&["--store", url, "put", uri, "--content", text]);
    }
    let runners: Vec<(Ce, KillOnDrop)> = (0..3)
        .map(|_| {
            let ce = Ce::hash(&config);
            let child = ce
                .command(&["--store", url, "worker", "--workers", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("ce worker starts");
            (ce, KillOnDrop(child))
        })
        .collect();
    let pids: Vec<u32> = runners.iter().map(|(_, k)| k.0.id()).collect();
    // Each runner has completed a job, or 30 jobs ran (one at a time: they share the key).
    let mut completed_by: BTreeMap<String, String> = BTreeMap::new();
    for _ in 0..30 {
        let q = client.json(&["--store", url, "reindex", "--no-wait"]);
        assert_eq!(q["created"], true, "the previous job had finished: {q}");
        let id = q["job_id"].as_str().expect("job_id").to_owned();
        let job = eventually(Duration::from_secs(30), || {
            let j = client.json(&["--store", url, "jobs", "show", &id]);
            (j["state"] == "completed").then_some(j)
        })
        .unwrap_or_else(|| {
            panic!(
                "job {id} never completed: {}",
                client.json(&["--store", url, "jobs", "show", &id])
            )
        });
        assert_eq!(job["attempts"], 0, "{job}");
        completed_by.insert(id, job["claimed_by"].as_str().expect("by").to_owned());
        let done: Vec<&String> = completed_by.values().collect();
        if pids
            .iter()
            .all(|p| done.iter().any(|b| b.ends_with(&format!("-jobs-{p}"))))
        {
            break;
        }
    }
    for p in &pids {
        assert!(
            completed_by
                .values()
                .any(|b| *b == format!("worker-jobs-{p}")),
            "runner {p} completed none of {completed_by:?}"
        );
    }
    // Each job appended its repair events once: one per node with text, per job.
    let rows = client.json(&[
        "--store",
        url,
        "outbox",
        "list",
        "--consumer",
        "vector",
        "--type",
        "UPSERT_CONTEXT",
        "--limit",
        "10000",
    ]);
    let repairs = array(&rows)
        .iter()
        .filter(|r| r["event"]["payload"]["reason"] == "repair")
        .count();
    assert_eq!(repairs, 3 * completed_by.len(), "{completed_by:?}");
    let listed = client.json(&["--store", url, "jobs", "list", "--state", "completed"]);
    assert_eq!(array(&listed).len(), completed_by.len());
    drop(runners);
}

/// `ce --server URL --json ARGS`; asserts success.
fn remote_json(ce: &Ce, server: &Server, args: &[&str]) -> Value {
    let mut all = vec!["--server", server.url.as_str(), "--json"];
    all.extend_from_slice(args);
    let out = ce.run(&all);
    serde_json::from_str(&success(&all, out)).expect("JSON")
}

#[test]
fn jobs_over_the_server_and_admin_scope() {
    let ce = Ce::hash(&format!("{FAST_JOBS}{NO_DERIVE}"));
    put_nodes(&ce);
    let server = ce.serve(&[]);
    let remote = |args: &[&str]| remote_json(&ce, &server, args);
    // Waiting: the server's runner runs the job; the answer is its report.
    let r = remote(&["reindex", "--consumer", "keyword"]);
    let id = r["job_id"].as_str().expect("job_id").to_owned();
    assert_eq!(r["requeued"], 3, "{r}");
    let shown = remote(&["jobs", "show", &id]);
    assert_eq!(shown["state"], "completed", "{shown}");
    assert!(
        shown["claimed_by"]
            .as_str()
            .is_some_and(|b| b.starts_with("serve-jobs-")),
        "{shown}"
    );
    let listed = remote(&["jobs", "list", "--type", "reindex"]);
    assert_eq!(array(&listed)[0]["id"], id.as_str(), "{listed}");
    let human = ce.remote(&server, &["jobs", "list"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains(&id));
    // --no-wait answers at once; the server runs it on its own.
    let q = remote(&["reindex", "--consumer", "keyword", "--no-wait"]);
    let queued = q["job_id"].as_str().expect("job_id").to_owned();
    eventually(Duration::from_secs(20), || {
        (remote(&["jobs", "show", &queued])["state"] == "completed").then_some(())
    })
    .expect("the server never ran the queued job");
    let args = [
        "--server",
        server.url.as_str(),
        "--json",
        "jobs",
        "cancel",
        &id,
    ];
    let f = failure(&args, &ce.run(&args));
    assert_eq!(
        (f.exit, f.error["code"].as_str()),
        (4, Some("state_transition"))
    );
    let (status, body) = server.get("/v1/jobs/job-nope");
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = server.get("/v1/jobs?state=finished");
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_field")),
        "{body}"
    );
    let (status, body) = server.post(
        "/v1/reindex",
        &json!({"consumer": "keyword", "no_wait": true, "x": 1}),
    );
    assert_eq!(status, 400, "{body}");
    let s = remote(&["status"]);
    assert_eq!(
        (
            s["jobs"]["enabled"].as_bool(),
            s["jobs"]["runner"].as_bool()
        ),
        (Some(true), Some(true)),
        "{s}"
    );
    assert!(
        server.metric(
            "ce_jobs_total",
            &["type=\"reindex\"", "state=\"completed\""]
        ) >= 2.0,
        "{}",
        server.text("/metrics").1
    );
    assert_eq!(
        server.metric("ce_jobs_total", &["type=\"reindex\"", "state=\"pending\""]),
        0.0
    );
    assert!(server.metric("ce_job_run_latency_ms_count", &["type=\"reindex\""]) >= 2.0);
    drop(server);

    // Without a runner ([jobs].enabled = false) a queued job waits, and can be cancelled.
    ce.write_config(&format!(
        "{}[jobs]\nenabled = false\n",
        super::harness::HASH_EMBEDDER
    ));
    let server = ce.serve(&[]);
    let remote = |args: &[&str]| remote_json(&ce, &server, args);
    let s = remote(&["status"]);
    assert_eq!(
        (
            s["jobs"]["enabled"].as_bool(),
            s["jobs"]["runner"].as_bool()
        ),
        (Some(false), Some(false)),
        "{s}"
    );
    let human = ce.remote(&server, &["status"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("jobs.enabled is false"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );
    let q = remote(&["reindex", "--consumer", "keyword", "--no-wait"]);
    let waiting = q["job_id"].as_str().expect("job_id").to_owned();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(remote(&["jobs", "show", &waiting])["state"], "pending");
    assert_eq!(remote(&["jobs", "cancel", &waiting])["state"], "cancelled");
    assert_eq!(remote(&["jobs", "retry", &waiting])["state"], "pending");
    drop(server);

    // With API keys, only an admin key reaches the job routes.
    ce.write_config(&format!(
        "{}[[server.api_keys]]\nkey = \"tenant-key-0000000001\"\naccount_id = \"acc\"\n\
         [[server.api_keys]]\nkey = \"admin-key-00000000001\"\nadmin = true\n",
        super::harness::HASH_EMBEDDER
    ));
    let server = ce.serve(&[]);
    for (key, exit) in [
        ("tenant-key-0000000001", Some(7)),
        ("admin-key-00000000001", None),
    ] {
        for args in [vec!["jobs", "list"], vec!["jobs", "show", waiting.as_str()]] {
            let mut all = vec!["--server", server.url.as_str(), "--api-key", key, "--json"];
            all.extend(args);
            let out = ce.run(&all);
            match exit {
                Some(code) => {
                    let f = failure(&all, &out);
                    assert_eq!(
                        (f.exit, f.error["code"].as_str()),
                        (code, Some("forbidden"))
                    );
                }
                None => {
                    success(&all, out);
                }
            }
        }
    }
}
