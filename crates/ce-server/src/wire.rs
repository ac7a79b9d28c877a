//! The HTTP API's JSON bodies (see `docs/http-api.md`). The server deserializes them; the
//! CLI's `--server` mode serializes them. Domain values (URIs, levels, types, modes) travel as
//! plain JSON strings and numbers and are parsed by the core types, so bad input gets the same
//! typed error (`invalid_uri`, `invalid_level`, ...) over HTTP as on the command line.

use std::collections::BTreeMap;

use ce_core::{
    ContextNode, CoreError, CtxUri, Delivery, IndexProjector, Level, LevelSource, Meta, OutboxEvent,
};
use ce_index::vector::SearchFilter;
use ce_retrieval::{
    DEFAULT_EMBED_TIMEOUT, DEFAULT_TOP_K, HierarchicalParams, HierarchicalRequest, SearchRequest,
};
use ce_store::{LinkRequest, PutRequest};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// Parses a URI field (bad input is `invalid_uri`).
pub fn uri(s: &str) -> Result<CtxUri, CoreError> {
    Ok(CtxUri::parse(s)?)
}

/// A request body: a `T` from a JSON object only. serde's derived structs also accept an
/// array of their fields in order (`[null, null]`), which the API's schemas do not allow.
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        not_array(d).map(Object)
    }
}

/// Deserializes a `T` from any JSON value but an array (for a struct-typed field:
/// `#[serde(deserialize_with = "crate::wire::not_array")]`; see [`Object`]).
pub fn not_array<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<T, D::Error> {
    let v = Value::deserialize(d)?;
    if v.is_array() {
        return Err(D::Error::custom("expected a JSON object, not an array"));
    }
    T::deserialize(v).map_err(D::Error::custom)
}

/// `POST /v1/put`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PutBody {
    /// Node URI.
    #[schemars(with = "CtxUri")]
    pub uri: String,
    /// L0 text.
    #[serde(rename = "abstract", default, skip_serializing_if = "Option::is_none")]
    pub abstract_text: Option<String>,
    /// L1 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overview: Option<String>,
    /// L2 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// `memory`, `resource`, `skill` or `session` (default: from the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ce_core::ContextType>")]
    pub context_type: Option<String>,
    /// Category (default: from the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// `user:ID`, `agent:ID` or `shared` (default: from the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ce_core::OwnerSpace>")]
    pub owner_space: Option<String>,
    /// Metadata (any JSON values; in `merge` mode a `null` removes a key).
    #[serde(default, skip_serializing_if = "Meta::is_empty")]
    pub meta: Meta,
    /// `replace` (default), `merge` or `append`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ce_store::PutMode>")]
    pub mode: Option<String>,
    /// Fail with `version_conflict` unless the stored version is this (0 = must not exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_version: Option<u64>,
    /// Trace id recorded on the node and its events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Layers (0: abstract, 1: overview) whose client text is dropped so that the derive
    /// consumer writes them again (docs/derive.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub derive: Vec<ce_core::Level>,
}

impl PutBody {
    /// The node and the store request.
    pub fn into_request(self) -> Result<(CtxUri, PutRequest), CoreError> {
        let uri = uri(&self.uri)?;
        let req = PutRequest {
            mode: self
                .mode
                .as_deref()
                .map(str::parse)
                .transpose()?
                .unwrap_or_default(),
            abstract_text: self.abstract_text,
            overview: self.overview,
            content: self.content,
            context_type: self.context_type.as_deref().map(str::parse).transpose()?,
            category: self.category,
            owner_space: self.owner_space.as_deref().map(str::parse).transpose()?,
            meta: self.meta,
            expect_version: self.expect_version,
            trace_id: self.trace_id,
            derive: self.derive,
        };
        Ok((uri, req))
    }
}

