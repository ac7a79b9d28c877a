//! Vector index on PostgreSQL with the pgvector extension: records, vectors and the per-URI
//! versions live in three tables of one database, an HNSW index (`vector_cosine_ops`, the
//! cosine metric of the embedded index) answers approximate searches. Every process that
//! opens the same database sees the same index; the contract is the one of
//! [`super::memory::MemoryVectorIndex`], property for property.
//!
//! Tables (schema version [`SCHEMA_VERSION`], created by [`PgVectorIndex::open`] under the
//! advisory lock [`DDL_LOCK`], so concurrent openers take turns and the second finds nothing
//! to do):
//! - `ce_vector_records`: one row per record — `id`, `uri` and `parent_uri` (`COLLATE "C"`:
//!   byte order, so a subtree is one index range, as in SQLite), `level`, `node_version`,
//!   `pairs` (every filter field as the text `"key"` + canonical value, GIN-indexed: exact
//!   `serde_json::Value` equality, where `5` ≠ `5.0`, which `jsonb` cannot tell apart), the
//!   record as JSON text and the `embedding`. The column is an untyped `vector` until the
//!   dimension is fixed (by [`VectorIndex::bind_model`], or by the first vector of an unbound
//!   index); it then becomes `vector(d)` and gets the HNSW index (pgvector indexes at most
//!   2,000 dimensions: above that searches are exact scans) — at once, or, with
//!   [`PgVectorOptions::defer_graph`] (the default), after the bulk load that follows, when
//!   [`VectorIndex::finish_bulk`] runs one `CREATE INDEX` over all rows (meanwhile searches
//!   are exact scans). [`VectorIndex::clear`] turns it back.
//! - `ce_vector_uri_versions`: the newest source state seen per URI (invariant VX1).
//! - `ce_vector_meta`: `schema_version`, `model`, `dimension`.
//!
//! Writes: one `READ COMMITTED` transaction per trait call ([`VectorIndex::write_nodes`]: one
//! for the batch, planned in memory and written in a few `unnest` statements, see [`batch`];
//! `upsert` writes its rows in one statement). Writes that replace or remove the records of
//! given nodes (`sync_node`, `remove_node`, `write_nodes`, `upsert`, `delete_by_uri` of one
//! node) take the write lock shared plus one advisory lock per URI written (in key order, so
//! two batches never deadlock): workers on several hosts write different nodes in parallel,
//! and the version check and the write of one URI are never interleaved with another
//! writer's (VX1). Writes that span subtrees or change the schema (`move_uri`, subtree
//! deletes, `bind_model`, `clear`, and the first write that fixes the dimension) take the
//! write lock exclusively. A write that finds the dimension unfixed under the shared lock
//! rolls back and runs again under the exclusive one.
//!
//! Search plan (pgvector 0.6 applies `WHERE` after the HNSW graph search, so a filtered
//! index scan can return fewer than `top_k` rows): in one `REPEATABLE READ` snapshot, count
//! the records passing the filter (the GIN, URI and parent indexes serve the count; counting
//! stops past `max(exact_max_candidates, top_k)`); up to
//! [`PgVectorOptions::exact_max_candidates`] (5,000) candidates are scanned exactly (distance
//! to each candidate, top-k sort: exact and complete). Larger sets go through the HNSW index
//! with `hnsw.ef_search = max(ef_search, top_k)` (pgvector's limit is 1,000); if that returns
//! fewer than `top_k` hits while more records pass, the search falls back to the exact scan.
//! So a search returns exactly `top_k` hits whenever at least `top_k` records pass, at the
//! price of a counting query per filtered search; filters selective enough for HNSW to come
//! up short are those whose candidate sets are small enough to scan. (Raising `ef_search`
//! alone cannot keep the contract: a 1 % filter needs about `100 × top_k` graph candidates,
//! past pgvector's limit of 1,000, and nothing bounds the shortfall; the exact scan does, and
//! it is what the embedded index falls back to as well.) An unfiltered search on
//! a table whose statistics (`pg_class.reltuples`) say it is larger than the exact limit
//! skips the count and goes to the graph (counting would read thousands of rows); it counts
//! only if the graph comes up short. Graph searches run with `enable_sort = off`, so the
//! HNSW index scan is the plan: the path is chosen by the count, not by the planner's cost
//! estimates (which know nothing of pgvector's post-filtering).
//!
//! Connections: the store's [`ce_store::postgres::pool::Pool`] of synchronous clients, each
//! with its prepared statements. A connection that saw a PostgreSQL error is dropped, never
//! reused, and the next call connects afresh; a pooled connection found dead at `BEGIN`
//! (server restart, terminated backend) is replaced at once, transparently (nothing was sent
//! yet).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{BufMut, BytesMut};
use ce_core::{CoreError, CtxUri, IndexRecord};
use ce_embed::ModelIdentity;
use ce_store::postgres::pool::{self, Begin, Pool, PoolError};
use postgres::Row;
use postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use serde::Serialize;
use serde_json::Value;

use super::embedded::{SearchPlan, SearchReport, SearchStrategy};
use super::rules::{
    check_binding, check_kept, check_query, check_vector, kept, metadata_version, missing_vector,
    rank,
};
use super::{
    NodeRecord, NodeWrite, SearchFilter, StoredRecord, StoredVector, SyncOutcome, VectorHit,
    VectorIndex, VectorRecord, canonical_value, push_json_string,
};
use crate::error::{IndexError, Result};
use crate::records::{
    SeenVersion, SeenVersions, check_move, check_node_records, move_versions, moved_record,
    node_level, of_nodes, to_i64,
};

mod batch;

/// Version of the table layout this build writes; a database with a newer one is refused.
pub const SCHEMA_VERSION: i64 = 1;
/// Advisory lock key (transaction scope) serializing the schema setup: "ce-vec" in ASCII.
pub const DDL_LOCK: i64 = 0x63_65_2d_76_65_63;
/// Class of the write lock (two-key advisory lock `(WRITE_LOCK_CLASS, 0)`): "cevw".
const WRITE_LOCK_CLASS: i32 = 0x6365_7677;
/// Class of the per-URI locks (`(URI_LOCK_CLASS, hash of the URI)`): "cevu".
const URI_LOCK_CLASS: i32 = 0x6365_7675;
/// The largest dimension pgvector's HNSW index takes.
const HNSW_MAX_DIMENSION: usize = 2_000;
/// The largest dimension of pgvector's `vector` type.
const MAX_DIMENSION: usize = 16_000;
/// pgvector's largest `hnsw.ef_search`.
const MAX_EF_SEARCH: usize = 1_000;
/// Prepared statements kept per connection (search statements vary with the filter's shape
/// and `top_k`); the cache is emptied when full.
const MAX_STATEMENTS: usize = 256;

