//! The SQLite file of the embedded vector index (`vectors.db`): schema, row codecs and the
//! small statements every write is made of.
//!
//! Tables:
//! - `records`: one row per record, unique by `(uri, level)` — the filter columns, the
//!   record's text and metadata as JSON (its other fields are columns: [`RawRecord`]), the
//!   filters as JSON without those that repeat the columns ([`decode_filters`]; so the
//!   in-memory filter table is rebuilt without parsing texts), the
//!   vector at half precision (`ce_embed::half`; rows written before it
//!   hold little-endian `f32`s, read as they are) and `key`, the record's key in the ANN
//!   graph. A key is allocated from `meta.next_key` and never reused; it changes only when the
//!   vector does. The record's `id` is a plain column: it is a hash, and a unique index on it
//!   cost every batch a WAL frame for most of that index's pages (layout 1; docs/indexing.md,
//!   "Index writes").
//! - `uri_versions`: the newest source version seen per URI, and whether it was a removal
//!   (invariant VX1 of the versioned writes).
//! - `meta`: `db_id` (random, names snapshot files), `generation` (bumped by every commit
//!   that adds or removes an ANN key), `next_key`, `dimension`, `model`, `schema_version`,
//!   `snapshot_generation` (the graph snapshot to load at open, see `ann.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use ce_core::{CtxUri, IndexRecord, Level};
use ce_embed::ModelIdentity;
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::super::{StoredRecord, StoredVector};
use crate::error::{IndexError, Result};
use crate::records::{FieldFilters, restore_filters, stored_filters, to_i64};
use crate::sqlite::{select_within, subtree_bounds, within_sql};

/// Page size of a new file. A record row was ~2.6 KB for a 384-d model with `f32` vectors
/// (1,536 bytes of vector, ~800 of record JSON, ~170 of filters, the columns): on 4 KiB pages
/// a second row never fit, so every row took a page of its own (4.2 KB per record); 8 KiB
/// pages held three (docs/indexing.md "Footprint"). At half precision (769 bytes of vector)
/// and without repeated filters a row is ~1.43 KB: five to an 8 KiB page with 1 KiB unused,
/// eleven to a 16 KiB one (the 29,700 rows of the 10,000-document benchmark, vacuumed into
/// each size: 50.8 → 46.4 MB).
const PAGE_SIZE: u32 = 16384;

/// Version of this layout. Layout 3 stores vectors at half precision and only the text and
/// metadata in the `record` column; a file of layout 2 (`f32` vectors, whole records) is
/// only re-labelled when opened — its rows are read as they are and take the new form when
/// rewritten — and a file of layout 1 (records keyed by a unique `id`) is migrated
/// ([`crate::sqlite::rekey_records_by_node`]). Any other version is refused, so a build that
/// reads only layout 2 refuses a file of this one instead of misreading its rows.
pub(super) const SCHEMA_VERSION: u64 = 3;

