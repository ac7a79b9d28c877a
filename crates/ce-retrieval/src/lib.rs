//! ContextEngine retrieval: turns a query into hits that the source of truth vouches for.
//!
//! A search runs in one of three modes ([`SearchMode`]), one step per stage:
//! 1. validate the request ([`SearchRequest::validate`]);
//! 2. **vector**: embed the query (one embedder call) and ask the vector index for
//!    [`SearchRequest::candidates`] records that pass the filter (`2 × top_k`, × 3 without a
//!    level filter, since a node has up to three records and hits are returned per node);
//!    **keyword**: ask the keyword index (BM25) for as many; **hybrid**: both;
//! 3. **hydrate**: read every candidate's node in one batched `read_nodes` and keep a
//!    candidate only if its node exists at exactly the version the record was computed from
//!    (`metadata.node_version`). A node that is gone, moved, or newer than its index record is
//!    dropped and counted in [`SearchResponse::dropped_by_hydration`] — stale text is never
//!    returned as current (DESIGN.md decision 9: better not found than found wrong);
//! 4. keep the best-scoring record of each node; in hybrid mode fuse the two node rankings by
//!    weighted reciprocal rank fusion ([`Fusion`]); return up to `top_k` nodes, each with the
//!    stable id of the record that matched (`record_id`, spec §2.1.1);
//! 5. report the lag of every index read, within the request's scope ([`IndexLag`]), so that
//!    "no hits" right after a write says why.
//!
//! A request that names no mode (nor does `retrieval.default_mode`) runs in `auto`: hybrid
//! when both indexes serve, else the one that does. When the vector index is configured but
//! cannot serve (the model is missing, or the index holds another model's vectors), `auto`
//! falls back to keyword search and says so in [`SearchResponse::notice`]; a request that
//! names a mode needing vectors gets [`RetrievalError::VectorUnavailable`].
//!
//! Nothing here writes: retrieval reads the indexes and the source and returns.

mod error;
mod hydrate;
mod lag;
mod related;
mod tree;

use ce_core::clock::ms_of;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ce_core::{CoreError, CtxUri, IndexRecord, Level, NodeKind, RetrievalConfig};
use ce_embed::Embedder;
use ce_index::keyword::KeywordIndex;
use ce_index::vector::{SearchFilter, VectorIndex};
use ce_store::SourceStore;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::debug;

pub use error::{Result, RetrievalError};
pub use lag::{IndexLag, lag_summary};
pub use related::{
    DEFAULT_RELATED_LIMIT, MAX_RELATED_LIMIT, RelatedEdge, RelatedRequest, RelatedResponse, related,
};
pub use tree::{
    HierarchicalHit, HierarchicalParams, HierarchicalRequest, HierarchicalResponse,
    HierarchicalStats, PathStep, hierarchical_search,
};

use hydrate::Current;

/// `top_k` when the request does not say.
pub const DEFAULT_TOP_K: usize = 10;
/// Largest `top_k` of a request from the interfaces (CLI `--top-k`, HTTP `top_k`), which
/// check it with [`SearchRequest::validate`].
pub const MAX_TOP_K: usize = 100;
/// Largest `top_k` a [`Retriever`] itself accepts: an evaluation ranks deeper than the
/// interfaces allow (`ce eval --k 1000` asks for one node more when a document shares the
/// query's id).
pub const MAX_RETRIEVER_TOP_K: usize = 1001;
/// Largest accepted query, in bytes.
pub const MAX_QUERY_BYTES: usize = 16 * 1024;
/// Characters of indexed text shown when a node has no abstract.
pub const SNIPPET_CHARS: usize = 200;
/// Embedding timeout when the request does not say.
pub const DEFAULT_EMBED_TIMEOUT: Duration = Duration::from_secs(30);

/// How a search finds its candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SearchMode {
    /// Embedding similarity (cosine) over the vector index.
    Vector,
    /// BM25 over the keyword index.
    Keyword,
    /// Both, fused by weighted reciprocal rank ([`Fusion`]).
    Hybrid,
}

impl SearchMode {
    /// Every mode.
    pub const ALL: [SearchMode; 3] = [SearchMode::Vector, SearchMode::Keyword, SearchMode::Hybrid];

