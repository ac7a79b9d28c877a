//! `ce bench derive`: what deriving L0 / L1 costs (docs/derive.md) — JSON out.
//!
//! - `throughput`: N documents of 1–5 KB (English sentences drawn from a fixed vocabulary,
//!   deterministic) under 100 folders are written, then the derive consumer is drained
//!   through the real worker loop with the extractive generator: documents and folders
//!   derived per second, write-backs applied, discarded, deferred, generator calls.
//! - `coalescing`: 100 children of one folder change at once (one batch of puts), and the
//!   consumer is drained: how many times the folder was derived (its version counts its
//!   write-backs), against 100 without coalescing.
//! - `ingest`: `--ingest-docs` documents through the whole engine with the default
//!   consumers and `--embedder` (the local model by default): write, then the derive
//!   consumer alone, then the indexes — each stage timed, so derivation's share of the total
//!   ingest time is measured — and the texts the embedder was given per new document
//!   against the distinct texts the nodes' records carry (equal when nothing is embedded
//!   twice and no fallback is embedded before its derived layer replaces it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ce_core::config::{DERIVE_CONSUMER, DeriveLlmConfig};
use ce_core::{Clock, Config, CtxUri, IndexProjector, SystemClock};
use ce_derive::{DeriveHandler, DeriveSettings, Extractive, Generator, LlmGenerator};
use ce_embed::Embedder as _;
use ce_embed::TokenCounter;
use ce_http::loopback::{LoopbackServer, Recorded, Reply};
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_server::status::DrainProgress;
use ce_server::{Engine, EngineOptions};
use ce_store::{ContextFs as _, DeriveStore as _, PutRequest, SourceStore, SqliteStore, WriteOp};
use serde_json::{Value, json};

use crate::bench::{BenchDir, machine, rate, round};

/// `ce bench derive`.
#[derive(Debug, clap::Args)]
pub struct BenchDeriveArgs {
    /// Documents of the throughput run.
    #[arg(long, default_value_t = 10_000)]
    pub docs: u64,
    /// Where the temporary store lives [default: the system's temporary directory].
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
    /// Keep the store afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Documents of the run of the `llm` generator against a loopback chat-completions
    /// server (0 skips it).
    #[arg(long, default_value_t = 1_000)]
    pub llm_docs: u64,
    /// Documents of the ingest run through the whole engine (0 skips it).
    #[arg(long, default_value_t = 1_000)]
    pub ingest_docs: u64,
    /// Embedder of the ingest run: `local` (all-MiniLM-L6-v2, scripts/fetch-model.sh) or
    /// `hash` (feature hashing: the pipeline's own cost).
    #[arg(long, default_value = "local")]
    pub embedder: String,
}

const SENTENCES: [&str; 12] = [
    "The outbox records every change in the same transaction as the data.",
    "A worker claims a batch of events and applies them to its index.",
    "Retries back off exponentially and give up after a configured number of attempts.",
    "Vector search finds passages whose meaning is close to the query.",
    "Keyword search ranks documents by BM25 over their terms.",
    "Hybrid search fuses both rankings with reciprocal rank fusion.",
    "Path locks keep a move and a removal of the same subtree apart.",
    "A crash loses nothing that was acknowledged to the client.",
    "Derived abstracts let an agent decide what to read before reading it.",
    "Folders roll up the abstracts of their children into an overview.",
    "The embedding cache avoids paying twice for the same text.",
    "Tenants see only the accounts their API key grants.",
];

/// A deterministic document of 1–5 KB.
fn document(i: u64) -> String {
    let target = 1024 + (i * 7919 % 4096) as usize;
    let mut out = format!("# Note {i}\n\n");
    let mut k = i as usize;
    while out.len() < target {
        out.push_str(SENTENCES[k % SENTENCES.len()]);
        out.push(' ');
        k = k.wrapping_mul(31).wrapping_add(7);
        if k.is_multiple_of(5) {
            out.push_str("\n\n");
        }
    }
    out
}

