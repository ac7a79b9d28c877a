//! The relation consumer end to end, on each source backend: a real store takes random put / link / unlink /
//! set-relations / mv / rm writes while several relation workers apply the outbox with
//! injected index write failures, lost leases and killed workers; after the outbox drains,
//! the relation index equals the source's edges exactly (every node's `get_edges`, with its
//! relation version). Also: persistence across reopen, non-retryable failures that go dead
//! and converge after requeue, and bad input that harms nothing.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ce_core::{Classify, CtxUri, ErrorCode, IndexProjector};
use ce_index::IndexError;
use ce_index::relation::embedded::EmbeddedRelationIndex;
use ce_index::relation::memory::MemoryRelationIndex;
use ce_index::relation::{
    Direction, RelationIndex, RelationOutcome, RelationRecord, RelationVersion, RelationWrite,
};
use ce_index::worker::IndexWorker;
use ce_store::{LinkRequest, PutRequest, WriteOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{
    Backend, Env, Running, Store, WrappedRelations, backend_tests, seed, unless_refused, uri,
    worker_config,
};

backend_tests!(
    memory_index_converges_under_concurrent_workers_and_faults,
    embedded_index_converges_and_persists_across_reopen,
    a_permanent_write_failure_goes_dead_and_converges_after_requeue,
    bad_input_gets_typed_errors_and_harms_nothing,
    a_move_back_applied_between_a_read_and_its_write_leaves_no_orphan,
    a_purge_that_lands_after_the_owner_was_created_and_synced_is_undone,
);

/// A relation index whose writes fail while faults are on: a whole batch, or single writes
/// (retryable), at a seeded rate; and writes of one owner non-retryably while it is poisoned.
pub(crate) struct FlakyRelations {
    inner: Arc<dyn RelationIndex>,
    /// Whether faults are injected.
    pub(crate) faults: AtomicBool,
    rate: f64,
    rng: Mutex<StdRng>,
    poisoned: Mutex<Option<CtxUri>>,
}

impl FlakyRelations {
    pub(crate) fn new(inner: Arc<dyn RelationIndex>, rate: f64, seed: u64) -> Arc<Self> {
        Arc::new(FlakyRelations {
            inner,
            faults: AtomicBool::new(rate > 0.0),
            rate,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            poisoned: Mutex::new(None),
        })
    }

    fn roll(&self) -> bool {
        self.faults.load(Ordering::SeqCst)
            && self.rng.lock().expect("rng").random::<f64>() < self.rate
    }
}

impl FlakyRelations {
    /// The index the workers use: writes go through [`FlakyRelations::write`].
    pub(crate) fn index(self: &Arc<Self>) -> Arc<dyn RelationIndex> {
        let me = self.clone();
        WrappedRelations::new(self.inner.clone(), move |inner, writes| {
            me.write(inner, writes)
        })
    }

    fn write(
        &self,
        inner: &dyn RelationIndex,
        writes: &[RelationWrite],
    ) -> ce_index::Result<Vec<ce_index::Result<RelationOutcome>>> {
        if self.roll() {
            return Err(IndexError::Unavailable("injected batch failure".into()));
        }
        let poisoned = self.poisoned.lock().expect("poison").clone();
        // Failing writes are answered here; the others go to the index in one batch.
        let mut answers: Vec<Option<ce_index::Result<RelationOutcome>>> = Vec::new();
        let mut pass = Vec::new();
        for w in writes {
            if poisoned.as_ref() == Some(w.owner()) {
                answers.push(Some(Err(IndexError::Corrupt(
                    "injected permanent failure".into(),
                ))));
            } else if self.roll() {
                answers.push(Some(Err(IndexError::Unavailable(
                    "injected write failure".into(),
                ))));
            } else {
                answers.push(None);
                pass.push(w.clone());
            }
        }
        let mut applied = inner.write_owners(&pass)?.into_iter();
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| applied.next().expect("one outcome per write")))
            .collect())
    }
}

fn env(backend: Backend) -> Env {
    Env::on(backend, &["relation"], |_| {})
}

fn worker(env: &Env, index: Arc<dyn RelationIndex>, id: &str) -> IndexWorker {
    IndexWorker::for_relations(worker_config(id, "relation"), env.store.clone(), index)
        .expect("relation worker")
}

fn key(r: &RelationRecord) -> (String, String, String) {
    (
        r.record.from_uri.to_string(),
        r.record.to_uri.to_string(),
        r.record.relation_type.clone(),
    )
}

