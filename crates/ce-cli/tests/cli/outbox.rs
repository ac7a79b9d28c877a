//! Every write appends its events in the same transaction; `outbox list/show/stats/append`.

use serde_json::{Value, json};

use super::harness::{Ce, events};

fn payloads(evts: &[Value]) -> Vec<(String, Value)> {
    evts.iter()
        .map(|e| {
            (
                e["event_type"].as_str().expect("type").to_owned(),
                e["payload"].clone(),
            )
        })
        .collect()
}

#[test]
fn each_write_appends_its_events() {
    let ce = Ce::new();
    let created = ce.json(&["put", "ctx://acc/a", "--content", "1", "--trace-id", "t-1"]);
    let evts = events(&ce);
    assert_eq!(evts.len(), 2, "account node and the node itself");
    assert_eq!(
        created["event_ids"],
        json!([evts[0]["event_id"], evts[1]["event_id"]])
    );
    assert_eq!(evts[1]["event_type"], "UPSERT_CONTEXT");
    assert_eq!(
        evts[1]["payload"],
        json!({"event_version": 1, "uri": "ctx://acc/a", "expected_node_version": 1,
               "reason": "create", "trace_id": "t-1"})
    );

    ce.json(&["put", "ctx://acc/a", "--mode", "merge", "--abstract", "A"]);
    ce.put("ctx://acc/a/child", "c");
    ce.json(&["mv", "ctx://acc/a", "ctx://acc/b/a2"]);
    let moved_version = ce.json(&["stat", "ctx://acc/b/a2"])["version"].clone();
    ce.json(&["rm", "-r", "ctx://acc/b/a2"]);

    let evts = events(&ce);
    let seqs: Vec<i64> = evts
        .iter()
        .map(|e| e["seq"].as_i64().expect("seq"))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let tail = payloads(&evts[2..]);
    let types: Vec<&str> = tail.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "UPSERT_CONTEXT", // merge
            "UPSERT_CONTEXT", // child
            "UPSERT_CONTEXT", // ctx://acc/b, created by the move
            "MOVE_CONTEXT",
            "DELETE_CONTEXT",
        ]
    );
    assert_eq!(tail[0].1["expected_node_version"], 2);
    assert_eq!(tail[0].1["reason"], "merge");
    assert_eq!(tail[1].1["uri"], "ctx://acc/a/child");
    assert_eq!(tail[2].1["uri"], "ctx://acc/b");
    let mv = &tail[3].1;
    assert_eq!(mv["from_uri"], "ctx://acc/a");
    assert_eq!(mv["to_uri"], "ctx://acc/b/a2");
    assert_eq!(mv["old_parent_uri"], "ctx://acc");
    assert_eq!(mv["new_parent_uri"], "ctx://acc/b");
    assert_eq!(mv["recursive"], true);
    let del = &tail[4].1;
    assert_eq!(del["uri"], "ctx://acc/b/a2");
    assert_eq!(del["recursive"], true);
    // The version the moved root had at its new URI when it was removed.
    assert_eq!(del["expected_deleted_version"], moved_version);

    ce.put("ctx://acc/leaf", "l");
    ce.json(&["rm", "ctx://acc/leaf"]);
    let last = events(&ce).pop().expect("an event");
    assert_eq!(last["event_type"], "DELETE_CONTEXT");
    assert_eq!(last["payload"]["expected_deleted_version"], 1, "{last}");
    assert_eq!(last["payload"]["recursive"], false);
}

#[test]
fn list_show_and_stats_agree() {
    let ce = Ce::new();
    ce.put("ctx://acc/x", "x");
    ce.put("ctx://acc/y", "y");
    let all = ce.json(&["outbox", "list"]);
    let rows = all.as_array().expect("array");
    // Three events, one delivery per consumer (vector, keyword, relation, derive).
    assert_eq!(rows.len(), 12);
    assert!(rows.iter().all(|r| r["delivery"]["status"] == "pending"));

    let first = &rows[0]["event"];
    let by_id = ce.json(&["outbox", "show", first["event_id"].as_str().expect("id")]);
    let by_seq = ce.json(&["outbox", "show", &first["seq"].to_string()]);
    assert_eq!(by_id, by_seq);
    assert_eq!(&by_id["event"], first);
    let consumers: Vec<&str> = by_id["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|d| d["consumer"].as_str().expect("consumer"))
        .collect();
    assert_eq!(consumers, ["derive", "keyword", "relation", "vector"]);

    let stats = ce.json(&["outbox", "stats"]);
    for s in stats.as_array().expect("array") {
        assert_eq!(s["pending"], 3, "{s}");
        assert_eq!(s["done"], 0, "{s}");
        assert_eq!(s["low_watermark_seq"], first["seq"], "{s}");
    }

    let after = ce.json(&[
        "outbox",
        "list",
        "--consumer",
        "keyword",
        "--after",
        &first["seq"].to_string(),
    ]);
    assert_eq!(after.as_array().expect("array").len(), 2);
    let limited = ce.json(&["outbox", "list", "--limit", "2"]);
    assert_eq!(limited.as_array().expect("array").len(), 2);
    let done = ce.json(&["outbox", "list", "--status", "done"]);
    assert_eq!(done, json!([]));
    let upserts = ce.json(&[
        "outbox",
        "list",
        "--type",
        "UPSERT_CONTEXT",
        "--consumer",
        "vector",
    ]);
    assert_eq!(upserts.as_array().expect("array").len(), 3);
    assert_eq!(
        ce.json(&["outbox", "list", "--type", "DELETE_CONTEXT"]),
        json!([])
    );

    let human = ce.ok(&["outbox", "list", "--consumer", "vector"]);
    assert!(human.starts_with("SEQ"), "{human}");
    assert_eq!(human.matches("UPSERT_CONTEXT").count(), 3, "{human}");
    let human = ce.ok(&["outbox", "stats"]);
    assert!(
        human.contains("vector") && human.contains("PENDING"),
        "{human}"
    );
}

#[test]
fn append_by_hand_validates_then_appends() {
    let ce = Ce::new();
    ce.put("ctx://acc/x", "x");
    let payload = json!({"event_version": 1, "uri": "ctx://acc/x", "expected_node_version": 1,
                         "reason": "repair", "trace_id": "fix-1"});
    let event = ce.json(&[
        "outbox",
        "append",
        "--type",
        "UPSERT_CONTEXT",
        "--payload",
        &payload.to_string(),
    ]);
    assert_eq!(event["event_type"], "UPSERT_CONTEXT");
    assert_eq!(event["uri"], "ctx://acc/x");
    assert_eq!(event["payload"], payload);
    let evts = events(&ce);
    assert_eq!(evts.last(), Some(&event));
    let shown = ce.json(&["outbox", "show", event["event_id"].as_str().expect("id")]);
    // One per consumer: vector, keyword, relation, derive.
    assert_eq!(shown["deliveries"].as_array().expect("deliveries").len(), 4);
}
