//! The MCP endpoint `/mcp` in-process, with raw JSON-RPC: both protocol revisions (stateless
//! `2026-07-28`, `2025-11-25` with initialize and a session), every tool's results and typed
//! errors, the knowledge-base tools end to end (added, indexed, found, removed from search at
//! once), the plain-schema walk, and the tenant-isolation walk over [`TOOLS`] (a new tool
//! without a case fails).

use axum::body::Body;
use axum::http::{Request, header};
use ce_server::mcp::tools::TOOLS;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::common::TestApp;

const KEY_A: &str = "key-of-account-a-00000001";
const KEY_B: &str = "key-of-account-b-00000001";
const KEY_ADMIN: &str = "key-of-the-admin-00000001";
const ADMIN_ENV: &str = "CE_TEST_MCP_ADMIN_KEY";
const CURRENT: &str = "2026-07-28";
const LEGACY: &str = "2025-11-25";

const A_PLAN: &str = "ctx://a/docs/plan";
const A_NOTE: &str = "ctx://a/users/u1/memories/note";
const B_SECRET: &str = "ctx://b/docs/secret";

/// The shared fixture, seeded with both accounts' nodes and edges.
struct H(TestApp);

/// One answer: HTTP status, session header, the JSON-RPC messages (JSON or SSE body).
struct A {
    status: u16,
    session: Option<String>,
    messages: Vec<Value>,
}

impl H {
    fn new() -> Self {
        Self::with("")
    }

    /// An engine whose configuration adds `extra` TOML.
    fn with(extra: &str) -> Self {
        let toml = format!(
            "[index.embedding]\nprovider = \"hash\"\n\
             [[server.api_keys]]\nkey = \"{KEY_A}\"\naccount_id = \"a\"\n\
             [[server.api_keys]]\nkey = \"{KEY_B}\"\naccount_id = \"b\"\n\
             [[server.api_keys]]\nkey_env = \"{ADMIN_ENV}\"\nadmin = true\n{extra}"
        );
        let t = TestApp::open(&toml, Some((ADMIN_ENV, KEY_ADMIN)));
        for (uri, text) in [
            (A_PLAN, "alpha quarterly roadmap planning"),
            (A_NOTE, "user one prefers dark mode"),
            (B_SECRET, "bravo confidential merger plans"),
        ] {
            t.put(uri, text, Some(format!("{text}: the overview")));
        }
        t.link(A_PLAN, B_SECRET);
        t.link(A_PLAN, A_NOTE);
        t.drain();
        H(t)
    }

    /// POSTs `body` to `/mcp` (with `MCP-Protocol-Version: version` and the session, if any).
    fn post(&self, key: Option<&str>, version: &str, session: Option<&str>, body: &Value) -> A {
        self.post_to("127.0.0.1", key, version, session, body)
    }

    /// [`H::post`] with `Host: host`.
    fn post_to(
        &self,
        host: &str,
        key: Option<&str>,
        version: &str,
        session: Option<&str>,
        body: &Value,
    ) -> A {
        let mut req = Request::builder()
            .method("POST")
            .uri("/mcp")
            .header(header::HOST, host)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", version);
        if let Some(k) = key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        // The 2026-07-28 routing headers: the method, and the tool name or resource URI.
        if let Some(m) = body["method"].as_str() {
            req = req.header("mcp-method", m);
        }
        if let Some(n) = body["params"]["name"]
            .as_str()
            .or(body["params"]["uri"].as_str())
        {
            req = req.header("mcp-name", n);
        }
        let req = req.body(Body::from(body.to_string())).expect("request");
        let app = self.0.app.clone();
        self.0.rt.block_on(async move {
            let res = app.oneshot(req).await.expect("infallible");
            let status = res.status().as_u16();
            let session = res
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let sse = res
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.starts_with("text/event-stream"));
            let bytes = axum::body::to_bytes(res.into_body(), 1 << 26)
                .await
                .expect("body");
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let messages = if sse {
                text.lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .filter_map(|d| serde_json::from_str(d.trim()).ok())
                    .collect()
            } else {
                serde_json::from_str(&text).into_iter().collect()
            };
            A {
                status,
                session,
                messages,
            }
        })
    }

    /// A stateless `2026-07-28` request of `method` as `key`; its one JSON-RPC answer.
    fn rpc(&self, key: &str, method: &str, params: Value) -> Value {
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": CURRENT,
            "io.modelcontextprotocol/clientInfo": {"name": "ce-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let a = self.post(Some(key), CURRENT, None, &body);
        assert_eq!(a.status, 200, "{method}: {:?}", a.messages);
        a.messages.into_iter().last().expect("an answer")
    }

    /// Calls tool `name` as `key`: `(is_error, structured content)`.
    fn tool(&self, key: &str, name: &str, args: Value) -> (bool, Value) {
        let answer = self.rpc(key, "tools/call", json!({"name": name, "arguments": args}));
        let r = &answer["result"];
        assert!(r.is_object(), "{name}: {answer}");
        let text = r["content"][0]["text"].as_str().expect("a text block");
        let structured = r["structuredContent"].clone();
        assert_eq!(
            serde_json::from_str::<Value>(text).expect("JSON text"),
            structured,
            "{name}: the text block is the structured content"
        );
        (r["isError"] == true, structured)
    }

    fn ok(&self, key: &str, name: &str, args: Value) -> Value {
        let (err, v) = self.tool(key, name, args.clone());
        assert!(!err, "{name} {args}: {v}");
        v
    }

    /// Calls a tool that must fail with `code`; returns the message.
    fn fails(&self, key: &str, name: &str, args: Value, code: &str) -> String {
        let (err, v) = self.tool(key, name, args.clone());
        assert!(err, "{name} {args} succeeded: {v}");
        assert_eq!(v["code"], code, "{name} {args}: {v}");
        assert!(v["retryable"].is_boolean(), "{v}");
        v["message"].as_str().expect("message").to_owned()
    }
}

