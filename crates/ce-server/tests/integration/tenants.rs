//! Tenants: with two accounts `a` and `b`, key A cannot read, list, search, relate, write,
//! move, link or remove anything of `b` through any route; an admin sees everything; a key
//! restricted to owner spaces sees only those. Every route of [`ROUTES`] must have a case in
//! [`isolation`], so a new route cannot ship without its scoping being tested. The MCP
//! endpoint `/mcp` (not a row of the table) has the same walk over its tools in `mcp.rs`.

use axum::body::Body;
use axum::http::{Request, header};
use ce_server::http::{Access, ROUTES, Route};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::common::TestApp;

const KEY_A: &str = "key-of-account-a-00000001";
const KEY_B: &str = "key-of-account-b-00000001";
const KEY_A_U1: &str = "key-of-a-user-u1-00000001";
const KEY_ADMIN: &str = "key-of-the-admin-00000001";
const ADMIN_ENV: &str = "CE_TEST_TENANTS_ADMIN_KEY";

const A_PLAN: &str = "ctx://a/docs/plan";
const A_U1: &str = "ctx://a/users/u1/memories/note";
const A_U2: &str = "ctx://a/users/u2/memories/note";
const B_SECRET: &str = "ctx://b/docs/secret";
const B_U1: &str = "ctx://b/users/u1/memories/note";
const B_SESSION: &str = "ctx://b/users/u1/sessions/chat";

/// The shared fixture, seeded with both accounts' nodes and edges.
struct H(TestApp);

/// An answer: status, `WWW-Authenticate` header, JSON body (text as a JSON string).
struct A {
    status: u16,
    challenge: Option<String>,
    body: Value,
}

fn keys_toml() -> String {
    format!(
        "[index.embedding]\nprovider = \"hash\"\n\
         [[server.api_keys]]\nkey = \"{KEY_A}\"\naccount_id = \"a\"\n\
         [[server.api_keys]]\nkey = \"{KEY_B}\"\naccount_id = \"b\"\n\
         [[server.api_keys]]\nkey = \"{KEY_A_U1}\"\naccount_id = \"a\"\nowner_spaces = [\"user:u1\"]\n\
         [[server.api_keys]]\nkey_env = \"{ADMIN_ENV}\"\nadmin = true\n"
    )
}

