//! `ce worker`: continuous workers stop cleanly on SIGTERM; a worker killed in the middle of
//! a batch leaves claims that another `ce worker --once` finishes once their lease expires.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::harness::{Ce, eventually};

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
    let r = ce.json(&["search", query, "--min-score", "0.3"]);
    r["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| h["uri"].as_str().expect("uri").to_owned())
        .collect()
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
        stdout.contains("6 workers running for vector, keyword, relation"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("stopped"), "{stdout}");
    assert_eq!(search_uris(&ce, "alpha beta gamma"), ["ctx://acc/docs/a"]);
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
    assert_eq!(remaining.len(), 3, "{report}");
    for r in remaining {
        assert_eq!(
            (r["pending"].as_u64(), r["claimed"].as_u64()),
            (Some(0), Some(0)),
            "{report}"
        );
    }
    let after = vector(&ce);
    assert_eq!(after["dead"], 0, "{after}");
    assert_eq!(search_uris(&ce, "delta epsilon zeta"), ["ctx://acc/docs/b"]);
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
    assert_eq!(synced, ["ctx://acc/docs/a", "ctx://acc/docs/b"], "{r}");
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
