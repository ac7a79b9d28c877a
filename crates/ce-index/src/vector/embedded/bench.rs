//! A search benchmark of [`EmbeddedVectorIndex`] on clustered synthetic unit vectors, and the
//! data generator the recall tests share.
//!
//! Independent random vectors are the worst case for every graph index (no neighbourhood
//! structure, recall collapses), and unlike real embeddings; the generator therefore draws
//! points around random centres.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ce_core::{CtxUri, IndexRecord, Level, stable_hash};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::super::rules::cosine;
use super::{EmbeddedVectorIndex, SearchPlan, SearchStrategy};
use crate::error::{IndexError, Result};
use crate::vector::{SearchFilter, VectorIndex, VectorRecord};

/// Clustered unit vectors: `n` points around `centres` random centres with Gaussian noise of
/// standard deviation `noise` per component (before normalisation). Deterministic in `seed`.
pub fn clustered_vectors(
    n: usize,
    dim: usize,
    centres: usize,
    noise: f32,
    seed: u64,
) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let centre_seed: u64 = rng.random();
    let cs = random_unit_vectors(centres.max(1), dim, centre_seed);
    (0..n)
        .map(|_| {
            let c = &cs[rng.random_range(0..cs.len())];
            let v: Vec<f32> = c.iter().map(|x| x + noise * gaussian(&mut rng)).collect();
            normalised(v)
        })
        .collect()
}

/// `n` independent random unit vectors. Deterministic in `seed`.
pub fn random_unit_vectors(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| normalised((0..dim).map(|_| gaussian(&mut rng)).collect()))
        .collect()
}

fn gaussian(rng: &mut StdRng) -> f32 {
    // Box–Muller.
    let u1: f32 = rng.random_range(f32::EPSILON..1.0);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    ce_embed::normalize(&mut v);
    v
}

/// Noise that puts points about as far from their centre as typical real-embedding clusters
/// (cosine to the centre ≈ 0.85).
pub fn default_noise(dim: usize) -> f32 {
    0.6 / (dim as f32).sqrt()
}

