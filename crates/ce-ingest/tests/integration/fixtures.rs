//! Every parser on its real fixtures: golden parse + chunk output, plus the properties each
//! format promises (what is dropped, titles, pages, languages, errors).

use ce_core::{Classify, ErrorCode};
use ce_ingest::{
    BlockKind, Chunk, ChunkOptions, Chunking, Format, Hint, IngestError, ParsedDocument,
    check_chunks, chunk, parse,
};

use crate::common::{fixture, golden, model_tokens, render};

/// Parses fixture `name` with `hint`, chunks it with the defaults and the model's tokenizer,
/// checks the invariants and the golden file.
fn run(name: &str, hint: Hint<'_>) -> (ParsedDocument, Chunking) {
    let doc = parse(&fixture(name), hint).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(doc.check(), Ok(()), "{name}");
    let options = ChunkOptions::default();
    let chunking = chunk(&doc, &model_tokens, &options).expect("valid options");
    if let Chunking::Split { chunks } = &chunking {
        assert_eq!(
            check_chunks(&doc, chunks, &model_tokens, &options),
            Ok(()),
            "{name}"
        );
    }
    golden(name, &render(&doc, &chunking));
    (doc, chunking)
}

fn chunks(chunking: Chunking) -> Vec<Chunk> {
    match chunking {
        Chunking::Split { chunks } => chunks,
        Chunking::Whole { tokens } => {
            panic!("expected a split, the document is whole ({tokens} tokens)")
        }
    }
}

#[test]
fn markdown_headings_become_sections_small_ones_merge_large_ones_split_with_overlap() {
    let (doc, chunking) = run("guide.md", Hint::file("docs/guide.md"));
    assert_eq!(doc.format, Format::Markdown);
    assert_eq!(
        doc.title.as_deref(),
        Some("Importing Documents into a Knowledge Base")
    );
    let headings: Vec<(u8, &str)> = doc
        .blocks
        .iter()
        .filter_map(|b| match &b.kind {
            BlockKind::Heading { level, title } => Some((*level, title.as_str())),
            _ => None,
        })
        .collect();
    assert!(
        headings.contains(&(2, "Setext headings work too")),
        "{headings:?}"
    );
    assert!(headings.contains(&(3, "Supported formats")), "{headings:?}");
    let chunks = chunks(chunking);
    let top = "Importing Documents into a Knowledge Base";
    // The one-sentence section is merged with a neighbour.
    let small = chunks
        .iter()
        .find(|c| c.text.contains("## Before You Start"))
        .expect("a chunk holds the small section");
    assert!(
        small.text.contains("A knowledge base is a subtree")
            || small.text.contains("## Adding Items"),
        "merged: {small:?}"
    );
    // The long paragraph of "Adding Items" is split at sentence boundaries, with an overlap.
    let adding: Vec<&Chunk> = chunks
        .iter()
        .filter(|c| c.heading_path == [top, "Adding Items"])
        .collect();
    assert!(adding.len() >= 2, "{adding:#?}");
    assert!(adding[1..].iter().all(|c| c.overlap > 0), "{adding:#?}");
    for c in &adding[1..] {
        let repeated = &c.text[..c.overlap];
        assert!(
            repeated.ends_with('.') || repeated.ends_with(". "),
            "whole sentences: {repeated:?}"
        );
    }
    // No chunk ends with a heading whose body is in the next one.
    for c in &chunks[..chunks.len() - 1] {
        let last_line = c.text.lines().last().unwrap_or("");
        assert!(
            !last_line.starts_with('#'),
            "chunk {} ends with a heading: {last_line:?}",
            c.index
        );
    }
    // The fenced code block survives whole inside one chunk.
    assert!(
        chunks
            .iter()
            .any(|c| c.text.contains("```toml\n[ingest.chunk]\nmax_tokens = 256"))
    );
    assert!(
        chunks
            .iter()
            .all(|c| c.heading_path.first().map(String::as_str) == Some(top))
    );
}

