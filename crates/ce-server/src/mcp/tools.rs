//! The MCP tools: one row of [`TOOLS`] each — name, description (written for a model),
//! annotations, a plain JSON Schema (no `anyOf`, `oneOf`, `$ref`, `$defs`) and the function.
//!
//! Every function runs on the blocking pool with the caller's [`Scope`] and goes through
//! the same checks as the HTTP route it mirrors (`check_put`, `check_rm`, `check_mv`,
//! `check_link`, `check_read`, `retain`; search through the route's own
//! `handlers::run_search`; the knowledge-base tools are admin-only like their routes, and
//! `kb_add` checks paths with the route's `check_paths`). Arguments are checked against the
//! tool's schema first, so a bad argument is an `invalid_field` error naming it.

use std::collections::HashMap;
use std::sync::Arc;

use ce_core::{CtxUri, DeliveryStatus, ErrorCode, IndexProjector, Level};
use ce_index::relation::Direction;
use ce_retrieval::{DEFAULT_RELATED_LIMIT, MAX_RELATED_LIMIT, MAX_TOP_K, RelatedRequest};
use ce_store::{ItemStatus, NodeStat, PutMode, PutRequest, WriteOutcome};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::pack::{self, Candidate};
use crate::engine::Engine;
use crate::http::ApiError;
use crate::http::Principal;
use crate::http::handlers::{SearchAnswer, on_blocking_pool, run_search};
use crate::http::kb::check_paths;
use crate::http::scope::Scope;
use crate::kb::{CreateBase, KbInput};
use crate::wire::{self, CatAnswer, LinkBody, MvBody, PutBody, RmBody, SearchBody};

type Result<T, E = ApiError> = std::result::Result<T, E>;
type Run = fn(&Engine, &Scope<'_>, Value) -> Result<Value>;

/// One tool.
pub struct Tool {
    /// Its name.
    pub name: &'static str,
    /// A short title.
    pub title: &'static str,
    /// What it does, for a model.
    pub description: &'static str,
    /// It changes nothing.
    pub read_only: bool,
    /// It may remove or overwrite data.
    pub destructive: bool,
    /// Calling it twice with the same arguments changes nothing more.
    pub idempotent: bool,
    /// It may reach beyond the database (a knowledge base's URLs).
    pub open_world: bool,
    schema: fn() -> Value,
    run: Run,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Tool {
    /// Its input schema (a JSON Schema object).
    pub fn input_schema(&self) -> Value {
        (self.schema)()
    }

    /// Its MCP description.
    pub fn to_mcp(&self) -> rmcp::model::Tool {
        // Every schema is built by `object` (a JSON object).
        let schema = match self.input_schema() {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        let annotations = rmcp::model::ToolAnnotations::with_title(self.title)
            .read_only(self.read_only)
            .destructive(self.destructive)
            .idempotent(self.idempotent)
            .open_world(self.open_world);
        rmcp::model::Tool::new(self.name, self.description, Arc::new(schema))
            .with_title(self.title)
            .with_annotations(annotations)
    }
}

/// The tool named `name`.
pub fn find(name: &str) -> Option<&'static Tool> {
    TOOLS.iter().find(|t| t.name == name)
}

/// Runs `tool` for `p` with `args` (a JSON object): checks the arguments against the schema,
/// then runs the tool on the blocking pool.
pub async fn call(
    engine: &Arc<Engine>,
    p: Principal,
    tool: &'static Tool,
    args: Value,
) -> Result<Value> {
    check(&tool.input_schema(), &args, "")?;
    on_blocking_pool(engine, move |e| {
        (tool.run)(e, &Scope::new(&p, e.store().as_ref()), args)
    })
    .await
}

fn invalid(field: &str, reason: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidField,
        format!("argument `{field}`: {reason}"),
        false,
    )
}

/// Checks `v` against the plain `schema` (type, properties, required,
/// additionalProperties, enum, minimum, maximum, items, minItems, maxItems).
fn check(schema: &Value, v: &Value, path: &str) -> Result<()> {
    let here = if path.is_empty() { "arguments" } else { path };
    let ty = schema["type"].as_str().unwrap_or("");
    let ok = match ty {
        "object" => v.is_object(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        _ => true,
    };
    if !ok {
        return Err(invalid(here, format!("must be of type {ty}, got {v}")));
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(v)
    {
        return Err(invalid(
            here,
            format!("{v} is not one of {}", Value::Array(allowed.clone())),
        ));
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = schema["minimum"].as_f64()
            && n < min
        {
            return Err(invalid(here, format!("{v} is below the minimum {min}")));
        }
        if let Some(max) = schema["maximum"].as_f64()
            && n > max
        {
            return Err(invalid(here, format!("{v} is above the maximum {max}")));
        }
    }
    if let Value::Array(items) = v {
        if let Some(min) = schema["minItems"].as_u64()
            && (items.len() as u64) < min
        {
            return Err(invalid(here, format!("needs at least {min} item(s)")));
        }
        if let Some(max) = schema["maxItems"].as_u64()
            && items.len() as u64 > max
        {
            return Err(invalid(here, format!("takes at most {max} items")));
        }
        for (i, item) in items.iter().enumerate() {
            check(&schema["items"], item, &format!("{here}[{i}]"))?;
        }
    }
    if let Value::Object(fields) = v {
        let props = schema["properties"].as_object();
        for r in schema["required"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap_or("");
            if !fields.contains_key(r) {
                return Err(invalid(&join(path, r), "is required"));
            }
        }
        for (k, val) in fields {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(s, val, &join(path, k))?,
                None if schema["additionalProperties"] == false => {
                    return Err(invalid(&join(path, k), "is not an argument of this tool"));
                }
                None => {}
            }
        }
    }
    Ok(())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Deserializes checked arguments.
fn args<T: DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| invalid("arguments", e))
}

fn to_value(v: impl Serialize) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| {
        ApiError::new(
            ErrorCode::Internal,
            format!("serializing the result: {e}"),
            false,
        )
    })
}

