//! Text processing shared by the keyword index, the derived-layer generators and (later)
//! ingestion's chunking: terms ([`tokenize`]) and sentences ([`sentences`]). Pure functions,
//! no I/O; the same input always gives the same output.

pub mod sentences;
pub mod tokenize;

pub use sentences::{Block, BlockKind, Sentence, blocks, is_cjk, sentence_ranges};
pub use tokenize::{for_each_term, tokenize};
