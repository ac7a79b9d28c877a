//! The routes the web console adds: `GET /v1/children` (a page of children with their L0,
//! filtered by context type), `GET /v1/records` (a node's records per index and whether they
//! are current), `POST /v1/search` with `explain` (the candidates hydration dropped, with the
//! reason) and `GET /v1/status/lag` (the recent lag samples), against a real engine whose
//! outbox is applied on demand, so each state is reached on purpose.

use axum::body::Body;
use axum::http::{Request, header};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::common::{TestApp, u};

fn app() -> TestApp {
    TestApp::open("[index.embedding]\nprovider = \"hash\"\n", None)
}

fn call(t: &TestApp, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let req = Request::builder().method(method).uri(path);
    let req = match body {
        Some(b) => req
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .expect("request");
    let app = t.app.clone();
    t.rt.block_on(async move {
        let res = app.oneshot(req).await.expect("infallible");
        let status = res.status().as_u16();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 24)
            .await
            .expect("body");
        (status, serde_json::from_slice(&bytes).expect("JSON"))
    })
}

fn get(t: &TestApp, path: &str) -> Value {
    let (status, v) = call(t, "GET", path, None);
    assert_eq!(status, 200, "{path}: {v}");
    v
}

fn uris(v: &Value) -> Vec<&str> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|c| c["uri"].as_str().expect("uri"))
        .collect()
}

#[test]
fn children_come_in_pages_with_their_abstracts_and_filter_leaves_by_type() {
    let t = app();
    for i in 0..5 {
        t.put(
            &format!("ctx://acc/docs/d{i}"),
            &format!("document {i}"),
            None,
        );
    }
    let memory = ce_store::PutRequest {
        abstract_text: Some("a remembered fact".into()),
        context_type: Some(ce_core::ContextType::Memory),
        ..ce_store::PutRequest::default()
    };
    t.engine
        .put(&u("ctx://acc/docs/fact"), memory)
        .expect("put");
    t.put("ctx://acc/docs/sub/inner", "inside a folder", None);

    let page = get(&t, "/v1/children?uri=ctx://acc/docs&limit=2&offset=1");
    assert_eq!(page["total"], 7, "{page}");
    assert_eq!(page["offset"], 1);
    assert_eq!(
        uris(&page["children"]),
        ["ctx://acc/docs/d1", "ctx://acc/docs/d2"]
    );
    assert_eq!(page["children"][0]["abstract"], "document 1");
    assert_eq!(page["children"][0]["kind"], "leaf");

    // Only memories among the leaves; the folder stays, so the tree can be browsed.
    let memories = get(&t, "/v1/children?uri=ctx://acc/docs&context_type=memory");
    assert_eq!(
        uris(&memories["children"]),
        ["ctx://acc/docs/fact", "ctx://acc/docs/sub"]
    );
    assert_eq!(memories["total"], 2);

    for bad in [
        "/v1/children?uri=ctx://acc/docs&limit=0",
        "/v1/children?uri=ctx://acc/docs&limit=1001",
        "/v1/children?uri=ctx://acc/docs&context_type=poem",
        "/v1/children?uri=ctx://acc/docs&offset=-1",
    ] {
        let (status, v) = call(&t, "GET", bad, None);
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some("invalid_field")),
            "{bad}: {v}"
        );
    }
    let (status, v) = call(&t, "GET", "/v1/children?uri=ctx://acc/none", None);
    assert_eq!(
        (status, v["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
}

fn states(v: &Value, index: &str) -> Vec<(u64, String)> {
    v["indexes"]
        .as_array()
        .expect("indexes")
        .iter()
        .find(|i| i["index"] == index)
        .expect("index")["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r["level"].as_u64().expect("level"),
                r["state"].as_str().expect("state").to_owned(),
            )
        })
        .collect()
}

