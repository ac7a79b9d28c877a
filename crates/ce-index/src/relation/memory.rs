//! Exact in-memory relation index: the reference implementation of [`RelationIndex`].
//! Property tests run the same operations on it and on
//! [`super::embedded::EmbeddedRelationIndex`] and compare.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ce_core::CtxUri;

use super::{
    Direction, OwnerVersion, RelationIndex, RelationOutcome, RelationRecord, RelationWrite, by_key,
    check_owner, check_record, check_replace, check_type_filter, rank, stored,
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
    /// The records owned by `owner`, by id.
    fn owned(&self, owner: &CtxUri) -> Vec<RelationRecord> {
        self.records
            .values()
            .filter(|r| r.record.from_uri == *owner)
            .cloned()
            .collect()
    }

    /// Removes the records owned by `owner`; how many.
    fn remove_owned(&mut self, owner: &CtxUri) -> u64 {
        let before = self.records.len();
        self.records.retain(|_, r| r.record.from_uri != *owner);
        (before - self.records.len()) as u64
    }

    /// Applies one write (already checked).
    fn apply(&mut self, w: RelationWrite) -> RelationOutcome {
        match w {
            RelationWrite::Replace {
                owner,
                version,
                records,
            } => {
                if !OwnerVersion::admits_replace(self.owners.get(&owner).copied(), version) {
                    return RelationOutcome::Stale;
                }
                let mut new: Vec<RelationRecord> = records
                    .into_iter()
                    .map(|r| stored(r, version.relation_version))
                    .collect();
                new.sort_by(|a, b| a.record.id.cmp(&b.record.id));
                let same = self.owned(&owner) == new;
                if !same {
                    self.remove_owned(&owner);
                    for r in new {
                        self.records.insert(r.record.id.clone(), r);
                    }
                }
                self.owners.insert(owner, OwnerVersion::live(version));
                if same {
                    RelationOutcome::Unchanged
                } else {
                    RelationOutcome::Applied
                }
            }
            RelationWrite::Remove {
                owner,
                node_version,
            } => {
                if !OwnerVersion::admits_removal(self.owners.get(&owner).copied(), node_version) {
                    return RelationOutcome::Stale;
                }
                let removed = self.remove_owned(&owner);
                self.owners
                    .insert(owner, OwnerVersion::removed(node_version));
                changed(removed)
            }
            RelationWrite::Purge { owner } => changed(self.remove_owned(&owner)),
        }
    }
}

/// `Applied` when records were removed, else `Unchanged`.
pub(crate) fn changed(removed: u64) -> RelationOutcome {
    if removed > 0 {
        RelationOutcome::Applied
    } else {
        RelationOutcome::Unchanged
    }
}

/// Checks a write before it is applied.
pub(crate) fn check_write(w: &RelationWrite) -> Result<()> {
    match w {
        RelationWrite::Replace { owner, records, .. } => check_replace(owner, records),
        RelationWrite::Remove { owner, .. } => check_owner(owner),
        RelationWrite::Purge { .. } => Ok(()),
    }
}

impl MemoryRelationIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic cannot leave the state half-written: every write is checked first, then
        // mutates without fallible steps.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RelationIndex for MemoryRelationIndex {
    fn write_owners(&self, writes: Vec<RelationWrite>) -> Result<Vec<Result<RelationOutcome>>> {
        let mut s = self.state();
        Ok(writes
            .into_iter()
            .map(|w| {
                check_write(&w)?;
                Ok(s.apply(w))
            })
            .collect())
    }

    fn upsert_relations(&self, records: &[RelationRecord]) -> Result<()> {
        for r in records {
            check_record(&r.record)?;
        }
        let mut s = self.state();
        for r in records {
            let r = stored(r.record.clone(), r.relation_version);
            s.records.insert(r.record.id.clone(), r);
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
        let mut out: Vec<RelationRecord> = self
            .state()
            .records
            .values()
            .filter(|r| {
                direction.matches(&r.record, uri)
                    && relation_type.is_none_or(|t| r.record.relation_type == t)
            })
            .cloned()
            .collect();
        rank(&mut out, limit);
        Ok(out)
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>> {
        let mut out: Vec<RelationRecord> = self
            .state()
            .records
            .values()
            .filter(|r| r.record.from_uri.is_within(uri))
            .cloned()
            .collect();
        out.sort_by(by_key);
        Ok(out)
    }

    fn list_targeting(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>> {
        let mut out: Vec<RelationRecord> = self
            .state()
            .records
            .values()
            .filter(|r| r.record.to_uri.is_within(uri))
            .cloned()
            .collect();
        out.sort_by(by_key);
        Ok(out)
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
