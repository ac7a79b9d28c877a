//! Exact in-memory vector index: brute-force cosine over every record that passes the filter.
//!
//! [`MemoryVectorIndex`] is the reference implementation of [`VectorIndex`]: property tests
//! run the same operations on it and on [`super::embedded::EmbeddedVectorIndex`] and compare.
//! The small pure rules both implementations share live here too, so there is one definition
//! of each: the version rule ([`UriVersion`]) and its bookkeeping on moves (`move_versions`),
//! the move rewrite (`moved_record`), scoring (`cosine`) and result order (`rank`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use ce_core::{CoreError, CtxUri, IndexRecord, PathDefaults, stable_hash};
use ce_embed::ModelIdentity;
use numkong::Angular as _;
use serde_json::Value;

use super::{
    NodeRecord, SearchFilter, StoredRecord, SyncOutcome, VectorHit, VectorIndex, VectorRecord,
};
use crate::error::{IndexError, Result};

/// The newest version an index has seen for one URI (the state behind invariant VX1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UriVersion {
    /// The source version.
    pub version: u64,
    /// Whether that version was a removal (a tombstone).
    pub deleted: bool,
}

impl UriVersion {
    /// Whether a write of the node's records computed from `version` may apply (VX1).
    ///
    /// Versions at least as new as a live version apply (replays are idempotent); after a
    /// removal at `v`, version `v` itself is stale — the source deleted it, and the next
    /// version a recreated node gets is `v + 1`.
    pub fn admits_write(stored: Option<Self>, version: u64) -> bool {
        match stored {
            None => true,
            Some(s) if s.deleted => version > s.version,
            Some(s) => version >= s.version,
        }
    }

    /// Whether a removal computed from `version` may apply (VX1).
    pub fn admits_removal(stored: Option<Self>, version: u64) -> bool {
        stored.is_none_or(|s| version >= s.version)
    }
}

/// Where an index keeps the [`UriVersion`] of each URI.
pub(crate) trait UriVersions {
    /// The newest state seen for `uri`.
    fn uri_version(&mut self, uri: &CtxUri) -> Result<Option<UriVersion>>;
    /// Records `v` as the newest state of `uri`.
    fn set_uri_version(&mut self, uri: &CtxUri, v: UriVersion) -> Result<()>;
}

impl UriVersions for BTreeMap<CtxUri, UriVersion> {
    fn uri_version(&mut self, uri: &CtxUri) -> Result<Option<UriVersion>> {
        Ok(self.get(uri).copied())
    }

    fn set_uri_version(&mut self, uri: &CtxUri, v: UriVersion) -> Result<()> {
        self.insert(uri.clone(), v);
        Ok(())
    }
}

/// The versions of one record that `move_uri` moves from URI `from` to `to`, computed from
/// node version `version`: `from` becomes `(its version, deleted)` (at least `version`);
/// then, if the state of `to` admits a write at `version`, `to` becomes live at least at
/// `version` and the answer is `true`; otherwise the record is dropped, not moved (`false`).
pub(crate) fn move_versions(
    versions: &mut impl UriVersions,
    from: &CtxUri,
    to: &CtxUri,
    version: u64,
) -> Result<bool> {
    let src = versions.uri_version(from)?;
    versions.set_uri_version(
        from,
        UriVersion {
            version: src.map_or(0, |s| s.version).max(version),
            deleted: true,
        },
    )?;
    let target = versions.uri_version(to)?;
    if !UriVersion::admits_write(target, version) {
        return Ok(false);
    }
    versions.set_uri_version(
        to,
        UriVersion {
            version: target.map_or(0, |t| t.version).max(version),
            deleted: false,
        },
    )?;
    Ok(true)
}

/// Cosine similarity of `a` and `b` (equal lengths), the score every implementation reports.
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    // numkong's SIMD kernel (built at opt-level 3) keeps exact scans fast even in debug builds.
    f32::angular(a, b).map_or(f32::NAN, |d| (1.0 - d) as f32)
}

/// Sorts hits best first — score descending, then id ascending so ties are deterministic —
/// and keeps `top_k`.
pub(crate) fn rank(hits: &mut Vec<VectorHit>, top_k: usize) {
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.record.id.cmp(&b.record.id))
    });
    hits.truncate(top_k);
}

