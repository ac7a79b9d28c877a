//! Index errors, classified per spec §8.4.

use ce_core::{Classify, CoreError, ErrorCode};
use ce_store::postgres::PgFailure;

/// Result of an index operation.
pub type Result<T, E = IndexError> = std::result::Result<T, E>;

/// Maps a SQLite error of database `file`: damaged files and undecodable values are corrupt
/// (not retryable); busy, locked and I/O are unavailable (retryable).
pub(crate) fn sqlite_error(file: &str, e: rusqlite::Error) -> IndexError {
    use rusqlite::ErrorCode as C;
    let corrupt = match &e {
        rusqlite::Error::SqliteFailure(f, _) => {
            matches!(f.code, C::DatabaseCorrupt | C::NotADatabase)
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => true,
        _ => false,
    };
    if corrupt {
        IndexError::Corrupt(format!("{file}: {e}"))
    } else {
        IndexError::Unavailable(format!("{file}: {e}"))
    }
}

/// Maps a PostgreSQL error by the classification the store uses on the same pool
/// ([`PgFailure`], docs/postgres.md "Errors"): unavailable (retryable), an integrity violation
/// raced a concurrent writer ([`IndexError::Raced`], retryable), bad data or the server's
/// internal error is corrupt, the rest (e.g. a missing table or privilege, a value the client
/// cannot convert) is [`IndexError::Postgres`].
pub(crate) fn postgres_error(e: &postgres::Error) -> IndexError {
    let text = ce_store::error::pg_error_text(e);
    match PgFailure::of(e) {
        PgFailure::Unavailable => IndexError::Unavailable(format!("postgres: {text}")),
        PgFailure::Raced => IndexError::Raced(format!("postgres: {text}")),
        PgFailure::Corrupt => IndexError::Corrupt(format!("postgres: {text}")),
        PgFailure::Permanent => IndexError::Postgres(text),
    }
}

/// The error of an invalid input field (a [`CoreError::InvalidField`]): not retryable.
pub(crate) fn invalid(field: &'static str, reason: String) -> IndexError {
    IndexError::Core(CoreError::InvalidField { field, reason })
}

impl From<postgres::Error> for IndexError {
    fn from(e: postgres::Error) -> Self {
        postgres_error(&e)
    }
}

/// Everything an index operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Bad input caught by the core model (e.g. an invalid URI): not retryable.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The index's storage is temporarily unavailable (locked, I/O hiccup): retryable.
    #[error("index unavailable: {0}")]
    Unavailable(String),
    /// The index lives in a directory another process (or another instance in this one)
    /// has open, and only one may: retryable, once that process has closed it.
    #[error("index held elsewhere: {0}")]
    Held(String),
    /// Stored vectors belong to another model, or a vector has the wrong dimension:
    /// not retryable — rebuild with `ce reindex --consumer vector`.
    #[error("vector schema mismatch: {0}")]
    SchemaMismatch(String),
    /// Stored data does not decode: not retryable.
    #[error("index data is corrupt: {0}")]
    Corrupt(String),
    /// A query the index cannot run (e.g. a query vector of the wrong dimension).
    #[error("invalid vector query: {0}")]
    InvalidQuery(String),
    /// A write planned from what the index held no longer fits it: another worker moved or
    /// removed the records in between (e.g. a payload-only update whose stored vector was
    /// moved away). Retryable: the retry plans again from the index's current state.
    #[error("index changed under the write: {0}")]
    Raced(String),
    /// Any other PostgreSQL failure (e.g. a missing table or privilege), with its SQLSTATE:
    /// not retryable.
    #[error("postgres: {0}")]
    Postgres(String),
}

impl Classify for IndexError {
    fn code(&self) -> ErrorCode {
        match self {
            IndexError::Core(e) => e.code(),
            IndexError::Unavailable(_) | IndexError::Held(_) => ErrorCode::Unavailable,
            IndexError::SchemaMismatch(_) => ErrorCode::SchemaMismatch,
            IndexError::Corrupt(_) => ErrorCode::Corrupt,
            IndexError::InvalidQuery(_) => ErrorCode::InvalidField,
            IndexError::Raced(_) => ErrorCode::VersionConflict,
            IndexError::Postgres(_) => ErrorCode::Internal,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            IndexError::Core(e) => e.is_retryable(),
            IndexError::Unavailable(_) | IndexError::Held(_) | IndexError::Raced(_) => true,
            IndexError::SchemaMismatch(_)
            | IndexError::Corrupt(_)
            | IndexError::InvalidQuery(_)
            | IndexError::Postgres(_) => false,
        }
    }
}
