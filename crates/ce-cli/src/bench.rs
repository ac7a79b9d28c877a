//! `ce bench outbox`: throughput and latency of the SQLite store's write path and outbox.
//!
//! The run opens a fresh [`SqliteStore`] (default configuration: consumers vector, keyword and
//! relation) in a new directory and measures, one thread, in this order:
//!
//! 0. the disk's raw `fsync` latency (the floor under every durable commit);
//! 1. durable single `ContextFs::put` calls (one `synchronous=FULL` transaction each);
//! 2. `OutboxStore::append_batch` of 1000 events per call until the journal holds `--pending`
//!    events, which also builds the backlog for step 3;
//! 3. `claim_batch("vector", …, --batch)` against that backlog, `--claims` samples, each
//!    followed by `mark_done` of every claimed delivery (timed separately), so the backlog
//!    only shrinks by `--batch` per sample;
//! 4. jobs: `--jobs-pending` pending jobs of [`JOB_TYPES`] enqueued 1000 per source batch
//!    (`WriteOp::Enqueue`), then `--claims` samples of `claim_jobs(…, 10)` over every type,
//!    each followed by `complete` of every claimed job (claim alone and claim + completes
//!    are timed).
//!
//! The answer is one JSON object; progress goes to stderr. The directory is removed at the end
//! (also on error) unless `--keep`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use ce_core::{
    Config, CtxUri, EVENT_VERSION, EventPayload, OutboxEventCreate, UpsertContextPayload,
    UpsertReason,
};
use ce_store::{JobSpec, JobState, PutRequest, SourceStore, SqliteStore, TypeSlots, WriteOp};
use serde_json::{Value, json};

/// Events per `append_batch` call.
const APPEND_BATCH: usize = 1000;
/// The consumer whose deliveries are claimed.
const CONSUMER: &str = "vector";
/// The job types the jobs backlog is spread over.
const JOB_TYPES: [&str; 4] = ["bench-a", "bench-b", "bench-c", "bench-d"];
/// Jobs per `claim_jobs` call (also each type's concurrency in the run).
const JOB_CLAIM_LIMIT: usize = 10;
/// Targets from the issue: claim p95 (ms), append (events/s), durable put (ops/s).
const TARGET_CLAIM_P95_MS: f64 = 5.0;
const TARGET_APPEND_EVENTS_PER_S: f64 = 50_000.0;
const TARGET_PUT_OPS_PER_S: f64 = 1_000.0;

/// Options of `ce bench outbox`.
#[derive(Debug, clap::Args)]
pub struct BenchOutboxArgs {
    /// Directory in which a fresh, uniquely named store directory is created [default: the
    /// system temp dir]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Events in the journal (pending deliveries per consumer) before claiming starts
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub pending: u64,
    /// Durable single puts to time
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub puts: u64,
    /// claim_batch samples to take
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub claims: u64,
    /// Deliveries per claim_batch call
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub batch: usize,
    /// Pending jobs in the queue before job claims start (0 skips the jobs figures)
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub jobs_pending: u64,
    /// Keep the store directory (and PostgreSQL databases) instead of removing them
    #[arg(long)]
    pub keep: bool,
    /// With --store postgres://…: nodes per end-to-end drain run (0 skips those runs)
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub e2e_events: u64,
    /// With --store postgres://…: worker processes (threads on SQLite) per end-to-end run
    #[arg(long, value_name = "N,…", value_delimiter = ',', default_values_t = [1, 2, 4])]
    pub processes: Vec<usize>,
    /// With --store postgres://…: administrative URL of a PostgreSQL with pgvector for the
    /// end-to-end runs' vectors [default: the store's server]
    #[arg(long, value_name = "URL")]
    pub pgvector_url: Option<String>,
}

/// Runs the outbox benchmark and returns its parameters and figures as one JSON object; with
/// a PostgreSQL `store` (an administrative URL: the run creates and drops its own
/// databases there), the same figures on both backends and the end-to-end series
/// ([`crate::bench_scale`]).
pub fn run_outbox(args: &BenchOutboxArgs, store: Option<&str>) -> anyhow::Result<Value> {
    let sqlite = run_sqlite(args)?;
    match store {
        Some(url) if ce_core::config::is_postgres_url(url) => {
            crate::bench_scale::run_postgres(args, url, sqlite)
        }
        Some(url) => bail!("--store must be a postgres:// URL for this benchmark, not {url:?}"),
        None => Ok(sqlite),
    }
}

