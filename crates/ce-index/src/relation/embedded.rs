//! Embedded relation index: one SQLite file (`relations.db`) in the index directory holds the
//! records (indexed by owner and by target) and the owners' versions (invariant RX1).
//!
//! Write path ([`RelationIndex::write_owners`]): the writes are checked first, outside any
//! lock; then one `IMMEDIATE` transaction on the writer connection (WAL, `synchronous=FULL`)
//! applies them ([`sqlite::write_batch`]: without savepoints, and only if one fails again with
//! each in a savepoint), so a write that fails leaves nothing behind while the others commit
//! together. Reads run on a second, read-only connection, each in one read
//! transaction (a consistent snapshot).
//!
//! Everything lives in SQLite, so several connections (or processes) may open the same file.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ce_core::CtxUri;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use super::{
    Direction, OwnerStore, OwnerVersion, RelationIndex, RelationIndexRecord, RelationOutcome,
    RelationRecord, RelationWrite, apply_write, check_record, check_type_filter, check_write, rank,
    stored,
};
use crate::error::{IndexError, Result};
use crate::sqlite::{
    self, init_writer, open_conn, select_within, subtree_bounds, within, within_sql,
};

/// File name of the database inside the index directory.
pub const DB_FILE: &str = "relations.db";

/// Version of the file layout; a file with another version is refused.
const SCHEMA_VERSION: u64 = 1;

/// Tables:
/// - `relations`: one row per record, keyed by its stable id; indexed by owner (`from_uri`,
///   in listing order) and by target (`to_uri`). Versions are stored as the `i64` with the
///   same bits (lossless for every `u64`).
/// - `owner_versions`: the newest state applied per owner URI (invariant RX1).
/// - `meta` ([`crate::sqlite::init_writer`]): `schema_version`.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS relations (
    id TEXT PRIMARY KEY NOT NULL,
    from_uri TEXT NOT NULL,
    to_uri TEXT NOT NULL,
    relation_type TEXT NOT NULL,
    weight REAL NOT NULL,
    reason TEXT NOT NULL,
    account_id TEXT NOT NULL,
    owner_space TEXT NOT NULL,
    relation_version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS relations_by_from ON relations (from_uri, to_uri, relation_type);
CREATE INDEX IF NOT EXISTS relations_by_to ON relations (to_uri, from_uri, relation_type);
CREATE TABLE IF NOT EXISTS owner_versions (
    uri TEXT PRIMARY KEY NOT NULL,
    node_version INTEGER NOT NULL,
    relation_version INTEGER NOT NULL,
    deleted INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The columns of a record, in the order [`decode`] reads them.
const COLUMNS: &str = "id, from_uri, to_uri, relation_type, weight, reason, account_id, owner_space, relation_version";

/// Maps a SQLite error of this database (see [`crate::error::sqlite_error`]).
fn sql(e: rusqlite::Error) -> IndexError {
    crate::error::sqlite_error(DB_FILE, e)
}

/// A stored row, before its URIs are parsed.
type RawRow = (
    String,
    String,
    String,
    String,
    f64,
    String,
    String,
    String,
    i64,
);

fn raw(r: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
    ))
}

/// Decodes a stored row: a URI that does not parse means a damaged file.
fn decode(row: RawRow) -> Result<RelationRecord> {
    let (id, from, to, relation_type, weight, reason, account_id, owner_space, rv) = row;
    let parse = |s: &str| {
        CtxUri::parse_stored(s)
            .map_err(|e| IndexError::Corrupt(format!("{DB_FILE}: relation {id} uri {s:?}: {e}")))
    };
    Ok(RelationRecord {
        record: RelationIndexRecord {
            from_uri: parse(&from)?,
            to_uri: parse(&to)?,
            id,
            relation_type,
            weight,
            reason,
            account_id,
            owner_space,
        },
        relation_version: rv as u64,
    })
}

/// Runs a query returning records.
fn query(c: &Connection, sql_text: &str, p: impl rusqlite::Params) -> Result<Vec<RelationRecord>> {
    let rows: Vec<RawRow> = c
        .prepare_cached(sql_text)
        .and_then(|mut s| s.query_map(p, raw)?.collect())
        .map_err(sql)?;
    rows.into_iter().map(decode).collect()
}

