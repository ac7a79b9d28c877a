//! `ce worker`: continuous workers stop cleanly on SIGTERM; a worker killed in the middle of
//! a batch leaves claims that another `ce worker --once` finishes once their lease expires;
//! a provider's `Retry-After` holds back every worker of the process, not only the one that
//! got the 429.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fake_embeddings::FakeEmbeddings;
use super::harness::{Ce, eventually, vector_rows};

/// Claimed deliveries of the vector consumer.
fn vector(ce: &Ce) -> Value {
    ce.json(&["outbox", "stats"])
        .as_array()
        .expect("stats")
        .iter()
        .find(|c| c["consumer"] == "vector")
        .expect("vector")
        .clone()
}

fn search_uris(ce: &Ce, query: &str) -> Vec<String> {
    super::harness::hit_uris(&ce.json(&["search", query, "--min-score", "0.3"]))
}

#[test]
fn a_worker_drains_and_stops_on_sigterm() {
    let ce = Ce::hash("[index.worker]\npoll_interval_ms = 50\n");
    let child = ce
        .command(&["worker", "--workers", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ce worker starts");
    ce.put("ctx://acc/docs/a", "alpha beta gamma");
    ce.put("ctx://acc/docs/b", "delta epsilon");
    // Written by another process: the worker finds the events by polling.
    eventually(Duration::from_secs(20), || {
        let v = vector(&ce);
        (v["done"].as_u64() >= Some(4) && v["pending"] == 0 && v["claimed"] == 0).then_some(())
    })
    .unwrap_or_else(|| panic!("not drained: {}", vector(&ce)));
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("8 workers running for vector, keyword, relation, derive"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("stopped"), "{stdout}");
    // The document first (the folders' roll-ups, if derived by then, follow it).
    assert_eq!(
        search_uris(&ce, "alpha beta gamma")
            .first()
            .map(String::as_str),
        Some("ctx://acc/docs/a")
    );
}

#[test]
fn claims_of_a_killed_worker_are_finished_after_their_lease() {
    // The shortest lease the configuration allows.
    let ce = Ce::hash(
        "[index.worker]\nlease_seconds = 15\nheartbeat_seconds = 2\npoll_interval_ms = 50\n",
    );
    for (uri, text) in [
        ("ctx://acc/docs/a", "alpha beta gamma"),
        ("ctx://acc/docs/b", "delta epsilon zeta"),
        ("ctx://acc/docs/c", "eta theta iota"),
    ] {
        ce.put(uri, text);
    }
    // A worker whose embedding calls hang: it claims, then sits in the middle of its batch.
    let mut stuck = ce
        .command(&["worker", "--workers", "1"])
        .env("CE_FAILPOINT_WORKER_EMBED_DELAY_MS", "600000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ce worker starts");
    eventually(Duration::from_secs(20), || {
        (vector(&ce)["claimed"].as_u64() >= Some(5)).then_some(())
    })
    .unwrap_or_else(|| panic!("never claimed: {}", vector(&ce)));
    stuck.kill().expect("kill -9");
    stuck.wait().expect("reaped");
    let left = vector(&ce);
    assert!(left["claimed"].as_u64() >= Some(5), "{left}");

    // Another worker waits for the dead one's lease, then finishes the batch.
    let started = Instant::now();
    let report = ce.json(&["worker", "--once"]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(45), "took {took:?}");
    assert!(
        report["progress"]["succeeded"].as_u64() >= Some(5),
        "{report}"
    );
    let remaining = report["remaining"].as_array().expect("remaining");
    assert_eq!(
        remaining.len(),
        4,
        "vector, keyword, relation, derive: {report}"
    );
    for r in remaining {
        assert_eq!(
            (r["pending"].as_u64(), r["claimed"].as_u64()),
            (Some(0), Some(0)),
            "{report}"
        );
    }
    let after = vector(&ce);
    assert_eq!(after["dead"], 0, "{after}");
    // The document first; the folders' derived roll-ups, which name it, follow.
    assert_eq!(
        search_uris(&ce, "delta epsilon zeta")
            .first()
            .map(String::as_str),
        Some("ctx://acc/docs/b")
    );
}

#[test]
fn a_retry_after_pauses_every_worker_of_the_provider() {
    let fake = FakeEmbeddings::start(false);
    let ce = Ce::new();
    ce.write_config(&format!(
        "{}[index.outbox]\nconsumers = [\"vector\"]\nretry_base_seconds = 1\n\
         [index.worker]\npoll_interval_ms = 50\n",
        fake.embedding_config(8)
    ));
    fake.rate_limit_next(3);
    let _worker = KillOnDrop(
        ce.command(&["worker", "--workers", "2", "--consumer", "vector"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ce worker starts"),
    );
    // One text: one worker embeds it and gets 429 with Retry-After: 3.
    ce.put("ctx://acc/docs/first", "the first text");
    eventually(Duration::from_secs(30), || {
        (fake.rate_limited() > 0).then_some(())
    })
    .expect("the provider was called");
    // Work for the other worker while the provider's wait is not over.
    for i in 0..6 {
        ce.put(&format!("ctx://acc/docs/n{i}"), &format!("text number {i}"));
    }
    eventually(Duration::from_secs(60), || {
        let v = vector(&ce);
        (v["done"].as_u64() == Some(9) && v["retry_wait"] == 0).then_some(())
    })
    .unwrap_or_else(|| panic!("not drained: {}", vector(&ce)));
    assert_eq!(
        fake.requests_in_window(),
        0,
        "a worker called the provider before its Retry-After was over"
    );
    assert_eq!(fake.rate_limited(), 1);
}

/// `ce worker --once` says how many vector events it will embed, and with which model,
/// before it starts; with nothing open it says nothing.
#[test]
fn a_drain_that_embeds_says_so_first() {
    let ce = Ce::hash("");
    ce.put("ctx://acc/docs/a", "alpha beta gamma");
    ce.put("ctx://acc/docs/b", "delta epsilon");
    let stderr = |out: std::process::Output| {
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).expect("utf-8")
    };
    let open = vector(&ce)["pending"].as_u64().expect("pending");
    assert!(open >= 2, "two puts and their parents: {open}");
    let first = stderr(ce.run(&["worker", "--once"]));
    assert!(
        first.contains(&format!(
            "worker: {open} vector events to apply; their texts are embedded with feature-hash-v1"
        )),
        "{first}"
    );
    let again = stderr(ce.run(&["worker", "--once"]));
    assert!(!again.contains("vector events to apply"), "{again}");
    // Draining another consumer only embeds nothing.
    ce.put("ctx://acc/docs/c", "zeta");
    let keyword = stderr(ce.run(&["worker", "--once", "--consumer", "keyword"]));
    assert!(!keyword.contains("to apply"), "{keyword}");
}

/// A consumer in dry-run mode is never applied; `ce worker --dry-run` reports its delta,
/// changes nothing, and status then calls the consumer `dry_run_valid`.
#[test]
fn dry_run_mode_reports_the_delta_and_applies_nothing() {
    let ce = Ce::hash("[index.worker]\ndry_run_consumers = [\"keyword\"]\n");
    ce.put("ctx://acc/docs/a", "alpha beta gamma");
    ce.put("ctx://acc/docs/b", "delta epsilon");
    let consumer = |name: &str| {
        let s = ce.json(&["status"]);
        let c = s["consumers"]
            .as_array()
            .expect("consumers")
            .iter()
            .find(|c| c["consumer"] == name)
            .cloned()
            .expect("consumer");
        (c, s["keyword_records"].clone())
    };
    // The vector consumer drains; the keyword one waits, its queue untouched.
    ce.json(&["worker", "--once"]);
    let (keyword, records) = consumer("keyword");
    assert_eq!(keyword["validation"], "partial", "{keyword}");
    assert_eq!(records, 0);
    let lag = keyword["lag_events"].as_u64().expect("lag");
    assert_eq!(consumer("vector").0["validation"], "applied_valid");

    let reports = ce.json(&["worker", "--dry-run", "--consumer", "keyword"]);
    let r = &reports[0];
    assert_eq!(r["consumer"], "keyword", "{reports}");
    assert_eq!(r["valid"], true, "{r}");
    assert_eq!(r["events"].as_u64(), Some(lag), "{r}");
    assert!(r["actions"]["text"].as_u64() >= Some(2), "{r}");
    let synced: Vec<&str> = r["samples"]["sync"]
        .as_array()
        .expect("sample")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // The documents, and the folders whose roll-ups the derive consumer wrote meanwhile.
    assert_eq!(
        synced,
        [
            "ctx://acc",
            "ctx://acc/docs",
            "ctx://acc/docs/a",
            "ctx://acc/docs/b"
        ],
        "{r}"
    );
    let (keyword, records) = consumer("keyword");
    assert_eq!(keyword["validation"], "dry_run_valid", "{keyword}");
    assert_eq!(keyword["applied"], false);
    assert_eq!(
        (keyword["lag_events"].as_u64(), records),
        (Some(lag), 0.into())
    );
    // A new event makes the report out of date.
    ce.put("ctx://acc/docs/c", "zeta");
    assert_eq!(consumer("keyword").0["validation"], "partial");
    let human = ce.ok(&["worker", "--dry-run", "--consumer", "keyword"]);
    assert!(human.contains("would") && human.contains("text"), "{human}");
}

/// A child killed (SIGKILL works on a stopped process too) if the test ends early.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// The vector deliveries with status `claimed`: (seq, claimed_by, claim_token, claimed_until).
fn claimed(ce: &Ce) -> Vec<(i64, String, String, i64)> {
    vector_rows(ce, Some("claimed"))
        .iter()
        .map(|r| {
            let d = &r["delivery"];
            (
                d["seq"].as_i64().expect("seq"),
                d["claimed_by"].as_str().expect("claimed_by").to_owned(),
                d["claim_token"].as_str().expect("token").to_owned(),
                d["claimed_until_ms"].as_i64().expect("claimed_until_ms"),
            )
        })
        .collect()
}

fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    i64::try_from(d.as_millis()).expect("ms")
}

/// A worker frozen (SIGSTOP) while it holds claims, past its lease: no other process can take
/// its place on the vector index (the paused process still holds the index's lock), so its
/// claims are taken over at the outbox (as a second worker would); the nodes get new versions
/// meanwhile. Resumed (SIGCONT), the paused worker's late acknowledgements are refused (the
/// deliveries stay as the new holder has them), and the vector index ends with the newest
/// version of every node, never an older write of the paused worker.
#[test]
fn a_worker_paused_past_its_lease_cannot_ack_or_leave_stale_vectors() {
    use ce_core::{Config, CtxUri, IndexProjector};
    use ce_store::{OutboxStore as _, SqliteStore};

    let toml = "[index.worker]\nlease_seconds = 15\nheartbeat_seconds = 2\npoll_interval_ms = 50\n";
    let ce = Ce::hash(toml);
    let nodes = [
        ("ctx://acc/docs/a", "alpha beta gamma"),
        ("ctx://acc/docs/b", "delta epsilon zeta"),
        ("ctx://acc/docs/c", "eta theta iota"),
    ];
    for (uri, text) in nodes {
        ce.put(uri, text);
    }
    let log_path = ce.data_dir().join("paused-worker.log");
    let log = std::fs::File::create(&log_path).expect("log");
    // Each embedding call takes 5 s: the worker holds its claims in the middle of a batch.
    let mut paused = KillOnDrop(
        ce.command(&["worker", "--consumer", "vector", "--workers", "1"])
            .env("CE_FAILPOINT_WORKER_EMBED_DELAY_MS", "5000")
            .env_remove("CE_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("ce worker starts"),
    );
    let pid = paused.0.id();
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    eventually(Duration::from_secs(30), || {
        (vector(&ce)["claimed"].as_u64() >= Some(5)).then_some(())
    })
    .unwrap_or_else(|| panic!("never claimed: {}\n{}", vector(&ce), read_log()));
    signal(pid, "-STOP");
    let held = claimed(&ce);
    assert!(
        held.len() >= 5 && held.iter().all(|c| c.1.starts_with("worker-vector-")),
        "stopped too late: the paused worker no longer holds its claims: {held:?}\n{}",
        read_log()
    );
    let first_v2_seq = held.iter().map(|c| c.0).max().expect("claims") + 1;

    // Its heartbeat is frozen with it: wait out the lease.
    let until = held.iter().map(|c| c.3).max().expect("claims");
    while now_ms() <= until + 500 {
        std::thread::sleep(Duration::from_millis(200));
    }
    // No second process can open the vector index while the paused one holds its lock.
    let out = ce.run(&["--json", "worker", "--once", "--consumer", "vector"]);
    let f = super::harness::failure(&["worker", "--once"], &out);
    assert_eq!(
        (f.exit, f.error["code"].as_str()),
        (6, Some("unavailable")),
        "{:?}",
        f.error
    );
    assert_eq!(claimed(&ce), held, "the refused worker touched the claims");

    // New versions of the same nodes, then a takeover of the expired claims at the outbox.
    for (uri, text) in nodes {
        let o = ce.put(uri, &format!("{text} version two"));
        assert_eq!(o["version"], 2, "{o}");
    }
    let config = Config::from_toml(toml).expect("config");
    let store = SqliteStore::open(ce.data_dir(), config.clone()).expect("store");
    let taken = store
        .claim_batch("vector", "takeover", held.len())
        .expect("claim the expired claims");
    let taken_seqs: Vec<i64> = taken.iter().map(|c| c.claim.seq).collect();
    let held_seqs: Vec<i64> = held.iter().map(|c| c.0).collect();
    assert_eq!(taken_seqs, held_seqs, "the expired claims are taken over");
    assert!(taken_seqs.iter().all(|s| *s < first_v2_seq));

    // Resumed: its batch ends, and every late acknowledgement is refused.
    signal(pid, "-CONT");
    eventually(Duration::from_secs(60), || {
        read_log().contains("ack refused").then_some(())
    })
    .unwrap_or_else(|| panic!("no refused ack logged:\n{}", read_log()));
    let now: Vec<(i64, String)> = claimed(&ce)
        .into_iter()
        .filter(|c| c.0 < first_v2_seq)
        .map(|c| (c.0, c.1))
        .collect();
    let want: Vec<(i64, String)> = held_seqs.iter().map(|s| (*s, "takeover".into())).collect();
    assert_eq!(
        now, want,
        "a late ack of the paused worker changed a delivery"
    );
    for r in store
        .mark_done_batch(&taken.iter().map(|c| c.claim.clone()).collect::<Vec<_>>())
        .expect("mark done")
    {
        r.expect("the takeover's claims are live");
    }
    // The resumed worker applies the new versions.
    eventually(Duration::from_secs(90), || {
        let v = vector(&ce);
        (v["pending"] == 0 && v["claimed"] == 0 && v["retry_wait"] == 0).then_some(())
    })
    .unwrap_or_else(|| panic!("not drained: {}\n{}", vector(&ce), read_log()));
    assert_eq!(vector(&ce)["dead"], 0);
    signal(pid, "-TERM");
    let status = paused.0.wait().expect("worker exits");
    assert_eq!(status.code(), Some(0), "{}", read_log());
    drop(store);

    // The index holds exactly the newest version of each node.
    let engine = ce_server::Engine::open_with(
        ce.data_dir(),
        Config::from_toml(&format!("{}{toml}", super::harness::HASH_EMBEDDER)).expect("config"),
        ce_server::EngineOptions {
            run_workers: false,
            ..ce_server::EngineOptions::default()
        },
    )
    .expect("engine");
    let records = engine
        .index()
        .expect("vector index")
        .list_under(&CtxUri::root())
        .expect("list");
    let projector = IndexProjector::default();
    let want: Vec<(String, u64, String)> = engine
        .store()
        .read_subtree(&CtxUri::root())
        .expect("read")
        .iter()
        .flat_map(|n| {
            projector
                .build_context_records(n)
                .records
                .into_iter()
                .map(|r| (r.id, n.version, r.text))
        })
        .collect();
    let mut got: Vec<(String, u64, String)> = records
        .into_iter()
        .map(|r| (r.record.id, r.node_version, r.record.text))
        .collect();
    got.sort();
    let mut want = want;
    want.sort();
    assert_eq!(got, want, "the vector index is not the newest projection");
    assert!(
        got.iter().any(|r| r.1 == 2 && r.2.contains("version two")),
        "{got:?}"
    );
    engine.shutdown();
}