    /// The name used in JSON, the CLI and the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            SearchMode::Vector => "vector",
            SearchMode::Keyword => "keyword",
            SearchMode::Hybrid => "hybrid",
        }
    }

    fn uses_vectors(self) -> bool {
        self != SearchMode::Keyword
    }

    fn uses_keywords(self) -> bool {
        self != SearchMode::Vector
    }
}

impl std::fmt::Display for SearchMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SearchMode {
    type Err = CoreError;

    fn from_str(s: &str) -> Result<Self, CoreError> {
        SearchMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| CoreError::InvalidField {
                field: "mode",
                reason: format!("{s:?} is not one of \"vector\", \"keyword\", \"hybrid\""),
            })
    }
}

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
    /// Vector candidates with a cosine similarity below this are not considered (default:
    /// none; in [-1, 1]). Not accepted in keyword mode (BM25 scores have no fixed scale).
    pub min_score: Option<f32>,
    /// Timeout of the query's embedding call.
    pub embed_timeout: Duration,
    /// The mode; `None` takes the configured default ([`Fusion::default_mode`]), else `auto`.
    pub mode: Option<SearchMode>,
}

impl SearchRequest {
    /// A request for `query` with defaults: top 10, no filter, the default mode.
    pub fn new(query: impl Into<String>) -> Self {
        SearchRequest {
            query: query.into(),
            top_k: DEFAULT_TOP_K,
            filter: SearchFilter::default(),
            min_score: None,
            embed_timeout: DEFAULT_EMBED_TIMEOUT,
            mode: None,
        }
    }

    /// Checks what the types cannot: a non-empty query of bounded size, a `top_k` of at most
    /// [`MAX_TOP_K`].
    pub fn validate(&self) -> Result<()> {
        self.validate_up_to(MAX_TOP_K)
    }

    /// [`SearchRequest::validate`] with `top_k` bounded by `max_top_k`.
    pub fn validate_up_to(&self, max_top_k: usize) -> Result<()> {
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
        if let Some(m) = self.min_score {
            if !(-1.0..=1.0).contains(&m) {
                return bad("min_score", format!("{m} is outside -1..=1"));
            }
            if self.mode == Some(SearchMode::Keyword) {
                return bad(
                    "min_score",
                    "applies to vector similarity: not accepted in keyword mode".into(),
                );
            }
        }
        if self.top_k == 0 || self.top_k > max_top_k {
            return bad(
                "top_k",
                format!("{} is outside 1..={max_top_k}", self.top_k),
            );
        }
        Ok(())
    }

    /// How many index records to ask each index for (see the module docs).
    pub fn candidates(&self) -> usize {
        let per_node = if self.filter.level.is_some() {
            1
        } else {
            Level::ALL.len()
        };
        self.top_k * 2 * per_node
    }
}

/// Ranks of a hybrid hit in each mode's node ranking (from 1; `None`: not among its
/// candidates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ModeRanks {
    /// Rank by vector similarity.
    pub vector: Option<usize>,
    /// Rank by BM25.
    pub keyword: Option<usize>,
}

/// One node found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchHit {
    /// The node.
    pub uri: CtxUri,
    /// Its parent.
    pub parent_uri: CtxUri,
    /// The level of the best-matching record.
    pub level: Level,
    /// The stable id of that record, `stable_hash(uri, level)` (spec §2.1.1): the id the
    /// indexes store it under.
    pub record_id: String,
    /// Vector mode: cosine similarity of that record to the query; keyword mode: its BM25
    /// score; hybrid: the fused score, `Σ weight / (rrf_k + rank)` over the modes that ranked
    /// the node (see `ranks`; higher is better in every mode).
    pub score: f32,
    /// The node's current L0 abstract, or — when the node has none — the start of the
    /// matched record's indexed text (at most [`SNIPPET_CHARS`] characters).
    #[serde(rename = "abstract")]
    pub abstract_text: String,
    /// The node's current version (equal to the version the record was indexed from).
    pub version: u64,
    /// Context type (stored; accounts and created ancestors have their path default).
    pub context_type: String,
    /// Account, container or leaf (derived from the URI and the children).
    #[serde(default)]
    pub kind: NodeKind,
    /// Category.
    pub category: String,
    /// Hybrid mode: the node's rank in each mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<ModeRanks>,
}

