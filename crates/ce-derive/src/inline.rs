//! Deriving a small leaf in its write transaction (docs/derive.md, "Derived at write time"):
//! [`InlineExtractive`] is the store's [`LeafDeriver`] when the configured generator is
//! `extractive`. It derives exactly what the consumer would — the same generator, input hash
//! and provenance — so the consumer finds the node current, and the node is written and
//! indexed once instead of twice (its client's version, then the write-back's).

use std::time::Duration;

use ce_core::{ContextNode, Millis};
use ce_store::derive::{LayerWrite, LeafDeriver, LeafLayers, PreparedLeaf};

use crate::consumer::layers_of;
use crate::{Budget, DeriveInput, Extractive, Generator};

/// The extractive generator, for leaves of at most `max_chars` characters.
#[derive(Debug)]
pub struct InlineExtractive {
    generator: Extractive,
    budget: Budget,
    max_chars: usize,
}

impl InlineExtractive {
    /// Derives leaves of at most `max_chars` characters within `budget`.
    pub fn new(budget: Budget, max_chars: usize) -> Self {
        InlineExtractive {
            generator: Extractive::default(),
            budget,
            max_chars,
        }
    }

    /// The deriver `config` asks for: the extractive generator with
    /// `derive.inline_max_chars` above 0 (`None` otherwise: the consumer derives every
    /// node).
    pub fn from_config(config: &ce_core::Config) -> Option<Self> {
        let d = &config.derive;
        (d.generator == "extractive" && d.inline_max_chars > 0)
            .then(|| InlineExtractive::new(config.projector.into(), d.inline_max_chars))
    }

    /// The input and its hash when `content` is within the limit.
    fn input(&self, content: &str) -> Option<(DeriveInput, String)> {
        // A character is at most 4 bytes: most long texts are refused without counting.
        if content.len() > self.max_chars.saturating_mul(4)
            || content.chars().count() > self.max_chars
        {
            return None;
        }
        let input = DeriveInput::Leaf {
            content: content.to_owned(),
        };
        let hash = input.hash(self.generator.identity(), self.budget);
        Some((input, hash))
    }

    /// Derives `input`, whose hash is `hash`.
    fn derive(&self, input: &DeriveInput, hash: &str, now: Millis) -> Option<LeafLayers> {
        // The extractive generator has no timeout of its own to honour.
        let derived = self
            .generator
            .derive(std::slice::from_ref(input), self.budget, Duration::MAX)
            .pop()?
            .ok()?;
        Some(layers_of(&self.generator, hash, derived, now))
    }
}

impl LeafDeriver for InlineExtractive {
    fn derive_leaf(&self, node: &ContextNode, now: Millis) -> Option<LeafLayers> {
        let (input, hash) = self.input(&node.layers.content)?;
        if node.provenance.derived_from(&hash) {
            return Some(LeafLayers {
                abstract_layer: LayerWrite::Keep,
                overview_layer: LayerWrite::Keep,
            });
        }
        self.derive(&input, &hash, now)
    }

    fn derive_leaves(&self, contents: &[&str], now: Millis) -> Vec<Option<PreparedLeaf>> {
        let one = |content: &&str| {
            let (input, input_hash) = self.input(content)?;
            let layers = self.derive(&input, &input_hash, now)?;
            Some(PreparedLeaf { input_hash, layers })
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = contents.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let parts: Vec<_> = contents
                .chunks(chunk)
                .map(|part| s.spawn(move || part.iter().map(one).collect::<Vec<_>>()))
                .collect();
            parts
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    }
}
