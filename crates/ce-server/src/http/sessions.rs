//! The session routes (docs/sessions.md, docs/http-api.md): `POST /v1/sessions/new`,
//! `POST /v1/sessions/add`, `GET /v1/sessions/show?uri=`, `GET /v1/sessions/ls?uri=`,
//! `POST /v1/sessions/commit` (Phase 1; answers the job id of Phase 2, or `skipped`).
//! Tenant routes: the session's account and owner space must be the caller's.

use axum::extract::{Extension, State};
use ce_core::CtxUri;
use ce_session::Role;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AppState;
use super::auth::Principal;
use super::handlers::{Answer, J, Q, body, params, scoped};
use super::openapi::{Param, schema};
use crate::sessions::AddMessage;
use crate::wire;

/// `POST /v1/sessions/new`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSessionBody {
    /// The session, `ctx://A/users/U/sessions/S` or `ctx://A/agents/G/sessions/S`.
    #[schemars(with = "CtxUri")]
    pub uri: String,
    /// A title (the session node's content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// `POST /v1/sessions/add`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMessageBody {
    /// The session.
    #[schemars(with = "CtxUri")]
    pub uri: String,
    /// Who said it.
    pub role: Role,
    /// What was said (non-empty).
    pub content: String,
    /// The client's message id (a retried append with it does not duplicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When it was said, in milliseconds since the epoch (default: now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<i64>,
    /// Tool calls or other parts, kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Value>,
}

/// `POST /v1/sessions/commit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitBody {
    /// The session.
    #[schemars(with = "CtxUri")]
    pub uri: String,
}

/// `GET /v1/sessions/show`.
pub(super) const SHOW: &[Param] = &[Param::required("uri", schema::<CtxUri>(), "The session.")];
/// `GET /v1/sessions/ls`.
pub(super) const LS: &[Param] = &[Param::optional(
    "uri",
    schema::<CtxUri>(),
    "An account, an owner (`ctx://A/users/U`) or its sessions folder (default: every account).",
)];

/// `POST /v1/sessions/new`.
pub async fn new(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<NewSessionBody>,
) -> Answer {
    let b = body(b)?;
    let uri = wire::uri(&b.uri)?;
    scoped(&s, p, move |e, scope| {
        scope.check_put(&uri, &ce_store::PutRequest::default())?;
        Ok(e.sessions().create(&uri, b.title)?)
    })
    .await
}

/// `POST /v1/sessions/add`.
pub async fn add(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<AddMessageBody>,
) -> Answer {
    let b = body(b)?;
    let req = AddMessage {
        uri: wire::uri(&b.uri)?,
        role: b.role,
        content: b.content,
        id: b.id,
        time_ms: b.time_ms,
        parts: b.parts,
    };
    scoped(&s, p, move |e, scope| {
        scope.check_write(&req.uri)?;
        Ok(e.sessions().add(req)?)
    })
    .await
}

/// `GET /v1/sessions/show?uri=`.
pub async fn show(State(s): State<AppState>, Extension(p): Extension<Principal>, q: Q) -> Answer {
    let uri = params(q, SHOW)?.uri("uri")?;
    scoped(&s, p, move |e, scope| {
        scope.check_read(&uri)?;
        Ok(e.sessions().show(&uri)?)
    })
    .await
}

/// `GET /v1/sessions/ls?uri=`.
pub async fn ls(State(s): State<AppState>, Extension(p): Extension<Principal>, q: Q) -> Answer {
    let params = params(q, LS)?;
    let uri = params.get("uri").map(wire::uri).transpose()?;
    scoped(&s, p, move |e, scope| {
        if let Some(u) = &uri {
            scope.principal().check_read(u)?;
        }
        let mut out = e.sessions().ls(uri.as_ref())?;
        scope.retain(&mut out, |s| &s.uri)?;
        Ok(out)
    })
    .await
}

/// `POST /v1/sessions/commit`.
pub async fn commit(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<CommitBody>,
) -> Answer {
    let b = body(b)?;
    let uri = wire::uri(&b.uri)?;
    scoped(&s, p, move |e, scope| {
        scope.check_write(&uri)?;
        Ok(e.sessions().commit(&uri)?)
    })
    .await
}