#[test]
fn records_tell_missing_current_and_stale_apart() {
    let t = app();
    let uri = "ctx://acc/docs/guide";
    t.put(uri, "install the widget", None);
    let path = format!("/v1/records?uri={uri}");
    let all_in = |v: &Value, index: &str, want: &str| {
        let s = states(v, index);
        assert!(!s.is_empty(), "{v}");
        assert!(
            s.iter().all(|(_, state)| state == want),
            "{index} not all {want}: {v}"
        );
    };
    all_in(&get(&t, &path), "vector", "missing");
    all_in(&get(&t, &path), "keyword", "missing");
    t.drain();
    let current = get(&t, &path);
    all_in(&current, "vector", "current");
    all_in(&current, "keyword", "current");
    let rec = &current["indexes"][0]["records"][0];
    assert_eq!(rec["level"], 0, "{current}");
    assert_eq!(rec["indexed_version"], current["version"], "{current}");
    assert_eq!(rec["indexed_chars"], "install the widget".len());
    assert_eq!(
        rec["record_id"],
        ce_core::stable_hash(uri, 0),
        "the stable id"
    );
    // Changed, not yet indexed: stale until the worker catches up.
    t.put(uri, "install the widget with one command", None);
    let stale = get(&t, &path);
    assert!(
        stale["version"].as_u64() > current["version"].as_u64(),
        "{stale}"
    );
    all_in(&stale, "keyword", "stale");
    t.drain();
    all_in(&get(&t, &path), "keyword", "current");
}

#[test]
fn explain_answers_the_candidates_hydration_dropped_and_why() {
    let t = app();
    t.put("ctx://acc/docs/kept", "zebra migration patterns", None);
    t.put("ctx://acc/docs/changed", "zebra migration routes", None);
    t.put("ctx://acc/docs/gone", "zebra migration seasons", None);
    t.drain();
    t.put(
        "ctx://acc/docs/changed",
        "zebra migration routes revised",
        None,
    );
    t.engine
        .rm(&u("ctx://acc/docs/gone"), false, None, None)
        .expect("rm");
    let body = json!({"query": "zebra migration", "mode": "keyword", "explain": true});
    let (status, v) = call(&t, "POST", "/v1/search", Some(body));
    assert_eq!(status, 200, "{v}");
    let dropped: Vec<(String, String, Value)> = v["dropped"]
        .as_array()
        .expect("dropped")
        .iter()
        .map(|d| {
            (
                d["uri"].as_str().expect("uri").to_owned(),
                d["reason"].as_str().expect("reason").to_owned(),
                d["current_version"].clone(),
            )
        })
        .collect();
    assert_eq!(v["dropped_by_hydration"], dropped.len(), "{v}");
    let current = get(&t, "/v1/stat?uri=ctx://acc/docs/changed")["version"].clone();
    assert!(
        dropped.contains(&("ctx://acc/docs/changed".into(), "changed".into(), current)),
        "{v}"
    );
    assert!(
        dropped.contains(&("ctx://acc/docs/gone".into(), "gone".into(), Value::Null)),
        "{v}"
    );
    assert!(
        dropped.iter().all(|(u, ..)| u != "ctx://acc/docs/kept"),
        "{v}"
    );
    assert!(v["dropped"][0]["index"] == "keyword", "{v}");
    // Without explain: the count only.
    let plain = json!({"query": "zebra migration", "mode": "keyword"});
    let (_, v) = call(&t, "POST", "/v1/search", Some(plain));
    assert!(v.get("dropped").is_none(), "{v}");
    assert!(v["dropped_by_hydration"].as_u64() > Some(0), "{v}");
    // Hierarchical answers count their drops; explain is refused there, naming the field.
    let tree = json!({"query": "zebra", "mode": "hierarchical", "explain": true});
    let (status, v) = call(&t, "POST", "/v1/search", Some(tree));
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("invalid_field")),
        "{v}"
    );
    assert!(
        v["message"].as_str().is_some_and(|m| m.contains("explain")),
        "{v}"
    );
}

#[test]
fn lag_samples_follow_the_outbox() {
    let t = app();
    let empty = get(&t, "/v1/status/lag");
    assert_eq!(empty["interval_seconds"], 10);
    assert_eq!(empty["window_seconds"], 3600);
    assert_eq!(empty["samples"], json!([]));
    t.put("ctx://acc/docs/a", "one", None);
    t.put("ctx://acc/docs/b", "two", None);
    t.engine.sample_lag().expect("sample");
    t.drain();
    t.engine.sample_lag().expect("sample");
    let v = get(&t, "/v1/status/lag");
    let lag = |i: usize| -> u64 {
        v["samples"][i]["consumers"]
            .as_array()
            .expect("consumers")
            .iter()
            .find(|c| c["consumer"] == "vector")
            .expect("vector")["lag_events"]
            .as_u64()
            .expect("lag")
    };
    assert_eq!(v["samples"].as_array().map(Vec::len), Some(2), "{v}");
    assert!(lag(0) >= 2, "{v}");
    assert_eq!(lag(1), 0, "{v}");
    assert!(v["samples"][0]["at_ms"].as_i64() <= v["samples"][1]["at_ms"].as_i64());
}
