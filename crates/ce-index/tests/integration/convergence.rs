//! The convergence simulation (DESIGN.md §5) over the three consumers at once: a real
//! `SqliteStore` takes seeded random put / update / metadata-only update / mv / rm / link /
//! unlink writes while 4 workers per consumer (vector, keyword, relation) apply the outbox
//! with faults per consumer — embedder timeouts, rate limits and 5xx, index write failures,
//! lost leases, claims of killed workers — and the keyword index failing every write for a
//! long stretch, during which the other two consumers reach lag 0. After the faults stop and
//! the outbox drains, every index equals the projection of the source exactly, each consumer
//! is applied_valid (lag 0, nothing dead), vectors are the embeddings of their texts, and a
//! metadata-only update of every node then embeds nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ce_core::{CtxUri, IndexProjector, IndexRecord, ManualClock};
use ce_embed::hash::HashEmbedder;
use ce_embed::{EmbedError, Embedder, ModelIdentity};
use ce_index::IndexError;
use ce_index::keyword::memory::MemoryKeywordIndex;
use ce_index::relation::RelationIndex;
use ce_index::relation::memory::MemoryRelationIndex;
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{NodeWrite, StoredRecord, SyncOutcome, VectorIndex as _};
use ce_index::worker::target::{IndexTarget, KeywordTarget, VectorTarget};
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::{
    ContextFs as _, LinkRequest, OutboxStore as _, PutMode, PutRequest, RelationStore as _,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{Env, Running, seed, uri, worker_config};
use crate::relation::{FlakyRelations, expected_edges};

const CONSUMERS: [&str; 3] = ["vector", "keyword", "relation"];

/// The hashing embedder with seeded faults while `faults` is on; counts texts embedded.
struct FaultyEmbedder {
    inner: HashEmbedder,
    faults: AtomicBool,
    rng: Mutex<StdRng>,
    clock: ManualClock,
    texts: AtomicU64,
}

impl Embedder for FaultyEmbedder {
    fn identity(&self) -> &ModelIdentity {
        self.inner.identity()
    }

    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        if self.faults.load(Ordering::SeqCst) {
            let roll: f64 = self.rng.lock().expect("rng").random();
            if roll < 0.02 {
                // A pause long enough to lose the lease: the ack is refused and redone.
                self.clock.advance(61_000);
            }
            match roll {
                r if r < 0.10 => return Err(EmbedError::Timeout { after: timeout }),
                r if r < 0.15 => {
                    return Err(EmbedError::RateLimited {
                        retry_after: Some(Duration::from_millis(1)),
                        message: "slow down".into(),
                    });
                }
                r if r < 0.20 => {
                    return Err(EmbedError::Provider {
                        status: Some(503),
                        message: "unavailable".into(),
                        retryable: true,
                    });
                }
                _ => {}
            }
        }
        self.texts.fetch_add(texts.len() as u64, Ordering::SeqCst);
        self.inner.embed_texts(texts, timeout)
    }
}

/// A worker target whose writes fail while `failing` is set, or at a seeded rate while
/// `faults` is on.
struct FlakyTarget {
    inner: Arc<dyn IndexTarget>,
    failing: AtomicBool,
    faults: AtomicBool,
    rng: Mutex<StdRng>,
}

impl FlakyTarget {
    fn new(inner: Arc<dyn IndexTarget>, seed: u64) -> Arc<Self> {
        Arc::new(FlakyTarget {
            inner,
            failing: AtomicBool::new(false),
            faults: AtomicBool::new(true),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        })
    }
}

impl IndexTarget for FlakyTarget {
    fn uses_vectors(&self) -> bool {
        self.inner.uses_vectors()
    }
    fn bind_model(&self, model: &ModelIdentity) -> ce_index::Result<()> {
        self.inner.bind_model(model)
    }
    fn get(&self, ids: &[String]) -> ce_index::Result<Vec<StoredRecord>> {
        self.inner.get(ids)
    }
    fn vectors(&self, ids: &[String]) -> ce_index::Result<Vec<(String, Vec<f32>)>> {
        self.inner.vectors(ids)
    }
    fn list_under(&self, uri: &CtxUri) -> ce_index::Result<Vec<StoredRecord>> {
        self.inner.list_under(uri)
    }
    fn write_nodes(
        &self,
        writes: Vec<NodeWrite>,
    ) -> ce_index::Result<Vec<ce_index::Result<SyncOutcome>>> {
        let roll = self.rng.lock().expect("rng").random::<f64>();
        if self.failing.load(Ordering::SeqCst)
            || (self.faults.load(Ordering::SeqCst) && roll < 0.05)
        {
            return Err(IndexError::Unavailable("injected write failure".into()));
        }
        self.inner.write_nodes(writes)
    }
}

fn env() -> Env {
    Env::new(&CONSUMERS, |cfg| cfg.index.outbox.max_retries = 20)
}

