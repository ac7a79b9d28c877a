//! The approximate-nearest-neighbour graph: a usearch HNSW index (cosine) held in memory,
//! keyed by the `key` column of `records`, plus its snapshot files.
//!
//! The graph keeps its own copy of each vector **normalised to unit length and rounded to
//! `f16`** ([`STORED`]): half the memory and snapshot bytes of `f32`, and a faster build
//! (measured in docs/benchmarks.md), for recall@10 within the run-to-run spread. Normalising
//! first keeps every component in [-1, 1], where `f16` has a relative precision of 2⁻¹¹
//! whatever the caller's scale; so a cosine computed on the graph's copy is within
//! [`SCORE_ERROR`] of the one on the stored `f32` vector, and searches rescore their
//! shortlist with the stored vectors (see `embedded.rs`). The `f32` vectors in `vectors.db`
//! stay the truth.
//!
//! The graph is derived state: it can always be rebuilt from the stored vectors. Snapshots
//! make reopening cheap. They rest on one invariant, **AK1**: a key is bound to one vector for
//! ever (keys are never reused; a record whose vector changes gets a new key). So a snapshot
//! of any earlier state of the same database is correct for every key it shares with the
//! database, and is brought up to date by removing the keys the database no longer has and
//! adding the ones it gained. A snapshot is one file named by the database id and generation,
//! `ann-{db_id}-{generation}.usearch`, whose slots name the graph's keys, and is used only if
//! `meta.snapshot_generation` names it, which is written after the file is durable: a file
//! of another lineage (e.g. next to a database restored from a backup) is never trusted. The
//! file is written to a temporary name, fsynced and renamed. (Until 2026-12-07 a second file,
//! `.keys`, listed the same key set; one left by an earlier version is removed.)
//!
//! The graph file holds **no live vector** (they are in `vectors.db`): it is usearch's
//! serialization with its vector matrix cut out but for removed slots ([`Ann::save`],
//! [`Serialized`]); loading reads it into a [`Snapshot`], which streams it into usearch with
//! the stored vectors put back (into usearch's own memory, never `view`'s mmap: usearch has an
//! open memory-corruption report for `view` combined with filtered search). Both directions
//! stream through a pipe: neither holds the serialization whole.

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use super::EmbeddedOptions;
use crate::error::{IndexError, Result};

/// Extra usearch thread contexts beyond the CPU count, for concurrent searches.
const SEARCH_CONTEXTS: usize = 32;

/// Vectors from which [`Ann::add`] inserts on all cores (below, on the calling thread).
const PARALLEL_ADD_FROM: usize = 1024;

/// Vectors a thread of a parallel [`SharedGraph::add`] takes at a time (and checks its stop
/// flag between).
const ADD_GRAIN: usize = 64;

/// How the graph stores a vector (after normalising it).
const STORED: ScalarKind = ScalarKind::F16;

/// A bound on |cos(q, graph copy of v) − cos(q, v)| for any query `q` and stored vector `v`.
/// The graph's copy is `v / |v|` rounded to `f16`: each component is off by at most 2⁻¹¹ of
/// itself (below 2⁻¹⁴, the subnormal range, by at most 2⁻²⁵), so the dot product with `q` moves
/// by at most 2⁻¹¹·|q| and the norm by at most 2⁻¹¹ — about 2·2⁻¹¹ ≈ 1e-3 on the cosine, plus
/// the `f32` rounding of the kernel. Twice that, for margin.
pub(super) const SCORE_ERROR: f32 = 2e-3;

/// The graph's copy of `v`: normalised and rounded to what [`STORED`] holds, as `f32`. A zero
/// vector stays zero.
pub(super) fn as_stored(v: &[f32], out: &mut Vec<f32>) {
    normalised(v, out);
    out.iter_mut()
        .for_each(|x| *x = numkong::f16::from_f32(*x).to_f32());
}

