//! ContextFS and RelationStore written once, over the row operations of an open transaction.
//!
//! A backend implements [`ReadTx`] (and [`WriteTx`] for write transactions) with its own SQL;
//! everything a write *means* — ancestors created as containers, versions continued past
//! tombstones, the events appended with their rows, relation owners bumped, fences checked —
//! lives here, so SQLite and PostgreSQL cannot drift apart (DESIGN.md decision 1: one data
//! model). Backends then implement the public traits with [`impl_source_traits!`], which
//! routes each method through their `write` / `read` transaction runners.

use std::collections::HashSet;

use ce_core::{
    ContextNode, CoreError, CtxUri, DeleteContextPayload, EVENT_VERSION, EventPayload, Millis,
    MoveContextPayload, RelationEdge, RelationMode, UpsertContextPayload, UpsertReason,
    UpsertRelationPayload, node::validate_relation_type,
};

use crate::derive::{self as derive, DeriveUsage, DirtyKey, Rules};
use crate::error::{Result, StoreError};
use crate::jobs::machine;
use crate::jobs::rows::JobTx;
use crate::model::{
    LinkRequest, NodeStat, PutRequest, Relations, UriVersion, WriteFence, WriteOp, WriteOutcome,
};
use crate::plan::{self, check_expected, container, next_version, plan_put, trace_id_or_new};

/// Which end of an edge a query selects on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EdgeEnd {
    /// Edges owned by the node (`from_uri`).
    From,
    /// Edges pointing at the node (`to_uri`).
    To,
}

impl EdgeEnd {
    /// The `relations` column this end selects on.
    pub(crate) fn column(self) -> &'static str {
        match self {
            EdgeEnd::From => "from_uri",
            EdgeEnd::To => "to_uri",
        }
    }
}

/// The path of `fence` and its ancestors: a newer fence on any of them (or on a descendant)
/// supersedes it.
pub(crate) fn fence_lineage(fence: &WriteFence) -> Vec<String> {
    let mut paths: Vec<String> = fence
        .path
        .ancestors()
        .iter()
        .map(|a| a.as_str().to_owned())
        .collect();
    paths.push(fence.path.as_str().to_owned());
    paths
}

/// The dirty keys a write transaction has bumped and has not marked derived or deleted
/// since. Bumping such a key again is skipped: a coalesce version is a fence compared for
/// equality only ("the inputs changed since the derivation that read this version"), and from
/// outside the transaction one increment reads as any number would. It keeps a write that
/// touches one folder's children — an import of 10,000 files into one folder, each new child
/// dirtying its parent — at one update of the folder's key: on PostgreSQL every update of a
/// row leaves a version that the next update of it in the same transaction walks past, so
/// those updates were quadratic (9.8 s of a 22 s import of 10,000 files).
///
/// It also counts the nodes this transaction derived at write time
/// ([`derive::derive_at_write`]), added to the day's derive usage once, at the end
/// ([`count_derived_at_write`]), for the same reason.
#[derive(Debug, Default)]
pub(crate) struct DirtyMemo {
    /// The keys bumped (and not marked derived or deleted since).
    bumped: HashSet<CtxUri>,
    /// Nodes derived at write time, not yet added to the day's usage.
    derived_at_write: u64,
}

impl DirtyMemo {
    /// Whether this transaction bumped `uri`'s key (and has not marked it derived or deleted
    /// it since).
    pub(crate) fn bumped(&self, uri: &CtxUri) -> bool {
        self.bumped.contains(uri)
    }
}

