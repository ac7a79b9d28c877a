//! ContextEngine retrieval: turns a query into hits that the source of truth vouches for.
//!
//! [`search`] is one pass, one step per stage:
//! 1. validate the request ([`SearchRequest::validate`]);
//! 2. embed the query (one embedder call);
//! 3. ask the vector index for `2 × top_k` candidate records (× 3 without a level filter,
//!    since a node has up to three records and hits are returned per node) that pass the
//!    filter;
//! 4. **hydrate**: read every candidate's node in one batched `read_nodes` and keep a
//!    candidate only if its node exists at exactly the version the record was computed from
//!    (`metadata.node_version`). A node that is gone, moved, or newer than its index record is
//!    dropped and counted in [`SearchResponse::dropped_by_hydration`] — stale text is never
//!    returned as current (DESIGN.md decision 9: better not found than found wrong);
//! 5. keep the best-scoring record of each node, up to `top_k` nodes.
//!
//! Nothing here writes: retrieval reads the index and the source and returns.

mod error;
mod hydrate;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ce_core::{CoreError, CtxUri, Level};
use ce_embed::Embedder;
use ce_index::vector::{SearchFilter, VectorIndex};
use ce_store::SourceStore;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::debug;

pub use error::{Result, RetrievalError};

/// `top_k` when the request does not say.
pub const DEFAULT_TOP_K: usize = 10;
/// Largest accepted `top_k`.
pub const MAX_TOP_K: usize = 100;
/// Largest accepted query, in bytes.
pub const MAX_QUERY_BYTES: usize = 16 * 1024;
/// Characters of indexed text shown when a node has no abstract.
pub const SNIPPET_CHARS: usize = 200;
/// Embedding timeout when the request does not say.
pub const DEFAULT_EMBED_TIMEOUT: Duration = Duration::from_secs(30);

/// A search.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchRequest {
    /// The query text (non-empty, at most [`MAX_QUERY_BYTES`]).
    pub query: String,
    /// Number of nodes to return (1..=[`MAX_TOP_K`]).
    pub top_k: usize,
    /// Which records may match (level, subtree, parent, type, category, owner, account,
    /// flat metadata equality).
    pub filter: SearchFilter,
    /// Hits scoring below this are not returned (default: none; cosine similarity is in
    /// [-1, 1]).
    pub min_score: Option<f32>,
    /// Timeout of the query's embedding call.
    pub embed_timeout: Duration,
}

impl SearchRequest {
    /// A request for `query` with defaults: top 10, no filter.
    pub fn new(query: impl Into<String>) -> Self {
        SearchRequest {
            query: query.into(),
            top_k: DEFAULT_TOP_K,
            filter: SearchFilter::default(),
            min_score: None,
            embed_timeout: DEFAULT_EMBED_TIMEOUT,
        }
    }

    /// Checks what the types cannot: a non-empty query of bounded size, a bounded `top_k`.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| {
            Err(RetrievalError::InvalidRequest(CoreError::InvalidField {
                field,
                reason,
            }))
        };
        if self.query.trim().is_empty() {
            return bad("query", "must not be empty".into());
        }
        if self.query.len() > MAX_QUERY_BYTES {
            return Err(RetrievalError::InvalidRequest(CoreError::TooLarge {
                field: "query",
                len: self.query.len(),
                max: MAX_QUERY_BYTES,
            }));
        }
        if let Some(m) = self.min_score
            && !(-1.0..=1.0).contains(&m)
        {
            return bad("min_score", format!("{m} is outside -1..=1"));
        }
        if self.top_k == 0 || self.top_k > MAX_TOP_K {
            return bad(
                "top_k",
                format!("{} is outside 1..={MAX_TOP_K}", self.top_k),
            );
        }
        Ok(())
    }

    /// How many index records to ask for (see the module docs).
    pub fn candidates(&self) -> usize {
        let per_node = if self.filter.level.is_some() {
            1
        } else {
            Level::ALL.len()
        };
        self.top_k * 2 * per_node
    }
}

/// One node found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    /// The node.
    pub uri: CtxUri,
    /// Its parent.
    pub parent_uri: CtxUri,
    /// The level of the best-matching record.
    pub level: Level,
    /// Cosine similarity of that record to the query (higher is closer).
    pub score: f32,
    /// The node's current L0 abstract, or — when the node has none — the start of the
    /// matched record's indexed text (at most [`SNIPPET_CHARS`] characters).
    #[serde(rename = "abstract")]
    pub abstract_text: String,
    /// The node's current version (equal to the version the record was indexed from).
    pub version: u64,
    /// Context type.
    pub context_type: String,
    /// Category.
    pub category: String,
}

