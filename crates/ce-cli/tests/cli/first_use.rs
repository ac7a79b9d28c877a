//! First-use papercuts of issue 13, through the binary: what `put`, `ls`, `cat`, `status`,
//! `worker --once` and `serve` print, config and data-directory errors, look-alike URIs and
//! the `outbox list` bound.

use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::harness::{CE, Ce, failure, success};

/// Runs `ce ARGS` and returns (stdout, stderr), asserting success.
fn ok_both(ce: &Ce, args: &[&str]) -> (String, String) {
    let out = ce.run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (success(args, out), stderr)
}

fn kv_line<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no {key} line in:\n{text}"))
}

/// A put that creates ancestors appends one event per node: the human output counts them and
/// lists the ids only with `--verbose` (JSON always has them).
#[test]
fn put_counts_its_events_and_lists_ids_only_when_verbose() {
    let ce = Ce::new();
    let out = ce.ok(&["put", "ctx://acc/a/b/c/d", "--content", "deep"]);
    assert_eq!(kv_line(&out, "events"), "events    5", "{out}");
    assert!(!out.contains("evt-"), "ids without --verbose:\n{out}");
    let verbose = ce.ok(&["put", "ctx://acc/a/b/x/e", "--content", "x", "--verbose"]);
    let line = kv_line(&verbose, "events");
    assert!(line.starts_with("events    2: evt-"), "{verbose}");
    assert_eq!(line.matches("evt-").count(), 2, "{verbose}");
    let j = ce.json(&["put", "ctx://acc/a/b/c/f", "--content", "y"]);
    assert_eq!(j["event_ids"].as_array().expect("ids").len(), 1, "{j}");
    // rm -r counts too.
    let rm = ce.ok(&["rm", "-r", "ctx://acc/a/b"]);
    assert_eq!(kv_line(&rm, "events"), "events    1", "{rm}");
}

/// A put in replace mode empties the layers it was not given; the output names them. The
/// README's optimistic-lock example uses merge mode and keeps them.
#[test]
fn replace_mode_names_the_layers_it_removed_and_the_readme_example_keeps_them() {
    let ce = Ce::new();
    let g = "ctx://acc1/docs/guide";
    ce.ok(&["put", g, "--abstract", "A guide.", "--content", "v1"]);
    ce.ok(&["put", g, "--mode", "merge", "--overview", "New overview"]);
    ce.ok(&["put", g, "--mode", "append", "--content", "one more line"]);
    // The README's line, as written.
    let kept = ce.json(&[
        "put",
        g,
        "--mode",
        "merge",
        "--content",
        "v2",
        "--expect-version",
        "3",
    ]);
    assert_eq!(kept["version"], 4, "{kept}");
    assert!(kept.get("layers_removed").is_none(), "{kept}");
    assert_eq!(ce.ok(&["cat", g, "--level", "1"]), "New overview\n");
    assert_eq!(ce.ok(&["cat", g, "--level", "0"]), "A guide.\n");

    let replaced = ce.ok(&["put", g, "--content", "v3"]);
    let line = kv_line(&replaced, "removed");
    assert!(
        line.contains("L0 (abstract), L1 (overview)") && line.contains("--mode merge"),
        "{replaced}"
    );
    ce.ok(&["put", g, "--abstract", "again", "--content", "v3"]);
    let j = ce.json(&["put", g, "--overview", "only"]);
    assert_eq!(j["layers_removed"], json!([0, 2]), "{j}");
    // Nothing removed: no line.
    let same = ce.ok(&["put", g, "--overview", "only", "--content", "c"]);
    assert!(!same.contains("removed"), "{same}");
}

