//! HTML: the text a reader of the page sees, and its title, through html5gum's WHATWG
//! tokenizer (no DOM is built).
//!
//! - Encoding: a byte-order mark, else the content type's `charset`, else a
//!   `<meta charset>` / `<meta http-equiv="Content-Type">` in the first 1024 bytes, else
//!   UTF-8 when the bytes are valid UTF-8 and windows-1252 otherwise (the WHATWG default);
//!   decoded by encoding_rs.
//! - Scope: when the page has `<article>` elements, only their content is read; else, when
//!   it has `<main>`, only that; else the whole `<body>`.
//! - Dropped with everything inside: `script`, `style`, `noscript`, `template`, `svg`,
//!   `math`, `iframe`, `object`, `canvas`, `nav`, `aside`, `form`, `button`, `select`,
//!   `dialog`, every `footer`, and a `header` unless it is inside an `article` or `main`
//!   (there it holds the article's title and byline, elsewhere the site's banner).
//! - Blocks: `h1`–`h6` become [`BlockKind::Heading`]s, `pre` a [`BlockKind::Code`] block
//!   with its whitespace kept, a `table` one [`BlockKind::Table`] block (a row per line, cells
//!   separated by ` | `), and every other block-level element (`p`, `div`, `li`,
//!   `blockquote`, `figcaption`, …) ends the running [`BlockKind::Prose`] block. Inside a
//!   block whitespace collapses to one space, or to nothing at a line break between two
//!   Chinese characters (a Chinese line break is not a word break).
//! - Title: the `<title>`, else the first `<h1>`.
//!
//! The document text is the blocks' text, separated by blank lines.

use ce_core::text::is_cjk;
use encoding_rs::{Encoding, UTF_8, WINDOWS_1252};
use html5gum::{Token, Tokenizer, emitters::default::DefaultEmitter};

use crate::document::{Block, BlockKind, Format, ParsedDocument};
use crate::error::Result;

/// Elements dropped with their content, wherever they are.
const DROPPED: &[&str] = &[
    "script", "style", "noscript", "template", "svg", "math", "iframe", "object", "canvas", "nav",
    "aside", "form", "button", "select", "dialog", "footer", "head",
];

/// Elements with no end tag.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr",
];

/// Elements that end the running block where they start and where they end.
const BLOCK_LEVEL: &[&str] = &[
    "address",
    "article",
    "blockquote",
    "body",
    "caption",
    "center",
    "dd",
    "details",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "header",
    "hgroup",
    "hr",
    "li",
    "main",
    "ol",
    "p",
    "section",
    "summary",
    "ul",
];

/// Reads an HTML page.
pub(super) fn parse(bytes: &[u8], content_type: Option<&str>) -> Result<ParsedDocument> {
    let html = decode(bytes, content_type);
    let scope = scope_of(&html);
    let mut x = Extractor::new(scope);
    for token in tokens(&html) {
        x.token(token);
    }
    Ok(x.finish())
}

/// The tokens of `html`, with the tokenizer switching into raw-text states after `script`,
/// `style`, `title`, `textarea` and the like.
fn tokens(html: &str) -> impl Iterator<Item = Token> + '_ {
    let mut emitter = DefaultEmitter::default();
    emitter.naively_switch_states(true);
    Tokenizer::new_with_emitter(html, emitter).filter_map(|t| t.ok())
}

fn name(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

/// Which elements bound the readable content: `article` if the page has one, else `main`.
fn scope_of(html: &str) -> Option<&'static str> {
    let mut main = false;
    for token in tokens(html) {
        if let Token::StartTag(tag) = token {
            match tag.name.as_slice() {
                b"article" => return Some("article"),
                b"main" => main = true,
                _ => {}
            }
        }
    }
    main.then_some("main")
}

/// Decodes the page (see the module documentation for the order of the rules).
fn decode(bytes: &[u8], content_type: Option<&str>) -> String {
    if let Some((encoding, bom)) = Encoding::for_bom(bytes) {
        return encoding
            .decode_without_bom_handling(&bytes[bom..])
            .0
            .into_owned();
    }
    let declared = content_type
        .and_then(charset_param)
        .or_else(|| meta_charset(&bytes[..bytes.len().min(1024)]))
        .and_then(|label| Encoding::for_label(label.as_bytes()));
    let encoding = declared.unwrap_or_else(|| {
        if std::str::from_utf8(bytes).is_ok() {
            UTF_8
        } else {
            WINDOWS_1252
        }
    });
    encoding.decode_without_bom_handling(bytes).0.into_owned()
}

/// `text/html; charset="gbk"` → `gbk`.
fn charset_param(s: &str) -> Option<String> {
    let lower = s.to_ascii_lowercase();
    let at = lower.find("charset=")? + "charset=".len();
    let value: String = lower[at..]
        .trim_start_matches(['"', '\''])
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'))
        .collect();
    (!value.is_empty()).then_some(value)
}

