//! The local model against the sentence-transformers reference values. The model must be
//! installed (`scripts/fetch-model.sh`; CI runs it first): these tests fail, never skip,
//! without it.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use ce_embed::{EmbedError, Embedder, LocalEmbedder, default_model_dir};

fn model() -> &'static LocalEmbedder {
    static MODEL: OnceLock<LocalEmbedder> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir: PathBuf = default_model_dir();
        match LocalEmbedder::load(&dir) {
            Ok(m) => m,
            Err(e) => panic!(
                "the local embedding model is required for this test: {e}\n\
                 run scripts/fetch-model.sh (or set CE_MODEL_DIR) first"
            ),
        }
    })
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

const LONG: Duration = Duration::from_secs(60);

#[test]
fn cosine_matches_the_sentence_transformers_reference() {
    let m = model();
    assert_eq!(m.identity().provider, "local");
    assert_eq!(m.identity().model, "all-MiniLM-L6-v2");
    assert_eq!(m.identity().dimension, 384);
    assert_eq!(m.max_seq_length(), 256);
    let v = m
        .embed_texts(
            &["A man is eating food.", "A man is eating a piece of bread."],
            LONG,
        )
        .expect("embed");
    let c = cos(&v[0], &v[1]);
    println!("cosine = {c:.4}");
    assert!((c - 0.7553).abs() < 0.01, "cosine {c} differs from 0.7553");
}

#[test]
fn vectors_are_unit_and_batches_equal_singles() {
    let m = model();
    let long = "context database for agents ".repeat(200); // truncated at 256 tokens
    let texts = [
        "",
        "A man is eating food.",
        "The user prefers a dark theme in every editor.",
        long.as_str(),
        "用户偏好深色主题",
        "ok",
        "A man is riding a horse on the beach at sunset while children play nearby.",
        "Rust",
        "Configuration values out of range are rejected at start-up.",
        "A man is eating food.",
    ];
    let batch = m.embed_texts(&texts, LONG).expect("batch");
    assert_eq!(batch.len(), texts.len());
    for (t, b) in texts.iter().zip(&batch) {
        assert_eq!(b.len(), 384);
        assert!((norm(b) - 1.0).abs() < 1e-4, "{t:?} norm {}", norm(b));
        assert!(b.iter().all(|x| x.is_finite()));
        let single = m.embed_texts(&[t], LONG).expect("single");
        let diff = b
            .iter()
            .zip(&single[0])
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(diff < 1e-4, "{t:?}: batch and single differ by {diff}");
    }
    assert!(m.embed_texts(&[], LONG).expect("empty batch").is_empty());
}

#[test]
fn timeout_is_checked_between_sub_batches() {
    let m = model();
    let texts: Vec<String> = (0..40).map(|i| format!("sentence number {i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    // Every sub-batch takes longer than no time: a stall after the first of two.
    let err = m.embed_texts(&refs, Duration::ZERO).expect_err("timeout");
    assert!(matches!(err, EmbedError::Timeout { .. }), "{err}");
    // A single sub-batch is never interrupted.
    assert_eq!(
        m.embed_texts(&refs[..ce_embed::local::SUB_BATCH], Duration::ZERO)
            .expect("one sub-batch")
            .len(),
        ce_embed::local::SUB_BATCH
    );
}
