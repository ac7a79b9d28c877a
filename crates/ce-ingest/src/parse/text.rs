//! Plain text and source code: the text as it stands, one block per run of non-blank lines
//! (paragraphs; for code, the groups a programmer separates with blank lines).

use crate::document::{BlockKind, Format, ParsedDocument, paragraph_blocks};

/// Reads plain text (`language` is `None`) or source code in `language`.
pub(super) fn parse(text: String, language: Option<&'static str>) -> ParsedDocument {
    let (format, kind) = match language {
        Some(_) => (Format::Code, BlockKind::Code),
        None => (Format::Text, BlockKind::Prose),
    };
    let mut blocks = Vec::new();
    paragraph_blocks(&text, 0..text.len(), &kind, None, &mut blocks);
    ParsedDocument {
        format,
        language,
        title: None,
        text,
        blocks,
        pages: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_between_blank_lines_keep_their_source_ranges() {
        let doc = parse("  one\n two\n\n \n\tthree  \n".into(), None);
        let texts: Vec<&str> = doc.blocks.iter().map(|b| doc.block_text(b)).collect();
        assert_eq!(texts, ["one\n two", "three"]);
        assert_eq!(doc.check(), Ok(()));
        let code = parse("fn a() {}\n\nfn b() {}\n".into(), Some("rust"));
        assert_eq!(code.format, Format::Code);
        assert_eq!(code.language, Some("rust"));
        assert!(code.blocks.iter().all(|b| b.kind == BlockKind::Code));
        assert!(parse(" \n\n".into(), None).is_empty());
    }
}
