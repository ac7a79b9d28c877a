//! The CLI's error: typed errors of the layers below, kept typed so that their code decides
//! the exit status.

use ce_core::{Classify, CoreError, ErrorCode};
use ce_store::StoreError;

/// Everything a `ce` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Bad input caught by the core model.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// Reading or writing a local file (the message names the path).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Arguments that are well-formed one by one but do not fit together.
    #[error("{0}")]
    Usage(String),
    /// A failure reported by a helper that returns `anyhow` (the benchmarks).
    #[error("{0:#}")]
    Other(anyhow::Error),
}

impl Classify for CliError {
    fn code(&self) -> ErrorCode {
        match self {
            CliError::Store(e) => e.code(),
            CliError::Core(e) => e.code(),
            CliError::Io(_) => ErrorCode::Io,
            CliError::Usage(_) => ErrorCode::InvalidField,
            CliError::Other(e) => {
                if let Some(s) = e.downcast_ref::<StoreError>() {
                    s.code()
                } else if let Some(c) = e.downcast_ref::<CoreError>() {
                    c.code()
                } else {
                    ErrorCode::Internal
                }
            }
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            CliError::Store(e) => e.is_retryable(),
            CliError::Core(e) => e.is_retryable(),
            // The CLI's own I/O is on the caller's files: retrying will not help.
            CliError::Io(_) | CliError::Usage(_) => false,
            CliError::Other(e) => e
                .downcast_ref::<StoreError>()
                .is_some_and(Classify::is_retryable),
        }
    }
}

/// Result of a `ce` command.
pub type Result<T, E = CliError> = std::result::Result<T, E>;
