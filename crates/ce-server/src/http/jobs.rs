//! The job routes (admin only; docs/jobs.md): `GET /v1/jobs?state=&type=&limit=`,
//! `GET /v1/jobs/{id}`, `POST /v1/jobs/{id}/cancel`, `POST /v1/jobs/{id}/retry`; and
//! `POST /v1/reindex`, which enqueues a `reindex` job and answers once it has run (or at
//! once with `"no_wait": true`).

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use ce_core::ErrorCode;
use ce_store::{Job, JobFilter};
use serde::Serialize;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::handlers::{Answer, NoBody as B, Q, blocking, list_limit, no_fields, params};
use super::openapi::{Param, schema};
use crate::engine::Engine;
use crate::engine::consumers::DEFAULT_REINDEX_CONSUMER;
use crate::jobs::reindex::{ReindexPayload, report_of};
use crate::jobs::{job_error, parse_state};
use crate::wire::{JobQueued, Object, ReindexAnswer, ReindexBody};

/// Jobs a list answers when no `limit` is given.
const DEFAULT_LIMIT: u32 = 100;

/// `GET /v1/jobs`.
pub(super) const LIST: &[Param] = &[
    Param::optional(
        "state",
        schema::<ce_store::JobState>(),
        "Only jobs in this state.",
    ),
    Param::optional(
        "type",
        schema::<String>(),
        "Only jobs of this type, e.g. `reindex`.",
    ),
    Param::optional(
        "limit",
        list_limit,
        "At most this many (1..=10000, default 100).",
    ),
];

type P = Result<Path<String>, PathRejection>;

fn job_id(p: P) -> Result<String, ApiError> {
    p.map(|Path(id)| id).map_err(|r| {
        ApiError::new(
            ErrorCode::InvalidField,
            format!("bad job id in the path: {}", r.body_text()),
            false,
        )
    })
}

fn json(v: &impl Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(|e| {
        ApiError::new(
            ErrorCode::Internal,
            format!("encoding the answer: {e}"),
            false,
        )
    })
}

/// `GET /v1/jobs?state=&type=&limit=` (newest first).
pub async fn list(State(s): State<AppState>, q: Q) -> Answer {
    let p = params(q, LIST)?;
    let limit = p.number::<u32>("limit")?;
    ce_store::check_list_limit(limit)?;
    let filter = JobFilter {
        state: p.get("state").map(parse_state).transpose()?,
        job_type: p.get("type").map(str::to_owned),
        parent_job_id: None,
        limit: limit.unwrap_or(DEFAULT_LIMIT) as usize,
    };
    blocking(&s, move |e| Ok(e.list_jobs(&filter)?)).await
}

/// `GET /v1/jobs/{id}`.
pub async fn show(State(s): State<AppState>, id: P) -> Answer {
    let id = job_id(id)?;
    blocking(&s, move |e| Ok(e.job(&id)?)).await
}

/// Runs `change` on job `id` of a cancel or retry request.
async fn change(
    s: &AppState,
    id: P,
    b: B,
    change: fn(&Engine, &str) -> crate::Result<Job>,
) -> Answer {
    let id = job_id(id)?;
    no_fields(b)?;
    blocking(s, move |e| Ok(change(e, &id)?)).await
}

/// `POST /v1/jobs/{id}/cancel` (body: none or `{}`).
pub async fn cancel(State(s): State<AppState>, id: P, b: B) -> Answer {
    change(&s, id, b, Engine::cancel_job).await
}

/// `POST /v1/jobs/{id}/retry` (body: none or `{}`).
pub async fn retry(State(s): State<AppState>, id: P, b: B) -> Answer {
    change(&s, id, b, Engine::retry_job).await
}

/// `POST /v1/reindex` (body optional: `{"consumer": "vector", "no_wait": false}`): enqueues
/// the `reindex` job (key `reindex:C`: a request while one is queued or running shares it).
/// With `no_wait`, answers [`JobQueued`]; else waits for the job and answers its report
/// with the job id ([`ReindexAnswer`]), or the job's error. The server's job runner runs
/// it; a server without one (`[jobs].enabled = false`) runs it in the request.
pub async fn reindex(
    State(s): State<AppState>,
    b: Result<Json<Object<ReindexBody>>, JsonRejection>,
) -> Answer {
    let body = match b {
        Ok(Json(Object(b))) => b,
        // An empty body means the defaults.
        Err(JsonRejection::MissingJsonContentType(_)) => ReindexBody::default(),
        Err(r) => return Err(ApiError::from_json(&r)),
    };
    let consumer = body
        .consumer
        .unwrap_or_else(|| DEFAULT_REINDEX_CONSUMER.to_owned());
    let payload = ReindexPayload::new(&consumer, false)?;
    blocking(&s, move |e| {
        let queued = JobQueued::from(e.enqueue_job(payload.spec())?);
        if body.no_wait {
            return json(&queued);
        }
        let job = e.follow_job(&queued.job_id, !e.job_runner_running(), &|_| {})?;
        if let Some(err) = job_error(&job) {
            return Err(err.into());
        }
        json(&ReindexAnswer {
            report: report_of(&job)?,
            job_id: job.id,
        })
    })
    .await
}
