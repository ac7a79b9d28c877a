//! The embedding cache in front of a counting embedder.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ce_embed::{
    CacheStats, CachedEmbedder, EmbedError, Embedder, EmbeddingCache, HashEmbedder, ModelIdentity,
};

const T: Duration = Duration::from_secs(5);

/// What a cached embedder returns for `text`: the hash embedder's vector at the precision the
/// cache keeps ([`ce_embed::half`]), whether embedded now or read back.
fn kept(hash: &HashEmbedder, text: &str) -> Vec<f32> {
    ce_embed::half::round(&hash.embed_one(text))
}

/// The hash embedder under another identity, counting what it is asked; can be told to fail.
struct Counting {
    inner: HashEmbedder,
    identity: ModelIdentity,
    calls: AtomicUsize,
    texts: Mutex<Vec<String>>,
    fail: Mutex<bool>,
}

impl Counting {
    fn new(model: &str, dim: usize) -> Arc<Self> {
        Arc::new(Counting {
            inner: HashEmbedder::new(dim),
            identity: ModelIdentity {
                provider: "test".into(),
                model: model.into(),
                dimension: dim,
            },
            calls: AtomicUsize::new(0),
            texts: Mutex::new(Vec::new()),
            fail: Mutex::new(false),
        })
    }

    fn seen(&self) -> Vec<String> {
        self.texts.lock().expect("texts").clone()
    }
}

impl Embedder for Counting {
    fn identity(&self) -> &ModelIdentity {
        &self.identity
    }

    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if *self.fail.lock().expect("fail") {
            return Err(EmbedError::Timeout { after: timeout });
        }
        self.texts
            .lock()
            .expect("texts")
            .extend(texts.iter().map(|t| t.to_string()));
        self.inner.embed_texts(texts, timeout)
    }
}

fn cached(inner: &Arc<Counting>, cache: &Arc<EmbeddingCache>) -> CachedEmbedder {
    CachedEmbedder::new(Arc::clone(inner) as Arc<dyn Embedder>, Arc::clone(cache))
}

#[test]
fn identical_text_is_never_embedded_twice_even_across_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sub/embed-cache.db");
    let inner = Counting::new("m1", 32);
    let hash = HashEmbedder::new(32);
    {
        let cache = Arc::new(EmbeddingCache::open(&path).expect("open"));
        let e = cached(&inner, &cache);
        let out = e.embed_texts(&["a", "b", "a", "c", "b"], T).expect("embed");
        for (t, v) in ["a", "b", "a", "c", "b"].iter().zip(&out) {
            assert_eq!(v, &kept(&hash, t));
        }
        assert_eq!(inner.seen(), ["a", "b", "c"]);
        assert_eq!(
            e.stats(),
            CacheStats {
                hits: 0,
                misses: 3,
                duplicates: 2,
                provider_calls: 1,
                texts_embedded: 3,
                cache_errors: 0,
            }
        );
        // All hits: no provider call at all.
        e.embed_texts(&["c", "a"], T).expect("embed");
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
        assert_eq!(e.stats().hits, 2);
    }
    // Reopen the file: still cached.
    let cache = Arc::new(EmbeddingCache::open(&path).expect("reopen"));
    let e = cached(&inner, &cache);
    let out = e.embed_texts(&["b", "a", "c"], T).expect("embed");
    assert_eq!(out[0], kept(&hash, "b"));
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    assert_eq!(inner.seen(), ["a", "b", "c"]);
}

