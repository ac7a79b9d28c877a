//! Sentence centrality and a diverse order: TF-IDF vectors over one document's sentences,
//! each sentence's mean cosine similarity to the others (degree centrality, as in LexRank
//! without the power iteration), and a maximal-marginal-relevance order that takes the most
//! central sentence first and then prefers sentences that say something the chosen ones do
//! not. A sentence that shares many weighty terms with the rest of the document is what the
//! document is about; ten near-copies of one sentence are worth one.

use std::collections::HashMap;

use ce_core::text::for_each_term;

/// Scores of some texts and their TF-IDF vectors, from which [`Ranking::diverse_order`]
/// takes the similarities it needs.
pub struct Ranking {
    /// Per text (higher: more central).
    pub scores: Vec<f64>,
    /// Per text, its unit-length TF-IDF vector: `(term id, weight)` by term id.
    vectors: Vec<Vec<(usize, f64)>>,
    /// The number of distinct terms (term ids are `0..terms`).
    terms: usize,
}

/// Scores `texts` deterministically: the same texts in the same order always get the same
/// scores.
///
/// Terms are those of [`ce_core::text::tokenize`] except numbers. The score is the mean similarity to the
/// other texts, plus a small lead bonus that decays
/// with the position (`LEAD / (1 + i)`; writers put their point early), times a length factor
/// that keeps fragments of one or two terms from winning.
///
/// Linear in the texts' terms: the similarity of a text to each other one is a dot product of
/// unit vectors, so their sum is one dot product with the sum of the others' vectors (the
/// sum of all vectors, less its own). A folder of 10,000 children once took 150 s and 800 MB
/// here, pair by pair.
pub fn centrality(texts: &[&str]) -> Ranking {
    // Term ids in order of first appearance (deterministic); a term is copied once, when it
    // is first seen (a folder's 10,000 abstracts repeat a few thousand terms).
    let mut ids: HashMap<String, usize> = HashMap::new();
    let term_ids: Vec<Vec<usize>> = texts
        .iter()
        .map(|t| {
            let mut out = Vec::new();
            for_each_term(t, |term| {
                // Numbers tell texts apart but say little about what they are about: not
                // terms here.
                if term.bytes().all(|b| b.is_ascii_digit()) {
                    return;
                }
                let id = match ids.get(term) {
                    Some(&id) => id,
                    None => {
                        let next = ids.len();
                        ids.insert(term.to_owned(), next);
                        next
                    }
                };
                out.push(id);
            });
            out
        })
        .collect();
    let n = texts.len();
    let terms = ids.len();
    // Per text, (term id, count) by term id; and each term's document frequency.
    let mut df = vec![0_usize; terms];
    let lengths: Vec<usize> = term_ids.iter().map(Vec::len).collect();
    let counts: Vec<Vec<(usize, usize)>> = term_ids
        .into_iter()
        .map(|mut sorted| {
            sorted.sort_unstable();
            let mut counts: Vec<(usize, usize)> = Vec::new();
            for id in sorted {
                match counts.last_mut() {
                    Some((last, c)) if *last == id => *c += 1,
                    _ => {
                        df[id] += 1;
                        counts.push((id, 1));
                    }
                }
            }
            counts
        })
        .collect();
    let vectors: Vec<Vec<(usize, f64)>> = counts
        .into_iter()
        .map(|c| {
            let mut v: Vec<(usize, f64)> = c
                .into_iter()
                .map(|(id, tf)| (id, tf as f64 * (1.0 + n as f64 / df[id] as f64).ln()))
                .collect();
            let norm = v.iter().map(|(_, w)| w * w).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|(_, w)| *w /= norm);
            }
            v
        })
        .collect();
    let mut sum = vec![0.0_f64; terms];
    for v in &vectors {
        for &(id, w) in v {
            sum[id] += w;
        }
    }
    let scores = (0..n)
        .map(|i| {
            let mean = if n > 1 {
                let own: f64 = vectors[i].iter().map(|(_, w)| w * w).sum();
                (dot_dense(&vectors[i], &sum) - own) / (n - 1) as f64
            } else {
                1.0
            };
            weigh(mean, i, lengths[i])
        })
        .collect();
    Ranking {
        scores,
        vectors,
        terms,
    }
}

