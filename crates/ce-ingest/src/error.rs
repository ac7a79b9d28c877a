//! The crate's one error type.

use ce_core::{Classify, ErrorCode};

use crate::document::Format;

/// What can go wrong while parsing or chunking an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    /// No parser reads this kind of input; `kind` names it (a content type, a file
    /// extension or what the bytes look like) and `name` is the file name, if one was given.
    #[error("unsupported format: {kind}{}", name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default())]
    UnsupportedFormat {
        /// The type as the input presented it, e.g. `image/png` or `extension .docx`.
        kind: String,
        /// The input's file name, if any.
        name: Option<String>,
    },
    /// The input is of a supported format but cannot be read: corrupt, truncated, encrypted,
    /// or not in the text encoding it declares.
    #[error("parse error: {format} input cannot be read: {reason}")]
    Parse {
        /// The format the input was read as.
        format: Format,
        /// What is wrong with it.
        reason: String,
    },
    /// A chunking option is out of range.
    #[error("invalid chunk option {key}: {reason}")]
    InvalidOptions {
        /// The option, e.g. `max_tokens`.
        key: &'static str,
        /// What is wrong, with the allowed range.
        reason: String,
    },
}

/// Results of this crate.
pub type Result<T, E = IngestError> = std::result::Result<T, E>;

impl Classify for IngestError {
    fn code(&self) -> ErrorCode {
        match self {
            IngestError::UnsupportedFormat { .. } => ErrorCode::UnsupportedFormat,
            IngestError::Parse { .. } => ErrorCode::ParseError,
            IngestError::InvalidOptions { .. } => ErrorCode::InvalidConfig,
        }
    }

    /// No ingestion error is retryable: the same bytes fail the same way.
    fn is_retryable(&self) -> bool {
        match self {
            IngestError::UnsupportedFormat { .. }
            | IngestError::Parse { .. }
            | IngestError::InvalidOptions { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages_name_what_was_wrong() {
        let e = IngestError::UnsupportedFormat {
            kind: "image/png".into(),
            name: Some("figure.png".into()),
        };
        assert_eq!(e.to_string(), "unsupported format: image/png (figure.png)");
        assert_eq!(e.code(), ErrorCode::UnsupportedFormat);
        assert_eq!(e.code().as_str(), "unsupported_format");
        assert!(!e.is_retryable());
        let e = IngestError::Parse {
            format: Format::Pdf,
            reason: "no trailer".into(),
        };
        assert_eq!(
            e.to_string(),
            "parse error: pdf input cannot be read: no trailer"
        );
        assert_eq!(e.code().as_str(), "parse_error");
        assert!(!e.is_retryable());
        let e = IngestError::InvalidOptions {
            key: "max_tokens",
            reason: "0 is below 16".into(),
        };
        assert_eq!(e.code(), ErrorCode::InvalidConfig);
        assert!(!e.is_retryable());
    }
}
