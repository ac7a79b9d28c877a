//! Error codes shared by every layer, and the core's own errors.
//!
//! Each crate has one error enum; each variant maps, by an exhaustive match, to a stable
//! [`ErrorCode`] (which fixes the HTTP status and the CLI exit code) and to retryable or not
//! (spec §8.4).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::uri::UriError;

/// In JSON an error code is one of the names of [`ErrorCode::ALL`].
impl schemars::JsonSchema for ErrorCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        schemars::json_schema!({
            "description": "A stable, machine-readable error code.",
            "type": "string",
            "enum": names,
        })
    }
}

/// A stable, machine-readable error code. In JSON it is the snake_case name of
/// [`ErrorCode::as_str`], the one table of names (a new variant goes into [`ErrorCode::ALL`]
/// too, so that it parses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub enum ErrorCode {
    /// A URI is malformed.
    InvalidUri,
    /// A level is not 0, 1 or 2.
    InvalidLevel,
    /// A field of a request has a bad value.
    InvalidField,
    /// An outbox event type is not one of the four known ones.
    UnknownEventType,
    /// An outbox event payload lacks a field or has a bad one.
    InvalidPayload,
    /// A configuration value is out of range or malformed.
    InvalidConfig,
    /// A text or request is larger than the configured limit.
    PayloadTooLarge,
    /// The addressed node, event or edge does not exist.
    NotFound,
    /// The target of a create or move already exists.
    AlreadyExists,
    /// `expect_version` did not match the stored version.
    VersionConflict,
    /// A non-recursive remove of a node that has children.
    NotEmpty,
    /// A move whose target lies inside its source, or that moves the root.
    InvalidMove,
    /// An outbox claim is no longer held (expired or taken over).
    ClaimConflict,
    /// An outbox transition is not allowed from the current state.
    StateTransition,
    /// The store is locked or temporarily unavailable.
    Unavailable,
    /// An embedding call took longer than its timeout.
    EmbedTimeout,
    /// A provider asked us to slow down (HTTP 429).
    RateLimited,
    /// A remote provider failed (5xx, bad response, refused request).
    Upstream,
    /// Stored index data does not match what this build or model expects (dimension, model).
    SchemaMismatch,
    /// The stored data is corrupt or from an incompatible schema.
    Corrupt,
    /// A file-system operation failed.
    Io,
    /// Anything else.
    Internal,
    /// The request carries no API key, or one the server does not know.
    Unauthenticated,
    /// The caller's API key does not allow this (another account, an owner space it lacks,
    /// or an admin-only route).
    Forbidden,
    /// A path lock is held by someone else past the wait (retry later).
    Busy,
    /// A write carried a fencing token older than one the store has seen for its path: the
    /// lease it was made under was lost (expired, taken over). Retrying the whole operation
    /// takes a new lease.
    LeaseLost,
    /// A derived deletion larger than the delete-safety limits was refused.
    LargeDelete,
    /// An input is of a format no parser reads (the message names the type).
    UnsupportedFormat,
    /// An input of a supported format could not be parsed (corrupt, truncated, encrypted).
    ParseError,
}

impl ErrorCode {
    /// All codes.
    pub const ALL: [ErrorCode; 29] = [
        ErrorCode::InvalidUri,
        ErrorCode::InvalidLevel,
        ErrorCode::InvalidField,
        ErrorCode::UnknownEventType,
        ErrorCode::InvalidPayload,
        ErrorCode::InvalidConfig,
        ErrorCode::PayloadTooLarge,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::VersionConflict,
        ErrorCode::NotEmpty,
        ErrorCode::InvalidMove,
        ErrorCode::ClaimConflict,
        ErrorCode::StateTransition,
        ErrorCode::Unavailable,
        ErrorCode::EmbedTimeout,
        ErrorCode::RateLimited,
        ErrorCode::Upstream,
        ErrorCode::SchemaMismatch,
        ErrorCode::Corrupt,
        ErrorCode::Io,
        ErrorCode::Internal,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::Busy,
        ErrorCode::LeaseLost,
        ErrorCode::LargeDelete,
        ErrorCode::UnsupportedFormat,
        ErrorCode::ParseError,
    ];

