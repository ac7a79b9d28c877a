//! Retrieval errors, classified by the layer they come from.

use ce_core::{Classify, CoreError, ErrorCode};
use ce_embed::EmbedError;
use ce_index::IndexError;
use ce_store::StoreError;

/// Result of a retrieval operation.
pub type Result<T, E = RetrievalError> = std::result::Result<T, E>;

/// Everything a search can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RetrievalError {
    /// The request is malformed (empty query, `top_k` out of range, bad filter).
    #[error(transparent)]
    InvalidRequest(#[from] CoreError),
    /// The vector index holds vectors of another model than the configured embedder.
    #[error(
        "the vector index holds vectors of model {index} but the configured embedder is {embedder}: rebuild it with `ce reindex --consumer vector`"
    )]
    ModelMismatch {
        /// The model the index is bound to.
        index: String,
        /// The configured embedder's model.
        embedder: String,
    },
    /// The request needs the vector index, which is configured but cannot serve (the model
    /// is missing, or the index holds another model's vectors).
    #[error("{mode} search needs the vector index, which is not ready: {reason}")]
    VectorUnavailable {
        /// The mode that needs it.
        mode: crate::SearchMode,
        /// Why it cannot serve, with the fix.
        reason: String,
    },
    /// Embedding the query failed.
    #[error("embedding the query: {0}")]
    Embed(#[from] EmbedError),
    /// The vector index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// Reading the source of truth failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for RetrievalError {
    fn code(&self) -> ErrorCode {
        match self {
            RetrievalError::InvalidRequest(e) => e.code(),
            RetrievalError::ModelMismatch { .. } => ErrorCode::SchemaMismatch,
            RetrievalError::VectorUnavailable { .. } => ErrorCode::Unavailable,
            RetrievalError::Embed(e) => e.code(),
            RetrievalError::Index(e) => e.code(),
            RetrievalError::Store(e) => e.code(),
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            RetrievalError::InvalidRequest(e) => e.is_retryable(),
            RetrievalError::ModelMismatch { .. } => false,
            // The model may appear (or the index be rebuilt) without a restart.
            RetrievalError::VectorUnavailable { .. } => true,
            RetrievalError::Embed(e) => e.is_retryable(),
            RetrievalError::Index(e) => e.is_retryable(),
            RetrievalError::Store(e) => e.is_retryable(),
        }
    }
}
