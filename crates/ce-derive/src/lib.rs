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

pub mod extractive;
mod generator;

pub use extractive::Extractive;
pub use generator::{
    Budget, Child, DeriveError, DeriveInput, Derived, Generator, GeneratorIdentity,
};