/// Reads inside one transaction (one snapshot).
pub(crate) trait ReadTx {
    /// The live node at `uri`.
    fn node(&mut self, uri: &CtxUri) -> Result<Option<ContextNode>>;
    /// A hint: the write being applied will call [`ReadTx::node_or_tombstone`] for `uris`,
    /// in this order. A backend where a statement costs a round trip reads them ahead, a
    /// window at a time; the default ignores it.
    fn read_ahead(&mut self, _uris: Vec<CtxUri>) {}
    /// The live node at `uri`, or else the version of its tombstone. A backend where a
    /// statement costs a round trip reads both in one.
    fn node_or_tombstone(&mut self, uri: &CtxUri) -> Result<(Option<ContextNode>, Option<u64>)> {
        match self.node(uri)? {
            Some(n) => Ok((Some(n), None)),
            None => Ok((None, self.tombstone(uri)?)),
        }
    }
    /// The last version of a removed node at `uri`.
    fn tombstone(&mut self, uri: &CtxUri) -> Result<Option<u64>>;
    /// The live version at `uri` without reading the node.
    fn live_version(&mut self, uri: &CtxUri) -> Result<Option<u64>>;
    /// How many nodes have `uri` as parent.
    fn count_children(&mut self, uri: &CtxUri) -> Result<u64>;
    /// The live nodes among `uris`, in their order. A backend where a statement costs a
    /// round trip reads them all in one.
    fn nodes(&mut self, uris: &[CtxUri]) -> Result<Vec<ContextNode>> {
        let mut out = Vec::with_capacity(uris.len());
        for u in uris {
            out.extend(self.node(u)?);
        }
        Ok(out)
    }
    /// Per URI of `uris`: live, deleted or unknown. A backend where a statement costs a
    /// round trip reads them all in one.
    fn uri_versions(&mut self, uris: &[CtxUri]) -> Result<Vec<UriVersion>> {
        uris.iter()
            .map(|u| {
                Ok(match self.live_version(u)? {
                    Some(v) => UriVersion::Live(v),
                    None => self
                        .tombstone(u)?
                        .map_or(UriVersion::Unknown, UriVersion::Deleted),
                })
            })
            .collect()
    }
    /// [`ReadTx::count_children`] of each URI of `uris`, in their order.
    fn children_counts(&mut self, uris: &[CtxUri]) -> Result<Vec<u64>> {
        uris.iter().map(|u| self.count_children(u)).collect()
    }
    /// The nodes whose parent is `uri`, by URI.
    fn children(&mut self, uri: &CtxUri) -> Result<Vec<ContextNode>>;
    /// What a folder's derivation reads of each child of `uri`, by URI: the
    /// [`crate::derive::DeriveChild`] of each, its L1 and L2 cut to their first
    /// `fallback_chars` characters.
    fn derive_children(
        &mut self,
        uri: &CtxUri,
        fallback_chars: usize,
    ) -> Result<Vec<crate::derive::DeriveChild>>;
    /// Whether a child of `uri` has its L0 pending (`provenance.abstract` of origin
    /// `pending`): one probe of the partial index of such children, whatever the number of
    /// children.
    fn child_pending(&mut self, uri: &CtxUri) -> Result<bool>;
    /// `uri` and its descendants, by URI.
    fn subtree_nodes(&mut self, uri: &CtxUri) -> Result<Vec<ContextNode>>;
    /// The URIs of [`ReadTx::subtree_nodes`], without reading the nodes.
    fn subtree_uris(&mut self, uri: &CtxUri) -> Result<Vec<CtxUri>>;
    /// The URIs of [`ReadTx::subtree_nodes`] with their stamps, without reading the nodes.
    fn subtree_stamps(&mut self, uri: &CtxUri) -> Result<Vec<(CtxUri, crate::model::NodeStamp)>>;
    /// The stamp of the node at `uri`, `None` without one.
    fn stamp(&mut self, uri: &CtxUri) -> Result<Option<crate::model::NodeStamp>>;
    /// Edges from (`EdgeEnd::From`) or into (`EdgeEnd::To`) `uri`, ordered by
    /// (from, to, type).
    fn edges(&mut self, end: EdgeEnd, uri: &CtxUri) -> Result<Vec<RelationEdge>>;
    /// The dirty key of `uri` (open or not).
    fn dirty(&mut self, uri: &CtxUri) -> Result<Option<DirtyKey>>;
    /// The open dirty keys within the subtree `uri`, by URI.
    fn dirty_within(&mut self, uri: &CtxUri) -> Result<Vec<DirtyKey>>;
    /// How many keys are open.
    fn count_dirty(&mut self) -> Result<u64>;
    /// The derive usage of `day` (`YYYY-MM-DD`).
    fn derive_usage(&mut self, day: &str) -> Result<DeriveUsage>;
}

/// Row writes inside one source write transaction, which may enqueue and complete jobs too
/// ([`WriteOp::Enqueue`], [`WriteOp::CompleteJob`]).
pub(crate) trait WriteTx: ReadTx + JobTx + crate::kb::rows::KbTx {
    /// Inserts or overwrites a node row and clears its tombstone.
    fn insert_node(&mut self, n: &ContextNode) -> Result<()>;
    /// Tombstones and deletes `uri` and its descendants; returns how many were deleted.
    fn remove_subtree(&mut self, uri: &CtxUri, now: Millis) -> Result<u64>;
    /// Distinct owners (`from_uri`) outside the subtree `uri` of edges into it, sorted.
    fn owners_into(&mut self, uri: &CtxUri) -> Result<Vec<String>>;
    /// Deletes every edge with an end inside the subtree `uri`.
    fn delete_edges_within(&mut self, uri: &CtxUri) -> Result<()>;
    /// Rewrites edge ends inside the subtree `from` to the same place under `to`.
    fn rebase_edges(&mut self, from: &CtxUri, to: &CtxUri, now: Millis) -> Result<()>;
    /// Increments `owner`'s relation version; the new one, or `None` without such a node.
    fn bump_relation_version(&mut self, owner: &str) -> Result<Option<u64>>;
    /// Weight and reason of one edge.
    fn edge(
        &mut self,
        from: &CtxUri,
        to: &CtxUri,
        relation_type: &str,
    ) -> Result<Option<(f64, String)>>;
    /// Inserts or updates the edge `from -> e.to` of `e.relation_type`.
    fn upsert_edge(&mut self, from: &CtxUri, e: &LinkRequest, now: Millis) -> Result<()>;
    /// Deletes one edge; returns how many rows went (0 or 1).
    fn delete_edge(&mut self, from: &CtxUri, to: &CtxUri, relation_type: &str) -> Result<u64>;
    /// Appends events with a pending delivery per configured consumer; their event ids.
    fn append_events(&mut self, payloads: Vec<EventPayload>, now: Millis) -> Result<Vec<String>>;
    /// The newest fence above `fence.token` on its path, an ancestor or a descendant.
    fn newer_fence(&mut self, fence: &WriteFence) -> Result<Option<(String, u64)>>;
    /// Records `fence.token` for its path (keeping the larger token).
    fn record_fence(&mut self, fence: &WriteFence, now: Millis) -> Result<()>;
    /// Records a hold through the last journal sequence, superseding one on the same path.
    fn insert_hold(&mut self, id: &str, at: &CtxUri, lease: &str, now: Millis) -> Result<()>;
    /// Increments `uri`'s coalesce version (creating its key at 1); use
    /// [`WriteTx::bump_dirty`].
    fn bump_dirty_row(&mut self, uri: &CtxUri, now: Millis) -> Result<()>;
    /// Records that a write-back read `uri` at coalesce version `version`; use
    /// [`WriteTx::mark_derived`].
    fn mark_derived_row(&mut self, uri: &CtxUri, version: u64) -> Result<()>;
    /// Deletes the dirty keys within the subtree `uri`; use [`WriteTx::delete_dirty_within`].
    fn delete_dirty_rows_within(&mut self, uri: &CtxUri) -> Result<()>;
    /// The dirty keys this transaction bumped (see [`DirtyMemo`]).
    fn dirty_memo(&mut self) -> &mut DirtyMemo;
    /// Marks `uri`'s inputs changed: increments its coalesce version (creating its key at
    /// 1), unless this transaction already did and has not marked it derived or deleted it
    /// since ([`DirtyMemo`]).
    fn bump_dirty(&mut self, uri: &CtxUri, now: Millis) -> Result<()> {
        if self.dirty_memo().bumped.insert(uri.clone()) {
            self.bump_dirty_row(uri, now)?;
        }
        Ok(())
    }
    /// Counts a node derived at write time (see [`DirtyMemo`]).
    fn derived_at_write(&mut self) {
        self.dirty_memo().derived_at_write += 1;
    }
    /// Records that a write-back read `uri` at coalesce version `version`.
    fn mark_derived(&mut self, uri: &CtxUri, version: u64) -> Result<()> {
        self.dirty_memo().bumped.remove(uri);
        self.mark_derived_row(uri, version)
    }
    /// Deletes the dirty keys within the subtree `uri`.
    fn delete_dirty_within(&mut self, uri: &CtxUri) -> Result<()> {
        self.dirty_memo().bumped.retain(|u| !u.is_within(uri));
        self.delete_dirty_rows_within(uri)
    }
    /// Adds `usage` to the day's totals.
    fn add_derive_usage(&mut self, day: &str, usage: DeriveUsage) -> Result<()>;
}