impl H {
    fn new(toml: &str) -> Self {
        let t = TestApp::open(toml, Some((ADMIN_ENV, KEY_ADMIN)));
        t.put(A_PLAN, "alpha quarterly roadmap planning", None);
        t.put(A_U1, "user one prefers dark mode", None);
        t.put(A_U2, "user two salary figures", None);
        t.put(B_SECRET, "bravo confidential merger plans", None);
        t.put(B_U1, "bravo user one prefers light mode", None);
        // Cross-account edges only an admin can make; tenants must never see their far end.
        t.link(A_PLAN, B_SECRET);
        t.link(B_SECRET, A_PLAN);
        t.link(A_PLAN, A_U1);
        t.link(A_PLAN, A_U2);
        t.engine
            .sessions()
            .create(&super::common::u(B_SESSION), None)
            .expect("b's session");
        t.drain();
        H(t)
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>, key: Option<&str>) -> A {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(k) = key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let req = match body {
            Some(b) => req
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .expect("request");
        let app = self.0.app.clone();
        self.0.rt.block_on(async move {
            let res = app.oneshot(req).await.expect("infallible");
            let status = res.status().as_u16();
            let challenge = res
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = axum::body::to_bytes(res.into_body(), 1 << 26)
                .await
                .expect("body");
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            A {
                status,
                challenge,
                body,
            }
        })
    }

    fn get(&self, key: Option<&str>, path: &str) -> A {
        self.call("GET", path, None, key)
    }

    fn post(&self, key: Option<&str>, path: &str, body: &Value) -> A {
        self.call("POST", path, Some(body), key)
    }

    /// Asserts `status` and, for an error, `code`; returns the body.
    fn expect(&self, a: A, status: u16, code: Option<&str>, what: &str) -> Value {
        assert_eq!(a.status, status, "{what}: {}", a.body);
        if let Some(c) = code {
            assert_eq!(a.body["code"], c, "{what}: {}", a.body);
            assert_eq!(a.body["retryable"], false, "{what}: {}", a.body);
            assert!(a.body["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
        a.body
    }

    /// `GET path` as key A, expecting `404 not_found` with exactly the answer of a node that
    /// does not exist (`missing` is such a URI of account b, seen by the admin).
    fn hidden(&self, path: &str, uri: &str, missing: &str) {
        let a = self.get(Some(KEY_A), &format!("{path}?uri={uri}"));
        let body = self.expect(a, 404, Some("not_found"), &format!("A {path} {uri}"));
        let miss = self.get(Some(KEY_ADMIN), &format!("{path}?uri={missing}"));
        let miss = self.expect(
            miss,
            404,
            Some("not_found"),
            &format!("admin {path} {missing}"),
        );
        let norm = |v: &Value, uri: &str| v.to_string().replace(uri, "URI");
        assert_eq!(
            norm(&body, uri),
            norm(&miss, missing),
            "{path}: a hidden node is told apart"
        );
    }

    /// The URIs of an array of node stats (or of `hits`).
    fn uris(v: &Value) -> Vec<String> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|s| s["uri"].as_str().expect("uri").to_owned())
            .collect()
    }

    fn exists(&self, uri: &str) -> bool {
        self.get(Some(KEY_ADMIN), &format!("/v1/stat?uri={uri}"))
            .status
            == 200
    }

    fn search(&self, key: &str, body: Value) -> A {
        self.post(Some(key), "/v1/search", &body)
    }
}

fn search_uris(v: &Value) -> Vec<String> {
    H::uris(&v["hits"])
}

/// What every route does without a key, with an unknown key, and (admin routes) with a
/// tenant key.
fn gate(h: &H, r: &Route) {
    let what = format!("{r:?}");
    let send = |key: Option<&str>| match r.method.as_str() {
        "GET" => h.get(key, r.path),
        _ => h.post(key, r.path, &json!({})),
    };
    match r.access {
        Access::Open => {
            let a = send(None);
            assert!(!matches!(a.status, 401 | 403), "{what}: {}", a.body);
        }
        Access::Tenant | Access::Admin => {
            for key in [None, Some("key-nobody-knows-000000")] {
                let a = send(key);
                assert_eq!(a.challenge.as_deref(), Some("Bearer"), "{what}");
                h.expect(a, 401, Some("unauthenticated"), &what);
            }
            let a = send(Some(KEY_ADMIN));
            assert!(
                !matches!(a.status, 401 | 403),
                "{what} as admin: {}",
                a.body
            );
            if r.access == Access::Admin {
                for key in [KEY_A, KEY_A_U1] {
                    h.expect(send(Some(key)), 403, Some("forbidden"), &what);
                }
            }
        }
    }
}

/// Key A against account b's nodes, route by route.
fn isolation(h: &H, r: &Route) {
    let a = Some(KEY_A);
    let admin = Some(KEY_ADMIN);
    let what = format!("{r:?}");
    match (r.method.as_str(), r.path) {
        ("POST", "/v1/put") => {
            for uri in [B_SECRET, "ctx://b/new", "ctx://b"] {
                let body = json!({"uri": uri, "content": "overwritten by a"});
                h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            }
            assert!(!h.exists("ctx://b/new"));
            let cat = h.get(admin, &format!("/v1/cat?uri={B_SECRET}"));
            assert_eq!(
                cat.body["text"],
                "bravo confidential merger plans in detail"
            );
            let own = json!({"uri": "ctx://a/docs/own", "content": "mine"});
            h.expect(h.post(a, r.path, &own), 200, None, &what);
        }
        ("GET", "/v1/cat") => {
            h.hidden(r.path, B_SECRET, "ctx://b/docs/missing");
            h.expect(h.get(a, &format!("/v1/cat?uri={A_PLAN}")), 200, None, &what);
        }
        ("GET", "/v1/stat") => {
            h.hidden(r.path, B_SECRET, "ctx://b/docs/missing");
            h.hidden(r.path, "ctx://b", "ctx://zz");
        }
        ("GET", "/v1/ls") => {
            h.hidden(r.path, "ctx://b", "ctx://zz");
            h.hidden(r.path, "ctx://b/docs", "ctx://b/nothing");
            let root = h.expect(h.get(a, r.path), 200, None, &what);
            assert_eq!(H::uris(&root), ["ctx://a"]);
            let root = h.expect(h.get(admin, r.path), 200, None, &what);
            assert_eq!(H::uris(&root), ["ctx://a", "ctx://b"]);
        }
        ("GET", "/v1/tree") => {
            h.hidden(r.path, "ctx://b", "ctx://zz");
            let all = h.expect(h.get(a, "/v1/tree?uri=ctx://"), 200, None, &what);
            let all = H::uris(&all);
            assert!(all.contains(&A_U2.to_owned()), "{all:?}");
            assert!(all.iter().all(|u| u.starts_with("ctx://a")), "{all:?}");
            let top = h.expect(h.get(a, "/v1/tree?uri=ctx://&depth=1"), 200, None, &what);
            assert_eq!(H::uris(&top), ["ctx://a"]);
            let none = h.expect(h.get(a, "/v1/tree?uri=ctx://&depth=0"), 200, None, &what);
            assert_eq!(H::uris(&none), Vec::<String>::new());
            let every = h.expect(h.get(admin, "/v1/tree?uri=ctx://"), 200, None, &what);
            assert!(H::uris(&every).contains(&B_SECRET.to_owned()));
        }
        ("POST", "/v1/rm") => {
            for (uri, recursive) in [
                (B_SECRET, false),
                ("ctx://b", true),
                ("ctx://b/none", false),
            ] {
                let body = json!({"uri": uri, "recursive": recursive});
                h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            }
            assert!(h.exists(B_SECRET));
        }
        ("POST", "/v1/mv") => {
            for (from, to) in [
                (B_SECRET, "ctx://a/stolen"),
                (A_PLAN, "ctx://b/docs/planted"),
            ] {
                let body = json!({"from": from, "to": to});
                h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            }
            assert!(h.exists(B_SECRET) && h.exists(A_PLAN));
            assert!(!h.exists("ctx://a/stolen") && !h.exists("ctx://b/docs/planted"));
        }
        ("POST", "/v1/link") => {
            for (from, to) in [(A_PLAN, B_U1), (B_U1, A_PLAN), (B_U1, B_SECRET)] {
                let body = json!({"from": from, "to": to, "type": "peeks"});
                h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            }
            let rel = h.get(admin, &format!("/v1/relations?uri={B_U1}")).body;
            assert_eq!(rel, json!({"outgoing": [], "incoming": []}));
        }
        ("POST", "/v1/unlink") => {
            for (from, to) in [(A_PLAN, B_SECRET), (B_SECRET, A_PLAN)] {
                let body = json!({"from": from, "to": to, "type": "references"});
                h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            }
            let rel = h.get(admin, &format!("/v1/relations?uri={B_SECRET}")).body;
            assert_eq!(rel["outgoing"].as_array().map(Vec::len), Some(1), "{rel}");
            assert_eq!(rel["incoming"].as_array().map(Vec::len), Some(1), "{rel}");
        }
        ("GET", "/v1/relations") => {
            h.hidden(r.path, B_SECRET, "ctx://b/docs/missing");
            let rel = h.get(a, &format!("/v1/relations?uri={A_PLAN}")).body;
            let ends = |dir: &str, end: &str| -> Vec<String> {
                rel[dir]
                    .as_array()
                    .expect("edges")
                    .iter()
                    .map(|e| e[end].as_str().expect("uri").to_owned())
                    .collect()
            };
            assert_eq!(ends("outgoing", "to_uri"), [A_U1, A_U2], "{rel}");
            assert_eq!(ends("incoming", "from_uri"), Vec::<String>::new(), "{rel}");
            let all = h.get(admin, &format!("/v1/relations?uri={A_PLAN}")).body;
            assert_eq!(all["outgoing"].as_array().map(Vec::len), Some(3), "{all}");
            assert_eq!(all["incoming"].as_array().map(Vec::len), Some(1), "{all}");
        }
        ("GET", "/v1/related") => {
            h.hidden(r.path, B_SECRET, "ctx://b/docs/missing");
            let others = |key: Option<&str>, dir: &str| -> Vec<String> {
                let path = format!("/v1/related?uri={A_PLAN}&direction={dir}");
                let v = h.expect(h.get(key, &path), 200, None, &what);
                v["edges"]
                    .as_array()
                    .expect("edges")
                    .iter()
                    .map(|e| e["other"].as_str().expect("uri").to_owned())
                    .collect()
            };
            assert_eq!(others(a, "out"), [A_U1, A_U2]);
            assert_eq!(others(a, "in"), Vec::<String>::new());
            let mut all = others(admin, "both");
            all.sort();
            assert_eq!(all, [A_U1, A_U2, B_SECRET, B_SECRET]);
        }
        ("POST", "/v1/search") => {
            let q = "bravo confidential merger plans";
            let hits = h.expect(h.search(KEY_A, json!({"query": q})), 200, None, &what);
            let hits = search_uris(&hits);
            assert!(!hits.is_empty());
            // Account a's nodes only (its account node included).
            assert!(
                hits.iter()
                    .all(|u| u.starts_with("ctx://a/") || u == "ctx://a"),
                "{hits:?}"
            );
            let every = h.expect(h.search(KEY_ADMIN, json!({"query": q})), 200, None, &what);
            // The admin key sees b's secret.
            assert!(search_uris(&every).iter().any(|u| u == B_SECRET), "{every}");
            let theirs = h.expect(h.search(KEY_B, json!({"query": q})), 200, None, &what);
            assert!(
                search_uris(&theirs)
                    .iter()
                    .all(|u| u.starts_with("ctx://b/") || u == "ctx://b")
            );
            for body in [
                json!({"query": q, "account_id": "b"}),
                json!({"query": q, "subtree": "ctx://b"}),
                json!({"query": q, "parent_uri": "ctx://b/docs"}),
            ] {
                h.expect(h.search(KEY_A, body), 403, Some("forbidden"), &what);
            }
            let own = json!({"query": q, "account_id": "a", "subtree": "ctx://a"});
            h.expect(h.search(KEY_A, own), 200, None, &what);
            // Explained: the dropped candidates are the caller's own too.
            let explained = json!({"query": q, "explain": true});
            let v = h.expect(h.search(KEY_A, explained), 200, None, &what);
            for d in v["dropped"].as_array().into_iter().flatten() {
                assert!(
                    d["uri"].as_str().is_some_and(|u| u.starts_with("ctx://a")),
                    "{v}"
                );
            }
            // Hierarchical mode on the same route: the descent never leaves the account.
            let tree = json!({"query": q, "mode": "hierarchical"});
            let hits = h.expect(h.search(KEY_A, tree.clone()), 200, None, &what);
            let hits = search_uris(&hits);
            // Account a's nodes only (its account node included).
            assert!(
                hits.iter()
                    .all(|u| u.starts_with("ctx://a/") || u == "ctx://a"),
                "{hits:?}"
            );
            let every = h.expect(h.search(KEY_ADMIN, tree), 200, None, &what);
            assert!(search_uris(&every).contains(&B_SECRET.to_owned()));
            let escape = json!({"query": q, "mode": "hierarchical", "subtree": "ctx://b"});
            h.expect(h.search(KEY_A, escape), 403, Some("forbidden"), &what);
        }
        ("GET", "/v1/children") => {
            h.hidden(r.path, "ctx://b", "ctx://zz");
            h.hidden(r.path, "ctx://b/docs", "ctx://b/nothing");
            let kids = |key, uri: &str| {
                let v = h.expect(
                    h.get(key, &format!("{}?uri={uri}", r.path)),
                    200,
                    None,
                    &what,
                );
                H::uris(&v["children"])
            };
            let root = h.expect(h.get(a, r.path), 200, None, &what);
            assert_eq!(H::uris(&root["children"]), ["ctx://a"], "{root}");
            assert_eq!(root["total"], 1, "{root}");
            assert_eq!(kids(admin, "ctx://"), ["ctx://a", "ctx://b"]);
            assert!(kids(a, "ctx://a/docs").contains(&A_PLAN.to_owned()));
            // A key restricted to user:u1 lists nothing of the shared space.
            let u1 = kids(Some(KEY_A_U1), "ctx://a");
            assert!(!u1.contains(&"ctx://a/docs".to_owned()), "{u1:?}");
            assert_eq!(
                kids(a, "ctx://a/users"),
                ["ctx://a/users/u1", "ctx://a/users/u2"]
            );
        }
        ("GET", "/v1/records") => {
            h.hidden(r.path, B_SECRET, "ctx://b/docs/missing");
            let own = h.get(a, &format!("/v1/records?uri={A_PLAN}"));
            let own = h.expect(own, 200, None, &what);
            assert_eq!(own["uri"], A_PLAN, "{own}");
            let u2 = h.get(Some(KEY_A_U1), &format!("/v1/records?uri={A_U2}"));
            h.expect(u2, 404, Some("not_found"), &what);
        }
        ("GET", "/v1/outbox/list" | "/v1/outbox/stats" | "/v1/status" | "/v1/status/lag") => {
            h.expect(h.get(a, r.path), 403, Some("forbidden"), &what);
            h.expect(h.get(admin, r.path), 200, None, &what);
        }
        ("GET", "/v1/outbox/show") => {
            h.expect(
                h.get(a, "/v1/outbox/show?id=1"),
                403,
                Some("forbidden"),
                &what,
            );
            h.expect(h.get(admin, "/v1/outbox/show?id=1"), 200, None, &what);
        }
        ("POST", "/v1/outbox/append") => {
            let body = json!({"type": "DELETE_CONTEXT", "payload": {"uri": B_SECRET}});
            h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
        }
        ("POST", "/v1/reindex") => {
            h.expect(h.post(a, r.path, &json!({})), 403, Some("forbidden"), &what);
            let queued = json!({"consumer": "keyword", "no_wait": true});
            h.expect(h.post(a, r.path, &queued), 403, Some("forbidden"), &what);
        }
        ("GET" | "POST", path) if path.starts_with("/v1/kb") => {
            // Knowledge bases are admin only (they read the server's files and URLs): a
            // tenant key can neither see one of account b's nor add to it.
            let path = path.replace("{base}", "b-docs");
            let send = |key| match r.method.as_str() {
                "GET" => h.get(key, &path),
                _ => h.post(
                    key,
                    &path,
                    &json!({"inputs": [{"note": "x"}], "items": ["i"]}),
                ),
            };
            h.expect(send(a), 403, Some("forbidden"), &what);
            if path == "/v1/kb" {
                let bases = h.expect(send(admin), 200, None, &what);
                assert!(bases.is_array(), "{bases}");
            }
        }
        ("GET", "/v1/jobs") => {
            h.expect(h.get(a, r.path), 403, Some("forbidden"), &what);
            let jobs = h.expect(h.get(admin, r.path), 200, None, &what);
            assert!(jobs.is_array(), "{jobs}");
        }
        ("GET" | "POST", "/v1/jobs/{id}" | "/v1/jobs/{id}/cancel" | "/v1/jobs/{id}/retry") => {
            // A queued job of the admin's: a tenant key can neither see nor change it.
            let queued = json!({"consumer": "keyword", "no_wait": true});
            let q = h.expect(h.post(admin, "/v1/reindex", &queued), 200, None, &what);
            assert_eq!(q["job"]["state"], "pending", "{q}");
            let id = q["job_id"].as_str().expect("job_id").to_owned();
            let cancel = format!("/v1/jobs/{id}/cancel");
            let (path, expected) = match r.path.rsplit('/').next() {
                Some("cancel") => (cancel.clone(), "cancelled"),
                Some("retry") => {
                    h.expect(h.post(admin, &cancel, &json!({})), 200, None, &what);
                    (format!("/v1/jobs/{id}/retry"), "pending")
                }
                _ => (format!("/v1/jobs/{id}"), "pending"),
            };
            let send = |key: Option<&str>| match r.method.as_str() {
                "GET" => h.get(key, &path),
                _ => h.post(key, &path, &json!({})),
            };
            h.expect(send(a), 403, Some("forbidden"), &what);
            let answer = h.expect(send(admin), 200, None, &what);
            assert_eq!(
                (answer["id"].as_str(), answer["state"].as_str()),
                (Some(id.as_str()), Some(expected)),
                "{what}: {answer}"
            );
            if expected == "pending" {
                // No queued job is left for the next case.
                h.expect(h.post(admin, &cancel, &json!({})), 200, None, &what);
            }
        }
        ("POST", "/v1/repair/dead") => {
            let count = json!({"action": "count", "filter": {"subtree": "ctx://b"}});
            h.expect(h.post(a, r.path, &count), 403, Some("forbidden"), &what);
            let force = json!({"action": "force_done", "confirm": true});
            h.expect(h.post(a, r.path, &force), 403, Some("forbidden"), &what);
            let counted = h.expect(h.post(admin, r.path, &count), 200, None, &what);
            assert_eq!(counted["total"], 0, "{counted}");
        }
        ("POST", "/v1/repair/reconcile") => {
            let body = json!({"subtree": "ctx://b", "dry_run": true});
            h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            let report = h.expect(h.post(admin, r.path, &body), 200, None, &what);
            assert_eq!(report["emitted"], 0, "{report}");
        }
        ("POST", "/v1/sessions/new") => {
            let body = json!({"uri": "ctx://b/users/u1/sessions/planted"});
            h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            assert!(!h.exists("ctx://b/users/u1/sessions/planted"));
            let own = json!({"uri": "ctx://a/users/u1/sessions/own"});
            h.expect(h.post(a, r.path, &own), 200, None, &what);
        }
        ("POST", "/v1/sessions/add") => {
            let body = json!({"uri": B_SESSION, "role": "user", "content": "planted by a"});
            h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
            let shown = h
                .get(admin, &format!("/v1/sessions/show?uri={B_SESSION}"))
                .body;
            assert_eq!(shown["messages"], json!([]), "{shown}");
        }
        ("POST", "/v1/sessions/commit") => {
            let body = json!({"uri": B_SESSION});
            h.expect(h.post(a, r.path, &body), 403, Some("forbidden"), &what);
        }
        ("GET", "/v1/sessions/show") => {
            let a_show = h.get(a, &format!("{}?uri={B_SESSION}", r.path));
            assert!(
                matches!(a_show.status, 403 | 404),
                "{what}: {}",
                a_show.body
            );
            h.expect(
                h.get(admin, &format!("{}?uri={B_SESSION}", r.path)),
                200,
                None,
                &what,
            );
        }
        ("GET", "/v1/sessions/ls") => {
            let mine = h.expect(h.get(a, r.path), 200, None, &what);
            assert!(
                H::uris(&mine).iter().all(|u| u.starts_with("ctx://a/")),
                "{mine}"
            );
            let theirs = h.get(a, &format!("{}?uri=ctx://b", r.path));
            assert!(
                matches!(theirs.status, 403 | 404),
                "{what}: {}",
                theirs.body
            );
            let all = h.expect(h.get(admin, r.path), 200, None, &what);
            assert!(H::uris(&all).contains(&B_SESSION.to_owned()), "{all}");
        }
        ("GET", "/metrics") => {
            h.expect(h.get(a, r.path), 403, Some("forbidden"), &what);
        }
        ("GET", "/healthz" | "/readyz" | "/openapi.json") => {
            h.expect(h.get(None, r.path), 200, None, &what);
        }
        _ => panic!(
            "no tenant-isolation case for {what}: add one to `isolation` in {}",
            file!()
        ),
    }
}

#[test]
fn account_a_cannot_reach_account_b_through_any_route() {
    let h = H::new(&keys_toml());
    assert!(!ROUTES.is_empty());
    for r in ROUTES {
        gate(&h, r);
        isolation(&h, r);
    }
    // The router serves the table and nothing else.
    let unknown = h.get(Some(KEY_ADMIN), "/v1/unknown");
    h.expect(unknown, 404, Some("not_found"), "unknown route");
}

#[test]
fn owner_spaces_hide_nodes_within_the_account() {
    let h = H::new(&keys_toml());
    let k = Some(KEY_A_U1);
    // Reads.
    h.expect(
        h.get(k, &format!("/v1/cat?uri={A_U1}")),
        200,
        None,
        "own space",
    );
    for uri in [A_U2, A_PLAN, B_U1] {
        let a = h.get(k, &format!("/v1/cat?uri={uri}"));
        h.expect(a, 404, Some("not_found"), uri);
    }
    // Listings: the account is a valid start, only the key's space is listed.
    let tree = h.expect(h.get(k, "/v1/tree?uri=ctx://a"), 200, None, "tree");
    assert_eq!(
        H::uris(&tree),
        ["ctx://a/users/u1", "ctx://a/users/u1/memories", A_U1]
    );
    let root = h.expect(h.get(k, "/v1/tree?uri=ctx://"), 200, None, "tree root");
    assert_eq!(H::uris(&root), H::uris(&tree));
    h.expect(
        h.get(k, "/v1/ls?uri=ctx://a/users/u2"),
        404,
        Some("not_found"),
        "ls u2",
    );
    // Relations: the shared plan is hidden, and so is its edge into u1's note.
    h.expect(
        h.get(k, &format!("/v1/relations?uri={A_PLAN}")),
        404,
        Some("not_found"),
        "rel",
    );
    let rel = h.expect(
        h.get(k, &format!("/v1/relations?uri={A_U1}")),
        200,
        None,
        "rel u1",
    );
    assert_eq!(rel, json!({"outgoing": [], "incoming": []}));
    // Search: only the key's space, whatever the body asks.
    let hits = h.expect(
        h.search(KEY_A_U1, json!({"query": "user two salary figures"})),
        200,
        None,
        "search",
    );
    let hits = search_uris(&hits);
    assert!(
        hits.iter().all(|u| u.starts_with("ctx://a/users/u1/")),
        "{hits:?}"
    );
    let other = json!({"query": "salary", "owner_space": ["user:u2"]});
    h.expect(
        h.search(KEY_A_U1, other),
        403,
        Some("forbidden"),
        "search u2",
    );
    // Writes.
    let w = |path: &str, body: Value, status: u16, code: Option<&str>| {
        let what = format!("{path} {body}");
        h.expect(h.post(k, path, &body), status, code, &what);
    };
    w(
        "/v1/put",
        json!({"uri": "ctx://a/users/u2/memories/x", "content": "x"}),
        403,
        Some("forbidden"),
    );
    w(
        "/v1/put",
        json!({"uri": A_U2, "content": "x", "owner_space": "user:u1"}),
        403,
        Some("forbidden"),
    );
    w(
        "/v1/put",
        json!({"uri": "ctx://a/users/u1/memories/y", "content": "y", "owner_space": "shared"}),
        403,
        Some("forbidden"),
    );
    w("/v1/rm", json!({"uri": A_U2}), 404, Some("not_found"));
    w(
        "/v1/rm",
        json!({"uri": "ctx://a/users", "recursive": true}),
        404,
        Some("not_found"),
    );
    w(
        "/v1/mv",
        json!({"from": A_U1, "to": "ctx://a/users/u2/memories/mine"}),
        403,
        Some("forbidden"),
    );
    w(
        "/v1/link",
        json!({"from": A_U1, "to": A_U2, "type": "peeks"}),
        404,
        Some("not_found"),
    );
    assert!(h.exists(A_U2) && h.exists(A_U1));
    // Its own space works end to end.
    w(
        "/v1/put",
        json!({"uri": "ctx://a/users/u1/memories/y", "content": "y"}),
        200,
        None,
    );
    w(
        "/v1/mv",
        json!({"from": "ctx://a/users/u1/memories/y", "to": "ctx://a/users/u1/memories/z"}),
        200,
        None,
    );
    w(
        "/v1/link",
        json!({"from": A_U1, "to": "ctx://a/users/u1/memories/z", "type": "sees"}),
        200,
        None,
    );
    w(
        "/v1/rm",
        json!({"uri": "ctx://a/users/u1/memories/z"}),
        200,
        None,
    );
}

#[test]
fn without_keys_every_caller_is_the_admin() {
    let h = H::new("[index.embedding]\nprovider = \"hash\"\n");
    let root = h.expect(h.get(None, "/v1/ls"), 200, None, "ls");
    assert_eq!(H::uris(&root), ["ctx://a", "ctx://b"]);
    h.expect(
        h.get(None, &format!("/v1/cat?uri={B_SECRET}")),
        200,
        None,
        "cat",
    );
    h.expect(h.get(None, "/v1/status"), 200, None, "status");
    // A key sent anyway is ignored.
    h.expect(
        h.get(Some("whatever-key-00000000"), "/v1/status"),
        200,
        None,
        "status",
    );
}
