//! The embedded index's two parts — the exact-scan fresh segment and the HNSW graph — against
//! the exact in-memory oracle: random interleavings of writes, deletes, moves, searches,
//! graph-insertion steps (some with writes and searches *inside* the step, after the batch is
//! in the graph and before it leaves the fresh segment), settles and reopens with and without
//! a snapshot. After every operation the stored records equal the oracle's, every exact search
//! returns the oracle's hits with bit-identical scores, every graph search returns as many
//! hits as the oracle with the oracle's scores, and the graph and fresh segment agree with the
//! database (FS1). The background inserter is off (the steps are the test's), except in the
//! last test, which races it for real.

use ce_core::CtxUri;
use ce_index::vector::embedded::bench::random_unit_vectors;
use ce_index::vector::embedded::{EmbeddedOptions, EmbeddedVectorIndex, SearchStrategy};
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{NodeRecord, SearchFilter, VectorHit, VectorIndex, VectorRecord};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::common::{graph_only, record, seed, unit, uri};

const DIM: usize = 8;

/// A write, a read or an insertion step.
#[derive(Debug, Clone)]
enum Op {
    /// `(node, level, vector seed)` records.
    Upsert(Vec<(u8, u8, u16)>),
    /// A versioned write of `node`: levels with a fresh vector (`Some`) or keeping theirs.
    Sync(u8, u8, Vec<(u8, Option<u16>)>),
    /// A versioned removal of `node`.
    Remove(u8, u8),
    /// `delete_by_uri` of group `g`'s subtree.
    Delete(u8),
    /// Moves group `g` under `ctx://p/moved`.
    Move(u8),
    /// A search: query seed, filter kind, top_k.
    Search(u16, u8, u8),
    /// An insertion step of up to `max` fresh vectors, running `during` inside it.
    Step(u8, Vec<Op>),
    /// Every fresh vector into the graph.
    Settle,
    /// Close (writing a snapshot or not, as a crash) and open again.
    Reopen(bool),
    /// `clear` (a reindex starts with it).
    Clear,
}

fn node_uri(node: u8) -> String {
    format!("ctx://p/g{}/n{node}", node % 3)
}

fn filter(kind: u8) -> SearchFilter {
    match kind % 5 {
        0 => SearchFilter::default(),
        1 => SearchFilter {
            subtree: Some(uri("ctx://p/g1")),
            ..SearchFilter::default()
        },
        2 => SearchFilter {
            level: Some(ce_core::Level::ALL[1]),
            ..SearchFilter::default()
        },
        3 => SearchFilter {
            subtree: Some(uri("ctx://p/moved")),
            ..SearchFilter::default()
        },
        _ => SearchFilter {
            parent_uri: Some(uri("ctx://p/g0")),
            ..SearchFilter::default()
        },
    }
}