/// Migrations in order; version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[
    // 1: records, versions.
    r#"
    CREATE TABLE ce_vector_records (
        id           TEXT COLLATE "C" PRIMARY KEY,
        uri          TEXT COLLATE "C" NOT NULL,
        parent_uri   TEXT COLLATE "C" NOT NULL,
        level        SMALLINT NOT NULL,
        node_version BIGINT NOT NULL,
        pairs        TEXT[] NOT NULL,
        record       TEXT NOT NULL,
        embedding    vector NOT NULL
    );
    CREATE INDEX ce_vector_records_by_uri ON ce_vector_records (uri, level);
    CREATE INDEX ce_vector_records_by_parent ON ce_vector_records (parent_uri);
    CREATE INDEX ce_vector_records_pairs ON ce_vector_records USING gin (pairs);
    CREATE TABLE ce_vector_uri_versions (
        uri     TEXT COLLATE "C" PRIMARY KEY,
        version BIGINT NOT NULL,
        deleted BOOLEAN NOT NULL
    );
    "#,
];

/// Tuning of the pgvector index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PgVectorOptions {
    /// Candidate sets up to this size are scanned exactly (see the module documentation).
    pub exact_max_candidates: usize,
    /// `hnsw.ef_search` of graph searches (at least `top_k` is used, at most 1,000).
    pub ef_search: usize,
    /// HNSW `m` (edges per node), used when the index is created.
    pub hnsw_m: usize,
    /// HNSW `ef_construction`, used when the index is created.
    pub hnsw_ef_construction: usize,
    /// Idle connections kept for reuse.
    pub pool_size: usize,
    /// Bulk path: when the dimension is fixed on an empty table (first bind, or after
    /// [`VectorIndex::clear`]), the HNSW index is not created at once but by
    /// [`VectorIndex::finish_bulk`] once the load ends; until then searches are exact scans.
    /// When false, the index is created with the dimension and every insert updates it.
    pub defer_graph: bool,
    /// `maintenance_work_mem` (MiB) of the `CREATE INDEX` that ends a bulk load: pgvector
    /// builds the graph in memory while it fits, much faster than on disk.
    pub graph_build_memory_mb: usize,
}

impl Default for PgVectorOptions {
    fn default() -> Self {
        PgVectorOptions {
            exact_max_candidates: 5_000,
            ef_search: 100,
            hnsw_m: 16,
            hnsw_ef_construction: 64,
            pool_size: 8,
            defer_graph: true,
            graph_build_memory_mb: 256,
        }
    }
}

/// One open transaction and the statement cache of its connection.
type Tx<'a> = pool::Tx<'a, IndexError>;

impl PoolError for IndexError {
    /// Never by itself: PostgreSQL errors are folded into logical variants (a unique
    /// violation is [`IndexError::Raced`], bad data [`IndexError::Corrupt`]), so the
    /// statements that failed, which the transaction tracks, are what drop a connection.
    fn drops_connection(&self) -> bool {
        false
    }
}

/// Column `i` of `row`; a value that does not decode is corrupt.
fn col<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| IndexError::Corrupt(format!("ce_vector_records column {i}: {e}")))
}

/// A vector parameter in pgvector's binary format: the dimension (int16), an unused int16,
/// then the components as big-endian float4.
#[derive(Debug)]
struct PgVector<'a>(Cow<'a, [f32]>);

impl<'a> PgVector<'a> {
    /// A query, as given.
    fn query(v: &'a [f32]) -> Self {
        PgVector(Cow::Borrowed(v))
    }

    /// A vector to store: rounded as every vector index keeps it ([`kept`]), so that this
    /// index scores what the others do.
    fn stored(v: &[f32]) -> PgVector<'static> {
        PgVector(Cow::Owned(kept(v)))
    }
}

impl ToSql for PgVector<'_> {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let dim = i16::try_from(self.0.len())?;
        out.reserve(4 + 4 * self.0.len());
        out.put_i16(dim);
        out.put_i16(0);
        for x in self.0.iter() {
            out.put_f32(*x);
        }
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        ty.name() == "vector"
    }

    to_sql_checked!();
}

/// A vector read in pgvector's binary format.
struct ReadVector(Vec<f32>);

impl<'a> FromSql<'a> for ReadVector {
    fn from_sql(
        _ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let (head, body) = raw
            .split_at_checked(4)
            .ok_or("vector shorter than its header")?;
        let dim = usize::from(u16::from_be_bytes([head[0], head[1]]));
        if body.len() != 4 * dim {
            return Err(format!("vector of dimension {dim} has {} bytes", body.len()).into());
        }
        Ok(ReadVector(
            body.chunks_exact(4)
                .map(|c| f32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }

    fn accepts(ty: &Type) -> bool {
        ty.name() == "vector"
    }
}

/// The `pairs` element of filter field `key` = `value`: the key as a JSON string (which
/// delimits itself), then the canonical value.
fn pair(key: &str, value: &Value) -> String {
    let mut out = String::new();
    push_json_string(key, &mut out);
    canonical_value(value, &mut out);
    out
}

fn pairs_of(r: &IndexRecord) -> Vec<String> {
    r.filters.iter().map(|(k, v)| pair(k, v)).collect()
}

/// The exclusive bounds of the strict subtree of `uri` (not the root): `uri/` < x < `uri0`.
fn subtree_bounds(uri: &CtxUri) -> (String, String) {
    (format!("{uri}/"), format!("{uri}0"))
}

/// The hash of `uri` that names its advisory lock (FNV-1a, 32 bits: stable across
/// processes and builds; a collision only makes two URIs share a lock).
fn uri_lock_key(uri: &CtxUri) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in uri.as_str().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h as i32
}

/// A [`SearchFilter`] as a SQL condition on `ce_vector_records`, with its parameters
/// (`$1`…`$n`, in order).
struct FilterSql {
    cond: String,
    params: Vec<Box<dyn ToSql + Sync>>,
}

impl FilterSql {
    fn of(f: &SearchFilter) -> FilterSql {
        let mut conds: Vec<String> = Vec::new();
        let mut params: Vec<Box<dyn ToSql + Sync>> = Vec::new();
        let mut param = |p: Box<dyn ToSql + Sync>| {
            params.push(p);
            params.len()
        };
        if let Some(s) = f.subtree.as_ref().filter(|s| !s.is_root()) {
            let (lo, hi) = subtree_bounds(s);
            let a = param(Box::new(s.as_str().to_owned()));
            let b = param(Box::new(lo));
            let c = param(Box::new(hi));
            conds.push(format!("(uri = ${a} OR (uri > ${b} AND uri < ${c}))"));
        }
        if let Some(p) = &f.parent_uri {
            let n = param(Box::new(p.as_str().to_owned()));
            conds.push(format!("parent_uri = ${n}"));
        }
        if let Some(l) = f.level {
            let n = param(Box::new(i16::from(l.as_u8())));
            conds.push(format!("level = ${n}"));
        }
        let mut all: Vec<String> = [
            ("context_type", &f.context_type),
            ("category", &f.category),
            ("account_id", &f.account_id),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| pair(k, &Value::String(v.clone()))))
        .collect();
        all.extend(f.meta.iter().map(|(k, v)| pair(k, v)));
        if !all.is_empty() {
            let n = param(Box::new(all));
            conds.push(format!("pairs @> ${n}::text[]"));
        }
        if let Some(spaces) = &f.owner_spaces {
            let any: Vec<String> = spaces
                .iter()
                .map(|s| pair("owner_space", &Value::String(s.clone())))
                .collect();
            let n = param(Box::new(any));
            conds.push(format!("pairs && ${n}::text[]"));
        }
        let cond = if conds.is_empty() {
            "TRUE".to_owned()
        } else {
            conds.join(" AND ")
        };
        FilterSql { cond, params }
    }

    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params.iter().map(|p| p.as_ref()).collect()
    }
}

