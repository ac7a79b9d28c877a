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
        stdout.contains("4 workers running for vector, keyword"),
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
    assert_eq!(remaining.len(), 2, "{report}");
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
