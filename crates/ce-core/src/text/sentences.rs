//! Blocks and sentences of a text (Markdown or plain), for the extractive generator and for
//! header-aware chunking.
//!
//! [`blocks`] reads a text line by line: ATX headings (`#`–`######`), fenced code (```` ``` ````
//! or `~~~`), list items (`-`, `*`, `+`, `1.`, `1)`), table rows (`|…|`) and paragraphs
//! (lines up to a blank line, joined with one space — or none between two Han characters,
//! since a Chinese line break is not a word break). Each heading, paragraph and list item is
//! split into [`Sentence`]s, which end
//! - after `。`, `！` or `？` (a `，` or `；` only ends a clause);
//! - after `.`, `!`, `?` or `…` followed by whitespace or the end of the block, unless the
//!   `.` ends a known abbreviation (`e.g.`, `Dr.`, `vs.` …) or an initial (`J. Smith`);
//!   a `.` before a digit (`3.14`) or a letter (`example.com`) never ends one;
//! - with the closing quotes and brackets that follow the terminator.
//!
//! Everything is deterministic: the same text gives the same blocks, byte for byte.

use std::ops::Range;

/// What a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// An ATX heading of level 1–6.
    Heading(u8),
    /// A paragraph.
    Paragraph,
    /// One list item (with its continuation lines).
    ListItem,
    /// A fenced code block (never split into sentences).
    Code,
    /// Table rows (never split into sentences).
    Table,
}

/// A block of a text, in text order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// What it is.
    pub kind: BlockKind,
    /// Its text: markers (`#`, `-`, fences) removed, lines joined; code and tables verbatim.
    pub text: String,
    /// The index of the heading block this block is under (`None` before the first heading;
    /// a heading is under the previous heading of a lower level).
    pub section: Option<usize>,
    /// Its sentences (empty for code and tables).
    pub sentences: Vec<Sentence>,
}

/// One sentence of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sentence {
    /// The sentence, trimmed.
    pub text: String,
    /// Its position among all the sentences of the text (0, 1, 2, …).
    pub ordinal: usize,
}

/// English abbreviations whose `.` does not end a sentence (lower case, without the dot).
const ABBREVIATIONS: &[&str] = &[
    "e.g", "i.e", "etc", "vs", "cf", "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "no",
    "fig", "eq", "al", "approx", "inc", "ltd", "co", "corp", "jan", "feb", "mar", "apr", "jun",
    "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.k",
];

/// Splits `text` into its blocks (see the module documentation).
pub fn blocks(text: &str) -> Vec<Block> {
    let mut parser = Parser::default();
    for line in text.lines() {
        parser.line(line);
    }
    parser.finish()
}

#[derive(Default)]
struct Parser {
    out: Vec<Block>,
    /// The open paragraph or list item.
    open: Option<(BlockKind, String)>,
    /// The open fence (its marker) and its lines.
    fence: Option<(String, Vec<String>)>,
    /// Table rows being collected.
    table: Vec<String>,
    /// The heading blocks above the current line: (level, block index).
    headings: Vec<(u8, usize)>,
    ordinal: usize,
}

impl Parser {
    fn line(&mut self, line: &str) {
        if let Some((marker, lines)) = &mut self.fence {
            if line.trim_start().starts_with(marker.as_str()) {
                let code = lines.join("\n");
                self.fence = None;
                self.push(BlockKind::Code, code);
            } else {
                lines.push(line.to_owned());
            }
            return;
        }
        let trimmed = line.trim();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            self.close();
            self.fence = Some((trimmed[..3].to_owned(), Vec::new()));
            return;
        }
        if trimmed.starts_with('|') {
            self.close_open();
            self.table.push(trimmed.to_owned());
            return;
        }
        self.close_table();
        if trimmed.is_empty() {
            self.close_open();
            return;
        }
        if let Some((level, title)) = heading(trimmed) {
            self.close_open();
            self.headings.retain(|&(l, _)| l < level);
            let index = self.out.len();
            self.push(BlockKind::Heading(level), title.to_owned());
            self.headings.push((level, index));
            return;
        }
        if let Some(item) = list_item(trimmed) {
            self.close_open();
            self.open = Some((BlockKind::ListItem, item.to_owned()));
            return;
        }
        match &mut self.open {
            Some((_, text)) => join_line(text, trimmed),
            None => self.open = Some((BlockKind::Paragraph, trimmed.to_owned())),
        }
    }

    fn close_open(&mut self) {
        if let Some((kind, text)) = self.open.take() {
            self.push(kind, text);
        }
    }

    fn close_table(&mut self) {
        if !self.table.is_empty() {
            let rows = std::mem::take(&mut self.table).join("\n");
            self.push(BlockKind::Table, rows);
        }
    }

    fn close(&mut self) {
        self.close_open();
        self.close_table();
    }

    fn push(&mut self, kind: BlockKind, text: String) {
        // A heading is in the section of the previous heading of a lower level (the stack
        // holds only those once the new heading's level has been applied by the caller).
        let section = self.headings.last().map(|&(_, i)| i);
        let sentences = match kind {
            BlockKind::Code | BlockKind::Table => Vec::new(),
            BlockKind::Heading(_) => vec![text.trim().to_owned()],
            BlockKind::Paragraph | BlockKind::ListItem => split_sentences(&text),
        }
        .into_iter()
        .filter(|s| s.chars().any(char::is_alphanumeric))
        .map(|text| {
            let s = Sentence {
                text,
                ordinal: self.ordinal,
            };
            self.ordinal += 1;
            s
        })
        .collect();
        self.out.push(Block {
            kind,
            text,
            section,
            sentences,
        });
    }

    fn finish(mut self) -> Vec<Block> {
        if let Some((_, lines)) = self.fence.take() {
            // An unclosed fence runs to the end of the text, as in CommonMark.
            self.push(BlockKind::Code, lines.join("\n"));
        }
        self.close();
        self.out
    }
}

