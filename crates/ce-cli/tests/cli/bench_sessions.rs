//! `ce bench sessions` through the binary at tiny sizes: the JSON has every figure, and the
//! invariants that can fail hold — no duplicate in either mode, every planted statement read
//! by the model (windows), every archived retry recognised, CE's token accounting equal to what the loopback LLM answered, recall and
//! memory counts consistent with the planted facts — and the temporary stores are removed.

use serde_json::Value;

use super::harness::Ce;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn bench_sessions_reports_consistent_figures_and_cleans_up() {
    let ce = Ce::new();
    let work = tempfile::tempdir().expect("work dir");
    let work_dir = work.path().display().to_string();
    let r = ce.json(&[
        "bench",
        "sessions",
        "--sessions",
        "2",
        "--messages",
        "20",
        "--facts",
        "4",
        "--fact-sessions",
        "3",
        "--mentions",
        "2",
        "--work-dir",
        &work_dir,
    ]);
    assert_eq!(r["benchmark"], "sessions");
    assert_eq!(r["machine"]["profile"], "debug", "{}", r["machine"]);

    let a = &r["append"];
    assert_eq!(u(&a["messages"]), 40, "{a}");
    assert_eq!(u(&a["latency"]["count"]), 40);
    assert!(a["messages_per_s"].as_f64().expect("rate") > 0.0);
    let after = &a["after_commit"];
    assert_eq!(u(&after["messages"]), 4, "{after}");
    assert_eq!(u(&after["archived_retries"]), 4);
    assert_eq!(
        after["archived_retries_recognised"], after["archived_retries"],
        "a retry of an archived message is not appended again: {after}"
    );

    let p1 = &r["phase1"];
    assert_eq!(u(&p1["latency"]["count"]), 2, "{p1}");
    assert_eq!(u(&p1["messages_archived"]), 40);

    let p2 = &r["phase2"];
    let archives = u(&p2["archives"]);
    assert_eq!(archives, 2, "{p2}");
    let ce_calls = u(&p2["ce_accounting"]["calls"]);
    assert!(ce_calls >= archives, "{p2}");
    assert!(u(&p2["ce_accounting"]["tokens_in"]) > 0, "{p2}");
    assert!(u(&p2["ce_accounting"]["tokens_out"]) > 0, "{p2}");
    assert_eq!(p2["server"]["requests"], p2["ce_accounting"]["calls"]);
    assert_eq!(p2["server"]["tokens_in"], p2["ce_accounting"]["tokens_in"]);
    assert_eq!(p2["accounting_matches_server"], true, "{p2}");
    assert_eq!(u(&p2["wall_latency"]["count"]), archives);
    // Windowed extraction: the model reads every planted statement, one call per window.
    assert_eq!(
        p2["statements_sent_to_model"], p2["planted_statements"],
        "{p2}"
    );
    let w = &p2["windows"];
    assert_eq!(u(&w["left_out"]), 0, "{w}");
    assert_eq!(u(&w["extracted"]), ce_calls, "one call per window: {p2}");

    // The merge rule on measured pairs, with the local model.
    let sim = &r["similarity"];
    assert!(
        sim["model"].as_str().unwrap_or("").starts_with("local:"),
        "{sim}"
    );
    for (set, pairs) in sim["generator"].as_object().expect("sets") {
        let counted: u64 = pairs["relation"]
            .as_object()
            .expect("relations")
            .values()
            .map(u)
            .sum();
        assert_eq!(counted, u(&pairs["pairs"]), "{set}: {pairs}");
    }
    let para = &sim["generator"]["paraphrases"];
    assert_eq!(
        u(&para["pairs"]),
        4 * 3,
        "three wordings of 4 facts: {para}"
    );
    assert!(
        para["relation"].get("unrelated").is_none(),
        "every rewording of a planted fact is close to the others: {para}"
    );
    assert_eq!(u(&sim["hand_written"]["pairs"]), 31, "{sim}");

    for mode in ["cooperative", "paraphrase"] {
        let d = &r["dedup"][mode];
        assert_eq!(d["mode"], mode);
        let facts = u(&d["facts"]);
        assert_eq!(facts, 4, "{d}");
        assert_eq!(u(&d["statements"]), 8);
        assert_eq!(u(&d["model"]["requests"]), 3, "one call per session: {d}");
        assert_eq!(
            u(&d["model"]["candidates"]),
            8,
            "every statement extracted: {d}"
        );
        let m = &d["memories"];
        // Every current memory states one planted fact: found facts plus their duplicates.
        assert_eq!(u(&m["unrecognised"]), 0, "{d}");
        assert_eq!(
            u(&m["current"]),
            facts - u(&d["missing_facts"]) + u(&d["duplicates"]),
            "{d}"
        );
        let recall = &d["recall"];
        assert_eq!(u(&recall["facts"]), facts);
        assert!(u(&recall["in_top_5"]) <= facts, "{recall}");
        assert_eq!(
            recall["misses"].as_array().map(Vec::len),
            Some((facts - u(&recall["in_top_5"])) as usize),
            "{recall}"
        );
        assert_eq!(u(&recall["search_latency"]["count"]), facts);
        assert_eq!(
            r["targets"][mode]["duplicates_zero"],
            d["duplicates"] == 0,
            "{}",
            r["targets"]
        );
    }
    let coop = &r["dedup"]["cooperative"];
    assert_eq!(u(&coop["duplicates"]), 0, "{coop}");
    assert_eq!(u(&coop["mixed_memories"]), 0, "{coop}");
    assert_eq!(u(&coop["missing_facts"]), 0, "{coop}");
    assert!(u(&coop["model"]["keys_reused"]) > 0, "{coop}");
    let para = &r["dedup"]["paraphrase"];
    assert_eq!(u(&para["model"]["keys_reused"]), 0);
    // Reworded under fresh keys: caught by the embedding signal.
    assert_eq!(u(&para["duplicates"]), 0, "{para}");
    assert_eq!(u(&para["mixed_memories"]), 0, "{para}");

    let left = std::fs::read_dir(work.path()).expect("work dir").count();
    assert_eq!(left, 0, "the bench's stores are removed");
}
