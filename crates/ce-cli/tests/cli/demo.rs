//! `ce demo` runs from the repository root (and from anywhere else, via the source path).

use super::harness::{Ce, repo_root, success};

#[test]
fn demo_runs_from_the_repo_root() {
    let ce = Ce::new();
    let out = ce
        .command(&["demo"])
        .current_dir(repo_root())
        .output()
        .expect("ce runs");
    let text = success(&["demo"], out);
    assert!(text.contains("$ ce tree ctx://demo"), "{text}");
    assert!(text.contains("communication-style"), "{text}");
    assert!(text.contains("$ ce cat ctx://demo/"), "{text}");
    assert!(text.contains("$ ce outbox stats"), "{text}");

    let report = ce.json(&["stat", "ctx://demo/users/alice/memories/preferences/food"]);
    assert_eq!(report["owner_space"], "user:alice");
    assert_eq!(report["category"], "preferences");
}

#[test]
fn demo_json_reports_every_step_and_is_idempotent() {
    let ce = Ce::new();
    // From a directory without examples/, the tree is found next to the sources.
    let cwd = tempfile::tempdir().expect("tempdir");
    let run = || {
        let out = ce
            .command(&["--json", "demo"])
            .current_dir(cwd.path())
            .output()
            .expect("ce runs");
        let text = success(&["--json", "demo"], out);
        serde_json::from_str::<serde_json::Value>(&text).expect("one JSON document")
    };
    let first = run();
    let written = first["import"]["nodes_written"].as_u64().expect("count");
    assert!(written >= 15, "{}", first["import"]);
    assert!(
        first["import"]["relations_written"]
            .as_u64()
            .expect("count")
            > 0
    );
    let tree = first["tree"].as_array().expect("tree");
    assert_eq!(tree[0]["uri"], "ctx://demo");
    assert_eq!(tree.len() as u64, written);
    let cats = first["cat"].as_array().expect("cats");
    assert_eq!(cats.len(), 2);
    assert!(
        cats.iter()
            .all(|c| !c["text"].as_str().expect("text").is_empty())
    );
    assert_eq!(first["outbox_stats"].as_array().expect("stats").len(), 3);
    for key in ["open_ms", "import_ms", "tree_ms", "stats_ms"] {
        assert!(first[key].as_f64().is_some_and(|v| v >= 0.0), "{key}");
    }

    // Importing the same tree again writes nothing and appends no event.
    let second = run();
    assert_eq!(second["import"]["nodes_written"], 0);
    assert_eq!(second["import"]["nodes_unchanged"], written);
    assert_eq!(second["import"]["events"], 0);
    assert_eq!(second["outbox_stats"], first["outbox_stats"]);
}
