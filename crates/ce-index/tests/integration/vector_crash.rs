//! Crash safety of the embedded vector index (DESIGN.md §5): a child process writes batches
//! and is killed with SIGKILL at a random moment, ten times in a row on the same directory.
//! After each kill the index is reopened: it must hold exactly the acknowledged writes (plus,
//! or not, the one in flight), and its graph must agree with the stored records.
//!
//! The child inserts into the graph in the background in small batches with no linger, so a
//! kill usually lands while fresh vectors are being moved into the graph; it reports the
//! fresh / graph split after every write, and the parent checks that kills did land on a
//! mixed state. After each reopen, exact searches return the oracle's hits bit for bit.
//!
//! The child is this test binary re-executed on [`vector_crash_child`], which does nothing
//! unless `CE_VECTOR_CRASH_DIR` is set. Its operations are a pure function of (round, n), so
//! the parent replays the acknowledged ones on the exact in-memory index and compares.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use ce_core::CtxUri;
use ce_index::vector::embedded::bench::random_unit_vectors;
use ce_index::vector::embedded::{EmbeddedOptions, EmbeddedVectorIndex, SearchStrategy};
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{NodeRecord, SearchFilter, VectorIndex, VectorRecord};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::common::{record, seed, uri};

const DIR_ENV: &str = "CE_VECTOR_CRASH_DIR";
const ROUND_ENV: &str = "CE_VECTOR_CRASH_ROUND";
const KILLS: u64 = 10;
const DIM: usize = 24;

/// One write of the child.
#[derive(Debug)]
enum CrashOp {
    Upsert(Vec<VectorRecord>),
    Sync(CtxUri, u64, Vec<NodeRecord>),
    Remove(CtxUri, u64),
    Delete(CtxUri),
    Move(CtxUri, CtxUri),
}

/// The `n`-th operation of `round` (deterministic).
fn crash_op(round: u64, n: u64) -> CrashOp {
    let mut rng = StdRng::seed_from_u64(round.wrapping_mul(1_000_003) ^ n);
    let vecs = random_unit_vectors(40, DIM, rng.random());
    let base = format!("ctx://crash/r{round}");
    let earlier = |rng: &mut StdRng| rng.random_range(1..n.max(2));
    match rng.random_range(0..100) {
        0..60 => CrashOp::Upsert(
            vecs.into_iter()
                .enumerate()
                .map(|(j, v)| VectorRecord {
                    record: record(
                        &format!("{base}/b{n}/d{j}"),
                        (j % 3) as u8,
                        &[("j", json!(j))],
                    ),
                    vector: v,
                })
                .collect(),
        ),
        60..78 => {
            let u = format!("{base}/s/n{}", rng.random_range(0..6));
            let levels: Vec<u8> = (0..3u8).filter(|_| rng.random_bool(0.6)).collect();
            let keep = rng.random_bool(0.3);
            let recs = levels
                .iter()
                .zip(vecs)
                .map(|(l, v)| NodeRecord {
                    record: record(&u, *l, &[("n", json!(n))]),
                    vector: (!keep).then_some(v),
                })
                .collect();
            // Versions grow with n, with jitter so that some writes are stale.
            CrashOp::Sync(uri(&u), n * 2 - rng.random_range(0..4).min(n * 2 - 1), recs)
        }
        78..86 => CrashOp::Remove(
            uri(&format!("{base}/s/n{}", rng.random_range(0..6))),
            n * 2 - rng.random_range(0..4).min(n * 2 - 1),
        ),
        86..93 => CrashOp::Delete(uri(&format!("{base}/b{}", earlier(&mut rng)))),
        _ => {
            let m = earlier(&mut rng);
            CrashOp::Move(
                uri(&format!("{base}/b{m}")),
                uri(&format!("{base}/moved/b{m}")),
            )
        }
    }
}

fn apply(idx: &dyn VectorIndex, op: CrashOp) -> bool {
    match op {
        CrashOp::Upsert(recs) => idx.upsert(&recs).is_ok(),
        CrashOp::Sync(u, v, recs) => idx.sync_node(&u, v, recs).is_ok(),
        CrashOp::Remove(u, v) => idx.remove_node(&u, v).is_ok(),
        CrashOp::Delete(u) => idx.delete_by_uri(&u, true).is_ok(),
        CrashOp::Move(a, b) => idx.move_uri(&a, &b).is_ok(),
    }
}

