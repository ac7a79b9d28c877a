//! The outbox's row primitives on SQLite ([`OutboxReadTx`], [`OutboxTx`]): journal rows in
//! `events`, one `deliveries` row per (consumer, event). What the transitions mean is written
//! once in `crate::outbox`.
//!
//! Claiming is one short `BEGIN IMMEDIATE` transaction: an `UPDATE … WHERE seq IN (SELECT …
//! ORDER BY seq LIMIT n) RETURNING` over the partial index of runnable deliveries, so no two
//! live claims can ever hold one delivery. The single writer serializes every transition, so
//! reading a delivery's fencing columns is locking it.

use ce_core::{Delivery, EventPayload, Millis, OutboxEvent};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::rows::SqlTx;
use super::{Durability, SqliteStore};
use crate::error::Result;
use crate::model::{ConsumerError, DeliveryRow, JournalExtent};
use crate::outbox::rows::{
    DELIVERY_COLUMNS, DeadParams, EVENT_COLUMNS, FenceRow, StoredDelivery, consumer_error,
    dead_params, decode_event, new_event_id,
};
use crate::outbox::{
    ClaimRows, Commit, DeadChange, DeliveryUpdate, LagScan, ListQuery, OutboxBackend, OutboxReadTx,
    OutboxTx,
};

/// Claims the first `?6` runnable deliveries of consumer `?1` at time `?2` for worker `?3`
/// with token `?4` and lease end `?5`.
const CLAIM_SQL: &str = "UPDATE deliveries SET status = 1, claimed_by = ?3, claim_token = ?4,
        claimed_until = ?5, visible_at = ?5, updated_at = ?2
     WHERE consumer = ?1 AND seq IN (
        SELECT seq FROM deliveries
        WHERE consumer = ?1 AND status IN (0, 1, 2) AND visible_at <= ?2
        ORDER BY seq LIMIT ?6)
     RETURNING seq, retry_count";

/// Deletes at most `?2` done deliveries last changed before `?1`.
const PRUNE_DELIVERIES_SQL: &str = "DELETE FROM deliveries WHERE (consumer, seq) IN (
        SELECT consumer, seq FROM deliveries WHERE status = 3 AND updated_at < ?1 LIMIT ?2)
     RETURNING consumer, seq";

/// Deletes at most `?2` events appended before `?1` that no delivery of a known consumer
/// refers to, oldest first, never the newest event. Each (event, consumer) is one
/// primary-key probe: `CROSS JOIN` keeps `consumers` outside (as a plain join the planner
/// scanned `deliveries` for every event).
const PRUNE_EVENTS_SQL: &str = "DELETE FROM events WHERE seq IN (
        SELECT e.seq FROM events e
        WHERE e.created_at < ?1 AND e.seq < (SELECT max(seq) FROM events)
          AND NOT EXISTS (SELECT 1 FROM consumers c CROSS JOIN deliveries d
                          ON d.consumer = c.name AND d.seq = e.seq)
        ORDER BY e.seq LIMIT ?2)
     RETURNING seq, targeted";

/// The journal's extent: events, their oldest and newest sequence, deliveries, and the
/// newest untargeted event pruned.
const JOURNAL_EXTENT_SQL: &str = "SELECT count(*), min(seq), max(seq),
        (SELECT count(*) FROM deliveries), (SELECT pruned_through FROM journal WHERE id = 1)
     FROM events";

/// Whether consumer `?1` has a pending (0) or claimed (1) delivery: the runnable partial
/// index's own condition, so that the planner uses it, then retry-wait (2) left out.
const HAS_UNFINISHED_SQL: &str = "SELECT EXISTS (SELECT 1 FROM deliveries
     WHERE consumer = ?1 AND status IN (0, 1, 2) AND status <> 2)";

/// The counts per status of consumer `?1`'s deliveries that are not done, from the partial
/// indexes (never a done delivery visited).
const OPEN_STATUS_COUNTS_SQL: &str = "SELECT status, count(*) FROM deliveries
         INDEXED BY deliveries_runnable
     WHERE consumer = ?1 AND status IN (0, 1, 2) GROUP BY status
     UNION ALL
     SELECT 5, count(*) FROM deliveries INDEXED BY deliveries_dead
     WHERE consumer = ?1 AND status = 5";

/// The done deliveries of consumer `?1`: the sum of its maintained count's shards.
const DONE_COUNT_SQL: &str = "SELECT coalesce(sum(n), 0) FROM done_counts WHERE consumer = ?1";

