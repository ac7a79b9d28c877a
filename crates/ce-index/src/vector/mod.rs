//! The vector index contract (spec §6) and its implementations.
//!
//! Two layers of writes:
//! - the spec's contract — [`VectorIndex::upsert`], [`VectorIndex::delete_by_uri`],
//!   [`VectorIndex::move_uri`] — idempotent, stable ids, vectors kept on move;
//! - the worker's *versioned* writes — [`VectorIndex::sync_node`] and
//!   [`VectorIndex::remove_node`] — which replace (or remove) all records of one node only if
//!   the source state they were computed from is not older than the newest state the index
//!   has seen for that URI (invariant **VX1**, stated in [`crate::records`]);
//! - `move_uri` records the old URIs as `(their version, deleted)` and drops a moved record
//!   whose target URI already holds a newer state.
//!
//! The rules every implementation shares (scoring, result order, vector and model checks)
//! live in one private module, `rules`.
//!
//! Implementations: [`memory::MemoryVectorIndex`] (exact search, in memory: the test oracle),
//! [`embedded::EmbeddedVectorIndex`] (SQLite for records and vectors, usearch HNSW for
//! approximate search; persistent and crash-safe, one process) and
//! [`pgvector::PgVectorIndex`] (PostgreSQL with pgvector's HNSW index; shared by every
//! process that opens the database).

use std::collections::BTreeMap;

use ce_core::{CtxUri, IndexRecord, Level};
use ce_embed::ModelIdentity;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Result;

pub mod embedded;
pub mod memory;
pub mod pgvector;
mod rules;

pub use pgvector::{PgVectorIndex, PgVectorOptions};

/// A record with its vector (spec `IndexRecordWithVector`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VectorRecord {
    /// The record.
    pub record: IndexRecord,
    /// Its unit vector.
    pub vector: Vec<f32>,
}

/// One level of a node for [`VectorIndex::sync_node`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    /// The record (text, filters, metadata).
    pub record: IndexRecord,
    /// A fresh vector, or `None` to keep the stored vector of the same id (the text did not
    /// change: a payload-only update). `None` for an id that has no stored vector is an error.
    pub vector: Option<Vec<f32>>,
}

/// A stored record without its vector.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredRecord {
    /// The record as stored.
    pub record: IndexRecord,
    /// The source version it was computed from.
    pub node_version: u64,
}

/// A stored vector with the text hash (`metadata.content_hash`) of its record, both read from
/// the same row at once: a vector read apart from its record may already belong to a text
/// written since (another worker's write landing between the two reads).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredVector {
    /// The record's id.
    pub id: String,
    /// The hash of the text the vector embeds (`None` for a record written without one).
    pub text_hash: Option<String>,
    /// The vector.
    pub vector: Vec<f32>,
}

/// The distinct URIs of `records` (listed in URI order), in order.
pub(crate) fn uris_of(records: Vec<StoredRecord>) -> Vec<CtxUri> {
    let mut uris: Vec<CtxUri> = records.into_iter().map(|r| r.record.uri).collect();
    uris.dedup();
    uris
}

/// A search hit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VectorHit {
    /// The stored record.
    pub record: IndexRecord,
    /// Cosine similarity to the query (vectors are unit length), higher is closer.
    pub score: f32,
}

/// Outcome of a versioned write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SyncOutcome {
    /// The write was applied.
    Applied,
    /// The index already holds a newer version of this URI; nothing was written.
    Stale,
}

/// One versioned write of a batch: the worker's writes to the vector index
/// ([`VectorIndex::write_nodes`]) and to the keyword index
/// ([`crate::keyword::KeywordIndex::write_nodes`], which ignores [`NodeRecord::vector`]).
#[derive(Debug, Clone, PartialEq)]
pub enum NodeWrite {
    /// [`VectorIndex::sync_node`].
    Sync {
        /// The node.
        uri: CtxUri,
        /// The source version the records were computed from.
        version: u64,
        /// Its records.
        records: Vec<NodeRecord>,
    },
    /// [`VectorIndex::remove_node`].
    Remove {
        /// The node.
        uri: CtxUri,
        /// The source version at which it was deleted.
        version: u64,
    },
    /// Removes the records of a node the source has never stored (an orphan), like
    /// `delete_by_uri(uri, false)`; always [`SyncOutcome::Applied`].
    Purge {
        /// The node.
        uri: CtxUri,
    },
}

impl NodeWrite {
    /// The node written.
    pub fn uri(&self) -> &CtxUri {
        match self {
            NodeWrite::Sync { uri, .. }
            | NodeWrite::Remove { uri, .. }
            | NodeWrite::Purge { uri } => uri,
        }
    }

