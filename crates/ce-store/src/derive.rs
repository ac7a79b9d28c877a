//! Derived layers in the source of truth (docs/derive.md): the provenance rules every write
//! follows, the dirty keys with their `coalesce_version`, and the fenced write-back of the
//! `derive` consumer — written once here over the row primitives of [`ReadTx`] /
//! [`WriteTx`], like the rest of `crate::txn`.
//!
//! A key is dirty while its `coalesce_version` (bumped in the commit that changed its
//! inputs) is above its `derived_version` (the version the last write-back read). The
//! inputs of a leaf are its L2; of a container, its children's names and effective L0s and
//! its own L2. So a commit bumps:
//! - the written node, when it is derived and has a layer not written by a client;
//! - its parent, when a child is created, removed or moved, or a child's effective L0 (the
//!   text its L0 record would carry) changed — including by a write-back, which is how a
//!   roll-up climbs: one level per write-back, only as far as something changed.
//!
//! A write-back ([`DerivedWrite`]) carries the coalesce and node versions its derivation
//! read; it is applied only if both are still current and never touches a layer a client
//! wrote. Otherwise it is discarded: the commit that moved either version also appended an
//! event that derives the key again.

use std::collections::HashMap;
use std::sync::Arc;

use ce_core::projector::ProjectorConfig;
use ce_core::{
    Config, ContextNode, ContextType, CtxUri, Derivation, DeriveFailure, EVENT_VERSION,
    EventPayload, IndexProjector, LayerOrigin, Layers, Level, Millis, Provenance,
    UpsertContextPayload, UpsertReason,
};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::next_version;
use crate::txn::{ReadTx, WriteTx};

/// The write rules a store applies, from its configuration.
#[derive(Debug, Clone)]
pub struct Rules {
    /// `store.max_layer_bytes`.
    pub max_layer_bytes: usize,
    /// The context types whose nodes get derived layers (empty: derivation is off).
    pub derived: Vec<ContextType>,
    /// The projector, for a node's effective L0.
    pub projector: ProjectorConfig,
    /// Derives small leaves in their write transaction ([`LeafDeriver`]; `None`: the
    /// consumer derives every node).
    pub inline: Option<Arc<dyn LeafDeriver>>,
    /// The new leaves of a batch, derived before its transaction ([`Rules::prepare`]), by
    /// content.
    pub prepared: Arc<HashMap<String, PreparedLeaf>>,
}

/// Puts in one batch from which [`Rules::prepare`] derives the new leaves on every core
/// before the transaction (fewer are derived in it, one by one).
const PREPARE_MIN_PUTS: usize = 64;

/// URIs of a batch [`Rules::prepare`] reads to tell a batch of new nodes.
const PREPARE_SAMPLE: usize = 64;

impl Rules {
    /// The rules of `config`, with `inline` deriving small leaves at write time.
    pub fn of(config: &Config, inline: Option<&Arc<dyn LeafDeriver>>) -> Self {
        let derived = config.derived_types();
        Rules {
            max_layer_bytes: config.store.max_layer_bytes,
            inline: inline.filter(|_| !derived.is_empty()).cloned(),
            derived,
            projector: config.projector,
            prepared: Arc::default(),
        }
    }

