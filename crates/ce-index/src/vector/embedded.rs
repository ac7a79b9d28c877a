//! Embedded vector index: SQLite holds the records and vectors (the durable state); in memory,
//! a usearch HNSW graph and an exact-scan *fresh segment* answer searches.
//!
//! Write path (every trait write): one `IMMEDIATE` SQLite transaction on the writer connection
//! (WAL, `synchronous=FULL`) that reads the current rows, writes the new ones and records the
//! in-memory changes it implies (add / remove a key, update a key's filter data) → commit →
//! apply those changes: new vectors go to the fresh segment (`fresh.rs`, a contiguous buffer
//! scanned exactly), so a write is searchable as soon as it returns; removed keys leave the
//! part that holds them. Vectors durable first, graph later: a background thread
//! (`Shared::run_inserter`, at a lower scheduling priority than searches and writes) moves
//! fresh vectors into the graph in large batches, on all cores, outside the state lock, and
//! retires them from the fresh segment. When the fresh segment outgrows
//! [`EmbeddedOptions::fresh_max_bytes`], the writer inserts itself before returning
//! (back-pressure). An empty graph (first import, after `clear` for a reindex) is built once
//! from every fresh vector.
//!
//! [`EmbeddedVectorIndex::open`] reads the database's meta rows only: the graph, the filter
//! table and the fresh segment are loaded by the first search or maintenance call
//! ([`EmbeddedVectorIndex::load`]), so a command that only writes (`ce worker --once`, an
//! import) commits to the database and leaves the graph to the next process that searches —
//! unless it adds half a fresh segment's worth of vectors: then the background inserter loads
//! the graph beside the writers (its own connection; the writes committed meanwhile are caught
//! up, see `Shared::load_concurrently`) and inserts as above. Loading reads the last
//! snapshot of the graph and the writes committed after it (the tail) into the fresh
//! segment, or, without a snapshot, every stored vector
//! into the fresh segment when they fit it (the inserter then builds the graph in one pass),
//! else builds the graph from them — never re-embedding (see `ann.rs`). A crash therefore
//! loses only derived state. If applying fails, the in-memory state is rebuilt from the
//! database at once.
//!
//! One process at a time: the graph lives in this process's memory, so `open` takes an
//! exclusive lock on `LOCK` in the directory (released by the OS if the process dies).
//!
//! Search path: the planner counts the records passing the filter in the in-memory filter
//! table; small candidate sets (see [`EmbeddedOptions::exact_limit`]: 5,000, or 10 % of the
//! records up to 20·√records) are scanned exactly; larger ones scan the fresh segment exactly
//! (filter before scoring) and go through the graph for the rest (filtered search with the
//! table as predicate), merged by score; if the graph returns fewer than `top_k` while enough
//! of its records pass, the search falls back to an exact scan. The graph holds each vector
//! rounded to `f16` (`ann.rs`), so a score computed on its copy is within a known bound of the
//! true one: the in-memory search keeps a *shortlist* — the best `top_k` and the near-ties
//! within twice that bound — whose rows are then read from SQLite, rescored with their stored
//! `f32` vectors (the scores every hit reports) and checked against the filter once more, so a
//! search racing a write never returns a record that does not match.

mod ann;
pub mod bench;
mod fresh;
mod schema;
mod table;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use ce_core::{CtxUri, IndexRecord, Level};
use ce_embed::ModelIdentity;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use serde::Serialize;

use self::ann::Ann;
use self::fresh::Fresh;
use self::schema::sql;
use self::table::{KeyTable, Row};
use super::rules::{
    check_binding, check_kept, check_query, check_vector, cosine, metadata_version, missing_vector,
};
use super::{
    NodeRecord, NodeWrite, SearchFilter, StoredRecord, StoredVector, SyncOutcome, VectorHit,
    VectorIndex, VectorRecord,
};
use crate::error::{IndexError, Result};
use crate::records::{
    SeenVersion, SeenVersions, check_move, check_node_records, move_versions, moved_record,
};
use crate::sqlite::lock;

/// File name of the database inside the index directory.
pub const DB_FILE: &str = "vectors.db";

/// Tuning of the embedded index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmbeddedOptions {
    /// HNSW connectivity (edges per node).
    pub connectivity: usize,
    /// Candidate list size while inserting.
    pub expansion_add: usize,
    /// Candidate list size while searching (at least `top_k` is used).
    pub expansion_search: usize,
    /// Candidate sets up to this size are scanned exactly.
    pub exact_max_candidates: usize,
    /// Candidate sets up to this fraction of all records are scanned exactly…
    pub exact_max_fraction: f64,
    /// …but never more than this factor times √(records): an exact scan costs O(candidates)
    /// while a filtered graph search costs about O(records / candidates), so the break-even
    /// candidate count grows with √(records), not with records.
    pub exact_sqrt_factor: f64,
    /// Memory bound of the fresh segment (vectors committed but not yet in the graph), in
    /// bytes: a write that leaves it larger inserts into the graph itself before returning
    /// (back-pressure) until it is back under the bound.
    pub fresh_max_bytes: usize,
    /// Vectors per graph-insertion step (the first build of an empty graph takes all).
    pub insert_batch: usize,
    /// Whether a background thread moves fresh vectors into the graph. Without it they stay
    /// fresh until back-pressure, [`EmbeddedVectorIndex::insert_step`] or
    /// [`EmbeddedVectorIndex::settle`] moves them.
    pub background_insert: bool,
    /// How long the background thread waits after a write before inserting, so that the
    /// writes of a burst are inserted as one large batch.
    pub insert_linger: Duration,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            connectivity: 16,
            expansion_add: 64,
            expansion_search: 64,
            exact_max_candidates: 5_000,
            exact_max_fraction: 0.10,
            exact_sqrt_factor: 20.0,
            fresh_max_bytes: 64 << 20,
            insert_batch: 16_384,
            background_insert: true,
            insert_linger: Duration::from_millis(50),
        }
    }
}

impl EmbeddedOptions {
    /// The largest candidate set scanned exactly among `n` records:
    /// `max(exact_max_candidates, min(exact_max_fraction · n, exact_sqrt_factor · √n))` —
    /// 5,000 up to 62.5k records, 6,325 at 100k, 20k at 1M with the defaults (measured
    /// break-even at 100k × 384 dims: an exact scan costs ~0.9 µs per candidate, a filtered
    /// graph search ~5 ms at 10 % selectivity; docs/benchmarks.md).
    pub fn exact_limit(&self, n: usize) -> usize {
        let n = n as f64;
        let scaled = (self.exact_max_fraction * n).min(self.exact_sqrt_factor * n.sqrt());
        self.exact_max_candidates.max(scaled as usize)
    }
}

/// How to run one search (tests and benchmarks force a path; the trait uses `Auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SearchStrategy {
    /// Let the planner choose.
    Auto,
    /// Scan every candidate exactly.
    Exact,
    /// Use the graph whatever the candidate count (still falling back to an exact scan when
    /// the graph returns too few hits).
    Ann,
}

/// Which path a search took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SearchPlan {
    /// No record can pass the filter (or the index is empty).
    Empty,
    /// Exact scan of the candidates.
    Exact,
    /// Graph search (filtered when the filter is not trivial).
    Ann,
    /// Graph search returned fewer than `top_k` although enough records pass: exact scan.
    AnnThenExact,
}

/// A search result with the planner's decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchReport {
    /// Hits, best first.
    pub hits: Vec<VectorHit>,
    /// The path taken.
    pub plan: SearchPlan,
    /// Number of records passing the filter; for [`SearchPlan::Ann`] a lower bound (counting
    /// stops once the count rules out the exact scan).
    pub candidates: usize,
}

/// The embedded vector index (see the module documentation).
pub struct EmbeddedVectorIndex {
    dir: PathBuf,
    db_id: String,
    options: EmbeddedOptions,
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
    shared: Arc<Shared>,
    /// The background graph inserter (see [`EmbeddedOptions::background_insert`]).
    inserter: Option<JoinHandle<()>>,
    /// Set by [`EmbeddedVectorIndex::close_without_snapshot`].
    skip_snapshot: bool,
    /// Held open for the index's lifetime: an exclusive lock on `LOCK` (one process at a time,
    /// since the graph lives in this process's memory). The OS releases it if we die.
    _lock: fs_err::File,
}

/// Counters of the embedded index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EmbeddedStats {
    /// Records in the filter table (equals the stored records).
    pub records: usize,
    /// Vectors in the graph.
    pub graph_vectors: usize,
    /// Vectors in the fresh segment (committed, searched exactly, not yet in the graph).
    pub fresh_vectors: usize,
    /// Memory held by the fresh segment, in bytes.
    pub fresh_bytes: usize,
    /// Removed graph slots not yet reused by an insertion: they cost memory and some search
    /// time; [`EmbeddedVectorIndex::rebuild_graph`] drops them.
    pub tombstones: usize,
    /// Database generation (bumped by every commit that adds or removes a vector).
    pub generation: u64,
    /// Whether the snapshot on disk holds every vector: the graph has not changed since it was
    /// written and the fresh segment is empty (fresh vectors are never in a snapshot; the next
    /// open reads them back from the database).
    pub snapshot_current: bool,
    /// Whether this instance loaded its graph from a snapshot (else it built it from the stored
    /// vectors).
    pub opened_from_snapshot: bool,
    /// Keys added to or removed from that snapshot at open to catch up with the database.
    pub snapshot_catch_up: usize,
    /// Whether the graph and the filter table are in memory (see
    /// [`EmbeddedVectorIndex::load`]).
    pub resident: bool,
}

