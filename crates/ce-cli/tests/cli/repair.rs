//! `ce repair dead` and `ce repair reconcile` (docs/repair.md) through the real binary:
//! a delivery made dead by an embedding provider refusing the request is counted, refused a
//! force-done without `--yes`, requeued and applied once the provider works, and a second
//! one forced done — which leaves the vector index without its node, a *missing* record
//! that reconcile reports and repairs. A source restored from an older copy leaves the
//! indexes with orphans: reconcile's dry run reports them and appends nothing, the repair is
//! refused as a large delete (exit 4) until `--allow-large-delete`, locally and over
//! `--server`. A provider refusing one text of a batch of 32 kills that text's node alone,
//! and keeps killing it alone when it is requeued while still refused.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use super::fake_embeddings::{FakeEmbeddings, POISON};
use super::harness::{Ce, eventually, vector_rows};

/// The fake provider's config with only the vector consumer.
fn config(fake: &FakeEmbeddings) -> String {
    format!(
        "{}[index.outbox]\nconsumers = [\"vector\"]\n",
        fake.embedding_config(32)
    )
}

fn stats(ce: &Ce, consumer: &str) -> Value {
    ce.json(&["outbox", "stats"])
        .as_array()
        .expect("stats")
        .iter()
        .find(|c| c["consumer"] == consumer)
        .expect("consumer")
        .clone()
}

