//! `[index.embedding]` → embedder.

use std::time::Duration;

use ce_core::Classify;
use ce_core::config::{Config, EmbeddingConfig};
use ce_embed::{EmbedError, Embedder, build, build_cached};

use crate::server::FakeOpenAi;

fn build_err(c: &EmbeddingConfig, dir: &std::path::Path) -> EmbedError {
    match build(c, dir) {
        Ok(e) => panic!("expected an error, built {}", e.identity()),
        Err(e) => e,
    }
}

fn cfg(toml: &str) -> EmbeddingConfig {
    Config::from_toml(toml).expect("config").index.embedding
}

#[test]
fn config_defaults_and_provider_validation() {
    let c = EmbeddingConfig::default();
    assert_eq!(c.provider, "local");
    assert_eq!(c.model, "all-MiniLM-L6-v2");
    assert_eq!(c.base_url, "https://api.openai.com");
    assert_eq!(c.api_key_env, "OPENAI_API_KEY");
    let err = Config::from_toml("[index.embedding]\nprovider = \"onnx\"\n").expect_err("bad");
    assert!(
        err.to_string().contains("index.embedding.provider"),
        "{err}"
    );
    let err = Config::from_toml("[index.embedding]\ndimensions = 0\n").expect_err("bad");
    assert!(
        err.to_string().contains("index.embedding.dimensions"),
        "{err}"
    );
}

#[test]
fn hash_provider_is_cached_in_the_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg("[index.embedding]\nprovider = \"hash\"\ndimensions = 64\n");
    let e = build_cached(&c, dir.path()).expect("build");
    assert_eq!(e.identity().key(), "hash:feature-hash-v1:64");
    let v = e
        .embed_texts(&["a", "a"], Duration::from_secs(1))
        .expect("embed");
    assert_eq!(v[0], v[1]);
    assert_eq!(e.stats().texts_embedded, 1);
    assert!(dir.path().join("embed-cache.db").is_file());
}

#[test]
fn local_provider_with_a_missing_model_names_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg(&format!(
        "[index.embedding]\nmodel_dir = {:?}\n",
        dir.path().join("nope").display().to_string()
    ));
    let err = build_err(&c, dir.path());
    assert!(matches!(err, EmbedError::ModelLoad { .. }));
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("scripts/fetch-model.sh"), "{err}");
}

#[test]
fn openai_provider_reads_the_key_from_the_named_variable() {
    // Setting variables needs `unsafe` in edition 2024 (denied here), so use one that is
    // set in every environment as the "key".
    let home = std::env::var("HOME").expect("HOME is set");
    let server = FakeOpenAi::start(12, Some(&home));
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = |var: &str| {
        cfg(&format!(
            "[index.embedding]\nprovider = \"openai\"\nmodel = \"custom\"\n\
             base_url = \"{}/v1\"\napi_key_env = \"{var}\"\ndimensions = 12\n",
            server.base_url()
        ))
    };
    let e = build(&toml("HOME"), dir.path()).expect("build");
    assert_eq!(e.identity().key(), "openai:custom:12");
    let v = e
        .embed_texts(&["x"], Duration::from_secs(5))
        .expect("embed");
    assert_eq!(v[0].len(), 12);
    let r = &server.requests()[0];
    assert_eq!(
        r.header("authorization"),
        Some(format!("Bearer {home}").as_str())
    );
    // `dimensions` is the size to expect, not sent: a model other than text-embedding-3-*
    // cannot shorten, and vLLM refuses the field for such models.
    assert!(r.body.get("dimensions").is_none(), "{:?}", r.body);

    // An unset variable: no Authorization header, so this server refuses (401, final).
    let e = build(&toml("CE_EMBED_TEST_UNSET_VARIABLE"), dir.path()).expect("build");
    let err = e
        .embed_texts(&["y"], Duration::from_secs(5))
        .expect_err("no key");
    assert!(
        matches!(
            err,
            EmbedError::Provider {
                status: Some(401),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(server.requests()[1].header("authorization"), None);
}

#[test]
fn openai_unknown_dimension_asks_for_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg("[index.embedding]\nprovider = \"openai\"\nmodel = \"nomic-embed-text\"\n");
    let err = build_err(&c, dir.path());
    assert!(matches!(err, EmbedError::Config { .. }));
    assert!(
        err.to_string().contains("index.embedding.dimensions"),
        "{err}"
    );
    let known =
        cfg("[index.embedding]\nprovider = \"openai\"\nmodel = \"text-embedding-3-small\"\n");
    let e = build(&known, dir.path()).expect("known model");
    assert_eq!(e.identity().key(), "openai:text-embedding-3-small:1536");

    // text-embedding-3-* shortens on request: a smaller `dimensions` is sent.
    let server = FakeOpenAi::start(1536, None);
    let short = cfg(&format!(
        "[index.embedding]\nprovider = \"openai\"\nmodel = \"text-embedding-3-small\"\n\
         base_url = \"{}\"\ndimensions = 256\n",
        server.base_url()
    ));
    let e = build(&short, dir.path()).expect("build");
    let v = e
        .embed_texts(&["x"], Duration::from_secs(5))
        .expect("embed");
    assert_eq!(v[0].len(), 256);
    assert_eq!(server.requests()[0].body["dimensions"], 256);
}
