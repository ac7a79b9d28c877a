//! The CLI's error: typed errors of the layers below, kept typed so that their code decides
//! the exit status. Errors a server returns (`--server`) keep the server's code, so a command
//! exits the same way in both modes.

use ce_core::{Classify, CoreError, ErrorCode};
use ce_server::ServerError;
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
    /// The engine (search, status, reindex, workers, server) refused or failed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// Reading or writing a local file (the message names the path).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Arguments that are well-formed one by one but do not fit together.
    #[error("{0}")]
    Usage(String),
    /// A line of an evaluation data set (BEIR corpus, queries or qrels) that cannot be read.
    #[error("{path}:{line}: {message}")]
    EvalData {
        /// The file.
        path: String,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with the line.
        message: String,
    },
    /// The server at `--server` answered with an error.
    #[error("{message}")]
    Remote {
        /// The code, for the exit status (the server's own code when this build knows it).
        code: ErrorCode,
        /// The code exactly as the server sent it.
        code_text: String,
        /// The server's message.
        message: String,
        /// Whether the server said a retry can succeed.
        retryable: bool,
    },
    /// The server at `--server` could not be reached, or its answer not read.
    #[error("{url}: {message}")]
    Transport {
        /// The request URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// A failure reported by a helper that returns `anyhow` (the benchmarks).
    #[error("{0:#}")]
    Other(anyhow::Error),
}

impl CliError {
    /// The error code as printed (a remote error keeps the server's spelling).
    pub fn code_text(&self) -> String {
        match self {
            CliError::Remote { code_text, .. } => code_text.clone(),
            other => other.code().as_str().to_owned(),
        }
    }
}

impl Classify for CliError {
    fn code(&self) -> ErrorCode {
        match self {
            CliError::Store(e) => e.code(),
            CliError::Core(e) => e.code(),
            CliError::Server(e) => e.code(),
            CliError::Io(_) => ErrorCode::Io,
            CliError::Usage(_) | CliError::EvalData { .. } => ErrorCode::InvalidField,
            CliError::Remote { code, .. } => *code,
            CliError::Transport { .. } => ErrorCode::Unavailable,
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
            CliError::Server(e) => e.is_retryable(),
            // The CLI's own I/O is on the caller's files: retrying will not help.
            CliError::Io(_) | CliError::Usage(_) | CliError::EvalData { .. } => false,
            CliError::Remote { retryable, .. } => *retryable,
            CliError::Transport { .. } => true,
            CliError::Other(e) => e
                .downcast_ref::<StoreError>()
                .is_some_and(Classify::is_retryable),
        }
    }
}

/// Result of a `ce` command.
pub type Result<T, E = CliError> = std::result::Result<T, E>;