/// The child: writes until it is killed. A no-op in a normal test run.
#[test]
fn vector_crash_child() {
    let Some(dir) = std::env::var_os(DIR_ENV) else {
        return;
    };
    let round: u64 = std::env::var(ROUND_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let options = EmbeddedOptions {
        insert_batch: 16,
        insert_linger: Duration::ZERO,
        ..EmbeddedOptions::default()
    };
    let idx =
        EmbeddedVectorIndex::open_with(Path::new(&dir), options).expect("child opens the index");
    let mut out = std::io::stdout();
    if writeln!(out).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while Instant::now() < deadline {
        n += 1;
        let op = crash_op(round, n);
        if writeln!(out, "OP {n}").and_then(|()| out.flush()).is_err() {
            return;
        }
        let line = if apply(&idx, op) { "ACK" } else { "ERR" };
        let s = idx.stats();
        if writeln!(
            out,
            "{line} {n}\nSPLIT {} {}",
            s.fresh_vectors, s.graph_vectors
        )
        .and_then(|()| out.flush())
        .is_err()
        {
            return;
        }
    }
}

/// Runs one child for `ms` milliseconds, kills it, and returns the finished operations (in
/// order) and the one in flight.
fn run_child(dir: &Path, round: u64, ms: u64) -> (Vec<u64>, Option<u64>, bool) {
    let log = dir.with_extension(format!("child{round}.log"));
    let lines = ce_testkit::run_and_kill(
        &ce_testkit::test_name(module_path!(), "vector_crash_child"),
        &[
            (DIR_ENV, dir.display().to_string()),
            (ROUND_ENV, round.to_string()),
        ],
        Duration::from_millis(ms),
        &log,
    );
    let _ = std::fs::remove_file(&log);
    let mut done = Vec::new();
    let mut open = None;
    // The last split reported before the kill: fresh vectors and graph vectors at once.
    let mut mixed = false;
    for l in lines {
        if let Some(split) = l.strip_prefix("SPLIT ") {
            let n: Vec<usize> = split.split(' ').filter_map(|x| x.parse().ok()).collect();
            mixed = n.len() == 2 && n[0] > 0 && n[1] > 0;
            continue;
        }
        if let Some(n) = l.strip_prefix("OP ") {
            assert!(open.is_none(), "OP before the previous one ended");
            open = Some(n.parse::<u64>().expect("op number"));
        } else if let Some(n) = l.strip_prefix("ACK ").or_else(|| l.strip_prefix("ERR ")) {
            let n: u64 = n.parse().expect("op number");
            assert_eq!(open.take(), Some(n), "end of another op");
            done.push(n);
        }
    }
    (done, open, mixed)
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let seed = seed("acknowledged_writes_survive_kill_9");
    let mut rng = StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("vectors");
    let mut history = 0;
    let oracle = MemoryVectorIndex::new();
    let root = CtxUri::root();
    let mut total = 0;
    let mut mixed_kills = 0;
    for round in 0..KILLS {
        let (done, in_flight, mixed) = run_child(&dir, round, rng.random_range(250..900));
        mixed_kills += u32::from(mixed);
        total += done.len();
        for n in &done {
            apply(&oracle, crash_op(round, *n));
            history += 1;
        }
        let idx = EmbeddedVectorIndex::open(&dir).expect("reopen after the kill");
        let got = idx.list_under(&root).expect("list");
        let want = oracle.list_under(&root).expect("list");
        if got != want {
            let n = in_flight.unwrap_or_else(|| {
                panic!("round {round} (CE_SEED={seed}): state differs from the acknowledged writes and nothing was in flight")
            });
            // The write in flight committed before the kill: the oracle takes it too.
            apply(&oracle, crash_op(round, n));
            history += 1;
            let want = oracle.list_under(&root).expect("list");
            assert!(
                got == want,
                "round {round} (CE_SEED={seed}): {} records stored, {} expected after {} ops",
                got.len(),
                want.len(),
                history
            );
        }
        idx.check_consistency()
            .unwrap_or_else(|e| panic!("round {round} (CE_SEED={seed}): {e}"));
        // The graph answers: a search through it returns top_k of the stored records.
        let q = random_unit_vectors(1, DIM, round).remove(0);
        let hits = idx
            .search_with(&q, &SearchFilter::default(), 10, SearchStrategy::Ann)
            .expect("search")
            .hits;
        assert_eq!(hits.len(), got.len().min(10), "round {round}");
        // Exact searches (graph and fresh segment together) equal the oracle's bit for bit.
        for (i, f) in [
            SearchFilter::default(),
            SearchFilter {
                subtree: Some(uri(&format!("ctx://crash/r{round}"))),
                ..SearchFilter::default()
            },
        ]
        .iter()
        .enumerate()
        {
            let q = random_unit_vectors(1, DIM, round * 31 + i as u64).remove(0);
            let want: Vec<(String, u32)> = oracle
                .search(&q, f, 10)
                .expect("oracle search")
                .into_iter()
                .map(|h| (h.record.id, h.score.to_bits()))
                .collect();
            let got: Vec<(String, u32)> = idx
                .search_with(&q, f, 10, SearchStrategy::Exact)
                .expect("search")
                .hits
                .into_iter()
                .map(|h| (h.record.id, h.score.to_bits()))
                .collect();
            assert_eq!(
                got, want,
                "round {round} (CE_SEED={seed}): exact search differs"
            );
        }
        drop(idx); // a clean close: the next child starts from the snapshot
    }
    assert!(
        total > 20,
        "the children wrote too little to test anything ({total} ops)"
    );
    assert!(
        mixed_kills > 0,
        "no kill landed while vectors were both fresh and in the graph"
    );
    eprintln!(
        "acknowledged_writes_survive_kill_9: {total} acknowledged ops over {KILLS} kills, \
         {mixed_kills} with fresh vectors waiting for the graph"
    );
}