fn leaf_op() -> impl Strategy<Value = Op> {
    let node = 0u8..12;
    let level = 0u8..3;
    prop_oneof![
        4 => prop::collection::vec((node.clone(), level.clone(), 0u16..400), 1..12).prop_map(Op::Upsert),
        2 => (node.clone(), 0u8..20, prop::collection::vec((level, prop::option::weighted(0.7, 0u16..400)), 0..3))
            .prop_map(|(n, v, l)| Op::Sync(n, v, l)),
        1 => (node, 0u8..20).prop_map(|(n, v)| Op::Remove(n, v)),
        1 => (0u8..3).prop_map(Op::Delete),
        1 => (0u8..3).prop_map(Op::Move),
        3 => (0u16..400, 0u8..5, 1u8..12).prop_map(|(q, f, k)| Op::Search(q, f, k)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => leaf_op(),
        2 => (1u8..40, prop::collection::vec(leaf_op(), 0..4)).prop_map(|(m, d)| Op::Step(m, d)),
        1 => Just(Op::Settle),
        1 => any::<bool>().prop_map(Op::Reopen),
        1 => Just(Op::Clear),
    ]
}

/// The index under test and its directory.
struct Subject {
    dir: tempfile::TempDir,
    options: EmbeddedOptions,
    index: Option<EmbeddedVectorIndex>,
}

impl Subject {
    fn idx(&self) -> &EmbeddedVectorIndex {
        self.index.as_ref().expect("open")
    }
}

fn fail(what: &str, e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {e}"))
}

/// Applies a write to `idx` (embedded or oracle); the outcome as text (errors compared by
/// whether they happened: both refuse the same inputs).
fn write(idx: &dyn VectorIndex, op: &Op) -> String {
    let out = match op {
        Op::Upsert(recs) => idx
            .upsert(
                &recs
                    .iter()
                    .map(|(n, l, v)| VectorRecord {
                        record: record(&node_uri(*n), *l, &[]),
                        vector: unit(u64::from(*v), DIM),
                    })
                    .collect::<Vec<_>>(),
            )
            .map(|()| String::new()),
        Op::Sync(n, version, levels) => {
            let u = node_uri(*n);
            let mut seen = Vec::new();
            let recs = levels
                .iter()
                .filter(|(l, _)| {
                    let fresh = !seen.contains(l);
                    seen.push(*l);
                    fresh
                })
                .map(|(l, v)| NodeRecord {
                    record: record(&u, *l, &[]),
                    vector: v.map(|v| unit(u64::from(v), DIM)),
                })
                .collect();
            idx.sync_node(&uri(&u), u64::from(*version), recs)
                .map(|o| format!("{o:?}"))
        }
        Op::Remove(n, version) => idx
            .remove_node(&uri(&node_uri(*n)), u64::from(*version))
            .map(|o| format!("{o:?}")),
        Op::Delete(g) => idx
            .delete_by_uri(&uri(&format!("ctx://p/g{g}")), true)
            .map(|n| n.to_string()),
        Op::Move(g) => idx
            .move_uri(
                &uri(&format!("ctx://p/g{g}")),
                &uri(&format!("ctx://p/moved/g{g}")),
            )
            .map(|n| n.to_string()),
        Op::Clear => idx.clear().map(|()| String::new()),
        Op::Search(..) | Op::Step(..) | Op::Settle | Op::Reopen(_) => Ok(String::new()),
    };
    match out {
        Ok(s) => s,
        Err(_) => "error".into(),
    }
}

fn ids_scores(hits: &[VectorHit]) -> Vec<(String, u32)> {
    hits.iter()
        .map(|h| (h.record.id.clone(), h.score.to_bits()))
        .collect()
}

/// The checks after every operation (inside a step too).
fn check(
    idx: &EmbeddedVectorIndex,
    oracle: &MemoryVectorIndex,
    op: &Op,
) -> Result<(), TestCaseError> {
    let root = CtxUri::root();
    prop_assert_eq!(
        idx.list_under(&root).map_err(|e| fail("list", e))?,
        oracle.list_under(&root).map_err(|e| fail("list", e))?,
        "stored records after {:?}",
        op
    );
    if let Op::Search(q, f, k) = op {
        let (q, f, k) = (unit(u64::from(*q), DIM), filter(*f), usize::from(*k));
        let want = oracle
            .search(&q, &f, k)
            .map_err(|e| fail("oracle search", e))?;
        let exact = idx
            .search_with(&q, &f, k, SearchStrategy::Exact)
            .map_err(|e| fail("exact search", e))?;
        prop_assert_eq!(
            ids_scores(&exact.hits),
            ids_scores(&want),
            "exact search {:?}",
            op
        );
        let ann = idx
            .search_with(&q, &f, k, SearchStrategy::Ann)
            .map_err(|e| fail("graph search", e))?;
        prop_assert_eq!(
            ann.hits.len(),
            want.len(),
            "graph search returns top_k {:?}",
            op
        );
        let all = oracle
            .search(&q, &f, usize::MAX)
            .map_err(|e| fail("oracle search", e))?;
        for h in &ann.hits {
            let o = all.iter().find(|o| o.record.id == h.record.id);
            prop_assert!(
                o.is_some_and(|o| o.score.to_bits() == h.score.to_bits() && o.record == h.record),
                "graph hit {} is not the oracle's ({:?})",
                h.record.id,
                op
            );
        }
    }
    Ok(())
}

fn run(ops: &[Op], fresh_max_bytes: usize) -> Result<(), TestCaseError> {
    let options = EmbeddedOptions {
        background_insert: false,
        fresh_max_bytes,
        ..graph_only()
    };
    let dir = tempfile::tempdir().map_err(|e| fail("tempdir", e))?;
    let index =
        EmbeddedVectorIndex::open_with(dir.path(), options.clone()).map_err(|e| fail("open", e))?;
    let mut s = Subject {
        dir,
        options,
        index: Some(index),
    };
    let oracle = MemoryVectorIndex::new();
    for op in ops {
        match op {
            Op::Step(max, during) => {
                let mut inner: Result<(), TestCaseError> = Ok(());
                s.idx()
                    .insert_step_with(usize::from(*max), || {
                        for d in during {
                            if inner.is_err() {
                                return;
                            }
                            let (a, b) = (write(s.idx(), d), write(&oracle, d));
                            inner = if a == b {
                                check(s.idx(), &oracle, d)
                            } else {
                                Err(TestCaseError::fail(format!(
                                    "{d:?} during a step: {a} vs the oracle's {b}"
                                )))
                            };
                        }
                    })
                    .map_err(|e| fail("insert step", e))?;
                inner?;
            }
            Op::Settle => s.idx().settle().map_err(|e| fail("settle", e))?,
            Op::Reopen(snapshot) => {
                let old = s.index.take().expect("open");
                if *snapshot {
                    drop(old);
                } else {
                    old.close_without_snapshot();
                }
                s.index = Some(
                    EmbeddedVectorIndex::open_with(s.dir.path(), s.options.clone())
                        .map_err(|e| fail("reopen", e))?,
                );
            }
            _ => {
                let (a, b) = (write(s.idx(), op), write(&oracle, op));
                prop_assert_eq!(a, b, "outcome of {:?}", op);
            }
        }
        check(s.idx(), &oracle, op)?;
        s.idx()
            .check_consistency()
            .map_err(|e| fail(&format!("consistency after {op:?}"), e))?;
        let st = s.idx().stats();
        prop_assert!(
            st.fresh_bytes <= fresh_max_bytes + 12 * (DIM * 4 + 32),
            "back-pressure keeps the fresh segment near its bound: {:?}",
            st
        );
    }
    Ok(())
}

#[test]
fn fresh_segment_and_graph_match_the_oracle() {
    let seed = seed("fresh_segment_and_graph_match_the_oracle");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(48), 2048);
    // A large bound (everything may stay fresh) and a small one (back-pressure inserts).
    let strategy = (
        prop::collection::vec(op(), 1..40),
        prop_oneof![Just(1usize << 20), Just(1024usize)],
    );
    runner
        .run(&strategy, |(ops, bound)| run(&ops, bound))
        .unwrap_or_else(|e| panic!("CE_SEED={seed}: {e}"));
}

