//! put / cat / stat / ls / tree / rm / mv, and how the data directory and config are found.

use std::process::Command;

use serde_json::json;

use super::harness::{CE, Ce, events, failure, success};

const THEME: &str = "ctx://acc/users/u1/memories/preferences/theme";

fn uris(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|n| n["uri"].as_str().expect("uri").to_owned())
        .collect()
}

#[test]
fn put_then_read_back_every_way() {
    let ce = Ce::new();
    // A non-canonical spelling is canonicalized.
    let out = ce.json(&[
        "put",
        "CTX://acc/users/u1/memories/preferences/theme/",
        "--abstract",
        "Prefers dark mode.",
        "--overview",
        "Dark mode in every app; high contrast.",
        "--content",
        "Alice asked for dark mode in the IDE, the terminal and the browser.",
        "--meta",
        "source=chat",
        "--meta",
        "note=",
    ]);
    assert_eq!(out["uri"], THEME);
    assert_eq!(out["version"], 1);
    assert_eq!(out["changed"], true);
    // The node and its five missing ancestors.
    assert_eq!(out["nodes_affected"], 6);
    assert_eq!(out["event_ids"].as_array().expect("ids").len(), 6);

    let cat = ce.json(&["cat", THEME]);
    assert_eq!(cat["level"], 2);
    assert_eq!(cat["version"], 1);
    assert_eq!(
        cat["text"],
        "Alice asked for dark mode in the IDE, the terminal and the browser."
    );
    assert_eq!(
        ce.json(&["cat", THEME, "--level", "0"])["text"],
        "Prefers dark mode."
    );
    assert_eq!(
        ce.ok(&["cat", THEME, "--level", "1"]),
        "Dark mode in every app; high contrast.\n"
    );

    let stat = ce.json(&["stat", THEME]);
    assert_eq!(stat["context_type"], "memory");
    assert_eq!(stat["category"], "preferences");
    assert_eq!(stat["owner_space"], "user:u1");
    assert_eq!(
        stat["parent_uri"],
        "ctx://acc/users/u1/memories/preferences"
    );
    assert_eq!(stat["layer_bytes"], json!([18, 38, 67]));
    assert_eq!(stat["children"], 0);
    assert_eq!(stat["meta"], json!({"source": "chat", "note": ""}));
    assert!(
        stat["content_hash"]
            .as_str()
            .expect("hash")
            .starts_with("sha256:")
    );
    let human = ce.ok(&["stat", THEME]);
    assert!(
        human.contains("owner_space") && human.contains("user:u1"),
        "{human}"
    );

    assert_eq!(uris(&ce.json(&["ls"])), ["ctx://acc"]);
    let ls = ce.json(&["ls", "ctx://acc/users/u1/memories"]);
    assert_eq!(uris(&ls), ["ctx://acc/users/u1/memories/preferences"]);
    assert_eq!(ls[0]["children"], 1);
    let human = ce.ok(&["ls", "ctx://acc/users/u1/memories/preferences"]);
    assert!(human.starts_with("NAME"), "{human}");
    assert!(human.contains("theme"), "{human}");

    let tree = ce.json(&["tree", "ctx://acc"]);
    assert_eq!(
        uris(&tree),
        [
            "ctx://acc",
            "ctx://acc/users",
            "ctx://acc/users/u1",
            "ctx://acc/users/u1/memories",
            "ctx://acc/users/u1/memories/preferences",
            THEME,
        ]
    );
    assert_eq!(
        uris(&ce.json(&["tree", "ctx://acc", "--depth", "1"])),
        ["ctx://acc", "ctx://acc/users"]
    );
    let human = ce.ok(&["tree", "ctx://acc/users"]);
    assert!(human.starts_with("ctx://acc/users\n"), "{human}");
    assert!(human.contains("└── theme  [memory v1"), "{human}");
}

#[test]
fn explicit_attributes_override_the_path_defaults() {
    let ce = Ce::new();
    ce.json(&[
        "put",
        "ctx://acc/users/u1/notes/x",
        "--content",
        "x",
        "--type",
        "skill",
        "--category",
        "tools",
        "--owner-space",
        "agent:bot",
    ]);
    let stat = ce.json(&["stat", "ctx://acc/users/u1/notes/x"]);
    assert_eq!(stat["context_type"], "skill");
    assert_eq!(stat["category"], "tools");
    assert_eq!(stat["owner_space"], "agent:bot");
}

