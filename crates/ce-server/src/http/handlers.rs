//! One handler per route. Store and index calls block, so each runs on the blocking pool;
//! a panic there becomes a 500 answer, never a crashed server.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Extension, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use ce_core::{CtxUri, DeliveryStatus, EventPayload, EventType, Level, OutboxEventCreate};
use ce_index::relation::Direction;
use ce_retrieval::{DEFAULT_RELATED_LIMIT, RelatedRequest};
use ce_store::OutboxFilter;
use serde::Serialize;

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use super::openapi::{Param, schema};
use super::params::Params;
use super::scope::Scope;
use crate::engine::Engine;
use crate::error::ServerError;
use crate::wire::{
    self, AppendBody, CatAnswer, ErrorBody, Health, LinkBody, MvBody, NotReady, Object,
    OutboxShowAnswer, PutBody, Ready, RmBody, SearchBody, UnlinkBody,
};
use schemars::{Schema, SchemaGenerator, json_schema};

pub(super) type Answer = Result<Response, ApiError>;
pub(super) type Q = Result<Query<Vec<(String, String)>>, QueryRejection>;
pub(super) type J<T> = Result<Json<Object<T>>, JsonRejection>;

/// The body of a route that takes none: nothing, or `{}` (cancel, retry, a base's removal).
#[derive(Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoFields {}

/// A body that must be empty or `{}` (a request without `Content-Type` has none); read
/// like any JSON body, so one over the size limit is refused as too large.
pub(super) type NoBody = J<NoFields>;

/// Refuses a [`NoBody`] that holds anything.
pub(super) fn no_fields(b: NoBody) -> Result<(), ApiError> {
    match b {
        Ok(_) | Err(JsonRejection::MissingJsonContentType(_)) => Ok(()),
        Err(r) => Err(ApiError::from_json(&r)),
    }
}

pub(super) fn body<T>(b: J<T>) -> Result<T, ApiError> {
    b.map(|Json(Object(t))| t)
        .map_err(|r| ApiError::from_json(&r))
}

/// The query string of a request, checked against the parameters its operation documents.
pub(super) fn params(q: Q, allowed: &[Param]) -> Result<Params, ApiError> {
    let Query(pairs) = q.map_err(|r| ApiError::from_query(&r))?;
    let names: Vec<&'static str> = allowed.iter().map(|p| p.name).collect();
    Ok(Params::new(pairs, &names)?)
}

/// No query parameters.
pub(super) const NONE: &[Param] = &[];
const URI: Param = Param::required("uri", schema::<CtxUri>(), "The node.");
const LIMIT: Param = Param::optional("limit", list_limit, "At most this many rows (1..=10000).");

/// The schema of a list's `limit` (see `ce_store::check_list_limit`).
pub(super) fn list_limit(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer", "minimum": 1, "maximum": ce_store::MAX_LIST_LIMIT})
}

/// The schema of `GET /v1/related`'s `limit`.
fn related_limit(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer", "minimum": 1, "maximum": ce_retrieval::MAX_RELATED_LIMIT})
}
/// `GET /v1/cat`.
pub(super) const CAT: &[Param] = &[
    URI,
    Param::optional(
        "level",
        schema::<Level>(),
        "The layer: 0, 1 or 2 (default 2).",
    ),
];
/// `GET /v1/stat`.
pub(super) const STAT: &[Param] = &[URI];
/// `GET /v1/ls`.
pub(super) const LS: &[Param] = &[Param::optional(
    "uri",
    schema::<CtxUri>(),
    "The node (default `ctx://`: the accounts).",
)];
/// `GET /v1/tree`.
pub(super) const TREE: &[Param] = &[
    URI,
    Param::optional(
        "depth",
        schema::<u32>(),
        "Levels below the node (default: all).",
    ),
];
/// `GET /v1/relations`.
pub(super) const RELATIONS: &[Param] = &[URI];
/// `GET /v1/related`.
pub(super) const RELATED: &[Param] = &[
    URI,
    Param::optional("type", schema::<String>(), "Only relations of this type."),
    Param::optional(
        "direction",
        schema::<Direction>(),
        "`out` (default), `in` or `both`.",
    ),
    Param::optional(
        "limit",
        related_limit,
        "At most this many edges (1..=1000, default 50).",
    ),
];
/// `GET /v1/outbox/list`.
pub(super) const OUTBOX_LIST: &[Param] = &[
    Param::optional(
        "status",
        schema::<DeliveryStatus>(),
        "Only deliveries in this state.",
    ),
    Param::optional(
        "consumer",
        schema::<String>(),
        "Only this consumer's deliveries.",
    ),
    Param::optional("type", schema::<EventType>(), "Only events of this type."),
    Param::optional(
        "after",
        schema::<i64>(),
        "Only events after this sequence number.",
    ),
    Param::optional(
        "after_consumer",
        schema::<String>(),
        "With `after`: the page's last consumer.",
    ),
    LIMIT,
];
/// `GET /v1/outbox/show`.
pub(super) const OUTBOX_SHOW: &[Param] = &[Param::required(
    "id",
    schema::<String>(),
    "The event id or sequence number.",
)];

