//! Helpers of the vector-index suites: records shaped like the projector's, both
//! implementations behind one runner, seeds and whole-index snapshots.

use std::collections::BTreeMap;
use std::path::Path;

use ce_core::{CtxUri, IndexRecord, Level, PathDefaults, stable_hash};
use ce_index::vector::embedded::{EmbeddedOptions, EmbeddedVectorIndex};
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{NodeRecord, SearchFilter, StoredRecord, VectorIndex, VectorRecord};
use serde_json::{Value, json};

/// Parses a URI literal.
pub fn uri(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("valid uri literal")
}

pub use ce_testkit::seed;

/// A record of `uri` at `level` with the projector's filter fields (path defaults) plus
/// `extra` flat metadata filters.
pub fn record(uri_s: &str, level: u8, extra: &[(&str, Value)]) -> IndexRecord {
    let u = uri(uri_s);
    let parent = u.parent().expect("not the root");
    let d = PathDefaults::of(&u);
    let mut filters: BTreeMap<String, Value> = extra
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    filters.insert("uri".into(), json!(u.as_str()));
    filters.insert("parent_uri".into(), json!(parent.as_str()));
    filters.insert("context_type".into(), json!(d.context_type.as_str()));
    filters.insert("category".into(), json!(d.category));
    filters.insert("level".into(), json!(level));
    filters.insert("owner_space".into(), json!(d.owner_space.to_string()));
    filters.insert("account_id".into(), json!(u.account_id()));
    IndexRecord {
        id: stable_hash(u.as_str(), level),
        uri: u.clone(),
        parent_uri: parent,
        context_type: d.context_type.as_str().to_owned(),
        category: d.category,
        level: Level::try_from(level).expect("level"),
        text: format!("text of {u} L{level}"),
        filters,
        metadata: BTreeMap::from([("node_version".to_owned(), json!(1))]),
    }
}

/// [`record`] with a vector.
pub fn vr(uri_s: &str, level: u8, vector: Vec<f32>) -> VectorRecord {
    VectorRecord {
        record: record(uri_s, level, &[]),
        vector,
    }
}

/// A node record for `sync_node`.
pub fn nr(uri_s: &str, level: u8, vector: Option<Vec<f32>>) -> NodeRecord {
    NodeRecord {
        record: record(uri_s, level, &[]),
        vector,
    }
}

/// A deterministic unit vector of dimension `dim` for `i` (distinct `i`, distinct vectors).
pub fn unit(i: u64, dim: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..dim)
        .map(|j| {
            let x = (i
                .wrapping_mul(2_654_435_761)
                .wrapping_add(j as u64 * 40_503))
                % 1000;
            x as f32 / 1000.0 - 0.5
        })
        .collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

/// Dimension of the contract suites' vectors.
pub const DIM: usize = 8;

/// Runs `f` against the exact in-memory index and the embedded index (in a fresh directory,
/// with default options and with the planner forced onto the graph), naming each.
pub fn both(mut f: impl FnMut(&str, &dyn VectorIndex)) {
    f("memory", &MemoryVectorIndex::new());
    let dir = tempfile::tempdir().expect("tempdir");
    let e = EmbeddedVectorIndex::open(dir.path()).expect("open embedded");
    f("embedded", &e);
    e.check_consistency()
        .expect("graph agrees with the records");
    drop(e);
    let dir = tempfile::tempdir().expect("tempdir");
    let e = EmbeddedVectorIndex::open_with(dir.path(), graph_only()).expect("open embedded");
    f("embedded-graph", &e);
    e.check_consistency()
        .expect("graph agrees with the records");
}

/// Options that send every filtered search through the graph.
pub fn graph_only() -> EmbeddedOptions {
    EmbeddedOptions {
        exact_max_candidates: 0,
        exact_max_fraction: 0.0,
        ..EmbeddedOptions::default()
    }
}

/// Opens an embedded index in `dir`.
pub fn open(dir: &Path) -> EmbeddedVectorIndex {
    EmbeddedVectorIndex::open(dir).expect("open embedded index")
}

/// Every stored record, as comparable text lines (id, uri, parent, level, version, filters).
pub fn snapshot(idx: &dyn VectorIndex) -> Vec<StoredRecord> {
    idx.list_under(&CtxUri::root()).expect("list_under root")
}

/// Ids of `search` hits.
pub fn hit_ids(idx: &dyn VectorIndex, q: &[f32], f: &SearchFilter, k: usize) -> Vec<String> {
    idx.search(q, f, k)
        .expect("search")
        .into_iter()
        .map(|h| h.record.id)
        .collect()
}