/// Every node's edges in the source, projected as the index must hold them.
/// Every node's edges, as the relation index must hold them, in `list_under` order.
pub(crate) fn expected_edges(store: &Store) -> Vec<RelationRecord> {
    let p = IndexProjector::default();
    let mut out: Vec<RelationRecord> = store
        .read_subtree(&CtxUri::root())
        .expect("read")
        .iter()
        .flat_map(|n| {
            let edges = store.get_edges(&n.uri).expect("edges");
            p.build_relation_records(n, &edges)
                .into_iter()
                .map(|record| RelationRecord {
                    record,
                    relation_version: n.relation_version,
                })
        })
        .collect();
    out.sort_by_key(key);
    out
}

/// Asserts the index equals the source's edges, naming the differences.
fn assert_converged(env: &Env, index: &dyn RelationIndex, what: &str) {
    let want = expected_edges(&env.store);
    let got = index.list_under(&CtxUri::root()).expect("list");
    if got != want {
        let show = |rs: &[RelationRecord]| -> BTreeSet<String> {
            rs.iter().map(|r| format!("{r:?}")).collect()
        };
        let (w, g) = (show(&want), show(&got));
        panic!(
            "{what}: index differs from the source\n missing {:#?}\n extra {:#?}",
            w.difference(&g).collect::<Vec<_>>(),
            g.difference(&w).collect::<Vec<_>>()
        );
    }
    assert_eq!(index.count().expect("count"), want.len() as u64, "{what}");
}

/// Random writes on the source: nodes under two accounts, edges between existing nodes.
fn random_writes(env: &Env, rng: &mut StdRng, n: usize, dead_claims: bool) {
    let names = ["a", "b", "c"];
    let pick = |rng: &mut StdRng| {
        let account = if rng.random_bool(0.8) { "acc" } else { "other" };
        let depth = rng.random_range(1..=3);
        let segs: Vec<&str> = (0..depth)
            .map(|_| names[rng.random_range(0..names.len())])
            .collect();
        uri(&format!("ctx://{account}/{}", segs.join("/")))
    };
    let types = ["ref", "cites", "about"];
    for i in 0..n {
        let nodes: Vec<CtxUri> = env
            .store
            .read_subtree(&CtxUri::root())
            .expect("read")
            .into_iter()
            .map(|n| n.uri)
            .collect();
        let existing = |rng: &mut StdRng| {
            if nodes.is_empty() {
                pick(rng)
            } else {
                nodes[rng.random_range(0..nodes.len())].clone()
            }
        };
        let link = |rng: &mut StdRng, from: &CtxUri| LinkRequest {
            from: from.clone(),
            to: existing(rng),
            relation_type: types[rng.random_range(0..types.len())].into(),
            weight: f64::from(rng.random_range(0..4_u8)) / 2.0,
            reason: format!("r{}", rng.random_range(0..3)),
            trace_id: None,
        };
        match rng.random_range(0..100) {
            0..=24 => {
                let req = PutRequest {
                    content: Some(format!("content {}", rng.random_range(0..10))),
                    ..PutRequest::default()
                };
                unless_refused(env.store.put(&pick(rng), req));
            }
            25..=54 => {
                let from = existing(rng);
                unless_refused(env.store.link(link(rng, &from)));
            }
            55..=64 => {
                let from = existing(rng);
                if let Some(e) = env.store.get_edges(&from).expect("edges").first() {
                    unless_refused(env.store.unlink(&from, &e.to_uri, &e.relation_type, None));
                }
            }
            65..=71 => {
                let from = existing(rng);
                let edges = (0..rng.random_range(0..3))
                    .map(|_| link(rng, &from))
                    .collect();
                unless_refused(env.store.apply_batch(vec![WriteOp::SetRelations {
                    from,
                    edges,
                    trace_id: None,
                }]));
            }
            72..=83 => {
                unless_refused(env.store.mv(&existing(rng), &pick(rng), None));
            }
            84..=93 => {
                let recursive = rng.random_bool(0.7);
                unless_refused(env.store.rm(&existing(rng), recursive, None, None));
            }
            _ if dead_claims => {
                // A worker killed mid-batch: claims taken and never acknowledged.
                unless_refused(env.store.claim_batch("relation", &format!("dead-{i}"), 3));
            }
            _ => {}
        }
        if i % 25 == 0 {
            env.clock.advance(rng.random_range(0..5_000));
        }
        if rng.random_bool(0.01) {
            // Long enough to lose the leases of batches in flight: their acks are refused
            // and the work is redone.
            env.clock.advance(61_000);
        }
    }
}