fn uris(v: &Value, list: &str) -> Vec<String> {
    v[list]
        .as_array()
        .expect("array")
        .iter()
        .map(|n| n["uri"].as_str().expect("uri").to_owned())
        .collect()
}

#[test]
fn both_protocol_revisions_are_served() {
    let h = H::new();
    // Current revision, stateless: no initialize, no session.
    let list = h.rpc(KEY_ADMIN, "tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, TOOLS.iter().map(|t| t.name).collect::<Vec<_>>());
    // Previous revision: initialize, a session, then calls within it.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {},
        "clientInfo": {"name": "legacy", "version": "1"}}});
    let a = h.post(Some(KEY_ADMIN), LEGACY, None, &init);
    assert_eq!(a.status, 200, "{:?}", a.messages);
    assert_eq!(a.messages[0]["result"]["protocolVersion"], LEGACY);
    assert_eq!(
        a.messages[0]["result"]["serverInfo"]["name"],
        "contextengine"
    );
    let session = a.session.expect("a session for 2025-11-25");
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let a = h.post(Some(KEY_ADMIN), LEGACY, Some(&session), &note);
    assert_eq!(a.status, 202);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "read", "arguments": {"uris": [A_PLAN], "level": 0}}});
    let a = h.post(Some(KEY_ADMIN), LEGACY, Some(&session), &call);
    assert_eq!(a.status, 200);
    let r = &a.messages.last().expect("answer")["result"];
    assert_eq!(
        r["structuredContent"]["nodes"][0]["text"],
        "alpha quarterly roadmap planning"
    );
    // Without a key: the gate's 401, as for the JSON API.
    let a = h.post(None, CURRENT, None, &init);
    assert_eq!(a.status, 401);
    assert_eq!(a.messages[0]["code"], "unauthenticated");
    // A body that is not a JSON-RPC message is refused at the protocol level.
    let a = h.post(Some(KEY_ADMIN), CURRENT, None, &json!("not a message"));
    assert!(
        (400..500).contains(&a.status),
        "{} {:?}",
        a.status,
        a.messages
    );
    // An unknown tool is a protocol error, not a tool result.
    let e = h.rpc(
        KEY_ADMIN,
        "tools/call",
        json!({"name": "nope", "arguments": {}}),
    );
    assert_eq!(e["error"]["code"], -32602, "{e}");
}

#[test]
fn host_names_beyond_loopback_need_server_allowed_hosts() {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {},
        "clientInfo": {"name": "host", "version": "1"}}});
    let h = H::new();
    for host in ["localhost:7420", "127.0.0.1"] {
        let a = h.post_to(host, Some(KEY_A), LEGACY, None, &init);
        assert_eq!(a.status, 200, "{host}");
    }
    // DNS rebinding protection: a foreign Host is refused by default.
    let a = h.post_to("ce.example.com", Some(KEY_A), LEGACY, None, &init);
    assert_eq!(a.status, 403);
    let h = H::with("[server]\nallowed_hosts = [\"ce.example.com\"]\n");
    let a = h.post_to("ce.example.com", Some(KEY_A), LEGACY, None, &init);
    assert_eq!(a.status, 200, "{:?}", a.messages);
    let a = h.post_to("other.example.com", Some(KEY_A), LEGACY, None, &init);
    assert_eq!(a.status, 403);
    let h = H::with("[server]\nallowed_hosts = [\"*\"]\n");
    let a = h.post_to("other.example.com", Some(KEY_A), LEGACY, None, &init);
    assert_eq!(a.status, 200);
}

