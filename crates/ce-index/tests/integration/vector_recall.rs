//! Recall of the embedded index on clustered synthetic unit vectors (20,000 × 384 around 200
//! centres — independent random vectors would defeat any graph index, unlike real
//! embeddings): recall@10 against the exact scan, unfiltered and under 10 % and 1 % filters,
//! through the planner and forced through the graph.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use ce_index::vector::embedded::bench::{clustered_vectors, default_noise, synthetic_record};
use ce_index::vector::embedded::{EmbeddedVectorIndex, SearchPlan, SearchStrategy};
use ce_index::vector::{SearchFilter, VectorIndex, VectorRecord};
use serde_json::json;

const N: usize = 20_000;
const DIM: usize = 384;
const QUERIES: usize = 60;
const K: usize = 10;

#[test]
fn recall_at_10_on_clustered_vectors() {
    let t = Instant::now();
    let all = clustered_vectors(N + QUERIES, DIM, 200, default_noise(DIM), 2024);
    let (data, queries) = all.split_at(N);
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = EmbeddedVectorIndex::open(dir.path()).expect("open");
    let generated = t.elapsed();
    let t = Instant::now();
    for (c, chunk) in data.chunks(2_500).enumerate() {
        let batch: Vec<VectorRecord> = chunk
            .iter()
            .enumerate()
            .map(|(j, v)| VectorRecord {
                record: synthetic_record(c * 2_500 + j),
                vector: v.clone(),
            })
            .collect();
        idx.upsert(&batch).expect("upsert");
    }
    // The graph's recall is measured: every vector in it first (a search while insertion runs
    // is covered by `vector_fresh`).
    idx.settle().expect("settle");
    let built = t.elapsed();
    assert_eq!(idx.count().expect("count"), N as u64);

    let ten = SearchFilter {
        category: Some("cat3".into()),
        ..SearchFilter::default()
    };
    let one = SearchFilter {
        meta: BTreeMap::from([("bucket".into(), json!(42))]),
        ..SearchFilter::default()
    };
    let t = Instant::now();
    let mut report = Vec::new();
    for (name, f) in [
        ("unfiltered", SearchFilter::default()),
        ("10%", ten),
        ("1%", one),
    ] {
        let truth: Vec<Vec<String>> = queries
            .iter()
            .map(|q| {
                let r = idx
                    .search_with(q, &f, K, SearchStrategy::Exact)
                    .expect("exact");
                assert_eq!(r.hits.len(), K, "{name}: enough candidates");
                r.hits.into_iter().map(|h| h.record.id).collect()
            })
            .collect();
        for strategy in [SearchStrategy::Auto, SearchStrategy::Ann] {
            let mut found = 0;
            let mut plans: BTreeMap<String, usize> = BTreeMap::new();
            for (q, want) in queries.iter().zip(&truth) {
                let r = idx.search_with(q, &f, K, strategy).expect("search");
                assert_eq!(r.hits.len(), K, "{name} {strategy:?}: exactly top_k");
                assert!(
                    r.hits.iter().all(|h| f.matches(&h.record)),
                    "{name}: filter"
                );
                let want: HashSet<&String> = want.iter().collect();
                found += r
                    .hits
                    .iter()
                    .filter(|h| want.contains(&h.record.id))
                    .count();
                *plans.entry(format!("{:?}", r.plan)).or_default() += 1;
                if strategy == SearchStrategy::Auto {
                    let expected = if name == "unfiltered" {
                        SearchPlan::Ann
                    } else {
                        SearchPlan::Exact
                    };
                    assert_eq!(r.plan, expected, "{name}: planner choice");
                }
            }
            let recall = found as f64 / (K * QUERIES) as f64;
            report.push(format!(
                "{name} {strategy:?}: recall@10 {recall:.3} plans {plans:?}"
            ));
            assert!(
                recall >= 0.95,
                "{name} {strategy:?}: recall@10 {recall:.3} < 0.95"
            );
        }
    }
    eprintln!(
        "recall_at_10_on_clustered_vectors: generate {generated:?}, build {built:?} ({N} × {DIM}), queries {:?}\n  {}",
        t.elapsed(),
        report.join("\n  ")
    );
}
