//! `related`: a node's edges from the relation index, vouched for by the source of truth.
//!
//! The relation index answers (strongest first); then every edge is **hydrated** in one
//! batched read of its two endpoints: an edge is returned only if both endpoints exist and
//! the owner (`from_uri`) is at exactly the relation version the record was indexed from —
//! an owner whose edges changed since (linked, unlinked, moved, removed) has its records
//! dropped and counted until the relation worker catches up. Better not found than found
//! wrong (DESIGN.md decision 9). The answer carries the relation index's lag within the
//! node's account, so that an edge just linked and not yet indexed is explained.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ce_core::{ContextNode, CoreError, CtxUri};
use ce_index::relation::{Direction, RelationIndex};
use ce_store::{SourceStore, StoreError};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RetrievalError};
use crate::lag::{self, IndexLag};

/// Edges returned when the request does not say.
pub const DEFAULT_RELATED_LIMIT: usize = 50;
/// Largest accepted limit.
pub const MAX_RELATED_LIMIT: usize = 1000;

/// A `related` request.
#[derive(Debug, Clone, PartialEq)]
pub struct RelatedRequest {
    /// The node.
    pub uri: CtxUri,
    /// Only edges of this type.
    pub relation_type: Option<String>,
    /// Outgoing (`uri` is the owner), incoming, or both.
    pub direction: Direction,
    /// At most this many edges (1..=[`MAX_RELATED_LIMIT`]).
    pub limit: usize,
}

impl RelatedRequest {
    /// Outgoing edges of `uri`, any type, the default limit.
    pub fn new(uri: CtxUri) -> Self {
        RelatedRequest {
            uri,
            relation_type: None,
            direction: Direction::Out,
            limit: DEFAULT_RELATED_LIMIT,
        }
    }
}

/// One edge found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RelatedEdge {
    /// The owner of the edge.
    pub from_uri: CtxUri,
    /// Its target.
    pub to_uri: CtxUri,
    /// The relation type.
    pub relation_type: String,
    /// Weight (higher is stronger).
    pub weight: f64,
    /// Why the edge exists.
    pub reason: String,
    /// `out` when the requested node owns the edge, else `in`.
    pub direction: Direction,
    /// The end that is not the requested node (itself for a self-loop).
    pub other: CtxUri,
    /// The other end's current L0 abstract.
    #[serde(rename = "abstract")]
    pub abstract_text: String,
}

/// The answer of [`related`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RelatedResponse {
    /// The node asked about.
    pub uri: CtxUri,
    /// Edges, strongest first.
    pub edges: Vec<RelatedEdge>,
    /// Index records dropped because the source no longer vouches for them.
    pub dropped_by_hydration: usize,
    /// The relation index's changes within the node's account not applied yet.
    #[serde(default)]
    pub lag: Vec<IndexLag>,
    /// Time taken, in milliseconds.
    pub took_ms: f64,
}

