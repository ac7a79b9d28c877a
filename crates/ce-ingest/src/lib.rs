//! Ingestion's parsing and chunking layer (DESIGN.md §4 `ingest`; docs/ingestion.md): pure
//! functions from the bytes of one input to the text of the nodes it becomes. No I/O beyond
//! the bytes it is given; the knowledge-base workflow (items, jobs) sits on top.
//!
//! - [`parse`]: bytes and a [`Hint`] (file name, content type) → a [`ParsedDocument`]: its
//!   readable text and blocks (headings, prose, code, tables; pages for PDF). Markdown,
//!   plain text, source code, HTML and PDF; anything else is
//!   [`IngestError::UnsupportedFormat`] naming the type, a corrupt input
//!   [`IngestError::Parse`]. Neither is retryable.
//! - [`chunk`]: a parsed document, a [`TokenCount`] (the embedding model's tokenizer) and
//!   [`ChunkOptions`] → [`Chunking::Whole`] (one node) or [`Chunking::Split`] (a document
//!   node and one [`Chunk`] per child: text, heading path, byte range, pages), header-aware,
//!   with a documented overlap; deterministic.

mod chunk;
mod detect;
mod document;
mod error;
mod parse;

/// The version of what [`parse`] and [`chunk`] make of a given input. Bump it with any
/// change that alters their output for some input (a parser fix, a new block kind, another
/// chunking rule): a knowledge-base re-sync skips a file only when the version that read it
/// is this one (docs/ingestion.md, "Re-sync").
pub const OUTPUT_VERSION: u32 = 1;

pub use chunk::{Chunk, ChunkOptions, Chunking, PageSpan, TokenCount, check_chunks, chunk};
pub use detect::language_of;
pub use document::{Block, BlockKind, Format, Hint, ParsedDocument};
pub use error::{IngestError, Result};
pub use parse::parse;