/// Random writes while four workers apply the outbox with faults, then a drain without
/// faults; the index must equal the source and nothing may be dead.
fn converge(backend: Backend, seed: u64, index: Arc<dyn RelationIndex>, what: &str) -> Env {
    let env = env(backend);
    let flaky = FlakyRelations::new(index.clone(), 0.08, seed);
    let workers: Vec<Arc<IndexWorker>> = (0..4)
        .map(|i| Arc::new(worker(&env, flaky.index(), &format!("w{i}"))))
        .collect();
    let running = Running::start(&workers);
    let mut rng = StdRng::seed_from_u64(seed);
    random_writes(&env, &mut rng, 300, true);
    flaky.faults.store(false, Ordering::SeqCst);
    env.settle(
        &running,
        &format!("{what}: seed {seed}: outbox did not drain"),
        || env.open_deliveries(None) == 0,
    );
    running.stop();
    let dead = env.dead();
    assert!(
        dead.is_empty(),
        "{what}: seed {seed}: only retryable faults were injected, yet {} dead: {:?}",
        dead.len(),
        dead.first()
    );
    let edges = index.count().expect("count");
    eprintln!("{what}: seed {seed}: converged on {edges} edges");
    assert_converged(&env, index.as_ref(), &format!("{what}: seed {seed}"));
    env
}

fn memory_index_converges_under_concurrent_workers_and_faults(backend: Backend) {
    for run in 0..ce_core::test_cases(2) {
        let seed = seed(&format!("relation memory convergence run {run}"));
        converge(
            backend,
            seed,
            Arc::new(MemoryRelationIndex::new()),
            "memory",
        );
    }
}

fn embedded_index_converges_and_persists_across_reopen(backend: Backend) {
    for run in 0..ce_core::test_cases(2) {
        let seed = seed(&format!("relation embedded convergence run {run}"));
        let dir = tempfile::tempdir().expect("tmp");
        let index = Arc::new(EmbeddedRelationIndex::open(dir.path()).expect("open"));
        let env = converge(backend, seed, index.clone(), "embedded");
        drop(index);

        // Reopened, the index holds the same edges and versions, and goes on converging.
        let index: Arc<dyn RelationIndex> =
            Arc::new(EmbeddedRelationIndex::open(dir.path()).expect("reopen"));
        assert_converged(&env, index.as_ref(), "after reopen");
        let w = worker(&env, index.clone(), "after-reopen");
        let mut rng = StdRng::seed_from_u64(seed ^ 0xa5a5);
        random_writes(&env, &mut rng, 60, false);
        env.drain(&w);
        assert_converged(&env, index.as_ref(), "after more writes");
    }
}

fn a_permanent_write_failure_goes_dead_and_converges_after_requeue(backend: Backend) {
    let env = env(backend);
    let dir = tempfile::tempdir().expect("tmp");
    let index: Arc<dyn RelationIndex> =
        Arc::new(EmbeddedRelationIndex::open(dir.path()).expect("open"));
    let flaky = FlakyRelations::new(index.clone(), 0.0, 1);
    let w = worker(&env, flaky.index(), "w");
    for u in ["ctx://acc/a", "ctx://acc/b", "ctx://acc/c"] {
        let req = PutRequest {
            content: Some(format!("content of {u}")),
            ..PutRequest::default()
        };
        env.store.put(&uri(u), req).expect("put");
    }
    *flaky.poisoned.lock().expect("poison") = Some(uri("ctx://acc/a"));
    let link = |from: &str, to: &str| {
        env.store
            .link(LinkRequest {
                from: uri(from),
                to: uri(to),
                relation_type: "ref".into(),
                weight: 1.0,
                reason: String::new(),
                trace_id: None,
            })
            .expect("link");
    };
    link("ctx://acc/a", "ctx://acc/b");
    link("ctx://acc/b", "ctx://acc/c");
    env.drain(&w);
    let dead = env.dead();
    assert_eq!(dead.len(), 1, "only a's event is dead: {dead:?}");
    assert_eq!(
        edge_list(index.as_ref()),
        ["ctx://acc/b->ctx://acc/c"],
        "b's edges are indexed regardless"
    );
    // Repair: the fault is gone, the dead delivery is requeued and applied.
    *flaky.poisoned.lock().expect("poison") = None;
    assert_eq!(
        env.store
            .requeue_dead(Some("relation"), None)
            .expect("requeue"),
        1
    );
    env.drain(&w);
    assert_converged(&env, index.as_ref(), "after requeue");
    assert_eq!(
        edge_list(index.as_ref()),
        ["ctx://acc/a->ctx://acc/b", "ctx://acc/b->ctx://acc/c"]
    );
    let into_b = index
        .related(&uri("ctx://acc/b"), Some("ref"), Direction::Both, 10)
        .expect("related");
    assert_eq!(into_b.len(), 2);
}