/// `v / |v|` into `out` (a zero vector stays zero).
fn normalised(v: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(v);
    ce_embed::normalize(out);
}

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
            quantization: STORED,
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

    /// The graph's copy of the vector of `key`, as `f32` in `buf`'s memory: normalised and
    /// rounded (see [`as_stored`]), so scores computed on it are within [`SCORE_ERROR`] of the
    /// stored vector's. `None` when absent.
    pub(super) fn get<'b>(&self, key: u64, buf: &'b mut GraphVector) -> Option<&'b [f32]> {
        buf.resize(self.dimension);
        // The stored halves as they are (usearch's own conversion to `f32` is scalar), then
        // numkong's vectorised cast.
        let n = self
            .index
            .get(key, usearch::f16::from_mut_i16s(&mut buf.bits))
            .ok()?;
        if n == 0 {
            return None;
        }
        for (h, b) in buf.halves.iter_mut().zip(&buf.bits) {
            *h = numkong::f16(*b as u16);
        }
        numkong::cast(&buf.halves, &mut buf.floats)?;
        Some(&buf.floats)
    }

    /// Whether the graph holds `key` with the copy of `v` it would store (`buf` and `scratch`
    /// are working space).
    pub(super) fn holds(
        &self,
        key: u64,
        v: &[f32],
        buf: &mut GraphVector,
        scratch: &mut Vec<f32>,
    ) -> bool {
        as_stored(v, scratch);
        self.get(key, buf) == Some(scratch.as_slice())
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

    /// Writes the graph to `path` atomically (temporary file, fsync, rename), **without the
    /// vectors `vectors.db` holds**: only the links, the keys and the vectors of removed slots
    /// (which the database no longer has). See [`Snapshot`] for the format. usearch's
    /// serialization streams through a pipe into the file ([`Serialized::write`]): neither the
    /// vector matrix nor the graph is held whole. Which slots are removed shows only in the
    /// graph, after the vectors, so a graph with removed slots is written twice, the second time
    /// with their vectors.
    pub(super) fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("usearch.tmp");
        let mut written = Serialized::write(&self.index, &|_| false, &tmp)?;
        let removed = written.removed_slots();
        if !removed.is_empty() {
            let keep: std::collections::HashSet<usize> = removed.iter().copied().collect();
            written = Serialized::write(&self.index, &|slot| keep.contains(&slot), &tmp)?;
            if written.removed_slots() != removed {
                return Err(err("save", "the graph changed while it was written"));
            }
        }
        ce_core::failpoint::hit("vector.mid_snapshot");
        fs_err::rename(&tmp, path).map_err(|e| err("save", e))?;
        Ok(())
    }
}

/// The key usearch marks a removed slot with.
const FREE_KEY: u64 = u64::MAX;

/// The first bytes of a snapshot written by [`Ann::save`] (the last one is the format's
/// version).
const SNAPSHOT_MAGIC: &[u8; 8] = b"ce-ann\0\x01";

/// Bytes before a snapshot's removed vectors: the magic, then rows, bytes per vector and the
/// number of removed slots (little-endian `u64`s).
const SNAPSHOT_HEAD: usize = 8 + 3 * 8;

/// The path by which usearch, which opens files by name, opens our end of a pipe: the
/// snapshot's bytes stream between the two without a copy of the whole (Unix: `/dev/fd`, or
/// Linux's `/proc/self/fd` where a container left `/dev/fd` out).
fn pipe_path(end: &impl std::os::fd::AsRawFd) -> String {
    let fd = end.as_raw_fd();
    if cfg!(target_os = "linux") && !Path::new("/dev/fd").exists() {
        format!("/proc/self/fd/{fd}")
    } else {
        format!("/dev/fd/{fd}")
    }
}

/// Runs `usearch` (a save or a load of the path it is given) on a scoped thread beside
/// `ours`, which holds the other end of the pipe: `usearch` gets the pipe end `theirs` and
/// closes it when done, so `ours` sees the end of the stream (or a broken pipe when usearch
/// stopped early); `ours` drops its end before the join, so usearch is never left waiting (a
/// save then fails with `EPIPE`: Rust programs ignore `SIGPIPE`). usearch's error comes
/// first (ours is then most likely its echo).
fn through_pipe<T, P, O, U>(
    what: &str,
    theirs: P,
    ours: O,
    usearch: impl FnOnce(&str) -> std::result::Result<(), U> + Send,
    mine: impl FnOnce(O) -> Result<T>,
) -> Result<T>
where
    P: std::os::fd::AsRawFd + Send,
    U: std::fmt::Display + Send,
{
    std::thread::scope(|s| {
        let peer = s.spawn(move || {
            let done = usearch(&pipe_path(&theirs));
            drop(theirs);
            done
        });
        let result = mine(ours);
        let done = peer.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        match (done, result) {
            (Err(e), Err(ours)) => Err(err(what, format!("{e} ({ours})"))),
            (Err(e), Ok(_)) => Err(err(what, e)),
            (Ok(()), result) => result,
        }
    })
}

/// What [`Serialized::write`] found in usearch's serialization of a dense index (2.x). The
/// stream: `rows` and `cols` (`u32`s: slots, bytes per vector), the vectors in slot order, then
/// a 64-byte head (magic `usearch`, version, kinds, counts) and the graph — a header of five
/// `u64`s (size, connectivity, base connectivity, max level, entry slot), one `i16` level per
/// slot, then each slot's node: its key (`u64`), level, and per level a neighbour count and its
/// neighbours' slots (`u32`s; the base level has room for the base connectivity).
struct Serialized {
    /// Per slot, its key ([`FREE_KEY`] when removed).
    keys: Vec<u64>,
}