/// Where the time went, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchTimings {
    /// Embedding the query.
    pub embed_ms: f64,
    /// The vector index search.
    pub index_ms: f64,
    /// The keyword index search.
    #[serde(default)]
    pub keyword_ms: f64,
    /// The batched source read and checks.
    pub hydrate_ms: f64,
    /// Counting the lag of the indexes read.
    #[serde(default)]
    pub lag_ms: f64,
    /// The whole search.
    pub total_ms: f64,
}

/// Why hydration dropped a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The source holds no node at the record's URI (removed, or moved away).
    Gone,
    /// The source holds the node at another version than the record was computed from
    /// (changed since it was indexed; the index has not caught up).
    Changed,
}

/// A candidate an index returned that hydration dropped (see [`SearchResponse::dropped`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DroppedCandidate {
    /// The record's node.
    pub uri: CtxUri,
    /// The record's level.
    pub level: Level,
    /// The record's stable id.
    pub record_id: String,
    /// The index that returned it (`vector` or `keyword`).
    pub index: String,
    /// Its score in that index.
    pub score: f32,
    /// The source version the record was computed from, if recorded.
    pub indexed_version: Option<u64>,
    /// The node's current version (`None`: the node is gone).
    pub current_version: Option<u64>,
    /// Why it was dropped.
    pub reason: DropReason,
}

/// The name of the mode of a request that names none (see the module docs).
pub const AUTO_MODE: &str = "auto";

/// The answer of a search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchResponse {
    /// The mode asked for: the request's, else `retrieval.default_mode`'s, else
    /// [`AUTO_MODE`].
    pub mode: String,
    /// The mode that ran.
    pub mode_used: SearchMode,
    /// Why the mode that ran is not the one asked for (`auto` without a vector index that
    /// serves); `None` otherwise.
    #[serde(default)]
    pub notice: Option<String>,
    /// Hybrid mode: how the rankings were fused (`rrf k=60, vector×1, keyword×1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fusion: Option<String>,
    /// Nodes found, best first (at most `top_k`).
    pub hits: Vec<SearchHit>,
    /// Records the indexes returned (vector ones at or above `min_score`).
    pub candidates: usize,
    /// Candidates examined and dropped because the source no longer holds their node at the
    /// indexed version (removed, moved, or changed since it was indexed).
    pub dropped_by_hydration: usize,
    /// The dropped candidates themselves, with the reason (`POST /v1/search` answers them
    /// only with `"explain": true`; empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<DroppedCandidate>,
    /// The embedding model (`provider:model:dimension`); empty in keyword mode.
    pub model: String,
    /// Per index read: changes within the request's scope not applied yet.
    #[serde(default)]
    pub lag: Vec<IndexLag>,
    /// Timings.
    pub timings: SearchTimings,
}

/// How hybrid search fuses its rankings, and which mode a request without one gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fusion {
    /// The mode of a request that names none; `None`: hybrid when both indexes are
    /// available, else the one that is.
    pub default_mode: Option<SearchMode>,
    /// Reciprocal rank fusion constant: a node ranked `r` (from 1) adds `weight / (k + r)`.
    pub rrf_k: u32,
    /// Weight of the vector ranking.
    pub vector_weight: f64,
    /// Weight of the keyword ranking.
    pub keyword_weight: f64,
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion::from_config(&RetrievalConfig::default())
    }
}

impl Fusion {
    /// How the fusion is described to people: `rrf k=60, vector×1, keyword×1`.
    pub fn describe(&self) -> String {
        format!(
            "rrf k={}, vector×{}, keyword×{}",
            self.rrf_k, self.vector_weight, self.keyword_weight
        )
    }

    /// The `[retrieval]` settings (validated by `Config::validate`).
    pub fn from_config(c: &RetrievalConfig) -> Self {
        Fusion {
            default_mode: c.default_mode.parse().ok(),
            rrf_k: c.rrf_k,
            vector_weight: c.vector_weight,
            keyword_weight: c.keyword_weight,
        }
    }

