//! Index records and the version rule every versioned index obeys.
//!
//! The worker writes each node's records as one versioned write computed from a source state;
//! every index (vector, keyword) keeps, per URI, the newest state it has seen
//! ([`SeenVersion`]) and applies a write only if that state admits it:
//!
//! - **VX1**: a write computed from an older state of a URI never overwrites one computed from
//!   a newer state. States are ordered `(v, live) < (v, deleted) < (v + 1, live)`: a removal at
//!   version `v` supersedes the live node at `v`, since source versions never repeat at a URI
//!   (a re-created node continues above its tombstone). A write applies iff the seen state is
//!   absent, older than `v`, or exactly `(v, live)` ([`SeenVersion::admits_write`]); a removal
//!   iff the seen version is at most `v` ([`SeenVersion::admits_removal`]). Writers applying
//!   the events of one URI in any order therefore converge on its newest state.
//!
//! Also here, shared by every implementation: the versions a move records
//! ([`move_versions`]), how a move rewrites a record ([`moved_record`], spec §6.3), the
//! checks of a move and of a node's records, and the order of a node read ([`of_nodes`]).

use std::collections::{BTreeMap, HashMap};

use ce_core::{CoreError, CtxUri, IndexRecord, PathDefaults, stable_hash};
use serde_json::Value;

use crate::error::{Result, invalid};

/// The newest version an index has seen for one URI (the state behind invariant VX1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenVersion {
    /// The source version.
    pub version: u64,
    /// Whether that version was a removal (a tombstone).
    pub deleted: bool,
}

impl SeenVersion {
    /// The node live at `version`.
    pub fn live(version: u64) -> Self {
        Self {
            version,
            deleted: false,
        }
    }

    /// The node removed at `version`.
    pub fn removed(version: u64) -> Self {
        Self {
            version,
            deleted: true,
        }
    }

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

/// Where an index keeps the [`SeenVersion`] of each URI.
pub(crate) trait SeenVersions {
    /// The newest state seen for `uri`.
    fn seen_version(&mut self, uri: &CtxUri) -> Result<Option<SeenVersion>>;
    /// Records `v` as the newest state of `uri`.
    fn set_seen_version(&mut self, uri: &CtxUri, v: SeenVersion) -> Result<()>;
}

impl SeenVersions for BTreeMap<CtxUri, SeenVersion> {
    fn seen_version(&mut self, uri: &CtxUri) -> Result<Option<SeenVersion>> {
        Ok(self.get(uri).copied())
    }

    fn set_seen_version(&mut self, uri: &CtxUri, v: SeenVersion) -> Result<()> {
        self.insert(uri.clone(), v);
        Ok(())
    }
}

/// The versions of one record that `move_uri` moves from URI `from` to `to`, computed from
/// node version `version`: `from` becomes `(its version, deleted)` (at least `version`);
/// then, if the state of `to` admits a write at `version`, `to` becomes live at least at
/// `version` and the answer is `true`; otherwise the record is dropped, not moved (`false`).
pub(crate) fn move_versions(
    versions: &mut impl SeenVersions,
    from: &CtxUri,
    to: &CtxUri,
    version: u64,
) -> Result<bool> {
    let src = versions.seen_version(from)?;
    versions.set_seen_version(
        from,
        SeenVersion::removed(src.map_or(0, |s| s.version).max(version)),
    )?;
    let target = versions.seen_version(to)?;
    if !SeenVersion::admits_write(target, version) {
        return Ok(false);
    }
    versions.set_seen_version(
        to,
        SeenVersion::live(target.map_or(0, |t| t.version).max(version)),
    )?;
    Ok(true)
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

/// Checks that every record of a versioned write of node `uri` belongs to it.
pub(crate) fn check_node_records<'r>(
    uri: &CtxUri,
    records: impl IntoIterator<Item = &'r IndexRecord>,
) -> Result<()> {
    match records.into_iter().find(|r| r.uri != *uri) {
        Some(r) => Err(invalid(
            "uri",
            format!(
                "record {} has uri {} but the node being synced is {uri}",
                r.id, r.uri
            ),
        )),
        None => Ok(()),
    }
}

/// A version for a signed 64-bit column (SQLite, PostgreSQL); above `i64::MAX` it is an
/// invalid `what`.
pub(crate) fn to_i64(v: u64, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| invalid("version", format!("{what} {v} exceeds the stored range")))
}

/// The entries among `entries` that belong to the nodes `uris` (by `node_level`: an entry's
/// URI and level), in the order every index's `get` returns them: node by node as asked (a
/// URI asked twice, twice), levels ascending.
pub(crate) fn of_nodes<'e, E>(
    entries: impl IntoIterator<Item = &'e E>,
    uris: &[CtxUri],
    node_level: impl Fn(&E) -> (&str, u8),
) -> Vec<&'e E> {
    let mut by_uri: HashMap<&str, Vec<&'e E>> =
        uris.iter().map(|u| (u.as_str(), Vec::new())).collect();
    for e in entries {
        if let Some(found) = by_uri.get_mut(node_level(e).0) {
            found.push(e);
        }
    }
    for found in by_uri.values_mut() {
        found.sort_by_key(|e| node_level(e).1);
    }
    uris.iter()
        .flat_map(|u| by_uri.get(u.as_str()).into_iter().flatten().copied())
        .collect()
}