/// Where the time went, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchTimings {
    /// Embedding the query.
    pub embed_ms: f64,
    /// The vector index search.
    pub index_ms: f64,
    /// The batched source read and checks.
    pub hydrate_ms: f64,
    /// The whole search.
    pub total_ms: f64,
}

/// The answer of [`search`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResponse {
    /// Nodes found, best first (at most `top_k`).
    pub hits: Vec<SearchHit>,
    /// Records the index returned (at or above `min_score`).
    pub candidates: usize,
    /// Candidates examined and dropped because the source no longer holds their node at the
    /// indexed version (removed, moved, or changed since it was indexed).
    pub dropped_by_hydration: usize,
    /// The embedding model (`provider:model:dimension`).
    pub model: String,
    /// Timings.
    pub timings: SearchTimings,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Runs `req` (see the module docs).
pub fn search(
    source: &dyn SourceStore,
    embedder: &dyn Embedder,
    index: &dyn VectorIndex,
    req: &SearchRequest,
) -> Result<SearchResponse> {
    let started = Instant::now();
    req.validate()?;
    let identity = embedder.identity();
    if let Some(bound) = index.model()?
        && bound != *identity
    {
        return Err(RetrievalError::ModelMismatch {
            index: bound.key(),
            embedder: identity.key(),
        });
    }

    let t = Instant::now();
    let query_vector = embed_query(embedder, &req.query, req.embed_timeout)?;
    let embed_ms = ms(t.elapsed());

    let t = Instant::now();
    let mut candidates = index.search(&query_vector, &req.filter, req.candidates())?;
    if let Some(min) = req.min_score {
        candidates.retain(|h| h.score >= min);
    }
    let index_ms = ms(t.elapsed());

    let t = Instant::now();
    let hydrated = hydrate::hydrate(source, &candidates, req.top_k)?;
    let hydrate_ms = ms(t.elapsed());

    let total = started.elapsed();
    metrics::histogram!("retrieval_search_latency_ms").record(total.as_secs_f64() * 1e3);
    if hydrated.dropped > 0 {
        metrics::counter!("retrieval_dropped_by_hydration_total")
            .increment(hydrated.dropped as u64);
    }
    debug!(
        candidates = candidates.len(),
        hits = hydrated.hits.len(),
        dropped = hydrated.dropped,
        "search done"
    );
    Ok(SearchResponse {
        hits: hydrated.hits,
        candidates: candidates.len(),
        dropped_by_hydration: hydrated.dropped,
        model: identity.key(),
        timings: SearchTimings {
            embed_ms,
            index_ms,
            hydrate_ms,
            total_ms: ms(total),
        },
    })
}

fn embed_query(embedder: &dyn Embedder, query: &str, timeout: Duration) -> Result<Vec<f32>> {
    let mut vectors = embedder.embed_texts(&[query], timeout)?;
    match (vectors.pop(), vectors.is_empty()) {
        (Some(v), true) => Ok(v),
        _ => Err(RetrievalError::Embed(
            ce_embed::EmbedError::InvalidResponse(
                "expected exactly one vector for the query".into(),
            ),
        )),
    }
}

/// Builds a [`SearchFilter`] from flat `key=value` pairs: the known keys (`level`, `subtree`,
/// `parent_uri`, `context_type`, `category`, `owner_space`, `account_id`) set their field
/// (`owner_space` may repeat: any of them matches); any other key is a metadata equality on a
/// string value. Bad levels and URIs get their typed errors.
pub fn filter_from_pairs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<SearchFilter, CoreError> {
    let mut f = SearchFilter::default();
    let mut meta: BTreeMap<String, Value> = BTreeMap::new();
    for (k, v) in pairs {
        match k {
            "level" => {
                let n: i64 = v.trim().parse().map_err(|_| CoreError::InvalidField {
                    field: "level",
                    reason: format!("{v:?} is not 0, 1 or 2"),
                })?;
                f.level = Some(Level::from_i64(n)?);
            }
            "subtree" => f.subtree = Some(CtxUri::parse(v)?),
            "parent_uri" => f.parent_uri = Some(CtxUri::parse(v)?),
            "context_type" => {
                let t: ce_core::ContextType = v.parse()?;
                f.context_type = Some(t.as_str().to_owned());
            }
            "category" => f.category = Some(v.to_owned()),
            "owner_space" => {
                let o: ce_core::OwnerSpace = v.parse()?;
                f.owner_spaces
                    .get_or_insert_with(Vec::new)
                    .push(o.to_string());
            }
            "account_id" => f.account_id = Some(v.to_owned()),
            "" => {
                return Err(CoreError::InvalidField {
                    field: "filter",
                    reason: "a filter key must not be empty".into(),
                });
            }
            other => {
                meta.insert(other.to_owned(), Value::String(v.to_owned()));
            }
        }
    }
    f.meta = meta;
    Ok(f)
}

#[cfg(test)]
mod tests;
