//! `ce import` / `ce export` in the on-disk node layout.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::harness::{Ce, repo_root};

/// Every file under `dir`, by relative path.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).expect("under dir");
                out.insert(
                    rel.to_string_lossy().into_owned(),
                    std::fs::read(&path).expect("read"),
                );
            }
        }
    }
    out
}

#[test]
fn export_import_export_is_byte_identical() {
    let ce = Ce::new();
    let demo = repo_root().join("examples/demo-tree");
    let demo = demo.to_str().expect("utf-8 path");
    let imported = ce.json(&["import", demo, "--into", "ctx://acc/kb"]);
    assert!(imported["nodes_written"].as_u64().expect("count") >= 15);
    assert_eq!(imported["skipped"], serde_json::json!([]));
    let food = ce.json(&[
        "cat",
        "ctx://acc/kb/users/alice/memories/preferences/food",
        "--level",
        "0",
    ]);
    assert!(
        food["text"].as_str().expect("text").contains("素食"),
        "{food}"
    );
    let rel = ce.json(&[
        "relations",
        "ctx://acc/kb/agents/support-bot/skills/refund-request",
    ]);
    // Relative targets in .relations.json resolve under the import root.
    let targets: Vec<&str> = rel["outgoing"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|e| e["to_uri"].as_str().expect("uri"))
        .collect();
    assert_eq!(
        targets,
        [
            "ctx://acc/kb/agents/support-bot/skills/escalate-to-human",
            "ctx://acc/kb/resources/docs/refund-policy",
        ]
    );

    let out = tempfile::tempdir().expect("tempdir");
    let first = out.path().join("first");
    let second = out.path().join("second");
    let report = ce.json(&["export", "ctx://acc/kb", first.to_str().expect("path")]);
    assert_eq!(report["nodes"], imported["nodes_written"]);
    ce.json(&[
        "import",
        first.to_str().expect("path"),
        "--into",
        "ctx://acc/kb2",
    ]);
    ce.json(&["export", "ctx://acc/kb2", second.to_str().expect("path")]);
    let (a, b) = (files(&first), files(&second));
    assert!(a.contains_key("users/alice/memories/preferences/food/content.md"));
    assert_eq!(a, b);

    // Exporting over a non-empty directory is refused and writes nothing.
    let before = files(&first);
    let f = ce.fail(
        &["export", "ctx://acc/kb", first.to_str().expect("path")],
        2,
    );
    assert_eq!(f.error["code"], "invalid_field");
    assert_eq!(files(&first), before);
}

/// `ce import --prune` re-syncs a directory: nodes whose files vanished are removed with the
/// import, within the delete-safety limits (a derived deletion of more than 25 % of a scope
/// of at least 20 is refused and changes nothing) unless `--allow-large-delete`.
#[test]
fn import_prune_removes_what_vanished_within_the_delete_safety_limits() {
    let ce = Ce::new();
    let src = tempfile::tempdir().expect("tempdir");
    for i in 0..30 {
        std::fs::write(src.path().join(format!("doc{i:02}.md")), format!("doc {i}"))
            .expect("write");
    }
    let dir = src.path().to_str().expect("utf-8 path");
    let first = ce.json(&["import", dir, "--into", "ctx://acc/kb"]);
    assert_eq!(first["nodes_written"], 31, "30 leaves and the root");
    let children = |ce: &Ce| {
        ce.json(&["ls", "ctx://acc/kb"])
            .as_array()
            .expect("ls")
            .len()
    };
    assert_eq!(children(&ce), 30);

    // 5 of 31 vanish: within the limits.
    for i in 0..5 {
        std::fs::remove_file(src.path().join(format!("doc{i:02}.md"))).expect("rm");
    }
    let plain = ce.json(&["import", dir, "--into", "ctx://acc/kb"]);
    assert_eq!(
        plain["nodes_removed"], 0,
        "without --prune nothing is removed"
    );
    assert_eq!(children(&ce), 30);
    let pruned = ce.json(&["import", dir, "--into", "ctx://acc/kb", "--prune"]);
    assert_eq!(pruned["nodes_removed"], 5);
    // The report counts the DELETE events the prune appended (issue 13: it said 0).
    assert_eq!(pruned["events"], 5, "{pruned}");
    assert_eq!(children(&ce), 25);
    ce.fail(&["cat", "ctx://acc/kb/doc00.md"], 3);

    // 10 of 26 (38 %) vanish: refused, and nothing changes.
    for i in 5..15 {
        std::fs::remove_file(src.path().join(format!("doc{i:02}.md"))).expect("rm");
    }
    let before = ce.snapshot("ctx://acc");
    let f = ce.fail(&["import", dir, "--into", "ctx://acc/kb", "--prune"], 4);
    assert_eq!(f.error["code"], "large_delete", "{}", f.error);
    assert_eq!(f.error["retryable"], false, "{}", f.error);
    let message = f.error["message"].as_str().expect("message");
    assert!(message.contains("10 of 26"), "{message}");
    assert!(message.contains("--allow-large-delete"), "{message}");
    assert_eq!(
        ce.snapshot("ctx://acc"),
        before,
        "a refused prune changed the store"
    );
    // The override lets it through; the import's lock was released after the refusal.
    let forced = ce.json(&[
        "import",
        dir,
        "--into",
        "ctx://acc/kb",
        "--prune",
        "--allow-large-delete",
    ]);
    assert_eq!(forced["nodes_removed"], 10);
    assert_eq!(children(&ce), 15);
}