fn object(props: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

fn described(description: &str, mut schema: Value) -> Value {
    schema["description"] = json!(description);
    schema
}

fn uri_prop(what: &str) -> Value {
    json!({"type": "string", "description": format!("{what}, a ctx:// URI, e.g. ctx://acme/users/u1/memories/prefs")})
}

fn level_prop(default: u8) -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": 2,
           "description": format!("Layer: 0 = abstract (L0), 1 = overview (L1), 2 = full content (L2). Default {default}.")})
}

fn version_prop() -> Value {
    json!({"type": "integer", "minimum": 0,
           "description": "Fail with version_conflict unless the node's current version is this (0: the node must not exist). Use the version a read returned to avoid overwriting a change you have not seen."})
}

// ---- Write freshness ----------------------------------------------------------------

/// How far one index is behind a write.
#[derive(Debug, Serialize)]
struct IndexProgress {
    consumer: String,
    /// The index has applied this write.
    applied: bool,
    /// Events this index has yet to apply (this write's included); 0 when applied.
    events_behind: u64,
}

/// Whether a write is already visible to search, and how far each index is behind.
#[derive(Debug, Serialize)]
struct Freshness {
    searchable: bool,
    indexes: Vec<IndexProgress>,
}

fn freshness(e: &Engine, outcome: &WriteOutcome) -> Result<Freshness> {
    let Some(last) = outcome.event_ids.last() else {
        return Ok(Freshness {
            searchable: true,
            indexes: Vec::new(),
        });
    };
    let (_, deliveries) = e.store().show(last)?;
    // Per consumer: the events not applied yet, and the lowest sequence not done or dead.
    let stats: HashMap<String, (u64, Option<i64>)> = e
        .store()
        .stats()?
        .into_iter()
        .map(|s| {
            let lag = s.pending + s.claimed + s.retry_wait;
            (s.consumer, (lag, s.low_watermark_seq))
        })
        .collect();
    let indexes: Vec<IndexProgress> = deliveries
        .into_iter()
        .map(|d| {
            let (lag, low) = stats.get(&d.consumer).copied().unwrap_or((1, None));
            // The write's events all have sequences up to the last one's: the index has
            // applied them all when the last is done and nothing below it is still open.
            let applied = d.status == DeliveryStatus::Done && low.is_none_or(|w| w > d.seq);
            IndexProgress {
                events_behind: if applied { 0 } else { lag.max(1) },
                consumer: d.consumer,
                applied,
            }
        })
        .collect();
    Ok(Freshness {
        searchable: indexes.iter().all(|i| i.applied),
        indexes,
    })
}

/// A write's answer: the outcome plus its [`Freshness`] as `indexing`.
fn written(e: &Engine, outcome: &WriteOutcome) -> Result<Value> {
    let mut v = to_value(outcome)?;
    v["indexing"] = to_value(freshness(e, outcome)?)?;
    Ok(v)
}

// ---- Listings ------------------------------------------------------------------------

/// Node stats with their abstracts (one batched read).
fn with_abstracts(e: &Engine, stats: &[NodeStat]) -> Result<Vec<Value>> {
    let uris: Vec<CtxUri> = stats.iter().map(|s| s.uri.clone()).collect();
    let abstracts: HashMap<CtxUri, String> = e
        .store()
        .read_nodes(&uris)?
        .into_iter()
        .map(|n| {
            let a = n.layers.get(Level::L0).to_owned();
            (n.uri, a)
        })
        .collect();
    stats
        .iter()
        .map(|s| {
            Ok(json!({
                "uri": s.uri,
                "kind": to_value(s.kind)?,
                "children": s.children,
                "version": s.version,
                "abstract": abstracts.get(&s.uri).cloned().unwrap_or_default(),
            }))
        })
        .collect()
}