/// `ls` of a leaf and of an empty root, and `cat` of an empty layer, say what is there
/// (the note goes to stderr; stdout stays the exact layer text).
#[test]
fn ls_of_a_leaf_and_cat_of_an_empty_layer_say_what_is_there() {
    let ce = Ce::new();
    // Leaves left to the derive consumer, as a leaf longer than `derive.inline_max_chars` is.
    ce.write_config("[derive]\ninline_max_chars = 0\n");
    assert!(ce.ok(&["ls"]).starts_with("no accounts yet"));
    let leaf = "ctx://acc/docs/note";
    ce.put(leaf, "a body of text");
    let ls = ce.ok(&["ls", leaf]);
    assert!(ls.starts_with(&format!("{leaf} has no children")), "{ls}");
    assert!(ls.contains(&format!("ce cat {leaf}")), "{ls}");
    assert_eq!(ce.json(&["ls", leaf]), json!([]));

    // A resource's L0 is derived: until the derive consumer has run, it is pending.
    let (out, err) = ok_both(&ce, &["cat", leaf, "--level", "0"]);
    assert_eq!(out, "", "stdout is the layer exactly as stored");
    assert!(
        err.contains("L0 (abstract) of ctx://acc/docs/note is not derived yet")
            && err.contains("search has no L0 record of it until then"),
        "{err}"
    );
    let j = ce.json(&["cat", leaf, "--level", "0"]);
    assert_eq!(
        (&j["text"], &j["pending"]),
        (&json!(""), &json!(true)),
        "{j}"
    );
    // A memory's is not (by default): search uses the fallback.
    let memory = "ctx://acc/memories/note";
    ce.put(memory, "a body of text");
    let (out, err) = ok_both(&ce, &["cat", memory, "--level", "0"]);
    assert_eq!(out, "", "stdout is the layer exactly as stored");
    assert!(
        err.contains("L0 (abstract) of ctx://acc/memories/note is empty")
            && err.contains("search uses the first 200 characters of L2 (content)"),
        "{err}"
    );
    let j = ce.json(&["cat", memory, "--level", "0"]);
    assert_eq!(j["text"], "");
    assert_eq!(j["fallback"], json!({"level": 2, "max_chars": 200}), "{j}");
    assert!(j.get("pending").is_none(), "{j}");
    // A layer with text has no note and no fallback.
    let (out, err) = ok_both(&ce, &["cat", leaf]);
    assert_eq!((out.as_str(), err.as_str()), ("a body of text\n", ""));
    assert!(ce.json(&["cat", leaf]).get("fallback").is_none());
    // A container has no content, and its roll-up is pending too.
    let (out, err) = ok_both(&ce, &["cat", "ctx://acc/docs"]);
    assert_eq!(out, "");
    assert!(err.contains("L2 has no fallback"), "{err}");
    let (_, err) = ok_both(&ce, &["cat", "ctx://acc/docs", "--level", "1"]);
    assert!(err.contains("not derived yet"), "{err}");
    // A memory folder has no text anywhere.
    let (_, err) = ok_both(&ce, &["cat", "ctx://acc/memories", "--level", "1"]);
    assert!(err.contains("so is every layer it falls back to"), "{err}");
}

/// `status` of a process that runs no workers says so instead of `workers 0 ()`.
#[test]
fn status_without_workers_says_none() {
    let ce = Ce::hash("");
    let out = ce.ok(&["status"]);
    let line = kv_line(&out, "workers");
    assert!(!line.contains("()"), "{out}");
    assert!(line.contains("none in this process"), "{out}");
}