/// The charset a `<meta>` in `head` declares.
fn meta_charset(head: &[u8]) -> Option<String> {
    let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
    let mut rest = lower.as_str();
    while let Some(at) = rest.find("<meta") {
        let tag_end = rest[at..].find('>').map_or(rest.len(), |e| at + e);
        if let Some(charset) = charset_param(&rest[at..tag_end]) {
            return Some(charset);
        }
        rest = &rest[tag_end..];
    }
    None
}

/// The state of one pass over the tokens.
struct Extractor {
    scope: Option<&'static str>,
    /// How many scope elements (`article` / `main`) are open.
    in_scope: usize,
    /// The open dropped elements, innermost last.
    dropped: Vec<String>,
    in_title: bool,
    title: String,
    first_h1: Option<String>,
    /// The running block: its kind and text.
    kind: BlockKind,
    buf: String,
    /// A collapsed run of whitespace waiting to be written (`true` if it held a line break).
    pending_space: Option<bool>,
    pre: usize,
    table: usize,
    cells_in_row: usize,
    text: String,
    blocks: Vec<Block>,
}

impl Extractor {
    fn new(scope: Option<&'static str>) -> Self {
        Extractor {
            scope,
            in_scope: 0,
            dropped: Vec::new(),
            in_title: false,
            title: String::new(),
            first_h1: None,
            kind: BlockKind::Prose,
            buf: String::new(),
            pending_space: None,
            pre: 0,
            table: 0,
            cells_in_row: 0,
            text: String::new(),
            blocks: Vec::new(),
        }
    }

    fn reading(&self) -> bool {
        self.dropped.is_empty() && (self.scope.is_none() || self.in_scope > 0)
    }

    fn token(&mut self, token: Token) {
        match token {
            Token::StartTag(tag) => {
                let n = name(&tag.name);
                let void = tag.self_closing || VOID.contains(&n.as_str());
                self.start(&n, void);
            }
            Token::EndTag(tag) => self.end(&name(&tag.name)),
            Token::String(s) => self.string(&String::from_utf8_lossy(&s.value)),
            Token::Comment(_) | Token::Doctype(_) | Token::Error(_) => {}
        }
    }