/// `## Title` → (2, "Title"); `#hashtag` and `####### x` are not headings.
fn heading(line: &str) -> Option<(u8, &str)> {
    let hashes = line.bytes().take_while(|&b| b == b'#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    let title = rest.trim().trim_end_matches('#').trim_end();
    (!title.is_empty()).then_some((hashes as u8, title))
}

/// `- item`, `* item`, `+ item`, `12. item`, `3) item` → the item's text.
fn list_item(line: &str) -> Option<&str> {
    for marker in ["- ", "* ", "+ "] {
        if let Some(rest) = line.strip_prefix(marker) {
            return Some(rest.trim_start());
        }
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if (1..=9).contains(&digits) {
        let rest = &line[digits..];
        for marker in [". ", ") "] {
            if let Some(item) = rest.strip_prefix(marker) {
                return Some(item.trim_start());
            }
        }
    }
    None
}

/// Appends a continuation line: with a space, or without one between two Han characters.
fn join_line(text: &mut String, line: &str) {
    let glue =
        text.chars().next_back().is_some_and(is_cjk) && line.chars().next().is_some_and(is_cjk);
    if !glue {
        text.push(' ');
    }
    text.push_str(line);
}

/// Han ideographs and CJK or full-width punctuation: around them a line break is not a
/// space, and sentences are joined without one.
pub fn is_cjk(c: char) -> bool {
    super::tokenize::is_han(c) || matches!(c, '\u{3000}'..='\u{303F}' | '\u{FF00}'..='\u{FFEF}')
}

/// Closing quotes and brackets that stay with the sentence they end.
fn is_closer(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | ')' | ']' | '”' | '’' | '」' | '』' | '）' | '】' | '》' | '〉'
    )
}

/// Splits one block's text into sentences (see the module documentation).
fn split_sentences(text: &str) -> Vec<String> {
    sentence_ranges(text)
        .into_iter()
        .map(|r| text[r].to_owned())
        .collect()
}

/// The byte ranges of the sentences of `text`, in order, each trimmed of surrounding
/// whitespace (never empty), by the rules of the module documentation. Line breaks count as
/// whitespace, so the text of a paragraph can be passed as it stands in its source: the
/// ranges then address the source itself (header-aware chunking splits long sections with
/// them).
pub fn sentence_ranges(text: &str) -> Vec<Range<usize>> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        let (_, c) = chars[i];
        let end = match c {
            '。' | '！' | '？' | '!' | '?' | '…' => true,
            '.' => ends_with_period(text, &chars, i),
            _ => false,
        };
        if !end {
            i += 1;
            continue;
        }
        // Runs of terminators (`?!`, `……`, `...`) and closers stay with the sentence.
        let mut j = i + 1;
        while j < chars.len()
            && (matches!(chars[j].1, '。' | '！' | '？' | '!' | '?' | '.' | '…')
                || is_closer(chars[j].1))
        {
            j += 1;
        }
        let western = c.is_ascii() || c == '…';
        if western && j < chars.len() && !chars[j].1.is_whitespace() {
            // `a.b`, `3.14`, `?foo`: not the end of a sentence.
            i = j;
            continue;
        }
        let cut = chars.get(j).map_or(text.len(), |&(b, _)| b);
        push_sentence(&mut out, text, start..cut);
        start = cut;
        i = j;
    }
    push_sentence(&mut out, text, start..text.len());
    out
}

/// Pushes `range` of `text` trimmed, unless nothing is left.
fn push_sentence(out: &mut Vec<Range<usize>>, text: &str, range: Range<usize>) {
    let s = &text[range.clone()];
    let lead = s.len() - s.trim_start().len();
    let trail = s.len() - s.trim_end().len();
    if lead < s.len() {
        out.push(range.start + lead..range.end - trail);
    }
}

