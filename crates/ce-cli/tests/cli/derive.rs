//! Derived layers through the binary (docs/derive.md): an imported tree with no L0 / L1 gets
//! derived layers on every node and folder after `ce worker --once`; status shows the derive
//! consumer; hierarchical search seeds on the folders' roll-ups; a client's layer stays.

use serde_json::{Value, json};

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
    // The leaves are short: derived in their writes (docs/derive.md, "Derived at write
    // time"), once. The folders wait for the consumer, which rolls them up.
    let tea = stat(&ce, "ctx://acme/resources/kb/cooking/tea.md");
    assert_eq!(origin(&tea, "abstract"), "derived", "{tea}");
    assert_eq!(tea["version"], 1, "{tea}");
    let cooking = stat(&ce, "ctx://acme/resources/kb/cooking");
    assert_eq!(origin(&cooking, "abstract"), "pending", "{cooking}");
    ce.ok(&["worker", "--once"]);
    assert_eq!(
        stat(&ce, "ctx://acme/resources/kb/cooking/tea.md")["version"],
        1
    );

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
        assert_eq!(s["provenance"]["abstract"]["generator"], "extractive:2");
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
    assert_eq!(d["generator"], "extractive:2", "{status}");
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

/// Leaves left to the derive consumer, as one longer than `derive.inline_max_chars` is.
const INLINE_OFF: &str = "[derive]\ninline_max_chars = 0\n";

#[test]
fn a_pending_layer_is_not_indexed_until_it_is_derived() {
    // The keyword consumer alone first: the derive consumer has not run, so only L2 is
    // indexed (a fallback L0 / L1 would be replaced minutes later).
    let ce = Ce::hash(&format!("{DERIVE_ON}{INLINE_OFF}"));
    let doc = "Tea is brewed with hot water. Green tea needs cooler water than black tea.";
    ce.put("ctx://acme/resources/doc", doc);
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

    // Derived in its write (the default for a leaf this short), the document is indexed
    // with its three layers by the keyword consumer's first pass.
    let ce = Ce::hash(DERIVE_ON);
    ce.put("ctx://acme/resources/doc", doc);
    ce.ok(&["worker", "--once", "--consumer", "keyword"]);
    assert_eq!(
        (found(&ce, "0"), found(&ce, "1"), found(&ce, "2")),
        (1, 1, 1)
    );
}

#[test]
fn a_new_document_costs_one_embedding_per_distinct_text() {
    // A remote embedder that lists every text it embeds, behind the embedding cache.
    let embeddings = super::fake_embeddings::FakeEmbeddings::start(false);
    let ce = super::harness::Ce::new();
    ce.write_config(&embeddings.embedding_config(8));
    let src = tempfile::tempdir().expect("tmp");
    write(
        src.path(),
        "guides/tea.md",
        // Longer than the 200 characters of the L0 fallback: a fallback would be new text.
        "# Tea\n\nGreen tea is brewed at 80 degrees for two minutes. Black tea takes boiling \
         water and steeps for four. Oolong sits between them, at about 90 degrees.\n\n\
         ## Storage\n\nKeep the leaves dry, cool and away from light, in a tin that closes \
         tightly; they lose their aroma within a year.",
    );
    write(
        src.path(),
        "guides/bread.md",
        "Bread needs flour, water, salt and yeast. The dough rises for two hours.",
    );
    write(src.path(), "notes.md", "Buy more tea leaves on Friday.");
    ce.ok(&[
        "import",
        src.path().to_str().expect("utf-8"),
        "--into",
        "ctx://acme/resources/kb",
    ]);
    ce.ok(&["worker", "--once"]);

    // What the indexes hold now: every node's L0 / L1 / L2 text, fallbacks applied.
    let mut current = std::collections::BTreeSet::new();
    let tree = ce.json(&["tree", "ctx://acme"]);
    for node in tree.as_array().expect("tree") {
        let uri = node["uri"].as_str().expect("uri");
        for level in ["0", "1", "2"] {
            let c = ce.json(&["cat", uri, "--level", level]);
            let text = c["text"].as_str().expect("text");
            if !text.is_empty() {
                current.insert(text.to_owned());
            }
        }
    }
    let embedded = embeddings.embedded();
    let distinct: std::collections::BTreeSet<String> = embedded.iter().cloned().collect();
    assert_eq!(
        embedded.len(),
        distinct.len(),
        "a text was embedded twice: {embedded:#?}"
    );
    // Exactly the current texts: no fallback L0 / L1 (cut from L2) was embedded while the
    // derivation was pending, and every derived layer was embedded once it was written.
    assert_eq!(distinct, current);
    let status = ce.json(&["status"]);
    assert_eq!(status["derive"]["dirty"], 0, "{status}");
}

#[test]
fn a_dry_run_counts_the_derivations_and_tokens_before_spending_any() {
    let ce = Ce::hash(INLINE_OFF);
    for (uri, text) in [
        (
            "ctx://acme/resources/kb/a",
            "Alpha is the first letter. It starts the alphabet.",
        ),
        (
            "ctx://acme/resources/kb/b",
            "Beta comes second. Software is in beta before release.",
        ),
    ] {
        ce.put(uri, text);
    }
    // a, b, kb, resources and the account: five open dirty keys; extractive spends nothing.
    let r = &ce.json(&["worker", "--dry-run", "--consumer", "derive"])[0];
    assert_eq!(
        (
            &r["consumer"],
            &r["events"],
            &r["actions"]["derive"],
            &r["valid"]
        ),
        (&json!("derive"), &json!(5), &json!(5), &json!(true)),
        "{r}"
    );
    assert_eq!(
        r["spend"],
        json!({"generator": "extractive:2", "derivations": 5, "tokens_in": 0, "tokens_out": 0}),
        "{r}"
    );
    let text = ce.ok(&["worker", "--dry-run", "--consumer", "derive"]);
    assert!(
        text.contains("5 derivations by extractive:2: about 0 tokens in"),
        "{text}"
    );
    // Nothing was derived or written.
    let stat = ce.json(&["stat", "ctx://acme/resources/kb/a"]);
    assert_eq!(origin(&stat, "abstract"), "pending", "{stat}");

    // With an LLM configured, the estimate counts its prompt tokens; no request is sent (the
    // endpoint does not exist).
    ce.write_config(&format!(
        "{}[derive]\ngenerator = \"llm\"\n[derive.llm]\nbase_url = \"http://127.0.0.1:9\"\n\
         model = \"m\"\nmax_tokens = 100\n",
        super::harness::HASH_EMBEDDER
    ));
    let r = &ce.json(&["worker", "--dry-run", "--consumer", "derive"])[0];
    let spend = &r["spend"];
    assert_eq!(spend["generator"], "llm:1001:m", "{r}");
    assert_eq!(spend["derivations"], 5, "{r}");
    assert!(spend["tokens_in"].as_u64() > Some(50), "{r}");
    assert_eq!(spend["tokens_out"], 500, "at most max_tokens each: {r}");

    // Once drained, nothing is left to derive.
    ce.write_config(super::harness::HASH_EMBEDDER);
    ce.ok(&["worker", "--once"]);
    let r = &ce.json(&["worker", "--dry-run", "--consumer", "derive"])[0];
    assert_eq!(
        (&r["events"], &r["spend"]["derivations"]),
        (&json!(0), &json!(0)),
        "{r}"
    );
}