/// Parses a connection URL, with a connect timeout and TCP keepalives unless it sets them.
fn pg_config(url: &str) -> Result<postgres::Config> {
    pool::client_config(url, "contextengine-vector").map_err(|reason| {
        IndexError::Core(CoreError::InvalidConfig {
            key: "index.vector.url".to_owned(),
            reason,
        })
    })
}

/// The schema state a transaction reads: the model and dimension in `ce_vector_meta`, and
/// whether the HNSW index exists.
#[derive(Debug, Default)]
struct Meta {
    model: Option<ModelIdentity>,
    dimension: Option<usize>,
    graph: bool,
}

impl Meta {
    /// Whether the dimension takes an HNSW index that does not exist yet (a bulk load not
    /// finished, see [`PgVectorOptions::defer_graph`]).
    fn graph_pending(&self) -> bool {
        graph_pending(self.dimension, self.graph)
    }
}

/// Whether `dimension` takes an HNSW index and there is none (`graph`).
fn graph_pending(dimension: Option<usize>, graph: bool) -> bool {
    !graph && dimension.is_some_and(|d| d <= HNSW_MAX_DIMENSION)
}

/// The schema state (see [`Meta`]), in one query.
fn read_meta(tx: &mut Tx<'_>) -> Result<Meta> {
    let rows = tx.query(
        "SELECT key, value FROM ce_vector_meta WHERE key IN ('model', 'dimension')
         UNION ALL
         SELECT 'graph', (to_regclass('ce_vector_records_hnsw') IS NOT NULL)::text",
        &[],
    )?;
    let mut meta = Meta::default();
    for r in &rows {
        let (key, value): (String, String) = (col(r, 0)?, col(r, 1)?);
        match key.as_str() {
            "model" => {
                meta.model = Some(serde_json::from_str(&value).map_err(|e| {
                    IndexError::Corrupt(format!("ce_vector_meta model {value:?}: {e}"))
                })?);
            }
            "dimension" => {
                meta.dimension = Some(value.parse().map_err(|e| {
                    IndexError::Corrupt(format!("ce_vector_meta dimension {value:?}: {e}"))
                })?);
            }
            _ => meta.graph = value == "true",
        }
    }
    Ok(meta)
}

/// Creates the HNSW index on `ce_vector_records` (the dimension is fixed and at most
/// [`HNSW_MAX_DIMENSION`]; the caller holds the write lock exclusively).
fn create_graph(tx: &mut Tx<'_>, o: &PgVectorOptions) -> Result<()> {
    tx.batch(&format!(
        "SET LOCAL maintenance_work_mem = '{}MB';
         CREATE INDEX IF NOT EXISTS ce_vector_records_hnsw ON ce_vector_records
         USING hnsw (embedding vector_cosine_ops) WITH (m = {}, ef_construction = {});",
        o.graph_build_memory_mb.clamp(1, 1 << 20),
        o.hnsw_m.clamp(2, 100),
        o.hnsw_ef_construction.clamp(4, 1000),
    ))
}

fn set_meta(tx: &mut Tx<'_>, key: &str, value: &str) -> Result<()> {
    tx.execute(
        "INSERT INTO ce_vector_meta (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&key, &value],
    )?;
    Ok(())
}

/// The planner's estimate of the number of records (`pg_class.reltuples`: -1 before the
/// table was first analyzed).
fn estimated_records(tx: &mut Tx<'_>) -> Result<f64> {
    let row = tx.query_one(
        "SELECT reltuples FROM pg_class WHERE oid = 'ce_vector_records'::regclass",
        &[],
    )?;
    Ok(f64::from(col::<f32>(&row, 0)?))
}

fn decode_stored(record: &str, node_version: i64) -> Result<StoredRecord> {
    Ok(StoredRecord {
        record: serde_json::from_str(record)
            .map_err(|e| IndexError::Corrupt(format!("ce_vector_records record: {e}")))?,
        node_version: node_version as u64,
    })
}

/// The rows of `SELECT {select} FROM ce_vector_records` for the records within `uri` (the
/// root: all), ordered by `order`.
fn select_within(tx: &mut Tx<'_>, select: &str, order: &str, uri: &CtxUri) -> Result<Vec<Row>> {
    if uri.is_root() {
        return tx.query(
            &format!("SELECT {select} FROM ce_vector_records ORDER BY {order}"),
            &[],
        );
    }
    let (lo, hi) = subtree_bounds(uri);
    tx.query(
        &format!(
            "SELECT {select} FROM ce_vector_records
             WHERE uri = $1 OR (uri > $2 AND uri < $3) ORDER BY {order}"
        ),
        &[&uri.as_str(), &lo, &hi],
    )
}

/// Stored records within `uri` (the root: all), in (uri, level) order.
fn rows_within(tx: &mut Tx<'_>, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
    select_within(tx, "record, node_version", "uri, level", uri)?
        .iter()
        .map(|r| decode_stored(&col::<String>(r, 0)?, col(r, 1)?))
        .collect()
}

/// The distinct URIs of the records within `uri`, in URI order (no record decoded).
fn uris_within(tx: &mut Tx<'_>, uri: &CtxUri) -> Result<Vec<CtxUri>> {
    select_within(tx, "DISTINCT uri", "uri", uri)?
        .iter()
        .map(|r| {
            let u = col::<String>(r, 0)?;
            CtxUri::parse_stored(&u).map_err(|e| {
                IndexError::Corrupt(format!("ce_vector_records: record uri {u:?}: {e}"))
            })
        })
        .collect()
}