/// The oldest non-terminal delivery of consumer `?1` (the low watermark).
const LOW_WATERMARK_SQL: &str = "SELECT d.seq, e.created_at FROM deliveries d
     JOIN events e ON e.seq = d.seq
     WHERE d.consumer = ?1 AND d.status IN (0, 1, 2) ORDER BY d.seq LIMIT 1";

/// Among the oldest `?3` deliveries of consumer `?1` not applied yet (inside the runnable
/// partial index): how many were examined, how many are of events on `?2` or below it (all
/// when `?2` is NULL), and the oldest append time of those.
const LAG_SQL: &str = "SELECT count(*), coalesce(sum(in_scope), 0),
        min(CASE WHEN in_scope = 1 THEN created_at END) FROM (
     SELECT e.created_at, CASE WHEN ?2 IS NULL OR e.uri = ?2
            OR substr(e.uri, 1, length(?2) + 1) = ?2 || '/' THEN 1 ELSE 0 END AS in_scope
     FROM deliveries d INDEXED BY deliveries_runnable
     JOIN events e ON e.seq = d.seq
     WHERE d.consumer = ?1 AND d.status IN (0, 1, 2)
     ORDER BY d.seq LIMIT ?3)";

/// The most recent failure among consumer `?1`'s runnable (pending, claimed, retrying)
/// deliveries, and among its dead ones (`INDEXED BY`: the planner would otherwise walk the
/// consumer's whole history by primary key).
const LAST_ERROR_RUNNABLE_SQL: &str = "SELECT d.seq, e.event_id, d.error_code, d.last_error,
        d.updated_at, d.status FROM deliveries d INDEXED BY deliveries_runnable
     JOIN events e ON e.seq = d.seq
     WHERE d.consumer = ?1 AND d.status IN (0, 1, 2) AND d.last_error IS NOT NULL
     ORDER BY d.updated_at DESC, d.seq DESC LIMIT 1";
const LAST_ERROR_DEAD_SQL: &str = "SELECT d.seq, e.event_id, d.error_code, d.last_error,
        d.updated_at, d.status FROM deliveries d INDEXED BY deliveries_dead
     JOIN events e ON e.seq = d.seq
     WHERE d.consumer = ?1 AND d.status = 5
     ORDER BY d.updated_at DESC, d.seq DESC LIMIT 1";

/// The dead deliveries a [`DeadParams`] selects, as `WHERE` conditions on `deliveries`
/// (parameters `?1` consumer, `?2` error code, `?3`/`?4` sequence bounds, `?5` exhausted only,
/// `?6` max retries, `?7` event type, `?8` subtree, `?9` configured consumers as JSON).
const DEAD_WHERE: &str = "status = 5
       AND (?1 IS NULL OR consumer = ?1)
       AND (?2 IS NULL OR error_code = ?2)
       AND seq >= ?3 AND seq <= ?4
       AND (?5 = 0 OR retry_count >= ?6)
       AND ((?7 IS NULL AND ?8 IS NULL) OR seq IN (
            SELECT seq FROM events WHERE (?7 IS NULL OR event_type = ?7)
              AND (?8 IS NULL OR uri = ?8 OR substr(uri, 1, length(?8) + 1) = ?8 || '/')))
       AND consumer IN (SELECT value FROM json_each(?9))";

/// Appends `payloads` to the journal inside `tx`, with a pending delivery per consumer
/// (`targeted`: for those consumers only).
pub(super) fn append_events_tx(
    tx: &Connection,
    consumers: &[String],
    targeted: bool,
    payloads: Vec<EventPayload>,
    now: Millis,
) -> Result<Vec<OutboxEvent>> {
    let mut ins_event = tx.prepare_cached(
        "INSERT INTO events (event_id, event_type, uri, payload, created_at, targeted)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut ins_delivery = tx.prepare_cached(
        "INSERT INTO deliveries (consumer, seq, status, retry_count, visible_at, updated_at)
         VALUES (?1, ?2, 0, 0, ?3, ?3)",
    )?;
    let mut out = Vec::with_capacity(payloads.len());
    for payload in payloads {
        let event_id = new_event_id();
        let event_type = payload.event_type();
        let uri = payload.uri().clone();
        let json = serde_json::to_string(&payload)?;
        ins_event.execute(params![
            event_id,
            event_type.as_str(),
            uri.as_str(),
            json,
            now,
            targeted
        ])?;
        let seq = tx.last_insert_rowid();
        for c in consumers {
            ins_delivery.execute(params![c, seq, now])?;
        }
        out.push(OutboxEvent {
            seq,
            event_id,
            event_type,
            uri,
            payload,
            created_at_ms: now,
        });
    }
    Ok(out)
}

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<Result<OutboxEvent>> {
    let event_type: String = row.get(2)?;
    let payload: String = row.get(4)?;
    Ok(decode_event(
        row.get(0)?,
        row.get(1)?,
        &event_type,
        &payload,
        row.get(5)?,
    ))
}

