//! Store errors, each classified by code and retryability.

use std::path::PathBuf;

use ce_core::{Classify, CoreError, CtxUri, ErrorCode};

use crate::postgres::PgFailure;

/// Result of a store operation.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Everything a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad input caught by the core model.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The addressed node does not exist.
    #[error("node {uri} not found")]
    NodeNotFound {
        /// The node.
        uri: CtxUri,
    },
    /// The addressed relation does not exist.
    #[error("relation {from} -[{relation_type}]-> {to} not found")]
    RelationNotFound {
        /// Source.
        from: CtxUri,
        /// Target.
        to: CtxUri,
        /// Type.
        relation_type: String,
    },
    /// The addressed event does not exist (never appended, or pruned: docs/store.md
    /// "Journal retention").
    #[error(
        "event {event_id} not found (the journal keeps what every consumer applied for index.outbox.journal_retention_seconds)"
    )]
    EventNotFound {
        /// The event id (or sequence) asked for.
        event_id: String,
    },
    /// The target of a move already exists.
    #[error("node {uri} already exists")]
    AlreadyExists {
        /// The node.
        uri: CtxUri,
    },
    /// `expect_version` did not match.
    #[error("version conflict on {uri}: expected version {expected}, found {}", found_text(*.actual))]
    VersionConflict {
        /// The node.
        uri: CtxUri,
        /// What the caller expected (0 = must not exist).
        expected: u64,
        /// What is stored (`None` = no node).
        actual: Option<u64>,
    },
    /// `rm` without `recursive` on a node with children.
    #[error("node {uri} has {children} children: remove it recursively")]
    NotEmpty {
        /// The node.
        uri: CtxUri,
        /// Number of direct children.
        children: u64,
    },
    /// A move that cannot be done.
    #[error("cannot move {from} to {to}: {reason}")]
    InvalidMove {
        /// Source.
        from: CtxUri,
        /// Target.
        to: CtxUri,
        /// Why.
        reason: &'static str,
    },
    /// The root `ctx://` is virtual and cannot be written.
    #[error("the root ctx:// is not a node: write below an account, e.g. ctx://acc1/...")]
    RootNotWritable,
    /// A consumer name that the configuration does not list.
    #[error("unknown consumer {name:?}: configured consumers are {configured:?}")]
    UnknownConsumer {
        /// The name asked for.
        name: String,
        /// The configured names.
        configured: Vec<String>,
    },
    /// The claim is no longer held: expired, taken over, or never existed.
    #[error("claim on event {event_id} for consumer {consumer} is no longer held ({state})")]
    ClaimConflict {
        /// Event id.
        event_id: String,
        /// Consumer.
        consumer: String,
        /// What the delivery looks like now.
        state: String,
    },
    /// A transition the delivery state machine does not allow.
    #[error("event {event_id} for consumer {consumer} is {status}: {reason}")]
    StateTransition {
        /// Event id.
        event_id: String,
        /// Consumer.
        consumer: String,
        /// Current status.
        status: String,
        /// What was refused.
        reason: &'static str,
    },
    /// The addressed job does not exist.
    #[error("job {job_id} not found")]
    JobNotFound {
        /// The job id asked for.
        job_id: String,
    },
    /// A job's claim is no longer held: its lease ended, a newer claim took the job, or the
    /// job left `running`.
    #[error("claim on job {job_id} is no longer held ({state})")]
    JobClaimConflict {
        /// The job.
        job_id: String,
        /// What the job looks like now.
        state: String,
    },
    /// A transition the job state machine does not allow.
    #[error("job {job_id} is {}: {reason}", state.as_str())]
    JobTransition {
        /// The job.
        job_id: String,
        /// Its state.
        state: crate::jobs::JobState,
        /// What was refused.
        reason: &'static str,
    },
    /// A knowledge base or item that does not exist.
    #[error("{what} {id} not found")]
    KbNotFound {
        /// `knowledge base` or `item`.
        what: &'static str,
        /// Its name, or `base/item`.
        id: String,
    },
    /// A knowledge base whose name or root is taken.
    #[error("knowledge base {name} or one at {root} already exists")]
    KbExists {
        /// The name asked for.
        name: String,
        /// The root asked for.
        root: CtxUri,
    },
    /// The stale guard of a knowledge-base write: the item is gone or in a status that
    /// refuses the write; the whole batch was written nothing.
    #[error("item {base}/{item} is {}: the write was skipped", status.map_or("gone", |s| s.as_str()))]
    KbStale {
        /// The base.
        base: String,
        /// The item.
        item: String,
        /// Its status (`None`: gone).
        status: Option<crate::kb::ItemStatus>,
    },
    /// A knowledge-base operation its entry guard refuses.
    #[error("knowledge base {base}: refused: {reason}")]
    KbRefused {
        /// The base.
        base: String,
        /// Why.
        reason: String,
    },
    /// A derived deletion (an import's prune) over the delete-safety limits.
    #[error(
        "large delete refused: {0}; check that the source is complete, then pass --allow-large-delete"
    )]
    LargeDelete(#[from] ce_core::safety::LargeDelete),
    /// A write under a path lock carried a fencing token older than one already recorded
    /// for its path: its lease was lost to a newer holder.
    #[error(
        "lease on {path} lost: the write carries fencing token {token}, but {newest_path} was \
         last written under token {newest} (a newer lock holder); retry the operation"
    )]
    LeaseLost {
        /// The locked path the write was made under.
        path: CtxUri,
        /// The write's token.
        token: u64,
        /// Where the newer token was recorded.
        newest_path: String,
        /// The newer token.
        newest: u64,
    },
    /// Another process holds the database's write lock for longer than the busy timeout.
    #[error("the store is busy (locked by another writer): {0}")]
    Busy(rusqlite::Error),
    /// Stored data does not decode (corruption or a foreign schema).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database was written by a newer ContextEngine.
    #[error("the store at {location} has schema version {found}, this build knows up to {known}")]
    SchemaTooNew {
        /// Database file, or PostgreSQL URL without its password.
        location: String,
        /// Version found.
        found: i64,
        /// Highest version this build knows.
        known: i64,
    },
    /// Any other SQLite failure.
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),
    /// The PostgreSQL server cannot be reached, dropped the connection or refuses work for
    /// now ([`PgFailure::Unavailable`]): retryable.
    #[error("postgres unavailable: {0}")]
    PgUnavailable(String),
    /// Any other PostgreSQL failure, with its SQLSTATE when the server sent one; retryable
    /// only when a concurrent writer raced it ([`PgFailure`]).
    #[error("postgres: {}", pg_error_text(.0))]
    Postgres(postgres::Error),
    /// A failure tied to a file of an import or export.
    #[error("{}: {source}", path.display())]
    AtPath {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong there.
        source: Box<StoreError>,
    },
    /// A file of the node layout that does not parse.
    #[error("{}: {reason}", path.display())]
    BadLayout {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file-system failure (`fs-err` names the path).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The data directory does not exist and cannot be created (a parent that is a file or
    /// missing and not creatable, no permission, a read-only file system).
    #[error("cannot create the data directory {}: {source}", path.display())]
    DataDir {
        /// The data directory.
        path: PathBuf,
        /// Why `create_dir_all` failed.
        source: std::io::Error,
    },
}

fn found_text(actual: Option<u64>) -> String {
    actual.map_or_else(|| "no node".to_owned(), |v| v.to_string())
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StoreError::Busy(e)
            }
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                StoreError::Corrupt(e.to_string())
            }
            _ => StoreError::Sqlite(e),
        }
    }
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        match PgFailure::of(&e) {
            PgFailure::Unavailable => StoreError::PgUnavailable(pg_error_text(&e)),
            PgFailure::Raced | PgFailure::Corrupt | PgFailure::Permanent => StoreError::Postgres(e),
        }
    }
}

