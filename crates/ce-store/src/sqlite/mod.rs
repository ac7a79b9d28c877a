//! The embedded backend: one SQLite file (`ce.db`) in WAL mode under the data directory.
//!
//! Durability: source writes commit with `synchronous=FULL` (the WAL is fsynced before the
//! write is acknowledged). Outbox bookkeeping (claim, renew, done, failed) commits with
//! `synchronous=NORMAL`: a power loss may roll such a commit back, which only means an event
//! is delivered again (at-least-once, idempotent consumers), and because the WAL is a single
//! append-only log, the next FULL commit makes every earlier commit durable too — recovery
//! always yields a prefix of the commit order. A process crash (SIGKILL) loses nothing in
//! either mode: committed WAL frames are already in the operating system's cache.
//!
//! Concurrency: one writer connection per process behind a mutex (no busy-waiting inside a
//! process); across processes SQLite's write lock with `busy_timeout`. Readers use a pool of
//! connections and see a consistent snapshot per call.

mod holds;
mod jobs;
mod kb;
mod outbox;
mod owners;
mod rows;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ce_core::{Clock, Config, ContextNode, CtxUri, Layers, Millis, SystemClock};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior};

use crate::error::Result;
pub(super) use crate::shared::{NODE_COLUMNS, subtree_bounds};
use crate::shared::{decode_node, decode_provenance, encode_provenance};
use crate::txn::{ReadTx, WriteTx};

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "ce.db";

/// How hard a write transaction syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// fsync the WAL at commit: acknowledged source writes.
    Full,
    /// No fsync at commit: outbox bookkeeping that replays safely.
    Normal,
}

struct Writer {
    conn: Connection,
    mode: Durability,
}

/// The SQLite store. Cheap to share behind an `Arc`; safe to use from many threads and,
/// through SQLite's locking, from many processes on one data directory.
pub struct SqliteStore {
    path: PathBuf,
    writer: Mutex<Writer>,
    readers: Mutex<Vec<Connection>>,
    clock: Arc<dyn Clock>,
    config: Config,
    /// The schema version before and after the migrations this open applied.
    migrated: (i64, i64),
    /// Derives small leaves in their write transaction, once set
    /// ([`crate::derive::LeafDeriver`]).
    leaf_deriver: std::sync::OnceLock<std::sync::Arc<dyn crate::derive::LeafDeriver>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Switches the database of `conn` to WAL. Two processes creating the same new file at once
/// can both hold a shared lock while asking for the exclusive one the switch needs; SQLite
/// then answers one of them `SQLITE_BUSY` at once, without the busy timeout (waiting would
/// deadlock). The switch is retried for up to about five seconds; once the file is in WAL
/// mode it needs no lock at all.
fn enable_wal(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let mut attempt: u64 = 0;
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(e)
                if attempt < 100
                    && e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) =>
            {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(10 + attempt % 20));
            }
            r => return r,
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `data_dir` with the system clock.
    pub fn open(data_dir: &Path, config: Config) -> Result<Self> {
        Self::open_with_clock(data_dir, config, Arc::new(SystemClock))
    }

    /// Opens the store with an explicit clock (tests and simulations).
    pub fn open_with_clock(data_dir: &Path, config: Config, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        std::fs::create_dir_all(data_dir).map_err(|source| crate::StoreError::DataDir {
            path: data_dir.to_owned(),
            source,
        })?;
        let path = data_dir.join(DB_FILE);
        let conn = open_conn(&path, &config)?;
        enable_wal(&conn)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let mut writer = Writer {
            conn,
            mode: Durability::Full,
        };
        let migrated = schema::migrate(&mut writer.conn, &path)?;
        let store = SqliteStore {
            path,
            migrated,
            leaf_deriver: std::sync::OnceLock::new(),
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            clock,
            config,
        };
        crate::outbox::journal::register_consumers(&store)?;
        Ok(store)
    }

    /// The schema version before and after the migrations this open applied (equal when
    /// there were none, e.g. another process applied them first).
    pub fn schema_migration(&self) -> (i64, i64) {
        self.migrated
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        // A panic while holding the lock leaves no half-done transaction (it rolls back on
        // drop), so a poisoned lock is safe to reuse.
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction with the time at which the write lock was
    /// acquired; commits when it returns `Ok`.
    fn write<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Transaction<'_>, Millis) -> Result<T>,
    ) -> Result<T> {
        let mut w = self.lock_writer();
        if w.mode != durability {
            let v = match durability {
                Durability::Full => "FULL",
                Durability::Normal => "NORMAL",
            };
            w.conn.pragma_update(None, "synchronous", v)?;
            w.mode = durability;
        }
        let tx = w
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // The clock is read once the write lock is held, so a wait for another process's
        // lock never leaves the transaction acting on an old time (leases, fencing).
        let now = self.now();
        let out = f(&tx, now)?;
        let source_write = durability == Durability::Full;
        if source_write {
            ce_core::failpoint::hit("store.before_commit");
        }
        tx.commit()?;
        if source_write {
            ce_core::failpoint::hit("store.after_commit");
        }
        Ok(out)
    }

    /// Runs `f` on a pooled read connection inside one read transaction (one snapshot).
    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let pooled = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = open_conn(&self.path, &self.config)?;
                c.pragma_update(None, "query_only", true)?;
                c
            }
        };
        conn.execute_batch("BEGIN")?;
        let out = f(&conn);
        // A failed COMMIT of a read-only transaction leaves nothing behind; drop the
        // connection rather than pool one in an unknown state.
        if conn.execute_batch("COMMIT").is_ok() {
            self.readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
        }
        out
    }
}