fn delivery_from_row(row: &Row<'_>, off: usize) -> rusqlite::Result<Result<Delivery>> {
    let stored = StoredDelivery {
        consumer: row.get(off)?,
        seq: row.get(off + 1)?,
        status: row.get(off + 2)?,
        retry_count: row.get(off + 3)?,
        visible_at: row.get(off + 4)?,
        claimed_by: row.get(off + 5)?,
        claim_token: row.get(off + 6)?,
        claimed_until: row.get(off + 7)?,
        last_error: row.get(off + 8)?,
        error_code: row.get(off + 9)?,
        updated_at: row.get(off + 10)?,
    };
    Ok(stored.decode())
}

fn error_from_row(r: &Row<'_>) -> rusqlite::Result<ConsumerError> {
    Ok(consumer_error(
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}

impl SqlTx<'_> {
    /// Runs `sql` (whose `WHERE` ends with [`DEAD_WHERE`] and which returns the consumer of
    /// each row it selects or changes) with `p`'s parameters followed by `extra`.
    fn dead_rows(
        &self,
        p: &DeadParams,
        sql: &str,
        extra: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<String>> {
        let configured = serde_json::to_string(&p.configured)?;
        let base: [&dyn rusqlite::ToSql; 9] = dead_params!(p, &configured);
        let params: Vec<&dyn rusqlite::ToSql> = base.iter().chain(extra).copied().collect();
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map(params.as_slice(), |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

impl OutboxReadTx for SqlTx<'_> {
    fn events(&mut self, seqs: &[i64]) -> Result<Vec<OutboxEvent>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events e WHERE e.seq = ?1"
        ))?;
        let mut out = Vec::with_capacity(seqs.len());
        for s in seqs {
            if let Some(e) = stmt.query_row([s], event_from_row).optional()? {
                out.push(e?);
            }
        }
        Ok(out)
    }

    fn event(&mut self, event_id: &str, seq: Option<i64>) -> Result<Option<OutboxEvent>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM events e WHERE e.event_id = ?1 OR e.seq = ?2
                 ORDER BY e.seq LIMIT 1"
            ))?
            .query_row(params![event_id, seq], event_from_row)
            .optional()?
            .transpose()
    }

    fn deliveries(&mut self, seq: i64) -> Result<Vec<Delivery>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d WHERE d.seq = ?1 ORDER BY d.consumer"
        ))?;
        let rows = stmt.query_map([seq], |r| delivery_from_row(r, 0))?;
        rows.map(|r| r?).collect()
    }

    fn list_rows(&mut self, q: &ListQuery<'_>) -> Result<Vec<DeliveryRow>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS}, {DELIVERY_COLUMNS}
             FROM deliveries d JOIN events e ON e.seq = d.seq
             WHERE (?1 IS NULL OR d.status = ?1) AND (?2 IS NULL OR d.consumer = ?2)
               AND (?3 IS NULL OR e.event_type = ?3)
               AND (d.seq > ?4 OR (d.seq = ?4 AND ?6 IS NOT NULL AND d.consumer > ?6))
               AND d.consumer IN (SELECT value FROM json_each(?7))
             ORDER BY d.seq, d.consumer LIMIT ?5"
        ))?;
        let rows = stmt.query_map(
            params![
                q.status,
                q.consumer,
                q.event_type,
                q.after_seq,
                q.limit,
                q.after_consumer,
                serde_json::to_string(q.configured)?,
            ],
            |r| Ok((event_from_row(r)?, delivery_from_row(r, 6)?)),
        )?;
        let mut out = Vec::new();
        for row in rows {
            let (e, d) = row?;
            out.push(DeliveryRow {
                event: e?,
                delivery: d?,
            });
        }
        Ok(out)
    }

    fn open_status_counts(&mut self, consumer: &str) -> Result<Vec<(i64, i64)>> {
        let mut stmt = self.conn.prepare_cached(OPEN_STATUS_COUNTS_SQL)?;
        let rows = stmt.query_map([consumer], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn done_count(&mut self, consumer: &str) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached(DONE_COUNT_SQL)?
            .query_row([consumer], |r| r.get(0))?)
    }

    fn has_unfinished(&mut self, consumer: &str) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached(HAS_UNFINISHED_SQL)?
            .query_row([consumer], |r| r.get(0))?)
    }

    fn low_watermark(&mut self, consumer: &str) -> Result<Option<(i64, Millis)>> {
        Ok(self
            .conn
            .prepare_cached(LOW_WATERMARK_SQL)?
            .query_row([consumer], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    fn last_error(&mut self, consumer: &str, dead: bool) -> Result<Option<ConsumerError>> {
        let sql = if dead {
            LAST_ERROR_DEAD_SQL
        } else {
            LAST_ERROR_RUNNABLE_SQL
        };
        Ok(self
            .conn
            .prepare_cached(sql)?
            .query_row([consumer], error_from_row)
            .optional()?)
    }

    fn lag_scan(&mut self, consumer: &str, within: Option<&str>, limit: i64) -> Result<LagScan> {
        Ok(self
            .conn
            .prepare_cached(LAG_SQL)?
            .query_row(params![consumer, within, limit], |r| {
                Ok(LagScan {
                    examined: r.get(0)?,
                    in_scope: r.get(1)?,
                    oldest: r.get(2)?,
                })
            })?)
    }

    fn dead_consumers(&mut self, p: &DeadParams) -> Result<Vec<String>> {
        self.dead_rows(
            p,
            &format!("SELECT consumer FROM deliveries WHERE {DEAD_WHERE}"),
            &[],
        )
    }

    fn through_seq(&mut self, consumer: &str) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT coalesce((SELECT through_seq FROM consumers WHERE name = ?1), 0)",
            )?
            .query_row([consumer], |r| r.get(0))?)
    }

    fn oldest_event_at(&mut self) -> Result<Option<Millis>> {
        Ok(self
            .conn
            .prepare_cached("SELECT created_at FROM events ORDER BY seq LIMIT 1")?
            .query_row([], |r| r.get(0))
            .optional()?)
    }

    fn flagged_rebuilds(&mut self) -> Result<Vec<String>> {
        self.strings(
            "SELECT name FROM consumers WHERE needs_rebuild <> 0 ORDER BY name",
            [],
        )
    }

    fn journal_extent(&mut self) -> Result<JournalExtent> {
        Ok(self
            .conn
            .prepare_cached(JOURNAL_EXTENT_SQL)?
            .query_row([], |r| {
                Ok(JournalExtent {
                    events: r.get::<_, i64>(0)?.max(0) as u64,
                    oldest_seq: r.get(1)?,
                    newest_seq: r.get(2)?,
                    deliveries: r.get::<_, i64>(3)?.max(0) as u64,
                    pruned_through: r.get(4)?,
                })
            })?)
    }
}

