//! Helpers shared by the suites: records shaped like the projector's, every vector-index
//! implementation behind one runner, seeds and whole-index snapshots; and the worker
//! suites' harness ([`Env`]: a real store of either [`Backend`] on a manual clock, [`Running`]
//! worker threads).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use ce_core::{
    Config, CtxUri, DeliveryStatus, IndexRecord, Level, ManualClock, PathDefaults, stable_hash,
};
use ce_index::vector::embedded::{EmbeddedOptions, EmbeddedVectorIndex};
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{
    NodeRecord, SearchFilter, StoredRecord, StoredVector, VectorIndex, VectorRecord,
};
use ce_index::vector::{PgVectorIndex, PgVectorOptions};
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::postgres::PgStore;
use ce_store::{DeliveryRow, OutboxFilter, SourceStore, SqliteStore};
use ce_testkit::pg::TestDb;
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

/// `v` as every vector index keeps it (half precision, `ce_embed::half`): what `vectors`
/// gives back.
pub fn kept(v: &[f32]) -> Vec<f32> {
    ce_embed::half::round(v)
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

/// Runs `f` against every vector index, each fresh and named: the exact in-memory index, the
/// embedded index (in a fresh directory, with default options and with the planner forced
/// onto the graph) and the pgvector index (in a fresh database of the pgvector test server,
/// likewise).
pub fn each_index(mut f: impl FnMut(&str, &dyn VectorIndex)) {
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
    drop(e);
    for (name, shape) in [
        ("embedded-fresh-only", Shape::FreshOnly),
        ("embedded-settled", Shape::Settled),
        ("embedded-mixed", Shape::Mixed),
        ("embedded-mid-insertion", Shape::MidInsertion),
        ("embedded-unloaded", Shape::Unloaded),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Shaped::open(dir.path(), shape);
        f(name, &e);
        e.0.check_consistency()
            .expect("graph and fresh segment agree with the records");
    }
    let (db, p) = pgvector("contract", PgVectorOptions::default());
    f("pgvector", &p);
    drop((p, db));
    let (db, p) = pgvector("contract_graph", pg_graph_only());
    f("pgvector-graph", &p);
    drop((p, db));
}

/// A pgvector index in a fresh database named after `label` on the pgvector test server;
/// the database is dropped with the returned [`TestDb`] (drop the index first).
pub fn pgvector(label: &str, options: PgVectorOptions) -> (TestDb, PgVectorIndex) {
    let db = ce_testkit::pgvector::test_db(label);
    let idx = PgVectorIndex::open_with(db.url(), options).expect("open pgvector index");
    (db, idx)
}

/// pgvector options that send every non-empty search through the HNSW index (with its
/// fallback to an exact scan when the graph comes up short), which exists from the first
/// write on (no bulk path).
pub fn pg_graph_only() -> PgVectorOptions {
    PgVectorOptions {
        exact_max_candidates: 0,
        defer_graph: false,
        ..PgVectorOptions::default()
    }
}

/// Options that send every filtered search through the graph.
pub fn graph_only() -> EmbeddedOptions {
    EmbeddedOptions {
        exact_max_candidates: 0,
        exact_max_fraction: 0.0,
        ..EmbeddedOptions::default()
    }
}

/// Where an embedded index under test keeps its vectors between calls (the background
/// inserter is off, so the shape is deterministic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Everything stays in the fresh segment.
    FreshOnly,
    /// Everything is moved into the graph after each write.
    Settled,
    /// About half of the fresh vectors are moved into the graph after each write.
    Mixed,
    /// Every read runs inside an insertion step of half the fresh vectors: after they were
    /// added to the graph and before they leave the fresh segment.
    MidInsertion,
    /// The graph is dropped from memory after each write (settled and its snapshot written
    /// when it was loaded), as a short-lived command closing would: the next writes commit
    /// without it, and a search loads the snapshot and reads the tail of writes after it
    /// into the fresh segment.
    Unloaded,
}

/// Options of [`Shaped`]: no background inserter, and the planner on the graph path (so that
/// the fresh + graph merge is what searches exercise).
pub fn shaped_options() -> EmbeddedOptions {
    EmbeddedOptions {
        background_insert: false,
        ..graph_only()
    }
}

/// An embedded index held in one [`Shape`], behind the [`VectorIndex`] contract.
pub struct Shaped(pub EmbeddedVectorIndex, pub Shape);

impl Shaped {
    /// Opens one in `dir`.
    pub fn open(dir: &Path, shape: Shape) -> Shaped {
        let idx = EmbeddedVectorIndex::open_with(dir, shaped_options()).expect("open embedded");
        Shaped(idx, shape)
    }