/// The `UPSERT_CONTEXT` event of a written node.
fn upsert_event(node: &ContextNode, reason: UpsertReason) -> EventPayload {
    EventPayload::UpsertContext(UpsertContextPayload {
        event_version: EVENT_VERSION,
        uri: node.uri.clone(),
        expected_node_version: node.version,
        reason,
        trace_id: node.trace_id.clone(),
    })
}

/// The `UPSERT_RELATION` event for `owner` at relation version `rv`.
fn relation_event(owner: CtxUri, rv: u64, trace_id: &str) -> EventPayload {
    EventPayload::UpsertRelation(UpsertRelationPayload {
        event_version: EVENT_VERSION,
        uri: owner,
        relation_version: rv,
        mode: RelationMode::Replace,
        trace_id: trace_id.to_owned(),
    })
}

/// Parses a stored edge end.
pub(crate) fn edge_uri(s: &str) -> Result<CtxUri> {
    CtxUri::parse_stored(s).map_err(|e| StoreError::Corrupt(format!("relation uri {s:?}: {e}")))
}

fn unchanged(uri: &CtxUri, version: u64, trace_id: String) -> WriteOutcome {
    WriteOutcome {
        uri: uri.clone(),
        version,
        changed: false,
        event_ids: Vec::new(),
        nodes_affected: 0,
        trace_id,
        layers_removed: Vec::new(),
        job_id: None,
    }
}

/// Increments the relation version of each owner: `(owner, new version)`. The node's
/// `updated_at` and `version` describe its content and stay as they are.
fn bump_relation_versions(tx: &mut dyn WriteTx, owners: &[String]) -> Result<Vec<(CtxUri, u64)>> {
    let mut out = Vec::with_capacity(owners.len());
    for o in owners {
        if let Some(rv) = tx.bump_relation_version(o)? {
            let uri = CtxUri::parse_stored(o)
                .map_err(|e| StoreError::Corrupt(format!("relation owner {o:?}: {e}")))?;
            out.push((uri, rv));
        }
    }
    Ok(out)
}

/// Creates the missing ancestors of `uri` as containers (like `mkdir -p`), returning their
/// events. Invariant TR1: every node's parent is a node or the root.
fn create_ancestors(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    uri: &CtxUri,
    now: Millis,
    trace_id: &str,
) -> Result<Vec<EventPayload>> {
    // By TR1 a live parent has every ancestor live: one lookup settles the common case (a
    // new node in an existing folder), whatever the depth.
    match uri.parent() {
        Some(parent) if parent.is_root() => return Ok(Vec::new()),
        Some(parent) if tx.live_version(&parent)?.is_some() => return Ok(Vec::new()),
        _ => {}
    }
    let mut events = Vec::new();
    let ancestors = uri.ancestors();
    let versions = tx.uri_versions(&ancestors)?;
    for (anc, v) in ancestors.into_iter().zip(versions) {
        let tomb = match v {
            UriVersion::Live(_) => continue,
            UriVersion::Deleted(t) => Some(t),
            UriVersion::Unknown => None,
        };
        let mut c = container(&anc, next_version(None, tomb), now, trace_id);
        derive::settle_origins(&mut c, rules);
        tx.insert_node(&c)?;
        derive::dirty_after_put(tx, rules, None, &c, false, now)?;
        events.push(upsert_event(&c, UpsertReason::Create));
    }
    Ok(events)
}

