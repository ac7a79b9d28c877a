//! link / unlink / relations, and their UPSERT_RELATION events.

use serde_json::json;

use super::harness::{Ce, events};

#[test]
fn link_unlink_and_relations() {
    let ce = Ce::new();
    ce.put("ctx://acc/skills/refund", "how to refund");
    ce.put("ctx://acc/docs/policy", "the policy");
    let out = ce.json(&[
        "link",
        "ctx://acc/skills/refund",
        "ctx://acc/docs/policy",
        "--type",
        "references",
        "--weight",
        "0.5",
        "--reason",
        "eligibility rules",
    ]);
    assert_eq!(out["changed"], true);
    let edge = json!({"from_uri": "ctx://acc/skills/refund", "to_uri": "ctx://acc/docs/policy",
                      "relation_type": "references", "weight": 0.5, "reason": "eligibility rules"});
    assert_eq!(
        ce.json(&["relations", "ctx://acc/skills/refund"]),
        json!({"outgoing": [edge], "incoming": []})
    );
    assert_eq!(
        ce.json(&["relations", "ctx://acc/docs/policy"]),
        json!({"outgoing": [], "incoming": [edge]})
    );
    let human = ce.ok(&["relations", "ctx://acc/docs/policy"]);
    assert!(
        human.contains("<-") && human.contains("ctx://acc/skills/refund"),
        "{human}"
    );
    let last = events(&ce).pop().expect("an event");
    assert_eq!(last["event_type"], "UPSERT_RELATION");
    assert_eq!(last["payload"]["uri"], "ctx://acc/skills/refund");
    assert_eq!(last["payload"]["relation_version"], 1);
    assert_eq!(last["payload"]["mode"], "replace");
    assert_eq!(
        ce.json(&["stat", "ctx://acc/skills/refund"])["relation_version"],
        1
    );

    // The default weight is 1.0.
    ce.json(&[
        "link",
        "ctx://acc/docs/policy",
        "ctx://acc/skills/refund",
        "--type",
        "used_by",
    ]);
    assert_eq!(
        ce.json(&["relations", "ctx://acc/docs/policy"])["outgoing"][0]["weight"],
        1.0
    );

    let out = ce.json(&[
        "unlink",
        "ctx://acc/skills/refund",
        "ctx://acc/docs/policy",
        "--type",
        "references",
    ]);
    assert_eq!(out["changed"], true);
    assert_eq!(
        ce.json(&["relations", "ctx://acc/skills/refund"])["outgoing"],
        json!([])
    );
    let last = events(&ce).pop().expect("an event");
    assert_eq!(last["event_type"], "UPSERT_RELATION");
    assert_eq!(last["payload"]["relation_version"], 2);

    let before = ce.snapshot("ctx://acc");
    let f = ce.fail(
        &[
            "unlink",
            "ctx://acc/skills/refund",
            "ctx://acc/docs/policy",
            "--type",
            "references",
        ],
        3,
    );
    assert_eq!(f.error["code"], "not_found");
    let f = ce.fail(
        &[
            "link",
            "ctx://acc/skills/refund",
            "ctx://acc/docs/nope",
            "--type",
            "references",
        ],
        3,
    );
    assert_eq!(f.error["code"], "not_found");
    let f = ce.fail(
        &[
            "link",
            "ctx://acc/skills/refund",
            "ctx://acc/docs/policy",
            "--type",
            "has space",
        ],
        2,
    );
    assert_eq!(f.error["code"], "invalid_field");
    let f = ce.fail(
        &[
            "link",
            "ctx://acc/skills/refund",
            "ctx://acc/docs/policy",
            "--type",
            "t",
            "--weight",
            "inf",
        ],
        2,
    );
    assert_eq!(f.error["code"], "invalid_field");
    assert_eq!(ce.snapshot("ctx://acc"), before);
}

#[test]
fn mv_carries_relations_along() {
    let ce = Ce::new();
    ce.put("ctx://acc/a", "a");
    ce.put("ctx://acc/b", "b");
    ce.json(&["link", "ctx://acc/a", "ctx://acc/b", "--type", "references"]);
    ce.json(&["mv", "ctx://acc/b", "ctx://acc/c"]);
    let r = ce.json(&["relations", "ctx://acc/a"]);
    assert_eq!(r["outgoing"][0]["to_uri"], "ctx://acc/c");
    assert_eq!(
        ce.json(&["relations", "ctx://acc/c"])["incoming"][0]["from_uri"],
        "ctx://acc/a"
    );
}

