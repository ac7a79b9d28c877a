//! Routes the web console (`/ui`, docs/console.md) needs beyond the CLI's: a page of a
//! node's children with their L0 (`GET /v1/children`), a node's records in each index and
//! whether they are current (`GET /v1/records`), and the server's recent lag samples
//! (`GET /v1/status/lag`, admin).

use axum::extract::{Extension, State};
use ce_core::{ContextNode, ContextType, CtxUri, IndexProjector, IndexRecord, Level, stable_hash};
use ce_index::vector::StoredRecord;
use ce_store::NodeStat;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::Principal;
use super::handlers::{Answer, NONE, Q, blocking, params, scoped};
use super::openapi::{Param, schema};
use crate::engine::Engine;

/// Children a page answers when no `limit` is given.
pub const DEFAULT_CHILDREN_LIMIT: usize = 200;
/// The largest `limit` of `GET /v1/children`.
pub const MAX_CHILDREN_LIMIT: usize = 1000;

fn children_limit(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer", "minimum": 1, "maximum": MAX_CHILDREN_LIMIT})
}

/// `GET /v1/children`.
pub(super) const CHILDREN: &[Param] = &[
    Param::optional(
        "uri",
        schema::<CtxUri>(),
        "The node (default `ctx://`: the accounts).",
    ),
    Param::optional(
        "context_type",
        schema::<ContextType>(),
        "Only leaves of this type (containers are always listed, so the tree stays browsable).",
    ),
    Param::optional(
        "offset",
        schema::<u64>(),
        "Skip this many children (after the type filter).",
    ),
    Param::optional(
        "limit",
        children_limit,
        "At most this many children (1..=1000, default 200).",
    ),
];

/// `GET /v1/records`.
pub(super) const RECORDS: &[Param] = &[Param::required("uri", schema::<CtxUri>(), "The node.")];

/// A child: its stat and its L0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChildEntry {
    /// The node's stat.
    #[serde(flatten)]
    pub stat: NodeStat,
    /// Its L0 (empty when it has none).
    #[serde(rename = "abstract")]
    pub abstract_text: String,
}

/// `GET /v1/children`: one page of a node's children, in URI order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChildrenPage {
    /// The node listed.
    pub uri: CtxUri,
    /// Children that pass the filter (all pages).
    pub total: u64,
    /// The offset of this page.
    pub offset: u64,
    /// This page.
    pub children: Vec<ChildEntry>,
}

/// Whether an index's record of a level matches the source's projection of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// The index holds exactly the record the source projects now.
    Current,
    /// The index holds a record that differs (older version, other text or filters).
    Stale,
    /// The source projects a record the index lacks (not indexed yet, or failed).
    Missing,
    /// The index holds a record of a level the node no longer projects.
    Extra,
}

/// One level's record in one index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LevelRecord {
    /// The level.
    pub level: Level,
    /// Its stable id, `stable_hash(uri, level)`.
    pub record_id: String,
    /// Current, stale, missing or extra.
    pub state: RecordState,
    /// The source version the index's record was computed from (`None`: no record).
    pub indexed_version: Option<u64>,
    /// Characters of the index's record text (`None`: no record).
    pub indexed_chars: Option<u64>,
}

/// A node's records in one index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IndexRecords {
    /// `vector` or `keyword`.
    pub index: String,
    /// Whether this server has the index open (the vector index needs the model).
    pub available: bool,
    /// One entry per level the source projects or the index holds.
    pub records: Vec<LevelRecord>,
}

/// `GET /v1/records`: a node's records in each index, compared with the source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeRecords {
    /// The node.
    pub uri: CtxUri,
    /// Its current version.
    pub version: u64,
    /// Per index.
    pub indexes: Vec<IndexRecords>,
}

