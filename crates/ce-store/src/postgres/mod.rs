//! The scale backend: nodes, relations and the outbox on PostgreSQL, with the semantics of
//! the SQLite backend (DESIGN.md decisions 1 and 3).
//!
//! Transactions:
//! - **Source writes** (put, rm, mv, link, import, admin append) run in one transaction that
//!   first takes the transaction-scoped advisory lock [`SOURCE_LOCK`]: source writes are
//!   serialized across every process, as SQLite's single writer serializes them. Versions are
//!   read and bumped without lost updates, and journal sequence numbers commit in the order
//!   they are assigned, so a consumer's low watermark never skips an event that commits late.
//!   A write that appended events sends `NOTIFY ce_outbox` in the same transaction; PostgreSQL
//!   delivers it after the commit (DESIGN.md decision 12: a hint, polling is the fallback).
//! - **Outbox bookkeeping** (claim, renew, done, failed, repair) takes no global lock:
//!   claims pick rows with `FOR UPDATE SKIP LOCKED` (spec §3.4) and every fenced transition
//!   locks its delivery row first. It commits with `synchronous_commit = off`, the analogue
//!   of SQLite's NORMAL: a crash of the server may roll back the last bookkeeping commits,
//!   which only redelivers events (at-least-once, idempotent consumers).
//! - **Reads** run in a `REPEATABLE READ, READ ONLY` transaction: one snapshot per call.
//!
//! Time comes from the store's [`Clock`] as on SQLite (leases, backoff); hosts that share a
//! database must keep their clocks in sync (NTP), as the lease is the only thing that
//! depends on it — fencing by claim token does not.
//!
//! Connections: a small [`pool::Pool`] of synchronous clients. A connection that failed
//! (server restart, `pg_terminate_backend`) is dropped, never reused; the error is
//! [`StoreError::PgUnavailable`] (retryable) and the next call connects afresh. A stale pooled
//! connection found dead at `BEGIN` is replaced once transparently (nothing was sent yet).

mod failure;
mod holds;
mod jobs;
mod kb;
mod outbox;
mod owners;
pub mod pool;
mod rows;
mod schema;

use std::sync::Arc;

use ce_core::{Clock, Config, ContextNode, CtxUri, Layers, Millis, SystemClock};
use postgres::{Client, Row};

use self::pool::{Begin, Pool};
use crate::error::{Result, StoreError};
use crate::shared::{NODE_COLUMNS, decode_node, decode_provenance, encode_provenance};
use crate::txn::{ReadTx, WriteTx};

pub use failure::PgFailure;
pub use schema::SCHEMA_VERSION;

/// Advisory lock key (transaction scope) that serializes source writes: "ce-src" in ASCII.
pub const SOURCE_LOCK: i64 = 0x63_65_2d_73_72_63;
/// Advisory lock key that serializes schema migrations: "ce-mig".
pub const MIGRATE_LOCK: i64 = 0x63_65_2d_6d_69_67;
/// The channel that carries wake-up hints after commits that appended events.
pub const NOTIFY_CHANNEL: &str = "ce_outbox";

pub use ce_core::config::is_postgres_url;

/// `url` without its password, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                url.to_owned()
            }
        }
        None => url.to_owned(),
    }
}

/// `url` with its database name replaced by `db` (query parameters kept).
pub fn with_database(url: &str, db: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map_or(0, |i| i + 3);
    let base = match head[scheme_end..].find('/') {
        Some(i) => &head[..scheme_end + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// What a write transaction is, which decides its locking and durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// Nodes, relations, journal: serialized by [`SOURCE_LOCK`], synchronous commit.
    Source,
    /// Delivery state: row locks only, asynchronous commit.
    Bookkeeping,
}

/// One open transaction of the store (statements prepared once per connection).
pub(crate) type Tx<'a> = pool::Tx<'a, StoreError>;

impl Tx<'_> {
    /// Marks the transaction as one that appended events: it notifies [`NOTIFY_CHANNEL`] at
    /// commit.
    pub(crate) fn appended(&mut self) {
        self.notify_at_commit(NOTIFY_CHANNEL);
    }
}

impl pool::PoolError for StoreError {
    /// Every PostgreSQL error, also one raised in the client (a row that does not decode).
    fn drops_connection(&self) -> bool {
        matches!(self, StoreError::PgUnavailable(_) | StoreError::Postgres(_))
    }
}

/// Idle connections a store keeps.
const MAX_IDLE: usize = 16;

/// The PostgreSQL store. Cheap to share behind an `Arc`; safe to use from many threads,
/// processes and hosts.
pub struct PgStore {
    pool: Pool,
    clock: Arc<dyn Clock>,
    config: Config,
    /// The schema version before and after the migrations this open applied.
    migrated: (i64, i64),
    /// Derives small leaves in their write transaction, once set
    /// ([`crate::derive::LeafDeriver`]).
    leaf_deriver: std::sync::OnceLock<std::sync::Arc<dyn crate::derive::LeafDeriver>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.pool.location())
            .finish_non_exhaustive()
    }
}