/// `ce related` reads the relation index (after the relation worker ran), follows mv and rm
/// of the endpoints, leaves out what the source no longer holds, and works over `--server`.
#[test]
fn related_reads_the_relation_index_and_follows_the_source() {
    let ce = Ce::hash("");
    ce.put("ctx://acc/skills/refund", "how to refund");
    ce.put("ctx://acc/docs/policy", "the policy");
    ce.put("ctx://acc/docs/faq", "questions");
    for (to, w) in [
        ("ctx://acc/docs/policy", "0.5"),
        ("ctx://acc/docs/faq", "0.9"),
    ] {
        ce.ok(&[
            "link",
            "ctx://acc/skills/refund",
            to,
            "--type",
            "references",
            "--weight",
            w,
        ]);
    }
    let others = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["related"];
        all.extend_from_slice(args);
        ce.json(&all)["edges"]
            .as_array()
            .expect("edges")
            .iter()
            .map(|e| e["other"].as_str().expect("uri").to_owned())
            .collect()
    };
    // Not indexed yet: nothing, never a guess.
    assert!(others(&["ctx://acc/skills/refund"]).is_empty());
    ce.json(&["worker", "--once"]);
    assert_eq!(
        others(&["ctx://acc/skills/refund"]),
        ["ctx://acc/docs/faq", "ctx://acc/docs/policy"]
    );
    assert_eq!(
        others(&["ctx://acc/docs/faq", "--direction", "in"]),
        ["ctx://acc/skills/refund"]
    );
    // Moves and removals: stale edges are dropped at once, the index follows after a drain.
    ce.ok(&["mv", "ctx://acc/docs/faq", "ctx://acc/docs/help"]);
    let r = ce.json(&["related", "ctx://acc/skills/refund"]);
    assert_eq!(r["dropped_by_hydration"], 2, "{r}");
    ce.json(&["worker", "--once"]);
    assert_eq!(
        others(&["ctx://acc/skills/refund"]),
        ["ctx://acc/docs/help", "ctx://acc/docs/policy"]
    );
    ce.ok(&["rm", "ctx://acc/docs/policy"]);
    ce.json(&["worker", "--once"]);
    assert_eq!(
        others(&["ctx://acc/skills/refund"]),
        ["ctx://acc/docs/help"]
    );
    assert_eq!(
        ce.fail(
            &["related", "ctx://acc/skills/refund", "--direction", "up"],
            2
        )
        .error["code"],
        "invalid_field"
    );
    assert_eq!(
        ce.fail(&["related", "ctx://acc/docs/none"], 3).error["code"],
        "not_found"
    );
    let server = ce.serve(&[]);
    let out = ce.remote(&server, &["--json", "related", "ctx://acc/skills/refund"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["edges"][0]["other"], "ctx://acc/docs/help", "{v}");
}

/// `ce related` right after `link` says the relation index has not applied the change yet
/// (after the edges; `lag` in JSON), locally and over `--server`.
#[test]
fn related_right_after_link_says_the_relation_index_lags() {
    let ce = Ce::hash("");
    ce.put("ctx://acc/docs/a", "a");
    ce.put("ctx://acc/docs/b", "b");
    ce.json(&["worker", "--once"]);
    let r = ce.json(&["related", "ctx://acc/docs/a"]);
    assert_eq!(
        r["lag"],
        serde_json::json!([{"index": "relation", "events": 0, "capped": false, "oldest_age_seconds": 0.0}])
    );
    assert!(
        !ce.ok(&["related", "ctx://acc/docs/a"])
            .contains("not indexed yet")
    );
    ce.ok(&[
        "link",
        "ctx://acc/docs/a",
        "ctx://acc/docs/b",
        "--type",
        "cites",
    ]);
    let r = ce.json(&["related", "ctx://acc/docs/a"]);
    assert_eq!(r["edges"], serde_json::json!([]), "{r}");
    assert_eq!(
        (
            r["lag"][0]["index"].as_str(),
            r["lag"][0]["events"].as_u64()
        ),
        (Some("relation"), Some(1)),
        "{r}"
    );
    let human = ce.ok(&["related", "ctx://acc/docs/a"]);
    assert!(
        human.contains("1 change not indexed yet (relation index")
            && human.contains("run `ce worker --once`"),
        "{human}"
    );
    let server = ce.serve(&["--workers", "0"]);
    let (status, v) = server.get("/v1/related?uri=ctx://acc/docs/a");
    assert_eq!(
        (status, v["lag"][0]["events"].as_u64()),
        (200, Some(1)),
        "{v}"
    );
    let out = ce.remote(&server, &["related", "ctx://acc/docs/a"]);
    let human = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && human.contains("1 change not indexed yet"),
        "{out:?}"
    );
}
