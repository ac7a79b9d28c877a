//! Which index instance owns each embedded consumer, and the release of claims a crashed
//! predecessor left ([`OwnerStore`]).

use rusqlite::params;

use super::{Durability, SqliteStore};
use crate::error::Result;
use crate::model::{IndexOwner, OwnerStore};
use crate::outbox::OutboxBackend as _;

impl OwnerStore for SqliteStore {
    fn claim_owner(&self, consumer: &str, me: &IndexOwner, take_over: bool) -> Result<IndexOwner> {
        self.check_consumer(consumer)?;
        self.write(Durability::Full, |tx, now| {
            tx.execute(
                "INSERT INTO index_owners (consumer, instance, host, data_dir, since)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (consumer) DO UPDATE SET instance = excluded.instance,
                    host = excluded.host, data_dir = excluded.data_dir,
                    since = CASE WHEN instance = excluded.instance THEN since
                                 ELSE excluded.since END
                 WHERE ?6 OR instance = excluded.instance",
                params![consumer, me.instance, me.host, me.data_dir, now, take_over],
            )?;
            Ok(tx.query_row(
                "SELECT instance, host, data_dir, since FROM index_owners WHERE consumer = ?1",
                [consumer],
                |r| {
                    Ok(IndexOwner {
                        instance: r.get(0)?,
                        host: r.get(1)?,
                        data_dir: r.get(2)?,
                        since_ms: r.get(3)?,
                    })
                },
            )?)
        })
    }

    fn expire_claims(&self, consumer: &str) -> Result<u64> {
        self.check_consumer(consumer)?;
        self.write(Durability::Full, |tx, now| {
            let n = tx.execute(
                "UPDATE deliveries SET claimed_until = ?2, visible_at = ?2, updated_at = ?2
                 WHERE consumer = ?1 AND status = 1 AND visible_at > ?2",
                params![consumer, now],
            )?;
            Ok(n as u64)
        })
    }
}