impl Ranking {
    /// The texts in maximal-marginal-relevance order: the highest score first, then each
    /// time the text maximising `relevance · score / best − (1 − relevance) · similarity to the
    /// closest chosen text` (`relevance` 1: by score alone; lower: coverage counts more); ties
    /// keep text order.
    ///
    /// Lazy: each text taken costs one similarity per text left, so a caller that needs the
    /// first few of many texts (a folder's overview) pays for those few.
    pub fn diverse_order(&self, relevance: f64) -> DiverseOrder<'_> {
        let n = self.scores.len();
        DiverseOrder {
            ranking: self,
            relevance,
            best: self.scores.iter().copied().fold(0.0_f64, f64::max),
            closest: vec![0.0; n],
            left: (0..n).collect(),
            picked: vec![0.0; self.terms],
        }
    }
}

/// The iterator of [`Ranking::diverse_order`].
pub struct DiverseOrder<'r> {
    ranking: &'r Ranking,
    relevance: f64,
    /// The highest score.
    best: f64,
    /// Per text, its similarity to the closest text taken so far.
    closest: Vec<f64>,
    /// The texts not taken yet.
    left: Vec<usize>,
    /// The vector of the text taken last, dense (a scratch buffer).
    picked: Vec<f64>,
}

impl Iterator for DiverseOrder<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let scores = &self.ranking.scores;
        let norm = |i: usize| {
            if self.best > 0.0 {
                scores[i] / self.best
            } else {
                0.0
            }
        };
        // Nothing taken yet: by score alone.
        let first = self.left.len() == scores.len();
        let value = |i: usize| {
            if first {
                norm(i)
            } else {
                self.relevance * norm(i) - (1.0 - self.relevance) * self.closest[i]
            }
        };
        let (pos, &pick) = self
            .left
            .iter()
            .enumerate()
            .max_by(|(_, a), (_, b)| value(**a).total_cmp(&value(**b)).then(b.cmp(a)))?;
        self.left.remove(pos);
        if self.relevance < 1.0 && !self.left.is_empty() {
            let vectors = &self.ranking.vectors;
            for &(id, w) in &vectors[pick] {
                self.picked[id] = w;
            }
            for &i in &self.left {
                self.closest[i] = self.closest[i].max(dot_dense(&vectors[i], &self.picked));
            }
            for &(id, _) in &vectors[pick] {
                self.picked[id] = 0.0;
            }
        }
        Some(pick)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left.len(), Some(self.left.len()))
    }
}

/// The lead bonus of the first text (halved for the second, a third for the third, …).
const LEAD: f64 = 0.1;

/// The score of text `i` of `terms` terms whose mean similarity to the others is `mean`: the
/// lead bonus added, fragments of one or two terms halved, a text without terms nothing.
fn weigh(mean: f64, i: usize, terms: usize) -> f64 {
    let length = match terms {
        0 => 0.0,
        1 | 2 => 0.5,
        _ => 1.0,
    };
    (mean + LEAD / (1.0 + i as f64)) * length
}