/// Runs `f` on the blocking pool (store and index calls block); a panic there is an
/// `internal` error, never a crashed server. Shared with the MCP tools.
pub(crate) async fn on_blocking_pool<T, F>(engine: &Arc<Engine>, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&Engine) -> Result<T, ApiError> + Send + 'static,
{
    let engine = engine.clone();
    match tokio::task::spawn_blocking(move || f(&engine)).await {
        Ok(r) => r,
        Err(e) => Err(ApiError::task_failed("request", &e)),
    }
}

/// Runs `f` on the blocking pool and answers its value as JSON.
pub(super) async fn blocking<T, F>(state: &AppState, f: F) -> Answer
where
    T: Serialize + Send + 'static,
    F: FnOnce(&Engine) -> Result<T, ApiError> + Send + 'static,
{
    let v = on_blocking_pool(&state.engine, f).await?;
    ce_core::failpoint::hit("http.before_reply");
    Ok(Json(v).into_response())
}

/// Runs `f` on the blocking pool with the caller's [`Scope`] (tenant routes; see
/// `super::scope` for what a route must check).
pub(super) async fn scoped<T, F>(state: &AppState, p: Principal, f: F) -> Answer
where
    T: Serialize + Send + 'static,
    F: FnOnce(&Engine, &Scope<'_>) -> Result<T, ApiError> + Send + 'static,
{
    blocking(state, move |e| f(e, &Scope::new(&p, e.store().as_ref()))).await
}

/// `POST /v1/put`.
pub async fn put(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<PutBody>,
) -> Answer {
    let (uri, req) = body(b)?.into_request()?;
    scoped(&s, p, move |e, scope| {
        scope.check_put(&uri, &req)?;
        Ok(e.put(&uri, req)?)
    })
    .await
}

/// `GET /v1/cat?uri=&level=`.
pub async fn cat(State(s): State<AppState>, Extension(p): Extension<Principal>, q: Q) -> Answer {
    let params = params(q, CAT)?;
    let uri = params.uri("uri")?;
    let level = params.level("level")?.unwrap_or(Level::L2);
    scoped(&s, p, move |e, scope| {
        let projector = ce_core::IndexProjector::new(e.config().projector);
        Ok(CatAnswer::of(&scope.read_node(&uri)?, level, &projector))
    })
    .await
}

/// `GET /v1/stat?uri=`.
pub async fn stat(State(s): State<AppState>, Extension(p): Extension<Principal>, q: Q) -> Answer {
    let uri = params(q, STAT)?.uri("uri")?;
    scoped(&s, p, move |_, scope| scope.stat(&uri)).await
}

/// `GET /v1/ls?uri=` (default: the root, which lists accounts — a tenant's own only).
pub async fn ls(State(s): State<AppState>, Extension(p): Extension<Principal>, q: Q) -> Answer {
    let uri = params(q, LS)?.uri_or("uri", CtxUri::root())?;
    scoped(&s, p, move |_, scope| scope.ls(&uri)).await
}

/// `GET /v1/tree?uri=&depth=`.
pub async fn tree(State(s): State<AppState>, Extension(p): Extension<Principal>, q: Q) -> Answer {
    let params = params(q, TREE)?;
    let uri = params.uri("uri")?;
    let depth = params.number::<u32>("depth")?;
    scoped(&s, p, move |_, scope| scope.tree(&uri, depth)).await
}

/// `POST /v1/rm`.
pub async fn rm(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<RmBody>,
) -> Answer {
    let b = body(b)?;
    let uri = wire::uri(&b.uri)?;
    scoped(&s, p, move |e, scope| {
        scope.check_rm(&uri, b.recursive)?;
        Ok(e.rm(&uri, b.recursive, b.expect_version, b.trace_id)?)
    })
    .await
}

/// `POST /v1/mv`.
pub async fn mv(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<MvBody>,
) -> Answer {
    let b = body(b)?;
    let (from, to) = (wire::uri(&b.from)?, wire::uri(&b.to)?);
    scoped(&s, p, move |e, scope| {
        scope.check_mv(&from, &to)?;
        Ok(e.mv(&from, &to, b.trace_id)?)
    })
    .await
}

/// `POST /v1/link`.
pub async fn link(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<LinkBody>,
) -> Answer {
    let req = body(b)?.into_request()?;
    scoped(&s, p, move |e, scope| {
        scope.check_link(&req.from, &req.to)?;
        Ok(e.link(req)?)
    })
    .await
}

/// `POST /v1/unlink`.
pub async fn unlink(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<UnlinkBody>,
) -> Answer {
    let b = body(b)?;
    let (from, to) = (wire::uri(&b.from)?, wire::uri(&b.to)?);
    scoped(&s, p, move |e, scope| {
        scope.check_link(&from, &to)?;
        Ok(e.unlink(&from, &to, &b.relation_type, b.trace_id)?)
    })
    .await
}

/// `GET /v1/relations?uri=` (edges whose other end the caller does not see are left out).
pub async fn relations(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    q: Q,
) -> Answer {
    let uri = params(q, RELATIONS)?.uri("uri")?;
    scoped(&s, p, move |e, scope| {
        scope.check_read(&uri)?;
        scope.relations(e.store().relations(&uri)?)
    })
    .await
}

/// `GET /v1/related?uri=U[&type=T][&direction=out|in|both][&limit=N]`: the node's edges from
/// the relation index, checked against the source; edges whose other end the caller may not
/// see are left out.
pub async fn related(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    q: Q,
) -> Answer {
    let q = params(q, RELATED)?;
    let req = RelatedRequest {
        uri: q.uri("uri")?,
        relation_type: q.get("type").map(str::to_owned),
        direction: q.parse("direction")?.unwrap_or(Direction::Out),
        limit: q.number("limit")?.unwrap_or(DEFAULT_RELATED_LIMIT),
    };
    scoped(&s, p, move |e, scope| {
        scope.check_read(&req.uri)?;
        let mut answer = e.related(&req)?;
        scope.retain(&mut answer.edges, |x| &x.other)?;
        Ok(answer)
    })
    .await
}

/// `POST /v1/search` (the filter is forced into the caller's account and owner spaces).
pub async fn search(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    b: J<SearchBody>,
) -> Answer {
    let b = body(b)?;
    scoped(&s, p, move |e, scope| run_search(e, scope, b)).await
}

/// The answer of a search: flat (vector, keyword, hybrid) or hierarchical.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum SearchAnswer {
    /// Vector, keyword or hybrid.
    Flat(ce_retrieval::SearchResponse),
    /// Hierarchical.
    Hierarchical(ce_retrieval::HierarchicalResponse),
}