    /// Derives the leaves a batch of `ops` creates, before its write transaction and on
    /// every core ([`LeafDeriver::derive_leaves`]): a cold import of 10,000 short documents
    /// would otherwise derive them one by one inside the write lock. Only a batch of new
    /// nodes is prepared — `fs` holds none of [`PREPARE_SAMPLE`] of its URIs, spread over
    /// the batch (read here, before the transaction; reading every URI cost a re-import of
    /// an unchanged tree 10 % more, and deriving them all would cost it the whole
    /// derivation). The transaction still decides ([`derive_at_write`]); a prepared leaf it
    /// does not use costs only its derivation, a leaf not prepared is derived in it.
    pub fn prepare(
        &mut self,
        fs: &dyn crate::model::ContextFs,
        ops: &[crate::model::WriteOp],
        now: Millis,
    ) -> Result<()> {
        let Some(deriver) = &self.inline else {
            return Ok(());
        };
        let puts: Vec<(&CtxUri, &str)> = ops
            .iter()
            .filter_map(|op| match op {
                crate::model::WriteOp::Put { uri, req }
                    if req.mode != crate::model::PutMode::Append =>
                {
                    let t = req
                        .context_type
                        .unwrap_or_else(|| ce_core::PathDefaults::of(uri).context_type);
                    let content = req.content.as_deref().filter(|c| !c.is_empty())?;
                    self.derives(t).then_some((uri, content))
                }
                _ => None,
            })
            .collect();
        if puts.len() < PREPARE_MIN_PUTS {
            return Ok(());
        }
        let step = puts.len().div_ceil(PREPARE_SAMPLE);
        let sample: Vec<CtxUri> = puts
            .iter()
            .step_by(step)
            .map(|(u, _)| (*u).clone())
            .collect();
        let versions = fs.versions(&sample)?;
        if versions
            .iter()
            .any(|v| matches!(v, crate::model::UriVersion::Live(_)))
        {
            return Ok(());
        }
        let new: Vec<&str> = puts.iter().map(|(_, content)| *content).collect();
        let derived = deriver.derive_leaves(&new, now);
        self.prepared = Arc::new(
            new.into_iter()
                .zip(derived)
                .filter_map(|(c, p)| Some((c.to_owned(), p?)))
                .collect(),
        );
        Ok(())
    }

    /// Rules with a layer size limit and derivation off (tests).
    #[cfg(test)]
    pub fn limit(max_layer_bytes: usize) -> Self {
        Rules {
            max_layer_bytes,
            derived: Vec::new(),
            projector: ProjectorConfig::default(),
            inline: None,
            prepared: Arc::default(),
        }
    }

    /// Whether nodes of `t` get derived layers.
    pub fn derives(&self, t: ContextType) -> bool {
        self.derived.contains(&t)
    }

    /// The text `node`'s L0 record carries (fallbacks applied; `None` while pending).
    fn effective_l0(&self, node: &ContextNode) -> Option<String> {
        IndexProjector::new(self.projector).level_text(node, Level::L0)
    }
}

/// Sets the origins a node's L0 / L1 must have under `rules` ([`settle_layer_origins`]) and
/// the content hash of the layers that result.
pub(crate) fn settle_origins(node: &mut ContextNode, rules: &Rules) {
    settle_layer_origins(node, rules);
    node.content_hash = node.layers.content_hash();
}

/// Sets the origins a node's L0 / L1 must have under `rules`: a layer without client text
/// on a derived node is pending until derived; on a node that is not derived it has no
/// origin, and text a generator wrote is dropped (a client's text always stays). The content
/// hash is left to the caller.
pub(crate) fn settle_layer_origins(node: &mut ContextNode, rules: &Rules) {
    let derives = rules.derives(node.context_type);
    for level in [Level::L0, Level::L1] {
        let Some(origin) = node.provenance.get_mut(level) else {
            continue;
        };
        match (derives, &*origin) {
            (_, LayerOrigin::User) => {}
            (true, LayerOrigin::None) => *origin = LayerOrigin::Pending,
            (true, _) => {}
            (false, LayerOrigin::None) => {}
            (false, _) => {
                *origin = LayerOrigin::None;
                match level {
                    Level::L0 => node.layers.abstract_text.clear(),
                    _ => node.layers.overview.clear(),
                }
            }
        }
    }
}

/// One dirty key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirtyKey {
    /// The node.
    pub uri: CtxUri,
    /// Bumped by every commit that changed the node's inputs.
    pub coalesce_version: u64,
    /// The coalesce version the last write-back read.
    pub derived_version: u64,
    /// When it was last bumped.
    pub dirtied_at_ms: Millis,
}