    fn after_write(&self) {
        if self.1 == Shape::Unloaded {
            // A write on a loaded index (after a search) settles into the graph first, so
            // that snapshots hold vectors and later loads catch up a tail on top of them.
            if self.0.resident() {
                self.0.settle().expect("settle");
            }
            self.0.unload().expect("unload");
            return;
        }
        let fresh = self.0.stats().fresh_vectors;
        match self.1 {
            Shape::FreshOnly | Shape::MidInsertion | Shape::Unloaded => {}
            Shape::Settled => self.0.settle().expect("settle"),
            Shape::Mixed if fresh > 1 => {
                self.0.insert_step(fresh / 2).expect("insert step");
            }
            Shape::Mixed => {}
        }
    }

    fn read<T>(&self, f: impl FnOnce(&EmbeddedVectorIndex) -> T) -> T {
        if self.1 != Shape::MidInsertion || self.0.stats().fresh_vectors == 0 {
            return f(&self.0);
        }
        let half = self.0.stats().fresh_vectors.div_ceil(2);
        let mut f = Some(f);
        let mut out = None;
        self.0
            .insert_step_with(half, || out = f.take().map(|f| f(&self.0)))
            .expect("insert step");
        out.expect("the step ran the read")
    }
}

impl VectorIndex for Shaped {
    fn model(&self) -> ce_index::Result<Option<ce_embed::ModelIdentity>> {
        self.0.model()
    }
    fn bind_model(&self, model: &ce_embed::ModelIdentity) -> ce_index::Result<()> {
        self.0.bind_model(model)
    }
    fn upsert(&self, records: &[VectorRecord]) -> ce_index::Result<()> {
        let r = self.0.upsert(records);
        self.after_write();
        r
    }
    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> ce_index::Result<u64> {
        let r = self.0.delete_by_uri(uri, subtree);
        self.after_write();
        r
    }
    fn move_uri(&self, from: &CtxUri, to: &CtxUri) -> ce_index::Result<u64> {
        let r = self.0.move_uri(from, to);
        self.after_write();
        r
    }
    fn search(
        &self,
        query: &[f32],
        filter: &SearchFilter,
        top_k: usize,
    ) -> ce_index::Result<Vec<ce_index::vector::VectorHit>> {
        self.read(|i| i.search(query, filter, top_k))
    }
    fn sync_node(
        &self,
        uri: &CtxUri,
        version: u64,
        records: Vec<NodeRecord>,
    ) -> ce_index::Result<ce_index::vector::SyncOutcome> {
        let r = self.0.sync_node(uri, version, records);
        self.after_write();
        r
    }
    fn remove_node(
        &self,
        uri: &CtxUri,
        version: u64,
    ) -> ce_index::Result<ce_index::vector::SyncOutcome> {
        let r = self.0.remove_node(uri, version);
        self.after_write();
        r
    }
    fn write_nodes(
        &self,
        writes: &[ce_index::vector::NodeWrite],
    ) -> ce_index::Result<Vec<ce_index::Result<ce_index::vector::SyncOutcome>>> {
        let r = self.0.write_nodes(writes);
        self.after_write();
        r
    }
    fn get(&self, uris: &[CtxUri]) -> ce_index::Result<Vec<StoredRecord>> {
        self.read(|i| i.get(uris))
    }
    fn vectors(&self, uris: &[CtxUri]) -> ce_index::Result<Vec<StoredVector>> {
        self.read(|i| i.vectors(uris))
    }
    fn list_under(&self, uri: &CtxUri) -> ce_index::Result<Vec<StoredRecord>> {
        self.read(|i| i.list_under(uri))
    }
    fn count(&self) -> ce_index::Result<u64> {
        self.read(|i| i.count())
    }
    fn clear(&self) -> ce_index::Result<()> {
        let r = self.0.clear();
        self.after_write();
        r
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

/// A source store under test, whatever its backend.
pub type Store = Arc<dyn SourceStore>;

pub use ce_testkit::backend_tests;
pub use ce_testkit::backends::{Backend, Place};

/// Opens the source store that lives in `place`, on `clock`.
fn open_store(place: &Place, config: Config, clock: ManualClock) -> Store {
    let clock = Arc::new(clock);
    match place {
        Place::Dir(dir) => Arc::new(
            SqliteStore::open_with_clock(dir.path(), config, clock).expect("open sqlite store"),
        ),
        Place::Db(db) => Arc::new(
            PgStore::open_with_clock(db.url(), config, clock).expect("open postgres store"),
        ),
    }
}

/// A real source store (SQLite or PostgreSQL) on a manual clock, whose outbox retries after
/// 1 s with backoffs capped at 30 s.
pub struct Env {
    /// The store.
    pub store: Store,
    /// Its clock.
    pub clock: ManualClock,
    /// Where the store lives (after `store`: dropped last).
    _place: Place,
}

impl Env {
    /// A SQLite store whose outbox feeds `consumers`; `tune` adjusts the configuration
    /// further.
    pub fn new(consumers: &[&str], tune: impl FnOnce(&mut Config)) -> Env {
        Env::on(Backend::Sqlite, consumers, tune)
    }

    /// [`Env::new`] on `backend`.
    pub fn on(backend: Backend, consumers: &[&str], tune: impl FnOnce(&mut Config)) -> Env {
        let mut cfg = Config::default();
        cfg.index.outbox.consumers = consumers.iter().map(|&c| c.to_owned()).collect();
        cfg.index.outbox.retry_base_seconds = 1;
        cfg.index.outbox.retry_max_seconds = 30;
        tune(&mut cfg);
        let clock = ManualClock::new(1_700_000_000_000);
        let place = backend.place();
        let store = open_store(&place, cfg, clock.clone());
        Env {
            store,
            clock,
            _place: place,
        }
    }

    /// Deliveries still to apply (pending, claimed, waiting to retry) of `consumer`, or of
    /// every consumer.
    pub fn open_deliveries(&self, consumer: Option<&str>) -> u64 {
        self.store
            .stats()
            .expect("stats")
            .iter()
            .filter(|s| consumer.is_none_or(|c| s.consumer == c))
            .map(|s| s.pending + s.claimed + s.retry_wait)
            .sum()
    }

    /// The dead deliveries.
    pub fn dead(&self) -> Vec<DeliveryRow> {
        self.store
            .list(&OutboxFilter {
                status: Some(DeliveryStatus::Dead),
                ..OutboxFilter::default()
            })
            .expect("dead")
    }

    /// Advances time over backoffs and expired leases while `running`'s threads work, until
    /// `done` holds: by 31 s while no thread is inside a batch, else by 2 s, so a batch that
    /// is merely slow (a loaded machine, a PostgreSQL round trip) keeps its lease through its
    /// heartbeats and leases expire only by the injected jumps and dead claims. After 2,000
    /// rounds and at least a minute, panics with `what` and the outbox statistics.
    pub fn settle(&self, running: &Running, what: &str, done: impl Fn() -> bool) {
        let started = std::time::Instant::now();
        let mut rounds = 0;
        while !done() {
            rounds += 1;
            assert!(
                rounds < 2_000 || started.elapsed() < Duration::from_secs(60),
                "{what}: {:?}",
                self.store.stats()
            );
            std::thread::sleep(Duration::from_millis(5));
            let step = if running.working.load(Ordering::SeqCst) == 0 {
                31_000
            } else {
                2_000
            };
            self.clock.advance(step);
        }
    }

    /// Runs `w` until no delivery is open, advancing the clock over backoffs and leases.
    pub fn drain(&self, w: &IndexWorker) {
        for _ in 0..2_000 {
            if w.run_once(64).expect("run_once").claimed == 0 {
                if self.open_deliveries(None) == 0 {
                    return;
                }
                self.clock.advance(31_000);
            }
        }
        panic!("outbox did not drain");
    }
}

/// What a random write committed: `None` when the store refused it (a missing node, a
/// taken target, a move into its own subtree: part of a random history). A retryable
/// failure is not part of it — the store is up and nothing holds it for long — and panics.
#[track_caller]
pub fn unless_refused<T>(res: ce_store::Result<T>) -> Option<T> {
    match res {
        Ok(v) => Some(v),
        Err(e) if ce_core::Classify::is_retryable(&e) => panic!("a random write failed: {e}"),
        Err(_) => None,
    }
}

/// The settings of worker `id` of `consumer`, renewing leases every 50 ms.
pub fn worker_config(id: &str, consumer: &str) -> WorkerConfig {
    let mut c = WorkerConfig::from_config(&Config::default(), id, consumer);
    c.heartbeat = Duration::from_millis(50);
    c
}

/// Worker threads, each running batches of 16 in a loop until [`Running::stop`].
pub struct Running {
    stop: Arc<AtomicBool>,
    /// Threads inside `run_once` (claiming, applying or acknowledging a batch).
    working: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Starts a thread per worker.
    pub fn start(workers: &[Arc<IndexWorker>]) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let working = Arc::new(AtomicUsize::new(0));
        let threads = workers
            .iter()
            .map(|w| {
                let (w, stop, working) = (w.clone(), stop.clone(), working.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        working.fetch_add(1, Ordering::SeqCst);
                        let claimed = w.run_once(16).map(|r| r.claimed).unwrap_or(0);
                        working.fetch_sub(1, Ordering::SeqCst);
                        if claimed == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                })
            })
            .collect();
        Running {
            stop,
            working,
            threads,
        }
    }

