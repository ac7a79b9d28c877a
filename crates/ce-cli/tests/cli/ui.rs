//! The web console (`/ui`) in a real browser: Debian's `chromium`, headless, driven by
//! `puppeteer-core` (`tests/ui/package-lock.json`) from `tests/ui/check.mjs`, against a real
//! `ce serve` with two tenants, an admin key, seeded nodes, a relation, a session and a dead
//! letter (the OpenAI-compatible loopback embedder refused its text). The script logs in,
//! browses, edits L0 and sees the new version, meets a version conflict, searches, requeues
//! the dead letter and sees lag return to 0, and checks that account B sees nothing of A;
//! it saves a screenshot of each page under `target/ui-screenshots/`. A missing node,
//! `puppeteer-core` or chromium fails the test.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use super::fake_embeddings::FakeEmbeddings;
use super::harness::{Ce, agent, eventually, external, repo_root};

const KEY_A: &str = "ui-key-of-account-a-00001";
const KEY_B: &str = "ui-key-of-account-b-00001";
const KEY_ADMIN: &str = "ui-key-of-the-admin-00001";

/// `POST path` with `key` → (status, body).
fn post(url: &str, key: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut res = agent()
        .post(format!("{url}{path}"))
        .header("Authorization", &format!("Bearer {key}"))
        .header("Content-Type", "application/json")
        .send(body.to_string().as_bytes())
        .expect("request");
    let status = res.status().as_u16();
    let text = res.body_mut().read_to_string().expect("body");
    (status, serde_json::from_str(&text).expect("JSON"))
}

/// `GET path` with `key` → (status, body).
fn get(url: &str, key: &str, path: &str) -> (u16, Value) {
    let mut res = agent()
        .get(format!("{url}{path}"))
        .header("Authorization", &format!("Bearer {key}"))
        .call()
        .expect("request");
    let status = res.status().as_u16();
    let text = res.body_mut().read_to_string().expect("body");
    (status, serde_json::from_str(&text).expect("JSON"))
}

fn vector(status: &Value) -> &Value {
    status["consumers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["consumer"] == "vector"))
        .expect("vector consumer")
}

#[test]
fn the_console_in_a_headless_browser() {
    let fake = FakeEmbeddings::start(false);
    let ce = Ce::new();
    ce.write_config(&format!(
        "{}\
         [[server.api_keys]]\nkey = \"{KEY_A}\"\naccount_id = \"a\"\n\
         [[server.api_keys]]\nkey = \"{KEY_B}\"\naccount_id = \"b\"\n\
         [[server.api_keys]]\nkey = \"{KEY_ADMIN}\"\nadmin = true\n",
        fake.embedding_config(8)
    ));
    let server = ce.serve(&[]);
    let url = server.url.clone();
    let put = |key: &str, body: Value| {
        let (status, v) = post(&url, key, "/v1/put", &body);
        assert_eq!(status, 200, "{body}: {v}");
    };
    put(
        KEY_A,
        json!({"uri": "ctx://a/docs/guide", "abstract": "How to install the widget.",
        "content": "Installing the widget: download it, run the installer, restart.",
        "context_type": "resource", "meta": {"lang": "en"}}),
    );
    put(
        KEY_A,
        json!({"uri": "ctx://a/docs/faq", "abstract": "Frequently asked questions about the widget.",
        "content": "Frequently asked questions: does the widget work offline? Yes.",
        "context_type": "resource"}),
    );
    put(
        KEY_A,
        json!({"uri": "ctx://a/users/u1/memories/preferences/theme",
        "abstract": "Prefers dark mode.", "context_type": "memory"}),
    );
    put(
        KEY_B,
        json!({"uri": "ctx://b/notes/secret", "abstract": "Bravo's widget install guide.",
        "content": "Bravo's confidential widget install guide."}),
    );
    let (status, v) = post(
        &url,
        KEY_A,
        "/v1/link",
        &json!({"from": "ctx://a/docs/guide",
        "to": "ctx://a/docs/faq", "type": "references"}),
    );
    assert_eq!(status, 200, "{v}");
    let session = "ctx://a/users/u1/sessions/s1";
    for (path, body) in [
        (
            "/v1/sessions/new",
            json!({"uri": session, "title": "Setting up the widget"}),
        ),
        (
            "/v1/sessions/add",
            json!({"uri": session, "role": "user", "content": "How do I install the widget?"}),
        ),
        ("/v1/sessions/commit", json!({"uri": session})),
    ] {
        let (status, v) = post(&url, KEY_A, path, &body);
        assert_eq!(status, 200, "{path}: {v}");
    }
    let drained = eventually(Duration::from_secs(30), || {
        let (_, s) = get(&url, KEY_ADMIN, "/v1/status");
        let lag: u64 = s["consumers"]
            .as_array()?
            .iter()
            .filter_map(|c| c["lag_events"].as_u64())
            .sum();
        (lag == 0).then_some(())
    });
    assert!(
        drained.is_some(),
        "the indexes never caught up\n{}",
        server.log()
    );

    // A dead letter: the provider refuses (400, not retryable) while this node is written.
    fake.failing.store(true, Ordering::SeqCst);
    put(
        KEY_A,
        json!({"uri": "ctx://a/docs/changelog", "abstract": "What changed in the widget."}),
    );
    // Until nothing is left to apply: the derived write-back of its L1 may die too.
    let dead = eventually(Duration::from_secs(30), || {
        let (_, s) = get(&url, KEY_ADMIN, "/v1/status");
        let lag: u64 = s["consumers"]
            .as_array()?
            .iter()
            .filter_map(|c| c["lag_events"].as_u64())
            .sum();
        (vector(&s)["dead"].as_u64()? > 0 && lag == 0).then_some(())
    });
    assert!(dead.is_some(), "no dead letter\n{}", server.log());
    fake.failing.store(false, Ordering::SeqCst);

    let shots = repo_root().join("target/ui-screenshots");
    let out = external(
        "node",
        &[
            "tests/ui/check.mjs",
            &url,
            KEY_ADMIN,
            KEY_A,
            KEY_B,
            shots.to_str().expect("utf-8 path"),
        ],
        &[],
    );
    assert!(out.contains("ui console check: ok"), "{out}");
    let (_, s) = get(&url, KEY_ADMIN, "/v1/status");
    assert_eq!(vector(&s)["dead"], 0, "{s}");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// The static files: served without a key, with a strict Content-Security-Policy, every
/// file the page loads present; the data routes still need a key.
#[test]
fn static_assets_need_no_key_and_carry_a_strict_policy() {
    let ce = Ce::hash(&format!(
        "[[server.api_keys]]\nkey = \"{KEY_A}\"\naccount_id = \"a\"\n"
    ));
    let server = ce.serve(&[]);
    for path in ["/ui/", "/ui/console.css", "/ui/js/app.js", "/ui/js/tree.js"] {
        let res = agent()
            .get(format!("{}{path}", server.url))
            .call()
            .expect("request");
        assert_eq!(res.status().as_u16(), 200, "{path}");
        let csp = res
            .headers()
            .get("content-security-policy")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{path}: {csp}"
        );
    }
    let (status, _) = server.text("/ui/js/no-such-file.js");
    assert_eq!(status, 404);
    let (status, v) = server.get("/v1/children?uri=ctx://a");
    assert_eq!(status, 401, "{v}");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}
