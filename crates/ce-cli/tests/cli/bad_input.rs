//! Bad input gets a typed error, the matching exit code, and leaves the store untouched.

use super::harness::Ce;

/// A store with a small tree, plus its snapshot.
fn seeded() -> Ce {
    let ce = Ce::new();
    ce.put("ctx://acc/docs/a/b", "b");
    ce.json(&[
        "put",
        "ctx://acc/docs/c",
        "--content",
        "c",
        "--abstract",
        "C",
    ]);
    ce
}

/// Runs `args`, expects `exit` and `code`, and checks that nothing stored changed.
fn rejected(ce: &Ce, args: &[&str], exit: i32, code: &str) {
    let before = ce.snapshot("ctx://acc");
    let f = ce.fail(args, exit);
    assert_eq!(f.error["code"], code, "ce {args:?}: {}", f.error);
    assert_eq!(
        ce.snapshot("ctx://acc"),
        before,
        "ce {args:?} changed the store"
    );
}

#[test]
fn malformed_uris() {
    let ce = seeded();
    for uri in [
        "ctx://acc//b",
        "http://x",
        "ctx://acc/../b",
        "ctx://acc/./b",
        "acc/b",
        "",
        "ctx://acc/content.md",
        "ctx://acc/a\\b",
        "ctx://acc/a\u{7}b",
    ] {
        rejected(&ce, &["put", uri, "--content", "x"], 2, "invalid_uri");
        rejected(&ce, &["cat", uri], 2, "invalid_uri");
        rejected(&ce, &["rm", "-r", uri], 2, "invalid_uri");
        rejected(&ce, &["mv", "ctx://acc/docs/c", uri], 2, "invalid_uri");
        rejected(
            &ce,
            &["link", "ctx://acc/docs/c", uri, "--type", "t"],
            2,
            "invalid_uri",
        );
    }
    rejected(
        &ce,
        &["import", ".", "--into", "ctx://acc//x"],
        2,
        "invalid_uri",
    );
    // The root is not a node.
    rejected(&ce, &["put", "ctx://", "--content", "x"], 2, "invalid_uri");
}

#[test]
fn unknown_event_type_and_bad_payloads() {
    let ce = seeded();
    let good = r#"{"event_version":1,"uri":"ctx://acc/docs/c","expected_node_version":1,"reason":"repair","trace_id":""}"#;
    rejected(
        &ce,
        &[
            "outbox",
            "append",
            "--type",
            "FROB_CONTEXT",
            "--payload",
            good,
        ],
        2,
        "unknown_event_type",
    );
    rejected(
        &ce,
        &[
            "outbox",
            "append",
            "--type",
            "upsert_context",
            "--payload",
            good,
        ],
        2,
        "unknown_event_type",
    );
    for payload in [
        "{not json",
        r#"{"event_version":1,"uri":"ctx://acc/docs/c"}"#,
        r#"{"event_version":2,"uri":"ctx://acc/docs/c","expected_node_version":1,"reason":"repair","trace_id":""}"#,
        r#"{"event_version":1,"uri":"http://x","expected_node_version":1,"reason":"repair","trace_id":""}"#,
        r#"{"event_version":1,"uri":"ctx://acc/docs/c","expected_node_version":1,"reason":"repair","trace_id":"","extra":1}"#,
    ] {
        rejected(
            &ce,
            &[
                "outbox",
                "append",
                "--type",
                "UPSERT_CONTEXT",
                "--payload",
                payload,
            ],
            2,
            "invalid_payload",
        );
    }
    rejected(
        &ce,
        &["outbox", "list", "--type", "FROB"],
        2,
        "unknown_event_type",
    );
    rejected(
        &ce,
        &["outbox", "list", "--status", "stuck"],
        2,
        "invalid_field",
    );
}

#[test]
fn invalid_levels() {
    let ce = seeded();
    for level in ["9", "3", "-1"] {
        rejected(
            &ce,
            &["cat", "ctx://acc/docs/c", "--level", level],
            2,
            "invalid_level",
        );
    }
    // The level is checked before the node is looked up.
    rejected(
        &ce,
        &["cat", "ctx://acc/nope", "--level", "9"],
        2,
        "invalid_level",
    );
}

