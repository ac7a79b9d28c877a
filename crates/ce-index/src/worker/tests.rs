//! Worker tests: every branch of spec §5.2/§5.5, compaction, the §8.4 error matrix,
//! callbacks, batching, and the convergence simulation with concurrent workers and faults.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ce_core::{
    Classify as _, Config, CtxUri, DeliveryStatus, IndexProjector, IndexRecord, ManualClock,
    OutboxEvent,
};
use ce_embed::{EmbedError, Embedder, ModelIdentity};
use ce_store::{
    ContextFs as _, LinkRequest, OutboxFilter, OutboxStore as _, PutMode, PutRequest,
    RelationStore as _, SqliteStore,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::IndexError;
use crate::vector::memory::MemoryVectorIndex;
use crate::vector::{
    NodeRecord, NodeWrite, SearchFilter, StoredRecord, SyncOutcome, VectorHit, VectorRecord,
};

/// Decides the fault of one embedding call: 0 ok, 1 timeout, 2 rate limit, 3 5xx, 4 permanent.
type FaultScript = Box<dyn FnMut(&[&str]) -> u8 + Send>;

/// A deterministic embedder with call counting and scripted faults.
struct TestEmbedder {
    id: ModelIdentity,
    calls: AtomicU64,
    texts: AtomicU64,
    max_batch: AtomicU64,
    faults: Mutex<FaultScript>,
}

impl TestEmbedder {
    fn new() -> Arc<Self> {
        Self::with_faults(|_| 0)
    }

    fn with_faults(f: impl FnMut(&[&str]) -> u8 + Send + 'static) -> Arc<Self> {
        Self::named("bytes-8", f)
    }

    fn named(model: &str, f: impl FnMut(&[&str]) -> u8 + Send + 'static) -> Arc<Self> {
        Arc::new(TestEmbedder {
            id: ModelIdentity {
                provider: "test".into(),
                model: model.into(),
                dimension: 8,
            },
            calls: AtomicU64::new(0),
            texts: AtomicU64::new(0),
            max_batch: AtomicU64::new(0),
            faults: Mutex::new(Box::new(f)),
        })
    }

    fn vector(text: &str) -> Vec<f32> {
        let mut v = [0.1f32; 8];
        for (i, b) in text.bytes().enumerate() {
            v[(i + b as usize) % 8] += f32::from(b) / 255.0;
        }
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }
}

impl Embedder for TestEmbedder {
    fn identity(&self) -> &ModelIdentity {
        &self.id
    }

    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.max_batch
            .fetch_max(texts.len() as u64, Ordering::SeqCst);
        let fault = (self.faults.lock().expect("faults"))(texts);
        match fault {
            1 => return Err(EmbedError::Timeout { after: timeout }),
            2 => {
                return Err(EmbedError::RateLimited {
                    retry_after: Some(Duration::from_millis(1)),
                    message: "slow down".into(),
                });
            }
            3 => {
                return Err(EmbedError::Provider {
                    status: Some(503),
                    message: "unavailable".into(),
                    retryable: true,
                });
            }
            4 => return Err(EmbedError::InvalidResponse("permanent".into())),
            _ => {}
        }
        self.texts.fetch_add(texts.len() as u64, Ordering::SeqCst);
        Ok(texts.iter().map(|t| Self::vector(t)).collect())
    }
}

/// A vector index whose writes fail while `failing` is set or by a seeded rate.
struct FlakyIndex {
    inner: MemoryVectorIndex,
    failing: AtomicBool,
    rate: f64,
    rng: Mutex<StdRng>,
}

impl FlakyIndex {
    fn new(rate: f64, seed: u64) -> Arc<Self> {
        Arc::new(FlakyIndex {
            inner: MemoryVectorIndex::new(),
            failing: AtomicBool::new(false),
            rate,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        })
    }

    fn fault(&self) -> crate::Result<()> {
        let roll = self.rng.lock().expect("rng").random::<f64>();
        if self.failing.load(Ordering::SeqCst) || roll < self.rate {
            return Err(IndexError::Unavailable("injected write failure".into()));
        }
        Ok(())
    }
}

