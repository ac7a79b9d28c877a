//! SQLite plumbing shared by the embedded indexes (keyword, vector, relation): how a
//! connection is opened, how the writer connection is prepared (WAL, `synchronous=FULL`,
//! schema, layout version), read and write transactions and the savepoint that isolates one
//! write of a batch, the `meta` key/value table, the `uri_versions` table of the versioned
//! indexes (VX1, [`crate::records`]), and the key range that finds every row
//! within a URI's subtree.
//!
//! Every function takes the database's file name (`file`), which error messages name (see
//! [`crate::error::sqlite_error`]).

use std::cell::Cell;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use ce_core::CtxUri;
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};

use crate::error::{IndexError, Result, sqlite_error};
use crate::records::{SeenVersion, to_i64};

/// How long a connection waits for a lock held by another connection before giving up with
/// a (retryable) busy error.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The `meta` key/value table every database has (created by [`init_writer`]).
const META_TABLE: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) WITHOUT ROWID;
";

/// Opens a connection to `path` with the settings every connection needs.
pub(crate) fn open_conn(path: &Path, file: &str) -> Result<Connection> {
    let conn = Connection::open(path)
        .map_err(|e| IndexError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| sqlite_error(file, e))?;
    // Plans that do not depend on bound values (docs/store.md, "Prepared statements").
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|e| sqlite_error(file, e))?;
    // Savepoint sub-journals in memory: a batch that runs again with each node write in a
    // savepoint ([`write_batch`]), or a statement journal, passes SQLite's 64 KiB spill
    // threshold with 8 KiB pages and went to a temporary file, a `pwrite` per page (8 % of a
    // cold drain's main thread when every batch took savepoints). Crash safety is the WAL's,
    // not the sub-journal's.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(|e| sqlite_error(file, e))?;
    Ok(conn)
}

/// Makes `conn` a reader: it refuses every write.
pub(crate) fn read_only(conn: Connection, file: &str) -> Result<Connection> {
    conn.pragma_update(None, "query_only", "ON")
        .map_err(|e| sqlite_error(file, e))?;
    Ok(conn)
}

/// Prepares the writer connection: WAL, `synchronous=FULL`, then, in an `IMMEDIATE`
/// transaction returned to the caller (who adds its own defaults and commits), creates the
/// `meta (key, value)` table and `schema` and checks the layout version: a new file records
/// `version`, a file of another version is a [`IndexError::SchemaMismatch`].
pub(crate) fn init_writer<'c>(
    conn: &'c mut Connection,
    file: &str,
    schema: &str,
    version: u64,
) -> Result<Transaction<'c>> {
    let sql = |e| sqlite_error(file, e);
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sql)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sql)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql)?;
    tx.execute_batch(META_TABLE).map_err(sql)?;
    tx.execute_batch(schema).map_err(sql)?;
    match meta(&tx, file, "schema_version")? {
        None => set_meta(&tx, file, "schema_version", &version.to_string())?,
        Some(v) if v == version.to_string() => {}
        Some(v) => {
            return Err(IndexError::SchemaMismatch(format!(
                "{file} has layout version {v}, this build reads version {version}"
            )));
        }
    }
    Ok(tx)
}

/// The value of `key` in the `meta` table.
pub(crate) fn meta(c: &Connection, file: &str, key: &str) -> Result<Option<String>> {
    c.prepare_cached("SELECT value FROM meta WHERE key = ?1")
        .and_then(|mut s| s.query_row([key], |r| r.get(0)).optional())
        .map_err(|e| sqlite_error(file, e))
}

/// The value of `key` in the `meta` table as a number; another value means a damaged file.
pub(crate) fn meta_u64(c: &Connection, file: &str, key: &str) -> Result<Option<u64>> {
    meta(c, file, key)?
        .map(|v| {
            v.parse()
                .map_err(|e| IndexError::Corrupt(format!("{file}: meta {key}: {e}")))
        })
        .transpose()
}

/// Sets `key` in the `meta` table.
pub(crate) fn set_meta(c: &Connection, file: &str, key: &str, value: &str) -> Result<()> {
    c.prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![key, value]))
        .map_err(|e| sqlite_error(file, e))?;
    Ok(())
}

/// Number of rows of `table`.
pub(crate) fn count_rows(c: &Connection, file: &str, table: &str) -> Result<u64> {
    c.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n as u64)
    .map_err(|e| sqlite_error(file, e))
}

