//! `ce bench locks`: what a path lock costs an rm / mv / import, per provider — acquire +
//! release of an EXACT lock on a leaf and of a TREE lock on a folder, one thread, and the
//! hand-over rate of one contended path among four threads. JSON out.

use std::time::Instant;

use anyhow::Context as _;
use ce_core::CtxUri;
use ce_core::config::LockConfig;
use ce_lock::{LockManager, LockRequest};
use serde_json::{Value, json};

use crate::bench::{latency_summary, rate, round};
use crate::cli::BenchLocksArgs;

/// Runs the benchmark for every provider asked for.
pub fn run_locks(args: &BenchLocksArgs) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir().context("temporary lock directory")?;
    let mut providers = serde_json::Map::new();
    for provider in &args.providers {
        let cfg = LockConfig {
            provider: provider.clone(),
            wait_ms: 30_000,
            redis_url: args.redis_url.clone(),
            service_name: format!("ce-bench-{}", uuid::Uuid::now_v7().simple()),
            ..LockConfig::default()
        };
        let locks = LockManager::from_config(&cfg, dir.path())
            .with_context(|| format!("lock provider {provider}"))?;
        providers.insert(provider.clone(), one_provider(&locks, args.iterations)?);
    }
    Ok(json!({
        "benchmark": "locks",
        "iterations": args.iterations,
        "providers": providers,
    }))
}

fn uri(s: &str) -> anyhow::Result<CtxUri> {
    Ok(CtxUri::parse(s)?)
}

fn one_provider(locks: &LockManager, iterations: usize) -> anyhow::Result<Value> {
    let timed = |req: &dyn Fn(usize) -> anyhow::Result<LockRequest>| -> anyhow::Result<Value> {
        let mut samples = Vec::with_capacity(iterations);
        for i in 0..iterations {
            let r = req(i)?;
            let t0 = Instant::now();
            locks.acquire(&[r])?.release()?;
            samples.push(t0.elapsed());
        }
        Ok(latency_summary(&mut samples))
    };
    let exact = timed(&|i| {
        Ok(LockRequest::exact(uri(&format!(
            "ctx://bench/docs/d{}/leaf{i}",
            i % 50
        ))?))
    })?;
    let tree = timed(&|i| {
        Ok(LockRequest::tree(uri(&format!(
            "ctx://bench/docs/d{}",
            i % 50
        ))?))
    })?;
    // Four threads taking turns on one path: grants per second of a contended lock.
    let path = uri("ctx://bench/hot")?;
    let per_thread = (iterations / 4).max(1);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (locks, path) = (locks.clone(), path.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                for _ in 0..per_thread {
                    locks
                        .acquire(&[LockRequest::exact(path.clone())])?
                        .release()?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a contending thread panicked"))??;
    }
    let contended = t0.elapsed();
    Ok(json!({
        "exact_acquire_release": exact,
        "tree_acquire_release": tree,
        "contended_grants_per_s": round(rate(4 * per_thread as u64, contended), 1),
    }))
}