/// The columns of `records`, as the layout-1 migration copies them.
const RECORD_COLUMNS: &str = "id, uri, parent_uri, level, account_id, owner_space, \
    context_type, category, node_version, filters, record, vector, key";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    id TEXT NOT NULL,
    uri TEXT NOT NULL,
    parent_uri TEXT NOT NULL,
    level INTEGER NOT NULL,
    account_id TEXT NOT NULL,
    owner_space TEXT NOT NULL,
    context_type TEXT NOT NULL,
    category TEXT NOT NULL,
    node_version INTEGER NOT NULL,
    filters TEXT NOT NULL,
    record TEXT NOT NULL,
    vector BLOB NOT NULL,
    key INTEGER NOT NULL UNIQUE
);
CREATE UNIQUE INDEX IF NOT EXISTS records_by_node ON records (uri, level);
CREATE TABLE IF NOT EXISTS uri_versions (
    uri TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL,
    deleted INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Maps a SQLite error of this database (see [`crate::error::sqlite_error`]).
pub(super) fn sql(e: rusqlite::Error) -> IndexError {
    crate::error::sqlite_error(super::DB_FILE, e)
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> IndexError {
    IndexError::Corrupt(format!("{}: {what}: {e}", super::DB_FILE))
}

/// Opens a connection with the pragmas every connection needs (see
/// [`crate::sqlite::open_conn`]).
pub(super) fn open_conn(path: &Path) -> Result<Connection> {
    crate::sqlite::open_conn(path, super::DB_FILE)
}

/// Prepares the writer connection: WAL, `synchronous=FULL`, schema and layout version (see
/// [`crate::sqlite::init_writer`]), meta defaults. Returns the database id.
pub(super) fn init(conn: &mut Connection) -> Result<String> {
    // A new file only (SQLite keeps an existing file's page size): see [`PAGE_SIZE`].
    conn.pragma_update(None, "page_size", PAGE_SIZE)
        .map_err(sql)?;
    crate::sqlite::rekey_records_by_node(
        conn,
        super::DB_FILE,
        (1, SCHEMA_VERSION),
        SCHEMA,
        RECORD_COLUMNS,
    )?;
    if crate::sqlite::layout_version(conn, super::DB_FILE)? == Some(2) {
        // Layout 2's rows are layout 3's too (see [`SCHEMA_VERSION`]).
        set_meta(conn, "schema_version", &SCHEMA_VERSION.to_string())?;
    }
    let tx = crate::sqlite::init_writer(conn, super::DB_FILE, SCHEMA, SCHEMA_VERSION)?;
    let id = match meta(&tx, "db_id")? {
        Some(id) => id,
        None => {
            let id = uuid::Uuid::now_v7().simple().to_string();
            set_meta(&tx, "db_id", &id)?;
            id
        }
    };
    for (k, v) in [("generation", "0"), ("next_key", "1")] {
        tx.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES (?1, ?2)",
            params![k, v],
        )
        .map_err(sql)?;
    }
    tx.commit().map_err(sql)?;
    Ok(id)
}

pub(super) fn meta(c: &Connection, key: &str) -> Result<Option<String>> {
    crate::sqlite::meta(c, super::DB_FILE, key)
}

pub(super) fn meta_u64(c: &Connection, key: &str) -> Result<Option<u64>> {
    crate::sqlite::meta_u64(c, super::DB_FILE, key)
}

pub(super) fn set_meta(c: &Connection, key: &str, value: &str) -> Result<()> {
    crate::sqlite::set_meta(c, super::DB_FILE, key, value)
}

pub(super) fn delete_meta(c: &Connection, key: &str) -> Result<()> {
    c.execute("DELETE FROM meta WHERE key = ?1", [key])
        .map_err(sql)?;
    Ok(())
}

/// The bound model, if any.
pub(super) fn model(c: &Connection) -> Result<Option<ModelIdentity>> {
    meta(c, "model")?
        .map(|m| serde_json::from_str(&m).map_err(|e| corrupt("meta model", e)))
        .transpose()
}

pub(super) fn set_model(c: &Connection, m: &ModelIdentity) -> Result<()> {
    let json = serde_json::to_string(m).map_err(|e| corrupt("meta model", e))?;
    set_meta(c, "model", &json)
}

pub(super) fn dimension(c: &Connection) -> Result<Option<usize>> {
    Ok(meta_u64(c, "dimension")?.map(|d| d as usize))
}

/// A vector as stored: at half precision ([`ce_embed::half`]; what the index keeps of it is
/// [`decode_vector`] of these bytes).
pub(super) fn encode_vector(v: &[f32]) -> Vec<u8> {
    ce_embed::half::encode(v)
}

/// A stored vector: half precision, or the little-endian `f32`s rows written before it hold.
pub(super) fn decode_vector(b: &[u8]) -> Result<Vec<f32>> {
    ce_embed::half::decode(b).ok_or_else(|| corrupt("vector", format!("blob of {} bytes", b.len())))
}

/// What the `record` column holds of a record: the fields no other column of the row does.
/// Layout 2 stored the whole record there (~340 more bytes a row: the filters twice, the
/// path fields); such rows are still read — their extra fields are ignored, the columns hold
/// the same values.
#[derive(serde::Serialize)]
struct Body<'a> {
    text: &'a str,
    metadata: &'a BTreeMap<String, Value>,
}

/// [`Body`] as read.
#[derive(serde::Deserialize)]
struct StoredBody {
    text: String,
    #[serde(default)]
    metadata: BTreeMap<String, Value>,
}

