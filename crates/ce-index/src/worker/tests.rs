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
    NodeRecord, NodeWrite, SearchFilter, StoredRecord, StoredVector, SyncOutcome, VectorHit,
    VectorRecord,
};

/// Decides the fault of one embedding call: 0 ok, 1 timeout, 2 rate limit, 3 5xx, 4 permanent
/// (invalid response), 5 the provider refuses the request (HTTP 400).
type FaultScript = Box<dyn FnMut(&[&str]) -> u8 + Send>;

/// What the test provider answers when it refuses a request.
const REFUSAL: &str = "input refused by the provider";

/// A deterministic embedder with call counting and scripted faults. Like a real provider, a
/// rate limit pauses it for the wait it asks for (every worker sharing it then holds back),
/// unless it is built without a pause of its own ([`TestEmbedder::asking`]).
struct TestEmbedder {
    id: ModelIdentity,
    calls: AtomicU64,
    texts: AtomicU64,
    max_batch: AtomicU64,
    faults: Mutex<FaultScript>,
    rate_limit_wait: Duration,
    /// The provider's shared pause; `None` for a provider that keeps none.
    pause: Option<ce_embed::RateLimitPause>,
}

impl TestEmbedder {
    fn new() -> Arc<Self> {
        Self::with_faults(|_| 0)
    }

    fn with_faults(f: impl FnMut(&[&str]) -> u8 + Send + 'static) -> Arc<Self> {
        Self::named("bytes-8", f)
    }

    fn named(model: &str, f: impl FnMut(&[&str]) -> u8 + Send + 'static) -> Arc<Self> {
        Self::build(model, Duration::from_millis(1), true, f)
    }

    /// An embedder whose rate limits ask for `wait` and pause it for that long.
    fn pausing(wait: Duration, f: impl FnMut(&[&str]) -> u8 + Send + 'static) -> Arc<Self> {
        Self::build("bytes-8", wait, true, f)
    }

    /// An embedder whose rate limits ask for `wait` but that keeps no pause of its own
    /// ([`Embedder::paused_for`] stays `None`): only the worker's own pause holds it back.
    fn asking(wait: Duration, f: impl FnMut(&[&str]) -> u8 + Send + 'static) -> Arc<Self> {
        Self::build("bytes-8", wait, false, f)
    }

