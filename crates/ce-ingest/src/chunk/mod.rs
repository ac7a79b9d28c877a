//! Header-aware chunking by tokens of the embedding model's tokenizer.
//!
//! [`chunk`] turns a [`ParsedDocument`] into either [`Chunking::Whole`] (the document fits in
//! one chunk and stays one node) or [`Chunking::Split`] (a document node with one child per
//! [`Chunk`]). The loop, one file per step:
//!
//! 1. [`units`]: the blocks are grouped into sections by their headings (every heading
//!    opens a section that runs to the next heading of any level; its path is the titles of
//!    the headings it is under and its own), and every block becomes a *unit* — the
//!    whole block if it fits in `max_tokens`, else its sentences (prose, headings; from
//!    [`ce_core::text::sentence_ranges`]) or lines (code, tables), and a sentence or line
//!    that alone exceeds the limit is cut at the last whitespace (or character) that fits.
//! 2. [`pack`]: units are packed greedily in text order. Within a section the next unit
//!    joins the open chunk if it fits. At a section boundary the next section joins only
//!    whole, and only when it or the open chunk is small (under `min_tokens`) and all of it
//!    fits — so a section that fits is kept together, small sections merge with a
//!    neighbour, and a large section starts its own chunks.
//!    A heading never ends a chunk that more text follows: it opens the next one.
//!    A chunk that follows another of the same section starts with an *overlap*: the longest
//!    run of whole sentences (lines for code) at the end of the previous chunk that fits in
//!    `overlap_tokens`; none when the last sentence alone is longer.
//!
//! Every chunk is a slice of the document text (`chunk.text == doc.text[chunk.range]`), at
//! most `max_tokens` long as the counter counts the slice itself — not a sum of its parts —
//! so the limit holds for any tokenizer. Chunks are in text order, their starts and ends
//! strictly increase, they overlap only by their documented overlap, and together they cover
//! every block. The same document, counter and options always give the same chunks.

mod pack;
mod units;

use std::ops::Range;

use serde::Serialize;

use crate::document::ParsedDocument;
use crate::error::{IngestError, Result};

/// Counts the tokens of a text as the embedding model sees it.
///
/// Wire the model's own tokenizer, counting what the model is given for `text` (special
/// tokens included, without truncation), so that [`ChunkOptions::max_tokens`] can be the
/// model's `max_seq_length`. Any `Fn(&str) -> usize` is a counter.
pub trait TokenCount {
    /// The number of tokens of `text`.
    fn count_tokens(&self, text: &str) -> usize;
}

impl<F: Fn(&str) -> usize> TokenCount for F {
    fn count_tokens(&self, text: &str) -> usize {
        self(text)
    }
}

/// The knobs of [`chunk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ChunkOptions {
    /// The most tokens of one chunk (default 256: the `max_seq_length` of the default model,
    /// all-MiniLM-L6-v2, special tokens included). 16–8192.
    pub max_tokens: usize,
    /// The most tokens a chunk repeats from the end of the previous chunk of its section
    /// (default 32). Less than half of `max_tokens`.
    pub overlap_tokens: usize,
    /// A section smaller than this, or following a chunk smaller than this, is merged into
    /// that chunk when it fits whole (default 64). At most `max_tokens`.
    pub min_tokens: usize,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        ChunkOptions {
            max_tokens: 256,
            overlap_tokens: 32,
            min_tokens: 64,
        }
    }
}

impl ChunkOptions {
    /// Checks the ranges documented on each field.
    pub fn validate(&self) -> Result<()> {
        let invalid =
            |key: &'static str, reason: String| Err(IngestError::InvalidOptions { key, reason });
        if !(16..=8192).contains(&self.max_tokens) {
            return invalid(
                "max_tokens",
                format!("{} is outside 16..=8192", self.max_tokens),
            );
        }
        if self.overlap_tokens * 2 >= self.max_tokens {
            return invalid(
                "overlap_tokens",
                format!(
                    "{} is not less than half of max_tokens {}",
                    self.overlap_tokens, self.max_tokens
                ),
            );
        }
        if self.min_tokens > self.max_tokens {
            return invalid(
                "min_tokens",
                format!(
                    "{} is above max_tokens {}",
                    self.min_tokens, self.max_tokens
                ),
            );
        }
        Ok(())
    }
}