#[test]
fn mixed_batches_keep_input_order_and_send_misses_in_one_call() {
    let cache = Arc::new(EmbeddingCache::open_in_memory().expect("open"));
    let inner = Counting::new("m1", 24);
    let e = cached(&inner, &cache);
    let hash = HashEmbedder::new(24);
    e.embed_texts(&["two", "four"], T).expect("warm");
    let texts = ["one", "two", "three", "four", "five", "one", "", "用户"];
    let out = e.embed_texts(&texts, T).expect("embed");
    assert_eq!(out.len(), texts.len());
    for (t, v) in texts.iter().zip(&out) {
        assert_eq!(v, &kept(&hash, t), "{t:?}");
    }
    assert_eq!(inner.calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        inner.seen(),
        ["two", "four", "one", "three", "five", "", "用户"]
    );
    let s = e.stats();
    assert_eq!((s.hits, s.misses, s.duplicates), (2, 7, 1));
}

#[test]
fn model_identities_do_not_share_entries() {
    let cache = Arc::new(EmbeddingCache::open_in_memory().expect("open"));
    let m1 = Counting::new("m1", 16);
    let m2 = Counting::new("m2", 16);
    let m1_wide = Counting::new("m1", 32);
    cached(&m1, &cache)
        .embed_texts(&["same text"], T)
        .expect("m1");
    cached(&m2, &cache)
        .embed_texts(&["same text"], T)
        .expect("m2");
    let wide = cached(&m1_wide, &cache)
        .embed_texts(&["same text"], T)
        .expect("m1 wide");
    assert_eq!(wide[0].len(), 32);
    for c in [&m1, &m2, &m1_wide] {
        assert_eq!(c.calls.load(Ordering::SeqCst), 1);
    }
    cached(&m1, &cache)
        .embed_texts(&["same text"], T)
        .expect("m1 again");
    assert_eq!(m1.calls.load(Ordering::SeqCst), 1);
    assert_eq!(cache.count("test:m1:16").expect("count"), 1);
    assert_eq!(cache.count("test:m2:16").expect("count"), 1);
}

#[test]
fn entries_of_the_wrong_dimension_are_misses() {
    let cache = Arc::new(EmbeddingCache::open_in_memory().expect("open"));
    let key = ce_embed::cache::text_key("x");
    // A corrupt entry under the right model key but with 3 components.
    cache
        .put_many("test:m1:8", &[(key.as_str(), &[1.0, 0.0, 0.0][..])])
        .expect("put");
    let inner = Counting::new("m1", 8);
    let e = cached(&inner, &cache);
    let out = e.embed_texts(&["x"], T).expect("embed");
    assert_eq!(out[0].len(), 8);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    // Overwritten with the good vector.
    e.embed_texts(&["x"], T).expect("embed");
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn provider_errors_pass_through_and_nothing_is_cached() {
    let cache = Arc::new(EmbeddingCache::open_in_memory().expect("open"));
    let inner = Counting::new("m1", 8);
    let e = cached(&inner, &cache);
    *inner.fail.lock().expect("fail") = true;
    let err = e.embed_texts(&["x"], T).expect_err("fails");
    assert!(matches!(err, EmbedError::Timeout { .. }));
    *inner.fail.lock().expect("fail") = false;
    e.embed_texts(&["x"], T).expect("embed");
    assert_eq!(inner.calls.load(Ordering::SeqCst), 2);
}

#[test]
fn a_broken_cache_falls_back_to_the_provider() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("embed-cache.db");
    let cache = Arc::new(EmbeddingCache::open(&path).expect("open"));
    let inner = Counting::new("m1", 8);
    let e = cached(&inner, &cache);
    // The model has entries in the file (so a lookup reaches the vectors table).
    e.embed_texts(&["w"], T).expect("embed");
    e.flush();
    // Break the cache behind its back: drop the table through another connection.
    let other = rusqlite::Connection::open(&path).expect("conn");
    other.execute_batch("DROP TABLE vectors").expect("drop");
    let out = e.embed_texts(&["x", "y"], T).expect("embed anyway");
    assert_eq!(out.len(), 2);
    // The staged vectors cannot be written either.
    e.flush();
    let s = e.stats();
    assert_eq!(s.provider_calls, 2);
    assert_eq!(s.cache_errors, 2, "{s:?}"); // the read and the write
}