/// The relation tables seen through one connection (inside a transaction).
struct Tables<'a>(&'a Connection);

impl OwnerStore for Tables<'_> {
    fn owner_version(&self, owner: &CtxUri) -> Result<Option<OwnerVersion>> {
        self.0
            .prepare_cached(
                "SELECT node_version, relation_version, deleted FROM owner_versions WHERE uri = ?1",
            )
            .and_then(|mut s| {
                s.query_row([owner.as_str()], |r| {
                    Ok(OwnerVersion {
                        node_version: r.get::<_, i64>(0)? as u64,
                        relation_version: r.get::<_, i64>(1)? as u64,
                        deleted: r.get(2)?,
                    })
                })
                .optional()
            })
            .map_err(sql)
    }

    fn set_owner_version(&mut self, owner: &CtxUri, v: OwnerVersion) -> Result<()> {
        self.0
            .prepare_cached(
                "INSERT OR REPLACE INTO owner_versions (uri, node_version, relation_version, deleted)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    owner.as_str(),
                    v.node_version as i64,
                    v.relation_version as i64,
                    v.deleted
                ])
            })
            .map_err(sql)?;
        Ok(())
    }

    fn owned(&self, owner: &CtxUri) -> Result<Vec<RelationRecord>> {
        query(
            self.0,
            &format!("SELECT {COLUMNS} FROM relations WHERE from_uri = ?1 ORDER BY id"),
            [owner.as_str()],
        )
    }

    fn remove_owned(&mut self, owner: &CtxUri) -> Result<u64> {
        self.0
            .prepare_cached("DELETE FROM relations WHERE from_uri = ?1")
            .and_then(|mut s| s.execute([owner.as_str()]))
            .map(|n| n as u64)
            .map_err(sql)
    }

    fn put(&mut self, r: RelationRecord) -> Result<()> {
        let x = &r.record;
        self.0
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO relations ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    x.id,
                    x.from_uri.as_str(),
                    x.to_uri.as_str(),
                    x.relation_type,
                    x.weight,
                    x.reason,
                    x.account_id,
                    x.owner_space,
                    r.relation_version as i64,
                ])
            })
            .map_err(sql)?;
        Ok(())
    }
}

/// The embedded relation index (see the module documentation).
pub struct EmbeddedRelationIndex {
    dir: PathBuf,
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
}

impl std::fmt::Debug for EmbeddedRelationIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedRelationIndex")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl EmbeddedRelationIndex {
    /// Opens (creating if needed) the index stored in `dir` (file [`DB_FILE`]). A file that is
    /// not a database, or one of another layout version, is a non-retryable error and is left
    /// as it is.
    pub fn open(dir: &Path) -> Result<Self> {
        fs_err::create_dir_all(dir)
            .map_err(|e| IndexError::Unavailable(format!("relation index directory: {e}")))?;
        let path = dir.join(DB_FILE);
        let mut writer = open_conn(&path, DB_FILE)?;
        init_writer(&mut writer, DB_FILE, SCHEMA, SCHEMA_VERSION)?
            .commit()
            .map_err(sql)?;
        let reader = sqlite::read_only(open_conn(&path, DB_FILE)?, DB_FILE)?;
        Ok(EmbeddedRelationIndex {
            dir: dir.to_owned(),
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
        })
    }

    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `f` in one write transaction, committed if `f` succeeds.
    fn write<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        sqlite::write(&self.writer, DB_FILE, f)
    }

    /// Runs `f` in one read transaction (a consistent snapshot) on the reader connection.
    fn read<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        sqlite::read(&self.reader, DB_FILE, f)
    }

    /// Records whose column `col` is within `uri`, in listing order.
    fn list_within(&self, col: &str, uri: &CtxUri) -> Result<Vec<RelationRecord>> {
        let (lo, hi) = subtree_bounds(uri);
        let rows = self.read(|tx| {
            query(
                tx,
                &format!(
                    "SELECT {COLUMNS} FROM relations WHERE {}
                     ORDER BY from_uri, to_uri, relation_type",
                    within_sql(col)
                ),
                params![uri.as_str(), lo, hi],
            )
        })?;
        // The range also admits e.g. `a/b!x` for `a/b`; keep only true descendants.
        Ok(rows
            .into_iter()
            .filter(|r| {
                let u = if col == "from_uri" {
                    &r.record.from_uri
                } else {
                    &r.record.to_uri
                };
                within(u.as_str(), uri)
            })
            .collect())
    }
}