impl Serialized {
    /// Serializes `index` through a pipe into a snapshot file at `path` (fsynced): the head,
    /// the vectors of the slots `keep` accepts, then usearch's head and graph as they come;
    /// checks that every part is where its sizes say and that the graph is of the kinds
    /// [`Ann`] builds (any doubt is an error).
    fn write(index: &Index, keep: &dyn Fn(usize) -> bool, path: &Path) -> Result<Serialized> {
        let bad = |what: &str| err("serialize", what);
        let (reader, writer) = std::io::pipe().map_err(|e| err("serialize", e))?;
        through_pipe(
            "serialize",
            writer,
            reader,
            |path| index.save(path),
            |reader| {
                let mut input = std::io::BufReader::with_capacity(1 << 16, reader);
                let mut head = [0u8; 8];
                input
                    .read_exact(&mut head)
                    .map_err(|_| bad("truncated before the vectors"))?;
                let rows = u32_at(&head, 0).unwrap_or(0) as usize;
                let cols = u32_at(&head, 4).unwrap_or(0) as usize;
                let (mut kept, mut vector) = (Vec::new(), vec![0u8; cols]);
                for slot in 0..rows {
                    input
                        .read_exact(&mut vector)
                        .map_err(|_| bad("truncated vectors"))?;
                    if keep(slot) {
                        kept.extend_from_slice(&vector);
                    }
                }
                let file = fs_err::File::create(path).map_err(|e| err("save", e))?;
                let mut out = BufWriter::with_capacity(1 << 16, file);
                let io = |e: std::io::Error| err("save", e);
                out.write_all(SNAPSHOT_MAGIC).map_err(io)?;
                for n in [rows, cols, kept.len() / cols.max(1)] {
                    out.write_all(&(n as u64).to_le_bytes()).map_err(io)?;
                }
                out.write_all(&kept).map_err(io)?;
                let keys = graph_keys(&mut input, &mut out, rows).map_err(|what| bad(&what))?;
                out.into_inner()
                    .map_err(|e| io(e.into_error()))?
                    .sync_all()
                    .map_err(io)?;
                Ok(Serialized { keys })
            },
        )
    }

