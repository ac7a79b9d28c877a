//! Sentence centrality and a diverse order: TF-IDF vectors over one document's sentences,
//! each sentence's mean cosine similarity to the others (degree centrality, as in LexRank
//! without the power iteration), and a maximal-marginal-relevance order that takes the most
//! central sentence first and then prefers sentences that say something the chosen ones do
//! not. A sentence that shares many weighty terms with the rest of the document is what the
//! document is about; ten near-copies of one sentence are worth one.

use std::collections::BTreeMap;

use ce_core::text::tokenize;

/// Scores and pairwise similarities of some texts.
pub struct Ranking {
    /// Per text (higher: more central).
    pub scores: Vec<f64>,
    /// Cosine similarity of the TF-IDF vectors of each pair.
    similarity: Vec<Vec<f64>>,
}

/// Scores `texts` deterministically: the same texts in the same order always get the same
/// scores.
///
/// Terms are those of [`tokenize`] except numbers. The score is the mean similarity to the
/// other texts, plus a small lead bonus that decays
/// with the position (`LEAD / (1 + i)`; writers put their point early), times a length factor
/// that keeps fragments of one or two terms from winning.
pub fn centrality(texts: &[&str]) -> Ranking {
    // Numbers tell texts apart but say little about what they are about: not terms here.
    let terms: Vec<Vec<String>> = texts
        .iter()
        .map(|t| {
            let mut terms = tokenize(t);
            terms.retain(|term| !term.chars().all(|c| c.is_ascii_digit()));
            terms
        })
        .collect();
    let n = texts.len();
    let mut df: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &terms {
        let mut seen: Vec<&str> = t.iter().map(String::as_str).collect();
        seen.sort_unstable();
        seen.dedup();
        for term in seen {
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
                let idf = (1.0 + n as f64 / df[term] as f64).ln();
                *w *= idf;
            }
            let norm = v.values().map(|w| w * w).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.values_mut().for_each(|w| *w /= norm);
            }
            v
        })
        .collect();
    let similarity: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..n).map(|j| dot(&vectors[i], &vectors[j])).collect())
        .collect();
    let scores = (0..n)
        .map(|i| {
            let mean = if n > 1 {
                (0..n)
                    .filter(|&j| j != i)
                    .map(|j| similarity[i][j])
                    .sum::<f64>()
                    / (n - 1) as f64
            } else {
                1.0
            };
            let length = match terms[i].len() {
                0 => 0.0,
                1 | 2 => 0.5,
                _ => 1.0,
            };
            (mean + LEAD / (1.0 + i as f64)) * length
        })
        .collect();
    Ranking { scores, similarity }
}

impl Ranking {
    /// The texts in maximal-marginal-relevance order: the highest score first, then each
    /// time the text maximising `relevance · score / best − (1 − relevance) · similarity to the
    /// closest chosen text` (`relevance` 1: by score alone; lower: coverage counts more); ties
    /// keep text order.
    pub fn diverse_order(&self, relevance: f64) -> Vec<usize> {
        let n = self.scores.len();
        let best = self.scores.iter().copied().fold(0.0_f64, f64::max);
        let norm = |i: usize| {
            if best > 0.0 {
                self.scores[i] / best
            } else {
                0.0
            }
        };
        let mut order = Vec::with_capacity(n);
        let mut closest = vec![0.0_f64; n];
        let mut left: Vec<usize> = (0..n).collect();
        while !left.is_empty() {
            let value = |i: usize| {
                if order.is_empty() {
                    norm(i)
                } else {
                    relevance * norm(i) - (1.0 - relevance) * closest[i]
                }
            };
            let (pos, &pick) = left
                .iter()
                .enumerate()
                .max_by(|(_, a), (_, b)| value(**a).total_cmp(&value(**b)).then(b.cmp(a)))
                .expect("not empty");
            left.remove(pos);
            order.push(pick);
            for &i in &left {
                closest[i] = closest[i].max(self.similarity[i][pick]);
            }
        }
        order
    }
}

/// The lead bonus of the first text (halved for the second, a third for the third, …).
const LEAD: f64 = 0.1;

fn dot(a: &BTreeMap<&str, f64>, b: &BTreeMap<&str, f64>) -> f64 {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    small
        .iter()
        .filter_map(|(t, w)| large.get(t).map(|v| w * v))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentence_sharing_the_most_weighty_terms_wins() {
        let texts = [
            "The weather was nice.",
            "Vector indexes store embeddings of documents.",
            "Embeddings of documents are searched by the vector index.",
            "A keyword index complements the vector index for documents.",
        ];
        let r = centrality(&texts);
        let order = r.diverse_order(1.0);
        assert_ne!(order[0], 0, "an off-topic lead loses: {:?}", r.scores);
        assert_eq!(r.scores, centrality(&texts).scores, "deterministic");
        assert_eq!(order, centrality(&texts).diverse_order(1.0));
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
            r.diverse_order(1.0)[1..3],
            [1, 2],
            "by score, the copies come first"
        );
        let order = r.diverse_order(0.3);
        assert_eq!(order[1], 3, "{order:?}");
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3], "a permutation");
    }

    #[test]
    fn fragments_score_low_and_empty_input_is_empty() {
        let s = centrality(&["ok", "ok"]).scores;
        assert!(s[0] < 1.0, "{s:?}");
        assert!(centrality(&[]).diverse_order(0.5).is_empty());
        assert_eq!(centrality(&["!!!"]).scores, [0.0]);
    }
}
