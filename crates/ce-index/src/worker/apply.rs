//! Applying a compacted batch: read the current source state, project, classify each level
//! (re-embed / payload-only / unchanged), embed what changed in capped batches, and write
//! versioned node records.
//!
//! Failures are per URI: a URI whose read, embedding or write failed fails the operations
//! that include it, and only the events needing those operations are retried. A batched
//! embedding call or index write refused for good is split until the refused texts or nodes
//! are isolated ([`super::bisect`]), so one refused text fails only its own node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use ce_core::{Classify as _, ContextNode, CtxUri, IndexProjector, IndexRecord, ProjectionWarning};
use ce_embed::{EmbedError, Embedder};
use ce_store::{SourceStore, UriVersion};
use tracing::{debug, info_span, warn};

use super::WorkerConfig;
use super::bisect::{self, Refusal};
use super::compact::Op;
use super::error::WorkError;
use super::fanout::{Applied, OpFanout, SourceSubtrees};
use super::target::IndexTarget;
use crate::vector::{NodeRecord, NodeWrite, SyncOutcome};

/// What a batch did, by change class (spec "Vector Change").
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChangeCounts {
    /// Levels whose text (or model) changed and that needed an embedding (from the provider
    /// or the embedding cache), written.
    pub embedded: u64,
    /// Levels whose text changed at their URI but whose vector was reused from the record the
    /// node had before a move (no embedding), written.
    pub reused: u64,
    /// Levels whose text is unchanged but whose filters/metadata changed: written without
    /// embedding.
    pub payload_only: u64,
    /// Levels whose text changed, written to a target without vectors (nothing to embed).
    pub rewritten: u64,
    /// Nodes identical to what the index holds: no write.
    pub unchanged: u64,
    /// Nodes removed from the index.
    pub removed: u64,
    /// Writes skipped because the index already held a newer version.
    pub stale: u64,
    /// Nodes whose source moved on to a newer version than the one read (before the write,
    /// or while it was written): the newer version's own event carries the work, so the
    /// events needing these nodes are done.
    pub superseded: u64,
}

/// Applies a compacted batch of node operations to one record index (vector or keyword).
pub(super) struct NodeApplier<'a> {
    pub source: &'a dyn SourceStore,
    /// Set iff the target uses vectors.
    pub embedder: Option<&'a dyn Embedder>,
    pub target: &'a dyn IndexTarget,
    pub projector: &'a IndexProjector,
    pub cfg: &'a WorkerConfig,
}

/// What the index writes of one pass applied.
#[derive(Default)]
struct Written {
    /// The syncs: URI and version written.
    synced: Vec<(CtxUri, u64)>,
    /// The purges.
    purged: Vec<CtxUri>,
}

/// A node to write once its embeddings are ready.
struct PendingNode {
    node: ContextNode,
    records: Vec<IndexRecord>,
    /// For each record: `None` = keep the stored vector, `Some(i)` = text index to embed.
    text_slot: Vec<Option<usize>>,
}

