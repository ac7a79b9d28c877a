//! The OpenAPI document covers exactly what the router serves: one operation per row of
//! [`ROUTES`] (and of [`MOUNTED`]), each served by the real router, with resolvable schema
//! references, the auth scheme, and the error answers.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, header};
use ce_server::http::ROUTES;
use ce_server::http::openapi::{MOUNTED, document};
use serde_json::Value;
use tower::ServiceExt as _;

use super::common::TestApp;

fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            ops.insert((method.to_ascii_uppercase(), path.clone()));
        }
    }
    ops
}

/// Every `$ref` in `v`.
fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r);
            }
            m.values().for_each(|v| refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn every_route_has_an_operation_and_every_operation_a_route() {
    let doc = document(ROUTES, MOUNTED);
    assert_eq!(doc["openapi"], "3.1.0");
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .chain(
            MOUNTED
                .iter()
                .map(|m| (m.method.to_string(), m.path.to_owned())),
        )
        .collect();
    assert_eq!(operations(&doc), served);
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r} is not a component reference"));
        assert!(schemas.contains_key(name), "{r} does not resolve");
    }
    for r in ROUTES {
        let op = &doc["paths"][r.path][r.method.as_str().to_ascii_lowercase()];
        let what = format!("{r:?}");
        assert!(op["responses"]["200"]["content"].is_object(), "{what}");
        let protected = op["security"].as_array().is_some_and(|s| !s.is_empty());
        assert_eq!(
            protected,
            r.access != ce_server::http::Access::Open,
            "{what}"
        );
        assert_eq!(op["responses"]["401"].is_object(), protected, "{what}");
        assert!(op["responses"]["500"].is_object(), "{what}");
    }
    let error = &schemas["ErrorBody"];
    assert_eq!(
        error["required"],
        serde_json::json!(["code", "message", "retryable"])
    );
    let codes = &schemas["ErrorCode"]["enum"];
    assert!(
        codes
            .as_array()
            .is_some_and(|c| c.contains(&"not_found".into()))
    );
    // Request bodies are described as deserialized: a defaulted field is optional.
    let put = &schemas["PutBody"];
    assert_eq!(put["required"], serde_json::json!(["uri"]));
    assert_eq!(put["additionalProperties"], false);
}

/// A router over a fresh data directory (single-user mode: every caller is an admin).
struct App(TestApp);

impl App {
    fn new() -> Self {
        App(TestApp::open(
            "[index.embedding]\nprovider = \"hash\"\n",
            None,
        ))
    }

    /// `METHOD uri` with a JSON `body` → (status, body text).
    fn call(&self, method: &str, uri: &str, body: &str) -> (u16, String) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .expect("request");
        self.0.rt.block_on(async {
            let res = self.0.app.clone().oneshot(req).await.expect("infallible");
            let status = res.status().as_u16();
            let bytes = axum::body::to_bytes(res.into_body(), 1 << 24)
                .await
                .expect("body");
            (status, String::from_utf8_lossy(&bytes).into_owned())
        })
    }
}

/// Every documented operation reaches its handler in the router (never the fallback's
/// `no route` 404 or the 405 of a wrong method), and `/openapi.json` serves the document.
#[test]
fn the_router_serves_every_documented_operation() {
    let app = App::new();
    let doc = document(ROUTES, MOUNTED);
    for (method, path) in operations(&doc) {
        let uri = path.replace("{id}", "no-such-job");
        let (status, body) = app.call(&method, &uri, "{}");
        let what = format!("{method} {path}: {status} {body}");
        assert_ne!(status, 405, "{what}");
        assert!(!body.contains("no route"), "{what}");
        let op = &doc["paths"][&path][method.to_ascii_lowercase()];
        assert!(
            op["responses"][status.to_string()].is_object(),
            "undocumented status: {what}"
        );
        if path == "/openapi.json" {
            assert_eq!(serde_json::from_str::<Value>(&body).expect("json"), doc);
        }
    }
}

/// Found by schemathesis: serde's derived structs also accept an array of their fields, so
/// `[null, null]` was a valid reconcile body and `"filter": [null, null]` a valid filter.
/// Every body and struct-typed field is a JSON object only.
#[test]
fn bodies_and_nested_structs_must_be_objects() {
    let app = App::new();
    for (path, body) in [
        ("/v1/repair/reconcile", r#"[null, null]"#),
        (
            "/v1/repair/dead",
            r#"{"action": "count", "filter": [null, null]}"#,
        ),
        (
            "/v1/search",
            r#"{"query": "x", "mode": "hierarchical", "hierarchical": [20]}"#,
        ),
        ("/v1/put", r#"["ctx://a/b"]"#),
        ("/v1/reindex", r#"[null, true]"#),
        ("/v1/jobs/x/cancel", "[]"),
    ] {
        let (status, text) = app.call("POST", path, body);
        assert_eq!(status, 400, "{path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["code"], "invalid_field", "{path}: {v}");
        assert!(
            v["message"]
                .as_str()
                .is_some_and(|m| m.contains("not an array")),
            "{path}: {v}"
        );
    }
    // The object forms are accepted.
    let (status, text) = app.call("POST", "/v1/repair/reconcile", r#"{"dry_run": true}"#);
    assert_eq!(status, 200, "{text}");
    let dead = r#"{"action": "count", "filter": {"consumer": "vector"}}"#;
    let (status, text) = app.call("POST", "/v1/repair/dead", dead);
    assert_eq!(status, 200, "{text}");
}