impl VectorIndex for FlakyIndex {
    fn model(&self) -> crate::Result<Option<ModelIdentity>> {
        self.inner.model()
    }
    fn bind_model(&self, model: &ModelIdentity) -> crate::Result<()> {
        self.inner.bind_model(model)
    }
    fn upsert(&self, records: &[VectorRecord]) -> crate::Result<()> {
        self.fault()?;
        self.inner.upsert(records)
    }
    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> crate::Result<u64> {
        self.fault()?;
        self.inner.delete_by_uri(uri, subtree)
    }
    fn move_uri(&self, from: &CtxUri, to: &CtxUri) -> crate::Result<u64> {
        self.fault()?;
        self.inner.move_uri(from, to)
    }
    fn search(&self, q: &[f32], f: &SearchFilter, k: usize) -> crate::Result<Vec<VectorHit>> {
        self.inner.search(q, f, k)
    }
    fn sync_node(
        &self,
        uri: &CtxUri,
        version: u64,
        records: Vec<NodeRecord>,
    ) -> crate::Result<SyncOutcome> {
        self.fault()?;
        self.inner.sync_node(uri, version, records)
    }
    fn remove_node(&self, uri: &CtxUri, version: u64) -> crate::Result<SyncOutcome> {
        self.fault()?;
        self.inner.remove_node(uri, version)
    }
    /// The whole batch can fail, and then each write on its own.
    fn write_nodes(
        &self,
        writes: Vec<NodeWrite>,
    ) -> crate::Result<Vec<crate::Result<SyncOutcome>>> {
        self.fault()?;
        Ok(writes.into_iter().map(|w| w.apply_to(self)).collect())
    }
    fn get(&self, ids: &[String]) -> crate::Result<Vec<StoredRecord>> {
        self.inner.get(ids)
    }
    fn vectors(&self, ids: &[String]) -> crate::Result<Vec<(String, Vec<f32>)>> {
        self.inner.vectors(ids)
    }
    fn list_under(&self, uri: &CtxUri) -> crate::Result<Vec<StoredRecord>> {
        self.inner.list_under(uri)
    }
    fn count(&self) -> crate::Result<u64> {
        self.inner.count()
    }
    fn clear(&self) -> crate::Result<()> {
        self.inner.clear()
    }
}

struct Env {
    _dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    clock: ManualClock,
}

fn env() -> Env {
    env_with(&["vector"])
}

fn env_with(consumers: &[&str]) -> Env {
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = Config::default();
    cfg.index.outbox.consumers = consumers.iter().map(|c| (*c).to_owned()).collect();
    cfg.index.outbox.max_retries = 20;
    cfg.index.outbox.retry_base_seconds = 1;
    cfg.index.outbox.retry_max_seconds = 30;
    let clock = ManualClock::new(1_700_000_000_000);
    let store = Arc::new(
        SqliteStore::open_with_clock(dir.path(), cfg, Arc::new(clock.clone())).expect("open"),
    );
    Env {
        _dir: dir,
        store,
        clock,
    }
}

fn wcfg(id: &str) -> WorkerConfig {
    let mut c = WorkerConfig::from_config(&Config::default(), id, "vector");
    c.heartbeat = Duration::from_millis(50);
    c.default_rate_limit_pause = Duration::from_millis(1);
    // Several index writes per batch, so chunking is exercised everywhere.
    c.vector_upsert_batch_size = 5;
    c
}

fn worker(env: &Env, emb: Arc<dyn Embedder>, index: Arc<dyn VectorIndex>, id: &str) -> IndexWorker {
    IndexWorker::new(
        wcfg(id),
        env.store.clone(),
        emb,
        index,
        IndexProjector::default(),
    )
    .expect("worker")
}

fn uri(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("uri")
}

fn put(env: &Env, u: &str, abs: &str, content: &str) -> u64 {
    let req = PutRequest {
        abstract_text: Some(abs.into()),
        content: Some(content.into()),
        ..PutRequest::default()
    };
    env.store.put(&uri(u), req).expect("put").version
}