impl DirtyKey {
    /// Whether a derivation is due.
    pub fn is_open(&self) -> bool {
        self.coalesce_version > self.derived_version
    }
}

/// What a derivation of one dirty node reads, in one snapshot.
#[derive(Debug, Clone)]
pub struct DeriveSnapshot {
    /// The dirty key (open).
    pub key: DirtyKey,
    /// The node.
    pub node: ContextNode,
    /// Its children, by URI: what a folder's derivation reads of them.
    /// Empty when the snapshot was taken with [`WaitingFolders::Skip`] and it is `waiting`.
    pub children: Vec<DeriveChild>,
    /// A child's L0 is pending, so a derivation of the node must wait for it (known before
    /// reading the children with [`WaitingFolders::Skip`]; `false` otherwise: the caller
    /// reads the pending state off `children`).
    pub waiting: bool,
}

/// What a folder's derivation reads of one child: its L0 with the projector's fallbacks
/// (`IndexProjector::layers_text`), and so its layers with the L1 and the L2 cut to
/// `projector.l0_fallback_chars` characters (at least 1: an empty layer stays the only empty
/// one) — a folder waiting for pending children is read again as each of them comes by, and
/// with whole contents 100 children of 5 KB made that 500 KB a read; nothing else of the
/// node (decoding whole nodes was a fifth of rolling up a folder of 10,000).
#[derive(Debug, Clone, PartialEq)]
pub struct DeriveChild {
    /// The child.
    pub uri: CtxUri,
    /// Its L0, and its L1 and L2 cut.
    pub layers: Layers,
    /// Where its L0 and L1 came from.
    pub provenance: Provenance,
}

/// How [`DeriveStore::derive_snapshots`] reads a folder whose derivation waits for a child
/// (a child's L0 is pending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingFolders {
    /// Its children, like any node's (a dry run estimates its derivation with them).
    Read,
    /// Not its children: the snapshot says it is `waiting`. While 10,000 imported children
    /// are derived batch by batch, each batch's write-backs dirty the folder again; reading
    /// all of them each time took a quarter of that drain.
    Skip,
}

/// What a write-back does to one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerWrite {
    /// Leave it as it is.
    Keep,
    /// The derived text (possibly empty: the input held nothing to summarise, so the
    /// projector's fallback applies) and how it was made.
    Derived {
        /// The text.
        text: String,
        /// Its derivation.
        derivation: Derivation,
    },
    /// The generator refused the input for good: no text, the fallback applies.
    Failed(DeriveFailure),
}

/// The layers of a leaf derived in its write transaction, or [`LayerWrite::Keep`] where they
/// are current already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafLayers {
    /// L0.
    pub abstract_layer: LayerWrite,
    /// L1.
    pub overview_layer: LayerWrite,
}

/// Derives a small leaf's L0 / L1 in the transaction that writes it (docs/derive.md,
/// "Derived at write time"): the same generator, input hash and provenance as the
/// consumer's write-back, without the second node version and the second round of index
/// writes a write-back makes. Only a generator that is cheap, local and deterministic
/// belongs here (the `extractive` one); the store calls it inside its write lock.
pub trait LeafDeriver: Send + Sync + std::fmt::Debug {
    /// The layers of leaf `node` (its type is derived, and it has a layer no client wrote),
    /// or `None` to leave the node to the consumer (its content is too long, or the
    /// generator failed on it).
    fn derive_leaf(&self, node: &ContextNode, now: Millis) -> Option<LeafLayers>;
    /// The derivation of each of `contents` as a new leaf's ([`Self::derive_leaf`] of a
    /// node without layers), computed before a batch's transaction, on every core.
    fn derive_leaves(&self, contents: &[&str], now: Millis) -> Vec<Option<PreparedLeaf>>;
}

