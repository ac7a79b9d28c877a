//! `ce bench ingest --source kb`: knowledge bases measured on the user's path (issue 17,
//! docs/ingestion.md). It generates `--docs` files ([`crate::bench_corpus`]: Markdown, HTML,
//! PDF, Rust and Python, 1–20 KB, in nested directories, from `--seed`), then:
//!
//! 1. `parsers`: `ce_ingest::parse` over every file of each format (MB/s of file bytes), then
//!    `ce_ingest::chunk` over the parsed documents with the engine's token counter (MB/s of
//!    text), in this process;
//! 2. the phases, each through the CLI's own dispatch like `--source import` (each command
//!    opens and closes the engine): `ce kb create`, then `ce kb add BASE DIR` — which follows
//!    its work to the end (jobs, outbox drain, settle) — for `cold`, `noop` (the same
//!    directory again: a re-sync), `edit_1pct` (1 % of the files get one section rewritten)
//!    and `delete_1pct` (1 % of the files removed: the re-sync removes their nodes under the
//!    delete-safety policy). Per phase: wall seconds, CPU seconds of the process (the
//!    command runs in it; steadier than wall time on a shared machine), files read (index
//!    jobs: a re-sync reads only what changed), items by status (an item that failed fails
//!    the bench), texts embedded (new embedding-cache entries), the embedder's calls (the
//!    command's own counters; the loopback server's requests too), events appended (new
//!    deliveries of one consumer: every kb event is delivered to every consumer), nodes
//!    under the base, sizes on disk. The corpus is at least 2 s old when the cold phase
//!    reads it (a user's files are; docs/ingestion.md "Re-sync");
//! 3. `raw_model`, measured right after the cold phase: the configured provider itself (no
//!    cache, no pipeline) embedding a sample of the very texts the cold phase embedded (the
//!    nodes' L0/L1/L2 records, projected as the vector consumer projects them), in batches
//!    of `index.embedding.batch_size`, and the cold phase's texts/s over it: `ratio`, with
//!    the target (≥ 0.9, local model only).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use ce_core::{CtxUri, IndexProjector};
use ce_embed::tokens::TokenCounter;
use ce_ingest::{Chunking, Hint, TokenCount};
use serde_json::{Value, json};

use crate::bench::{cpu_seconds_since, load_average, machine, process_cpu_seconds, round};
use crate::bench_corpus::{self as corpus, Entry, Kind};
use crate::bench_ingest::{BenchIngestArgs, Ce, Seen, Setup};

/// The base's name; its root is `ctx://default/resources/bench`.
const BASE: &str = "bench";
/// The corpus directory's name (the base's top-level item and node).
const CORPUS_DIR: &str = "corpus";
/// The ratio of pipeline to raw texts/s the issue asks of the local model.
const TARGET_RATIO: f64 = 0.9;

