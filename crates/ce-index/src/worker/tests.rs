//! Worker tests: every branch of spec §5.2/§5.5, compaction, the §8.4 error matrix,
//! callbacks and batching. The convergence simulation with concurrent workers and faults over
//! all three consumers is `tests/integration/convergence.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ce_core::{
    Classify as _, Config, CtxUri, DeliveryStatus, IndexProjector, IndexRecord, OutboxEvent,
};
use ce_embed::{EmbedError, Embedder, ModelIdentity};
use ce_store::{ContextFs as _, OutboxFilter, OutboxStore as _, PutMode, PutRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::testkit::{Env, drain};
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

fn env() -> Env {
    Env::new("vector")
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
