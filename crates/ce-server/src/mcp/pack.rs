//! The `max_tokens` packing of the `search` tool: one context block that fits a token
//! budget. Pure: the same hits and budget always give the same block.
//!
//! Tokens are counted with a documented, conservative approximation,
//! [`approx_tokens`]: one token per Han ideograph or CJK / full-width punctuation mark (BPE
//! tokenizers spend about one token on a common Chinese character), plus one token per
//! started group of [`CHARS_PER_TOKEN`] other characters (they average about four characters
//! of English per token), so it over-counts typical text rather than under-counting it. The block is the concatenation
//! of its entries, and the count of a concatenation is at most the sum of the counts of its
//! parts, so summing per-entry costs never lets the block exceed the budget.
//!
//! The order: every hit's L0 abstract first, best hit first, while it fits (the first hit
//! whose abstract does not fit ends the list: the block holds a prefix of the ranking);
//! then, level by level up to the requested detail, each included hit, best first, is
//! expanded to that layer when the layer has text and the larger entry still fits.

use serde::Serialize;

/// Characters per token of [`approx_tokens`].
pub const CHARS_PER_TOKEN: usize = 3;

/// The approximate token count of `text`: one per CJK character plus
/// `ceil(other chars / CHARS_PER_TOKEN)`.
pub fn approx_tokens(text: &str) -> usize {
    let (cjk, other) = text.chars().fold((0, 0), |(cjk, other), c| {
        if ce_core::text::is_cjk(c) {
            (cjk + 1, other)
        } else {
            (cjk, other + 1)
        }
    });
    cjk + usize::div_ceil(other, CHARS_PER_TOKEN)
}

/// One search hit with its three layers (L0, L1, L2; empty when the node has none).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The node.
    pub uri: String,
    /// Its score (higher is better; candidates come best first).
    pub score: f32,
    /// L0, L1, L2 text.
    pub layers: [String; 3],
}

/// One hit in the block, at the layer it was expanded to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PackedHit {
    /// The node.
    pub uri: String,
    /// Its score.
    pub score: f32,
    /// The layer shown (0, 1 or 2).
    pub level: u8,
    /// Tokens of its entry in the block.
    pub tokens: usize,
}

/// A hit the block leaves out or does not expand.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeftOut {
    /// The node.
    pub uri: String,
    /// `omitted` (not in the block) or `not_expanded` (in the block at a lower layer than
    /// asked for).
    pub what: &'static str,
    /// The deepest layer that did not fit.
    pub level: u8,
    /// Tokens that layer's entry would have needed.
    pub tokens_needed: usize,
}

/// The packed block.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Packed {
    /// The context block: one entry per included hit, best first.
    pub context: String,
    /// The included hits, best first.
    pub hits: Vec<PackedHit>,
    /// What did not fit.
    pub left_out: Vec<LeftOut>,
    /// Tokens of `context` by [`approx_tokens`] (never above `budget`).
    pub tokens: usize,
    /// The budget.
    pub budget: usize,
}

/// The entry of `c` at layer `level`.
fn entry(c: &Candidate, level: usize) -> String {
    format!(
        "## {} (L{level}, score {:.3})\n{}\n\n",
        c.uri, c.score, c.layers[level]
    )
}

/// The lowest layer with text, from L0 (L0 itself when every layer is empty).
fn first_layer(c: &Candidate) -> usize {
    (0..3).find(|&l| !c.layers[l].is_empty()).unwrap_or(0)
}

