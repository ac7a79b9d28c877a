//! The outbox on SQLite: journal rows in `events`, one `deliveries` row per (consumer, event).
//!
//! Claiming is one short `BEGIN IMMEDIATE` transaction: an `UPDATE … WHERE seq IN (SELECT …
//! ORDER BY seq LIMIT n) RETURNING` over the partial index of runnable deliveries, so no two
//! live claims can ever hold one delivery. Acks are fenced by the claim token and the lease.

use ce_core::{
    CtxUri, Delivery, DeliveryStatus, EventPayload, EventType, Millis, OutboxEvent,
    OutboxEventCreate,
};
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use super::{Durability, SqliteStore};
use crate::error::{Result, StoreError};
use crate::model::{
    Claim, ClaimedEvent, ConsumerError, ConsumerLag, ConsumerStats, DeadCounts, DeadFilter,
    DeliveryRow, FORCED_DONE_CODE, LAG_SCAN_LIMIT, OutboxFilter, OutboxStore,
};
use crate::queue::{new_claim_token, stored_error};
use crate::shared::outbox::{
    DELIVERY_COLUMNS, DeadParams, EVENT_COLUMNS, FORCED_DONE_LAST_ERROR_SQL, Failure, FenceRow,
    StoredDelivery, check_consumer, checked_payloads, consumer_error, count_status, decode_event,
    fence, latest_error, lease_ms, new_event_id,
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

/// The dead deliveries a [`DeadFilter`] selects, as `WHERE` conditions on `deliveries`
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

/// Appends `payloads` to the journal inside `tx`, with a pending delivery per consumer.
pub(super) fn append_events_tx(
    tx: &Connection,
    consumers: &[String],
    payloads: Vec<EventPayload>,
    now: Millis,
) -> Result<Vec<OutboxEvent>> {
    let mut ins_event = tx.prepare_cached(
        "INSERT INTO events (event_id, event_type, uri, payload, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
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
            now
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

impl SqliteStore {
    /// Records the configured consumers and back-fills each: a consumer seen for the first
    /// time, or switched back on after a gap, gets a pending delivery for every journal event
    /// after its newest delivery (an index seek when there is nothing to add).
    pub(super) fn register_consumers(&self) -> Result<()> {
        let consumers = self.config.index.outbox.consumers.clone();
        self.write(Durability::Full, |tx, now| {
            for c in &consumers {
                tx.execute(
                    "INSERT INTO consumers (name, added_at) VALUES (?1, ?2)
                     ON CONFLICT(name) DO NOTHING",
                    params![c, now],
                )?;
                tx.execute(
                    "INSERT INTO deliveries (consumer, seq, status, retry_count, visible_at, updated_at)
                     SELECT ?1, seq, 0, 0, ?2, ?2 FROM events
                     WHERE seq > (SELECT coalesce(max(seq), 0) FROM deliveries WHERE consumer = ?1)",
                    params![c, now],
                )?;
            }
            Ok(())
        })
    }

    pub(super) fn check_consumer(&self, consumer: &str) -> Result<()> {
        check_consumer(&self.config.index.outbox.consumers, consumer)
    }

    /// Applies a fenced transition: `f` runs only when `claim` is the live claim; otherwise
    /// the delivery's current state decides between `Ok(None)` (already done) and a conflict.
    fn fenced<T>(
        &self,
        claim: &Claim,
        done_is_ok: bool,
        f: impl FnOnce(&Transaction<'_>, Millis, u32) -> Result<T>,
    ) -> Result<Option<T>> {
        self.write(Durability::Normal, |tx, now| {
            fenced_tx(tx, now, claim, done_is_ok, f)
        })
    }
}

/// The body of [`SqliteStore::fenced`] inside an open transaction.
fn fenced_tx<T>(
    tx: &Transaction<'_>,
    now: Millis,
    claim: &Claim,
    done_is_ok: bool,
    f: impl FnOnce(&Transaction<'_>, Millis, u32) -> Result<T>,
) -> Result<Option<T>> {
    let row = tx
        .prepare_cached(
            "SELECT status, claim_token, claimed_until, retry_count FROM deliveries
                     WHERE consumer = ?1 AND seq = ?2",
        )?
        .query_row(params![claim.consumer, claim.seq], |r| {
            Ok(FenceRow {
                status: r.get(0)?,
                token: r.get(1)?,
                until: r.get(2)?,
                retry_count: r.get(3)?,
            })
        })
        .optional()?;
    match fence(row, claim, now, done_is_ok)? {
        Some(retry_count) => f(tx, now, retry_count).map(Some),
        None => Ok(None),
    }
}

fn done_tx(tx: &Transaction<'_>, now: Millis, claim: &Claim) -> Result<()> {
    tx.prepare_cached(
        "UPDATE deliveries SET status = 3, visible_at = NULL, updated_at = ?3
         WHERE consumer = ?1 AND seq = ?2",
    )?
    .execute(params![claim.consumer, claim.seq, now])?;
    Ok(())
}

fn read_events(conn: &Connection, seqs: &[i64]) -> Result<Vec<OutboxEvent>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {EVENT_COLUMNS} FROM events e WHERE e.seq = ?1"
    ))?;
    let mut out = Vec::with_capacity(seqs.len());
    for s in seqs {
        out.push(stmt.query_row([s], event_from_row)??);
    }
    Ok(out)
}

impl SqliteStore {
    /// Runs `sql` (whose `WHERE` ends with [`DEAD_WHERE`] and which returns the consumer of
    /// each row it selects or changes) with `filter`'s parameters after `extra`, in one write
    /// transaction; counts the rows per consumer.
    fn dead_rows(
        &self,
        filter: &DeadFilter,
        sql: &str,
        extra: &[&dyn rusqlite::ToSql],
    ) -> Result<DeadCounts> {
        let p = DeadParams::new(filter, &self.config.index.outbox)?;
        let configured = serde_json::to_string(&p.configured)?;
        let base: [&dyn rusqlite::ToSql; 9] = [
            &p.consumer,
            &p.error_code,
            &p.min_seq,
            &p.max_seq,
            &p.exhausted_only,
            &p.max_retries,
            &p.event_type,
            &p.subtree,
            &configured,
        ];
        let params: Vec<&dyn rusqlite::ToSql> = base.iter().chain(extra).copied().collect();
        let run = |conn: &Connection| -> Result<DeadCounts> {
            let mut stmt = conn.prepare(sql)?;
            let rows = stmt.query_map(params.as_slice(), |r| r.get::<_, String>(0))?;
            let mut counts = DeadCounts::new();
            for c in rows {
                *counts.entry(c?).or_default() += 1;
            }
            Ok(counts)
        };
        if extra.is_empty() {
            // A count: a read snapshot is enough.
            self.read(run)
        } else {
            self.write(Durability::Full, |tx, _| run(tx))
        }
    }
}

impl OutboxStore for SqliteStore {
    fn append_batch_for(
        &self,
        consumers: &[String],
        events: Vec<OutboxEventCreate>,
    ) -> Result<Vec<OutboxEvent>> {
        let payloads = checked_payloads(&self.config.index.outbox.consumers, consumers, events)?;
        self.write(Durability::Full, |tx, now| {
            append_events_tx(tx, consumers, payloads, now)
        })
    }

    fn claim_batch(
        &self,
        consumer: &str,
        worker_id: &str,
        limit: usize,
    ) -> Result<Vec<ClaimedEvent>> {
        self.check_consumer(consumer)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let lease_ms = lease_ms(&self.config);
        let token = new_claim_token();
        self.write(Durability::Normal, |tx, now| {
            let until = now + lease_ms;
            let mut claimed: Vec<(i64, u32)> = tx
                .prepare_cached(CLAIM_SQL)?
                .query_map(
                    params![consumer, now, worker_id, token, until, limit as i64],
                    |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u32)),
                )?
                .collect::<rusqlite::Result<_>>()?;
            claimed.sort_unstable();
            let seqs: Vec<i64> = claimed.iter().map(|c| c.0).collect();
            let events = read_events(tx, &seqs)?;
            Ok(events
                .into_iter()
                .zip(claimed)
                .map(|(event, (seq, retry_count))| ClaimedEvent {
                    claim: Claim {
                        consumer: consumer.to_owned(),
                        seq,
                        event_id: event.event_id.clone(),
                        worker_id: worker_id.to_owned(),
                        token: token.clone(),
                        claimed_until_ms: until,
                    },
                    event,
                    retry_count,
                })
                .collect::<Vec<_>>())
        })
        .inspect(|c| {
            if !c.is_empty() {
                ce_core::failpoint::hit("outbox.after_claim");
            }
        })
    }

    fn renew(&self, claim: &Claim) -> Result<Millis> {
        let lease = lease_ms(&self.config);
        let renewed = self.fenced(claim, false, |tx, now, _| {
            let until = now + lease;
            tx.prepare_cached(
                "UPDATE deliveries SET claimed_until = ?3, visible_at = ?3, updated_at = ?4
                 WHERE consumer = ?1 AND seq = ?2",
            )?
            .execute(params![claim.consumer, claim.seq, until, now])?;
            Ok(until)
        })?;
        renewed.ok_or_else(|| StoreError::Corrupt("renew of a done delivery".into()))
    }

    fn mark_done(&self, claim: &Claim) -> Result<()> {
        self.fenced(claim, true, |tx, now, _| done_tx(tx, now, claim))?;
        Ok(())
    }

    fn mark_done_batch(&self, claims: &[Claim]) -> Result<Vec<Result<()>>> {
        self.write(Durability::Normal, |tx, now| {
            let mut out = Vec::with_capacity(claims.len());
            for claim in claims {
                match fenced_tx(tx, now, claim, true, |tx, now, _| done_tx(tx, now, claim)) {
                    Ok(_) => out.push(Ok(())),
                    Err(
                        e @ (StoreError::ClaimConflict { .. } | StoreError::EventNotFound { .. }),
                    ) => {
                        out.push(Err(e));
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
    }

    fn mark_failed(
        &self,
        claim: &Claim,
        error: &str,
        error_code: &str,
        retryable: bool,
    ) -> Result<DeliveryStatus> {
        let o = &self.config.index.outbox;
        let error = stored_error(error);
        let status = self.fenced(claim, false, |tx, now, retry_count| {
            let to = Failure::after(o, retry_count, retryable, now);
            tx.prepare_cached(
                "UPDATE deliveries SET status = ?3, retry_count = ?4, visible_at = ?5,
                    last_error = ?6, error_code = ?7, updated_at = ?8
                 WHERE consumer = ?1 AND seq = ?2",
            )?
            .execute(params![
                claim.consumer,
                claim.seq,
                to.status,
                to.retry_count,
                to.visible_at,
                error,
                error_code,
                now
            ])?;
            Ok(to.delivery_status())
        })?;
        status.ok_or_else(|| StoreError::Corrupt("mark_failed of a done delivery".into()))
    }

    fn requeue_dead(&self, consumer: Option<&str>, seqs: Option<&[i64]>) -> Result<u64> {
        if let Some(c) = consumer {
            self.check_consumer(c)?;
        }
        self.write(Durability::Full, |tx, now| {
            let mut stmt = tx.prepare_cached(
                "UPDATE deliveries SET status = 0, retry_count = 0, visible_at = ?1, updated_at = ?1
                 WHERE status = 5 AND (?2 IS NULL OR consumer = ?2) AND (?3 IS NULL OR seq = ?3)",
            )?;
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
        })
    }

    fn count_dead(&self, filter: &DeadFilter) -> Result<DeadCounts> {
        self.dead_rows(
            filter,
            &format!("SELECT consumer FROM deliveries WHERE {DEAD_WHERE}"),
            &[],
        )
    }

    fn requeue_dead_matching(&self, filter: &DeadFilter) -> Result<DeadCounts> {
        let now = self.clock().now_ms();
        self.dead_rows(
            filter,
            &format!(
                "UPDATE deliveries SET status = 0, retry_count = 0, visible_at = ?10,
                    updated_at = ?10
                 WHERE {DEAD_WHERE} RETURNING consumer"
            ),
            &[&now],
        )
    }

    fn force_done(&self, filter: &DeadFilter) -> Result<DeadCounts> {
        let now = self.clock().now_ms();
        self.dead_rows(
            filter,
            &format!(
                "UPDATE deliveries SET status = 3, visible_at = NULL, updated_at = ?10,
                    error_code = ?11, last_error = {FORCED_DONE_LAST_ERROR_SQL}
                 WHERE {DEAD_WHERE} RETURNING consumer"
            ),
            &[&now, &FORCED_DONE_CODE],
        )
    }

    fn list(&self, filter: &OutboxFilter) -> Result<Vec<DeliveryRow>> {
        if let Some(c) = &filter.consumer {
            self.check_consumer(c)?;
        }
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
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
                    filter.status.map(DeliveryStatus::as_i64),
                    filter.consumer,
                    filter.event_type.map(EventType::as_str),
                    filter.after_seq.unwrap_or(0),
                    i64::from(filter.limit.unwrap_or(100)),
                    filter.after_consumer,
                    serde_json::to_string(&self.config.index.outbox.consumers)?,
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
        })
    }

    fn show(&self, event_id: &str) -> Result<(OutboxEvent, Vec<Delivery>)> {
        self.read(|conn| {
            let by_seq = event_id.parse::<i64>().ok();
            let event = conn
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM events e WHERE e.event_id = ?1 OR e.seq = ?2"
                ))?
                .query_row(params![event_id, by_seq], event_from_row)
                .optional()?
                .ok_or_else(|| StoreError::EventNotFound {
                    event_id: event_id.to_owned(),
                })??;
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM deliveries d WHERE d.seq = ?1 ORDER BY d.consumer"
            ))?;
            let deliveries = stmt
                .query_map([event.seq], |r| delivery_from_row(r, 0))?
                .collect::<rusqlite::Result<Vec<_>>>()?
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
            Ok((event, deliveries))
        })
    }

    fn stats(&self) -> Result<Vec<ConsumerStats>> {
        self.read(|conn| {
            let mut out = Vec::new();
            for c in &self.config.index.outbox.consumers {
                let mut s = ConsumerStats {
                    consumer: c.clone(),
                    ..ConsumerStats::default()
                };
                let mut stmt = conn.prepare_cached(
                    "SELECT status, count(*) FROM deliveries WHERE consumer = ?1 GROUP BY status",
                )?;
                let rows =
                    stmt.query_map([c], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
                for row in rows {
                    let (status, n) = row?;
                    count_status(&mut s, status, n);
                }
                let low: Option<(i64, i64)> = conn
                    .prepare_cached(LOW_WATERMARK_SQL)?
                    .query_row([c], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                s.low_watermark_seq = low.map(|l| l.0);
                s.oldest_pending_created_at_ms = low.map(|l| l.1);
                // Each query stays inside one partial index (runnable, dead).
                let mut last: Option<ConsumerError> = None;
                for sql in [LAST_ERROR_RUNNABLE_SQL, LAST_ERROR_DEAD_SQL] {
                    let e = conn
                        .prepare_cached(sql)?
                        .query_row([c], |r| {
                            Ok(consumer_error(
                                r.get(0)?,
                                r.get(1)?,
                                r.get(2)?,
                                r.get(3)?,
                                r.get(4)?,
                                r.get(5)?,
                            ))
                        })
                        .optional()?;
                    last = latest_error(last, e);
                }
                s.last_error = last;
                out.push(s);
            }
            Ok(out)
        })
    }

    fn lag(&self, consumer: &str, within: Option<&CtxUri>) -> Result<ConsumerLag> {
        check_consumer(&self.config.index.outbox.consumers, consumer)?;
        let within = within.map(CtxUri::as_str);
        let now = self.clock.now_ms();
        self.read(|conn| {
            let limit = i64::try_from(LAG_SCAN_LIMIT + 1).unwrap_or(i64::MAX);
            let (examined, events, oldest): (i64, i64, Option<i64>) = conn
                .prepare_cached(LAG_SQL)?
                .query_row(params![consumer, within, limit], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            Ok(ConsumerLag {
                events: u64::try_from(events).unwrap_or(0),
                capped: u64::try_from(examined).unwrap_or(0) > LAG_SCAN_LIMIT,
                oldest_age_ms: oldest.map(|t| u64::try_from(now - t).unwrap_or(0)),
            })
        })
    }

    fn consumers(&self) -> Vec<String> {
        self.config.index.outbox.consumers.clone()
    }
}

#[cfg(test)]
mod tests {
    //! SQLite's own outbox tests; the backend-neutral ones run on every backend in
    //! `tests/integration/outbox_ops.rs`.

    use super::{
        CLAIM_SQL, LAG_SQL, LAST_ERROR_DEAD_SQL, LAST_ERROR_RUNNABLE_SQL, LOW_WATERMARK_SQL,
    };
    use crate::sqlite::SqliteStore;

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
        ] {
            let plan = store
                .read(|c| {
                    let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                    let nulls = std::iter::repeat_n(rusqlite::types::Null, stmt.parameter_count());
                    let rows = stmt
                        .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))?;
                    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("\n"))
                })
                .expect("explain");
            assert!(plan.contains(index), "{sql}\n{plan}");
        }
    }
}