/// Parses a connection URL, with a connect timeout and TCP keepalives unless it sets them.
pub fn pg_config(url: &str) -> Result<postgres::Config> {
    pool::client_config(url, "contextengine").map_err(|reason| {
        StoreError::Core(ce_core::CoreError::InvalidConfig {
            key: "store.url".to_owned(),
            reason,
        })
    })
}

impl PgStore {
    /// Connects to `url`, applies missing migrations and registers the configured consumers.
    pub fn open(url: &str, config: Config) -> Result<Self> {
        Self::open_with_clock(url, config, Arc::new(SystemClock))
    }

    /// Opens the store with an explicit clock (tests and simulations).
    pub fn open_with_clock(url: &str, config: Config, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        let pool = Pool::new(pg_config(url)?, redact_url(url), MAX_IDLE);
        // Safe from several processes at once: an advisory lock serializes migrators, and
        // the later ones find nothing to do.
        let migrated = pool.with_client(|client| schema::migrate(client, pool.location()))?;
        let store = PgStore {
            pool,
            clock,
            config,
            migrated,
            leaf_deriver: std::sync::OnceLock::new(),
        };
        crate::outbox::journal::register_consumers(&store)?;
        Ok(store)
    }

    /// The schema version before and after the migrations this open applied (equal when
    /// there were none, e.g. another process applied them first).
    pub fn schema_migration(&self) -> (i64, i64) {
        self.migrated
    }