impl OutboxTx for SqlTx<'_> {
    fn append_events(
        &mut self,
        consumers: &[String],
        targeted: bool,
        payloads: Vec<EventPayload>,
        now: Millis,
    ) -> Result<Vec<OutboxEvent>> {
        append_events_tx(self.conn, consumers, targeted, payloads, now)
    }

    fn add_consumer(&mut self, consumer: &str, now: Millis) -> Result<i64> {
        self.conn
            .prepare_cached(
                "INSERT INTO consumers (name, added_at) VALUES (?1, ?2)
                 ON CONFLICT(name) DO NOTHING",
            )?
            .execute(params![consumer, now])?;
        Ok(self
            .conn
            .prepare_cached(
                "SELECT max(coalesce((SELECT max(seq) FROM deliveries WHERE consumer = ?1), 0),
                            through_seq)
                 FROM consumers WHERE name = ?1",
            )?
            .query_row([consumer], |r| r.get(0))?)
    }

    fn pruned_through(&mut self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT pruned_through FROM journal WHERE id = 1")?
            .query_row([], |r| r.get(0))?)
    }

    fn back_fill(&mut self, consumer: &str, after: i64, now: Millis) -> Result<u64> {
        let added = self
            .conn
            .prepare_cached(
                "INSERT INTO deliveries (consumer, seq, status, retry_count, visible_at, updated_at)
                 SELECT ?1, seq, 0, 0, ?2, ?2 FROM events WHERE seq > ?3 AND NOT targeted",
            )?
            .execute(params![consumer, now, after])?;
        Ok(added as u64)
    }

    fn flag_rebuild(&mut self, consumer: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE consumers SET needs_rebuild = 1,
                     through_seq = max(through_seq, (SELECT coalesce(max(seq), 0) FROM events))
                 WHERE name = ?1",
            )?
            .execute([consumer])?;
        Ok(())
    }

    fn clear_rebuild(&mut self, consumer: &str) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached(
                "UPDATE consumers SET needs_rebuild = 0 WHERE name = ?1 AND needs_rebuild <> 0",
            )?
            .execute([consumer])?
            > 0)
    }

    fn prune_deliveries(&mut self, cutoff: Millis, limit: i64) -> Result<Vec<(String, i64)>> {
        self.pairs(PRUNE_DELIVERIES_SQL, params![cutoff, limit])
    }

    fn raise_through(&mut self, consumer: &str, seq: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE consumers SET through_seq = max(through_seq, ?2) WHERE name = ?1",
            )?
            .execute(params![consumer, seq])?;
        Ok(())
    }

    fn add_done(&mut self, consumer: &str, delta: i64) -> Result<()> {
        // One shard: SQLite has one writer at a time.
        self.conn
            .prepare_cached(
                "INSERT INTO done_counts (consumer, shard, n) VALUES (?1, 0, ?2)
                 ON CONFLICT (consumer, shard) DO UPDATE SET n = n + excluded.n",
            )?
            .execute(params![consumer, delta])?;
        Ok(())
    }

    fn prune_events(&mut self, cutoff: Millis, limit: i64) -> Result<Vec<(i64, bool)>> {
        self.pairs(PRUNE_EVENTS_SQL, params![cutoff, limit])
    }

    fn raise_pruned_through(&mut self, seq: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE journal SET pruned_through = max(pruned_through, ?1) WHERE id = 1",
            )?
            .execute([seq])?;
        Ok(())
    }

    fn claim_rows(&mut self, c: &ClaimRows<'_>) -> Result<Vec<(i64, i64)>> {
        self.pairs(
            CLAIM_SQL,
            params![c.consumer, c.now, c.worker_id, c.token, c.until, c.limit],
        )
    }

    fn lock_delivery(&mut self, consumer: &str, seq: i64) -> Result<Option<FenceRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT status, claim_token, claimed_until, retry_count FROM deliveries
                 WHERE consumer = ?1 AND seq = ?2",
            )?
            .query_row(params![consumer, seq], |r| {
                Ok(FenceRow {
                    status: r.get(0)?,
                    token: r.get(1)?,
                    until: r.get(2)?,
                    retry_count: r.get(3)?,
                })
            })
            .optional()?)
    }

    fn done_live(
        &mut self,
        consumer: &str,
        claims: &[(i64, &str)],
        now: Millis,
    ) -> Result<Vec<(i64, String)>> {
        // One cheap statement per row: SQLite runs in-process, and its single writer is
        // the lock.
        let mut st = self.conn.prepare_cached(
            "UPDATE deliveries SET status = 3, visible_at = NULL, updated_at = ?4
             WHERE consumer = ?1 AND seq = ?2 AND status = 1 AND claim_token = ?3
               AND claimed_until > ?4",
        )?;
        let mut done = Vec::with_capacity(claims.len());
        for &(seq, token) in claims {
            if st.execute(params![consumer, seq, token, now])? == 1 {
                done.push((seq, token.to_owned()));
            }
        }
        Ok(done)
    }

    fn update_delivery(
        &mut self,
        consumer: &str,
        seq: i64,
        u: &DeliveryUpdate<'_>,
        now: Millis,
    ) -> Result<()> {
        let (code, message) = u.error.unzip();
        self.conn
            .prepare_cached(
                "UPDATE deliveries SET status = ?3, retry_count = ?4, visible_at = ?5,
                    claimed_until = coalesce(?6, claimed_until),
                    error_code = coalesce(?7, error_code), last_error = coalesce(?8, last_error),
                    updated_at = ?9
                 WHERE consumer = ?1 AND seq = ?2",
            )?
            .execute(params![
                consumer,
                seq,
                u.status,
                u.retry_count,
                u.visible_at,
                u.claimed_until,
                code,
                message,
                now
            ])?;
        Ok(())
    }

    fn requeue_dead(
        &mut self,
        consumer: Option<&str>,
        seqs: Option<&[i64]>,
        now: Millis,
    ) -> Result<u64> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "UPDATE deliveries SET {}
             WHERE status = 5 AND (?2 IS NULL OR consumer = ?2) AND (?3 IS NULL OR seq = ?3)",
            DeadChange::Requeue.set_sql("?1")
        ))?;
        let mut n = 0;
        match seqs {
            None => n += stmt.execute(params![now, consumer, None::<i64>])?,
            Some(seqs) => {
                for s in seqs {
                    n += stmt.execute(params![now, consumer, s])?;
                }
            }
        }
        Ok(n as u64)
    }

    fn change_dead(
        &mut self,
        p: &DeadParams,
        change: DeadChange,
        now: Millis,
    ) -> Result<Vec<String>> {
        let set = change.set_sql("?10");
        let sql = format!("UPDATE deliveries SET {set} WHERE {DEAD_WHERE} RETURNING consumer");
        self.dead_rows(p, &sql, &[&now])
    }
}