/// The source version a record carries in `metadata.node_version` (0 when absent): what an
/// unversioned [`VectorIndex::upsert`] stores as the record's version.
pub(crate) fn metadata_version(r: &IndexRecord) -> u64 {
    r.metadata
        .get("node_version")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Checks a move's arguments; `Ok(false)` when the move is a no-op (`from == to`).
pub(crate) fn check_move(from: &CtxUri, to: &CtxUri) -> Result<bool> {
    if from == to {
        return Ok(false);
    }
    if from.is_root() || to.is_root() {
        return Err(invalid(
            "uri",
            "the root ctx:// cannot be moved or replaced".into(),
        ));
    }
    if to.is_within(from) {
        return Err(invalid(
            "uri",
            format!("cannot move {from} into its own subtree {to}"),
        ));
    }
    // The source store refuses this too (the target, an ancestor, exists); allowing it would
    // let a moved record land on a source record that has not moved yet.
    if from.is_within(to) {
        return Err(invalid(
            "uri",
            format!("cannot move {from} onto its own ancestor {to}"),
        ));
    }
    Ok(true)
}

/// The record `r` (within `from`) rewritten for a move to `to` (spec §6.3): uri and parent_uri
/// rebased (the moved root's parent becomes `parent(to)`), id re-keyed with
/// `stable_hash(new_uri, level)`, and the filter fields that follow the path (`uri`,
/// `parent_uri`, `account_id`, and `context_type` / `category` / `owner_space` where they were
/// the old path's defaults, as the source store does) rewritten. Text, metadata and the vector
/// are kept.
pub(crate) fn moved_record(r: &IndexRecord, from: &CtxUri, to: &CtxUri) -> Result<IndexRecord> {
    let uri = r.uri.rebase(from, to).map_err(CoreError::from)?;
    let parent_uri = if r.uri == *from {
        to.parent().unwrap_or_else(CtxUri::root)
    } else if r.parent_uri.is_within(from) {
        r.parent_uri.rebase(from, to).map_err(CoreError::from)?
    } else {
        r.parent_uri.clone()
    };
    let (old_d, new_d) = (PathDefaults::of(&r.uri), PathDefaults::of(&uri));
    let mut out = r.clone();
    out.id = stable_hash(uri.as_str(), r.level.as_u8());
    if out.context_type == old_d.context_type.as_str() {
        out.context_type = new_d.context_type.as_str().to_owned();
    }
    if out.category == old_d.category {
        out.category.clone_from(&new_d.category);
    }
    let rewrite = |filters: &mut BTreeMap<String, Value>, key: &str, old: &str, new: &str| {
        if let Some(v) = filters.get_mut(key)
            && v.as_str() == Some(old)
        {
            *v = Value::String(new.to_owned());
        }
    };
    let f = &mut out.filters;
    rewrite(f, "uri", r.uri.as_str(), uri.as_str());
    rewrite(f, "parent_uri", r.parent_uri.as_str(), parent_uri.as_str());
    rewrite(f, "account_id", r.uri.account_id(), uri.account_id());
    rewrite(
        f,
        "context_type",
        old_d.context_type.as_str(),
        new_d.context_type.as_str(),
    );
    rewrite(f, "category", &old_d.category, &new_d.category);
    rewrite(
        f,
        "owner_space",
        &old_d.owner_space.to_string(),
        &new_d.owner_space.to_string(),
    );
    out.uri = uri;
    out.parent_uri = parent_uri;
    Ok(out)
}

/// Checks that every record of a [`VectorIndex::sync_node`] call belongs to node `uri`.
pub(crate) fn check_node_records(uri: &CtxUri, records: &[NodeRecord]) -> Result<()> {
    match records.iter().find(|r| r.record.uri != *uri) {
        Some(r) => Err(invalid(
            "uri",
            format!(
                "record {} has uri {} but the node being synced is {uri}",
                r.record.id, r.record.uri
            ),
        )),
        None => Ok(()),
    }
}

/// The dimension vectors written to an index must have: the bound model's, else the one the
/// stored vectors have, else (first write) the vector's own. Also rejects empty or
/// non-finite vectors.
pub(crate) fn check_vector(
    id: &str,
    v: &[f32],
    model: Option<&ModelIdentity>,
    dimension: Option<usize>,
) -> Result<()> {
    let want = model.map(|m| m.dimension).or(dimension);
    if let Some(d) = want
        && v.len() != d
    {
        let whose = model.map_or_else(|| "stored vectors".to_owned(), |m| format!("model {m}"));
        return Err(IndexError::SchemaMismatch(format!(
            "vector of record {id} has dimension {}, {whose} has dimension {d}",
            v.len()
        )));
    }
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return Err(invalid(
            "vector",
            format!("vector of record {id} is empty or holds a non-finite value"),
        ));
    }
    Ok(())
}