    fn start(&mut self, n: &str, void: bool) {
        if n == "title" && !void {
            self.in_title = true;
            return;
        }
        let header_outside_scope = n == "header" && self.in_scope == 0;
        if !void && (DROPPED.contains(&n) || header_outside_scope) {
            if self.dropped.is_empty() {
                self.flush();
            }
            self.dropped.push(n.to_owned());
            return;
        }
        if !self.dropped.is_empty() {
            return;
        }
        if Some(n) == self.scope {
            self.flush();
            self.in_scope += 1;
            return;
        }
        match n {
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" if self.pre == 0 && self.table == 0 => {
                self.flush();
                let level = n.as_bytes()[1] - b'0';
                self.kind = BlockKind::Heading {
                    level,
                    title: String::new(),
                };
            }
            "pre" if self.table == 0 => {
                self.flush();
                self.pre += 1;
                self.kind = BlockKind::Code;
            }
            "table" => {
                if self.table == 0 {
                    self.flush();
                    self.kind = BlockKind::Table;
                }
                self.table += 1;
            }
            "tr" if self.table > 0 => {
                self.cells_in_row = 0;
            }
            "td" | "th" if self.table > 0 => {
                if self.cells_in_row > 0 && self.reading() {
                    self.pending_space = None;
                    self.buf.push_str(" | ");
                }
                self.cells_in_row += 1;
            }
            "br" if self.reading() => {
                self.pending_space = None;
                self.buf.push('\n');
            }
            _ if BLOCK_LEVEL.contains(&n) && self.pre == 0 && self.table == 0 => self.flush(),
            _ => {}
        }
    }

    fn end(&mut self, n: &str) {
        if n == "title" {
            self.in_title = false;
            return;
        }
        if let Some(at) = self.dropped.iter().rposition(|d| d == n) {
            self.dropped.truncate(at);
            return;
        }
        if !self.dropped.is_empty() {
            return;
        }
        if Some(n) == self.scope {
            self.flush();
            self.in_scope = self.in_scope.saturating_sub(1);
            return;
        }
        match n {
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" if self.pre == 0 && self.table == 0 => {
                self.flush()
            }
            "pre" if self.pre > 0 => {
                self.pre -= 1;
                if self.pre == 0 {
                    self.flush();
                }
            }
            "table" if self.table > 0 => {
                self.table -= 1;
                if self.table == 0 {
                    self.flush();
                }
            }
            "tr" if self.table > 0 && self.reading() => {
                self.pending_space = None;
                if !self.buf.is_empty() && !self.buf.ends_with('\n') {
                    self.buf.push('\n');
                }
            }
            _ if BLOCK_LEVEL.contains(&n) && self.pre == 0 && self.table == 0 => self.flush(),
            _ => {}
        }
    }

    fn string(&mut self, s: &str) {
        if self.in_title {
            self.title.push_str(s);
            return;
        }
        if !self.reading() {
            return;
        }
        if self.pre > 0 {
            // `<pre>\n` : the first line break after the start tag is not content.
            let s = if self.buf.is_empty() {
                s.strip_prefix('\n').unwrap_or(s)
            } else {
                s
            };
            self.buf.push_str(s);
            return;
        }
        for c in s.chars() {
            if c.is_whitespace() {
                let newline = c == '\n' || c == '\r';
                self.pending_space = Some(self.pending_space.unwrap_or(false) || newline);
                continue;
            }
            if let Some(newline) = self.pending_space.take() {
                let glue = newline && self.buf.chars().next_back().is_some_and(is_cjk) && is_cjk(c);
                if !self.buf.is_empty() && !glue && !self.buf.ends_with('\n') {
                    self.buf.push(' ');
                }
            }
            self.buf.push(c);
        }
    }

    /// Ends the running block: appends it to the text (after a blank line) as a block.
    fn flush(&mut self) {
        self.pending_space = None;
        let kind = std::mem::replace(&mut self.kind, BlockKind::Prose);
        let raw = std::mem::take(&mut self.buf);
        let content = match kind {
            BlockKind::Code => raw.trim_end().trim_start_matches(['\n', '\r']).to_owned(),
            _ => raw
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("\n"),
        };
        // A code block keeps its indentation, but a block has no surrounding whitespace.
        let content = content.trim();
        if content.is_empty() {
            return;
        }
        let kind = match kind {
            BlockKind::Heading { level, .. } => {
                let title = content.split_whitespace().collect::<Vec<_>>().join(" ");
                if level == 1 && self.first_h1.is_none() {
                    self.first_h1 = Some(title.clone());
                }
                BlockKind::Heading { level, title }
            }
            other => other,
        };
        if !self.text.is_empty() {
            self.text.push_str("\n\n");
        }
        let start = self.text.len();
        self.text.push_str(content);
        self.blocks.push(Block {
            kind,
            range: start..self.text.len(),
            page: None,
        });
    }

    fn finish(mut self) -> ParsedDocument {
        self.flush();
        let title = self.title.split_whitespace().collect::<Vec<_>>().join(" ");
        let title = if title.is_empty() {
            self.first_h1
        } else {
            Some(title)
        };
        ParsedDocument {
            format: Format::Html,
            language: None,
            title,
            text: self.text,
            blocks: self.blocks,
            pages: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(html: &str) -> ParsedDocument {
        let doc = parse(html.as_bytes(), None).expect("html always parses");
        assert_eq!(doc.check(), Ok(()));
        doc
    }

    #[test]
    fn drops_scripts_styles_and_chrome_and_keeps_structure() {
        let doc = read(
            "<html><head><title> A &amp; B </title><style>p{}</style></head><body>\
             <header>Site</header><nav><a>Home</a></nav>\
             <h1>Head</h1><p>One <b>two</b>\n three.<br>Four</p><script>alert(1)</script>\
             <pre>\n  let x = 1;\n  y</pre><table><tr><th>k</th><th>v</th></tr><tr><td>a</td><td>1</td></tr></table>\
             <ul><li>x</li><li>y</li></ul><footer>(c)</footer></body></html>",
        );
        assert_eq!(doc.title.as_deref(), Some("A & B"));
        let texts: Vec<&str> = doc.blocks.iter().map(|b| doc.block_text(b)).collect();
        assert_eq!(
            texts,
            [
                "Head",
                "One two three.\nFour",
                "let x = 1;\n  y",
                "k | v\na | 1",
                "x",
                "y"
            ]
        );
        assert!(matches!(
            doc.blocks[0].kind,
            BlockKind::Heading { level: 1, .. }
        ));
        assert_eq!(doc.blocks[2].kind, BlockKind::Code);
        assert_eq!(doc.blocks[3].kind, BlockKind::Table);
    }

    #[test]
    fn article_scope_keeps_its_header_and_the_charset_is_honoured() {
        let doc = read(
            "<body><p>menu</p><article><header><h1>T</h1></header><p>body</p>\
             <footer>tags</footer></article><p>after</p></body>",
        );
        let texts: Vec<&str> = doc.blocks.iter().map(|b| doc.block_text(b)).collect();
        assert_eq!(texts, ["T", "body"]);
        assert_eq!(doc.title.as_deref(), Some("T"));
        let (gbk, _, _) = encoding_rs::GBK.encode("<meta charset=gbk><p>中文\n段落</p>");
        let doc = parse(&gbk, None).expect("parses");
        assert_eq!(doc.text, "中文段落");
        let doc = parse(&gbk, Some("text/html; charset=utf-8")).expect("parses");
        assert!(
            doc.text.contains('\u{FFFD}'),
            "the header's charset wins: {}",
            doc.text
        );
    }
}