/// Synthetic record `i`: `ctx://bench/resources/g{i / 1000}/d{i}`, level 0, category
/// `cat{i % 10}` (a 10 % filter) and metadata filter `bucket = i % 100` (a 1 % filter).
pub fn synthetic_record(i: usize) -> IndexRecord {
    let uri = CtxUri::parse(&format!("ctx://bench/resources/g{}/d{i}", i / 1000))
        .unwrap_or_else(|_| CtxUri::root());
    let parent_uri = uri.parent().unwrap_or_else(CtxUri::root);
    let category = format!("cat{}", i % 10);
    let filters = BTreeMap::from([
        ("uri".to_owned(), json!(uri.as_str())),
        ("parent_uri".to_owned(), json!(parent_uri.as_str())),
        ("context_type".to_owned(), json!("resource")),
        ("category".to_owned(), json!(category)),
        ("level".to_owned(), json!(0)),
        ("owner_space".to_owned(), json!("shared")),
        ("account_id".to_owned(), json!("bench")),
        ("bucket".to_owned(), json!(i % 100)),
    ]);
    IndexRecord {
        id: stable_hash(uri.as_str(), 0),
        uri,
        parent_uri,
        context_type: "resource".into(),
        category,
        level: Level::L0,
        text: format!("document {i}"),
        filters,
        metadata: BTreeMap::from([("node_version".to_owned(), json!(1))]),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// Runs `queries` with `filter`, reporting latency (µs), recall@10 against the exact scan and
/// the plans taken.
fn measure(
    index: &EmbeddedVectorIndex,
    queries: &[Vec<f32>],
    filter: &SearchFilter,
    strategy: SearchStrategy,
) -> Result<Value> {
    const K: usize = 10;
    let mut lat = Vec::with_capacity(queries.len());
    let mut found = 0usize;
    let mut wanted = 0usize;
    let mut plans: BTreeMap<String, usize> = BTreeMap::new();
    let mut candidates = 0;
    for q in queries {
        let t = Instant::now();
        let got = index.search_with(q, filter, K, strategy)?;
        lat.push(t.elapsed());
        let exact = index.search_with(q, filter, K, SearchStrategy::Exact)?;
        let truth: HashSet<&str> = exact.hits.iter().map(|h| h.record.id.as_str()).collect();
        wanted += truth.len();
        found += got
            .hits
            .iter()
            .filter(|h| truth.contains(h.record.id.as_str()))
            .count();
        *plans.entry(plan_name(got.plan).into()).or_default() += 1;
        candidates = got.candidates;
    }
    lat.sort();
    Ok(json!({
        "candidates": candidates,
        "p50_us": percentile(&lat, 0.50),
        "p99_us": percentile(&lat, 0.99),
        "recall_at_10": if wanted == 0 { 1.0 } else { found as f64 / wanted as f64 },
        "plans": plans,
    }))
}

/// What keeping vectors at half precision ([`super::super::rules::kept`]) costs: for each
/// query, the index's exact top 10 against a brute-force top 10 over the `f32` vectors as
/// generated (`data`, record `i` holding `data[i]`) — recall@10 — and the largest difference
/// between a hit's score and its `f32` cosine.
fn kept_precision(
    index: &EmbeddedVectorIndex,
    data: &[Vec<f32>],
    queries: &[Vec<f32>],
) -> Result<Value> {
    const K: usize = 10;
    let ids: Vec<String> = (0..data.len()).map(|i| synthetic_record(i).id).collect();
    let by_id: std::collections::HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let (mut found, mut wanted, mut max_error) = (0usize, 0usize, 0f32);
    for q in queries {
        let mut scored: Vec<(f32, usize)> = data
            .iter()
            .enumerate()
            .map(|(i, v)| (cosine(q, v), i))
            .collect();
        // The best K in the index's order (score, then id), without sorting all of them.
        let k = K.min(scored.len());
        if k > 0 && k < scored.len() {
            scored.select_nth_unstable_by(k - 1, |a, b| {
                b.0.total_cmp(&a.0).then_with(|| ids[a.1].cmp(&ids[b.1]))
            });
        }
        let truth: HashSet<usize> = scored[..k].iter().map(|&(_, i)| i).collect();
        let got = index.search_with(q, &SearchFilter::default(), K, SearchStrategy::Exact)?;
        for h in &got.hits {
            let Some(&i) = by_id.get(h.record.id.as_str()) else {
                continue;
            };
            found += usize::from(truth.contains(&i));
            max_error = max_error.max((h.score - cosine(q, &data[i])).abs());
        }
        wanted += truth.len();
    }
    Ok(json!({
        "recall_at_10_vs_f32": if wanted == 0 { 1.0 } else { found as f64 / wanted as f64 },
        "max_score_error": max_error,
    }))
}

/// Upserts `vectors` as records `first..` in batches of `batch`, calling `before(start, end)`
/// before writing the vectors `start..end` of `vectors`.
fn write_records(
    index: &EmbeddedVectorIndex,
    vectors: &[Vec<f32>],
    first: usize,
    batch: usize,
    mut before: impl FnMut(usize, usize),
) -> Result<()> {
    for (b, chunk) in vectors.chunks(batch.max(1)).enumerate() {
        let start = b * batch.max(1);
        before(start, start + chunk.len());
        let records: Vec<VectorRecord> = chunk
            .iter()
            .enumerate()
            .map(|(j, v)| VectorRecord {
                record: synthetic_record(first + start + j),
                vector: v.clone(),
            })
            .collect();
        index.upsert(&records)?;
    }
    Ok(())
}

/// The write load of [`bench_search`]'s `unfiltered_during_insertion` section.
#[derive(Debug, Clone, Copy)]
pub struct WriteLoad {
    /// Vectors written (as new records).
    pub vectors: usize,
    /// Target vectors per second (paced per batch).
    pub rate: u32,
    /// Vectors per write (the vector consumer's batch is 100 events).
    pub batch: usize,
}

/// Searches (unfiltered, planner's choice) in a loop while another thread writes `load.vectors`
/// new records at `load.rate` — the background inserter moving them from the fresh segment
/// into the graph meanwhile — and reports the latency of every search, and recall@10 of the
/// searches that no write overlapped (their index held exactly `base` plus a known prefix of
/// `extra`; the truth is a brute-force scan of that set, with the index's own cosine) — and,
/// once the inserter has settled, recall@10 of every query over the whole set.
fn measure_during_writes(
    index: &EmbeddedVectorIndex,
    base: &[Vec<f32>],
    extra: &[Vec<f32>],
    queries: &[Vec<f32>],
    load: WriteLoad,
) -> Result<Value> {
    const K: usize = 10;
    if queries.is_empty() || extra.is_empty() {
        return Ok(Value::Null);
    }
    let graph_before = index.stats().graph_vectors;
    // Vectors whose write has completed, and whose write has begun.
    let committed = AtomicUsize::new(0);
    let begun = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let mut fresh_peak = 0usize;
    let mut latencies = Vec::new();
    let mut plans: BTreeMap<String, usize> = BTreeMap::new();
    // (query, extra vectors present, hit ids) of the searches no write overlapped.
    let mut stable: Vec<(usize, usize, Vec<String>)> = Vec::new();
    let written = std::thread::scope(|s| -> Result<Duration> {
        let writer = s.spawn(|| {
            let t = Instant::now();
            let per_vector = 1.0 / f64::from(load.rate.max(1));
            let out = write_records(index, extra, base.len(), load.batch, |start, end| {
                // The vectors before `start` are written; none is being written while
                // `begun == committed`, i.e. until the next batch is due.
                committed.store(start, Ordering::SeqCst);
                let due = Duration::from_secs_f64(start as f64 * per_vector);
                if let Some(wait) = due.checked_sub(t.elapsed()) {
                    std::thread::sleep(wait);
                }
                begun.store(end, Ordering::SeqCst);
            });
            committed.store(extra.len(), Ordering::SeqCst);
            done.store(true, Ordering::SeqCst);
            out.map(|()| t.elapsed())
        });
        let mut i = 0usize;
        while !done.load(Ordering::SeqCst) {
            let q = i % queries.len();
            let present = committed.load(Ordering::SeqCst);
            let t = Instant::now();
            let got = index.search_with(
                &queries[q],
                &SearchFilter::default(),
                K,
                SearchStrategy::Auto,
            )?;
            latencies.push(t.elapsed());
            if begun.load(Ordering::SeqCst) == present {
                stable.push((
                    q,
                    present,
                    got.hits.iter().map(|h| h.record.id.clone()).collect(),
                ));
            }
            *plans.entry(plan_name(got.plan).into()).or_default() += 1;
            fresh_peak = fresh_peak.max(index.stats().fresh_vectors);
            i += 1;
        }
        writer
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })?;
    let fresh_at_end = index.stats().fresh_vectors;
    let graph_during = index.stats().graph_vectors.saturating_sub(graph_before);
    let t = Instant::now();
    index.settle()?;
    let settle = t.elapsed();

    // The ids of the exact top K of `query` over `base` and the first `present` of `extra`.
    let truth = |query: &[f32], present: usize| -> HashSet<String> {
        let mut scored: Vec<(f32, usize)> = base
            .iter()
            .chain(&extra[..present])
            .enumerate()
            .map(|(j, v)| (cosine(query, v), j))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        scored
            .iter()
            .take(K)
            .map(|(_, j)| synthetic_record(*j).id)
            .collect()
    };
    // Recall over at most `queries.len()` of the stable searches, spread over the run.
    let step = stable.len().div_ceil(queries.len()).max(1);
    let (mut found, mut wanted, mut sampled) = (0usize, 0usize, 0usize);
    for (q, present, hits) in stable.iter().step_by(step) {
        let truth = truth(&queries[*q], *present);
        wanted += truth.len();
        found += hits.iter().filter(|h| truth.contains(*h)).count();
        sampled += 1;
    }
    // The same queries once every vector is in the graph: what the insertion left behind,
    // as against what searches overlapping it saw.
    let (mut found_after, mut wanted_after) = (0usize, 0usize);
    for query in queries {
        let got = index.search_with(query, &SearchFilter::default(), K, SearchStrategy::Auto)?;
        let truth = truth(query, extra.len());
        wanted_after += truth.len();
        found_after += got
            .hits
            .iter()
            .filter(|h| truth.contains(&h.record.id))
            .count();
    }
    let recall = |found: usize, wanted: usize| {
        if wanted == 0 {
            Value::Null
        } else {
            json!(found as f64 / wanted as f64)
        }
    };
    latencies.sort();
    Ok(json!({
        "vectors_written": extra.len(),
        "batch": load.batch,
        "target_rate": load.rate,
        "write_seconds": written.as_secs_f64(),
        "writes_per_s": extra.len() as f64 / written.as_secs_f64(),
        "searches": latencies.len(),
        "p50_us": percentile(&latencies, 0.50),
        "p99_us": percentile(&latencies, 0.99),
        "max_us": percentile(&latencies, 1.0),
        "recall_at_10": recall(found, wanted),
        "recall_searches": sampled,
        "recall_at_10_after_settle": recall(found_after, wanted_after),
        "stable_searches": stable.len(),
        "plans": plans,
        "graph_inserted_during": graph_during,
        "fresh_vectors_peak": fresh_peak,
        "fresh_vectors_at_end": fresh_at_end,
        "settle_after_ms": ms(settle),
    }))
}

fn plan_name(p: SearchPlan) -> &'static str {
    match p {
        SearchPlan::Empty => "empty",
        SearchPlan::Exact => "exact",
        SearchPlan::Ann => "ann",
        SearchPlan::AnnThenExact => "ann_then_exact",
    }
}

/// Builds an [`EmbeddedVectorIndex`] of `n` clustered `dim`-dimensional vectors in `dir`
/// (which should be empty) and reports, as JSON: commit time (durable and searchable through
/// the fresh segment), build time (every vector in the graph), snapshot save / load time, for
/// `queries` queries the p50/p99 latency and recall@10 against an exact scan — unfiltered, with
/// a 10 % and a 1 % filter (planner's choice), with the 10 % filter forced through the graph
/// and a full exact scan — then unfiltered searches while `load` writes go on and the
/// background inserter moves them into the graph ([`measure_during_writes`]), then the open
/// time after a crash that followed `n / 20` more writes (snapshot catch-up) and without any
/// snapshot (full rebuild). `phase` is called with each phase's name as it ends (the caller
/// may, e.g., read and reset the process's peak memory there).
pub fn bench_search(
    dir: &Path,
    n: usize,
    dim: usize,
    queries: usize,
    load: WriteLoad,
    mut phase: impl FnMut(&'static str),
) -> Result<Value> {
    if n == 0 || dim == 0 {
        return Err(IndexError::InvalidQuery(
            "bench needs at least one vector of at least one dimension".into(),
        ));
    }
    let centres = (n / 100).max(1);
    let noise = default_noise(dim);
    // Queries and the vectors written during the searches come from the same clusters as
    // the data (the generator's output for a seed is a prefix of its output for more).
    let vectors = clustered_vectors(n + queries + load.vectors, dim, centres, noise, 42);
    let (data, rest) = vectors.split_at(n);
    let (qs, written) = rest.split_at(queries);
    phase("generate");

    let index = EmbeddedVectorIndex::open(dir)?;
    let t = Instant::now();
    write_records(&index, data, 0, 1000, |_, _| {})?;
    // Durable and searchable (fresh segment) …
    let commit = t.elapsed();
    phase("commit");
    // … and every vector in the graph.
    index.settle()?;
    let build = t.elapsed();
    phase("build");
    let t = Instant::now();
    index.flush()?;
    let save = t.elapsed();
    drop(index);
    phase("snapshot_save");

    let t = Instant::now();
    let index = EmbeddedVectorIndex::open(dir)?;
    index.load()?;
    let load_time = t.elapsed();
    phase("open_with_snapshot");

    let cat = SearchFilter {
        category: Some("cat3".into()),
        ..SearchFilter::default()
    };
    let bucket = SearchFilter {
        meta: BTreeMap::from([("bucket".to_owned(), json!(7))]),
        ..SearchFilter::default()
    };
    let unfiltered = measure(&index, qs, &SearchFilter::default(), SearchStrategy::Auto)?;
    let filtered_10 = measure(&index, qs, &cat, SearchStrategy::Auto)?;
    let filtered_1 = measure(&index, qs, &bucket, SearchStrategy::Auto)?;
    let filtered_10_graph = measure(&index, qs, &cat, SearchStrategy::Ann)?;
    let exact_all = measure(&index, qs, &SearchFilter::default(), SearchStrategy::Exact)?;
    let precision = kept_precision(&index, data, qs)?;
    phase("searches");

    let during = measure_during_writes(&index, data, written, qs, load)?;
    phase("during_insertion");

    // A crash after more writes: the next open loads the snapshot and catches up.
    index.flush()?;
    phase("flush");
    let extra = (n / 20).max(1);
    let more = clustered_vectors(extra, dim, centres, noise, 43);
    write_records(&index, &more, n + written.len(), 1000, |_, _| {})?;
    index.close_without_snapshot();
    phase("writes_then_crash");
    let t = Instant::now();
    let index = EmbeddedVectorIndex::open(dir)?;
    let catch_up = t.elapsed();
    let caught_up = index.stats().snapshot_catch_up;
    index.close_without_snapshot();
    phase("open_catch_up");

    // Without a snapshot the next open rebuilds the graph from the stored vectors.
    super::ann::remove_other_snapshots(dir, None)?;
    let t = Instant::now();
    let index = EmbeddedVectorIndex::open(dir)?;
    let rebuild = t.elapsed();
    index.check_consistency()?;
    phase("open_rebuild");
    let db_bytes = fs_err::metadata(dir.join(super::DB_FILE)).map_or(0, |m| m.len());
    drop(index);
    phase("close_with_snapshot");
    let snapshot_bytes: u64 = fs_err::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".usearch"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);

    Ok(json!({
        "n": n,
        "dim": dim,
        "clusters": centres,
        "queries": qs.len(),
        "commit_ms": ms(commit),
        "build_ms": ms(build),
        "build_per_sec": n as f64 / build.as_secs_f64(),
        "snapshot_save_ms": ms(save),
        "open_with_snapshot_ms": ms(load_time),
        "open_catch_up_ms": ms(catch_up),
        "open_catch_up_vectors": caught_up,
        "open_rebuild_ms": ms(rebuild),
        "db_bytes": db_bytes,
        "snapshot_bytes": snapshot_bytes,
        "unfiltered": unfiltered,
        "filtered_10pct": filtered_10,
        "filtered_1pct": filtered_1,
        "filtered_10pct_graph": filtered_10_graph,
        "exact_scan_all": exact_all,
        "half_precision_vs_f32": precision,
        "unfiltered_during_insertion": during,
        "options": index_options(),
    }))
}

fn index_options() -> Value {
    serde_json::to_value(super::EmbeddedOptions::default()).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The searches during the write load are measured, and recall is computed against the
    /// set each stable search saw: below the exact-scan limit every search is exact, so any
    /// recall under 1 would be a truth computed on the wrong set.
    #[test]
    fn searches_during_writes_are_timed_and_scored_against_the_set_they_saw() {
        let dir = tempfile::tempdir().expect("temp dir");
        let load = WriteLoad {
            vectors: 400,
            rate: 2_000,
            batch: 20,
        };
        let mut phases = Vec::new();
        let report =
            bench_search(dir.path(), 1_000, 16, 20, load, |p| phases.push(p)).expect("bench");
        assert_eq!(phases.first(), Some(&"generate"), "{phases:?}");
        assert_eq!(phases.last(), Some(&"close_with_snapshot"), "{phases:?}");
        assert_eq!(phases.len(), 12, "{phases:?}");
        let during = &report["unfiltered_during_insertion"];
        assert_eq!(during["vectors_written"], json!(400));
        let count = |k: &str| during[k].as_u64().expect(k);
        let (searches, stable) = (count("searches"), count("stable_searches"));
        assert!(searches > 0 && stable > 0 && stable <= searches, "{during}");
        assert!(count("recall_searches") <= 20, "{during}");
        assert_eq!(during["recall_at_10"], json!(1.0), "{during}");
        assert_eq!(during["recall_at_10_after_settle"], json!(1.0), "{during}");
        assert_eq!(report["open_catch_up_vectors"], json!(50), "{report}");
        // Half precision moves a 16-d cosine by well under 2⁻⁸ (4 × 2⁻¹¹ at worst), and the
        // clustered data keeps the top 10 nearly intact.
        let precision = &report["half_precision_vs_f32"];
        let error = precision["max_score_error"].as_f64().expect("error");
        assert!(error > 0.0 && error < 4.0 * 2f64.powi(-11), "{precision}");
        let recall = precision["recall_at_10_vs_f32"].as_f64().expect("recall");
        assert!(recall >= 0.9, "{precision}");
    }
}