fn wcfg(id: &str, consumer: &str) -> WorkerConfig {
    let mut c = worker_config(id, consumer);
    c.default_rate_limit_pause = Duration::from_millis(1);
    // Several index writes per batch, so chunking is exercised everywhere.
    c.vector_upsert_batch_size = 5;
    c
}

/// The projection of the whole source, as the vector and keyword indexes must hold it.
fn expected_records(env: &Env) -> BTreeMap<String, IndexRecord> {
    let p = IndexProjector::default();
    env.store
        .read_subtree(&CtxUri::root())
        .expect("read")
        .iter()
        .flat_map(|n| p.build_context_records(n).records)
        .map(|r| (r.id.clone(), r))
        .collect()
}

fn records_of(target: &dyn IndexTarget) -> BTreeMap<String, IndexRecord> {
    target
        .list_under(&CtxUri::root())
        .expect("list")
        .into_iter()
        .map(|s| (s.record.id.clone(), s.record))
        .collect()
}

/// Missing, extra and stale records of `got` against `want`.
fn diff(
    want: &BTreeMap<String, IndexRecord>,
    got: &BTreeMap<String, IndexRecord>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let show = |r: &IndexRecord| format!("{}#{}", r.uri, r.level);
    let missing = want
        .iter()
        .filter(|(k, _)| !got.contains_key(*k))
        .map(|(_, r)| show(r))
        .collect();
    let extra = got
        .iter()
        .filter(|(k, _)| !want.contains_key(*k))
        .map(|(_, r)| show(r))
        .collect();
    let stale = want
        .iter()
        .filter(|(k, r)| got.get(*k).is_some_and(|g| g != *r))
        .map(|(_, r)| show(r))
        .collect();
    (missing, extra, stale)
}

#[test]
fn three_indexes_converge_under_concurrent_workers_and_faults() {
    for run in 0..ce_core::test_cases(3) {
        converge(seed(&format!("three-index convergence run {run}")));
    }
}