/// Runs the worker until nothing is runnable, advancing the clock over backoffs.
fn drain(env: &Env, w: &IndexWorker) {
    for _ in 0..200 {
        let r = w.run_once(100).expect("run_once");
        if r.claimed == 0 {
            let open = env
                .store
                .stats()
                .expect("stats")
                .iter()
                .map(|s| s.pending + s.claimed + s.retry_wait)
                .sum::<u64>();
            if open == 0 {
                return;
            }
            env.clock.advance(31_000);
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    panic!("outbox did not drain");
}

/// The projection of the whole source, as the index must hold it.
fn expected(env: &Env) -> BTreeMap<String, IndexRecord> {
    let p = IndexProjector::default();
    env.store
        .read_subtree(&CtxUri::root())
        .expect("read")
        .iter()
        .flat_map(|n| p.build_context_records(n).records)
        .map(|r| (r.id.clone(), r))
        .collect()
}

fn actual(index: &dyn VectorIndex) -> BTreeMap<String, IndexRecord> {
    index
        .list_under(&CtxUri::root())
        .expect("list")
        .into_iter()
        .map(|s| (s.record.id.clone(), s.record))
        .collect()
}

/// Vectors must be the embedding of the record's current text (no stale vector).
fn assert_vectors_match_text(index: &dyn VectorIndex) {
    for s in index.list_under(&CtxUri::root()).expect("list") {
        // Siblings may share a text (and so a vector): look for this record among the hits.
        let filter = SearchFilter {
            parent_uri: Some(s.record.parent_uri.clone()),
            level: Some(s.record.level),
            ..SearchFilter::default()
        };
        let hits = index
            .search(&TestEmbedder::vector(&s.record.text), &filter, 64)
            .expect("search");
        let own = hits
            .iter()
            .find(|h| h.record.id == s.record.id)
            .expect("record is searchable");
        assert!(
            own.score > 0.9999,
            "vector of {} is stale (score {})",
            s.record.id,
            own.score
        );
    }
}

#[test]
fn upsert_update_metadata_and_identical() {
    let env = env();
    let emb = TestEmbedder::new();
    let index = Arc::new(MemoryVectorIndex::new());
    let w = worker(&env, emb.clone(), index.clone(), "w1");
    put(&env, "ctx://acc/docs/a", "alpha", "alpha content");
    drain(&env, &w);
    assert_eq!(actual(index.as_ref()), expected(&env));
    assert_vectors_match_text(index.as_ref());
    let texts_after_create = emb.texts.load(Ordering::SeqCst);
    // abstract + content; the L1 fallback (content truncated) equals the content: one call.
    assert_eq!(texts_after_create, 2, "identical texts are embedded once");

    // Text change: only the changed text is embedded.
    put(&env, "ctx://acc/docs/a", "alpha", "new content");
    drain(&env, &w);
    assert_eq!(actual(index.as_ref()), expected(&env));
    assert_vectors_match_text(index.as_ref());
    assert_eq!(emb.texts.load(Ordering::SeqCst) - texts_after_create, 1);

    // Metadata-only change: zero embed calls, payload updated.
    let calls = emb.calls.load(Ordering::SeqCst);
    let mut req = PutRequest {
        mode: PutMode::Merge,
        ..PutRequest::default()
    };
    req.meta.insert("lang".into(), serde_json::json!("en"));
    env.store.put(&uri("ctx://acc/docs/a"), req).expect("meta");
    drain(&env, &w);
    assert_eq!(emb.calls.load(Ordering::SeqCst), calls);
    assert_eq!(actual(index.as_ref()), expected(&env));
    assert!(
        actual(index.as_ref())
            .values()
            .all(|r| r.filters.get("lang") == Some(&serde_json::json!("en")))
    );

    // Re-delivering the same state writes nothing and embeds nothing.
    let ev = env
        .store
        .list(&OutboxFilter {
            limit: Some(1),
            ..OutboxFilter::default()
        })
        .expect("list");
    env.store
        .append(ce_core::OutboxEventCreate {
            payload: ev[0].event.payload.clone(),
        })
        .expect("append");
    drain(&env, &w);
    assert_eq!(emb.calls.load(Ordering::SeqCst), calls);
}

#[test]
fn delete_move_and_stale_events() {
    let env = env();
    let emb = TestEmbedder::new();
    let index = Arc::new(MemoryVectorIndex::new());
    let w = worker(&env, emb.clone(), index.clone(), "w1");
    put(&env, "ctx://acc/docs/a", "alpha", "");
    put(&env, "ctx://acc/docs/b", "beta", "beta body");
    put(&env, "ctx://acc/docs/b/c", "gamma", "");
    drain(&env, &w);
    assert_eq!(actual(index.as_ref()), expected(&env));

    // mv: records follow with parent_uri rewritten and zero embed calls.
    let calls = emb.calls.load(Ordering::SeqCst);
    env.store
        .mv(&uri("ctx://acc/docs/b"), &uri("ctx://acc/archive/b"), None)
        .expect("mv");
    drain(&env, &w);
    assert_eq!(
        emb.calls.load(Ordering::SeqCst),
        calls,
        "a move must not re-embed"
    );
    assert_eq!(actual(index.as_ref()), expected(&env));
    let c = actual(index.as_ref())
        .into_values()
        .find(|r| r.uri.as_str() == "ctx://acc/archive/b/c")
        .expect("moved");
    assert_eq!(c.parent_uri.as_str(), "ctx://acc/archive/b");

    // rm -r: the subtree's records go.
    env.store
        .rm(&uri("ctx://acc/archive"), true, None, None)
        .expect("rm");
    drain(&env, &w);
    assert_eq!(actual(index.as_ref()), expected(&env));

    // A stale DELETE (node re-created at a newer version) deletes nothing; an UPSERT whose
    // node is gone deletes.
    env.store
        .rm(&uri("ctx://acc/docs/a"), false, None, None)
        .expect("rm");
    put(&env, "ctx://acc/docs/a", "alpha again", "");
    drain(&env, &w);
    assert_eq!(actual(index.as_ref()), expected(&env));
    assert!(
        actual(index.as_ref())
            .values()
            .any(|r| r.text == "alpha again")
    );
}

#[test]
fn compaction_acks_every_folded_event() {
    let env = env();
    let emb = TestEmbedder::new();
    let index = Arc::new(MemoryVectorIndex::new());
    let w = worker(&env, emb.clone(), index.clone(), "w1");
    for i in 0..5 {
        put(&env, "ctx://acc/x", &format!("v{i}"), "");
    }
    env.store
        .rm(&uri("ctx://acc/x"), false, None, None)
        .expect("rm");
    let r = w.run_once(100).expect("run");
    // ctx://acc (container) + 5 upserts + delete
    assert_eq!((r.claimed, r.succeeded), (7, 7));
    assert_eq!(
        emb.calls.load(Ordering::SeqCst),
        0,
        "everything folded into a delete"
    );
    assert!(actual(index.as_ref()).is_empty());
    let stats = env.store.stats().expect("stats");
    assert_eq!(stats[0].done, 7);
}

#[test]
fn error_matrix() {
    // Embed timeout, rate limit and 5xx are retryable; an invalid response is not.
    for (fault, status, retryable) in [
        (1u8, DeliveryStatus::RetryWait, true),
        (2, DeliveryStatus::RetryWait, true),
        (3, DeliveryStatus::RetryWait, true),
        (4, DeliveryStatus::Dead, false),
    ] {
        let env = env();
        let emb = TestEmbedder::with_faults(move |_| fault);
        let index = Arc::new(MemoryVectorIndex::new());
        let w = worker(&env, emb, index, "w1");
        put(&env, "ctx://acc/x", "text", "");
        let r = w.run_once(100).expect("run");
        assert_eq!(r.claimed, 2);
        assert_eq!(
            (r.retried > 0, r.failed > 0),
            (retryable, !retryable),
            "fault {fault}"
        );
        let rows = env
            .store
            .list(&OutboxFilter {
                status: Some(status),
                ..OutboxFilter::default()
            })
            .expect("list");
        assert_eq!(
            rows.len(),
            1,
            "fault {fault}: the node's event, not the container's"
        );
        assert!(rows[0].delivery.error_code.is_some());
        if fault == 2 {
            assert!(
                w.paused_for().is_some()
                    || rows[0].delivery.error_code.as_deref() == Some("rate_limited")
            );
        }
    }
    // Vector store unavailable: retryable.
    let env = env();
    let index = FlakyIndex::new(0.0, 1);
    index.failing.store(true, Ordering::SeqCst);
    let w = worker(&env, TestEmbedder::new(), index.clone(), "w1");
    put(&env, "ctx://acc/x", "text", "");
    let r = w.run_once(100).expect("run");
    // The container ctx://acc has no text, so it needs no write and succeeds.
    assert_eq!((r.retried, r.succeeded), (1, 1));
    index.failing.store(false, Ordering::SeqCst);
    drain(&env, &w);
    assert_eq!(actual(index.as_ref()), expected(&env));
    // Schema mismatch: a worker for another model refuses to start.
    let other = TestEmbedder::named("other", |_| 0);
    let err = IndexWorker::new(
        wcfg("w2"),
        env.store.clone(),
        other,
        index.clone(),
        IndexProjector::default(),
    )
    .err()
    .expect("mismatch");
    assert_eq!(err.code(), ce_core::ErrorCode::SchemaMismatch);
}

struct Panicky(AtomicU64);

impl WorkerCallbacks for Panicky {
    fn on_event_start(&self, _e: &OutboxEvent) -> Result<(), String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("callback panic");
    }
    fn on_event_success(&self, _e: &OutboxEvent, _ms: u64) -> Result<(), String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err("callback error".into())
    }
}

