//! `ce bench ui`: what the web console's tree page costs on a large account. Seeds
//! `--nodes` leaves (100 topics × 10 subtopics × the rest, plus their folders) under one
//! account on the embedded store, serves them with the real HTTP server on 127.0.0.1 with a
//! tenant key, and times the API calls the tree page's first screen makes — `GET /v1/ls`
//! (the login probe), `GET /v1/children?uri=ctx://` and `GET /v1/children?uri=ctx://ACCOUNT`
//! (the account opened one level) — and the calls that open one node (`stat`, `cat` × 3,
//! `relations`, `records`), each `--iterations` times over loopback HTTP; plus the size of
//! the embedded assets. JSON out; progress on stderr.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use ce_core::{Config, CtxUri};
use ce_server::engine::{Engine, EngineOptions};
use ce_server::http::ServeOptions;
use ce_store::{PutRequest, WriteOp};
use serde_json::{Value, json};

use crate::bench::{latency_summary, machine, round};

/// Options of `ce bench ui`.
#[derive(Debug, clap::Args)]
pub struct BenchUiArgs {
    /// Directory in which a fresh, uniquely named directory is created [default: the system
    /// temp dir]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Leaf nodes under the account
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub nodes: usize,
    /// Times each call is measured
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub iterations: usize,
}

const ACCOUNT: &str = "bench";
const KEY: &str = "bench-ui-tenant-key-0001";
const TOPICS: usize = 100;
const SUBTOPICS: usize = 10;
/// The tree page's first screen must answer within this (p95 of each call).
const TARGET_P95_MS: f64 = 50.0;

fn put(uri: String, abs: String, content: Option<String>) -> anyhow::Result<WriteOp> {
    Ok(WriteOp::Put {
        uri: CtxUri::parse(&uri)?,
        req: PutRequest {
            abstract_text: Some(abs),
            content,
            ..PutRequest::default()
        },
    })
}

/// The account's tree: topics, subtopics, then leaves spread evenly.
fn tree_ops(leaves: usize) -> anyhow::Result<Vec<WriteOp>> {
    let per_sub = leaves.div_ceil(TOPICS * SUBTOPICS).max(1);
    let mut ops = Vec::with_capacity(leaves + TOPICS * (SUBTOPICS + 1));
    let mut written = 0;
    for t in 0..TOPICS {
        ops.push(put(
            format!("ctx://{ACCOUNT}/t{t}"),
            format!("Topic {t}: notes on area {t}."),
            None,
        )?);
        for s in 0..SUBTOPICS {
            ops.push(put(
                format!("ctx://{ACCOUNT}/t{t}/s{s}"),
                format!("Subtopic {s} of topic {t}."),
                None,
            )?);
            for d in 0..per_sub {
                if written == leaves {
                    break;
                }
                written += 1;
                ops.push(put(
                    format!("ctx://{ACCOUNT}/t{t}/s{s}/d{d}"),
                    format!("Document {d} of subtopic {s}, topic {t}."),
                    Some(format!(
                        "The full text of document {d} in subtopic {s} of topic {t}."
                    )),
                )?);
            }
        }
    }
    Ok(ops)
}

/// `GET url` with the tenant key, timed; the answer must be 200.
fn timed_get(agent: &ureq::Agent, url: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut res = agent
        .get(url)
        .header("Authorization", &format!("Bearer {KEY}"))
        .call()
        .with_context(|| format!("GET {url}"))?;
    let body = res.body_mut().read_to_string()?;
    let took = t.elapsed();
    if res.status().as_u16() != 200 {
        bail!("GET {url}: {} {body}", res.status());
    }
    Ok(took)
}