/// Checks a query vector: `Ok(false)` when the index is empty of vectors and unbound (any
/// query then finds nothing).
pub(crate) fn check_query(
    query: &[f32],
    model: Option<&ModelIdentity>,
    dimension: Option<usize>,
) -> Result<bool> {
    if query.is_empty() || query.iter().any(|x| !x.is_finite()) {
        return Err(IndexError::InvalidQuery(
            "query vector is empty or holds a non-finite value".into(),
        ));
    }
    match model.map(|m| m.dimension).or(dimension) {
        Some(d) if d != query.len() => Err(IndexError::InvalidQuery(format!(
            "query vector has dimension {}, the index holds vectors of dimension {d}",
            query.len()
        ))),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

/// Compares a model to the bound one: a different model is a [`IndexError::SchemaMismatch`]
/// naming both; so is a model whose dimension differs from the stored vectors'.
pub(crate) fn check_binding(
    bound: Option<&ModelIdentity>,
    dimension: Option<usize>,
    model: &ModelIdentity,
) -> Result<()> {
    if let Some(b) = bound
        && b != model
    {
        return Err(IndexError::SchemaMismatch(format!(
            "index holds vectors of model {b}, cannot use model {model}: rebuild with `ce reindex --consumer vector`"
        )));
    }
    if let Some(d) = dimension
        && d != model.dimension
    {
        return Err(IndexError::SchemaMismatch(format!(
            "index holds vectors of dimension {d}, cannot use model {model}: rebuild with `ce reindex --consumer vector`"
        )));
    }
    Ok(())
}

pub(crate) fn invalid(field: &'static str, reason: String) -> IndexError {
    IndexError::Core(CoreError::InvalidField { field, reason })
}

/// Exact in-memory vector index (the test oracle).
#[derive(Debug, Default)]
pub struct MemoryVectorIndex {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By id.
    records: BTreeMap<String, Entry>,
    versions: BTreeMap<CtxUri, UriVersion>,
    model: Option<ModelIdentity>,
    dimension: Option<usize>,
}

#[derive(Debug, Clone)]
struct Entry {
    record: IndexRecord,
    vector: Vec<f32>,
    node_version: u64,
}

impl State {
    fn ids_of_node(&self, uri: &CtxUri) -> Vec<String> {
        self.records
            .iter()
            .filter(|(_, e)| e.record.uri == *uri)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn stored(e: &Entry) -> StoredRecord {
        StoredRecord {
            record: e.record.clone(),
            node_version: e.node_version,
        }
    }
}

impl MemoryVectorIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }
}

impl VectorIndex for MemoryVectorIndex {
    fn model(&self) -> Result<Option<ModelIdentity>> {
        Ok(self.state().model.clone())
    }

    fn bind_model(&self, model: &ModelIdentity) -> Result<()> {
        let mut s = self.state();
        check_binding(s.model.as_ref(), s.dimension, model)?;
        s.model = Some(model.clone());
        Ok(())
    }

    fn upsert(&self, records: &[VectorRecord]) -> Result<()> {
        let mut s = self.state();
        let mut dim = s.dimension;
        for r in records {
            check_vector(&r.record.id, &r.vector, s.model.as_ref(), dim)?;
            dim = Some(r.vector.len());
        }
        s.dimension = dim;
        for r in records {
            s.records.insert(
                r.record.id.clone(),
                Entry {
                    record: r.record.clone(),
                    vector: r.vector.clone(),
                    node_version: metadata_version(&r.record),
                },
            );
        }
        Ok(())
    }

    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64> {
        let mut s = self.state();
        let before = s.records.len();
        s.records.retain(|_, e| {
            if subtree {
                !e.record.uri.is_within(uri)
            } else {
                e.record.uri != *uri
            }
        });
        Ok((before - s.records.len()) as u64)
    }

    fn move_uri(&self, from: &CtxUri, to: &CtxUri) -> Result<u64> {
        if !check_move(from, to)? {
            return Ok(0);
        }
        let mut s = self.state();
        let mut moving: Vec<Entry> = s
            .records
            .values()
            .filter(|e| e.record.uri.is_within(from))
            .cloned()
            .collect();
        moving
            .sort_by(|a, b| (&a.record.uri, a.record.level).cmp(&(&b.record.uri, b.record.level)));
        let rewritten = moving
            .iter()
            .map(|e| moved_record(&e.record, from, to))
            .collect::<Result<Vec<_>>>()?;
        let mut moved = 0;
        for (old, new) in moving.into_iter().zip(rewritten) {
            s.records.remove(&old.record.id);
            if !move_versions(&mut s.versions, &old.record.uri, &new.uri, old.node_version)? {
                continue;
            }
            s.records.insert(
                new.id.clone(),
                Entry {
                    record: new,
                    vector: old.vector,
                    node_version: old.node_version,
                },
            );
            moved += 1;
        }
        Ok(moved)
    }

    fn search(&self, query: &[f32], filter: &SearchFilter, top_k: usize) -> Result<Vec<VectorHit>> {
        let s = self.state();
        if !check_query(query, s.model.as_ref(), s.dimension)? || top_k == 0 {
            return Ok(Vec::new());
        }
        let mut hits: Vec<VectorHit> = s
            .records
            .values()
            .filter(|e| filter.matches(&e.record))
            .map(|e| VectorHit {
                record: e.record.clone(),
                score: cosine(query, &e.vector),
            })
            .collect();
        rank(&mut hits, top_k);
        Ok(hits)
    }

    fn sync_node(
        &self,
        uri: &CtxUri,
        version: u64,
        records: Vec<NodeRecord>,
    ) -> Result<SyncOutcome> {
        check_node_records(uri, &records)?;
        let mut s = self.state();
        if !UriVersion::admits_write(s.versions.get(uri).copied(), version) {
            return Ok(SyncOutcome::Stale);
        }
        let mut dim = s.dimension;
        let mut entries = Vec::with_capacity(records.len());
        for NodeRecord { record, vector } in records {
            let vector = match vector {
                Some(v) => v,
                None => s
                    .records
                    .get(&record.id)
                    .map(|e| e.vector.clone())
                    .ok_or_else(|| missing_vector(&record))?,
            };
            check_vector(&record.id, &vector, s.model.as_ref(), dim)?;
            dim = Some(vector.len());
            entries.push(Entry {
                record,
                vector,
                node_version: version,
            });
        }
        s.dimension = dim;
        for id in s.ids_of_node(uri) {
            s.records.remove(&id);
        }
        for e in entries {
            s.records.insert(e.record.id.clone(), e);
        }
        s.versions.insert(
            uri.clone(),
            UriVersion {
                version,
                deleted: false,
            },
        );
        Ok(SyncOutcome::Applied)
    }

    fn remove_node(&self, uri: &CtxUri, version: u64) -> Result<SyncOutcome> {
        let mut s = self.state();
        if !UriVersion::admits_removal(s.versions.get(uri).copied(), version) {
            return Ok(SyncOutcome::Stale);
        }
        for id in s.ids_of_node(uri) {
            s.records.remove(&id);
        }
        s.versions.insert(
            uri.clone(),
            UriVersion {
                version,
                deleted: true,
            },
        );
        Ok(SyncOutcome::Applied)
    }

    fn get(&self, ids: &[String]) -> Result<Vec<StoredRecord>> {
        let s = self.state();
        Ok(ids
            .iter()
            .filter_map(|id| s.records.get(id).map(State::stored))
            .collect())
    }

    fn vectors(&self, ids: &[String]) -> Result<Vec<(String, Vec<f32>)>> {
        let s = self.state();
        Ok(ids
            .iter()
            .filter_map(|id| s.records.get(id).map(|e| (id.clone(), e.vector.clone())))
            .collect())
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        let s = self.state();
        let mut out: Vec<StoredRecord> = s
            .records
            .values()
            .filter(|e| e.record.uri.is_within(uri))
            .map(State::stored)
            .collect();
        out.sort_by(|a, b| (&a.record.uri, a.record.level).cmp(&(&b.record.uri, b.record.level)));
        Ok(out)
    }

    fn count(&self) -> Result<u64> {
        Ok(self.state().records.len() as u64)
    }

    fn clear(&self) -> Result<()> {
        *self.state() = State::default();
        Ok(())
    }
}

/// The error of a payload-only update (`vector: None`) for a record with no stored vector:
/// the worker planned it from a stored vector that another worker has since moved or removed
/// (back-to-back moves of one subtree on two workers), so it is retried and planned again.
pub(crate) fn missing_vector(r: &IndexRecord) -> IndexError {
    IndexError::Raced(format!(
        "record {} ({} level {}) has no stored vector to keep (moved or removed since it was \
         read): embed its text",
        r.id, r.uri, r.level
    ))
}