    /// Stops every thread and waits for it.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().expect("worker thread");
        }
    }
}

/// The write step of a [`WrappedRelations`]: sees every batch and decides what reaches the
/// index (fault injection, hooks).
pub type RelationWriteStep = dyn Fn(
        &dyn ce_index::relation::RelationIndex,
        &[ce_index::relation::RelationWrite],
    ) -> ce_index::Result<Vec<ce_index::Result<ce_index::relation::RelationOutcome>>>
    + Send
    + Sync;

/// A relation index whose batched writes go through `write`; every other call goes straight
/// to `inner`.
pub struct WrappedRelations {
    /// The real index.
    pub inner: Arc<dyn ce_index::relation::RelationIndex>,
    /// What happens to a batch of writes.
    pub write: Box<RelationWriteStep>,
}

impl WrappedRelations {
    /// Wraps `inner` with the write step `write`.
    pub fn new(
        inner: Arc<dyn ce_index::relation::RelationIndex>,
        write: impl Fn(
            &dyn ce_index::relation::RelationIndex,
            &[ce_index::relation::RelationWrite],
        )
            -> ce_index::Result<Vec<ce_index::Result<ce_index::relation::RelationOutcome>>>
        + Send
        + Sync
        + 'static,
    ) -> Arc<Self> {
        Arc::new(WrappedRelations {
            inner,
            write: Box::new(write),
        })
    }
}

