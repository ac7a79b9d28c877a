//! Token counting for chunking (docs/ingestion.md "Chunking"): the tokens the embedding model
//! is given for a text, so that a chunk of `max_tokens` is embedded whole.
//!
//! With the `local` provider and its model installed, the count is the model's own tokenizer
//! (`tokenizer.json`, special tokens included, truncation off). Otherwise — the `hash`
//! provider, a remote provider whose tokenizer is not on this machine, or no model — it is
//! [`TokenCounter::Estimate`]: an upper-leaning estimate (a word piece per four characters of
//! a word, a token per Chinese/Japanese/Korean character, plus the two special tokens), and
//! status says which one is in use.

use std::path::Path;

use ce_core::config::EmbeddingConfig;
use tokenizers::Tokenizer;

use crate::from_config::local_model_dir;

/// Counts tokens the way chunking needs them.
pub enum TokenCounter {
    /// The embedding model's own tokenizer, and the sha256 (hex) of its `tokenizer.json`.
    Model(Box<Tokenizer>, String),
    /// The estimate of the module documentation.
    Estimate,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

impl TokenCounter {
    /// The counter for `cfg`: the local model's tokenizer when the provider is `local` and
    /// its `tokenizer.json` loads, else the estimate.
    pub fn for_config(cfg: &EmbeddingConfig) -> TokenCounter {
        if cfg.provider != crate::local::PROVIDER {
            return TokenCounter::Estimate;
        }
        TokenCounter::from_model_dir(&local_model_dir(cfg)).unwrap_or(TokenCounter::Estimate)
    }

    /// The tokenizer of the model in `dir`, truncation and padding off.
    pub fn from_model_dir(dir: &Path) -> Option<TokenCounter> {
        let bytes = std::fs::read(dir.join("tokenizer.json")).ok()?;
        let mut t = Tokenizer::from_bytes(&bytes).ok()?;
        t.with_truncation(None).ok()?;
        t.with_padding(None);
        Some(TokenCounter::Model(
            Box::new(t),
            ce_core::sha256_hex(&bytes),
        ))
    }

    /// What it counts with (`model tokenizer` or `estimate`).
    pub fn describe(&self) -> &'static str {
        match self {
            TokenCounter::Model(..) => "model tokenizer",
            TokenCounter::Estimate => "estimate",
        }
    }

    /// Which counter exactly: `estimate`, or `model tokenizer sha256:{hex of tokenizer.json}`
    /// — two counters with one identity count every text alike.
    pub fn identity(&self) -> String {
        match self {
            TokenCounter::Model(_, digest) => format!("model tokenizer sha256:{digest}"),
            TokenCounter::Estimate => "estimate".to_owned(),
        }
    }

    /// The tokens of `text`.
    pub fn count(&self, text: &str) -> usize {
        match self {
            TokenCounter::Model(t, _) => match t.encode_fast(text, true) {
                Ok(e) => e.len(),
                Err(_) => estimate(text),
            },
            TokenCounter::Estimate => estimate(text),
        }
    }
}

/// The estimate: two special tokens, one per CJK character, one per started four
/// characters of every other run of letters and digits, one per other symbol.
pub fn estimate(text: &str) -> usize {
    let mut n = 2;
    let mut run = 0usize;
    let flush = |run: &mut usize, n: &mut usize| {
        *n += run.div_ceil(4);
        *run = 0;
    };
    for c in text.chars() {
        if ce_core::text::is_cjk(c) {
            flush(&mut run, &mut n);
            n += 1;
        } else if c.is_alphanumeric() {
            run += 1;
        } else {
            flush(&mut run, &mut n);
            if !c.is_whitespace() {
                n += 1;
            }
        }
    }
    flush(&mut run, &mut n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_counts_words_symbols_and_cjk_characters() {
        assert_eq!(estimate(""), 2);
        assert_eq!(estimate("hello world"), 2 + 2 + 2);
        assert_eq!(estimate("a, b."), 2 + 1 + 1 + 1 + 1);
        assert_eq!(estimate("知识库"), 2 + 3);
    }

    #[test]
    fn the_model_tokenizer_counts_special_tokens_without_truncation() {
        let Some(c) = TokenCounter::from_model_dir(&crate::default_model_dir()) else {
            eprintln!(
                "skipped: no model installed at {}",
                crate::default_model_dir().display()
            );
            return;
        };
        assert_eq!(c.describe(), "model tokenizer");
        let digest = ce_core::sha256_hex(
            &std::fs::read(crate::default_model_dir().join("tokenizer.json")).expect("read"),
        );
        assert_eq!(c.identity(), format!("model tokenizer sha256:{digest}"));
        assert_eq!(TokenCounter::Estimate.identity(), "estimate");
        assert_eq!(c.count("hello"), 3);
        let long = "word ".repeat(1000);
        assert!(c.count(&long) > 1000, "truncation is off");
    }
}