#[test]
fn callback_panics_and_errors_are_swallowed() {
    let env = env();
    let cb = Arc::new(Panicky(AtomicU64::new(0)));
    let w = worker(
        &env,
        TestEmbedder::new(),
        Arc::new(MemoryVectorIndex::new()),
        "w1",
    )
    .with_callback(cb.clone());
    put(&env, "ctx://acc/x", "text", "");
    let r = w.run_once(100).expect("run");
    assert_eq!(r.succeeded, 2);
    assert_eq!(cb.0.load(Ordering::SeqCst), 4);
}

#[test]
fn embedding_batches_respect_the_batch_size() {
    let env = env();
    let emb = TestEmbedder::new();
    let index = Arc::new(MemoryVectorIndex::new());
    let mut cfg = wcfg("w1");
    cfg.embed_batch_size = 8;
    let w = IndexWorker::new(
        cfg,
        env.store.clone(),
        emb.clone(),
        index.clone(),
        IndexProjector::default(),
    )
    .expect("worker");
    for i in 0..40 {
        put(
            &env,
            &format!("ctx://acc/d{i}"),
            &format!("abstract {i}"),
            &format!("content {i}"),
        );
    }
    drain(&env, &w);
    assert_eq!(emb.max_batch.load(Ordering::SeqCst), 8);
    assert_eq!(
        emb.texts.load(Ordering::SeqCst),
        80,
        "abstract and content per node"
    );
    assert_eq!(actual(index.as_ref()), expected(&env));
}

