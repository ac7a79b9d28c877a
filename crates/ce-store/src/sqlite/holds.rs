//! Leases handed off to background work ([`HoldStore`]): a row per hold, ended once the
//! consumers have applied the write that recorded it.

use ce_core::{CtxUri, Millis};
use rusqlite::{Connection, params};

use super::SqliteStore;
use crate::error::Result;
use crate::model::{Hold, HoldStore};

/// Records a hold through the last journal sequence written so far in `tx`; it supersedes
/// any earlier hold on the same path (whose lease the writer took over).
pub(super) fn insert_hold_tx(
    tx: &Connection,
    id: &str,
    at: &CtxUri,
    lease: &str,
    now: Millis,
) -> Result<()> {
    tx.execute("DELETE FROM holds WHERE at = ?1", [at.as_str()])?;
    tx.execute(
        "INSERT INTO holds (id, at, lease, through_seq, created_at)
         VALUES (?1, ?2, ?3, (SELECT coalesce(max(seq), 0) FROM events), ?4)",
        params![id, at.as_str(), lease, now],
    )?;
    Ok(())
}

impl HoldStore for SqliteStore {
    fn holds(&self) -> Result<Vec<Hold>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, at, lease, through_seq, created_at FROM holds ORDER BY created_at, id",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })?;
            rows.map(|row| {
                let (id, at, lease, through_seq, created_at_ms) = row?;
                Ok(Hold {
                    id,
                    at: CtxUri::parse_stored(&at).map_err(ce_core::CoreError::from)?,
                    lease,
                    through_seq,
                    created_at_ms,
                })
            })
            .collect()
        })
    }

    fn first_open(&self, consumers: &[String]) -> Result<Option<i64>> {
        let consumers = serde_json::to_string(consumers)?;
        self.read(|c| {
            Ok(c.prepare_cached(
                "SELECT min(seq) FROM deliveries
                 WHERE consumer IN (SELECT value FROM json_each(?1)) AND status IN (0, 1, 2, 4)",
            )?
            .query_row(params![consumers], |r| r.get(0))?)
        })
    }

    fn end_hold(&self, id: &str) -> Result<bool> {
        self.write(super::Durability::Full, |tx, _| {
            Ok(tx.execute("DELETE FROM holds WHERE id = ?1", [id])? > 0)
        })
    }
}