/// The [`SeenVersion`] of `uri` in the `uri_versions (uri, version, deleted)` table.
pub(crate) fn seen_version(
    c: &Connection,
    file: &str,
    uri: &CtxUri,
) -> Result<Option<SeenVersion>> {
    c.prepare_cached("SELECT version, deleted FROM uri_versions WHERE uri = ?1")
        .and_then(|mut s| {
            s.query_row([uri.as_str()], |r| {
                Ok(SeenVersion {
                    // Written by `set_seen_version`, so never negative.
                    version: r.get::<_, i64>(0)? as u64,
                    deleted: r.get(1)?,
                })
            })
            .optional()
        })
        .map_err(|e| sqlite_error(file, e))
}

/// Records `v` as the [`SeenVersion`] of `uri` in the `uri_versions` table.
pub(crate) fn set_seen_version(
    c: &Connection,
    file: &str,
    uri: &CtxUri,
    v: SeenVersion,
) -> Result<()> {
    let version = to_i64(v.version, "version")?;
    c.prepare_cached(
        "INSERT OR REPLACE INTO uri_versions (uri, version, deleted) VALUES (?1, ?2, ?3)",
    )
    .and_then(|mut s| s.execute(params![uri.as_str(), version, v.deleted]))
    .map_err(|e| sqlite_error(file, e))?;
    Ok(())
}

/// Locks a connection (connections hold no half-done state across a panic: transactions roll
/// back on drop).
pub(crate) use crate::lock;

/// Runs `f` in one read transaction (a consistent snapshot) on `conn`.
pub(crate) fn read<T>(
    conn: &Mutex<Connection>,
    file: &str,
    f: impl FnOnce(&Transaction<'_>) -> Result<T>,
) -> Result<T> {
    let mut conn = lock(conn);
    let tx = conn.transaction().map_err(|e| sqlite_error(file, e))?;
    f(&tx)
}

/// The layout version a file records (`meta.schema_version`); `None` for a new, empty file.
pub(crate) fn layout_version(c: &Connection, file: &str) -> Result<Option<u64>> {
    let has_meta: bool = c
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| sqlite_error(file, e))?
        > 0;
    if !has_meta {
        return Ok(None);
    }
    meta_u64(c, file, "schema_version")
}

/// Migrates a file whose `records` table is keyed by a unique `id` (layout `from`) to layout
/// `to`, where `(uri, level)` is the unique key and `id` a plain column, in one transaction:
/// the old table is renamed, `schema` (the new layout's `CREATE … IF NOT EXISTS` statements)
/// creates the new one, `columns` are copied, the old table and its indexes are dropped.
/// Does nothing to a new file or one at another layout. A record's id is the hash of its
/// `(uri, level)`, so two records never share them; a file where they do is refused as
/// [`IndexError::Corrupt`] (rebuild it with `ce reindex`).
///
/// Why (docs/indexing.md, "Index writes"): the ids are random, and every batch of writes or
/// removals touched most pages of their index — one WAL frame each, 2.5× the WAL of the
/// rows alone.
pub(crate) fn rekey_records_by_node(
    conn: &mut Connection,
    file: &str,
    (from, to): (u64, u64),
    schema: &str,
    columns: &str,
) -> Result<()> {
    let sql = |e| sqlite_error(file, e);
    if layout_version(conn, file)? != Some(from) {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql)?;
    let shared: Option<(String, i64)> = tx
        .query_row(
            "SELECT uri, level FROM records GROUP BY uri, level HAVING COUNT(*) > 1 LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql)?;
    if let Some((uri, level)) = shared {
        return Err(IndexError::Corrupt(format!(
            "{file}: two records of {uri} at level {level}; rebuild this index (`ce reindex`)"
        )));
    }
    // The old table's own indexes go first: a name the new layout reuses would otherwise
    // still be taken (by the renamed table) when `schema` creates it.
    let indexes: Vec<String> = tx
        .prepare(
            "SELECT name FROM sqlite_master
             WHERE type = 'index' AND tbl_name = 'records' AND sql IS NOT NULL",
        )
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql)?;
    for name in indexes {
        tx.execute_batch(&format!("DROP INDEX \"{name}\""))
            .map_err(sql)?;
    }
    tx.execute_batch(&format!(
        "ALTER TABLE records RENAME TO records_before_layout_{to};
         {schema}
         INSERT INTO records ({columns}) SELECT {columns} FROM records_before_layout_{to};
         DROP TABLE records_before_layout_{to};"
    ))
    .map_err(sql)?;
    let rows = count_rows(&tx, file, "records")?;
    set_meta(&tx, file, "schema_version", &to.to_string())?;
    tx.commit().map_err(sql)?;
    tracing::info!(
        file,
        rows,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "index file migrated from layout {from} to layout {to} (records keyed by node and level)"
    );
    Ok(())
}

