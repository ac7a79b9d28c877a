//! Derived layers (DESIGN.md §8): the generators that write a node's L0 (abstract) and L1
//! (overview) when no client wrote them.
//!
//! - [`Generator`]: one batched trait with a timeout and classified errors
//!   ([`DeriveError`]), like the embedders; a generator is identified by
//!   [`GeneratorIdentity`] (id, version, model), and a change of identity re-derives.
//! - [`extractive`]: the default — offline, deterministic, no model download — picks the most
//!   central sentences of a leaf's content (English and Chinese), builds an outline from its
//!   headings, and rolls a container up from its children's abstracts.
//!
//! No generator writes placeholder text: an input with nothing to summarise derives nothing
//! ([`Derived::abstract_text`] is `None`), and the caller keeps the node as it is.

pub mod consumer;
pub mod extractive;
mod generator;
pub mod inline;
pub mod llm;

pub use consumer::{DeriveCounters, DeriveHandler, DeriveSettings};
pub use extractive::Extractive;
pub use inline::InlineExtractive;
pub use llm::LlmGenerator;

use std::sync::Arc;

/// The generator `[derive]` configures.
pub fn from_config(
    config: &ce_core::config::DeriveConfig,
) -> Result<Arc<dyn Generator>, DeriveError> {
    match config.generator.as_str() {
        "llm" => Ok(Arc::new(LlmGenerator::from_config(&config.llm)?)),
        "extractive" => Ok(Arc::new(Extractive::default())),
        other => Err(DeriveError::Config {
            key: "derive.generator".into(),
            reason: format!("{other:?} is not one of \"extractive\", \"llm\""),
        }),
    }
}
pub use generator::{
    Budget, Child, DeriveError, DeriveInput, Derived, Generator, GeneratorIdentity,
};
