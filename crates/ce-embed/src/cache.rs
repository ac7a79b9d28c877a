//! The embedding cache (DESIGN.md decision 6: never embed the same text twice).
//!
//! [`EmbeddingCache`] is a SQLite file of `(model identity key, sha256(text)) → vector`;
//! [`CachedEmbedder`] puts it in front of any [`Embedder`]:
//!
//! 1. hash every text and de-duplicate identical texts within the batch;
//! 2. look the distinct hashes up in the cache;
//! 3. send only the misses to the inner embedder, in **one** call;
//! 4. stage the new vectors for writing and return one vector per input text, in input
//!    order.
//!
//! New vectors are written in batches ([`EmbeddingCache::stage`]): they stay in memory, where
//! lookups find them, until what they cost the provider reaches [`STAGE_MAX_COST`] (50 ms) or
//! they number [`STAGE_MAX_VECTORS`], then go to the file in one transaction — and at
//! [`Embedder::flush`], which the index worker calls once a claimed batch is embedded, before
//! its index write, and when the cache is dropped. A call to a real model usually costs more than that on
//! its own and is written at once; vectors that cost next to nothing (the `hash` embedder, a
//! fast loopback server) are no longer written 32 at a time, a transaction each — which cost
//! more than computing them. A crash loses at most 50 ms of provider work.
//!
//! The cache is an optimisation and never a reason to fail: when it cannot be read, every
//! text is a miss; when it cannot be written, the vectors are still returned (both are
//! counted in [`CacheStats::cache_errors`]). A cached vector whose length is not the model's
//! dimension is treated as a miss and overwritten.
//!
//! Concurrent calls that miss the same text embed it once: the first claims it in an
//! in-flight table, the others wait for that call and then read the cache (they embed it
//! themselves only when that call failed). A call re-reads the cache for the misses it
//! claimed, so a call that finished between its first read and its claim is not paid twice.
//!
//! Layout (schema 2; docs/indexing.md "The cache file"): `models` names each model identity
//! once (a small integer id) and keeps its entry count, maintained by every write, so
//! [`EmbeddingCache::totals`] is one indexed read however large the cache grows; `vectors` is
//! a rowid table of `(model id, 32-byte sha256, vector blob)` with a unique index on the key.
//! Vectors are kept at half precision ([`crate::half`]: `1 + 2 × dimension` bytes); entries
//! written before that hold `f32`s and are still read (the blob's length tells which).
//! Schema 1 (one `WITHOUT ROWID` table keyed by hex strings) put each ~1.5 KiB vector beside
//! its key in an index b-tree, whose rows spill to an overflow page above ~1 KiB: about 4.7 KB
//! of file per 384-d vector. A schema-1 file is migrated in place when it is opened, keeping
//! every vector (they may have been paid for). New files use 8 KiB pages, so ten 384-d rows
//! share a page.
//!
//! Entries are never evicted: a vector costs `1 + 2 × dimension` bytes plus ~60 bytes of key
//! and index (about 830 bytes for a 384-d model). Deleting the file is always safe.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use sha2::{Digest, Sha256};

use crate::{EmbedError, Embedder, ModelIdentity};

/// Schema version stored in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 2;

