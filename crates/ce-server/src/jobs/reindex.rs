//! The `reindex` job type: payload `{"consumer": C, "take_over": bool}`. It takes the
//! consumer over first when asked ([`Engine::take_over`]), then rebuilds its index
//! ([`Engine::reindex`]: the repair events, then the cleared index); its result is the
//! [`ReindexReport`]. `ce reindex` and `POST /v1/reindex` enqueue it with the idempotency key
//! `reindex:C`, so concurrent requests for one consumer share one job.
//!
//! It runs only on an engine that serves every configured consumer: a `ce worker --consumer`
//! that opens one index leaves it to another runner.

use ce_core::CoreError;
use ce_store::{Job, JobSpec};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{JobContext, JobHandler};
use crate::engine::Engine;
use crate::engine::consumers;
use crate::error::{Result, ServerError};
use crate::status::ReindexReport;

/// The job type.
pub const REINDEX_JOB: &str = "reindex";

/// A `reindex` job's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReindexPayload {
    /// The consumer whose index to rebuild.
    pub consumer: String,
    /// Make the running data directory the consumer's owner first (docs/indexing.md).
    #[serde(default)]
    pub take_over: bool,
}

impl ReindexPayload {
    /// A payload for `consumer`, checked: it must be a consumer this build has an index for.
    pub fn new(consumer: &str, take_over: bool) -> Result<Self> {
        let p = ReindexPayload {
            consumer: consumer.to_owned(),
            take_over,
        };
        p.check()?;
        Ok(p)
    }

    fn check(&self) -> Result<()> {
        if consumers::registration(&self.consumer).is_none() {
            return Err(consumers::unknown(&self.consumer));
        }
        Ok(())
    }

    fn parse(payload: &Value) -> Result<Self> {
        let p = ReindexPayload::deserialize(payload).map_err(|e| CoreError::InvalidField {
            field: "payload",
            reason: format!("not a reindex payload {{\"consumer\", \"take_over\"}}: {e}"),
        })?;
        p.check()?;
        Ok(p)
    }

    /// The job to enqueue: keyed `reindex:C`.
    pub fn spec(&self) -> JobSpec {
        JobSpec {
            job_type: REINDEX_JOB.into(),
            payload: serde_json::json!(self),
            idempotency_key: Some(format!("{REINDEX_JOB}:{}", self.consumer)),
            run_at_ms: None,
            parent_job_id: None,
        }
    }
}

/// Reads a completed `reindex` job's result.
pub fn report_of(job: &Job) -> Result<ReindexReport> {
    let result = job.progress.clone().unwrap_or_default();
    ReindexReport::deserialize(&result).map_err(|e| {
        ServerError::Internal(format!(
            "job {} has no reindex report as its result ({e}): {result}",
            job.id
        ))
    })
}

/// Runs `reindex` jobs.
pub struct ReindexJob;

impl JobHandler for ReindexJob {
    fn job_type(&self) -> &'static str {
        REINDEX_JOB
    }

    fn validate(&self, payload: &Value) -> Result<()> {
        ReindexPayload::parse(payload).map(drop)
    }

    fn runs_on(&self, engine: &Engine) -> bool {
        engine.options().consumers.is_empty()
    }

    fn run(&self, engine: &Engine, job: &Job, ctx: &JobContext<'_>) -> Result<Option<Value>> {
        let p = ReindexPayload::parse(&job.payload)?;
        if p.take_over {
            engine.take_over(&p.consumer)?;
        }
        ctx.checkpoint()?;
        ctx.report(serde_json::json!({"stage": "requeue_and_clear", "consumer": p.consumer}));
        let report = engine.reindex(&p.consumer)?;
        let result = serde_json::to_value(&report)
            .map_err(|e| ServerError::Internal(format!("encoding the reindex report: {e}")))?;
        Ok(Some(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_checked_and_keyed_by_consumer() {
        let p = ReindexPayload::new("keyword", false).expect("keyword");
        let spec = p.spec();
        assert_eq!(spec.idempotency_key.as_deref(), Some("reindex:keyword"));
        assert_eq!(
            spec.payload,
            serde_json::json!({"consumer": "keyword", "take_over": false})
        );
        assert!(ReindexJob.validate(&spec.payload).is_ok());
        for bad in [
            serde_json::json!({"consumer": "graph"}),
            serde_json::json!({"consumer": "vector", "extra": 1}),
            serde_json::json!({"take_over": true}),
            serde_json::json!("vector"),
        ] {
            let e = ReindexJob.validate(&bad).expect_err("refused");
            assert_eq!(
                ce_core::Classify::code(&e),
                ce_core::ErrorCode::InvalidField,
                "{bad}"
            );
        }
        assert!(ReindexPayload::new("graph", false).is_err());
    }
}