/// Whether the `.` at `chars[i]` may end a sentence: not after an abbreviation, an initial
/// or inside a number.
fn ends_with_period(text: &str, chars: &[(usize, char)], i: usize) -> bool {
    let next = chars.get(i + 1).map(|&(_, c)| c);
    if next.is_some_and(|c| c.is_ascii_digit()) {
        return false;
    }
    let before = &text[..chars[i].0];
    let word: String = before
        .chars()
        .rev()
        .take_while(|c| c.is_alphanumeric() || *c == '.')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if word.is_empty() {
        return true;
    }
    let lower = word.to_lowercase();
    if ABBREVIATIONS.contains(&lower.as_str()) {
        return false;
    }
    // A single capital letter: an initial (`J. Smith`), not a sentence end.
    let mut letters = word.chars();
    !matches!((letters.next(), letters.next()), (Some(c), None) if c.is_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str) -> Vec<String> {
        blocks(text)
            .into_iter()
            .flat_map(|b| b.sentences.into_iter().map(|s| s.text))
            .collect()
    }

    #[test]
    fn english_sentences_end_at_terminators_not_at_abbreviations_or_numbers() {
        assert_eq!(
            texts(
                "It costs 3.14 dollars, e.g. in the U.S. today. Dr. Smith agreed! Did J. R. R. Tolkien write it? Yes."
            ),
            [
                "It costs 3.14 dollars, e.g. in the U.S. today.",
                "Dr. Smith agreed!",
                "Did J. R. R. Tolkien write it?",
                "Yes."
            ]
        );
        assert_eq!(
            texts("He said \"stop.\" Then he left... Finally (really.) we went."),
            [
                "He said \"stop.\"",
                "Then he left...",
                "Finally (really.)",
                "we went."
            ]
        );
        assert_eq!(
            texts("see example.com or v1.2.3 now"),
            ["see example.com or v1.2.3 now"]
        );
    }

    #[test]
    fn chinese_sentences_end_at_full_width_terminators() {
        assert_eq!(
            texts("上下文数据库保存记忆。它支持向量检索！你会用吗？当然，“马上就用。”"),
            [
                "上下文数据库保存记忆。",
                "它支持向量检索！",
                "你会用吗？",
                "当然，“马上就用。”"
            ]
        );
        // A Chinese line break joins without a space; an English one with a space.
        assert_eq!(texts("第一行\n第二行。"), ["第一行第二行。"]);
        assert_eq!(
            texts("first line\nsecond line."),
            ["first line second line."]
        );
    }

    #[test]
    fn markdown_blocks_sections_and_code() {
        let text = "# Title\n\nIntro text. More.\n\n## Part A\n\n- item one\n- item two\n  continued\n\n```rust\nlet x = 1. ;\n```\n\n| a | b |\n|---|---|\n\n### Deep\nBody.\n\n## Part B\n1. first\n2) second\n";
        let b = blocks(text);
        let kinds: Vec<BlockKind> = b.iter().map(|b| b.kind).collect();
        assert_eq!(
            kinds,
            [
                BlockKind::Heading(1),
                BlockKind::Paragraph,
                BlockKind::Heading(2),
                BlockKind::ListItem,
                BlockKind::ListItem,
                BlockKind::Code,
                BlockKind::Table,
                BlockKind::Heading(3),
                BlockKind::Paragraph,
                BlockKind::Heading(2),
                BlockKind::ListItem,
                BlockKind::ListItem,
            ]
        );
        let sections: Vec<Option<usize>> = b.iter().map(|b| b.section).collect();
        assert_eq!(
            sections,
            [
                None,
                Some(0),
                Some(0),
                Some(2),
                Some(2),
                Some(2),
                Some(2),
                Some(2),
                Some(7),
                Some(0),
                Some(9),
                Some(9)
            ]
        );
        assert_eq!(b[4].text, "item two continued");
        assert_eq!(b[5].text, "let x = 1. ;");
        assert!(b[5].sentences.is_empty() && b[6].sentences.is_empty());
        let ordinals: Vec<usize> = b
            .iter()
            .flat_map(|b| b.sentences.iter().map(|s| s.ordinal))
            .collect();
        assert_eq!(ordinals, (0..ordinals.len()).collect::<Vec<_>>());
    }

    #[test]
    fn sentence_ranges_address_the_text_as_it_stands() {
        let text = "  First line\nstill first. 第二句。\n\n Third?! ";
        let ranges = sentence_ranges(text);
        let got: Vec<&str> = ranges.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(got, ["First line\nstill first.", "第二句。", "Third?!"]);
        assert!(sentence_ranges(" \n ").is_empty());
    }

    #[test]
    fn not_headings_and_unclosed_fences() {
        let b = blocks("#hashtag is text\n####### seven\n```\nopen fence");
        assert_eq!(b[0].kind, BlockKind::Paragraph);
        assert_eq!(b[0].text, "#hashtag is text ####### seven");
        assert_eq!(b[1].kind, BlockKind::Code);
        assert_eq!(b[1].text, "open fence");
        assert!(blocks("").is_empty());
        assert!(texts("  ...  \n\n —— ").is_empty());
    }
}
