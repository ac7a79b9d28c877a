//! Exact in-memory keyword index: BM25 computed directly over every stored record.
//!
//! [`MemoryKeywordIndex`] is the reference implementation of [`KeywordIndex`]: property tests
//! run the same operations on it and on [`super::embedded::EmbeddedKeywordIndex`] and compare.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use ce_core::{CtxUri, IndexRecord};

use super::{
    Bm25, KeywordHit, KeywordIndex, NodeWrite, SearchFilter, StoredRecord, SyncOutcome, Terms,
    query_terms, rank,
};
use crate::error::Result;
use crate::records::{SeenVersion, check_node_records, node_level, of_nodes};

/// Exact in-memory keyword index (the test oracle).
#[derive(Debug, Default)]
pub struct MemoryKeywordIndex {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By id.
    records: BTreeMap<String, Entry>,
    /// The ids of each node's records (so that replacing a node does not scan every record).
    nodes: BTreeMap<CtxUri, BTreeSet<String>>,
    versions: BTreeMap<CtxUri, SeenVersion>,
}

#[derive(Debug, Clone)]
struct Entry {
    record: IndexRecord,
    node_version: u64,
    terms: Terms,
}

impl State {
    /// Stores `e`, replacing the record with its id (whichever node held it).
    fn insert(&mut self, e: Entry) {
        let id = e.record.id.clone();
        self.remove(&id);
        self.nodes
            .entry(e.record.uri.clone())
            .or_default()
            .insert(id.clone());
        self.records.insert(id, e);
    }

    /// Removes record `id` if stored.
    fn remove(&mut self, id: &str) {
        let Some(e) = self.records.remove(id) else {
            return;
        };
        if let Some(ids) = self.nodes.get_mut(&e.record.uri) {
            ids.remove(id);
            if ids.is_empty() {
                self.nodes.remove(&e.record.uri);
            }
        }
    }

    /// Removes every record of node `uri`; how many.
    fn remove_node(&mut self, uri: &CtxUri) -> u64 {
        let ids = self.nodes.remove(uri).unwrap_or_default();
        for id in &ids {
            self.records.remove(id);
        }
        ids.len() as u64
    }

    fn apply(&mut self, write: &NodeWrite) -> Result<SyncOutcome> {
        match write {
            NodeWrite::Sync {
                uri,
                version,
                records,
            } => {
                check_node_records(uri, records.iter().map(|r| &r.record))?;
                if !SeenVersion::admits_write(self.versions.get(uri).copied(), *version) {
                    return Ok(SyncOutcome::Stale);
                }
                self.remove_node(uri);
                for r in records {
                    self.insert(Entry {
                        terms: Terms::of(&r.record.text),
                        record: r.record.clone(),
                        node_version: *version,
                    });
                }
                self.versions
                    .insert(uri.clone(), SeenVersion::live(*version));
            }
            NodeWrite::Remove { uri, version } => {
                if !SeenVersion::admits_removal(self.versions.get(uri).copied(), *version) {
                    return Ok(SyncOutcome::Stale);
                }
                self.remove_node(uri);
                self.versions
                    .insert(uri.clone(), SeenVersion::removed(*version));
            }
            NodeWrite::Purge { uri } => {
                self.remove_node(uri);
            }
        }
        Ok(SyncOutcome::Applied)
    }

    fn stored(e: &Entry) -> StoredRecord {
        StoredRecord {
            record: e.record.clone(),
            node_version: e.node_version,
        }
    }
}

impl MemoryKeywordIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The document frequency of `term` (a term as the tokenizer produces it): how many stored
    /// records hold it, counted over every record.
    pub fn document_frequency(&self, term: &str) -> u64 {
        let s = self.state();
        s.records
            .values()
            .filter(|e| e.terms.tf.contains_key(term))
            .count() as u64
    }

    fn state(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }
}

impl KeywordIndex for MemoryKeywordIndex {
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        let mut s = self.state();
        Ok(writes.iter().map(|w| s.apply(w)).collect())
    }

    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64> {
        let mut s = self.state();
        if !subtree {
            return Ok(s.remove_node(uri));
        }
        let within: Vec<CtxUri> = s
            .nodes
            .keys()
            .filter(|u| u.is_within(uri))
            .cloned()
            .collect();
        Ok(within.iter().map(|u| s.remove_node(u)).sum())
    }

    fn search(&self, query: &str, filter: &SearchFilter, top_k: usize) -> Result<Vec<KeywordHit>> {
        let terms = query_terms(query);
        if terms.is_empty() || top_k == 0 {
            return Ok(Vec::new());
        }
        let s = self.state();
        let total: u64 = s.records.values().map(|e| u64::from(e.terms.len)).sum();
        let bm25 = Bm25::new(s.records.len() as u64, total);
        let idf: Vec<f64> = terms
            .iter()
            .map(|t| {
                let df = s.records.values().filter(|e| e.terms.tf.contains_key(t));
                bm25.idf(df.count() as u64)
            })
            .collect();
        let mut hits = Vec::new();
        for e in s.records.values() {
            let mut score = 0.0;
            let mut found = false;
            for (t, idf) in terms.iter().zip(&idf) {
                if let Some(&tf) = e.terms.tf.get(t) {
                    score += bm25.term(*idf, tf, e.terms.len);
                    found = true;
                }
            }
            if found && filter.matches(&e.record) {
                hits.push(KeywordHit {
                    record: e.record.clone(),
                    score: score as f32,
                });
            }
        }
        rank(&mut hits, top_k);
        Ok(hits)
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

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        let s = self.state();
        let mut out: Vec<StoredRecord> = s
            .records
            .values()
            .filter(|e| e.record.uri.is_within(uri))
            .map(State::stored)
            .collect();
        out.sort_by(|a, b| {
            (&a.record.uri, a.record.level, &a.record.id).cmp(&(
                &b.record.uri,
                b.record.level,
                &b.record.id,
            ))
        });
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
