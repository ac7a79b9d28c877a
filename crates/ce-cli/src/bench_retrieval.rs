//! `ce bench retrieval`: the keyword index and the search modes at scale, on the engine as
//! `ce serve` runs it (SQLite source and outbox, workers, embedded vector and keyword indexes;
//! hashing embedder, so the figures are the engine's own cost, not the model's).
//!
//! Sections, in order (one JSON object on stdout, progress on stderr):
//! 1. `vector_indexing`: a tree of `--nodes` leaves (topics → subtopics → leaves, every node
//!    with text) written and applied by the vector consumer alone;
//! 2. `keyword_backfill`: the keyword consumer switched on afterwards back-fills from the
//!    journal: events, seconds, documents (nodes) indexed per second; the vector consumer's
//!    queue is untouched;
//! 3. `search`: p50/p99 latency of `--queries` searches per mode (vector, keyword, hybrid) at
//!    that size, with the hits' mean count and hydration drops — after the vector graph is
//!    loaded and settled (`vector_graph_settle_seconds`), as a server's is once it started;
//! 4. `hierarchical_search`: p50/p99 of the same queries in hierarchical mode on that tree,
//!    with the mean containers expanded and index searches per query;
//! 5. `bulk_delete`: the keyword consumer alone applying the removal of a tenth of the topics
//!    (one recursive `rm` per topic: one event per subtree), then of the leaves of another
//!    tenth (one `rm` per leaf: one event per node): nodes and records removed, seconds.
//!
//! Text is synthetic but shaped like prose: a Zipf-distributed vocabulary of pseudo-words,
//! each topic drawing half of its words from its own slice of the vocabulary.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ce_core::config::{KEYWORD_CONSUMER, VECTOR_CONSUMER};
use ce_core::{Config, CtxUri};
use ce_retrieval::{
    HierarchicalParams, HierarchicalRequest, SearchMode, SearchRequest, SearchTimings,
};
use ce_server::engine::{Engine, EngineOptions};
use ce_store::{PutRequest, WriteOp};
use serde_json::{Value, json};

use crate::bench::{latency_summary, machine, round};

/// Options of `ce bench retrieval`.
#[derive(Debug, clap::Args)]
pub struct BenchRetrievalArgs {
    /// Directory in which a fresh, uniquely named directory is created [default: the system
    /// temp dir]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Leaf nodes of the tree (100 topics × 10 subtopics × nodes/1000 leaves)
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub nodes: usize,
    /// Searches per mode
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub queries: usize,
    /// Worker threads per consumer
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub workers: usize,
}

const TOPICS: usize = 100;
const SUBTOPICS: usize = 10;
const VOCABULARY: usize = 20_000;

/// A small deterministic generator (xorshift64*): the bench needs no `rand` dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A Zipf-like rank in `0..n` (exponent 1, by inverse transform of the log density).
    fn zipf(&mut self, n: usize) -> usize {
        let r = ((n as f64).ln() * self.unit()).exp() as usize;
        r.saturating_sub(1).min(n - 1)
    }
}

/// The `i`-th pseudo-word: syllables from the index, distinct per index.
fn word(mut i: usize) -> String {
    const SYL: [&str; 16] = [
        "ka", "lo", "mi", "ne", "ra", "tu", "si", "vo", "pe", "da", "zu", "qi", "ho", "be", "fy",
        "wa",
    ];
    let mut w = String::new();
    loop {
        w.push_str(SYL[i % 16]);
        i /= 16;
        if i == 0 {
            break;
        }
    }
    w
}

/// `n` words of a text about `topic`.
fn words(rng: &mut Rng, topic: usize, n: usize) -> Vec<String> {
    let slice = VOCABULARY / TOPICS;
    (0..n)
        .map(|_| {
            if rng.next().is_multiple_of(2) {
                word(topic * slice + rng.zipf(slice))
            } else {
                word(rng.zipf(VOCABULARY))
            }
        })
        .collect()
}

fn text(rng: &mut Rng, topic: usize, n: usize) -> String {
    words(rng, topic, n).join(" ")
}