impl OutboxBackend for SqliteStore {
    fn write_outbox<T>(
        &self,
        commit: Commit,
        f: impl FnOnce(&mut dyn OutboxTx, Millis) -> Result<T>,
    ) -> Result<T> {
        let durability = match commit {
            Commit::Journal | Commit::Repair => Durability::Full,
            Commit::Bookkeeping => Durability::Normal,
        };
        let consumers = &self.config.index.outbox.consumers;
        self.write(durability, |tx, now| f(&mut SqlTx::new(tx, consumers), now))
    }

    fn read_outbox<T>(&self, f: impl FnOnce(&mut dyn OutboxReadTx) -> Result<T>) -> Result<T> {
        let consumers = &self.config.index.outbox.consumers;
        self.read(|conn| f(&mut SqlTx::new(conn, consumers)))
    }
}

crate::outbox::impl_outbox_store!(SqliteStore);

#[cfg(test)]
mod tests {
    //! SQLite's own outbox tests; the backend-neutral ones run on every backend in
    //! `tests/integration/outbox_ops.rs`.

    use super::{
        CLAIM_SQL, LAG_SQL, LAST_ERROR_DEAD_SQL, LAST_ERROR_RUNNABLE_SQL, LOW_WATERMARK_SQL,
        OPEN_STATUS_COUNTS_SQL, PRUNE_EVENTS_SQL,
    };
    use crate::sqlite::SqliteStore;