/// `POST /v1/rm`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RmBody {
    /// Node URI.
    #[schemars(with = "CtxUri")]
    pub uri: String,
    /// Remove the whole subtree.
    #[serde(default)]
    pub recursive: bool,
    /// Fail unless the stored version is this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_version: Option<u64>,
    /// Trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// `POST /v1/mv`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MvBody {
    /// Current URI.
    #[schemars(with = "CtxUri")]
    pub from: String,
    /// New URI.
    #[schemars(with = "CtxUri")]
    pub to: String,
    /// Trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// `POST /v1/link`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkBody {
    /// Source node.
    #[schemars(with = "CtxUri")]
    pub from: String,
    /// Target node.
    #[schemars(with = "CtxUri")]
    pub to: String,
    /// Relation type (1-64 bytes; no whitespace, `|` or control characters).
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[^\s|]+$"))]
    pub relation_type: String,
    /// Weight (default 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// Reason (default "").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl LinkBody {
    /// The store request.
    pub fn into_request(self) -> Result<LinkRequest, CoreError> {
        Ok(LinkRequest {
            from: uri(&self.from)?,
            to: uri(&self.to)?,
            relation_type: self.relation_type,
            weight: self.weight.unwrap_or(1.0),
            reason: self.reason.unwrap_or_default(),
            trace_id: self.trace_id,
        })
    }
}

/// `POST /v1/unlink`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnlinkBody {
    /// Source node.
    #[schemars(with = "CtxUri")]
    pub from: String,
    /// Target node.
    #[schemars(with = "CtxUri")]
    pub to: String,
    /// Relation type (1-64 bytes; no whitespace, `|` or control characters).
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[^\s|]+$"))]
    pub relation_type: String,
    /// Trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// `POST /v1/outbox/append`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendBody {
    /// Event type, e.g. `UPSERT_CONTEXT`.
    #[serde(rename = "type")]
    #[schemars(with = "ce_core::EventType")]
    pub event_type: String,
    /// The payload object (its fields depend on the type).
    #[schemars(with = "ce_core::EventPayload")]
    pub payload: Value,
}

/// `POST /v1/reindex`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReindexBody {
    /// The consumer to rebuild (default `vector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// Answer as soon as the `reindex` job is queued ([`JobQueued`]) instead of once it has
    /// run ([`ReindexAnswer`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_wait: bool,
}

/// A reindex whose job has run: the job's report, and the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReindexAnswer {
    /// The report of the run.
    #[serde(flatten)]
    pub report: crate::status::ReindexReport,
    /// The `reindex` job that ran it.
    pub job_id: String,
}

/// An enqueued job (`POST /v1/reindex` with `no_wait`, `ce reindex --no-wait`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobQueued {
    /// The job's id.
    pub job_id: String,
    /// Whether this request created it (false: a job with the same idempotency key was
    /// not finished yet, and is the answer).
    pub created: bool,
    /// The job.
    pub job: ce_store::Job,
}

impl From<ce_store::Enqueued> for JobQueued {
    fn from(e: ce_store::Enqueued) -> Self {
        JobQueued {
            job_id: e.job.id.clone(),
            created: e.created,
            job: e.job,
        }
    }
}

/// `POST /v1/search`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchBody {
    /// The query text (not blank). A query over 16 KiB is refused with 413
    /// `payload_too_large`, not as a malformed body, so the schema sets no maximum.
    #[schemars(length(min = 1))]
    pub query: String,
    /// Number of nodes to return (default 10, at most 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = ce_retrieval::MAX_TOP_K))]
    pub top_k: Option<usize>,
    /// `vector`, `keyword`, `hybrid` (default: `retrieval.default_mode`) or `hierarchical`
    /// (answered by `POST /v1/search` with the hierarchical answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["vector", "keyword", "hybrid", "hierarchical", null]))]
    pub mode: Option<String>,
    /// Parameters of the descent in `hierarchical` mode (defaults when absent).
    #[serde(
        default,
        deserialize_with = "not_array",
        skip_serializing_if = "Option::is_none"
    )]
    pub hierarchical: Option<HierarchicalParams>,
    /// Vector candidates below this cosine similarity are not considered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_score: Option<f32>,
    /// Only records of this level (0, 1 or 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Level>")]
    pub level: Option<i64>,
    /// Only nodes at or below this URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<CtxUri>")]
    pub subtree: Option<String>,
    /// Only direct children of this URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<CtxUri>")]
    pub parent_uri: Option<String>,
    /// Only this context type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ce_core::ContextType>")]
    pub context_type: Option<String>,
    /// Only this category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Only these owner spaces (any of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<ce_core::OwnerSpace>")]
    pub owner_space: Vec<String>,
    /// Only this account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// Flat metadata equality: every key must hold exactly this scalar value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, Value>,
    /// Also answer the candidates hydration dropped, each with its reason (`dropped`; flat
    /// modes only: refused with `hierarchical`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explain: bool,
}

