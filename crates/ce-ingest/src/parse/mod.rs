//! From bytes to a [`ParsedDocument`]: [`detect`](crate::detect) picks the parser, the parser
//! produces the readable text and its blocks.
//!
//! One file per format: [`markdown`] (pulldown-cmark's block events with source offsets),
//! [`text`] (plain text and source code: paragraphs between blank lines), [`html`]
//! (html5gum's tokens → readable text, title; scripts, styles, navigation dropped) and
//! [`pdf`] (pdf-extract's text, page by page).

mod html;
mod markdown;
mod pdf;
mod text;

use crate::detect::{Detected, detect};
use crate::document::{Format, Hint, ParsedDocument};
use crate::error::{IngestError, Result};

/// Parses `bytes`, whose format `hint` and the bytes themselves tell (see
/// [`detect`](crate::detect)).
///
/// A format no parser reads is [`IngestError::UnsupportedFormat`]; a corrupt input of a
/// supported format (a truncated PDF, text that is not valid UTF-8) is
/// [`IngestError::Parse`]. An input with no text at all (a scanned PDF, an empty file)
/// parses into a document without blocks.
pub fn parse(bytes: &[u8], hint: Hint<'_>) -> Result<ParsedDocument> {
    let doc = match detect(bytes, &hint)? {
        Detected::Markdown => markdown::parse(decode_utf8(bytes, Format::Markdown)?),
        Detected::Text => text::parse(decode_utf8(bytes, Format::Text)?, None),
        Detected::Code(lang) => text::parse(decode_utf8(bytes, Format::Code)?, Some(lang)),
        Detected::Html => html::parse(bytes, hint.content_type)?,
        Detected::Pdf => pdf::parse(bytes)?,
    };
    debug_assert_eq!(doc.check(), Ok(()));
    Ok(doc)
}

/// The text of a text format: UTF-8 (a byte-order mark is dropped) or UTF-16 with a
/// byte-order mark; anything else is a parse error naming the first bad byte.
fn decode_utf8(bytes: &[u8], format: Format) -> Result<String> {
    if let Some((encoding, bom)) = encoding_rs::Encoding::for_bom(bytes) {
        let (text, had_errors) = encoding.decode_without_bom_handling(&bytes[bom..]);
        if had_errors {
            return Err(IngestError::Parse {
                format,
                reason: format!("invalid {} after its byte-order mark", encoding.name()),
            });
        }
        return Ok(text.into_owned());
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(e) => Err(IngestError::Parse {
            format,
            reason: format!("not valid utf-8 at byte {}", e.valid_up_to()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_must_be_utf8_or_carry_a_bom() {
        assert_eq!(
            decode_utf8("\u{feff}héllo".as_bytes(), Format::Text).as_deref(),
            Ok("héllo")
        );
        let utf16: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain("文本".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        assert_eq!(decode_utf8(&utf16, Format::Text).as_deref(), Ok("文本"));
        let e = decode_utf8(b"caf\xe9 au lait", Format::Text).expect_err("fails");
        assert_eq!(
            e.to_string(),
            "parse error: text input cannot be read: not valid utf-8 at byte 3"
        );
    }
}
