//! The relation index (spec §4.3, §6.2; DESIGN.md decision 8): the typed edges of the
//! source's `RelationStore`, kept by their *owner* (the `from` node), so that "what is related
//! to X" is answered in both directions without reading the source.
//!
//! - Records ([`RelationRecord`]) are the projector's [`RelationIndexRecord`] (stable id
//!   `stable_hash("{from}|{to}|{type}", 0)`, from/to URIs, type, weight, reason, account and
//!   owner space of the owner) plus the owner's `relation_version` they were read at.
//! - The worker writes one owner's **whole edge set** at a time ([`RelationWrite::Replace`]),
//!   removes an owner's edges when the source removed (or moved away) the owner
//!   ([`RelationWrite::Remove`]), and purges an owner the source never stored
//!   ([`RelationWrite::Purge`]). Writes come in batches with one outcome each
//!   ([`RelationIndex::write_owners`]), like the keyword index's node writes.
//!
//! # Versions (invariant RX1)
//!
//! The source gives every node a `version` that never repeats at a URI (a re-created or
//! moved-in node continues above the URI's tombstone) and a `relation_version` that bumps
//! with every change of its outgoing edges — but starts again at 0 for a new node. So
//! `relation_version` alone cannot order the states of a URI (rm, re-create and link go back
//! to 1), while the pair [`RelationVersion`] `(node_version, relation_version)` can: every
//! change of an owner's edge set raises it (a link or unlink raises the relation version, a
//! re-creation or a move raises the node version). With a removal at node version `v` sorting
//! after every live state at `v`, the states of a URI are ordered
//! `(v, r, live) < (v, r + 1, live) < (v, deleted) < (v + 1, any, live)`, and the index keeps,
//! per owner URI, the newest state it has applied ([`OwnerVersion`]):
//!
//! - **RX1**: a write computed from an older state of an owner never overwrites one computed
//!   from a newer state. A replace applies iff its version is at least the stored live version
//!   (replays are idempotent) or above a stored removal's node version; a removal applies iff
//!   its node version is at least the stored one ([`OwnerVersion::admits_replace`],
//!   [`OwnerVersion::admits_removal`]).
//!
//! Several workers applying events for the same owner in any order therefore converge on the
//! source's newest edge set.
//!
//! Implementations: [`memory::MemoryRelationIndex`] (the exact reference, in memory) and
//! [`embedded::EmbeddedRelationIndex`] (SQLite, persistent).

use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use ce_core::projector::relation_id;
use ce_core::{CoreError, CtxUri, node::validate_relation_type};
use serde::{Deserialize, Serialize};

use crate::error::{Result, invalid};

pub use ce_core::RelationIndexRecord;

pub mod embedded;
pub mod memory;

/// The version of one owner's edge set: its node version, then its relation version
/// (compared in that order; see the module documentation).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct RelationVersion {
    /// The owner node's `version`.
    pub node_version: u64,
    /// The owner node's `relation_version`.
    pub relation_version: u64,
}

impl fmt::Display for RelationVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.node_version, self.relation_version)
    }
}

/// The newest state of one owner URI an index has applied (the state behind invariant RX1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerVersion {
    /// The owner's node version.
    pub node_version: u64,
    /// The owner's relation version (0 for a removal).
    pub relation_version: u64,
    /// Whether that state is a removal (a tombstone).
    pub deleted: bool,
}

impl OwnerVersion {
    /// A live state at `v`.
    pub fn live(v: RelationVersion) -> Self {
        OwnerVersion {
            node_version: v.node_version,
            relation_version: v.relation_version,
            deleted: false,
        }
    }

    /// A removal at node version `node_version`.
    pub fn removed(node_version: u64) -> Self {
        OwnerVersion {
            node_version,
            relation_version: 0,
            deleted: true,
        }
    }

    /// The version of a live state.
    fn version(&self) -> RelationVersion {
        RelationVersion {
            node_version: self.node_version,
            relation_version: self.relation_version,
        }
    }