fn run_sqlite(args: &BenchOutboxArgs) -> anyhow::Result<Value> {
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let work_dir = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = BenchDir::create(&work_dir, args.keep)?;
    eprintln!("bench: store directory {}", dir.path.display());
    let mut report = measure(&dir.path, args)?;
    report["parameters"]["store_dir"] = json!(dir.path.display().to_string());
    report["parameters"]["kept"] = json!(args.keep);
    Ok(report)
}

fn measure(dir: &Path, args: &BenchOutboxArgs) -> anyhow::Result<Value> {
    let config = Config::default();
    let fsync = fsync_probe(dir)?;
    let data_dir = dir.join("data");
    let store = SqliteStore::open(&data_dir, config)
        .with_context(|| format!("opening a store in {}", data_dir.display()))?;
    let mut report = measure_store(&store, args)?;
    report["disk_fsync"] = fsync;
    report["db_bytes"] = json!(file_len(store.path()) + file_len(&wal_path(store.path())));
    Ok(report)
}

/// Steps 1–4 on `store` (any backend), one thread.
pub(crate) fn measure_store(
    store: &dyn SourceStore,
    args: &BenchOutboxArgs,
) -> anyhow::Result<Value> {
    let started = Instant::now();
    let load_at_start = load_average();
    let consumers = store.consumers();

    // 1. Durable single puts.
    let content: String = "benchmark content line, about two hundred bytes in all. "
        .repeat(4)
        .chars()
        .take(200)
        .collect();
    let mut put_lat = Vec::with_capacity(args.puts as usize);
    let mut journal_events: u64 = 0;
    eprintln!("bench: {} durable puts", args.puts);
    for i in 0..args.puts {
        let uri = CtxUri::parse(&format!("ctx://bench/docs/d{i}"))?;
        let req = PutRequest {
            content: Some(content.clone()),
            ..PutRequest::default()
        };
        let t = Instant::now();
        let out = store.put(&uri, req)?;
        put_lat.push(t.elapsed());
        journal_events += out.event_ids.len() as u64;
    }
    let put_total: Duration = put_lat.iter().sum();

    // 2. append_batch until the journal holds `pending` events.
    let to_append = args.pending.saturating_sub(journal_events);
    eprintln!("bench: appending {to_append} events in batches of {APPEND_BATCH}");
    let append_started = Instant::now();
    let mut append_time = Duration::ZERO;
    let mut append_calls: u64 = 0;
    let mut appended: u64 = 0;
    let mut next_report = to_append / 10;
    while appended < to_append {
        let n = (to_append - appended).min(APPEND_BATCH as u64);
        let batch = (appended..appended + n)
            .map(upsert_event)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let t = Instant::now();
        let events = store.append_batch(batch)?;
        append_time += t.elapsed();
        append_calls += 1;
        appended += events.len() as u64;
        if appended >= next_report && to_append >= 10 {
            eprintln!(
                "bench:   {appended}/{to_append} appended ({:.0} events/s)",
                appended as f64 / append_time.as_secs_f64()
            );
            next_report += to_append / 10;
        }
    }
    let append_wall = append_started.elapsed();
    journal_events += appended;

    // 3. claim_batch samples against the backlog, each followed by mark_done of the claim.
    let pending_start = pending_of(store, CONSUMER)?;
    eprintln!(
        "bench: {} claim_batch({}) samples at {pending_start} pending",
        args.claims, args.batch
    );
    let mut claim_lat = Vec::with_capacity(args.claims as usize);
    let mut done_lat = Vec::with_capacity(args.claims as usize * args.batch);
    let mut claimed_total: u64 = 0;
    let mut short_claims: u64 = 0;
    for s in 0..args.claims {
        let t = Instant::now();
        let claimed = store.claim_batch(CONSUMER, "bench-worker", args.batch)?;
        claim_lat.push(t.elapsed());
        if claimed.len() < args.batch {
            short_claims += 1;
        }
        claimed_total += claimed.len() as u64;
        for c in &claimed {
            let t = Instant::now();
            store.mark_done(&c.claim)?;
            done_lat.push(t.elapsed());
        }
        if (s + 1) % 50 == 0 {
            eprintln!("bench:   {}/{} claims", s + 1, args.claims);
        }
    }
    let pending_end = pending_of(store, CONSUMER)?;
    let done_total: Duration = done_lat.iter().sum();

    let put_ops_per_s = rate(put_lat.len() as u64, put_total);
    let append_events_per_s = rate(appended, append_time);
    let mark_done_per_s = rate(done_lat.len() as u64, done_total);
    let claim = latency_summary(&mut claim_lat);
    let claim_p95 = claim["p95_ms"].as_f64();
    let jobs = measure_jobs(store, args)?;
    Ok(json!({
        "benchmark": "outbox",
        "parameters": {
            "pending": args.pending,
            "puts": args.puts,
            "claims": args.claims,
            "batch": args.batch,
            "append_batch_size": APPEND_BATCH,
            "consumers": consumers,
            "claim_consumer": CONSUMER,
            "threads": 1,
        },
        "machine": machine(),
        "load_average": { "start": load_at_start, "end": load_average() },
        "put_ops_per_s": round(put_ops_per_s, 1),
        "put_latency": latency_summary(&mut put_lat),
        "append_batch_events_per_s": round(append_events_per_s, 1),
        "append_batch": {
            "events": appended,
            "calls": append_calls,
            "append_seconds": round(append_time.as_secs_f64(), 3),
            "wall_seconds": round(append_wall.as_secs_f64(), 3),
            "deliveries_written": appended * consumers.len() as u64,
            "journal_events_total": journal_events,
        },
        format!("claim_batch_{}", args.batch): claim,
        "claim_run": {
            "pending_at_start": pending_start,
            "pending_at_end": pending_end,
            "claimed": claimed_total,
            "short_claims": short_claims,
        },
        "mark_done_per_s": round(mark_done_per_s, 1),
        "mark_done_latency": latency_summary(&mut done_lat),
        "jobs": jobs,
        "total_seconds": round(started.elapsed().as_secs_f64(), 3),
        "targets": {
            "claim_batch_p95_ms_max": TARGET_CLAIM_P95_MS,
            "claim_batch_p95_met": claim_p95.map(|p| p <= TARGET_CLAIM_P95_MS),
            "append_batch_events_per_s_min": TARGET_APPEND_EVENTS_PER_S,
            "append_batch_met": append_events_per_s >= TARGET_APPEND_EVENTS_PER_S,
            "put_ops_per_s_min": TARGET_PUT_OPS_PER_S,
            "put_met": put_ops_per_s >= TARGET_PUT_OPS_PER_S,
            "note": "targets are stated for the default parameters (1M pending, batch 100) on a release build",
        },
    }))
}