fn edge_list(index: &dyn RelationIndex) -> Vec<String> {
    index
        .list_under(&CtxUri::root())
        .expect("list")
        .iter()
        .map(|r| format!("{}->{}", r.record.from_uri, r.record.to_uri))
        .collect()
}

fn bad_input_gets_typed_errors_and_harms_nothing(backend: Backend) {
    let env = env(backend);
    let dir = tempfile::tempdir().expect("tmp");
    let index: Arc<dyn RelationIndex> =
        Arc::new(EmbeddedRelationIndex::open(dir.path()).expect("open"));
    let w = worker(&env, index.clone(), "w");
    let mut rng = StdRng::seed_from_u64(7);
    random_writes(&env, &mut rng, 80, false);
    env.drain(&w);
    assert_converged(&env, index.as_ref(), "before bad input");
    let before = index.list_under(&CtxUri::root()).expect("list");
    let owner = before
        .first()
        .map(|r| r.record.from_uri.clone())
        .unwrap_or_else(|| uri("ctx://acc/a"));
    let version_before = index.owner_version(&owner).expect("version");

    // Writes the index must refuse, each on its own: a record of another owner, a wrong id,
    // a non-finite weight, an invalid type, the root as owner.
    let good = |to: &str| {
        let to = uri(to);
        ce_core::RelationIndexRecord {
            id: ce_core::projector::relation_id(&owner, &to, "ref"),
            from_uri: owner.clone(),
            to_uri: to,
            relation_type: "ref".into(),
            weight: 1.0,
            reason: String::new(),
            account_id: owner.account_id().to_owned(),
            owner_space: "shared".into(),
        }
    };
    let mut foreign = good("ctx://acc/x");
    foreign.from_uri = uri("ctx://acc/elsewhere");
    let mut wrong_id = good("ctx://acc/x");
    wrong_id.id = "d41d8cd98f00b204e9800998ecf8427e".into();
    let mut infinite = good("ctx://acc/x");
    infinite.weight = f64::INFINITY;
    let mut bad_type = good("ctx://acc/x");
    bad_type.relation_type = "a|b".into();
    let newer = RelationVersion {
        node_version: u64::MAX,
        relation_version: 0,
    };
    let mut writes: Vec<RelationWrite> = [foreign, wrong_id, infinite, bad_type]
        .into_iter()
        .map(|r| RelationWrite::Replace {
            owner: owner.clone(),
            version: newer,
            records: vec![r],
        })
        .collect();
    writes.push(RelationWrite::Replace {
        owner: CtxUri::root(),
        version: newer,
        records: Vec::new(),
    });
    let out = index.write_owners(&writes).expect("batch");
    for o in &out {
        let e = o.as_ref().expect_err("refused");
        assert_eq!(e.code(), ErrorCode::InvalidField, "{e}");
        assert!(!e.is_retryable(), "{e}");
    }
    let e = index
        .related(&owner, Some(""), Direction::Out, 5)
        .expect_err("empty type");
    assert_eq!(e.code(), ErrorCode::InvalidField, "{e}");
    let e = "upward".parse::<Direction>().expect_err("direction");
    assert_eq!(e.code(), ErrorCode::InvalidField, "{e}");

    assert_eq!(index.list_under(&CtxUri::root()).expect("list"), before);
    assert_eq!(
        index.owner_version(&owner).expect("version"),
        version_before
    );
    assert_converged(&env, index.as_ref(), "after bad input");

    // A damaged file is refused with a non-retryable error, and left as it was.
    let bad = tempfile::tempdir().expect("tmp");
    let file = bad.path().join(ce_index::relation::embedded::DB_FILE);
    std::fs::write(&file, b"not a database at all, just some bytes".repeat(200)).expect("write");
    let e = EmbeddedRelationIndex::open(bad.path()).expect_err("damaged");
    assert_eq!(e.code(), ErrorCode::Corrupt, "{e}");
    assert!(!e.is_retryable());
    assert!(read_prefix(&file).starts_with(b"not a database"));
}