    fn removed_slots(&self) -> Vec<usize> {
        (0..self.keys.len())
            .filter(|s| self.keys[*s] == FREE_KEY)
            .collect()
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads a serialized head and graph from `input`, copying every byte read to `out`, and
/// returns the key of each of the `rows` slots; checks the kinds and that the nodes' sizes add
/// up to the end of the input exactly. Nothing is allocated for a count the input does not
/// back (a damaged file may claim any): the levels are read a piece at a time.
fn graph_keys(
    input: &mut impl Read,
    out: &mut impl Write,
    rows: usize,
) -> std::result::Result<Vec<u64>, String> {
    const HEAD: usize = 64;
    let mut copy = |buf: &mut [u8]| -> std::result::Result<(), String> {
        input
            .read_exact(buf)
            .map_err(|_| "truncated graph".to_string())?;
        out.write_all(buf).map_err(|e| format!("write: {e}"))
    };
    let mut head = [0u8; HEAD + 5 * 8];
    copy(&mut head)?;
    if head[..7] != *b"usearch" {
        return Err("no usearch head".into());
    }
    // Kinds after the magic (7 bytes) and the version (three `u16`s): metric, scalar, key, slot.
    let kinds = &head[13..17];
    if kinds != [b'c', 12, 14, 15] {
        return Err(format!(
            "kinds {kinds:?}, this version stores cosine / f16 / u64 keys / u32 slots"
        ));
    }
    let header = |i: usize| u64_at(&head, HEAD + 8 * i).unwrap_or(0);
    let (size, connectivity, base) = (header(0), header(1), header(2));
    if size != rows as u64 {
        return Err(format!("{size} nodes for {rows} vectors"));
    }
    if connectivity > 1 << 12 || base > 1 << 13 {
        return Err(format!("connectivity {connectivity} / {base}"));
    }
    let (per_level, base_bytes) = (4 + 4 * connectivity as usize, 4 + 4 * base as usize);
    let mut levels = Vec::new();
    let mut piece = [0u8; 1 << 14];
    let mut left = rows.checked_mul(2).ok_or("truncated graph")?;
    while left > 0 {
        let n = left.min(piece.len());
        copy(&mut piece[..n])?;
        levels.extend_from_slice(&piece[..n]);
        left -= n;
    }
    let (mut keys, mut node) = (Vec::with_capacity(rows), Vec::new());
    for (slot, level) in levels.chunks_exact(2).enumerate() {
        let level = i16::from_le_bytes([level[0], level[1]]);
        let level = usize::try_from(level).map_err(|_| format!("slot {slot} has level {level}"))?;
        node.resize(8 + 2 + base_bytes + level * per_level, 0);
        copy(&mut node)?;
        keys.push(u64_at(&node, 0).unwrap_or(FREE_KEY));
    }
    match input.read(&mut piece[..1]) {
        Ok(0) => Ok(keys),
        Ok(_) => Err("bytes after the last node".into()),
        Err(e) => Err(format!("read: {e}")),
    }
}

/// A snapshot read back, waiting for its vectors: usearch's serialization without the vectors
/// of live keys, which [`Snapshot::into_graph`] streams into usearch from `vectors.db`; removed
/// slots' vectors came with the file. A key it does not get keeps a zero vector: it must be one
/// the database no longer has, which the caller removes right after (a zero vector is at cosine
/// distance 1 from everything, so it only thins the paths through its node).
pub(super) struct Snapshot {
    /// The file: head, removed slots' vectors, then usearch's head and graph from `tail_at`.
    bytes: Vec<u8>,
    tail_at: usize,
    cols: usize,
    /// Per slot, its key ([`FREE_KEY`] when removed).
    slot_keys: Vec<u64>,
    /// Slot of each live key.
    slots: HashMap<u64, usize>,
}

impl Snapshot {
    /// Reads the snapshot at `path`, written by [`Ann::save`] for vectors of `dimension`.
    pub(super) fn read(path: &Path, dimension: usize) -> Result<Snapshot> {
        let bytes = fs_err::read(path).map_err(|e| err("read snapshot", e))?;
        let bad = |what: String| err(&format!("snapshot {}", path.display()), what);
        if bytes.get(..8) != Some(SNAPSHOT_MAGIC.as_slice()) {
            return Err(bad("not a snapshot of this version".into()));
        }
        let field = |i: usize| {
            u64_at(&bytes, 8 + 8 * i)
                .map(|n| n as usize)
                .ok_or_else(|| bad("truncated".into()))
        };
        let (rows, cols, removed) = (field(0)?, field(1)?, field(2)?);
        if cols != 2 * dimension {
            return Err(bad(format!(
                "{cols} bytes per vector, the database has dimension {dimension}"
            )));
        }
        let tail_at = removed
            .checked_mul(cols)
            .and_then(|n| n.checked_add(SNAPSHOT_HEAD))
            .filter(|t| *t <= bytes.len())
            .ok_or_else(|| bad("truncated".into()))?;
        let slot_keys =
            graph_keys(&mut &bytes[tail_at..], &mut std::io::sink(), rows).map_err(bad)?;
        let slots: HashMap<u64, usize> = slot_keys
            .iter()
            .enumerate()
            .filter(|(_, k)| **k != FREE_KEY)
            .map(|(slot, k)| (*k, slot))
            .collect();
        if rows - slots.len() != removed {
            return Err(bad(format!(
                "{removed} removed vectors for {} removed slots",
                rows - slots.len()
            )));
        }
        Ok(Snapshot {
            bytes,
            tail_at,
            cols,
            slot_keys,
            slots,
        })
    }

    /// Dimension of the vectors.
    pub(super) fn dimension(&self) -> usize {
        self.cols / 2
    }

    /// The keys of the graph's live slots.
    pub(super) fn keys(&self) -> Vec<u64> {
        self.slots.keys().copied().collect()
    }

    /// The graph, usearch reading the snapshot through a pipe while `scan` gives it the
    /// stored vectors: `scan` calls its argument with each stored `(key, vector)` **in
    /// ascending key order** (keys the snapshot lacks are ignored). Each vector goes in as the
    /// graph stored it (see [`as_stored`]), in slot order; one whose slot comes later waits.
    /// Slots follow key order but for the interleaving of parallel insertion and slots
    /// reused for newer keys, so few wait; when more than [`WAITING_MAX`] do, the slot that
    /// holds them up is given its vector by `fetch` (the stored vector of one key, `None` if
    /// the database lost it) instead of waiting for the scan to reach it.
    pub(super) fn into_graph(
        self,
        o: &EmbeddedOptions,
        scan: impl FnOnce(&mut dyn FnMut(u64, &[f32]) -> Result<()>) -> Result<()>,
        fetch: &dyn Fn(u64) -> Result<Option<Vec<f32>>>,
    ) -> Result<Ann> {
        self.into_graph_holding(o, WAITING_MAX, scan, fetch)
    }

    /// [`Snapshot::into_graph`], holding back at most `waiting_max` vectors.
    fn into_graph_holding(
        self,
        o: &EmbeddedOptions,
        waiting_max: usize,
        scan: impl FnOnce(&mut dyn FnMut(u64, &[f32]) -> Result<()>) -> Result<()>,
        fetch: &dyn Fn(u64) -> Result<Option<Vec<f32>>>,
    ) -> Result<Ann> {
        let ann = Ann::new(self.dimension(), o)?;
        let removed = self.slot_keys.len() - self.slots.len();
        let (reader, writer) = std::io::pipe().map_err(|e| err("load snapshot", e))?;
        through_pipe(
            "load snapshot",
            reader,
            writer,
            |path| ann.index.load(path),
            |writer| {
                let mut feed = SlotFeed::new(&self, writer, waiting_max, fetch)?;
                scan(&mut |key, v| feed.put(key, v))?;
                feed.finish()
            },
        )?;
        ann.index.change_expansion_add(o.expansion_add);
        ann.index.change_expansion_search(o.expansion_search);
        ann.reserve(ann.index.capacity().max(1024))?;
        Ok(Ann {
            tombstones: removed,
            ..ann
        })
    }
}

/// Vectors a snapshot load holds back for their slots' turn before it looks the next one up
/// instead (see [`Snapshot::into_graph`]): 3 MiB at 384 dimensions.
const WAITING_MAX: usize = 4096;

/// Writes usearch's serialization of a [`Snapshot`] in stream order, the live vectors put in
/// as they come (see [`Snapshot::into_graph`]).
struct SlotFeed<'s> {
    snapshot: &'s Snapshot,
    out: BufWriter<std::io::PipeWriter>,
    /// The next slot to write.
    next: usize,
    /// Vectors of slots after `next`, as stored.
    waiting: HashMap<usize, Vec<u8>>,
    waiting_max: usize,
    fetch: &'s dyn Fn(u64) -> Result<Option<Vec<f32>>>,
    /// The removed slots' vectors, in slot order.
    removed: std::slice::ChunksExact<'s, u8>,
    /// The last key given.
    last: Option<u64>,
    unit: Vec<f32>,
    halves: Vec<numkong::f16>,
    bytes: Vec<u8>,
}

impl<'s> SlotFeed<'s> {
    fn new(
        snapshot: &'s Snapshot,
        writer: std::io::PipeWriter,
        waiting_max: usize,
        fetch: &'s dyn Fn(u64) -> Result<Option<Vec<f32>>>,
    ) -> Result<SlotFeed<'s>> {
        let mut out = BufWriter::with_capacity(1 << 16, writer);
        let rows = snapshot.slot_keys.len();
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&(rows as u32).to_le_bytes());
        head[4..].copy_from_slice(&(snapshot.cols as u32).to_le_bytes());
        send(&mut out, &head)?;
        let mut feed = SlotFeed {
            snapshot,
            out,
            next: 0,
            waiting: HashMap::new(),
            waiting_max,
            fetch,
            removed: snapshot.bytes[SNAPSHOT_HEAD..snapshot.tail_at].chunks_exact(snapshot.cols),
            last: None,
            unit: Vec::new(),
            halves: Vec::new(),
            bytes: Vec::new(),
        };
        feed.advance(false)?;
        Ok(feed)
    }

    /// Gives the stored vector of `key` (keys must come in ascending order).
    fn put(&mut self, key: u64, v: &[f32]) -> Result<()> {
        if let Some(last) = self.last.filter(|last| *last >= key) {
            return Err(err(
                "load snapshot",
                format!("key {key} came after key {last}"),
            ));
        }
        self.last = Some(key);
        // A slot before `next` was looked up already.
        if let Some(&slot) = self.snapshot.slots.get(&key).filter(|s| **s >= self.next) {
            self.encode(key, v)?;
            if slot == self.next {
                send(&mut self.out, &self.bytes)?;
                self.next += 1;
            } else {
                self.waiting.insert(slot, self.bytes.clone());
            }
        }
        self.advance(false)?;
        while self.waiting.len() > self.waiting_max {
            // The slot holding the others up: its vector looked up, not waited for.
            let key = self.snapshot.slot_keys[self.next];
            match (self.fetch)(key)? {
                Some(v) => {
                    self.encode(key, &v)?;
                    send(&mut self.out, &self.bytes)?;
                }
                None => send(&mut self.out, &vec![0u8; self.snapshot.cols])?,
            }
            self.next += 1;
            self.advance(false)?;
        }
        Ok(())
    }

    /// `v` as the graph stores it, into `bytes`: normalised, then rounded by numkong's
    /// vectorised cast (the scalar conversion of every component was most of a load's time).
    fn encode(&mut self, key: u64, v: &[f32]) -> Result<()> {
        normalised(v, &mut self.unit);
        self.halves.resize(self.unit.len(), numkong::f16::ZERO);
        if numkong::cast(&self.unit, &mut self.halves).is_none() {
            for (h, x) in self.halves.iter_mut().zip(&self.unit) {
                *h = numkong::f16::from_f32(*x);
            }
        }
        self.bytes.clear();
        self.bytes
            .extend(self.halves.iter().flat_map(|h| h.0.to_le_bytes()));
        if self.bytes.len() != self.snapshot.cols {
            return Err(err(
                "load snapshot",
                format!("key {key} has dimension {}", v.len()),
            ));
        }
        Ok(())
    }

    /// Writes the slots from `next` on that can be: removed ones, given ones, and those whose
    /// key the scan has passed (or, at the `end`, every one left) without giving it — a zero
    /// vector, for a key the database lost.
    fn advance(&mut self, end: bool) -> Result<()> {
        while let Some(&key) = self.snapshot.slot_keys.get(self.next) {
            if key == FREE_KEY {
                let v = self
                    .removed
                    .next()
                    .ok_or_else(|| err("load snapshot", "fewer removed vectors than slots"))?;
                send(&mut self.out, v)?;
            } else if let Some(v) = self.waiting.remove(&self.next) {
                send(&mut self.out, &v)?;
            } else if end || self.last.is_some_and(|last| last > key) {
                send(&mut self.out, &vec![0u8; self.snapshot.cols])?;
            } else {
                break;
            }
            self.next += 1;
        }
        Ok(())
    }

    /// Writes the slots left and usearch's head and graph; the stream ends when `self` drops.
    fn finish(mut self) -> Result<()> {
        self.advance(true)?;
        send(&mut self.out, &self.snapshot.bytes[self.snapshot.tail_at..])?;
        self.out.flush().map_err(|e| err("load snapshot", e))
    }
}