impl SqliteStore {
    /// A source write (FULL durability) with the row operations of `crate::txn`.
    fn write_source<T>(&self, f: impl FnOnce(&mut dyn WriteTx, Millis) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.write(Durability::Full, |tx, now| {
            f(&mut rows::SqlTx::new(tx, consumers), now)
        })
    }

    /// A read snapshot with the row operations of `crate::txn`.
    fn read_source<T>(&self, f: impl FnOnce(&mut dyn ReadTx) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.read(|conn| f(&mut rows::SqlTx::new(conn, consumers)))
    }
}

crate::txn::impl_source_traits!(SqliteStore);

fn open_conn(path: &Path, config: &Config) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(std::time::Duration::from_millis(
        config.store.busy_timeout_ms,
    ))?;
    conn.pragma_update(None, "cache_size", -32_000)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.set_prepared_statement_cache_capacity(64);
    // Plans that do not depend on bound values (docs/store.md, "Prepared statements").
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}

/// SQL predicate on `col` for "within the subtree `?N`" using bounds `?N+1`, `?N+2`.
fn subtree_sql(col: &str, n: usize) -> String {
    format!(
        "({col} = ?{n} OR ({col} > ?{} AND {col} < ?{}))",
        n + 1,
        n + 2
    )
}

fn node_from_row(row: &Row<'_>) -> rusqlite::Result<Result<ContextNode>> {
    let uri: String = row.get(0)?;
    let parent: String = row.get(1)?;
    let ctype: String = row.get(2)?;
    let owner: String = row.get(4)?;
    let meta: String = row.get(8)?;
    let version: i64 = row.get(9)?;
    let relation_version: i64 = row.get(11)?;
    let layers = Layers {
        abstract_text: row.get(5)?,
        overview: row.get(6)?,
        content: row.get(7)?,
    };
    let category: String = row.get(3)?;
    let content_hash: String = row.get(10)?;
    let created_at_ms: i64 = row.get(12)?;
    let updated_at_ms: i64 = row.get(13)?;
    let trace_id: String = row.get(14)?;
    let provenance = match decode_provenance(&uri, row.get(15)?, &layers) {
        Ok(p) => p,
        Err(e) => return Ok(Err(e)),
    };
    Ok(
        decode_node(uri, parent, ctype, owner, meta).map(|(uri, parent_uri, t, o, m)| {
            ContextNode {
                uri,
                parent_uri,
                context_type: t,
                category,
                owner_space: o,
                layers,
                meta: m,
                version: version as u64,
                content_hash,
                relation_version: relation_version as u64,
                created_at_ms,
                updated_at_ms,
                trace_id,
                provenance,
            }
        }),
    )
}