/// Runs `f` in one `IMMEDIATE` write transaction on `conn`, committed if `f` succeeds.
pub(crate) fn write<T>(
    conn: &Mutex<Connection>,
    file: &str,
    f: impl FnOnce(&Transaction<'_>) -> Result<T>,
) -> Result<T> {
    let sql = |e| sqlite_error(file, e);
    let mut conn = lock(conn);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql)?;
    let out = f(&tx)?;
    ce_core::failpoint::hit("index.before_commit");
    tx.commit().map_err(sql)?;
    Ok(out)
}

/// How the writes of one batch are kept apart inside its transaction ([`write_batch`]).
pub(crate) struct Isolation {
    /// Each write in its own savepoint; otherwise (the optimistic pass) none.
    per_write: bool,
    /// Whether a write of the optimistic pass failed, aborting it.
    aborted: Cell<bool>,
}

impl Isolation {
    fn new(per_write: bool) -> Self {
        Isolation {
            per_write,
            aborted: Cell::new(false),
        }
    }

    /// Runs one write of a batch in the transaction on `c`. In the savepoint pass as
    /// [`savepoint`] does: a failure is rolled back alone and returned inside `Ok` (callers undo
    /// their own in-memory changes). In the optimistic pass directly: a failure is returned as
    /// the outer error, which must abort the transaction (the batch then runs again, each
    /// write in its own savepoint).
    pub(crate) fn run<T>(
        &self,
        c: &Connection,
        file: &str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<Result<T>> {
        if self.per_write {
            return savepoint(c, file, f);
        }
        f().map(Ok).inspect_err(|_| self.aborted.set(true))
    }
}

/// Runs a batch of writes that each have their own outcome in one transaction, so that a
/// failing write fails alone. `pass` runs the whole transaction, each write through
/// [`Isolation::run`], and returns one result per write.
///
/// The first pass takes no savepoints: a savepoint copies every page its write first touches
/// to a sub-journal, 6–9 % of a drain's CPU (docs/indexing.md, "Index writes"), for a failure
/// that almost never happens. Only when a write fails is that pass rolled back and the batch
/// run again from the start, each write in its own savepoint. An error of the transaction
/// itself (not of one write) is returned as it is, without a second pass. `pass` borrows the
/// writes, so that a second pass needs no copy of the batch made in advance (a copy of
/// every record and vector cost 2 % of a cold vector drain).
pub(crate) fn write_batch<W, T>(
    writes: &[W],
    mut pass: impl FnMut(&[W], &Isolation) -> Result<Vec<Result<T>>>,
) -> Result<Vec<Result<T>>> {
    let optimistic = Isolation::new(false);
    match pass(writes, &optimistic) {
        Err(e) if optimistic.aborted.get() => {
            tracing::debug!(error = %e, "a write of the batch failed: again, one savepoint each");
            pass(writes, &Isolation::new(true))
        }
        out => out,
    }
}

/// Runs `f` in a savepoint of the transaction on `c`: if it fails, its rows are rolled back
/// and its error is returned inside `Ok` (the transaction goes on; callers undo their own
/// in-memory changes). The outer error means the savepoint itself failed.
fn savepoint<T>(c: &Connection, file: &str, f: impl FnOnce() -> Result<T>) -> Result<Result<T>> {
    // Cached statements: a batch opens one savepoint per write.
    let run = |stmt: &str| {
        c.prepare_cached(stmt)
            .and_then(|mut s| s.execute([]))
            .map_err(|e| sqlite_error(file, e))
    };
    run("SAVEPOINT one_write")?;
    match f() {
        Ok(v) => {
            run("RELEASE one_write")?;
            Ok(Ok(v))
        }
        Err(e) => {
            run("ROLLBACK TO one_write")?;
            run("RELEASE one_write")?;
            Ok(Err(e))
        }
    }
}

/// Runs `select`, a query whose first column is a URI and whose condition is [`within_sql`]
/// over it, for `uri`; reads each row with `row` and keeps those whose URI is `uri` or lies
/// below it (the SQL range also admits e.g. `a/b!x` for `a/b`).
pub(crate) fn select_within<T>(
    c: &Connection,
    file: &str,
    select: &str,
    uri: &CtxUri,
    mut row: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>> {
    let (lo, hi) = subtree_bounds(uri);
    let rows: Vec<Option<T>> = c
        .prepare_cached(select)
        .and_then(|mut s| {
            s.query_map(params![uri.as_str(), lo, hi], |r| {
                let u: String = r.get(0)?;
                let t = row(r)?;
                Ok(within(&u, uri).then_some(t))
            })?
            .collect()
        })
        .map_err(|e| sqlite_error(file, e))?;
    Ok(rows.into_iter().flatten().collect())
}

/// The bounds `?2`, `?3` of [`within_sql`] for `uri` (`?1`): every descendant of `uri` sorts
/// strictly between them (and so do a few non-descendants such as `a/b!x` for `a/b`, which
/// callers drop with [`within`]).
pub(crate) fn subtree_bounds(uri: &CtxUri) -> (String, String) {
    if uri.is_root() {
        ("ctx://".to_owned(), "ctx:/0".to_owned())
    } else {
        (format!("{uri}/"), format!("{uri}0"))
    }
}

/// SQL condition "column `col` is `?1` or lies in the range `(?2, ?3)`", with the parameters
/// `uri, subtree_bounds(uri)`; it can use an index on `col`.
pub(crate) fn within_sql(col: &str) -> String {
    format!("({col} = ?1 OR ({col} > ?2 AND {col} < ?3))")
}

/// The distinct URIs within `uri` of the `records` table of `file` (its `uri` column, read
/// from its index: no row is decoded), in URI order.
pub(crate) fn uris_within(c: &Connection, file: &str, uri: &CtxUri) -> Result<Vec<CtxUri>> {
    let uris: Vec<String> = select_within(
        c,
        file,
        &format!(
            "SELECT DISTINCT uri FROM records WHERE {} ORDER BY uri",
            within_sql("uri")
        ),
        uri,
        |r| r.get(0),
    )?;
    uris.iter()
        .map(|u| {
            CtxUri::parse_stored(u)
                .map_err(|e| IndexError::Corrupt(format!("{file}: record uri {u:?}: {e}")))
        })
        .collect()
}

/// Whether `uri` (a stored URI string) equals `root` or lies below it.
pub(crate) fn within(uri: &str, root: &CtxUri) -> bool {
    let r = root.as_str();
    root.is_root() || uri == r || (uri.starts_with(r) && uri.as_bytes().get(r.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    #[test]
    fn subtree_range_and_within_agree_with_is_within() {
        let root = uri("ctx://a/b");
        let (lo, hi) = subtree_bounds(&root);
        for (s, inside) in [
            ("ctx://a/b", true),
            ("ctx://a/b/c", true),
            ("ctx://a/b/c/d", true),
            ("ctx://a/bc", false),
            ("ctx://a/b!x", false),
            ("ctx://a", false),
        ] {
            let in_range = s == root.as_str() || (s > lo.as_str() && s < hi.as_str());
            assert_eq!(within(s, &root), inside, "{s}");
            assert_eq!(uri(s).is_within(&root), inside, "{s}");
            if inside {
                assert!(in_range, "{s} lies in the SQL range");
            }
        }
        let all = CtxUri::root();
        let (lo, hi) = subtree_bounds(&all);
        assert!("ctx://z/y" > lo.as_str() && "ctx://z/y" < hi.as_str());
        assert!(within("ctx://z", &all));
    }

    /// A cached statement is compiled once: rusqlite clears a statement's bindings when it
    /// returns to the cache, and SQLite expires a statement whose plan it tied to bound values
    /// (here the range and `LIMIT` over the key) when its bindings are cleared, so without the
    /// query planner stability guarantee every call of such a statement compiled it again.
    #[test]
    fn a_cached_statement_is_not_compiled_again_on_every_call() {
        let dir = tempfile::tempdir().expect("tmp");
        let c = open_conn(&dir.path().join("t.db"), "t.db").expect("open");
        c.execute_batch(
            "CREATE TABLE blocks (term TEXT NOT NULL, last_doc INTEGER NOT NULL,
                 PRIMARY KEY (term, last_doc)) WITHOUT ROWID;
             INSERT INTO blocks VALUES ('a', 1), ('a', 9), ('b', 5);",
        )
        .expect("schema");
        let sql = "SELECT last_doc FROM blocks WHERE term = ?1 AND last_doc >= ?2
                   ORDER BY last_doc LIMIT 1";
        for (term, doc, want) in [("a", 0, Some(1)), ("a", 2, Some(9)), ("b", 0, Some(5))] {
            let got: Option<i64> = c
                .prepare_cached(sql)
                .and_then(|mut s| s.query_row(params![term, doc], |r| r.get(0)).optional())
                .expect("query");
            assert_eq!(got, want, "{term} from {doc}");
        }
        let cached = c.prepare_cached(sql).expect("cached");
        assert_eq!(cached.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }

    #[test]
    fn a_file_of_another_layout_version_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("t.db");
        let schema = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);";
        let mut c = open_conn(&path, "t.db").expect("open");
        init_writer(&mut c, "t.db", schema, 1)
            .expect("init")
            .commit()
            .expect("commit");
        init_writer(&mut c, "t.db", schema, 1)
            .expect("same version")
            .commit()
            .expect("commit");
        let e = init_writer(&mut c, "t.db", schema, 2).expect_err("other version");
        assert!(matches!(e, IndexError::SchemaMismatch(_)), "{e}");
        assert!(e.to_string().contains("t.db has layout version 1"), "{e}");
    }

    /// What [`run_batch`] saw.
    struct BatchRun {
        out: Result<Vec<Result<()>>>,
        /// Per pass: whether it took a savepoint per write.
        passes: Vec<bool>,
        /// The rows committed.
        rows: Vec<(i64, i64)>,
    }

    /// A batch of writes each inserting `(w, 0)` and `(w, 1)`; a negative `w` inserts
    /// `(w, 0)` and then breaks the table's check, failing after a change.
    fn run_batch(writes: Vec<i64>, fail_transaction: bool) -> BatchRun {
        let c = Connection::open_in_memory().expect("open");
        c.execute_batch(
            "CREATE TABLE t (w INTEGER NOT NULL, part INTEGER NOT NULL CHECK (part < 2))",
        )
        .expect("schema");
        let conn = Mutex::new(c);
        let mut passes = Vec::new();
        let out = write_batch(&writes, |writes, isolation| {
            passes.push(isolation.per_write);
            write(&conn, "t.db", |tx| {
                let mut out = Vec::new();
                for &w in writes {
                    out.push(isolation.run(tx, "t.db", || {
                        let second = if w < 0 { 2 } else { 1 };
                        for part in [0, second] {
                            tx.execute("INSERT INTO t (w, part) VALUES (?1, ?2)", params![w, part])
                                .map_err(|e| sqlite_error("t.db", e))?;
                        }
                        Ok(())
                    })?);
                }
                if fail_transaction {
                    return Err(IndexError::Unavailable("the disk went away".into()));
                }
                Ok(out)
            })
        });
        let rows = lock(&conn)
            .prepare("SELECT w, part FROM t ORDER BY w, part")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .expect("rows");
        BatchRun { out, passes, rows }
    }

    #[test]
    fn a_batch_runs_once_without_savepoints_unless_a_write_fails() {
        let BatchRun { out, passes, rows } = run_batch(vec![1, 2, 3], false);
        assert!(out.expect("batch").iter().all(Result::is_ok));
        assert_eq!(passes, [false], "no write failed: one pass, no savepoint");
        assert_eq!(rows, [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]);
    }

    #[test]
    fn a_write_failing_after_a_change_fails_alone_and_leaves_nothing() {
        let BatchRun { out, passes, rows } = run_batch(vec![1, -2, 3], false);
        let out = out.expect("batch");
        assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
        let e = out[1].as_ref().expect_err("the bad write fails");
        assert!(e.to_string().contains("CHECK"), "{e}");
        assert_eq!(
            passes,
            [false, true],
            "the optimistic pass was rolled back and run again, one savepoint per write"
        );
        // Nothing of the bad write's first insert, and the good writes once each.
        assert_eq!(rows, [(1, 0), (1, 1), (3, 0), (3, 1)]);
    }

    #[test]
    fn a_failure_of_the_transaction_is_not_run_again() {
        let BatchRun { out, passes, rows } = run_batch(vec![1, 2], true);
        let e = out.expect_err("the transaction fails");
        assert!(matches!(e, IndexError::Unavailable(_)), "{e}");
        assert_eq!(passes, [false], "only a failing write earns a second pass");
        assert!(rows.is_empty(), "rolled back: {rows:?}");
    }
}