/// The error with the server's message and SQLSTATE (`Display` of `postgres::Error` alone
/// says only "db error").
pub fn pg_error_text(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(src) => format!("{e}: {src}"),
            None => e.to_string(),
        },
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(format!("stored json does not decode: {e}"))
    }
}

impl Classify for StoreError {
    fn code(&self) -> ErrorCode {
        match self {
            StoreError::Core(e) => e.code(),
            StoreError::NodeNotFound { .. }
            | StoreError::RelationNotFound { .. }
            | StoreError::EventNotFound { .. }
            | StoreError::JobNotFound { .. }
            | StoreError::KbNotFound { .. } => ErrorCode::NotFound,
            StoreError::AlreadyExists { .. } | StoreError::KbExists { .. } => {
                ErrorCode::AlreadyExists
            }
            StoreError::KbStale { .. } | StoreError::KbRefused { .. } => ErrorCode::StateTransition,
            StoreError::VersionConflict { .. } => ErrorCode::VersionConflict,
            StoreError::NotEmpty { .. } => ErrorCode::NotEmpty,
            StoreError::InvalidMove { .. } => ErrorCode::InvalidMove,
            StoreError::RootNotWritable => ErrorCode::InvalidUri,
            StoreError::UnknownConsumer { .. } => ErrorCode::InvalidField,
            StoreError::ClaimConflict { .. } | StoreError::JobClaimConflict { .. } => {
                ErrorCode::ClaimConflict
            }
            StoreError::StateTransition { .. } | StoreError::JobTransition { .. } => {
                ErrorCode::StateTransition
            }
            StoreError::Busy(_) => ErrorCode::Unavailable,
            StoreError::LeaseLost { .. } => ErrorCode::LeaseLost,
            StoreError::LargeDelete(_) => ErrorCode::LargeDelete,
            StoreError::Corrupt(_) | StoreError::SchemaTooNew { .. } => ErrorCode::Corrupt,
            StoreError::Sqlite(_) => ErrorCode::Internal,
            StoreError::Postgres(e) => match PgFailure::of(e) {
                PgFailure::Corrupt => ErrorCode::Corrupt,
                PgFailure::Unavailable => ErrorCode::Unavailable,
                PgFailure::Raced | PgFailure::Permanent => ErrorCode::Internal,
            },
            StoreError::PgUnavailable(_) => ErrorCode::Unavailable,
            StoreError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => ErrorCode::NotFound,
            StoreError::Io(_) | StoreError::DataDir { .. } => ErrorCode::Io,
            StoreError::AtPath { source, .. } => source.code(),
            StoreError::BadLayout { .. } => ErrorCode::InvalidField,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            StoreError::Core(e) => e.is_retryable(),
            // Spec §8.1: a lost lease is retryable (the event or job is simply run again).
            StoreError::ClaimConflict { .. }
            | StoreError::JobClaimConflict { .. }
            | StoreError::Busy(_)
            | StoreError::PgUnavailable(_) => true,
            // The operation as a whole can be retried under a new lease.
            StoreError::LeaseLost { .. } => true,
            // The same deletion stays over the limits until the caller overrides it.
            StoreError::LargeDelete(_) => false,
            // A missing or forbidden path stays so; other I/O (disk full, EINTR) may clear.
            StoreError::Io(e) | StoreError::DataDir { source: e, .. } => !matches!(
                e.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::InvalidInput
                    | std::io::ErrorKind::AlreadyExists
            ),
            // Unknown SQLite errors are retried by default so that nothing is lost (spec §5.4).
            StoreError::Sqlite(_) => true,
            // One table for the store and the indexes (docs/postgres.md "Errors").
            StoreError::Postgres(e) => PgFailure::of(e).is_retryable(),
            StoreError::AtPath { source, .. } => source.is_retryable(),
            StoreError::BadLayout { .. } => false,
            StoreError::NodeNotFound { .. }
            | StoreError::RelationNotFound { .. }
            | StoreError::EventNotFound { .. }
            | StoreError::JobNotFound { .. }
            | StoreError::KbNotFound { .. }
            | StoreError::KbExists { .. }
            | StoreError::KbStale { .. }
            | StoreError::KbRefused { .. }
            | StoreError::JobTransition { .. }
            | StoreError::AlreadyExists { .. }
            | StoreError::VersionConflict { .. }
            | StoreError::NotEmpty { .. }
            | StoreError::InvalidMove { .. }
            | StoreError::RootNotWritable
            | StoreError::UnknownConsumer { .. }
            | StoreError::StateTransition { .. }
            | StoreError::Corrupt(_)
            | StoreError::SchemaTooNew { .. } => false,
        }
    }
}

impl From<ce_core::UriError> for StoreError {
    fn from(e: ce_core::UriError) -> Self {
        StoreError::Core(CoreError::InvalidUri(e))
    }
}
