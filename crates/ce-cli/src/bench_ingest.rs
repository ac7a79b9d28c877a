//! `ce bench ingest`: the user's path, measured the way a user would compare CE with another
//! pipeline. It writes `--docs` documents (~250 characters and one metadata field each) as
//! node directories in a temporary folder, then runs, phase after phase, exactly what a user
//! runs — `ce import DIR --into URI` followed by `ce worker --once` (the drain) — through the
//! CLI's own command dispatch ([`crate::commands::run`] on parsed arguments), so each command
//! opens and closes the engine as a separate `ce` process would:
//!
//! 1. `cold`: the first import of every document;
//! 2. `noop`: the same folder again (nothing changed);
//! 3. `text_1pct`: 1 % of the documents get new text;
//! 4. `meta_1pct`: 1 % get a new metadata value only (no re-embedding expected);
//! 5. `delete_1pct`: 1 % are removed from the folder (`--prune`);
//! 6. `empty_drain`: `ce worker --once` with nothing to do (process start and index opening);
//! 7. `graph_settle` (with the vector consumer): the embedded index opened directly, the time
//!    to load it (its last graph snapshot and the vectors written after it, which the
//!    commands above, never searching, did not load) and to move every vector still outside
//!    the graph into it — the graph work those commands left for later — and the sizes on disk
//!    once that whole graph is saved.
//! 8. `delete_rest`: every remaining document is removed from the folder (`--prune
//!    --allow-large-delete`), a bulk delete of 99 % of the corpus.
//! 9. `journal_prune`: the whole journal of the run pruned, as a worker prunes what every
//!    consumer applied once the retention has passed (docs/store.md "Journal retention"):
//!    seconds, rows removed, the journal before and after.
//!
//! Per phase: wall seconds of the import and of the drain, and the CPU seconds of each (every
//! thread, user and system: on a shared machine, whose other work stretches wall time, the
//! steadier figure to compare two builds by), the texts embedded (new entries of
//! the embedding cache, which never embeds a text twice), the embedder's HTTP requests and
//! texts when it is the loopback server, and the size on disk of every file of the data
//! directory. `--embedder hash` uses the hashing embedder in-process; `--embedder loopback`
//! the same deterministic vectors served by an OpenAI-compatible `/v1/embeddings` endpoint on
//! 127.0.0.1 (HTTP and JSON cost included); `--embedder local` the real model
//! (all-MiniLM-L6-v2, the default provider). `--consumers vector` enables the vector consumer
//! alone, `all` the three index consumers (vector, keyword, relation), `default` the
//! configuration's default list (the index consumers and `derive`, which writes L0 / L1
//! with the offline extractive generator and rolls the folder up).
//!
//! `--source kb` measures knowledge bases instead — a generated corpus of files through
//! `ce kb add`, with the same setup, counters and sizes ([`crate::bench_kb`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use ce_embed::Embedder;
use ce_embed::hash::HashEmbedder;
use ce_http::loopback::{LoopbackServer, Recorded, Reply};
use clap::Parser as _;
use serde_json::{Value, json};

use crate::bench::{cpu_seconds_since, machine, process_cpu_seconds, round};
use crate::cli::Cli;

/// Options of `ce bench ingest`.
#[derive(Debug, clap::Args)]
pub struct BenchIngestArgs {
    /// Directory in which a fresh, uniquely named directory is created [default: the system
    /// temp dir]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Documents generated
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub docs: usize,
    /// What is ingested: `import` (node directories through `ce import`) or `kb` (generated
    /// Markdown, HTML, PDF and code files through `ce kb add`)
    #[arg(long, default_value = "import")]
    pub source: String,
    /// Embedder: `hash` (in-process), `loopback` (the same vectors behind an
    /// OpenAI-compatible HTTP endpoint on 127.0.0.1) or `local` (the real local model)
    #[arg(long, default_value = "hash")]
    pub embedder: String,
    /// Consumers enabled: `vector`, `all` (the three index consumers) or `default` (the
    /// default configuration's: the index consumers and `derive`)
    #[arg(long, default_value = "vector")]
    pub consumers: String,
    /// `--source kb`: the seed of the generated corpus
    #[arg(long, value_name = "N", default_value_t = 17)]
    pub seed: u64,
    /// `--source kb`: texts of the raw-provider measurement (a sample of the cold phase's)
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub raw_texts: usize,
}