/// Page size of a new cache file: ten 384-d vectors (769 bytes each) per page.
const PAGE_SIZE: u32 = 8192;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS models (
    id      INTEGER PRIMARY KEY,
    key     TEXT    NOT NULL UNIQUE,
    entries INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS vectors (
    id          INTEGER PRIMARY KEY,
    model       INTEGER NOT NULL,
    text_sha256 BLOB    NOT NULL,
    vector      BLOB    NOT NULL,
    created_at  INTEGER NOT NULL DEFAULT (unixepoch())
);
CREATE UNIQUE INDEX IF NOT EXISTS vectors_by_text ON vectors (model, text_sha256);
";

/// Schema 1 → 2, in one transaction: every vector is kept.
const MIGRATE_FROM_1: &str = "
INSERT OR IGNORE INTO models (key) SELECT DISTINCT model FROM embedding_cache;
INSERT OR REPLACE INTO vectors (model, text_sha256, vector, created_at)
    SELECT m.id, unhex(e.text_sha256), e.vector, e.created_at
    FROM embedding_cache e JOIN models m ON m.key = e.model
    WHERE unhex(e.text_sha256) IS NOT NULL;
UPDATE models SET entries = (SELECT count(*) FROM vectors v WHERE v.model = models.id);
DROP TABLE embedding_cache;
";

/// The cache key of a text: lower-case hex sha256 of its UTF-8 bytes.
pub fn text_key(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The stored form of a [`text_key`]: its 32 bytes (any other string is stored as it is).
fn key_bytes(key: &str) -> Vec<u8> {
    hex::decode(key).unwrap_or_else(|_| key.as_bytes().to_vec())
}

fn cache_err(path: &Path, what: &str, e: impl std::fmt::Display) -> EmbedError {
    EmbedError::Cache(format!("{what} {}: {e}", path.display()))
}

/// A persistent map `(model identity key, sha256 of text) → vector` in one SQLite
/// file (WAL; `synchronous = NORMAL`, so a power cut may lose the newest entries, which are
/// simply recomputed).
pub struct EmbeddingCache {
    conn: Mutex<Connection>,
    path: PathBuf,
    /// Model identity key → row id in `models` (ids are never deleted or reused).
    model_ids: Mutex<HashMap<String, i64>>,
    /// Vectors not yet written (see [`EmbeddingCache::stage`]). Locked before `conn` by
    /// whoever takes both, and held while they are written, so a reader finds each vector
    /// either here or in the file.
    staged: Mutex<Staged>,
}

/// Vectors kept in memory until written in one transaction.
#[derive(Default)]
struct Staged {
    /// Model identity key → text key → vector.
    vectors: HashMap<String, HashMap<String, Vec<f32>>>,
    /// How many vectors `vectors` holds.
    len: usize,
    /// What the provider spent computing them.
    cost: Duration,
}

/// The provider time a crash may lose: staged vectors are written once they cost this much
/// (a call to a remote or local model usually costs more on its own, and is written at once).
pub const STAGE_MAX_COST: Duration = Duration::from_millis(50);

/// Staged vectors are written once there are this many (about 6 MiB of 384-d vectors).
pub const STAGE_MAX_VECTORS: usize = 4096;

impl Drop for EmbeddingCache {
    fn drop(&mut self) {
        // Best effort: what is lost costs at most `STAGE_MAX_COST` to compute again.
        let _ = self.flush();
    }
}

impl std::fmt::Debug for EmbeddingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingCache")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl EmbeddingCache {
    /// Opens (creating if needed) the cache file at `path`; the parent directory is created
    /// too. A file of schema 1 is migrated to schema 2.
    pub fn open(path: &Path) -> Result<Self, EmbedError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| cache_err(parent, "cannot create directory", e))?;
        }
        let conn = Connection::open(path).map_err(|e| cache_err(path, "cannot open", e))?;
        Self::init(conn, path.to_path_buf())
    }

    /// An in-memory cache (tests, or a process that must not write files).
    pub fn open_in_memory() -> Result<Self, EmbedError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().map_err(|e| cache_err(&path, "cannot open", e))?;
        Self::init(conn, path)
    }

    fn init(mut conn: Connection, path: PathBuf) -> Result<Self, EmbedError> {
        let err = |e: rusqlite::Error| cache_err(&path, "cannot initialise", e);
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        // Plans that do not depend on bound values (docs/store.md, "Prepared statements").
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(err)?;
        // Takes effect only while the file is empty (SQLite ignores it afterwards).
        conn.execute_batch(&format!("PRAGMA page_size = {PAGE_SIZE}"))
            .map_err(err)?;
        // In-memory databases answer "memory" here; both are fine. Two processes creating
        // the file at once: SQLite answers one SQLITE_BUSY at once, without the busy timeout
        // (waiting for the exclusive lock would deadlock), so the switch is retried.
        let mut attempt: u64 = 0;
        let _mode: String = loop {
            match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
                Err(e)
                    if attempt < 100
                        && e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) =>
                {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(10 + attempt % 20));
                }
                r => break r.map_err(err)?,
            }
        };
        conn.execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(err)?;
        // One writer decides the layout; another process opening at once waits, then sees
        // the version the first wrote.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        let migrate = match version {
            0 => {
                // A new file, or one written before versions were stored (schema 1's table).
                tx.query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'embedding_cache'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(err)?
                    > 0
            }
            1 => true,
            SCHEMA_VERSION => false,
            other => {
                return Err(cache_err(
                    &path,
                    "cannot use",
                    format!(
                        "schema version {other} is newer than {SCHEMA_VERSION} (delete the \
                         file; it is only a cache)"
                    ),
                ));
            }
        };
        tx.execute_batch(SCHEMA).map_err(err)?;
        if migrate {
            tx.execute_batch(MIGRATE_FROM_1).map_err(err)?;
        }
        if version != SCHEMA_VERSION {
            tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
                .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        if migrate {
            // Give the old table's pages back to the file system (once; best effort: a
            // failure leaves free pages that later writes reuse).
            let _ = conn.execute_batch("VACUUM");
        }
        Ok(EmbeddingCache {
            conn: Mutex::new(conn),
            path,
            model_ids: Mutex::new(HashMap::new()),
            staged: Mutex::new(Staged::default()),
        })
    }

    /// The cache file (`:memory:` for an in-memory cache).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn staged(&self) -> std::sync::MutexGuard<'_, Staged> {
        // Staged vectors are whole entries: a panic elsewhere leaves nothing half-made.
        self.staged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>, EmbedError> {
        self.conn
            .lock()
            .map_err(|_| EmbedError::Cache(format!("{} connection poisoned", self.path.display())))
    }

    /// The id of `model` in `models`; `create` adds a missing one (inside the caller's write
    /// transaction), otherwise a missing model is `None`.
    fn model_id(
        &self,
        conn: &Connection,
        model: &str,
        create: bool,
    ) -> Result<Option<i64>, rusqlite::Error> {
        if let Some(id) = self
            .model_ids
            .lock()
            .ok()
            .and_then(|m| m.get(model).copied())
        {
            return Ok(Some(id));
        }
        if create {
            conn.prepare_cached("INSERT OR IGNORE INTO models (key) VALUES (?1)")?
                .execute([model])?;
        }
        let id: Option<i64> = conn
            .prepare_cached("SELECT id FROM models WHERE key = ?1")?
            .query_row([model], |r| r.get(0))
            .optional()?;
        if let (Some(id), false) = (id, create) {
            // A row created here is remembered by the caller once its transaction commits.
            self.remember(model, id);
        }
        Ok(id)
    }

    fn remember(&self, model: &str, id: i64) {
        if let Ok(mut ids) = self.model_ids.lock() {
            ids.insert(model.to_owned(), id);
        }
    }

    /// Looks up `keys` (from [`text_key`]) for `model` (a [`ModelIdentity::key`]); an entry
    /// whose length is not `dimension` comes back as `None`.
    pub fn get_many(
        &self,
        model: &str,
        dimension: usize,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<f32>>>, EmbedError> {
        let mut out: Vec<Option<Vec<f32>>> = {
            let staged = self.staged();
            let of_model = staged.vectors.get(model);
            keys.iter()
                .map(|k| {
                    of_model
                        .and_then(|m| m.get(k))
                        .filter(|v| v.len() == dimension)
                        .cloned()
                })
                .collect()
        };
        if out.iter().all(Option::is_some) {
            return Ok(out);
        }
        let mut conn = self.conn()?;
        let err = |e: rusqlite::Error| cache_err(&self.path, "cannot read", e);
        // One read transaction for all the keys: outside one, every lookup would be a
        // transaction of its own, taking and releasing the WAL's read locks (system calls).
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(err)?;
        let Some(model) = self.model_id(&tx, model, false).map_err(err)? else {
            return Ok(out);
        };
        {
            let mut stmt = tx
                .prepare_cached("SELECT vector FROM vectors WHERE model = ?1 AND text_sha256 = ?2")
                .map_err(err)?;
            for (key, slot) in keys.iter().zip(&mut out).filter(|(_, v)| v.is_none()) {
                let blob: Option<Vec<u8>> = stmt
                    .query_row(params![model, key_bytes(key)], |r| r.get(0))
                    .optional()
                    .map_err(err)?;
                *slot = blob.and_then(|b| decode(&b, dimension));
            }
        }
        tx.commit().map_err(err)?;
        Ok(out)
    }

    /// Stores `(key, vector)` pairs for `model` in one transaction, replacing old entries
    /// and counting the new ones in `models.entries`.
    pub fn put_many(&self, model: &str, entries: &[(&str, &[f32])]) -> Result<(), EmbedError> {
        // Staged vectors of the same keys are older: they must not be written over these.
        let mut staged = self.staged();
        if let Some(m) = staged.vectors.get_mut(model) {
            let removed = entries
                .iter()
                .filter(|(k, _)| m.remove(*k).is_some())
                .count();
            staged.len -= removed;
        }
        self.write(model, entries)
    }

    /// Keeps `entries` (vectors of `model` that cost the provider `cost`) in memory and writes
    /// them with others, in one transaction, once the staged vectors cost
    /// [`STAGE_MAX_COST`] or number [`STAGE_MAX_VECTORS`] — or at [`EmbeddingCache::flush`]
    /// and when the cache is dropped. [`EmbeddingCache::get_many`] finds them meanwhile.
    /// Writing vectors that cost little one small transaction at a time cost more than
    /// computing them; a crash loses at most what the staged vectors cost.
    pub fn stage(
        &self,
        model: &str,
        entries: &[(&str, &[f32])],
        cost: Duration,
    ) -> Result<(), EmbedError> {
        // As the file will hold them, so a lookup before and after the write agree.
        let kept = entries
            .iter()
            .map(|(key, v)| ((*key).to_owned(), crate::half::round(v)));
        self.stage_kept(model, kept, cost)
    }

    /// [`EmbeddingCache::stage`] of vectors already rounded as the file keeps them
    /// ([`crate::half::round`]).
    fn stage_kept(
        &self,
        model: &str,
        entries: impl Iterator<Item = (String, Vec<f32>)>,
        cost: Duration,
    ) -> Result<(), EmbedError> {
        let mut staged = self.staged();
        let m = staged.vectors.entry(model.to_owned()).or_default();
        let before = m.len();
        m.extend(entries);
        let added = m.len() - before;
        staged.len += added;
        staged.cost += cost;
        if staged.cost >= STAGE_MAX_COST || staged.len >= STAGE_MAX_VECTORS {
            self.write_staged(&mut staged)?;
        }
        Ok(())
    }

    /// Writes the staged vectors.
    pub fn flush(&self) -> Result<(), EmbedError> {
        self.write_staged(&mut self.staged())
    }

    /// Writes `staged` (the caller holds its lock until they are in the file) and empties it;
    /// on failure they are dropped (the cache never fails a caller).
    fn write_staged(&self, staged: &mut Staged) -> Result<(), EmbedError> {
        let taken = std::mem::take(staged);
        let mut result = Ok(());
        for (model, vectors) in &taken.vectors {
            let entries: Vec<(&str, &[f32])> = vectors
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            if let Err(e) = self.write(model, &entries) {
                result = Err(e);
            }
        }
        result
    }

    /// Writes `entries` in one transaction.
    fn write(&self, model: &str, entries: &[(&str, &[f32])]) -> Result<(), EmbedError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn()?;
        let err = |e: rusqlite::Error| cache_err(&self.path, "cannot write", e);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let id = self
            .model_id(&tx, model, true)
            .map_err(err)?
            .ok_or_else(|| cache_err(&self.path, "cannot write", "model row missing"))?;
        let mut added: i64 = 0;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO vectors (model, text_sha256, vector) \
                     VALUES (?1, ?2, ?3)",
                )
                .map_err(err)?;
            let mut update = tx
                .prepare_cached(
                    "UPDATE vectors SET vector = ?3, created_at = unixepoch() \
                     WHERE model = ?1 AND text_sha256 = ?2",
                )
                .map_err(err)?;
            for (key, v) in entries {
                let (key, blob) = (key_bytes(key), crate::half::encode(v));
                if insert.execute(params![id, key, blob]).map_err(err)? == 1 {
                    added += 1;
                } else {
                    update.execute(params![id, key, blob]).map_err(err)?;
                }
            }
        }
        if added > 0 {
            tx.execute(
                "UPDATE models SET entries = entries + ?2 WHERE id = ?1",
                params![id, added],
            )
            .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        self.remember(model, id);
        Ok(())
    }

    /// Number of entries stored for `model`.
    pub fn count(&self, model: &str) -> Result<u64, EmbedError> {
        Ok(self.totals(model)?.model_entries)
    }

    /// What the cache holds: entries of `model`, of every model, and the file's size — read
    /// from the maintained counts, never by counting rows.
    pub fn totals(&self, model: &str) -> Result<CacheTotals, EmbedError> {
        self.flush()?;
        let conn = self.conn()?;
        let read = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
            conn.query_row(sql, params, |r| r.get::<_, Option<i64>>(0))
                .map(|n| n.unwrap_or(0).max(0) as u64)
                .map_err(|e| cache_err(&self.path, "cannot read", e))
        };
        Ok(CacheTotals {
            model_entries: read(
                "SELECT (SELECT entries FROM models WHERE key = ?1)",
                &[&model],
            )?,
            entries: read("SELECT sum(entries) FROM models", &[])?,
            file_bytes: read(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                &[],
            )?,
        })
    }

    /// Deletes every entry of `model` (e.g. after switching models); returns how many.
    pub fn remove_model(&self, model: &str) -> Result<u64, EmbedError> {
        let mut staged = self.staged();
        if let Some(m) = staged.vectors.remove(model) {
            staged.len -= m.len();
        }
        let mut conn = self.conn()?;
        let err = |e: rusqlite::Error| cache_err(&self.path, "cannot write", e);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let Some(id) = self.model_id(&tx, model, false).map_err(err)? else {
            return Ok(0);
        };
        let n = tx
            .execute("DELETE FROM vectors WHERE model = ?1", [id])
            .map_err(err)?;
        tx.execute("UPDATE models SET entries = 0 WHERE id = ?1", [id])
            .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(n as u64)
    }
}