/// Runs `req` over `index`, fed by the outbox consumer `consumer` (see the module docs).
pub fn related(
    source: &dyn SourceStore,
    index: &dyn RelationIndex,
    consumer: &str,
    req: &RelatedRequest,
) -> Result<RelatedResponse> {
    let started = Instant::now();
    if req.limit == 0 || req.limit > MAX_RELATED_LIMIT {
        return Err(RetrievalError::InvalidRequest(CoreError::InvalidField {
            field: "limit",
            reason: format!("{} is outside 1..={MAX_RELATED_LIMIT}", req.limit),
        }));
    }
    let records = index.related(
        &req.uri,
        req.relation_type.as_deref(),
        req.direction,
        req.limit,
    )?;
    let uris: Vec<CtxUri> = records
        .iter()
        .flat_map(|r| [r.record.from_uri.clone(), r.record.to_uri.clone()])
        .chain([req.uri.clone()])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let nodes: BTreeMap<CtxUri, ContextNode> = source
        .read_nodes(&uris)?
        .into_iter()
        .map(|n| (n.uri.clone(), n))
        .collect();
    if !nodes.contains_key(&req.uri) {
        return Err(RetrievalError::Store(StoreError::NodeNotFound {
            uri: req.uri.clone(),
        }));
    }
    let mut edges = Vec::with_capacity(records.len());
    let mut dropped = 0;
    for r in records {
        let e = r.record;
        let owner_current = nodes
            .get(&e.from_uri)
            .is_some_and(|n| n.relation_version == r.relation_version);
        let outgoing = e.from_uri == req.uri;
        let other = if outgoing {
            e.to_uri.clone()
        } else {
            e.from_uri.clone()
        };
        match (owner_current, nodes.get(&other)) {
            (true, Some(o)) if nodes.contains_key(&e.to_uri) => edges.push(RelatedEdge {
                abstract_text: o.layers.abstract_text.clone(),
                direction: if outgoing {
                    Direction::Out
                } else {
                    Direction::In
                },
                other,
                from_uri: e.from_uri,
                to_uri: e.to_uri,
                relation_type: e.relation_type,
                weight: e.weight,
                reason: e.reason,
            }),
            _ => dropped += 1,
        }
    }
    if dropped > 0 {
        metrics::counter!("retrieval_dropped_by_hydration_total", "mode" => "related")
            .increment(dropped as u64);
    }
    let lag = lag::lag_of(source, &[consumer], lag::account_scope(&req.uri).as_ref())?;
    Ok(RelatedResponse {
        uri: req.uri.clone(),
        edges,
        dropped_by_hydration: dropped,
        lag,
        took_ms: ce_core::clock::ms_of(started.elapsed()),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ce_core::{Classify as _, Config, ErrorCode};
    use ce_index::relation::memory::MemoryRelationIndex;
    use ce_index::worker::{IndexWorker, WorkerConfig};
    use ce_store::{ContextFs as _, LinkRequest, PutRequest, RelationStore as _, SqliteStore};

    use super::*;

    fn u(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Arc<SqliteStore>,
        index: Arc<MemoryRelationIndex>,
        worker: IndexWorker,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("tmp");
            let cfg = Config::default();
            let store = Arc::new(SqliteStore::open(dir.path(), cfg.clone()).expect("store"));
            let index = Arc::new(MemoryRelationIndex::new());
            let worker = IndexWorker::for_relations(
                WorkerConfig::from_config(&cfg, "r1", "relation"),
                store.clone(),
                index.clone(),
            )
            .expect("worker");
            Fixture {
                _dir: dir,
                store,
                index,
                worker,
            }
        }

        fn put(&self, uri: &str, abs: &str) {
            let req = PutRequest {
                abstract_text: Some(abs.into()),
                ..PutRequest::default()
            };
            self.store.put(&u(uri), req).expect("put");
        }

        fn link(&self, from: &str, to: &str, ty: &str, weight: f64) {
            self.store
                .link(LinkRequest {
                    from: u(from),
                    to: u(to),
                    relation_type: ty.into(),
                    weight,
                    reason: format!("{from} → {to}"),
                    trace_id: None,
                })
                .expect("link");
        }

        fn index_all(&self) {
            while self.worker.run_once(100).expect("run").claimed > 0 {}
        }

        fn related(&self, uri: &str, ty: Option<&str>, dir: Direction) -> RelatedResponse {
            let req = RelatedRequest {
                relation_type: ty.map(str::to_owned),
                direction: dir,
                ..RelatedRequest::new(u(uri))
            };
            related(self.store.as_ref(), self.index.as_ref(), "relation", &req).expect("related")
        }
    }

    fn others(r: &RelatedResponse) -> Vec<&str> {
        r.edges.iter().map(|e| e.other.as_str()).collect()
    }

    #[test]
    fn edges_come_strongest_first_with_the_other_end() {
        let f = Fixture::new();
        for (uri, abs) in [("a", "Alpha"), ("b", "Beta"), ("c", "Gamma")] {
            f.put(&format!("ctx://acc/docs/{uri}"), abs);
        }
        f.link("ctx://acc/docs/a", "ctx://acc/docs/b", "cites", 0.5);
        f.link("ctx://acc/docs/a", "ctx://acc/docs/c", "cites", 0.9);
        f.link("ctx://acc/docs/c", "ctx://acc/docs/a", "depends_on", 1.0);
        f.index_all();
        let out = f.related("ctx://acc/docs/a", None, Direction::Out);
        assert_eq!(others(&out), ["ctx://acc/docs/c", "ctx://acc/docs/b"]);
        assert_eq!(out.edges[0].abstract_text, "Gamma");
        assert_eq!(out.dropped_by_hydration, 0);
        let inbound = f.related("ctx://acc/docs/a", None, Direction::In);
        assert_eq!(others(&inbound), ["ctx://acc/docs/c"]);
        assert_eq!(inbound.edges[0].direction, Direction::In);
        let typed = f.related("ctx://acc/docs/a", Some("depends_on"), Direction::Both);
        assert_eq!(typed.edges.len(), 1);
        assert_eq!(typed.edges[0].relation_type, "depends_on");
    }

    #[test]
    fn an_edge_not_indexed_yet_shows_as_relation_lag_within_the_account() {
        let f = Fixture::new();
        for n in ["a", "b"] {
            f.put(&format!("ctx://acc/docs/{n}"), n);
        }
        f.put("ctx://other/docs/c", "c");
        f.index_all();
        let r = f.related("ctx://acc/docs/a", None, Direction::Out);
        assert_eq!(r.lag.len(), 1, "{r:?}");
        assert_eq!((r.lag[0].index.as_str(), r.lag[0].events), ("relation", 0));
        f.link("ctx://acc/docs/a", "ctx://acc/docs/b", "cites", 1.0);
        f.put("ctx://other/docs/d", "another account's change");
        let r = f.related("ctx://acc/docs/a", None, Direction::Out);
        assert!(r.edges.is_empty(), "{r:?}");
        assert_eq!(r.lag[0].events, 1, "only this account's change: {r:?}");
        f.index_all();
        let r = f.related("ctx://acc/docs/a", None, Direction::Out);
        assert_eq!((others(&r), r.lag[0].events), (vec!["ctx://acc/docs/b"], 0));
    }

    #[test]
    fn edges_the_source_no_longer_holds_are_dropped_and_counted() {
        let f = Fixture::new();
        for n in ["a", "b", "c"] {
            f.put(&format!("ctx://acc/docs/{n}"), n);
        }
        f.link("ctx://acc/docs/a", "ctx://acc/docs/b", "cites", 1.0);
        f.link("ctx://acc/docs/a", "ctx://acc/docs/c", "cites", 1.0);
        f.index_all();
        // Not yet indexed: b removed, and a's edges changed.
        f.store
            .rm(&u("ctx://acc/docs/b"), false, None, None)
            .expect("rm");
        f.store
            .unlink(
                &u("ctx://acc/docs/a"),
                &u("ctx://acc/docs/c"),
                "cites",
                None,
            )
            .expect("unlink");
        let r = f.related("ctx://acc/docs/a", None, Direction::Out);
        assert!(r.edges.is_empty(), "{r:?}");
        assert_eq!(r.dropped_by_hydration, 2);
        f.index_all();
        let r = f.related("ctx://acc/docs/a", None, Direction::Out);
        assert_eq!((r.edges.len(), r.dropped_by_hydration), (0, 0), "{r:?}");
    }

    #[test]
    fn a_bad_limit_or_a_missing_node_is_refused() {
        let f = Fixture::new();
        let err = related(
            f.store.as_ref(),
            f.index.as_ref(),
            "relation",
            &RelatedRequest::new(u("ctx://acc/docs/none")),
        )
        .expect_err("missing");
        assert_eq!(err.code(), ErrorCode::NotFound);
        let req = RelatedRequest {
            limit: 0,
            ..RelatedRequest::new(u("ctx://acc/docs/a"))
        };
        let err = related(f.store.as_ref(), f.index.as_ref(), "relation", &req).expect_err("limit");
        assert_eq!(err.code(), ErrorCode::InvalidField);
    }
}
