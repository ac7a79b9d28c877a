//! Golden outputs of the extractive generator on English and Chinese texts written for these
//! tests (`tests/golden/*`): each input's L0 and L1 must equal, byte for byte, the file
//! `<input>.expected.json` next to it. After a deliberate change of the algorithm (and a bump
//! of `extractive::VERSION`), regenerate with `CE_BLESS=1 cargo test -p ce-derive --test
//! golden` and review the diff.

use std::path::Path;

use ce_derive::extractive::derive_one;
use ce_derive::{Budget, Child, DeriveInput};
use serde_json::{Value, json};

fn check(name: &str, input: &DeriveInput) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let d = derive_one(input, Budget::default());
    let got = json!({"abstract": d.abstract_text, "overview": d.overview});
    let path = dir.join(format!("{name}.expected.json"));
    if std::env::var_os("CE_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&got).expect("json") + "\n";
        std::fs::write(&path, text).expect("bless");
        return;
    }
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .expect("expected json");
    assert_eq!(got, want, "{name}: the derived layers changed");
    // Within the budget, and every sentence is the input's own.
    let b = Budget::default();
    for (layer, max) in [("abstract", b.l0_chars), ("overview", b.l1_chars)] {
        if let Some(text) = got[layer].as_str() {
            assert!(text.chars().count() <= max, "{name} {layer}: over budget");
        }
    }
}

fn leaf(file: &str) -> DeriveInput {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    DeriveInput::Leaf {
        content: std::fs::read_to_string(path).expect("input"),
    }
}

#[test]
fn english_guide_with_headings_lists_and_code() {
    check("en-guide.md", &leaf("en-guide.md"));
}

#[test]
fn chinese_article() {
    check("zh-article.md", &leaf("zh-article.md"));
}

#[test]
fn english_plain_text_without_headings() {
    check("en-plain.txt", &leaf("en-plain.txt"));
}

#[test]
fn a_folder_rolls_up_its_children_named() {
    let child = |name: &str, abstract_text: &str| Child {
        name: name.into(),
        abstract_text: abstract_text.into(),
    };
    let mut children = vec![
        child(
            "pooling",
            "A connection pool keeps a small set of server connections open and lends them to clients.",
        ),
        child(
            "vacuum",
            "VACUUM reclaims the space of dead rows and keeps the visibility map current.",
        ),
        child(
            "indexes",
            "B-tree indexes serve equality and range queries on sortable columns.",
        ),
        child(
            "replication",
            "Streaming replication ships the write-ahead log to standby servers.",
        ),
        child("drafts", ""),
    ];
    for i in 0..12 {
        children.push(child(
            &format!("note-{i:02}"),
            &format!("Meeting note {i} about connection limits and server settings."),
        ));
    }
    check(
        "folder",
        &DeriveInput::Container {
            content: String::new(),
            children,
        },
    );
}
