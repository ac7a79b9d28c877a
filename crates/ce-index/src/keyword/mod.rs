//! The keyword index (DESIGN.md §3, decision 8): BM25 over the texts of index records, for
//! Chinese and English, with the same filters as the vector index.
//!
//! - Terms come from one tokenizer ([`tokenize::tokenize`]) for records and queries.
//! - Scores are Okapi BM25 with `k1` = [`K1`], `b` = [`B`],
//!   `idf(t) = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))` where `N` is the number of stored
//!   records and `n(t)` how many contain `t`, and the document length counted in terms;
//!   statistics are over every stored record, whatever the search's filter. A query's terms
//!   count once each (duplicates are dropped) and are summed in ascending term order, so every
//!   implementation computes bit-identical scores ([`Bm25`] holds the one formula).
//! - Hits are the records containing at least one query term that pass the
//!   [`SearchFilter`] (the vector index's, with its reference semantics
//!   [`SearchFilter::matches`]), best first, ties by id ascending; when at least `top_k` such
//!   records exist exactly `top_k` are returned.
//! - Writes are the worker's versioned node writes, the vector index's [`NodeWrite`]s (their
//!   vectors ignored), under the vector index's rule (invariant **VX1**, [`crate::records`]):
//!   [`NodeWrite::Sync`] replaces all records of a node if [`SeenVersion::admits_write`]
//!   admits its version, [`NodeWrite::Remove`] removes them if
//!   [`SeenVersion::admits_removal`], [`NodeWrite::Purge`] removes an orphan's.
//!
//! [`SeenVersion::admits_write`]: crate::records::SeenVersion::admits_write
//! [`SeenVersion::admits_removal`]: crate::records::SeenVersion::admits_removal
//!
//! Implementations: [`memory::MemoryKeywordIndex`] (the exact reference, in memory) and
//! [`embedded::EmbeddedKeywordIndex`] (SQLite postings, persistent).

use std::collections::BTreeMap;

use ce_core::{CtxUri, IndexRecord};
use serde::Serialize;

pub use crate::vector::{NodeRecord, NodeWrite, SearchFilter, StoredRecord, SyncOutcome};

use crate::error::Result;

pub mod embedded;
pub mod memory;
pub use ce_core::text::tokenize;

/// BM25 term-frequency saturation.
pub const K1: f64 = 1.2;
/// BM25 length normalization.
pub const B: f64 = 0.75;

/// A search hit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeywordHit {
    /// The stored record.
    pub record: IndexRecord,
    /// BM25 score, higher is better (always positive).
    pub score: f32,
}

/// A keyword index.
pub trait KeywordIndex: Send + Sync {
    /// Applies several versioned writes in order, each with the outcome it would have alone.
    /// One write failing (e.g. a record of another node) fails only that write and changes
    /// nothing of it; the outer error means none was applied. The embedded implementation
    /// makes the batch one durable transaction. [`NodeRecord::vector`] is ignored.
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>>;
    /// Removes the records of `uri` (all levels), and of its whole subtree when `subtree`;
    /// returns how many were removed. Removing nothing is not an error. Versions are kept.
    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64>;
    /// The `top_k` best records for `query` that pass `filter`, best first (score descending,
    /// then id ascending). A query without terms finds nothing.
    fn search(&self, query: &str, filter: &SearchFilter, top_k: usize) -> Result<Vec<KeywordHit>>;
    /// The stored records of the nodes `uris` (every level each holds), node by node in the
    /// order asked, levels ascending; a node the index holds nothing of adds nothing.
    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>>;
    /// Every stored record within `uri` (the root lists all), in (uri, level) order.
    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>>;
    /// The distinct URIs of the records within `uri`, in URI order: what a subtree sync
    /// must visit, without decoding the records.
    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        Ok(crate::vector::uris_of(self.list_under(uri)?))
    }
    /// Number of stored records.
    fn count(&self) -> Result<u64>;
    /// Removes every record and version (for a rebuild).
    fn clear(&self) -> Result<()>;
}

/// The terms of a text: term → frequency, and the text's length in terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Terms {
    pub tf: BTreeMap<String, u32>,
    pub len: u32,
}

impl Terms {
    pub(crate) fn of(text: &str) -> Self {
        let mut t = Terms::default();
        tokenize::for_each_term(text, |term| {
            match t.tf.get_mut(term) {
                Some(n) => *n += 1,
                None => {
                    t.tf.insert(term.to_owned(), 1);
                }
            }
            t.len += 1;
        });
        t
    }
}

/// The distinct terms of a query, in ascending order (the order scores are summed in).
pub(crate) fn query_terms(query: &str) -> Vec<String> {
    let mut terms = tokenize::tokenize(query);
    terms.sort_unstable();
    terms.dedup();
    terms
}

/// Collection statistics of one search: the one BM25 formula every implementation uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bm25 {
    docs: u64,
    avgdl: f64,
}

impl Bm25 {
    /// Statistics of `docs` stored records holding `total_len` terms in all.
    pub(crate) fn new(docs: u64, total_len: u64) -> Self {
        let avgdl = if docs == 0 {
            0.0
        } else {
            total_len as f64 / docs as f64
        };
        Bm25 { docs, avgdl }
    }

    /// The idf of a term contained in `df` records.
    pub(crate) fn idf(&self, df: u64) -> f64 {
        let (n, df) = (self.docs as f64, df as f64);
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
    }

    /// The contribution of a term with `idf` occurring `tf` times in a record of `len` terms.
    pub(crate) fn term(&self, idf: f64, tf: u32, len: u32) -> f64 {
        let tf = f64::from(tf);
        let norm = if self.avgdl > 0.0 {
            f64::from(len) / self.avgdl
        } else {
            1.0
        };
        idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * norm))
    }
}

/// Sorts hits best first — score descending, then id ascending — and keeps `top_k`.
pub(crate) fn rank(hits: &mut Vec<KeywordHit>, top_k: usize) {
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.record.id.cmp(&b.record.id))
    });
    hits.truncate(top_k);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bm25_prefers_rare_terms_and_short_records() {
        let s = Bm25::new(10, 100);
        assert!(s.idf(1) > s.idf(5));
        assert!(
            s.idf(10) > 0.0,
            "idf stays positive for a term in every record"
        );
        let idf = s.idf(2);
        assert!(s.term(idf, 1, 5) > s.term(idf, 1, 20));
        assert!(s.term(idf, 3, 10) > s.term(idf, 1, 10));
        // Saturation: tf → ∞ tends to idf · (k1 + 1).
        assert!(s.term(idf, 1000, 10) < idf * (K1 + 1.0));
    }

    #[test]
    fn a_texts_terms_count_each_occurrence() {
        let t = Terms::of("Running runs, the RUN! 北京大学 and the run");
        let mut expected: BTreeMap<String, u32> = BTreeMap::new();
        let all = tokenize::tokenize("Running runs, the RUN! 北京大学 and the run");
        for term in &all {
            *expected.entry(term.clone()).or_default() += 1;
        }
        assert_eq!(t.tf, expected);
        assert_eq!(t.len as usize, all.len());
        assert_eq!((t.tf["run"], t.tf["the"], t.tf["北京"]), (4, 2, 1));
    }

    #[test]
    fn query_terms_are_distinct_and_sorted() {
        assert_eq!(query_terms("runs Running apple"), ["appl", "run"]);
        assert!(query_terms("，。!? ").is_empty());
    }
}
