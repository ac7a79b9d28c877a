//! The worker's error: any failure of the layers it drives, reduced to what the retry logic
//! needs (code, message, retryable, rate-limit pause) and cheap to copy to every event it
//! affects.

use std::time::Duration;

use ce_core::{Classify, CoreError, ErrorCode};
use ce_embed::EmbedError;
use ce_store::StoreError;

use crate::error::IndexError;

/// A classified failure of one operation (spec §8.4).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct WorkError {
    /// Stable code, recorded as the delivery's `error_code`.
    pub code: ErrorCode,
    /// Message, recorded as `last_error`.
    pub message: String,
    /// Whether the event goes to `retry_wait` (else `dead`).
    pub retryable: bool,
    /// For a rate limit: how long the provider asked us to wait.
    pub retry_after: Option<Duration>,
}

impl WorkError {
    /// An unclassified failure: retryable, so nothing is lost (spec §5.4).
    pub fn internal(message: impl Into<String>) -> Self {
        WorkError {
            code: ErrorCode::Internal,
            message: message.into(),
            retryable: true,
            retry_after: None,
        }
    }

    /// The failure `e`, with its code and retryability.
    pub fn classified(e: &(impl Classify + std::fmt::Display)) -> Self {
        WorkError {
            code: e.code(),
            message: e.to_string(),
            retryable: e.is_retryable(),
            retry_after: None,
        }
    }

    /// Whether this is a provider rate limit (the worker then slows down).
    pub fn is_rate_limit(&self) -> bool {
        self.code == ErrorCode::RateLimited
    }
}

impl Classify for WorkError {
    fn code(&self) -> ErrorCode {
        self.code
    }

    fn is_retryable(&self) -> bool {
        self.retryable
    }
}

impl From<EmbedError> for WorkError {
    fn from(e: EmbedError) -> Self {
        let mut w = WorkError::classified(&e);
        if let EmbedError::RateLimited { retry_after, .. } = e {
            w.retry_after = retry_after;
        }
        w
    }
}

impl From<IndexError> for WorkError {
    fn from(e: IndexError) -> Self {
        WorkError::classified(&e)
    }
}

impl From<StoreError> for WorkError {
    fn from(e: StoreError) -> Self {
        WorkError::classified(&e)
    }
}

impl From<CoreError> for WorkError {
    fn from(e: CoreError) -> Self {
        WorkError::classified(&e)
    }
}