/// The JSON columns and the checked version of a row, shared by inserts and rewrites.
fn encoded(r: &IndexRecord, node_version: u64) -> Result<(String, String, i64)> {
    let filters =
        serde_json::to_string(&stored_filters(r)).map_err(|e| corrupt("record filters", e))?;
    let body = Body {
        text: &r.text,
        metadata: &r.metadata,
    };
    let record = serde_json::to_string(&body).map_err(|e| corrupt("record", e))?;
    Ok((filters, record, to_i64(node_version, "node version")?))
}

/// A `filters` column: `[filters, repeated]`, the filters without those that repeat the
/// record's fields and the mask of those left out ([`stored_filters`]), or, as rows written before
/// 2026-12-07 hold them, the whole filters as an object.
fn decode_filters(column: &str, fields: FieldFilters<'_>) -> Result<BTreeMap<String, Value>> {
    let bad = |e: serde_json::Error| corrupt("record filters", e);
    if !column.starts_with('[') {
        return serde_json::from_str(column).map_err(bad);
    }
    let (mut filters, repeated): (BTreeMap<String, Value>, u8) =
        serde_json::from_str(column).map_err(bad)?;
    restore_filters(&mut filters, repeated, fields);
    Ok(filters)
}

/// The columns a stored record is rebuilt from ([`RawRecord::read`] reads them in this
/// order, from a given column on).
pub(super) const RECORD_COLUMNS_READ: &str =
    "id, uri, parent_uri, level, context_type, category, filters, record, node_version";

/// A stored record's columns, decoded only when wanted ([`RawRecord::decode`]).
pub(super) struct RawRecord {
    id: String,
    uri: String,
    parent_uri: String,
    level: u8,
    context_type: String,
    category: String,
    filters: String,
    body: String,
    node_version: i64,
}

impl RawRecord {
    /// The [`RECORD_COLUMNS_READ`] of `row`, starting at column `at`.
    pub(super) fn read(row: &Row<'_>, at: usize) -> rusqlite::Result<Self> {
        Ok(RawRecord {
            id: row.get(at)?,
            uri: row.get(at + 1)?,
            parent_uri: row.get(at + 2)?,
            level: row.get(at + 3)?,
            context_type: row.get(at + 4)?,
            category: row.get(at + 5)?,
            filters: row.get(at + 6)?,
            body: row.get(at + 7)?,
            node_version: row.get(at + 8)?,
        })
    }

    /// The record's id.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn decode(self) -> Result<StoredRecord> {
        let uri = |s: &str, what: &str| CtxUri::parse(s).map_err(|e| corrupt(what, e));
        let body: StoredBody =
            serde_json::from_str(&self.body).map_err(|e| corrupt("record", e))?;
        let record = IndexRecord {
            uri: uri(&self.uri, "record uri")?,
            parent_uri: uri(&self.parent_uri, "record parent_uri")?,
            level: Level::try_from(self.level).map_err(|e| corrupt("record level", e))?,
            filters: decode_filters(
                &self.filters,
                FieldFilters {
                    uri: &self.uri,
                    parent_uri: &self.parent_uri,
                    level: self.level,
                    context_type: &self.context_type,
                    category: &self.category,
                },
            )?,
            id: self.id,
            context_type: self.context_type,
            category: self.category,
            text: body.text,
            metadata: body.metadata,
        };
        Ok(StoredRecord {
            record,
            node_version: self.node_version as u64,
        })
    }
}

/// Inserts or replaces the row of `r` (by node and level).
pub(super) fn put_row(
    c: &Connection,
    r: &IndexRecord,
    node_version: u64,
    vector: &[u8],
    key: u64,
) -> Result<()> {
    let s = |k: &str| r.filters.get(k).and_then(Value::as_str).unwrap_or("");
    let (filters, record, node_version) = encoded(r, node_version)?;
    c.prepare_cached(
        "INSERT OR REPLACE INTO records (id, uri, parent_uri, level, account_id, owner_space,
             context_type, category, node_version, filters, record, vector, key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.id,
            r.uri.as_str(),
            r.parent_uri.as_str(),
            r.level.as_u8(),
            s("account_id"),
            s("owner_space"),
            r.context_type,
            r.category,
            node_version,
            filters,
            record,
            vector,
            key as i64,
        ])
    })
    .map_err(sql)?;
    Ok(())
}

