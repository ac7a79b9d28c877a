//! The approximate-nearest-neighbour graph: a usearch HNSW index (cosine, `f32`) held in
//! memory, keyed by the `key` column of `records`, plus its snapshot files.
//!
//! The graph is derived state: it can always be rebuilt from the stored vectors. Snapshots
//! make reopening cheap. They rest on one invariant, **AK1**: a key is bound to one vector for
//! ever (keys are never reused; a record whose vector changes gets a new key). So a snapshot
//! of any earlier state of the same database is correct for every key it shares with the
//! database, and is brought up to date by removing the keys the database no longer has and
//! adding the ones it gained. A snapshot is a pair of files named by the database id and
//! generation — `ann-{db_id}-{generation}.usearch` (the graph) and `.keys` (its key set) —
//! and is used only if `meta.snapshot_generation` names it, which is written after both
//! files are durable: a file of another lineage (e.g. next to a database restored from a
//! backup) is never trusted. Files are written to a temporary name, fsynced and renamed.
//! They are loaded with `load` (a copy in RAM), never `view` (mmap): usearch has an open
//! memory-corruption report for `view` combined with filtered search.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use super::EmbeddedOptions;
use crate::error::{IndexError, Result};

/// Extra usearch thread contexts beyond the CPU count, for concurrent searches.
const SEARCH_CONTEXTS: usize = 32;

fn err(what: &str, e: impl std::fmt::Display) -> IndexError {
    IndexError::Unavailable(format!("ann {what}: {e}"))
}

/// The HNSW graph.
pub(super) struct Ann {
    /// Shared with the graph inserter, which adds to it outside the state lock (usearch
    /// supports concurrent insertion and search; capacity is reserved under the lock first).
    index: Arc<Index>,
    dimension: usize,
    /// Removed keys whose slots have not been reused by an add since the last build.
    tombstones: usize,
}

impl std::fmt::Debug for Ann {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ann")
            .field("dimension", &self.dimension)
            .field("size", &self.index.size())
            .field("tombstones", &self.tombstones)
            .finish()
    }
}

impl Ann {
    /// An empty graph for vectors of `dimension`.
    pub(super) fn new(dimension: usize, o: &EmbeddedOptions) -> Result<Self> {
        let options = IndexOptions {
            dimensions: dimension,
            metric: MetricKind::Cos,
            quantization: ScalarKind::F32,
            connectivity: o.connectivity,
            expansion_add: o.expansion_add,
            expansion_search: o.expansion_search,
            multi: false,
        };
        let index = Arc::new(Index::new(&options).map_err(|e| err("create", e))?);
        let ann = Ann {
            index,
            dimension,
            tombstones: 0,
        };
        ann.reserve(1024)?;
        Ok(ann)
    }

    fn reserve(&self, capacity: usize) -> Result<()> {
        self.index
            .reserve_capacity_and_threads(capacity, ce_core::parallel::threads() + SEARCH_CONTEXTS)
            .map_err(|e| err("reserve", e))
    }

    /// Vector dimension.
    pub(super) fn dimension(&self) -> usize {
        self.dimension
    }

    /// Number of live vectors.
    pub(super) fn len(&self) -> usize {
        self.index.size()
    }

    /// Removed slots not yet reused.
    pub(super) fn tombstones(&self) -> usize {
        self.tombstones
    }

    /// Adds vectors under fresh keys, on all cores when the batch is large.
    pub(super) fn add(&mut self, items: &[(u64, &[f32])]) -> Result<()> {
        self.reserve_for(items.len())?;
        self.shared().add(items, &AtomicBool::new(false))?;
        self.note_added(items.len());
        Ok(())
    }

    /// Makes room for `n` more vectors (call with the state lock held exclusively: usearch
    /// must not grow while another thread adds or searches).
    pub(super) fn reserve_for(&self, n: usize) -> Result<()> {
        let needed = self.index.size() + self.tombstones + n;
        if needed > self.index.capacity() {
            self.reserve(needed.max(self.index.capacity() * 2))?;
        }
        Ok(())
    }

    /// Accounts for `n` vectors added through [`Ann::shared`] (they may reuse removed slots).
    pub(super) fn note_added(&mut self, n: usize) {
        self.tombstones = self.tombstones.saturating_sub(n);
    }

    /// A handle that adds vectors without `&mut` (see [`SharedGraph::add`]).
    pub(super) fn shared(&self) -> SharedGraph {
        SharedGraph {
            index: Arc::clone(&self.index),
            dimension: self.dimension,
        }
    }

    /// Removes `key` (absent keys are ignored).
    pub(super) fn remove(&mut self, key: u64) -> Result<()> {
        let n = self.index.remove(key).map_err(|e| err("remove", e))?;
        self.tombstones += n;
        Ok(())
    }

    /// Whether `key` is in the graph.
    pub(super) fn contains(&self, key: u64) -> bool {
        self.index.contains(key)
    }

    /// Copies the vector of `key` into `buf` (of the graph's dimension); false when absent.
    pub(super) fn get(&self, key: u64, buf: &mut [f32]) -> bool {
        matches!(self.index.get(key, buf), Ok(n) if n > 0)
    }

    /// Up to `k` approximate nearest keys.
    pub(super) fn search(&self, query: &[f32], k: usize) -> Result<Vec<u64>> {
        self.index
            .search(query, k)
            .map(|m| m.keys)
            .map_err(|e| err("search", e))
    }

    /// Up to `k` approximate nearest keys among those `admit` accepts.
    pub(super) fn filtered_search(
        &self,
        query: &[f32],
        k: usize,
        admit: impl Fn(u64) -> bool,
    ) -> Result<Vec<u64>> {
        self.index
            .filtered_search(query, k, admit)
            .map(|m| m.keys)
            .map_err(|e| err("filtered search", e))
    }

