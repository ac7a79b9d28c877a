//! What a parser produces: the readable text of one input and its blocks.

use std::fmt;
use std::ops::Range;

use serde::Serialize;

/// The formats the parsers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// CommonMark with tables, footnotes, task lists and front matter.
    Markdown,
    /// Plain text (UTF-8).
    Text,
    /// Source code; the language is in [`ParsedDocument::language`].
    Code,
    /// An HTML page: its readable text and title.
    Html,
    /// A PDF file: its text page by page.
    Pdf,
}

impl Format {
    /// The lowercase name (`markdown`, `text`, `code`, `html`, `pdf`).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Markdown => "markdown",
            Format::Text => "text",
            Format::Code => "code",
            Format::Html => "html",
            Format::Pdf => "pdf",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is known about an input besides its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint<'a> {
    /// The file name or path (only the last component and its extension are used).
    pub file_name: Option<&'a str>,
    /// A MIME content type, e.g. from an HTTP response (`text/html; charset=gbk`).
    pub content_type: Option<&'a str>,
}

impl<'a> Hint<'a> {
    /// A hint with a file name only.
    pub fn file(name: &'a str) -> Self {
        Hint {
            file_name: Some(name),
            content_type: None,
        }
    }
}

/// What a block of a document is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum BlockKind {
    /// A heading of level 1–6 and its plain-text title; it starts a section.
    Heading {
        /// 1 for a top-level heading.
        level: u8,
        /// The heading's text without markup.
        title: String,
    },
    /// Running text (a paragraph, a list item, a quote): split at sentence boundaries when
    /// it is too large for one chunk.
    Prose,
    /// Code or preformatted text: split at line boundaries, never inside a line unless one
    /// line alone is too large.
    Code,
    /// A table: split between rows.
    Table,
}

/// One block of a document's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Block {
    /// What it is.
    #[serde(flatten)]
    pub kind: BlockKind,
    /// Its byte range in [`ParsedDocument::text`]: never empty, with no whitespace at either
    /// end.
    pub range: Range<usize>,
    /// The 1-based page it is on (PDF only).
    pub page: Option<u32>,
}

/// The readable content of one input.
///
/// Invariants (checked by [`ParsedDocument::check`] in tests and debug builds):
/// - `DOC1` blocks are in text order, do not overlap, and each range is a non-empty slice of
///   `text` on char boundaries without leading or trailing whitespace;
/// - `DOC2` text outside every block is whitespace only: a chunker that covers the blocks
///   covers the content;
/// - `DOC3` for a PDF, `pages[i]` is the range of page `i + 1`, the pages are in order, and
///   every block lies inside the page it names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParsedDocument {
    /// The format it was read as.
    pub format: Format,
    /// The programming language of source code (`rust`, `python`, …), from the file name.
    pub language: Option<&'static str>,
    /// The title: an HTML `<title>` (else its first `<h1>`), a PDF's `/Title`, the first
    /// level-1 heading of Markdown.
    pub title: Option<String>,
    /// The readable text. Markdown, plain text and code keep their source text as it is
    /// (markup included); HTML and PDF get the text a reader sees, blocks separated by a
    /// blank line.
    pub text: String,
    /// The blocks of `text`, in order.
    pub blocks: Vec<Block>,
    /// For a PDF, the byte range of each page in `text` (page `i + 1` at index `i`); empty
    /// for other formats.
    pub pages: Vec<Range<usize>>,
}

impl ParsedDocument {
    /// The text of `block`.
    pub fn block_text(&self, block: &Block) -> &str {
        &self.text[block.range.clone()]
    }

    /// Whether the document holds no text at all (e.g. a scanned PDF).
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Checks the invariants `DOC1`–`DOC3`; the error names the first one broken.
    pub fn check(&self) -> Result<(), String> {
        let mut end = 0;
        for (i, b) in self.blocks.iter().enumerate() {
            let r = &b.range;
            if r.start < end || r.start >= r.end || r.end > self.text.len() {
                return Err(format!("DOC1: block {i} range {r:?} after byte {end}"));
            }
            let Some(s) = self.text.get(r.clone()) else {
                return Err(format!(
                    "DOC1: block {i} range {r:?} not on char boundaries"
                ));
            };
            if s.trim() != s {
                return Err(format!("DOC1: block {i} has surrounding whitespace"));
            }
            if !self.text[end..r.start].trim().is_empty() {
                return Err(format!("DOC2: text before block {i} is not whitespace"));
            }
            end = r.end;
            if let Some(page) = b.page {
                let inside = page
                    .checked_sub(1)
                    .and_then(|p| self.pages.get(p as usize))
                    .is_some_and(|p| p.start <= r.start && r.end <= p.end);
                if !inside {
                    return Err(format!("DOC3: block {i} is not inside page {page}"));
                }
            }
        }
        if !self.text[end..].trim().is_empty() {
            return Err("DOC2: text after the last block is not whitespace".into());
        }
        for w in self.pages.windows(2) {
            if w[0].end > w[1].start {
                return Err(format!("DOC3: pages {:?} and {:?} overlap", w[0], w[1]));
            }
        }
        Ok(())
    }
}

/// Appends to `out` one block per run of non-blank lines of `text[range]` (a paragraph
/// split), each trimmed; `text` is the whole document text.
pub(crate) fn paragraph_blocks(
    text: &str,
    range: Range<usize>,
    kind: &BlockKind,
    page: Option<u32>,
    out: &mut Vec<Block>,
) {
    let mut start: Option<usize> = None;
    let mut last_end = range.start;
    let mut pos = range.start;
    for line in text[range.clone()].split_inclusive('\n') {
        let line_start = pos;
        pos += line.len();
        if line.trim().is_empty() {
            if let Some(s) = start.take() {
                push_trimmed(text, s..last_end, kind, page, out);
            }
        } else {
            start.get_or_insert(line_start);
            last_end = pos;
        }
    }
    if let Some(s) = start {
        push_trimmed(text, s..last_end, kind, page, out);
    }
}

/// Pushes a block for `range` of `text` trimmed of whitespace, unless nothing is left.
pub(crate) fn push_trimmed(
    text: &str,
    range: Range<usize>,
    kind: &BlockKind,
    page: Option<u32>,
    out: &mut Vec<Block>,
) {
    if let Some(r) = trim_range(text, range) {
        out.push(Block {
            kind: kind.clone(),
            range: r,
            page,
        });
    }
}

/// `range` of `text` without leading and trailing whitespace; `None` when nothing is left.
pub(crate) fn trim_range(text: &str, range: Range<usize>) -> Option<Range<usize>> {
    let s = &text[range.clone()];
    let lead = s.len() - s.trim_start().len();
    if lead == s.len() {
        return None;
    }
    let trail = s.len() - s.trim_end().len();
    Some(range.start + lead..range.end - trail)
}