/// One write transaction: its lock mode and the schema state it read under the lock.
struct WriteTx<'t, 'c> {
    tx: &'t mut Tx<'c>,
    options: &'t PgVectorOptions,
    model: Option<ModelIdentity>,
    dimension: Option<usize>,
    /// Whether the HNSW index exists.
    graph: bool,
    /// Whether the write lock is held exclusively.
    exclusive: bool,
    /// Set when the write must fix the dimension but holds the lock shared: it is rolled
    /// back and run again exclusively.
    needs_exclusive: bool,
    model_changed: bool,
}

impl WriteTx<'_, '_> {
    /// Takes the advisory locks of `uris` (in key order); nothing under the exclusive lock.
    fn lock_uris<'u>(&mut self, uris: impl IntoIterator<Item = &'u CtxUri>) -> Result<()> {
        if self.exclusive {
            return Ok(());
        }
        let mut keys: Vec<i32> = uris.into_iter().map(uri_lock_key).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            return Ok(());
        }
        // unnest yields the keys in array order, so the locks are taken in that order.
        self.tx.execute(
            "SELECT pg_advisory_xact_lock($1, k) FROM unnest($2::int4[]) AS k",
            &[&URI_LOCK_CLASS, &keys],
        )?;
        Ok(())
    }

    /// Checks a vector to write; the first vector of an unbound, empty index fixes the
    /// dimension (which needs the exclusive lock).
    fn check_vector(&mut self, id: &str, v: &[f32]) -> Result<()> {
        if self.dimension.is_some() {
            return check_vector(id, v, self.model.as_ref(), self.dimension);
        }
        check_vector(id, v, None, None)?;
        self.fix_dimension(v.len())
    }

    /// Types the embedding column `vector(d)` and creates the HNSW index, unless
    /// [`PgVectorOptions::defer_graph`] leaves it to [`VectorIndex::finish_bulk`] (the table is
    /// empty: the dimension is fixed only on an unbound, empty index).
    fn fix_dimension(&mut self, d: usize) -> Result<()> {
        if !self.exclusive {
            self.needs_exclusive = true;
            return Err(IndexError::Raced(
                "fixing the vector dimension needs the exclusive write lock".into(),
            ));
        }
        if d == 0 || d > MAX_DIMENSION {
            return Err(IndexError::SchemaMismatch(format!(
                "vectors of dimension {d} cannot be stored (pgvector takes 1 to {MAX_DIMENSION})"
            )));
        }
        self.tx.batch(&format!(
            "ALTER TABLE ce_vector_records ALTER COLUMN embedding TYPE vector({d});
             DROP INDEX IF EXISTS ce_vector_records_hnsw;"
        ))?;
        self.graph = false;
        if d <= HNSW_MAX_DIMENSION && !self.options.defer_graph {
            create_graph(self.tx, self.options)?;
            self.graph = true;
        }
        set_meta(self.tx, "dimension", &d.to_string())?;
        self.dimension = Some(d);
        Ok(())
    }

    /// Inserts or replaces the row of `r` (by id) with `vector`.
    fn put_row(&mut self, r: &IndexRecord, node_version: u64, vector: &[f32]) -> Result<()> {
        let json = serde_json::to_string(r)
            .map_err(|e| IndexError::Corrupt(format!("record {}: {e}", r.id)))?;
        let (version, level) = (
            to_i64(node_version, "node version")?,
            i16::from(r.level.as_u8()),
        );
        self.tx.execute(
            "INSERT INTO ce_vector_records
                 (id, uri, parent_uri, level, node_version, pairs, record, embedding)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (id) DO UPDATE SET uri = excluded.uri,
                 parent_uri = excluded.parent_uri, level = excluded.level,
                 node_version = excluded.node_version, pairs = excluded.pairs,
                 record = excluded.record, embedding = excluded.embedding",
            &[
                &r.id,
                &r.uri.as_str(),
                &r.parent_uri.as_str(),
                &level,
                &version,
                &pairs_of(r),
                &json,
                &PgVector::stored(vector),
            ],
        )?;
        Ok(())
    }

    /// Rewrites every column of the row `id` but its vector (a payload-only update, or a
    /// move when `r.id` differs from `id`); false when there is no such row.
    fn rewrite_row(&mut self, id: &str, r: &IndexRecord, node_version: u64) -> Result<bool> {
        let json = serde_json::to_string(r)
            .map_err(|e| IndexError::Corrupt(format!("record {}: {e}", r.id)))?;
        let (version, level) = (
            to_i64(node_version, "node version")?,
            i16::from(r.level.as_u8()),
        );
        let n = self.tx.execute(
            "UPDATE ce_vector_records SET id = $1, uri = $2, parent_uri = $3, level = $4,
                 node_version = $5, pairs = $6, record = $7
             WHERE id = $8",
            &[
                &r.id,
                &r.uri.as_str(),
                &r.parent_uri.as_str(),
                &level,
                &version,
                &pairs_of(r),
                &json,
                &id,
            ],
        )?;
        Ok(n == 1)
    }

    /// Inserts or replaces the rows of `rows` (record, node version, vector) in one
    /// statement; each id at most once.
    fn put_rows(&mut self, rows: &[(&IndexRecord, i64, &[f32])]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut a = batch::RowArrays::default();
        for (r, version, vector) in rows {
            a.push(r, *version, Some(vector))?;
        }
        self.tx.execute(
            "INSERT INTO ce_vector_records
                 (id, uri, parent_uri, level, node_version, pairs, record, embedding)
             SELECT u.id, u.uri, u.parent_uri, u.level, u.node_version,
                 ARRAY(SELECT json_array_elements_text(u.pairs::json)), u.record, u.embedding
             FROM unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::int8[],
                         $6::text[], $7::text[], $8::vector[])
                 AS u(id, uri, parent_uri, level, node_version, pairs, record, embedding)
             ON CONFLICT (id) DO UPDATE SET uri = excluded.uri,
                 parent_uri = excluded.parent_uri, level = excluded.level,
                 node_version = excluded.node_version, pairs = excluded.pairs,
                 record = excluded.record, embedding = excluded.embedding",
            &[a.columns(), vec![&a.vectors]].concat(),
        )?;
        Ok(())
    }

    /// Rewrites every column but the vector of the rows of `rows` (record, node version),
    /// by id, in one statement; how many rows were found.
    fn rewrite_rows(&mut self, rows: &[(&IndexRecord, i64)]) -> Result<u64> {
        if rows.is_empty() {
            return Ok(0);
        }
        let mut a = batch::RowArrays::default();
        for (r, version) in rows {
            a.push(r, *version, None)?;
        }
        self.tx.execute(
            "UPDATE ce_vector_records SET uri = u.uri, parent_uri = u.parent_uri,
                 level = u.level, node_version = u.node_version,
                 pairs = ARRAY(SELECT json_array_elements_text(u.pairs::json)),
                 record = u.record
             FROM unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::int8[],
                         $6::text[], $7::text[])
                 AS u(id, uri, parent_uri, level, node_version, pairs, record)
             WHERE ce_vector_records.id = u.id",
            &a.columns(),
        )
    }

    /// [`VectorIndex::write_nodes`] in a constant number of statements (see [`batch`]); the
    /// dimension is fixed.
    fn write_batch(&mut self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        let loaded = batch::Loaded::read(self, writes)?;
        let mut plan = batch::Plan::new(&loaded);
        let out = writes.iter().map(|nw| plan.apply(self, nw)).collect();
        plan.write(self)?;
        Ok(out)
    }

    fn delete_row(&mut self, id: &str) -> Result<u64> {
        self.tx
            .execute("DELETE FROM ce_vector_records WHERE id = $1", &[&id])
    }

    /// Deletes every record of node `uri` (all levels); how many.
    fn delete_node(&mut self, uri: &CtxUri) -> Result<u64> {
        self.tx.execute(
            "DELETE FROM ce_vector_records WHERE uri = $1",
            &[&uri.as_str()],
        )
    }

    /// [`VectorIndex::sync_node`] inside this transaction (the URI is locked).
    fn sync_node(
        &mut self,
        uri: &CtxUri,
        version: u64,
        records: &[NodeRecord],
    ) -> Result<SyncOutcome> {
        check_node_records(uri, records.iter().map(|r| &r.record))?;
        if !SeenVersion::admits_write(self.seen_version(uri)?, version) {
            return Ok(SyncOutcome::Stale);
        }
        // Checked in order before anything is written, as the reference does.
        let kept: Vec<&str> = records
            .iter()
            .filter(|r| r.vector.is_none())
            .map(|r| r.record.id.as_str())
            .collect();
        // Each kept id with its stored record's text hash.
        let stored: HashMap<String, Option<String>> = if kept.is_empty() {
            HashMap::new()
        } else {
            self.tx
                .query(
                    "SELECT id, (record::jsonb)->'metadata'->>'content_hash'
                     FROM ce_vector_records WHERE id = ANY($1)",
                    &[&kept],
                )?
                .iter()
                .map(|r| Ok((col(r, 0)?, col(r, 1)?)))
                .collect::<Result<_>>()?
        };
        for r in records {
            match &r.vector {
                Some(v) => self.check_vector(&r.record.id, v)?,
                None => match stored.get(&r.record.id) {
                    Some(hash) => check_kept(hash.as_deref(), &r.record)?,
                    None => return Err(missing_vector(&r.record)),
                },
            }
        }
        let ids: Vec<&str> = records.iter().map(|r| r.record.id.as_str()).collect();
        self.tx.execute(
            "DELETE FROM ce_vector_records WHERE uri = $1 AND id <> ALL($2)",
            &[&uri.as_str(), &ids],
        )?;
        for r in records {
            match &r.vector {
                Some(v) => self.put_row(&r.record, version, v)?,
                None => {
                    if !self.rewrite_row(&r.record.id, &r.record, version)? {
                        return Err(missing_vector(&r.record));
                    }
                }
            }
        }
        self.set_seen_version(uri, SeenVersion::live(version))?;
        Ok(SyncOutcome::Applied)
    }

    /// [`VectorIndex::remove_node`] inside this transaction (the URI is locked).
    fn remove_node(&mut self, uri: &CtxUri, version: u64) -> Result<SyncOutcome> {
        if !SeenVersion::admits_removal(self.seen_version(uri)?, version) {
            return Ok(SyncOutcome::Stale);
        }
        self.delete_node(uri)?;
        self.set_seen_version(uri, SeenVersion::removed(version))?;
        Ok(SyncOutcome::Applied)
    }

    /// Runs `f` in a savepoint: if it fails, its rows (and a dimension it fixed) are rolled
    /// back and its error is returned inside `Ok`.
    fn isolated<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<Result<T>> {
        self.tx.batch("SAVEPOINT ce_vector_write")?;
        let dimension = self.dimension;
        let out = f(self);
        if out.is_ok() {
            self.tx.batch("RELEASE SAVEPOINT ce_vector_write")?;
        } else {
            self.tx.batch(
                "ROLLBACK TO SAVEPOINT ce_vector_write; RELEASE SAVEPOINT ce_vector_write",
            )?;
            self.dimension = dimension;
        }
        Ok(out)
    }

    /// Writes the model binding if it changed.
    fn finish(self) -> Result<()> {
        if self.model_changed {
            match &self.model {
                Some(m) => {
                    let json = serde_json::to_string(m)
                        .map_err(|e| IndexError::Corrupt(format!("model {m}: {e}")))?;
                    set_meta(self.tx, "model", &json)?;
                }
                None => {
                    self.tx
                        .execute("DELETE FROM ce_vector_meta WHERE key = 'model'", &[])?;
                }
            }
        }
        Ok(())
    }
}