    /// Whether a replace of the owner's edge set computed at `v` may apply (RX1): versions at
    /// least as new as a live state apply (replays are idempotent); after a removal at node
    /// version `n`, only node versions above `n` do.
    pub fn admits_replace(stored: Option<Self>, v: RelationVersion) -> bool {
        match stored {
            None => true,
            Some(s) if s.deleted => v.node_version > s.node_version,
            Some(s) => v >= s.version(),
        }
    }

    /// Whether a removal at node version `node_version` may apply (RX1): it supersedes every
    /// state at that node version or below.
    pub fn admits_removal(stored: Option<Self>, node_version: u64) -> bool {
        stored.is_none_or(|s| node_version >= s.node_version)
    }
}

/// A stored relation record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelationRecord {
    /// The edge as projected (spec §4.3).
    #[serde(flatten)]
    pub record: RelationIndexRecord,
    /// The owner's relation version the edge set was read at.
    pub relation_version: u64,
}

/// The direction of [`RelationIndex::related`], seen from the URI asked about.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Edges from the URI (it owns them).
    Out,
    /// Edges into the URI.
    In,
    /// Both (an edge from the URI to itself appears once).
    #[default]
    Both,
}

impl Direction {
    /// `out`, `in` or `both`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Out => "out",
            Direction::In => "in",
            Direction::Both => "both",
        }
    }

    /// Whether `r` is an edge of `uri` in this direction.
    pub fn matches(self, r: &RelationIndexRecord, uri: &CtxUri) -> bool {
        match self {
            Direction::Out => r.from_uri == *uri,
            Direction::In => r.to_uri == *uri,
            Direction::Both => r.from_uri == *uri || r.to_uri == *uri,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Direction {
    type Err = CoreError;

    /// Parses `out`, `in` or `both` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, CoreError> {
        match s.to_ascii_lowercase().as_str() {
            "out" => Ok(Direction::Out),
            "in" => Ok(Direction::In),
            "both" => Ok(Direction::Both),
            _ => Err(CoreError::InvalidField {
                field: "direction",
                reason: format!("{s:?} is not one of out, in, both"),
            }),
        }
    }
}

/// One versioned write of a batch (see [`RelationIndex::write_owners`]).
#[derive(Debug, Clone, PartialEq)]
pub enum RelationWrite {
    /// Replaces every record owned by `owner` with `records` (an empty list removes them all)
    /// if `version` is admitted ([`OwnerVersion::admits_replace`]); records the version. Each
    /// record must be valid (see [`check_record`]), have `owner` as its `from_uri`, and
    /// appear once.
    Replace {
        /// The owner (the edges' `from` node).
        owner: CtxUri,
        /// The source state the edge set was read at.
        version: RelationVersion,
        /// The owner's edges.
        records: Vec<RelationIndexRecord>,
    },
    /// Removes every record owned by `owner` if `node_version` is admitted
    /// ([`OwnerVersion::admits_removal`]); records the removal.
    Remove {
        /// The owner.
        owner: CtxUri,
        /// The node version at which the source removed (or moved away) the owner.
        node_version: u64,
    },
    /// Removes the records of an owner the source has never stored (an orphan), like
    /// `delete_relations_by_uri(owner, false)`; never stale, versions untouched.
    Purge {
        /// The owner.
        owner: CtxUri,
    },
}

impl RelationWrite {
    /// The owner written.
    pub fn owner(&self) -> &CtxUri {
        match self {
            RelationWrite::Replace { owner, .. }
            | RelationWrite::Remove { owner, .. }
            | RelationWrite::Purge { owner } => owner,
        }
    }
}

/// Outcome of one [`RelationWrite`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RelationOutcome {
    /// The write was admitted and changed the owner's records.
    Applied,
    /// The write was admitted (its version is recorded) but the owner's records already were
    /// exactly these: no record changed.
    Unchanged,
    /// The index already holds a newer state of this owner; nothing was written.
    Stale,
}