/// A worker target whose writes fail while `failing` is set or by a seeded rate.
struct FlakyTarget {
    inner: Arc<dyn IndexTarget>,
    failing: AtomicBool,
    rate: f64,
    rng: Mutex<StdRng>,
}

impl FlakyTarget {
    fn new(inner: Arc<dyn IndexTarget>, rate: f64, seed: u64) -> Arc<Self> {
        Arc::new(FlakyTarget {
            inner,
            failing: AtomicBool::new(false),
            rate,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        })
    }
}

impl IndexTarget for FlakyTarget {
    fn uses_vectors(&self) -> bool {
        self.inner.uses_vectors()
    }
    fn bind_model(&self, model: &ModelIdentity) -> crate::Result<()> {
        self.inner.bind_model(model)
    }
    fn get(&self, ids: &[String]) -> crate::Result<Vec<StoredRecord>> {
        self.inner.get(ids)
    }
    fn vectors(&self, ids: &[String]) -> crate::Result<Vec<(String, Vec<f32>)>> {
        self.inner.vectors(ids)
    }
    fn list_under(&self, uri: &CtxUri) -> crate::Result<Vec<StoredRecord>> {
        self.inner.list_under(uri)
    }
    fn write_nodes(
        &self,
        writes: Vec<NodeWrite>,
    ) -> crate::Result<Vec<crate::Result<SyncOutcome>>> {
        let roll = self.rng.lock().expect("rng").random::<f64>();
        if self.failing.load(Ordering::SeqCst) || roll < self.rate {
            return Err(IndexError::Unavailable("injected write failure".into()));
        }
        self.inner.write_nodes(writes)
    }
}