    /// Fuses two node rankings (best first, one entry per node): each node scores
    /// `Σ weight / (rrf_k + rank)` over the rankings that hold it; best first, ties by URI.
    /// Each entry keeps the record of the ranking where it contributes most (vector on a
    /// tie), and its ranks.
    fn fuse<'r>(
        &self,
        vector: &[(&'r IndexRecord, f32)],
        keyword: &[(&'r IndexRecord, f32)],
    ) -> Vec<(&'r IndexRecord, f32, ModeRanks)> {
        struct Entry<'r> {
            record: &'r IndexRecord,
            best: f64,
            score: f64,
            ranks: ModeRanks,
        }
        let mut by_uri: BTreeMap<&CtxUri, Entry<'r>> = BTreeMap::new();
        for (weight, list, is_vector) in [
            (self.vector_weight, vector, true),
            (self.keyword_weight, keyword, false),
        ] {
            for (i, (record, _)) in list.iter().enumerate() {
                let rank = i + 1;
                let part = weight / (f64::from(self.rrf_k) + rank as f64);
                let e = by_uri.entry(&record.uri).or_insert(Entry {
                    record,
                    best: part,
                    score: 0.0,
                    ranks: ModeRanks {
                        vector: None,
                        keyword: None,
                    },
                });
                e.score += part;
                if part > e.best {
                    (e.best, e.record) = (part, record);
                }
                if is_vector {
                    e.ranks.vector = Some(rank);
                } else {
                    e.ranks.keyword = Some(rank);
                }
            }
        }
        let mut fused: Vec<_> = by_uri
            .into_values()
            .map(|e| (e.record, e.score as f32, e.ranks))
            .collect();
        fused.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.uri.cmp(&b.0.uri)));
        fused
    }
}

/// What the vector leg of a search found.
struct VectorLeg {
    hits: Vec<ce_index::vector::VectorHit>,
    /// The embedder's model key.
    model: String,
    embed_ms: f64,
    index_ms: f64,
}

/// Embeds the query and searches the vector index (checking first that the index is bound
/// to the embedder's model).
fn vector_leg(v: VectorSide<'_>, req: &SearchRequest) -> Result<VectorLeg> {
    let identity = v.embedder.identity();
    if let Some(bound) = v.index.model()?
        && bound != *identity
    {
        return Err(RetrievalError::ModelMismatch {
            index: bound.key(),
            embedder: identity.key(),
        });
    }
    let t = Instant::now();
    let query_vector = embed_query(v.embedder, &req.query, req.embed_timeout)?;
    let embed_ms = ms_of(t.elapsed());
    let t = Instant::now();
    let mut hits = v
        .index
        .search(&query_vector, &req.filter, req.candidates())?;
    if let Some(min) = req.min_score {
        hits.retain(|h| h.score >= min);
    }
    Ok(VectorLeg {
        hits,
        model: identity.key(),
        embed_ms,
        index_ms: ms_of(t.elapsed()),
    })
}

/// Searches the keyword index; the hits and the milliseconds it took.
fn keyword_leg(
    k: KeywordSide<'_>,
    req: &SearchRequest,
) -> Result<(Vec<ce_index::keyword::KeywordHit>, f64)> {
    let t = Instant::now();
    let hits = k.index.search(&req.query, &req.filter, req.candidates())?;
    Ok((hits, ms_of(t.elapsed())))
}

/// The vector side of retrieval: the query embedder and the vector index.
#[derive(Clone, Copy)]
pub struct VectorSide<'a> {
    /// Embeds the query.
    pub embedder: &'a dyn Embedder,
    /// The vector index (bound to the embedder's model).
    pub index: &'a dyn VectorIndex,
    /// The outbox consumer that feeds the index (its lag is reported).
    pub consumer: &'a str,
}

/// The keyword side of retrieval: the keyword index.
#[derive(Clone, Copy)]
pub struct KeywordSide<'a> {
    /// The keyword index.
    pub index: &'a dyn KeywordIndex,
    /// The outbox consumer that feeds the index (its lag is reported).
    pub consumer: &'a str,
}

