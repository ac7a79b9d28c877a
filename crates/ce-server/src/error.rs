//! Engine and server errors, classified by the layer they come from.

use ce_core::{Classify, CoreError, ErrorCode};
use ce_embed::EmbedError;
use ce_index::IndexError;
use ce_lock::LockError;
use ce_retrieval::RetrievalError;
use ce_store::StoreError;

/// Result of an engine or server operation.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;

/// Everything the engine and the server can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Bad input caught by the core model.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The source of truth refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The vector index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The embedder failed.
    #[error(transparent)]
    Embed(#[from] EmbedError),
    /// A search failed.
    #[error(transparent)]
    Retrieval(#[from] RetrievalError),
    /// A path lock was busy, lost, or its provider failed.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The engine cannot serve this yet (model missing, index bound to another model).
    #[error("not ready: {reason}")]
    NotReady {
        /// Why, and how to fix it.
        reason: String,
        /// The code that explains it best (`unavailable` or `schema_mismatch`).
        code: ErrorCode,
    },
    /// A consumer this engine has no worker for.
    #[error("consumer {name:?} is not served here: {reason}")]
    UnsupportedConsumer {
        /// The name asked for.
        name: String,
        /// Why.
        reason: String,
    },
    /// Binding, serving or a signal handler failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A blocking task failed to complete (it panicked or was cancelled).
    #[error("internal error: {0}")]
    Internal(String),
    /// A derived deletion refused by the delete-safety policy (DESIGN.md decision 11); the
    /// reason names the counts and the override.
    #[error("large delete refused: {reason}")]
    LargeDelete {
        /// What would have been deleted, and how to proceed.
        reason: String,
    },
}

impl Classify for ServerError {
    fn code(&self) -> ErrorCode {
        match self {
            ServerError::Core(e) => e.code(),
            ServerError::Store(e) => e.code(),
            ServerError::Index(e) => e.code(),
            ServerError::Embed(e) => e.code(),
            ServerError::Retrieval(e) => e.code(),
            ServerError::Lock(e) => e.code(),
            ServerError::NotReady { code, .. } => *code,
            ServerError::UnsupportedConsumer { .. } => ErrorCode::InvalidField,
            ServerError::Io { .. } => ErrorCode::Io,
            ServerError::Internal(_) => ErrorCode::Internal,
            ServerError::LargeDelete { .. } => ErrorCode::LargeDelete,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            ServerError::Core(e) => e.is_retryable(),
            ServerError::Store(e) => e.is_retryable(),
            ServerError::Index(e) => e.is_retryable(),
            ServerError::Embed(e) => e.is_retryable(),
            ServerError::Retrieval(e) => e.is_retryable(),
            ServerError::Lock(e) => e.is_retryable(),
            ServerError::NotReady { code, .. } => *code == ErrorCode::Unavailable,
            ServerError::UnsupportedConsumer { .. } | ServerError::LargeDelete { .. } => false,
            ServerError::Io { .. } | ServerError::Internal(_) => true,
        }
    }
}
