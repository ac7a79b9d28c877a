//! Hydration: every candidate is checked against the source of truth in one batched read.
//!
//! Invariant **RT1**: a returned hit's node exists in the source at exactly the version its
//! index record was computed from, so the returned text is the node's current text.

use std::collections::{BTreeMap, BTreeSet};

use ce_core::{ContextNode, CtxUri, IndexRecord, LayerOrigin, Level};
use ce_index::keyword::KeywordHit;
use ce_index::vector::VectorHit;
use ce_store::SourceStore;
use serde_json::Value;

use crate::error::Result;
use crate::{DropReason, DroppedCandidate, SNIPPET_CHARS, SearchHit};

/// An index hit: a stored record and its score (vector or keyword).
pub(crate) trait Scored {
    fn record(&self) -> &IndexRecord;
    fn score(&self) -> f32;
}

impl Scored for VectorHit {
    fn record(&self) -> &IndexRecord {
        &self.record
    }
    fn score(&self) -> f32 {
        self.score
    }
}

impl Scored for KeywordHit {
    fn record(&self) -> &IndexRecord {
        &self.record
    }
    fn score(&self) -> f32 {
        self.score
    }
}

/// The version an index record was computed from (`metadata.node_version`), if recorded.
pub(crate) fn indexed_version(record: &IndexRecord) -> Option<u64> {
    record.metadata.get("node_version").and_then(Value::as_u64)
}

/// The source's current nodes for a set of candidates: one batched read.
/// Whether `node`'s record of `level` is a derived roll-up: an L0 / L1 the derive consumer
/// wrote for a node with no content of its own (a folder; docs/derive.md).
pub(crate) fn is_rollup(node: &ContextNode, level: Level) -> bool {
    level != Level::L2
        && node.layers.content.is_empty()
        && node
            .provenance
            .get(level)
            .is_some_and(|o| matches!(o, LayerOrigin::Derived(_)))
}

pub(crate) struct Current {
    nodes: BTreeMap<CtxUri, ContextNode>,
}

impl Current {
    /// Reads the nodes of `records` in one `read_nodes`.
    pub(crate) fn read<'a>(
        source: &dyn SourceStore,
        records: impl IntoIterator<Item = &'a IndexRecord>,
    ) -> Result<Self> {
        Self::read_uris(source, records.into_iter().map(|r| r.uri.clone()))
    }

    /// Reads the nodes at `uris` in one `read_nodes`.
    pub(crate) fn read_uris(
        source: &dyn SourceStore,
        uris: impl IntoIterator<Item = CtxUri>,
    ) -> Result<Self> {
        let uris: Vec<CtxUri> = uris
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let nodes = if uris.is_empty() {
            BTreeMap::new()
        } else {
            source
                .read_nodes(&uris)?
                .into_iter()
                .map(|n| (n.uri.clone(), n))
                .collect()
        };
        Ok(Current { nodes })
    }

    /// The node at `uri`, whatever its version.
    pub(crate) fn node(&self, uri: &CtxUri) -> Option<&ContextNode> {
        self.nodes.get(uri)
    }

    /// The node of `record` if the source holds it at exactly the indexed version (RT1).
    pub(crate) fn of(&self, record: &IndexRecord) -> Option<&ContextNode> {
        self.nodes
            .get(&record.uri)
            .filter(|n| indexed_version(record) == Some(n.version))
    }

    /// Why `record` is not current, if it is not: its node is gone from the source (removed
    /// or moved away), or the source holds it at another version than the record was
    /// computed from (RT1).
    pub(crate) fn drop_reason(&self, record: &IndexRecord) -> Option<(DropReason, Option<u64>)> {
        match self.nodes.get(&record.uri) {
            None => Some((DropReason::Gone, None)),
            Some(n) if indexed_version(record) != Some(n.version) => {
                Some((DropReason::Changed, Some(n.version)))
            }
            Some(_) => None,
        }
    }

    /// The current candidates of `candidates` (best first), one per node: each node's best
    /// current record and its score, in order; and the candidates dropped as stale, with the
    /// reason. Stops once `limit` nodes are found (drops are among the candidates examined).
    ///
    /// The flat modes rank with this, and it passes over the records of a folder's derived
    /// roll-up ([`is_rollup`]): a roll-up restates its children's abstracts, so it would
    /// outrank the very documents it names. Hierarchical search seeds on roll-ups itself.
    pub(crate) fn rank<'c, H: Scored>(
        &self,
        candidates: &'c [H],
        limit: usize,
        index: &'static str,
    ) -> (Vec<(&'c IndexRecord, f32)>, Vec<DroppedCandidate>) {
        let mut seen: BTreeSet<&CtxUri> = BTreeSet::new();
        let mut out = Vec::new();
        let mut dropped = Vec::new();
        for c in candidates {
            if out.len() >= limit {
                break;
            }
            let r = c.record();
            if let Some((reason, current_version)) = self.drop_reason(r) {
                dropped.push(DroppedCandidate {
                    uri: r.uri.clone(),
                    level: r.level,
                    record_id: r.id.clone(),
                    index: index.to_owned(),
                    score: c.score(),
                    indexed_version: indexed_version(r),
                    current_version,
                    reason,
                });
                continue;
            }
            // Current (checked above): a roll-up is passed over, a node counted once.
            if self.of(r).is_some_and(|node| !is_rollup(node, r.level)) && seen.insert(&r.uri) {
                out.push((r, c.score()));
            }
        }
        (out, dropped)
    }

    /// The hit of a current record (see [`Current::of`]); `None` if it is not current.
    pub(crate) fn hit(&self, record: &IndexRecord, score: f32) -> Option<SearchHit> {
        let node = self.of(record)?;
        Some(SearchHit {
            uri: node.uri.clone(),
            parent_uri: node.parent_uri.clone(),
            level: record.level,
            record_id: record.id.clone(),
            score,
            abstract_text: if node.layers.abstract_text.is_empty() {
                snippet(&record.text)
            } else {
                node.layers.abstract_text.clone()
            },
            version: node.version,
            context_type: node.context_type.as_str().to_owned(),
            // The search sets it from one batched read of the hits' children.
            kind: ce_core::NodeKind::Leaf,
            category: node.category.clone(),
            ranks: None,
        })
    }
}

/// The first [`SNIPPET_CHARS`] characters of `text`, with `…` when cut.
pub(crate) fn snippet(text: &str) -> String {
    match text.char_indices().nth(SNIPPET_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