/// Tombstones below this never trigger a graph rebuild (see [`EmbeddedStats::needs_rebuild`]).
pub const REBUILD_MIN_TOMBSTONES: usize = 1_000;

impl EmbeddedStats {
    /// Whether removed slots make up more than `ratio` of the graph (and at least
    /// [`REBUILD_MIN_TOMBSTONES`]): time for [`EmbeddedVectorIndex::rebuild_graph`].
    pub fn needs_rebuild(&self, ratio: f64) -> bool {
        let slots = self.graph_vectors + self.tombstones;
        self.tombstones >= REBUILD_MIN_TOMBSTONES && self.tombstones as f64 > ratio * slots as f64
    }
}

impl std::fmt::Debug for EmbeddedVectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedVectorIndex")
            .field("dir", &self.dir)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the index and its graph inserter share.
struct Shared {
    mem: RwLock<Mem>,
    /// Serializes graph insertions (background, back-pressure, tests) and snapshots. Lock
    /// order: writer connection → `insert` → `mem`.
    insert: Mutex<()>,
    ctl: Mutex<Ctl>,
    wake: Condvar,
    /// Set at close: a running insertion stops within a few vectors.
    abort: AtomicBool,
    options: EmbeddedOptions,
    /// The index directory and database id (what a load reads).
    dir: PathBuf,
    db_id: String,
}

/// Control of the background inserter.
#[derive(Debug, Default)]
struct Ctl {
    stop: bool,
    paused: bool,
    /// A write left vectors in the fresh segment since the inserter last looked.
    pending: bool,
    /// A writer asked for the graph to be loaded (see [`Shared::load_concurrently`]).
    load: bool,
}

thread_local! {
    /// Set while this thread runs the `during` hook of an insertion step: insertions it would
    /// start (back-pressure, `settle`) are skipped instead of waiting for the step it is in.
    static IN_STEP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The nice value of the background graph inserter's threads (Linux): a search or a write
/// that wakes on a busy machine preempts a graph insertion instead of waiting out its time
/// slice (docs/indexing.md, "Search during graph insertion").
const INSERTER_NICE: i32 = 10;

/// Source of [`Mem::epoch`] values.
static EPOCH: AtomicU64 = AtomicU64::new(1);

fn next_epoch() -> u64 {
    EPOCH.fetch_add(1, Ordering::Relaxed)
}

/// Derived in-memory state: the graph, the fresh segment and the filter table, as of
/// `generation`. Every key of the table is in the graph or in the fresh segment (FS1).
#[derive(Debug, Default)]
struct Mem {
    ann: Option<Ann>,
    fresh: Fresh,
    /// A graph insertion is running outside the lock: removals from the graph wait here.
    inserting: bool,
    deferred: Vec<u64>,
    /// Changes whenever the graph is replaced or cleared: an insertion that started on
    /// another epoch is discarded.
    epoch: u64,
    /// The graph changed since the snapshot on disk was written.
    graph_dirty: bool,
    table: KeyTable,
    model: Option<ModelIdentity>,
    dimension: Option<usize>,
    /// The database generation this state reflects.
    generation: u64,
    /// The generation of the snapshot on disk (the one `meta.snapshot_generation` names).
    saved: Option<u64>,
    /// At load: loaded from the snapshot, with this many keys changed to catch up.
    loaded: Option<usize>,
    /// False while changes are being applied, and after applying failed.
    healthy: bool,
    /// Whether the filter table, the graph and the fresh segment are in memory. An index
    /// opens without them (a command that only writes, or does nothing, never pays for
    /// loading the graph); the first search or maintenance call loads them, and so does a
    /// writer once it has added [`Mem::unloaded_limit`] vectors without them.
    resident: bool,
    /// Vectors added by writes committed while not resident (the tail the load will read).
    unloaded_adds: usize,
    /// While a load reads the database beside the writers: the writes committed meanwhile.
    catch_up: Option<CatchUp>,
}

/// Where [`EmbeddedVectorIndex::load_concurrently`] is when it calls its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadStep {
    /// Writes committed from now on are caught up; the database has not been read yet.
    Started,
    /// The database has been read; the catch-up and the swap follow.
    Read,
}

/// The writes committed while a load runs beside the writers ([`Shared::load_concurrently`]),
/// in commit order: the load applies those its read did not see.
struct CatchUp {
    /// Which load collects them (a load finding another's, or none, was superseded).
    ticket: u64,
    commits: Vec<Committed>,
}

impl std::fmt::Debug for CatchUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatchUp")
            .field("ticket", &self.ticket)
            .field("commits", &self.commits.len())
            .finish()
    }
}

/// A change to the in-memory state implied by a committed write.
enum Op {
    Add {
        key: u64,
        vector: Vec<f32>,
        row: Row,
    },
    Remove(u64),
    Update {
        key: u64,
        row: Row,
    },
    Clear,
}

/// One write transaction and the changes it implies.
struct WriteTx<'c> {
    tx: &'c Transaction<'c>,
    ops: Vec<Op>,
    next_key: u64,
    first_key: u64,
    model: Option<ModelIdentity>,
    dimension: Option<usize>,
    stored_dimension: Option<usize>,
    model_changed: bool,
}

/// What a committed write hands to the in-memory state.
struct Committed {
    ops: Vec<Op>,
    generation: Option<u64>,
    model: Option<ModelIdentity>,
    dimension: Option<usize>,
}

impl<'c> WriteTx<'c> {
    fn new(tx: &'c Transaction<'c>) -> Result<Self> {
        let next_key = schema::meta_u64(tx, "next_key")?.unwrap_or(1);
        let dimension = schema::dimension(tx)?;
        Ok(WriteTx {
            tx,
            ops: Vec::new(),
            next_key,
            first_key: next_key,
            model: schema::model(tx)?,
            dimension,
            stored_dimension: dimension,
            model_changed: false,
        })
    }

    fn check_vector(&mut self, id: &str, v: &[f32]) -> Result<()> {
        check_vector(id, v, self.model.as_ref(), self.dimension)?;
        self.dimension = Some(v.len());
        Ok(())
    }

    /// Writes `r` with `vector`, kept at half precision (what the fresh segment and the
    /// graph get is what the file holds): the key is kept when the stored vector is
    /// bit-identical (a payload-only change), otherwise a fresh key replaces the old one.
    fn put(&mut self, r: &IndexRecord, node_version: u64, vector: &[f32]) -> Result<()> {
        let bytes = schema::encode_vector(vector);
        let vector = schema::decode_vector(&bytes)?;
        let row = Row::of(r);
        match schema::key_and_vector(self.tx, &r.uri, r.level)? {
            Some((key, old)) if old == bytes => {
                schema::put_row(self.tx, r, node_version, &bytes, key)?;
                self.ops.push(Op::Update { key, row });
            }
            old => {
                let key = self.next_key;
                self.next_key += 1;
                schema::put_row(self.tx, r, node_version, &bytes, key)?;
                if let Some((old_key, _)) = old {
                    self.ops.push(Op::Remove(old_key));
                }
                self.ops.push(Op::Add { key, vector, row });
            }
        }
        Ok(())
    }

    /// Deletes the record of node `uri` at `level`; whether it existed.
    fn delete_at(&mut self, uri: &CtxUri, level: Level) -> Result<bool> {
        let key = schema::delete_row_at(self.tx, uri, level)?;
        if let Some(key) = key {
            self.ops.push(Op::Remove(key));
        }
        Ok(key.is_some())
    }

    /// Deletes the record with `key`; whether it existed.
    fn delete_key(&mut self, key: u64) -> Result<bool> {
        let deleted = schema::delete_row_key(self.tx, key)?;
        if deleted {
            self.ops.push(Op::Remove(key));
        }
        Ok(deleted)
    }

    /// Deletes every record of node `uri`; how many. One statement whatever the number of
    /// records (a node's removal is the bulk of a subtree's or a folder's).
    fn delete_node(&mut self, uri: &CtxUri) -> Result<u64> {
        let keys = schema::delete_node_rows(self.tx, uri)?;
        self.ops.extend(keys.iter().map(|&key| Op::Remove(key)));
        Ok(keys.len() as u64)
    }