#[test]
fn chinese_markdown_splits_on_chinese_sentences() {
    let (doc, chunking) = run("notes-zh.md", Hint::file("notes-zh.md"));
    assert_eq!(doc.title.as_deref(), Some("知识库使用说明"));
    let chunks = chunks(chunking);
    assert!(chunks.len() >= 2);
    let block_ends: Vec<usize> = doc.blocks.iter().map(|b| b.range.end).collect();
    for c in &chunks {
        let last = c.text.chars().last().expect("non-empty");
        assert!(
            block_ends.contains(&c.range.end) || matches!(last, '。' | '！' | '？'),
            "a chunk ends with a sentence or a block: {c:?}"
        );
    }
    // The small last section joins the chunk before it; their shared path is the title.
    let last = chunks.last().expect("chunks");
    assert!(
        last.text.starts_with("## 文档分块") && last.text.contains("## 常见问题"),
        "{last:?}"
    );
    assert_eq!(last.heading_path, ["知识库使用说明"]);
    assert!(
        chunks
            .iter()
            .any(|c| c.heading_path == ["知识库使用说明", "添加条目"])
    );
}

#[test]
fn plain_text_that_fits_stays_one_node() {
    let (doc, chunking) = run("plain.txt", Hint::file("RELEASE-NOTES.txt"));
    assert_eq!(doc.format, Format::Text);
    assert_eq!(doc.blocks.len(), 5);
    let Chunking::Whole { tokens } = chunking else {
        panic!("plain.txt fits in one chunk");
    };
    assert_eq!(tokens, model_tokens(doc.text.trim()));
    assert!(tokens <= 256);
}

#[test]
fn source_code_keeps_its_language_and_splits_between_lines() {
    let (doc, chunking) = run("sentences.rs", Hint::file("src/text/sentences.rs"));
    assert_eq!(doc.format, Format::Code);
    assert_eq!(doc.language, Some("rust"));
    assert!(doc.blocks.iter().all(|b| b.kind == BlockKind::Code));
    let chunks = chunks(chunking);
    assert!(chunks.len() > 5);
    assert!(chunks.iter().all(|c| c.heading_path.is_empty()));
    let source = String::from_utf8(fixture("sentences.rs")).expect("utf-8");
    assert_eq!(doc.text, source, "code is kept as it stands");
}

#[test]
fn saved_html_article_keeps_the_article_and_drops_scripts_styles_and_chrome() {
    let (doc, chunking) = run("article.html", Hint::file("Why Your Search Index.html"));
    assert_eq!(doc.format, Format::Html);
    assert_eq!(
        doc.title.as_deref(),
        Some("Why Your Search Index Should Never Be the Source of Truth – The Data Desk")
    );
    for gone in [
        "dataLayer",
        "gtag",
        ".site-header",
        "schema.org",
        "Skip to content",
        "Archive",
        "Subscribe",
        "Recent Posts",
        "Leave a comment",
        "Post Comment",
        "Proudly powered",
        "We use cookies",
        "Posted in",
        "Previous: Measuring recall",
        "Notes on databases",
    ] {
        assert!(
            !doc.text.contains(gone),
            "{gone:?} should be dropped:\n{}",
            doc.text
        );
    }
    for kept in [
        "Every few months someone asks me",
        "Mara Lindqvist",
        "Writes go to the source and the outbox in one transaction.",
        "Better not found than found wrong.",
        "Every committed write has an event & every event has a write.",
    ] {
        assert!(
            doc.text.contains(kept),
            "{kept:?} should be kept:\n{}",
            doc.text
        );
    }
    let code = doc
        .blocks
        .iter()
        .find(|b| b.kind == BlockKind::Code)
        .expect("the <pre> block");
    assert!(
        doc.block_text(code)
            .starts_with("BEGIN;\nUPDATE nodes SET content = $1")
    );
    let chunks = chunks(chunking);
    assert!(
        chunks
            .iter()
            .any(|c| c.heading_path.last().map(String::as_str) == Some("The outbox pattern"))
    );
}

#[test]
fn gbk_chinese_page_is_decoded_from_its_meta_charset() {
    let (doc, _) = run("zh-news.gbk.html", Hint::file("news.html"));
    assert_eq!(
        doc.title.as_deref(),
        Some("开源上下文数据库发布新版本 - 科技日报")
    );
    assert!(
        doc.text.contains("新版本支持导入文档，并能把长文档"),
        "{}",
        doc.text
    );
    for gone in [
        "统计脚本",
        "页脚脚本",
        "关于我们",
        "版权所有",
        "相关阅读",
        "首页",
    ] {
        assert!(
            !doc.text.contains(gone),
            "{gone:?} should be dropped:\n{}",
            doc.text
        );
    }
    // The HTTP header's charset wins over the page's own declaration.
    let wrong = parse(
        &fixture("zh-news.gbk.html"),
        Hint {
            file_name: None,
            content_type: Some("text/html; charset=gbk"),
        },
    )
    .expect("parses");
    assert_eq!(wrong.text, doc.text);
}