/// Writes `bytes` to usearch's stream.
fn send(out: &mut impl Write, bytes: &[u8]) -> Result<()> {
    out.write_all(bytes).map_err(|e| err("load snapshot", e))
}

/// Working space of [`Ann::get`] (one per thread that reads vectors).
#[derive(Default)]
pub(super) struct GraphVector {
    bits: Vec<i16>,
    halves: Vec<numkong::f16>,
    floats: Vec<f32>,
}

impl GraphVector {
    fn resize(&mut self, dimension: usize) {
        self.bits.resize(dimension, 0);
        self.halves.resize(dimension, numkong::f16::ZERO);
        self.floats.resize(dimension, 0.0);
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
        let add_grain = |grain: &[(u64, V)]| -> Result<()> {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let mut unit = Vec::with_capacity(self.dimension);
            for (k, v) in grain {
                normalised(v.as_ref(), &mut unit);
                index.add(*k, &unit).map_err(|e| err("add", e))?;
            }
            Ok(())
        };
        // Threads only for a batch worth them: a few hundred vectors take milliseconds on one,
        // and one thread builds the same graph every time (concurrent insertion makes its
        // links depend on the threads' interleaving: the likely cause of the one failure seen
        // of `search_returns_exactly_top_k_under_a_selective_filter`'s exact-best check, in a
        // loaded test run, after a 300-vector step on two threads). The threads take grains
        // of `ADD_GRAIN` in turn, so usearch numbers the vectors (its slots) close to the
        // batch's order — key order — which keeps what a snapshot load holds back small
        // ([`Snapshot::into_graph`]); halves per thread interleaved two distant key ranges.
        ce_core::parallel::try_for_each_grain(items, PARALLEL_ADD_FROM, ADD_GRAIN, add_grain)
    }
}

