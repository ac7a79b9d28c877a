//! Versioned schema migrations, applied under the write lock so concurrent openers agree.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{Result, StoreError};

/// Migrations in order; `PRAGMA user_version` records how many were applied.
const MIGRATIONS: &[&str] = &[
    // 1: nodes, tombstones, relations, journal, deliveries.
    r#"
    CREATE TABLE nodes (
        uri              TEXT PRIMARY KEY,
        parent_uri       TEXT NOT NULL,
        context_type     TEXT NOT NULL,
        category         TEXT NOT NULL,
        owner_space      TEXT NOT NULL,
        abstract         TEXT NOT NULL,
        overview         TEXT NOT NULL,
        content          TEXT NOT NULL,
        meta             TEXT NOT NULL,
        version          INTEGER NOT NULL,
        content_hash     TEXT NOT NULL,
        relation_version INTEGER NOT NULL,
        created_at       INTEGER NOT NULL,
        updated_at       INTEGER NOT NULL,
        trace_id         TEXT NOT NULL
    );
    CREATE INDEX nodes_by_parent ON nodes (parent_uri, uri);

    -- The last version of every URI that once held a node and holds none now, so a re-created
    -- node continues the version sequence (a stale DELETE can then never hit it).
    CREATE TABLE tombstones (
        uri        TEXT PRIMARY KEY,
        version    INTEGER NOT NULL,
        deleted_at INTEGER NOT NULL
    );

    CREATE TABLE relations (
        from_uri      TEXT NOT NULL,
        to_uri        TEXT NOT NULL,
        relation_type TEXT NOT NULL,
        weight        REAL NOT NULL,
        reason        TEXT NOT NULL,
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        PRIMARY KEY (from_uri, to_uri, relation_type)
    );
    CREATE INDEX relations_by_to ON relations (to_uri);

    CREATE TABLE events (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id   TEXT NOT NULL UNIQUE,
        event_type TEXT NOT NULL,
        uri        TEXT NOT NULL,
        payload    TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );

    CREATE TABLE consumers (
        name     TEXT PRIMARY KEY,
        added_at INTEGER NOT NULL
    );

    -- status: 0 pending, 1 claimed, 2 retry_wait, 3 done, 4 failed (never at rest), 5 dead.
    -- visible_at: when the delivery can be claimed (next_visible_at for pending/retry_wait,
    -- the lease end for claimed); NULL once terminal.
    CREATE TABLE deliveries (
        consumer      TEXT NOT NULL,
        seq           INTEGER NOT NULL,
        status        INTEGER NOT NULL,
        retry_count   INTEGER NOT NULL,
        visible_at    INTEGER,
        claimed_by    TEXT,
        claim_token   TEXT,
        claimed_until INTEGER,
        last_error    TEXT,
        error_code    TEXT,
        updated_at    INTEGER NOT NULL,
        PRIMARY KEY (consumer, seq)
    ) WITHOUT ROWID;
    -- status is a key column too: without it SQLite's planner does not prove the partial
    -- index usable for `status IN (0, 1, 2)` and walks the primary key over every done row.
    CREATE INDEX deliveries_runnable ON deliveries (consumer, seq, visible_at, status)
        WHERE status IN (0, 1, 2);
    CREATE INDEX deliveries_dead ON deliveries (consumer, seq) WHERE status = 5;
    "#,
    // 2: fencing tokens of path locks — the newest token a write under a lock carried, per
    // locked path (docs/store.md "Fencing") — and leases handed off to background work.
    r#"
    CREATE TABLE fences (
        path       TEXT PRIMARY KEY,
        token      INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE holds (
        id          TEXT PRIMARY KEY,
        at          TEXT NOT NULL,
        lease       TEXT NOT NULL,
        through_seq INTEGER NOT NULL,
        created_at  INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 3: the index instance that owns each embedded consumer (docs/indexing.md).
    r#"
    CREATE TABLE index_owners (
        consumer TEXT PRIMARY KEY,
        instance TEXT NOT NULL,
        host     TEXT NOT NULL,
        data_dir TEXT NOT NULL,
        since    INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 4: durable workflow jobs (docs/jobs.md). run_at: when a waiting job becomes claimable,
    // or a running job's lease end (claimable again after it); NULL once terminal.
    r#"
    CREATE TABLE jobs (
        id               TEXT PRIMARY KEY,
        job_type         TEXT NOT NULL,
        payload          TEXT NOT NULL,
        idempotency_key  TEXT,
        state            TEXT NOT NULL,
        attempts         INTEGER NOT NULL,
        run_at           INTEGER,
        claimed_by       TEXT,
        claim_token      TEXT,
        claimed_until    INTEGER,
        parent_job_id    TEXT,
        progress         TEXT,
        cancel_requested INTEGER NOT NULL,
        error_code       TEXT,
        last_error       TEXT,
        created_at       INTEGER NOT NULL,
        updated_at       INTEGER NOT NULL,
        started_at       INTEGER,
        finished_at      INTEGER
    );
    -- The idempotency guarantee: one non-terminal job per key, whatever its type.
    CREATE UNIQUE INDEX jobs_live_key ON jobs (idempotency_key)
        WHERE state IN ('pending', 'delayed', 'failed', 'running');
    -- Claims: a range scan of one type's runnable jobs by run_at (state is a key column so
    -- that the planner proves the partial index usable, as for deliveries_runnable).
    CREATE INDEX jobs_runnable ON jobs (job_type, run_at, id, state)
        WHERE state IN ('pending', 'delayed', 'failed', 'running');
    CREATE INDEX jobs_running ON jobs (job_type, run_at) WHERE state = 'running';
    CREATE INDEX jobs_by_type ON jobs (job_type, state, id);
    CREATE INDEX jobs_by_state ON jobs (state, id);
    CREATE INDEX jobs_by_parent ON jobs (parent_job_id, id) WHERE parent_job_id IS NOT NULL;
    "#,
    // 5: events appended for some consumers only (a rebuild's repair events): a consumer's
    // back-fill skips them, so rebuilding one index never re-applies it in another.
    r#"
    ALTER TABLE events ADD COLUMN targeted INTEGER NOT NULL DEFAULT 0;
    "#,
    // 6: derived layers (docs/derive.md). A node's provenance is JSON (NULL: written before
    // provenance existed). derive_dirty: a key is dirty while coalesce_version (bumped by
    // every commit that changes its inputs) is above derived_version (the version its last
    // write-back read); rows stay after a write-back, so a version is never reused for a
    // key — only removing the node removes its row, and that changes the node version the
    // write-back is also fenced by. derive_usage: the tokens spent per UTC day.
    r#"
    ALTER TABLE nodes ADD COLUMN provenance TEXT;
    CREATE TABLE derive_dirty (
        uri              TEXT PRIMARY KEY,
        coalesce_version INTEGER NOT NULL,
        derived_version  INTEGER NOT NULL,
        dirtied_at       INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX derive_dirty_open ON derive_dirty (uri) WHERE coalesce_version > derived_version;
    CREATE TABLE derive_usage (
        day         TEXT PRIMARY KEY,
        tokens_in   INTEGER NOT NULL,
        tokens_out  INTEGER NOT NULL,
        derivations INTEGER NOT NULL,
        discarded   INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 7: knowledge bases and their items (docs/ingestion.md "Workflow"). An item's status is
    // its durable lifecycle (never derived from its jobs); through_seq is the last journal
    // sequence of the commit of its nodes (embedding -> completed once every consumer has
    // applied it). Items of a base are unique by the node they own.
    r#"
    CREATE TABLE knowledge_bases (
        name       TEXT PRIMARY KEY,
        root_uri   TEXT NOT NULL UNIQUE,
        settings   TEXT NOT NULL,
        status     TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE kb_items (
        base          TEXT NOT NULL,
        id            TEXT NOT NULL,
        parent_id     TEXT,
        kind          TEXT NOT NULL,
        source        TEXT NOT NULL,
        node_uri      TEXT NOT NULL,
        status        TEXT NOT NULL,
        error_code    TEXT,
        error_message TEXT,
        through_seq   INTEGER,
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        PRIMARY KEY (base, id)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX kb_items_by_node ON kb_items (node_uri);
    CREATE INDEX kb_items_by_parent ON kb_items (base, parent_id, id);
    CREATE INDEX kb_items_by_status ON kb_items (status, base, id);
    "#,
    // 8: what an item's nodes were made from (a file's stat and the reading settings): a
    // re-sync skips an unchanged completed file (docs/ingestion.md "Re-sync").
    r#"
    ALTER TABLE kb_items ADD COLUMN fingerprint TEXT;
    "#,
    // 9: journal retention (docs/store.md "Journal retention"). through_seq: the newest
    // sequence a consumer covers without a delivery row to show it (its pruned deliveries,
    // or the journal's end when it was given a rebuild instead of a back-fill);
    // needs_rebuild: the journal no longer holds what it missed. journal.pruned_through:
    // the newest untargeted event pruned.
    r#"
    ALTER TABLE consumers ADD COLUMN through_seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE consumers ADD COLUMN needs_rebuild INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE journal (
        id             INTEGER PRIMARY KEY CHECK (id = 1),
        pruned_through INTEGER NOT NULL
    );
    INSERT INTO journal (id, pruned_through) VALUES (1, 0);
    "#,
    // 10: the children whose abstract is pending, by folder: whether a folder's roll-up must
    // wait (`ReadTx::child_pending`) was a scan of all its children when none was pending —
    // the common case of an edit in a folder of 10,000.
    r#"
    CREATE INDEX nodes_pending_abstract ON nodes (parent_uri, uri)
        WHERE json_extract(provenance, '$.abstract.origin') = 'pending';
    "#,
    // 11: each consumer's count of done deliveries, maintained by the writes that make a
    // delivery done or delete a done one (docs/store.md "Done counts"): counting the rows
    // read the journal's whole history at every status. Seeded from the rows once.
    r#"
    CREATE TABLE done_counts (
        consumer TEXT NOT NULL,
        shard    INTEGER NOT NULL,
        n        INTEGER NOT NULL,
        PRIMARY KEY (consumer, shard)
    );
    INSERT INTO done_counts (consumer, shard, n)
        SELECT consumer, 0, count(*) FROM deliveries WHERE status = 3 GROUP BY consumer;
    "#,
];

/// Applies missing migrations; returns the schema version before and after. Refuses a
/// database from a newer build.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(i64, i64)> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if current > known {
        return Err(StoreError::SchemaTooNew {
            location: path.display().to_string(),
            found: current,
            known,
        });
    }
    for sql in &MIGRATIONS[current as usize..] {
        tx.execute_batch(sql)?;
    }
    tx.pragma_update(None, "user_version", known)?;
    tx.commit()?;
    Ok((current, known))
}