// ---- The tools -----------------------------------------------------------------------

/// The names of the three layers in the tools' arguments, L0 to L2.
const DETAILS: [&str; 3] = ["abstract", "overview", "content"];

/// The layer a [`DETAILS`] name names (the schemas admit no other).
fn layer_named(name: &str) -> Level {
    DETAILS
        .iter()
        .position(|d| *d == name)
        .map_or(Level::L2, |i| Level::ALL[i])
}

fn search_schema() -> Value {
    object(
        json!({
            "query": {"type": "string", "description": "What to look for, in natural language or keywords."},
            "mode": {"type": "string", "enum": ["vector", "keyword", "hybrid", "hierarchical"],
                     "description": "Retrieval mode (default: the server's default, usually hybrid). hierarchical descends the tree from the best containers."},
            "subtree": uri_prop("Only nodes at or below this node"),
            "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "description": "How many nodes to find (default 10)."},
            "level": {"type": "integer", "minimum": 0, "maximum": 2, "description": "Only match index records of this layer (0 abstract, 1 overview, 2 content)."},
            "filters": described("Narrow the search: context type, category, owner spaces, parent, metadata.", object(json!({
                "context_type": {"type": "string", "enum": ["memory", "resource", "skill", "session"], "description": "Only this context type."},
                "category": {"type": "string", "description": "Only this category."},
                "owner_space": {"type": "array", "items": {"type": "string"}, "description": "Only these owner spaces (user:ID, agent:ID, shared)."},
                "parent_uri": uri_prop("Only direct children of this node"),
                "meta": {"type": "object", "description": "Metadata equality: every key must hold exactly this string, number or boolean."},
            }), &[])),
            "detail": {"type": "string", "enum": DETAILS,
                       "description": "How deep to show each hit: abstract (L0, default), overview (L1) or content (L2). With max_tokens, hits are expanded towards this layer while the budget allows."},
            "max_tokens": {"type": "integer", "minimum": 1,
                           "description": "Token budget for the returned context block: abstracts of the best hits first, then the best hits expanded; the result lists what was left out."},
        }),
        &["query"],
    )
}

#[derive(Deserialize)]
struct SearchArgs {
    #[serde(default)]
    filters: Map<String, Value>,
    #[serde(default)]
    detail: Option<String>,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(flatten)]
    body: Map<String, Value>,
}

fn search(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let a: SearchArgs = args(v)?;
    let mut body = a.body;
    body.extend(a.filters);
    let body: SearchBody = args(Value::Object(body))?;
    let detail = a.detail.as_deref().map_or(Level::L0, layer_named).as_u8();
    let (ranked, lag, mode) = match run_search(e, scope, body)? {
        SearchAnswer::Flat(r) => (
            r.hits
                .iter()
                .map(|h| (h.uri.clone(), h.score))
                .collect::<Vec<_>>(),
            r.lag,
            r.mode_used.as_str().to_owned(),
        ),
        SearchAnswer::Hierarchical(r) => (
            r.hits.iter().map(|h| (h.uri.clone(), h.score)).collect(),
            r.lag,
            wire::HIERARCHICAL_MODE.to_owned(),
        ),
    };
    let uris: Vec<CtxUri> = ranked.iter().map(|(u, _)| u.clone()).collect();
    let mut nodes: HashMap<CtxUri, ce_core::ContextNode> = e
        .store()
        .read_nodes(&uris)?
        .into_iter()
        .map(|n| (n.uri.clone(), n))
        .collect();
    let candidates: Vec<Candidate> = ranked
        .into_iter()
        .filter_map(|(uri, score)| {
            let n = nodes.remove(&uri)?;
            Some(Candidate {
                uri: uri.to_string(),
                score,
                layers: Level::ALL.map(|l| n.layers.get(l).to_owned()),
            })
        })
        .collect();
    let packed = pack::pack(&candidates, detail, a.max_tokens.unwrap_or(usize::MAX));
    let mut v = to_value(&packed)?;
    v["mode"] = json!(mode);
    v["budget"] = json!(a.max_tokens);
    v["lag"] = to_value(lag)?;
    Ok(v)
}

fn read_schema() -> Value {
    object(
        json!({
            "uris": {"type": "array", "items": uri_prop("A node"), "minItems": 1, "maxItems": 50,
                     "description": "The nodes to read (1 to 50)."},
            "level": level_prop(2),
        }),
        &["uris"],
    )
}

#[derive(Deserialize)]
struct ReadArgs {
    uris: Vec<String>,
    #[serde(default)]
    level: Option<i64>,
}