    /// Applies this write alone through the single-write methods.
    pub fn apply_to<I: VectorIndex + ?Sized>(&self, index: &I) -> Result<SyncOutcome> {
        match self {
            NodeWrite::Sync {
                uri,
                version,
                records,
            } => index.sync_node(uri, *version, records.clone()),
            NodeWrite::Remove { uri, version } => index.remove_node(uri, *version),
            NodeWrite::Purge { uri } => index
                .delete_by_uri(uri, false)
                .map(|_| SyncOutcome::Applied),
        }
    }
}

/// Search filters (spec §6.1 `filters`). All set fields must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SearchFilter {
    /// Only records whose URI is this URI or below it.
    pub subtree: Option<CtxUri>,
    /// Only direct children of this URI.
    pub parent_uri: Option<CtxUri>,
    /// Only this context type.
    pub context_type: Option<String>,
    /// Only this category.
    pub category: Option<String>,
    /// Only this level.
    pub level: Option<Level>,
    /// Only these owner spaces (any of them).
    pub owner_spaces: Option<Vec<String>>,
    /// Only this account.
    pub account_id: Option<String>,
    /// Flat metadata equality on `record.filters` keys.
    pub meta: BTreeMap<String, Value>,
}

impl SearchFilter {
    /// Whether `r` passes every set field (the reference semantics every implementation must
    /// agree with).
    pub fn matches(&self, r: &IndexRecord) -> bool {
        self.admits(&r.uri, &r.parent_uri, r.level) && self.admits_filters(&r.filters)
    }

    /// Whether no field is set, so that every record passes.
    pub fn is_unrestricted(&self) -> bool {
        *self == SearchFilter::default()
    }

    /// [`SearchFilter::matches`] on the parts of a record a filter reads (an index that
    /// stores records decodes only these to check a candidate).
    pub(crate) fn matches_view(&self, v: &FilterView) -> bool {
        self.admits(&v.uri, &v.parent_uri, v.level) && self.admits_filters(&v.filters)
    }

    /// The checks of the record's own fields.
    fn admits(&self, uri: &CtxUri, parent_uri: &CtxUri, level: Level) -> bool {
        self.subtree.as_ref().is_none_or(|s| uri.is_within(s))
            && self.parent_uri.as_ref().is_none_or(|p| parent_uri == p)
            && self.level.is_none_or(|l| level == l)
    }

    /// The checks of the record's filter scalars.
    fn admits_filters(&self, filters: &BTreeMap<String, Value>) -> bool {
        let f = |k: &str| filters.get(k);
        let str_eq = |k: &str, want: &Option<String>| {
            want.as_ref()
                .is_none_or(|w| f(k).and_then(Value::as_str) == Some(w.as_str()))
        };
        str_eq("context_type", &self.context_type)
            && str_eq("category", &self.category)
            && str_eq("account_id", &self.account_id)
            && self.owner_spaces.as_ref().is_none_or(|o| {
                f("owner_space")
                    .and_then(Value::as_str)
                    .is_some_and(|s| o.iter().any(|x| x == s))
            })
            && self.meta.iter().all(|(k, v)| f(k) == Some(v))
    }
}

/// The parts of an [`IndexRecord`] a [`SearchFilter`] reads, decoded from a stored record
/// without its text and descriptive metadata (unknown fields are skipped).
#[derive(Debug, Deserialize)]
pub(crate) struct FilterView {
    pub uri: CtxUri,
    pub parent_uri: CtxUri,
    pub level: Level,
    pub filters: BTreeMap<String, Value>,
}

/// Appends the canonical text of `v` to `out`: one text per value under
/// `serde_json::Value`'s equality, which [`SearchFilter::matches`] compares with. Numbers keep
/// their kind (`1` ≠ `1.0`, as in `Value`), `-0.0` equals `0.0`, object keys are sorted. The
/// embedded index's filter table interns it and the pgvector index stores it (its `pairs`
/// column): changing it changes stored data.
pub(crate) fn canonical_value(v: &Value, out: &mut String) {
    use std::fmt::Write as _;
    match v {
        Value::Null => out.push('n'),
        Value::Bool(b) => out.push(if *b { 't' } else { 'f' }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                let _ = write!(out, "u{u}");
            } else if let Some(i) = n.as_i64() {
                let _ = write!(out, "i{i}");
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                let f = if f == 0.0 { 0.0 } else { f };
                let _ = write!(out, "d{f:?}");
            }
        }
        Value::String(s) => {
            out.push('s');
            push_json_string(s, out);
        }
        Value::Array(a) => {
            out.push('[');
            for x in a {
                canonical_value(x, out);
                out.push(',');
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for k in keys {
                push_json_string(k, out);
                out.push(':');
                canonical_value(&m[k], out);
                out.push(',');
            }
            out.push('}');
        }
    }
}