impl SeenVersions for WriteTx<'_, '_> {
    fn seen_version(&mut self, uri: &CtxUri) -> Result<Option<SeenVersion>> {
        let row = self.tx.query_opt(
            "SELECT version, deleted FROM ce_vector_uri_versions WHERE uri = $1",
            &[&uri.as_str()],
        )?;
        row.map(|r| {
            Ok(SeenVersion {
                version: col::<i64>(&r, 0)? as u64,
                deleted: col(&r, 1)?,
            })
        })
        .transpose()
    }

    fn set_seen_version(&mut self, uri: &CtxUri, v: SeenVersion) -> Result<()> {
        let version = to_i64(v.version, "version")?;
        self.tx.execute(
            "INSERT INTO ce_vector_uri_versions (uri, version, deleted) VALUES ($1, $2, $3)
             ON CONFLICT (uri) DO UPDATE SET version = excluded.version,
                 deleted = excluded.deleted",
            &[&uri.as_str(), &version, &v.deleted],
        )?;
        Ok(())
    }
}

/// The pgvector index (see the module documentation). Safe to share between threads,
/// processes and hosts.
pub struct PgVectorIndex {
    options: PgVectorOptions,
    pool: Pool,
    /// Set when this process may have left the HNSW index to build (it opened the index or
    /// wrote while the index was missing); [`VectorIndex::finish_bulk`] then looks and
    /// clears it, and does nothing otherwise.
    graph_pending: AtomicBool,
}