/// The real background inserter racing writes and searches from two threads: the state
/// converges to the oracle's, and every search meanwhile returns `top_k` hits that pass the
/// filter.
#[test]
fn background_insertion_races_writes_and_searches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = EmbeddedOptions {
        insert_batch: 64,
        insert_linger: std::time::Duration::ZERO,
        ..graph_only()
    };
    let idx = EmbeddedVectorIndex::open_with(dir.path(), options).expect("open");
    let oracle = MemoryVectorIndex::new();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut mixed = false;
    std::thread::scope(|s| {
        let searcher = s.spawn(|| {
            let mut searches = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for f in 0..5 {
                    let f = filter(f);
                    let hits = idx
                        .search_with(&unit(searches, DIM), &f, 10, SearchStrategy::Ann)
                        .expect("search")
                        .hits;
                    assert!(
                        hits.iter().all(|h| f.matches(&h.record)),
                        "hits pass the filter"
                    );
                    assert!(
                        hits.windows(2).all(|w| w[0].score >= w[1].score),
                        "best first"
                    );
                }
                searches += 1;
            }
            searches
        });
        for round in 0..300u64 {
            let ops = [
                Op::Upsert(
                    (0..8)
                        .map(|j| {
                            (
                                ((round * 8 + j) % 12) as u8,
                                (j % 3) as u8,
                                (round * 8 + j) as u16,
                            )
                        })
                        .collect(),
                ),
                if round % 7 == 3 {
                    Op::Delete((round % 3) as u8)
                } else if round % 11 == 5 {
                    Op::Move((round % 3) as u8)
                } else {
                    Op::Remove((round % 12) as u8, (round / 12) as u8)
                },
            ];
            for op in &ops {
                assert_eq!(write(&idx, op), write(&oracle, op), "{op:?}");
            }
            let st = idx.stats();
            mixed |= st.fresh_vectors > 0 && st.graph_vectors > 0;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let searches = searcher.join().expect("searcher");
        assert!(searches > 0);
    });
    idx.settle().expect("settle");
    idx.check_consistency().expect("consistent");
    assert_eq!(idx.stats().fresh_vectors, 0);
    let root = CtxUri::root();
    assert_eq!(
        idx.list_under(&root).expect("list"),
        oracle.list_under(&root).expect("list")
    );
    for q in 0..20 {
        for f in 0..5 {
            let (q, f) = (unit(1000 + q, DIM), filter(f));
            assert_eq!(
                ids_scores(
                    &idx.search_with(&q, &f, 10, SearchStrategy::Exact)
                        .expect("search")
                        .hits
                ),
                ids_scores(&oracle.search(&q, &f, 10).expect("search")),
            );
        }
    }
    eprintln!(
        "background_insertion_races_writes_and_searches: mixed fresh+graph state seen: {mixed}"
    );
}

