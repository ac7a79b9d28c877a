//! The model's tokenizer, fixtures and golden files.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;

use ce_ingest::{Chunking, ParsedDocument};
use tokenizers::Tokenizer;

/// The tokenizer of the default embedding model, found as ce-embed finds the model, with
/// no truncation and no padding.
pub fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = ce_embed::default_model_dir().join("tokenizer.json");
        let mut t = Tokenizer::from_file(&path).unwrap_or_else(|e| {
            panic!(
                "the embedding model's tokenizer is required for this test ({}: {e}); \
                 run scripts/fetch-model.sh (or set CE_MODEL_DIR) first",
                path.display()
            )
        });
        t.with_truncation(None).expect("truncation off");
        t.with_padding(None);
        t
    })
}

/// Tokens of `text` as the model is given it: special tokens included.
pub fn model_tokens(text: &str) -> usize {
    tokenizer()
        .encode(text, true)
        .expect("the tokenizer encodes any text")
        .len()
}

pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn fixture(name: &str) -> Vec<u8> {
    let path = fixture_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Parse output and chunks as reviewable text.
pub fn render(doc: &ParsedDocument, chunking: &Chunking) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "format: {}", doc.format);
    let _ = writeln!(out, "language: {}", doc.language.unwrap_or("-"));
    let _ = writeln!(out, "title: {}", doc.title.as_deref().unwrap_or("-"));
    let pages: Vec<String> = doc.pages.iter().map(|r| format!("{r:?}")).collect();
    let _ = writeln!(out, "pages: [{}]", pages.join(", "));
    let _ = writeln!(out, "blocks: {}", doc.blocks.len());
    for (i, b) in doc.blocks.iter().enumerate() {
        let kind = match &b.kind {
            ce_ingest::BlockKind::Heading { level, title } => format!("h{level} {title:?}"),
            ce_ingest::BlockKind::Prose => "prose".into(),
            ce_ingest::BlockKind::Code => "code".into(),
            ce_ingest::BlockKind::Table => "table".into(),
        };
        let page = b.page.map(|p| format!(" page {p}")).unwrap_or_default();
        let head: String = doc.block_text(b).chars().take(48).collect();
        let _ = writeln!(out, "  [{i}] {kind} {:?}{page} {head:?}", b.range);
    }
    match chunking {
        Chunking::Whole { tokens } => {
            let _ = writeln!(out, "chunking: whole, {tokens} tokens");
            let _ = writeln!(out, "=== text\n{}", doc.text);
        }
        Chunking::Split { chunks } => {
            let _ = writeln!(out, "chunking: split, {} chunks", chunks.len());
            for c in chunks {
                let pages = c
                    .pages
                    .map(|p| format!(" pages {}-{}", p.first, p.last))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "=== chunk {} {:?} {} tokens overlap {} path {:?}{pages}\n{}",
                    c.index, c.range, c.tokens, c.overlap, c.heading_path, c.text
                );
            }
        }
    }
    out
}

/// Compares `actual` with `tests/golden/{name}.txt`, or rewrites it when
/// `CE_UPDATE_GOLDEN=1`.
pub fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if std::env::var("CE_UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "read {}: {e} (CE_UPDATE_GOLDEN=1 writes it)",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output at line {}:\nexpected: {:?}\nactual:   {:?}\n\
             (review, then CE_UPDATE_GOLDEN=1 rewrites it)",
            path.display(),
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}