impl NodeApplier<'_> {
    pub fn apply(&self, ops: &[Op]) -> Applied<ChangeCounts> {
        let mut counts = ChangeCounts::default();

        // 1. Moves: the syncs of both subtrees do the work; the pairs let the target's sync
        //    reuse the vectors stored at the source URIs (see `reuse_vectors`).
        let moves: Vec<(CtxUri, CtxUri)> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Move { from, to } => Some((from.clone(), to.clone())),
                _ => None,
            })
            .collect();

        // 2. Resolve every node URI the syncs cover, remembering which ops need it.
        let subtrees = SourceSubtrees::read(self.source, ops);
        let mut fanout = OpFanout::expand(ops, |op| match op {
            Op::Move { .. } => None,
            Op::SyncNode(u) => Some(Ok(vec![u.clone()])),
            Op::SyncSubtree(u) => Some(self.subtree_uris(u, &subtrees)),
        });
        let mut failed: HashMap<CtxUri, WorkError> = HashMap::new();
        if let Err(e) = self.sync_nodes(&fanout.uris(), &moves, &mut failed, &mut counts) {
            // The batched read failed: every sync op fails with it.
            fanout.fail_all(&e);
        }
        fanout.fail_uris(failed);
        fanout.finish(counts)
    }

    /// Every URI within `u` that the source (as read in `subtrees`) or the index knows.
    fn subtree_uris(
        &self,
        u: &CtxUri,
        subtrees: &SourceSubtrees,
    ) -> Result<Vec<CtxUri>, WorkError> {
        let mut set: BTreeSet<CtxUri> = subtrees.within(u)?.iter().cloned().collect();
        set.extend(self.target.uris_under(u)?);
        set.insert(u.clone());
        Ok(set.into_iter().collect())
    }

    /// Syncs `uris`; per-URI failures go to `failed`, a failure of the batched reads is returned.
    ///
    /// After writing, the source versions are read again (read after write):
    /// - a node now live at a newer version is *superseded*: the commit of that version
    ///   appended an event for this consumer in the same transaction (invariant OB1,
    ///   `ce-store/src/txn.rs`: every write path appends its events with its rows), and that
    ///   event is processed after it was committed, so it reads the newer state and writes it
    ///   — VX1 keeps our older write from overwriting it. Nothing is left to do here;
    /// - a node removed or moved away meanwhile gets its removal written now: the event that
    ///   removed it may already have been applied before our write landed, and its subtree
    ///   sync cannot see a node the index did not hold yet, so no later event would revisit
    ///   the URI;
    /// - a URI purged (the source had never held it when read) that the source now holds live
    ///   is synced again: a purge is not ordered by versions, so if the node was created after
    ///   our read and another worker applied its event before our purge landed, the purge
    ///   removed what that sync wrote, and no later event would restore it.
    fn sync_nodes(
        &self,
        uris: &[CtxUri],
        moves: &[(CtxUri, CtxUri)],
        failed: &mut HashMap<CtxUri, WorkError>,
        counts: &mut ChangeCounts,
    ) -> Result<(), WorkError> {
        if uris.is_empty() {
            return Ok(());
        }
        let live: BTreeMap<CtxUri, ContextNode> = self
            .source
            .read_nodes(uris)?
            .into_iter()
            .map(|n| (n.uri.clone(), n))
            .collect();
        let missing: Vec<CtxUri> = uris
            .iter()
            .filter(|u| !live.contains_key(*u))
            .cloned()
            .collect();
        let versions = self.source.versions(&missing)?;

        // Project and classify every live node against what the index holds.
        let mut pending: Vec<PendingNode> = Vec::new();
        let mut texts: Vec<String> = Vec::new();
        let mut text_index: HashMap<String, usize> = HashMap::new();
        let uris: Vec<CtxUri> = live.keys().cloned().collect();
        let stored: HashMap<String, (IndexRecord, u64)> = self
            .target
            .get(&uris)?
            .into_iter()
            .map(|s| (s.record.id.clone(), (s.record, s.node_version)))
            .collect();
        for node in live.into_values() {
            let projection = self.projector.build_context_records(&node);
            for w in &projection.warnings {
                match w {
                    ProjectionWarning::AllLayersEmpty { uri } => {
                        debug!(uri = %uri, "node has no text in any layer: no index records")
                    }
                }
            }
            let records = projection.records;
            // A node without records (a container) is written even when the index holds none
            // for it: only a write records its version (VX1), and without it an older write of
            // the node's records still in flight could land after this one (found by the
            // convergence simulation: a container re-created at the URI of a moved node kept
            // the records that node had before the move).
            let same_set = !records.is_empty()
                && ce_core::Level::ALL.iter().all(|l| {
                    let id = ce_core::stable_hash(node.uri.as_str(), l.as_u8());
                    let new = records.iter().find(|r| r.level == *l);
                    match (new, stored.get(&id)) {
                        (None, None) => true,
                        (Some(r), Some((s, v))) => *v == node.version && r == s,
                        _ => false,
                    }
                });
            if same_set {
                counts.unchanged += 1;
                continue;
            }
            let mut text_slot = Vec::with_capacity(records.len());
            for r in &records {
                let same_text = stored.get(&r.id).is_some_and(|(s, _)| {
                    s.metadata.get("content_hash") == r.metadata.get("content_hash")
                });
                if same_text {
                    counts.payload_only += 1;
                    text_slot.push(None);
                } else if self.embedder.is_none() {
                    counts.rewritten += 1;
                    text_slot.push(None);
                } else {
                    let next = texts.len();
                    let slot = *text_index.entry(r.text.clone()).or_insert_with(|| {
                        texts.push(r.text.clone());
                        next
                    });
                    text_slot.push(Some(slot));
                }
            }
            pending.push(PendingNode {
                node,
                records,
                text_slot,
            });
        }

        // Vectors a move left at the source URIs serve the same texts at the target.
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
        if !moves.is_empty() && !texts.is_empty() {
            self.reuse_vectors(&pending, moves, &texts, &mut vectors)?;
        }
        for slot in pending.iter().flat_map(|p| p.text_slot.iter().flatten()) {
            if vectors[*slot].is_some() {
                counts.reused += 1;
            } else {
                counts.embedded += 1;
            }
        }
        // Shortest first: a model pads each batch to its longest text, so batches of similar
        // lengths waste the least compute.
        let mut to_embed: Vec<usize> = (0..texts.len()).filter(|&i| vectors[i].is_none()).collect();
        to_embed.sort_by_key(|&i| texts[i].len());
        let embed_texts: Vec<String> = to_embed.iter().map(|&i| texts[i].clone()).collect();

        // Embed in batches of `embed_batch_size` texts and at most `max_batch_text_bytes`; a
        // call refused for good is split until the refused texts are isolated.
        let mut embed_errors: HashMap<usize, WorkError> = HashMap::new();
        for (start, end) in batches(
            &embed_texts,
            self.cfg.embed_batch_size,
            self.cfg.max_batch_text_bytes,
        ) {
            // Without vectors nothing is queued for embedding (`embed_texts` is empty).
            let Some(embedder) = self.embedder else {
                break;
            };
            let refs: Vec<&str> = embed_texts[start..end].iter().map(String::as_str).collect();
            let mut call = |refs: &[&str]| self.embed(embedder, refs);
            let outcomes = bisect::call_split(&refs, &mut call, &self.cfg.consumer, "embed");
            for (k, outcome) in outcomes.into_iter().enumerate() {
                match outcome {
                    Ok(v) => vectors[to_embed[start + k]] = Some(v),
                    Err(e) => {
                        embed_errors.insert(to_embed[start + k], e);
                    }
                }
            }
        }

        // The vectors just paid for are in the cache before the index write (a cache stages
        // cheap ones in memory until now).
        if let Some(embedder) = self.embedder.filter(|_| !embed_texts.is_empty()) {
            embedder.flush();
        }

        // One batched index write: each node whose vectors are all ready, then the removals
        // (last, so a move's target could reuse the vectors stored at its source URIs above).
        let mut writes: Vec<NodeWrite> = Vec::new();
        for p in pending {
            let mut node_records = Vec::with_capacity(p.records.len());
            let mut missing_vector: Option<usize> = None;
            for (r, slot) in p.records.into_iter().zip(&p.text_slot) {
                let vector = match slot {
                    None => None,
                    Some(i) => match &vectors[*i] {
                        Some(v) => Some(v.clone()),
                        None => {
                            missing_vector = Some(*i);
                            break;
                        }
                    },
                };
                node_records.push(NodeRecord { record: r, vector });
            }
            if let Some(i) = missing_vector {
                let err = embed_errors
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| WorkError::internal("embedding missing"));
                failed.insert(p.node.uri.clone(), err);
                continue;
            }
            writes.push(NodeWrite::Sync {
                uri: p.node.uri,
                version: p.node.version,
                records: node_records,
            });
        }
        for (u, v) in missing.iter().zip(versions) {
            // Created between our two reads: its own UPSERT event (appended after the read)
            // will sync it; removing here could hide it behind a deleted state.
            match removal(u, v) {
                Some(w) => writes.push(w),
                None => counts.superseded += 1,
            }
        }
        let Written { synced, purged } = self.write_all(writes, failed, counts);

        // Read after write (see above).
        let created = super::live_now(self.source, purged)?;
        if !created.is_empty() {
            debug!(
                uris = created.len(),
                "purged nodes created meanwhile: syncing again"
            );
            // They existed by now, so this sync can purge none of them again.
            self.sync_nodes(&created, &[], failed, counts)?;
        }
        if synced.is_empty() {
            return Ok(());
        }
        let uris: Vec<CtxUri> = synced.iter().map(|(u, _)| u.clone()).collect();
        let now = self.source.versions(&uris)?;
        let mut removals: Vec<NodeWrite> = Vec::new();
        for ((u, v), now) in synced.into_iter().zip(now) {
            if now == UriVersion::Live(v) {
                continue;
            }
            match removal(&u, now) {
                Some(w) => removals.push(w),
                None => {
                    debug!(uri = %u, version = v, "node changed while it was indexed: superseded");
                    counts.superseded += 1;
                }
            }
        }
        // Removals are not checked again: a node re-created since is live at a newer version,
        // which VX1 lets no removal computed from an older state hide, and its event syncs it.
        self.write_all(removals, failed, counts);
        Ok(())
    }

    /// Writes `writes` in chunks of at most [`IndexTarget::write_records`] records; returns
    /// what was applied.
    fn write_all(
        &self,
        writes: Vec<NodeWrite>,
        failed: &mut HashMap<CtxUri, WorkError>,
        counts: &mut ChangeCounts,
    ) -> Written {
        let mut written = Written::default();
        let removal_cost = usize::from(!self.target.bulk_removals());
        let max_records = self.target.write_records(self.cfg.vector_upsert_batch_size);
        for chunk in write_batches(writes, max_records, removal_cost) {
            self.write_chunk(chunk, &mut written, failed, counts);
        }
        written
    }

    /// One embedding call; a refusal says whether splitting the call may help.
    fn embed(&self, embedder: &dyn Embedder, texts: &[&str]) -> Result<Vec<Vec<f32>>, Refusal> {
        let _s = info_span!("index.embed", texts = texts.len()).entered();
        let t0 = Instant::now();
        let refused = |e: EmbedError| Refusal {
            splittable: !e.is_retryable() && e.may_concern_some_texts(),
            error: WorkError::from(e),
        };
        match embedder.embed_texts(texts, self.cfg.embed_timeout) {
            Ok(vs) if vs.len() == texts.len() => {
                metrics::histogram!("index_embed_latency_ms")
                    .record(t0.elapsed().as_secs_f64() * 1e3);
                Ok(vs)
            }
            Ok(vs) => Err(refused(EmbedError::InvalidResponse(format!(
                "{} vectors for {} texts",
                vs.len(),
                texts.len()
            )))),
            Err(e) => Err(refused(e)),
        }
    }

    /// Applies one batched index write (split when refused for good, see [`bisect`]); syncs
    /// and purges applied go to `written`.
    fn write_chunk(
        &self,
        writes: Vec<NodeWrite>,
        written: &mut Written,
        failed: &mut HashMap<CtxUri, WorkError>,
        counts: &mut ChangeCounts,
    ) {
        let kind = self.target.kind();
        let _s = kind.write_span(writes.len());
        let keys: Vec<(CtxUri, Option<u64>, bool)> = writes
            .iter()
            .map(|w| match w {
                NodeWrite::Sync { uri, version, .. } => (uri.clone(), Some(*version), false),
                NodeWrite::Remove { uri, .. } => (uri.clone(), None, false),
                NodeWrite::Purge { uri } => (uri.clone(), None, true),
            })
            .collect();
        ce_core::failpoint::hit("worker.after_embed");
        let mut call = |writes: &[NodeWrite]| {
            bisect::index_write(writes, kind, |w| self.target.write_nodes(w))
        };
        let outcomes = bisect::call_split(&writes, &mut call, &self.cfg.consumer, "write");
        ce_core::failpoint::hit("worker.after_index_write");
        for ((uri, synced, purge), outcome) in keys.into_iter().zip(outcomes) {
            match (outcome.and_then(|o| o.map_err(WorkError::from)), synced) {
                (Ok(SyncOutcome::Applied), Some(v)) => written.synced.push((uri, v)),
                (Ok(SyncOutcome::Applied), None) => {
                    counts.removed += 1;
                    if purge {
                        written.purged.push(uri);
                    }
                }
                (Ok(SyncOutcome::Stale), _) => counts.stale += 1,
                (Err(e), _) => {
                    warn!(uri = %uri, error = %e, "{} write failed", kind.name());
                    failed.insert(uri, e);
                }
            }
        }
    }

    /// Fills `vectors` for texts that a moved node carried: for each pending node within a
    /// move's target, the stored record at the corresponding source URI with the same
    /// content hash lends its vector (zero re-embedding on `mv`).
    fn reuse_vectors(
        &self,
        pending: &[PendingNode],
        moves: &[(CtxUri, CtxUri)],
        texts: &[String],
        vectors: &mut [Option<Vec<f32>>],
    ) -> Result<(), WorkError> {
        let mut old_uris: Vec<CtxUri> = Vec::new();
        for p in pending {
            for (from, to) in moves {
                if let Ok(old) = p.node.uri.rebase(to, from) {
                    old_uris.push(old);
                }
            }
        }
        if old_uris.is_empty() {
            return Ok(());
        }
        // Each vector with the text hash read with it: a vector and a record read apart could
        // straddle another worker's write of the source URI, and lend one text's vector to
        // another (found by the convergence simulation, 2026-12-06).
        let by_hash: HashMap<String, Vec<f32>> = self
            .target
            .vectors(&old_uris)?
            .into_iter()
            .filter_map(|s| Some((s.text_hash?, s.vector)))
            .collect();
        for (i, text) in texts.iter().enumerate() {
            if let Some(v) = by_hash.get(&ce_core::sha256_tagged(text)) {
                vectors[i] = Some(v.clone());
            }
        }
        Ok(())
    }
}