/// Runs the benchmark and returns the JSON report.
pub fn run_ui(args: &BenchUiArgs) -> anyhow::Result<Value> {
    let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("ce-bench-ui-")
        .tempdir_in(&base)
        .with_context(|| format!("create a directory in {}", base.display()))?;
    let config = Config::from_toml(&format!(
        "[index.embedding]\nprovider = \"hash\"\n\
         [[server.api_keys]]\nkey = \"{KEY}\"\naccount_id = \"{ACCOUNT}\"\n"
    ))?;
    let mut options = ServeOptions::for_config(&config)?;
    options.bind = "127.0.0.1:0".into();
    // No workers: the calls are timed against the source alone, not against indexing.
    let engine = Arc::new(Engine::open_with(
        tmp.path(),
        config,
        EngineOptions {
            workers: 1,
            run_workers: false,
            role: "bench".into(),
            consumers: Vec::new(),
        },
    )?);

    let ops = tree_ops(args.nodes)?;
    let total_nodes = ops.len();
    let t = Instant::now();
    let chunks = ops.chunks(1000).count();
    for (i, chunk) in ops.chunks(1000).enumerate() {
        engine.store().apply_batch(chunk.to_vec())?;
        if (i + 1) % 10 == 0 || i + 1 == chunks {
            eprintln!(
                "bench ui: seeding {}/{total_nodes} nodes",
                ((i + 1) * 1000).min(total_nodes)
            );
        }
    }
    let seed_s = t.elapsed().as_secs_f64();

    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let server = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            ce_server::http::serve_until(
                engine,
                &options,
                |addr| {
                    let _ = tx.send(addr);
                },
                stop,
            )
        })
    };
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .context("the server did not start listening")?;
    let url = format!("http://{addr}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();

    let enc = |u: &str| u.replace(':', "%3A").replace('/', "%2F");
    let account = format!("ctx://{ACCOUNT}");
    let leaf = format!("ctx://{ACCOUNT}/t42/s3/d0");
    let first_screen = [
        ("ls_root", format!("{url}/v1/ls")),
        (
            "children_root",
            format!("{url}/v1/children?uri={}", enc("ctx://")),
        ),
        (
            "children_account",
            format!("{url}/v1/children?uri={}", enc(&account)),
        ),
    ];
    let open_node = [
        ("stat", format!("{url}/v1/stat?uri={}", enc(&leaf))),
        ("cat_l0", format!("{url}/v1/cat?uri={}&level=0", enc(&leaf))),
        ("cat_l1", format!("{url}/v1/cat?uri={}&level=1", enc(&leaf))),
        ("cat_l2", format!("{url}/v1/cat?uri={}&level=2", enc(&leaf))),
        (
            "relations",
            format!("{url}/v1/relations?uri={}", enc(&leaf)),
        ),
        ("records", format!("{url}/v1/records?uri={}", enc(&leaf))),
        (
            "children_subtopic",
            format!(
                "{url}/v1/children?uri={}",
                enc(&format!("ctx://{ACCOUNT}/t42/s3"))
            ),
        ),
    ];
    let measure = |calls: &[(&str, String)], label: &str| -> anyhow::Result<(Value, f64)> {
        let mut per: Vec<Vec<Duration>> = vec![Vec::with_capacity(args.iterations); calls.len()];
        let mut screens = Vec::with_capacity(args.iterations);
        for i in 0..args.iterations {
            let mut screen = Duration::ZERO;
            for (j, (_, u)) in calls.iter().enumerate() {
                let d = timed_get(&agent, u)?;
                per[j].push(d);
                screen += d;
            }
            screens.push(screen);
            if (i + 1) % 50 == 0 || i + 1 == args.iterations {
                eprintln!("bench ui: {label} {}/{}", i + 1, args.iterations);
            }
        }
        let mut out = serde_json::Map::new();
        let mut worst_p95: f64 = 0.0;
        for ((name, _), samples) in calls.iter().zip(per.iter_mut()) {
            let s = latency_summary(samples);
            worst_p95 = worst_p95.max(s["p95_ms"].as_f64().unwrap_or(f64::INFINITY));
            out.insert((*name).to_owned(), s);
        }
        out.insert(
            "all_calls_in_sequence".into(),
            latency_summary(&mut screens),
        );
        Ok((Value::Object(out), worst_p95))
    };
    let (first, first_p95) = measure(&first_screen, "first screen")?;
    let (node, node_p95) = measure(&open_node, "open a node")?;
    let first_children = timed_get(&agent, &first_screen[2].1)?;

    stop.store(true, Ordering::SeqCst);
    match server.join() {
        Ok(r) => r?,
        Err(_) => bail!("the server thread panicked"),
    }

    let assets: Vec<Value> = ce_server::ui::ASSETS
        .iter()
        .map(|a| json!({"path": a.path, "bytes": a.body.len()}))
        .collect();
    Ok(json!({
        "benchmark": "ui",
        "machine": machine(),
        "nodes": total_nodes,
        "leaves": args.nodes,
        "account_children": TOPICS,
        "seed_seconds": round(seed_s, 2),
        "iterations": args.iterations,
        "first_screen": first,
        "first_screen_worst_p95_ms": round(first_p95, 3),
        "first_screen_target_p95_ms": TARGET_P95_MS,
        "first_screen_within_target": first_p95 <= TARGET_P95_MS,
        "last_children_account_ms": round(first_children.as_secs_f64() * 1e3, 3),
        "open_node": node,
        "open_node_worst_p95_ms": round(node_p95, 3),
        "assets": {
            "files": assets,
            "total_bytes": ce_server::ui::assets_bytes(),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_reports_every_call_and_the_assets() {
        let r = run_ui(&BenchUiArgs {
            work_dir: None,
            nodes: 2_000,
            iterations: 3,
        })
        .expect("bench");
        assert_eq!(r["nodes"], 2_000 + TOPICS * (SUBTOPICS + 1));
        for call in [
            "ls_root",
            "children_root",
            "children_account",
            "all_calls_in_sequence",
        ] {
            assert_eq!(r["first_screen"][call]["count"], 3, "{call}: {r}");
        }
        assert_eq!(r["open_node"]["records"]["count"], 3, "{r}");
        assert!(r["assets"]["total_bytes"].as_u64() > Some(10_000), "{r}");
    }
}
