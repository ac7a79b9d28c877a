//! Leases handed off to background work ([`HoldStore`]) on PostgreSQL: the SQLite
//! backend's `holds` table and queries (`sqlite/holds.rs`).

use ce_core::{CtxUri, Millis};

use super::{PgStore, Tx, WriteKind};
use crate::error::Result;
use crate::model::{Hold, HoldStore};

/// Records a hold through the last journal sequence written so far in `tx`; it supersedes
/// any earlier hold on the same path (whose lease the writer took over).
pub(super) fn insert_hold_tx(
    tx: &mut Tx<'_>,
    id: &str,
    at: &CtxUri,
    lease: &str,
    now: Millis,
) -> Result<()> {
    tx.execute("DELETE FROM holds WHERE at = $1", &[&at.as_str()])?;
    tx.execute(
        "INSERT INTO holds (id, at, lease, through_seq, created_at)
         VALUES ($1, $2, $3, (SELECT coalesce(max(seq), 0) FROM events), $4)",
        &[&id, &at.as_str(), &lease, &now],
    )?;
    Ok(())
}

impl HoldStore for PgStore {
    fn holds(&self) -> Result<Vec<Hold>> {
        self.read(|tx| {
            tx.query(
                "SELECT id, at, lease, through_seq, created_at FROM holds ORDER BY created_at, id",
                &[],
            )?
            .iter()
            .map(|r| {
                let at: String = r.try_get(1)?;
                Ok(Hold {
                    id: r.try_get(0)?,
                    at: CtxUri::parse_stored(&at).map_err(ce_core::CoreError::from)?,
                    lease: r.try_get(2)?,
                    through_seq: r.try_get(3)?,
                    created_at_ms: r.try_get(4)?,
                })
            })
            .collect()
        })
    }

    fn first_open(&self, consumers: &[String]) -> Result<Option<i64>> {
        self.read(|tx| {
            Ok(tx
                .query_one(
                    "SELECT min(seq) FROM deliveries
                     WHERE consumer = ANY($1) AND status IN (0, 1, 2, 4)",
                    &[&consumers],
                )?
                .try_get(0)?)
        })
    }

    fn end_hold(&self, id: &str) -> Result<bool> {
        self.write(WriteKind::Source, |tx, _| {
            Ok(tx.execute("DELETE FROM holds WHERE id = $1", &[&id])? > 0)
        })
    }
}
