//! Exact in-memory vector index: brute-force cosine over every record that passes the filter.
//!
//! [`MemoryVectorIndex`] is the reference implementation of [`VectorIndex`]: property tests
//! run the same operations on it and on [`super::embedded::EmbeddedVectorIndex`] and compare.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use ce_core::{CtxUri, IndexRecord};
use ce_embed::ModelIdentity;

use super::rules::{
    check_binding, check_kept, check_query, check_vector, cosine, kept, metadata_version,
    missing_vector, rank, text_hash,
};
use super::{
    NodeRecord, SearchFilter, StoredRecord, StoredVector, SyncOutcome, VectorHit, VectorIndex,
    VectorRecord,
};
use crate::error::Result;
use crate::records::{
    SeenVersion, check_move, check_node_records, move_versions, moved_record, node_level, of_nodes,
};

/// Exact in-memory vector index (the test oracle).
#[derive(Debug, Default)]
pub struct MemoryVectorIndex {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By id.
    records: BTreeMap<String, Entry>,
    versions: BTreeMap<CtxUri, SeenVersion>,
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
                    vector: kept(&r.vector),
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
        check_node_records(uri, records.iter().map(|r| &r.record))?;
        let mut s = self.state();
        if !SeenVersion::admits_write(s.versions.get(uri).copied(), version) {
            return Ok(SyncOutcome::Stale);
        }
        let mut dim = s.dimension;
        let mut entries = Vec::with_capacity(records.len());
        for NodeRecord { record, vector } in records {
            let vector = match vector {
                Some(v) => kept(&v),
                None => {
                    let e = s
                        .records
                        .get(&record.id)
                        .ok_or_else(|| missing_vector(&record))?;
                    check_kept(text_hash(&e.record), &record)?;
                    e.vector.clone()
                }
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
        s.versions.insert(uri.clone(), SeenVersion::live(version));
        Ok(SyncOutcome::Applied)
    }

    fn remove_node(&self, uri: &CtxUri, version: u64) -> Result<SyncOutcome> {
        let mut s = self.state();
        if !SeenVersion::admits_removal(s.versions.get(uri).copied(), version) {
            return Ok(SyncOutcome::Stale);
        }
        for id in s.ids_of_node(uri) {
            s.records.remove(&id);
        }
        s.versions
            .insert(uri.clone(), SeenVersion::removed(version));
        Ok(SyncOutcome::Applied)
    }

    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>> {
        let s = self.state();
        Ok(
            of_nodes(s.records.values(), uris, |e| node_level(&e.record))
                .into_iter()
                .map(State::stored)
                .collect(),
        )
    }

    fn vectors(&self, uris: &[CtxUri]) -> Result<Vec<StoredVector>> {
        let s = self.state();
        Ok(
            of_nodes(s.records.values(), uris, |e| node_level(&e.record))
                .into_iter()
                .map(|e| StoredVector {
                    id: e.record.id.clone(),
                    text_hash: text_hash(&e.record).map(str::to_owned),
                    vector: e.vector.clone(),
                })
                .collect(),
        )
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
