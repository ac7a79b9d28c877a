//! Local `ce search`, `ce status`, `ce reindex`, `ce worker --once` against the data directory.

use serde_json::{Value, json};

use super::harness::Ce;

/// Derivation off: these tests check exact hit lists, lags and delivery counts of the
/// indexes, to which the folders' derived roll-ups would add hits and events (they have
/// their own tests: `cli::derive`).
const NO_DERIVE: &str = "[index.outbox]\nconsumers = [\"vector\", \"keyword\", \"relation\"]\n";

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
    let ce = Ce::hash(NO_DERIVE);
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
    assert_eq!(
        (&top["kind"], &top["context_type"]),
        (&json!("leaf"), &json!("resource"))
    );

    // Every hit names the stable id of the record that matched (spec §2.1.1).
    for m in ["hybrid", "vector", "keyword"] {
        let r = ce.json(&["search", q, "--mode", m]);
        let hits = r["hits"].as_array().expect("hits");
        assert!(!hits.is_empty(), "{m}: {r}");
        for h in hits {
            let (uri, level) = (h["uri"].as_str().expect("uri"), h["level"].as_u64());
            let level = u8::try_from(level.expect("level")).expect("level");
            assert_eq!(h["record_id"], ce_core::stable_hash(uri, level), "{m}: {h}");
        }
    }
    // Hybrid (the default) names its fusion and shows each hit's rank in each mode; counts
    // are in words.
    let human = ce.ok(&["search", q, "--top-k", "1"]);
    let mut lines = human.lines();
    let fusion = lines.next().unwrap_or_default();
    assert!(
        fusion.contains("reciprocal rank fusion (rrf k=60, vector×1, keyword×1)"),
        "{human}"
    );
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("SCORE") && header.contains("VECTOR") && header.contains("KEYWORD"),
        "{human}"
    );
    assert!(lines.next().is_some_and(|l| l.contains("#1")), "{human}");
    assert!(human.contains("(1 hit from "), "{human}");
    assert!(!human.contains("not indexed yet"), "{human}");
    let r = ce.json(&["search", q, "--top-k", "1"]);
    assert_eq!(
        (r["mode"].as_str(), r["mode_used"].as_str()),
        (Some("auto"), Some("hybrid"))
    );
    assert_eq!(r["hits"][0]["ranks"]["vector"], 1, "{r}");
    let human = ce.ok(&["search", q, "--mode", "keyword", "--top-k", "2"]);
    assert!(
        human.starts_with("SCORE") && !human.contains("VECTOR"),
        "{human}"
    );
    assert!(human.contains("(2 hits from "), "{human}");
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
    let ce = Ce::hash(NO_DERIVE);
    ce.put("ctx://acc/docs/a", "alpha beta gamma");
    ce.json(&["worker", "--once"]);
    assert_eq!(
        uris(&ce.json(&["search", "alpha beta gamma"])),
        ["ctx://acc/docs/a"]
    );

    // Another model: the index no longer fits.
    ce.write_config(&format!(
        "[index.embedding]\nprovider = \"hash\"\ndimensions = 64\n{NO_DERIVE}"
    ));
    let s = ce.json(&["status"]);
    assert_eq!(s["ready"], false);
    let why = s["not_ready"][0].as_str().expect("reason");
    assert!(why.contains("ce reindex --consumer vector"), "{why}");
    let f = ce.fail(&["search", "alpha", "--mode", "vector"], 4);
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
    // `auto` answers from the keyword index meanwhile, and says why.
    let auto = ce.json(&["search", "alpha"]);
    assert_eq!(auto["mode_used"], "keyword", "{auto}");
    assert!(
        auto["notice"]
            .as_str()
            .is_some_and(|n| n.contains("ce reindex --consumer vector")),
        "{auto}"
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

    // In human mode, a vector rebuild says what it may embed before it starts.
    let out = ce.run(&["reindex"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("reindex: 1 node queued for the vector index"),
        "{stderr}"
    );
    // --no-wait only enqueues the job; the next runner runs it.
    let r = ce.json(&["reindex", "--no-wait"]);
    assert!(r["drain"].is_null(), "{r}");
    assert_eq!(r["job"]["state"], "pending", "{r}");
    let once = ce.json(&["worker", "--once"]);
    assert_eq!(once["jobs"]["completed"], 1, "{once}");
    assert_eq!(
        ce.fail(&["reindex", "--consumer", "graph"], 2).error["code"],
        "invalid_field"
    );
    // The keyword index rebuilds on its own, without the vector consumer's help.
    assert_eq!(vector(&ce.json(&["status"]))["lag_events"], 0);
    let r = ce.json(&["reindex", "--consumer", "keyword"]);
    assert_eq!(
        (r["requeued"].as_u64(), &r["model"]),
        (Some(1), &Value::Null),
        "{r}"
    );
    // Its repair events are the keyword index's alone, also once the store is opened again.
    assert_eq!(vector(&ce.json(&["status"]))["lag_events"], 0);
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
    // A flat search can hit a container: its kind says so (its stored type is the default).
    let flat = ce.json(&[
        "search",
        "italian cooking recipes",
        "--mode",
        "keyword",
        "--top-k",
        "1",
    ]);
    assert_eq!(
        (&flat["hits"][0]["uri"], &flat["hits"][0]["kind"]),
        (&json!("ctx://acc/kb/cooking"), &json!("container")),
        "{flat}"
    );
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

/// A search right after a write says how many changes the indexes it read have not applied
/// yet and what to run (after the hits, on stdout; `lag` per index in JSON), locally and over
/// `--server`; once indexed, the line goes away.
#[test]
fn a_search_right_after_a_write_says_what_is_not_indexed_yet() {
    let ce = Ce::hash(NO_DERIVE);
    ce.put("ctx://acc/docs/a", "alpha beta gamma");
    let lag = |r: &Value| -> Vec<(String, u64)> {
        r["lag"]
            .as_array()
            .expect("lag")
            .iter()
            .map(|l| {
                assert!(l["oldest_age_seconds"].as_f64().is_some(), "{l}");
                (
                    l["index"].as_str().expect("index").to_owned(),
                    l["events"].as_u64().expect("events"),
                )
            })
            .collect()
    };
    let r = ce.json(&["search", "alpha"]);
    assert!(uris(&r).is_empty(), "{r}");
    // A put of ctx://acc/docs/a also creates ctx://acc and ctx://acc/docs: three changes.
    let both = [("vector".to_owned(), 3), ("keyword".to_owned(), 3)];
    assert_eq!(lag(&r), both, "{r}");
    let k = ce.json(&["search", "alpha", "--mode", "keyword"]);
    assert_eq!(lag(&k), [("keyword".to_owned(), 3)], "{k}");
    let scoped = ce.json(&["search", "alpha", "--subtree", "ctx://acc/docs/a"]);
    assert_eq!(lag(&scoped)[0].1, 1, "{scoped}");
    let human = ce.ok(&["search", "alpha"]);
    let last = human.lines().last().unwrap_or_default();
    assert_eq!(
        last.split(" (").next(),
        Some("3 changes not indexed yet"),
        "{human}"
    );
    assert!(
        last.ends_with("run `ce worker --once` or keep `ce serve` running"),
        "{human}"
    );
    let tree = ce.json(&["search", "alpha", "--mode", "hierarchical"]);
    assert_eq!(lag(&tree), [("vector".to_owned(), 3)], "{tree}");

    // Over HTTP (a server without workers keeps the lag).
    let server = ce.serve(&["--workers", "0"]);
    let body = server.ok("/v1/search", &serde_json::json!({"query": "alpha"}));
    assert_eq!(lag(&body), both, "{body}");
    let out = ce.remote(&server, &["search", "alpha"]);
    let human = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    assert!(
        human.contains("3 changes not indexed yet") && human.contains("`ce status`"),
        "{human}"
    );
    server.stop();

    ce.json(&["worker", "--once"]);
    let r = ce.json(&["search", "alpha"]);
    assert_eq!(uris(&r), ["ctx://acc/docs/a"], "{r}");
    assert_eq!(
        lag(&r),
        [("vector".to_owned(), 0), ("keyword".to_owned(), 0)]
    );
    assert!(!ce.ok(&["search", "alpha"]).contains("not indexed yet"));
}

/// Without the embedding model, `auto` search falls back to the keyword index with a notice
/// (first line of the human output; `mode_used` and `notice` in JSON); a named mode that needs
/// vectors stays `unavailable`.
#[test]
fn auto_search_without_the_model_falls_back_to_keyword_with_a_notice() {
    let ce = Ce::new();
    let missing = ce.data_dir().join("no-model");
    ce.write_config(&format!(
        "[index.embedding]\nprovider = \"local\"\nmodel_dir = {:?}\n",
        missing.display().to_string()
    ));
    ce.put("ctx://acc/docs/a", "alpha beta gamma");
    ce.json(&["worker", "--once", "--consumer", "keyword"]);
    let r = ce.json(&["search", "alpha"]);
    assert_eq!(uris(&r), ["ctx://acc/docs/a"], "{r}");
    assert_eq!(
        (r["mode"].as_str(), r["mode_used"].as_str()),
        (Some("auto"), Some("keyword"))
    );
    assert!(
        r["notice"]
            .as_str()
            .is_some_and(|n| n.contains("scripts/fetch-model.sh") && n.contains("keyword")),
        "{r}"
    );
    let human = ce.ok(&["search", "alpha"]);
    assert!(
        human.starts_with("notice: vector search is unavailable"),
        "{human}"
    );
    assert!(human.contains("ctx://acc/docs/a"), "{human}");
    for m in ["vector", "hybrid"] {
        let f = ce.fail(&["search", "alpha", "--mode", m], 6);
        assert_eq!(f.error["code"], "unavailable", "{m}: {}", f.error);
    }
}