    /// The URL without its password.
    pub fn location(&self) -> &str {
        self.pool.location()
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A new connection with the store's settings (also used by `LISTEN` wake-up threads).
    pub fn connect_client(&self) -> Result<Client> {
        Ok(self.pool.connect()?)
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    /// Runs `f` in one write transaction with the time at which its locks were taken;
    /// commits when it returns `Ok`.
    fn write<T>(
        &self,
        kind: WriteKind,
        f: impl FnOnce(&mut Tx<'_>, Millis) -> Result<T>,
    ) -> Result<T> {
        self.pool
            .run(Begin::Write, |tx| {
                match kind {
                    WriteKind::Source => {
                        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SOURCE_LOCK])?;
                    }
                    WriteKind::Bookkeeping => {
                        tx.batch("SET LOCAL synchronous_commit = off")?;
                    }
                }
                // The clock is read once the locks are held, so a wait never leaves the
                // transaction acting on an old time (leases, fencing).
                let now = self.now();
                let out = f(tx, now)?;
                if kind == WriteKind::Source {
                    ce_core::failpoint::hit("store.before_commit");
                }
                Ok(out)
            })
            .inspect(|_| {
                if kind == WriteKind::Source {
                    ce_core::failpoint::hit("store.after_commit");
                }
            })
    }

    /// Runs `f` in one read-only snapshot.
    fn read<T>(&self, f: impl FnOnce(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        self.pool.run(Begin::Read, f)
    }
}

impl PgStore {
    /// A source write with the row operations of `crate::txn`.
    fn write_source<T>(&self, f: impl FnOnce(&mut dyn WriteTx, Millis) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.write(WriteKind::Source, |tx, now| {
            f(&mut rows::PgTx::new(tx, consumers), now)
        })
    }

    /// A read snapshot with the row operations of `crate::txn`.
    fn read_source<T>(&self, f: impl FnOnce(&mut dyn ReadTx) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.read(|tx| f(&mut rows::PgTx::new(tx, consumers)))
    }
}

crate::txn::impl_source_traits!(PgStore);

/// Decodes a `SELECT {NODE_COLUMNS}` row.
fn node_from_row(row: &Row) -> Result<ContextNode> {
    let (uri, parent_uri, context_type, owner_space, meta) = decode_node(
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(4)?,
        row.try_get(8)?,
    )?;
    let version: i64 = row.try_get(9)?;
    let relation_version: i64 = row.try_get(11)?;
    let layers = Layers {
        abstract_text: row.try_get(5)?,
        overview: row.try_get(6)?,
        content: row.try_get(7)?,
    };
    let provenance = decode_provenance(uri.as_str(), row.try_get(15)?, &layers)?;
    Ok(ContextNode {
        uri,
        parent_uri,
        context_type,
        category: row.try_get(3)?,
        owner_space,
        layers,
        meta,
        version: version as u64,
        content_hash: row.try_get(10)?,
        relation_version: relation_version as u64,
        created_at_ms: row.try_get(12)?,
        updated_at_ms: row.try_get(13)?,
        trace_id: row.try_get(14)?,
        provenance,
    })
}

fn get_node(tx: &mut Tx<'_>, uri: &CtxUri) -> Result<Option<ContextNode>> {
    tx.query_opt(
        &format!("SELECT {NODE_COLUMNS} FROM nodes WHERE uri = $1"),
        &[&uri.as_str()],
    )?
    .map(|r| node_from_row(&r))
    .transpose()
}

fn get_tombstone(tx: &mut Tx<'_>, uri: &CtxUri) -> Result<Option<u64>> {
    Ok(tx
        .query_opt(
            "SELECT version FROM tombstones WHERE uri = $1",
            &[&uri.as_str()],
        )?
        .map(|r| r.get::<_, i64>(0) as u64))
}

fn insert_node(tx: &mut Tx<'_>, n: &ContextNode) -> Result<()> {
    let meta = serde_json::to_string(&n.meta)?;
    let provenance = encode_provenance(&n.provenance)?;
    let owner = n.owner_space.to_string();
    let (version, relation_version) = (n.version as i64, n.relation_version as i64);
    // One statement (one round trip) for the node and its tombstone.
    tx.execute(
        &format!(
            "WITH revived AS (DELETE FROM tombstones WHERE uri = $1)
             INSERT INTO nodes ({NODE_COLUMNS})
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16)
             ON CONFLICT (uri) DO UPDATE SET parent_uri=excluded.parent_uri,
               context_type=excluded.context_type, category=excluded.category,
               owner_space=excluded.owner_space, abstract=excluded.abstract,
               overview=excluded.overview, content=excluded.content, meta=excluded.meta,
               version=excluded.version, content_hash=excluded.content_hash,
               relation_version=excluded.relation_version, created_at=excluded.created_at,
               updated_at=excluded.updated_at, trace_id=excluded.trace_id,
               provenance=excluded.provenance"
        ),
        &[
            &n.uri.as_str(),
            &n.parent_uri.as_str(),
            &n.context_type.as_str(),
            &n.category,
            &owner,
            &n.layers.abstract_text,
            &n.layers.overview,
            &n.layers.content,
            &meta,
            &version,
            &n.content_hash,
            &relation_version,
            &n.created_at_ms,
            &n.updated_at_ms,
            &n.trace_id,
            &provenance,
        ],
    )?;
    Ok(())
}

/// SQL predicate on `col` for "within the subtree `$n`" using bounds `$n+1`, `$n+2`.
fn subtree_sql(col: &str, n: usize) -> String {
    format!(
        "({col} = ${n} OR ({col} > ${} AND {col} < ${}))",
        n + 1,
        n + 2
    )
}

/// The plan PostgreSQL runs for `sql` as a prepared statement executed with `args` (SQL
/// literals) under `plan_cache_mode` `mode`: what the store's cached statements get.
#[cfg(test)]
pub(crate) fn explain(store: &PgStore, mode: &str, sql: &str, args: &str) -> String {
    store
        .write(WriteKind::Bookkeeping, |tx, _| {
            tx.batch(&format!(
                "SET LOCAL plan_cache_mode = {mode}; PREPARE plan_probe AS {sql}"
            ))?;
            let rows = tx.query(&format!("EXPLAIN EXECUTE plan_probe{args}"), &[])?;
            tx.batch("DEALLOCATE plan_probe")?;
            rows.iter()
                .map(|r| Ok(r.try_get::<_, String>(0)?))
                .collect::<crate::Result<Vec<_>>>()
                .map(|l| l.join("\n"))
        })
        .expect("explain")
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn urls_lose_their_password_only() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db?x=1"),
            "postgres://u:***@h:5432/db?x=1"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgresql://h/db"), "postgresql://h/db");
    }
}
