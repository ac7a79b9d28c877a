//! Row-agnostic pieces both backends share: column lists, decoding of stored text, subtree
//! bounds and event payload builders. Backend modules hold only their SQL and bindings.

use ce_core::{ContextType, CtxUri, Layers, Meta, OwnerSpace, Provenance};

use crate::error::{Result, StoreError};

/// Bounds of the strict descendants of `uri` in binary collation: `(lo, hi)` exclusive.
pub(crate) fn subtree_bounds(uri: &CtxUri) -> (String, String) {
    if uri.is_root() {
        ("ctx://".to_owned(), "ctx:/0".to_owned())
    } else {
        (format!("{uri}/"), format!("{uri}0"))
    }
}

/// The columns of `nodes` in the order [`decode_node`]'s callers read them.
pub(crate) const NODE_COLUMNS: &str = "uri, parent_uri, context_type, category, owner_space, \
     abstract, overview, content, meta, version, content_hash, relation_version, created_at, \
     updated_at, trace_id, provenance";

/// Parses a stored node URI; one that does not parse is corruption.
pub(crate) fn stored_uri(s: &str) -> Result<CtxUri> {
    CtxUri::parse_stored(s).map_err(|e| StoreError::Corrupt(format!("node uri {s:?}: {e}")))
}

/// A node's typed columns decoded from their stored text.
pub(crate) type Decoded = (CtxUri, CtxUri, ContextType, OwnerSpace, Meta);

/// Decodes the text columns of a stored node; a value that does not parse is corruption.
pub(crate) fn decode_node(
    uri: String,
    parent: String,
    t: String,
    o: String,
    meta: String,
) -> Result<Decoded> {
    let corrupt = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!("node {uri:?}: bad {what}: {e}"))
    };
    let u = CtxUri::parse_stored(&uri).map_err(|e| corrupt("uri", &e))?;
    let p = CtxUri::parse_stored(&parent).map_err(|e| corrupt("parent_uri", &e))?;
    let t: ContextType = t.parse().map_err(|e| corrupt("context_type", &e))?;
    let o: OwnerSpace = o.parse().map_err(|e| corrupt("owner_space", &e))?;
    let m: Meta = serde_json::from_str(&meta).map_err(|e| corrupt("meta", &e))?;
    Ok((u, p, t, o, m))
}

/// Decodes a node's stored provenance; a row written before provenance existed (`NULL`)
/// reads as [`Provenance::legacy`]: its layers with text were the client's.
pub(crate) fn decode_provenance(
    uri: &str,
    stored: Option<String>,
    layers: &Layers,
) -> Result<Provenance> {
    match stored {
        None => Ok(Provenance::legacy(&layers.abstract_text, &layers.overview)),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("node {uri:?}: bad provenance: {e}"))),
    }
}

/// A child as a folder's derivation reads it, from its stored URI, its (cut) layers and its
/// stored provenance.
pub(crate) fn derive_child(
    uri: String,
    layers: Layers,
    provenance: Option<String>,
) -> Result<crate::derive::DeriveChild> {
    Ok(crate::derive::DeriveChild {
        provenance: decode_provenance(&uri, provenance, &layers)?,
        uri: stored_uri(&uri)?,
        layers,
    })
}

/// A node's provenance as stored.
pub(crate) fn encode_provenance(p: &Provenance) -> Result<String> {
    Ok(serde_json::to_string(p)?)
}

/// A stored dirty key (`uri, coalesce_version, derived_version, dirtied_at`).
pub(crate) fn dirty_key(uri: String, cv: i64, dv: i64, at: i64) -> Result<crate::derive::DirtyKey> {
    Ok(crate::derive::DirtyKey {
        uri: CtxUri::parse_stored(&uri)
            .map_err(|e| StoreError::Corrupt(format!("dirty key {uri:?}: {e}")))?,
        coalesce_version: cv as u64,
        derived_version: dv as u64,
        dirtied_at_ms: at,
    })
}