/// Appends `s` as a JSON string literal (quoted and escaped: it delimits itself).
pub(crate) fn push_json_string(s: &str, out: &mut String) {
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// A vector index (spec §6, §11.4).
pub trait VectorIndex: Send + Sync {
    /// The model whose vectors the index holds, if any were written.
    fn model(&self) -> Result<Option<ModelIdentity>>;
    /// Binds the index to `model` on first use; a different model than the stored one is a
    /// non-retryable [`crate::IndexError::SchemaMismatch`] (never mix vector spaces).
    fn bind_model(&self, model: &ModelIdentity) -> Result<()>;

    /// Inserts or overwrites records by id (idempotent).
    fn upsert(&self, records: &[VectorRecord]) -> Result<()>;
    /// Removes the records of `uri` (all levels), and of its whole subtree when `subtree`;
    /// returns how many were removed. Removing nothing is not an error.
    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64>;
    /// Moves every record within `from` to the same place within `to` (spec §6.3): uri and
    /// parent_uri rewritten by prefix, ids re-keyed with `stable_hash(new_uri, level)`,
    /// vectors kept. Idempotent and re-entrant: nothing left under `from` counts as done.
    /// A record whose target URI already holds a newer version is dropped, not moved.
    /// Returns how many records moved.
    fn move_uri(&self, from: &CtxUri, to: &CtxUri) -> Result<u64>;
    /// The `top_k` records closest to `query` that pass `filter`, best first. When at least
    /// `top_k` records pass the filter, exactly `top_k` are returned.
    fn search(&self, query: &[f32], filter: &SearchFilter, top_k: usize) -> Result<Vec<VectorHit>>;

    /// Replaces all records of node `uri` with `records` (levels not given are removed) if
    /// `version` ≥ the newest version seen for `uri`; records the version.
    fn sync_node(
        &self,
        uri: &CtxUri,
        version: u64,
        records: Vec<NodeRecord>,
    ) -> Result<SyncOutcome>;
    /// Removes all records of node `uri` if `version` ≥ the newest version seen for `uri`;
    /// records the version as deleted.
    fn remove_node(&self, uri: &CtxUri, version: u64) -> Result<SyncOutcome>;
    /// Applies several versioned writes, each with the outcome it would have alone, in order.
    /// One write failing (e.g. a vector of the wrong dimension) fails only that write; the
    /// outer error means none was applied. Implementations make the batch one durable
    /// transaction where they can (the worker's throughput depends on it); the default
    /// applies the writes one by one.
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        Ok(writes.iter().map(|w| w.apply_to(self)).collect())
    }

    /// The stored records of the nodes `uris` (every level each holds), node by node in the
    /// order asked, levels ascending; a node the index holds nothing of adds nothing.
    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>>;
    /// The stored vectors of the nodes `uris` with their records' text hashes, in the order
    /// of [`VectorIndex::get`], e.g. for a moved node to reuse for the same text.
    fn vectors(&self, uris: &[CtxUri]) -> Result<Vec<StoredVector>>;
    /// Every stored record within `uri` (the root lists all), in (uri, level) order.
    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>>;
    /// The distinct URIs of the records within `uri`, in URI order: what a subtree sync
    /// must visit, without decoding the records.
    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        Ok(uris_of(self.list_under(uri)?))
    }
    /// Number of stored records.
    fn count(&self) -> Result<u64>;
    /// Removes every record, version and the model binding (for a rebuild).
    fn clear(&self) -> Result<()>;
    /// Ends a bulk load: builds what an index defers while it is loaded from empty (the
    /// pgvector index's HNSW index, [`PgVectorOptions::defer_graph`]). Called by the worker
    /// when its queue is empty (the end of a first import or of a reindex's rebuild);
    /// cheap when there is nothing to build. Searches are correct before it, only slower.
    fn finish_bulk(&self) -> Result<()> {
        Ok(())
    }
    /// Whether [`VectorIndex::finish_bulk`] may have something to build (cheap, no I/O).
    fn bulk_pending(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::{Value, canonical_value};
    use serde_json::json;

    #[test]
    fn canonical_values_follow_value_equality() {
        let canon = |v: &Value| {
            let mut out = String::new();
            canonical_value(v, &mut out);
            out
        };
        let cases = [
            (json!(1), json!(1), true),
            (json!(1), json!(1.0), false),
            (json!(-0.0), json!(0.0), true),
            (json!("a"), json!("a"), true),
            (json!("1"), json!(1), false),
            (
                json!({"a": 1, "b": [true]}),
                json!({"b": [true], "a": 1}),
                true,
            ),
            (json!(null), json!("n"), false),
        ];
        for (a, b, eq) in cases {
            assert_eq!(a == b, eq, "{a} vs {b}");
            assert_eq!(canon(&a) == canon(&b), eq, "{a} vs {b}");
        }
        // The form stored in pgvector's `pairs` column.
        assert_eq!(
            canon(&json!({"k\"": [1, -2, 0.5, -0.0, "x", null, false]})),
            r#"{"k\"":[u1,i-2,d0.5,d0.0,s"x",n,f,],}"#
        );
    }
}
