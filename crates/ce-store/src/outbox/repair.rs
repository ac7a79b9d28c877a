//! Dead deliveries repaired by an operator (spec §8.3): counted, requeued with a fresh retry
//! budget, or forced done without applying. Only `dead` deliveries of configured consumers
//! move, each repair in one durable transaction.

use super::rows::DeadParams;
use super::{Commit, DeadChange, OutboxBackend};
use crate::error::Result;
use crate::model::{DeadCounts, DeadFilter};

/// [`crate::model::OutboxStore::requeue_dead`].
pub(crate) fn requeue_dead(
    s: &impl OutboxBackend,
    consumer: Option<&str>,
    seqs: Option<&[i64]>,
) -> Result<u64> {
    if let Some(c) = consumer {
        s.check_consumer(c)?;
    }
    s.write_outbox(Commit::Repair, |tx, now| {
        tx.requeue_dead(consumer, seqs, now)
    })
}

/// [`crate::model::OutboxStore::count_dead`]: a read snapshot, nothing changes.
pub(crate) fn count_dead(s: &impl OutboxBackend, filter: &DeadFilter) -> Result<DeadCounts> {
    let p = DeadParams::new(filter, &s.outbox_config().index.outbox)?;
    Ok(per_consumer(s.read_outbox(|tx| tx.dead_consumers(&p))?))
}

/// [`crate::model::OutboxStore::requeue_dead_matching`] and
/// [`crate::model::OutboxStore::force_done`]: `change` for the dead deliveries `filter`
/// selects.
pub(crate) fn change_dead(
    s: &impl OutboxBackend,
    filter: &DeadFilter,
    change: DeadChange,
) -> Result<DeadCounts> {
    let p = DeadParams::new(filter, &s.outbox_config().index.outbox)?;
    let changed = s.write_outbox(Commit::Repair, |tx, now| {
        let changed = per_consumer(tx.change_dead(&p, change, now)?);
        if change == DeadChange::ForceDone {
            for (consumer, n) in &changed {
                tx.add_done(consumer, *n as i64)?;
            }
        }
        Ok(changed)
    })?;
    Ok(changed)
}

/// Counts the consumers of the rows a repair selected.
fn per_consumer(consumers: Vec<String>) -> DeadCounts {
    let mut counts = DeadCounts::new();
    for c in consumers {
        *counts.entry(c).or_default() += 1;
    }
    counts
}