#[test]
fn merge_keeps_append_extends_replace_resets() {
    let ce = Ce::new();
    let uri = "ctx://acc/docs/guide";
    ce.json(&[
        "put",
        uri,
        "--abstract",
        "A",
        "--content",
        "C",
        "--meta",
        "a=1",
    ]);
    let merged = ce.json(&[
        "put",
        uri,
        "--mode",
        "merge",
        "--overview",
        "O",
        "--meta",
        "b=2",
    ]);
    assert_eq!(merged["version"], 2);
    assert_eq!(ce.json(&["cat", uri, "--level", "0"])["text"], "A");
    assert_eq!(ce.json(&["cat", uri, "--level", "1"])["text"], "O");
    assert_eq!(ce.json(&["cat", uri])["text"], "C");
    assert_eq!(ce.json(&["stat", uri])["meta"], json!({"a": "1", "b": "2"}));

    // In the CLI a meta value is always a string: "null" does not remove the key.
    ce.json(&["put", uri, "--mode", "merge", "--meta", "a=null"]);
    assert_eq!(
        ce.json(&["stat", uri])["meta"],
        json!({"a": "null", "b": "2"})
    );

    let appended = ce.json(&["put", uri, "--mode", "append", "--content", " and more"]);
    assert_eq!(appended["version"], 4);
    assert_eq!(ce.json(&["cat", uri])["text"], "C and more");
    assert_eq!(ce.json(&["cat", uri, "--level", "0"])["text"], "A");

    let replaced = ce.json(&["put", uri, "--content", "new"]);
    assert_eq!(replaced["version"], 5);
    // The client's layers are gone; a short leaf's are derived in the same write from its
    // new content (docs/derive.md, "Derived at write time").
    let stat = ce.json(&["stat", uri]);
    for layer in ["abstract", "overview"] {
        assert_eq!(stat["provenance"][layer]["origin"], "derived", "{stat}");
    }
    assert_eq!(ce.json(&["cat", uri, "--level", "0"])["text"], "new");
    assert_eq!(ce.json(&["cat", uri, "--level", "1"])["text"], "new");
    assert_eq!(ce.json(&["cat", uri])["text"], "new");
    assert_eq!(ce.json(&["stat", uri])["meta"], json!({}));
}

#[test]
fn layers_come_from_files_and_stdin() {
    let ce = Ce::new();
    let file = ce.data_dir().join("content.txt");
    std::fs::write(&file, "from a file\n").expect("write input");
    let file = file.to_str().expect("utf-8 path");
    let out = ce.run_with_stdin(
        &[
            "--json",
            "put",
            "ctx://acc/docs/f",
            "--content-file",
            file,
            "--abstract-file",
            "-",
        ],
        "from stdin",
    );
    success(&["put"], out);
    assert_eq!(
        ce.json(&["cat", "ctx://acc/docs/f"])["text"],
        "from a file\n"
    );
    assert_eq!(
        ce.json(&["cat", "ctx://acc/docs/f", "--level", "0"])["text"],
        "from stdin"
    );

    // Only one layer can come from stdin.
    let before = ce.snapshot("ctx://acc");
    let args = [
        "--json",
        "put",
        "ctx://acc/docs/f",
        "--overview-file",
        "-",
        "--content-file",
        "-",
    ];
    let f = failure(&args, &ce.run_with_stdin(&args, "x"));
    assert_eq!(f.exit, 2);
    assert_eq!(f.error["code"], "invalid_field");
    // A missing input file is an I/O error naming the file.
    let f = ce.fail(
        &[
            "put",
            "ctx://acc/docs/f",
            "--content-file",
            "/nonexistent/x",
        ],
        1,
    );
    assert_eq!(f.error["code"], "io");
    assert!(
        f.error["message"]
            .as_str()
            .expect("message")
            .contains("/nonexistent/x"),
        "{}",
        f.error
    );
    assert_eq!(ce.snapshot("ctx://acc"), before);
}