/// Rewrites every column of the row with `key` but its vector and key (a move); false when
/// no row has that key.
pub(super) fn rewrite_row(
    c: &Connection,
    key: u64,
    r: &IndexRecord,
    node_version: u64,
) -> Result<bool> {
    let s = |k: &str| r.filters.get(k).and_then(Value::as_str).unwrap_or("");
    let (filters, record, node_version) = encoded(r, node_version)?;
    c.prepare_cached(
        "UPDATE records SET id = ?1, uri = ?2, parent_uri = ?3, level = ?4, account_id = ?5,
             owner_space = ?6, context_type = ?7, category = ?8, node_version = ?9, filters = ?10,
             record = ?11
         WHERE key = ?12",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.id,
            r.uri.as_str(),
            r.parent_uri.as_str(),
            r.level.as_u8(),
            s("account_id"),
            s("owner_space"),
            r.context_type,
            r.category,
            node_version,
            filters,
            record,
            key as i64,
        ])
    })
    .map(|n| n == 1)
    .map_err(sql)
}

/// The key and vector bytes of the record of node `uri` at `level`.
pub(super) fn key_and_vector(
    c: &Connection,
    uri: &CtxUri,
    level: Level,
) -> Result<Option<(u64, Vec<u8>)>> {
    c.prepare_cached("SELECT key, vector FROM records WHERE uri = ?1 AND level = ?2")
        .and_then(|mut s| {
            s.query_row(params![uri.as_str(), level.as_u8()], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))
            })
            .optional()
        })
        .map_err(sql)
}

/// The vector stored for the record of node `uri` at `level` and its text hash
/// (`metadata.content_hash`), for a payload-only update that keeps the vector
/// ([`crate::vector::rules::check_kept`]).
pub(super) fn vector_and_text_hash(
    c: &Connection,
    uri: &CtxUri,
    level: Level,
) -> Result<Option<(Vec<u8>, Option<String>)>> {
    c.prepare_cached(
        "SELECT vector, json_extract(record, '$.metadata.content_hash') FROM records
         WHERE uri = ?1 AND level = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![uri.as_str(), level.as_u8()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
    })
    .map_err(sql)
}

/// Deletes the record of node `uri` at `level`, returning its key.
pub(super) fn delete_row_at(c: &Connection, uri: &CtxUri, level: Level) -> Result<Option<u64>> {
    c.prepare_cached("DELETE FROM records WHERE uri = ?1 AND level = ?2 RETURNING key")
        .and_then(|mut s| {
            s.query_row(params![uri.as_str(), level.as_u8()], |r| r.get::<_, i64>(0))
                .optional()
        })
        .map(|k| k.map(|k| k as u64))
        .map_err(sql)
}

/// Deletes the record with `key`; whether there was one.
pub(super) fn delete_row_key(c: &Connection, key: u64) -> Result<bool> {
    c.prepare_cached("DELETE FROM records WHERE key = ?1")
        .and_then(|mut s| s.execute([key as i64]))
        .map(|n| n > 0)
        .map_err(sql)
}

/// Deletes the records of node `uri` (all levels), returning their keys.
pub(super) fn delete_node_rows(c: &Connection, uri: &CtxUri) -> Result<Vec<u64>> {
    c.prepare_cached("DELETE FROM records WHERE uri = ?1 RETURNING key")
        .and_then(|mut s| {
            s.query_map([uri.as_str()], |r| Ok(r.get::<_, i64>(0)? as u64))?
                .collect()
        })
        .map_err(sql)
}

/// `(level, key)` of the records of node `uri` (all levels).
pub(super) fn node_rows(c: &Connection, uri: &CtxUri) -> Result<Vec<(u8, u64)>> {
    c.prepare_cached("SELECT level, key FROM records WHERE uri = ?1")
        .and_then(|mut s| {
            s.query_map([uri.as_str()], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)? as u64))
            })?
            .collect()
        })
        .map_err(sql)
}

/// Stored records within `uri`, with their keys, in (uri, level) order.
pub(super) fn rows_within(c: &Connection, uri: &CtxUri) -> Result<Vec<(u64, StoredRecord)>> {
    let (lo, hi) = subtree_bounds(uri);
    let rows: Vec<(i64, RawRecord)> = c
        .prepare_cached(&format!(
            "SELECT key, {RECORD_COLUMNS_READ} FROM records WHERE {} ORDER BY uri, level",
            within_sql("uri")
        ))
        .and_then(|mut s| {
            s.query_map(params![uri.as_str(), lo, hi], |r| {
                Ok((r.get(0)?, RawRecord::read(r, 1)?))
            })?
            .collect()
        })
        .map_err(sql)?;
    rows.into_iter()
        .map(|(k, raw)| Ok((k as u64, raw.decode()?)))
        .filter(|r| {
            r.as_ref()
                .map_or(true, |(_, s)| s.record.uri.is_within(uri))
        })
        .collect()
}

