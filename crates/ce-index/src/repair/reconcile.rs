//! `repair_reconcile_index` (spec §8.3.2): one index compared with the projection of the
//! source of truth within a subtree, in both directions, by stable record id.
//!
//! - **missing**: the source's projection has a record the index lacks (a node or an edge
//!   never indexed, or indexed under another URI before a move);
//! - **orphan**: the index has a record whose node (vector, keyword) the source does not hold
//!   at that URI — removed, or moved to another URI — or, for the relation index, an edge the
//!   source does not have;
//! - **stale**: both have the record but it differs (text and its `content_hash`, filters,
//!   metadata, the source version it was computed from, an edge's weight or reason), the
//!   index has a level the live node no longer projects, or the vector index holds vectors of
//!   another embedding model than the configured one.
//!
//! The events that converge the index (delivered to its consumer only, by the caller):
//! `UPSERT_CONTEXT` (reason `repair`) per node with missing or stale records,
//! `DELETE_CONTEXT` per orphan URI — the worker finds the node absent in the source and
//! removes the URI's records (`remove_node` at its tombstone's version, or a purge when the
//! source never stored it) — and, for the relation index, `UPSERT_RELATION` per owner with any
//! finding (the worker replaces the owner's whole edge set with the source's, or removes it).
//! A vector index of another model gets no events: only a rebuild (`ce reindex --consumer
//! vector`) can fix it.
//!
//! The source and the index are read one after the other, not in one snapshot: under
//! concurrent writes a finding may be work already queued. Its repair event is then
//! redundant, never harmful (the worker applies the current state).

use std::collections::{BTreeMap, BTreeSet};

use ce_core::{
    ContextNode, CtxUri, DeleteContextPayload, EVENT_VERSION, EventPayload, IndexProjector,
    OutboxEventCreate, RelationEdge, RelationMode, UpsertContextPayload, UpsertReason,
    UpsertRelationPayload,
};
use ce_embed::ModelIdentity;
use ce_store::{SourceStore, UriVersion};
use serde::{Deserialize, Serialize};

use super::RepairError;
use crate::keyword::KeywordIndex;
use crate::relation::{RelationIndex, RelationRecord};
use crate::vector::VectorIndex;
use ce_core::safety::{DeleteSafety, LargeDelete};

/// Sample URIs kept per kind of finding.
pub const SAMPLES: usize = 10;

/// The index to compare, through its listing.
#[derive(Clone, Copy)]
pub enum IndexView<'a> {
    /// A vector index, and the model it must hold (`None`: not checked, e.g. the embedder
    /// is not loaded).
    Vector {
        /// The index.
        index: &'a dyn VectorIndex,
        /// The configured model.
        model: Option<&'a ModelIdentity>,
    },
    /// A keyword index.
    Keyword(&'a dyn KeywordIndex),
    /// A relation index.
    Relations(&'a dyn RelationIndex),
}

/// One kind of finding: how many records, on how many URIs (nodes, or relation owners), and
/// the first [`SAMPLES`] of those URIs in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Finding {
    /// Records concerned.
    pub records: u64,
    /// Distinct URIs concerned (nodes; owners for the relation index).
    pub uris: u64,
    /// The first URIs, in URI order.
    pub samples: Vec<CtxUri>,
}

impl Finding {
    fn of(owners: &[CtxUri]) -> Self {
        let distinct: BTreeSet<&CtxUri> = owners.iter().collect();
        Finding {
            records: owners.len() as u64,
            uris: distinct.len() as u64,
            samples: distinct.into_iter().take(SAMPLES).cloned().collect(),
        }
    }
}

/// What a reconcile of one index found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Findings {
    /// The index's consumer.
    pub consumer: String,
    /// The subtree compared.
    pub scope: CtxUri,
    /// Records the source's projection has within the scope.
    pub source_records: u64,
    /// Records the index has within the scope (the scope of the delete-safety check).
    pub index_records: u64,
    /// Records the index lacks.
    pub missing: Finding,
    /// Records the index has for nodes (edges) the source does not hold there.
    pub orphan: Finding,
    /// Records that differ from the source's projection.
    pub stale: Finding,
    /// Set when the vector index holds another model's vectors (every record is then stale
    /// and only a rebuild fixes it).
    pub model_mismatch: Option<String>,
}

impl Findings {
    /// Whether the index equals the source's projection within the scope.
    pub fn is_clean(&self) -> bool {
        self.missing.records == 0
            && self.orphan.records == 0
            && self.stale.records == 0
            && self.model_mismatch.is_none()
    }

    /// The delete-safety check of the orphan deletes this repair would make
    /// ([`DeleteSafety::check`] with the orphans out of the index's records in scope).
    pub fn delete_safety(&self) -> Result<(), LargeDelete> {
        DeleteSafety::check(self.orphan.records, self.index_records)
    }
}