/// Dimension of the benchmark's vectors (all-MiniLM-L6-v2's).
const DIM: usize = 384;

/// A benchmark run's directories, configuration and embedder endpoint.
pub(crate) struct Setup {
    /// The run's directory (removed on drop).
    pub tmp: tempfile::TempDir,
    /// The data directory.
    pub data: PathBuf,
    /// The configuration file.
    pub config: PathBuf,
    /// The loopback embedder (`--embedder loopback`).
    pub server: Option<LoopbackServer>,
    /// `index.outbox.consumers`, as TOML.
    pub consumers: String,
}

impl Setup {
    /// A fresh directory with a data directory and a configuration for `--embedder` and
    /// `--consumers`.
    fn new(args: &BenchIngestArgs) -> anyhow::Result<Setup> {
        let consumers = match args.consumers.as_str() {
            "vector" => "[\"vector\"]".to_owned(),
            "all" => "[\"vector\", \"keyword\", \"relation\"]".to_owned(),
            "default" => {
                serde_json::to_string(&ce_core::config::OutboxConfig::default().consumers)?
            }
            other => anyhow::bail!(
                "--consumers: {other:?} is not one of \"vector\", \"all\", \"default\""
            ),
        };
        let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
        let tmp = tempfile::Builder::new()
            .prefix("ce-bench-ingest-")
            .tempdir_in(&base)
            .with_context(|| format!("create a directory in {}", base.display()))?;
        let data = tmp.path().join("data");
        fs_err::create_dir_all(&data)?;
        let (server, embedding) = match args.embedder.as_str() {
            "hash" => (None, format!("provider = \"hash\"\ndimensions = {DIM}\n")),
            "loopback" => {
                let server = loopback_embedder();
                let cfg = format!(
                    "provider = \"openai\"\nmodel = \"bench-hash-{DIM}\"\nbase_url = \"{}\"\n\
                     api_key_env = \"CE_BENCH_NO_KEY\"\ndimensions = {DIM}\n",
                    server.base_url()
                );
                (Some(server), cfg)
            }
            // The default provider and model (all-MiniLM-L6-v2, `scripts/fetch-model.sh`)
            // with the default timeout, which bounds one sub-batch (docs/indexing.md).
            "local" => (None, "provider = \"local\"\n".to_owned()),
            other => anyhow::bail!(
                "--embedder: {other:?} is not one of \"hash\", \"loopback\", \"local\""
            ),
        };
        let config = data.join("ce.toml");
        fs_err::write(
            &config,
            format!("[index.embedding]\n{embedding}\n[index.outbox]\nconsumers = {consumers}\n"),
        )?;
        Ok(Setup {
            tmp,
            data,
            config,
            server,
            consumers,
        })
    }
}

/// Runs every phase of `--source` and returns the JSON report.
pub fn run_ingest(args: &BenchIngestArgs) -> anyhow::Result<Value> {
    let setup = Setup::new(args)?;
    match args.source.as_str() {
        "import" => run_import(args, setup),
        "kb" => crate::bench_kb::run_kb(args, setup),
        other => anyhow::bail!("--source: {other:?} is neither \"import\" nor \"kb\""),
    }
}

