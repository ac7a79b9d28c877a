//! Versioned migrations of the PostgreSQL schema. `ce_schema_migrations` records each
//! applied version; a transaction-scoped advisory lock ([`super::MIGRATE_LOCK`]) makes
//! concurrent migrators take turns, so the second finds nothing left to do.
//!
//! The tables mirror the SQLite schema column for column (docs/store.md): URIs are `TEXT
//! COLLATE "C"` so that subtree range scans compare bytes as SQLite does; integers are
//! `BIGINT`; JSON stays `TEXT`, byte for byte as written (export round trips depend on it).

use postgres::Client;

use super::MIGRATE_LOCK;
use crate::error::{Result, StoreError};

/// Migrations in order; version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[
    // 1: the whole schema of SQLite migrations 1 and 2.
    r#"
    CREATE TABLE nodes (
        uri              TEXT COLLATE "C" PRIMARY KEY,
        parent_uri       TEXT COLLATE "C" NOT NULL,
        context_type     TEXT NOT NULL,
        category         TEXT NOT NULL,
        owner_space      TEXT NOT NULL,
        abstract         TEXT NOT NULL,
        overview         TEXT NOT NULL,
        content          TEXT NOT NULL,
        meta             TEXT NOT NULL,
        version          BIGINT NOT NULL,
        content_hash     TEXT NOT NULL,
        relation_version BIGINT NOT NULL,
        created_at       BIGINT NOT NULL,
        updated_at       BIGINT NOT NULL,
        trace_id         TEXT NOT NULL
    );
    CREATE INDEX nodes_by_parent ON nodes (parent_uri, uri);

    CREATE TABLE tombstones (
        uri        TEXT COLLATE "C" PRIMARY KEY,
        version    BIGINT NOT NULL,
        deleted_at BIGINT NOT NULL
    );

    CREATE TABLE relations (
        from_uri      TEXT COLLATE "C" NOT NULL,
        to_uri        TEXT COLLATE "C" NOT NULL,
        relation_type TEXT NOT NULL,
        weight        DOUBLE PRECISION NOT NULL,
        reason        TEXT NOT NULL,
        created_at    BIGINT NOT NULL,
        updated_at    BIGINT NOT NULL,
        PRIMARY KEY (from_uri, to_uri, relation_type)
    );
    CREATE INDEX relations_by_to ON relations (to_uri);

    CREATE TABLE events (
        seq        BIGSERIAL PRIMARY KEY,
        event_id   TEXT NOT NULL UNIQUE,
        event_type TEXT NOT NULL,
        uri        TEXT COLLATE "C" NOT NULL,
        payload    TEXT NOT NULL,
        created_at BIGINT NOT NULL
    );

    CREATE TABLE consumers (
        name     TEXT COLLATE "C" PRIMARY KEY,
        added_at BIGINT NOT NULL
    );

    -- status: 0 pending, 1 claimed, 2 retry_wait, 3 done, 4 failed (never at rest), 5 dead.
    CREATE TABLE deliveries (
        consumer      TEXT COLLATE "C" NOT NULL,
        seq           BIGINT NOT NULL,
        status        BIGINT NOT NULL,
        retry_count   BIGINT NOT NULL,
        visible_at    BIGINT,
        claimed_by    TEXT,
        claim_token   TEXT,
        claimed_until BIGINT,
        last_error    TEXT,
        error_code    TEXT,
        updated_at    BIGINT NOT NULL,
        PRIMARY KEY (consumer, seq)
    );
    CREATE INDEX deliveries_runnable ON deliveries (consumer, seq, visible_at)
        WHERE status IN (0, 1, 2);
    CREATE INDEX deliveries_dead ON deliveries (consumer, seq) WHERE status = 5;

    CREATE TABLE fences (
        path       TEXT COLLATE "C" PRIMARY KEY,
        token      BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
    );
    CREATE TABLE holds (
        id          TEXT PRIMARY KEY,
        at          TEXT COLLATE "C" NOT NULL,
        lease       TEXT NOT NULL,
        through_seq BIGINT NOT NULL,
        created_at  BIGINT NOT NULL
    );
    "#,
    // 2: the index instance that owns each embedded consumer (SQLite migration 3).
    r#"
    CREATE TABLE index_owners (
        consumer TEXT COLLATE "C" PRIMARY KEY,
        instance TEXT NOT NULL,
        host     TEXT NOT NULL,
        data_dir TEXT NOT NULL,
        since    BIGINT NOT NULL
    );
    "#,
    // 3: durable workflow jobs (SQLite migration 4; docs/jobs.md).
    r#"
    CREATE TABLE jobs (
        id               TEXT COLLATE "C" PRIMARY KEY,
        job_type         TEXT COLLATE "C" NOT NULL,
        payload          TEXT NOT NULL,
        idempotency_key  TEXT COLLATE "C",
        state            TEXT COLLATE "C" NOT NULL,
        attempts         BIGINT NOT NULL,
        run_at           BIGINT,
        claimed_by       TEXT,
        claim_token      TEXT,
        claimed_until    BIGINT,
        parent_job_id    TEXT COLLATE "C",
        progress         TEXT,
        cancel_requested BOOLEAN NOT NULL,
        error_code       TEXT,
        last_error       TEXT,
        created_at       BIGINT NOT NULL,
        updated_at       BIGINT NOT NULL,
        started_at       BIGINT,
        finished_at      BIGINT
    );
    CREATE UNIQUE INDEX jobs_live_key ON jobs (idempotency_key)
        WHERE state IN ('pending', 'delayed', 'failed', 'running');
    CREATE INDEX jobs_runnable ON jobs (job_type, run_at, id)
        WHERE state IN ('pending', 'delayed', 'failed', 'running');
    CREATE INDEX jobs_running ON jobs (job_type, run_at) WHERE state = 'running';
    CREATE INDEX jobs_by_type ON jobs (job_type, state, id);
    CREATE INDEX jobs_by_state ON jobs (state, id);
    CREATE INDEX jobs_by_parent ON jobs (parent_job_id, id) WHERE parent_job_id IS NOT NULL;
    "#,
    // 4: events appended for some consumers only (SQLite migration 5).
    r#"
    ALTER TABLE events ADD COLUMN targeted BOOLEAN NOT NULL DEFAULT false;
    "#,
    // 5: derived layers (SQLite migration 6, docs/derive.md).
    r#"
    ALTER TABLE nodes ADD COLUMN provenance TEXT;
    CREATE TABLE derive_dirty (
        uri              TEXT COLLATE "C" PRIMARY KEY,
        coalesce_version BIGINT NOT NULL,
        derived_version  BIGINT NOT NULL,
        dirtied_at       BIGINT NOT NULL
    );
    CREATE INDEX derive_dirty_open ON derive_dirty (uri) WHERE coalesce_version > derived_version;
    CREATE TABLE derive_usage (
        day         TEXT PRIMARY KEY,
        tokens_in   BIGINT NOT NULL,
        tokens_out  BIGINT NOT NULL,
        derivations BIGINT NOT NULL,
        discarded   BIGINT NOT NULL
    );
    "#,
    // 6: knowledge bases and their items (SQLite migration 7, docs/ingestion.md).
    r#"
    CREATE TABLE knowledge_bases (
        name       TEXT COLLATE "C" PRIMARY KEY,
        root_uri   TEXT COLLATE "C" NOT NULL UNIQUE,
        settings   TEXT NOT NULL,
        status     TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
    );
    CREATE TABLE kb_items (
        base          TEXT COLLATE "C" NOT NULL,
        id            TEXT COLLATE "C" NOT NULL,
        parent_id     TEXT COLLATE "C",
        kind          TEXT NOT NULL,
        source        TEXT NOT NULL,
        node_uri      TEXT COLLATE "C" NOT NULL,
        status        TEXT NOT NULL,
        error_code    TEXT,
        error_message TEXT,
        through_seq   BIGINT,
        created_at    BIGINT NOT NULL,
        updated_at    BIGINT NOT NULL,
        PRIMARY KEY (base, id)
    );
    CREATE UNIQUE INDEX kb_items_by_node ON kb_items (node_uri);
    CREATE INDEX kb_items_by_parent ON kb_items (base, parent_id, id);
    CREATE INDEX kb_items_by_status ON kb_items (status, base, id);
    "#,
    // 7: what an item's nodes were made from (SQLite migration 8, docs/ingestion.md
    // "Re-sync").
    r#"
    ALTER TABLE kb_items ADD COLUMN fingerprint TEXT COLLATE "C";
    "#,
    // 8: journal retention (SQLite migration 9, docs/store.md "Journal retention").
    r#"
    ALTER TABLE consumers ADD COLUMN through_seq BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE consumers ADD COLUMN needs_rebuild BOOLEAN NOT NULL DEFAULT false;
    CREATE TABLE journal (
        id             INTEGER PRIMARY KEY CHECK (id = 1),
        pruned_through BIGINT NOT NULL
    );
    INSERT INTO journal (id, pruned_through) VALUES (1, 0);
    "#,
    // 9: the children whose abstract is pending, by folder (SQLite migration 10).
    r#"
    CREATE INDEX nodes_pending_abstract ON nodes (parent_uri, uri)
        WHERE (provenance::jsonb -> 'abstract' ->> 'origin') = 'pending';
    "#,
    // 10: each consumer's count of done deliveries, in shards (SQLite migration 11).
    r#"
    CREATE TABLE done_counts (
        consumer TEXT COLLATE "C" NOT NULL,
        shard    INTEGER NOT NULL,
        n        BIGINT NOT NULL,
        PRIMARY KEY (consumer, shard)
    );
    INSERT INTO done_counts (consumer, shard, n)
        SELECT consumer, 0, count(*) FROM deliveries WHERE status = 3 GROUP BY consumer;
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Applies missing migrations in one transaction; returns the version before and after.
/// Refuses a database from a newer build.
pub(super) fn migrate(client: &mut Client, location: &str) -> Result<(i64, i64)> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS ce_schema_migrations (
             version    BIGINT PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )?;
    let current: i64 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM ce_schema_migrations",
            &[],
        )?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            location: location.to_owned(),
            found: current,
            known: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        tx.batch_execute(sql)?;
        tx.execute(
            "INSERT INTO ce_schema_migrations (version) VALUES ($1)",
            &[&(i as i64 + 1)],
        )?;
    }
    tx.commit()?;
    Ok((current, SCHEMA_VERSION))
}
