//! Index errors, classified per spec §8.4.

use ce_core::{Classify, CoreError, ErrorCode};

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

/// Maps a PostgreSQL error: no SQLSTATE (I/O, a closed connection), connection exceptions
/// (08), insufficient resources (53), operator intervention (57: shutdown, terminated
/// backend, cancelled statement), system errors (58), transaction rollbacks (40:
/// serialization failures, deadlocks), lock timeouts (55P03, 55006) and a prepared statement
/// outdated by a concurrent schema change are unavailable (retryable); an
/// integrity violation (23) can only come from a concurrent writer, so the write raced
/// (retryable); data exceptions (22) and internal errors (XX: corruption) are corrupt; the
/// rest (e.g. 42: a missing table or privilege) is [`IndexError::Postgres`].
pub(crate) fn postgres_error(e: &postgres::Error) -> IndexError {
    let text = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(src) => format!("{e}: {src}"),
            None => e.to_string(),
        },
    };
    let Some(code) = e.code().map(|c| c.code()) else {
        return IndexError::Unavailable(format!("postgres: {text}"));
    };
    // "cached plan must not change result type" (0A000 like every unsupported feature):
    // the connection is dropped, so a retry prepares the statement afresh.
    let stale_plan = e
        .as_db_error()
        .is_some_and(|db| db.routine() == Some("RevalidateCachedQuery"));
    let class = code.get(..2).unwrap_or("");
    match class {
        "08" | "53" | "57" | "58" | "40" => IndexError::Unavailable(format!("postgres: {text}")),
        _ if matches!(code, "55P03" | "55006") || stale_plan => {
            IndexError::Unavailable(format!("postgres: {text}"))
        }
        "23" => IndexError::Raced(format!("postgres: {text}")),
        "22" | "XX" => IndexError::Corrupt(format!("postgres: {text}")),
        _ => IndexError::Postgres(text),
    }
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
            IndexError::Unavailable(_) => ErrorCode::Unavailable,
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
            IndexError::Unavailable(_) | IndexError::Raced(_) => true,
            IndexError::SchemaMismatch(_)
            | IndexError::Corrupt(_)
            | IndexError::InvalidQuery(_)
            | IndexError::Postgres(_) => false,
        }
    }
}