/// `--source import`: the node layout through `ce import`.
fn run_import(args: &BenchIngestArgs, setup: Setup) -> anyhow::Result<Value> {
    let Setup {
        tmp,
        data,
        config,
        server,
        consumers,
    } = setup;
    let docs = tmp.path().join("docs");
    let n = args.docs;
    let one_pct = (n / 100).max(1);
    eprintln!("bench: writing {n} documents");
    for i in 0..n {
        write_doc(&docs, i, &doc_text(i, 0), &format!("g{}", i % 10))?;
    }
    let ce = Ce {
        data: data.clone(),
        config,
        docs: docs.clone(),
    };
    let mut phases = serde_json::Map::new();
    let mut seen = Seen::default();
    let mut phase = |name: &str, flags: &[&str]| -> anyhow::Result<()> {
        eprintln!("bench: phase {name}");
        let v = ce.phase(flags, server.as_ref(), &mut seen)?;
        phases.insert(name.to_owned(), v);
        Ok(())
    };
    phase("cold", &[])?;
    phase("noop", &[])?;
    for i in (0..n).step_by(100).take(one_pct) {
        write_doc(&docs, i, &doc_text(i, 1), &format!("g{}", i % 10))?;
    }
    phase("text_1pct", &[])?;
    for i in (1..n).step_by(100).take(one_pct) {
        write_doc(&docs, i, &doc_text(i, 0), "edited")?;
    }
    phase("meta_1pct", &[])?;
    for i in (2..n).step_by(100).take(one_pct) {
        fs_err::remove_dir_all(doc_dir(&docs, i))?;
    }
    phase("delete_1pct", &["--prune"])?;
    let t = Instant::now();
    let drained = ce.run(&["worker", "--once"])?;
    let empty = json!({
        "drain_s": round(t.elapsed().as_secs_f64(), 3),
        "deliveries": drained["progress"]["succeeded"],
    });
    phases.insert("empty_drain".into(), empty);
    if consumers.contains("vector") {
        phases.insert("graph_settle".into(), settle_graph(&data)?);
    }
    // Everything left is removed from the folder: a bulk delete of 99 % of the documents.
    for i in 0..n {
        let dir = doc_dir(&docs, i);
        if dir.exists() {
            fs_err::remove_dir_all(dir)?;
        }
    }
    eprintln!("bench: phase delete_rest");
    let flags = ["--prune", "--allow-large-delete"];
    let v = ce.phase(&flags, server.as_ref(), &mut seen)?;
    phases.insert("delete_rest".into(), v);
    phases.insert("journal_prune".into(), prune_journal(&ce)?);

    Ok(json!({
        "benchmark": "ingest",
        "machine": machine(),
        "docs": n,
        "changed_per_phase": one_pct,
        "embedder": args.embedder,
        "consumers": args.consumers,
        "phases": phases,
    }))
}

/// The running counters phases are measured against.
#[derive(Default)]
pub(crate) struct Seen {
    cache_entries: u64,
    requests: usize,
    texts: usize,
    /// Deliveries of one consumer (`--source kb` counts events with them).
    pub deliveries: u64,
}

/// The `ce` invocations of one benchmark run.
pub(crate) struct Ce {
    /// The data directory.
    pub data: PathBuf,
    /// The configuration file.
    pub config: PathBuf,
    /// The folder ingested.
    pub docs: PathBuf,
}