    /// [`VectorIndex::sync_node`] inside this transaction (records already checked).
    fn sync_node(
        &mut self,
        uri: &CtxUri,
        version: u64,
        records: &[NodeRecord],
    ) -> Result<SyncOutcome> {
        if !SeenVersion::admits_write(self.seen_version(uri)?, version) {
            return Ok(SyncOutcome::Stale);
        }
        let mut resolved = Vec::with_capacity(records.len());
        for NodeRecord { record, vector } in records {
            let vector = match vector {
                Some(v) => Cow::Borrowed(v.as_slice()),
                None => match schema::vector_and_text_hash(self.tx, &record.uri, record.level)? {
                    Some((bytes, stored)) => {
                        check_kept(stored.as_deref(), record)?;
                        Cow::Owned(schema::decode_vector(&bytes)?)
                    }
                    None => return Err(missing_vector(record)),
                },
            };
            self.check_vector(&record.id, &vector)?;
            resolved.push((record, vector));
        }
        for (level, key) in schema::node_rows(self.tx, uri)? {
            if !resolved.iter().any(|(r, _)| r.level.as_u8() == level) {
                self.delete_key(key)?;
            }
        }
        for (record, vector) in resolved {
            self.put(record, version, &vector)?;
        }
        self.set_seen_version(uri, SeenVersion::live(version))?;
        Ok(SyncOutcome::Applied)
    }

    /// [`VectorIndex::remove_node`] inside this transaction.
    fn remove_node(&mut self, uri: &CtxUri, version: u64) -> Result<SyncOutcome> {
        if !SeenVersion::admits_removal(self.seen_version(uri)?, version) {
            return Ok(SyncOutcome::Stale);
        }
        self.delete_node(uri)?;
        self.set_seen_version(uri, SeenVersion::removed(version))?;
        Ok(SyncOutcome::Applied)
    }

    /// Runs `f` as one write of a batch ([`crate::sqlite::Isolation::run`]): if it fails in
    /// its savepoint, its rows and its in-memory changes are rolled back and its error is
    /// returned inside `Ok`.
    fn isolated<T>(
        &mut self,
        isolation: &crate::sqlite::Isolation,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<Result<T>> {
        let (ops, next_key, dimension) = (self.ops.len(), self.next_key, self.dimension);
        let out = isolation.run(self.tx, DB_FILE, || f(self))?;
        if out.is_err() {
            self.ops.truncate(ops);
            self.next_key = next_key;
            self.dimension = dimension;
        }
        Ok(out)
    }

    fn finish(self) -> Result<Committed> {
        if self.next_key != self.first_key {
            schema::set_meta(self.tx, "next_key", &self.next_key.to_string())?;
        }
        if self.dimension != self.stored_dimension {
            match self.dimension {
                Some(d) => schema::set_meta(self.tx, "dimension", &d.to_string())?,
                None => schema::delete_meta(self.tx, "dimension")?,
            }
        }
        let touches_ann = self
            .ops
            .iter()
            .any(|op| matches!(op, Op::Add { .. } | Op::Remove(_) | Op::Clear));
        let generation = if touches_ann {
            let g = schema::meta_u64(self.tx, "generation")?.unwrap_or(0) + 1;
            schema::set_meta(self.tx, "generation", &g.to_string())?;
            Some(g)
        } else {
            None
        };
        if self.model_changed {
            match &self.model {
                Some(m) => schema::set_model(self.tx, m)?,
                None => schema::delete_meta(self.tx, "model")?,
            }
        }
        Ok(Committed {
            ops: self.ops,
            generation,
            model: self.model,
            dimension: self.dimension,
        })
    }
}

impl SeenVersions for WriteTx<'_> {
    fn seen_version(&mut self, uri: &CtxUri) -> Result<Option<SeenVersion>> {
        crate::sqlite::seen_version(self.tx, DB_FILE, uri)
    }

    fn set_seen_version(&mut self, uri: &CtxUri, v: SeenVersion) -> Result<()> {
        crate::sqlite::set_seen_version(self.tx, DB_FILE, uri, v)
    }
}

impl Mem {
    /// The state of an index whose graph and filter table are not loaded: what the
    /// database's meta rows say, nothing more (see [`Mem::resident`]).
    fn unloaded(conn: &Connection) -> Result<Mem> {
        Ok(Mem {
            model: schema::model(conn)?,
            dimension: schema::dimension(conn)?,
            generation: schema::meta_u64(conn, "generation")?.unwrap_or(0),
            saved: schema::meta_u64(conn, "snapshot_generation")?,
            healthy: true,
            epoch: next_epoch(),
            ..Mem::default()
        })
    }

    /// How many vectors a writer adds without the graph before it loads it: half the fresh
    /// segment's bound, so that the load can keep what it reads back fresh (searchable at
    /// once, inserted in the background) instead of inserting it into the graph first.
    fn unloaded_limit(&self, o: &EmbeddedOptions) -> usize {
        let per_vector = Fresh::bytes_for(1, self.dimension.unwrap_or(384));
        (o.fresh_max_bytes / per_vector / 2).max(1)
    }

    /// Builds the in-memory state from the database: the filter table from the rows, the graph
    /// from the snapshot `meta.snapshot_generation` names, brought up to date (AK1), when
    /// `use_snapshot` and the snapshot checks out — else from the stored vectors.
    fn load(
        conn: &Connection,
        dir: &Path,
        db_id: &str,
        o: &EmbeddedOptions,
        use_snapshot: bool,
    ) -> Result<Mem> {
        let generation = schema::meta_u64(conn, "generation")?.unwrap_or(0);
        let snapshot = schema::meta_u64(conn, "snapshot_generation")?;
        let mut mem = Mem {
            model: schema::model(conn)?,
            dimension: schema::dimension(conn)?,
            generation,
            healthy: true,
            resident: true,
            epoch: next_epoch(),
            ..Mem::default()
        };
        if let (true, Some(d), None) = (use_snapshot, mem.dimension, snapshot) {
            // No graph was ever saved (a first import by commands that only wrote, or a crash
            // before the first snapshot): when the vectors fit the fresh segment they are read
            // into it — searchable at once — and the inserter builds the graph in one pass.
            if Fresh::bytes_for(schema::count(conn)? as usize, d) <= o.fresh_max_bytes {
                schema::scan_rows(conn, true, |r, v| {
                    let key = r.key;
                    mem.table.insert(key, &table_row(r));
                    if let Some(v) = v {
                        mem.fresh.push(key, &v);
                    }
                    Ok(())
                })?;
                ann::remove_other_snapshots(dir, None)?;
                mem.graph_dirty = true;
                return Ok(mem);
            }
        }
        if let (true, Some(d), Some(g)) = (use_snapshot, mem.dimension, snapshot) {
            // The snapshot holds the graph without the vectors: they stream into it from the
            // rows, read in key order with the filter table.
            if let Ok(image) = ann::Snapshot::read(&ann::snapshot_path(dir, db_id, g), d) {
                let keys = image.keys();
                let fetch = |key: u64| -> Result<Option<Vec<f32>>> {
                    Ok(schema::vectors_by_keys(conn, &[key])?.pop().map(|(_, v)| v))
                };
                let scan = |put: &mut dyn FnMut(u64, &[f32]) -> Result<()>| {
                    schema::scan_rows(conn, true, |r, v| {
                        if let Some(v) = v {
                            put(r.key, &v)?;
                        }
                        mem.table.insert(r.key, &table_row(r));
                        Ok(())
                    })
                };
                let graph = image.into_graph(o, scan, &fetch);
                let mut fresh = Fresh::default();
                if let Ok((graph, removed, caught_up)) = graph.and_then(|graph| {
                    Self::from_snapshot(conn, dir, db_id, g, keys, graph, o, &mem.table, &mut fresh)
                }) {
                    mem.ann = Some(graph);
                    mem.fresh = fresh;
                    mem.saved = Some(g);
                    mem.graph_dirty = removed > 0;
                    mem.loaded = Some(removed + caught_up);
                    ann::remove_other_snapshots(dir, Some((db_id, g)))?;
                    return Ok(mem);
                }
                mem.table = KeyTable::default();
            }
        }
        Self::rebuild(conn, o, &mut mem)?;
        mem.graph_dirty = true;
        if use_snapshot {
            // At open: the snapshot is missing or failed its checks.
            ann::remove_other_snapshots(dir, None)?;
        } else {
            // A rebuild while running: the snapshot on disk stays good for a later open.
            mem.saved = snapshot;
        }
        Ok(mem)
    }