/// `put` inside an open transaction.
pub(crate) fn put(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    uri: &CtxUri,
    req: PutRequest,
    now: Millis,
) -> Result<WriteOutcome> {
    let trace_id = trace_id_or_new(req.trace_id.clone());
    let (existing, tomb) = tx.node_or_tombstone(uri)?;
    let Some(mut planned) = plan_put(uri, existing.as_ref(), tomb, req, now, rules, &trace_id)?
    else {
        return Ok(unchanged(uri, existing.map_or(0, |n| n.version), trace_id));
    };
    let derived = derive::derive_at_write(tx, rules, existing.as_ref(), &mut planned.node, now)?;
    let mut events = if existing.is_none() {
        create_ancestors(tx, rules, uri, now, &trace_id)?
    } else {
        Vec::new()
    };
    tx.insert_node(&planned.node)?;
    derive::dirty_after_put(tx, rules, existing.as_ref(), &planned.node, derived, now)?;
    events.push(upsert_event(&planned.node, planned.reason));
    let nodes_affected = events.len() as u64;
    let event_ids = tx.append_events(events, now)?;
    Ok(WriteOutcome {
        uri: uri.clone(),
        version: planned.node.version,
        changed: true,
        event_ids,
        nodes_affected,
        trace_id,
        layers_removed: planned.layers_removed,
        job_id: None,
    })
}

/// Adds the nodes this transaction derived at write time to the day's derive usage, in one
/// row update.
pub(crate) fn count_derived_at_write(tx: &mut dyn WriteTx, now: Millis) -> Result<()> {
    let derivations = std::mem::take(&mut tx.dirty_memo().derived_at_write);
    if derivations > 0 {
        let usage = DeriveUsage {
            derivations,
            ..DeriveUsage::default()
        };
        tx.add_derive_usage(&derive::day_of(now), usage)?;
    }
    Ok(())
}

/// `rm` inside an open transaction.
pub(crate) fn rm(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    uri: &CtxUri,
    recursive: bool,
    expect_version: Option<u64>,
    trace_id: Option<String>,
    now: Millis,
) -> Result<WriteOutcome> {
    if uri.is_root() {
        return Err(StoreError::RootNotWritable);
    }
    let trace_id = trace_id_or_new(trace_id);
    let node = tx
        .node(uri)?
        .ok_or_else(|| StoreError::NodeNotFound { uri: uri.clone() })?;
    check_expected(uri, expect_version, Some(node.version))?;
    let children = tx.count_children(uri)?;
    if children > 0 && !recursive {
        return Err(StoreError::NotEmpty {
            uri: uri.clone(),
            children,
        });
    }
    let removed = tx.remove_subtree(uri, now)?;
    tx.delete_dirty_within(uri)?;
    derive::dirty_parent(tx, rules, uri, now)?;
    // Edges into the removed subtree from outside change their owners' edge sets.
    let owners = tx.owners_into(uri)?;
    tx.delete_edges_within(uri)?;
    let mut events = vec![EventPayload::DeleteContext(DeleteContextPayload {
        event_version: EVENT_VERSION,
        uri: uri.clone(),
        expected_deleted_version: node.version,
        recursive,
        trace_id: trace_id.clone(),
    })];
    for (owner, rv) in bump_relation_versions(tx, &owners)? {
        events.push(relation_event(owner, rv, &trace_id));
    }
    let event_ids = tx.append_events(events, now)?;
    Ok(WriteOutcome {
        uri: uri.clone(),
        version: node.version,
        changed: true,
        event_ids,
        nodes_affected: removed,
        trace_id,
        layers_removed: Vec::new(),
        job_id: None,
    })
}

/// `mv` inside an open transaction.
pub(crate) fn mv(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    from: &CtxUri,
    to: &CtxUri,
    trace_id: Option<String>,
    now: Millis,
) -> Result<WriteOutcome> {
    plan::check_move(from, to)?;
    let trace_id = trace_id_or_new(trace_id);
    let root = tx
        .node(from)?
        .ok_or_else(|| StoreError::NodeNotFound { uri: from.clone() })?;
    if from == to {
        return Ok(unchanged(to, root.version, trace_id));
    }
    if tx.node(to)?.is_some() {
        return Err(StoreError::AlreadyExists { uri: to.clone() });
    }
    let mut events = create_ancestors(tx, rules, to, now, &trace_id)?;
    let nodes = tx.subtree_nodes(from)?;
    let mut moved = Vec::with_capacity(nodes.len());
    for n in &nodes {
        let dest = n.uri.rebase(from, to)?;
        let tomb = tx.tombstone(&dest)?;
        let mut m = plan::moved(n, dest, tomb, now, &trace_id);
        derive::settle_origins(&mut m, rules);
        moved.push(m);
    }
    tx.remove_subtree(from, now)?;
    tx.delete_dirty_within(from)?;
    for n in &moved {
        tx.insert_node(n)?;
        derive::dirty_node(tx, rules, n, now)?;
    }
    // A child left one folder and joined another.
    derive::dirty_parent(tx, rules, from, now)?;
    derive::dirty_parent(tx, rules, to, now)?;
    // Owners outside the subtree whose edges point into it see their edge set change.
    let owners = tx.owners_into(from)?;
    tx.rebase_edges(from, to, now)?;
    events.push(EventPayload::MoveContext(MoveContextPayload {
        event_version: EVENT_VERSION,
        from_uri: from.clone(),
        to_uri: to.clone(),
        recursive: true,
        old_parent_uri: from.parent().unwrap_or_else(CtxUri::root),
        new_parent_uri: to.parent().unwrap_or_else(CtxUri::root),
        trace_id: trace_id.clone(),
    }));
    for (owner, rv) in bump_relation_versions(tx, &owners)? {
        events.push(relation_event(owner, rv, &trace_id));
    }
    let version = moved.first().map_or(0, |n| n.version);
    let event_ids = tx.append_events(events, now)?;
    Ok(WriteOutcome {
        uri: to.clone(),
        version,
        changed: true,
        event_ids,
        nodes_affected: moved.len() as u64,
        trace_id,
        layers_removed: Vec::new(),
        job_id: None,
    })
}