impl Ce {
    /// `ce --json --data-dir … --config … ARGS`, parsed.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<Cli> {
        let data = self.data.display().to_string();
        let config = self.config.display().to_string();
        let mut argv = vec!["ce", "--json", "--data-dir", &data, "--config", &config];
        argv.extend_from_slice(args);
        Cli::try_parse_from(&argv).with_context(|| format!("parse {argv:?}"))
    }

    /// Runs `ce --json --data-dir … --config … ARGS` through the CLI's dispatch.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Value> {
        let cli = self.cli(args)?;
        let rendered =
            crate::commands::run(&cli).map_err(|e| anyhow::anyhow!("ce {args:?}: {e}"))?;
        Ok(rendered.json)
    }

    /// The source of truth, opened as a command would (read between commands).
    pub fn store(&self) -> anyhow::Result<ce_server::source::Source> {
        crate::commands::open_store(&self.cli(&["status"])?)
            .map_err(|e| anyhow::anyhow!("open the store: {e}"))
    }

    /// Runs `ce status` and adds to `v` the texts embedded since the last call (new entries
    /// of the embedding cache, which never embeds a text twice) and, with the loopback
    /// embedder, its HTTP requests and texts; returns the status.
    pub fn count_embeds(
        &self,
        v: &mut Value,
        server: Option<&LoopbackServer>,
        seen: &mut Seen,
    ) -> anyhow::Result<Value> {
        let status = self.run(&["status"])?;
        let entries = status["embed_cache"]["entries"].as_u64().unwrap_or(0);
        v["texts_embedded"] = json!(entries.saturating_sub(seen.cache_entries));
        seen.cache_entries = entries;
        if let Some(s) = server {
            let requests = s.requests();
            let texts: usize = requests
                .iter()
                .map(|r| r.body["input"].as_array().map_or(0, Vec::len))
                .sum();
            v["embedder_requests"] = json!(requests.len() - seen.requests);
            v["embedder_texts"] = json!(texts - seen.texts);
            seen.requests = requests.len();
            seen.texts = texts;
        }
        Ok(status)
    }

    /// One phase: import (with `flags`), drain, then the counters and sizes.
    fn phase(
        &self,
        flags: &[&str],
        server: Option<&LoopbackServer>,
        seen: &mut Seen,
    ) -> anyhow::Result<Value> {
        let docs = self.docs.display().to_string();
        let mut import = vec!["import", &docs, "--into", "ctx://bench/docs"];
        import.extend_from_slice(flags);
        let (t, cpu) = (Instant::now(), process_cpu_seconds());
        let imported = self.run(&import)?;
        let (import_s, import_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds_since(cpu));
        let (t, cpu) = (Instant::now(), process_cpu_seconds());
        let drained = self.run(&["worker", "--once"])?;
        let (drain_s, drain_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds_since(cpu));
        let mut v = json!({
            "wall_s": round(import_s + drain_s, 3),
            "import_s": round(import_s, 3),
            "drain_s": round(drain_s, 3),
            "import_cpu_s": import_cpu,
            "drain_cpu_s": drain_cpu,
            "nodes_written": imported["nodes_written"],
            "nodes_removed": imported["nodes_removed"],
            "nodes_not_read": imported["nodes_not_read"],
            "events": imported["events"],
            "deliveries": drained["progress"]["succeeded"],
        });
        self.count_embeds(&mut v, server, seen)?;
        v["sizes_mib"] = json!(sizes(&self.data)?);
        Ok(v)
    }
}

/// After the phases: prunes the whole journal of the run — every consumer applied all of it —
/// as a worker does once the retention has passed (docs/store.md "Journal retention"), and
/// reports what it held before and after and how long the prune took.
fn prune_journal(ce: &Ce) -> anyhow::Result<Value> {
    let store = ce.store()?;
    let before = store.journal()?;
    // The retention is measured from each row's last change: let the last one be in the past.
    std::thread::sleep(std::time::Duration::from_millis(2));
    let t = Instant::now();
    let pruned = store.prune_journal(0, ce_server::engine::journal::PRUNE_CHUNK)?;
    let prune_s = t.elapsed().as_secs_f64();
    Ok(json!({
        "prune_s": round(prune_s, 3),
        "deliveries_pruned": pruned.deliveries,
        "events_pruned": pruned.events,
        "before": before,
        "after": store.journal()?,
    }))
}

/// After the phases: opens the embedded vector index itself, loads it (the graph's snapshot and
/// the vectors written after it, read into the fresh segment) and times moving every vector
/// still outside the graph into it — the graph work the short-lived commands above left for
/// later.
fn settle_graph(data: &Path) -> anyhow::Result<Value> {
    use ce_index::vector::embedded::EmbeddedVectorIndex;
    let dir = data.join(ce_server::engine::consumers::VECTOR_DIR);
    let t = Instant::now();
    let index = EmbeddedVectorIndex::open(&dir)?;
    let open_s = t.elapsed().as_secs_f64();
    index.pause_graph_insertion(true);
    let t = Instant::now();
    index.load()?;
    let load_s = t.elapsed().as_secs_f64();
    let before = index.stats();
    let t = Instant::now();
    index.settle()?;
    let settle_s = t.elapsed().as_secs_f64();
    let after = index.stats();
    drop(index);
    Ok(json!({
        "open_s": round(open_s, 3),
        "load_s": round(load_s, 3),
        "fresh_at_load": before.fresh_vectors,
        "settle_s": round(settle_s, 3),
        "graph_vectors": after.graph_vectors,
        // The footprint of the 9,900 documents with the whole graph saved.
        "sizes_mib": sizes(data)?,
    }))
}