fn converge(seed: u64) {
    let env = env();
    let emb = Arc::new(FaultyEmbedder {
        inner: HashEmbedder::new(16),
        faults: AtomicBool::new(true),
        rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)),
        clock: env.clock.clone(),
        texts: AtomicU64::new(0),
    });
    let vector_index = Arc::new(MemoryVectorIndex::new());
    let vector = FlakyTarget::new(Arc::new(VectorTarget(vector_index.clone())), seed ^ 1);
    let keyword = FlakyTarget::new(
        Arc::new(KeywordTarget(Arc::new(MemoryKeywordIndex::new()))),
        seed ^ 2,
    );
    let relations = FlakyRelations::new(Arc::new(MemoryRelationIndex::new()), 0.05, seed ^ 3);
    keyword.failing.store(true, Ordering::SeqCst);

    let mut workers: Vec<Arc<IndexWorker>> = Vec::new();
    for i in 0..4 {
        let e: Arc<dyn Embedder> = emb.clone();
        let w = |consumer: &str, target: Arc<dyn IndexTarget>, e: Option<Arc<dyn Embedder>>| {
            IndexWorker::for_target(
                wcfg(&format!("{consumer}-{i}"), consumer),
                env.store.clone(),
                target,
                e,
                IndexProjector::default(),
            )
            .expect("worker")
        };
        workers.push(Arc::new(w("vector", vector.clone(), Some(e))));
        workers.push(Arc::new(w("keyword", keyword.clone(), None)));
        let r: Arc<dyn RelationIndex> = relations.clone();
        let rw = IndexWorker::for_relations(
            wcfg(&format!("relation-{i}"), "relation"),
            env.store.clone(),
            r,
        )
        .expect("relation worker");
        workers.push(Arc::new(rw));
    }
    let running = Running::start(&workers);

    let mut rng = StdRng::seed_from_u64(seed);
    let names = ["a", "b", "c", "d"];
    let pick = |rng: &mut StdRng| {
        let depth = rng.random_range(1..=3);
        let segs: Vec<&str> = (0..depth)
            .map(|_| names[rng.random_range(0..names.len())])
            .collect();
        uri(&format!("ctx://acc/{}", segs.join("/")))
    };
    for i in 0..300 {
        if i == 150 {
            // The end of the keyword index's outage: meanwhile the other consumers caught up
            // completely, while every keyword write failed.
            env.settle(
                &format!("seed {seed}: vector and relation did not catch up"),
                || env.open_deliveries(Some("vector")) + env.open_deliveries(Some("relation")) == 0,
            );
            let k = env
                .store
                .stats()
                .expect("stats")
                .into_iter()
                .find(|s| s.consumer == "keyword")
                .expect("keyword");
            assert!(
                k.pending + k.retry_wait + k.dead > 0 && k.last_error.is_some(),
                "seed {seed}: the failing keyword consumer shows no failure: {k:?}"
            );
            keyword.failing.store(false, Ordering::SeqCst);
            // What the outage made dead is requeued, as an operator would after the fix.
            env.store
                .requeue_dead(Some("keyword"), None)
                .expect("requeue");
        }
        let u = pick(&mut rng);
        match rng.random_range(0..100) {
            0..=39 => {
                let req = PutRequest {
                    abstract_text: Some(format!("abs {}", rng.random_range(0..20))),
                    content: Some(format!("content {}", rng.random_range(0..20))),
                    ..PutRequest::default()
                };
                let _ = env.store.put(&u, req);
            }
            40..=54 => {
                let mut req = PutRequest {
                    mode: PutMode::Merge,
                    ..PutRequest::default()
                };
                req.meta
                    .insert("k".into(), serde_json::json!(rng.random_range(0..5)));
                let _ = env.store.put(&u, req);
            }
            55..=66 => {
                let _ = env.store.mv(&u, &pick(&mut rng), None);
            }
            67..=76 => {
                let _ = env.store.rm(&u, true, None, None);
            }
            77..=88 => {
                let _ = env.store.link(LinkRequest {
                    from: u,
                    to: pick(&mut rng),
                    relation_type: ["rel", "cites"][rng.random_range(0..2)].into(),
                    weight: 1.0,
                    reason: String::new(),
                    trace_id: None,
                });
            }
            89..=94 => {
                if let Some(e) = env
                    .store
                    .get_edges(&u)
                    .ok()
                    .and_then(|e| e.first().cloned())
                {
                    let _ = env.store.unlink(&u, &e.to_uri, &e.relation_type, None);
                }
            }
            _ => {
                // A worker killed mid-batch: claims taken and never acknowledged.
                let consumer = CONSUMERS[rng.random_range(0..CONSUMERS.len())];
                let _ = env.store.claim_batch(consumer, &format!("dead-{i}"), 3);
            }
        }
        if i % 25 == 0 {
            env.clock.advance(rng.random_range(0..5_000));
        }
    }
    emb.faults.store(false, Ordering::SeqCst);
    vector.faults.store(false, Ordering::SeqCst);
    keyword.faults.store(false, Ordering::SeqCst);
    relations.faults.store(false, Ordering::SeqCst);
    let all_open = || env.open_deliveries(None) == 0;
    env.settle(&format!("seed {seed}: outbox did not drain"), all_open);
    let dead = env.dead();
    assert!(
        dead.is_empty(),
        "seed {seed}: only retryable faults were injected, yet {} dead",
        dead.len()
    );
    let check = |phase: &str| {
        let want = expected_records(&env);
        assert!(
            !want.is_empty(),
            "seed {seed}: the simulation left nothing to index"
        );
        for (name, got) in [
            ("vector", records_of(vector.as_ref())),
            ("keyword", records_of(keyword.as_ref())),
        ] {
            let (missing, extra, stale) = diff(&want, &got);
            assert!(
                missing.is_empty() && extra.is_empty() && stale.is_empty(),
                "seed {seed}, {phase}, {name}: missing {missing:?} extra {extra:?} stale {stale:?}"
            );
        }
        let edges = relations.list_under(&CtxUri::root()).expect("edges");
        assert_eq!(
            edges,
            expected_edges(&env.store),
            "seed {seed}, {phase}: relation"
        );
        // Every consumer is applied_valid: lag 0 and nothing dead.
        for s in env.store.stats().expect("stats") {
            assert_eq!(
                (s.pending + s.claimed + s.retry_wait, s.dead),
                (0, 0),
                "seed {seed}, {phase}: {s:?}"
            );
        }
        // Every stored vector is the embedding of its record's current text.
        let stored = vector_index.list_under(&CtxUri::root()).expect("list");
        let ids: Vec<String> = stored.iter().map(|s| s.record.id.clone()).collect();
        let vectors: BTreeMap<String, Vec<f32>> = vector_index
            .vectors(&ids)
            .expect("vectors")
            .into_iter()
            .collect();
        for s in &stored {
            let want = emb
                .inner
                .embed_texts(&[&s.record.text], Duration::from_secs(5))
                .expect("embed");
            assert_eq!(
                vectors.get(&s.record.id),
                want.first(),
                "seed {seed}: {}",
                s.record.id
            );
        }
    };
    check("after the faults");

    // A metadata-only update of every node: every index follows, nothing is embedded.
    let texts_before = emb.texts.load(Ordering::SeqCst);
    for n in env.store.read_subtree(&CtxUri::root()).expect("read") {
        let mut req = PutRequest {
            mode: PutMode::Merge,
            ..PutRequest::default()
        };
        req.meta
            .insert("phase".into(), serde_json::json!("meta-only"));
        env.store.put(&n.uri, req).expect("meta put");
    }
    env.settle(
        &format!("seed {seed}: meta-only updates did not drain"),
        all_open,
    );
    running.stop();
    check("after the metadata-only updates");
    assert_eq!(
        emb.texts.load(Ordering::SeqCst),
        texts_before,
        "seed {seed}: a metadata-only update was embedded"
    );
}
