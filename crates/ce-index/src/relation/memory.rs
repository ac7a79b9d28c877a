//! Exact in-memory relation index: the reference implementation of [`RelationIndex`].
//! Property tests run the same operations on it and on
//! [`super::embedded::EmbeddedRelationIndex`] and compare.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use ce_core::CtxUri;

use super::{
    Direction, OwnerStore, OwnerVersion, RelationIndex, RelationIndexRecord, RelationOutcome,
    RelationRecord, RelationWrite, apply_write, by_key, check_record, check_type_filter,
    check_write, rank, stored,
};
use crate::error::Result;

/// Exact in-memory relation index.
#[derive(Debug, Default)]
pub struct MemoryRelationIndex {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By id.
    records: BTreeMap<String, RelationRecord>,
    owners: BTreeMap<CtxUri, OwnerVersion>,
}

impl State {
    /// Every record `keep` accepts, in listing order ([`by_key`]).
    fn select(&self, keep: impl Fn(&RelationIndexRecord) -> bool) -> Vec<RelationRecord> {
        let mut out: Vec<RelationRecord> = self
            .records
            .values()
            .filter(|r| keep(&r.record))
            .cloned()
            .collect();
        out.sort_by(by_key);
        out
    }
}

impl OwnerStore for State {
    fn owner_version(&self, owner: &CtxUri) -> Result<Option<OwnerVersion>> {
        Ok(self.owners.get(owner).copied())
    }

    fn set_owner_version(&mut self, owner: &CtxUri, v: OwnerVersion) -> Result<()> {
        self.owners.insert(owner.clone(), v);
        Ok(())
    }

    fn owned(&self, owner: &CtxUri) -> Result<Vec<RelationRecord>> {
        Ok(self
            .records
            .values()
            .filter(|r| r.record.from_uri == *owner)
            .cloned()
            .collect())
    }

    fn remove_owned(&mut self, owner: &CtxUri) -> Result<u64> {
        let before = self.records.len();
        self.records.retain(|_, r| r.record.from_uri != *owner);
        Ok((before - self.records.len()) as u64)
    }

    fn put(&mut self, r: RelationRecord) -> Result<()> {
        self.records.insert(r.record.id.clone(), r);
        Ok(())
    }
}

impl MemoryRelationIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }
}

impl RelationIndex for MemoryRelationIndex {
    fn write_owners(&self, writes: &[RelationWrite]) -> Result<Vec<Result<RelationOutcome>>> {
        let mut s = self.state();
        Ok(writes
            .iter()
            .map(|w| {
                check_write(w)?;
                apply_write(&mut *s, w.clone())
            })
            .collect())
    }

    fn upsert_relations(&self, records: &[RelationRecord]) -> Result<()> {
        for r in records {
            check_record(&r.record)?;
        }
        let mut s = self.state();
        for r in records {
            s.put(stored(r.record.clone(), r.relation_version))?;
        }
        Ok(())
    }

    fn delete_relations_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64> {
        let mut s = self.state();
        let before = s.records.len();
        s.records.retain(|_, r| {
            if subtree {
                !r.record.from_uri.is_within(uri)
            } else {
                r.record.from_uri != *uri
            }
        });
        Ok((before - s.records.len()) as u64)
    }

    fn related(
        &self,
        uri: &CtxUri,
        relation_type: Option<&str>,
        direction: Direction,
        limit: usize,
    ) -> Result<Vec<RelationRecord>> {
        check_type_filter(relation_type)?;
        let mut out = self.state().select(|r| {
            direction.matches(r, uri) && relation_type.is_none_or(|t| r.relation_type == t)
        });
        rank(&mut out, limit);
        Ok(out)
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>> {
        Ok(self.state().select(|r| r.from_uri.is_within(uri)))
    }

    fn list_targeting(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>> {
        Ok(self.state().select(|r| r.to_uri.is_within(uri)))
    }

    fn owner_version(&self, owner: &CtxUri) -> Result<Option<OwnerVersion>> {
        Ok(self.state().owners.get(owner).copied())
    }

    fn count(&self) -> Result<u64> {
        Ok(self.state().records.len() as u64)
    }

    fn clear(&self) -> Result<()> {
        *self.state() = State::default();
        Ok(())
    }
}