    /// `EXPLAIN QUERY PLAN` of `sql` (every parameter NULL), one line per step.
    fn plan(store: &SqliteStore, sql: &str) -> String {
        store
            .read(|c| {
                let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                let nulls = std::iter::repeat_n(rusqlite::types::Null, stmt.parameter_count());
                let rows =
                    stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("\n"))
            })
            .expect("explain")
    }

    /// The claim and the low watermark must walk the partial index of runnable deliveries,
    /// never the primary key over the done history (which made claims O(history)).
    #[test]
    fn claim_and_watermark_use_the_runnable_index() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = SqliteStore::open(tmp.path(), ce_core::Config::default()).expect("open");
        for (sql, index) in [
            (CLAIM_SQL, "deliveries_runnable"),
            (LOW_WATERMARK_SQL, "deliveries_runnable"),
            (LAG_SQL, "deliveries_runnable"),
            (LAST_ERROR_RUNNABLE_SQL, "deliveries_runnable"),
            (LAST_ERROR_DEAD_SQL, "deliveries_dead"),
            (OPEN_STATUS_COUNTS_SQL, "deliveries_runnable"),
            (OPEN_STATUS_COUNTS_SQL, "deliveries_dead"),
        ] {
            let plan = plan(&store, sql);
            assert!(plan.contains(index), "{sql}\n{plan}");
        }
        // The open counts never walk the primary key (every done delivery).
        let plan = plan(&store, OPEN_STATUS_COUNTS_SQL);
        assert!(!plan.contains("PRIMARY KEY"), "{plan}");
    }

    /// The journal's prune looks each event's deliveries up by primary key, one probe per
    /// consumer, never by scanning `deliveries` per event.
    #[test]
    fn pruning_events_probes_their_deliveries() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = SqliteStore::open(tmp.path(), ce_core::Config::default()).expect("open");
        let plan = plan(&store, PRUNE_EVENTS_SQL);
        assert!(
            plan.contains("SEARCH d USING PRIMARY KEY (consumer=? AND seq=?)"),
            "{plan}"
        );
        assert!(!plan.contains("SCAN d"), "{plan}");
    }
}