/// The mode name of hierarchical search on the wire and in the CLI.
pub const HIERARCHICAL_MODE: &str = "hierarchical";

impl SearchBody {
    /// Whether the body asks for hierarchical search (`"mode": "hierarchical"`).
    pub fn is_hierarchical(&self) -> bool {
        self.mode.as_deref() == Some(HIERARCHICAL_MODE)
    }

    /// The hierarchical request of a body whose mode is `hierarchical`.
    pub fn into_hierarchical(mut self) -> Result<HierarchicalRequest, CoreError> {
        if self.explain {
            return Err(CoreError::InvalidField {
                field: "explain",
                reason: "not with \"mode\": \"hierarchical\" (its answer counts its drops)".into(),
            });
        }
        let params = self.hierarchical.take().unwrap_or_default();
        self.mode = None;
        Ok(HierarchicalRequest {
            search: self.into_request()?,
            params,
        })
    }

    /// The body that asks for hierarchical `req` (the CLI's `--server` mode).
    pub fn from_hierarchical(req: &HierarchicalRequest) -> Self {
        SearchBody {
            mode: Some(HIERARCHICAL_MODE.into()),
            hierarchical: Some(req.params),
            ..SearchBody::from_request(&req.search)
        }
    }

    /// The retrieval request (bad levels, URIs, types and owner spaces get typed errors).
    pub fn into_request(self) -> Result<SearchRequest, CoreError> {
        if self.hierarchical.is_some() {
            return Err(CoreError::InvalidField {
                field: "hierarchical",
                reason: "only with \"mode\": \"hierarchical\"".into(),
            });
        }
        let mut pairs: Vec<(&str, String)> = Vec::new();
        if let Some(l) = self.level {
            pairs.push(("level", Level::from_i64(l)?.as_u8().to_string()));
        }
        let opt = [
            ("subtree", &self.subtree),
            ("parent_uri", &self.parent_uri),
            ("context_type", &self.context_type),
            ("category", &self.category),
            ("account_id", &self.account_id),
        ];
        for (k, v) in opt {
            if let Some(v) = v {
                pairs.push((k, v.clone()));
            }
        }
        for o in &self.owner_space {
            pairs.push(("owner_space", o.clone()));
        }
        let mut filter: SearchFilter =
            ce_retrieval::filter_from_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())))?;
        for (k, v) in self.meta {
            if !matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
                return Err(CoreError::InvalidField {
                    field: "meta",
                    reason: format!("filter {k:?} must be a string, number or boolean"),
                });
            }
            filter.meta.insert(k, v);
        }
        Ok(SearchRequest {
            query: self.query,
            top_k: self.top_k.unwrap_or(DEFAULT_TOP_K),
            filter,
            min_score: self.min_score,
            embed_timeout: DEFAULT_EMBED_TIMEOUT,
            mode: self.mode.as_deref().map(str::parse).transpose()?,
        })
    }

    /// The body that asks for `req` (the CLI's `--server` mode).
    pub fn from_request(req: &SearchRequest) -> Self {
        let f = &req.filter;
        SearchBody {
            query: req.query.clone(),
            top_k: Some(req.top_k),
            mode: req.mode.map(|m| m.as_str().to_owned()),
            hierarchical: None,
            min_score: req.min_score,
            level: f.level.map(|l| i64::from(l.as_u8())),
            subtree: f.subtree.as_ref().map(|u| u.to_string()),
            parent_uri: f.parent_uri.as_ref().map(|u| u.to_string()),
            context_type: f.context_type.clone(),
            category: f.category.clone(),
            owner_space: f.owner_spaces.clone().unwrap_or_default(),
            account_id: f.account_id.clone(),
            meta: f.meta.clone(),
            explain: false,
        }
    }
}

/// The answer of `GET /v1/cat` and `ce cat --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CatAnswer {
    /// Node URI.
    pub uri: CtxUri,
    /// The layer returned.
    pub level: Level,
    /// Node version.
    pub version: u64,
    /// Node content hash.
    pub content_hash: String,
    /// The layer's text exactly as stored (empty when the layer is empty; no fallback).
    pub text: String,
    /// When the layer is empty: the layer search indexes for this level instead (spec
    /// §2.2.1 fallbacks). Absent when the layer has text, or when no fallback has any (the
    /// level then has no index record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<LevelSource>,
    /// True when the layer is L0 or L1 and a derivation is due: the derive consumer writes
    /// it, and search has no record of the level until then (docs/derive.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