    /// Checks the graph of the snapshot of generation `g` (`graph`, loaded, whose live keys
    /// the file named `keys`) and brings it up to date with the database (whose
    /// filter table is `table`): keys it has that the database lost are removed, keys the
    /// database gained (the tail) are read from the stored vectors into `fresh` — or straight
    /// into the graph when they would not fit [`EmbeddedOptions::fresh_max_bytes`]. Returns
    /// the graph, how many keys were removed and how many were caught up. Any doubt
    /// (unreadable files, counts that do not add up, a sampled vector that differs) is an
    /// error, and the caller rebuilds instead.
    #[allow(clippy::too_many_arguments)]
    fn from_snapshot(
        conn: &Connection,
        dir: &Path,
        db_id: &str,
        g: u64,
        keys: Vec<u64>,
        mut graph: Ann,
        o: &EmbeddedOptions,
        table: &KeyTable,
        fresh: &mut Fresh,
    ) -> Result<(Ann, usize, usize)> {
        let path = ann::snapshot_path(dir, db_id, g);
        let mismatch =
            |what: &str| IndexError::Corrupt(format!("snapshot {}: {what}", path.display()));
        let dimension = graph.dimension();
        if keys.len() != graph.len() || keys.iter().any(|k| !graph.contains(*k)) {
            return Err(mismatch(
                "usearch loaded another key set than the file's slots",
            ));
        }
        let mut removed = 0;
        for k in keys.iter().filter(|k| table.id(**k).is_none()) {
            graph.remove(*k)?;
            removed += 1;
        }
        let missing: Vec<u64> = table.keys().filter(|k| !graph.contains(*k)).collect();
        let into_fresh = Fresh::bytes_for(missing.len(), dimension) <= o.fresh_max_bytes;
        for chunk in missing.chunks(4096) {
            let rows = schema::vectors_by_keys(conn, chunk)?;
            if rows.len() != chunk.len() {
                return Err(mismatch("rows vanished while catching up"));
            }
            if into_fresh {
                for (k, v) in &rows {
                    fresh.push(*k, v);
                }
            } else {
                let items: Vec<(u64, &[f32])> =
                    rows.iter().map(|(k, v)| (*k, v.as_slice())).collect();
                graph.add(&items)?;
            }
        }
        if graph.len() + fresh.len() != table.len() {
            return Err(mismatch("vector count differs from the database"));
        }
        let (mut buf, mut scratch) = (ann::GraphVector::default(), Vec::new());
        for (k, v) in schema::sample_vectors(conn, 32)? {
            let same = match fresh.get(k) {
                Some(f) => f == v.as_slice(),
                None => graph.holds(k, &v, &mut buf, &mut scratch),
            };
            if !same {
                return Err(mismatch(&format!("vector of key {k} differs")));
            }
        }
        Ok((graph, removed, missing.len()))
    }

    fn rebuild(conn: &Connection, o: &EmbeddedOptions, mem: &mut Mem) -> Result<()> {
        const CHUNK: usize = 8192;
        let mut chunk: Vec<(u64, Vec<f32>)> = Vec::with_capacity(CHUNK);
        let mut ann: Option<Ann> = None;
        let flush = |chunk: &mut Vec<(u64, Vec<f32>)>, ann: &mut Option<Ann>| -> Result<()> {
            let Some((_, first)) = chunk.first() else {
                return Ok(());
            };
            if ann.is_none() {
                *ann = Some(Ann::new(first.len(), o)?);
            }
            if let Some(a) = ann.as_mut() {
                let items: Vec<(u64, &[f32])> =
                    chunk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
                a.add(&items)?;
            }
            chunk.clear();
            Ok(())
        };
        schema::scan_rows(conn, true, |r, v| {
            let key = r.key;
            mem.table.insert(key, &table_row(r));
            if let Some(v) = v {
                chunk.push((key, v));
            }
            if chunk.len() == CHUNK {
                flush(&mut chunk, &mut ann)?;
            }
            Ok(())
        })?;
        flush(&mut chunk, &mut ann)?;
        if mem.dimension.is_none() {
            mem.dimension = ann.as_ref().map(Ann::dimension);
        }
        mem.ann = ann;
        Ok(())
    }

    /// Applies a committed write: new vectors go to the fresh segment (searchable at once),
    /// removed ones leave whichever part holds them.
    fn apply(&mut self, c: Committed) -> Result<()> {
        if !self.resident {
            // The database holds the write; the load reads it back (a load running beside
            // the writers may have read before it: it is kept for that load).
            self.unloaded_adds += c
                .ops
                .iter()
                .filter(|op| matches!(op, Op::Add { .. }))
                .count();
            if let Some(g) = c.generation {
                self.generation = g;
            }
            self.model.clone_from(&c.model);
            self.dimension = c.dimension;
            if let Some(catch_up) = self.catch_up.as_mut() {
                catch_up.commits.push(c);
            }
            return Ok(());
        }
        for op in c.ops {
            match op {
                Op::Add { key, vector, row } => {
                    self.table.insert(key, &row);
                    self.fresh.push(key, &vector);
                }
                Op::Remove(key) => {
                    self.table.remove(key);
                    if !self.fresh.remove(key) {
                        self.remove_from_graph(key)?;
                    }
                }
                Op::Update { key, row } => self.table.insert(key, &row),
                Op::Clear => {
                    self.table = KeyTable::default();
                    self.fresh.clear();
                    self.ann = None;
                    self.inserting = false;
                    self.deferred.clear();
                    self.epoch = next_epoch();
                    self.graph_dirty = true;
                }
            }
        }
        if let Some(g) = c.generation {
            self.generation = g;
        }
        self.model = c.model;
        self.dimension = c.dimension;
        Ok(())
    }

    /// Applies the writes committed while this state was read from the database, which saw
    /// it at generation `read_at`: a write that changed the vectors carries its generation,
    /// and is applied when newer; a write that only changed filter data carries none, so it
    /// may or may not have been read — its rows are applied to the keys the state holds
    /// (applying a row twice, in commit order, ends with the newest; a key the state lacks
    /// was removed by a write the read saw, or is added by a newer one applied first).
    fn catch_up(&mut self, read_at: u64, commits: Vec<Committed>) -> Result<()> {
        let mut last = None;
        for mut c in commits {
            last = Some((c.model.clone(), c.dimension));
            match c.generation {
                Some(g) if g <= read_at => continue,
                Some(_) => {}
                None => c.ops.retain(
                    |op| matches!(op, Op::Update { key, .. } if self.table.id(*key).is_some()),
                ),
            }
            self.apply(c)?;
        }
        if let Some((model, dimension)) = last {
            self.model = model;
            self.dimension = dimension;
        }
        Ok(())
    }

    /// Removes `key` from the graph, or defers that while an insertion runs (usearch must not
    /// remove while another thread adds; the insertion's end applies deferred removals).
    fn remove_from_graph(&mut self, key: u64) -> Result<()> {
        if self.inserting {
            self.deferred.push(key);
            return Ok(());
        }
        if let Some(a) = self.ann.as_mut() {
            a.remove(key)?;
            self.graph_dirty = true;
        }
        Ok(())
    }

    /// The shortlist of the best `top_k` hits (keys with scores, see [`Mem::shortlist`]), the
    /// plan taken and the candidate count.
    fn search(
        &self,
        query: &[f32],
        filter: &SearchFilter,
        top_k: usize,
        strategy: SearchStrategy,
        o: &EmbeddedOptions,
    ) -> (Vec<(u64, f32)>, SearchPlan, usize) {
        let empty = (Vec::new(), SearchPlan::Empty, 0);
        let Some(c) = self.table.compile(filter) else {
            return empty;
        };
        let table = &self.table;
        let n = table.len();
        if n == 0 {
            return empty;
        }
        let limit = match strategy {
            SearchStrategy::Auto => o.exact_limit(n),
            SearchStrategy::Exact => usize::MAX,
            SearchStrategy::Ann => 0,
        };
        let trivial = c.is_trivial();
        // Counting stops past what the decisions below need: the exact limit, and top_k.
        let cap = limit.max(top_k);
        let (count, keys) = if trivial {
            (
                n,
                if n <= limit {
                    table.keys().collect()
                } else {
                    Vec::new()
                },
            )
        } else {
            table.scan(&c, limit, cap)
        };
        if count == 0 {
            return empty;
        }
        if count <= limit {
            return (self.exact(query, &keys, top_k), SearchPlan::Exact, count);
        }
        // The fresh segment is scanned exactly (filter first); the graph answers for the rest.
        // The table decides membership: a key the graph still holds after its record was
        // removed (an insertion in flight) never passes.
        let admit = |k: u64| table.matches(k, &c);
        let mut scored = self.fresh.scan(query, admit);
        let fresh_matches = scored.len();
        let mut graph_found = 0;
        if let Some(ann) = &self.ann {
            // Asked for a shortlist's worth: near-ties the graph's rounding cannot tell apart
            // are then all rescored.
            let wanted = shortlist_cap(top_k);
            let found = if trivial {
                ann.search(query, wanted)
            } else {
                ann.filtered_search(query, wanted, admit)
            };
            // A graph error (e.g. every search context busy) degrades to the exact path.
            let found: Vec<u64> = found
                .unwrap_or_default()
                .into_iter()
                .filter(|k| admit(*k))
                .collect();
            graph_found = found.len();
            // A key in both parts (an insertion in flight) is scored once, from the fresh side.
            let only_graph: Vec<u64> = found
                .into_iter()
                .filter(|k| !self.fresh.contains(*k))
                .collect();
            scored.extend(self.exact(query, &only_graph, only_graph.len()));
        }
        // `count` is exact up to `cap` ≥ top_k (a lower bound past it), so the graph holds at
        // least `count - fresh_matches` candidates: it must return as many as top_k allows,
        // and the merge must hold top_k (or every candidate).
        if graph_found >= top_k.min(count.saturating_sub(fresh_matches))
            && scored.len() >= top_k.min(count)
        {
            return (self.shortlist(scored, top_k), SearchPlan::Ann, count);
        }
        let (count, keys) = if trivial {
            (n, table.keys().collect())
        } else {
            table.scan(&c, usize::MAX, usize::MAX)
        };
        (
            self.exact(query, &keys, top_k),
            SearchPlan::AnnThenExact,
            count,
        )
    }

