//! `ce demo` runs from the repository root (and from anywhere else, via the source path),
//! indexes what it imported and searches it. The tests use the hashing embedder; without a
//! model the demo stops before importing, with the fix.

use super::harness::{Ce, repo_root, success};

#[test]
fn demo_runs_from_the_repo_root() {
    let ce = Ce::hash("");
    let out = ce
        .command(&["demo"])
        .current_dir(repo_root())
        .output()
        .expect("ce runs");
    let text = success(&["demo"], out);
    assert!(text.contains("$ ce tree ctx://demo"), "{text}");
    assert!(text.contains("communication-style"), "{text}");
    assert!(text.contains("$ ce cat ctx://demo/"), "{text}");
    assert!(text.contains("$ ce worker --once"), "{text}");
    assert!(text.contains("$ ce search \""), "{text}");
    assert!(text.contains("$ ce status"), "{text}");

    let report = ce.json(&["stat", "ctx://demo/users/alice/memories/preferences/food"]);
    assert_eq!(report["owner_space"], "user:alice");
    assert_eq!(report["category"], "preferences");
}

#[test]
fn demo_json_reports_every_step_and_is_idempotent() {
    let ce = Ce::hash("");
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
    // Every event was indexed by every consumer, and the searches ran on the demo subtree.
    let remaining = first["index"]["remaining"].as_array().expect("remaining");
    assert_eq!(
        remaining.len(),
        4,
        "vector, keyword, relation, derive: {}",
        first["index"]
    );
    assert!(
        remaining
            .iter()
            .all(|r| r["pending"] == 0 && r["applied"] == true)
    );
    // One delivery per event and consumer: the import's events and the derived write-backs.
    let progress = &first["index"]["progress"];
    assert_eq!(
        progress["succeeded"].as_u64(),
        progress["events"].as_u64().map(|n| n * 4),
        "{}",
        first["index"]
    );
    assert!(
        progress["events"].as_u64() > first["import"]["events"].as_u64(),
        "{}",
        first["index"]
    );
    let searches = first["searches"].as_array().expect("searches");
    assert_eq!(searches.len(), 4);
    for s in searches {
        let hits = s["result"]["hits"].as_array().expect("hits");
        assert!(!hits.is_empty() && hits.len() <= 3, "{s}");
        assert!(
            hits.iter().all(|h| h["uri"]
                .as_str()
                .is_some_and(|u| u.starts_with("ctx://demo/"))),
            "{s}"
        );
    }
    assert_eq!(
        first["status"]["consumers"]
            .as_array()
            .expect("consumers")
            .len(),
        4,
        "vector, keyword, relation, derive"
    );
    for key in ["open_ms", "import_ms", "tree_ms"] {
        assert!(first[key].as_f64().is_some_and(|v| v >= 0.0), "{key}");
    }

    // Importing the same tree again writes nothing, appends no event, indexes nothing.
    let second = run();
    assert_eq!(second["import"]["nodes_written"], 0);
    assert_eq!(second["import"]["nodes_unchanged"], written);
    assert_eq!(second["import"]["events"], 0);
    assert_eq!(second["index"]["progress"]["claimed"], 0);
    let counts = |v: &serde_json::Value| -> Vec<(String, u64, u64)> {
        v["status"]["consumers"]
            .as_array()
            .expect("consumers")
            .iter()
            .map(|c| {
                (
                    c["consumer"].as_str().unwrap_or_default().to_owned(),
                    c["pending"].as_u64().unwrap_or(0),
                    c["done"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    assert_eq!(counts(&second), counts(&first));
}

#[test]
fn demo_without_the_model_says_how_to_get_it_and_imports_nothing() {
    let ce = Ce::new();
    let missing = ce.data_dir().join("no-model");
    ce.write_config(&format!(
        "[index.embedding]\nprovider = \"local\"\nmodel_dir = {:?}\n",
        missing.display().to_string()
    ));
    let f = ce.fail(&["demo"], 6);
    assert_eq!(f.error["code"], "unavailable");
    let message = f.error["message"].as_str().expect("message");
    assert!(message.contains("scripts/fetch-model.sh"), "{message}");
    assert_eq!(ce.json(&["ls"]), serde_json::json!([]));
}
