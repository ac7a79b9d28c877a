//! Model test of the vector indexes: random sequences of upsert / delete / move / versioned
//! sync and remove / search / reopen run on the exact in-memory index (the oracle) and on two
//! embedded indexes — default planner, and planner forced onto the graph. After every step:
//! the same outcome (value or error class), the same `list_under(root)`, and for searches
//! the same hits (ids and scores) from the default embedded index — its candidate sets are
//! small, so it scans exactly — and, from the graph-forced one, exactly as many hits, all
//! passing the filter. Embedded indexes are closed (with or without snapshot) and reopened
//! at random; the graph is checked against the stored records at the end of each case.

use std::collections::BTreeMap;

use ce_core::{Classify, CtxUri, Level};
use ce_index::vector::embedded::{EmbeddedOptions, EmbeddedVectorIndex};
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{NodeRecord, NodeWrite, SearchFilter, VectorIndex, VectorRecord};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};
use serde_json::json;

use crate::common::{graph_only, record, seed, uri};

const NODES: [&str; 9] = [
    "ctx://p/a",
    "ctx://p/a/x",
    "ctx://p/a/x/y",
    "ctx://p/ab",
    "ctx://p/ab/x",
    "ctx://p/b",
    "ctx://p/b/x",
    "ctx://q/users/u1/memories/m",
    "ctx://q/agents/bot/m",
];
const DIM: usize = 6;
const POOL: usize = 7;

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        node: usize,
        levels: Vec<u8>,
        vec: usize,
        tag: u8,
    },
    Delete {
        node: usize,
        subtree: bool,
    },
    Move {
        from: usize,
        to: usize,
    },
    Sync {
        node: usize,
        version: u64,
        levels: Vec<u8>,
        vec: Option<usize>,
        tag: u8,
    },
    Remove {
        node: usize,
        version: u64,
    },
    Search {
        q: usize,
        filter: FilterSpec,
        k: usize,
    },
    Reopen {
        snapshot: bool,
    },
    /// `write_nodes` of `Sync`, `Remove` and `Delete { subtree: false }` (a purge) ops.
    Batch(Vec<Op>),
}

#[derive(Debug, Clone)]
struct FilterSpec {
    subtree: Option<usize>,
    parent: Option<usize>,
    level: Option<u8>,
    tag: Option<u8>,
    account: Option<&'static str>,
    owners: Option<Vec<&'static str>>,
}

impl FilterSpec {
    fn build(&self) -> SearchFilter {
        SearchFilter {
            subtree: self.subtree.map(|n| uri(NODES[n])),
            parent_uri: self
                .parent
                .map(|n| uri(NODES[n]).parent().unwrap_or_else(CtxUri::root)),
            level: self.level.map(|l| Level::try_from(l).expect("level")),
            meta: self
                .tag
                .map(|t| BTreeMap::from([("tag".to_owned(), json!(t))]))
                .unwrap_or_default(),
            account_id: self.account.map(str::to_owned),
            owner_spaces: self
                .owners
                .as_ref()
                .map(|o| o.iter().map(|s| (*s).to_owned()).collect()),
            ..SearchFilter::default()
        }
    }
}

fn levels() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::subsequence(vec![0u8, 1, 2], 0..=3)
}

fn filter() -> impl Strategy<Value = FilterSpec> {
    (
        prop::option::weighted(0.4, 0..NODES.len()),
        prop::option::weighted(0.15, 0..NODES.len()),
        prop::option::weighted(0.3, 0u8..3),
        prop::option::weighted(0.3, 0u8..3),
        prop::option::weighted(0.15, prop::sample::select(vec!["p", "q"])),
        prop::option::weighted(
            0.15,
            prop::sample::subsequence(vec!["shared", "user:u1", "agent:bot"], 0..=2),
        ),
    )
        .prop_map(
            |(subtree, parent, level, tag, account, owners)| FilterSpec {
                subtree,
                parent,
                level,
                tag,
                account,
                owners,
            },
        )
}