/// The graph holds each vector normalised and rounded to `f16`, `vectors.db` at half precision
/// with a power-of-two scale of its own (`ce_embed::half`): records whose vectors differ near
/// that precision score alike, or nearly, on the graph's copies, yet every search — exact or
/// through the graph, with the vectors in the graph or still fresh — ranks them by their
/// stored vectors, with the oracle's bit-identical scores (the oracle keeps the same rounding).
/// Vectors of any scale (`f16` overflows past 65,504) behave the same. Without the rescoring of
/// the shortlist the order among these near-ties would be the graph copies' scores'.
#[test]
fn near_ties_below_the_graphs_precision_rank_by_the_stored_vectors() {
    const NEAR: usize = 48;
    let dim = 64;
    let mut random = random_unit_vectors(202, dim, 7).into_iter();
    let (base, other) = (random.next().expect("base"), random.next().expect("other"));
    let records: Vec<VectorRecord> = (0..NEAR)
        .map(|i| {
            let scale = [1.0, 1e-3, 1e5][i % 3];
            let mut v = base.clone();
            v[i % dim] += 2e-5 * i as f32;
            VectorRecord {
                record: crate::common::record(&format!("ctx://p/near/n{i:02}"), 0, &[]),
                vector: v.into_iter().map(|x| x * scale).collect(),
            }
        })
        .chain(
            random
                .enumerate()
                .map(|(i, v)| crate::common::vr(&format!("ctx://p/far/n{i}"), 0, v)),
        )
        .collect();
    // Close to the near-ties' direction, not along it (so a perturbation moves the score).
    let query: Vec<f32> = base.iter().zip(other).map(|(b, o)| b + 0.3 * o).collect();
    let oracle = MemoryVectorIndex::new();
    oracle.upsert(&records).expect("oracle upsert");
    let dir = tempfile::tempdir().expect("tempdir");
    let options = EmbeddedOptions {
        background_insert: false,
        ..graph_only()
    };
    let idx = EmbeddedVectorIndex::open_with(dir.path(), options).expect("open");
    idx.upsert(&records).expect("upsert");
    for part in ["fresh", "graph"] {
        if part == "graph" {
            idx.settle().expect("settle");
            assert_eq!(idx.stats().graph_vectors, records.len(), "all in the graph");
        }
        for top_k in [1, 5, 10, 30] {
            let want = oracle
                .search(&query, &SearchFilter::default(), top_k)
                .expect("oracle search");
            assert!(
                want.iter()
                    .all(|h| h.record.uri.as_str().contains("/near/")),
                "the near-ties are the best hits: {:?}",
                want.iter()
                    .map(|h| (h.record.uri.as_str(), h.score))
                    .collect::<Vec<_>>()
            );
            for strategy in [SearchStrategy::Exact, SearchStrategy::Ann] {
                let got = idx
                    .search_with(&query, &SearchFilter::default(), top_k, strategy)
                    .expect("search");
                assert_eq!(
                    ids_scores(&got.hits),
                    ids_scores(&want),
                    "{part}, {strategy:?}, top {top_k}"
                );
            }
        }
    }
    idx.check_consistency()
        .expect("graph agrees with the records");
}
