//! PDF: the text of every page through pdf-extract (over lopdf), page numbers kept.
//!
//! The document is loaded once from memory; an encrypted one is opened with the empty user
//! password (what readers do for "owner-password only" files) or refused. Each page's text
//! is pdf-extract's plain-text rendering (fonts decoded through their encodings and
//! ToUnicode maps) laid out by [`PageText`]: a space where the text jumps right, a line break
//! where it moves down, and a blank line — a new paragraph — where it moves down by clearly
//! more than the line spacing of the paragraph so far. Pages follow each other in the document text separated by
//! a blank line, and [`ParsedDocument::pages`] records each page's range; every block (a run
//! of non-blank lines) names its page. The title is the `/Title` of the document information
//! dictionary.
//!
//! A corrupt file is a parse error: one that lopdf cannot load (a truncated download has no
//! cross-reference table or trailer), a page whose content cannot be decoded, and a panic
//! inside the PDF libraries (caught; their hand-written decoders assert on some malformed
//! input).

use std::panic::{AssertUnwindSafe, catch_unwind};

use ce_core::text::is_cjk;

use pdf_extract::{
    Document, MediaBox, Object, OutputDev, OutputError, Transform, decode_text_string,
    output_doc_page,
};

use crate::document::{BlockKind, Format, ParsedDocument, paragraph_blocks};
use crate::error::{IngestError, Result};

fn parse_error(reason: impl Into<String>) -> IngestError {
    IngestError::Parse {
        format: Format::Pdf,
        reason: reason.into(),
    }
}

/// Reads a PDF file.
pub(super) fn parse(bytes: &[u8]) -> Result<ParsedDocument> {
    match catch_unwind(AssertUnwindSafe(|| read(bytes))) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown cause".to_owned());
            Err(parse_error(format!("the pdf reader failed: {message}")))
        }
    }
}

fn read(bytes: &[u8]) -> Result<ParsedDocument> {
    if !bytes.starts_with(b"%PDF-") {
        return Err(parse_error("no %PDF- header"));
    }
    let mut doc = Document::load_mem(bytes).map_err(|e| parse_error(format!("{e}")))?;
    if doc.is_encrypted() {
        doc.decrypt("")
            .map_err(|e| parse_error(format!("encrypted and the empty password fails: {e}")))?;
    }
    let title = info_title(&doc);
    let mut text = String::new();
    let mut pages = Vec::new();
    let mut blocks = Vec::new();
    for (number, _) in doc.get_pages() {
        let mut page = PageText::default();
        output_doc_page(&doc, &mut page, number)
            .map_err(|e| parse_error(format!("page {number}: {e}")))?;
        let page_text = page.text;
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        let start = text.len();
        text.push_str(page_text.trim_end());
        let range = start..text.len();
        paragraph_blocks(
            &text,
            range.clone(),
            &BlockKind::Prose,
            Some(number),
            &mut blocks,
        );
        pages.push(range);
    }
    Ok(ParsedDocument {
        format: Format::Pdf,
        language: None,
        title,
        text,
        blocks,
        pages,
    })
}

/// The `/Title` of the trailer's `/Info` dictionary, if it has a non-empty one.
fn info_title(doc: &Document) -> Option<String> {
    let info = doc.trailer.get(b"Info").ok()?;
    let (_, info) = doc.dereference(info).ok()?;
    let Object::Dictionary(info) = info else {
        return None;
    };
    let (_, title) = doc.dereference(info.get(b"Title").ok()?).ok()?;
    let title = decode_text_string(title).ok()?;
    let title = title.split_whitespace().collect::<Vec<_>>().join(" ");
    (!title.is_empty()).then_some(title)
}

/// Lays out the characters of one page as text with paragraphs.
///
/// A new line starts where the baseline moves down by more than half the font size, or back
/// left while moving down; it opens a new paragraph when the drop exceeds 1.3 times the line
/// spacing of the paragraph so far, or twice the font size on a paragraph's first line
/// (headings and paragraph spacing). A line break between two Chinese characters is
/// dropped. A space is written where the text jumps right by more
/// than a tenth of the font size, as pdf-extract's own plain-text output does.
#[derive(Default)]
struct PageText {
    text: String,
    /// The end of the last character on the line (x) and its baseline (y, downwards).
    last: Option<(f64, f64)>,
    /// The line spacing of the current paragraph, once it has two lines.
    line_gap: Option<f64>,
    word_start: bool,
}

impl OutputDev for PageText {
    fn begin_page(
        &mut self,
        _page: u32,
        _media_box: &MediaBox,
        _art_box: Option<(f64, f64, f64, f64)>,
    ) -> Result<(), OutputError> {
        Ok(())
    }

    fn end_page(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn output_character(
        &mut self,
        trm: &Transform,
        width: f64,
        _spacing: f64,
        font_size: f64,
        ch: &str,
    ) -> Result<(), OutputError> {
        let (x, y) = (trm.m31, -trm.m32);
        let sx = font_size * (trm.m11 + trm.m21);
        let sy = font_size * (trm.m12 + trm.m22);
        let size = (sx * sy).abs().sqrt().max(f64::EPSILON);
        if let Some((last_x, last_y)) = self.last {
            let dy = y - last_y;
            let new_line = dy > size * 0.5 || (x < last_x && dy > size * 0.2);
            if new_line {
                let paragraph = match self.line_gap {
                    Some(gap) => dy > gap * 1.3,
                    None => dy > size * 2.0,
                };
                if paragraph {
                    self.text.push_str("\n\n");
                    self.line_gap = None;
                } else {
                    // A Chinese line break is not a word break (as in ce_core::text).
                    let glue = self.text.chars().next_back().is_some_and(is_cjk)
                        && ch.chars().next().is_some_and(is_cjk);
                    if !glue {
                        self.text.push('\n');
                    }
                    self.line_gap = Some(dy);
                }
            } else if self.word_start && x > last_x + size * 0.1 {
                self.text.push(' ');
            }
        }
        self.text.push_str(ch);
        self.word_start = false;
        self.last = Some((x + width * size, y));
        Ok(())
    }

    fn begin_word(&mut self) -> Result<(), OutputError> {
        self.word_start = true;
        Ok(())
    }

    fn end_word(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn end_line(&mut self) -> Result<(), OutputError> {
        Ok(())
    }
}