/// A leaf's derivation computed before its write transaction ([`Rules::prepare`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedLeaf {
    /// The input hash of the content it was derived from.
    pub input_hash: String,
    /// The derived layers.
    pub layers: LeafLayers,
}

/// Tokens and derivations of a UTC day (or to add to it).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct DeriveUsage {
    /// Model tokens read.
    pub tokens_in: u64,
    /// Model tokens written.
    pub tokens_out: u64,
    /// Write-backs applied, and leaves derived at write time.
    pub derivations: u64,
    /// Write-backs discarded because newer inputs had been committed.
    pub discarded: u64,
}

impl DeriveUsage {
    /// Model tokens in and out.
    pub fn tokens(&self) -> u64 {
        self.tokens_in + self.tokens_out
    }
}

/// The `derive` consumer's write-back of one node.
#[derive(Debug, Clone)]
pub struct DerivedWrite {
    /// The node.
    pub uri: CtxUri,
    /// The node version the derivation read.
    pub node_version: u64,
    /// The coalesce version the derivation read.
    pub coalesce_version: u64,
    /// L0.
    pub abstract_layer: LayerWrite,
    /// L1.
    pub overview_layer: LayerWrite,
    /// Model tokens spent on it (counted even when the write-back is discarded).
    pub tokens_in: u64,
    /// Model tokens written.
    pub tokens_out: u64,
}

/// What a write-back did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DerivedOutcome {
    /// The node was rewritten at `version` with its derived layers.
    Written {
        /// The new node version.
        version: u64,
    },
    /// The derivation gave what the node holds already: the key is clean, nothing written.
    Unchanged,
    /// Newer inputs were committed (or the node went): nothing written.
    Discarded {
        /// Which fence failed.
        reason: String,
    },
}

/// Derived layers in the store: the `derive` consumer's reads and write-backs.
pub trait DeriveStore: Send + Sync {
    /// The open dirty key of each of `uris` that has one, with the node and its children
    /// (see [`WaitingFolders`]), each read in one snapshot.
    fn derive_snapshots(
        &self,
        uris: &[CtxUri],
        waiting: WaitingFolders,
    ) -> Result<Vec<DeriveSnapshot>>;
    /// The open dirty keys within the subtree `uri` (itself included), by URI.
    fn dirty_within(&self, uri: &CtxUri) -> Result<Vec<DirtyKey>>;
    /// Applies write-backs in one transaction, each fenced on its own.
    fn write_derived(&self, writes: Vec<DerivedWrite>) -> Result<Vec<DerivedOutcome>>;
    /// How many keys are dirty.
    fn count_dirty(&self) -> Result<u64>;
    /// Marks every derived node with a layer no client wrote dirty (`ce reindex --consumer
    /// derive`: a derivation whose input hash is current is then a no-op, so only a changed
    /// generator, model, prompt or limit re-derives); returns how many.
    fn dirty_all(&self) -> Result<u64>;
    /// The usage of the UTC day holding `at_ms`.
    fn derive_usage(&self, at_ms: Millis) -> Result<DeriveUsage>;
}

/// The UTC day of `ms`, `YYYY-MM-DD`.
pub(crate) fn day_of(ms: Millis) -> String {
    ce_core::rfc3339(ms)[..10].to_owned()
}

/// Bumps `node`'s key when it is derived and has a layer no client wrote.
pub(crate) fn dirty_node(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    node: &ContextNode,
    now: Millis,
) -> Result<()> {
    if rules.derives(node.context_type) && !node.provenance.all_user() {
        tx.bump_dirty(&node.uri, now)?;
    }
    Ok(())
}