/// Runs the search of `b` for `scope`'s caller: the filter is forced into the caller's
/// account and owner spaces, and the source of truth has the last word on every hit.
/// Shared by `POST /v1/search` and the MCP `search` tool.
pub(crate) fn run_search(
    e: &Engine,
    scope: &Scope<'_>,
    b: SearchBody,
) -> Result<SearchAnswer, ApiError> {
    if b.is_hierarchical() {
        let mut req = b.into_hierarchical()?;
        scope.principal().scope_filter(&mut req.search.filter)?;
        let mut answer = e.hierarchical(&req)?;
        scope.retain(&mut answer.hits, |h| &h.uri)?;
        return Ok(SearchAnswer::Hierarchical(answer));
    }
    let explain = b.explain;
    let mut req = b.into_request()?;
    req.validate()?;
    scope.principal().scope_filter(&mut req.filter)?;
    let mut answer = e.search(&req)?;
    // The index filter already did this; the source of truth has the last word.
    scope.retain(&mut answer.hits, |h| &h.uri)?;
    if explain {
        scope.retain(&mut answer.dropped, |d| &d.uri)?;
    } else {
        answer.dropped.clear();
    }
    Ok(SearchAnswer::Flat(answer))
}

/// `GET /v1/outbox/list?status=&consumer=&type=&after=&after_consumer=&limit=`.
pub async fn outbox_list(State(s): State<AppState>, q: Q) -> Answer {
    let p = params(q, OUTBOX_LIST)?;
    let filter = OutboxFilter {
        status: p.parse::<DeliveryStatus>("status")?,
        consumer: p.get("consumer").map(str::to_owned),
        event_type: p.parse::<EventType>("type")?,
        after_seq: p.number("after")?,
        after_consumer: p.get("after_consumer").map(str::to_owned),
        limit: p.number("limit")?,
    };
    ce_store::check_list_limit(filter.limit)?;
    blocking(&s, move |e| Ok(e.store().list(&filter)?)).await
}