impl std::fmt::Debug for PgVectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgVectorIndex")
            .field("url", &self.pool.location())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl PgVectorIndex {
    /// Connects to the database at `url` (a libpq URL: `postgresql://user@host/db`, or
    /// `postgresql://user@%2Fsocket%2Fdir/db` for a unix socket), creates the `vector`
    /// extension if missing and the index's tables if this build's schema version is not
    /// there yet. Safe to run from several processes at once.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, PgVectorOptions::default())
    }

    /// [`PgVectorIndex::open`] with explicit options.
    pub fn open_with(url: &str, options: PgVectorOptions) -> Result<Self> {
        let pool = Pool::new(
            pg_config(url)?,
            ce_store::postgres::redact_url(url),
            options.pool_size,
        )
        .with_max_statements(MAX_STATEMENTS);
        let index = PgVectorIndex {
            options,
            pool,
            graph_pending: AtomicBool::new(true),
        };
        index.migrate()?;
        Ok(index)
    }

    /// The URL without its password.
    pub fn location(&self) -> &str {
        self.pool.location()
    }

    /// The options the index was opened with.
    pub fn options(&self) -> &PgVectorOptions {
        &self.options
    }

    /// Creates the extension and applies the missing migrations, under [`DDL_LOCK`].
    fn migrate(&self) -> Result<()> {
        let shown = self.pool.location();
        self.pool.run(Begin::Write, |tx| {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&DDL_LOCK])?;
            tx.batch("CREATE EXTENSION IF NOT EXISTS vector")
                .map_err(|e| match e {
                    IndexError::Unavailable(_) => e,
                    e => IndexError::Postgres(format!(
                        "{shown}: cannot create the `vector` extension (install pgvector on \
                         the server, or have an administrator run `CREATE EXTENSION vector` \
                         in this database): {e}"
                    )),
                })?;
            tx.batch(
                "CREATE TABLE IF NOT EXISTS ce_vector_meta (
                     key   TEXT PRIMARY KEY,
                     value TEXT NOT NULL
                 )",
            )?;
            let current: i64 = match tx.query_opt(
                "SELECT value FROM ce_vector_meta WHERE key = 'schema_version'",
                &[],
            )? {
                Some(r) => col::<String>(&r, 0)?.parse().map_err(|e| {
                    IndexError::Corrupt(format!("{shown}: ce_vector_meta schema_version: {e}"))
                })?,
                None => 0,
            };
            if current > SCHEMA_VERSION {
                return Err(IndexError::Corrupt(format!(
                    "{shown}: the vector index has schema version {current}, this build knows \
                     up to {SCHEMA_VERSION}: upgrade"
                )));
            }
            for sql in MIGRATIONS.iter().skip(current as usize) {
                tx.batch(sql)?;
            }
            if current < SCHEMA_VERSION {
                set_meta(tx, "schema_version", &SCHEMA_VERSION.to_string())?;
            }
            Ok(())
        })
    }

    /// Runs `f` in one write transaction holding the write lock (exclusively when
    /// `exclusive`, or when `f` turns out to fix the dimension).
    fn write<T>(
        &self,
        exclusive: bool,
        mut f: impl FnMut(&mut WriteTx<'_, '_>) -> Result<T>,
    ) -> Result<T> {
        let mut exclusive = exclusive;
        loop {
            let mut escalate = false;
            let out = self.pool.run(Begin::Write, |tx| {
                let lock = if exclusive {
                    "SELECT pg_advisory_xact_lock($1, 0)"
                } else {
                    "SELECT pg_advisory_xact_lock_shared($1, 0)"
                };
                tx.execute(lock, &[&WRITE_LOCK_CLASS])?;
                let meta = read_meta(tx)?;
                let mut w = WriteTx {
                    tx,
                    options: &self.options,
                    model: meta.model,
                    dimension: meta.dimension,
                    graph: meta.graph,
                    exclusive,
                    needs_exclusive: false,
                    model_changed: false,
                };
                let out = f(&mut w);
                if w.needs_exclusive {
                    escalate = true;
                    return Err(IndexError::Raced(
                        "the write fixes the vector dimension".into(),
                    ));
                }
                let out = out?;
                let pending = graph_pending(w.dimension, w.graph);
                w.finish()?;
                if pending {
                    // Seen missing by this process: its next `finish_bulk` looks again.
                    self.graph_pending.store(true, Ordering::Relaxed);
                }
                Ok(out)
            });
            if escalate && !exclusive {
                exclusive = true;
                continue;
            }
            return out;
        }
    }

    /// Searches like [`VectorIndex::search`] with an explicit strategy, reporting the plan
    /// (see the module documentation; [`SearchStrategy::Ann`] still falls back to an exact
    /// scan when the graph returns too few hits).
    pub fn search_with(
        &self,
        query: &[f32],
        filter: &SearchFilter,
        top_k: usize,
        strategy: SearchStrategy,
    ) -> Result<SearchReport> {
        let fsql = FilterSql::of(filter);
        let q = PgVector::query(query);
        let limit = top_k.min(i64::MAX as usize);
        let o = &self.options;
        self.pool.run(Begin::Read, |tx| {
            let mut report = SearchReport {
                hits: Vec::new(),
                plan: SearchPlan::Empty,
                candidates: 0,
            };
            let meta = read_meta(tx)?;
            if !check_query(query, meta.model.as_ref(), meta.dimension)? || top_k == 0 {
                return Ok(report);
            }
            let fparams = fsql.refs();
            let cap = o.exact_max_candidates.max(limit).min(i64::MAX as usize - 1) + 1;
            let count_sql = format!(
                "SELECT count(*) FROM (SELECT 1 FROM ce_vector_records WHERE {} LIMIT {cap}) t",
                fsql.cond
            );
            let count = |tx: &mut Tx<'_>| -> Result<usize> {
                Ok(col::<i64>(&tx.query_one(&count_sql, &fparams)?, 0)? as usize)
            };
            let mut params = fparams.clone();
            params.push(&q);
            let qn = params.len();
            let select = format!(
                "SELECT record, node_version, 1 - (embedding <=> ${qn}) AS score
                 FROM ce_vector_records WHERE {}",
                fsql.cond
            );
            let exact_sql = format!("{select} ORDER BY score DESC, id LIMIT {limit}");
            // No HNSW index during a bulk load (or above its dimension limit): exact scans.
            let graph = meta.graph;
            let mut candidates = None;
            let use_graph = match strategy {
                SearchStrategy::Exact => false,
                SearchStrategy::Ann => graph,
                // Unfiltered on a table the statistics say is large: straight to the graph
                // (counting would read thousands of rows); the count comes only if it is short.
                SearchStrategy::Auto
                    if graph
                        && fsql.params.is_empty()
                        && estimated_records(tx)? > o.exact_max_candidates as f64 =>
                {
                    true
                }
                SearchStrategy::Auto => {
                    let c = count(tx)?;
                    candidates = Some(c);
                    graph && c > o.exact_max_candidates
                }
            };
            let rows = if use_graph {
                // Sorting disabled, the HNSW index scan is the one way to the order: the
                // graph path is ours to choose (by the count), not the planner's.
                let ef = o.ef_search.max(top_k).clamp(1, MAX_EF_SEARCH);
                tx.batch(&format!(
                    "SET LOCAL hnsw.ef_search = {ef}; SET LOCAL enable_sort = off"
                ))?;
                let rows = tx.query(
                    &format!("{select} ORDER BY embedding <=> ${qn} LIMIT {limit}"),
                    &params,
                )?;
                report.plan = SearchPlan::Ann;
                if rows.len() < top_k {
                    let c = match candidates {
                        Some(c) => c,
                        None => count(tx)?,
                    };
                    candidates = Some(c);
                    if rows.len() < c {
                        report.plan = SearchPlan::AnnThenExact;
                        tx.batch("SET LOCAL enable_sort = on")?;
                        tx.query(&exact_sql, &params)?
                    } else {
                        rows
                    }
                } else {
                    rows
                }
            } else {
                let c = match candidates {
                    Some(c) => c,
                    None => count(tx)?,
                };
                candidates = Some(c);
                report.plan = SearchPlan::Exact;
                if c == 0 {
                    Vec::new()
                } else {
                    tx.query(&exact_sql, &params)?
                }
            };
            report.candidates = candidates.unwrap_or(rows.len());
            if report.candidates == 0 {
                report.plan = SearchPlan::Empty;
            }
            let mut hits = Vec::with_capacity(rows.len());
            for r in &rows {
                let stored = decode_stored(&col::<String>(r, 0)?, col(r, 1)?)?;
                debug_assert!(filter.matches(&stored.record), "{:?}", stored.record.id);
                hits.push(VectorHit {
                    record: stored.record,
                    score: col::<f64>(r, 2)? as f32,
                });
            }
            rank(&mut hits, top_k);
            report.hits = hits;
            Ok(report)
        })
    }
}