    /// Scores `keys` (exactly from the fresh segment, within [`ann::SCORE_ERROR`] from the
    /// graph's copies) and keeps their [`Mem::shortlist`].
    fn exact(&self, query: &[f32], keys: &[u64], top_k: usize) -> Vec<(u64, f32)> {
        const PARALLEL_FROM: usize = 16_384;
        let score = |keys: &[u64]| -> Vec<(u64, f32)> {
            let mut buf = ann::GraphVector::default();
            let scored = keys
                .iter()
                .filter_map(|k| {
                    if let Some(v) = self.fresh.get(*k) {
                        return Some((*k, cosine(query, v)));
                    }
                    let v = self.ann.as_ref()?.get(*k, &mut buf)?;
                    Some((*k, cosine(query, v)))
                })
                .collect();
            self.shortlist(scored, top_k)
        };
        let merged = ce_core::parallel::map_chunks(keys, PARALLEL_FROM, score);
        self.shortlist(merged.into_iter().flatten().collect(), top_k)
    }

    /// The best `top_k` of `scored` (score descending, id ascending) and every other within
    /// 2·[`ann::SCORE_ERROR`] of the `top_k`-th — up to [`shortlist_cap`] in all — best
    /// first. A graph score is within `SCORE_ERROR` of the stored vector's, so rescoring
    /// this shortlist with the stored vectors (`search_with`) finds the exact best `top_k`
    /// among `scored`; only a crowd of more near-ties than the cap allows could displace one.
    fn shortlist(&self, mut scored: Vec<(u64, f32)>, top_k: usize) -> Vec<(u64, f32)> {
        if top_k == 0 {
            return Vec::new();
        }
        let id = |k: u64| self.table.id(k).unwrap_or("");
        let order =
            |a: &(u64, f32), b: &(u64, f32)| b.1.total_cmp(&a.1).then_with(|| id(a.0).cmp(id(b.0)));
        let cap = shortlist_cap(top_k);
        if scored.len() > cap {
            scored.select_nth_unstable_by(cap - 1, order);
            scored.truncate(cap);
        }
        scored.sort_by(order);
        if let Some(&(_, kth)) = scored.get(top_k - 1) {
            let floor = kth - 2.0 * ann::SCORE_ERROR;
            let near = scored[top_k..].iter().take_while(|(_, s)| *s >= floor);
            let keep = top_k + near.count();
            scored.truncate(keep);
        }
        scored
    }
}

/// The most candidates a shortlist of the best `top_k` holds (see [`Mem::shortlist`]).
fn shortlist_cap(top_k: usize) -> usize {
    2 * top_k + 32
}

fn table_row(r: schema::TableRowSql) -> Row {
    Row {
        id: r.id,
        uri: r.uri,
        parent_uri: r.parent_uri,
        level: r.level,
        filters: r.filters,
    }
}

/// Where an insertion step adds its batch.
enum Target {
    Graph(ann::SharedGraph),
    /// The graph is empty: build one of this dimension from the batch.
    New(usize),
}

impl Shared {
    fn mem(&self) -> RwLockReadGuard<'_, Mem> {
        self.mem.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the background inserter to load the graph ([`Shared::load_concurrently`]).
    fn request_load(&self) {
        let mut ctl = crate::lock(&self.ctl);
        ctl.load = true;
        self.wake.notify_all();
    }

    /// Loads the graph, the filter table and the fresh segment as [`Mem::load`] does, reading
    /// through a connection of its own while writers go on committing: the writes committed
    /// from the start of the load are kept (`Mem::catch_up`) and those the read did not see
    /// are applied before the loaded state replaces the unloaded one. `during` runs at each
    /// [`LoadStep`] (a test hook). Returns whether this call loaded the state (not when it was
    /// loaded already, or another load got there first).
    fn load_concurrently(&self, during: &mut dyn FnMut(LoadStep)) -> Result<bool> {
        let ticket = {
            let mut mem = self.mem_mut();
            if mem.resident {
                return Ok(false);
            }
            match &mem.catch_up {
                Some(c) => c.ticket,
                None => {
                    let ticket = next_epoch();
                    mem.catch_up = Some(CatchUp {
                        ticket,
                        commits: Vec::new(),
                    });
                    ticket
                }
            }
        };
        // Every write from here on is kept; the read below starts after, so it misses none.
        during(LoadStep::Started);
        let read = || -> Result<Mem> {
            let conn = schema::open_conn(&self.dir.join(DB_FILE))?;
            let tx = conn.unchecked_transaction().map_err(sql)?;
            Mem::load(&tx, &self.dir, &self.db_id, &self.options, true)
        };
        let loaded = read();
        during(LoadStep::Read);
        let mut mem = self.mem_mut();
        if mem.resident || mem.catch_up.as_ref().map(|c| c.ticket) != Some(ticket) {
            return Ok(false);
        }
        let Some(catch_up) = mem.catch_up.take() else {
            return Ok(false);
        };
        let mut fresh = loaded?;
        let read_at = fresh.generation;
        fresh.catch_up(read_at, catch_up.commits)?;
        *mem = fresh;
        Ok(true)
    }

    fn mem_mut(&self) -> RwLockWriteGuard<'_, Mem> {
        self.mem.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the background inserter for good: a running step stops within a few vectors
    /// (what it added is kept), no other starts, and later steps (back-pressure, `settle`)
    /// add nothing.
    fn stop(&self) {
        {
            let mut ctl = crate::lock(&self.ctl);
            ctl.stop = true;
            self.wake.notify_all();
        }
        self.abort.store(true, Ordering::Relaxed);
    }

    fn notify(&self) {
        let mut ctl = crate::lock(&self.ctl);
        if !ctl.pending {
            ctl.pending = true;
            self.wake.notify_all();
        }
    }

    /// One graph insertion: copies up to `max` fresh vectors (every one when the graph is
    /// empty) under the lock, adds them to the graph outside it — searches and writes go on;
    /// removals from the graph are deferred — runs `during`, then, under the lock again,
    /// retires the batch from the fresh segment, removes from the graph the keys deleted
    /// meanwhile and applies the deferred removals. A batch whose state was replaced meanwhile
    /// (clear, rebuild) is dropped. Returns the batch size.
    fn insert_step(&self, max: usize, during: &mut dyn FnMut()) -> Result<usize> {
        if IN_STEP.with(std::cell::Cell::get) {
            return Ok(0);
        }
        let _serial = crate::lock(&self.insert);
        let (epoch, batch, target) = {
            let mut mem = self.mem_mut();
            if !mem.healthy || mem.fresh.is_empty() {
                return Ok(0);
            }
            let max = if mem.ann.is_none() {
                usize::MAX
            } else {
                max.max(1)
            };
            let batch = mem.fresh.batch(max);
            let target = match &mem.ann {
                Some(a) => {
                    a.reserve_for(batch.keys().len())?;
                    Target::Graph(a.shared())
                }
                None => Target::New(batch.dimension()),
            };
            mem.inserting = true;
            (mem.epoch, batch, target)
        };
        let started = std::time::Instant::now();
        let (added, built) = match target {
            Target::Graph(g) => (g.add(&batch.items(), &self.abort), None),
            Target::New(d) => match Ann::new(d, &self.options) {
                Ok(a) => {
                    let added = a
                        .reserve_for(batch.keys().len())
                        .and_then(|()| a.shared().add(&batch.items(), &self.abort));
                    (added, Some(a))
                }
                Err(e) => (Err(e), None),
            },
        };
        IN_STEP.with(|s| s.set(true));
        during();
        IN_STEP.with(|s| s.set(false));
        let mut mem = self.mem_mut();
        if mem.epoch != epoch {
            return Ok(batch.keys().len());
        }
        mem.inserting = false;
        let deferred = std::mem::take(&mut mem.deferred);
        let m = &mut *mem;
        if let Some(a) = built {
            m.ann = Some(a);
        }
        // Whatever made it into the graph (all of the batch unless the add failed or was
        // stopped) leaves the fresh segment; a key no longer fresh was deleted meanwhile.
        let retired = match m.ann.as_mut() {
            None => Ok(0),
            Some(a) => (|| -> Result<usize> {
                let mut moved = 0;
                for k in batch.keys() {
                    if a.contains(*k) {
                        moved += 1;
                        if !m.fresh.remove(*k) {
                            a.remove(*k)?;
                        }
                    }
                }
                a.note_added(moved);
                for k in deferred {
                    a.remove(k)?;
                }
                m.graph_dirty = true;
                Ok(moved)
            })(),
        };
        let moved = match retired {
            Ok(n) => n,
            Err(e) => {
                // The graph and the fresh segment may disagree: rebuild on next use.
                m.healthy = false;
                return Err(e);
            }
        };
        drop(mem);
        added?;
        metrics::counter!("index_vector_graph_inserted_total").increment(moved as u64);
        metrics::histogram!("index_vector_graph_insert_latency_ms")
            .record(started.elapsed().as_secs_f64() * 1e3);
        Ok(moved)
    }

