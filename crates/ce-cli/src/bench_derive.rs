//! `ce bench derive`: what deriving L0 / L1 costs (docs/derive.md) — JSON out.
//!
//! - `throughput`: N documents of 1–5 KB (English sentences drawn from a fixed vocabulary,
//!   deterministic) under 100 folders are written, then the derive consumer is drained
//!   through the real worker loop with the extractive generator: documents and folders
//!   derived per second, write-backs applied, discarded, deferred, generator calls.
//! - `coalescing`: 100 children of one folder change at once (one batch of puts), and the
//!   consumer is drained: how many times the folder was derived (its version counts its
//!   write-backs), against 100 without coalescing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_core::{Clock, Config, CtxUri, IndexProjector, SystemClock};
use ce_derive::{DeriveHandler, DeriveSettings, Extractive};
use ce_index::worker::{IndexWorker, WorkerConfig};
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

fn worker(store: &Arc<SqliteStore>, config: &Config) -> (IndexWorker, Arc<DeriveHandler>) {
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
        Arc::new(Extractive::default()),
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
        let r = w.run_once(w.config().claim_limit)?;
        if r.claimed == 0 {
            return Ok(batches);
        }
        batches += 1;
    }
}

/// Runs the benchmark.
pub fn run_derive(args: &BenchDeriveArgs) -> anyhow::Result<Value> {
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
    let mut batch = Vec::new();
    for i in 0..args.docs {
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
    let write = t0.elapsed();
    let (w, handler) = worker(&store, &config);
    let t1 = Instant::now();
    let batches = drain(&w)?;
    let derive = t1.elapsed();
    let c = handler.counters();
    // The documents, their 100 folders, `ctx://bench/resources` and `ctx://bench`.
    let nodes = args.docs + 102;
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

    // Coalescing: 100 children of one folder change in one commit.
    let dir = BenchDir::create(&work_dir, args.keep)?;
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
    let (w, handler) = worker(&store, &config);
    drain(&w)?;
    let version_after = store.read_node(&folder)?.map_or(0, |n| n.version);
    let coalescing = json!({
        "children_changed": 100,
        "folder_derivations": version_after - version_before,
        "without_coalescing": 100,
        "counters": handler.counters(),
    });
    Ok(json!({
        "benchmark": "derive",
        "generator": "extractive:1",
        "machine": machine(),
        "throughput": throughput,
        "coalescing": coalescing,
    }))
}