/// The `DELETE_CONTEXT` for a URI the source does not hold (`ContextFs::purge_missing`).
pub(crate) fn purge_missing(
    tx: &mut dyn WriteTx,
    uri: &CtxUri,
    trace_id: String,
    now: Millis,
) -> Result<Option<String>> {
    if tx.node(uri)?.is_some() {
        return Ok(None);
    }
    let event = EventPayload::DeleteContext(DeleteContextPayload {
        event_version: EVENT_VERSION,
        uri: uri.clone(),
        expected_deleted_version: tx.tombstone(uri)?.unwrap_or(0),
        recursive: true,
        trace_id,
    });
    Ok(tx.append_events(vec![event], now)?.into_iter().next())
}

/// The fencing check (docs/store.md "Fencing"): refuses a write under `fence` when a newer
/// token was recorded for its path, an ancestor or a descendant; records the token.
pub(crate) fn check_fence(tx: &mut dyn WriteTx, fence: &WriteFence, now: Millis) -> Result<()> {
    if let Some((newest_path, newest)) = tx.newer_fence(fence)? {
        return Err(StoreError::LeaseLost {
            path: fence.path.clone(),
            token: fence.token,
            newest_path,
            newest,
        });
    }
    tx.record_fence(fence, now)
}

/// The fenced batch of `ContextFs::apply_fenced` inside an open transaction.
pub(crate) fn apply_fenced(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    fences: &[WriteFence],
    ops: Vec<WriteOp>,
    now: Millis,
) -> Result<Vec<WriteOutcome>> {
    for f in fences {
        check_fence(tx, f, now)?;
    }
    let puts: Vec<CtxUri> = ops.iter().filter_map(WriteOp::put_uri).cloned().collect();
    if puts.len() > 1 {
        tx.read_ahead(puts);
    }
    let mut appended = false;
    ops.into_iter()
        .map(|op| {
            let out = apply_op(tx, rules, op, now, appended)?;
            appended |= !out.event_ids.is_empty();
            Ok(out)
        })
        .collect()
}

/// One op of a batch; `appended`: whether an earlier op of the batch appended events.
fn apply_op(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    op: WriteOp,
    now: Millis,
    appended: bool,
) -> Result<WriteOutcome> {
    match op {
        WriteOp::Put { uri, req } => put(tx, rules, &uri, req, now),
        WriteOp::SetRelations {
            from,
            edges,
            trace_id,
        } => set_relations(tx, &from, edges, trace_id, now),
        WriteOp::Rm {
            uri,
            recursive,
            expect_version,
            trace_id,
        } => rm(tx, rules, &uri, recursive, expect_version, trace_id, now),
        WriteOp::Mv { from, to, trace_id } => mv(tx, rules, &from, &to, trace_id, now),
        WriteOp::Hold {
            id,
            at,
            lease,
            only_with_events,
        } => {
            let record = appended || !only_with_events;
            if record {
                tx.insert_hold(&id, &at, &lease, now)?;
            }
            Ok(WriteOutcome {
                uri: at,
                version: 0,
                changed: record,
                event_ids: Vec::new(),
                nodes_affected: 0,
                trace_id: id,
                layers_removed: Vec::new(),
                job_id: None,
            })
        }
        WriteOp::Enqueue(spec) => {
            let e = machine::enqueue(tx, spec, now)?;
            Ok(job_outcome(e.job.id, e.created))
        }
        WriteOp::CompleteJob { claim, result } => {
            let (job, changed) = machine::complete(tx, &claim, result, now)?;
            Ok(job_outcome(job.id, changed))
        }
        WriteOp::Kb(op) => {
            let changed = crate::kb::logic::apply(tx, op, now)?;
            Ok(WriteOutcome {
                changed,
                job_id: None,
                ..job_outcome(String::new(), changed)
            })
        }
    }
}

/// The outcome of a job op of a batch: no node, no event.
fn job_outcome(job_id: String, changed: bool) -> WriteOutcome {
    WriteOutcome {
        uri: CtxUri::root(),
        version: 0,
        changed,
        event_ids: Vec::new(),
        nodes_affected: 0,
        trace_id: String::new(),
        layers_removed: Vec::new(),
        job_id: Some(job_id),
    }
}

/// Checks a link's type, weight and reason.
pub(crate) fn validate_link(req: &LinkRequest) -> Result<()> {
    validate_relation_type(&req.relation_type)?;
    if !req.weight.is_finite() {
        return Err(CoreError::InvalidField {
            field: "weight",
            reason: format!("{} is not a finite number", req.weight),
        }
        .into());
    }
    if req.reason.len() > 4096 || req.reason.chars().any(|c| c.is_control() && c != '\n') {
        return Err(CoreError::InvalidField {
            field: "reason",
            reason: "must be at most 4096 bytes without control characters".into(),
        }
        .into());
    }
    Ok(())
}

fn require_node(tx: &mut dyn WriteTx, uri: &CtxUri) -> Result<()> {
    match tx.node(uri)? {
        Some(_) => Ok(()),
        None => Err(StoreError::NodeNotFound { uri: uri.clone() }),
    }
}

