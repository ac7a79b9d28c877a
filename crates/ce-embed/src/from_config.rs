//! `[index.embedding]` → a ready embedder behind the persistent cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ce_core::config::EmbeddingConfig;

use crate::cache::{CachedEmbedder, EmbeddingCache};
use crate::hash::HashEmbedder;
use crate::local::{self, LocalEmbedder};
use crate::openai::{self, OpenAiConfig, OpenAiEmbedder};
use crate::{EmbedError, Embedder};

/// The cache file's name inside the data directory.
pub const CACHE_FILE: &str = "embed-cache.db";

/// The `hash` provider's dimension when `dimensions` is not set (all-MiniLM-L6-v2's).
pub const HASH_DEFAULT_DIMENSION: usize = 384;

/// Builds the configured provider wrapped in the embedding cache at
/// `data_dir/embed-cache.db` (see [`build_cached`]).
pub fn build(cfg: &EmbeddingConfig, data_dir: &Path) -> Result<Arc<dyn Embedder>, EmbedError> {
    let cached: Arc<dyn Embedder> = build_cached(cfg, data_dir)?;
    Ok(cached)
}

/// Like [`build`], but keeps the concrete type so callers can read
/// [`CachedEmbedder::stats`] (metrics).
///
/// - `local`: loads the model from `model_dir`, else `$CE_MODEL_DIR`, else
///   `~/.cache/contextengine/models/{model}` (a missing model fails with the fix:
///   `run scripts/fetch-model.sh`).
/// - `openai`: reads the key from the variable named by `api_key_env` (unset or empty: no key);
///   the dimension is `dimensions`, else the known size of OpenAI's models, else
///   [`EmbedError::Config`] asking for `index.embedding.dimensions`; `dimensions` is sent in
///   requests only to `text-embedding-3-*` models, to shorten them. No request is made here.
/// - `hash`: `dimensions` (default 384). Test and benchmark use only: its identity
///   (`hash:feature-hash-v1:…`) says so wherever vectors are stored.
pub fn build_provider(cfg: &EmbeddingConfig) -> Result<Arc<dyn Embedder>, EmbedError> {
    let dimensions = cfg.dimensions.map(|d| d as usize);
    if dimensions == Some(0) {
        return Err(EmbedError::Config {
            key: "index.embedding.dimensions".into(),
            reason: "must be at least 1".into(),
        });
    }
    match cfg.provider.as_str() {
        local::PROVIDER => Ok(Arc::new(LocalEmbedder::load(&local_model_dir(cfg))?)),
        openai::PROVIDER => {
            let expected_dimension = dimensions
                .or_else(|| openai::known_dimension(&cfg.model))
                .ok_or_else(|| EmbedError::Config {
                    key: "index.embedding.dimensions".into(),
                    reason: format!(
                        "the vector dimension of model {:?} is not known: set it (e.g. 768)",
                        cfg.model
                    ),
                })?;
            let api_key = std::env::var(&cfg.api_key_env)
                .ok()
                .filter(|k| !k.trim().is_empty());
            Ok(Arc::new(OpenAiEmbedder::new(OpenAiConfig {
                base_url: cfg.base_url.clone(),
                api_key,
                model: cfg.model.clone(),
                // Only OpenAI's text-embedding-3 models shorten their vectors on request, so
                // only they are sent a `dimensions` (one other than their native size). For
                // any other model it is the size to expect and is not sent: vLLM refuses the
                // field for a model that cannot shorten, even at its native size.
                dimensions: dimensions.filter(|&d| {
                    shortens_on_request(&cfg.model)
                        && openai::known_dimension(&cfg.model) != Some(d)
                }),
                expected_dimension,
            })?))
        }
        crate::hash::PROVIDER => Ok(Arc::new(HashEmbedder::new(
            dimensions.unwrap_or(HASH_DEFAULT_DIMENSION),
        ))),
        other => Err(EmbedError::Config {
            key: "index.embedding.provider".into(),
            reason: format!("{other:?} is not one of \"local\", \"openai\", \"hash\""),
        }),
    }
}

/// Whether the `openai` provider's `model` returns shorter vectors when asked
/// (`dimensions` in the request): OpenAI's `text-embedding-3-*`.
fn shortens_on_request(model: &str) -> bool {
    model.starts_with("text-embedding-3-")
}

/// See [`build`]; returns the concrete cached embedder.
pub fn build_cached(
    cfg: &EmbeddingConfig,
    data_dir: &Path,
) -> Result<Arc<CachedEmbedder>, EmbedError> {
    let inner = build_provider(cfg)?;
    let cache = EmbeddingCache::open(&data_dir.join(CACHE_FILE))?;
    Ok(Arc::new(CachedEmbedder::new(inner, Arc::new(cache))))
}

/// Where the `local` provider loads its model from (see [`build_cached`]).
pub fn local_model_dir(cfg: &EmbeddingConfig) -> PathBuf {
    if let Some(dir) = cfg.model_dir.as_deref().filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match std::env::var_os(local::MODEL_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => local::models_root().join(&cfg.model),
    }
}