/// A stored vector of `dimension` components ([`crate::half`]); one of the `f32`s written
/// before half precision comes back rounded, as a new entry would.
fn decode(b: &[u8], dimension: usize) -> Option<Vec<f32>> {
    let v = crate::half::decode(b).filter(|v| v.len() == dimension)?;
    Some(if b.len().is_multiple_of(2) {
        crate::half::round(&v)
    } else {
        v
    })
}

/// What an [`EmbeddingCache`] holds, read from the file (the same for every process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheTotals {
    /// Vectors stored for the model asked about.
    pub model_entries: u64,
    /// Vectors stored for every model.
    pub entries: u64,
    /// The database file's size in bytes (its write-ahead log aside).
    pub file_bytes: u64,
}

/// Counters of a [`CachedEmbedder`] since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Distinct texts (per call) answered from the cache.
    pub hits: u64,
    /// Distinct texts (per call) not in the cache, hence sent to the provider.
    pub misses: u64,
    /// Input texts answered by an identical text earlier in the same call.
    pub duplicates: u64,
    /// Calls made to the inner embedder (at most one per [`Embedder::embed_texts`]).
    pub provider_calls: u64,
    /// Texts the inner embedder embedded successfully.
    pub texts_embedded: u64,
    /// Cache reads or writes that failed (the call went on without the cache).
    pub cache_errors: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    duplicates: AtomicU64,
    provider_calls: AtomicU64,
    texts_embedded: AtomicU64,
    cache_errors: AtomicU64,
}

