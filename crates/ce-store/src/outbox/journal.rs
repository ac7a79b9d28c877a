//! Journal retention (docs/store.md "Journal retention"): pruning what every consumer has
//! applied, and what a consumer gets when it needs events the journal no longer holds — a
//! rebuild from the source instead of a back-fill.
//!
//! Two positions keep back-fill exact once rows are gone: each consumer's `through_seq`
//! (the newest sequence it covers without a delivery row to show it) and the journal's
//! `pruned_through` (the newest untargeted event pruned). A consumer covered every event up
//! to its start `max(newest delivery, through_seq)`; an untargeted event after that start
//! was appended while it was not configured, and back-fill hands it over — unless such an
//! event is pruned (`start < pruned_through`), and then only a rebuild restores the index.

use std::collections::BTreeMap;

use ce_core::Millis;

use super::{Commit, OutboxBackend, OutboxTx};
use crate::error::Result;
use crate::model::JournalPruned;

/// Records every configured consumer and back-fills it from the journal: a consumer seen for
/// the first time, or switched back on after a gap, gets a pending delivery for every
/// untargeted event after the newest one it covers (an index seek when there is nothing to
/// add) — or, when the journal pruned some of those, a rebuild flag instead
/// ([`crate::model::OutboxStore::rebuilds_needed`]).
pub(crate) fn register_consumers(s: &impl OutboxBackend) -> Result<()> {
    let configured = &s.outbox_config().index.outbox.consumers;
    s.write_outbox(Commit::Journal, |tx, now| {
        let pruned = tx.pruned_through()?;
        for c in configured {
            register(tx, c, pruned, now)?;
        }
        Ok(())
    })
}

fn register(tx: &mut dyn OutboxTx, consumer: &str, pruned: i64, now: Millis) -> Result<()> {
    let start = tx.add_consumer(consumer, now)?;
    if start < pruned {
        tracing::warn!(
            consumer,
            covered_through = start,
            pruned_through = pruned,
            "the journal no longer holds events this consumer missed: its index is to be rebuilt from the source"
        );
        tx.flag_rebuild(consumer)
    } else {
        tx.back_fill(consumer, start, now).map(drop)
    }
}

/// [`crate::model::OutboxStore::prune_journal`].
pub(crate) fn prune(
    s: &impl OutboxBackend,
    retain_ms: Millis,
    chunk: usize,
) -> Result<JournalPruned> {
    let limit = i64::try_from(chunk.max(1)).unwrap_or(i64::MAX);
    let mut total = JournalPruned::default();
    // One cutoff for every chunk of this prune.
    let cutoff = s.outbox_clock().now_ms().saturating_sub(retain_ms.max(0));
    // Nothing can go while the oldest event is younger than the retention (a done delivery
    // is never older than its event): one key lookup instead of the scans below.
    if s.read_outbox(|tx| tx.oldest_event_at())?
        .is_none_or(|at| at >= cutoff)
    {
        return Ok(total);
    }
    loop {
        let step = s.write_outbox(Commit::Bookkeeping, |tx, _| prune_step(tx, cutoff, limit))?;
        total.deliveries += step.deliveries;
        total.events += step.events;
        if step.deliveries < limit as u64 && step.events < limit as u64 {
            return Ok(total);
        }
    }
}

/// One transaction: done deliveries first (each consumer's `through_seq` raised to the
/// newest of its own removed), then the events left without deliveries.
fn prune_step(tx: &mut dyn OutboxTx, cutoff: Millis, limit: i64) -> Result<JournalPruned> {
    // Read first: on PostgreSQL this locks the journal row, so a registration's back-fill
    // (which reads it first too) never reads an event this step deletes.
    tx.pruned_through()?;
    let removed = tx.prune_deliveries(cutoff, limit)?;
    // Per consumer: the newest sequence pruned, and how many done deliveries went.
    let mut pruned: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (consumer, seq) in &removed {
        let (newest, n) = pruned.entry(consumer).or_insert((*seq, 0));
        *newest = (*newest).max(*seq);
        *n += 1;
    }
    for (consumer, (newest, _)) in &pruned {
        tx.raise_through(consumer, *newest)?;
    }
    let events = tx.prune_events(cutoff, limit)?;
    if let Some(seq) = events
        .iter()
        .filter(|(_, targeted)| !targeted)
        .map(|(s, _)| *s)
        .max()
    {
        tx.raise_pruned_through(seq)?;
    }
    for (consumer, (_, n)) in pruned {
        tx.add_done(consumer, -n)?;
    }
    Ok(JournalPruned {
        deliveries: removed.len() as u64,
        events: events.len() as u64,
    })
}

/// [`crate::model::OutboxStore::rebuild_queued`].
pub(crate) fn rebuild_queued(s: &impl OutboxBackend, consumer: &str) -> Result<bool> {
    s.write_outbox(Commit::Journal, |tx, _| tx.clear_rebuild(consumer))
}