/// `GET /v1/outbox/show?id=` (event id or sequence number).
pub async fn outbox_show(State(s): State<AppState>, q: Q) -> Answer {
    let p = params(q, OUTBOX_SHOW)?;
    let id = p.get("id").unwrap_or_default().trim().to_owned();
    blocking(&s, move |e| {
        let (event, deliveries) = e.store().show(&id)?;
        Ok(OutboxShowAnswer { event, deliveries })
    })
    .await
}

/// `GET /v1/outbox/stats`.
pub async fn outbox_stats(State(s): State<AppState>, q: Q) -> Answer {
    params(q, NONE)?;
    blocking(&s, move |e| Ok(e.store().stats()?)).await
}

/// `POST /v1/outbox/append` (admin / repair).
pub async fn outbox_append(State(s): State<AppState>, b: J<AppendBody>) -> Answer {
    let b = body(b)?;
    let payload = EventPayload::parse(&b.event_type, &b.payload)?;
    blocking(&s, move |e| {
        Ok(e.append_event(OutboxEventCreate { payload })?)
    })
    .await
}

/// `GET /v1/status`.
pub async fn status(State(s): State<AppState>, q: Q) -> Answer {
    params(q, NONE)?;
    blocking(&s, move |e| Ok(e.status()?)).await
}

/// `GET /healthz`: 200 while the process serves.
pub async fn healthz() -> Response {
    Json(Health {
        status: "ok".into(),
    })
    .into_response()
}

/// `GET /readyz`: 200 when ready, else 503 with the reasons.
pub async fn readyz(State(s): State<AppState>) -> Response {
    let r = s.engine.readiness();
    if r.ready {
        return Json(Ready { ready: true }).into_response();
    }
    let body = NotReady {
        error: ErrorBody {
            code: ce_core::ErrorCode::Unavailable.as_str().to_owned(),
            message: format!("not ready: {}", r.reasons.join("; ")),
            retryable: true,
        },
        reasons: r.reasons,
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// `GET /metrics`: Prometheus text, outbox gauges refreshed first.
pub async fn metrics(State(s): State<AppState>) -> Answer {
    let Some(m) = s.metrics.clone() else {
        return Err(ApiError::from(ServerError::NotReady {
            reason: "metrics are not enabled in this process".into(),
            code: ce_core::ErrorCode::Unavailable,
        }));
    };
    let engine = s.engine.clone();
    let text = tokio::task::spawn_blocking(move || m.render(&engine))
        .await
        .map_err(|e| ApiError::task_failed("metrics", &e))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Any other path: 404 `not_found`.
pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ce_core::ErrorCode::NotFound,
        format!("no route {}: see docs/http-api.md", uri.path()),
        false,
    )
}

/// A known path with the wrong method: 405.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    let mut e = ApiError::new(
        ce_core::ErrorCode::InvalidField,
        format!("method {method} is not allowed on {}", uri.path()),
        false,
    );
    e.status = StatusCode::METHOD_NOT_ALLOWED;
    e
}