/// An import that changed nothing appends no events and holds nothing, so an `rm -r` right
/// after it succeeds without a worker; while an import that changed something is not
/// indexed yet, the busy error names it (its hold id and age) and the fix.
#[test]
fn a_no_op_import_holds_nothing_and_a_busy_rm_names_the_import() {
    let ce = Ce::hash("[lock]\nwait_ms = 200\n");
    let src = tempfile::tempdir().expect("tempdir");
    for i in 0..3 {
        std::fs::write(src.path().join(format!("doc{i}.md")), format!("doc {i}")).expect("write");
    }
    let dir = src.path().to_str().expect("utf-8 path");
    let first = ce.json(&["import", dir, "--into", "ctx://acc/kb"]);
    let hold = first["hold"]
        .as_str()
        .expect("the first import holds its subtree");
    let f = ce.fail(&["rm", "-r", "ctx://acc/kb"], 4);
    assert_eq!(f.error["code"], "busy", "{}", f.error);
    assert_eq!(f.error["retryable"], true, "{}", f.error);
    let message = f.error["message"].as_str().expect("message");
    for part in [hold, "import", "ctx://acc/kb", "s ago", "ce worker --once"] {
        assert!(message.contains(part), "{part:?} missing: {message}");
    }
    // Indexed: the hold ends. The same import again changes nothing and holds nothing.
    ce.json(&["worker", "--once"]);
    let again = ce.json(&["import", dir, "--into", "ctx://acc/kb"]);
    assert_eq!(again["events"], 0, "{again}");
    assert_eq!(again["nodes_written"], 0, "{again}");
    assert!(again["hold"].is_null(), "{again}");
    let human = ce.ok(&["import", dir, "--into", "ctx://acc/kb"]);
    assert!(human.contains("hold                none"), "{human}");
    assert_eq!(ce.json(&["status"])["holds"], serde_json::json!([]));
    let removed = ce.json(&["rm", "-r", "ctx://acc/kb"]);
    assert_eq!(removed["nodes_affected"], 4, "{removed}");
}

/// A re-import reads only the directories whose entries changed (the stat cache in the data
/// directory vouches for the others), finds an edit, and `--read-all` reads everything.
#[test]
fn a_reimport_reads_only_what_changed_and_read_all_reads_everything() {
    let ce = Ce::hash("");
    let src = tempfile::tempdir().expect("tempdir");
    for i in 0..3 {
        let d = src.path().join(format!("d{i}"));
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("content.md"), format!("document {i}")).expect("write");
    }
    // Past the racy window: a stat vouches only for a file that changed longer ago.
    let settle = || std::thread::sleep(Duration::from_millis(2_100));
    settle();
    let dir = src.path().to_str().expect("utf-8 path");
    let import = |extra: &[&str]| {
        let mut args = vec!["import", dir, "--into", "ctx://acc/kb"];
        args.extend_from_slice(extra);
        ce.json(&args)
    };
    let first = import(&[]);
    assert_eq!(
        (
            first["nodes_written"].as_u64(),
            first["nodes_not_read"].as_u64()
        ),
        (Some(4), Some(0)),
        "{first}"
    );
    let again = import(&[]);
    assert_eq!(again["nodes_unchanged"], 4, "{again}");
    assert_eq!(again["nodes_not_read"], 4, "{again}");
    std::fs::write(src.path().join("d1").join("content.md"), "document one").expect("edit");
    let edited = import(&[]);
    assert_eq!(edited["nodes_written"], 1, "{edited}");
    assert_eq!(edited["nodes_not_read"], 3, "d1 alone was read: {edited}");
    let node = ce.json(&["cat", "ctx://acc/kb/d1"]);
    assert!(node.to_string().contains("document one"), "{node}");
    // Without the cache, --read-all records what it reads: the next import vouches for all
    // but d1, and for d1 too if its edit is more than the racy window old by then.
    std::fs::remove_dir_all(ce.data_dir().join("import-stat")).expect("rm the cache");
    let all = import(&["--read-all"]);
    assert_eq!(all["nodes_unchanged"], 4, "{all}");
    assert_eq!(all["nodes_not_read"], 0, "{all}");
    let after = import(&[]);
    let not_read = after["nodes_not_read"].as_u64();
    assert!(matches!(not_read, Some(3 | 4)), "{after}");
    for key in ["read_ms", "write_ms", "record_ms"] {
        assert!(
            after[key].as_f64().is_some_and(|ms| ms >= 0.0),
            "{key}: {after}"
        );
    }
    let human = ce.ok(&["import", dir, "--into", "ctx://acc/kb"]);
    assert!(
        human.contains("nodes_not_read") && human.contains("took "),
        "{human}"
    );
    let caches = std::fs::read_dir(ce.data_dir().join("import-stat"))
        .expect("the stat cache's directory")
        .count();
    assert_eq!(caches, 1);
}