    /// The background inserter: waits for a write, lingers so that a burst becomes one
    /// batch, then inserts until the fresh segment is empty, paused or stopped.
    fn run_inserter(self: Arc<Self>) {
        loop {
            {
                let mut ctl = crate::lock(&self.ctl);
                while !ctl.stop && !ctl.load && (ctl.paused || !ctl.pending) {
                    ctl = self.wake.wait(ctl).unwrap_or_else(PoisonError::into_inner);
                }
                if ctl.stop {
                    return;
                }
                if std::mem::take(&mut ctl.load) {
                    drop(ctl);
                    match self.load_concurrently(&mut |_| {}) {
                        // What it read back waits in the fresh segment: insert it next.
                        Ok(true) => self.notify(),
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "vector index: loading the graph failed");
                        }
                    }
                    continue;
                }
                ctl.pending = false;
            }
            std::thread::sleep(self.options.insert_linger);
            loop {
                {
                    let ctl = crate::lock(&self.ctl);
                    if ctl.stop || ctl.paused {
                        break;
                    }
                }
                match self.insert_step(self.options.insert_batch, &mut || {}) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "vector graph insertion failed; the in-memory state is rebuilt from the database on next use");
                        break;
                    }
                }
            }
        }
    }
}

/// What [`EmbeddedVectorIndex::peek`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The model its vectors belong to.
    pub model: Option<ModelIdentity>,
    /// Its records.
    pub records: u64,
}

