//! Tenants through the real binary: `ce serve` with `[[server.api_keys]]`, and
//! `ce --server URL --api-key KEY` for search, cat, ls, writes and admin commands with the
//! right and the wrong account's key; bad key configuration fails with an error naming it.

use std::time::Duration;

use serde_json::Value;

use super::harness::{Ce, eventually, failure, success};

const KEY_A: &str = "cli-key-account-a-000001";
const KEY_B: &str = "cli-key-account-b-000001";
const KEY_ADMIN: &str = "cli-key-the-admin-000001";
const B_SECRET: &str = "ctx://b/docs/secret";
const A_PLAN: &str = "ctx://a/docs/plan";

fn config() -> String {
    format!(
        "[[server.api_keys]]\nkey = \"{KEY_A}\"\naccount_id = \"a\"\n\
         [[server.api_keys]]\nkey_env = \"TENANT_TEST_KEY_B\"\naccount_id = \"b\"\n\
         [[server.api_keys]]\nkey_env = \"TENANT_TEST_KEY_ADMIN\"\nadmin = true\n"
    )
}

#[test]
fn a_key_of_account_a_cannot_read_or_search_account_b() {
    let ce = Ce::hash(&config());
    ce.put(A_PLAN, "alpha quarterly roadmap planning");
    ce.put(B_SECRET, "bravo confidential merger plans");
    let server = ce.serve_with_env(
        &[],
        &[
            ("TENANT_TEST_KEY_B", KEY_B),
            ("TENANT_TEST_KEY_ADMIN", KEY_ADMIN),
        ],
    );
    let with_key = |key: Option<&str>, args: &[&str]| -> Vec<String> {
        let mut all = vec![
            "--server".to_owned(),
            server.url.clone(),
            "--json".to_owned(),
        ];
        if let Some(k) = key {
            all.extend(["--api-key".to_owned(), k.to_owned()]);
        }
        all.extend(args.iter().map(|a| (*a).to_owned()));
        all
    };
    let ok = |key: Option<&str>, args: &[&str]| -> Value {
        let all = with_key(key, args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let text = success(&all, ce.run(&all));
        serde_json::from_str(&text).expect("JSON")
    };
    let fail = |key: Option<&str>, args: &[&str], exit: i32, code: &str| -> String {
        let all = with_key(key, args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let f = failure(&all, &ce.run(&all));
        assert_eq!(f.exit, exit, "{all:?}: {}", f.error);
        assert_eq!(f.error["code"], code, "{all:?}: {}", f.error);
        f.error["message"].as_str().expect("message").to_owned()
    };
    let hits = |v: &Value| -> Vec<String> {
        v["hits"]
            .as_array()
            .expect("hits")
            .iter()
            .map(|h| h["uri"].as_str().expect("uri").to_owned())
            .collect()
    };
    let query = "bravo confidential merger plans";

    // The admin finds b's node once it is indexed.
    eventually(Duration::from_secs(20), || {
        let found = hits(&ok(
            Some(KEY_ADMIN),
            &["search", query, "--min-score", "0.5"],
        ));
        found.contains(&B_SECRET.to_owned()).then_some(())
    })
    .unwrap_or_else(|| panic!("never indexed\n{}", server.log()));

    // Key A: its own account works, b's is invisible. a's node matches the query by keyword
    // only ("plans", "planning"), and each index catches up on its own (b's node may be found
    // by the vector index before the keyword index holds a's): wait for a hit.
    let a = Some(KEY_A);
    let found = eventually(Duration::from_secs(20), || {
        let found = hits(&ok(a, &["search", query]));
        (!found.is_empty()).then_some(found)
    })
    .unwrap_or_else(|| panic!("key a never found its own node\n{}", server.log()));
    // a's nodes only (its account node included).
    assert!(
        found
            .iter()
            .all(|u| u.starts_with("ctx://a/") || u == "ctx://a"),
        "{found:?}"
    );
    let msg = fail(
        a,
        &["search", query, "--filter", "account_id=b"],
        7,
        "forbidden",
    );
    assert!(msg.contains("account"), "{msg}");
    fail(
        a,
        &["search", query, "--subtree", "ctx://b"],
        7,
        "forbidden",
    );
    assert_eq!(
        ok(a, &["cat", A_PLAN])["text"],
        "alpha quarterly roadmap planning"
    );
    let hidden = fail(a, &["cat", B_SECRET], 3, "not_found");
    let missing = fail(
        Some(KEY_ADMIN),
        &["cat", "ctx://b/docs/missing"],
        3,
        "not_found",
    );
    assert_eq!(
        hidden.replace(B_SECRET, "URI"),
        missing.replace("ctx://b/docs/missing", "URI")
    );
    fail(a, &["stat", B_SECRET], 3, "not_found");
    fail(a, &["ls", "ctx://b"], 3, "not_found");
    let roots = ok(a, &["ls"]);
    let roots: Vec<&str> = roots
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|s| s["uri"].as_str())
        .collect();
    assert_eq!(roots, ["ctx://a"]);
    fail(
        a,
        &["put", "ctx://b/planted", "--content", "x"],
        7,
        "forbidden",
    );
    fail(a, &["rm", B_SECRET], 7, "forbidden");
    fail(a, &["status"], 7, "forbidden");

    // Key B (from the environment of `ce serve`) sees its node.
    assert_eq!(
        ok(Some(KEY_B), &["cat", B_SECRET])["text"],
        "bravo confidential merger plans"
    );

    // No key or an unknown one: 401, the server's message, exit 7.
    let msg = fail(None, &["cat", A_PLAN], 7, "unauthenticated");
    assert!(msg.contains("API key"), "{msg}");
    fail(
        Some("cli-key-nobody-0000000"),
        &["ls"],
        7,
        "unauthenticated",
    );

    // CE_API_KEY works like --api-key; human output prints the message on stderr.
    let out = ce
        .command(&["--server", &server.url, "cat", A_PLAN])
        .env("CE_API_KEY", KEY_A)
        .output()
        .expect("ce runs");
    assert_eq!(success(&["cat"], out), "alpha quarterly roadmap planning\n");
    let out = ce
        .command(&["--server", &server.url, "cat", B_SECRET])
        .env("CE_API_KEY", KEY_A)
        .output()
        .expect("ce runs");
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not found [not_found]"), "{stderr}");
}

/// Runs `ce --json serve --bind BIND` (quiet logs) and returns its JSON error and exit.
fn serve_fails(ce: &Ce, bind: &str) -> (i32, String) {
    let args = ["--json", "serve", "--bind", bind];
    let out = ce
        .command(&args)
        .env("CE_LOG", "off")
        .output()
        .expect("ce runs");
    let f = failure(&args, &out);
    assert_eq!(f.error["code"], "invalid_config", "{}", f.error);
    let msg = f.error["message"].as_str().expect("message").to_owned();
    (f.exit, msg)
}

#[test]
fn bad_key_configuration_is_refused_naming_the_key() {
    // Every command reads the configuration: the error names the entry.
    let ce = Ce::hash("[[server.api_keys]]\nkey = \"short\"\naccount_id = \"a\"\n");
    let f = ce.fail(&["ls"], 2);
    assert_eq!(f.error["code"], "invalid_config");
    let msg = f.error["message"].as_str().expect("message");
    assert!(msg.contains("server.api_keys[0].key"), "{msg}");

    // A key_env that is not set stops `ce serve` before it listens.
    let ce =
        Ce::hash("[[server.api_keys]]\nkey_env = \"TENANT_TEST_UNSET_KEY\"\naccount_id = \"a\"\n");
    let (exit, msg) = serve_fails(&ce, "127.0.0.1:0");
    assert_eq!(exit, 2);
    assert!(
        msg.contains("server.api_keys[0].key_env") && msg.contains("TENANT_TEST_UNSET_KEY"),
        "{msg}"
    );

    // No keys on a non-loopback address: refused unless allow_unauthenticated.
    let ce = Ce::hash("");
    let (exit, msg) = serve_fails(&ce, "0.0.0.0:0");
    assert_eq!(exit, 2);
    assert!(msg.contains("server.allow_unauthenticated"), "{msg}");
}