/// The convergence simulation (DESIGN.md §5), vector and keyword consumers together: random
/// put / update / metadata update / mv / rm / link / unlink with 4 concurrent workers per
/// consumer, embedder timeouts, rate limits and 5xx, index write failures, abandoned claims (a
/// worker killed mid-batch) and acks lost to lease expiry — and the keyword index failing
/// every write for a long stretch, during which the vector consumer still reaches lag 0.
/// After faults stop and the outbox drains, each index equals the projection exactly, and a
/// metadata-only update of every node then embeds nothing.
#[test]
fn convergence_with_concurrent_workers_and_faults() {
    let runs = ce_core::test_cases(3);
    for run in 0..runs {
        converge(ce_testkit::seed(&format!("convergence run {run}")));
    }
}

/// Deliveries of `consumer` still to apply.
fn open_of(env: &Env, consumer: &str) -> u64 {
    env.store
        .stats()
        .expect("stats")
        .iter()
        .find(|s| s.consumer == consumer)
        .map_or(0, |s| s.pending + s.claimed + s.retry_wait)
}

/// Advances time over leases and backoffs until `done` holds (bounded).
fn settle(env: &Env, seed: u64, what: &str, done: impl Fn() -> bool) {
    let mut rounds = 0;
    while !done() {
        rounds += 1;
        assert!(
            rounds < 2_000,
            "seed {seed}: {what}: {:?}",
            env.store.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
        env.clock.advance(31_000);
    }
}

/// Missing, extra and stale records of `got` against the projection `want`.
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

fn records_of(target: &dyn IndexTarget) -> BTreeMap<String, IndexRecord> {
    target
        .list_under(&CtxUri::root())
        .expect("list")
        .into_iter()
        .map(|s| (s.record.id.clone(), s.record))
        .collect()
}

fn converge(seed: u64) {
    let env = env_with(&["vector", "keyword"]);
    let faults_on = Arc::new(AtomicBool::new(true));
    let (f, clock) = (faults_on.clone(), env.clock.clone());
    let mut frng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let emb = TestEmbedder::with_faults(move |_| {
        if !f.load(Ordering::SeqCst) {
            return 0;
        }
        let roll: f64 = frng.random();
        if roll < 0.02 {
            // A pause long enough to lose the lease: the ack must be refused and redone.
            clock.advance(61_000);
        }
        match roll {
            r if r < 0.10 => 1,
            r if r < 0.15 => 2,
            r if r < 0.20 => 3,
            _ => 0,
        }
    });
    let index = FlakyIndex::new(0.05, seed);
    let keyword_index = Arc::new(crate::keyword::memory::MemoryKeywordIndex::new());
    let keyword = FlakyTarget::new(Arc::new(KeywordTarget(keyword_index)), 0.05, seed ^ 0x6b77);
    keyword.failing.store(true, Ordering::SeqCst);
    let mut workers: Vec<Arc<IndexWorker>> = (0..4)
        .map(|i| Arc::new(worker(&env, emb.clone(), index.clone(), &format!("v{i}"))))
        .collect();
    for i in 0..4 {
        let mut cfg = wcfg(&format!("k{i}"));
        cfg.consumer = "keyword".into();
        let w = IndexWorker::for_target(
            cfg,
            env.store.clone(),
            keyword.clone(),
            None,
            IndexProjector::default(),
        )
        .expect("keyword worker");
        workers.push(Arc::new(w));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = workers
        .iter()
        .map(|w| {
            let (w, stop) = (w.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if w.run_once(16).map(|r| r.claimed).unwrap_or(0) == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            })
        })
        .collect();

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
            // The end of the keyword index's outage: meanwhile the vector consumer caught up
            // completely, while every keyword write failed.
            settle(
                &env,
                seed,
                "vector did not catch up during the outage",
                || open_of(&env, "vector") == 0,
            );
            let keyword_stats = env
                .store
                .stats()
                .expect("stats")
                .into_iter()
                .find(|s| s.consumer == "keyword")
                .expect("keyword");
            assert!(
                keyword_stats.pending + keyword_stats.retry_wait + keyword_stats.dead > 0,
                "seed {seed}: the failing keyword consumer has nothing open: {keyword_stats:?}"
            );
            assert!(keyword_stats.last_error.is_some(), "{keyword_stats:?}");
            keyword.failing.store(false, Ordering::SeqCst);
            // What the outage made dead is requeued, as an operator would after the fix.
            env.store
                .requeue_dead(Some("keyword"), None)
                .expect("requeue");
        }
        let u = pick(&mut rng);
        match rng.random_range(0..100) {
            0..=44 => {
                let req = PutRequest {
                    abstract_text: Some(format!("abs {}", rng.random_range(0..20))),
                    content: Some(format!("content {}", rng.random_range(0..20))),
                    ..PutRequest::default()
                };
                let _ = env.store.put(&u, req);
            }
            45..=59 => {
                let mut req = PutRequest {
                    mode: PutMode::Merge,
                    ..PutRequest::default()
                };
                req.meta
                    .insert("k".into(), serde_json::json!(rng.random_range(0..5)));
                let _ = env.store.put(&u, req);
            }
            60..=71 => {
                let _ = env.store.mv(&u, &pick(&mut rng), None);
            }
            72..=82 => {
                let _ = env.store.rm(&u, true, None, None);
            }
            83..=89 => {
                let _ = env.store.link(LinkRequest {
                    from: u,
                    to: pick(&mut rng),
                    relation_type: "rel".into(),
                    weight: 1.0,
                    reason: String::new(),
                    trace_id: None,
                });
            }
            90..=94 => {
                let _ = env.store.unlink(&u, &pick(&mut rng), "rel", None);
            }
            _ => {
                // A worker killed mid-batch: claims taken and never acknowledged.
                let consumer = if rng.random_bool(0.5) {
                    "vector"
                } else {
                    "keyword"
                };
                let _ = env.store.claim_batch(consumer, &format!("dead-{i}"), 3);
            }
        }
        if i % 25 == 0 {
            env.clock.advance(rng.random_range(0..5_000));
        }
    }
    faults_on.store(false, Ordering::SeqCst);
    let all_open = || open_of(&env, "vector") + open_of(&env, "keyword") == 0;
    settle(&env, seed, "outbox did not drain", all_open);
    let dead = env
        .store
        .list(&OutboxFilter {
            status: Some(DeliveryStatus::Dead),
            ..OutboxFilter::default()
        })
        .expect("dead");
    assert!(
        dead.is_empty(),
        "seed {seed}: only retryable faults were injected, yet {} dead",
        dead.len()
    );
    let check = |phase: &str| {
        let want = expected(&env);
        for (name, got) in [
            ("vector", actual(index.as_ref())),
            ("keyword", records_of(keyword.as_ref())),
        ] {
            let (missing, extra, stale) = diff(&want, &got);
            assert!(
                missing.is_empty() && extra.is_empty() && stale.is_empty(),
                "seed {seed}, {phase}, {name}: missing {missing:?} extra {extra:?} stale {stale:?}"
            );
        }
        // Both consumers are applied_valid: lag 0 and nothing dead.
        for s in env.store.stats().expect("stats") {
            assert_eq!(
                (s.pending + s.claimed + s.retry_wait, s.dead),
                (0, 0),
                "seed {seed}, {phase}: {s:?}"
            );
        }
    };
    check("after the faults");
    assert_vectors_match_text(index.as_ref());

    // A metadata-only update of every node with text: both indexes follow, nothing is embedded.
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
    settle(&env, seed, "meta-only updates did not drain", all_open);
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("worker thread");
    }
    check("after the metadata-only updates");
    assert_eq!(
        emb.texts.load(Ordering::SeqCst),
        texts_before,
        "seed {seed}: a metadata-only update was embedded"
    );
}