fn read_prefix(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read")
}

/// Puts a node at `u` with some content.
fn put_content(store: &Store, u: &str) {
    let req = PutRequest {
        content: Some(format!("content of {u}")),
        ..PutRequest::default()
    };
    store.put(&uri(u), req).expect("put");
}

/// Links `from` to `to` with a `refers` edge.
fn refers(store: &Store, from: &str, to: &str) {
    store
        .link(LinkRequest {
            from: uri(from),
            to: uri(to),
            relation_type: "refers".into(),
            weight: 1.0,
            reason: String::new(),
            trace_id: None,
        })
        .expect("link");
}

/// Found by the crash sweep: worker A applies a move `w → wm` and reads the moved owners;
/// before its write lands, the subtree moves back and worker B applies that move — B cannot
/// see, under `wm`, the edges A is about to write there. A's write then lands under `wm`; A
/// must notice that its owners left `wm` meanwhile and remove them, or they stay as orphans.
fn a_move_back_applied_between_a_read_and_its_write_leaves_no_orphan(backend: Backend) {
    let env = env(backend);
    let inner: Arc<dyn RelationIndex> = Arc::new(MemoryRelationIndex::new());
    put_content(&env.store, "ctx://a/w/n");
    put_content(&env.store, "ctx://a/t");
    refers(&env.store, "ctx://a/w/n", "ctx://a/t");
    worker(&env, inner.clone(), "setup")
        .run_once(100)
        .expect("setup");
    assert_converged(&env, inner.as_ref(), "before the moves");

    env.store
        .mv(&uri("ctx://a/w"), &uri("ctx://a/wm"), None)
        .expect("move away");
    let b = worker(&env, inner.clone(), "b");
    let store = env.store.clone();
    let once = std::sync::Once::new();
    let hooked = WrappedRelations::new(inner.clone(), move |inner, writes| {
        once.call_once(|| {
            // Between A's read and its first write: the move back, applied by B.
            store
                .mv(&uri("ctx://a/wm"), &uri("ctx://a/w"), None)
                .expect("move back");
            b.run_once(100).expect("worker b");
        });
        inner.write_owners(writes)
    });
    let a = worker(&env, hooked, "a");
    let done = a.run_once(100).expect("worker a");
    assert!(done.claimed > 0, "A applied the move away");
    // Anything left (B's events are done; A's were acknowledged) is drained by a third worker.
    worker(&env, inner.clone(), "c")
        .run_once(100)
        .expect("drain");
    assert_converged(&env, inner.as_ref(), "after the move and the move back");
    assert!(
        inner
            .list_under(&uri("ctx://a/wm"))
            .expect("list")
            .is_empty(),
        "an orphan edge was left under the moved-away URI"
    );
}

/// The purge race (`worker::live_now`): worker A reads that the source never held `x` (the
/// `purge_missing` of a URI not created yet) and purges it; between that read and the purge,
/// `x` is created with an edge and worker B applies it. A must then sync `x` again: its purge
/// removed B's write, and no later event would restore it.
fn a_purge_that_lands_after_the_owner_was_created_and_synced_is_undone(backend: Backend) {
    let env = env(backend);
    let inner: Arc<dyn RelationIndex> = Arc::new(MemoryRelationIndex::new());
    let x = uri("ctx://a/x");
    env.store.purge_missing(&x, None).expect("purge_missing");
    let b = worker(&env, inner.clone(), "b");
    let store = env.store.clone();
    let once = std::sync::Once::new();
    let created = x.clone();
    let hooked = WrappedRelations::new(inner.clone(), move |inner, writes| {
        if writes
            .iter()
            .any(|w| matches!(w, RelationWrite::Purge { .. }))
        {
            once.call_once(|| {
                put_content(&store, created.as_str());
                put_content(&store, "ctx://a/t");
                refers(&store, created.as_str(), "ctx://a/t");
                b.run_once(100).expect("worker b");
                assert!(
                    !inner.list_under(&created).expect("list").is_empty(),
                    "B wrote x's edge"
                );
            });
        }
        inner.write_owners(writes)
    });
    let a = worker(&env, hooked, "a");
    let done = a.run_once(100).expect("worker a");
    assert_eq!((done.claimed, done.failed), (1, 0), "{done:?}");
    assert!(
        !inner.list_under(&x).expect("list").is_empty(),
        "the late purge left x without its edge"
    );
    assert_converged(&env, inner.as_ref(), "after the late purge");
}
