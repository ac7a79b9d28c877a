//! Errors of sessions and memory extraction, classified (retryable or not, and a code).

use ce_core::{Classify, CoreError, ErrorCode};
use ce_llm::LlmError;

/// Why a session operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    /// Bad input (a URI, a role, a message id).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The chat endpoint failed (classified by the client).
    #[error("memory extraction: {0}")]
    Llm(#[from] LlmError),
    /// Every answer of the model failed validation against the extraction schema; nothing
    /// was stored.
    #[error(
        "memory extraction failed: {attempts} answer(s) did not match the schema; the last one: {reason}"
    )]
    InvalidExtraction {
        /// Calls made.
        attempts: u32,
        /// Why the last answer was refused.
        reason: String,
    },
    /// A retried append carries a message id the session holds with other content.
    #[error("message {id:?} of {session} exists with other {what}: an id names one message")]
    MessageConflict {
        /// The session.
        session: String,
        /// The id.
        id: String,
        /// What differs (`role`, `content`).
        what: &'static str,
    },
}

impl Classify for SessionError {
    fn code(&self) -> ErrorCode {
        match self {
            SessionError::Core(e) => e.code(),
            SessionError::Llm(e) => e.code(),
            SessionError::InvalidExtraction { .. } => ErrorCode::Upstream,
            SessionError::MessageConflict { .. } => ErrorCode::AlreadyExists,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            SessionError::Core(e) => e.is_retryable(),
            SessionError::Llm(e) => e.is_retryable(),
            SessionError::InvalidExtraction { .. } | SessionError::MessageConflict { .. } => false,
        }
    }
}