/// Runs the kb benchmark in `setup`'s directories.
pub fn run_kb(args: &BenchIngestArgs, setup: Setup) -> anyhow::Result<Value> {
    let started = Instant::now();
    let load_start = load_average();
    let root = setup.tmp.path().join(CORPUS_DIR);
    let n = args.docs;
    if n == 0 {
        bail!("--docs must be at least 1");
    }
    let entries = corpus::plan(args.seed, n);
    let files = corpus_summary(&root, args.seed, &entries)?;
    let written = Instant::now();

    let ce = Ce {
        data: setup.data.clone(),
        config: setup.config.clone(),
        docs: root.clone(),
    };
    let (_, config) = crate::commands::resolve(&ce.cli(&["status"])?)
        .map_err(|e| anyhow::anyhow!("the bench configuration: {e}"))?;
    let counter = TokenCounter::for_config(&config.index.embedding);
    let parsers = parsers(&root, &entries, &counter)?;
    // A user's files are older than the racy window when they are added (a file changed
    // just before it is read gets no fingerprint and is read again at the next re-sync):
    // wait it out when the parsers took less, so `noop` measures the stat checks. The
    // edited files of `edit_1pct` are read right after their edit, as a user's would be.
    let racy = ce_server::kb::fingerprint::RACY_WINDOW + Duration::from_millis(100);
    if let Some(left) = racy.checked_sub(written.elapsed()) {
        std::thread::sleep(left);
    }

    ce.run(&["kb", "create", BASE])?;
    let base_uri = CtxUri::parse(&format!("ctx://default/resources/{BASE}"))?;
    let dir_uri = base_uri.join(CORPUS_DIR)?;
    let node_of = |e: &Entry| -> anyhow::Result<CtxUri> {
        let mut u = dir_uri.clone();
        for part in e.rel.iter() {
            u = u.join(&part.to_string_lossy())?;
        }
        Ok(u)
    };
    let one_pct = (n / 100).max(1);
    let step = n / one_pct;
    let edited: Vec<&Entry> = entries.iter().step_by(step).take(one_pct).collect();
    let deleted: Vec<&Entry> = entries
        .iter()
        .skip(step / 2)
        .step_by(step)
        .take(one_pct)
        .collect();

    let mut phases = serde_json::Map::new();
    let mut seen = Seen::default();
    let phase = |name: &str, seen: &mut Seen| -> anyhow::Result<Value> {
        eprintln!("bench: phase {name} (ce kb add {BASE} {})", root.display());
        let v = kb_phase(&ce, &root, setup.server.as_ref(), seen, &base_uri)?;
        eprintln!(
            "bench: phase {name}: {} s, {} texts embedded, {} events",
            v["wall_s"], v["texts_embedded"], v["events"]
        );
        Ok(v)
    };
    let load_before_cold = load_average();
    let mut cold = phase("cold", &mut seen)?;
    cold["load_average"] = json!({"before": load_before_cold, "after": load_average()});
    phases.insert("cold".into(), cold.clone());
    // The raw provider right after the cold phase, on the machine as loaded as it was.
    let cold_texts = projected_texts(&ce, &base_uri)?;
    let raw = raw_model(&config, &cold_texts, args.raw_texts)?;
    drop(cold_texts);
    phases.insert("noop".into(), phase("noop", &mut seen)?);

    for e in &edited {
        corpus::write(&root, args.seed, e, 1)?;
    }
    let mut edit = phase("edit_1pct", &mut seen)?;
    let (mut edited_nodes, mut edited_texts) = (0u64, BTreeSet::new());
    {
        let store = ce.store()?;
        let projector = IndexProjector::new(config.projector);
        for e in &edited {
            for node in store.read_subtree(&node_of(e)?)? {
                edited_nodes += 1;
                for r in projector.build_context_records(&node).records {
                    edited_texts.insert(r.text);
                }
            }
        }
    }
    edit["edited_files"] = json!(edited.len());
    edit["edited_files_nodes"] = json!(edited_nodes);
    edit["edited_files_texts"] = json!(edited_texts.len());
    phases.insert("edit_1pct".into(), edit);

    let mut deleted_nodes = 0u64;
    {
        let store = ce.store()?;
        for e in &deleted {
            deleted_nodes += store.read_subtree(&node_of(e)?)?.len() as u64;
        }
    }
    for e in &deleted {
        fs_err::remove_file(root.join(&e.rel))?;
    }
    let mut del = phase("delete_1pct", &mut seen)?;
    del["deleted_files"] = json!(deleted.len());
    del["deleted_files_nodes"] = json!(deleted_nodes);
    phases.insert("delete_1pct".into(), del);

    let cold_rate = rate(&cold["texts_embedded"], &cold["wall_s"]);
    let raw_rate = raw["texts_per_s"].as_f64();
    let ratio = match (cold_rate, raw_rate) {
        (Some(p), Some(r)) if r > 0.0 => Some(round(p / r, 3)),
        _ => None,
    };
    let local = args.embedder == "local";
    Ok(json!({
        "benchmark": "ingest",
        "source": "kb",
        "machine": machine(),
        "load_average": {"start": load_start, "end": load_average()},
        "docs": n,
        "seed": args.seed,
        "changed_per_phase": one_pct,
        "embedder": args.embedder,
        "consumers": args.consumers,
        "token_counter": counter.describe(),
        "corpus": files.iter().map(|(k, f)| (k.clone(), f.json())).collect::<serde_json::Map<_, _>>(),
        "parsers": parsers,
        "phases": phases,
        "raw_model": raw,
        "cold_texts_per_s": cold_rate.map(|r| round(r, 1)),
        "ratio": ratio,
        "targets": {
            "model_ratio_min": TARGET_RATIO,
            "model_ratio_met": if local { ratio.map(|r| r >= TARGET_RATIO) } else { None },
            "note": "ratio = the cold phase's texts embedded per wall second ÷ the raw \
                     provider's texts/s on a sample of the same texts; the target applies to \
                     --embedder local (with hash it is the pipeline's overhead)",
        },
        "total_seconds": round(started.elapsed().as_secs_f64(), 1),
    }))
}

/// The `kb-index-documents` jobs enqueued so far, whatever their state: one per file (or
/// URL, note) read.
fn index_jobs(ce: &Ce) -> anyhow::Result<u64> {
    Ok(ce
        .store()?
        .jobs()
        .job_counts()?
        .iter()
        .filter(|c| c.job_type == ce_server::kb::INDEX_JOB)
        .map(|c| c.count)
        .sum())
}