/// Packs `candidates` (best first) into at most `budget` tokens, expanding hits up to layer
/// `detail` (0, 1 or 2).
pub fn pack(candidates: &[Candidate], detail: u8, budget: usize) -> Packed {
    let detail = usize::from(detail.min(2));
    // (candidate index, layer shown, entry tokens)
    let mut chosen: Vec<(usize, usize, usize)> = Vec::new();
    let mut left_out = Vec::new();
    let mut used = 0usize;
    for (i, c) in candidates.iter().enumerate() {
        let level = first_layer(c).min(detail);
        let cost = approx_tokens(&entry(c, level));
        if left_out.is_empty() && used + cost <= budget {
            used += cost;
            chosen.push((i, level, cost));
        } else {
            left_out.push(LeftOut {
                uri: c.uri.clone(),
                what: "omitted",
                level: level as u8,
                tokens_needed: cost,
            });
        }
    }
    let mut short: Vec<Option<(usize, usize)>> = vec![None; chosen.len()];
    for level in 1..=detail {
        for (slot, (i, shown, cost)) in chosen.iter_mut().enumerate() {
            let c = &candidates[*i];
            if *shown >= level || c.layers[level].is_empty() {
                continue;
            }
            let bigger = approx_tokens(&entry(c, level));
            if used - *cost + bigger <= budget {
                used = used - *cost + bigger;
                *shown = level;
                *cost = bigger;
                short[slot] = None;
            } else {
                short[slot] = Some((level, bigger));
            }
        }
    }
    let mut context = String::new();
    let mut hits = Vec::with_capacity(chosen.len());
    for (slot, &(i, level, cost)) in chosen.iter().enumerate() {
        let c = &candidates[i];
        context.push_str(&entry(c, level));
        hits.push(PackedHit {
            uri: c.uri.clone(),
            score: c.score,
            level: level as u8,
            tokens: cost,
        });
        if let Some((level, tokens_needed)) = short[slot] {
            left_out.push(LeftOut {
                uri: c.uri.clone(),
                what: "not_expanded",
                level: level as u8,
                tokens_needed,
            });
        }
    }
    Packed {
        tokens: approx_tokens(&context),
        context,
        hits,
        left_out,
        budget,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cand(uri: &str, score: f32, l0: &str, l1: &str, l2: &str) -> Candidate {
        Candidate {
            uri: uri.into(),
            score,
            layers: [l0.into(), l1.into(), l2.into()],
        }
    }

    #[test]
    fn chinese_counts_a_token_per_character() {
        assert_eq!(approx_tokens(""), 0);
        assert_eq!(approx_tokens("abcd"), 2);
        assert_eq!(approx_tokens("向量检索。"), 5);
        assert_eq!(approx_tokens("向量 search"), 2 + 3);
    }

    #[test]
    fn abstracts_first_then_the_best_hits_expand() {
        let cs = [
            cand("ctx://a/1", 0.9, "one", "one overview", &"x".repeat(300)),
            cand("ctx://a/2", 0.8, "two", "two overview", "two content"),
        ];
        let all = pack(&cs, 2, 10_000);
        assert_eq!(all.hits.iter().map(|h| h.level).collect::<Vec<_>>(), [2, 2]);
        assert!(all.left_out.is_empty());
        // Room for both abstracts and a little more: the long L2 of hit 1 does not fit,
        // hit 2 still expands.
        let tight = approx_tokens(&entry(&cs[0], 1)) + approx_tokens(&entry(&cs[1], 2));
        let p = pack(&cs, 2, tight);
        assert_eq!(p.hits.iter().map(|h| h.level).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(p.left_out.len(), 1);
        assert_eq!(p.left_out[0].what, "not_expanded");
        assert_eq!(p.left_out[0].uri, "ctx://a/1");
        // Room for one abstract only.
        let one = approx_tokens(&entry(&cs[0], 0));
        let p = pack(&cs, 2, one);
        assert_eq!(p.hits.len(), 1);
        assert_eq!(p.left_out[0].what, "omitted");
        assert_eq!(p.left_out[0].uri, "ctx://a/2");
        // Nothing fits.
        let p = pack(&cs, 0, 1);
        assert!(p.hits.is_empty() && p.context.is_empty());
        assert_eq!(p.left_out.len(), 2);
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        proptest::collection::vec(
            (
                "[a-z]{1,8}",
                "[a-z ]{0,40}",
                "[a-z ]{0,120}",
                "[a-zé ]{0,400}",
            ),
            0..12,
        )
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (name, l0, l1, l2))| {
                    cand(
                        &format!("ctx://a/{name}{i}"),
                        1.0 / (i as f32 + 1.0),
                        &l0,
                        &l1,
                        &l2,
                    )
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(ce_core::test_cases(256)))]
        #[test]
        fn never_over_budget_best_first_deterministic(
            cs in candidates(), budget in 0usize..600, detail in 0u8..3
        ) {
            let p = pack(&cs, detail, budget);
            prop_assert!(p.tokens <= budget);
            prop_assert_eq!(p.tokens, approx_tokens(&p.context));
            // The included hits are a prefix of the ranking.
            for (h, c) in p.hits.iter().zip(&cs) {
                prop_assert_eq!(&h.uri, &c.uri);
                prop_assert!(h.level <= detail);
            }
            // Every hit is either included or said to be left out.
            let omitted = p.left_out.iter().filter(|l| l.what == "omitted").count();
            prop_assert_eq!(p.hits.len() + omitted, cs.len());
            prop_assert_eq!(pack(&cs, detail, budget), p);
        }
    }
}