/// What a search reads: the source of truth and the indexes that are available.
#[derive(Clone, Copy)]
pub struct Retriever<'a> {
    /// The source of truth (hydration).
    pub source: &'a dyn SourceStore,
    /// The vector index, if available.
    pub vector: Option<VectorSide<'a>>,
    /// The keyword index, if available.
    pub keyword: Option<KeywordSide<'a>>,
    /// Fusion and the default mode.
    pub fusion: Fusion,
    /// Why the vector index is configured but cannot serve (`vector` is then `None`): `auto`
    /// falls back to keyword search with this as the notice; a mode that needs vectors is
    /// [`RetrievalError::VectorUnavailable`].
    pub vector_unavailable: Option<&'a str>,
}

/// The mode a request runs in, as [`Retriever::mode`] decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeChoice {
    /// The mode asked for, or [`AUTO_MODE`].
    pub requested: String,
    /// The mode that runs.
    pub used: SearchMode,
    /// Why `used` differs from what `auto` prefers, when it does.
    pub notice: Option<String>,
}

impl Retriever<'_> {
    /// The mode `req` runs in: its own, else the configured default, else `auto`: hybrid when
    /// both indexes are available, else the one that is — keyword, with a notice, when the
    /// vector index is configured but cannot serve. A named mode whose vector index cannot
    /// serve is [`RetrievalError::VectorUnavailable`]; one whose index is not configured is a
    /// non-retryable error naming `mode`.
    pub fn mode(&self, req: &SearchRequest) -> Result<ModeChoice> {
        let named = req.mode.or(self.fusion.default_mode);
        let (used, notice) = match (named, self.vector.is_some(), self.keyword.is_some()) {
            (Some(m), _, _) => (m, None),
            (None, true, true) => (SearchMode::Hybrid, None),
            (None, false, true) => (
                SearchMode::Keyword,
                self.vector_unavailable.map(|why| {
                    format!("vector search is unavailable ({why}): searched the keyword index only")
                }),
            ),
            (None, _, false) => (SearchMode::Vector, None),
        };
        if used.uses_vectors() && self.vector.is_none() {
            return Err(match self.vector_unavailable {
                Some(why) => RetrievalError::VectorUnavailable {
                    mode: used,
                    reason: why.to_owned(),
                },
                None => not_configured(used, SearchMode::Vector),
            });
        }
        if used.uses_keywords() && self.keyword.is_none() {
            return Err(not_configured(used, SearchMode::Keyword));
        }
        Ok(ModeChoice {
            requested: named.map_or(AUTO_MODE, SearchMode::as_str).to_owned(),
            used,
            notice,
        })
    }

    /// Runs `req` (see the module docs).
    pub fn search(&self, req: &SearchRequest) -> Result<SearchResponse> {
        let started = Instant::now();
        req.validate_up_to(MAX_RETRIEVER_TOP_K)?;
        let choice = self.mode(req)?;
        let mode = choice.used;
        let mut timings = SearchTimings::default();
        let mut model = String::new();

        let vector = self.vector.filter(|_| mode.uses_vectors());
        let keyword = self.keyword.filter(|_| mode.uses_keywords());
        // Hybrid search runs its two legs at once (the keyword leg on a scoped thread): its
        // latency is the slower leg's, not their sum.
        let (vector_found, keyword_found) = match (vector, keyword) {
            (Some(v), Some(k)) if ce_core::parallel::threads() > 1 => {
                let span = tracing::Span::current();
                std::thread::scope(|s| {
                    let keyword = s.spawn(move || span.in_scope(|| keyword_leg(k, req)));
                    let vector = vector_leg(v, req);
                    let keyword = keyword
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p));
                    (Some(vector), Some(keyword))
                })
            }
            _ => (
                vector.map(|v| vector_leg(v, req)),
                keyword.map(|k| keyword_leg(k, req)),
            ),
        };
        let vector_hits = match vector_found.transpose()? {
            Some(leg) => {
                model = leg.model;
                timings.embed_ms = leg.embed_ms;
                timings.index_ms = leg.index_ms;
                leg.hits
            }
            None => Vec::new(),
        };
        let keyword_hits = match keyword_found.transpose()? {
            Some((hits, ms)) => {
                timings.keyword_ms = ms;
                hits
            }
            None => Vec::new(),
        };

        let t = Instant::now();
        let current = Current::read(
            self.source,
            vector_hits
                .iter()
                .map(|h| &h.record)
                .chain(keyword_hits.iter().map(|h| &h.record)),
        )?;
        let (mut hits, dropped) = match mode {
            SearchMode::Vector | SearchMode::Keyword => {
                let (ranked, dropped) = if mode == SearchMode::Vector {
                    current.rank(&vector_hits, req.top_k, "vector")
                } else {
                    current.rank(&keyword_hits, req.top_k, "keyword")
                };
                let hits: Vec<SearchHit> = ranked
                    .into_iter()
                    .filter_map(|(r, score)| current.hit(r, score))
                    .collect();
                (hits, dropped)
            }
            SearchMode::Hybrid => {
                let (v, mut dropped) = current.rank(&vector_hits, usize::MAX, "vector");
                let (k, dk) = current.rank(&keyword_hits, usize::MAX, "keyword");
                dropped.extend(dk);
                let hits = self
                    .fusion
                    .fuse(&v, &k)
                    .into_iter()
                    .take(req.top_k)
                    .filter_map(|(r, score, ranks)| {
                        let mut hit = current.hit(r, score)?;
                        hit.ranks = Some(ranks);
                        Some(hit)
                    })
                    .collect();
                (hits, dropped)
            }
        };
        let uris: Vec<CtxUri> = hits.iter().map(|h| h.uri.clone()).collect();
        for (hit, kind) in hits.iter_mut().zip(self.source.kinds(&uris)?) {
            hit.kind = kind;
        }
        timings.hydrate_ms = ms_of(t.elapsed());
        let t = Instant::now();
        // The mode check above guarantees the sides this mode reads.
        let read: Vec<&str> = [
            self.vector
                .filter(|_| mode.uses_vectors())
                .map(|v| v.consumer),
            self.keyword
                .filter(|_| mode.uses_keywords())
                .map(|k| k.consumer),
        ]
        .into_iter()
        .flatten()
        .collect();
        let lag = lag::lag_of(self.source, &read, lag::search_scope(&req.filter).as_ref())?;
        timings.lag_ms = ms_of(t.elapsed());

        let total = started.elapsed();
        timings.total_ms = ms_of(total);
        metrics::histogram!("retrieval_search_latency_ms", "mode" => mode.as_str())
            .record(total.as_secs_f64() * 1e3);
        if !dropped.is_empty() {
            metrics::counter!("retrieval_dropped_by_hydration_total", "mode" => mode.as_str())
                .increment(dropped.len() as u64);
        }
        let candidates = vector_hits.len() + keyword_hits.len();
        debug!(%mode, candidates, hits = hits.len(), dropped = dropped.len(), "search done");
        Ok(SearchResponse {
            mode: choice.requested,
            mode_used: mode,
            notice: choice.notice,
            fusion: (mode == SearchMode::Hybrid).then(|| self.fusion.describe()),
            hits,
            candidates,
            dropped_by_hydration: dropped.len(),
            dropped,
            model,
            lag,
            timings,
        })
    }
}

/// Runs `req` in vector mode over `vector` (a [`Retriever`] without a keyword index).
pub fn search(
    source: &dyn SourceStore,
    vector: VectorSide<'_>,
    req: &SearchRequest,
) -> Result<SearchResponse> {
    Retriever {
        source,
        vector: Some(vector),
        keyword: None,
        fusion: Fusion::default(),
        vector_unavailable: None,
    }
    .search(req)
}

/// The error of a mode whose index (named by the mode that reads it alone) is not
/// configured.
fn not_configured(mode: SearchMode, index: SearchMode) -> RetrievalError {
    RetrievalError::InvalidRequest(CoreError::InvalidField {
        field: "mode",
        reason: format!("{mode} search needs the {index} index, which is not available"),
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
mod modes_tests;
#[cfg(test)]
mod tests;