/// `texts` / `seconds` of two JSON numbers.
fn rate(texts: &Value, seconds: &Value) -> Option<f64> {
    let (t, s) = (texts.as_f64()?, seconds.as_f64()?);
    (s > 0.0).then(|| t / s)
}

/// Files, bytes, smallest and largest of one format of the corpus.
#[derive(Default)]
struct FormatFiles {
    files: u64,
    bytes: u64,
    min: usize,
    max: usize,
}

impl FormatFiles {
    fn json(&self) -> Value {
        json!({
            "files": self.files,
            "mb": round(self.bytes as f64 / 1e6, 2),
            "min_bytes": self.min,
            "max_bytes": self.max,
        })
    }
}

/// Writes the corpus with progress lines; returns its files per format.
fn corpus_summary(
    root: &Path,
    seed: u64,
    entries: &[Entry],
) -> anyhow::Result<BTreeMap<String, FormatFiles>> {
    let t = Instant::now();
    let mut out: BTreeMap<String, FormatFiles> = BTreeMap::new();
    let every = (entries.len() / 10).max(1);
    for (k, e) in entries.iter().enumerate() {
        let len = corpus::write(root, seed, e, 0)?;
        let f = out.entry(e.kind.ext().to_owned()).or_default();
        f.min = if f.files == 0 { len } else { f.min.min(len) };
        f.max = f.max.max(len);
        f.files += 1;
        f.bytes += len as u64;
        if (k + 1) % every == 0 || k + 1 == entries.len() {
            eprintln!("bench: corpus {}/{} files", k + 1, entries.len());
        }
    }
    eprintln!(
        "bench: corpus written in {:.1} s to {}",
        t.elapsed().as_secs_f64(),
        root.display()
    );
    Ok(out)
}

/// Parser throughput per format, then chunking over every parsed document.
fn parsers(root: &Path, entries: &[Entry], counter: &TokenCounter) -> anyhow::Result<Value> {
    let mut out = serde_json::Map::new();
    let mut parsed = Vec::with_capacity(entries.len());
    for kind in Kind::ALL {
        let mut inputs = Vec::new();
        for e in entries.iter().filter(|e| e.kind == kind) {
            let path = root.join(&e.rel);
            inputs.push((path.display().to_string(), fs_err::read(&path)?));
        }
        if inputs.is_empty() {
            continue;
        }
        eprintln!("bench: parsing {} .{} files", inputs.len(), kind.ext());
        let bytes: usize = inputs.iter().map(|(_, b)| b.len()).sum();
        let t = Instant::now();
        for (name, b) in &inputs {
            let doc = ce_ingest::parse(b, Hint::file(name))
                .with_context(|| format!("the generated {name} does not parse"))?;
            parsed.push(doc);
        }
        let secs = t.elapsed().as_secs_f64();
        out.insert(
            kind.ext().to_owned(),
            json!({
                "files": inputs.len(),
                "mb": round(bytes as f64 / 1e6, 3),
                "seconds": round(secs, 3),
                "mb_per_s": round(bytes as f64 / 1e6 / secs.max(1e-9), 2),
            }),
        );
    }
    eprintln!("bench: chunking {} documents", parsed.len());
    let options = ce_server::kb::KbSettings::default().chunk_options();
    let count = |t: &str| counter.count(t);
    let text_bytes: usize = parsed.iter().map(|d| d.text.len()).sum();
    let (mut chunks, mut whole) = (0usize, 0usize);
    let t = Instant::now();
    for d in &parsed {
        match ce_ingest::chunk(d, &count as &dyn TokenCount, &options)? {
            Chunking::Whole { .. } => whole += 1,
            Chunking::Split { chunks: c } => chunks += c.len(),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    out.insert(
        "chunk".into(),
        json!({
            "documents": parsed.len(),
            "text_mb": round(text_bytes as f64 / 1e6, 3),
            "seconds": round(secs, 3),
            "mb_per_s": round(text_bytes as f64 / 1e6 / secs.max(1e-9), 2),
            "whole_documents": whole,
            "chunks": chunks,
            "token_counter": counter.describe(),
            "options": {"max_tokens": options.max_tokens, "overlap_tokens": options.overlap_tokens,
                        "min_tokens": options.min_tokens},
        }),
    );
    Ok(Value::Object(out))
}

/// One phase: `ce kb add BASE DIR` (followed to its end), then the item counts, embedder
/// counters, events and nodes.
fn kb_phase(
    ce: &Ce,
    root: &Path,
    server: Option<&ce_http::loopback::LoopbackServer>,
    seen: &mut Seen,
    base_uri: &CtxUri,
) -> anyhow::Result<Value> {
    let dir = root.display().to_string();
    let read_before = index_jobs(ce)?;
    let t = Instant::now();
    let cpu = process_cpu_seconds();
    let added = ce.run(&["kb", "add", BASE, &dir])?;
    let wall = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds_since(cpu);
    let files_read = index_jobs(ce)? - read_before;
    if let Some(w) = added["waiting"].as_str() {
        bail!("ce kb add stopped before the end: {w}");
    }
    if added["progress"]["finished"] != true {
        bail!(
            "ce kb add answered before its work ended: {}",
            added["progress"]
        );
    }
    let status = ce.run(&["kb", "status", BASE])?;
    let failed: Vec<String> = status["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|i| i["status"] == "failed")
        .take(5)
        .map(|i| format!("{}: {}", i["source"], i["error"]))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} items failed, e.g. {}",
            status["counts"]["failed"],
            failed.join("; ")
        );
    }
    let mut v = json!({
        "wall_s": round(wall, 3),
        "cpu_s": cpu,
        "files_read": files_read,
        "items": status["counts"],
        "items_done": status["done"],
        "items_total": status["total"],
        "embedder_calls": added["embed"]["provider_calls"],
        "cache_hits": added["embed"]["hits"],
    });
    let engine = ce.count_embeds(&mut v, server, seen)?;
    // Every kb write's events are delivered to every configured consumer, so one consumer's
    // deliveries count the journal's events.
    let c = &engine["consumers"][0];
    let deliveries: u64 = ["pending", "claimed", "retry_wait", "done", "dead"]
        .iter()
        .filter_map(|k| c[*k].as_u64())
        .sum();
    v["events"] = json!(deliveries.saturating_sub(seen.deliveries));
    seen.deliveries = deliveries;
    v["lag_events"] = c["lag_events"].clone();
    v["nodes"] = json!(ce.store()?.read_subtree(base_uri)?.len());
    v["sizes_mib"] = json!(crate::bench_ingest::sizes(&ce.data)?);
    Ok(v)
}