/// The graph file of the snapshot of `generation`.
pub(super) fn snapshot_path(dir: &Path, db_id: &str, generation: u64) -> PathBuf {
    dir.join(format!("ann-{db_id}-{generation}.usearch"))
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
        // A `.keys` file is an earlier version's, whatever its generation.
        let kept = keep
            .as_deref()
            .is_some_and(|k| name.starts_with(k) && name.ends_with(".usearch"));
        if ours && !kept {
            fs_err::remove_file(&path).map_err(|e| err("remove old snapshot", e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::HashMap;

    use proptest::prelude::*;

    use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::{Ann, SCORE_ERROR, Serialized, Snapshot, as_stored, remove_other_snapshots};
    use crate::vector::embedded::EmbeddedOptions;
    use crate::vector::rules::cosine;

    /// A cleanup keeps the kept generation's graph file only: other generations', an earlier
    /// version's key sets and an interrupted save's go.
    #[test]
    fn only_the_kept_generations_graph_file_survives_a_cleanup() {
        let dir = tempfile::tempdir().expect("tmp");
        let names = [
            "ann-db-7.usearch",
            "ann-db-7.keys", // an earlier version's key set, even of the kept generation
            "ann-db-6.usearch",
            "ann-db-6.keys",
            "ann-db-8.usearch.tmp", // an interrupted save
            "ann-other-7.usearch",
            "vectors.db",
        ];
        for n in names {
            std::fs::write(dir.path().join(n), b"x").expect("write");
        }
        remove_other_snapshots(dir.path(), Some(("db", 7))).expect("cleanup");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["ann-db-7.usearch", "vectors.db"]);
    }

    /// A snapshot of an earlier version (usearch's own file, vectors included, here of `f32`
    /// vectors) or a damaged one is refused — the caller then rebuilds the graph from the stored
    /// vectors — and so is a serialization of other kinds.
    #[test]
    fn a_foreign_or_damaged_snapshot_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = EmbeddedOptions::default();
        let v = [0.6, 0.0, -0.8, 0.0];
        let old = Index::new(&IndexOptions {
            dimensions: 4,
            metric: MetricKind::Cos,
            quantization: ScalarKind::F32,
            ..IndexOptions::default()
        })
        .expect("index");
        old.reserve(1).expect("reserve");
        old.add(1, &v).expect("add");
        let old_path = dir.path().join("old.usearch");
        old.save(old_path.to_str().expect("utf-8")).expect("save");
        let e = Snapshot::read(&old_path, 4)
            .err()
            .expect("an old snapshot is refused");
        assert!(e.to_string().contains("not a snapshot"), "{e}");
        let e = Serialized::write(&old, &|_| false, &dir.path().join("f32.usearch"))
            .err()
            .expect("f32 kinds are refused");
        assert!(e.to_string().contains("kinds"), "{e}");

        let mut ours = Ann::new(4, &o).expect("graph");
        ours.add(&[(1, &v[..]), (2, &[0.0, 1.0, 0.0, 0.0][..])])
            .expect("add");
        let path = dir.path().join("ours.usearch");
        ours.save(&path).expect("save");
        assert!(Snapshot::read(&path, 4).is_ok());
        let e = Snapshot::read(&path, 8)
            .err()
            .expect("another dimension is refused");
        assert!(e.to_string().contains("dimension 8"), "{e}");
        let bytes = std::fs::read(&path).expect("read");
        // A row count no file could hold is refused before anything is allocated for it.
        let mut huge = bytes.clone();
        // (No removed slots here: the graph's header, whose size must agree, is at 32 + 64.)
        for at in [8, super::SNAPSHOT_HEAD + 64] {
            huge[at..at + 8].copy_from_slice(&(u64::MAX / 4).to_le_bytes());
        }
        std::fs::write(&path, &huge).expect("write");
        assert!(Snapshot::read(&path, 4).is_err(), "a huge row count");
        for cut in [1, 8, bytes.len() / 2] {
            std::fs::write(&path, &bytes[..bytes.len() - cut]).expect("write");
            assert!(Snapshot::read(&path, 4).is_err(), "cut by {cut} bytes");
        }
    }

    /// A snapshot holds the graph without the live vectors (the file is a fraction of the
    /// graph's serialization) and, given them back in key order, is the same graph: every key's
    /// copy bit for bit, the removed slots with theirs, the same search results. The keys were
    /// added in shuffled order, so the graph's slots are not in key order and vectors wait for
    /// their slot's turn.
    #[test]
    fn a_snapshot_without_its_vectors_is_the_same_graph_once_given_them() {
        let seed = ce_testkit::seed("ann::a_snapshot_without_its_vectors_is_the_same_graph");
        let mut rng = StdRng::seed_from_u64(seed);
        let dim = 32;
        let o = EmbeddedOptions::default();
        let vectors = scaled_vectors(&mut rng, 600, dim);
        let (graph, removed, _dir, path) = saved_shuffled_graph(&mut rng, &vectors, &o);
        let file = std::fs::metadata(&path).expect("stat").len() as usize;
        let live_bytes = (vectors.len() - removed.len()) * dim * 2;
        assert_eq!(
            file + live_bytes,
            graph.index.serialized_length() + super::SNAPSHOT_HEAD - 8,
            "CE_SEED={seed}: the snapshot is usearch's serialization without the live vectors"
        );

        let stored: HashMap<u64, &Vec<f32>> = vectors.iter().map(|(k, v)| (*k, v)).collect();
        let fetched = Cell::new(0usize);
        let fetch = |k: u64| {
            fetched.set(fetched.get() + 1);
            Ok(stored.get(&k).map(|v| v.to_vec()))
        };
        // Holding back as many as it needs, then at most 8 (the shuffled slots make it look up
        // most of them).
        for waiting_max in [usize::MAX, 8] {
            let loaded = Snapshot::read(&path, dim)
                .expect("read")
                .into_graph_holding(
                    &o,
                    waiting_max,
                    |put| vectors.iter().try_for_each(|(k, v)| put(*k, v)),
                    &fetch,
                )
                .expect("load");
            assert_eq!(
                (loaded.len(), loaded.tombstones()),
                (graph.len(), graph.tombstones())
            );
            let (mut a, mut b) = (super::GraphVector::default(), super::GraphVector::default());
            for (k, _) in &vectors {
                let (before, after) = (graph.get(*k, &mut a), loaded.get(*k, &mut b));
                assert_eq!(
                    before, after,
                    "CE_SEED={seed}: key {k}, waiting_max {waiting_max}"
                );
                assert_eq!(
                    before.is_some(),
                    !removed.contains(k),
                    "CE_SEED={seed}: key {k}"
                );
            }
            for _ in 0..20 {
                let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                assert_eq!(
                    graph.search(&q, 10).expect("search"),
                    loaded.search(&q, 10).expect("search"),
                    "CE_SEED={seed}"
                );
            }
            let looked_up = fetched.replace(0);
            if waiting_max == usize::MAX {
                assert_eq!(looked_up, 0, "CE_SEED={seed}");
            } else {
                assert!(looked_up > 100, "CE_SEED={seed}: {looked_up} looked up");
            }
        }
    }

    /// A live key the scan passes without giving or the lookup does not find (the database
    /// lost it since the save) is loaded with a zero vector, for the caller to remove; keys
    /// out of order are refused, and a failed load — usearch still reading, or the scan
    /// failing — returns, never hangs.
    #[test]
    fn a_snapshot_load_zeroes_lost_keys_and_refuses_keys_out_of_order() {
        let seed = ce_testkit::seed("ann::a_snapshot_load_zeroes_lost_keys");
        let mut rng = StdRng::seed_from_u64(seed);
        let dim = 16;
        let o = EmbeddedOptions::default();
        let vectors = scaled_vectors(&mut rng, 300, dim);
        let (graph, removed, _dir, path) = saved_shuffled_graph(&mut rng, &vectors, &o);

        let live: Vec<&(u64, Vec<f32>)> = vectors
            .iter()
            .filter(|(k, _)| !removed.contains(k))
            .collect();
        let lost: Vec<u64> = live.iter().skip(1).step_by(7).map(|(k, _)| *k).collect();
        let kept = |k: &u64| !lost.contains(k);
        let fetch = |k: u64| {
            Ok(live
                .iter()
                .find(|(key, _)| *key == k && kept(key))
                .map(|(_, v)| v.clone()))
        };
        let loaded = Snapshot::read(&path, dim)
            .expect("read")
            .into_graph_holding(
                &o,
                8,
                |put| {
                    live.iter()
                        .filter(|(k, _)| kept(k))
                        .try_for_each(|(k, v)| put(*k, v))
                },
                &fetch,
            )
            .expect("load");
        assert_eq!(loaded.len(), graph.len(), "CE_SEED={seed}");
        let (mut a, mut b) = (super::GraphVector::default(), super::GraphVector::default());
        for (k, _) in &live {
            let got = loaded.get(*k, &mut b).expect("every live key is loaded");
            if lost.contains(k) {
                assert!(got.iter().all(|x| *x == 0.0), "CE_SEED={seed}: key {k}");
            } else {
                assert_eq!(Some(got), graph.get(*k, &mut a), "CE_SEED={seed}: key {k}");
            }
        }

        let backwards = Snapshot::read(&path, dim).expect("read").into_graph(
            &o,
            |put| live.iter().rev().try_for_each(|(k, v)| put(*k, v)),
            &fetch,
        );
        let e = backwards.expect_err("keys out of order are refused");
        assert!(e.to_string().contains("came after"), "{e}");
        let failed = Snapshot::read(&path, dim).expect("read").into_graph(
            &o,
            |put| {
                put(live[0].0, &live[0].1)?;
                Err(crate::error::IndexError::Unavailable("scan failed".into()))
            },
            &fetch,
        );
        assert!(failed.is_err(), "CE_SEED={seed}");
    }

    /// `n` vectors of `dim` under ascending keys, each of a random scale.
    fn scaled_vectors(rng: &mut StdRng, n: u64, dim: usize) -> Vec<(u64, Vec<f32>)> {
        (0..n)
            .map(|k| {
                let scale = 10f32.powi(rng.random_range(-3..3));
                (
                    k * 7 + 3,
                    (0..dim)
                        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
                        .collect(),
                )
            })
            .collect()
    }

    /// A graph of `vectors` added in shuffled order (one thread: slots follow that order), a
    /// fifth of them removed, and saved; the removed keys, and the snapshot's directory and
    /// path.
    fn saved_shuffled_graph(
        rng: &mut StdRng,
        vectors: &[(u64, Vec<f32>)],
        o: &EmbeddedOptions,
    ) -> (Ann, Vec<u64>, tempfile::TempDir, std::path::PathBuf) {
        let mut order: Vec<usize> = (0..vectors.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let dim = vectors.first().map_or(0, |(_, v)| v.len());
        let mut graph = Ann::new(dim, o).expect("graph");
        let items: Vec<(u64, &[f32])> = order
            .iter()
            .map(|i| (vectors[*i].0, vectors[*i].1.as_slice()))
            .collect();
        graph.add(&items).expect("add");
        let removed: Vec<u64> = vectors.iter().step_by(5).map(|(k, _)| *k).collect();
        for k in &removed {
            graph.remove(*k).expect("remove");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("g.usearch");
        graph.save(&path).expect("save");
        (graph, removed, dir, path)
    }

    /// The bound searches rely on to rescore a shortlist (see `SCORE_ERROR`): for vectors of
    /// any scale and any direction, the cosine on the graph's copy is within half of it (the
    /// derivation's ≈ 1e-3) of the cosine on the stored vector.
    #[test]
    fn a_score_on_the_graphs_copy_is_within_the_bound() {
        let seed = ce_testkit::seed("ann::a_score_on_the_graphs_copy_is_within_the_bound");
        let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(256), 1024);
        let vector = |dim: usize| prop::collection::vec(-1.0f32..1.0, dim);
        let case = (1usize..400)
            .prop_flat_map(move |dim| (vector(dim), vector(dim), -12i32..12, 0.0f32..1.0));
        runner
            .run(&case, |(q, v, exponent, pull)| {
                // Scaled from 2⁻²⁴ to 2²² (past `f16`'s range both ways); pulled towards the
                // query for high scores too.
                let scale = 2f32.powi(exponent * 2);
                let v: Vec<f32> = v
                    .iter()
                    .zip(&q)
                    .map(|(x, y)| (x * (1.0 - pull) + y * pull) * scale)
                    .collect();
                let mut copy = Vec::new();
                as_stored(&v, &mut copy);
                let (exact, approx) = (cosine(&q, &v), cosine(&q, &copy));
                if exact.is_finite() {
                    prop_assert!(
                        (exact - approx).abs() <= SCORE_ERROR / 2.0,
                        "cosine {exact} on the vector, {approx} on the graph's copy"
                    );
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("CE_SEED={seed}: {e}"));
    }
}
