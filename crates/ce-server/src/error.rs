//! Engine and server errors, classified by the layer they come from.

use ce_core::{Classify, CoreError, ErrorCode};
use ce_embed::EmbedError;
use ce_index::IndexError;
use ce_lock::LockError;
use ce_retrieval::RetrievalError;
use ce_store::StoreError;

/// Result of an engine or server operation.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;

/// Everything the engine and the server can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Bad input caught by the core model.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The source of truth refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The vector index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The embedder failed.
    #[error(transparent)]
    Embed(#[from] EmbedError),
    /// The derived-layer generator (its configuration, at open).
    #[error(transparent)]
    Derive(#[from] ce_derive::DeriveError),
    /// A search failed.
    #[error(transparent)]
    Retrieval(#[from] RetrievalError),
    /// A path lock was busy, lost, or its provider failed.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A session operation or memory extraction failed (docs/sessions.md).
    #[error(transparent)]
    Session(#[from] ce_session::SessionError),
    /// An input no parser reads, or one that cannot be parsed (an item's error).
    #[error(transparent)]
    Ingest(#[from] ce_ingest::IngestError),
    /// The engine cannot serve this yet (model missing, index bound to another model).
    #[error("not ready: {reason}")]
    NotReady {
        /// Why, and how to fix it.
        reason: String,
        /// The code that explains it best (`unavailable` or `schema_mismatch`).
        code: ErrorCode,
    },
    /// A consumer this engine has no worker for.
    #[error("consumer {name:?} is not served here: {reason}")]
    UnsupportedConsumer {
        /// The name asked for.
        name: String,
        /// Why.
        reason: String,
    },
    /// Binding, serving or a signal handler failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A defect of this build (a worker panicked, a value did not serialise, the metrics
    /// recorder could not be installed): retrying the same operation meets it again.
    #[error("internal error: {0}")]
    Internal(String),
    /// An operation this engine cannot do in the way it runs (e.g. a drain while its
    /// workers run continuously): a caller's mistake, not a failure.
    #[error("{0}")]
    Usage(String),
    /// A file of the data directory holds what no process writes (e.g. an empty instance
    /// id); the reason says how to recover.
    #[error("{path} is corrupt: {reason}")]
    CorruptFile {
        /// The file.
        path: String,
        /// What is wrong, and the fix.
        reason: String,
    },
    /// A classified failure of a lower layer (e.g. a worker's), reported with what was being
    /// done; its code and retryability are kept, so a permanent error stays permanent up to
    /// the HTTP status and the exit code.
    #[error("{context}: {message}")]
    Failed {
        /// What was being done.
        context: String,
        /// The failure's code.
        code: ErrorCode,
        /// Whether retrying may succeed.
        retryable: bool,
        /// The failure's message.
        message: String,
    },
    /// A path lock is busy because an import's hold keeps it (docs/locks.md, "Holds").
    #[error(
        "{path} is busy: import {hold} locks {at} until its events are indexed (recorded \
         {age_seconds} s ago; `ce status` lists the holds); run `ce worker --once` on the data \
         directory, or keep `ce serve` running, to index it and end the hold, then retry"
    )]
    HeldByImport {
        /// The path that could not be locked.
        path: ce_core::CtxUri,
        /// The hold's id (the import's `hold`).
        hold: String,
        /// The subtree the hold locks.
        at: ce_core::CtxUri,
        /// The hold's age.
        age_seconds: u64,
    },
    /// Another index instance owns the embedded index of the consumer this process would
    /// consume (docs/indexing.md, "One index per consumer").
    #[error(
        "consumer {consumer:?} is owned by another index instance: {} (data directory {} on \
         {}, owner for {age_seconds} s); this is instance {} (data directory {} on {}). Its \
         deliveries are split among whoever claims them, so a second embedded index would miss \
         records while the outbox shows them done. Run this consumer's workers only in the \
         owner's data directory (send searches there with --server); for the vector index use \
         a shared destination (index.vector.destination = \"pgvector\"); if the owner's data \
         directory is gone for good, stop its processes and take the consumer over here, \
         rebuilding its index: `ce reindex --consumer {consumer} --take-over`",
        owner.instance,
        owner.data_dir,
        owner.host,
        me.instance,
        me.data_dir,
        me.host
    )]
    ConsumerOwned {
        /// The consumer.
        consumer: String,
        /// The instance that owns it.
        owner: Box<ce_store::IndexOwner>,
        /// This data directory's instance.
        me: Box<ce_store::IndexOwner>,
        /// How long the owner has owned it.
        age_seconds: u64,
    },
    /// A job's handler stopped at a checkpoint (docs/jobs.md, "Runner"): a cancel was asked
    /// for, or its lease was lost to another runner.
    #[error("job {job_id} stopped: {stop}")]
    JobStopped {
        /// The job.
        job_id: String,
        /// Why.
        stop: crate::jobs::JobStop,
    },
    /// A derived deletion refused by the delete-safety policy (DESIGN.md decision 11); the
    /// reason names the counts and the override.
    #[error("large delete refused: {reason}")]
    LargeDelete {
        /// What would have been deleted, and how to proceed.
        reason: String,
    },
}

