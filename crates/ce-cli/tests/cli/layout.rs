//! `ce import` / `ce export` in the on-disk node layout.

use std::collections::BTreeMap;
use std::path::Path;

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