#[test]
fn invalid_fields() {
    let ce = seeded();
    let put = |extra: &[&str]| {
        let mut args = vec!["put", "ctx://acc/docs/c", "--content", "changed"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    for extra in [
        &["--type", "frob"][..],
        &["--owner-space", "admin:x"],
        &["--mode", "upsert"],
        &["--meta", "novalue"],
        &["--meta", "=empty-key"],
    ] {
        let args = put(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        rejected(&ce, &args, 2, "invalid_field");
    }
}

#[test]
fn usage_errors_keep_clap_exit_code() {
    let ce = seeded();
    let before = ce.snapshot("ctx://acc");
    for args in [
        &["put"][..],
        &["cat", "ctx://acc/docs/c", "--level", "abc"],
        &["frobnicate"],
        &[
            "put",
            "ctx://acc/docs/c",
            "--content",
            "x",
            "--content-file",
            "f",
        ],
        &["rm", "ctx://acc/docs/c", "--expect-version", "-1"],
    ] {
        let out = ce.run(args);
        assert_eq!(out.status.code(), Some(2), "ce {args:?}");
        assert!(!out.stderr.is_empty(), "ce {args:?} explains itself");
    }
    assert_eq!(ce.snapshot("ctx://acc"), before);
}

#[test]
fn oversize_text() {
    let mut ce = seeded();
    let cfg = ce.dir.path().join("small.toml");
    std::fs::write(&cfg, "[store]\nmax_layer_bytes = 1024\n").expect("write config");
    ce.config = Some(cfg);
    let big = "x".repeat(2000);
    rejected(
        &ce,
        &["put", "ctx://acc/docs/big", "--content", &big],
        5,
        "payload_too_large",
    );
    rejected(
        &ce,
        &["put", "ctx://acc/docs/c", "--abstract", &big],
        5,
        "payload_too_large",
    );
    // An append that would cross the limit is refused too.
    let half = "y".repeat(1000);
    ce.json(&[
        "put",
        "ctx://acc/docs/c",
        "--mode",
        "append",
        "--content",
        &half,
    ]);
    rejected(
        &ce,
        &[
            "put",
            "ctx://acc/docs/c",
            "--mode",
            "append",
            "--content",
            &half,
        ],
        5,
        "payload_too_large",
    );
}

#[test]
fn version_conflicts() {
    let ce = seeded();
    rejected(
        &ce,
        &[
            "put",
            "ctx://acc/docs/c",
            "--content",
            "new",
            "--expect-version",
            "7",
        ],
        4,
        "version_conflict",
    );
    // 0 means "must not exist".
    rejected(
        &ce,
        &[
            "put",
            "ctx://acc/docs/c",
            "--content",
            "new",
            "--expect-version",
            "0",
        ],
        4,
        "version_conflict",
    );
    rejected(
        &ce,
        &[
            "put",
            "ctx://acc/docs/new",
            "--content",
            "new",
            "--expect-version",
            "3",
        ],
        4,
        "version_conflict",
    );
    rejected(
        &ce,
        &["rm", "ctx://acc/docs/c", "--expect-version", "7"],
        4,
        "version_conflict",
    );
    // The right version goes through.
    let out = ce.json(&[
        "put",
        "ctx://acc/docs/c",
        "--content",
        "new",
        "--expect-version",
        "1",
    ]);
    assert_eq!(out["version"], 2);
}

#[test]
fn missing_nodes() {
    let ce = seeded();
    rejected(&ce, &["cat", "ctx://acc/docs/nope"], 3, "not_found");
    rejected(&ce, &["stat", "ctx://acc/docs/nope"], 3, "not_found");
    rejected(&ce, &["ls", "ctx://acc/docs/nope"], 3, "not_found");
    rejected(&ce, &["tree", "ctx://acc/docs/nope"], 3, "not_found");
    rejected(&ce, &["relations", "ctx://acc/docs/nope"], 3, "not_found");
    rejected(
        &ce,
        &["mv", "ctx://acc/docs/nope", "ctx://acc/docs/x"],
        3,
        "not_found",
    );
    // An rm of a missing path is refused too, but queues one cleanup of index records that
    // might be left under it (and changes no node).
    for (args, uri) in [
        (&["rm", "ctx://acc/docs/nope"][..], "ctx://acc/docs/nope"),
        (&["rm", "-r", "ctx://other"][..], "ctx://other"),
    ] {
        let (tree, outbox) = ce.snapshot("ctx://acc");
        let f = ce.fail(args, 3);
        assert_eq!(f.error["code"], "not_found", "ce {args:?}: {}", f.error);
        let (tree_after, outbox_after) = ce.snapshot("ctx://acc");
        assert_eq!(tree_after, tree, "ce {args:?} changed a node");
        let before = outbox.as_array().expect("rows").len();
        let added = &outbox_after.as_array().expect("rows")[before..];
        assert!(!added.is_empty(), "ce {args:?} queued no cleanup");
        for row in added {
            assert_eq!(row["event"]["event_type"], "DELETE_CONTEXT", "{row}");
            assert_eq!(row["event"]["uri"], uri, "{row}");
            assert_eq!(row["event"]["payload"]["recursive"], true, "{row}");
        }
    }
    rejected(&ce, &["outbox", "show", "999999"], 3, "not_found");
    rejected(&ce, &["outbox", "show", "evt-nope"], 3, "not_found");
}

#[test]
fn impossible_moves() {
    let ce = seeded();
    rejected(
        &ce,
        &["mv", "ctx://acc/docs", "ctx://acc/docs/a/inside"],
        2,
        "invalid_move",
    );
    rejected(
        &ce,
        &["mv", "ctx://acc/docs/a", "ctx://acc/docs/a/b"],
        2,
        "invalid_move",
    );
    rejected(
        &ce,
        &["mv", "ctx://acc/docs/a", "ctx://"],
        2,
        "invalid_move",
    );
    rejected(
        &ce,
        &["mv", "ctx://acc/docs/a", "ctx://acc/docs/c"],
        4,
        "already_exists",
    );
}

#[test]
fn bad_input_does_not_create_a_data_dir() {
    let parent = tempfile::tempdir().expect("tempdir");
    let fresh = parent.path().join("fresh");
    let fresh_str = fresh.to_str().expect("utf-8 path");
    for args in [
        &["cat", "ctx://a//b"][..],
        &["cat", "ctx://a/b", "--level", "7"],
        &["put", "http://x", "--content", "x"],
        &["put", "ctx://a/b", "--mode", "upsert"],
        &["outbox", "append", "--type", "FROB", "--payload", "{}"],
    ] {
        let mut all = vec!["--json", "--data-dir", fresh_str];
        all.extend_from_slice(args);
        let out = std::process::Command::new(super::harness::CE)
            .args(&all)
            .env_remove("CE_CONFIG")
            .output()
            .expect("ce runs");
        let f = super::harness::failure(&all, &out);
        assert_eq!(f.exit, 2, "{:?}", f.error);
        assert!(!fresh.exists(), "ce {all:?} created the data directory");
    }
}
