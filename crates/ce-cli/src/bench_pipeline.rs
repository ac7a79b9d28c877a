//! `ce bench pipeline`: commit → searchable, measured end to end on the embedded stack
//! (SQLite source and outbox, `IndexWorker`, embedded vector index).
//!
//! Sections, in order (one JSON object on stdout, progress on stderr):
//! 1. `hash_pipeline`: events/s of one worker with the hashing embedder — the pipeline's own
//!    overhead (the hashing embedder is for tests and benchmarks only: no semantics);
//! 2. `model_pipeline`: the same with the local model (all-MiniLM-L6-v2), next to the raw
//!    model's sentences/s on the very same texts in the same run, and their ratio;
//! 3. `vector_search`: search latency and recall@10 at `--search-n` records, idle and while
//!    `--search-n / 10` more records are written at `--search-write-rate` vectors/s and the
//!    background inserter moves them into the graph
//!    (`ce_index::vector::embedded::bench::bench_search`);
//! 4. `commit_to_searchable`: p50/p99 from a put's commit to its index write being
//!    acknowledged, at a steady `--rate` writes/s with two workers woken after each commit;
//! 5. `peak_rss_mib` of the whole run, and `peak_rss_mib_by_phase`: each section's (and each
//!    vector-search phase's) own peak — the kernel's high-water mark, read and reset at its
//!    end — and its resident memory at the end.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ce_core::{Clock as _, Config, CtxUri, IndexProjector, OutboxEvent, SystemClock};
use ce_embed::Embedder;
use ce_embed::cache::{CachedEmbedder, EmbeddingCache};
use ce_embed::hash::HashEmbedder;
use ce_embed::local::{LocalEmbedder, default_model_dir};
use ce_index::vector::VectorIndex;
use ce_index::vector::embedded::EmbeddedVectorIndex;
use ce_index::vector::embedded::bench::WriteLoad;
use ce_index::worker::runner::{Wakeup, WorkerPool};
use ce_index::worker::{IndexWorker, WorkError, WorkerCallbacks, WorkerConfig};
use ce_store::{ContextFs, OutboxStore, PutRequest, SqliteStore, WriteOp};
use serde_json::{Value, json};

use crate::bench::{latency_summary, machine, round};

/// Options of `ce bench pipeline`.
#[derive(Debug, clap::Args)]
pub struct BenchPipelineArgs {
    /// Directory in which fresh, uniquely named directories are created [default: the system
    /// temp dir]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Nodes written before the hash-embedder worker run
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub events: usize,
    /// Nodes written before the local-model worker run
    #[arg(long, value_name = "N", default_value_t = 400)]
    pub model_events: usize,
    /// Records in the vector-search benchmark
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub search_n: usize,
    /// Queries in the vector-search benchmark
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub search_queries: usize,
    /// Vectors written per second (in batches of 100, as the vector consumer writes) while
    /// the vector-search benchmark measures search during background graph insertion
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    pub search_write_rate: u32,
    /// Writes per second in the commit → searchable run
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub rate: u32,
    /// Duration of the commit → searchable run, in seconds
    #[arg(long, value_name = "S", default_value_t = 10)]
    pub latency_seconds: u64,
    /// Skip the local-model section (e.g. when the model is not installed)
    #[arg(long)]
    pub skip_model: bool,
}