impl ServerError {
    /// `e` reported with `context`, keeping its classification.
    pub fn failed(context: impl Into<String>, e: &(impl Classify + std::fmt::Display)) -> Self {
        ServerError::Failed {
            context: context.into(),
            code: e.code(),
            retryable: e.is_retryable(),
            message: e.to_string(),
        }
    }

    /// Whether the store cannot be reached for now (its database restarting, a connection
    /// dropped, the embedded file busy): what a long-running process waits out at start
    /// instead of exiting (`ce serve`, `ce worker`).
    pub fn is_store_unavailable(&self) -> bool {
        matches!(self, ServerError::Store(e) if e.code() == ErrorCode::Unavailable)
    }
}

impl Classify for ServerError {
    fn code(&self) -> ErrorCode {
        match self {
            ServerError::Core(e) => e.code(),
            ServerError::Store(e) => e.code(),
            ServerError::Index(e) => e.code(),
            ServerError::Embed(e) => e.code(),
            ServerError::Derive(e) => e.code(),
            ServerError::Retrieval(e) => e.code(),
            ServerError::Lock(e) => e.code(),
            ServerError::Session(e) => e.code(),
            ServerError::Ingest(e) => e.code(),
            ServerError::NotReady { code, .. } => *code,
            ServerError::UnsupportedConsumer { .. } => ErrorCode::InvalidField,
            ServerError::ConsumerOwned { .. } => ErrorCode::InvalidConfig,
            ServerError::HeldByImport { .. } => ErrorCode::Busy,
            ServerError::Io { .. } => ErrorCode::Io,
            ServerError::Internal(_) => ErrorCode::Internal,
            ServerError::Usage(_) => ErrorCode::InvalidField,
            ServerError::CorruptFile { .. } => ErrorCode::Corrupt,
            ServerError::Failed { code, .. } => *code,
            ServerError::LargeDelete { .. } => ErrorCode::LargeDelete,
            ServerError::JobStopped { stop, .. } => stop.code(),
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            ServerError::Core(e) => e.is_retryable(),
            ServerError::Store(e) => e.is_retryable(),
            ServerError::Index(e) => e.is_retryable(),
            ServerError::Embed(e) => e.is_retryable(),
            ServerError::Derive(e) => e.is_retryable(),
            ServerError::Retrieval(e) => e.is_retryable(),
            ServerError::Lock(e) => e.is_retryable(),
            ServerError::Session(e) => e.is_retryable(),
            ServerError::Ingest(e) => e.is_retryable(),
            ServerError::NotReady { code, .. } => *code == ErrorCode::Unavailable,
            ServerError::Failed { retryable, .. } => *retryable,
            ServerError::JobStopped { stop, .. } => stop.is_retryable(),
            ServerError::UnsupportedConsumer { .. }
            | ServerError::ConsumerOwned { .. }
            | ServerError::LargeDelete { .. }
            | ServerError::Internal(_)
            | ServerError::Usage(_)
            | ServerError::CorruptFile { .. } => false,
            ServerError::Io { .. } | ServerError::HeldByImport { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use ce_index::repair::RepairError;

    use super::*;
    use crate::http::ApiError;

    /// `e`'s code and retryability, after every way it can reach a caller: converted into a
    /// [`ServerError`], reported with context ([`ServerError::failed`]), and as an HTTP
    /// answer.
    fn kept<E>(e: E) -> (ErrorCode, bool)
    where
        E: Classify + std::fmt::Display + Into<ServerError>,
    {
        let want = (e.code(), e.is_retryable());
        let failed = ServerError::failed("doing it", &e);
        assert_eq!((failed.code(), failed.is_retryable()), want, "failed: {e}");
        let converted: ServerError = e.into();
        assert_eq!(
            (converted.code(), converted.is_retryable()),
            want,
            "converted: {converted}"
        );
        let answer = ApiError::from(converted);
        assert_eq!(
            (answer.code, answer.retryable),
            want,
            "answered: {}",
            answer.message
        );
        want
    }

    /// Every layer's errors, a permanent and a transient one each, keep their
    /// classification up to the HTTP answer: none becomes retryable on the way.
    #[test]
    fn every_conversion_keeps_retryability() {
        let u = |s: &str| ce_core::CtxUri::parse(s).expect("uri");
        let permanent = [
            kept(StoreError::RootNotWritable),
            kept(IndexError::SchemaMismatch("dimension".into())),
            kept(IndexError::Postgres("syntax error".into())),
            kept(EmbedError::InvalidResponse("two vectors".into())),
            kept(EmbedError::Provider {
                status: Some(400),
                message: "bad request".into(),
                retryable: false,
            }),
            kept(RetrievalError::Index(IndexError::Corrupt(
                "bad page".into(),
            ))),
            kept(LockError::Invalid("empty batch".into())),
            kept(CoreError::InvalidField {
                field: "x",
                reason: "bad".into(),
            }),
            kept(RepairError::Index(IndexError::Corrupt("bad page".into()))),
        ];
        for (code, retryable) in permanent {
            assert!(!retryable, "{code} stays permanent");
        }
        let transient = [
            kept(StoreError::PgUnavailable("connection refused".into())),
            kept(IndexError::Unavailable("locked".into())),
            kept(EmbedError::Timeout {
                after: std::time::Duration::from_secs(1),
            }),
            kept(LockError::Lost {
                path: u("ctx://a"),
                reason: "expired".into(),
            }),
            kept(RepairError::Store(StoreError::PgUnavailable("down".into()))),
        ];
        for (code, retryable) in transient {
            assert!(retryable, "{code} stays retryable");
        }
    }

    /// The engine's own errors: a defect, a usage mistake or a corrupt file is permanent
    /// (exit status 1, 2 and 1); only I/O and a busy hold are worth a retry.
    #[test]
    fn the_engines_own_errors_are_classified() {
        let cases = [
            (
                ServerError::Internal("a worker panicked".into()),
                ErrorCode::Internal,
                false,
            ),
            (
                ServerError::Usage("drain needs the workers".into()),
                ErrorCode::InvalidField,
                false,
            ),
            (
                ServerError::CorruptFile {
                    path: "index-instance".into(),
                    reason: "it is empty".into(),
                },
                ErrorCode::Corrupt,
                false,
            ),
            (
                ServerError::NotReady {
                    reason: "no model".into(),
                    code: ErrorCode::SchemaMismatch,
                },
                ErrorCode::SchemaMismatch,
                false,
            ),
            (
                ServerError::NotReady {
                    reason: "no model".into(),
                    code: ErrorCode::Unavailable,
                },
                ErrorCode::Unavailable,
                true,
            ),
            (
                ServerError::Io {
                    context: "binding".into(),
                    source: std::io::Error::other("in use"),
                },
                ErrorCode::Io,
                true,
            ),
        ];
        for (e, code, retryable) in cases {
            assert_eq!((e.code(), e.is_retryable()), (code, retryable), "{e}");
        }
        assert_eq!(
            ServerError::Usage("x".into()).code().exit_code(),
            2,
            "a usage mistake exits 2"
        );
    }

    #[test]
    fn a_failure_reported_with_context_keeps_its_classification() {
        let permanent = StoreError::RootNotWritable;
        let e = ServerError::failed("the worker gave up", &permanent);
        assert_eq!((e.code(), e.is_retryable()), (ErrorCode::InvalidUri, false));
        assert_eq!(
            e.to_string(),
            format!("the worker gave up: {permanent}"),
            "the context leads the message"
        );
        let transient = StoreError::PgUnavailable("connection refused".into());
        let e = ServerError::failed("dry run of vector", &transient);
        assert_eq!((e.code(), e.is_retryable()), (ErrorCode::Unavailable, true));
    }
}