    fn build(
        model: &str,
        rate_limit_wait: Duration,
        shared_pause: bool,
        f: impl FnMut(&[&str]) -> u8 + Send + 'static,
    ) -> Arc<Self> {
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
            rate_limit_wait,
            pause: shared_pause.then(ce_embed::RateLimitPause::default),
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

    fn paused_for(&self) -> Option<Duration> {
        self.pause.as_ref()?.remaining()
    }

    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.max_batch
            .fetch_max(texts.len() as u64, Ordering::SeqCst);
        let fault = (self.faults.lock().expect("faults"))(texts);
        match fault {
            1 => return Err(EmbedError::Timeout { after: timeout }),
            2 => {
                if let Some(p) = &self.pause {
                    p.extend(self.rate_limit_wait);
                }
                return Err(EmbedError::RateLimited {
                    retry_after: Some(self.rate_limit_wait),
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
            5 => {
                return Err(EmbedError::Provider {
                    status: Some(400),
                    message: REFUSAL.into(),
                    retryable: false,
                });
            }
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
    /// Calls of `finish_bulk` (which fails while `failing` is set).
    bulk_finished: AtomicU64,
}

impl FlakyIndex {
    fn new(rate: f64, seed: u64) -> Arc<Self> {
        Arc::new(FlakyIndex {
            inner: MemoryVectorIndex::new(),
            failing: AtomicBool::new(false),
            rate,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            bulk_finished: AtomicU64::new(0),
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
    fn write_nodes(&self, writes: &[NodeWrite]) -> crate::Result<Vec<crate::Result<SyncOutcome>>> {
        self.fault()?;
        Ok(writes.iter().map(|w| w.apply_to(self)).collect())
    }
    fn get(&self, uris: &[CtxUri]) -> crate::Result<Vec<StoredRecord>> {
        self.inner.get(uris)
    }
    fn vectors(&self, uris: &[CtxUri]) -> crate::Result<Vec<StoredVector>> {
        self.inner.vectors(uris)
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
    fn finish_bulk(&self) -> crate::Result<()> {
        self.bulk_finished.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(IndexError::Unavailable(
                "injected bulk build failure".into(),
            ));
        }
        Ok(())
    }
    fn bulk_pending(&self) -> bool {
        true
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
    by_id(index.list_under(&CtxUri::root()).expect("list"))
}

/// Stored records by id.
fn by_id(stored: Vec<StoredRecord>) -> BTreeMap<String, IndexRecord> {
    stored
        .into_iter()
        .map(|s| (s.record.id.clone(), s.record))
        .collect()
}

/// Each stored vector is the embedding of its record's current text (no stale vector), read
/// with that text's hash.
fn assert_vectors_match_text(index: &dyn VectorIndex) {
    let stored = index.list_under(&CtxUri::root()).expect("list");
    let uris: Vec<CtxUri> = stored
        .iter()
        .map(|s| s.record.uri.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let vectors: BTreeMap<String, StoredVector> = index
        .vectors(&uris)
        .expect("vectors")
        .into_iter()
        .map(|v| (v.id.clone(), v))
        .collect();
    for s in stored {
        let v = vectors
            .get(&s.record.id)
            .expect("every record has a vector");
        assert_eq!(
            (&v.vector, v.text_hash.as_deref()),
            (
                &ce_embed::half::round(&TestEmbedder::vector(&s.record.text)),
                s.record
                    .metadata
                    .get("content_hash")
                    .and_then(|h| h.as_str())
            ),
            "the vector of {} level {} is not its text's",
            s.record.uri,
            s.record.level
        );
    }
}

#[test]
fn an_empty_queue_finishes_the_bulk_load() {
    let env = env();
    let index = FlakyIndex::new(0.0, 1);
    let w = worker(&env, TestEmbedder::new(), index.clone(), "w1");
    put(&env, "ctx://acc/docs/a", "alpha", "alpha content");
    put(&env, "ctx://acc/docs/b", "beta", "beta content");
    // Another worker holds the whole queue: an empty claim is not the end of the load.
    let held = env
        .store
        .claim_batch("vector", "other", 100)
        .expect("claim");
    assert!(!held.is_empty());
    assert_eq!(w.run_once(1).expect("run_once").claimed, 0);
    assert_eq!(
        index.bulk_finished.load(Ordering::SeqCst),
        0,
        "claimed elsewhere"
    );
    // Its leases expire; this worker does the work.
    env.clock.advance(120_000);
    let mut batches = 0;
    while w.run_once(1).expect("run_once").claimed > 0 {
        assert_eq!(index.bulk_finished.load(Ordering::SeqCst), 0, "work left");
        batches += 1;
    }
    assert!(batches >= 2, "{batches}");
    assert_eq!(index.bulk_finished.load(Ordering::SeqCst), 1, "queue empty");
    // A failed build is logged, not a failed claim, and is tried again at the next one.
    index.failing.store(true, Ordering::SeqCst);
    assert_eq!(w.run_once(1).expect("run_once").claimed, 0);
    assert_eq!(index.bulk_finished.load(Ordering::SeqCst), 2);
    assert_eq!(actual(index.as_ref()), expected(&env));
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
        // A rate limit asks for an hour: long enough to observe the pause. The provider keeps
        // no pause of its own, so any pause seen is the one the worker recorded.
        let emb = TestEmbedder::asking(Duration::from_secs(3600), move |_| fault);
        let index = Arc::new(MemoryVectorIndex::new());
        let w = worker(&env, emb.clone(), index, "w1");
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
            assert_eq!(rows[0].delivery.error_code.as_deref(), Some("rate_limited"));
            assert_eq!(emb.paused_for(), None, "the provider keeps no pause");
            let pause = w.paused_for().expect("a rate limit pauses the worker");
            assert!(
                pause > Duration::from_secs(3500),
                "the worker pauses for the provider's Retry-After: {pause:?}"
            );
            // While paused the worker claims nothing, even with new work ready.
            put(&env, "ctx://acc/y", "more text", "");
            let calls = emb.calls.load(Ordering::SeqCst);
            assert_eq!(w.run_once(100).expect("run").claimed, 0);
            assert_eq!(emb.calls.load(Ordering::SeqCst), calls);
        } else {
            assert_eq!(w.paused_for(), None, "fault {fault} does not pause");
        }
    }
    // Vector store unavailable: retryable.
    let env = env();
    let index = FlakyIndex::new(0.0, 1);
    index.failing.store(true, Ordering::SeqCst);
    let w = worker(&env, TestEmbedder::new(), index.clone(), "w1");
    put(&env, "ctx://acc/x", "text", "");
    let r = w.run_once(100).expect("run");
    // The container ctx://acc has no text, but its write records its version (VX1): both
    // events retry.
    assert_eq!((r.retried, r.succeeded), (2, 0));
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

/// The dead deliveries: URI → last error.
fn dead(env: &Env) -> BTreeMap<String, String> {
    env.store
        .list(&OutboxFilter {
            status: Some(DeliveryStatus::Dead),
            limit: Some(1000),
            ..OutboxFilter::default()
        })
        .expect("list")
        .into_iter()
        .map(|r| {
            (
                r.event.uri.to_string(),
                r.delivery.last_error.unwrap_or_default(),
            )
        })
        .collect()
}

/// 32 leaves `ctx://acc/d/n{i}`, each with one distinct text; those in `refused` carry
/// "POISON". Returns the URIs of the refused ones, sorted.
fn seed_32(env: &Env, refused: &[usize]) -> Vec<String> {
    let mut poisoned = Vec::new();
    for i in 0..32 {
        let u = format!("ctx://acc/d/n{i}");
        let mark = if refused.contains(&i) {
            poisoned.push(u.clone());
            " POISON"
        } else {
            ""
        };
        put(env, &u, &format!("text {i}{mark}"), "");
    }
    poisoned.sort();
    poisoned
}

/// The records expected of every node except `without`.
fn expected_without(env: &Env, without: &[String]) -> BTreeMap<String, IndexRecord> {
    expected(env)
        .into_iter()
        .filter(|(_, r)| !without.contains(&r.uri.to_string()))
        .collect()
}

/// Refuses (HTTP 400) every call that holds a POISON text.
fn refuse_poison(texts: &[&str]) -> u8 {
    if texts.iter().any(|t| t.contains("POISON")) {
        5
    } else {
        0
    }
}

#[test]
fn one_refused_text_fails_only_its_own_node() {
    for refused in [vec![17], vec![0, 9, 31]] {
        let env = env();
        let emb = TestEmbedder::with_faults(refuse_poison);
        let index = Arc::new(MemoryVectorIndex::new());
        let w = worker(&env, emb.clone(), index.clone(), "w1");
        let poisoned = seed_32(&env, &refused);
        let total = drain(&env, &w);
        // One call of 32 texts, split until each refused text is alone: k refused of 32 cost
        // at most 2k·log₂32 more calls.
        let k = refused.len() as u64;
        let calls = emb.calls.load(Ordering::SeqCst);
        assert!(calls <= 1 + 10 * k, "{refused:?}: {calls} embedding calls");
        assert_eq!(emb.max_batch.load(Ordering::SeqCst), 32, "one batched call");
        let dead = dead(&env);
        assert_eq!(
            dead.keys().cloned().collect::<Vec<_>>(),
            poisoned,
            "only the refused nodes are dead"
        );
        assert!(dead.values().all(|e| e.contains(REFUSAL)), "{dead:?}");
        assert_eq!(total.failed, refused.len());
        assert_eq!(total.retried, 0, "a permanent refusal is not retried");
        assert_eq!(actual(index.as_ref()), expected_without(&env, &poisoned));
        assert_vectors_match_text(index.as_ref());
    }
}

#[test]
fn a_503_then_400_batch_retries_then_fails_only_the_refused_node() {
    let env = env();
    let mut first = true;
    let emb = TestEmbedder::with_faults(move |texts| {
        if std::mem::take(&mut first) {
            3
        } else {
            refuse_poison(texts)
        }
    });
    let index = Arc::new(MemoryVectorIndex::new());
    let w = worker(&env, emb, index.clone(), "w1");
    let poisoned = seed_32(&env, &[5]);
    let first_run = w.run_once(100).expect("run");
    // The 503 is retryable: the whole call's events retry, unsplit.
    assert_eq!(first_run.retried, 32, "{first_run:?}");
    assert!(dead(&env).is_empty());
    drain(&env, &w);
    assert_eq!(dead(&env).keys().cloned().collect::<Vec<_>>(), poisoned);
    assert_eq!(actual(index.as_ref()), expected_without(&env, &poisoned));
}

#[test]
fn rate_limits_and_timeouts_are_never_split() {
    for fault in [1u8, 2, 3] {
        let env = env();
        let emb = TestEmbedder::with_faults(move |_| fault);
        let index = Arc::new(MemoryVectorIndex::new());
        let w = worker(&env, emb.clone(), index, "w1");
        seed_32(&env, &[]);
        let r = w.run_once(100).expect("run");
        assert_eq!(r.retried, 32, "fault {fault}: {r:?}");
        assert_eq!(
            emb.calls.load(Ordering::SeqCst),
            1,
            "fault {fault}: one call"
        );
    }
}

/// The write step of a [`HookedTarget`].
type WriteHook = dyn Fn(&dyn IndexTarget, &[NodeWrite]) -> crate::Result<Vec<crate::Result<SyncOutcome>>>
    + Send
    + Sync;

/// What a [`HookedTarget`] runs after each of its record or vector reads, with the ids read.
type ReadHook = dyn Fn(&[CtxUri]) + Send + Sync;

/// A target whose batched writes go through `write`, and which runs `after_read` after each
/// `get` and `vectors`; every other call goes straight to `inner`.
struct HookedTarget {
    inner: Arc<dyn IndexTarget>,
    write: Box<WriteHook>,
    after_read: Box<ReadHook>,
}

impl HookedTarget {
    fn new(
        inner: Arc<dyn IndexTarget>,
        write: impl Fn(&dyn IndexTarget, &[NodeWrite]) -> crate::Result<Vec<crate::Result<SyncOutcome>>>
        + Send
        + Sync
        + 'static,
    ) -> Arc<Self> {
        Arc::new(HookedTarget {
            inner,
            write: Box::new(write),
            after_read: Box::new(|_| {}),
        })
    }

    /// Writes go straight to `inner`; `after_read` runs after each read.
    fn reading(
        inner: Arc<dyn IndexTarget>,
        after_read: impl Fn(&[CtxUri]) + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(HookedTarget {
            inner,
            write: Box::new(|inner, writes| inner.write_nodes(writes)),
            after_read: Box::new(after_read),
        })
    }
}

impl IndexTarget for HookedTarget {
    fn kind(&self) -> IndexKind {
        self.inner.kind()
    }
    fn uses_vectors(&self) -> bool {
        self.inner.uses_vectors()
    }
    fn bind_model(&self, model: &ModelIdentity) -> crate::Result<()> {
        self.inner.bind_model(model)
    }
    fn get(&self, uris: &[CtxUri]) -> crate::Result<Vec<StoredRecord>> {
        let read = self.inner.get(uris);
        (self.after_read)(uris);
        read
    }
    fn vectors(&self, uris: &[CtxUri]) -> crate::Result<Vec<StoredVector>> {
        let read = self.inner.vectors(uris);
        (self.after_read)(uris);
        read
    }
    fn list_under(&self, uri: &CtxUri) -> crate::Result<Vec<StoredRecord>> {
        self.inner.list_under(uri)
    }
    fn write_nodes(&self, writes: &[NodeWrite]) -> crate::Result<Vec<crate::Result<SyncOutcome>>> {
        (self.write)(self.inner.as_ref(), writes)
    }
    fn bulk_removals(&self) -> bool {
        self.inner.bulk_removals()
    }
    fn write_records(&self, configured: usize) -> usize {
        self.inner.write_records(configured)
    }
}

/// The vector index's batch size (5 records here) does not cut the keyword index's writes: a
/// claimed batch is one transaction (each commit rewrites the blocks of every term it touches).
#[test]
fn a_keyword_worker_writes_a_claimed_batch_at_once() {
    use crate::keyword::KeywordIndex as _;
    use crate::keyword::memory::MemoryKeywordIndex;

    let env = Env::new("keyword");
    let mut cfg = WorkerConfig::from_config(&Config::default(), "w", "keyword");
    cfg.vector_upsert_batch_size = 5;
    let index = Arc::new(MemoryKeywordIndex::new());
    let writes = Arc::new(Mutex::new(Vec::new()));
    let seen = writes.clone();
    let w = IndexWorker::for_target(
        cfg,
        env.store.clone(),
        HookedTarget::new(
            Arc::new(KeywordTarget(index.clone())),
            move |inner, batch| {
                let records = batch
                    .iter()
                    .map(|w| match w {
                        NodeWrite::Sync { records, .. } => records.len(),
                        _ => 0,
                    })
                    .sum::<usize>();
                seen.lock().expect("writes").push(records);
                inner.write_nodes(batch)
            },
        ),
        None,
        IndexProjector::default(),
    )
    .expect("worker");
    for i in 0..40 {
        put(
            &env,
            &format!("ctx://acc/d/n{i}"),
            &format!("abstract {i}"),
            &format!("content {i}"),
        );
    }
    let r = w.run_once(100).expect("run");
    // The 40 nodes and their two parents.
    assert_eq!((r.claimed, r.failed), (42, 0), "{r:?}");
    let writes = writes.lock().expect("writes").clone();
    assert_eq!(writes.len(), 1, "one write for the batch: {writes:?}");
    assert!(writes[0] >= 80, "two records a node at least: {writes:?}");
    let held = by_id(index.list_under(&CtxUri::root()).expect("list"));
    assert_eq!(held, expected(&env));
}

/// A running worker's claims grow while the queue is deep and its rounds are fast, up to
/// `max_inflight_events`, and every event is applied once (`ClaimSize`, with round times no
/// machine misses: the sizing itself is tested in `claim_size`).
#[test]
fn a_running_worker_claims_more_from_a_deep_queue_up_to_its_inflight_bound() {
    use crate::keyword::KeywordIndex as _;
    use crate::keyword::memory::MemoryKeywordIndex;

    let env = Env::new("keyword");
    let mut cfg = WorkerConfig::from_config(&Config::default(), "w", "keyword");
    cfg.claim_limit = 10;
    cfg.max_inflight_events = 60;
    let index = Arc::new(MemoryKeywordIndex::new());
    let w = IndexWorker::for_target(
        cfg,
        env.store.clone(),
        Arc::new(KeywordTarget(index.clone())),
        None,
        IndexProjector::default(),
    )
    .expect("worker")
    .with_claim_size(
        ClaimSize::new(10, 60).with_round_times(Duration::from_secs(3600), Duration::MAX),
    );
    for i in 0..300 {
        put(
            &env,
            &format!("ctx://acc/d/n{i}"),
            &format!("abstract {i}"),
            &format!("content {i}"),
        );
    }
    let mut rounds = Vec::new();
    loop {
        let r = w.run_next().expect("round");
        if r.claimed == 0 {
            break;
        }
        assert_eq!(r.failed + r.retried, 0, "{r:?}");
        rounds.push(r.claimed);
    }
    // 300 nodes and their two parents.
    assert_eq!(rounds.iter().sum::<usize>(), 302, "{rounds:?}");
    assert_eq!(
        &rounds[..4],
        &[10, 20, 40, 60],
        "doubling from claim_limit: {rounds:?}"
    );
    assert!(rounds.iter().all(|&n| n <= 60), "{rounds:?}");
    assert_eq!(w.run_once(100).expect("run").claimed, 0);
    let held = by_id(index.list_under(&CtxUri::root()).expect("list"));
    assert_eq!(held, expected(&env));
}

#[test]
fn a_refused_batched_write_fails_only_the_refused_nodes() {
    let env = env();
    let index = Arc::new(MemoryVectorIndex::new());
    let mut cfg = wcfg("w1");
    cfg.vector_upsert_batch_size = 128;
    let w = IndexWorker::for_target(
        cfg,
        env.store.clone(),
        // Batched writes holding a node whose URI contains "poison" are refused for good (a
        // non-retryable index error).
        HookedTarget::new(Arc::new(VectorTarget(index.clone())), |inner, writes| {
            if let Some(w) = writes.iter().find(|w| w.uri().as_str().contains("poison")) {
                return Err(IndexError::Corrupt(format!("cannot store {}", w.uri())));
            }
            inner.write_nodes(writes)
        }),
        Some(TestEmbedder::new()),
        IndexProjector::default(),
    )
    .expect("worker");
    let mut refused = Vec::new();
    for i in 0..32 {
        let u = if i == 3 || i == 20 {
            refused.push(format!("ctx://acc/d/poison{i}"));
            refused.sort();
            format!("ctx://acc/d/poison{i}")
        } else {
            format!("ctx://acc/d/n{i}")
        };
        put(&env, &u, &format!("text {i}"), "");
    }
    let total = drain(&env, &w);
    let dead = dead(&env);
    assert_eq!(dead.keys().cloned().collect::<Vec<_>>(), refused);
    assert!(
        dead.values().all(|e| e.contains("cannot store")),
        "{dead:?}"
    );
    assert_eq!(total.failed, 2);
    assert_eq!(actual(index.as_ref()), expected_without(&env, &refused));
}

#[test]
fn a_provider_pause_holds_back_every_worker_sharing_it() {
    let env = env();
    let mut first = true;
    let emb = TestEmbedder::pausing(Duration::from_secs(3600), move |_| {
        if std::mem::take(&mut first) { 2 } else { 0 }
    });
    let index = Arc::new(MemoryVectorIndex::new());
    let w1 = worker(&env, emb.clone(), index.clone(), "w1");
    let w2 = worker(&env, emb.clone(), index, "w2");
    put(&env, "ctx://acc/a", "alpha", "");
    assert_eq!(w1.run_once(100).expect("run").retried, 1);
    // w2 never saw the 429, yet the provider's pause holds it back: no second call.
    put(&env, "ctx://acc/b", "beta", "");
    let pause = w2.paused_for().expect("the provider's pause is shared");
    assert!(pause > Duration::from_secs(3500), "{pause:?}");
    assert_eq!(w2.run_once(100).expect("run").claimed, 0);
    assert_eq!(
        emb.calls.load(Ordering::SeqCst),
        1,
        "one request per window"
    );
}

#[test]
fn a_node_changing_while_it_is_indexed_is_superseded_not_failed() {
    // Every embedding call races a write of the node (the writer always wins), 12 times.
    let env = env();
    let store = env.store.clone();
    let mut writes_left = 12;
    let emb = TestEmbedder::with_faults(move |_| {
        if writes_left > 0 {
            writes_left -= 1;
            let req = PutRequest {
                abstract_text: Some(format!("hot {writes_left}")),
                ..PutRequest::default()
            };
            store.put(&uri("ctx://acc/hot"), req).expect("racing put");
        }
        0
    });
    let index = Arc::new(MemoryVectorIndex::new());
    let w = worker(&env, emb, index.clone(), "w1");
    put(&env, "ctx://acc/hot", "hot start", "");
    let total = drain(&env, &w);
    assert_eq!(
        (total.failed, total.retried),
        (0, 0),
        "a superseded delivery is done, never failed: {total:?}"
    );
    assert!(dead(&env).is_empty());
    assert_eq!(actual(index.as_ref()), expected(&env));
    let node = env
        .store
        .read_node(&uri("ctx://acc/hot"))
        .expect("read")
        .expect("node");
    let stored = index.get(&[uri("ctx://acc/hot")]).expect("get");
    assert_eq!(
        stored[0].node_version, node.version,
        "the index ends at the last version"
    );
    assert_eq!(stored[0].record.text, "hot 0");
}

#[test]
fn a_hot_node_written_by_several_threads_leaves_no_dead_delivery() {
    let env = env();
    // A slow embedder widens the window in which the node changes under the worker.
    let emb = TestEmbedder::with_faults(|_| {
        std::thread::sleep(Duration::from_millis(2));
        0
    });
    let index = Arc::new(MemoryVectorIndex::new());
    let workers: Vec<Arc<IndexWorker>> = (0..2)
        .map(|i| Arc::new(worker(&env, emb.clone(), index.clone(), &format!("w{i}"))))
        .collect();
    put(&env, "ctx://acc/hot", "hot start", "");
    let stop = Arc::new(AtomicBool::new(false));
    let running: Vec<_> = workers
        .iter()
        .map(|w| {
            let (w, stop) = (w.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut total = IndexBatchResult::default();
                while !stop.load(Ordering::SeqCst) {
                    let r = w.run_once(100).expect("run_once");
                    total.failed += r.failed;
                    total.retried += r.retried;
                }
                total
            })
        })
        .collect();
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let store = env.store.clone();
            std::thread::spawn(move || {
                for i in 0..150 {
                    let req = PutRequest {
                        mode: PutMode::Merge,
                        abstract_text: Some(format!("writer {t} line {i}")),
                        ..PutRequest::default()
                    };
                    store.put(&uri("ctx://acc/hot"), req).expect("put");
                }
            })
        })
        .collect();
    for h in writers {
        h.join().expect("writer");
    }
    let mut failures = 0;
    stop.store(true, Ordering::SeqCst);
    for h in running {
        let t = h.join().expect("worker");
        failures += t.failed + t.retried;
    }
    drain(&env, &workers[0]);
    assert!(dead(&env).is_empty(), "dead: {:?}", dead(&env));
    assert_eq!(failures, 0, "no delivery failed");
    assert_eq!(
        actual(index.as_ref()),
        expected(&env),
        "the index ends at the last version"
    );
}

/// The race the convergence simulation found: a worker reads that the source never held
/// `x` (the `purge_missing` of a URI not created yet) and purges it; meanwhile `x` is created
/// and another worker applies its event; the purge lands after that sync. The purging worker
/// must then sync `x` itself — no later event would.
#[test]
fn a_purge_that_lands_after_the_uri_was_created_and_synced_is_undone() {
    use crate::keyword::KeywordIndex as _;
    use crate::keyword::memory::MemoryKeywordIndex;

    let env = Env::new("keyword");
    let cfg = |id: &str| WorkerConfig::from_config(&Config::default(), id, "keyword");
    let index = Arc::new(MemoryKeywordIndex::new());
    let x = uri("ctx://acc/x");
    env.store.purge_missing(&x, None).expect("purge_missing");
    let (store, other, created) = (env.store.clone(), index.clone(), x.clone());
    let once = std::sync::Once::new();
    let meanwhile = move || {
        let req = PutRequest {
            abstract_text: Some("created meanwhile".into()),
            content: Some("the node the purge must not hide".into()),
            ..PutRequest::default()
        };
        store.put(&created, req).expect("put");
        let w2 = IndexWorker::for_target(
            cfg("w2"),
            store.clone(),
            Arc::new(KeywordTarget(other.clone())),
            None,
            IndexProjector::default(),
        )
        .expect("worker");
        let r = w2.run_once(100).expect("run");
        assert_eq!((r.claimed, r.failed), (2, 0), "{r:?}");
        assert!(
            !other.list_under(&created).expect("list").is_empty(),
            "w2 synced x"
        );
    };
    let w1 = IndexWorker::for_target(
        cfg("w1"),
        env.store.clone(),
        // Just before the purge is written: x is created and another worker syncs it.
        HookedTarget::new(
            Arc::new(KeywordTarget(index.clone())),
            move |inner, writes| {
                if writes.iter().any(|w| matches!(w, NodeWrite::Purge { .. })) {
                    once.call_once(&meanwhile);
                }
                inner.write_nodes(writes)
            },
        ),
        None,
        IndexProjector::default(),
    )
    .expect("worker");
    let r = w1.run_once(100).expect("run");
    assert_eq!((r.claimed, r.succeeded), (1, 1), "{r:?}");
    let held = by_id(index.list_under(&CtxUri::root()).expect("list"));
    assert!(!held.is_empty());
    assert_eq!(held, expected(&env), "x is indexed after the late purge");
}

/// The race the convergence simulation found next: worker A reads node `c/d` with text and
/// is slow to write it; meanwhile `c/d` is moved away and a container is created at its URI,
/// and worker B applies both. B's write of the container (no records, and the index held none
/// for `c/d`) must record its version, so that A's older write, landing last, is refused.
#[test]
fn an_older_write_landing_after_a_container_took_the_uri_is_refused() {
    use crate::keyword::KeywordIndex as _;
    use crate::keyword::memory::MemoryKeywordIndex;

    let env = Env::new("keyword");
    let cfg = |id: &str| WorkerConfig::from_config(&Config::default(), id, "keyword");
    let index = Arc::new(MemoryKeywordIndex::new());
    let keyword = |id: &str, target: Arc<dyn IndexTarget>| {
        IndexWorker::for_target(
            cfg(id),
            env.store.clone(),
            target,
            None,
            IndexProjector::default(),
        )
        .expect("worker")
    };
    // c/d starts as a container (created with c/d/z), then gets text.
    put(&env, "ctx://acc/c/d/z", "z", "z");
    drain(&env, &keyword("w0", Arc::new(KeywordTarget(index.clone()))));
    put(&env, "ctx://acc/c/d", "d's abstract", "d's content");
    let store = env.store.clone();
    let b = keyword("b", Arc::new(KeywordTarget(index.clone())));
    let once = std::sync::Once::new();
    let d = uri("ctx://acc/c/d");
    let a = keyword(
        "a",
        // Just before A writes c/d: the move, the container, and B applying them.
        HookedTarget::new(
            Arc::new(KeywordTarget(index.clone())),
            move |inner, writes| {
                if writes.iter().any(|w| w.uri() == &d) {
                    once.call_once(|| {
                        store.mv(&d, &uri("ctx://acc/c/x"), None).expect("mv");
                        let req = PutRequest {
                            content: Some("b".into()),
                            ..PutRequest::default()
                        };
                        store.put(&uri("ctx://acc/c/d/b"), req).expect("put");
                        let r = b.run_once(100).expect("b");
                        assert_eq!(r.failed, 0, "{r:?}");
                    });
                }
                inner.write_nodes(writes)
            },
        ),
    );
    let r = a.run_once(100).expect("a");
    assert_eq!((r.claimed, r.failed), (1, 0), "{r:?}");
    let held = by_id(index.list_under(&CtxUri::root()).expect("list"));
    assert!(!held.is_empty(), "the index holds the moved node");
    assert_eq!(
        held,
        expected(&env),
        "no record of the moved node is left at c/d"
    );
}

/// The race the convergence simulation found on 2026-12-06: worker A applies a move and looks
/// up the vectors left at the source URI to reuse them for the same texts; between A's reads,
/// a node with another text is created at the source URI and worker B indexes it. A must not
/// lend B's vector to the moved text (it did when it read the source's records and their
/// vectors in two calls).
#[test]
fn a_moved_node_never_takes_the_vector_of_a_text_written_at_its_source_meanwhile() {
    let env = env();
    let emb = TestEmbedder::new();
    let index = Arc::new(MemoryVectorIndex::new());
    put(&env, "ctx://acc/a", "alpha", "alpha's content");
    drain(&env, &worker(&env, emb.clone(), index.clone(), "w0"));
    env.store
        .mv(&uri("ctx://acc/a"), &uri("ctx://acc/b"), None)
        .expect("mv");

    let store = env.store.clone();
    let b = worker(&env, emb.clone(), index.clone(), "b");
    let source = uri("ctx://acc/a");
    let once = std::sync::Once::new();
    let a = IndexWorker::for_target(
        wcfg("a"),
        env.store.clone(),
        // Right after A reads anything stored at the source URI: a is re-created with another
        // text, and B indexes it.
        HookedTarget::reading(Arc::new(VectorTarget(index.clone())), move |uris| {
            if uris.contains(&source) {
                once.call_once(|| {
                    let req = PutRequest {
                        abstract_text: Some("omega".into()),
                        content: Some("omega's content".into()),
                        ..PutRequest::default()
                    };
                    store.put(&uri("ctx://acc/a"), req).expect("put");
                    let r = b.run_once(100).expect("b");
                    assert_eq!((r.claimed, r.failed), (1, 0), "{r:?}");
                });
            }
        }),
        Some(emb.clone() as Arc<dyn Embedder>),
        IndexProjector::default(),
    )
    .expect("worker");
    let r = a.run_once(100).expect("a");
    assert_eq!((r.claimed, r.failed), (1, 0), "{r:?}");
    drain(&env, &a);
    assert_eq!(actual(index.as_ref()), expected(&env));
    assert_vectors_match_text(index.as_ref());
}