/// The write that removes `uri` from the index given its source state, `None` when the source
/// holds it live (then its own event syncs it).
fn removal(uri: &CtxUri, state: UriVersion) -> Option<NodeWrite> {
    match state {
        UriVersion::Deleted(version) => Some(NodeWrite::Remove {
            uri: uri.clone(),
            version,
        }),
        UriVersion::Live(_) => None,
        // Never stored in the source (e.g. a source restored from an older copy): whatever
        // the index holds for it is an orphan.
        UriVersion::Unknown => Some(NodeWrite::Purge { uri: uri.clone() }),
    }
}

/// Groups `writes` in order into batches of at most `max_records` records (a removal counts
/// as `removal_cost`: one, or none for a target whose removals all go in one write); a node is
/// never split, so a node over the cap gets a batch of its own.
fn write_batches(
    writes: Vec<NodeWrite>,
    max_records: usize,
    removal_cost: usize,
) -> Vec<Vec<NodeWrite>> {
    let mut out: Vec<Vec<NodeWrite>> = Vec::new();
    let mut records = 0;
    for w in writes {
        let n = match &w {
            NodeWrite::Sync { records, .. } => records.len().max(1),
            _ => removal_cost,
        };
        match out.last_mut() {
            Some(last) if records + n <= max_records.max(1) => last.push(w),
            _ => {
                out.push(vec![w]);
                records = 0;
            }
        }
        records += n;
    }
    out
}