impl EmbeddedVectorIndex {
    /// Opens (creating if needed) the index stored in `dir` with default options.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, EmbeddedOptions::default())
    }

    /// What the index in `dir` holds, read without opening it (and without its lock), e.g.
    /// while another process has it open: `None` when there is no index yet.
    pub fn peek(dir: &Path) -> Result<Option<Peek>> {
        let path = dir.join(DB_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let reader = crate::sqlite::read_only(schema::open_conn(&path)?, DB_FILE)?;
        Ok(Some(Peek {
            model: schema::model(&reader)?,
            records: schema::count(&reader)?,
        }))
    }

    /// Opens the index with explicit options.
    pub fn open_with(dir: &Path, options: EmbeddedOptions) -> Result<Self> {
        fs_err::create_dir_all(dir)
            .map_err(|e| IndexError::Unavailable(format!("vector index directory: {e}")))?;
        let lock = fs_err::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(|e| IndexError::Unavailable(format!("vector index lock: {e}")))?;
        // A process forked by this one holds a copy of the lock until it execs: retry briefly.
        let mut attempts = 0;
        loop {
            match lock.file().try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if attempts < 20 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(IndexError::Held(format!(
                        "vector index {} is already open (in this or another process)",
                        dir.display()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(IndexError::Unavailable(format!(
                        "cannot lock {}: {e}",
                        dir.join("LOCK").display()
                    )));
                }
            }
        }
        let path = dir.join(DB_FILE);
        let mut writer = schema::open_conn(&path)?;
        let db_id = schema::init(&mut writer)?;
        let reader = crate::sqlite::read_only(schema::open_conn(&path)?, DB_FILE)?;
        let mem = Mem::unloaded(&writer)?;
        let shared = Arc::new(Shared {
            mem: RwLock::new(mem),
            insert: Mutex::new(()),
            ctl: Mutex::new(Ctl::default()),
            wake: Condvar::new(),
            abort: AtomicBool::new(false),
            options: options.clone(),
            dir: dir.to_owned(),
            db_id: db_id.clone(),
        });
        let inserter = if options.background_insert {
            let s = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name("ce-vector-graph".into())
                    .spawn(move || {
                        // Background work: searches and writes preempt it (the threads of an
                        // insertion step inherit the priority).
                        if let Err(e) = ce_core::parallel::lower_thread_priority(INSERTER_NICE) {
                            tracing::debug!(error = %e, "vector graph inserter keeps its priority");
                        }
                        s.run_inserter()
                    })
                    .map_err(|e| {
                        IndexError::Unavailable(format!("vector graph inserter thread: {e}"))
                    })?,
            )
        } else {
            None
        };
        Ok(EmbeddedVectorIndex {
            dir: dir.to_owned(),
            db_id,
            options,
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
            shared,
            inserter,
            skip_snapshot: false,
            _lock: lock,
        })
    }

    /// Counters of the index, with its graph loaded (see [`EmbeddedVectorIndex::load`]); if
    /// loading fails, the counters of the unloaded index (`resident` false).
    pub fn stats(&self) -> EmbeddedStats {
        if let Err(e) = self.load() {
            tracing::warn!(error = %e, "vector index: loading the graph failed");
        }
        let mem = self.mem();
        EmbeddedStats {
            records: mem.table.len(),
            graph_vectors: mem.ann.as_ref().map_or(0, Ann::len),
            fresh_vectors: mem.fresh.len(),
            fresh_bytes: mem.fresh.bytes(),
            tombstones: mem.ann.as_ref().map_or(0, Ann::tombstones),
            generation: mem.generation,
            snapshot_current: mem.saved.is_some() && !mem.graph_dirty && mem.fresh.is_empty(),
            opened_from_snapshot: mem.loaded.is_some(),
            snapshot_catch_up: mem.loaded.unwrap_or(0),
            resident: mem.resident,
        }
    }

    /// What a closing process does (also on drop): stops graph insertion for good — a running
    /// step within a few vectors, what it added kept — and writes the snapshot of the graph as
    /// it is, without waiting for the rest of the fresh segment (the next open reads it back
    /// as the tail). Searches and writes go on; what is written after it stays fresh.
    pub fn close_graph(&self) -> Result<()> {
        self.shared.stop();
        self.save_snapshot()
    }

    /// Closes the index without writing a snapshot, as a crash would: the next open rebuilds
    /// the graph from the stored vectors.
    pub fn close_without_snapshot(mut self) {
        self.skip_snapshot = true;
    }

    /// Whether the graph and the filter table are in memory (without loading them, unlike
    /// [`EmbeddedVectorIndex::stats`]).
    pub fn resident(&self) -> bool {
        self.mem().resident
    }

    /// Writes the snapshot of the graph as it is and drops the graph, the filter table and the
    /// fresh segment from memory, as a short-lived command closing and the next one opening
    /// would (without releasing the directory's lock): later writes commit to the database
    /// alone until something loads the index again (test and maintenance hook).
    pub fn unload(&self) -> Result<()> {
        self.save_snapshot()?;
        let conn = lock(&self.writer);
        let _serial = crate::lock(&self.shared.insert);
        *self.mem_mut() = Mem::unloaded(&conn)?;
        Ok(())
    }

    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options the index was opened with.
    pub fn options(&self) -> &EmbeddedOptions {
        &self.options
    }

    fn mem(&self) -> RwLockReadGuard<'_, Mem> {
        self.shared.mem()
    }

    fn mem_mut(&self) -> RwLockWriteGuard<'_, Mem> {
        self.shared.mem_mut()
    }

    /// Pauses (or resumes) the background graph inserter after its current step: a test and
    /// maintenance hook. Back-pressure still inserts when the fresh segment outgrows its bound.
    pub fn pause_graph_insertion(&self, paused: bool) {
        let mut ctl = crate::lock(&self.shared.ctl);
        ctl.paused = paused;
        ctl.pending = true;
        self.shared.wake.notify_all();
    }

    /// Moves up to `max` fresh vectors into the graph (all of them when the graph is empty:
    /// it is then built once from every fresh vector); returns how many were taken. The
    /// background inserter calls the same step.
    pub fn insert_step(&self, max: usize) -> Result<usize> {
        self.recover()?;
        self.shared.insert_step(max, &mut || {})
    }

    /// [`EmbeddedVectorIndex::insert_step`] running `during` after the batch is in the graph
    /// but before it leaves the fresh segment — the window in which a concurrent search or
    /// write meets a key in both parts (test hook). Inside `during`, insertions are skipped
    /// (back-pressure, [`EmbeddedVectorIndex::settle`] and these hooks do nothing), and
    /// [`EmbeddedVectorIndex::flush`], [`EmbeddedVectorIndex::save_snapshot`] and
    /// [`EmbeddedVectorIndex::check_consistency`] must not be called: they wait for the step.
    pub fn insert_step_with(&self, max: usize, mut during: impl FnMut()) -> Result<usize> {
        self.recover()?;
        self.shared.insert_step(max, &mut during)
    }

    /// Moves every fresh vector into the graph (e.g. before measuring graph search).
    pub fn settle(&self) -> Result<()> {
        self.recover()?;
        while self.shared.insert_step(usize::MAX, &mut || {})? > 0 {}
        Ok(())
    }

    /// After a write: wakes the inserter, or — when the fresh segment is over its bound —
    /// inserts here until it is back under (back-pressure: the caller holds the writer
    /// connection, so further writes wait). A failed insertion leaves the state unhealthy;
    /// the next call rebuilds it from the database.
    fn after_write(&self) {
        let (over, pending) = {
            let mem = self.mem();
            (
                mem.fresh.bytes() > self.options.fresh_max_bytes,
                !mem.fresh.is_empty(),
            )
        };
        if over {
            metrics::counter!("index_vector_insert_backpressure_total").increment(1);
            while self.mem().fresh.bytes() > self.options.fresh_max_bytes {
                match self
                    .shared
                    .insert_step(self.options.insert_batch, &mut || {})
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        } else if pending {
            self.shared.notify();
        }
    }

    /// Loads like [`EmbeddedVectorIndex::load`] without holding up writes, as the background
    /// inserter does once a writer has added enough vectors without the graph: reads the
    /// database through a connection of its own, then applies the writes committed meanwhile.
    /// `during` runs at each [`LoadStep`] (a test hook). Returns whether this call loaded.
    pub fn load_concurrently(&self, during: &mut dyn FnMut(LoadStep)) -> Result<bool> {
        self.shared.load_concurrently(during)
    }

    /// Loads the graph, the filter table and the fresh segment if they are not in memory yet:
    /// the last snapshot of the graph and the tail of writes after it (read into the fresh
    /// segment, where the background inserter picks them up), or, with no snapshot, every
    /// stored vector into the fresh segment when they fit it, else a graph built from them.
    /// Searches and the maintenance calls load on their own; a long-running process calls it
    /// once so that its first search does not wait. Writes wait meanwhile.
    pub fn load(&self) -> Result<()> {
        if self.mem().resident {
            return Ok(());
        }
        let conn = lock(&self.writer);
        self.load_locked(&conn)
    }

    /// [`EmbeddedVectorIndex::load`] for a caller holding the writer connection.
    fn load_locked(&self, conn: &Connection) -> Result<()> {
        if self.mem().resident {
            return Ok(());
        }
        let mem = Mem::load(conn, &self.dir, &self.db_id, &self.options, true)?;
        let pending = !mem.fresh.is_empty();
        *self.mem_mut() = mem;
        if pending {
            self.shared.notify();
        }
        Ok(())
    }

    /// Rebuilds the in-memory state if a failed apply left it behind the database. The caller
    /// holds the writer connection.
    fn recover_locked(&self, conn: &Connection) -> Result<()> {
        if self.mem().healthy {
            return Ok(());
        }
        let fresh = Mem::load(conn, &self.dir, &self.db_id, &self.options, false)?;
        *self.mem_mut() = fresh;
        Ok(())
    }

    /// Brings the in-memory state up to the database: loaded ([`EmbeddedVectorIndex::load`])
    /// and healthy (rebuilt after a failed apply).
    fn recover(&self) -> Result<()> {
        {
            let mem = self.mem();
            if mem.healthy && mem.resident {
                return Ok(());
            }
        }
        let conn = lock(&self.writer);
        self.recover_locked(&conn)?;
        self.load_locked(&conn)
    }

    /// Runs `f` in one write transaction, then applies its changes to the in-memory state.
    fn write<T>(&self, f: impl FnOnce(&mut WriteTx<'_>) -> Result<T>) -> Result<T> {
        let mut conn = lock(&self.writer);
        self.recover_locked(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        let mut w = WriteTx::new(&tx)?;
        let out = f(&mut w)?;
        let committed = w.finish()?;
        tx.commit().map_err(sql)?;
        {
            let mut mem = self.mem_mut();
            mem.healthy = false;
            if mem.apply(committed).is_ok() {
                mem.healthy = true;
            } else if let Ok(fresh) = Mem::load(&conn, &self.dir, &self.db_id, &self.options, false)
            {
                // The write is committed either way; if this rebuild fails too, the next call
                // retries it (`healthy` stays false).
                *mem = fresh;
            }
        }
        let (resident, adds, limit) = {
            let mem = self.mem();
            (
                mem.resident,
                mem.unloaded_adds,
                mem.unloaded_limit(&self.options),
            )
        };
        if !resident && adds >= limit {
            // Enough vectors wait for the graph: from here on this process inserts them in
            // the background, as a resident index does (the write is committed either way).
            // The background inserter loads beside the writers; without one, this writer
            // loads.
            if self.inserter.is_some() {
                self.shared.request_load();
            } else if let Err(e) = self.load_locked(&conn) {
                tracing::warn!(error = %e, "vector index: loading the graph failed");
            }
        }
        self.after_write();
        Ok(out)
    }

    /// Searches like [`VectorIndex::search`] with an explicit strategy, reporting the plan.
    pub fn search_with(
        &self,
        query: &[f32],
        filter: &SearchFilter,
        top_k: usize,
        strategy: SearchStrategy,
    ) -> Result<SearchReport> {
        self.recover()?;
        let mut report = SearchReport {
            hits: Vec::new(),
            plan: SearchPlan::Empty,
            candidates: 0,
        };
        // A write committing between the graph search and the read of the rows can remove or
        // move a hit; the search then runs again on the new state.
        for _ in 0..4 {
            let (scored, plan, candidates) = {
                let mem = self.mem();
                if !check_query(query, mem.model.as_ref(), mem.dimension)? || top_k == 0 {
                    return Ok(report);
                }
                mem.search(query, filter, top_k, strategy, &self.options)
            };
            let (hits, complete) = self.rescore(query, filter, &scored, top_k)?;
            report = SearchReport {
                hits,
                plan,
                candidates,
            };
            if complete {
                break;
            }
        }
        Ok(report)
    }

    /// Reads the rows of a search's `shortlist`, scores them with their stored vectors and
    /// returns the best `top_k` that still match `filter` — and whether the result is
    /// complete: false when a row vanished or stopped matching since the in-memory search (a
    /// write raced it), then the caller searches again.
    fn rescore(
        &self,
        query: &[f32],
        filter: &SearchFilter,
        shortlist: &[(u64, f32)],
        top_k: usize,
    ) -> Result<(Vec<VectorHit>, bool)> {
        let keys: Vec<u64> = shortlist.iter().map(|(k, _)| *k).collect();
        let mut rows = schema::shortlist_rows(&lock(&self.reader), &keys)?;
        let mut complete = rows.len() == keys.len();
        let mut ranked: Vec<(f32, schema::ShortlistRow)> = keys
            .iter()
            .filter_map(|k| rows.remove(k))
            .map(|row| (cosine(query, &row.vector), row))
            .collect();
        ranked.sort_by(|(a, ra), (b, rb)| {
            b.total_cmp(a)
                .then_with(|| ra.record.id().cmp(rb.record.id()))
        });
        let mut hits = Vec::with_capacity(top_k.min(ranked.len()));
        for (score, row) in ranked {
            if hits.len() == top_k {
                break;
            }
            let record = row.record.decode()?.record;
            if filter.matches(&record) {
                hits.push(VectorHit { record, score });
            } else {
                complete = false;
            }
        }
        Ok((hits, complete))
    }

    /// Moves every fresh vector into the graph, then writes a snapshot of the graph if it
    /// changed since the last one, so that the next open loads it instead of rebuilding the
    /// graph from the stored vectors; a later crash then costs only the catch-up of the writes
    /// after it. Long-running processes should call it now and then (e.g. every few minutes
    /// under write load) to bound the recovery time after a crash. Closing the index writes
    /// the snapshot without settling first (see [`EmbeddedVectorIndex::save_snapshot`]).
    pub fn flush(&self) -> Result<()> {
        self.settle()?;
        self.save_snapshot()
    }

    /// Writes a snapshot of the graph as it is, if it changed since the last one. Vectors
    /// still in the fresh segment are not in it: they are the tail the next open reads back
    /// from the database. Called on drop.
    pub fn save_snapshot(&self) -> Result<()> {
        let conn = lock(&self.writer);
        self.recover_locked(&conn)?;
        // No insertion runs while the graph is written (and none is half done).
        let _serial = crate::lock(&self.shared.insert);
        let generation = {
            let mut mem = self.mem_mut();
            // Not loaded: the graph did not change, the snapshot on disk stays good (what
            // was written since is its tail).
            if !mem.resident || (mem.saved.is_some() && !mem.graph_dirty) {
                return Ok(());
            }
            let Some(graph) = &mem.ann else {
                ann::remove_other_snapshots(&self.dir, None)?;
                mem.graph_dirty = false;
                return Ok(());
            };
            let g = mem.generation;
            graph.save(&ann::snapshot_path(&self.dir, &self.db_id, g))?;
            ann::sync_dir(&self.dir)?;
            g
        };
        // Only now, with the file durable, does the database point at it.
        schema::set_meta(&conn, "snapshot_generation", &generation.to_string())?;
        ann::remove_other_snapshots(&self.dir, Some((&self.db_id, generation)))?;
        {
            let mut mem = self.mem_mut();
            mem.saved = Some(generation);
            mem.graph_dirty = false;
        }
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .map_err(sql)?;
        Ok(())
    }

    /// Rebuilds the graph from the stored vectors, dropping the slots of removed vectors
    /// (see [`EmbeddedStats::tombstones`]): maintenance after most records were deleted.
    /// Writes wait meanwhile; searches keep using the old graph until the new one is ready.
    pub fn rebuild_graph(&self) -> Result<()> {
        let conn = lock(&self.writer);
        let fresh = Mem::load(&conn, &self.dir, &self.db_id, &self.options, false)?;
        *self.mem_mut() = fresh;
        Ok(())
    }

    /// Checks that the graph and the filter table agree with the stored records: the same keys,
    /// bit-identical vectors, the same ids. Returns [`IndexError::Corrupt`] describing the first
    /// differences.
    pub fn check_consistency(&self) -> Result<()> {
        let conn = lock(&self.writer);
        self.recover_locked(&conn)?;
        self.load_locked(&conn)?;
        let _serial = crate::lock(&self.shared.insert);
        let mem = self.mem();
        let mut problems = Vec::new();
        let mut rows = 0usize;
        let (mut buf, mut scratch) = (ann::GraphVector::default(), Vec::new());
        schema::scan_rows(&conn, true, |r, v| {
            rows += 1;
            if mem.table.id(r.key) != Some(r.id.as_str()) {
                problems.push(format!(
                    "filter table: key {} is not record {}",
                    r.key, r.id
                ));
            }
            let in_graph = mem.ann.as_ref().is_some_and(|a| a.contains(r.key));
            let same = match (mem.fresh.get(r.key), &mem.ann, v) {
                (Some(f), _, Some(v)) => !in_graph && f == v.as_slice(),
                (None, Some(a), Some(v)) => a.holds(r.key, &v, &mut buf, &mut scratch),
                _ => false,
            };
            if !same {
                problems.push(format!(
                    "graph/fresh: vector of key {} ({}) differs or is in both",
                    r.key, r.id
                ));
            }
            Ok(())
        })?;
        let graph_len = mem.ann.as_ref().map_or(0, Ann::len);
        if graph_len + mem.fresh.len() != rows || mem.table.len() != rows {
            problems.push(format!(
                "{rows} records, {graph_len} graph vectors, {} fresh vectors, {} filter entries",
                mem.fresh.len(),
                mem.table.len()
            ));
        }
        if problems.is_empty() {
            return Ok(());
        }
        problems.truncate(5);
        Err(IndexError::Corrupt(problems.join("; ")))
    }
}

impl Drop for EmbeddedVectorIndex {
    fn drop(&mut self) {
        // The inserter stops within a few vectors (what it added is retired); what is still
        // fresh stays in the database and is the tail the next open reads back.
        self.shared.stop();
        if let Some(h) = self.inserter.take() {
            let _ = h.join();
        }
        // Best effort: without a snapshot the next open catches up from an older one or
        // rebuilds the graph. A graph left behind by a failed apply is not worth rebuilding
        // just to save it.
        if !self.skip_snapshot && self.mem().healthy {
            let _ = self.save_snapshot();
        }
    }
}

impl VectorIndex for EmbeddedVectorIndex {
    fn model(&self) -> Result<Option<ModelIdentity>> {
        schema::model(&lock(&self.reader))
    }

    fn bind_model(&self, model: &ModelIdentity) -> Result<()> {
        self.write(|w| {
            check_binding(w.model.as_ref(), w.dimension, model)?;
            if w.model.as_ref() != Some(model) {
                w.model = Some(model.clone());
                w.model_changed = true;
            }
            Ok(())
        })
    }

    fn upsert(&self, records: &[VectorRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        self.write(|w| {
            for r in records {
                w.check_vector(&r.record.id, &r.vector)?;
            }
            for r in records {
                w.put(&r.record, metadata_version(&r.record), &r.vector)?;
            }
            Ok(())
        })
    }

    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64> {
        self.write(|w| {
            if !subtree {
                return w.delete_node(uri);
            }
            let mut n = 0;
            for key in schema::keys_within(w.tx, uri)? {
                n += u64::from(w.delete_key(key)?);
            }
            Ok(n)
        })
    }

    fn move_uri(&self, from: &CtxUri, to: &CtxUri) -> Result<u64> {
        if !check_move(from, to)? {
            return Ok(0);
        }
        self.write(|w| {
            let moving = schema::rows_within(w.tx, from)?;
            let rewritten = moving
                .iter()
                .map(|(_, s)| moved_record(&s.record, from, to))
                .collect::<Result<Vec<_>>>()?;
            let mut moved = 0;
            for ((key, old), new) in moving.into_iter().zip(rewritten) {
                if !move_versions(w, &old.record.uri, &new.uri, old.node_version)? {
                    w.delete_key(key)?;
                    continue;
                }
                // A record already at the target (a half-done earlier move) is replaced; the
                // moved row keeps its key and vector, so the graph does not change.
                w.delete_at(&new.uri, new.level)?;
                if !schema::rewrite_row(w.tx, key, &new, old.node_version)? {
                    continue;
                }
                w.ops.push(Op::Update {
                    key,
                    row: Row::of(&new),
                });
                moved += 1;
            }
            Ok(moved)
        })
    }

    fn search(&self, query: &[f32], filter: &SearchFilter, top_k: usize) -> Result<Vec<VectorHit>> {
        Ok(self
            .search_with(query, filter, top_k, SearchStrategy::Auto)?
            .hits)
    }

    fn sync_node(
        &self,
        uri: &CtxUri,
        version: u64,
        records: Vec<NodeRecord>,
    ) -> Result<SyncOutcome> {
        check_node_records(uri, records.iter().map(|r| &r.record))?;
        self.write(|w| w.sync_node(uri, version, &records))
    }

    fn remove_node(&self, uri: &CtxUri, version: u64) -> Result<SyncOutcome> {
        self.write(|w| w.remove_node(uri, version))
    }

    /// One transaction for the whole batch (one fsync); a failing write is rolled back alone
    /// ([`crate::sqlite::write_batch`]).
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        crate::sqlite::write_batch(writes, |writes, isolation| {
            self.write(|w| {
                let mut out = Vec::with_capacity(writes.len());
                for nw in writes {
                    out.push(w.isolated(isolation, |w| match nw {
                        NodeWrite::Sync {
                            uri,
                            version,
                            records,
                        } => {
                            check_node_records(uri, records.iter().map(|r| &r.record))?;
                            w.sync_node(uri, *version, records)
                        }
                        NodeWrite::Remove { uri, version } => w.remove_node(uri, *version),
                        NodeWrite::Purge { uri } => {
                            w.delete_node(uri)?;
                            Ok(SyncOutcome::Applied)
                        }
                    })?);
                }
                Ok(out)
            })
        })
    }

    // One read transaction per call: a statement per node outside one would each take and
    // release the WAL's read locks (system calls).
    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>> {
        crate::sqlite::read(&self.reader, DB_FILE, |tx| schema::get_nodes(tx, uris))
    }

    fn vectors(&self, uris: &[CtxUri]) -> Result<Vec<StoredVector>> {
        crate::sqlite::read(&self.reader, DB_FILE, |tx| schema::node_vectors(tx, uris))
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        Ok(schema::rows_within(&lock(&self.reader), uri)?
            .into_iter()
            .map(|(_, s)| s)
            .collect())
    }

    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        crate::sqlite::uris_within(&lock(&self.reader), DB_FILE, uri)
    }

    fn count(&self) -> Result<u64> {
        schema::count(&lock(&self.reader))
    }

    fn clear(&self) -> Result<()> {
        self.write(|w| {
            w.tx.execute_batch("DELETE FROM records; DELETE FROM uri_versions;")
                .map_err(sql)?;
            w.ops.push(Op::Clear);
            w.model = None;
            w.model_changed = true;
            w.dimension = None;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{EmbeddedOptions, EmbeddedStats};

    #[test]
    fn exact_limit_grows_with_the_square_root() {
        let o = EmbeddedOptions::default();
        assert_eq!(o.exact_limit(1_000), 5_000);
        assert_eq!(o.exact_limit(50_000), 5_000);
        assert_eq!(o.exact_limit(100_000), 6_324);
        assert_eq!(o.exact_limit(1_000_000), 20_000);
    }

    #[test]
    fn rebuild_needs_enough_tombstones_in_absolute_and_relative_terms() {
        let stats = |graph_vectors, tombstones| EmbeddedStats {
            records: graph_vectors,
            graph_vectors,
            fresh_vectors: 0,
            fresh_bytes: 0,
            tombstones,
            generation: 1,
            snapshot_current: true,
            opened_from_snapshot: false,
            snapshot_catch_up: 0,
            resident: true,
        };
        assert!(
            !stats(100, 900).needs_rebuild(0.3),
            "too few in absolute terms"
        );
        assert!(stats(1_000, 1_000).needs_rebuild(0.3));
        assert!(!stats(10_000, 2_000).needs_rebuild(0.3), "1/6 of the slots");
        assert!(stats(10_000, 5_000).needs_rebuild(0.3));
    }
}