/// The texts the vector consumer embeds for the base's nodes (L0/L1/L2 records, fallbacks
/// applied), each once, grouped by node in URI order.
fn projected_texts(ce: &Ce, base_uri: &CtxUri) -> anyhow::Result<Vec<Vec<String>>> {
    let (_, config) = crate::commands::resolve(&ce.cli(&["status"])?)
        .map_err(|e| anyhow::anyhow!("the bench configuration: {e}"))?;
    let projector = IndexProjector::new(config.projector);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for node in ce.store()?.read_subtree(base_uri)? {
        let mut texts = Vec::new();
        for r in projector.build_context_records(&node).records {
            if seen.insert(r.text.clone()) {
                texts.push(r.text);
            }
        }
        if !texts.is_empty() {
            out.push(texts);
        }
    }
    Ok(out)
}

/// The configured provider itself (no cache, no pipeline) on an evenly spread sample of
/// whole nodes of `nodes` (every text of a sampled node, so short and long levels keep their
/// proportions; about `limit` texts), in batches of `index.embedding.batch_size`.
fn raw_model(
    config: &ce_core::Config,
    nodes: &[Vec<String>],
    limit: usize,
) -> anyhow::Result<Value> {
    let total: usize = nodes.iter().map(Vec::len).sum();
    if total == 0 || limit == 0 {
        return Ok(json!({"texts": 0}));
    }
    let provider = ce_embed::build_provider(&config.index.embedding)?;
    let stride = total.div_ceil(limit).max(1);
    let sample: Vec<&str> = nodes
        .iter()
        .step_by(stride)
        .flatten()
        .map(String::as_str)
        .collect();
    let texts = total;
    let batch = config.index.embedding.batch_size as usize;
    eprintln!(
        "bench: raw provider {} on {} of the cold phase's {} texts, batches of {batch}",
        provider.identity().key(),
        sample.len(),
        texts
    );
    let t = Instant::now();
    let mut calls = 0usize;
    for (k, chunk) in sample.chunks(batch).enumerate() {
        provider.embed_texts(chunk, Duration::from_secs(600))?;
        calls += 1;
        if (k + 1) % 20 == 0 {
            eprintln!("bench:   raw {}/{} texts", (k + 1) * batch, sample.len());
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let chars: usize = sample.iter().map(|s| s.chars().count()).sum();
    Ok(json!({
        "provider": provider.identity().key(),
        "texts": sample.len(),
        "of_cold_texts": texts,
        "mean_chars": round(chars as f64 / sample.len() as f64, 1),
        "calls": calls,
        "seconds": round(secs, 3),
        "texts_per_s": round(sample.len() as f64 / secs.max(1e-9), 1),
        "load_average_after": load_average(),
    }))
}