/// Runs every section and returns the JSON report.
pub fn run_pipeline(args: &BenchPipelineArgs) -> anyhow::Result<Value> {
    let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("ce-bench-pipeline-")
        .tempdir_in(&base)
        .with_context(|| format!("create a directory in {}", base.display()))?;
    let started = Instant::now();
    let mut report = serde_json::Map::new();
    report.insert("benchmark".into(), json!("pipeline"));
    report.insert("machine".into(), machine());
    let mut peaks = PeakRss::default();
    peaks.mark("start");

    eprintln!("bench: hash-embedder pipeline, {} nodes", args.events);
    let hash: Arc<dyn Embedder> = Arc::new(HashEmbedder::new(384));
    report.insert(
        "hash_pipeline".into(),
        worker_run(&dir.path().join("hash"), hash, args.events, |i| {
            node_text(i, 400)
        })?,
    );
    peaks.mark("hash_pipeline");

    if args.skip_model {
        report.insert("model_pipeline".into(), json!("skipped (--skip-model)"));
    } else {
        report.insert(
            "model_pipeline".into(),
            model_section(&dir.path().join("model"), args.model_events)?,
        );
        peaks.mark("model_pipeline");
    }

    eprintln!("bench: vector search at {} records", args.search_n);
    let search_dir = dir.path().join("search");
    std::fs::create_dir_all(&search_dir)?;
    let search = ce_index::vector::embedded::bench::bench_search(
        &search_dir,
        args.search_n,
        384,
        args.search_queries,
        WriteLoad {
            vectors: (args.search_n / 10).max(1),
            rate: args.search_write_rate,
            batch: 100,
        },
        |phase| peaks.mark(&format!("vector_search.{phase}")),
    )?;
    report.insert("vector_search".into(), search);

    eprintln!(
        "bench: commit → searchable at {} writes/s for {} s",
        args.rate, args.latency_seconds
    );
    report.insert(
        "commit_to_searchable".into(),
        latency_section(&dir.path().join("latency"), args.rate, args.latency_seconds)?,
    );
    peaks.mark("commit_to_searchable");

    report.insert("peak_rss_mib".into(), json!(peaks.max));
    report.insert(
        "peak_rss_mib_by_phase".into(),
        Value::Object(std::mem::take(&mut peaks.phases)),
    );
    report.insert(
        "total_seconds".into(),
        json!(round(started.elapsed().as_secs_f64(), 1)),
    );
    report.insert("targets".into(), targets(&report));
    Ok(Value::Object(report))
}

/// An abstract and a content of about `content_len` bytes, distinct per node.
fn node_text(i: usize, content_len: usize) -> (String, String) {
    let words = [
        "context", "agent", "memory", "index", "vector", "outbox", "search", "resource", "skill",
        "session",
    ];
    let abs = format!(
        "Node {i} is about {} and {}.",
        words[i % 10],
        words[(i / 10) % 10]
    );
    let mut content = String::with_capacity(content_len + 32);
    let mut k = i;
    while content.len() < content_len {
        content.push_str(words[k % 10]);
        content.push(' ');
        k = k.wrapping_mul(31).wrapping_add(7);
    }
    content.push_str(&format!("#{i}"));
    (abs, content)
}

fn open_store(dir: &Path) -> anyhow::Result<Arc<SqliteStore>> {
    let mut cfg = Config::default();
    cfg.index.outbox.consumers = vec!["vector".into()];
    Ok(Arc::new(SqliteStore::open(dir, cfg)?))
}