/// The tree: topic and subtopic containers with abstracts, leaves with abstract and content.
fn tree_ops(leaves: usize, rng: &mut Rng) -> anyhow::Result<Vec<WriteOp>> {
    let per_sub = leaves.div_ceil(TOPICS * SUBTOPICS).max(1);
    let mut ops = Vec::with_capacity(leaves + TOPICS * (SUBTOPICS + 1));
    let put = |uri: String, abs: String, content: Option<String>| -> anyhow::Result<WriteOp> {
        Ok(WriteOp::Put {
            uri: CtxUri::parse(&uri)?,
            req: PutRequest {
                abstract_text: Some(abs),
                content,
                ..PutRequest::default()
            },
        })
    };
    let mut written = 0;
    for t in 0..TOPICS {
        ops.push(put(format!("ctx://bench/t{t}"), text(rng, t, 12), None)?);
        for s in 0..SUBTOPICS {
            ops.push(put(
                format!("ctx://bench/t{t}/s{s}"),
                text(rng, t, 12),
                None,
            )?);
            for d in 0..per_sub {
                if written == leaves {
                    break;
                }
                written += 1;
                ops.push(put(
                    format!("ctx://bench/t{t}/s{s}/d{d}"),
                    text(rng, t, 10),
                    Some(text(rng, t, 60)),
                )?);
            }
        }
    }
    Ok(ops)
}

fn config(consumers: &[&str]) -> anyhow::Result<Config> {
    let mut cfg = Config::from_toml("[index.embedding]\nprovider = \"hash\"\ndimensions = 384\n")?;
    cfg.index.outbox.consumers = consumers.iter().map(|c| (*c).to_owned()).collect();
    Ok(cfg)
}

/// An engine of `consumers` that runs the workers of `only` (empty: all of them).
fn open(
    dir: &std::path::Path,
    consumers: &[&str],
    only: &[&str],
    workers: usize,
) -> anyhow::Result<Engine> {
    let options = EngineOptions {
        workers,
        run_workers: false,
        role: "bench".into(),
        consumers: only.iter().map(|c| (*c).to_owned()).collect(),
    };
    Ok(Engine::open_with(dir, config(consumers)?, options)?)
}

fn quiet(_: &ce_server::status::DrainProgress) {}

/// The mean of each stage of `searches` (what the retriever timed) and of the whole call, ms.
fn stage_means(searches: &[(Duration, SearchTimings, &str)]) -> Value {
    let n = searches.len().max(1) as f64;
    let mean = |f: fn(&SearchTimings) -> f64| {
        round(searches.iter().map(|(_, t, _)| f(t)).sum::<f64>() / n, 3)
    };
    json!({
        "embed": mean(|t| t.embed_ms),
        "vector_index": mean(|t| t.index_ms),
        "keyword_index": mean(|t| t.keyword_ms),
        "hydrate": mean(|t| t.hydrate_ms),
        "lag": mean(|t| t.lag_ms),
        "retriever_total": mean(|t| t.total_ms),
        "call": round(searches.iter().map(|(d, ..)| d.as_secs_f64() * 1e3).sum::<f64>() / n, 3),
    })
}