#[test]
fn rm_needs_recursive_for_a_node_with_children() {
    let ce = Ce::new();
    ce.put("ctx://acc/docs/a/b", "b");
    ce.put("ctx://acc/docs/a/c", "c");
    let before = ce.snapshot("ctx://acc");
    let f = ce.fail(&["rm", "ctx://acc/docs/a"], 4);
    assert_eq!(f.error["code"], "not_empty");
    assert_eq!(f.error["retryable"], false);
    assert_eq!(ce.snapshot("ctx://acc"), before);

    let leaf = ce.json(&["rm", "ctx://acc/docs/a/c", "--expect-version", "1"]);
    assert_eq!(leaf["nodes_affected"], 1);
    let out = ce.json(&["rm", "-r", "ctx://acc/docs/a"]);
    assert_eq!(out["changed"], true);
    assert_eq!(out["nodes_affected"], 2);
    assert_eq!(
        uris(&ce.json(&["tree", "ctx://acc"])),
        ["ctx://acc", "ctx://acc/docs"]
    );
    let f = ce.fail(&["cat", "ctx://acc/docs/a/b"], 3);
    assert_eq!(f.error["code"], "not_found");
    // The human form of an error names the code too.
    let out = ce.run(&["cat", "ctx://acc/docs/a/b"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: node ctx://acc/docs/a/b not found [not_found]\n"
    );
}

#[test]
fn mv_rewrites_every_descendant() {
    let ce = Ce::new();
    ce.put("ctx://acc/docs/x/y", "y");
    ce.put("ctx://acc/docs/x/y/z", "z");
    let out = ce.json(&["mv", "ctx://acc/docs/x", "ctx://acc/archive/x2"]);
    assert_eq!(out["uri"], "ctx://acc/archive/x2");
    assert_eq!(out["nodes_affected"], 3);
    assert_eq!(
        uris(&ce.json(&["tree", "ctx://acc/archive"])),
        [
            "ctx://acc/archive",
            "ctx://acc/archive/x2",
            "ctx://acc/archive/x2/y",
            "ctx://acc/archive/x2/y/z",
        ]
    );
    assert_eq!(ce.json(&["cat", "ctx://acc/archive/x2/y/z"])["text"], "z");
    assert_eq!(
        ce.json(&["stat", "ctx://acc/archive/x2/y"])["parent_uri"],
        "ctx://acc/archive/x2"
    );
    ce.fail(&["stat", "ctx://acc/docs/x/y"], 3);
    assert_eq!(
        uris(&ce.json(&["ls", "ctx://acc/docs"])),
        Vec::<String>::new()
    );
}

#[test]
fn identical_put_changes_nothing() {
    let ce = Ce::new();
    ce.json(&[
        "put",
        "ctx://acc/docs/same",
        "--content",
        "x",
        "--meta",
        "k=v",
    ]);
    let before = events(&ce);
    let again = ce.json(&[
        "put",
        "ctx://acc/docs/same",
        "--content",
        "x",
        "--meta",
        "k=v",
    ]);
    assert_eq!(again["changed"], false);
    assert_eq!(again["version"], 1);
    assert_eq!(again["event_ids"], json!([]));
    assert_eq!(events(&ce), before);
}

#[test]
fn data_dir_comes_from_env_then_defaults_to_ce_data() {
    let ce = Ce::new();
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("ce runs");
        success(&["(env)"], out)
    };
    // CE_DATA_DIR is used when --data-dir is absent.
    run(Command::new(CE)
        .env("CE_DATA_DIR", ce.data_dir())
        .env_remove("CE_CONFIG")
        .args(["put", "ctx://acc/env", "--content", "e"]));
    assert_eq!(ce.json(&["cat", "ctx://acc/env"])["text"], "e");
    // Neither: ./ce-data in the current directory.
    let cwd = tempfile::tempdir().expect("tempdir");
    run(Command::new(CE)
        .current_dir(cwd.path())
        .env_remove("CE_DATA_DIR")
        .env_remove("CE_CONFIG")
        .args(["put", "ctx://acc/here", "--content", "h"]));
    assert!(cwd.path().join("ce-data").join("ce.db").is_file());
}

#[test]
fn config_is_read_from_the_data_dir_or_named_explicitly() {
    let ce = Ce::new();
    ce.put("ctx://acc/docs/a", "a");
    std::fs::write(
        ce.data_dir().join("ce.toml"),
        "[store]\nmax_layer_bytes = 1024\n",
    )
    .expect("write config");
    let big = "x".repeat(2000);
    let f = ce.fail(&["put", "ctx://acc/docs/big", "--content", &big], 5);
    assert_eq!(f.error["code"], "payload_too_large");

    // --config wins over <data-dir>/ce.toml; CE_CONFIG works like --config.
    let roomy = ce.dir.path().join("roomy.toml");
    std::fs::write(&roomy, "[store]\nmax_layer_bytes = 4096\n").expect("write config");
    let roomy = roomy.to_str().expect("utf-8 path");
    ce.json(&[
        "--config",
        roomy,
        "put",
        "ctx://acc/docs/big",
        "--content",
        &big,
    ]);
    let out = ce
        .command(&["put", "ctx://acc/docs/big2", "--content", &big])
        .env("CE_CONFIG", roomy)
        .output()
        .expect("ce runs");
    success(&["put (CE_CONFIG)"], out);

    // A bad configuration is rejected, naming the key.
    std::fs::write(
        ce.data_dir().join("ce.toml"),
        "[index.worker]\nlease_seconds = 5\n",
    )
    .expect("write config");
    let f = ce.fail(&["cat", "ctx://acc/docs/a"], 2);
    assert_eq!(f.error["code"], "invalid_config");
    assert!(
        f.error["message"]
            .as_str()
            .expect("message")
            .contains("index.worker.lease_seconds"),
        "{}",
        f.error
    );
}

/// Accounts and the containers a put creates keep their stored path-default type
/// (`resource` outside a type folder); `ls` and `stat` show their kind beside it.
#[test]
fn listings_show_the_kind_beside_the_stored_type() {
    let ce = Ce::new();
    ce.put("ctx://acc/docs/a", "text");
    let kind = |args: &[&str]| {
        let mut all = vec!["ls"];
        all.extend_from_slice(args);
        let v = ce.json(&all);
        (v[0]["kind"].clone(), v[0]["context_type"].clone())
    };
    assert_eq!(kind(&[]), (json!("account"), json!("resource")));
    assert_eq!(
        kind(&["ctx://acc"]),
        (json!("container"), json!("resource"))
    );
    assert_eq!(
        kind(&["ctx://acc/docs"]),
        (json!("leaf"), json!("resource"))
    );
    let human = ce.ok(&["ls", "ctx://acc"]);
    let mut lines = human.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header[..3], ["NAME", "KIND", "TYPE"], "{human}");
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..3], ["docs/", "container", "resource"], "{human}");
    let stat = ce.ok(&["stat", "ctx://acc"]);
    assert!(
        stat.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["kind", "account"]),
        "{stat}"
    );
}
