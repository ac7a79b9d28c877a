//! `ce serve` over HTTP: writes become searchable, updates / removals / moves converge,
//! restarts keep the index, and errors carry `{code, message, retryable}` with their status.

use serde_json::{Value, json};

use super::harness::{Ce, success};

fn uris(hits: &[Value]) -> Vec<&str> {
    hits.iter().filter_map(|h| h["uri"].as_str()).collect()
}

/// Derivation off, for the tests that compare exact hit lists, versions or requeue counts
/// (the folders' derived roll-ups would add hits and events; `cli::derive` covers them).
const NO_DERIVE: &str = "[index.outbox]\nconsumers = [\"vector\", \"keyword\", \"relation\"]\n";

#[test]
fn writes_converge_in_search_and_survive_a_restart() {
    // Derivation off: the move below must ask for no embedding, and the folders' new
    // roll-ups would be new text (the derive consumer's own tests cover those).
    let ce = Ce::hash(NO_DERIVE);
    let server = ce.serve(&[]);
    assert_eq!(server.get("/healthz").0, 200);
    let (status, ready) = server.get("/readyz");
    assert_eq!(status, 200, "{ready}");

    // put -> searchable
    let theme = "ctx://acc/users/u1/memories/preferences/theme";
    let o = server.ok(
        "/v1/put",
        &json!({"uri": theme, "abstract": "Prefers dark mode", "content": "dark mode in the IDE and the terminal"}),
    );
    assert_eq!(o["version"], 1);
    let hits = server.search_until("dark mode terminal", |h| uris(h).contains(&theme));
    let hit = hits.iter().find(|h| h["uri"] == theme).expect("hit");
    assert_eq!(hit["abstract"], "Prefers dark mode");
    assert_eq!(hit["version"], 1);

    // update -> the new text is found, the old one no longer
    server.ok(
        "/v1/put",
        &json!({"uri": theme, "abstract": "Prefers solarized light", "content": "solarized light colours everywhere"}),
    );
    server.search_until("solarized light colours", |h| {
        h.iter().any(|x| x["uri"] == theme && x["version"] == 2)
    });
    // The old text matched itself almost exactly; now nothing close to it is left, and no
    // hit ever shows the old abstract.
    let old = "dark mode in the IDE and the terminal";
    server.search_until_min(old, 0.5, |h| !uris(h).contains(&theme));
    for h in server.search_min(old, -1.0) {
        assert_ne!(
            h["abstract"], "Prefers dark mode",
            "stale text returned: {h}"
        );
    }

    // rm -> gone
    server.ok("/v1/rm", &json!({"uri": theme}));
    server.search_until("solarized light colours", |h| !uris(h).contains(&theme));

    // mv -> found at the new URI with its new parent, without embedding anything again
    let draft = "ctx://acc/drafts/plan";
    let archived = "ctx://acc/archive/plan";
    server.ok(
        "/v1/put",
        &json!({"uri": draft, "abstract": "Quarterly planning", "content": "quarterly planning notes for the roadmap"}),
    );
    server.search_until("quarterly planning notes", |h| uris(h) == [draft]);
    // Embedding requests of the workers (each is one `index.embed` call, cached or not) and
    // texts the embedding cache was asked for, measured with no search in between.
    let embed_requests = |s: &super::harness::Server| {
        let calls = s.metric("index_embed_latency_ms_count", &[]);
        let c = s.get("/v1/status").1["embed_cache"].clone();
        let texts = ["hits", "misses", "duplicates"]
            .iter()
            .map(|k| c[*k].as_u64().expect("counter"))
            .sum::<u64>();
        (calls, texts)
    };
    // Counters move when a batch is acknowledged, just after its records are visible.
    server.wait_drained();
    let before = embed_requests(&server);
    assert!(before.0 > 0.0, "{}", server.text("/metrics").1);
    let embed_action =
        |s: &super::harness::Server| s.metric("index_worker_changes_total", &["action=\"embed\""]);
    let embedded_before = embed_action(&server);
    server.ok("/v1/mv", &json!({"from": draft, "to": archived}));
    server.wait_drained();
    assert_eq!(
        embed_requests(&server),
        before,
        "the move asked for embeddings"
    );
    let hits = server.search_until("quarterly planning notes", |h| uris(h) == [archived]);
    assert_eq!(hits[0]["parent_uri"], "ctx://acc/archive");
    assert!(server.metric("index_worker_changes_total", &["action=\"reuse\""]) > 0.0);
    assert_eq!(
        embed_action(&server),
        embedded_before,
        "a move counts reused vectors, not embeddings"
    );

    // The spec's metrics are exported.
    let (_, text) = server.text("/metrics");
    for name in [
        "index_outbox_pending_total",
        "index_outbox_claimed_total",
        "index_outbox_dead_total",
        "index_worker_run_once_latency_ms",
        "index_worker_event_success_total",
        "index_embed_latency_ms",
        "index_vector_upsert_latency_ms",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    // Every index's batched writes are timed under its own name, not the vector index's.
    for index in ["vector", "keyword", "relation"] {
        let name = format!("index_{index}_upsert_latency_ms_count");
        assert!(server.metric(&name, &[]) > 0.0, "{name}:\n{text}");
    }
    let status = server.get("/v1/status").1;
    let vector = status["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .find(|c| c["consumer"] == "vector")
        .expect("vector")
        .clone();
    assert_eq!(vector["lag_events"], 0, "{status}");
    assert_eq!(status["workers"], 6, "two per consumer with an index");
    assert_eq!(status["ready"], true);

    // Graceful stop, restart: the index is still there (no reindex, no re-embedding).
    let (code, rest) = server.stop();
    assert_eq!(code, Some(0), "{rest}");
    assert_eq!(rest.trim(), "stopped");
    let outbox = ce.json(&["outbox", "stats"]);
    let claimed: u64 = outbox
        .as_array()
        .expect("stats")
        .iter()
        .map(|c| c["claimed"].as_u64().expect("claimed"))
        .sum();
    assert_eq!(claimed, 0, "a claim was left behind: {outbox}");
    let server = ce.serve(&[]);
    assert_eq!(uris(&server.search("quarterly planning notes")), [archived]);
    // Even the query comes from the persistent embedding cache.
    assert_eq!(
        server.get("/v1/status").1["embed_cache"]["provider_calls"],
        0
    );
}

/// Asserts an error answer: status, code, a message, retryable.
fn error(answer: (u16, Value), status: u16, code: &str, retryable: bool) -> Value {
    let (s, body) = answer;
    assert_eq!(s, status, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(body["retryable"], retryable, "{body}");
    body
}

#[test]
fn errors_have_a_code_a_message_and_the_right_status() {
    // Derivation off: the node's version at the end is the check that nothing changed it.
    let ce = Ce::hash(&format!("[store]\nmax_layer_bytes = 1024\n{NO_DERIVE}"));
    let server = ce.serve(&["--max-body-bytes", "8192", "--workers", "1"]);
    server.ok(
        "/v1/put",
        &json!({"uri": "ctx://acc/docs/a", "content": "a"}),
    );

    // bad URI, bad level, bad fields
    error(
        server.post("/v1/put", &json!({"uri": "ctx://acc//x"})),
        400,
        "invalid_uri",
        false,
    );
    error(
        server.get("/v1/cat?uri=ctx%3A%2F%2Facc%2Fdocs%2F..%2Fa"),
        400,
        "invalid_uri",
        false,
    );
    error(
        server.get("/v1/cat?uri=ctx://acc/docs/a&level=7"),
        400,
        "invalid_level",
        false,
    );
    error(
        server.get("/v1/cat?uri=ctx://acc/docs/a&bogus=1"),
        400,
        "invalid_field",
        false,
    );
    error(
        server.post(
            "/v1/put",
            &json!({"uri": "ctx://acc/docs/a", "mode": "upsert"}),
        ),
        400,
        "invalid_field",
        false,
    );
    error(
        server.post("/v1/search", &json!({"query": "x", "level": 3})),
        400,
        "invalid_level",
        false,
    );
    error(
        server.post("/v1/search", &json!({"query": " "})),
        400,
        "invalid_field",
        false,
    );
    // malformed JSON, unknown fields, wrong content type
    error(
        server.post_raw("/v1/put", b"{\"uri\": ".to_vec(), "application/json"),
        400,
        "invalid_field",
        false,
    );
    error(
        server.post(
            "/v1/put",
            &json!({"uri": "ctx://acc/docs/a", "colour": "red"}),
        ),
        400,
        "invalid_field",
        false,
    );
    error(
        server.post_raw("/v1/put", b"uri=x".to_vec(), "text/plain"),
        400,
        "invalid_field",
        false,
    );
    // missing node, missing route, wrong method
    error(
        server.get("/v1/cat?uri=ctx://acc/docs/nope"),
        404,
        "not_found",
        false,
    );
    error(
        server.get("/v1/outbox/show?id=evt-nope"),
        404,
        "not_found",
        false,
    );
    error(
        server.post("/v1/rm", &json!({"uri": "ctx://acc/nope"})),
        404,
        "not_found",
        false,
    );
    error(server.get("/v1/nope"), 404, "not_found", false);
    assert_eq!(server.get("/v1/put").0, 405);
    // conflicts
    error(
        server.post(
            "/v1/put",
            &json!({"uri": "ctx://acc/docs/a", "content": "b", "expect_version": 7}),
        ),
        409,
        "version_conflict",
        false,
    );
    error(
        server.post("/v1/rm", &json!({"uri": "ctx://acc/docs"})),
        409,
        "not_empty",
        false,
    );
    // too large: a layer over store.max_layer_bytes, and a body over --max-body-bytes
    error(
        server.post(
            "/v1/put",
            &json!({"uri": "ctx://acc/docs/big", "content": "x".repeat(2000)}),
        ),
        413,
        "payload_too_large",
        false,
    );
    error(
        server.post(
            "/v1/put",
            &json!({"uri": "ctx://acc/docs/big", "content": "x".repeat(10_000)}),
        ),
        413,
        "payload_too_large",
        false,
    );
    error(
        server.post("/v1/reindex", &json!({"consumer": "graph"})),
        400,
        "invalid_field",
        false,
    );

    // Nothing of that changed the node.
    let (status, cat) = server.get("/v1/cat?uri=ctx://acc/docs/a");
    assert_eq!(status, 200);
    assert_eq!(cat["text"], "a");
    assert_eq!(cat["version"], 1);
    assert_eq!(server.get("/readyz").0, 200);
}

#[test]
fn without_the_model_the_server_is_up_but_not_ready() {
    let ce = Ce::new();
    let missing = ce.data_dir().join("no-model");
    ce.write_config(&format!(
        "[index.embedding]\nprovider = \"local\"\nmodel_dir = {:?}\n",
        missing.display().to_string()
    ));
    let server = ce.serve(&[]);
    assert_eq!(server.get("/healthz").0, 200);
    let body = error(server.get("/readyz"), 503, "unavailable", true);
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("scripts/fetch-model.sh")),
        "{body}"
    );
    // Nodes still work; `auto` search falls back to the keyword index and says why; a mode
    // that needs vectors says why it cannot.
    server.ok(
        "/v1/put",
        &json!({"uri": "ctx://acc/docs/a", "content": "alpha"}),
    );
    let auto = super::harness::eventually(std::time::Duration::from_secs(20), || {
        let r = server.ok("/v1/search", &json!({"query": "alpha"}));
        (r["hits"].as_array().is_some_and(|h| !h.is_empty())).then_some(r)
    })
    .expect("the keyword index caught up");
    assert_eq!(
        (auto["mode"].as_str(), auto["mode_used"].as_str()),
        (Some("auto"), Some("keyword"))
    );
    assert!(
        auto["notice"]
            .as_str()
            .is_some_and(|n| n.contains("scripts/fetch-model.sh")),
        "{auto}"
    );
    for mode in ["vector", "hybrid"] {
        error(
            server.post("/v1/search", &json!({"query": "alpha", "mode": mode})),
            503,
            "unavailable",
            true,
        );
    }
    assert_eq!(server.get("/v1/status").1["ready"], false);
}

#[test]
fn the_cli_talks_to_the_server_with_the_same_exit_codes() {
    let ce = Ce::hash(NO_DERIVE);
    let server = ce.serve(&[]);
    let remote_json = |args: &[&str]| -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = ce.remote(&server, &all);
        let text = super::harness::success(&all, out);
        serde_json::from_str(&text).expect("JSON")
    };
    let remote_fail = |args: &[&str]| {
        let mut all = vec!["--server", server.url.as_str(), "--json"];
        all.extend_from_slice(args);
        super::harness::failure(&all, &ce.run(&all))
    };

    let o = remote_json(&[
        "put",
        "ctx://acc/docs/guide",
        "--abstract",
        "Install guide",
        "--content",
        "install the tool with cargo",
        "--meta",
        "lang=en",
    ]);
    assert_eq!(o["version"], 1);
    remote_json(&[
        "put",
        "ctx://acc/docs/faq",
        "--content",
        "frequently asked questions",
    ]);
    remote_json(&[
        "link",
        "ctx://acc/docs/faq",
        "ctx://acc/docs/guide",
        "--type",
        "references",
    ]);

    // Answers are the local answers.
    for args in [
        &["stat", "ctx://acc/docs/guide"][..],
        &["cat", "ctx://acc/docs/guide", "--level", "0"],
        &["ls", "ctx://acc/docs"],
        &["tree", "ctx://acc", "--depth", "1"],
        &["relations", "ctx://acc/docs/guide"],
    ] {
        assert_eq!(remote_json(args), ce.json(args), "ce {args:?}");
    }
    let plain = super::harness::success(
        &["cat"],
        ce.remote(&server, &["cat", "ctx://acc/docs/guide"]),
    );
    assert_eq!(plain, "install the tool with cargo\n");

    // Search, status, outbox over HTTP.
    let found = super::harness::eventually(std::time::Duration::from_secs(20), || {
        let r = remote_json(&[
            "search",
            "install the tool with cargo",
            "--filter",
            "lang=en",
            "--min-score",
            "0.3",
        ]);
        (r["hits"].as_array()?.len() == 1).then_some(r)
    })
    .expect("searchable");
    assert_eq!(found["hits"][0]["uri"], "ctx://acc/docs/guide");
    // Once indexed, the outbox rows are stable: the same over HTTP as read locally.
    let rows = |j: Value| j.as_array().map(|a| a.len());
    assert_eq!(
        rows(remote_json(&["outbox", "list"])),
        rows(ce.json(&["outbox", "list"]))
    );
    // `outbox show` decodes the event (its payload by its type) and its deliveries.
    let list = remote_json(&["outbox", "list"]);
    let id = list[0]["event"]["event_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no event id in {list}"))
        .to_owned();
    assert_eq!(
        remote_json(&["outbox", "show", &id]),
        ce.json(&["outbox", "show", &id])
    );
    let shown = super::harness::success(&["outbox"], ce.remote(&server, &["outbox", "show", &id]));
    assert!(shown.contains(&id), "{shown}");
    let appended = remote_json(&[
        "outbox",
        "append",
        "--type",
        "UPSERT_CONTEXT",
        "--payload",
        r#"{"event_version": 1, "uri": "ctx://acc/docs/guide", "expected_node_version": 1, "reason": "repair", "trace_id": "t-cli"}"#,
    ]);
    assert_eq!(appended["event_type"], "UPSERT_CONTEXT", "{appended}");
    let human = super::harness::success(
        &["search"],
        ce.remote(&server, &["search", "install the tool", "--top-k", "1"]),
    );
    assert!(human.contains("ctx://acc/docs/guide"), "{human}");
    assert!(remote_json(&["status"])["ready"].as_bool().expect("ready"));
    assert_eq!(
        remote_json(&["outbox", "stats"])
            .as_array()
            .expect("stats")
            .len(),
        3
    );
    assert!(
        !remote_json(&["outbox", "list", "--consumer", "vector"])
            .as_array()
            .expect("rows")
            .is_empty()
    );
    remote_json(&["mv", "ctx://acc/docs/faq", "ctx://acc/faq"]);
    remote_json(&[
        "unlink",
        "ctx://acc/faq",
        "ctx://acc/docs/guide",
        "--type",
        "references",
    ]);
    remote_json(&["rm", "ctx://acc/faq"]);

    // Failures exit as in local mode.
    for (args, exit, code) in [
        (&["cat", "ctx://acc/docs/missing"][..], 3, "not_found"),
        (&["put", "ctx://acc//x", "--content", "x"], 2, "invalid_uri"),
        (
            &[
                "put",
                "ctx://acc/docs/guide",
                "--content",
                "x",
                "--expect-version",
                "9",
            ],
            4,
            "version_conflict",
        ),
        (&["rm", "ctx://acc/docs"], 4, "not_empty"),
        (
            &["cat", "ctx://acc/docs/guide", "--level", "5"],
            2,
            "invalid_level",
        ),
        (&["search", "x", "--top-k", "0"], 2, "invalid_field"),
    ] {
        let remote = remote_fail(args);
        assert_eq!(
            (remote.exit, remote.error["code"].as_str()),
            (exit, Some(code)),
            "remote {args:?}"
        );
        let local = ce.fail(args, exit);
        assert_eq!(local.error["code"], code, "local {args:?}");
    }
    // A local `status` reads the index the server holds from its files and says who
    // applies it; a local `search` needs that index open, and says where to go.
    let local = ce.json(&["status"]);
    let vector = local["consumers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["consumer"] == "vector"))
        .expect("vector consumer");
    assert!(
        vector["validation_reason"]
            .as_str()
            .is_some_and(|r| r.contains("holds its index")),
        "{local}"
    );
    let f = ce.fail(&["search", "anything"], 6);
    assert!(
        f.error["message"]
            .as_str()
            .is_some_and(|m| m.contains("--server")),
        "{}",
        f.error
    );
    // Data-directory commands refuse --server; an unreachable server is "unavailable".
    assert_eq!(
        remote_fail(&["import", ".", "--into", "ctx://acc/x"]).exit,
        2
    );
    let mut args = vec!["--server", "http://127.0.0.1:1", "--json", "status"];
    let f = super::harness::failure(&args, &ce.run(&args));
    assert_eq!((f.exit, f.error["code"].as_str()), (6, Some("unavailable")));
    args[1] = "localhost:7420";
    assert_eq!(super::harness::failure(&args, &ce.run(&args)).exit, 2);

    // Reindex over HTTP: the server's workers rebuild, the node is found again.
    let r = remote_json(&["reindex"]);
    assert_eq!(r["requeued"], 1, "{r}");
    server.search_until("install the tool with cargo", |h| {
        uris(h) == ["ctx://acc/docs/guide"]
    });
    assert!(server.metric("index_repair_requeued_total", &[]) >= 1.0);
}