/// The keys of every record within `uri`.
pub(super) fn keys_within(c: &Connection, uri: &CtxUri) -> Result<Vec<u64>> {
    let rows: Vec<i64> = select_within(
        c,
        super::DB_FILE,
        &format!("SELECT uri, key FROM records WHERE {}", within_sql("uri")),
        uri,
        |r| r.get(1),
    )?;
    Ok(rows.into_iter().map(|k| k as u64).collect())
}

/// The stored records of the nodes `uris`, node by node as asked, levels ascending.
pub(super) fn get_nodes(c: &Connection, uris: &[CtxUri]) -> Result<Vec<StoredRecord>> {
    let mut st = c
        .prepare_cached(&format!(
            "SELECT {RECORD_COLUMNS_READ} FROM records WHERE uri = ?1 ORDER BY level"
        ))
        .map_err(sql)?;
    let mut out = Vec::with_capacity(uris.len() * 3);
    for uri in uris {
        let rows: Vec<RawRecord> = st
            .query_map([uri.as_str()], |r| RawRecord::read(r, 0))
            .and_then(|rows| rows.collect())
            .map_err(sql)?;
        for raw in rows {
            out.push(raw.decode()?);
        }
    }
    Ok(out)
}

/// The stored vectors of the nodes `uris` with their records' text hashes
/// (`metadata.content_hash`), read from the same rows, in the order of [`get_nodes`].
pub(super) fn node_vectors(c: &Connection, uris: &[CtxUri]) -> Result<Vec<StoredVector>> {
    let mut st = c
        .prepare_cached(
            "SELECT id, vector, json_extract(record, '$.metadata.content_hash') FROM records
             WHERE uri = ?1 ORDER BY level",
        )
        .map_err(sql)?;
    let mut out = Vec::with_capacity(uris.len() * 3);
    for uri in uris {
        let rows: Vec<(String, Vec<u8>, Option<String>)> = st
            .query_map([uri.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(|rows| rows.collect())
            .map_err(sql)?;
        for (id, blob, text_hash) in rows {
            out.push(StoredVector {
                id,
                text_hash,
                vector: decode_vector(&blob)?,
            });
        }
    }
    Ok(out)
}

/// A row read to rescore a search's shortlist: the record is decoded only if it is returned.
pub(super) struct ShortlistRow {
    pub record: RawRecord,
    pub vector: Vec<f32>,
}

/// The rows of `keys` (absent keys skipped), with their stored vectors.
pub(super) fn shortlist_rows(c: &Connection, keys: &[u64]) -> Result<BTreeMap<u64, ShortlistRow>> {
    let mut out = BTreeMap::new();
    for chunk in keys.chunks(256) {
        let marks = vec!["?"; chunk.len()].join(",");
        let mut st = c
            .prepare_cached(&format!(
                "SELECT key, vector, {RECORD_COLUMNS_READ} FROM records WHERE key IN ({marks})"
            ))
            .map_err(sql)?;
        let rows: Vec<(i64, Vec<u8>, RawRecord)> = st
            .query_map(
                rusqlite::params_from_iter(chunk.iter().map(|k| *k as i64)),
                |r| Ok((r.get(0)?, r.get(1)?, RawRecord::read(r, 2)?)),
            )
            .and_then(|it| it.collect())
            .map_err(sql)?;
        for (k, blob, record) in rows {
            let row = ShortlistRow {
                record,
                vector: decode_vector(&blob)?,
            };
            out.insert(k as u64, row);
        }
    }
    Ok(out)
}

pub(super) fn count(c: &Connection) -> Result<u64> {
    c.prepare_cached("SELECT COUNT(*) FROM records")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map(|n| n as u64)
        .map_err(sql)
}

/// What the in-memory filter table needs of a row.
pub(super) struct TableRowSql {
    pub key: u64,
    pub id: String,
    pub uri: String,
    pub parent_uri: String,
    pub level: u8,
    pub filters: BTreeMap<String, Value>,
}

/// Calls `f` for every row's filter data and (when `with_vectors`) vector, in key order.
pub(super) fn scan_rows(
    c: &Connection,
    with_vectors: bool,
    mut f: impl FnMut(TableRowSql, Option<Vec<f32>>) -> Result<()>,
) -> Result<()> {
    let cols = if with_vectors { ", vector" } else { "" };
    let mut st = c
        .prepare(&format!(
            "SELECT key, id, uri, parent_uri, level, filters, context_type, category{cols}
             FROM records ORDER BY key"
        ))
        .map_err(sql)?;
    let mut rows = st.query([]).map_err(sql)?;
    while let Some(r) = rows.next().map_err(sql)? {
        let row = table_row(r).map_err(sql)?;
        let (filters, context_type, category): (String, String, String) = (
            r.get(5).map_err(sql)?,
            r.get(6).map_err(sql)?,
            r.get(7).map_err(sql)?,
        );
        let filters = decode_filters(
            &filters,
            FieldFilters {
                uri: &row.uri,
                parent_uri: &row.parent_uri,
                level: row.level,
                context_type: &context_type,
                category: &category,
            },
        )?;
        let vector = if with_vectors {
            Some(decode_vector(&r.get::<_, Vec<u8>>(8).map_err(sql)?)?)
        } else {
            None
        };
        f(TableRowSql { filters, ..row }, vector)?;
    }
    Ok(())
}

fn table_row(r: &Row<'_>) -> rusqlite::Result<TableRowSql> {
    Ok(TableRowSql {
        key: r.get::<_, i64>(0)? as u64,
        id: r.get(1)?,
        uri: r.get(2)?,
        parent_uri: r.get(3)?,
        level: r.get(4)?,
        filters: BTreeMap::new(),
    })
}

/// `(key, vector)` of the rows with `keys` (absent keys skipped).
pub(super) fn vectors_by_keys(c: &Connection, keys: &[u64]) -> Result<Vec<(u64, Vec<f32>)>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(256) {
        let marks = vec!["?"; chunk.len()].join(",");
        let rows: Vec<(i64, Vec<u8>)> = c
            .prepare_cached(&format!(
                "SELECT key, vector FROM records WHERE key IN ({marks})"
            ))
            .and_then(|mut s| {
                s.query_map(
                    rusqlite::params_from_iter(chunk.iter().map(|k| *k as i64)),
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?
                .collect()
            })
            .map_err(sql)?;
        for (k, v) in rows {
            out.push((k as u64, decode_vector(&v)?));
        }
    }
    Ok(out)
}

/// `(key, vector)` of up to `limit` rows chosen at random (snapshot spot checks).
pub(super) fn sample_vectors(c: &Connection, limit: usize) -> Result<Vec<(u64, Vec<f32>)>> {
    let rows: Vec<(i64, Vec<u8>)> = c
        .prepare("SELECT key, vector FROM records ORDER BY random() LIMIT ?1")
        .and_then(|mut s| {
            s.query_map([limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(sql)?;
    rows.into_iter()
        .map(|(k, v)| Ok((k as u64, decode_vector(&v)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A `filters` column is written without the filters that repeat the record's columns and
    /// reads back whole; the object form of earlier rows reads as it is.
    #[test]
    fn filters_are_stored_without_the_columns_they_repeat() {
        let uri = CtxUri::parse("ctx://acc/docs/a").expect("uri");
        let r = IndexRecord {
            id: "id".into(),
            parent_uri: uri.parent().expect("parent"),
            uri: uri.clone(),
            context_type: "resource".into(),
            category: String::new(),
            level: Level::L2,
            text: "t".into(),
            filters: BTreeMap::from([
                ("uri".into(), json!("ctx://acc/docs/a")),
                ("parent_uri".into(), json!("ctx://acc/docs")),
                ("level".into(), json!(2)),
                ("context_type".into(), json!("resource")),
                ("category".into(), json!("")),
                ("group".into(), json!("g1")),
            ]),
            metadata: BTreeMap::new(),
        };
        let (column, _, _) = encoded(&r, 1).expect("encode");
        assert_eq!(column, r#"[{"group":"g1"},31]"#);
        let read = |column: &str| decode_filters(column, FieldFilters::of(&r)).expect("decode");
        assert_eq!(read(&column), r.filters);
        let earlier = serde_json::to_string(&r.filters).expect("json");
        assert_eq!(read(&earlier), r.filters);
    }
}