impl VectorIndex for PgVectorIndex {
    fn model(&self) -> Result<Option<ModelIdentity>> {
        self.pool.run(Begin::Read, |tx| Ok(read_meta(tx)?.model))
    }

    fn bind_model(&self, model: &ModelIdentity) -> Result<()> {
        // Already bound to it: no need for the exclusive lock.
        if self.model()?.as_ref() == Some(model) {
            return Ok(());
        }
        self.write(true, |w| {
            check_binding(w.model.as_ref(), w.dimension, model)?;
            if w.dimension.is_none() {
                w.fix_dimension(model.dimension)?;
            }
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
        // One row per id, the last of repeated ids, written in id order (row locks in one
        // order: no deadlock between two upserts).
        let last: BTreeMap<&str, &VectorRecord> =
            records.iter().map(|r| (r.record.id.as_str(), r)).collect();
        self.write(false, |w| {
            w.lock_uris(records.iter().map(|r| &r.record.uri))?;
            for r in records {
                w.check_vector(&r.record.id, &r.vector)?;
            }
            let rows = last
                .values()
                .map(|r| {
                    Ok((
                        &r.record,
                        to_i64(metadata_version(&r.record), "node version")?,
                        r.vector.as_slice(),
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            w.put_rows(&rows)
        })
    }

    fn delete_by_uri(&self, uri: &CtxUri, subtree: bool) -> Result<u64> {
        if !subtree {
            return self.write(false, |w| {
                w.lock_uris([uri])?;
                w.delete_node(uri)
            });
        }
        self.write(true, |w| {
            if uri.is_root() {
                return w.tx.execute("DELETE FROM ce_vector_records", &[]);
            }
            let (lo, hi) = subtree_bounds(uri);
            w.tx.execute(
                "DELETE FROM ce_vector_records WHERE uri = $1 OR (uri > $2 AND uri < $3)",
                &[&uri.as_str(), &lo, &hi],
            )
        })
    }

    fn move_uri(&self, from: &CtxUri, to: &CtxUri) -> Result<u64> {
        if !check_move(from, to)? {
            return Ok(0);
        }
        self.write(true, |w| {
            let moving = rows_within(w.tx, from)?;
            let rewritten = moving
                .iter()
                .map(|s| moved_record(&s.record, from, to))
                .collect::<Result<Vec<_>>>()?;
            let mut moved = 0;
            for (old, new) in moving.iter().zip(rewritten) {
                if !move_versions(w, &old.record.uri, &new.uri, old.node_version)? {
                    w.delete_row(&old.record.id)?;
                    continue;
                }
                // A record already at the target (a half-done earlier move) is replaced; the
                // moved row keeps its vector.
                w.delete_row(&new.id)?;
                if w.rewrite_row(&old.record.id, &new, old.node_version)? {
                    moved += 1;
                }
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
        self.write(false, |w| {
            w.lock_uris([uri])?;
            w.sync_node(uri, version, &records)
        })
    }

    fn remove_node(&self, uri: &CtxUri, version: u64) -> Result<SyncOutcome> {
        self.write(false, |w| {
            w.lock_uris([uri])?;
            w.remove_node(uri, version)
        })
    }

    /// One transaction for the whole batch, the URIs of the batch locked up front, in key
    /// order. Once the dimension is fixed, the batch is planned in memory and written in a
    /// few statements ([`batch`]); before (the first write of an unbound index), each write
    /// runs in a savepoint, so a failing write is rolled back alone.
    fn write_nodes(&self, writes: &[NodeWrite]) -> Result<Vec<Result<SyncOutcome>>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        self.write(false, |w| {
            w.lock_uris(writes.iter().map(NodeWrite::uri))?;
            if w.dimension.is_some() {
                return w.write_batch(writes);
            }
            let mut out = Vec::with_capacity(writes.len());
            for nw in writes {
                if w.needs_exclusive {
                    // Rolled back and run again under the exclusive lock.
                    break;
                }
                out.push(w.isolated(|w| match nw {
                    NodeWrite::Sync {
                        uri,
                        version,
                        records,
                    } => w.sync_node(uri, *version, records),
                    NodeWrite::Remove { uri, version } => w.remove_node(uri, *version),
                    NodeWrite::Purge { uri } => {
                        w.delete_node(uri)?;
                        Ok(SyncOutcome::Applied)
                    }
                })?);
            }
            Ok(out)
        })
    }

    fn get(&self, uris: &[CtxUri]) -> Result<Vec<StoredRecord>> {
        if uris.is_empty() {
            return Ok(Vec::new());
        }
        let asked: Vec<&str> = uris.iter().map(CtxUri::as_str).collect();
        let found = self.pool.run(Begin::Read, |tx| {
            let rows = tx.query(
                "SELECT record, node_version FROM ce_vector_records WHERE uri = ANY($1)",
                &[&asked],
            )?;
            rows.iter()
                .map(|r| decode_stored(&col::<String>(r, 0)?, col(r, 1)?))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(of_nodes(&found, uris, |s| node_level(&s.record))
            .into_iter()
            .cloned()
            .collect())
    }

    fn vectors(&self, uris: &[CtxUri]) -> Result<Vec<StoredVector>> {
        if uris.is_empty() {
            return Ok(Vec::new());
        }
        let asked: Vec<&str> = uris.iter().map(CtxUri::as_str).collect();
        let found = self.pool.run(Begin::Read, |tx| {
            // Not cached: the result type follows the column's dimension, which a cached
            // statement would keep across a concurrent `clear` and rebind.
            let rows = tx.query_uncached(
                "SELECT id, (record::jsonb)->'metadata'->>'content_hash', embedding, uri, level
                 FROM ce_vector_records WHERE uri = ANY($1)",
                &[&asked],
            )?;
            rows.iter()
                .map(|r| {
                    let v = StoredVector {
                        id: col(r, 0)?,
                        text_hash: col(r, 1)?,
                        vector: col::<ReadVector>(r, 2)?.0,
                    };
                    let level: i16 = col(r, 4)?;
                    Ok((col::<String>(r, 3)?, level as u8, v))
                })
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(
            of_nodes(&found, uris, |(uri, level, _)| (uri.as_str(), *level))
                .into_iter()
                .map(|(_, _, v)| v.clone())
                .collect(),
        )
    }

    fn list_under(&self, uri: &CtxUri) -> Result<Vec<StoredRecord>> {
        self.pool.run(Begin::Read, |tx| rows_within(tx, uri))
    }

    fn uris_under(&self, uri: &CtxUri) -> Result<Vec<CtxUri>> {
        self.pool.run(Begin::Read, |tx| uris_within(tx, uri))
    }

    fn count(&self) -> Result<u64> {
        self.pool.run(Begin::Read, |tx| {
            Ok(col::<i64>(
                &tx.query_one("SELECT count(*) FROM ce_vector_records", &[])?,
                0,
            )? as u64)
        })
    }

    fn clear(&self) -> Result<()> {
        self.write(true, |w| {
            w.tx.batch(
                "TRUNCATE ce_vector_records, ce_vector_uri_versions;
                 DROP INDEX IF EXISTS ce_vector_records_hnsw;
                 ALTER TABLE ce_vector_records ALTER COLUMN embedding TYPE vector;
                 DELETE FROM ce_vector_meta WHERE key IN ('model', 'dimension');",
            )?;
            w.dimension = None;
            w.model = None;
            w.graph = false;
            Ok(())
        })
    }

    fn bulk_pending(&self) -> bool {
        self.graph_pending.load(Ordering::Relaxed)
    }

    /// Creates the HNSW index if a bulk load left it to build (see
    /// [`PgVectorOptions::defer_graph`]); nothing (no query) unless this process opened the
    /// index or wrote to it while the index was missing.
    fn finish_bulk(&self) -> Result<()> {
        if !self.graph_pending.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let out = (|| {
            if !self
                .pool
                .run(Begin::Read, |tx| Ok(read_meta(tx)?.graph_pending()))?
            {
                return Ok(());
            }
            self.write(true, |w| {
                if graph_pending(w.dimension, w.graph) {
                    create_graph(w.tx, w.options)?;
                    w.graph = true;
                }
                Ok(())
            })
        })();
        if out.is_err() {
            // Not built: the next call tries again.
            self.graph_pending.store(true, Ordering::Relaxed);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pairs_are_the_quoted_key_then_the_canonical_value() {
        assert_eq!(pair("k", &json!(1)), r#""k"u1"#);
        assert_eq!(pair("k", &json!(1.0)), r#""k"d1.0"#);
        // The key delimits itself: ("a", "\"b…") never reads as ("a\"b", …).
        assert_ne!(pair("a", &json!("bc")), pair("a\"s\"b", &json!("c")));
        assert_ne!(pair("a", &json!("x")), pair("ax", &json!("")));
    }

    #[test]
    fn vectors_round_trip_in_pgvector_binary_format() {
        let v = [1.5f32, -0.25, 0.0, 3.0e-7];
        let mut buf = BytesMut::new();
        PgVector::query(&v)
            .to_sql(&Type::TEXT, &mut buf)
            .expect("to_sql");
        assert_eq!(&buf[..4], &[0, 4, 0, 0], "dimension, then an unused int16");
        assert_eq!(&buf[4..8], &1.5f32.to_be_bytes(), "big-endian float4");
        let back = ReadVector::from_sql(&Type::TEXT, &buf).expect("from_sql");
        assert_eq!(back.0, v);
        assert!(ReadVector::from_sql(&Type::TEXT, &buf[..7]).is_err());
    }

    #[test]
    fn uri_lock_keys_are_stable() {
        let u = CtxUri::parse("ctx://a/b").expect("uri");
        assert_eq!(uri_lock_key(&u), uri_lock_key(&u.clone()));
        assert_ne!(
            uri_lock_key(&u),
            uri_lock_key(&CtxUri::parse("ctx://a/c").expect("uri"))
        );
    }

    #[test]
    fn filters_number_their_parameters_in_order() {
        let f = SearchFilter {
            subtree: Some(CtxUri::parse("ctx://a").expect("uri")),
            level: Some(ce_core::Level::L1),
            owner_spaces: Some(vec!["user:u".into()]),
            meta: [("lang".to_owned(), json!("zh"))].into(),
            ..SearchFilter::default()
        };
        let s = FilterSql::of(&f);
        assert_eq!(
            s.cond,
            "(uri = $1 OR (uri > $2 AND uri < $3)) AND level = $4 AND pairs @> $5::text[] \
             AND pairs && $6::text[]"
        );
        assert_eq!(s.params.len(), 6);
        assert_eq!(FilterSql::of(&SearchFilter::default()).cond, "TRUE");
    }
}