fn vector_of(report: &Value) -> &Value {
    report["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .find(|c| c["consumer"] == "vector")
        .expect("vector")
}

#[test]
fn dead_deliveries_are_counted_requeued_applied_and_forced() {
    let fake = FakeEmbeddings::start(true);
    let ce = Ce::new();
    ce.write_config(&config(&fake));
    ce.put("ctx://acc/docs/a", "alpha beta");
    ce.json(&["worker", "--once", "--consumer", "vector"]);
    let dead = stats(&ce, "vector")["dead"].as_u64().expect("dead");
    assert!(dead >= 1, "the refused embedding killed the delivery");

    // Count, with and without a filter that excludes it.
    let counted = ce.json(&["repair", "dead", "--dry-run"]);
    assert_eq!(counted["total"], dead, "{counted}");
    assert_eq!(counted["counts"], json!({"vector": dead}));
    let none = ce.json(&["repair", "dead", "--dry-run", "--subtree", "ctx://other"]);
    assert_eq!(none["total"], 0, "{none}");
    let by_code = ce.json(&["repair", "dead", "--dry-run", "--error-code", "upstream"]);
    assert_eq!(by_code["total"], dead, "{by_code}");

    // Force-done without --yes and without a terminal: refused, nothing changed.
    let refused = ce.fail(&["repair", "dead", "--force-done"], 2);
    let message = refused.error["message"].as_str().expect("message");
    assert!(message.contains("--yes"), "{message}");
    assert_eq!(stats(&ce, "vector")["dead"], dead);
    // One action is required (a usage error from the argument parser).
    assert_eq!(ce.run(&["repair", "dead"]).status.code(), Some(2));

    // The provider works again: requeue, then the worker applies it.
    fake.failing.store(false, Ordering::SeqCst);
    let requeued = ce.json(&["repair", "dead", "--requeue", "--consumer", "vector"]);
    assert_eq!(requeued["counts"], json!({"vector": dead}), "{requeued}");
    ce.json(&["worker", "--once", "--consumer", "vector"]);
    let s = stats(&ce, "vector");
    assert_eq!(
        (s["dead"].as_u64(), s["pending"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    let clean = ce.json(&["repair", "reconcile", "--dry-run"]);
    let v = vector_of(&clean);
    assert_eq!(v["index_records"], v["source_records"], "{clean}");
    assert_eq!(v["missing"]["records"], 0, "{clean}");

    // A second dead delivery, forced done: done without applying, and it says so.
    fake.failing.store(true, Ordering::SeqCst);
    ce.put("ctx://acc/docs/b", "gamma delta");
    ce.json(&["worker", "--once", "--consumer", "vector"]);
    let forced = ce.json(&[
        "repair",
        "dead",
        "--force-done",
        "--yes",
        "--subtree",
        "ctx://acc/docs/b",
    ]);
    assert_eq!(forced["counts"], json!({"vector": 1}), "{forced}");
    let rows = ce.json(&["outbox", "list", "--consumer", "vector", "--status", "done"]);
    let row = rows
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["event"]["uri"] == "ctx://acc/docs/b")
        .expect("b's delivery is done");
    assert_eq!(row["delivery"]["error_code"], "forced_done", "{row}");

    // The forced node is missing from the vector index: reconcile reports and repairs it.
    fake.failing.store(false, Ordering::SeqCst);
    let found = ce.json(&["repair", "reconcile", "--dry-run", "--consumer", "vector"]);
    let v = vector_of(&found);
    assert_eq!(
        v["missing"]["samples"],
        json!(["ctx://acc/docs/b"]),
        "{found}"
    );
    assert_eq!(
        (v["events"].as_u64(), v["emitted"].as_u64()),
        (Some(1), Some(0))
    );
    let repaired = ce.json(&["repair", "reconcile", "--consumer", "vector"]);
    assert_eq!(repaired["emitted"], 1, "{repaired}");
    let after = ce.json(&["repair", "reconcile", "--dry-run"]);
    let v = vector_of(&after);
    assert_eq!(v["missing"]["records"], 0, "{after}");
    assert_eq!(v["index_records"], v["source_records"], "{after}");
}

/// The URIs of the vector consumer's dead deliveries, with their last errors.
fn dead_vector(ce: &Ce) -> Vec<(String, String)> {
    vector_rows(ce, Some("dead"))
        .iter()
        .map(|r| {
            (
                r["event"]["uri"].as_str().expect("uri").to_owned(),
                r["delivery"]["last_error"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect()
}

#[test]
fn one_refused_text_in_a_batch_of_32_kills_only_its_node() {
    let fake = FakeEmbeddings::start(false);
    let ce = Ce::new();
    ce.write_config(&config(&fake));
    let text = |i: usize| {
        let mark = if i == 13 { POISON } else { "" };
        format!("note {i} on topic {i} {mark}")
    };
    for i in 0..32 {
        ce.put(&format!("ctx://acc/notes/n{i}"), &text(i));
    }
    ce.json(&["worker", "--once", "--consumer", "vector"]);
    let dead = dead_vector(&ce);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, "ctx://acc/notes/n13");
    assert!(
        dead[0].1.contains("refused"),
        "the provider's message: {dead:?}"
    );
    // One call of 32 texts, then at most two per level of the split (log₂ 32 = 5).
    let calls = fake.requests();
    assert!(calls <= 11, "{calls} requests");
    let s = stats(&ce, "vector");
    assert_eq!(
        (s["pending"].as_u64(), s["retry_wait"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    assert_eq!(
        s["done"].as_u64(),
        Some(33),
        "the 31 innocent nodes and the two containers: {s}"
    );
    for i in (0..32).filter(|&i| i != 13) {
        let hits = ce.json(&["search", &text(i), "--mode", "vector", "--top-k", "3"]);
        let found = hits["hits"]
            .as_array()
            .expect("hits")
            .iter()
            .any(|h| h["uri"] == format!("ctx://acc/notes/n{i}").as_str());
        assert!(found, "n{i} is searchable: {hits}");
    }

    // Requeued while the provider still refuses it: only that node dies again.
    let requeued = ce.json(&["repair", "dead", "--requeue"]);
    assert_eq!(requeued["counts"], json!({"vector": 1}), "{requeued}");
    ce.json(&["worker", "--once", "--consumer", "vector"]);
    let again = dead_vector(&ce);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].0, "ctx://acc/notes/n13");
    assert_eq!(stats(&ce, "vector")["done"].as_u64(), Some(33));
}

/// The store's files (`ce.db` and its WAL), copied to or from `to`.
fn copy_db(from: &Path, to: &Path) {
    for name in ["ce.db", "ce.db-wal", "ce.db-shm"] {
        let target = to.join(name);
        let _ = std::fs::remove_file(&target);
        let source = from.join(name);
        if source.exists() {
            std::fs::copy(&source, &target).expect("copy db");
        }
    }
}

/// 5 nodes indexed, the store copied, 20 more indexed, the copy restored: every index has
/// 20 nodes the source does not (80 % of the vector index's records).
fn restored_source() -> (Ce, tempfile::TempDir) {
    // Derivation off: the counts below are the index records of the 25 nodes (the folders'
    // derived roll-ups would be re-derived after the repair, one more step to wait for).
    let ce = Ce::hash("[index.outbox]\nconsumers = [\"vector\", \"keyword\", \"relation\"]\n");
    for i in 0..5 {
        ce.put(&format!("ctx://acc/keep/n{i}"), &format!("kept node {i}"));
    }
    ce.json(&["worker", "--once"]);
    let backup = tempfile::tempdir().expect("backup");
    copy_db(ce.data_dir(), backup.path());
    for i in 0..20 {
        ce.put(
            &format!("ctx://acc/lost/n{i:02}"),
            &format!("lost node {i}"),
        );
    }
    ce.json(&["worker", "--once"]);
    copy_db(backup.path(), ce.data_dir());
    (ce, backup)
}

#[test]
fn a_large_orphan_delete_is_refused_until_allowed() {
    let (ce, _backup) = restored_source();
    let before = ce.snapshot("ctx://acc");

    // Dry run: the orphans and the refusal are reported, nothing is appended.
    let report = ce.json(&["repair", "reconcile", "--dry-run"]);
    let v = vector_of(&report);
    assert_eq!(v["orphan"]["uris"], 20, "{report}"); // their container has no text
    assert_eq!(
        (v["orphan"]["records"].as_u64(), v["index_records"].as_u64()),
        (Some(60), Some(75))
    );
    assert_eq!(v["orphan"]["samples"].as_array().map(Vec::len), Some(10));
    assert_eq!(v["orphan"]["samples"][0], "ctx://acc/lost/n00");
    assert_eq!(v["missing"]["records"], 0);
    assert_eq!(v["large_delete"]["limit"], "fraction", "{report}");
    assert_eq!(report["emitted"], 0);
    assert_eq!(
        ce.snapshot("ctx://acc"),
        before,
        "a dry run appends nothing"
    );
    let text = ce.ok(&["repair", "reconcile", "--dry-run"]);
    assert!(text.contains("dry run: nothing appended"), "{text}");
    assert!(text.contains("delete safety"), "{text}");

    // The repair itself: refused (conflict, exit 4), nothing appended for any index.
    let refused = ce.fail(&["repair", "reconcile"], 4);
    assert_eq!(refused.error["code"], "large_delete", "{:?}", refused.error);
    let message = refused.error["message"].as_str().expect("message");
    assert!(message.contains("--allow-large-delete"), "{message}");
    assert_eq!(
        ce.snapshot("ctx://acc"),
        before,
        "a refusal appends nothing"
    );

    // Allowed: appended and applied; a second reconcile finds nothing.
    let done = ce.json(&["repair", "reconcile", "--allow-large-delete"]);
    assert!(done["emitted"].as_u64() >= Some(20), "{done}");
    let clean = ce.json(&["repair", "reconcile", "--dry-run"]);
    for c in clean["consumers"].as_array().expect("consumers") {
        for kind in ["missing", "orphan", "stale"] {
            assert_eq!(c[kind]["records"], 0, "{kind}: {clean}");
        }
        assert_eq!(c["events"], 0, "{clean}");
    }
}

#[test]
fn repair_works_over_the_server() {
    let (ce, _backup) = restored_source();
    let server = ce.serve(&[]);
    let remote = |args: &[&str]| {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        ce.remote(&server, &all)
    };
    let json = |args: &[&str]| -> Value {
        let out = remote(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };

    let dead = json(&["repair", "dead", "--dry-run"]);
    assert_eq!(dead["total"], 0, "{dead}");
    let out = remote(&["repair", "dead", "--force-done"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "force-done without --yes is refused"
    );

    let report = json(&["repair", "reconcile", "--dry-run", "--consumer", "vector"]);
    assert_eq!(vector_of(&report)["orphan"]["uris"], 20, "{report}");
    let out = remote(&["repair", "reconcile"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let error: Value = serde_json::from_slice(&out.stderr).expect("json error");
    assert_eq!(error["code"], "large_delete");
    // The same over plain HTTP: 409, not retryable.
    let (status, body) = server.post("/v1/repair/reconcile", &json!({}));
    assert_eq!((status, &body["retryable"]), (409, &json!(false)), "{body}");

    let done = json(&["repair", "reconcile", "--allow-large-delete"]);
    assert!(done["emitted"].as_u64() >= Some(20), "{done}");
    // The server's workers apply the repair.
    let clean = eventually(Duration::from_secs(20), || {
        let r = json(&["repair", "reconcile", "--dry-run"]);
        r["consumers"]
            .as_array()?
            .iter()
            .all(|c| c["events"] == 0)
            .then_some(r)
    });
    assert!(clean.is_some(), "never converged\n{}", server.log());
}