impl CatAnswer {
    /// Layer `level` of `node`; `projector` tells the fallback of an empty layer.
    pub fn of(node: &ContextNode, level: Level, projector: &IndexProjector) -> Self {
        let text = node.layers.get(level).to_owned();
        CatAnswer {
            uri: node.uri.clone(),
            level,
            version: node.version,
            content_hash: node.content_hash.clone(),
            fallback: if text.is_empty() {
                projector.level_source(node, level)
            } else {
                None
            },
            pending: node.provenance.get(level).is_some_and(|o| o.is_pending()),
            text,
        }
    }
}

/// The answer of `GET /v1/outbox/show`: an event and its delivery to every consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OutboxShowAnswer {
    /// The event.
    pub event: OutboxEvent,
    /// Its deliveries, one per consumer.
    pub deliveries: Vec<Delivery>,
}

/// The body of every error answer: `{code, message, retryable}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorBody {
    /// Stable error code, e.g. `not_found`.
    #[schemars(with = "ce_core::ErrorCode")]
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// Whether retrying later can succeed.
    pub retryable: bool,
}

/// The answer of `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Health {
    /// Always `ok`.
    #[schemars(extend("const" = "ok"))]
    pub status: String,
}

/// The answer of `GET /readyz` when the server is ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Ready {
    /// Always true.
    #[schemars(extend("const" = true))]
    pub ready: bool,
}

/// The answer of `GET /readyz` when the server is not ready (503, retryable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NotReady {
    /// `unavailable`, the message and `retryable: true`.
    #[serde(flatten)]
    pub error: ErrorBody,
    /// Why, one reason per consumer or input that is not ready.
    pub reasons: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ce_core::Classify as _;
    use ce_core::ErrorCode;

    #[test]
    fn search_body_round_trips_through_the_request() {
        let body: SearchBody = serde_json::from_value(serde_json::json!({
            "query": "dark mode", "top_k": 3, "level": 0, "subtree": "ctx://acc",
            "owner_space": ["user:u1"], "meta": {"lang": "en"}
        }))
        .expect("body");
        let req = body.clone().into_request().expect("request");
        assert_eq!(req.top_k, 3);
        assert_eq!(req.filter.level, Some(Level::L0));
        assert_eq!(
            SearchBody::from_request(&req),
            SearchBody {
                min_score: None,
                ..body
            }
        );
    }

    #[test]
    fn bad_fields_get_typed_errors() {
        let code = |v: serde_json::Value| {
            serde_json::from_value::<SearchBody>(v)
                .expect("shape")
                .into_request()
                .expect_err("refused")
                .code()
        };
        assert_eq!(
            code(serde_json::json!({"query": "x", "level": 5})),
            ErrorCode::InvalidLevel
        );
        assert_eq!(
            code(serde_json::json!({"query": "x", "subtree": "ctx://a//b"})),
            ErrorCode::InvalidUri
        );
        assert_eq!(
            code(serde_json::json!({"query": "x", "meta": {"k": [1]}})),
            ErrorCode::InvalidField
        );
        let put = PutBody {
            uri: "ctx://a/b".into(),
            mode: Some("upsert".into()),
            ..PutBody::default()
        };
        assert_eq!(
            put.into_request().expect_err("mode").code(),
            ErrorCode::InvalidField
        );
        assert!(serde_json::from_str::<PutBody>(r#"{"uri":"ctx://a","bogus":1}"#).is_err());
    }
}

/// `POST /v1/kb/{base}/items`: the inputs to add.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KbAddBody {
    /// Each exactly one of `path` (server-side, under `[ingest].allowed_paths`), `url`,
    /// `note`.
    pub inputs: Vec<crate::kb::KbInput>,
}

/// `POST /v1/kb/{base}/items/rm` and `POST /v1/kb/{base}/reindex`: the items.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KbItemsBody {
    /// Item ids (nested ones fold into their selected ancestor).
    pub items: Vec<String>,
}

/// `POST /v1/kb/{base}/progress`: what to report on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KbProgressBody {
    /// Items whose subtrees are followed.
    #[serde(default)]
    pub roots: Vec<String>,
    /// Jobs that must have ended.
    #[serde(default)]
    pub jobs: Vec<String>,
}
