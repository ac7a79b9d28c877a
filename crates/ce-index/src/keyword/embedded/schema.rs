//! The SQLite file of the embedded keyword index (`keywords.db`): schema, pragmas, row codecs
//! and the small statements the index is made of.

use std::collections::BTreeMap;
use std::path::Path;

use ce_core::IndexRecord;
use rusqlite::Connection;

use super::super::Terms;
use crate::error::{IndexError, Result};

/// File name of the database inside the index directory.
pub const DB_FILE: &str = "keywords.db";

/// Version of the file layout; a file with another version is refused.
const SCHEMA_VERSION: u64 = 1;

/// Tables:
/// - `records`: one row per record; `doc` is its key in the postings, `len` its length in
///   terms, `terms` its postings (`term\ttf` lines: what to delete or update when it changes,
///   without an index of the postings by record), `head` the record as JSON with an empty
///   text (what filters are checked on), `text` the text.
/// - `postings`: one row per (term, record holding it) with the term's frequency and the
///   record's length (so scoring never reads `records`).
/// - `uri_versions`: the newest source version seen per URI, and whether it was a removal
///   (invariant VX1).
/// - `meta` ([`crate::sqlite::init_writer`]): `schema_version`, and `docs` / `total_len` (the record count and the sum of
///   their lengths, BM25's collection statistics, kept up to date by every write).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    doc INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    uri TEXT NOT NULL,
    level INTEGER NOT NULL,
    node_version INTEGER NOT NULL,
    len INTEGER NOT NULL,
    terms TEXT NOT NULL,
    head TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_uri ON records (uri, level);
CREATE TABLE IF NOT EXISTS postings (
    term TEXT NOT NULL,
    doc INTEGER NOT NULL,
    tf INTEGER NOT NULL,
    len INTEGER NOT NULL,
    PRIMARY KEY (term, doc)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uri_versions (
    uri TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL,
    deleted INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Maps a SQLite error of this database (see [`crate::error::sqlite_error`]).
pub(super) fn sql(e: rusqlite::Error) -> IndexError {
    crate::error::sqlite_error(DB_FILE, e)
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> IndexError {
    IndexError::Corrupt(format!("{DB_FILE}: {what}: {e}"))
}

/// Page cache per connection, in KiB (SQLite's default is 2 MiB). Postings are inserted in
/// term order, scattered over the file: a 64 MiB cache made writing 20k records 1.5× faster.
const CACHE_KIB: i64 = 64 * 1024;

/// Opens a connection with the pragmas every connection needs (see
/// [`crate::sqlite::open_conn`]), plus a larger page cache.
pub(super) fn open_conn(path: &Path) -> Result<Connection> {
    let conn = crate::sqlite::open_conn(path, DB_FILE)?;
    conn.pragma_update(None, "cache_size", -CACHE_KIB)
        .map_err(sql)?;
    Ok(conn)
}

/// Prepares the writer connection: WAL, `synchronous=FULL`, schema and layout version (see
/// [`crate::sqlite::init_writer`]).
pub(super) fn init(conn: &mut Connection) -> Result<()> {
    crate::sqlite::init_writer(conn, DB_FILE, SCHEMA, SCHEMA_VERSION)?
        .commit()
        .map_err(sql)
}

fn meta_u64(c: &Connection, key: &str) -> Result<Option<u64>> {
    crate::sqlite::meta_u64(c, DB_FILE, key)
}

pub(super) fn set_meta(c: &Connection, key: &str, value: u64) -> Result<()> {
    crate::sqlite::set_meta(c, DB_FILE, key, &value.to_string())
}

/// BM25's collection statistics: `(docs, total_len)`.
pub(super) fn stats(c: &Connection) -> Result<(u64, u64)> {
    Ok((
        meta_u64(c, "docs")?.unwrap_or(0),
        meta_u64(c, "total_len")?.unwrap_or(0),
    ))
}

/// A record from its stored head and text.
pub(super) fn decode(head: &str, text: String) -> Result<IndexRecord> {
    let mut r: IndexRecord = serde_json::from_str(head).map_err(|e| corrupt("record", e))?;
    r.text = text;
    Ok(r)
}

/// The record as stored in `head`: everything but the text.
pub(super) fn encode_head(r: &IndexRecord) -> Result<String> {
    let head = IndexRecord {
        text: String::new(),
        ..r.clone()
    };
    serde_json::to_string(&head).map_err(|e| corrupt("record", e))
}

/// A record's postings as stored in `records.terms`: one `term\ttf` line per term (terms
/// never hold whitespace).
pub(super) fn encode_terms(t: &Terms) -> String {
    let mut out = String::new();
    for (term, tf) in &t.tf {
        out.push_str(term);
        out.push('\t');
        out.push_str(&tf.to_string());
        out.push('\n');
    }
    out
}

pub(super) fn decode_terms(s: &str) -> Result<BTreeMap<&str, u32>> {
    s.lines()
        .map(|line| {
            let (term, tf) = line
                .split_once('\t')
                .ok_or_else(|| corrupt("record terms", format!("line {line:?}")))?;
            let tf = tf.parse().map_err(|e| corrupt("record terms", e))?;
            Ok((term, tf))
        })
        .collect()
}
