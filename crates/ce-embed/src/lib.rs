//! Embedders (spec §11.3, DESIGN.md decisions 6–7): one batched trait with timeouts and
//! classified errors, three providers, and a persistent cache.
//!
//! - [`local`]: a BERT-family sentence-embedding model on the CPU (candle); default
//!   all-MiniLM-L6-v2
//! - [`openai`]: any OpenAI-compatible `/v1/embeddings` endpoint
//! - [`hash`]: deterministic feature hashing — for tests and pipeline-overhead benchmarks
//!   only, never a default
//! - [`cache`]: a persistent cache keyed by (model identity, sha256(text)) so identical text
//!   is never embedded twice
//! - [`half`]: vectors kept at half precision, as the cache and the vector indexes store them
//! - [`pause`]: the rate-limit pause a provider shares with all its callers (from ce-http)
//!
//! [`build`] turns `[index.embedding]` into the configured provider behind the cache.

use std::fmt;
use std::time::Duration;

use ce_core::{Classify, ErrorCode};
use serde::{Deserialize, Serialize};

pub mod cache;
pub mod from_config;
pub mod half;
pub mod hash;
pub mod local;
pub mod openai;
pub mod tokens;

pub use cache::{CacheStats, CacheTotals, CachedEmbedder, EmbeddingCache};
pub use ce_http::RateLimitPause;
/// The rate-limit pause shared by a provider's callers (moved to ce-http; kept here for the
/// embedders' callers).
pub use ce_http::pause;
pub use from_config::{CACHE_FILE, build, build_cached, build_provider, local_model_dir};
pub use hash::HashEmbedder;
pub use local::{LocalEmbedder, default_model_dir};
pub use openai::{OpenAiConfig, OpenAiEmbedder};
pub use tokens::TokenCounter;

/// Which vector space an embedding belongs to. Vectors of two identities never mix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ModelIdentity {
    /// `local`, `openai` or `hash`.
    pub provider: String,
    /// Model name (for `local`: the model directory's name).
    pub model: String,
    /// Vector dimension.
    pub dimension: usize,
}

impl ModelIdentity {
    /// `provider:model:dimension`, the key stored with indexes and cache entries.
    pub fn key(&self) -> String {
        format!("{}:{}:{}", self.provider, self.model, self.dimension)
    }
}

impl fmt::Display for ModelIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// Why an embedding call failed (spec §8.4 classes).
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The call did not finish in time (retryable).
    #[error("embedding timed out after {after:?}")]
    Timeout {
        /// The timeout that expired.
        after: Duration,
    },
    /// The provider rate-limited us (retryable; slow down for `retry_after` when given).
    #[error("embedding provider rate-limited the request{}: {message}", retry_after.map(|d| format!(" (retry after {d:?})")).unwrap_or_default())]
    RateLimited {
        /// The provider's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The provider failed: 5xx and transport errors are retryable, 4xx are not.
    #[error("embedding provider error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Provider {
        /// HTTP status, if the provider answered.
        status: Option<u16>,
        /// What went wrong.
        message: String,
        /// Whether a retry can help.
        retryable: bool,
    },
    /// The provider answered with something that is not the expected vectors (wrong count,
    /// wrong dimension, bad JSON): not retryable.
    #[error("embedding provider returned an invalid response: {0}")]
    InvalidResponse(String),
    /// The model could not be loaded (missing or bad files): not retryable.
    #[error("cannot load embedding model from {path}: {reason}")]
    ModelLoad {
        /// Model directory or file.
        path: String,
        /// What is wrong, and how to fix it.
        reason: String,
    },
    /// The embedding cache failed (retryable: the cache is an optimisation).
    #[error("embedding cache: {0}")]
    Cache(String),
    /// The embedding configuration is unusable (unknown provider, missing dimension, …):
    /// not retryable.
    #[error("invalid configuration {key}: {reason}")]
    Config {
        /// The configuration key, e.g. `index.embedding.provider`.
        key: String,
        /// What is wrong, and how to fix it.
        reason: String,
    },
}

impl Classify for EmbedError {
    fn code(&self) -> ErrorCode {
        match self {
            EmbedError::Timeout { .. } => ErrorCode::EmbedTimeout,
            EmbedError::RateLimited { .. } => ErrorCode::RateLimited,
            EmbedError::Provider { .. } | EmbedError::InvalidResponse(_) => ErrorCode::Upstream,
            EmbedError::ModelLoad { .. } => ErrorCode::Unavailable,
            EmbedError::Cache(_) => ErrorCode::Internal,
            EmbedError::Config { .. } => ErrorCode::InvalidConfig,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            EmbedError::Timeout { .. } | EmbedError::RateLimited { .. } | EmbedError::Cache(_) => {
                true
            }
            EmbedError::Provider { retryable, .. } => *retryable,
            EmbedError::InvalidResponse(_)
            | EmbedError::ModelLoad { .. }
            | EmbedError::Config { .. } => false,
        }
    }
}

impl EmbedError {
    /// Whether the failure may concern only some texts of the call — a text the provider
    /// refuses (HTTP 400, 413, 422, …), a bad vector for one text — rather than the call as a
    /// whole (credentials, permissions, unknown model or endpoint, configuration,
    /// availability). A permanent failure of this kind over several texts is worth splitting
    /// (the worker bisects the call to find the refused texts).
    pub fn may_concern_some_texts(&self) -> bool {
        match self {
            EmbedError::Provider {
                status: Some(status),
                ..
            } => (400..500).contains(status) && !matches!(status, 401 | 403 | 404 | 408 | 429),
            EmbedError::InvalidResponse(_) => true,
            EmbedError::Provider { status: None, .. }
            | EmbedError::Timeout { .. }
            | EmbedError::RateLimited { .. }
            | EmbedError::ModelLoad { .. }
            | EmbedError::Cache(_)
            | EmbedError::Config { .. } => false,
        }
    }
}

/// Turns texts into unit vectors. Implementations are batched: one call embeds all `texts`
/// (callers split into `embedding.batch_size` chunks) and must honour `timeout`.
pub trait Embedder: Send + Sync {
    /// The vector space this embedder produces.
    fn identity(&self) -> &ModelIdentity;
    /// Embeds `texts`, returning one L2-normalised vector of `identity().dimension` per text,
    /// in order.
    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// How long the provider still asks every caller to wait after a rate limit (see
    /// [`pause`]); `None` when a call may go out now. Shared by all callers of this embedder;
    /// wrappers return their inner embedder's.
    fn paused_for(&self) -> Option<Duration> {
        None
    }
    /// Writes what this embedder keeps in memory for later (a cache's staged vectors, see
    /// [`cache::EmbeddingCache::stage`]); callers flush once a unit of work is embedded.
    /// Best effort: a failure is counted by the embedder, never returned. Wrappers flush
    /// their inner embedder.
    fn flush(&self) {}
}

/// Scales `v` to unit length in place; returns false (leaving `v` alone) when its norm is
/// zero or not finite.
pub fn normalize(v: &mut [f32]) -> bool {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if !(norm.is_finite() && norm > 0.0) {
        return false;
    }
    for x in v {
        *x /= norm;
    }
    true
}
