//! Derived layers through the binary (docs/derive.md): an imported tree with no L0 / L1 gets
//! derived layers on every node and folder after `ce worker --once`; status shows the derive
//! consumer; hierarchical search seeds on the folders' roll-ups; a client's layer stays.

use serde_json::Value;

use super::harness::Ce;

/// The derive consumer on, beside the default ones.
const DERIVE_ON: &str =
    "[index.outbox]\nconsumers = [\"vector\", \"keyword\", \"relation\", \"derive\"]\n";

fn write(root: &std::path::Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

fn stat(ce: &Ce, uri: &str) -> Value {
    ce.json(&["stat", uri])
}

fn origin(stat: &Value, layer: &str) -> String {
    stat["provenance"][layer]["origin"]
        .as_str()
        .unwrap_or("missing")
        .to_owned()
}

#[test]
fn an_imported_tree_gets_derived_layers_and_folders_roll_up() {
    let ce = Ce::hash(DERIVE_ON);
    let src = tempfile::tempdir().expect("tmp");
    let root = src.path();
    write(
        root,
        "cooking/tea.md",
        "# Tea\n\nGreen tea is brewed with water at 80 degrees. Black tea takes boiling water.\n\n\
         ## Storage\n\nKeep tea leaves dry and away from light.",
    );
    write(
        root,
        "cooking/bread.md",
        "Bread needs flour, water, salt and yeast. The dough rises for two hours before baking.",
    );
    write(
        root,
        "rust/ownership.md",
        "Rust's ownership rules free memory without a garbage collector. Every value has one owner.",
    );
    write(
        root,
        "rust/中文.md",
        "向量检索把文本变成向量。关键词检索匹配词项，两者可以融合。",
    );
    ce.ok(&[
        "import",
        root.to_str().expect("utf-8"),
        "--into",
        "ctx://acme/resources/kb",
    ]);
    let pending = stat(&ce, "ctx://acme/resources/kb/cooking/tea.md");
    assert_eq!(origin(&pending, "abstract"), "pending", "{pending}");
    ce.ok(&["worker", "--once"]);

    for leaf in [
        "cooking/tea.md",
        "cooking/bread.md",
        "rust/ownership.md",
        "rust/中文.md",
    ] {
        let uri = format!("ctx://acme/resources/kb/{leaf}");
        let s = stat(&ce, &uri);
        assert_eq!(origin(&s, "abstract"), "derived", "{uri}: {s}");
        assert_eq!(origin(&s, "overview"), "derived", "{uri}: {s}");
        assert_eq!(s["provenance"]["abstract"]["generator"], "extractive:1");
        let l0 = ce.ok(&["cat", &uri, "--level", "0"]);
        assert!(!l0.trim().is_empty(), "{uri} has an abstract");
    }
    let tea = ce.ok(&[
        "cat",
        "ctx://acme/resources/kb/cooking/tea.md",
        "--level",
        "0",
    ]);
    assert!(
        tea.contains("tea"),
        "the abstract is taken from the text: {tea}"
    );
    for folder in [
        "ctx://acme/resources/kb/cooking",
        "ctx://acme/resources/kb/rust",
        "ctx://acme/resources/kb",
        "ctx://acme/resources",
    ] {
        let s = stat(&ce, folder);
        assert_eq!(origin(&s, "abstract"), "derived", "{folder}: {s}");
        let l1 = ce.ok(&["cat", folder, "--level", "1"]);
        assert!(!l1.trim().is_empty(), "{folder} has an overview");
    }
    let cooking = ce.ok(&["cat", "ctx://acme/resources/kb/cooking", "--level", "1"]);
    assert!(
        cooking.contains("tea.md") && cooking.contains("bread.md"),
        "the roll-up names its children: {cooking}"
    );

    let status = ce.json(&["status"]);
    let d = &status["derive"];
    assert_eq!(d["generator"], "extractive:1", "{status}");
    assert_eq!(d["dirty"], 0, "{status}");
    assert!(
        d["today"]["derivations"].as_u64().unwrap_or(0) >= 8,
        "{status}"
    );
    let consumers: Vec<&str> = status["consumers"]
        .as_array()
        .expect("consumers")
        .iter()
        .filter_map(|c| c["consumer"].as_str())
        .collect();
    assert!(consumers.contains(&"derive"), "{consumers:?}");
    for c in status["consumers"].as_array().expect("consumers") {
        assert_eq!(c["pending"], 0, "{c}");
    }

    // Hierarchical search seeds on folders, which now have text of their own.
    let hits = ce.json(&["search", "brewing green tea", "--mode", "hierarchical"]);
    let text = hits.to_string();
    assert!(
        text.contains("cooking"),
        "the cooking folder is found: {text}"
    );

    // A client's abstract wins and is kept through a later content change.
    let uri = "ctx://acme/resources/kb/rust/ownership.md";
    ce.ok(&["put", uri, "--mode", "merge", "--abstract", "Mine."]);
    ce.ok(&[
        "put",
        uri,
        "--mode",
        "merge",
        "--content",
        "Borrowing lets code use a value without owning it.",
    ]);
    ce.ok(&["worker", "--once"]);
    assert_eq!(ce.ok(&["cat", uri, "--level", "0"]).trim(), "Mine.");
    let s = stat(&ce, uri);
    assert_eq!(origin(&s, "abstract"), "user");
    assert_eq!(origin(&s, "overview"), "derived");
    let l1 = ce.ok(&["cat", uri, "--level", "1"]);
    assert!(
        l1.contains("Borrowing"),
        "the overview follows the new content: {l1}"
    );
    // …and handed back, it is derived again.
    ce.ok(&["put", uri, "--mode", "merge", "--derive-abstract"]);
    ce.ok(&["worker", "--once"]);
    let s = stat(&ce, uri);
    assert_eq!(origin(&s, "abstract"), "derived", "{s}");
    assert_ne!(ce.ok(&["cat", uri, "--level", "0"]).trim(), "Mine.");
}

#[test]
fn a_pending_layer_is_not_indexed_until_it_is_derived() {
    // The keyword consumer alone first: the derive consumer has not run, so only L2 is
    // indexed (a fallback L0 / L1 would be replaced minutes later).
    let ce = Ce::hash(DERIVE_ON);
    ce.put(
        "ctx://acme/resources/doc",
        "Tea is brewed with hot water. Green tea needs cooler water than black tea.",
    );
    ce.ok(&["worker", "--once", "--consumer", "keyword"]);
    let found = |ce: &Ce, level: &str| -> usize {
        let v = ce.json(&[
            "search",
            "tea",
            "--mode",
            "keyword",
            "--level",
            level,
            "--subtree",
            "ctx://acme/resources/doc",
        ]);
        v["hits"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(
        (found(&ce, "0"), found(&ce, "1"), found(&ce, "2")),
        (0, 0, 1)
    );
    ce.ok(&["worker", "--once"]);
    assert_eq!(
        (found(&ce, "0"), found(&ce, "1"), found(&ce, "2")),
        (1, 1, 1)
    );
}