impl RelationIndex for EmbeddedRelationIndex {
    fn write_owners(&self, writes: &[RelationWrite]) -> Result<Vec<Result<RelationOutcome>>> {
        sqlite::write_batch(writes, |writes, isolation| {
            // The rule applies owned writes (the in-memory index keeps them).
            let checked: Vec<Result<RelationWrite>> = writes
                .iter()
                .map(|w| check_write(w).map(|()| w.clone()))
                .collect();
            self.write(|tx| {
                checked
                    .into_iter()
                    .map(|w| match w {
                        Ok(w) => isolation.run(tx, DB_FILE, || apply_write(&mut Tables(tx), w)),
                        Err(e) => Ok(Err(e)),
                    })
                    .collect()
            })
        })
    }

    fn upsert_relations(&self, records: &[RelationRecord]) -> Result<()> {
        for r in records {
            check_record(&r.record)?;
        }
        self.write(|tx| {
            for r in records {
                Tables(tx).put(stored(r.record.clone(), r.relation_version))?;
            }
            Ok(())
        })
    }

    fn delete_relations_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64> {
        self.write(|tx| {
            if !subtree {
                return Tables(tx).remove_owned(uri);
            }
            let ids: Vec<String> = select_within(
                tx,
                DB_FILE,
                &format!(
                    "SELECT from_uri, id FROM relations WHERE {}",
                    within_sql("from_uri")
                ),
                uri,
                |r| r.get(1),
            )?;
            let mut st = tx
                .prepare_cached("DELETE FROM relations WHERE id = ?1")
                .map_err(sql)?;
            let mut n = 0;
            for id in ids {
                n += st.execute([id]).map_err(sql)? as u64;
            }
            Ok(n)
        })
    }

    fn related(
        &self,
        uri: &CtxUri,
        relation_type: Option<&str>,
        direction: Direction,
        limit: usize,
    ) -> Result<Vec<RelationRecord>> {
        check_type_filter(relation_type)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let cols: &[&str] = match direction {
            Direction::Out => &["from_uri"],
            Direction::In => &["to_uri"],
            Direction::Both => &["from_uri", "to_uri"],
        };
        let cap = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut out = self.read(|tx| {
            let mut out: Vec<RelationRecord> = Vec::new();
            let mut seen: HashSet<String> = HashSet::new();
            for col in cols {
                // Each direction's best `limit` suffice: the union's best `limit` are among
                // them.
                let rows = query(
                    tx,
                    &format!(
                        "SELECT {COLUMNS} FROM relations
                         WHERE {col} = ?1 AND (?2 IS NULL OR relation_type = ?2)
                         ORDER BY weight DESC, from_uri, to_uri, relation_type LIMIT ?3"
                    ),
                    params![uri.as_str(), relation_type, cap],
                )?;
                for r in rows {
                    // A self-loop is found in both directions: keep it once.
                    if seen.insert(r.record.id.clone()) {
                        out.push(r);
                    }
                }
            }
            Ok(out)
        })?;
        rank(&mut out, limit);
        Ok(out)
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>> {
        self.list_within("from_uri", uri)
    }

    fn list_targeting(&self, uri: &CtxUri) -> Result<Vec<RelationRecord>> {
        self.list_within("to_uri", uri)
    }

    fn owner_version(&self, owner: &CtxUri) -> Result<Option<OwnerVersion>> {
        self.read(|tx| Tables(tx).owner_version(owner))
    }

    fn count(&self) -> Result<u64> {
        self.read(|tx| sqlite::count_rows(tx, DB_FILE, "relations"))
    }

    fn clear(&self) -> Result<()> {
        self.write(|tx| {
            tx.execute_batch("DELETE FROM relations; DELETE FROM owner_versions;")
                .map_err(sql)
        })
    }
}