    /// Writes the graph to `path` atomically (temporary file, fsync, rename).
    pub(super) fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("usearch.tmp");
        self.index
            .save(utf8(&tmp)?)
            .map_err(|e| err(&format!("save {}", tmp.display()), e))?;
        let f = fs_err::File::open(&tmp).map_err(|e| err("save", e))?;
        f.sync_all().map_err(|e| err("save", e))?;
        ce_core::failpoint::hit("vector.mid_snapshot");
        fs_err::rename(&tmp, path).map_err(|e| err("save", e))?;
        Ok(())
    }

    /// Loads a graph written by [`Ann::save`] (copied into RAM, not memory-mapped).
    pub(super) fn load(path: &Path, dimension: usize, o: &EmbeddedOptions) -> Result<Self> {
        let meta = Index::metadata(utf8(path)?)
            .map_err(|e| err(&format!("read {}", path.display()), e))?;
        if meta.dimensions != dimension as u64 {
            return Err(err(
                "load",
                format!(
                    "{} has dimension {}, the database {dimension}",
                    path.display(),
                    meta.dimensions
                ),
            ));
        }
        let ann = Ann::new(dimension, o)?;
        ann.index
            .load(utf8(path)?)
            .map_err(|e| err(&format!("load {}", path.display()), e))?;
        ann.index.change_expansion_add(o.expansion_add);
        ann.index.change_expansion_search(o.expansion_search);
        ann.reserve(ann.index.capacity().max(1024))?;
        Ok(Ann {
            tombstones: meta.count_deleted as usize,
            ..ann
        })
    }
}

/// A handle on a graph for insertion outside the state lock.
pub(super) struct SharedGraph {
    index: Arc<Index>,
    dimension: usize,
}

impl SharedGraph {
    /// Adds vectors under fresh keys, on all cores when the batch is large, until `stop` is
    /// set (checked every few vectors: the caller then finds out with `contains` which keys
    /// made it). Capacity must have been reserved ([`Ann::reserve_for`]); nothing else may
    /// remove from the graph meanwhile (removals wait for the insertion to end, see
    /// `embedded.rs`).
    pub(super) fn add<V: AsRef<[f32]> + Sync>(
        &self,
        items: &[(u64, V)],
        stop: &AtomicBool,
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        if let Some((k, v)) = items
            .iter()
            .find(|(_, v)| v.as_ref().len() != self.dimension)
        {
            return Err(err(
                "add",
                format!(
                    "key {k} has dimension {}, the graph holds {}",
                    v.as_ref().len(),
                    self.dimension
                ),
            ));
        }
        let index = &self.index;
        let add_all = |chunk: &[(u64, V)]| -> Result<()> {
            for (i, (k, v)) in chunk.iter().enumerate() {
                if i % 64 == 0 && stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                index.add(*k, v.as_ref()).map_err(|e| err("add", e))?;
            }
            Ok(())
        };
        ce_core::parallel::map_chunks(items, 256, add_all)
            .into_iter()
            .collect()
    }
}

fn utf8(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| err("path", format!("{} is not valid UTF-8", p.display())))
}

/// The graph file of the snapshot of `generation`.
pub(super) fn snapshot_path(dir: &Path, db_id: &str, generation: u64) -> PathBuf {
    dir.join(format!("ann-{db_id}-{generation}.usearch"))
}

/// The key-set file of the snapshot of `generation`.
pub(super) fn keys_path(dir: &Path, db_id: &str, generation: u64) -> PathBuf {
    dir.join(format!("ann-{db_id}-{generation}.keys"))
}

/// Writes `keys` (little-endian `u64`s) to `path` atomically.
pub(super) fn save_keys(path: &Path, keys: &[u64]) -> Result<()> {
    let tmp = path.with_extension("keys.tmp");
    let mut bytes = Vec::with_capacity(keys.len() * 8);
    for k in keys {
        bytes.extend_from_slice(&k.to_le_bytes());
    }
    fs_err::write(&tmp, &bytes).map_err(|e| err("save keys", e))?;
    fs_err::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| err("save keys", e))?;
    fs_err::rename(&tmp, path).map_err(|e| err("save keys", e))?;
    Ok(())
}

/// Reads a key set written by [`save_keys`].
pub(super) fn load_keys(path: &Path) -> Result<Vec<u64>> {
    let bytes = fs_err::read(path).map_err(|e| err("load keys", e))?;
    if !bytes.len().is_multiple_of(8) {
        return Err(err("load keys", format!("{} is truncated", path.display())));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

/// Fsyncs the directory (makes renames durable).
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    fs_err::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| err("sync directory", e))
}

/// Removes snapshot files (and leftovers of interrupted saves) except those of `keep`.
pub(super) fn remove_other_snapshots(dir: &Path, keep: Option<(&str, u64)>) -> Result<()> {
    let keep = keep.map(|(id, g)| format!("ann-{id}-{g}."));
    let entries = fs_err::read_dir(dir).map_err(|e| err("list snapshots", e))?;
    for entry in entries {
        let path = entry.map_err(|e| err("list snapshots", e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ours = name.starts_with("ann-")
            && [".usearch", ".keys", ".tmp"]
                .iter()
                .any(|x| name.ends_with(x));
        let kept = keep
            .as_deref()
            .is_some_and(|k| name.starts_with(k) && !name.ends_with(".tmp"));
        if ours && !kept {
            fs_err::remove_file(&path).map_err(|e| err("remove old snapshot", e))?;
        }
    }
    Ok(())
}