/// Splits `texts` into `[start, end)` ranges of at most `max_count` texts and at most
/// `max_bytes` bytes each; a single text over `max_bytes` gets a range of its own (split,
/// never dropped).
pub fn batches(texts: &[String], max_count: usize, max_bytes: usize) -> Vec<(usize, usize)> {
    let max_count = max_count.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, t) in texts.iter().enumerate() {
        let full = i - start >= max_count || (i > start && bytes + t.len() > max_bytes);
        if full {
            out.push((start, i));
            start = i;
            bytes = 0;
        }
        bytes += t.len();
    }
    if start < texts.len() {
        out.push((start, texts.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{NodeRecord, NodeWrite, batches, write_batches};

    #[test]
    fn write_batches_cap_records_and_never_split_a_node() {
        let u = |s: &str| ce_core::CtxUri::parse(s).expect("uri");
        let sync = |name: &str, n: u8| NodeWrite::Sync {
            uri: u(name),
            version: 1,
            records: (0..n)
                .map(|l| NodeRecord {
                    record: ce_core::IndexRecord {
                        id: format!("{name}-{l}"),
                        uri: u(name),
                        parent_uri: ce_core::CtxUri::root(),
                        context_type: "resource".into(),
                        category: String::new(),
                        level: ce_core::Level::ALL[usize::from(l)],
                        text: "t".into(),
                        filters: Default::default(),
                        metadata: Default::default(),
                    },
                    vector: None,
                })
                .collect(),
        };
        let rm = |name: &str| NodeWrite::Remove {
            uri: u(name),
            version: 2,
        };
        let writes = vec![
            sync("ctx://a", 3),
            sync("ctx://b", 3),
            rm("ctx://c"),
            sync("ctx://d", 3),
            rm("ctx://e"),
        ];
        let sizes = |b: &[Vec<NodeWrite>]| b.iter().map(Vec::len).collect::<Vec<_>>();
        let got = write_batches(writes.clone(), 4, 1);
        assert_eq!(sizes(&got), [1, 2, 2]);
        let flat: Vec<NodeWrite> = got.into_iter().flatten().collect();
        assert_eq!(flat, writes, "order kept, nothing dropped");
        assert_eq!(sizes(&write_batches(writes.clone(), 2, 1)), [1, 1, 1, 1, 1]);
        assert_eq!(sizes(&write_batches(writes.clone(), 128, 1)), [5]);
        assert!(write_batches(Vec::new(), 4, 1).is_empty());
        // Free removals join the batch at hand: many removals make one write.
        assert_eq!(sizes(&write_batches(writes.clone(), 6, 1)), [2, 3]);
        assert_eq!(sizes(&write_batches(writes.clone(), 6, 0)), [3, 2]);
        let many: Vec<NodeWrite> = (0..1000).map(|i| rm(&format!("ctx://r{i}"))).collect();
        assert_eq!(sizes(&write_batches(many, 128, 0)), [1000]);
    }

    #[test]
    fn batches_respect_count_and_bytes_and_never_drop() {
        let t = |n: usize| "x".repeat(n);
        let texts = vec![t(10), t(10), t(10), t(10), t(10)];
        assert_eq!(batches(&texts, 2, 1000), [(0, 2), (2, 4), (4, 5)]);
        assert_eq!(batches(&texts, 32, 25), [(0, 2), (2, 4), (4, 5)]);
        let big = vec![t(5), t(100), t(5)];
        assert_eq!(batches(&big, 32, 50), [(0, 1), (1, 2), (2, 3)]);
        assert!(batches(&[], 32, 50).is_empty());
        let covered: usize = batches(&texts, 3, 15).iter().map(|(s, e)| e - s).sum();
        assert_eq!(covered, texts.len());
    }
}