fn get_node(conn: &Connection, uri: &CtxUri) -> Result<Option<ContextNode>> {
    conn.prepare_cached(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE uri = ?1"))?
        .query_row([uri.as_str()], node_from_row)
        .optional()?
        .transpose()
}

fn get_tombstone(conn: &Connection, uri: &CtxUri) -> Result<Option<u64>> {
    Ok(conn
        .prepare_cached("SELECT version FROM tombstones WHERE uri = ?1")?
        .query_row([uri.as_str()], |r| r.get::<_, i64>(0))
        .optional()?
        .map(|v| v as u64))
}

fn insert_node(tx: &Connection, n: &ContextNode) -> Result<()> {
    tx.prepare_cached(&format!(
        "INSERT INTO nodes ({NODE_COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)
         ON CONFLICT(uri) DO UPDATE SET parent_uri=excluded.parent_uri,
           context_type=excluded.context_type, category=excluded.category,
           owner_space=excluded.owner_space, abstract=excluded.abstract,
           overview=excluded.overview, content=excluded.content, meta=excluded.meta,
           version=excluded.version, content_hash=excluded.content_hash,
           relation_version=excluded.relation_version, created_at=excluded.created_at,
           updated_at=excluded.updated_at, trace_id=excluded.trace_id,
           provenance=excluded.provenance"
    ))?
    .execute(rusqlite::params![
        n.uri.as_str(),
        n.parent_uri.as_str(),
        n.context_type.as_str(),
        n.category,
        n.owner_space.to_string(),
        n.layers.abstract_text,
        n.layers.overview,
        n.layers.content,
        serde_json::to_string(&n.meta)?,
        n.version as i64,
        n.content_hash,
        n.relation_version as i64,
        n.created_at_ms,
        n.updated_at_ms,
        n.trace_id,
        encode_provenance(&n.provenance)?,
    ])?;
    tx.prepare_cached("DELETE FROM tombstones WHERE uri = ?1")?
        .execute([n.uri.as_str()])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use ce_core::Config;

    use super::SqliteStore;

    /// A cached statement with a bound `LIMIT` (as the outbox's claim has) is compiled once,
    /// not on every call: see `ce_index::sqlite`'s test of the same guarantee.
    #[test]
    fn a_cached_statement_with_a_bound_limit_is_compiled_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = super::open_conn(&dir.path().join("t.db"), &Config::default()).expect("open");
        c.execute_batch(
            "CREATE TABLE d (consumer TEXT NOT NULL, seq INTEGER NOT NULL,
                 PRIMARY KEY (consumer, seq));
             INSERT INTO d VALUES ('k', 1), ('k', 2), ('v', 3);",
        )
        .expect("schema");
        let sql = "SELECT seq FROM d WHERE consumer = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";
        for (consumer, after, want) in [("k", 0, vec![1, 2]), ("k", 1, vec![2]), ("v", 0, vec![3])]
        {
            let got: Vec<i64> = c
                .prepare_cached(sql)
                .and_then(|mut s| {
                    s.query_map(rusqlite::params![consumer, after, 10], |r| r.get(0))?
                        .collect()
                })
                .expect("query");
            assert_eq!(got, want, "{consumer} after {after}");
        }
        let cached = c.prepare_cached(sql).expect("cached");
        assert_eq!(cached.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }

    /// Several openers of one new data directory at once (`ce worker` and `ce put` started
    /// together): every open succeeds, none is answered "database is locked".
    #[test]
    fn concurrent_first_opens_of_a_new_store_all_succeed() {
        for round in 0..20 {
            let dir = tempfile::tempdir().expect("tempdir");
            let openers = 6;
            let barrier = Arc::new(Barrier::new(openers));
            let handles: Vec<_> = (0..openers)
                .map(|_| {
                    let (path, barrier) = (dir.path().to_owned(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        SqliteStore::open(&path, Config::default()).map(|_| ())
                    })
                })
                .collect();
            for h in handles {
                let opened = h.join().expect("opener");
                assert!(opened.is_ok(), "round {round}: {opened:?}");
            }
        }
    }
}