/// An OpenAI-compatible `/v1/embeddings` endpoint on 127.0.0.1 answering with the hashing
/// embedder's vectors (the same vectors as `--embedder hash`, plus the HTTP round trips).
fn loopback_embedder() -> LoopbackServer {
    let embedder = Arc::new(HashEmbedder::new(DIM));
    LoopbackServer::start(move |r: &Recorded| {
        if r.method != "POST" || !r.path.ends_with("/embeddings") {
            return Reply::error(404, &format!("no route {} {}", r.method, r.path));
        }
        let Some(input) = r.body["input"].as_array() else {
            return Reply::error(400, "input must be an array of strings");
        };
        let texts: Vec<&str> = input.iter().filter_map(Value::as_str).collect();
        if texts.len() != input.len() {
            return Reply::error(400, "input must be an array of strings");
        }
        match embedder.embed_texts(&texts, std::time::Duration::from_secs(30)) {
            Ok(vectors) => {
                let data: Vec<Value> = vectors
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
                    .collect();
                let tokens: usize = texts.iter().map(|t| t.split_whitespace().count()).sum();
                Reply::json(
                    200,
                    &json!({
                        "object": "list",
                        "data": data,
                        "model": r.body["model"],
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                    }),
                )
            }
            Err(e) => Reply::error(500, &e.to_string()),
        }
    })
}

fn doc_dir(docs: &Path, i: usize) -> PathBuf {
    docs.join(format!("d{i:05}"))
}

/// Writes document `i`: `content.md` and a `.meta.json` with one metadata field.
fn write_doc(docs: &Path, i: usize, text: &str, group: &str) -> anyhow::Result<()> {
    let dir = doc_dir(docs, i);
    fs_err::create_dir_all(&dir)?;
    fs_err::write(dir.join("content.md"), text)?;
    fs_err::write(
        dir.join(ce_store::layout::META_FILE),
        json!({"meta": {"group": group}}).to_string(),
    )?;
    Ok(())
}

const WORDS: [&str; 48] = [
    "context", "agent", "memory", "index", "vector", "graph", "query", "store", "search", "record",
    "batch", "event", "stream", "worker", "commit", "source", "truth", "layer", "node", "tree",
    "path", "lock", "lease", "token", "model", "embed", "cache", "shard", "table", "field",
    "value", "score", "rank", "hit", "page", "file", "folder", "import", "export", "delete",
    "move", "write", "read", "scan", "merge", "split", "drain", "queue",
];

/// About 250 characters of text for document `i`, revision `rev`.
fn doc_text(i: usize, rev: usize) -> String {
    let mut x = (i as u64 ^ ((rev as u64) << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = format!("Document {i} revision {rev}.");
    while out.len() < 250 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(' ');
        out.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    out.push('.');
    out
}

/// Size on disk of every file under `dir`, in MiB, by path relative to it (SQLite's `-wal`
/// and `-shm` files counted with their database), and the total.
pub(crate) fn sizes(dir: &Path) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs_err::read_dir(&d)? {
            let entry = entry?;
            let path = entry.path();
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            let rel = rel
                .strip_suffix("-wal")
                .or_else(|| rel.strip_suffix("-shm"))
                .unwrap_or(&rel)
                .to_owned();
            *bytes.entry(rel).or_default() += meta.len();
        }
    }
    let total: u64 = bytes.values().sum();
    let mib = |b: u64| round(b as f64 / (1024.0 * 1024.0), 2);
    let mut out: BTreeMap<String, f64> = bytes
        .into_iter()
        .filter(|(_, b)| *b >= 64 * 1024)
        .map(|(k, b)| (k, mib(b)))
        .collect();
    out.insert("total".into(), mib(total));
    Ok(out)
}