#[test]
fn multi_page_pdf_keeps_page_numbers_in_blocks_and_chunks() {
    let (doc, chunking) = run("handbook.pdf", Hint::file("handbook.pdf"));
    assert_eq!(doc.format, Format::Pdf);
    assert_eq!(
        doc.title.as_deref(),
        Some("Field Handbook: Running the Context Store")
    );
    assert_eq!(doc.pages.len(), 3);
    for (page, heading) in [
        (0, "Field Handbook: Running the Context Store"),
        (1, "When an Index Falls Behind"),
        (2, "Recovering a Node"),
    ] {
        let text = doc.text[doc.pages[page].clone()].trim_start();
        assert!(text.starts_with(heading), "page {}: {text:?}", page + 1);
    }
    let pages: Vec<u32> = doc.blocks.iter().filter_map(|b| b.page).collect();
    assert_eq!(pages.len(), doc.blocks.len());
    assert!(pages.windows(2).all(|w| w[0] <= w[1]) && pages[0] == 1 && pages[pages.len() - 1] == 3);
    let chunks = chunks(chunking);
    let spans: Vec<(u32, u32)> = chunks
        .iter()
        .map(|c| {
            c.pages
                .map(|p| (p.first, p.last))
                .expect("pdf chunks have pages")
        })
        .collect();
    assert_eq!(spans.first().map(|s| s.0), Some(1));
    assert_eq!(spans.last().map(|s| s.1), Some(3));
    let dead = chunks
        .iter()
        .find(|c| c.text.contains("Dead deliveries need a person"))
        .expect("page 2 text");
    assert!(
        dead.pages.is_some_and(|p| p.first <= 2 && 2 <= p.last),
        "{dead:?}"
    );
}

#[test]
fn one_page_pdf_stays_one_node() {
    let (doc, chunking) = run("memo.pdf", Hint::file("memo.pdf"));
    assert_eq!(doc.pages.len(), 1);
    assert!(
        doc.text.contains("Incremental indexing is not affected."),
        "{}",
        doc.text
    );
    assert!(matches!(chunking, Chunking::Whole { .. }));
}

#[test]
fn chinese_pdf_text_comes_through_its_tounicode_map() {
    let (doc, _) = run("zh-report.pdf", Hint::file("季度报告.pdf"));
    assert_eq!(doc.pages.len(), 2);
    assert_eq!(doc.title.as_deref(), Some("上下文数据库季度报告"));
    let compact: String = doc.text.split_whitespace().collect();
    assert!(
        compact.contains("宁可搜不到，也不要搜到坏结果"),
        "{}",
        doc.text
    );
    assert!(doc.text[doc.pages[1].clone()].contains("下季度计划"));
}

#[test]
fn a_truncated_pdf_is_a_parse_error() {
    let err = parse(&fixture("corrupt.pdf"), Hint::file("corrupt.pdf")).expect_err("truncated");
    assert!(
        matches!(
            err,
            IngestError::Parse {
                format: Format::Pdf,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), ErrorCode::ParseError);
    assert!(!err.is_retryable());
    assert!(
        err.to_string()
            .starts_with("parse error: pdf input cannot be read: "),
        "{err}"
    );
    // A "pdf" that is not one at all.
    let err = parse(&fixture("figure.png"), Hint::file("scan.pdf")).expect_err("not a pdf");
    assert_eq!(
        err.to_string(),
        "parse error: pdf input cannot be read: no %PDF- header"
    );
}

#[test]
fn other_formats_are_unsupported_and_named() {
    let png = fixture("figure.png");
    let err = parse(&png, Hint::file("figure.png")).expect_err("png");
    assert_eq!(err.code(), ErrorCode::UnsupportedFormat);
    assert!(!err.is_retryable());
    assert_eq!(
        err.to_string(),
        "unsupported format: extension .png (figure.png)"
    );
    let err = parse(
        &png,
        Hint {
            file_name: None,
            content_type: Some("image/png"),
        },
    )
    .expect_err("png");
    assert_eq!(err.to_string(), "unsupported format: image/png");
    let err = parse(&fixture("bundle.zip"), Hint::default()).expect_err("zip");
    assert_eq!(err.to_string(), "unsupported format: binary data");
}