/// Step 4: the job queue at `--jobs-pending` pending jobs (`null` when 0).
fn measure_jobs(store: &dyn SourceStore, args: &BenchOutboxArgs) -> anyhow::Result<Value> {
    if args.jobs_pending == 0 {
        return Ok(Value::Null);
    }
    eprintln!(
        "bench: enqueueing {} jobs in batches of {APPEND_BATCH}",
        args.jobs_pending
    );
    let mut enqueue_time = Duration::ZERO;
    let mut enqueued: u64 = 0;
    while enqueued < args.jobs_pending {
        let n = (args.jobs_pending - enqueued).min(APPEND_BATCH as u64);
        let ops = (enqueued..enqueued + n)
            .map(|i| {
                WriteOp::Enqueue(JobSpec {
                    job_type: JOB_TYPES[i as usize % JOB_TYPES.len()].to_owned(),
                    payload: json!({"i": i}),
                    idempotency_key: Some(format!("bench:{i}")),
                    run_at_ms: None,
                    parent_job_id: None,
                })
            })
            .collect();
        let t = Instant::now();
        store.apply_batch(ops)?;
        enqueue_time += t.elapsed();
        enqueued += n;
    }
    let pending = |store: &dyn SourceStore| -> anyhow::Result<u64> {
        Ok(store
            .job_counts()?
            .iter()
            .filter(|c| c.state == JobState::Pending)
            .map(|c| c.count)
            .sum())
    };
    let pending_start = pending(store)?;
    let slots: Vec<TypeSlots> = JOB_TYPES
        .iter()
        .map(|t| TypeSlots {
            job_type: (*t).to_owned(),
            concurrency: JOB_CLAIM_LIMIT as u32,
        })
        .collect();
    eprintln!(
        "bench: {} claim_jobs({JOB_CLAIM_LIMIT}) + complete samples at {pending_start} pending jobs",
        args.claims
    );
    let mut claim_lat = Vec::with_capacity(args.claims as usize);
    let mut cycle_lat = Vec::with_capacity(args.claims as usize);
    let mut claimed_total: u64 = 0;
    for _ in 0..args.claims {
        let t = Instant::now();
        let claimed = store.claim_jobs("bench-runner", &slots, JOB_CLAIM_LIMIT)?;
        claim_lat.push(t.elapsed());
        for c in &claimed {
            store.complete(&c.claim, None)?;
        }
        cycle_lat.push(t.elapsed());
        claimed_total += claimed.len() as u64;
    }
    Ok(json!({
        "pending": args.jobs_pending,
        "types": JOB_TYPES.len(),
        "enqueue_jobs_per_s": round(rate(enqueued, enqueue_time), 1),
        format!("claim_jobs_{JOB_CLAIM_LIMIT}"): latency_summary(&mut claim_lat),
        format!("claim_jobs_{JOB_CLAIM_LIMIT}_and_complete"): latency_summary(&mut cycle_lat),
        "claimed": claimed_total,
        "pending_at_start": pending_start,
        "pending_at_end": pending(store)?,
    }))
}

