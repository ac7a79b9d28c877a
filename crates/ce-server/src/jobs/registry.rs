//! The job types this build runs: one [`JobHandler`] per type, registered in
//! [`JobRegistry::builtin`]. A new job type is one implementation and one line there.

use ce_core::CoreError;
use ce_core::config::JobsConfig;
use ce_store::{Job, TypeSlots};
use serde_json::Value;

use super::JobContext;
use super::reindex::ReindexJob;
use crate::engine::Engine;
use crate::error::Result;

/// Runs the jobs of one type.
pub trait JobHandler: Send + Sync {
    /// The job type it runs (`[a-z][a-z0-9_-]{0,63}`).
    fn job_type(&self) -> &'static str;

    /// Checks a payload: at enqueue (a bad one is refused), and again before each run.
    fn validate(&self, payload: &Value) -> Result<()>;

    /// Whether this engine can run the type's jobs; a runner that cannot does not claim them
    /// (e.g. `ce worker --consumer keyword` serves one index only).
    fn runs_on(&self, engine: &Engine) -> bool;

    /// Runs one job and returns its result (stored as the job's `progress`). It calls
    /// [`JobContext::checkpoint`] between steps, so that a cancel or a lost lease stops it
    /// there; an error is classified by its `Classify` (code, retryable).
    fn run(&self, engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>>;
}

/// Every job type this build runs.
pub struct JobRegistry {
    handlers: Vec<Box<dyn JobHandler>>,
}

impl JobRegistry {
    /// The job types of this build.
    pub fn builtin() -> Self {
        let mut r = JobRegistry {
            handlers: Vec::new(),
        };
        r.register(ReindexJob);
        r.register(crate::sessions::phase2::SessionCommitJob);
        r.register(crate::kb::handlers::PrepareRoot);
        r.register(crate::kb::handlers::IndexDocuments);
        r.register(crate::kb::handlers::DeleteSubtree);
        r.register(crate::kb::handlers::ReindexSubtree);
        r
    }

    /// A registry of `handlers` only (the runner's tests).
    #[cfg(test)]
    pub(super) fn of(handlers: Vec<Box<dyn JobHandler>>) -> Self {
        JobRegistry { handlers }
    }

    fn register(&mut self, handler: impl JobHandler + 'static) {
        debug_assert!(
            ce_core::config::valid_job_type(handler.job_type())
                && self.get(handler.job_type()).is_none(),
            "job type {:?} is invalid or registered twice",
            handler.job_type()
        );
        self.handlers.push(Box::new(handler));
    }

    fn get(&self, job_type: &str) -> Option<&dyn JobHandler> {
        self.handlers
            .iter()
            .find(|h| h.job_type() == job_type)
            .map(AsRef::as_ref)
    }

    /// The handler of `job_type`; an unknown type is `invalid_field`.
    pub fn handler(&self, job_type: &str) -> Result<&dyn JobHandler> {
        self.get(job_type).ok_or_else(|| {
            CoreError::InvalidField {
                field: "job_type",
                reason: format!(
                    "{job_type:?} is not a job type of this build ({})",
                    self.types().join(", ")
                ),
            }
            .into()
        })
    }

    /// The registered job types.
    pub fn types(&self) -> Vec<&'static str> {
        self.handlers.iter().map(|h| h.job_type()).collect()
    }

    /// Checks that `job_type` is registered and that its handler accepts `payload`.
    pub fn validate(&self, job_type: &str, payload: &Value) -> Result<()> {
        self.handler(job_type)?.validate(payload)
    }

    /// The claim slots of the types `engine` can run, with their `[jobs]` concurrency.
    pub fn slots(&self, engine: &Engine, config: &JobsConfig) -> Vec<TypeSlots> {
        self.handlers
            .iter()
            .filter(|h| h.runs_on(engine))
            .map(|h| TypeSlots {
                job_type: h.job_type().to_owned(),
                concurrency: config.settings(h.job_type()).concurrency,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_type_is_an_invalid_field_naming_the_known_ones() {
        let r = JobRegistry::builtin();
        assert_eq!(
            r.types(),
            [
                "reindex",
                "session-commit",
                "kb-prepare-root",
                "kb-index-documents",
                "kb-delete-subtree",
                "kb-reindex-subtree"
            ]
        );
        let e = r
            .validate("summarize", &serde_json::json!({}))
            .expect_err("unknown");
        assert_eq!(
            ce_core::Classify::code(&e),
            ce_core::ErrorCode::InvalidField
        );
        let text = e.to_string();
        assert!(
            text.contains("summarize") && text.contains("reindex"),
            "{text}"
        );
    }
}
