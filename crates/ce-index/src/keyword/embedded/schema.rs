//! The SQLite file of the embedded keyword index (`keywords.db`): schema, pragmas, row codecs
//! and the small statements the index is made of.

use std::collections::BTreeMap;
use std::path::Path;

use ce_core::{CtxUri, IndexRecord, Level};
use rusqlite::Connection;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use super::super::Terms;
use super::blocks::{self, Posting};
use crate::error::{IndexError, Result};
use crate::records::{FieldFilters, restore_filters, stored_filters};
use crate::vector::{FilterView, StoredRecord};

/// File name of the database inside the index directory.
pub const DB_FILE: &str = "keywords.db";

/// Version of the file layout. A file of layout 1 (one row per posting) is migrated in place
/// when opened (see [`migrate_v1`]), then as one of layout 2 (records keyed by a unique `id`,
/// [`crate::sqlite::rekey_records_by_node`]); a file of any other version is refused.
const SCHEMA_VERSION: u64 = 3;

/// The columns of `records`, as the layout-2 migration copies them (`doc` kept: the postings
/// refer to it).
const RECORD_COLUMNS: &str = "doc, id, uri, level, node_version, len, terms, head, text";

/// Tables:
/// - `records`: one row per record, unique by `(uri, level)` (`id` is a plain column: see
///   [`crate::sqlite::rekey_records_by_node`]); `doc` is its key in the postings, `len` its length in
///   terms, `terms` its postings (`term\ttf` lines: what to delete or update when it changes,
///   without an index of the postings by record), `head` the record as JSON with an empty
///   text (what filters are checked on), `text` the text.
/// - `blocks`: each term's postings in blocks of at most [`super::blocks::BLOCK`], keyed by
///   `(term, last_doc)`, with `first_doc`, the count `n`, the score bound and the postings
///   (see [`super::blocks`]; postings carry the record's length, so scoring never reads
///   `records`).
/// - `terms`: per term, its document frequency `df` (the number of records holding it, the
///   sum of its blocks' `n`), kept up to date by every write; terms held by no record have
///   no row.
/// - `uri_versions`: the newest source version seen per URI, and whether it was a removal
///   (invariant VX1).
/// - `meta` ([`crate::sqlite::init_writer`]): `schema_version`, and `docs` / `total_len` (the
///   record count and the sum of their lengths, BM25's collection statistics, kept up to date
///   by every write).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    doc INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    uri TEXT NOT NULL,
    level INTEGER NOT NULL,
    node_version INTEGER NOT NULL,
    len INTEGER NOT NULL,
    terms TEXT NOT NULL,
    head TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS records_by_node ON records (uri, level);