/// `mode` over HTTP: keyword and hybrid answer with their mode; a bad mode, or `min_score` in
/// keyword mode, is a 400 naming the field.
#[test]
fn search_modes_over_http() {
    let ce = Ce::hash(NO_DERIVE);
    let server = ce.serve(&[]);
    let doc = "ctx://acc/docs/incident";
    server.ok(
        "/v1/put",
        &json!({"uri": doc, "abstract": "Incident ERR_CONN_RESET", "content": "the proxy reset connections"}),
    );
    let keyword = |q: &str| {
        server
            .post("/v1/search", &json!({"query": q, "mode": "keyword"}))
            .1
    };
    let caught_up = super::harness::eventually(std::time::Duration::from_secs(20), || {
        let hits = keyword("ERR_CONN_RESET")["hits"].clone();
        (uris(hits.as_array().expect("hits")) == [doc]).then_some(())
    });
    assert!(caught_up.is_some(), "the keyword index never caught up");
    let r = keyword("ERR_CONN_RESET");
    assert_eq!(
        (r["mode"].as_str(), r["model"].as_str()),
        (Some("keyword"), Some(""))
    );
    // Every hit carries the stable id of the record that matched (spec §2.1.1).
    let level = u8::try_from(r["hits"][0]["level"].as_u64().expect("level")).expect("level");
    assert_eq!(
        r["hits"][0]["record_id"],
        ce_core::stable_hash(doc, level),
        "{r}"
    );
    let hybrid = server.search_until("proxy reset connections", |h| uris(h).contains(&doc));
    assert!(hybrid[0]["ranks"].is_object(), "{hybrid:?}");
    assert!(
        hybrid[0]["record_id"]
            .as_str()
            .is_some_and(|id| id.len() == 32),
        "{hybrid:?}"
    );
    let (status, body) = server.post("/v1/search", &json!({"query": "x", "mode": "fuzzy"}));
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_field")),
        "{body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("mode")),
        "{body}"
    );
    let (status, body) = server.post(
        "/v1/search",
        &json!({"query": "x", "mode": "keyword", "min_score": 0.5}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("min_score")),
        "{body}"
    );
}