/// The first and last page a chunk's text is on (1-based, inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PageSpan {
    /// The first page.
    pub first: u32,
    /// The last page.
    pub last: u32,
}

/// One chunk of a split document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chunk {
    /// Its position among the document's chunks (0, 1, 2, …).
    pub index: usize,
    /// Its byte range in the document text.
    pub range: Range<usize>,
    /// Its text: `doc.text[range]`.
    pub text: String,
    /// The titles of the headings it is under, outermost first; a chunk holding several
    /// merged sections has the path they share.
    pub heading_path: Vec<String>,
    /// The pages it is on (PDF only).
    pub pages: Option<PageSpan>,
    /// Its length in tokens, as the counter counts its text.
    pub tokens: usize,
    /// How many bytes at its start repeat the end of the previous chunk (0 for none).
    pub overlap: usize,
}

/// How a document is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Chunking {
    /// The document fits in one chunk: one node, its text unsplit.
    Whole {
        /// Its length in tokens.
        tokens: usize,
    },
    /// A document node with one child per chunk, in order.
    Split {
        /// The chunks.
        chunks: Vec<Chunk>,
    },
}

/// Chunks `doc` (see the module documentation); an invalid `options` is
/// [`IngestError::InvalidOptions`].
pub fn chunk(
    doc: &ParsedDocument,
    counter: &dyn TokenCount,
    options: &ChunkOptions,
) -> Result<Chunking> {
    options.validate()?;
    let tokens = counter.count_tokens(doc.text.trim());
    if tokens <= options.max_tokens || doc.blocks.is_empty() {
        return Ok(Chunking::Whole { tokens });
    }
    let units = units::units(doc, counter, options.max_tokens);
    let chunks = pack::pack(doc, &units, counter, options);
    debug_assert_eq!(check_chunks(doc, &chunks, counter, options), Ok(()));
    Ok(Chunking::Split { chunks })
}

/// Checks the invariants of a split (module documentation): `CH1` each chunk is its slice of
/// the text and within `max_tokens` (as `tokens` records); `CH2` starts and ends strictly
/// increase; `CH3` only whitespace lies between chunks, before the first block and after the
/// last; `CH4` a chunk's `overlap` is exactly how far it reaches back into the previous one.
pub fn check_chunks(
    doc: &ParsedDocument,
    chunks: &[Chunk],
    counter: &dyn TokenCount,
    options: &ChunkOptions,
) -> Result<(), String> {
    let Some(first_block) = doc.blocks.first() else {
        return if chunks.is_empty() {
            Ok(())
        } else {
            Err("CH3: chunks of an empty document".into())
        };
    };
    let mut covered = first_block.range.start;
    if !doc.text[..covered].trim().is_empty() {
        return Err("CH3: text before the first block".into());
    }
    let mut prev: Option<&Chunk> = None;
    for (i, c) in chunks.iter().enumerate() {
        if c.index != i || doc.text.get(c.range.clone()) != Some(c.text.as_str()) {
            return Err(format!("CH1: chunk {i} is not its slice of the text"));
        }
        let tokens = counter.count_tokens(&c.text);
        if tokens != c.tokens || tokens > options.max_tokens {
            return Err(format!(
                "CH1: chunk {i} has {tokens} tokens, says {}",
                c.tokens
            ));
        }
        if let Some(p) = prev {
            if c.range.start <= p.range.start || c.range.end <= p.range.end {
                return Err(format!("CH2: chunk {i} {:?} after {:?}", c.range, p.range));
            }
            let reach = p.range.end.saturating_sub(c.range.start);
            if reach != c.overlap {
                return Err(format!(
                    "CH4: chunk {i} overlaps {reach} bytes, says {}",
                    c.overlap
                ));
            }
        } else if c.overlap != 0 {
            return Err("CH4: the first chunk has an overlap".into());
        }
        if c.range.start > covered && !doc.text[covered..c.range.start].trim().is_empty() {
            return Err(format!("CH3: text before chunk {i} is in no chunk"));
        }
        covered = covered.max(c.range.end);
        prev = Some(c);
    }
    if !doc.text[covered..].trim().is_empty() {
        return Err("CH3: text after the last chunk is in no chunk".into());
    }
    Ok(())
}