fn worker(
    store: &Arc<SqliteStore>,
    config: &Config,
    generator: Arc<dyn Generator>,
) -> (IndexWorker, Arc<DeriveHandler>) {
    let d = &config.derive;
    let settings = DeriveSettings {
        budget: config.projector.into(),
        batch_size: d.batch_size as usize,
        timeout: Duration::from_secs(u64::from(d.timeout_seconds)),
        max_tokens_per_day: 0,
        types: d.derived_types(),
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let source: Arc<dyn SourceStore> = store.clone();
    let handler = Arc::new(DeriveHandler::new(
        source.clone(),
        generator,
        settings,
        IndexProjector::new(config.projector),
        clock,
    ));
    let cfg = WorkerConfig::from_config(config, "bench-derive", "derive");
    (IndexWorker::for_ops(cfg, source, handler.clone()), handler)
}

/// Runs `w` until it claims nothing; the batches run.
fn drain(w: &IndexWorker) -> anyhow::Result<u64> {
    let mut batches = 0;
    loop {
        let r = w.run_next()?;
        if r.claimed == 0 {
            return Ok(batches);
        }
        batches += 1;
    }
}

/// Runs the benchmark.
pub fn run_derive(args: &BenchDeriveArgs) -> anyhow::Result<Value> {
    if !matches!(args.embedder.as_str(), "local" | "hash") {
        anyhow::bail!(
            "--embedder {:?} is not one of \"local\", \"hash\"",
            args.embedder
        );
    }
    let work_dir = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut config = Config::default();
    config.index.outbox.consumers = vec!["derive".into()];
    eprintln!(
        "bench derive: writing {} documents, then deriving them (extractive, no model)",
        args.docs
    );

    let dir = BenchDir::create(&work_dir, args.keep)?;
    let store = Arc::new(SqliteStore::open(&dir.path, config.clone())?);
    let t0 = Instant::now();
    write_documents(store.as_ref(), args.docs)?;
    let write = t0.elapsed();
    let (w, handler) = worker(&store, &config, Arc::new(Extractive::default()));
    let t1 = Instant::now();
    let batches = drain(&w)?;
    let derive = t1.elapsed();
    let c = handler.counters();
    // The documents, their (up to) 100 folders, `ctx://bench/resources` and `ctx://bench`.
    let nodes = args.docs + args.docs.min(100) + 2;
    let throughput = json!({
        "documents": args.docs,
        "write_s": round(write.as_secs_f64(), 3),
        "derive_s": round(derive.as_secs_f64(), 3),
        "documents_per_s": round(rate(args.docs, derive), 1),
        "nodes_per_s": round(rate(nodes, derive), 1),
        "derive_share_of_write_plus_derive": round(derive.as_secs_f64() / (write + derive).as_secs_f64(), 3),
        "batches": batches,
        "counters": c,
        "dirty_left": store.count_dirty()?,
    });
    drop(w);
    drop(store);
    drop(dir);

    let coalescing = coalesce(
        &work_dir,
        args.keep,
        &config,
        Arc::new(Extractive::default()),
    )?;
    let llm = match args.llm_docs {
        0 => Value::Null,
        n => llm(args, &work_dir, &config, n)?,
    };
    let ingest = match args.ingest_docs {
        0 => Value::Null,
        n => ingest(args, &work_dir, n)?,
    };
    Ok(json!({
        "benchmark": "derive",
        "generator": Extractive::default().identity().key(),
        "machine": machine(),
        "throughput": throughput,
        "coalescing": coalescing,
        "llm": llm,
        "ingest": ingest,
    }))
}

/// Writes `docs` documents of 1–5 KB under 100 folders of `store` in batches of 500.
fn write_documents(store: &dyn SourceStore, docs: u64) -> anyhow::Result<()> {
    let mut batch = Vec::new();
    for i in 0..docs {
        let uri = CtxUri::parse(&format!("ctx://bench/resources/f{}/doc{i}", i % 100))?;
        let req = PutRequest {
            content: Some(document(i)),
            ..PutRequest::default()
        };
        batch.push(WriteOp::Put { uri, req });
        if batch.len() == 500 {
            store.apply_batch(std::mem::take(&mut batch))?;
        }
    }
    if !batch.is_empty() {
        store.apply_batch(batch)?;
    }
    Ok(())
}

/// 100 children of one folder change in one commit, then the derive consumer drains with
/// `generator`: how many times the folder was derived (its version counts its write-backs).
fn coalesce(
    work_dir: &std::path::Path,
    keep: bool,
    config: &Config,
    generator: Arc<dyn Generator>,
) -> anyhow::Result<Value> {
    let dir = BenchDir::create(work_dir, keep)?;
    let store = Arc::new(SqliteStore::open(&dir.path, config.clone())?);
    let folder = CtxUri::parse("ctx://bench/resources/folder")?;
    let ops: Vec<WriteOp> = (0..100)
        .map(|i| {
            Ok(WriteOp::Put {
                uri: CtxUri::parse(&format!("ctx://bench/resources/folder/c{i}"))?,
                req: PutRequest {
                    content: Some(document(i)),
                    ..PutRequest::default()
                },
            })
        })
        .collect::<anyhow::Result<_>>()?;
    store.apply_batch(ops)?;
    let version_before = store.read_node(&folder)?.map_or(0, |n| n.version);
    let (w, handler) = worker(&store, config, generator);
    drain(&w)?;
    let version_after = store.read_node(&folder)?.map_or(0, |n| n.version);
    Ok(json!({
        "children_changed": 100,
        "folder_derivations": version_after - version_before,
        "without_coalescing": 100,
        "counters": handler.counters(),
    }))
}

/// The answer of the loopback chat-completions server to one derivation request: the
/// first sentence of the input (up to 200 characters) as the abstract, its first 600
/// characters as the overview, in the JSON object the prompts ask for, with `usage` counted
/// by `tokens` over the messages sent and the answer given (and added to `reported`: prompt,
/// completion).
fn chat_answer(req: &Recorded, tokens: &TokenCounter, reported: &[AtomicU64; 2]) -> Reply {
    let messages = req.body["messages"].as_array().cloned().unwrap_or_default();
    let text = |m: &Value| m["content"].as_str().unwrap_or("").to_owned();
    let input = messages.last().map(text).unwrap_or_default();
    let input = input.trim();
    let first = input
        .split_inclusive(['.', '\n'])
        .next()
        .unwrap_or(input)
        .trim();
    let answer = json!({
        "abstract": ce_core::projector::truncate_chars(first, 200),
        "overview": ce_core::projector::truncate_chars(input, 600),
    })
    .to_string();
    let prompt_tokens: usize = messages.iter().map(|m| tokens.count(&text(m))).sum();
    let completion_tokens = tokens.count(&answer);
    reported[0].fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    reported[1].fetch_add(completion_tokens as u64, Ordering::Relaxed);
    Reply::chat_completion(
        "bench",
        &answer,
        prompt_tokens as u64,
        completion_tokens as u64,
    )
}

/// The `llm` section: the `llm` generator against a loopback chat-completions server (the
/// real wire protocol over HTTP): chat calls and tokens per document as CE accounts them and
/// as the server reported them, and the folder derivations and chat calls when 100 children
/// of one folder change at once.
fn llm(
    args: &BenchDeriveArgs,
    work_dir: &std::path::Path,
    config: &Config,
    docs: u64,
) -> anyhow::Result<Value> {
    let tokens = Arc::new(TokenCounter::for_config(&config.index.embedding));
    let usage_tokenizer = tokens.describe();
    let reported = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let server = {
        let (tokens, reported) = (tokens.clone(), reported.clone());
        LoopbackServer::start(move |req| chat_answer(req, &tokens, &reported))
    };
    let generator = || -> anyhow::Result<Arc<dyn Generator>> {
        Ok(Arc::new(LlmGenerator::from_config(&DeriveLlmConfig {
            base_url: server.base_url(),
            model: "bench".into(),
            api_key_env: "CE_BENCH_NO_SUCH_KEY".into(),
            ..DeriveLlmConfig::default()
        })?))
    };
    eprintln!(
        "bench derive: {docs} documents with the llm generator against a loopback \
         chat-completions server (tokens counted by the {usage_tokenizer})"
    );
    let dir = BenchDir::create(work_dir, args.keep)?;
    let store = Arc::new(SqliteStore::open(&dir.path, config.clone())?);
    write_documents(store.as_ref(), docs)?;
    let (w, handler) = worker(&store, config, generator()?);
    let t = Instant::now();
    drain(&w)?;
    let elapsed = t.elapsed();
    let usage = store.derive_usage(SystemClock.now_ms())?;
    let calls = server.requests().len() as u64;
    let (server_in, server_out) = (
        reported[0].load(Ordering::Relaxed),
        reported[1].load(Ordering::Relaxed),
    );
    let per_doc = |v: u64| round(v as f64 / docs as f64, 1);
    let derived = json!({
        "documents": docs,
        "derive_s": round(elapsed.as_secs_f64(), 3),
        "chat_calls": calls,
        "counters": handler.counters(),
        "tokens_in": usage.tokens_in,
        "tokens_out": usage.tokens_out,
        "server_tokens_in": server_in,
        "server_tokens_out": server_out,
        "tokens_in_per_document": per_doc(usage.tokens_in),
        "tokens_out_per_document": per_doc(usage.tokens_out),
        "usage_tokenizer": usage_tokenizer,
    });
    drop(w);
    drop(store);
    drop(dir);
    let before = server.requests().len();
    let mut coalescing = coalesce(work_dir, args.keep, config, generator()?)?;
    coalescing["chat_calls"] = json!(server.requests().len() - before);
    Ok(json!({ "derive": derived, "coalescing": coalescing }))
}

/// The `ingest` section: `docs` documents written, derived, then indexed by the engine.
fn ingest(args: &BenchDeriveArgs, work_dir: &std::path::Path, docs: u64) -> anyhow::Result<Value> {
    let mut config = Config::default();
    config.index.embedding.provider = args.embedder.clone();
    let dir = BenchDir::create(work_dir, args.keep)?;
    let open = |consumers: &[&str]| {
        Engine::open_with(
            &dir.path,
            config.clone(),
            EngineOptions {
                workers: 2,
                run_workers: false,
                role: "bench".into(),
                consumers: consumers.iter().map(|c| (*c).to_owned()).collect(),
            },
        )
    };
    let engine = open(&[DERIVE_CONSUMER])?;
    eprintln!(
        "bench derive: ingest of {docs} documents with the default consumers; embeds up to \
         {} texts (3 per node, folders included) with {}",
        (docs + docs.min(100) + 2) * 3,
        args.embedder
    );
    let t = Instant::now();
    let uris = (0..docs)
        .map(|i| CtxUri::parse(&format!("ctx://bench/resources/f{}/doc{i}", i % 100)))
        .collect::<Result<Vec<_>, _>>()?;
    for (chunk, start) in uris.chunks(500).zip((0..).step_by(500)) {
        let ops = chunk
            .iter()
            .zip(start..)
            .map(|(uri, i)| WriteOp::Put {
                uri: uri.clone(),
                req: PutRequest {
                    content: Some(document(i)),
                    ..PutRequest::default()
                },
            })
            .collect();
        engine.store().apply_batch(ops)?;
    }
    let write = t.elapsed();
    let stage = |engine: &Engine, name: &str| -> anyhow::Result<Duration> {
        let t = Instant::now();
        let last = std::sync::Mutex::new(Instant::now());
        engine.drain(&|p: &DrainProgress| {
            let mut last = last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.elapsed() >= Duration::from_secs(1) {
                eprintln!(
                    "bench derive: ingest {name}: {} deliveries applied",
                    p.succeeded
                );
                *last = Instant::now();
            }
        })?;
        Ok(t.elapsed())
    };
    let derive = stage(&engine, "derive")?;
    engine.shutdown();
    drop(engine);
    let engine = open(&[])?;
    let embedder = engine
        .embedder()
        .map_err(|e| anyhow::anyhow!("the embedder could not be opened: {e}"))?
        .clone();
    let before = embedder.stats();
    let index = stage(&engine, "index")?;
    let embedded = embedder.stats().texts_embedded - before.texts_embedded;

    // The texts the index records carry now: every node's levels, fallbacks applied.
    let projector = IndexProjector::new(config.projector);
    let base = CtxUri::parse("ctx://bench/resources")?;
    let mut nodes = uris;
    nodes.push(CtxUri::parse("ctx://bench")?);
    nodes.push(base.clone());
    for f in 0..docs.min(100) {
        nodes.push(base.join(&format!("f{f}"))?);
    }
    let mut distinct = std::collections::HashSet::new();
    for uri in &nodes {
        let node = engine
            .store()
            .read_node(uri)?
            .ok_or_else(|| anyhow::anyhow!("{uri} is missing after the ingest"))?;
        distinct.extend(
            ce_core::Level::ALL
                .into_iter()
                .filter_map(|l| projector.level_text(&node, l)),
        );
    }
    engine.shutdown();
    let total = write + derive + index;
    Ok(json!({
        "documents": docs,
        "nodes": nodes.len(),
        "embedder": embedder.identity().key(),
        "write_s": round(write.as_secs_f64(), 3),
        "derive_s": round(derive.as_secs_f64(), 3),
        "index_s": round(index.as_secs_f64(), 3),
        "total_s": round(total.as_secs_f64(), 3),
        "derive_share_of_total": round(derive.as_secs_f64() / total.as_secs_f64(), 3),
        "texts_embedded": embedded,
        "distinct_texts": distinct.len(),
        "texts_embedded_per_document": round(embedded as f64 / docs as f64, 3),
        "distinct_texts_per_document": round(distinct.len() as f64 / docs as f64, 3),
        "embedded_equals_distinct": embedded == distinct.len() as u64,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_derives_coalesces_and_embeds_each_distinct_text_once() {
        let dir = tempfile::tempdir().expect("tmp");
        let r = run_derive(&BenchDeriveArgs {
            docs: 150,
            work_dir: Some(dir.path().to_owned()),
            keep: false,
            llm_docs: 60,
            ingest_docs: 120,
            embedder: "hash".into(),
        })
        .expect("bench");
        let t = &r["throughput"];
        assert_eq!(t["dirty_left"], 0, "{r}");
        // 150 leaves, 100 folders, resources, the account: each written back once.
        assert_eq!(t["counters"]["written"], 252, "{r}");
        assert!(
            r["coalescing"]["folder_derivations"].as_u64() <= Some(3),
            "{r}"
        );
        let l = &r["llm"]["derive"];
        // One chat call per node derived: 60 leaves, 60 folders, resources, the account.
        assert_eq!(l["chat_calls"], 122, "{r}");
        assert_eq!(l["counters"]["written"], 122, "{r}");
        // CE accounts exactly the usage the server reported.
        assert_eq!(l["tokens_in"], l["server_tokens_in"], "{r}");
        assert_eq!(l["tokens_out"], l["server_tokens_out"], "{r}");
        assert!(l["tokens_in_per_document"].as_f64() > Some(100.0), "{r}");
        let c = &r["llm"]["coalescing"];
        assert!(c["folder_derivations"].as_u64() <= Some(3), "{r}");
        // The 100 children, then their folder, resources and the account, once each.
        assert!(c["chat_calls"].as_u64() <= Some(110), "{r}");
        let i = &r["ingest"];
        assert_eq!(i["nodes"], 222, "{r}");
        assert_eq!(i["embedded_equals_distinct"], true, "{r}");
        // Every document has an L2 and a derived L0 / L1 that differ from it.
        assert!(i["distinct_texts_per_document"].as_f64() > Some(2.0), "{r}");
        assert!(i["derive_share_of_total"].as_f64() > Some(0.0), "{r}");
    }

    #[test]
    fn an_unknown_embedder_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let e = run_derive(&BenchDeriveArgs {
            docs: 1,
            work_dir: Some(dir.path().to_owned()),
            keep: false,
            llm_docs: 1,
            ingest_docs: 1,
            embedder: "bert".into(),
        })
        .expect_err("refused");
        assert!(e.to_string().contains("\"bert\""), "{e}");
    }
}
