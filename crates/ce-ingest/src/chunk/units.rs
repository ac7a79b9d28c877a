//! Step 1: sections and units (see the module documentation of [`super`]).

use std::ops::Range;

use ce_core::text::sentence_ranges;

use super::TokenCount;
use crate::document::{BlockKind, ParsedDocument, trim_range};

/// A piece of text that packing never splits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unit {
    /// Its byte range in the document text (trimmed, non-empty).
    pub range: Range<usize>,
    /// Its tokens, counted on its own.
    pub tokens: usize,
    /// The index of the block it is (part of).
    pub block: usize,
    /// The index of its section.
    pub section: usize,
}

/// The units of `doc` in text order, and the heading path of each section.
pub(super) struct Units {
    pub units: Vec<Unit>,
    pub sections: Vec<Vec<String>>,
}

/// Groups the blocks of `doc` into sections and cuts them into units of at most `max`
/// tokens.
pub(super) fn units(doc: &ParsedDocument, counter: &dyn TokenCount, max: usize) -> Units {
    let mut sections: Vec<Vec<String>> = Vec::new();
    let mut stack: Vec<(u8, String)> = Vec::new();
    let mut units = Vec::new();
    for (b, block) in doc.blocks.iter().enumerate() {
        if let BlockKind::Heading { level, title } = &block.kind {
            stack.retain(|(l, _)| l < level);
            stack.push((*level, title.clone()));
            sections.push(stack.iter().map(|(_, t)| t.clone()).collect());
        } else if sections.is_empty() {
            sections.push(Vec::new());
        }
        let section = sections.len() - 1;
        let text = doc.block_text(block);
        let tokens = counter.count_tokens(text);
        if tokens <= max {
            units.push(Unit {
                range: block.range.clone(),
                tokens,
                block: b,
                section,
            });
            continue;
        }
        for piece in pieces(&doc.text, block.range.clone(), &block.kind) {
            for range in fit(&doc.text, piece, counter, max) {
                units.push(Unit {
                    tokens: counter.count_tokens(&doc.text[range.clone()]),
                    range,
                    block: b,
                    section,
                });
            }
        }
    }
    Units { units, sections }
}

/// The natural pieces of `range` of `text`: sentences of prose and headings, lines of code
/// and tables. Only whitespace lies between them.
pub(super) fn pieces(text: &str, range: Range<usize>, kind: &BlockKind) -> Vec<Range<usize>> {
    let s = &text[range.clone()];
    match kind {
        BlockKind::Prose | BlockKind::Heading { .. } => sentence_ranges(s)
            .into_iter()
            .map(|r| range.start + r.start..range.start + r.end)
            .collect(),
        BlockKind::Code | BlockKind::Table => {
            let mut out = Vec::new();
            let mut pos = range.start;
            for line in s.split_inclusive('\n') {
                if let Some(r) = trim_range(text, pos..pos + line.len()) {
                    out.push(r);
                }
                pos += line.len();
            }
            out
        }
    }
}

/// `range` of `text` cut into consecutive trimmed ranges of at most `max` tokens each: the
/// whole range if it fits, else the longest prefix that fits (found by bisection over
/// character boundaries), moved back to its last whitespace if that keeps at least half of
/// it, and so on with the rest.
pub(super) fn fit(
    text: &str,
    range: Range<usize>,
    counter: &dyn TokenCount,
    max: usize,
) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut rest = range;
    while let Some(r) = trim_range(text, rest.clone()) {
        let s = &text[r.clone()];
        if counter.count_tokens(s) <= max {
            out.push(r);
            break;
        }
        // Char boundaries after the first char: candidate ends (relative to r.start).
        let ends: Vec<usize> = s
            .char_indices()
            .skip(1)
            .map(|(i, _)| i)
            .chain(std::iter::once(s.len()))
            .collect();
        // The largest k with a verified fit of s[..ends[k]]; k = 0 is a single char.
        let (mut lo, mut hi) = (0usize, ends.len() - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if counter.count_tokens(&s[..ends[mid]]) <= max {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let mut cut = ends[lo];
        if let Some(ws) = s[..cut].rfind(char::is_whitespace)
            && ws * 2 >= cut
            && ws > 0
            && counter.count_tokens(&s[..ws]) <= max
        {
            cut = ws;
        }
        if let Some(piece) = trim_range(text, r.start..r.start + cut) {
            out.push(piece);
        }
        rest = r.start + cut..r.end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn fit_cuts_at_whitespace_within_the_limit() {
        let text = "  one two three four five six seven  ";
        let got: Vec<&str> = fit(text, 0..text.len(), &words, 3)
            .into_iter()
            .map(|r| &text[r])
            .collect();
        assert_eq!(got, ["one two three", "four five six", "seven"]);
        // Without whitespace (Chinese), it cuts between characters.
        let chars = |s: &str| s.chars().count();
        let text = "一二三四五六七";
        let got: Vec<&str> = fit(text, 0..text.len(), &chars, 3)
            .into_iter()
            .map(|r| &text[r])
            .collect();
        assert_eq!(got, ["一二三", "四五六", "七"]);
    }

    #[test]
    fn pieces_are_sentences_or_lines() {
        let text = "x First one. Second one!\n Third";
        let got: Vec<&str> = pieces(text, 2..text.len(), &BlockKind::Prose)
            .into_iter()
            .map(|r| &text[r])
            .collect();
        assert_eq!(got, ["First one.", "Second one!", "Third"]);
        let code = "fn a() {\n    1\n\n}";
        let got: Vec<&str> = pieces(code, 0..code.len(), &BlockKind::Code)
            .into_iter()
            .map(|r| &code[r])
            .collect();
        assert_eq!(got, ["fn a() {", "1", "}"]);
    }
}