    /// The snake_case name used in JSON error bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidUri => "invalid_uri",
            ErrorCode::InvalidLevel => "invalid_level",
            ErrorCode::InvalidField => "invalid_field",
            ErrorCode::UnknownEventType => "unknown_event_type",
            ErrorCode::InvalidPayload => "invalid_payload",
            ErrorCode::InvalidConfig => "invalid_config",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::VersionConflict => "version_conflict",
            ErrorCode::NotEmpty => "not_empty",
            ErrorCode::InvalidMove => "invalid_move",
            ErrorCode::ClaimConflict => "claim_conflict",
            ErrorCode::StateTransition => "state_transition",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::EmbedTimeout => "embed_timeout",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Upstream => "upstream",
            ErrorCode::SchemaMismatch => "schema_mismatch",
            ErrorCode::Corrupt => "corrupt",
            ErrorCode::Io => "io",
            ErrorCode::Internal => "internal",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Busy => "busy",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::LargeDelete => "large_delete",
            ErrorCode::UnsupportedFormat => "unsupported_format",
            ErrorCode::ParseError => "parse_error",
        }
    }

    /// The HTTP status that carries this code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidUri
            | ErrorCode::InvalidLevel
            | ErrorCode::InvalidField
            | ErrorCode::UnknownEventType
            | ErrorCode::InvalidPayload
            | ErrorCode::InvalidConfig
            | ErrorCode::InvalidMove
            | ErrorCode::UnsupportedFormat
            | ErrorCode::ParseError => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyExists
            | ErrorCode::VersionConflict
            | ErrorCode::NotEmpty
            | ErrorCode::ClaimConflict
            | ErrorCode::StateTransition
            | ErrorCode::SchemaMismatch
            | ErrorCode::Busy
            | ErrorCode::LeaseLost
            | ErrorCode::LargeDelete => 409,
            ErrorCode::RateLimited => 429,
            ErrorCode::Upstream => 502,
            ErrorCode::EmbedTimeout => 504,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::Unavailable => 503,
            ErrorCode::Corrupt | ErrorCode::Io | ErrorCode::Internal => 500,
        }
    }

    /// The `ce` exit code (documented in the README): 2 bad input, 3 not found, 4 conflict,
    /// 5 too large, 6 unavailable or overloaded (retry), 7 not allowed (no or unknown API
    /// key, or a key without the right), 1 anything else.
    pub fn exit_code(self) -> i32 {
        match self.http_status() {
            400 => 2,
            404 => 3,
            409 => 4,
            413 => 5,
            429 | 502 | 503 | 504 => 6,
            401 | 403 => 7,
            _ => 1,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErrorCode {
    type Err = CoreError;
    /// Parses [`ErrorCode::as_str`]; a name this build does not know is `invalid_field`.
    fn from_str(s: &str) -> Result<Self, CoreError> {
        ErrorCode::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| CoreError::InvalidField {
                field: "code",
                reason: format!("{s:?} is not a known error code"),
            })
    }
}

impl TryFrom<String> for ErrorCode {
    type Error = CoreError;
    fn try_from(s: String) -> Result<Self, CoreError> {
        s.parse()
    }
}

impl From<ErrorCode> for &'static str {
    fn from(c: ErrorCode) -> Self {
        c.as_str()
    }
}

/// Classification every error enum of the project implements.
pub trait Classify {
    /// The stable code.
    fn code(&self) -> ErrorCode;
    /// Whether retrying the same operation later can succeed.
    fn is_retryable(&self) -> bool;
}

/// Errors of the core model: all are bad input, none is retryable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// A malformed URI.
    #[error("invalid uri: {0}")]
    InvalidUri(#[from] UriError),
    /// A level outside 0..=2.
    #[error("invalid level {level}: must be 0, 1 or 2")]
    InvalidLevel {
        /// The offending level.
        level: i64,
    },
    /// A field with a bad value.
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// The field name.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An unknown outbox event type.
    #[error(
        "unknown event type {found:?}: expected UPSERT_CONTEXT, DELETE_CONTEXT, MOVE_CONTEXT or UPSERT_RELATION"
    )]
    UnknownEventType {
        /// The offending type.
        found: String,
    },
    /// A payload that does not fit its event type.
    #[error("invalid {event_type} payload: {reason}")]
    InvalidPayload {
        /// The event type.
        event_type: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A configuration value out of range or malformed.
    #[error("invalid config {key}: {reason}")]
    InvalidConfig {
        /// The dotted key, e.g. `index.worker.lease_seconds`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A text over the configured limit.
    #[error("{field} is {len} bytes, the limit is {max}")]
    TooLarge {
        /// The field name.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
}

impl Classify for CoreError {
    fn code(&self) -> ErrorCode {
        match self {
            CoreError::InvalidUri(_) => ErrorCode::InvalidUri,
            CoreError::InvalidLevel { .. } => ErrorCode::InvalidLevel,
            CoreError::InvalidField { .. } => ErrorCode::InvalidField,
            CoreError::UnknownEventType { .. } => ErrorCode::UnknownEventType,
            CoreError::InvalidPayload { .. } => ErrorCode::InvalidPayload,
            CoreError::InvalidConfig { .. } => ErrorCode::InvalidConfig,
            CoreError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            CoreError::InvalidUri(_)
            | CoreError::InvalidLevel { .. }
            | CoreError::InvalidField { .. }
            | CoreError::UnknownEventType { .. }
            | CoreError::InvalidPayload { .. }
            | CoreError::InvalidConfig { .. }
            | CoreError::TooLarge { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_code_round_trips_through_its_name_and_json() {
        let names: HashSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len(), "names are unique");
        for c in ErrorCode::ALL {
            assert_eq!(c.as_str().parse::<ErrorCode>().expect("known"), c);
            let json = serde_json::to_value(c).expect("serializes");
            assert_eq!(json, serde_json::Value::from(c.as_str()));
            assert_eq!(
                serde_json::from_value::<ErrorCode>(json).expect("decodes"),
                c
            );
        }
        assert!(matches!(
            "teapot".parse::<ErrorCode>(),
            Err(CoreError::InvalidField { field: "code", .. })
        ));
        assert!(serde_json::from_str::<ErrorCode>("\"teapot\"").is_err());
    }
}