/// A relation index.
pub trait RelationIndex: Send + Sync {
    /// Applies several versioned writes in order, each with the outcome it would have alone.
    /// One write failing (invalid input) fails only that write and changes nothing of it; the
    /// outer error means none was applied. The embedded implementation makes the batch one
    /// durable transaction.
    fn write_owners(&self, writes: &[RelationWrite]) -> Result<Vec<Result<RelationOutcome>>>;
    /// Inserts or overwrites records by id (spec §6.2 `upsert_relations`; idempotent,
    /// unversioned). Every record is checked first: one invalid record fails the call and
    /// nothing is written.
    fn upsert_relations(&self, records: &[RelationRecord]) -> Result<()>;
    /// Removes the records owned by `uri`, and by every owner within its subtree when
    /// `subtree` (spec §6.2 `delete_relations_by_uri`); returns how many were removed.
    /// Removing nothing is not an error. Owner versions are kept.
    fn delete_relations_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64>;
    /// The edges of `uri` in `direction`, only of `relation_type` when given: at most `limit`,
    /// strongest first (weight descending, then `(from_uri, to_uri, relation_type)`
    /// ascending). An invalid `relation_type` is an error.
    fn related(
        &self,
        uri: &CtxUri,
        relation_type: Option<&str>,
        direction: Direction,
        limit: usize,
    ) -> Result<Vec<RelationRecord>>;
    /// Every record whose owner (`from_uri`) is `uri` or lies below it (the root lists all),
    /// in `(from_uri, to_uri, relation_type)` order.
    fn list_under(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>>;
    /// Every record whose target (`to_uri`) is `uri` or lies below it, in
    /// `(from_uri, to_uri, relation_type)` order.
    fn list_targeting(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>>;
    /// The newest state of `owner` the index has applied, if any.
    fn owner_version(&self, owner: &CtxUri) -> Result<Option<OwnerVersion>>;
    /// Number of stored records.
    fn count(&self) -> Result<u64>;
    /// Removes every record and owner version (for a rebuild).
    fn clear(&self) -> Result<()>;
}

/// Checks one record: a valid relation type, a finite weight, an owner that is not the root,
/// and the stable id of its `(from, to, type)`.
pub fn check_record(r: &RelationIndexRecord) -> Result<()> {
    validate_relation_type(&r.relation_type)?;
    if !r.weight.is_finite() {
        return Err(invalid(
            "weight",
            format!("weight of relation {} is not a finite number", r.id),
        ));
    }
    if r.from_uri.is_root() {
        return Err(invalid(
            "from_uri",
            "the root ctx:// owns no relations".into(),
        ));
    }
    let want = relation_id(&r.from_uri, &r.to_uri, &r.relation_type);
    if r.id != want {
        return Err(invalid(
            "id",
            format!(
                "relation {} -[{}]-> {} has id {:?}, its stable id is {want}",
                r.from_uri, r.relation_type, r.to_uri, r.id
            ),
        ));
    }
    Ok(())
}

/// Checks a replace of `owner`'s edge set: every record valid, owned by `owner`, once.
pub(crate) fn check_replace(owner: &CtxUri, records: &[RelationIndexRecord]) -> Result<()> {
    check_owner(owner)?;
    let mut ids = HashSet::with_capacity(records.len());
    for r in records {
        check_record(r)?;
        if r.from_uri != *owner {
            return Err(invalid(
                "from_uri",
                format!(
                    "relation {} is owned by {} but the owner being replaced is {owner}",
                    r.id, r.from_uri
                ),
            ));
        }
        if !ids.insert(r.id.as_str()) {
            return Err(invalid(
                "id",
                format!("relation {} appears twice in the edge set of {owner}", r.id),
            ));
        }
    }
    Ok(())
}

/// Checks a write before it is applied.
pub(crate) fn check_write(w: &RelationWrite) -> Result<()> {
    match w {
        RelationWrite::Replace { owner, records, .. } => check_replace(owner, records),
        RelationWrite::Remove { owner, .. } => check_owner(owner),
        RelationWrite::Purge { .. } => Ok(()),
    }
}

/// Checks the owner of a versioned write: the root is never a node.
pub(crate) fn check_owner(owner: &CtxUri) -> Result<()> {
    if owner.is_root() {
        return Err(invalid("uri", "the root ctx:// owns no relations".into()));
    }
    Ok(())
}

/// Checks the type filter of a query.
pub(crate) fn check_type_filter(relation_type: Option<&str>) -> Result<()> {
    match relation_type {
        Some(t) => Ok(validate_relation_type(t)?),
        None => Ok(()),
    }
}

/// What an implementation stores per owner: its records and its newest applied state.
/// [`apply_write`] is the write rule (RX1) over it, once for every implementation.
pub(crate) trait OwnerStore {
    /// The newest state of `owner` applied, if any.
    fn owner_version(&self, owner: &CtxUri) -> Result<Option<OwnerVersion>>;
    /// Records `v` as the newest state of `owner`.
    fn set_owner_version(&mut self, owner: &CtxUri, v: OwnerVersion) -> Result<()>;
    /// The records owned by `owner`, by id.
    fn owned(&self, owner: &CtxUri) -> Result<Vec<RelationRecord>>;
    /// Removes the records owned by `owner`; how many.
    fn remove_owned(&mut self, owner: &CtxUri) -> Result<u64>;
    /// Inserts or replaces (by id) record `r`.
    fn put(&mut self, r: RelationRecord) -> Result<()>;
}

/// Applies one checked write ([`check_write`]) to `s`: stale unless its version is admitted
/// (RX1); `Unchanged` when the owner's records already were exactly the new ones.
pub(crate) fn apply_write(s: &mut impl OwnerStore, w: RelationWrite) -> Result<RelationOutcome> {
    // `Applied` when records were removed, else `Unchanged`.
    let changed = |removed: u64| {
        if removed > 0 {
            RelationOutcome::Applied
        } else {
            RelationOutcome::Unchanged
        }
    };
    match w {
        RelationWrite::Replace {
            owner,
            version,
            records,
        } => {
            if !OwnerVersion::admits_replace(s.owner_version(&owner)?, version) {
                return Ok(RelationOutcome::Stale);
            }
            let mut new: Vec<RelationRecord> = records
                .into_iter()
                .map(|r| stored(r, version.relation_version))
                .collect();
            new.sort_by(|a, b| a.record.id.cmp(&b.record.id));
            let same = s.owned(&owner)? == new;
            if !same {
                s.remove_owned(&owner)?;
                for r in new {
                    s.put(r)?;
                }
            }
            s.set_owner_version(&owner, OwnerVersion::live(version))?;
            Ok(if same {
                RelationOutcome::Unchanged
            } else {
                RelationOutcome::Applied
            })
        }
        RelationWrite::Remove {
            owner,
            node_version,
        } => {
            if !OwnerVersion::admits_removal(s.owner_version(&owner)?, node_version) {
                return Ok(RelationOutcome::Stale);
            }
            let removed = s.remove_owned(&owner)?;
            s.set_owner_version(&owner, OwnerVersion::removed(node_version))?;
            Ok(changed(removed))
        }
        RelationWrite::Purge { owner } => Ok(changed(s.remove_owned(&owner)?)),
    }
}

/// The record as stored: `-0.0` weights become `0.0` (SQLite does not keep the sign of
/// zero), so every implementation stores the same value.
pub(crate) fn stored(mut record: RelationIndexRecord, relation_version: u64) -> RelationRecord {
    record.weight += 0.0;
    RelationRecord {
        record,
        relation_version,
    }
}

/// The order of listings: `(from_uri, to_uri, relation_type)`.
pub(crate) fn by_key(a: &RelationRecord, b: &RelationRecord) -> Ordering {
    fn key(r: &RelationRecord) -> (&str, &str, &str) {
        (
            r.record.from_uri.as_str(),
            r.record.to_uri.as_str(),
            r.record.relation_type.as_str(),
        )
    }
    key(a).cmp(&key(b))
}

/// Sorts `related` answers strongest first — weight descending, then [`by_key`] — and keeps
/// `limit`.
pub(crate) fn rank(records: &mut Vec<RelationRecord>, limit: usize) {
    records.sort_by(|a, b| {
        b.record
            .weight
            .total_cmp(&a.record.weight)
            .then_with(|| by_key(a, b))
    });
    records.truncate(limit);
}

#[cfg(test)]
mod tests;
