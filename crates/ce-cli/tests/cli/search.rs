//! Local `ce search`, `ce status`, `ce reindex`, `ce worker --once` against the data directory.

use serde_json::Value;

use super::harness::Ce;

fn uris(r: &Value) -> Vec<&str> {
    r["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .filter_map(|h| h["uri"].as_str())
        .collect()
}

fn vector(status: &Value) -> Value {
    status["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .find(|c| c["consumer"] == "vector")
        .expect("vector")
        .clone()
}

#[test]
fn index_then_search_with_filters() {
    let ce = Ce::hash("");
    ce.json(&[
        "put",
        "ctx://acc/users/u1/memories/preferences/theme",
        "--abstract",
        "Prefers dark mode",
        "--content",
        "dark mode in every editor",
        "--meta",
        "source=chat",
    ]);
    ce.json(&[
        "put",
        "ctx://acc/docs/editor",
        "--abstract",
        "Editor setup",
        "--content",
        "dark mode in every editor",
    ]);
    ce.json(&[
        "put",
        "ctx://other/docs/editor",
        "--content",
        "dark mode in every editor",
    ]);

    // Nothing is indexed before a worker runs.
    // (every put also announces the ancestors it created)
    let s = ce.json(&["status"]);
    assert_eq!(s["ready"], true, "{s}");
    let lag = vector(&s)["lag_events"].as_u64().expect("lag");
    assert!(lag >= 3, "{s}");
    assert_eq!(
        uris(&ce.json(&["search", "dark mode in every editor"])).len(),
        0
    );

    let report = ce.json(&["worker", "--once", "--workers", "1"]);
    // Each event once per consumer with an index (vector, keyword, relation).
    assert_eq!(report["progress"]["succeeded"], lag * 3, "{report}");
    let s = ce.json(&["status"]);
    assert_eq!(vector(&s)["lag_events"], 0, "{s}");
    assert!(s["index_records"].as_u64() >= Some(6), "{s}");
    assert_eq!(s["index_model"]["provider"], "hash");

    let q = "dark mode in every editor";
    assert_eq!(uris(&ce.json(&["search", q])).len(), 3);
    assert_eq!(uris(&ce.json(&["search", q, "--top-k", "1"])).len(), 1);
    assert_eq!(
        uris(&ce.json(&["search", q, "--filter", "source=chat"])),
        ["ctx://acc/users/u1/memories/preferences/theme"]
    );
    assert_eq!(
        uris(&ce.json(&["search", q, "--filter", "account_id=other"])),
        ["ctx://other/docs/editor"]
    );
    assert_eq!(
        uris(&ce.json(&["search", q, "--subtree", "ctx://acc/docs"])),
        ["ctx://acc/docs/editor"]
    );
    assert_eq!(
        uris(&ce.json(&[
            "search",
            q,
            "--filter",
            "context_type=memory",
            "--filter",
            "owner_space=user:u1"
        ]))
        .len(),
        1
    );
    let r = ce.json(&["search", q, "--level", "0"]);
    assert!(
        r["hits"]
            .as_array()
            .expect("hits")
            .iter()
            .all(|h| h["level"] == 0),
        "{r}"
    );
    let top = &ce.json(&["search", q, "--subtree", "ctx://acc/docs"])["hits"][0];
    assert_eq!(top["abstract"], "Editor setup");
    assert_eq!(top["version"], 1);

    let human = ce.ok(&["search", q, "--top-k", "2"]);
    assert!(human.starts_with("SCORE"), "{human}");
    assert!(human.contains("hits from"), "{human}");
    let human = ce.ok(&["status"]);
    assert!(
        human.contains("ready") && human.contains("vector"),
        "{human}"
    );

    // Bad filters are bad input.
    for (args, code) in [
        (&["search", q, "--level", "4"][..], "invalid_level"),
        (&["search", q, "--filter", "nokey"], "invalid_field"),
        (&["search", q, "--subtree", "ctx://a//b"], "invalid_uri"),
        (
            &["search", q, "--filter", "context_type=movie"],
            "invalid_field",
        ),
        (&["search", "", "--top-k", "3"], "invalid_field"),
        (&["search", q, "--top-k", "101"], "invalid_field"),
    ] {
        assert_eq!(ce.fail(args, 2).error["code"], code, "{args:?}");
    }
    assert_eq!(
        ce.fail(&["worker", "--consumer", "graph", "--once"], 2)
            .error["code"],
        "invalid_field"
    );
    assert_eq!(
        ce.fail(&["worker", "--workers", "0", "--once"], 2).error["code"],
        "invalid_field"
    );
}

#[test]
fn a_model_change_needs_a_reindex_and_gets_one() {
    let ce = Ce::hash("");
    ce.put("ctx://acc/docs/a", "alpha beta gamma");
    ce.json(&["worker", "--once"]);
    assert_eq!(
        uris(&ce.json(&["search", "alpha beta gamma"])),
        ["ctx://acc/docs/a"]
    );

    // Another model: the index no longer fits.
    ce.write_config("[index.embedding]\nprovider = \"hash\"\ndimensions = 64\n");
    let s = ce.json(&["status"]);
    assert_eq!(s["ready"], false);
    let why = s["not_ready"][0].as_str().expect("reason");
    assert!(why.contains("ce reindex --consumer vector"), "{why}");
    let f = ce.fail(&["search", "alpha"], 4);
    assert_eq!(f.error["code"], "schema_mismatch");
    assert!(
        f.error["message"]
            .as_str()
            .is_some_and(|m| m.contains("ce reindex")),
        "{}",
        f.error
    );
    assert_eq!(
        ce.fail(&["worker", "--once"], 4).error["code"],
        "schema_mismatch"
    );

    let r = ce.json(&["reindex"]);
    assert_eq!(r["requeued"], 1, "{r}");
    assert_eq!(r["model"]["dimension"], 64);
    let remaining = r["drain"]["remaining"].as_array().expect("remaining");
    assert!(remaining.iter().all(|c| c["pending"] == 0), "{r}");
    assert_eq!(
        uris(&ce.json(&["search", "alpha beta gamma", "--min-score", "0.3"])),
        ["ctx://acc/docs/a"]
    );
    assert_eq!(ce.json(&["status"])["ready"], true);

    // --no-wait only queues.
    let r = ce.json(&["reindex", "--no-wait"]);
    assert!(r["drain"].is_null(), "{r}");
    assert_eq!(vector(&ce.json(&["status"]))["lag_events"], 1);
    assert_eq!(
        ce.fail(&["reindex", "--consumer", "graph"], 2).error["code"],
        "invalid_field"
    );
    // The keyword index rebuilds on its own, without the vector consumer's help.
    let r = ce.json(&["reindex", "--consumer", "keyword"]);
    assert_eq!(
        (r["requeued"].as_u64(), &r["model"]),
        (Some(1), &Value::Null),
        "{r}"
    );
    assert_eq!(vector(&ce.json(&["status"]))["lag_events"], 1);
    let k = ce.json(&["search", "alpha", "--mode", "keyword"]);
    assert_eq!(uris(&k), ["ctx://acc/docs/a"], "{k}");
    assert_eq!(k["mode"], "keyword");
}

/// `--mode hierarchical` descends the best containers and returns leaves with their path,
/// locally and over `--server`.
#[test]
fn hierarchical_search_returns_leaves_with_their_path() {
    let ce = Ce::hash("");
    for (uri, abs) in [
        ("ctx://acc/kb/cooking", "italian cooking recipes"),
        ("ctx://acc/kb/cooking/pasta", "pasta al pomodoro"),
        ("ctx://acc/kb/chores", "household chores"),
        ("ctx://acc/kb/chores/floor", "mopping the floor"),
    ] {
        ce.json(&["put", uri, "--abstract", abs]);
    }
    ce.json(&["worker", "--once"]);
    let r = ce.json(&[
        "search",
        "italian cooking recipes",
        "--mode",
        "hierarchical",
        "--top-k",
        "2",
    ]);
    let hits = r["hits"].as_array().expect("hits");
    assert_eq!(hits[0]["uri"], "ctx://acc/kb/cooking/pasta", "{r}");
    assert_eq!(hits[0]["path"][0]["uri"], "ctx://acc/kb/cooking", "{r}");
    assert!(r["stats"]["containers_expanded"].as_u64() >= Some(1), "{r}");
    let human = ce.ok(&[
        "search",
        "italian cooking recipes",
        "--mode",
        "hierarchical",
    ]);
    assert!(human.contains("in ctx://acc/kb/cooking"), "{human}");
    assert_eq!(
        ce.fail(
            &["search", "x", "--mode", "hierarchical", "--alpha", "2"],
            2
        )
        .error["code"],
        "invalid_field"
    );
    let server = ce.serve(&[]);
    let out = ce.remote(
        &server,
        &[
            "--json",
            "search",
            "italian cooking recipes",
            "--mode",
            "hierarchical",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["hits"][0]["uri"], "ctx://acc/kb/cooking/pasta", "{v}");
}