/// Compares the source's projection `want` with the index's records `got` level by level
/// (the rule of `ce repair reconcile`: equal record and equal source version).
fn compare(node: &ContextNode, want: &[IndexRecord], got: &[StoredRecord]) -> Vec<LevelRecord> {
    Level::ALL
        .into_iter()
        .filter_map(|level| {
            let w = want.iter().find(|r| r.level == level);
            let g = got.iter().find(|s| s.record.level == level);
            let state = match (w, g) {
                (None, None) => return None,
                (Some(_), None) => RecordState::Missing,
                (None, Some(_)) => RecordState::Extra,
                (Some(w), Some(g)) if *w == g.record && g.node_version == node.version => {
                    RecordState::Current
                }
                (Some(_), Some(_)) => RecordState::Stale,
            };
            Some(LevelRecord {
                level,
                record_id: stable_hash(node.uri.as_str(), level.as_u8()),
                state,
                indexed_version: g.map(|g| g.node_version),
                indexed_chars: g.map(|g| g.record.text.chars().count() as u64),
            })
        })
        .collect()
}

/// `GET /v1/children?uri=&context_type=&offset=&limit=`.
pub async fn children(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    q: Q,
) -> Answer {
    let q = params(q, CHILDREN)?;
    let uri = q.uri_or("uri", CtxUri::root())?;
    let context_type = q.parse::<ContextType>("context_type")?;
    let offset = q.number::<u64>("offset")?.unwrap_or(0);
    let limit = q
        .number::<usize>("limit")?
        .unwrap_or(DEFAULT_CHILDREN_LIMIT);
    if limit == 0 || limit > MAX_CHILDREN_LIMIT {
        return Err(ce_core::CoreError::InvalidField {
            field: "limit",
            reason: format!("{limit} is outside 1..={MAX_CHILDREN_LIMIT}"),
        }
        .into());
    }
    scoped(&s, p, move |e, scope| {
        let mut stats = scope.ls(&uri)?;
        if let Some(t) = context_type {
            stats.retain(|s| s.kind != ce_core::NodeKind::Leaf || s.context_type == t);
        }
        let total = stats.len() as u64;
        let page: Vec<NodeStat> = stats
            .into_iter()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit)
            .collect();
        let uris: Vec<CtxUri> = page.iter().map(|s| s.uri.clone()).collect();
        let nodes = e.store().read_nodes(&uris)?;
        let children = page
            .into_iter()
            .map(|stat| {
                let abstract_text = nodes
                    .iter()
                    .find(|n| n.uri == stat.uri)
                    .map(|n| n.layers.abstract_text.clone())
                    .unwrap_or_default();
                ChildEntry {
                    stat,
                    abstract_text,
                }
            })
            .collect();
        Ok(ChildrenPage {
            uri,
            total,
            offset,
            children,
        })
    })
    .await
}

/// `GET /v1/records?uri=`.
pub async fn records(
    State(s): State<AppState>,
    Extension(p): Extension<Principal>,
    q: Q,
) -> Answer {
    let uri = params(q, RECORDS)?.uri("uri")?;
    scoped(&s, p, move |e, scope| {
        let node = scope.read_node(&uri)?;
        node_records(e, &node)
    })
    .await
}

/// The records of `node` in the vector and keyword indexes of `e`.
fn node_records(e: &Engine, node: &ContextNode) -> Result<NodeRecords, super::ApiError> {
    let want = IndexProjector::new(e.config().projector)
        .build_context_records(node)
        .records;
    let uris = std::slice::from_ref(&node.uri);
    let map =
        |r: ce_index::Result<Vec<StoredRecord>>| -> Result<Vec<StoredRecord>, super::ApiError> {
            r.map_err(|err| crate::error::ServerError::from(err).into())
        };
    let vector = match e.index() {
        Some(v) => Some(map(v.get(uris))?),
        None => None,
    };
    let keyword = match e.keyword_index() {
        Some(k) => Some(map(ce_index::keyword::KeywordIndex::get(k.as_ref(), uris))?),
        None => None,
    };
    let indexes = [("vector", vector), ("keyword", keyword)]
        .into_iter()
        .map(|(index, got)| IndexRecords {
            index: index.to_owned(),
            available: got.is_some(),
            records: got.map(|g| compare(node, &want, &g)).unwrap_or_default(),
        })
        .collect();
    Ok(NodeRecords {
        uri: node.uri.clone(),
        version: node.version,
        indexes,
    })
}

/// `GET /v1/status/lag` (admin).
pub async fn lag_history(State(s): State<AppState>, q: Q) -> Answer {
    params(q, NONE)?;
    blocking(&s, move |e| Ok(e.lag_history())).await
}