/// Runs an edge change of `from`; when `f` reports a change, bumps the owner's relation
/// version and appends its `UPSERT_RELATION`.
fn relation_write(
    tx: &mut dyn WriteTx,
    from: &CtxUri,
    trace_id: String,
    now: Millis,
    f: impl FnOnce(&mut dyn WriteTx) -> Result<bool>,
) -> Result<WriteOutcome> {
    let node = tx
        .node(from)?
        .ok_or_else(|| StoreError::NodeNotFound { uri: from.clone() })?;
    if !f(tx)? {
        return Ok(unchanged(from, node.relation_version, trace_id));
    }
    let bumped = bump_relation_versions(tx, &[from.to_string()])?;
    let rv = bumped.first().map_or(node.relation_version + 1, |b| b.1);
    let events = vec![relation_event(from.clone(), rv, &trace_id)];
    let event_ids = tx.append_events(events, now)?;
    Ok(WriteOutcome {
        uri: from.clone(),
        version: rv,
        changed: true,
        event_ids,
        nodes_affected: 1,
        trace_id,
        layers_removed: Vec::new(),
        job_id: None,
    })
}

/// Replaces the outgoing edges of `from` (import's `.relations.json`).
pub(crate) fn set_relations(
    tx: &mut dyn WriteTx,
    from: &CtxUri,
    desired: Vec<LinkRequest>,
    trace_id: Option<String>,
    now: Millis,
) -> Result<WriteOutcome> {
    for e in &desired {
        validate_link(e)?;
    }
    relation_write(tx, from, trace_id_or_new(trace_id), now, |tx| {
        let mut want = std::collections::BTreeMap::new();
        for e in desired {
            require_node(tx, &e.to)?;
            want.insert((e.to.to_string(), e.relation_type.clone()), e);
        }
        let have = tx.edges(EdgeEnd::From, from)?;
        let mut changed = false;
        for h in &have {
            let key = (h.to_uri.to_string(), h.relation_type.clone());
            match want.get(&key) {
                Some(w) if w.weight == h.weight && w.reason == h.reason => {
                    want.remove(&key);
                }
                Some(_) => {}
                None => {
                    tx.delete_edge(from, &h.to_uri, &h.relation_type)?;
                    changed = true;
                }
            }
        }
        for e in want.values() {
            tx.upsert_edge(from, e, now)?;
            changed = true;
        }
        Ok(changed)
    })
}

/// `link` inside an open transaction (the request was validated).
pub(crate) fn link(tx: &mut dyn WriteTx, req: &LinkRequest, now: Millis) -> Result<WriteOutcome> {
    let trace_id = trace_id_or_new(req.trace_id.clone());
    relation_write(tx, &req.from, trace_id, now, |tx| {
        require_node(tx, &req.to)?;
        let existing = tx.edge(&req.from, &req.to, &req.relation_type)?;
        if existing.is_some_and(|(w, r)| w == req.weight && r == req.reason) {
            return Ok(false);
        }
        tx.upsert_edge(&req.from, req, now)?;
        Ok(true)
    })
}

/// `unlink` inside an open transaction.
pub(crate) fn unlink(
    tx: &mut dyn WriteTx,
    from: &CtxUri,
    to: &CtxUri,
    relation_type: &str,
    trace_id: Option<String>,
    now: Millis,
) -> Result<WriteOutcome> {
    relation_write(tx, from, trace_id_or_new(trace_id), now, |tx| {
        if tx.delete_edge(from, to, relation_type)? == 0 {
            return Err(StoreError::RelationNotFound {
                from: from.clone(),
                to: to.clone(),
                relation_type: relation_type.to_owned(),
            });
        }
        Ok(true)
    })
}

/// What `stat` reports of a node.
pub(crate) fn stat_of(tx: &mut dyn ReadTx, n: ContextNode) -> Result<NodeStat> {
    let children = tx.count_children(&n.uri)?;
    let l = &n.layers;
    Ok(NodeStat {
        layer_bytes: [
            l.abstract_text.len() as u64,
            l.overview.len() as u64,
            l.content.len() as u64,
        ],
        children,
        kind: ce_core::NodeKind::of(&n.uri, children),
        uri: n.uri,
        parent_uri: n.parent_uri,
        context_type: n.context_type,
        category: n.category,
        owner_space: n.owner_space,
        version: n.version,
        content_hash: n.content_hash,
        relation_version: n.relation_version,
        meta: n.meta,
        created_at_ms: n.created_at_ms,
        updated_at_ms: n.updated_at_ms,
        provenance: n.provenance,
    })
}

/// `stat`.
pub(crate) fn stat(tx: &mut dyn ReadTx, uri: &CtxUri) -> Result<NodeStat> {
    let n = tx
        .node(uri)?
        .ok_or_else(|| StoreError::NodeNotFound { uri: uri.clone() })?;
    stat_of(tx, n)
}

/// `ls`.
pub(crate) fn ls(tx: &mut dyn ReadTx, uri: &CtxUri) -> Result<Vec<NodeStat>> {
    if !uri.is_root() && tx.node(uri)?.is_none() {
        return Err(StoreError::NodeNotFound { uri: uri.clone() });
    }
    let nodes = tx.children(uri)?;
    nodes.into_iter().map(|n| stat_of(tx, n)).collect()
}