/// An [`Embedder`] that answers from an [`EmbeddingCache`] first (see the module docs).
pub struct CachedEmbedder {
    inner: Arc<dyn Embedder>,
    cache: Arc<EmbeddingCache>,
    model_key: String,
    counters: Counters,
    in_flight: InFlight,
}

impl std::fmt::Debug for CachedEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEmbedder")
            .field("model", &self.model_key)
            .field("cache", &self.cache)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl CachedEmbedder {
    /// Wraps `inner`; entries are keyed by `inner.identity().key()`, so different models
    /// (or dimensions) never share vectors.
    pub fn new(inner: Arc<dyn Embedder>, cache: Arc<EmbeddingCache>) -> Self {
        let model_key = inner.identity().key();
        CachedEmbedder {
            inner,
            cache,
            model_key,
            counters: Counters::default(),
            in_flight: InFlight::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            provider_calls: c.provider_calls.load(Ordering::Relaxed),
            texts_embedded: c.texts_embedded.load(Ordering::Relaxed),
            cache_errors: c.cache_errors.load(Ordering::Relaxed),
        }
    }

    /// What the cache holds ([`EmbeddingCache::totals`] for this embedder's model).
    pub fn totals(&self) -> Result<CacheTotals, EmbedError> {
        self.cache.totals(&self.model_key)
    }

    /// The wrapped embedder.
    pub fn inner(&self) -> &Arc<dyn Embedder> {
        &self.inner
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<EmbeddingCache> {
        &self.cache
    }
}

impl CachedEmbedder {
    /// The cached vector of each key (`None`: not cached); `None` when the cache could not be
    /// read (counted in `cache_errors`).
    fn cached(&self, dim: usize, keys: &[String]) -> Option<Vec<Option<Vec<f32>>>> {
        let found = self.cache.get_many(&self.model_key, dim, keys).ok();
        if found.is_none() {
            self.counters.cache_errors.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Reads the vectors of `slots` from the cache into `vectors`; returns the slots still
    /// missing.
    fn fill_from_cache(
        &self,
        dim: usize,
        slots: &[usize],
        keys: &[String],
        vectors: &mut [Option<Vec<f32>>],
    ) -> Vec<usize> {
        let wanted: Vec<String> = slots.iter().map(|&s| keys[s].clone()).collect();
        for (&s, v) in slots
            .iter()
            .zip(self.cached(dim, &wanted).unwrap_or_default())
        {
            vectors[s] = v;
        }
        slots
            .iter()
            .copied()
            .filter(|&s| vectors[s].is_none())
            .collect()
    }

    /// Embeds the distinct texts of `slots` with the provider in one call, checks the
    /// answer, caches it and fills `vectors`.
    fn embed_into(
        &self,
        slots: &[usize],
        keys: &[String],
        distinct_texts: &[&str],
        vectors: &mut [Option<Vec<f32>>],
        timeout: Duration,
    ) -> Result<(), EmbedError> {
        let c = &self.counters;
        let dim = self.inner.identity().dimension;
        let texts: Vec<&str> = slots.iter().map(|&s| distinct_texts[s]).collect();
        c.provider_calls.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let fresh = self.inner.embed_texts(&texts, timeout)?;
        let cost = started.elapsed();
        if fresh.len() != texts.len() {
            return Err(EmbedError::InvalidResponse(format!(
                "{} returned {} vectors for {} texts",
                self.model_key,
                fresh.len(),
                texts.len()
            )));
        }
        if let Some(bad) = fresh.iter().find(|v| v.len() != dim) {
            return Err(EmbedError::InvalidResponse(format!(
                "{} returned a {}-dimensional vector, expected {dim}",
                self.model_key,
                bad.len()
            )));
        }
        c.texts_embedded
            .fetch_add(fresh.len() as u64, Ordering::Relaxed);
        // Returned as the cache keeps them, so a text's vector is the same whether it was
        // embedded now or read back.
        let fresh: Vec<Vec<f32>> = fresh.iter().map(|v| crate::half::round(v)).collect();
        let entries = slots
            .iter()
            .zip(&fresh)
            .map(|(&s, v)| (keys[s].clone(), v.clone()));
        if self
            .cache
            .stage_kept(&self.model_key, entries, cost)
            .is_err()
        {
            c.cache_errors.fetch_add(1, Ordering::Relaxed);
        }
        for (&s, v) in slots.iter().zip(fresh) {
            vectors[s] = Some(v);
        }
        Ok(())
    }
}

/// One text being embedded by some call: done once its vector is cached (or the call
/// gave up).
#[derive(Default)]
struct Flight {
    done: Mutex<bool>,
    finished: std::sync::Condvar,
}

impl Flight {
    /// Waits until the flight is done or `deadline` passes.
    fn wait_until(&self, deadline: std::time::Instant) {
        let mut done = self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while !*done {
            let now = std::time::Instant::now();
            if now >= deadline {
                return;
            }
            done = match self.finished.wait_timeout(done, deadline - now) {
                Ok((d, _)) => d,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// The texts (by cache key) being embedded right now by calls of one [`CachedEmbedder`]:
/// concurrent workers that miss the cache on the same text embed it once (the other waits
/// for it, then reads the cache), so a text is never paid for twice.
#[derive(Default)]
struct InFlight {
    flights: Mutex<std::collections::HashMap<String, Arc<Flight>>>,
}

/// The flights a call owns: ended (done, removed, waiters woken) when dropped, whether
/// the embedding succeeded or not.
struct Owned<'a> {
    in_flight: &'a InFlight,
    keys: Vec<(String, Arc<Flight>)>,
    /// The slots of the owned keys.
    slots: Vec<usize>,
}

impl InFlight {
    /// Takes the flights of `misses` (`(slot, key)`) no other call has; returns them and the
    /// flights to wait for.
    fn claim<'k>(
        &self,
        misses: impl Iterator<Item = (usize, &'k String)>,
    ) -> (Owned<'_>, Vec<(usize, Arc<Flight>)>) {
        let mut flights = self
            .flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut owned = Owned {
            in_flight: self,
            keys: Vec::new(),
            slots: Vec::new(),
        };
        let mut waits = Vec::new();
        for (slot, key) in misses {
            match flights.get(key) {
                Some(f) => waits.push((slot, f.clone())),
                None => {
                    let f = Arc::new(Flight::default());
                    flights.insert(key.clone(), f.clone());
                    owned.keys.push((key.clone(), f));
                    owned.slots.push(slot);
                }
            }
        }
        (owned, waits)
    }
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut flights = self
            .in_flight
            .flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (key, flight) in self.keys.drain(..) {
            flights.remove(&key);
            *flight
                .done
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
            flight.finished.notify_all();
        }
    }
}

impl Embedder for CachedEmbedder {
    fn identity(&self) -> &ModelIdentity {
        self.inner.identity()
    }

    fn paused_for(&self) -> Option<Duration> {
        self.inner.paused_for()
    }

    fn flush(&self) {
        if self.cache.flush().is_err() {
            self.counters.cache_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.flush();
    }

    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let dim = self.inner.identity().dimension;
        let c = &self.counters;

        // Distinct texts, and for each input the distinct slot it reads.
        let mut keys: Vec<String> = Vec::new();
        let mut distinct_texts: Vec<&str> = Vec::new();
        let mut slot_of: Vec<usize> = Vec::with_capacity(texts.len());
        let mut seen: std::collections::HashMap<String, usize> = Default::default();
        for t in texts {
            let key = text_key(t);
            let slot = match seen.get(&key) {
                Some(&s) => {
                    c.duplicates.fetch_add(1, Ordering::Relaxed);
                    s
                }
                None => {
                    let s = keys.len();
                    seen.insert(key.clone(), s);
                    keys.push(key);
                    distinct_texts.push(t);
                    s
                }
            };
            slot_of.push(slot);
        }

        let read = self.cached(dim, &keys);
        let readable = read.is_some();
        let mut vectors = read.unwrap_or_else(|| vec![None; keys.len()]);
        let misses: Vec<usize> = (0..keys.len()).filter(|&s| vectors[s].is_none()).collect();
        // Misses another call is embedding right now are waited for, not embedded again.
        let (owned, waits) = self.in_flight.claim(misses.iter().map(|&s| (s, &keys[s])));
        if !owned.slots.is_empty() {
            // A call that finished between the cache read above and the claim cached its
            // texts before it ended their flights: read the claimed misses once more (unless
            // the cache just failed to read).
            let left = if readable {
                self.fill_from_cache(dim, &owned.slots, &keys, &mut vectors)
            } else {
                owned.slots.clone()
            };
            if !left.is_empty() {
                self.embed_into(&left, &keys, &distinct_texts, &mut vectors, timeout)?;
            }
        }
        drop(owned);
        if !waits.is_empty() {
            let deadline = std::time::Instant::now() + timeout;
            for (_, flight) in &waits {
                flight.wait_until(deadline);
            }
            let waited: Vec<usize> = waits.iter().map(|(s, _)| *s).collect();
            // The other call failed (or the cache did): embed what is still missing here.
            let left = self.fill_from_cache(dim, &waited, &keys, &mut vectors);
            if !left.is_empty() {
                self.embed_into(&left, &keys, &distinct_texts, &mut vectors, timeout)?;
            }
        }
        c.hits
            .fetch_add((keys.len() - misses.len()) as u64, Ordering::Relaxed);
        c.misses.fetch_add(misses.len() as u64, Ordering::Relaxed);

        slot_of
            .iter()
            .map(|&s| {
                vectors[s].clone().ok_or_else(|| {
                    EmbedError::InvalidResponse(format!("no vector for distinct text {s}"))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashing embedder, slowed down, recording every text it embeds; fails its first
    /// `fail_first` calls.
    struct Slow {
        inner: crate::hash::HashEmbedder,
        texts: Mutex<Vec<String>>,
        fail_first: AtomicU64,
    }

    impl Embedder for Slow {
        fn identity(&self) -> &ModelIdentity {
            self.inner.identity()
        }

        fn embed_texts(&self, texts: &[&str], t: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
            std::thread::sleep(Duration::from_millis(150));
            self.texts
                .lock()
                .expect("texts")
                .extend(texts.iter().map(|t| (*t).to_owned()));
            let failing = self.fail_first.load(Ordering::SeqCst) > 0;
            if failing {
                self.fail_first.fetch_sub(1, Ordering::SeqCst);
                return Err(EmbedError::Provider {
                    status: Some(503),
                    message: "injected".into(),
                    retryable: true,
                });
            }
            self.inner.embed_texts(texts, t)
        }
    }

    fn slow(fail_first: u64) -> (Arc<Slow>, Arc<CachedEmbedder>) {
        let inner = Arc::new(Slow {
            inner: crate::hash::HashEmbedder::new(8),
            texts: Mutex::new(Vec::new()),
            fail_first: AtomicU64::new(fail_first),
        });
        let cache = Arc::new(EmbeddingCache::open_in_memory().expect("open"));
        (inner.clone(), Arc::new(CachedEmbedder::new(inner, cache)))
    }

    /// `n` threads embed `texts` at the same moment; their answers.
    fn at_once(
        e: &Arc<CachedEmbedder>,
        n: usize,
        texts: &'static [&'static str],
    ) -> Vec<Result<Vec<Vec<f32>>, EmbedError>> {
        let barrier = Arc::new(std::sync::Barrier::new(n));
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let (e, barrier) = (e.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    e.embed_texts(texts, Duration::from_secs(10))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect()
    }

    #[test]
    fn concurrent_misses_of_one_text_embed_it_once() {
        let (inner, e) = slow(0);
        let answers = at_once(&e, 4, &["same text", "other"]);
        let first = answers[0].as_ref().expect("embedded").clone();
        for a in &answers {
            assert_eq!(a.as_ref().expect("embedded"), &first);
        }
        let mut embedded = inner.texts.lock().expect("texts").clone();
        embedded.sort();
        assert_eq!(embedded, ["other", "same text"]);
        assert_eq!(e.stats().texts_embedded, 2);
    }

    #[test]
    fn a_failed_flight_is_embedded_again_by_its_waiter() {
        // The first call fails (whichever thread owns the text): the other, waiting for
        // it, embeds the text itself instead of failing or hanging.
        let (inner, e) = slow(1);
        let answers = at_once(&e, 2, &["t"]);
        assert_eq!(
            answers.iter().filter(|a| a.is_err()).count(),
            1,
            "{answers:?}"
        );
        assert_eq!(
            answers.iter().filter(|a| a.is_ok()).count(),
            1,
            "{answers:?}"
        );
        assert_eq!(inner.texts.lock().expect("texts").len(), 2);
        // Nothing is left in flight: the next call reads the cache.
        assert!(e.in_flight.flights.lock().expect("flights").is_empty());
        assert!(e.embed_texts(&["t"], Duration::from_secs(1)).is_ok());
        assert_eq!(inner.texts.lock().expect("texts").len(), 2);
    }

    #[test]
    fn text_key_is_sha256_hex() {
        assert_eq!(
            text_key(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn entries_round_trip_and_wrong_lengths_are_misses() {
        let cache = EmbeddingCache::open_in_memory().expect("open");
        let k = text_key("a");
        cache
            .put_many("m:x:3", &[(&k, &[1.0, -0.5, 0.25])])
            .expect("put");
        assert_eq!(
            cache
                .get_many("m:x:3", 3, std::slice::from_ref(&k))
                .expect("get"),
            vec![Some(vec![1.0, -0.5, 0.25])]
        );
        assert_eq!(
            cache
                .get_many("m:x:3", 4, std::slice::from_ref(&k))
                .expect("get"),
            vec![None]
        );
        assert_eq!(cache.get_many("m:y:3", 3, &[k]).expect("get"), vec![None]);
        assert_eq!(cache.count("m:x:3").expect("count"), 1);
        assert_eq!(cache.remove_model("m:x:3").expect("rm"), 1);
    }

    #[test]
    fn totals_are_read_from_the_file_by_any_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.db");
        let writer = EmbeddingCache::open(&path).expect("open");
        let (a, b) = (text_key("a"), text_key("b"));
        writer
            .put_many("m:x:2", &[(&a, &[1.0, 2.0]), (&b, &[3.0, 4.0])])
            .expect("put");
        writer.put_many("m:y:2", &[(&a, &[5.0, 6.0])]).expect("put");
        // Another handle (another process) sees what the first wrote.
        let reader = EmbeddingCache::open(&path).expect("open again");
        let t = reader.totals("m:x:2").expect("totals");
        assert_eq!((t.model_entries, t.entries), (2, 3));
        assert!(t.file_bytes > 0, "{t:?}");
        assert_eq!(reader.totals("m:z:2").expect("totals").model_entries, 0);
    }

    /// How many vectors of `model` the file holds, read through a handle of its own (as
    /// another process would).
    fn in_file(path: &Path, model: &str) -> u64 {
        let conn = Connection::open(path).expect("open");
        conn.query_row(
            "SELECT count(*) FROM vectors v JOIN models m ON m.id = v.model WHERE m.key = ?1",
            [model],
            |r| r.get::<_, i64>(0),
        )
        .expect("count") as u64
    }

    /// Staged vectors that cost little stay in memory, where lookups find them, until a flush
    /// writes them; then the file holds them; dropping the cache writes what is left.
    #[test]
    fn cheap_vectors_are_staged_until_a_flush_or_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.db");
        let cache = EmbeddingCache::open(&path).expect("open");
        let (a, b, c) = (text_key("a"), text_key("b"), text_key("c"));
        let cheap = Duration::from_millis(1);
        cache
            .stage("m:x:2", &[(&a, &[1.0, 2.0]), (&b, &[3.0, 4.0])], cheap)
            .expect("stage");
        assert_eq!(in_file(&path, "m:x:2"), 0, "written before a flush");
        assert_eq!(
            cache
                .get_many("m:x:2", 2, &[a.clone(), c.clone(), b.clone()])
                .expect("get"),
            vec![Some(vec![1.0, 2.0]), None, Some(vec![3.0, 4.0])]
        );
        // A staged vector of the wrong length is a miss, as a stored one is.
        assert_eq!(
            cache
                .get_many("m:x:2", 3, std::slice::from_ref(&a))
                .expect("get"),
            vec![None]
        );
        cache.flush().expect("flush");
        assert_eq!(in_file(&path, "m:x:2"), 2);
        assert_eq!(
            cache
                .get_many("m:x:2", 2, std::slice::from_ref(&b))
                .expect("get"),
            vec![Some(vec![3.0, 4.0])]
        );
        cache
            .stage("m:x:2", &[(&c, &[5.0, 6.0])], cheap)
            .expect("stage");
        assert_eq!(
            cache.count("m:x:2").expect("count"),
            3,
            "totals count staged ones"
        );
        cache
            .stage("m:y:2", &[(&c, &[7.0, 8.0])], cheap)
            .expect("stage");
        drop(cache);
        assert_eq!((in_file(&path, "m:x:2"), in_file(&path, "m:y:2")), (3, 1));
    }

    /// A provider call that costs more than `STAGE_MAX_COST` (a real model's) is in the file
    /// when it returns: a crash then loses nothing paid for. Cheap calls are staged, and a
    /// text embedded once is answered from memory by the next call.
    #[test]
    fn an_expensive_call_is_written_before_it_returns() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.db");
        let cache = Arc::new(EmbeddingCache::open(&path).expect("open"));
        let slow = Arc::new(Slow {
            inner: crate::hash::HashEmbedder::new(8),
            texts: Mutex::new(Vec::new()),
            fail_first: AtomicU64::new(0),
        });
        let embedder = CachedEmbedder::new(slow.clone(), cache.clone());
        let model = slow.identity().key();
        embedder
            .embed_texts(&["a", "b"], Duration::from_secs(5))
            .expect("embed");
        assert_eq!(in_file(&path, &model), 2);

        let cheap = CachedEmbedder::new(Arc::new(crate::hash::HashEmbedder::new(8)), cache);
        assert_eq!(cheap.identity().key(), model);
        let first = cheap
            .embed_texts(&["c", "a"], Duration::from_secs(5))
            .expect("embed");
        assert_eq!(in_file(&path, &model), 2, "a cheap call's vector is staged");
        let again = cheap
            .embed_texts(&["c"], Duration::from_secs(5))
            .expect("embed");
        assert_eq!(again[0], first[0]);
        let s = cheap.stats();
        assert_eq!((s.hits, s.misses, s.texts_embedded), (2, 1, 1), "{s:?}");
    }

    /// Staged vectors are written once what they cost reaches `STAGE_MAX_COST`, or once there
    /// are `STAGE_MAX_VECTORS` of them.
    #[test]
    fn staged_vectors_are_written_at_either_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.db");
        let cache = EmbeddingCache::open(&path).expect("open");
        let half = STAGE_MAX_COST / 2;
        let (a, b) = (text_key("a"), text_key("b"));
        cache.stage("m:x:1", &[(&a, &[1.0])], half).expect("stage");
        assert_eq!(in_file(&path, "m:x:1"), 0);
        cache.stage("m:x:1", &[(&b, &[1.0])], half).expect("stage");
        assert_eq!(in_file(&path, "m:x:1"), 2, "written at the cost bound");

        let keys: Vec<String> = (0..STAGE_MAX_VECTORS)
            .map(|i| text_key(&i.to_string()))
            .collect();
        let v = [0.5f32];
        let mut staged = 0;
        for chunk in keys.chunks(1000) {
            let entries: Vec<(&str, &[f32])> = chunk.iter().map(|k| (k.as_str(), &v[..])).collect();
            cache
                .stage("m:y:1", &entries, Duration::ZERO)
                .expect("stage");
            staged += chunk.len();
            let written = if staged < STAGE_MAX_VECTORS {
                0
            } else {
                staged
            };
            assert_eq!(in_file(&path, "m:y:1"), written as u64, "{staged} staged");
        }
    }

    /// A vector written directly replaces a staged one of the same key, which is not written
    /// over it later; removing a model drops its staged vectors too.
    #[test]
    fn direct_writes_and_removals_supersede_staged_vectors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.db");
        let cache = EmbeddingCache::open(&path).expect("open");
        let (a, b) = (text_key("a"), text_key("b"));
        let cheap = Duration::from_millis(1);
        cache
            .stage("m:x:1", &[(&a, &[1.0]), (&b, &[2.0])], cheap)
            .expect("stage");
        cache.put_many("m:x:1", &[(&a, &[9.0])]).expect("put");
        cache.flush().expect("flush");
        assert_eq!(
            cache
                .get_many("m:x:1", 1, &[a.clone(), b.clone()])
                .expect("get"),
            vec![Some(vec![9.0]), Some(vec![2.0])]
        );
        cache.stage("m:y:1", &[(&a, &[3.0])], cheap).expect("stage");
        assert_eq!(cache.remove_model("m:y:1").expect("remove"), 0);
        cache.flush().expect("flush");
        assert_eq!(cache.get_many("m:y:1", 1, &[a]).expect("get"), vec![None]);
        assert_eq!(in_file(&path, "m:y:1"), 0);
    }

    /// The maintained counts agree with the rows after inserts, replacements of existing
    /// keys, a second model and a removal.
    #[test]
    fn maintained_counts_match_the_rows() {
        let cache = EmbeddingCache::open_in_memory().expect("open");
        let keys: Vec<String> = (0..10).map(|i| text_key(&i.to_string())).collect();
        let put = |model: &str, range: std::ops::Range<usize>, x: f32| {
            let v = [x, x];
            let entries: Vec<(&str, &[f32])> =
                keys[range].iter().map(|k| (k.as_str(), &v[..])).collect();
            cache.put_many(model, &entries).expect("put");
        };
        put("m:a:2", 0..6, 1.0);
        put("m:a:2", 3..10, 2.0); // 3 replaced, 4 new
        put("m:b:2", 0..2, 3.0);
        let rows = |model: &str| -> u64 {
            let conn = cache.conn().expect("conn");
            conn.query_row(
                "SELECT count(*) FROM vectors v JOIN models m ON m.id = v.model \
                 WHERE m.key = ?1",
                [model],
                |r| r.get::<_, i64>(0),
            )
            .expect("count") as u64
        };
        let t = cache.totals("m:a:2").expect("totals");
        assert_eq!((t.model_entries, t.entries), (10, 12));
        assert_eq!(t.model_entries, rows("m:a:2"));
        let got = cache.get_many("m:a:2", 2, &keys[2..4]).expect("get");
        assert_eq!(got, vec![Some(vec![1.0, 1.0]), Some(vec![2.0, 2.0])]);
        assert_eq!(cache.remove_model("m:a:2").expect("rm"), 10);
        let t = cache.totals("m:a:2").expect("totals");
        assert_eq!((t.model_entries, t.entries), (0, 2));
        assert_eq!(rows("m:b:2"), 2);
        put("m:a:2", 0..1, 4.0);
        assert_eq!(cache.count("m:a:2").expect("count"), 1);
    }

    /// A file written by schema 1 (one `WITHOUT ROWID` table keyed by hex) is migrated when
    /// opened: every vector is kept and counted, the old table is gone.
    #[test]
    fn a_schema_1_file_is_migrated_keeping_every_vector() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.db");
        let (a, b) = (text_key("a"), text_key("b"));
        {
            let conn = Connection::open(&path).expect("conn");
            conn.execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE embedding_cache (
                     model TEXT NOT NULL, text_sha256 TEXT NOT NULL, vector BLOB NOT NULL,
                     created_at INTEGER NOT NULL DEFAULT (unixepoch()),
                     PRIMARY KEY (model, text_sha256)
                 ) WITHOUT ROWID;
                 PRAGMA user_version = 1;",
            )
            .expect("v1 schema");
            let mut insert = conn
                .prepare(
                    "INSERT INTO embedding_cache (model, text_sha256, vector) VALUES (?1, ?2, ?3)",
                )
                .expect("prepare");
            for (model, key, v) in [
                ("m:x:2", &a, [1.0f32, 2.0]),
                ("m:x:2", &b, [3.0, 4.0]),
                ("m:y:2", &a, [5.0, 6.0]),
            ] {
                // Schema 1 held little-endian `f32`s.
                let blob: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                insert.execute(params![model, key, blob]).expect("insert");
            }
        }
        let cache = EmbeddingCache::open(&path).expect("open migrates");
        let t = cache.totals("m:x:2").expect("totals");
        assert_eq!((t.model_entries, t.entries), (2, 3));
        assert_eq!(
            cache.get_many("m:x:2", 2, &[a.clone(), b]).expect("get"),
            vec![Some(vec![1.0, 2.0]), Some(vec![3.0, 4.0])]
        );
        assert_eq!(
            cache.get_many("m:y:2", 2, &[a]).expect("get"),
            vec![Some(vec![5.0, 6.0])]
        );
        let conn = cache.conn().expect("conn");
        let (version, old): (i64, i64) = conn
            .query_row(
                "SELECT (SELECT user_version FROM pragma_user_version()), \
                 (SELECT count(*) FROM sqlite_master WHERE name = 'embedding_cache')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("read");
        assert_eq!((version, old), (SCHEMA_VERSION, 0));
    }

    #[test]
    fn a_newer_schema_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.db");
        Connection::open(&path)
            .expect("conn")
            .execute_batch("PRAGMA user_version = 9")
            .expect("version");
        let e = EmbeddingCache::open(&path).expect_err("refused");
        assert!(e.to_string().contains("schema version 9"), "{e}");
    }
}