/// An `UPSERT_CONTEXT` event for synthetic node number `i`.
fn upsert_event(i: u64) -> anyhow::Result<OutboxEventCreate> {
    Ok(OutboxEventCreate {
        payload: EventPayload::UpsertContext(UpsertContextPayload {
            event_version: EVENT_VERSION,
            uri: CtxUri::parse(&format!("ctx://bench/events/e{i}"))?,
            expected_node_version: 1,
            reason: UpsertReason::Create,
            trace_id: format!("bench-{i}"),
        }),
    })
}

fn pending_of(store: &dyn SourceStore, consumer: &str) -> anyhow::Result<u64> {
    store
        .stats()?
        .into_iter()
        .find(|s| s.consumer == consumer)
        .map(|s| s.pending)
        .with_context(|| format!("no stats for consumer {consumer}"))
}

/// `n` per second over `d`.
pub(crate) fn rate(n: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// `x` rounded to `digits` decimals.
pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Nearest-rank percentile (`p` in 0..=100) of ascending `sorted`; `None` when empty.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n) - 1).copied()
}

/// Count, mean, p50/p95/p99 and max of `samples`, in milliseconds.
pub(crate) fn latency_summary(samples: &mut [Duration]) -> Value {
    samples.sort_unstable();
    let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    let mean = (!ms.is_empty()).then(|| ms.iter().sum::<f64>() / ms.len() as f64);
    let r = |v: Option<f64>| v.map(|x| round(x, 4));
    json!({
        "count": ms.len(),
        "mean_ms": r(mean),
        "p50_ms": r(percentile(&ms, 50.0)),
        "p95_ms": r(percentile(&ms, 95.0)),
        "p99_ms": r(percentile(&ms, 99.0)),
        "max_ms": r(ms.last().copied()),
    })
}

/// What the figures were measured on, so a debug-build run is not mistaken for a release one.
pub(crate) fn machine() -> Value {
    let cores = std::thread::available_parallelism().map(|n| n.get()).ok();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    });
    // The toolchain on PATH; rust-toolchain.toml pins the one that built this binary.
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    json!({
        "cores": cores,
        "cpu_model": cpu_model,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "rustc": rustc,
    })
}