fn node_write() -> impl Strategy<Value = Op> {
    let n = 0..NODES.len();
    prop_oneof![
        3 => (n.clone(), 1u64..10, levels(), prop::option::weighted(0.7, 0..POOL), 0u8..3)
            .prop_map(|(node, version, levels, vec, tag)| Op::Sync { node, version, levels, vec, tag }),
        1 => (n.clone(), 1u64..10).prop_map(|(node, version)| Op::Remove { node, version }),
        1 => n.prop_map(|node| Op::Delete { node, subtree: false }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0..NODES.len();
    prop_oneof![
        2 => prop::collection::vec(node_write(), 1..6).prop_map(Op::Batch),
        4 => (n.clone(), levels(), 0..POOL, 0u8..3)
            .prop_map(|(node, levels, vec, tag)| Op::Upsert { node, levels, vec, tag }),
        1 => (n.clone(), any::<bool>()).prop_map(|(node, subtree)| Op::Delete { node, subtree }),
        2 => (n.clone(), n.clone()).prop_map(|(from, to)| Op::Move { from, to }),
        4 => (n.clone(), 1u64..10, levels(), prop::option::weighted(0.7, 0..POOL), 0u8..3)
            .prop_map(|(node, version, levels, vec, tag)| Op::Sync { node, version, levels, vec, tag }),
        2 => (n.clone(), 1u64..10).prop_map(|(node, version)| Op::Remove { node, version }),
        4 => (0..POOL + 2, filter(), 1usize..6).prop_map(|(q, filter, k)| Op::Search { q, filter, k }),
        1 => any::<bool>().prop_map(|snapshot| Op::Reopen { snapshot }),
    ]
}

/// Vector `i` of the pool: a few directions, so scores tie and order by id.
fn pool(i: usize) -> Vec<f32> {
    let mut v = vec![0.1f32; DIM];
    v[i % DIM] = 1.0;
    if i >= DIM {
        v[0] = -1.0;
    }
    v
}

fn rec(node: usize, level: u8, tag: u8) -> ce_core::IndexRecord {
    record(NODES[node], level, &[("tag", json!(tag))])
}

/// One embedded index that can be closed and reopened.
struct Reopenable {
    dir: tempfile::TempDir,
    options: EmbeddedOptions,
    index: Option<EmbeddedVectorIndex>,
}

impl Reopenable {
    fn new(options: EmbeddedOptions) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let index =
            Some(EmbeddedVectorIndex::open_with(dir.path(), options.clone()).expect("open"));
        Reopenable {
            dir,
            options,
            index,
        }
    }

    fn get(&self) -> &EmbeddedVectorIndex {
        self.index.as_ref().expect("open")
    }

    fn reopen(&mut self, snapshot: bool) -> Result<(), TestCaseError> {
        let old = self.index.take().expect("open");
        // Stop the inserter and wait for its step: the fresh vectors left are the tail the
        // next open reads back.
        old.pause_graph_insertion(true);
        old.check_consistency()
            .map_err(|e| TestCaseError::fail(format!("consistency before reopen: {e}")))?;
        let (tail, graph) = (old.stats().fresh_vectors, old.stats().graph_vectors);
        if snapshot {
            drop(old);
        } else {
            old.close_without_snapshot();
        }
        let idx = EmbeddedVectorIndex::open_with(self.dir.path(), self.options.clone())
            .map_err(|e| TestCaseError::fail(format!("reopen: {e}")))?;
        let stats = idx.stats();
        // A graph that was empty at close left no snapshot (its vectors were all fresh).
        if snapshot && graph > 0 {
            prop_assert!(
                stats.opened_from_snapshot,
                "a closed index reopens from its snapshot"
            );
            prop_assert!(
                stats.snapshot_catch_up <= tail,
                "{:?}, tail {}",
                stats,
                tail
            );
            prop_assert!(stats.fresh_vectors <= tail, "{:?}, tail {}", stats, tail);
        }
        self.index = Some(idx);
        Ok(())
    }
}

/// Applies `op` to `idx`, returning a comparable outcome.
fn apply(idx: &dyn VectorIndex, op: &Op) -> Result<String, String> {
    let cls = |e: ce_index::IndexError| format!("error {:?}", e.code());
    match op {
        Op::Upsert {
            node,
            levels,
            vec,
            tag,
        } => {
            let recs: Vec<VectorRecord> = levels
                .iter()
                .map(|l| VectorRecord {
                    record: rec(*node, *l, *tag),
                    vector: pool(*vec),
                })
                .collect();
            idx.upsert(&recs).map(|()| "ok".into()).map_err(cls)
        }
        Op::Delete { node, subtree } => idx
            .delete_by_uri(&uri(NODES[*node]), *subtree)
            .map(|n| n.to_string())
            .map_err(cls),
        Op::Move { from, to } => idx
            .move_uri(&uri(NODES[*from]), &uri(NODES[*to]))
            .map(|n| n.to_string())
            .map_err(cls),
        Op::Sync { .. } | Op::Remove { .. } => node_write_of(op)
            .apply_to(idx)
            .map(|o| format!("{o:?}"))
            .map_err(cls),
        Op::Search { q, filter, k } => idx
            .search(&pool(*q), &filter.build(), *k)
            .map(|hits| {
                hits.iter()
                    .map(|h| format!("{}:{}", h.record.id, h.score.to_bits()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .map_err(cls),
        Op::Reopen { .. } => Ok("ok".into()),
        Op::Batch(ops) => {
            let writes: Vec<NodeWrite> = ops.iter().map(node_write_of).collect();
            idx.write_nodes(&writes)
                .map(|outcomes| {
                    outcomes
                        .into_iter()
                        .map(|o| o.map(|o| format!("{o:?}")).unwrap_or_else(cls))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .map_err(cls)
        }
    }
}

/// The `NodeWrite` a batched op stands for.
fn node_write_of(op: &Op) -> NodeWrite {
    match op {
        Op::Sync {
            node,
            version,
            levels,
            vec,
            tag,
        } => NodeWrite::Sync {
            uri: uri(NODES[*node]),
            version: *version,
            records: levels
                .iter()
                .map(|l| NodeRecord {
                    record: rec(*node, *l, *tag),
                    vector: vec.map(pool),
                })
                .collect(),
        },
        Op::Remove { node, version } => NodeWrite::Remove {
            uri: uri(NODES[*node]),
            version: *version,
        },
        Op::Delete { node, .. } => NodeWrite::Purge {
            uri: uri(NODES[*node]),
        },
        other => unreachable!("not a node write: {other:?}"),
    }
}

fn run_case(ops: &[Op]) -> Result<(), TestCaseError> {
    let oracle = MemoryVectorIndex::new();
    let mut planned = Reopenable::new(EmbeddedOptions::default());
    let mut graph = Reopenable::new(graph_only());
    let root = CtxUri::root();
    for (i, op) in ops.iter().enumerate() {
        if let Op::Reopen { snapshot } = op {
            planned.reopen(*snapshot)?;
            graph.reopen(!*snapshot)?;
        }
        let want = apply(&oracle, op);
        let got = apply(planned.get(), op);
        prop_assert_eq!(&got, &want, "step {}: {:?}", i, op);
        let got_graph = apply(graph.get(), op);
        if let Op::Search { q, filter, k } = op {
            let f = filter.build();
            let hits = graph
                .get()
                .search(&pool(*q), &f, *k)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let n_want = oracle
                .search(&pool(*q), &f, *k)
                .map(|h| h.len())
                .unwrap_or(0);
            prop_assert_eq!(hits.len(), n_want, "step {}: graph search returns top_k", i);
            prop_assert!(
                hits.iter().all(|h| f.matches(&h.record)),
                "step {}: filter",
                i
            );
        } else {
            prop_assert_eq!(
                &got_graph,
                &want,
                "step {}: graph-forced index: {:?}",
                i,
                op
            );
        }
        let state = oracle
            .list_under(&root)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (name, idx) in [("planned", planned.get()), ("graph", graph.get())] {
            let s = idx
                .list_under(&root)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&s, &state, "step {}: {} state after {:?}", i, name, op);
        }
    }
    for idx in [planned.get(), graph.get()] {
        idx.check_consistency()
            .map_err(|e| TestCaseError::fail(format!("consistency: {e}")))?;
    }
    Ok(())
}

#[test]
fn embedded_matches_the_exact_oracle() {
    let seed = seed("embedded_matches_the_exact_oracle");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(24), 2048);
    match runner.run(&prop::collection::vec(op(), 1..=40), |ops| run_case(&ops)) {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => panic!(
            "vector model test failed (replay with CE_SEED={seed}): {why}\nminimal ops:\n{ops:#?}"
        ),
        Err(e) => panic!("vector model test aborted (CE_SEED={seed}): {e}"),
    }
}
