//! Hydration: every candidate is checked against the source of truth in one batched read.
//!
//! Invariant **RT1**: a returned hit's node exists in the source at exactly the version its
//! index record was computed from, so the returned text is the node's current text.

use std::collections::{BTreeMap, BTreeSet};

use ce_core::{ContextNode, CtxUri};
use ce_index::vector::VectorHit;
use ce_store::SourceStore;
use serde_json::Value;

use crate::error::Result;
use crate::{SNIPPET_CHARS, SearchHit};

/// Hits that survived, and how many candidates were dropped.
pub(crate) struct Hydrated {
    pub hits: Vec<SearchHit>,
    pub dropped: usize,
}

/// The version an index record was computed from (`metadata.node_version`), if recorded.
pub(crate) fn indexed_version(hit: &VectorHit) -> Option<u64> {
    hit.record
        .metadata
        .get("node_version")
        .and_then(Value::as_u64)
}

/// Keeps the candidates (best first) whose node the source holds at the indexed version, one
/// hit per node, until `top_k` nodes are found. Drops are counted among the candidates
/// examined.
pub(crate) fn hydrate(
    source: &dyn SourceStore,
    candidates: &[VectorHit],
    top_k: usize,
) -> Result<Hydrated> {
    let uris: Vec<CtxUri> = candidates
        .iter()
        .map(|h| h.record.uri.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let nodes: BTreeMap<CtxUri, ContextNode> = if uris.is_empty() {
        BTreeMap::new()
    } else {
        source
            .read_nodes(&uris)?
            .into_iter()
            .map(|n| (n.uri.clone(), n))
            .collect()
    };
    let mut seen: BTreeSet<&CtxUri> = BTreeSet::new();
    let mut out = Hydrated {
        hits: Vec::new(),
        dropped: 0,
    };
    for hit in candidates {
        if out.hits.len() >= top_k {
            break;
        }
        let r = &hit.record;
        let current = nodes
            .get(&r.uri)
            .filter(|n| indexed_version(hit) == Some(n.version));
        let Some(node) = current else {
            out.dropped += 1;
            continue;
        };
        if !seen.insert(&r.uri) {
            continue;
        }
        debug_assert!(rt1(node, hit), "RT1 violated for {}", r.uri);
        out.hits.push(SearchHit {
            uri: node.uri.clone(),
            parent_uri: node.parent_uri.clone(),
            level: r.level,
            score: hit.score,
            abstract_text: if node.layers.abstract_text.is_empty() {
                snippet(&r.text)
            } else {
                node.layers.abstract_text.clone()
            },
            version: node.version,
            context_type: node.context_type.as_str().to_owned(),
            category: node.category.clone(),
        });
    }
    Ok(out)
}

/// RT1 for one hit.
pub(crate) fn rt1(node: &ContextNode, hit: &VectorHit) -> bool {
    node.uri == hit.record.uri && indexed_version(hit) == Some(node.version)
}

/// The first [`SNIPPET_CHARS`] characters of `text`, with `…` when cut.
pub(crate) fn snippet(text: &str) -> String {
    match text.char_indices().nth(SNIPPET_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