CREATE TABLE IF NOT EXISTS blocks (
    term TEXT NOT NULL,
    last_doc INTEGER NOT NULL,
    first_doc INTEGER NOT NULL,
    n INTEGER NOT NULL,
    bound BLOB NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (term, last_doc)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS terms (
    term TEXT PRIMARY KEY NOT NULL,
    df INTEGER NOT NULL
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

pub(super) fn corrupt(what: &str, e: impl std::fmt::Display) -> IndexError {
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

/// Page size of a new file. A `records` row is ~1.1 KB (the head ~600 bytes, the text, the
/// terms): three fit a 4 KiB page with a fifth of it left over, seven an 8 KiB one. The
/// keyword file of the 10,000-document benchmark (29,700 records), vacuumed into each size:
/// 42.8 MiB on 4 KiB pages, 35.0 on 8 KiB, 33.9 on 16 KiB (docs/indexing.md "Footprint").
const PAGE_SIZE: u32 = 8192;

/// Prepares the writer connection: WAL, `synchronous=FULL`, a file of layout 1 migrated,
/// schema and layout version (see [`crate::sqlite::init_writer`]).
pub(super) fn init(conn: &mut Connection) -> Result<()> {
    // A new file only (SQLite keeps an existing file's page size).
    conn.pragma_update(None, "page_size", PAGE_SIZE)
        .map_err(sql)?;
    migrate_v1(conn)?;
    crate::sqlite::rekey_records_by_node(
        conn,
        DB_FILE,
        (2, SCHEMA_VERSION),
        SCHEMA,
        RECORD_COLUMNS,
    )?;
    crate::sqlite::init_writer(conn, DB_FILE, SCHEMA, SCHEMA_VERSION)?
        .commit()
        .map_err(sql)
}

/// Migrates a file of layout 1 — one `postings (term, doc, tf, len)` row per posting, document
/// frequencies counted at search time — to layout 2 in one transaction: the postings are read
/// in (term, doc) order into blocks, each term's count becomes its `df`, the old table is
/// dropped. Records, versions and statistics are kept as they are (no text is re-tokenized).
/// Does nothing to a new file or one of another layout.
fn migrate_v1(conn: &mut Connection) -> Result<()> {
    if crate::sqlite::layout_version(conn, DB_FILE)? != Some(1) {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sql)?;
    tx.execute_batch(SCHEMA).map_err(sql)?;
    let (mut terms, mut postings) = (0u64, 0u64);
    {
        let mut st = tx
            .prepare("SELECT term, doc, tf, len FROM postings ORDER BY term, doc")
            .map_err(sql)?;
        let mut rows = st.query([]).map_err(sql)?;
        let mut term = String::new();
        let mut list: Vec<Posting> = Vec::new();
        let finish = |term: &str, list: &mut Vec<Posting>| -> Result<()> {
            if !list.is_empty() {
                blocks::write_blocks(&tx, term, list)?;
                blocks::add_df(&tx, term, list.len() as i64)?;
                list.clear();
            }
            Ok(())
        };
        while let Some(r) = rows.next().map_err(sql)? {
            let t: String = r.get(0).map_err(sql)?;
            if t != term {
                finish(&term, &mut list)?;
                term = t;
                terms += 1;
            }
            list.push(Posting {
                doc: r.get(1).map_err(sql)?,
                tf: r.get(2).map_err(sql)?,
                len: r.get(3).map_err(sql)?,
            });
            postings += 1;
        }
        finish(&term, &mut list)?;
    }
    tx.execute_batch("DROP TABLE postings").map_err(sql)?;
    // Layout 2: its records are keyed by `id` until the next migration rekeys them.
    crate::sqlite::set_meta(&tx, DB_FILE, "schema_version", "2")?;
    tx.commit().map_err(sql)?;
    tracing::info!(
        file = DB_FILE,
        terms,
        postings,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "keyword index migrated from layout 1 to layout 2 (postings in blocks, stored df)"
    );
    Ok(())
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

/// The columns a stored record is read from, in the order [`RawRecord::read`] reads them.
pub(super) const RECORD_READ: &str = "id, uri, level, head, text, node_version";

/// A stored record's columns ([`RECORD_READ`]), decoded by [`RawRecord::decode`].
pub(super) struct RawRecord {
    id: String,
    uri: String,
    level: u8,
    head: String,
    text: String,
    node_version: i64,
}

impl RawRecord {
    /// The [`RECORD_READ`] columns of `row`, starting at column `at`.
    pub(super) fn read(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Self> {
        Ok(RawRecord {
            id: row.get(at)?,
            uri: row.get(at + 1)?,
            level: row.get(at + 2)?,
            head: row.get(at + 3)?,
            text: row.get(at + 4)?,
            node_version: row.get(at + 5)?,
        })
    }

    pub(super) fn decode(self) -> Result<StoredRecord> {
        let (uri, level) = node_columns(&self.uri, self.level)?;
        let head = StoredHead::<BTreeMap<String, Value>>::read(&self.head, &uri, level)?;
        let record = IndexRecord {
            id: self.id,
            uri,
            parent_uri: head.parent_uri,
            context_type: head.context_type,
            category: head.category,
            level,
            text: self.text,
            filters: head.filters,
            metadata: head.metadata,
        };
        Ok(StoredRecord {
            record,
            node_version: self.node_version as u64,
        })
    }
}

/// A record's `uri` and `level` columns.
fn node_columns(uri: &str, level: u8) -> Result<(CtxUri, Level)> {
    Ok((
        CtxUri::parse(uri).map_err(|e| corrupt("record uri", e))?,
        Level::try_from(level).map_err(|e| corrupt("record level", e))?,
    ))
}

/// A stored head, its metadata read as `M` (skipped with [`IgnoredAny`] where only filters are
/// wanted). Heads written before the filters were stored without their repeated entries
/// (layout 3 until 2026-12) also hold the record's `id`, `uri`, `level` and an empty `text`,
/// which are skipped (the columns hold them), and no `~`: they decode the same.
#[derive(serde::Deserialize)]
struct StoredHead<M> {
    parent_uri: CtxUri,
    context_type: String,
    category: String,
    filters: BTreeMap<String, Value>,
    #[serde(default)]
    metadata: M,
    /// The filters left out because they repeat a field ([`stored_filters`]).
    #[serde(default, rename = "~")]
    repeated: u8,
}

impl<M: DeserializeOwned + Default> StoredHead<M> {
    /// Parses the head of the record at `uri`, `level`, its filters whole again.
    fn read(head: &str, uri: &CtxUri, level: Level) -> Result<Self> {
        let mut h: Self = serde_json::from_str(head).map_err(|e| corrupt("record", e))?;
        let fields = FieldFilters {
            uri: uri.as_str(),
            parent_uri: h.parent_uri.as_str(),
            level: level.as_u8(),
            context_type: &h.context_type,
            category: &h.category,
        };
        restore_filters(&mut h.filters, h.repeated, fields);
        Ok(h)
    }
}

/// The fields a search filter reads, from a record's `uri`, `level` and `head` columns.
pub(super) fn decode_view(uri: &str, level: u8, head: &str) -> Result<FilterView> {
    let (uri, level) = node_columns(uri, level)?;
    let head = StoredHead::<IgnoredAny>::read(head, &uri, level)?;
    Ok(FilterView {
        uri,
        parent_uri: head.parent_uri,
        level,
        filters: head.filters,
    })
}

/// The record as stored in `head`: what the `id`, `uri`, `level` and `text` columns do not
/// hold, the filters without those that repeat the record's fields ([`stored_filters`]).
pub(super) fn encode_head(r: &IndexRecord) -> Result<String> {
    #[derive(serde::Serialize)]
    struct Head<'a> {
        parent_uri: &'a CtxUri,
        context_type: &'a str,
        category: &'a str,
        filters: BTreeMap<&'a str, &'a Value>,
        metadata: &'a BTreeMap<String, Value>,
        #[serde(rename = "~", skip_serializing_if = "is_zero")]
        repeated: u8,
    }
    fn is_zero(n: &u8) -> bool {
        *n == 0
    }
    // Destructured so that a field added to `IndexRecord` fails to compile here.
    let IndexRecord {
        id: _,
        uri: _,
        parent_uri,
        context_type,
        category,
        level: _,
        text: _,
        filters: _,
        metadata,
    } = r;
    let (filters, repeated) = stored_filters(r);
    let head = Head {
        parent_uri,
        context_type,
        category,
        filters,
        metadata,
        repeated,
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

/// The terms of a stored `terms` column, without their frequencies (what a removal needs).
pub(super) fn term_names(s: &str) -> impl Iterator<Item = Result<&str>> {
    s.lines().map(|line| {
        line.split_once('\t')
            .map(|(term, _)| term)
            .ok_or_else(|| corrupt("record terms", format!("line {line:?}")))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A record is stored as its columns and a head without what they hold nor the filters
    /// that repeat its fields, and reads back whole; a head of the earlier form (the whole
    /// record without its text) reads back the same.
    #[test]
    fn a_record_reads_back_from_its_columns_and_head() {
        let uri = CtxUri::parse("ctx://acc/docs/a").expect("uri");
        let mut r = IndexRecord {
            id: "id-1".into(),
            parent_uri: uri.parent().expect("parent"),
            uri,
            context_type: "resource".into(),
            category: "notes \"quoted\"".into(),
            level: Level::L1,
            text: "the text is not in the head".into(),
            filters: BTreeMap::from([("owner_space".into(), Value::from("team"))]),
            metadata: BTreeMap::from([
                ("tags".into(), serde_json::json!(["a", "b"])),
                ("size".into(), Value::from(3)),
            ]),
        };
        for (k, v) in [
            ("uri", Value::from(r.uri.as_str())),
            ("parent_uri", Value::from(r.parent_uri.as_str())),
            ("level", Value::from(1)),
            ("context_type", Value::from("resource")),
            ("category", Value::from("another")),
        ] {
            r.filters.insert(k.into(), v);
        }
        let head = encode_head(&r).expect("encode");
        for absent in ["not in the head", "id-1", "ctx://acc/docs/a\"", "\"level\""] {
            assert!(!head.contains(absent), "{absent} in {head}");
        }
        assert!(
            head.contains("another"),
            "a filter unlike its field is kept: {head}"
        );
        let read = |head: String| {
            RawRecord {
                id: r.id.clone(),
                uri: r.uri.to_string(),
                level: 1,
                head,
                text: r.text.clone(),
                node_version: 7,
            }
            .decode()
            .expect("decode")
        };
        let back = read(head.clone());
        assert_eq!((back.record, back.node_version), (r.clone(), 7));
        let view = decode_view(r.uri.as_str(), 1, &head).expect("view");
        assert_eq!((view.level, view.filters), (r.level, r.filters.clone()));

        let earlier = serde_json::to_string(&IndexRecord {
            text: String::new(),
            ..r.clone()
        })
        .expect("json");
        assert_eq!(read(earlier.clone()).record, r);
        assert_eq!(
            decode_view(r.uri.as_str(), 1, &earlier)
                .expect("view")
                .filters,
            r.filters
        );
    }
}