/// A record's URI and level, as [`of_nodes`] takes them.
pub(crate) fn node_level(r: &IndexRecord) -> (&str, u8) {
    (r.uri.as_str(), r.level.as_u8())
}

/// The filters the projector copies from a record's own fields (`ce_core::projector`): the
/// embedded indexes store a record's filters without those that equal the field
/// ([`stored_filters`]) and put them back when they read it ([`restore_filters`]).
const FIELD_FILTERS: [&str; 5] = ["uri", "parent_uri", "level", "context_type", "category"];

/// The record fields behind [`FIELD_FILTERS`], in that order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FieldFilters<'a> {
    pub uri: &'a str,
    pub parent_uri: &'a str,
    pub level: u8,
    pub context_type: &'a str,
    pub category: &'a str,
}

impl<'a> FieldFilters<'a> {
    /// `r`'s fields.
    pub(crate) fn of(r: &'a IndexRecord) -> Self {
        FieldFilters {
            uri: r.uri.as_str(),
            parent_uri: r.parent_uri.as_str(),
            level: r.level.as_u8(),
            context_type: &r.context_type,
            category: &r.category,
        }
    }

    /// The value filter `FIELD_FILTERS[i]` has when it repeats its field.
    fn value(&self, i: usize) -> Value {
        match i {
            0 => Value::from(self.uri),
            1 => Value::from(self.parent_uri),
            2 => Value::from(self.level),
            3 => Value::from(self.context_type),
            _ => Value::from(self.category),
        }
    }
}

/// `r`'s filters as stored: without the entries that repeat the record's own fields, and the
/// bit mask (bit `i` for `FIELD_FILTERS[i]`) of those left out. Lossless:
/// [`restore_filters`] gives the filters back exactly (an entry that differs from its field is
/// kept as it is).
pub(crate) fn stored_filters(r: &IndexRecord) -> (BTreeMap<&str, &Value>, u8) {
    let fields = FieldFilters::of(r);
    let mut mask = 0u8;
    let filters = r
        .filters
        .iter()
        .filter(|(k, v)| {
            let Some(i) = FIELD_FILTERS.iter().position(|f| f == k) else {
                return true;
            };
            let repeats = **v == fields.value(i);
            if repeats {
                mask |= 1 << i;
            }
            !repeats
        })
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    (filters, mask)
}

/// Puts back into `filters` the entries [`stored_filters`] left out (`mask`), from the
/// record's `fields`.
pub(crate) fn restore_filters(
    filters: &mut BTreeMap<String, Value>,
    mask: u8,
    fields: FieldFilters<'_>,
) {
    for (i, key) in FIELD_FILTERS.iter().enumerate() {
        if mask & (1 << i) != 0 {
            filters.insert((*key).to_string(), fields.value(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use ce_core::Level;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Stored filters give back the record's filters exactly, whether each field filter
    /// repeats its field, differs from it (kept) or is absent.
    #[test]
    fn stored_filters_restore_exactly() {
        let seed = ce_testkit::seed("records::stored_filters_restore_exactly");
        let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(256), 1024);
        let choice = prop::collection::vec(0u8..3, FIELD_FILTERS.len());
        runner
            .run(&(choice, 0u8..3, "[a-z]{0,3}"), |(choice, level, extra)| {
                let uri = CtxUri::parse("ctx://acc/docs/a").expect("uri");
                let mut r = IndexRecord {
                    id: "id".into(),
                    parent_uri: uri.parent().expect("parent"),
                    uri,
                    context_type: "resource".into(),
                    category: extra.clone(),
                    level: Level::try_from(level).expect("level"),
                    text: "t".into(),
                    filters: BTreeMap::from([("group".into(), json!(extra))]),
                    metadata: BTreeMap::new(),
                };
                for (i, c) in choice.iter().enumerate() {
                    let own = FieldFilters::of(&r).value(i);
                    match c {
                        0 => None,
                        1 => r.filters.insert(FIELD_FILTERS[i].into(), own),
                        // Another value (a level as a string, a string with a suffix).
                        _ => r
                            .filters
                            .insert(FIELD_FILTERS[i].into(), json!(format!("{own}x"))),
                    };
                }
                let (stored, mask) = stored_filters(&r);
                let repeated = choice.iter().filter(|c| **c == 1).count();
                prop_assert_eq!(stored.len(), r.filters.len() - repeated);
                let mut back: BTreeMap<String, Value> = stored
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect();
                restore_filters(&mut back, mask, FieldFilters::of(&r));
                prop_assert_eq!(back, r.filters);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("CE_SEED={seed}: {e}"));
    }
}