/// `worker --once` counts events and deliveries apart (4 consumers: 4 deliveries per event),
/// and its progress reaches the final totals on stderr, as text or as JSON lines.
#[test]
fn worker_once_counts_events_and_deliveries_and_shows_progress_in_both_modes() {
    let ce = Ce::hash("");
    // 3 events (acc, acc/docs, acc/docs/a), then 1 each — the leaves are derived in their
    // writes (docs/derive.md, "Derived at write time") — and the folders' derived
    // write-backs (acc/docs, acc): 7 events, 28 deliveries (vector, keyword, relation,
    // derive).
    ce.put("ctx://acc/docs/a", "alpha");
    ce.put("ctx://acc/docs/b", "beta");
    ce.put("ctx://acc/docs/c", "gamma");
    let out = ce.run(&["--json", "worker", "--once"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: Value =
        serde_json::from_str(&success(&["--json", "worker", "--once"], out)).expect("json");
    let p = &report["progress"];
    assert_eq!(
        (p["events"].as_u64(), p["succeeded"].as_u64()),
        (Some(7), Some(28)),
        "{report}"
    );
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no progress with --json"));
    assert_eq!(last["progress"], "worker", "{last}");
    assert_eq!(
        (last["events"].as_u64(), last["succeeded"].as_u64()),
        (Some(7), Some(28))
    );

    ce.put("ctx://acc/docs/d", "delta");
    ce.put("ctx://acc/docs/e", "epsilon");
    // 2 events, and the write-backs of docs and acc: 4 events, 16 deliveries.
    let (out, err) = ok_both(&ce, &["worker", "--once"]);
    assert_eq!(kv_line(&out, "events"), "events      4", "{out}");
    assert!(
        kv_line(&out, "deliveries").starts_with("deliveries  16 done, 0 retried, 0 dead"),
        "{out}"
    );
    let took = kv_line(&out, "took");
    assert!(
        took.contains("events/s") && took.contains("deliveries/s"),
        "{out}"
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("worker: 4 events, 16 deliveries done, 0 retried, 0 dead"),
        "{err}"
    );
}

/// Config errors give the full key, line and column; an uncreatable data directory is an
/// I/O error naming it (exit 1), not `not_found`.
#[test]
fn config_and_data_dir_errors_say_where() {
    let ce = Ce::new();
    ce.write_config("# tuning\n[index.worker]\nlease_secnds = 30\n");
    let f = ce.fail(&["ls"], 2);
    assert_eq!(f.error["code"], "invalid_config");
    let m = f.error["message"].as_str().expect("message");
    assert!(
        m.contains("index.worker.lease_secnds") && m.contains("(line 3, column 1)"),
        "{m}"
    );
    assert!(!m.contains("byte"), "{m}");

    // /proc refuses new directories with ENOENT, which used to read as `not_found`.
    let dir = "/proc/ce-no-such-dir/data";
    let out = Command::new(CE)
        .env_remove("CE_DATA_DIR")
        .env_remove("CE_CONFIG")
        .env_remove("CE_SERVER")
        .env_remove("CE_STORE")
        .args([
            "--data-dir",
            dir,
            "--json",
            "put",
            "ctx://acc/x",
            "--content",
            "x",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("ce runs");
    let f = failure(&["put"], &out);
    assert_eq!(
        (f.exit, f.error["code"].as_str()),
        (1, Some("io")),
        "{}",
        f.error
    );
    let m = f.error["message"].as_str().expect("message");
    assert!(
        m.contains("cannot create the data directory") && m.contains(dir),
        "{m}"
    );
}

/// `serve --help` does not list the remote options; `serve` with an unset `key_env` fails
/// with `invalid_config` before any worker starts.
#[test]
fn serve_lists_only_its_options_and_validates_before_starting() {
    let ce = Ce::hash("");
    let help = ce.ok(&["serve", "--help"]);
    assert!(
        !help.contains("--server") && !help.contains("--api-key"),
        "{help}"
    );
    assert!(
        help.contains("--bind") && help.contains("--data-dir"),
        "{help}"
    );
    let put_help = ce.ok(&["put", "--help"]);
    assert!(put_help.contains("--server") && put_help.contains("--api-key"));
    // Given anyway, the remote options are refused with a reason.
    let f = ce.fail(&["--server", "http://127.0.0.1:9", "serve"], 2);
    assert!(
        f.error["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot be sent to --server")),
        "{}",
        f.error
    );

    ce.write_config(
        "[index.embedding]\nprovider = \"hash\"\n\
         [[server.api_keys]]\nkey_env = \"CE_TEST_UNSET_KEY_ISSUE13\"\nadmin = true\n",
    );
    let out = ce
        .command(&["serve", "--bind", "127.0.0.1:0"])
        .env_remove("CE_TEST_UNSET_KEY_ISSUE13")
        .env("CE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("ce serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("server.api_keys[0].key_env")
            && stderr.contains("CE_TEST_UNSET_KEY_ISSUE13 is not set")
            && stderr.contains("[invalid_config]"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("workers started"),
        "workers ran first:\n{stderr}"
    );
    assert!(out.stdout.is_empty(), "it listened");
}

/// Look-alike URIs: invisible and bidi characters and full-width letters are refused naming
/// the position; decomposed accents are one key with the precomposed spelling.
#[test]
fn look_alike_uris_are_refused_or_normalized() {
    let ce = Ce::new();
    for (uri, wants) in [
        ("ctx://acc/a\u{200b}b", "U+200B at byte 11"),
        (
            "ctx://acc/\u{202e}txt",
            "bidirectional control U+202E at byte 10",
        ),
        ("ctx://ａcc/x", "full-width 'ａ'"),
    ] {
        let f = ce.fail(&["put", uri, "--content", "x"], 2);
        assert_eq!(f.error["code"], "invalid_uri", "{uri:?}: {}", f.error);
        let m = f.error["message"].as_str().expect("message");
        assert!(m.contains(wants), "{uri:?}: {m}");
    }
    ce.put("ctx://acc/cafe\u{301}", "coffee");
    assert_eq!(ce.ok(&["cat", "ctx://acc/caf\u{e9}"]), "coffee\n");
    let ls = ce.json(&["ls", "ctx://acc"]);
    assert_eq!(ls[0]["uri"], "ctx://acc/caf\u{e9}", "{ls}");
}

/// `outbox list --limit` is bounded (1..=10000), locally and over HTTP alike.
#[test]
fn outbox_list_limit_is_bounded_like_the_http_api() {
    let ce = Ce::hash("");
    ce.put("ctx://acc/a", "x");
    for bad in ["0", "10001", "4000000000"] {
        let f = ce.fail(&["outbox", "list", "--limit", bad], 2);
        assert_eq!(f.error["code"], "invalid_field", "{bad}: {}", f.error);
    }
    let rows = ce.json(&["outbox", "list", "--limit", "10000"]);
    // Two events (acc, acc/a), one delivery each to vector, keyword, relation, derive.
    assert_eq!(rows.as_array().expect("rows").len(), 8, "{rows}");
    let server = ce.serve(&[]);
    let (status, body) = server.get("/v1/outbox/list?limit=10001");
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_field")),
        "{body}"
    );
    let (status, _) = server.get("/v1/outbox/list?limit=10000");
    assert_eq!(status, 200);
    let out = ce.remote(&server, &["--json", "outbox", "list", "--limit", "10001"]);
    assert_eq!(failure(&["--server", "outbox", "list"], &out).exit, 2);
    server.stop();
}
