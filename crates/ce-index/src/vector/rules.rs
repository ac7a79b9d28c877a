//! The pure rules every vector index implementation shares, so there is one definition of
//! each: the precision a vector is kept at ([`kept`]), scoring ([`cosine`]) and result order
//! ([`rank`]), the checks of vectors, queries and
//! the model binding, and the version an unversioned upsert stores.

use ce_core::IndexRecord;
use ce_embed::ModelIdentity;
use numkong::Angular as _;
use serde_json::Value;

use super::VectorHit;
use crate::error::{IndexError, Result, invalid};

/// Cosine similarity of `a` and `b` (equal lengths), the score every implementation reports.
pub(super) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    // numkong's SIMD kernel (built at opt-level 3) keeps exact scans fast even in debug builds.
    f32::angular(a, b).map_or(f32::NAN, |d| (1.0 - d) as f32)
}

/// The vector an index keeps for `v`: rounded to half precision ([`ce_embed::half`]), as the
/// embedded index stores it. Every implementation keeps — and scores — this, so that all of
/// them agree on every score; the embedding cache returns vectors already rounded so (the
/// rounding is idempotent).
pub(super) fn kept(v: &[f32]) -> Vec<f32> {
    ce_embed::half::round(v)
}

/// Sorts hits best first — score descending, then id ascending so ties are deterministic —
/// and keeps `top_k`.
pub(super) fn rank(hits: &mut Vec<VectorHit>, top_k: usize) {
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.record.id.cmp(&b.record.id))
    });
    hits.truncate(top_k);
}

/// The source version a record carries in `metadata.node_version` (0 when absent): what an
/// unversioned [`VectorIndex::upsert`] stores as the record's version.
pub(super) fn metadata_version(r: &IndexRecord) -> u64 {
    r.metadata
        .get("node_version")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The dimension vectors written to an index must have: the bound model's, else the one the
/// stored vectors have, else (first write) the vector's own. Also rejects empty or
/// non-finite vectors.
pub(super) fn check_vector(
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
pub(super) fn check_query(
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
pub(super) fn check_binding(
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

/// The text hash a record's metadata carries (`content_hash`, set by the projector).
pub(super) fn text_hash(r: &IndexRecord) -> Option<&str> {
    r.metadata.get("content_hash").and_then(|v| v.as_str())
}

/// Checks that a payload-only update (`vector: None`) of `new` may keep the vector stored
/// for its id, whose record's text hash is `stored`: not when the stored record is of another
/// text. The worker planned the update when the stored text was `new`'s; an older write of the
/// node that landed since (another worker's, admitted by VX1 as newer than what was stored)
/// holds another text's vector, which the new text must not keep. Retryable: the worker plans
/// again and embeds (found by the convergence simulation, 2026-12-05).
pub(super) fn check_kept(stored: Option<&str>, new: &IndexRecord) -> Result<()> {
    match (stored, text_hash(new)) {
        (Some(s), Some(n)) if s != n => Err(IndexError::Raced(format!(
            "record {} ({} level {}) holds the vector of another text now (rewritten since it \
             was read): embed its text",
            new.id, new.uri, new.level
        ))),
        _ => Ok(()),
    }
}

/// The error of a payload-only update (`vector: None`) for a record with no stored vector:
/// the worker planned it from a stored vector that another worker has since moved or removed
/// (back-to-back moves of one subtree on two workers), so it is retried and planned again.
pub(super) fn missing_vector(r: &IndexRecord) -> IndexError {
    IndexError::Raced(format!(
        "record {} ({} level {}) has no stored vector to keep (moved or removed since it was \
         read): embed its text",
        r.id, r.uri, r.level
    ))
}