/// `ce status` shows what the embedding cache holds (read from the cache file, so a one-shot
/// local status sees what the workers stored), and the hit / miss counters only where they
/// mean something: a running server's, with `--server`.
#[test]
fn status_shows_the_persistent_embedding_cache_totals() {
    let ce = Ce::hash("");
    for i in 0..3 {
        ce.put(
            &format!("ctx://acc/notes/n{i}"),
            &format!("cached text number {i}"),
        );
    }
    ce.json(&["worker", "--once"]);
    let local = ce.json(&["status"]);
    let cache = &local["embed_cache"];
    let entries = cache["entries"].as_u64().expect("entries");
    assert!(entries >= 3, "{local}");
    assert!(cache["all_entries"].as_u64() >= Some(entries), "{local}");
    assert!(cache["bytes"].as_u64() > Some(0), "{local}");
    assert!(
        cache.get("hits").is_none(),
        "a one-shot status has no counters of its own: {local}"
    );
    let human = ce.ok(&["status"]);
    assert!(
        human.contains(&format!("{entries} vectors of this model")),
        "{human}"
    );

    let server = ce.serve(&[]);
    let out = ce.run(&["--json", "--server", &server.url, "status"]);
    let remote: Value = serde_json::from_str(&success(&["status"], out)).expect("JSON");
    let cache = &remote["embed_cache"];
    assert_eq!(cache["entries"].as_u64(), Some(entries), "{remote}");
    assert_eq!(cache["hits"], 0, "the server's own counters: {remote}");
}