/// Latency of a plain 4 KiB overwrite + `fsync` in `dir`: the floor under a durable commit,
/// which tells a slow disk apart from a slow store.
fn fsync_probe(dir: &Path) -> anyhow::Result<Value> {
    use std::io::{Seek as _, SeekFrom, Write as _};
    const ROUNDS: usize = 100;
    let path = dir.join("fsync-probe");
    let ctx = || format!("probing fsync with {}", path.display());
    let mut f = std::fs::File::create(&path).with_context(ctx)?;
    let page = [0x5au8; 4096];
    let mut lat = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        f.seek(SeekFrom::Start((i % 8) as u64 * 4096))
            .with_context(ctx)?;
        f.write_all(&page).with_context(ctx)?;
        let t = Instant::now();
        f.sync_all().with_context(ctx)?;
        lat.push(t.elapsed());
    }
    drop(f);
    std::fs::remove_file(&path).with_context(ctx)?;
    Ok(latency_summary(&mut lat))
}

/// The 1, 5 and 15 minute load averages (Linux): other work on the machine skews every figure.
pub(crate) fn load_average() -> Option<[f64; 3]> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = s.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// CPU seconds (user + system, every thread) this process has used so far, from
/// `/proc/self/stat` (in USER_HZ ticks, 100 per second on Linux); `None` elsewhere. Less
/// sensitive than wall time to the other work on a shared machine.
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// CPU seconds used since `before` (a [`process_cpu_seconds`] reading), to 10 ms.
pub(crate) fn cpu_seconds_since(before: Option<f64>) -> Option<f64> {
    process_cpu_seconds()
        .zip(before)
        .map(|(after, before)| round(after - before, 2))
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

/// A fresh directory removed on drop unless kept.
pub(crate) struct BenchDir {
    pub(crate) path: PathBuf,
    keep: bool,
}

impl BenchDir {
    pub(crate) fn create(work_dir: &Path, keep: bool) -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = work_dir.join(format!("ce-bench-{}-{nanos}", std::process::id()));
        // `create_dir` (not `_all`) fails on an existing directory: the store is always fresh.
        std::fs::create_dir(&path)
            .with_context(|| format!("creating bench directory {}", path.display()))?;
        Ok(BenchDir { path, keep })
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("bench: kept {}", self.path.display());
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("bench: could not remove {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 95.0), Some(95.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn small_run_reports_every_figure_and_cleans_up() {
        let work = std::env::temp_dir().join(format!("ce-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&work).expect("work dir");
        let args = BenchOutboxArgs {
            work_dir: Some(work.clone()),
            pending: 3000,
            puts: 20,
            claims: 5,
            batch: 10,
            jobs_pending: 500,
            keep: false,
            e2e_events: 0,
            processes: vec![1],
            pgvector_url: None,
        };
        let r = run_outbox(&args, None).expect("bench runs");
        assert!(r["put_ops_per_s"].as_f64().expect("put rate") > 0.0);
        assert!(
            r["append_batch_events_per_s"]
                .as_f64()
                .expect("append rate")
                > 0.0
        );
        assert_eq!(r["append_batch"]["journal_events_total"], 3000);
        assert_eq!(r["claim_run"]["pending_at_start"], 3000);
        assert_eq!(r["claim_run"]["pending_at_end"], 3000 - 5 * 10);
        assert_eq!(r["claim_batch_10"]["count"], 5);
        assert_eq!(r["mark_done_latency"]["count"], 50);
        let jobs = &r["jobs"];
        assert_eq!(jobs["pending_at_start"], 500);
        assert_eq!(jobs["claimed"], 5 * 10);
        assert_eq!(jobs["pending_at_end"], 500 - 5 * 10);
        assert_eq!(jobs["claim_jobs_10"]["count"], 5);
        assert_eq!(jobs["claim_jobs_10_and_complete"]["count"], 5);
        assert!(jobs["enqueue_jobs_per_s"].as_f64().expect("enqueue rate") > 0.0);
        assert!(r["machine"]["cores"].as_u64().is_some());
        let left = std::fs::read_dir(&work).expect("read work dir").count();
        std::fs::remove_dir_all(&work).expect("remove work dir");
        assert_eq!(left, 0, "the store directory is removed");
    }
}