/// A reconcile's findings and the events that converge the index.
#[derive(Debug, Clone)]
pub struct Reconciliation {
    /// What was found.
    pub findings: Findings,
    /// The repair events, in URI order (to append for the consumer only).
    pub events: Vec<OutboxEventCreate>,
}

/// The source side of a reconcile within one subtree, read once and compared with each
/// index in turn.
pub struct Reconciler<'a> {
    source: &'a dyn SourceStore,
    projector: &'a IndexProjector,
    scope: CtxUri,
    trace_id: String,
    nodes: BTreeMap<CtxUri, ContextNode>,
    /// Each owner's outgoing edges, read on first use.
    edges: Option<BTreeMap<CtxUri, Vec<RelationEdge>>>,
}

/// One record on either side: the URI it belongs to and what must be equal.
struct Entry<V> {
    owner: CtxUri,
    value: V,
}

/// The owner URIs of each kind of finding, one per record.
#[derive(Default)]
struct Diff {
    missing: Vec<CtxUri>,
    orphan: Vec<CtxUri>,
    stale: Vec<CtxUri>,
}

/// Compares `want` (the source's projection) with `got` (the index) by record id. An index
/// record the source lacks is stale when `live(owner)` (its node is there: a level too many),
/// else an orphan; with `all_stale` every common record is stale.
fn compare<V: PartialEq>(
    want: &BTreeMap<String, Entry<V>>,
    got: &BTreeMap<String, Entry<V>>,
    live: impl Fn(&CtxUri) -> bool,
    all_stale: bool,
) -> Diff {
    let mut d = Diff::default();
    for (id, w) in want {
        match got.get(id) {
            None => d.missing.push(w.owner.clone()),
            Some(g) if all_stale || g.value != w.value || g.owner != w.owner => {
                d.stale.push(w.owner.clone());
            }
            Some(_) => {}
        }
    }
    for (id, g) in got {
        if !want.contains_key(id) {
            if live(&g.owner) {
                d.stale.push(g.owner.clone());
            } else {
                d.orphan.push(g.owner.clone());
            }
        }
    }
    d
}

fn distinct(lists: &[&[CtxUri]]) -> BTreeSet<CtxUri> {
    lists.iter().flat_map(|l| l.iter().cloned()).collect()
}

impl<'a> Reconciler<'a> {
    /// Reads the source's nodes within `scope` (the root: everything); `trace_id` goes into
    /// every repair event.
    pub fn new(
        source: &'a dyn SourceStore,
        projector: &'a IndexProjector,
        scope: &CtxUri,
        trace_id: &str,
    ) -> Result<Self, RepairError> {
        let nodes = source
            .read_subtree(scope)?
            .into_iter()
            .map(|n| (n.uri.clone(), n))
            .collect();
        Ok(Reconciler {
            source,
            projector,
            scope: scope.clone(),
            trace_id: trace_id.to_owned(),
            nodes,
            edges: None,
        })
    }

    /// The scope.
    pub fn scope(&self) -> &CtxUri {
        &self.scope
    }

    /// Compares `index`, the index of `consumer`, with the source within the scope.
    pub fn reconcile(
        &mut self,
        consumer: &str,
        index: IndexView<'_>,
    ) -> Result<Reconciliation, RepairError> {
        let mut findings = Findings {
            consumer: consumer.to_owned(),
            scope: self.scope.clone(),
            source_records: 0,
            index_records: 0,
            missing: Finding::default(),
            orphan: Finding::default(),
            stale: Finding::default(),
            model_mismatch: None,
        };
        let (diff, events) = match index {
            IndexView::Vector { index, model } => {
                let stored = index.model()?;
                findings.model_mismatch = match (stored, model) {
                    (Some(s), Some(m)) if s != *m => Some(format!(
                        "the vector index holds vectors of {} but the configured model is {m}: run `ce reindex --consumer vector`",
                        s.key()
                    )),
                    _ => None,
                };
                let got = index.list_under(&self.scope)?;
                let mismatch = findings.model_mismatch.is_some();
                let diff = self.compare_nodes(got, &mut findings, mismatch);
                let events = if mismatch {
                    Vec::new()
                } else {
                    self.node_events(&diff)?
                };
                (diff, events)
            }
            IndexView::Keyword(index) => {
                let got = index.list_under(&self.scope)?;
                let diff = self.compare_nodes(got, &mut findings, false);
                let events = self.node_events(&diff)?;
                (diff, events)
            }
            IndexView::Relations(index) => {
                let got = index.list_under(&self.scope)?;
                let diff = self.compare_relations(got, &mut findings)?;
                let events = self.relation_events(&diff);
                (diff, events)
            }
        };
        findings.missing = Finding::of(&diff.missing);
        findings.orphan = Finding::of(&diff.orphan);
        findings.stale = Finding::of(&diff.stale);
        Ok(Reconciliation { findings, events })
    }