/// Bumps the key of `child`'s parent (a child was added, removed or moved, or its effective
/// L0 changed), when the parent is a derived node with a layer no client wrote.
pub(crate) fn dirty_parent(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    child: &CtxUri,
    now: Millis,
) -> Result<()> {
    if rules.derived.is_empty() {
        return Ok(());
    }
    let Some(parent) = child.parent().filter(|p| !p.is_root()) else {
        return Ok(());
    };
    if tx.dirty_memo().bumped(&parent) {
        // Already bumped by this transaction: the bump would be skipped, so is the read (one
        // round trip per child on PostgreSQL when a batch adds many to one folder).
        return Ok(());
    }
    if let Some(p) = tx.node(&parent)? {
        dirty_node(tx, rules, &p, now)?;
    }
    Ok(())
}

/// The dirty marks of a put that wrote `new` over `old` (`derived_at_write`: see
/// [`derive_at_write`]).
pub(crate) fn dirty_after_put(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    old: Option<&ContextNode>,
    new: &ContextNode,
    derived_at_write: bool,
    now: Millis,
) -> Result<()> {
    if rules.derived.is_empty() {
        return Ok(());
    }
    if !derived_at_write {
        dirty_node(tx, rules, new, now)?;
    }
    let l0_changed = old.is_none_or(|o| rules.effective_l0(o) != rules.effective_l0(new));
    if l0_changed {
        dirty_parent(tx, rules, &new.uri, now)?;
    }
    Ok(())
}

/// Writes derived layers into `node`, leaving a layer a client wrote as it is.
fn apply_layers(node: &mut ContextNode, l0: &LayerWrite, l1: &LayerWrite, rules: &Rules) {
    for (level, write) in [(Level::L0, l0), (Level::L1, l1)] {
        let Some(origin) = node.provenance.get_mut(level) else {
            continue;
        };
        if origin.is_user() {
            continue;
        }
        let (text, new_origin) = match write {
            LayerWrite::Keep => continue,
            LayerWrite::Derived { text, derivation } => {
                (text.clone(), LayerOrigin::Derived(derivation.clone()))
            }
            LayerWrite::Failed(f) => (String::new(), LayerOrigin::Failed(f.clone())),
        };
        *origin = new_origin;
        match level {
            Level::L0 => node.layers.abstract_text = text,
            _ => node.layers.overview = text,
        }
    }
    settle_origins(node, rules);
}

/// Derives `node`, about to be written over `old`, in the write transaction when it is a
/// leaf the [`LeafDeriver`] takes ([`Rules::inline`]): its type is derived, a layer is not
/// the client's, it has content and no children (counted in the day's derive usage unless
/// its layers were current already). Returns whether it did — the node's inputs
/// are then derived as written, so [`dirty_after_put`] is told not to mark it dirty, and a
/// key left open by an earlier version is closed (a write-back of that version in flight
/// is discarded by its node-version fence).
pub(crate) fn derive_at_write(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    old: Option<&ContextNode>,
    node: &mut ContextNode,
    now: Millis,
) -> Result<bool> {
    let Some(deriver) = &rules.inline else {
        return Ok(false);
    };
    if !rules.derives(node.context_type)
        || node.provenance.all_user()
        || node.layers.content.is_empty()
    {
        return Ok(false);
    }
    if old.is_some() && tx.children_counts(std::slice::from_ref(&node.uri))?[0] > 0 {
        return Ok(false);
    }
    let prepared = rules.prepared.get(&node.layers.content).map(|p| {
        if node.provenance.derived_from(&p.input_hash) {
            LeafLayers {
                abstract_layer: LayerWrite::Keep,
                overview_layer: LayerWrite::Keep,
            }
        } else {
            p.layers.clone()
        }
    });
    let Some(layers) = prepared.or_else(|| deriver.derive_leaf(node, now)) else {
        return Ok(false);
    };
    let kept = [&layers.abstract_layer, &layers.overview_layer]
        .iter()
        .all(|l| **l == LayerWrite::Keep);
    if !kept {
        apply_layers(node, &layers.abstract_layer, &layers.overview_layer, rules);
        tx.derived_at_write();
    }
    if old.is_some()
        && let Some(key) = tx.dirty(&node.uri)?.filter(DirtyKey::is_open)
    {
        tx.mark_derived(&node.uri, key.coalesce_version)?;
    }
    Ok(true)
}

