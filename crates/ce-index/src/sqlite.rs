//! SQLite plumbing shared by the embedded indexes (keyword, vector, relation): how a
//! connection is opened, how the writer connection is prepared (WAL, `synchronous=FULL`,
//! schema, layout version), the `meta` key/value table, and the key range that finds every
//! row within a URI's subtree.
//!
//! Every function takes the database's file name (`file`), which error messages name (see
//! [`crate::error::sqlite_error`]).

use std::path::Path;
use std::time::Duration;

use ce_core::CtxUri;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::error::{IndexError, Result, sqlite_error};

/// How long a connection waits for a lock held by another connection before giving up with
/// a (retryable) busy error.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a connection to `path` with the settings every connection needs.
pub(crate) fn open_conn(path: &Path, file: &str) -> Result<Connection> {
    let conn = Connection::open(path)
        .map_err(|e| IndexError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| sqlite_error(file, e))?;
    Ok(conn)
}

/// Prepares the writer connection: WAL, `synchronous=FULL`, then, in an `IMMEDIATE`
/// transaction returned to the caller (who adds its own defaults and commits), creates
/// `schema` (which must create a `meta (key, value)` table) and checks the layout version:
/// a new file records `version`, a file of another version is a
/// [`IndexError::SchemaMismatch`].
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

/// Sets `key` in the `meta` table.
pub(crate) fn set_meta(c: &Connection, file: &str, key: &str, value: &str) -> Result<()> {
    c.prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![key, value]))
        .map_err(|e| sqlite_error(file, e))?;
    Ok(())
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
}
