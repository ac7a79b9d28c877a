//! Markdown (CommonMark with tables, footnotes, strikethrough, task lists and YAML / TOML
//! front matter) through pulldown-cmark's event stream with source offsets.
//!
//! The document text is the source as it stands; each top-level block becomes one
//! [`Block`] over its source range — markup included, so a chunk is a slice of the file:
//! ATX and setext headings are [`BlockKind::Heading`] with their plain-text title (they
//! make the section structure), fenced and indented code and front matter are
//! [`BlockKind::Code`], tables [`BlockKind::Table`], and everything else (paragraphs, quotes,
//! HTML blocks, footnotes, thematic breaks) [`BlockKind::Prose`]. A top-level list gives one
//! block per item, so that a long list splits between items.

use std::ops::Range;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

use crate::document::{Block, BlockKind, Format, ParsedDocument, push_trimmed};

/// Reads Markdown `text`.
pub(super) fn parse(text: String) -> ParsedDocument {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_YAML_STYLE_METADATA_BLOCKS
        | Options::ENABLE_PLUSES_DELIMITED_METADATA_BLOCKS;
    let mut blocks: Vec<Block> = Vec::new();
    let mut depth = 0usize;
    // The open top-level block (or list item): its kind and where it starts.
    let mut open: Option<(BlockKind, usize)> = None;
    let mut in_list = false;
    let mut heading: Option<(u8, String)> = None;
    for (event, range) in Parser::new_ext(&text, options).into_offset_iter() {
        match event {
            Event::Start(tag) => {
                if depth == 0 {
                    match tag {
                        Tag::List(_) => in_list = true,
                        Tag::Heading { level, .. } => {
                            heading = Some((level as u8, String::new()));
                            open = Some((BlockKind::Prose, range.start));
                        }
                        Tag::CodeBlock(_) | Tag::MetadataBlock(_) => {
                            open = Some((BlockKind::Code, range.start));
                        }
                        Tag::Table(_) => open = Some((BlockKind::Table, range.start)),
                        _ => open = Some((BlockKind::Prose, range.start)),
                    }
                } else if depth == 1 && in_list && matches!(tag, Tag::Item) {
                    open = Some((BlockKind::Prose, range.start));
                }
                depth += 1;
            }
            Event::End(end) => {
                depth = depth.saturating_sub(1);
                let closes = (depth == 0 && !in_list)
                    || (depth == 1 && in_list && matches!(end, TagEnd::Item));
                if closes {
                    close(&text, &mut open, &mut heading, range, &mut blocks);
                }
                if depth == 0 {
                    in_list = false;
                }
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, title)) = &mut heading {
                    title.push_str(&t);
                }
            }
            Event::SoftBreak | Event::HardBreak => {
                if let Some((_, title)) = &mut heading {
                    title.push(' ');
                }
            }
            Event::Rule if depth == 0 => {
                push_trimmed(&text, range, &BlockKind::Prose, None, &mut blocks);
            }
            _ => {}
        }
    }
    let title = blocks.iter().find_map(|b| match &b.kind {
        BlockKind::Heading { level: 1, title } => Some(title.clone()),
        _ => None,
    });
    ParsedDocument {
        format: Format::Markdown,
        language: None,
        title,
        text,
        blocks,
        pages: Vec::new(),
    }
}

/// Closes the open block at the end of `range` (its closing event's range).
fn close(
    text: &str,
    open: &mut Option<(BlockKind, usize)>,
    heading: &mut Option<(u8, String)>,
    range: Range<usize>,
    blocks: &mut Vec<Block>,
) {
    let Some((kind, start)) = open.take() else {
        return;
    };
    let kind = match heading.take() {
        Some((level, title)) => BlockKind::Heading {
            level,
            title: title.split_whitespace().collect::<Vec<_>>().join(" "),
        },
        None => kind,
    };
    // Blocks never overlap (a lazy continuation line can make ranges touch).
    let start = start.max(blocks.last().map_or(0, |b| b.range.end));
    if start < range.end {
        push_trimmed(text, start..range.end, &kind, None, blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(doc: &ParsedDocument) -> Vec<(String, &str)> {
        doc.blocks
            .iter()
            .map(|b| {
                let k = match &b.kind {
                    BlockKind::Heading { level, title } => format!("h{level} {title}"),
                    BlockKind::Prose => "prose".into(),
                    BlockKind::Code => "code".into(),
                    BlockKind::Table => "table".into(),
                };
                (k, doc.block_text(b))
            })
            .collect()
    }

    #[test]
    fn headings_lists_code_tables_and_front_matter_become_blocks() {
        let src = "---\ntitle: x\n---\n\n# Top *level*\n\nIntro\nline two.\n\n- a\n- b\n  more\n\n```rs\n# not a heading\n```\n\nSetext\n======\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n***\n> quote\n";
        let doc = parse(src.into());
        assert_eq!(doc.check(), Ok(()));
        assert_eq!(
            kinds(&doc),
            [
                ("code".into(), "---\ntitle: x\n---"),
                ("h1 Top level".into(), "# Top *level*"),
                ("prose".into(), "Intro\nline two."),
                ("prose".into(), "- a"),
                ("prose".into(), "- b\n  more"),
                ("code".into(), "```rs\n# not a heading\n```"),
                ("h1 Setext".into(), "Setext\n======"),
                ("table".into(), "| a | b |\n|---|---|\n| 1 | 2 |"),
                ("prose".into(), "***"),
                ("prose".into(), "> quote"),
            ]
        );
        assert_eq!(doc.title.as_deref(), Some("Top level"));
    }
}