fn write_nodes(
    store: &SqliteStore,
    n: usize,
    text: impl Fn(usize) -> (String, String),
) -> anyhow::Result<()> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let ops = chunk
            .iter()
            .map(|&i| {
                let (a, c) = text(i);
                let uri = CtxUri::parse(&format!("ctx://bench/docs/g{}/d{i}", i % 100))?;
                Ok(WriteOp::Put {
                    uri,
                    req: PutRequest {
                        abstract_text: Some(a),
                        content: Some(c),
                        ..PutRequest::default()
                    },
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        store.apply_batch(ops)?;
    }
    Ok(())
}

/// Writes `n` nodes, then times one worker draining the outbox.
fn worker_run(
    dir: &Path,
    embedder: Arc<dyn Embedder>,
    n: usize,
    text: impl Fn(usize) -> (String, String),
) -> anyhow::Result<Value> {
    let store = open_store(dir)?;
    write_nodes(&store, n, text)?;
    let cache = Arc::new(EmbeddingCache::open(&dir.join("embed-cache.db"))?);
    let cached = Arc::new(CachedEmbedder::new(embedder.clone(), cache));
    let index = Arc::new(EmbeddedVectorIndex::open(&dir.join("vector"))?);
    let cfg = WorkerConfig::from_config(store.config(), "bench-1", "vector");
    let worker = IndexWorker::new(
        cfg,
        store.clone(),
        cached.clone(),
        index.clone(),
        IndexProjector::default(),
    )?;
    let t0 = Instant::now();
    let mut events = 0;
    loop {
        let r = worker.run_once(100)?;
        if r.claimed == 0 {
            break;
        }
        events += r.succeeded;
    }
    let secs = t0.elapsed().as_secs_f64();
    let stats = cached.stats();
    Ok(json!({
        "embedder": embedder.identity().key(),
        "nodes": n,
        "events": events,
        "seconds": round(secs, 3),
        "events_per_s": round(events as f64 / secs, 1),
        "texts_embedded": stats.texts_embedded,
        "embedded_texts_per_s": round(stats.texts_embedded as f64 / secs, 1),
        "records": index.count()?,
    }))
}

fn model_section(dir: &Path, n: usize) -> anyhow::Result<Value> {
    let model_dir = default_model_dir();
    eprintln!(
        "bench: loading the local model from {}",
        model_dir.display()
    );
    let model: Arc<dyn Embedder> = Arc::new(LocalEmbedder::load(&model_dir)?);
    // The raw model on exactly the texts the pipeline will embed, batch 32.
    let texts: Vec<String> = {
        let mut set = std::collections::BTreeSet::new();
        for i in 0..n {
            let (a, c) = node_text(i, 120);
            set.insert(a);
            set.insert(c);
        }
        set.into_iter().collect()
    };
    eprintln!("bench: raw model, {} texts", texts.len());
    let t0 = Instant::now();
    for chunk in texts.chunks(32) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        model.embed_texts(&refs, Duration::from_secs(600))?;
    }
    let raw = texts.len() as f64 / t0.elapsed().as_secs_f64();
    eprintln!("bench: model pipeline, {n} nodes");
    let mut run = worker_run(dir, model, n, |i| node_text(i, 120))?;
    let in_pipeline = run["embedded_texts_per_s"].as_f64().unwrap_or(0.0);
    run["raw_model_sentences_per_s"] = json!(round(raw, 1));
    run["pipeline_vs_raw_ratio"] = json!(round(in_pipeline / raw, 3));
    Ok(run)
}

/// Records commit → acknowledged-index-write latency of every UPSERT through a callback.
struct LatencyProbe {
    clock: SystemClock,
    samples: Mutex<Vec<Duration>>,
}

impl WorkerCallbacks for LatencyProbe {
    fn on_event_success(&self, e: &OutboxEvent, _ms: u64) -> Result<(), String> {
        if e.event_type == ce_core::EventType::UpsertContext {
            let ms = (self.clock.now_ms() - e.created_at_ms).max(0) as u64;
            self.samples
                .lock()
                .map_err(|_| "poisoned")?
                .push(Duration::from_millis(ms));
        }
        Ok(())
    }

    fn on_event_failure(&self, _e: &OutboxEvent, _err: &WorkError, _r: bool) -> Result<(), String> {
        Ok(())
    }
}

fn latency_section(dir: &Path, rate: u32, seconds: u64) -> anyhow::Result<Value> {
    let store = open_store(dir)?;
    let cache = Arc::new(EmbeddingCache::open(&dir.join("embed-cache.db"))?);
    let embedder: Arc<dyn Embedder> =
        Arc::new(CachedEmbedder::new(Arc::new(HashEmbedder::new(384)), cache));
    let index: Arc<dyn VectorIndex> = Arc::new(EmbeddedVectorIndex::open(&dir.join("vector"))?);
    let probe = Arc::new(LatencyProbe {
        clock: SystemClock,
        samples: Mutex::new(Vec::new()),
    });
    let wake = Wakeup::new();
    let workers = (0..2)
        .map(|k| {
            let cfg = WorkerConfig::from_config(store.config(), &format!("bench-{k}"), "vector");
            Ok(Arc::new(
                IndexWorker::new(
                    cfg,
                    store.clone(),
                    embedder.clone(),
                    index.clone(),
                    IndexProjector::default(),
                )?
                .with_callback(probe.clone()),
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let poll = Duration::from_millis(store.config().index.worker.poll_interval_ms);
    let pool = WorkerPool::start(workers, wake.clone(), poll);
    let total = (rate as u64 * seconds) as usize;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let t0 = Instant::now();
    for i in 0..total {
        let due = t0 + period * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let (a, c) = node_text(i, 300);
        let uri = CtxUri::parse(&format!("ctx://bench/live/d{i}"))?;
        store.put(
            &uri,
            PutRequest {
                abstract_text: Some(a),
                content: Some(c),
                ..PutRequest::default()
            },
        )?;
        wake.notify();
    }
    let achieved = total as f64 / t0.elapsed().as_secs_f64();
    let done = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
        let open: u64 = store
            .stats()?
            .iter()
            .map(|s| s.pending + s.claimed + s.retry_wait)
            .sum();
        done.store(open == 0, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
    }
    pool.shutdown();
    let mut samples = std::mem::take(
        &mut *probe
            .samples
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?,
    );
    Ok(json!({
        "embedder": "hash:feature-hash-v1:384 (pipeline overhead; add the model's embedding time for real text)",
        "writes": total,
        "target_rate": rate,
        "achieved_rate": round(achieved, 1),
        "workers": 2,
        "latency": latency_summary(&mut samples),
    }))
}

fn targets(report: &serde_json::Map<String, Value>) -> Value {
    let get = |path: &[&str]| {
        let mut v = report.get(path[0])?;
        for p in &path[1..] {
            v = v.get(*p)?;
        }
        v.as_f64()
    };
    let hash = get(&["hash_pipeline", "events_per_s"]);
    let ratio = get(&["model_pipeline", "pipeline_vs_raw_ratio"]);
    let p99 = get(&["commit_to_searchable", "latency", "p99_ms"]);
    let rss = get(&["peak_rss_mib"]);
    let during = |k: &str| get(&["vector_search", "unfiltered_during_insertion", k]);
    let during_p99 = during("p99_us").map(|us| us / 1e3);
    let during_recall = during("recall_at_10");
    json!({
        // The spec's 5,000 events/s, raised by issue 20 ("hash-embedder worker ≥ 10,000").
        "hash_events_per_s_min": 10000, "hash_met": hash.map(|v| v >= 10000.0),
        "model_ratio_min": 0.9, "model_ratio_met": ratio.map(|v| v >= 0.9),
        "commit_to_searchable_p99_ms_max": 250, "commit_to_searchable_met": p99.map(|v| v <= 250.0),
        "peak_rss_mib_max": 512, "rss_met": rss.map(|v| v <= 512.0),
        "search_during_insertion_p99_ms_max": 5, "search_during_insertion_p99_met": during_p99.map(|v| v <= 5.0),
        "search_during_insertion_recall_min": 0.99, "search_during_insertion_recall_met": during_recall.map(|v| v >= 0.99),
        "note": "search p99 ≤ 10 ms and recall@10 are in vector_search; RSS covers the whole bench process, search index included",
    })
}

/// The process's peak resident memory, phase by phase: [`PeakRss::mark`] reads the kernel's
/// high-water mark (`VmHWM`) and the resident memory at the phase's end (`VmRSS`), then resets
/// the mark to the current RSS (`5` to `/proc/self/clear_refs`, Linux ≥ 4.0), so each phase
/// reports its own peak and `max` the whole run's. Without `/proc` nothing is reported; when
/// the reset is refused each phase reports the peak so far (`max` stays right).
#[derive(Default)]
struct PeakRss {
    phases: serde_json::Map<String, Value>,
    max: Option<f64>,
}

impl PeakRss {
    fn mark(&mut self, phase: &str) {
        let (Some(peak), Some(end)) = (status_mib("VmHWM:"), status_mib("VmRSS:")) else {
            return;
        };
        self.phases
            .insert(phase.to_owned(), json!({ "peak": peak, "end": end }));
        self.max = Some(self.max.map_or(peak, |m: f64| m.max(peak)));
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }
}

/// A memory line of `/proc/self/status` (`field` with its colon), in MiB.
fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(round(kib / 1024.0, 1))
}