/// Fails on any schema construct some model vendors reject (walking the schema's
/// subschemas: property schemas and array items).
fn plain(schema: &Value, path: &str) {
    let m = schema
        .as_object()
        .unwrap_or_else(|| panic!("{path}: a schema is an object"));
    for k in [
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$ref",
        "$defs",
        "definitions",
        "if",
    ] {
        assert!(!m.contains_key(k), "{path} uses {k}");
    }
    let t = m.get("type").unwrap_or_else(|| panic!("{path}: no type"));
    assert!(t.is_string(), "{path}: type must be one string, not {t}");
    if let Some(props) = m.get("properties") {
        for (k, v) in props.as_object().expect("properties") {
            plain(v, &format!("{path}.{k}"));
        }
    }
    if let Some(items) = m.get("items") {
        plain(items, &format!("{path}[]"));
    }
}

#[test]
fn every_tool_schema_is_plain_and_annotated() {
    let h = H::new();
    let list = h.rpc(KEY_A, "tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), TOOLS.len());
    for t in tools {
        let name = t["name"].as_str().expect("name");
        let schema = &t["inputSchema"];
        plain(schema, name);
        assert_eq!(schema["type"], "object", "{name}");
        assert_eq!(schema["additionalProperties"], false, "{name}");
        for (arg, p) in schema["properties"].as_object().expect("properties") {
            assert!(
                p["description"].as_str().is_some_and(|d| d.len() > 10),
                "{name}.{arg} needs a description for the model"
            );
        }
        assert!(
            t["description"].as_str().is_some_and(|d| d.len() > 40),
            "{name}"
        );
        let a = &t["annotations"];
        for hint in [
            "readOnlyHint",
            "destructiveHint",
            "idempotentHint",
            "openWorldHint",
        ] {
            assert!(a[hint].is_boolean(), "{name}: {hint}");
        }
        // Only the tools that fetch a knowledge base's URLs reach beyond the database.
        assert_eq!(
            a["openWorldHint"] == true,
            ["kb_add", "kb_reindex"].contains(&name),
            "{name}"
        );
        let read_only = a["readOnlyHint"] == true;
        assert_eq!(
            read_only,
            [
                "search",
                "read",
                "list",
                "tree",
                "related",
                "status",
                "kb_list",
                "kb_status"
            ]
            .contains(&name),
            "{name}"
        );
    }
    let forget = tools
        .iter()
        .find(|t| t["name"] == "forget")
        .expect("forget");
    assert_eq!(forget["annotations"]["destructiveHint"], true);
}

#[test]
fn tools_answer_results_and_typed_errors() {
    let h = H::new();
    let k = KEY_A;
    // write: the result says how far the indexes are behind, until they catch up.
    let w = h.ok(
        k,
        "write",
        json!({"uri": "ctx://a/docs/new", "abstract": "zebra migration notes",
        "content": "The zebra herd moves north in May. The zebra herd rests."}),
    );
    assert_eq!(w["version"], 1);
    assert_eq!(w["indexing"]["searchable"], false, "{w}");
    let behind = w["indexing"]["indexes"].as_array().expect("indexes");
    assert!(!behind.is_empty());
    assert!(
        behind
            .iter()
            .all(|i| i["applied"] == false && i["events_behind"].as_u64() >= Some(1))
    );
    let s = h.ok(k, "status", json!({}));
    assert_eq!(s["searchable"], false, "{s}");
    h.0.drain();
    let s = h.ok(k, "status", json!({}));
    assert_eq!(s["searchable"], true, "{s}");
    let found = h.ok(
        k,
        "search",
        json!({"query": "zebra migration", "mode": "keyword"}),
    );
    assert_eq!(uris(&found, "hits")[0], "ctx://a/docs/new", "{found}");
    // write errors: version conflict, bad mode, bad URI.
    h.fails(
        k,
        "write",
        json!({"uri": "ctx://a/docs/new", "content": "x", "expect_version": 7}),
        "version_conflict",
    );
    let m = h.fails(
        k,
        "write",
        json!({"uri": "ctx://a/docs/new", "mode": "upsert"}),
        "invalid_field",
    );
    assert!(m.contains("mode"), "{m}");
    h.fails(k, "write", json!({"uri": "ctx://a//x"}), "invalid_uri");
    // Bad arguments name the field.
    let m = h.fails(k, "search", json!({}), "invalid_field");
    assert!(m.contains("`query`"), "{m}");
    let m = h.fails(
        k,
        "search",
        json!({"query": "x", "top_k": "ten"}),
        "invalid_field",
    );
    assert!(m.contains("`top_k`"), "{m}");
    let m = h.fails(
        k,
        "search",
        json!({"query": "x", "filters": {"colour": "red"}}),
        "invalid_field",
    );
    assert!(m.contains("`filters.colour`"), "{m}");
    let m = h.fails(k, "read", json!({"uris": []}), "invalid_field");
    assert!(m.contains("`uris`"), "{m}");
    // edit: exact replacement, absent and ambiguous strings refused.
    let m = h.fails(
        k,
        "edit",
        json!({"uri": "ctx://a/docs/new", "old": "zebra herd", "new": "x"}),
        "invalid_field",
    );
    assert!(m.contains("occurs 2 times"), "{m}");
    let m = h.fails(
        k,
        "edit",
        json!({"uri": "ctx://a/docs/new", "old": "giraffe", "new": "x"}),
        "invalid_field",
    );
    assert!(m.contains("does not occur"), "{m}");
    h.fails(
        k,
        "edit",
        json!({"uri": "ctx://a/docs/new", "old": "May", "new": "June", "expect_version": 9}),
        "version_conflict",
    );
    h.fails(
        k,
        "edit",
        json!({"uri": "ctx://a/docs/none", "old": "a", "new": "b"}),
        "not_found",
    );
    let e = h.ok(
        k,
        "edit",
        json!({"uri": "ctx://a/docs/new", "old": "in May", "new": "in June"}),
    );
    // 1 the write (its overview derived in it: docs/derive.md, "Derived at write time"),
    // 2 the edit.
    assert_eq!(e["version"], 2);
    let r = h.ok(
        k,
        "read",
        json!({"uris": ["ctx://a/docs/new", "ctx://a/docs/none"]}),
    );
    assert_eq!(
        r["nodes"][0]["text"],
        "The zebra herd moves north in June. The zebra herd rests."
    );
    assert_eq!(r["nodes"][0]["version"], 2);
    assert_eq!(r["nodes"][1]["error"]["code"], "not_found");
    let e = h.ok(
        k,
        "edit",
        json!({"uri": "ctx://a/docs/new", "layer": "abstract", "old": "notes", "new": "log"}),
    );
    assert_eq!(e["version"], 3);
    let r = h.ok(k, "read", json!({"uris": ["ctx://a/docs/new"], "level": 0}));
    assert_eq!(r["nodes"][0]["text"], "zebra migration log");
    // list: children with abstracts, paginated.
    let p1 = h.ok(k, "list", json!({"uri": "ctx://a/docs", "limit": 1}));
    assert_eq!(p1["total"], 2);
    assert_eq!(uris(&p1, "children"), ["ctx://a/docs/new"]);
    assert_eq!(p1["children"][0]["abstract"], "zebra migration log");
    let p2 = h.ok(
        k,
        "list",
        json!({"uri": "ctx://a/docs", "limit": 1, "cursor": p1["next_cursor"]}),
    );
    assert_eq!(uris(&p2, "children"), [A_PLAN]);
    assert_eq!(p2["next_cursor"], Value::Null);
    h.fails(
        k,
        "list",
        json!({"uri": "ctx://a/docs", "cursor": "xyz"}),
        "invalid_field",
    );
    // tree: depth and node limits.
    let t = h.ok(k, "tree", json!({"uri": "ctx://a", "depth": 1}));
    assert_eq!(
        uris(&t, "nodes"),
        ["ctx://a", "ctx://a/docs", "ctx://a/users"]
    );
    let t = h.ok(
        k,
        "tree",
        json!({"uri": "ctx://a", "depth": 5, "max_nodes": 2}),
    );
    assert_eq!(t["truncated"], true);
    assert_eq!(t["nodes"].as_array().map(Vec::len), Some(2));
    // search with a budget: never over it, says what was left out.
    h.0.drain();
    let full = h.ok(
        k,
        "search",
        json!({"query": "zebra plan mode", "mode": "keyword", "detail": "content"}),
    );
    let tight = h.ok(k, "search", json!({"query": "zebra plan mode", "mode": "keyword", "detail": "content", "max_tokens": 30}));
    assert!(tight["tokens"].as_u64() <= Some(30), "{tight}");
    assert!(
        !tight["left_out"].as_array().expect("left_out").is_empty(),
        "{tight}"
    );
    assert!(full["tokens"].as_u64() > tight["tokens"].as_u64());
    assert!(
        full["context"]
            .as_str()
            .expect("context")
            .contains("in June"),
        "{full}"
    );
    // link / related.
    h.ok(
        k,
        "link",
        json!({"from": "ctx://a/docs/new", "to": A_PLAN, "type": "mentions", "reason": "test"}),
    );
    h.0.drain();
    let rel = h.ok(k, "related", json!({"uri": "ctx://a/docs/new"}));
    assert_eq!(rel["edges"][0]["other"], A_PLAN, "{rel}");
    h.fails(
        k,
        "related",
        json!({"uri": A_PLAN, "direction": "sideways"}),
        "invalid_field",
    );
    // move.
    let mv = h.ok(
        k,
        "move",
        json!({"from": "ctx://a/docs/new", "to": "ctx://a/docs/zebra"}),
    );
    assert_eq!(mv["uri"], "ctx://a/docs/zebra");
    h.fails(
        k,
        "move",
        json!({"from": "ctx://a/docs/new", "to": "ctx://a/docs/z2"}),
        "not_found",
    );
    // forget: recursive only when asked.
    h.fails(k, "forget", json!({"uri": "ctx://a/docs"}), "not_empty");
    h.ok(k, "forget", json!({"uri": "ctx://a/docs/zebra"}));
    h.fails(
        k,
        "forget",
        json!({"uri": "ctx://a/docs/zebra"}),
        "not_found",
    );
    h.ok(
        k,
        "forget",
        json!({"uri": "ctx://a/docs", "recursive": true}),
    );
    let r = h.ok(k, "read", json!({"uris": [A_PLAN]}));
    assert_eq!(r["nodes"][0]["error"]["code"], "not_found");
    // Resources: ctx:// nodes at a layer.
    let res = h.rpc(
        k,
        "resources/read",
        json!({"uri": format!("{A_NOTE}?level=1")}),
    );
    assert_eq!(
        res["result"]["contents"][0]["text"], "user one prefers dark mode: the overview",
        "{res}"
    );
    let res = h.rpc(k, "resources/read", json!({"uri": A_NOTE}));
    assert_eq!(
        res["result"]["contents"][0]["text"],
        "user one prefers dark mode in detail"
    );
    let top = h.rpc(k, "resources/list", json!({}));
    let listed: Vec<&str> = top["result"]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r["uri"].as_str().expect("uri"))
        .collect();
    assert_eq!(listed, ["ctx://a"]);
    assert_eq!(top["result"].get("nextCursor"), None, "{top}");
    let bad = h.rpc(k, "resources/list", json!({"cursor": "zz"}));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    let t = h.rpc(k, "resources/templates/list", json!({}));
    assert!(
        t["result"]["resourceTemplates"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );
}

/// Key A against account b, tool by tool (every tool of [`TOOLS`] must have a case).
#[test]
fn account_a_cannot_reach_account_b_through_any_tool() {
    let h = H::new();
    let a = KEY_A;
    // A knowledge base of account b's, with one note (created by the admin).
    h.ok(
        KEY_ADMIN,
        "kb_create",
        json!({"name": "bdocs", "account": "b"}),
    );
    let added = h.ok(
        KEY_ADMIN,
        "kb_add",
        json!({"base": "bdocs", "inputs": [{"note": "bravo kb note"}]}),
    );
    let b_item = added["items"][0]["id"].as_str().expect("item").to_owned();
    let hidden = |res: Value| {
        let text = res.to_string();
        assert!(
            !text.contains("ctx://b") && !text.contains("bravo"),
            "account b leaked: {text}"
        );
    };
    for t in TOOLS {
        match t.name {
            "search" => {
                for mode in ["keyword", "vector", "hybrid", "hierarchical"] {
                    let r = h.ok(a, "search", json!({"query": "bravo confidential merger plans", "mode": mode, "detail": "content"}));
                    hidden(r);
                }
                h.fails(
                    a,
                    "search",
                    json!({"query": "bravo", "subtree": "ctx://b"}),
                    "forbidden",
                );
                h.fails(
                    a,
                    "search",
                    json!({"query": "bravo", "filters": {"parent_uri": "ctx://b/docs"}}),
                    "forbidden",
                );
                let theirs = h.ok(
                    KEY_B,
                    "search",
                    json!({"query": "bravo confidential merger plans", "mode": "keyword"}),
                );
                assert_eq!(uris(&theirs, "hits"), [B_SECRET]);
            }
            "read" => {
                let r = h.ok(
                    a,
                    "read",
                    json!({"uris": [B_SECRET, "ctx://b/docs/missing"]}),
                );
                let norm = |v: &Value| {
                    v.to_string()
                        .replace(B_SECRET, "U")
                        .replace("ctx://b/docs/missing", "U")
                };
                assert_eq!(
                    norm(&r["nodes"][0]),
                    norm(&r["nodes"][1]),
                    "a hidden node is told apart"
                );
                assert_eq!(r["nodes"][0]["error"]["code"], "not_found");
            }
            "list" => {
                let top = h.ok(a, "list", json!({}));
                assert_eq!(uris(&top, "children"), ["ctx://a"]);
                h.fails(a, "list", json!({"uri": "ctx://b"}), "not_found");
            }
            "tree" => {
                let all = h.ok(a, "tree", json!({"uri": "ctx://", "depth": 8}));
                hidden(all);
                h.fails(a, "tree", json!({"uri": "ctx://b"}), "not_found");
            }
            "write" => {
                h.fails(
                    a,
                    "write",
                    json!({"uri": B_SECRET, "content": "overwritten"}),
                    "forbidden",
                );
                h.fails(
                    a,
                    "write",
                    json!({"uri": "ctx://b/new", "content": "planted"}),
                    "forbidden",
                );
            }
            "edit" => {
                h.fails(
                    a,
                    "edit",
                    json!({"uri": B_SECRET, "old": "bravo", "new": "x"}),
                    "not_found",
                );
            }
            "move" => {
                h.fails(
                    a,
                    "move",
                    json!({"from": B_SECRET, "to": "ctx://a/stolen"}),
                    "forbidden",
                );
                h.fails(
                    a,
                    "move",
                    json!({"from": A_PLAN, "to": "ctx://b/planted"}),
                    "forbidden",
                );
            }
            "forget" => {
                h.fails(a, "forget", json!({"uri": B_SECRET}), "forbidden");
                h.fails(
                    a,
                    "forget",
                    json!({"uri": "ctx://b", "recursive": true}),
                    "forbidden",
                );
            }
            "link" => {
                h.fails(
                    a,
                    "link",
                    json!({"from": A_PLAN, "to": B_SECRET, "type": "peeks"}),
                    "forbidden",
                );
            }
            "related" => {
                let r = h.ok(a, "related", json!({"uri": A_PLAN, "direction": "both"}));
                assert_eq!(r["edges"].as_array().map(Vec::len), Some(1), "{r}");
                hidden(r);
                h.fails(a, "related", json!({"uri": B_SECRET}), "not_found");
            }
            "status" => {
                let s = h.ok(a, "status", json!({}));
                hidden(s);
            }
            "session_add" => {
                h.fails(
                    a,
                    "session_add",
                    json!({"uri": "ctx://b/users/u1/sessions/planted", "role": "user", "content": "x"}),
                    "forbidden",
                );
                let own = h.ok(
                    a,
                    "session_add",
                    json!({"uri": "ctx://a/users/u1/sessions/chat", "role": "user", "content": "I use Helix", "id": "q1"}),
                );
                assert_eq!(own["created"], true, "{own}");
                let again = h.ok(
                    a,
                    "session_add",
                    json!({"uri": "ctx://a/users/u1/sessions/chat", "role": "user", "content": "I use Helix", "id": "q1"}),
                );
                assert_eq!(again["created"], false, "{again}");
            }
            "session_commit" => {
                h.fails(
                    a,
                    "session_commit",
                    json!({"uri": "ctx://b/users/u1/sessions/planted"}),
                    "forbidden",
                );
            }
            // Admin only, as the knowledge-base routes: a tenant key gets forbidden (the
            // base below exists, so nothing is told apart by not_found).
            "kb_list" => {
                let m = h.fails(a, "kb_list", json!({}), "forbidden");
                assert!(m.contains("admin"), "{m}");
            }
            "kb_create" => {
                h.fails(
                    a,
                    "kb_create",
                    json!({"name": "mine", "account": "a"}),
                    "forbidden",
                );
            }
            "kb_add" => {
                h.fails(
                    a,
                    "kb_add",
                    json!({"base": "bdocs", "inputs": [{"note": "planted"}]}),
                    "forbidden",
                );
            }
            "kb_status" => {
                h.fails(a, "kb_status", json!({"base": "bdocs"}), "forbidden");
            }
            "kb_remove_items" => {
                h.fails(
                    a,
                    "kb_remove_items",
                    json!({"base": "bdocs", "items": [b_item.clone()]}),
                    "forbidden",
                );
            }
            "kb_reindex" => {
                h.fails(
                    a,
                    "kb_reindex",
                    json!({"base": "bdocs", "items": [b_item.clone()]}),
                    "forbidden",
                );
            }
            other => panic!(
                "no tenant-isolation case for tool {other}: add one in {}",
                file!()
            ),
        }
    }
    // Resources too.
    let r = h.rpc(a, "resources/read", json!({"uri": B_SECRET}));
    let missing = h.rpc(
        KEY_ADMIN,
        "resources/read",
        json!({"uri": "ctx://b/docs/missing"}),
    );
    assert_eq!(r["error"]["data"]["code"], "not_found", "{r}");
    assert_eq!(
        r.to_string().replace(B_SECRET, "U"),
        missing.to_string().replace("ctx://b/docs/missing", "U"),
        "a hidden resource is told apart"
    );
    let top = h.rpc(a, "resources/list", json!({}));
    hidden(top);
    // Nothing of b changed.
    let st = h.ok(KEY_ADMIN, "kb_status", json!({"base": "bdocs"}));
    assert_eq!(st["total"], 1, "{st}");
    assert_eq!(st["items"][0]["id"], b_item.as_str());
    let theirs = h.ok(KEY_B, "read", json!({"uris": [B_SECRET]}));
    assert_eq!(
        theirs["nodes"][0]["text"],
        "bravo confidential merger plans in detail"
    );
}

/// Hits' URIs of an MCP search for `query` in `mode` below `subtree`.
fn found(h: &H, query: &str, mode: &str, subtree: &str) -> Vec<String> {
    let r = h.ok(
        KEY_ADMIN,
        "search",
        json!({"query": query, "mode": mode, "subtree": subtree}),
    );
    uris(&r, "hits")
}

#[test]
fn knowledge_base_tools_index_find_and_remove_items() {
    let docs = tempfile::tempdir().expect("docs");
    let allowed = docs.path().display().to_string();
    let file = docs.path().join("capybara.md");
    std::fs::write(
        &file,
        "# Capybaras\n\nCapybaras graze on riverbank grasses at dusk.\n",
    )
    .expect("file");
    let outside = tempfile::tempdir().expect("outside");
    let stray = outside.path().join("stray.md");
    std::fs::write(&stray, "not to be read").expect("stray");
    let h = H::with(&format!("[ingest]\nallowed_paths = [\"{allowed}\"]\n"));
    let k = KEY_ADMIN;
    let empty = h.ok(k, "kb_list", json!({}));
    assert_eq!(empty["bases"], json!([]), "{empty}");
    assert_eq!(empty["active_jobs"]["kb-index-documents"], 0, "{empty}");

    let base = h.ok(k, "kb_create", json!({"name": "docs", "account": "a"}));
    assert_eq!(base["root"], "ctx://a/resources/docs");
    let root = "ctx://a/resources/docs";
    h.fails(
        k,
        "kb_create",
        json!({"name": "docs", "account": "a"}),
        "already_exists",
    );
    let m = h.fails(k, "kb_create", json!({"name": "Bad Name"}), "invalid_field");
    assert!(m.contains("name"), "{m}");
    let m = h.fails(
        k,
        "kb_create",
        json!({"name": "x", "settings": {"max_tokens": 4}}),
        "invalid_field",
    );
    assert!(m.contains("max_tokens"), "{m}");

    // Bad inputs: each refused with a typed error, nothing added.
    let m = h.fails(
        k,
        "kb_add",
        json!({"base": "docs", "inputs": [{"path": stray.display().to_string()}]}),
        "invalid_field",
    );
    assert!(m.contains("allowed_paths") && m.contains(&allowed), "{m}");
    let m = h.fails(
        k,
        "kb_add",
        json!({"base": "docs", "inputs": [{"path": format!("{allowed}/../stray.md")}]}),
        "invalid_field",
    );
    assert!(m.contains("allowed_paths"), "{m}");
    h.fails(
        k,
        "kb_add",
        json!({"base": "docs", "inputs": [{"note": "a", "url": "https://example.com"}]}),
        "invalid_field",
    );
    let m = h.fails(
        k,
        "kb_add",
        json!({"base": "docs", "inputs": []}),
        "invalid_field",
    );
    assert!(m.contains("`inputs`"), "{m}");
    let m = h.fails(
        k,
        "kb_add",
        json!({"base": "docs", "inputs": [{"text": "x"}]}),
        "invalid_field",
    );
    assert!(m.contains("`inputs[0].text`"), "{m}");
    h.fails(
        k,
        "kb_add",
        json!({"base": "nope", "inputs": [{"note": "x"}]}),
        "not_found",
    );
    assert_eq!(h.ok(k, "kb_status", json!({"base": "docs"}))["total"], 0);

    // A file under allowed_paths and a note: added, then indexed by the jobs.
    let added = h.ok(
        k,
        "kb_add",
        json!({"base": "docs", "inputs": [
            {"path": file.display().to_string()},
            {"note": "Okapis browse on forest leaves in the Congo.", "name": "okapi"}]}),
    );
    let items = added["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{added}");
    let id = |i: usize| items[i]["id"].as_str().expect("id").to_owned();
    let (file_item, note_item) = (id(0), id(1));
    assert_eq!(items[0]["kind"], "file");
    assert_eq!(items[1]["node_uri"], "ctx://a/resources/docs/okapi");
    let jobs: Vec<String> = added["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j.as_str().expect("job").to_owned())
        .collect();
    assert_eq!(jobs.len(), 2);
    let listed = h.ok(k, "kb_list", json!({}));
    assert_eq!(listed["active_jobs"]["kb-index-documents"], 2, "{listed}");
    let under_way = h.ok(k, "kb_status", json!({"base": "docs"}));
    assert_eq!(under_way["done"], 0, "{under_way}");
    assert_eq!(under_way["counts"]["idle"], 2, "{under_way}");
    let roots = [file_item.clone(), note_item.clone()];
    let f =
        h.0.engine
            .kb_follow("docs", &roots, &jobs, &|_| {})
            .expect("follow");
    assert!(f.progress.finished, "{f:?}");

    let st = h.ok(k, "kb_status", json!({"base": "docs"}));
    assert_eq!(
        (st["done"].clone(), st["total"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(st["counts"]["completed"], 2, "{st}");
    assert_eq!(st["truncated"], false);
    let failed = h.ok(k, "kb_status", json!({"base": "docs", "status": "failed"}));
    assert_eq!(failed["items"], json!([]));
    assert_eq!(failed["items_matched"], 0);
    let one = h.ok(k, "kb_status", json!({"base": "docs", "limit": 1}));
    assert_eq!(one["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        (one["items_matched"].clone(), one["truncated"].clone()),
        (json!(2), json!(true))
    );
    h.fails(
        k,
        "kb_status",
        json!({"base": "docs", "status": "deleting"}),
        "invalid_field",
    );
    h.fails(
        k,
        "kb_status",
        json!({"base": "docs", "item": "nope"}),
        "not_found",
    );
    let listed = h.ok(k, "kb_list", json!({}));
    assert_eq!(listed["bases"][0]["name"], "docs");
    assert_eq!(listed["bases"][0]["counts"]["completed"], 2, "{listed}");
    assert_eq!(listed["active_jobs"]["kb-index-documents"], 0, "{listed}");

    // Findable by search: flat and hierarchical.
    let file_node = format!("{root}/capybara.md");
    let okapi = format!("{root}/okapi");
    let within = |hits: &[String], node: &str| hits.iter().any(|u| u.starts_with(node));
    assert!(within(
        &found(&h, "capybaras graze riverbank", "keyword", root),
        &file_node
    ));
    assert!(within(
        &found(&h, "okapis browse forest leaves", "hybrid", root),
        &okapi
    ));
    assert!(within(
        &found(&h, "okapis browse forest leaves", "hierarchical", root),
        &okapi
    ));

    // Removed: gone from every search mode and the status at once, before the cleanup job.
    let rm = h.ok(
        k,
        "kb_remove_items",
        json!({"base": "docs", "items": [note_item.clone()]}),
    );
    assert_eq!(rm["roots"], json!([note_item.clone()]));
    for mode in ["keyword", "vector", "hybrid", "hierarchical"] {
        let hits = found(&h, "okapis browse forest leaves", mode, root);
        assert!(!within(&hits, &okapi), "{mode}: {hits:?}");
    }
    let st = h.ok(k, "kb_status", json!({"base": "docs"}));
    assert_eq!(st["total"], 1, "{st}");
    assert_eq!(st["counts"]["deleting"], 1, "{st}");
    h.fails(
        k,
        "kb_remove_items",
        json!({"base": "docs", "items": ["nope"]}),
        "not_found",
    );

    // Reindex: accepted for a terminal item (asking again before it ran is the same job),
    // refused for unknown ones; the unchanged file stays findable.
    let again = h.ok(
        k,
        "kb_reindex",
        json!({"base": "docs", "items": [file_item.clone()]}),
    );
    let jobs: Vec<String> = again["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j.as_str().expect("job").to_owned())
        .collect();
    assert_eq!(jobs.len(), 1, "{again}");
    let twice = h.ok(
        k,
        "kb_reindex",
        json!({"base": "docs", "items": [file_item.clone()]}),
    );
    assert_eq!(twice["jobs"], again["jobs"], "one job for both");
    h.fails(
        k,
        "kb_reindex",
        json!({"base": "docs", "items": ["nope"]}),
        "not_found",
    );
    let f =
        h.0.engine
            .kb_follow("docs", &[file_item.clone(), note_item], &jobs, &|_| {})
            .expect("follow");
    assert!(f.progress.finished, "{f:?}");
    let st = h.ok(k, "kb_status", json!({"base": "docs"}));
    assert_eq!(st["counts"]["completed"], 1, "{st}");
    assert_eq!(st["counts"]["deleting"], 0, "the cleanup ran: {st}");
    assert!(within(
        &found(&h, "capybaras graze riverbank", "keyword", root),
        &file_node
    ));
}