/// Runs every section and returns the JSON report.
pub fn run_retrieval(args: &BenchRetrievalArgs) -> anyhow::Result<Value> {
    let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("ce-bench-retrieval-")
        .tempdir_in(&base)
        .with_context(|| format!("create a directory in {}", base.display()))?;
    let dir = tmp.path();
    let started = Instant::now();
    let mut report = serde_json::Map::new();
    report.insert("benchmark".into(), json!("retrieval"));
    report.insert("machine".into(), machine());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);

    // 1. The tree, applied by the vector consumer alone.
    eprintln!("bench: writing {} leaves", args.nodes);
    let engine = open(dir, &[VECTOR_CONSUMER], &[], args.workers)?;
    let ops = tree_ops(args.nodes, &mut rng)?;
    let nodes = ops.len();
    let uris: Vec<CtxUri> = ops.iter().filter_map(WriteOp::put_uri).cloned().collect();
    let t = Instant::now();
    for chunk in ops.chunks(1000) {
        engine.store().apply_batch(chunk.to_vec())?;
    }
    let write_s = t.elapsed().as_secs_f64();
    eprintln!("bench: vector consumer over {nodes} nodes");
    let drained = engine.drain(&quiet)?;
    let vector_s = drained.progress.elapsed_ms / 1e3;
    report.insert(
        "vector_indexing".into(),
        json!({
            "nodes": nodes,
            "write_seconds": round(write_s, 2),
            "events": drained.progress.succeeded,
            "seconds": round(vector_s, 2),
            "events_per_s": round(drained.progress.succeeded as f64 / vector_s, 1),
            "records": engine.index().map_or(Ok(0), |i| i.count())?,
        }),
    );
    engine.shutdown();
    drop(engine);

    // 2. The keyword consumer added later back-fills from the journal.
    let engine = open(dir, &[VECTOR_CONSUMER, KEYWORD_CONSUMER], &[], args.workers)?;
    let status = engine.status()?;
    let lag = |s: &ce_server::status::Status, c: &str| {
        s.consumers
            .iter()
            .find(|x| x.consumer == c)
            .map_or(0, |x| x.lag_events)
    };
    let backlog = lag(&status, KEYWORD_CONSUMER);
    eprintln!("bench: keyword back-fill over {backlog} events");
    let drained = engine.drain(&quiet)?;
    let keyword_s = drained.progress.elapsed_ms / 1e3;
    let after = engine.status()?;
    report.insert(
        "keyword_backfill".into(),
        json!({
            "events": backlog,
            "seconds": round(keyword_s, 2),
            "events_per_s": round(backlog as f64 / keyword_s, 1),
            "docs_per_s": round(nodes as f64 / keyword_s, 1),
            "records": after.keyword_records,
            "vector_events_applied_meanwhile": drained.progress.succeeded - backlog,
            "lag_after": after.consumers.iter().map(|c| (c.consumer.clone(), c.lag_events)).collect::<std::collections::BTreeMap<_, _>>(),
        }),
    );

    // 3. Search latency per mode, on the graph as a long-running process has it once its
    // upkeep thread loaded it and the inserter caught up (the index opens without its graph,
    // docs/indexing.md): loaded and settled first, and that time reported.
    if let Some(v) = engine.embedded_vector_index() {
        let t = Instant::now();
        v.settle()?;
        report.insert(
            "vector_graph_settle_seconds".into(),
            json!(round(t.elapsed().as_secs_f64(), 2)),
        );
    }
    let queries: Vec<String> = (0..args.queries)
        .map(|i| text(&mut rng, i % TOPICS, 4))
        .collect();
    let mut search = serde_json::Map::new();
    for mode in SearchMode::ALL {
        eprintln!("bench: {} queries, {mode} mode", queries.len());
        let mut samples: Vec<Duration> = Vec::with_capacity(queries.len());
        let mut stages: Vec<(Duration, SearchTimings, &str)> = Vec::with_capacity(queries.len());
        let (mut hits, mut dropped) = (0usize, 0usize);
        for q in &queries {
            let req = SearchRequest {
                mode: Some(mode),
                ..SearchRequest::new(q.clone())
            };
            let t = Instant::now();
            let r = engine.search(&req)?;
            let took = t.elapsed();
            samples.push(took);
            stages.push((took, r.timings, q));
            hits += r.hits.len();
            dropped += r.dropped_by_hydration;
        }
        let mut v = latency_summary(&mut samples);
        v["mean_hits"] = json!(round(hits as f64 / queries.len() as f64, 2));
        v["dropped_by_hydration"] = json!(dropped);
        v["stages_mean_ms"] = stage_means(&stages);
        stages.sort_by_key(|(took, ..)| std::cmp::Reverse(*took));
        stages.truncate(queries.len().div_ceil(100));
        v["stages_mean_ms_slowest_1pct"] = stage_means(&stages);
        v["slowest_queries"] = stages.iter().map(|(_, _, q)| json!(q)).collect();
        search.insert(mode.as_str().into(), v);
    }
    report.insert("search".into(), Value::Object(search));

    eprintln!("bench: {} queries, hierarchical", queries.len());
    let mut samples: Vec<Duration> = Vec::with_capacity(queries.len());
    let (mut hits, mut expanded, mut searches) = (0usize, 0usize, 0usize);
    for q in &queries {
        let req = HierarchicalRequest {
            search: SearchRequest::new(q.clone()),
            params: HierarchicalParams::default(),
        };
        let t = Instant::now();
        let r = engine.hierarchical(&req)?;
        samples.push(t.elapsed());
        hits += r.hits.len();
        expanded += r.stats.containers_expanded;
        searches += r.stats.index_searches;
    }
    let n = queries.len().max(1) as f64;
    let mut v = latency_summary(&mut samples);
    v["mean_hits"] = json!(round(hits as f64 / n, 2));
    v["mean_containers_expanded"] = json!(round(expanded as f64 / n, 2));
    v["mean_index_searches"] = json!(round(searches as f64 / n, 2));
    report.insert("hierarchical_search".into(), v);
    engine.shutdown();
    drop(engine);

    // 5. Bulk removal through the keyword consumer alone.
    let engine = open(
        dir,
        &[VECTOR_CONSUMER, KEYWORD_CONSUMER],
        &[KEYWORD_CONSUMER],
        args.workers,
    )?;
    let tenth = (TOPICS / 10).max(1);
    let topic_of = |u: &CtxUri| -> Option<usize> {
        let t = u.as_str().strip_prefix("ctx://bench/t")?;
        t.split('/').next()?.parse().ok()
    };
    let rm = |uri: CtxUri, recursive: bool| WriteOp::Rm {
        uri,
        recursive,
        expect_version: None,
        trace_id: None,
    };
    let subtrees: Vec<WriteOp> = (0..tenth)
        .map(|t| Ok(rm(CtxUri::parse(&format!("ctx://bench/t{t}"))?, true)))
        .collect::<anyhow::Result<_>>()?;
    let in_subtrees = uris
        .iter()
        .filter(|u| topic_of(u).is_some_and(|t| t < tenth))
        .count();
    // Leaves only (a container with children cannot be removed alone).
    let leaves: Vec<WriteOp> = uris
        .iter()
        .filter(|u| topic_of(u).is_some_and(|t| (tenth..2 * tenth).contains(&t)))
        .filter(|u| u.as_str().matches('/').count() == 5)
        .map(|u| rm(u.clone(), false))
        .collect();
    let mut bulk = serde_json::Map::new();
    for (name, removal, nodes) in [
        ("subtrees", subtrees, in_subtrees),
        ("nodes", leaves.clone(), leaves.len()),
    ] {
        let before = engine.status()?.keyword_records.unwrap_or(0);
        eprintln!("bench: removing {nodes} nodes ({name}), keyword consumer");
        let events = removal.len();
        for chunk in removal.chunks(1000) {
            engine.store().apply_batch(chunk.to_vec())?;
        }
        let drained = engine.drain(&quiet)?;
        let s = drained.progress.elapsed_ms / 1e3;
        let after = engine.status()?.keyword_records.unwrap_or(0);
        bulk.insert(
            name.into(),
            json!({
                "nodes": nodes,
                "events": events,
                "records_removed": before.saturating_sub(after),
                "seconds": round(s, 3),
                "nodes_per_s": round(nodes as f64 / s, 1),
            }),
        );
    }
    report.insert("bulk_delete".into(), Value::Object(bulk));
    engine.shutdown();
    report.insert(
        "total_seconds".into(),
        json!(round(started.elapsed().as_secs_f64(), 1)),
    );
    Ok(Value::Object(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_distinct_and_zipf_favours_low_ranks() {
        let all: std::collections::BTreeSet<String> = (0..VOCABULARY).map(word).collect();
        assert_eq!(all.len(), VOCABULARY);
        let mut rng = Rng(7);
        let low = (0..10_000).filter(|_| rng.zipf(1000) < 10).count();
        // P(rank < 10) = ln(11)/ln(1000) ≈ 0.35 for this inverse transform.
        assert!((3_000..4_000).contains(&low), "{low}");
    }

    #[test]
    fn a_small_run_reports_every_section() {
        let dir = tempfile::tempdir().expect("tmp");
        let r = run_retrieval(&BenchRetrievalArgs {
            work_dir: Some(dir.path().to_owned()),
            nodes: 2_000,
            queries: 5,
            workers: 1,
        })
        .expect("bench");
        // 2,000 leaves + 100 topics + 1,000 subtopics, each with text.
        assert_eq!(r["vector_indexing"]["nodes"], 3_100);
        assert_eq!(
            r["keyword_backfill"]["events"],
            r["vector_indexing"]["events"]
        );
        assert_eq!(r["keyword_backfill"]["vector_events_applied_meanwhile"], 0);
        assert!(
            r["keyword_backfill"]["records"].as_u64() > Some(6_000),
            "{r}"
        );
        let h = &r["hierarchical_search"];
        assert!(
            h["p99_ms"].as_f64().is_some() && h["mean_hits"].as_f64() > Some(0.0),
            "{r}"
        );
        assert!(h["mean_containers_expanded"].as_f64() >= Some(1.0), "{r}");
        // Ten topics of 1 + 10 + 20 nodes; the 200 leaves of ten more.
        for (name, nodes) in [("subtrees", 310), ("nodes", 200)] {
            let b = &r["bulk_delete"][name];
            assert_eq!(b["nodes"], nodes, "{name}: {r}");
            assert!(
                b["records_removed"].as_u64() >= Some(nodes),
                "{name}: every node had records: {r}"
            );
        }
        for m in ["vector", "keyword", "hybrid"] {
            assert!(r["search"][m]["p99_ms"].as_f64().is_some(), "{m}: {r}");
            assert!(r["search"][m]["mean_hits"].as_f64() > Some(0.0), "{m}: {r}");
            // The stages the mode runs were timed, the others not; 1 % of 5 is one query.
            let stages = &r["search"][m]["stages_mean_ms"];
            let timed = |k: &str| stages[k].as_f64().is_some_and(|ms| ms > 0.0);
            assert_eq!(timed("vector_index"), m != "keyword", "{m}: {stages}");
            assert_eq!(timed("keyword_index"), m != "vector", "{m}: {stages}");
            assert!(timed("hydrate") && timed("call"), "{m}: {stages}");
            assert_eq!(
                r["search"][m]["slowest_queries"].as_array().map(Vec::len),
                Some(1),
                "{m}: {r}"
            );
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("ls").count(),
            0,
            "the run cleans up"
        );
    }
}