    /// Node records (vector, keyword): the projection of every live node in scope.
    fn compare_nodes(
        &self,
        got: Vec<crate::vector::StoredRecord>,
        findings: &mut Findings,
        all_stale: bool,
    ) -> Diff {
        let want: BTreeMap<String, Entry<_>> = self
            .nodes
            .values()
            .flat_map(|n| {
                self.projector
                    .build_context_records(n)
                    .records
                    .into_iter()
                    .map(move |r| {
                        let entry = Entry {
                            owner: n.uri.clone(),
                            value: (r.clone(), n.version),
                        };
                        (r.id, entry)
                    })
            })
            .collect();
        let got: BTreeMap<String, Entry<_>> = got
            .into_iter()
            .map(|s| {
                let entry = Entry {
                    owner: s.record.uri.clone(),
                    value: (s.record.clone(), s.node_version),
                };
                (s.record.id, entry)
            })
            .collect();
        findings.source_records = want.len() as u64;
        findings.index_records = got.len() as u64;
        compare(&want, &got, |u| self.nodes.contains_key(u), all_stale)
    }

    /// `UPSERT_CONTEXT` per node with missing or stale records, `DELETE_CONTEXT` per orphan
    /// URI (skipping a URI created since the source was read: its own event syncs it).
    fn node_events(&self, d: &Diff) -> Result<Vec<OutboxEventCreate>, RepairError> {
        let mut events = Vec::new();
        for uri in distinct(&[&d.missing, &d.stale]) {
            let version = self.nodes.get(&uri).map_or(0, |n| n.version);
            events.push(OutboxEventCreate {
                payload: EventPayload::UpsertContext(UpsertContextPayload {
                    event_version: EVENT_VERSION,
                    uri,
                    expected_node_version: version,
                    reason: UpsertReason::Repair,
                    trace_id: self.trace_id.clone(),
                }),
            });
        }
        let orphans: Vec<CtxUri> = distinct(&[&d.orphan]).into_iter().collect();
        let versions = self.source.versions(&orphans)?;
        for (uri, v) in orphans.into_iter().zip(versions) {
            let version = match v {
                UriVersion::Deleted(v) => v,
                UriVersion::Unknown => 0,
                UriVersion::Live(_) => continue,
            };
            events.push(OutboxEventCreate {
                payload: EventPayload::DeleteContext(DeleteContextPayload {
                    event_version: EVENT_VERSION,
                    uri,
                    expected_deleted_version: version,
                    recursive: false,
                    trace_id: self.trace_id.clone(),
                }),
            });
        }
        Ok(events)
    }

    /// Relation records: every live owner's edges as the projector builds them, at its
    /// relation version. Any index edge the source lacks is an orphan.
    fn compare_relations(
        &mut self,
        got: Vec<RelationRecord>,
        findings: &mut Findings,
    ) -> Result<Diff, RepairError> {
        if self.edges.is_none() {
            let mut edges = BTreeMap::new();
            // Only nodes whose edges ever changed can own edges.
            for n in self.nodes.values().filter(|n| n.relation_version > 0) {
                edges.insert(n.uri.clone(), self.source.get_edges(&n.uri)?);
            }
            self.edges = Some(edges);
        }
        let mut want: BTreeMap<String, Entry<RelationRecord>> = BTreeMap::new();
        for (owner, edges) in self.edges.iter().flatten() {
            let Some(node) = self.nodes.get(owner) else {
                continue;
            };
            for r in self.projector.build_relation_records(node, edges) {
                let value = crate::relation::stored(r, node.relation_version);
                let entry = Entry {
                    owner: owner.clone(),
                    value,
                };
                want.insert(entry.value.record.id.clone(), entry);
            }
        }
        let got: BTreeMap<String, Entry<RelationRecord>> = got
            .into_iter()
            .map(|r| {
                let entry = Entry {
                    owner: r.record.from_uri.clone(),
                    value: r,
                };
                (entry.value.record.id.clone(), entry)
            })
            .collect();
        findings.source_records = want.len() as u64;
        findings.index_records = got.len() as u64;
        Ok(compare(&want, &got, |_| false, false))
    }

    /// `UPSERT_RELATION` per owner with any finding.
    fn relation_events(&self, d: &Diff) -> Vec<OutboxEventCreate> {
        distinct(&[&d.missing, &d.orphan, &d.stale])
            .into_iter()
            .map(|uri| {
                let relation_version = self.nodes.get(&uri).map_or(0, |n| n.relation_version);
                OutboxEventCreate {
                    payload: EventPayload::UpsertRelation(UpsertRelationPayload {
                        event_version: EVENT_VERSION,
                        uri,
                        relation_version,
                        mode: RelationMode::Replace,
                        trace_id: self.trace_id.clone(),
                    }),
                }
            })
            .collect()
    }
}