fn read(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let a: ReadArgs = args(v)?;
    let level = a
        .level
        .map(Level::from_i64)
        .transpose()?
        .unwrap_or(Level::L2);
    let projector = IndexProjector::new(e.config().projector);
    let nodes = a
        .uris
        .iter()
        .map(|u| {
            let one = wire::uri(u)
                .map_err(ApiError::from)
                .and_then(|uri| scope.read_node(&uri))
                .map(|n| CatAnswer::of(&n, level, &projector));
            match one {
                Ok(c) => to_value(c),
                Err(err) => Ok(json!({"uri": u, "error": super::error_body(&err)})),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({ "nodes": nodes }))
}

const MAX_LIST: u64 = 200;

fn list_schema() -> Value {
    object(
        json!({
            "uri": uri_prop("The node whose children to list (default ctx://, the accounts)"),
            "cursor": {"type": "string", "description": "next_cursor of the previous page."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIST, "description": "Children per page (default 50)."},
        }),
        &[],
    )
}

#[derive(Deserialize)]
struct ListArgs {
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

fn list(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let a: ListArgs = args(v)?;
    let uri = match &a.uri {
        Some(u) => wire::uri(u)?,
        None => CtxUri::root(),
    };
    let start: usize = match &a.cursor {
        Some(c) => c.parse().map_err(|_| {
            invalid(
                "cursor",
                format!("{c:?} is not a cursor this tool returned"),
            )
        })?,
        None => 0,
    };
    let children = scope.ls(&uri)?;
    let total = children.len();
    let end = total.min(start.saturating_add(a.limit.unwrap_or(50)));
    let page = children.get(start.min(end)..end).unwrap_or_default();
    Ok(json!({
        "uri": uri,
        "children": with_abstracts(e, page)?,
        "total": total,
        "next_cursor": (end < total).then(|| end.to_string()),
    }))
}

fn tree_schema() -> Value {
    object(
        json!({
            "uri": uri_prop("The root of the tree"),
            "depth": {"type": "integer", "minimum": 1, "maximum": 16, "description": "Levels below the root (default 2)."},
            "max_nodes": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many nodes (default 200); the result says when it was cut."},
        }),
        &["uri"],
    )
}

#[derive(Deserialize)]
struct TreeArgs {
    uri: String,
    #[serde(default)]
    depth: Option<u32>,
    #[serde(default)]
    max_nodes: Option<usize>,
}

fn tree(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let a: TreeArgs = args(v)?;
    let uri = wire::uri(&a.uri)?;
    let nodes = scope.tree(&uri, Some(a.depth.unwrap_or(2)))?;
    let total = nodes.len();
    let shown = &nodes[..total.min(a.max_nodes.unwrap_or(200))];
    Ok(json!({
        "uri": uri,
        "nodes": with_abstracts(e, shown)?,
        "total": total,
        "truncated": shown.len() < total,
    }))
}

fn write_schema() -> Value {
    object(
        json!({
            "uri": uri_prop("The node to write (missing parents are created)"),
            "abstract": {"type": "string", "description": "L0: one or two sentences that say what the node is."},
            "overview": {"type": "string", "description": "L1: a paragraph or an outline."},
            "content": {"type": "string", "description": "L2: the full text."},
            "meta": {"type": "object", "description": "Metadata (any JSON values; in merge mode a null removes a key)."},
            "mode": {"type": "string", "enum": ["replace", "merge", "append"],
                     "description": "replace (default): the node becomes exactly this; merge: given fields overwrite, others are kept; append: content is appended."},
            "expect_version": version_prop(),
            "context_type": {"type": "string", "enum": ["memory", "resource", "skill", "session"], "description": "Default: from the path."},
            "category": {"type": "string", "description": "Default: from the path."},
            "owner_space": {"type": "string", "description": "user:ID, agent:ID or shared (default: from the path)."},
        }),
        &["uri"],
    )
}

fn write(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let (uri, req) = args::<PutBody>(v)?.into_request()?;
    scope.check_put(&uri, &req)?;
    let outcome = e.put(&uri, req)?;
    written(e, &outcome)
}

fn edit_schema() -> Value {
    object(
        json!({
            "uri": uri_prop("The node to edit"),
            "old": {"type": "string", "description": "The exact text to replace; it must occur exactly once in the layer."},
            "new": {"type": "string", "description": "The replacement text."},
            "layer": {"type": "string", "enum": DETAILS, "description": "The layer to edit: abstract, overview or content (default content)."},
            "expect_version": version_prop(),
        }),
        &["uri", "old", "new"],
    )
}

#[derive(Deserialize)]
struct EditArgs {
    uri: String,
    old: String,
    new: String,
    #[serde(default)]
    layer: Option<String>,
    #[serde(default)]
    expect_version: Option<u64>,
}

fn edit(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let a: EditArgs = args(v)?;
    let uri = wire::uri(&a.uri)?;
    let layer = a.layer.as_deref().unwrap_or("content");
    let level = layer_named(layer);
    if a.old.is_empty() {
        return Err(invalid("old", "must not be empty"));
    }
    let node = scope.read_node(&uri)?;
    let text = node.layers.get(level);
    match text.matches(a.old.as_str()).count() {
        1 => {}
        0 => {
            return Err(invalid(
                "old",
                format!("does not occur in the {layer} of {uri}"),
            ));
        }
        n => {
            return Err(invalid(
                "old",
                format!(
                    "occurs {n} times in the {layer} of {uri}; include more surrounding text so it occurs once"
                ),
            ));
        }
    }
    let edited = text.replacen(a.old.as_str(), &a.new, 1);
    let mut req = PutRequest {
        mode: PutMode::Merge,
        // The version read, unless the caller names one: a change in between is a conflict.
        expect_version: Some(a.expect_version.unwrap_or(node.version)),
        ..PutRequest::default()
    };
    match level {
        Level::L0 => req.abstract_text = Some(edited),
        Level::L1 => req.overview = Some(edited),
        Level::L2 => req.content = Some(edited),
    }
    scope.check_put(&uri, &req)?;
    let outcome = e.put(&uri, req)?;
    written(e, &outcome)
}

fn move_schema() -> Value {
    object(
        json!({"from": uri_prop("The node to move (with its subtree)"), "to": uri_prop("Its new URI")}),
        &["from", "to"],
    )
}

fn move_(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let b: MvBody = args(v)?;
    let (from, to) = (wire::uri(&b.from)?, wire::uri(&b.to)?);
    scope.check_mv(&from, &to)?;
    let outcome = e.mv(&from, &to, None)?;
    written(e, &outcome)
}

fn forget_schema() -> Value {
    object(
        json!({
            "uri": uri_prop("The node to remove"),
            "recursive": {"type": "boolean", "description": "Also remove everything below it (default false: a node with children is refused with not_empty)."},
            "expect_version": version_prop(),
        }),
        &["uri"],
    )
}

fn forget(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let b: RmBody = args(v)?;
    let uri = wire::uri(&b.uri)?;
    scope.check_rm(&uri, b.recursive)?;
    let outcome = e.rm(&uri, b.recursive, b.expect_version, None)?;
    written(e, &outcome)
}

fn session_add_schema() -> Value {
    object(
        json!({
            "uri": {"type": "string", "description": "The session, ctx://ACCOUNT/users/USER/sessions/ID (or ctx://ACCOUNT/agents/AGENT/sessions/ID); created on the first message."},
            "role": {"type": "string", "enum": ["user", "assistant", "system", "tool"], "description": "Who said it."},
            "content": {"type": "string", "description": "What was said."},
            "id": {"type": "string", "description": "Your id of the message (letters, digits, '.', '_', '-'): sending it again does not duplicate the message."},
        }),
        &["uri", "role", "content"],
    )
}

fn session_add(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let b: crate::http::sessions::AddMessageBody = args(v)?;
    let uri = wire::uri(&b.uri)?;
    let sessions = e.sessions();
    if e.store().read_node(&uri)?.is_none() {
        scope.check_put(&uri, &PutRequest::default())?;
        sessions.create(&uri, None)?;
    }
    scope.check_write(&uri)?;
    to_value(sessions.add(crate::sessions::AddMessage {
        uri,
        role: b.role,
        content: b.content,
        id: b.id,
        time_ms: b.time_ms,
        parts: b.parts,
    })?)
}

fn session_commit_schema() -> Value {
    object(
        json!({"uri": {"type": "string", "description": "The session to commit, ctx://ACCOUNT/users/USER/sessions/ID."}}),
        &["uri"],
    )
}

fn session_commit(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let b: crate::http::sessions::CommitBody = args(v)?;
    let uri = wire::uri(&b.uri)?;
    scope.check_write(&uri)?;
    to_value(e.sessions().commit(&uri)?)
}

fn link_schema() -> Value {
    object(
        json!({
            "from": uri_prop("The source node"),
            "to": uri_prop("The target node"),
            "type": {"type": "string", "description": "The relation type, e.g. references, depends_on, contradicts."},
            "weight": {"type": "number", "description": "Strength (default 1.0; higher is stronger)."},
            "reason": {"type": "string", "description": "Why the nodes are related."},
        }),
        &["from", "to", "type"],
    )
}

fn link(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let req = args::<LinkBody>(v)?.into_request()?;
    scope.check_link(&req.from, &req.to)?;
    let outcome = e.link(req)?;
    written(e, &outcome)
}

fn related_schema() -> Value {
    object(
        json!({
            "uri": uri_prop("The node"),
            "type": {"type": "string", "description": "Only edges of this relation type."},
            "direction": {"type": "string", "enum": ["out", "in", "both"], "description": "out (default): edges the node owns; in: edges pointing at it; both."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RELATED_LIMIT, "description": "At most this many edges (default 20), strongest first."},
        }),
        &["uri"],
    )
}

#[derive(Deserialize)]
struct RelatedArgs {
    uri: String,
    #[serde(default, rename = "type")]
    relation_type: Option<String>,
    #[serde(default)]
    direction: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

fn related(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    let a: RelatedArgs = args(v)?;
    let req = RelatedRequest {
        uri: wire::uri(&a.uri)?,
        relation_type: a.relation_type,
        direction: a
            .direction
            .as_deref()
            .map(str::parse::<Direction>)
            .transpose()?
            .unwrap_or(Direction::Out),
        limit: a.limit.unwrap_or(DEFAULT_RELATED_LIMIT),
    };
    scope.check_read(&req.uri)?;
    let mut answer = e.related(&req)?;
    scope.retain(&mut answer.edges, |x| &x.other)?;
    to_value(answer)
}

fn status_schema() -> Value {
    object(json!({}), &[])
}

fn status(e: &Engine, _scope: &Scope<'_>, _v: Value) -> Result<Value> {
    let s = e.status()?;
    let indexes: Vec<Value> = s
        .consumers
        .iter()
        .map(|c| {
            json!({
                "consumer": c.consumer,
                "lag_events": c.lag_events,
                "lag_seconds": c.lag_seconds,
                "dead": c.dead,
                "caught_up": c.lag_events == 0,
            })
        })
        .collect();
    Ok(json!({
        "ready": s.ready,
        "not_ready": s.not_ready,
        "searchable": s.ready && s.consumers.iter().all(|c| c.lag_events == 0),
        "indexes": indexes,
    }))
}

// ---- Knowledge bases (admin only, as their HTTP routes) --------------------------------

fn base_prop() -> Value {
    json!({"type": "string", "description": "The knowledge base's name (see kb_list)."})
}

fn item_ids_prop(what: &str) -> Value {
    json!({"type": "array", "items": {"type": "string", "description": "An item id (from kb_add or kb_status)."},
           "minItems": 1, "description": format!("The items to {what} (ids; an item inside a selected directory folds into it).")})
}

/// The statuses an item can be listed in (`deleting` ones are invisible).
fn visible_statuses() -> Vec<&'static str> {
    ItemStatus::ALL
        .into_iter()
        .filter(|s| *s != ItemStatus::Deleting)
        .map(ItemStatus::as_str)
        .collect()
}

fn kb_list_schema() -> Value {
    object(json!({}), &[])
}

fn kb_list(e: &Engine, scope: &Scope<'_>, _v: Value) -> Result<Value> {
    scope.principal().require_admin()?;
    to_value(e.kb_report(&e.jobs_status()?.counts)?)
}

fn kb_create_schema() -> Value {
    object(
        json!({
            "name": {"type": "string", "description": "Its name: 1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or digit."},
            "root": uri_prop("The subtree its documents live under (default ctx://ACCOUNT/resources/NAME; not both root and account)"),
            "account": {"type": "string", "description": "The account of the default root (default: default)."},
            "settings": described("Chunking, in tokens of the embedding model (fixed at creation).", object(json!({
                "max_tokens": {"type": "integer", "minimum": 16, "maximum": 8192, "description": "The most tokens of one chunk."},
                "overlap_tokens": {"type": "integer", "minimum": 0, "description": "Tokens a chunk repeats from the previous chunk of its section."},
                "min_tokens": {"type": "integer", "minimum": 0, "description": "Sections smaller than this merge with a neighbour."},
            }), &[])),
        }),
        &["name"],
    )
}

fn kb_create(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    scope.principal().require_admin()?;
    to_value(e.kb_create(args::<CreateBase>(v)?)?)
}

fn kb_add_schema() -> Value {
    let input = object(
        json!({
            "path": {"type": "string", "description": "An absolute path of a file or directory on the server, under its [ingest].allowed_paths."},
            "url": {"type": "string", "description": "An http:// or https:// URL the server fetches."},
            "note": {"type": "string", "description": "Inline text to index (at most 1 MiB)."},
            "name": {"type": "string", "description": "The node name of a note (default note-XXXXXXXX)."},
        }),
        &[],
    );
    object(
        json!({
            "base": base_prop(),
            "inputs": {"type": "array", "items": described("Exactly one of path, url or note (name only with note).", input),
                       "minItems": 1, "description": "What to add."},
        }),
        &["base", "inputs"],
    )
}

#[derive(Deserialize)]
struct KbAddArgs {
    base: String,
    inputs: Vec<KbInput>,
}

fn kb_add(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    scope.principal().require_admin()?;
    let a: KbAddArgs = args(v)?;
    check_paths(&e.config().ingest.allowed_paths, &a.inputs)?;
    to_value(e.kb_add(&a.base, a.inputs)?)
}

/// Items `kb_status` lists unless told otherwise.
const KB_STATUS_ITEMS: usize = 100;

fn kb_status_schema() -> Value {
    object(
        json!({
            "base": base_prop(),
            "item": {"type": "string", "description": "Only this item and what was expanded from it (an item id)."},
            "status": {"type": "string", "enum": visible_statuses(), "description": "Only items in this status (failed: the errors)."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many items listed (default 100); counts cover all."},
        }),
        &["base"],
    )
}

#[derive(Deserialize)]
struct KbStatusArgs {
    base: String,
    #[serde(default)]
    item: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

fn kb_status(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    scope.principal().require_admin()?;
    let a: KbStatusArgs = args(v)?;
    let status = a
        .status
        .as_deref()
        .map(str::parse::<ItemStatus>)
        .transpose()?;
    let mut s = e.kb_status(&a.base, a.item.as_deref())?;
    if let Some(st) = status {
        s.items.retain(|i| i.status == st);
    }
    let matched = s.items.len();
    s.items.truncate(a.limit.unwrap_or(KB_STATUS_ITEMS));
    let listed = s.items.len();
    let mut v = to_value(s)?;
    v["items_matched"] = json!(matched);
    v["truncated"] = json!(listed < matched);
    Ok(v)
}

fn kb_items_schema(what: &str) -> Value {
    object(
        json!({"base": base_prop(), "items": item_ids_prop(what)}),
        &["base", "items"],
    )
}

fn kb_remove_items_schema() -> Value {
    kb_items_schema("delete")
}

fn kb_reindex_schema() -> Value {
    kb_items_schema("read and index again")
}

#[derive(Deserialize)]
struct KbItemsArgs {
    base: String,
    items: Vec<String>,
}

fn kb_remove_items(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    scope.principal().require_admin()?;
    let a: KbItemsArgs = args(v)?;
    to_value(e.kb_delete_items(&a.base, &a.items)?)
}

fn kb_reindex(e: &Engine, scope: &Scope<'_>, v: Value) -> Result<Value> {
    scope.principal().require_admin()?;
    let a: KbItemsArgs = args(v)?;
    to_value(e.kb_reindex_items(&a.base, &a.items)?)
}

/// Every tool the server offers.
pub const TOOLS: &[Tool] = &[
    Tool {
        name: "search",
        title: "Search the context database",
        description: "Find the nodes most relevant to a query. Returns the best hits best first, as one context block: with max_tokens the block fits the budget (abstracts first, then the best hits expanded to their overview or content as `detail` allows) and `left_out` lists what did not fit. Use subtree or filters to stay within a part of the tree. Follow up with `read` to get a hit's full content.",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: search_schema,
        run: search,
    },
    Tool {
        name: "read",
        title: "Read nodes",
        description: "Read one or more nodes by URI at a layer: 0 abstract, 1 overview, 2 full content (default). Each node answers its text and version (pass the version as expect_version to write or edit safely); a node you cannot see answers an error entry.",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: read_schema,
        run: read,
    },
    Tool {
        name: "list",
        title: "List children",
        description: "List the direct children of a node with their abstracts, a page at a time (pass next_cursor back as cursor). Without uri: the accounts you can see.",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: list_schema,
        run: list,
    },
    Tool {
        name: "tree",
        title: "Show a subtree",
        description: "Show the subtree below a node, depth first, with abstracts: at most `depth` levels and `max_nodes` nodes (`truncated` says when it was cut).",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: tree_schema,
        run: tree,
    },
    Tool {
        name: "write",
        title: "Write a node",
        description: "Create or change a node: abstract (L0), overview (L1), content (L2), meta. mode replace (default) makes the node exactly this, merge keeps what you do not give, append adds to the content. The result says whether the change is searchable yet (`indexing`: per index, applied or how many events behind).",
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
        schema: write_schema,
        run: write,
    },
    Tool {
        name: "edit",
        title: "Edit a node's text",
        description: "Replace an exact string in one layer of a node (content by default). `old` must occur exactly once: if it is absent or ambiguous the edit fails with invalid_field and changes nothing. Fails with version_conflict if the node changed since it was read (or since expect_version).",
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
        schema: edit_schema,
        run: edit,
    },
    Tool {
        name: "move",
        title: "Move a node",
        description: "Move (rename) a node and its whole subtree to a new URI within your account.",
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
        schema: move_schema,
        run: move_,
    },
    Tool {
        name: "forget",
        title: "Remove a node",
        description: "Remove a node permanently. A node with children is only removed with recursive: true, which removes its whole subtree. Cannot be undone.",
        read_only: false,
        destructive: true,
        idempotent: true,
        open_world: false,
        schema: forget_schema,
        run: forget,
    },
    Tool {
        name: "link",
        title: "Relate two nodes",
        description: "Record a typed, weighted relation from one node to another (e.g. references, depends_on). Linking the same pair and type again updates the edge.",
        read_only: false,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: link_schema,
        run: link,
    },
    Tool {
        name: "related",
        title: "Related nodes",
        description: "The relations of a node, strongest first, with the other end's abstract: outgoing (default), incoming or both.",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: related_schema,
        run: related,
    },
    Tool {
        name: "session_add",
        title: "Add a message to a session",
        description: "Append one message of a conversation to a session (created on its first message). Give each message an id so that a retry does not duplicate it. Commit the session with session_commit to turn it into long-term memories.",
        read_only: false,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: session_add_schema,
        run: session_add,
    },
    Tool {
        name: "session_commit",
        title: "Commit a session into memory",
        description: "Archive a session's messages and extract long-term memories from them in the background (facts about the user, preferences, entities, events; merged with the memories already held: restated facts update, changed facts supersede the old ones, which are kept). Answers at once with the job id, or status skipped when there is nothing new. Memories land under ctx://ACCOUNT/users/USER/memories/ and are found by search once extracted; without an LLM configured nothing is extracted and the answer says so.",
        read_only: false,
        destructive: false,
        idempotent: false,
        open_world: false,
        schema: session_commit_schema,
        run: session_commit,
    },
    Tool {
        name: "status",
        title: "Readiness and index lag",
        description: "Whether the database is ready and how far each index (vector, keyword, relation) is behind the latest writes. When every index shows lag_events 0, earlier writes are searchable.",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: status_schema,
        run: status,
    },
    Tool {
        name: "kb_list",
        title: "List knowledge bases",
        description: "The knowledge bases: each one's name, root (the subtree its documents are indexed under), items counted by status and its latest failures with their errors, plus the knowledge-base jobs under way. Admin only.",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: kb_list_schema,
        run: kb_list,
    },
    Tool {
        name: "kb_create",
        title: "Create a knowledge base",
        description: "Create a knowledge base: a subtree (default ctx://ACCOUNT/resources/NAME) into which files, URLs and notes are parsed, chunked and indexed so that search finds them. Give root or account, not both; settings sets the chunk sizes (fixed at creation). Fails with already_exists if the name is taken. Admin only.",
        read_only: false,
        destructive: false,
        idempotent: false,
        open_world: false,
        schema: kb_create_schema,
        run: kb_create,
    },
    Tool {
        name: "kb_add",
        title: "Add documents to a knowledge base",
        description: "Add inputs to a knowledge base, each exactly one of path (a file or directory on the server, under its [ingest].allowed_paths), url (http or https) or note (inline text). Answers at once with the new items and their job ids; the server reads, parses, chunks and indexes them in the background. Poll kb_status until the items are completed (or failed, with an error), then search within the base's root. Adding an input the base already has re-syncs it instead of copying it. Admin only.",
        read_only: false,
        destructive: false,
        idempotent: true,
        open_world: true,
        schema: kb_add_schema,
        run: kb_add,
    },
    Tool {
        name: "kb_status",
        title: "A knowledge base's items",
        description: "A knowledge base's items by status (idle, preparing, processing, reading, embedding: under way; completed; failed, with its error) and each item's id, source and node; done and total say how far indexing is. Narrow to one item (with what was expanded from it) or one status (failed: the errors); at most limit items are listed. Admin only.",
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        schema: kb_status_schema,
        run: kb_status,
    },
    Tool {
        name: "kb_remove_items",
        title: "Remove items from a knowledge base",
        description: "Delete items from a knowledge base (a directory with everything expanded from it): they vanish from search and kb_status at once, and a background job removes their nodes. Cannot be undone. Admin only.",
        read_only: false,
        destructive: true,
        idempotent: true,
        open_world: false,
        schema: kb_remove_items_schema,
        run: kb_remove_items,
    },
    Tool {
        name: "kb_reindex",
        title: "Reindex knowledge-base items",
        description: "Read, parse and index items again (their files or pages changed, or to retry failed ones); a directory is listed again, and nodes of files gone from it are removed. Accepted only when every item concerned is completed or failed, else state_transition. Inputs that did not change change nothing. Admin only.",
        read_only: false,
        destructive: true,
        idempotent: true,
        open_world: true,
        schema: kb_reindex_schema,
        run: kb_reindex,
    },
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The property names of `schema` (a tool's, or one generated from a type).
    fn props(schema: &Value) -> BTreeSet<String> {
        schema["properties"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn of<T: schemars::JsonSchema>() -> BTreeSet<String> {
        props(&serde_json::to_value(schemars::schema_for!(T)).expect("schema"))
    }

    #[test]
    fn kb_tool_schemas_name_exactly_the_fields_of_the_requests_they_fill() {
        let create = kb_create_schema();
        assert_eq!(props(&create), of::<CreateBase>());
        assert_eq!(
            props(&create["properties"]["settings"]),
            of::<crate::kb::KbSettings>()
        );
        let add = kb_add_schema();
        assert_eq!(
            props(&add["properties"]["inputs"]["items"]),
            of::<KbInput>()
        );
        let mut items = of::<crate::wire::KbItemsBody>();
        items.insert("base".into());
        assert_eq!(props(&kb_remove_items_schema()), items);
        assert_eq!(props(&kb_reindex_schema()), items);
    }
}