impl ce_index::relation::RelationIndex for WrappedRelations {
    fn write_owners(
        &self,
        writes: &[ce_index::relation::RelationWrite],
    ) -> ce_index::Result<Vec<ce_index::Result<ce_index::relation::RelationOutcome>>> {
        (self.write)(self.inner.as_ref(), writes)
    }
    fn upsert_relations(
        &self,
        records: &[ce_index::relation::RelationRecord],
    ) -> ce_index::Result<()> {
        self.inner.upsert_relations(records)
    }
    fn delete_relations_by_uri(&self, uri: &CtxUri, subtree: bool) -> ce_index::Result<u64> {
        self.inner.delete_relations_by_uri(uri, subtree)
    }
    fn related(
        &self,
        uri: &CtxUri,
        relation_type: Option<&str>,
        direction: ce_index::relation::Direction,
        limit: usize,
    ) -> ce_index::Result<Vec<ce_index::relation::RelationRecord>> {
        self.inner.related(uri, relation_type, direction, limit)
    }
    fn list_under(
        &self,
        uri: &CtxUri,
    ) -> ce_index::Result<Vec<ce_index::relation::RelationRecord>> {
        self.inner.list_under(uri)
    }
    fn list_targeting(
        &self,
        uri: &CtxUri,
    ) -> ce_index::Result<Vec<ce_index::relation::RelationRecord>> {
        self.inner.list_targeting(uri)
    }
    fn owner_version(
        &self,
        owner: &CtxUri,
    ) -> ce_index::Result<Option<ce_index::relation::OwnerVersion>> {
        self.inner.owner_version(owner)
    }
    fn count(&self) -> ce_index::Result<u64> {
        self.inner.count()
    }
    fn clear(&self) -> ce_index::Result<()> {
        self.inner.clear()
    }
}

/// Rewrites the `records` table of the index file at `path` into the layout written before
/// 2026-12-06: `create_table` (records keyed by a unique `id`) with a plain index on
/// `(uri, level)`, its `columns` copied over, `meta.schema_version` set to `version`.
pub fn key_records_by_id(path: &Path, create_table: &str, columns: &str, version: u32) {
    let c = rusqlite::Connection::open(path).expect("open");
    c.execute_batch(&format!(
        "BEGIN;
         DROP INDEX records_by_node;
         ALTER TABLE records RENAME TO records_new;
         {create_table};
         CREATE INDEX records_by_uri ON records (uri, level);
         INSERT INTO records ({columns}) SELECT {columns} FROM records_new;
         DROP TABLE records_new;
         UPDATE meta SET value = '{version}' WHERE key = 'schema_version';
         COMMIT;"
    ))
    .unwrap_or_else(|e| panic!("rewrite {} to layout {version}: {e}", path.display()));
}