/// The dot product of a sparse vector with a dense one.
fn dot_dense(sparse: &[(usize, f64)], dense: &[f64]) -> f64 {
    sparse.iter().map(|&(id, w)| w * dense[id]).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ce_core::text::tokenize;

    #[test]
    fn the_sentence_sharing_the_most_weighty_terms_wins() {
        let texts = [
            "The weather was nice.",
            "Vector indexes store embeddings of documents.",
            "Embeddings of documents are searched by the vector index.",
            "A keyword index complements the vector index for documents.",
        ];
        let r = centrality(&texts);
        let order: Vec<usize> = r.diverse_order(1.0).collect();
        assert_ne!(order[0], 0, "an off-topic lead loses: {:?}", r.scores);
        assert_eq!(r.scores, centrality(&texts).scores, "deterministic");
        assert_eq!(
            order,
            centrality(&texts).diverse_order(1.0).collect::<Vec<_>>()
        );
        let mut by_score = order.clone();
        by_score.sort_by(|&a, &b| r.scores[b].total_cmp(&r.scores[a]).then(a.cmp(&b)));
        assert_eq!(order, by_score, "relevance 1 is the score order");
    }

    #[test]
    fn near_copies_give_way_to_a_different_text() {
        let texts = [
            "Meeting note one about connection limits and server settings.",
            "Meeting note two about connection limits and server settings.",
            "Meeting note three about connection limits and server settings.",
            "VACUUM reclaims the space of dead rows.",
        ];
        let r = centrality(&texts);
        assert_eq!(
            r.diverse_order(1.0).collect::<Vec<_>>()[1..3],
            [1, 2],
            "by score, the copies come first"
        );
        let order: Vec<usize> = r.diverse_order(0.3).collect();
        assert_eq!(order[1], 3, "{order:?}");
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3], "a permutation");
    }

    #[test]
    fn fragments_score_low_and_empty_input_is_empty() {
        let s = centrality(&["ok", "ok"]).scores;
        assert!(s[0] < 1.0, "{s:?}");
        assert_eq!(centrality(&[]).diverse_order(0.5).next(), None);
        assert_eq!(centrality(&["!!!"]).scores, [0.0]);
    }

    /// The definitions, pair by pair: each text's TF-IDF vector by term, every pair's cosine.
    fn pairwise(texts: &[&str]) -> (Vec<f64>, Vec<Vec<f64>>) {
        use std::collections::BTreeMap;
        let terms: Vec<Vec<String>> = texts
            .iter()
            .map(|t| {
                let mut terms = tokenize(t);
                terms.retain(|t| !t.chars().all(|c| c.is_ascii_digit()));
                terms
            })
            .collect();
        let n = texts.len();
        let mut df: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &terms {
            let distinct: std::collections::BTreeSet<&str> = t.iter().map(String::as_str).collect();
            for term in distinct {
                *df.entry(term).or_default() += 1;
            }
        }
        let vectors: Vec<BTreeMap<&str, f64>> = terms
            .iter()
            .map(|t| {
                let mut v: BTreeMap<&str, f64> = BTreeMap::new();
                for term in t {
                    *v.entry(term.as_str()).or_default() += 1.0;
                }
                for (term, w) in &mut v {
                    *w *= (1.0 + n as f64 / df[term] as f64).ln();
                }
                let norm = v.values().map(|w| w * w).sum::<f64>().sqrt();
                if norm > 0.0 {
                    v.values_mut().for_each(|w| *w /= norm);
                }
                v
            })
            .collect();
        let sim: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| {
                        vectors[i]
                            .iter()
                            .filter_map(|(t, w)| vectors[j].get(t).map(|v| w * v))
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let scores = (0..n)
            .map(|i| {
                let mean = if n > 1 {
                    (0..n).filter(|&j| j != i).map(|j| sim[i][j]).sum::<f64>() / (n - 1) as f64
                } else {
                    1.0
                };
                weigh(mean, i, terms[i].len())
            })
            .collect();
        (scores, sim)
    }

    proptest::proptest! {
        /// The linear-time scores are the pairwise definition's, and every text the lazy order
        /// takes is one of the best by the pairwise similarities at that point.
        #[test]
        fn scores_and_order_match_the_pairwise_definition(
            texts in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["index", "vector", "graph", "note", "a", "b", "42", "the"]),
                    0..8,
                ),
                0..24,
            ),
            relevance in proptest::sample::select(vec![0.0, 0.3, 0.7, 1.0]),
            take in 0_usize..30,
        ) {
            let texts: Vec<String> = texts.iter().map(|w| w.join(" ")).collect();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let r = centrality(&texts);
            let (scores, sim) = pairwise(&texts);
            for (a, b) in r.scores.iter().zip(&scores) {
                proptest::prop_assert!((a - b).abs() < 1e-9, "{a} vs {b}");
            }
            let order: Vec<usize> = r.diverse_order(relevance).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            proptest::prop_assert_eq!(sorted, (0..texts.len()).collect::<Vec<_>>());
            let best = scores.iter().copied().fold(0.0_f64, f64::max);
            let norm = |i: usize| if best > 0.0 { scores[i] / best } else { 0.0 };
            for (k, &pick) in order.iter().enumerate() {
                let value = |i: usize| {
                    if k == 0 {
                        return norm(i);
                    }
                    let closest = order[..k].iter().map(|&c| sim[i][c]).fold(0.0_f64, f64::max);
                    relevance * norm(i) - (1.0 - relevance) * closest
                };
                for &other in &order[k..] {
                    proptest::prop_assert!(
                        value(pick) >= value(other) - 1e-9,
                        "step {k}: took {pick} ({}) over {other} ({})", value(pick), value(other)
                    );
                }
            }
            let prefix: Vec<usize> = r.diverse_order(relevance).take(take).collect();
            proptest::prop_assert_eq!(&prefix[..], &order[..take.min(order.len())]);
        }
    }
}
