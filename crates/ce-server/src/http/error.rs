//! Error answers: `{code, message, retryable}` with the code's HTTP status.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ce_core::{Classify, CoreError, ErrorCode};
use ce_retrieval::RetrievalError;
use ce_store::StoreError;
use tracing::warn;

use crate::error::ServerError;
use crate::wire::ErrorBody;

/// A failed request.
#[derive(Debug)]
pub struct ApiError {
    /// The status (normally `code.http_status()`).
    pub status: StatusCode,
    /// The code.
    pub code: ErrorCode,
    /// The message.
    pub message: String,
    /// Whether a retry can succeed.
    pub retryable: bool,
}

impl ApiError {
    /// An error of `code` with its own status.
    pub fn new(code: ErrorCode, message: impl Into<String>, retryable: bool) -> Self {
        ApiError {
            status: StatusCode::from_u16(code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            message: message.into(),
            retryable,
        }
    }

    /// The answer for any classified error.
    pub fn classified(e: &(impl Classify + std::fmt::Display)) -> Self {
        ApiError::new(e.code(), e.to_string(), e.is_retryable())
    }

    /// A blocking task `what` that did not complete: a panic is a defect (not retryable), a
    /// cancellation (the runtime shutting down) is retryable.
    pub fn task_failed(what: &str, e: &tokio::task::JoinError) -> Self {
        ApiError::new(
            ErrorCode::Internal,
            format!("{what} task failed: {e}"),
            e.is_cancelled(),
        )
    }

    /// A request body that is not the expected JSON: 400 `invalid_field`, or 413
    /// `payload_too_large` when it is over the body limit.
    pub fn from_json(r: &JsonRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("request body is over the limit: {}", r.body_text()),
                false,
            );
        }
        let message = match r {
            JsonRejection::MissingJsonContentType(_) => {
                "request body must be JSON with `Content-Type: application/json`".to_owned()
            }
            other => format!("malformed JSON body: {}", other.body_text()),
        };
        ApiError::new(ErrorCode::InvalidField, message, false)
    }

    /// A query string that does not parse: 400 `invalid_field`.
    pub fn from_query(r: &QueryRejection) -> Self {
        ApiError::new(
            ErrorCode::InvalidField,
            format!("malformed query string: {}", r.body_text()),
            false,
        )
    }
}

macro_rules! from_classified {
    ($($t:ty),*) => {$(
        impl From<$t> for ApiError {
            fn from(e: $t) -> Self {
                ApiError::classified(&e)
            }
        }
    )*};
}

from_classified!(ServerError, StoreError, CoreError, RetrievalError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            warn!(code = %self.code, status = self.status.as_u16(), error = %self.message, "request failed");
        }
        // A retryable refusal tells HTTP clients when to come back (a lock's holder usually
        // finishes within a second; an unavailable store or model within a few).
        let retry_after = match (self.retryable, self.code) {
            (false, _) => None,
            (true, ErrorCode::Busy | ErrorCode::LeaseLost) => Some("1"),
            (true, ErrorCode::Unavailable) => Some("5"),
            (true, _) => None,
        };
        let body = ErrorBody {
            code: self.code.as_str().to_owned(),
            message: self.message,
            retryable: self.retryable,
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(secs),
            );
        }
        response
    }
}