/// `tree`.
pub(crate) fn tree(tx: &mut dyn ReadTx, uri: &CtxUri, depth: Option<u32>) -> Result<Vec<NodeStat>> {
    let nodes = tx.subtree_nodes(uri)?;
    if nodes.is_empty() && !uri.is_root() {
        return Err(StoreError::NodeNotFound { uri: uri.clone() });
    }
    let base = uri.depth();
    nodes
        .into_iter()
        .filter(|n| depth.is_none_or(|d| n.uri.depth() - base <= d as usize))
        .map(|n| stat_of(tx, n))
        .collect()
}

/// `relations`.
pub(crate) fn relations(tx: &mut dyn ReadTx, uri: &CtxUri) -> Result<Relations> {
    if tx.node(uri)?.is_none() {
        return Err(StoreError::NodeNotFound { uri: uri.clone() });
    }
    Ok(Relations {
        outgoing: tx.edges(EdgeEnd::From, uri)?,
        incoming: tx.edges(EdgeEnd::To, uri)?,
    })
}

/// Implements `ContextFs` and `RelationStore` for a backend type that has
/// `fn write_source<T>(&self, f: impl FnOnce(&mut dyn WriteTx, Millis) -> Result<T>) -> Result<T>`,
/// `fn read_source<T>(&self, f: impl FnOnce(&mut dyn ReadTx) -> Result<T>) -> Result<T>` and a
/// `config: Config` field.
macro_rules! impl_source_traits {
    ($store:ty) => {
        impl $store {
            /// Derives small leaves in their write transaction from now on with `deriver`
            /// (docs/derive.md, "Derived at write time"; `None` changes nothing); the first
            /// deriver set stays. Writes derive nothing at write time until one is set, nor
            /// when the configuration derives no type.
            pub fn set_leaf_deriver_opt(
                &self,
                deriver: Option<std::sync::Arc<dyn $crate::derive::LeafDeriver>>,
            ) {
                if let Some(d) = deriver {
                    let _ = self.leaf_deriver.set(d);
                }
            }
        }

        impl $crate::model::ContextFs for $store {
            fn put(
                &self,
                uri: &ce_core::CtxUri,
                req: $crate::model::PutRequest,
            ) -> $crate::Result<$crate::model::WriteOutcome> {
                let rules = $crate::derive::Rules::of(&self.config, self.leaf_deriver.get());
                self.write_source(|tx, now| {
                    let out = $crate::txn::put(tx, &rules, uri, req, now)?;
                    $crate::txn::count_derived_at_write(tx, now)?;
                    Ok(out)
                })
            }

            fn apply_fenced(
                &self,
                fences: &[$crate::model::WriteFence],
                ops: Vec<$crate::model::WriteOp>,
            ) -> $crate::Result<Vec<$crate::model::WriteOutcome>> {
                let mut rules = $crate::derive::Rules::of(&self.config, self.leaf_deriver.get());
                rules.prepare(self, &ops, self.clock.now_ms())?;
                self.write_source(|tx, now| {
                    let out = $crate::txn::apply_fenced(tx, &rules, fences, ops, now)?;
                    $crate::txn::count_derived_at_write(tx, now)?;
                    Ok(out)
                })
            }

            fn rm(
                &self,
                uri: &ce_core::CtxUri,
                recursive: bool,
                expect_version: Option<u64>,
                trace_id: Option<String>,
            ) -> $crate::Result<$crate::model::WriteOutcome> {
                let rules = $crate::derive::Rules::of(&self.config, self.leaf_deriver.get());
                let r = self.write_source(|tx, now| {
                    $crate::txn::rm(
                        tx,
                        &rules,
                        uri,
                        recursive,
                        expect_version,
                        trace_id.clone(),
                        now,
                    )
                });
                if matches!(r, Err($crate::StoreError::NodeNotFound { .. }))
                    && expect_version.is_none()
                {
                    self.purge_missing(uri, trace_id)?;
                }
                r
            }

            fn mv(
                &self,
                from: &ce_core::CtxUri,
                to: &ce_core::CtxUri,
                trace_id: Option<String>,
            ) -> $crate::Result<$crate::model::WriteOutcome> {
                let rules = $crate::derive::Rules::of(&self.config, self.leaf_deriver.get());
                self.write_source(|tx, now| $crate::txn::mv(tx, &rules, from, to, trace_id, now))
            }

            fn purge_missing(
                &self,
                uri: &ce_core::CtxUri,
                trace_id: Option<String>,
            ) -> $crate::Result<Option<String>> {
                if uri.is_root() {
                    return Err($crate::StoreError::RootNotWritable);
                }
                let trace_id = $crate::plan::trace_id_or_new(trace_id);
                self.write_source(|tx, now| $crate::txn::purge_missing(tx, uri, trace_id, now))
            }

            fn read_node(
                &self,
                uri: &ce_core::CtxUri,
            ) -> $crate::Result<Option<ce_core::ContextNode>> {
                self.read_source(|tx| $crate::txn::ReadTx::node(tx, uri))
            }

            fn read_nodes(
                &self,
                uris: &[ce_core::CtxUri],
            ) -> $crate::Result<Vec<ce_core::ContextNode>> {
                self.read_source(|tx| $crate::txn::ReadTx::nodes(tx, uris))
            }

            fn kinds(&self, uris: &[ce_core::CtxUri]) -> $crate::Result<Vec<ce_core::NodeKind>> {
                let counts =
                    self.read_source(|tx| $crate::txn::ReadTx::children_counts(tx, uris))?;
                Ok(uris
                    .iter()
                    .zip(counts)
                    .map(|(u, n)| ce_core::NodeKind::of(u, n))
                    .collect())
            }

            fn versions(
                &self,
                uris: &[ce_core::CtxUri],
            ) -> $crate::Result<Vec<$crate::model::UriVersion>> {
                self.read_source(|tx| $crate::txn::ReadTx::uri_versions(tx, uris))
            }

            fn stat(&self, uri: &ce_core::CtxUri) -> $crate::Result<$crate::model::NodeStat> {
                self.read_source(|tx| $crate::txn::stat(tx, uri))
            }

            fn ls(&self, uri: &ce_core::CtxUri) -> $crate::Result<Vec<$crate::model::NodeStat>> {
                self.read_source(|tx| $crate::txn::ls(tx, uri))
            }

            fn tree(
                &self,
                uri: &ce_core::CtxUri,
                depth: Option<u32>,
            ) -> $crate::Result<Vec<$crate::model::NodeStat>> {
                self.read_source(|tx| $crate::txn::tree(tx, uri, depth))
            }

            fn read_subtree(
                &self,
                uri: &ce_core::CtxUri,
            ) -> $crate::Result<Vec<ce_core::ContextNode>> {
                self.read_source(|tx| $crate::txn::ReadTx::subtree_nodes(tx, uri))
            }

            fn subtree_uris(&self, uri: &ce_core::CtxUri) -> $crate::Result<Vec<ce_core::CtxUri>> {
                self.read_source(|tx| $crate::txn::ReadTx::subtree_uris(tx, uri))
            }

            fn subtree_stamps(
                &self,
                uri: &ce_core::CtxUri,
            ) -> $crate::Result<Vec<(ce_core::CtxUri, $crate::model::NodeStamp)>> {
                self.read_source(|tx| $crate::txn::ReadTx::subtree_stamps(tx, uri))
            }

            fn stamps(
                &self,
                uris: &[ce_core::CtxUri],
            ) -> $crate::Result<Vec<Option<$crate::model::NodeStamp>>> {
                self.read_source(|tx| {
                    uris.iter()
                        .map(|u| $crate::txn::ReadTx::stamp(tx, u))
                        .collect()
                })
            }

            fn subtrees_uris(
                &self,
                uris: &[ce_core::CtxUri],
            ) -> $crate::Result<Vec<Vec<ce_core::CtxUri>>> {
                self.read_source(|tx| {
                    uris.iter()
                        .map(|u| $crate::txn::ReadTx::subtree_uris(tx, u))
                        .collect()
                })
            }
        }

        impl $crate::derive::DeriveStore for $store {
            fn derive_snapshots(
                &self,
                uris: &[ce_core::CtxUri],
                waiting: $crate::derive::WaitingFolders,
            ) -> $crate::Result<Vec<$crate::derive::DeriveSnapshot>> {
                let cut = self.config.projector.l0_fallback_chars;
                self.read_source(|tx| $crate::derive::derive_snapshots(tx, uris, cut, waiting))
            }

            fn dirty_within(
                &self,
                uri: &ce_core::CtxUri,
            ) -> $crate::Result<Vec<$crate::derive::DirtyKey>> {
                self.read_source(|tx| $crate::txn::ReadTx::dirty_within(tx, uri))
            }

            fn write_derived(
                &self,
                writes: Vec<$crate::derive::DerivedWrite>,
            ) -> $crate::Result<Vec<$crate::derive::DerivedOutcome>> {
                let rules = $crate::derive::Rules::of(&self.config, self.leaf_deriver.get());
                self.write_source(|tx, now| {
                    writes
                        .into_iter()
                        .map(|w| $crate::derive::write_derived(tx, &rules, w, now))
                        .collect()
                })
            }

            fn count_dirty(&self) -> $crate::Result<u64> {
                self.read_source(|tx| $crate::txn::ReadTx::count_dirty(tx))
            }

            fn dirty_all(&self) -> $crate::Result<u64> {
                let rules = $crate::derive::Rules::of(&self.config, self.leaf_deriver.get());
                self.write_source(|tx, now| $crate::derive::dirty_all(tx, &rules, now))
            }

            fn derive_usage(
                &self,
                at_ms: ce_core::Millis,
            ) -> $crate::Result<$crate::derive::DeriveUsage> {
                let day = $crate::derive::day_of(at_ms);
                self.read_source(|tx| $crate::txn::ReadTx::derive_usage(tx, &day))
            }
        }

        impl $crate::model::RelationStore for $store {
            fn link(
                &self,
                req: $crate::model::LinkRequest,
            ) -> $crate::Result<$crate::model::WriteOutcome> {
                $crate::txn::validate_link(&req)?;
                self.write_source(|tx, now| $crate::txn::link(tx, &req, now))
            }

            fn unlink(
                &self,
                from: &ce_core::CtxUri,
                to: &ce_core::CtxUri,
                relation_type: &str,
                trace_id: Option<String>,
            ) -> $crate::Result<$crate::model::WriteOutcome> {
                ce_core::node::validate_relation_type(relation_type)?;
                self.write_source(|tx, now| {
                    $crate::txn::unlink(tx, from, to, relation_type, trace_id, now)
                })
            }

            fn relations(&self, uri: &ce_core::CtxUri) -> $crate::Result<$crate::model::Relations> {
                self.read_source(|tx| $crate::txn::relations(tx, uri))
            }

            fn get_edges(
                &self,
                uri: &ce_core::CtxUri,
            ) -> $crate::Result<Vec<ce_core::RelationEdge>> {
                self.read_source(|tx| {
                    $crate::txn::ReadTx::edges(tx, $crate::txn::EdgeEnd::From, uri)
                })
            }
        }
    };
}
pub(crate) use impl_source_traits;