/// `write_derived` inside an open transaction: one write-back.
pub(crate) fn write_derived(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    w: DerivedWrite,
    now: Millis,
) -> Result<DerivedOutcome> {
    let mut usage = DeriveUsage {
        tokens_in: w.tokens_in,
        tokens_out: w.tokens_out,
        ..DeriveUsage::default()
    };
    let outcome = fenced_write(tx, rules, &w, now)?;
    match outcome {
        DerivedOutcome::Discarded { .. } => usage.discarded = 1,
        DerivedOutcome::Written { .. } | DerivedOutcome::Unchanged => usage.derivations = 1,
    }
    tx.add_derive_usage(&day_of(now), usage)?;
    Ok(outcome)
}

fn fenced_write(
    tx: &mut dyn WriteTx,
    rules: &Rules,
    w: &DerivedWrite,
    now: Millis,
) -> Result<DerivedOutcome> {
    let discarded = |reason: &str| {
        Ok(DerivedOutcome::Discarded {
            reason: reason.to_owned(),
        })
    };
    match tx.dirty(&w.uri)? {
        None => return discarded("the node has no dirty key (it was removed)"),
        Some(k) if k.coalesce_version != w.coalesce_version => {
            return discarded("newer inputs were committed");
        }
        Some(_) => {}
    }
    let Some(old) = tx.node(&w.uri)? else {
        return discarded("the node was removed");
    };
    if old.version != w.node_version {
        return discarded("the node changed");
    }
    tx.mark_derived(&w.uri, w.coalesce_version)?;
    let mut node = old.clone();
    apply_layers(&mut node, &w.abstract_layer, &w.overview_layer, rules);
    if node.layers == old.layers && node.provenance == old.provenance {
        return Ok(DerivedOutcome::Unchanged);
    }
    node.version = next_version(Some(old.version), None);
    node.updated_at_ms = now;
    tx.insert_node(&node)?;
    let event = EventPayload::UpsertContext(UpsertContextPayload {
        event_version: EVENT_VERSION,
        uri: node.uri.clone(),
        expected_node_version: node.version,
        reason: UpsertReason::Derived,
        trace_id: node.trace_id.clone(),
    });
    tx.append_events(vec![event], now)?;
    if rules.effective_l0(&old) != rules.effective_l0(&node) {
        dirty_parent(tx, rules, &node.uri, now)?;
    }
    Ok(DerivedOutcome::Written {
        version: node.version,
    })
}

/// `derive_snapshots` inside one read transaction.
pub(crate) fn derive_snapshots(
    tx: &mut dyn ReadTx,
    uris: &[CtxUri],
    l0_fallback_chars: usize,
    waiting: WaitingFolders,
) -> Result<Vec<DeriveSnapshot>> {
    let mut out = Vec::new();
    for uri in uris {
        let Some(key) = tx.dirty(uri)?.filter(DirtyKey::is_open) else {
            continue;
        };
        let Some(node) = tx.node(uri)? else {
            continue;
        };
        let skip = waiting == WaitingFolders::Skip && tx.child_pending(uri)?;
        let children = if skip {
            Vec::new()
        } else {
            tx.derive_children(uri, l0_fallback_chars)?
        };
        out.push(DeriveSnapshot {
            key,
            node,
            children,
            waiting: skip,
        });
    }
    Ok(out)
}

/// `dirty_all` inside an open transaction.
pub(crate) fn dirty_all(tx: &mut dyn WriteTx, rules: &Rules, now: Millis) -> Result<u64> {
    let mut n = 0;
    for node in tx.subtree_nodes(&CtxUri::root())? {
        if rules.derives(node.context_type) && !node.provenance.all_user() {
            tx.bump_dirty(&node.uri, now)?;
            n += 1;
        }
    }
    Ok(n)
}
