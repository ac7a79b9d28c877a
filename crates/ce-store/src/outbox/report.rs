//! What the outbox reports: deliveries listed, one event shown, counts per consumer and lag.

use ce_core::{CtxUri, Delivery, DeliveryStatus, EventType, OutboxEvent};

use super::rows::{DONE, count_status, latest_error};
use super::{ListQuery, OutboxBackend};
use crate::error::{Result, StoreError};
use crate::model::{ConsumerLag, ConsumerStats, DeliveryRow, LAG_SCAN_LIMIT, OutboxFilter};

/// Rows a `list` without a limit returns.
const DEFAULT_LIST_LIMIT: u32 = 100;

/// [`crate::model::OutboxStore::list`].
pub(crate) fn list(s: &impl OutboxBackend, filter: &OutboxFilter) -> Result<Vec<DeliveryRow>> {
    let configured = &s.outbox_config().index.outbox.consumers;
    if let Some(c) = &filter.consumer {
        s.check_consumer(c)?;
    }
    let q = ListQuery {
        status: filter.status.map(DeliveryStatus::as_i64),
        consumer: filter.consumer.as_deref(),
        event_type: filter.event_type.map(EventType::as_str),
        after_seq: filter.after_seq.unwrap_or(0),
        after_consumer: filter.after_consumer.as_deref(),
        limit: i64::from(filter.limit.unwrap_or(DEFAULT_LIST_LIMIT)),
        configured,
    };
    s.read_outbox(|tx| tx.list_rows(&q))
}

/// [`crate::model::OutboxStore::show`]: by event id, else by sequence number.
pub(crate) fn show(s: &impl OutboxBackend, event_id: &str) -> Result<(OutboxEvent, Vec<Delivery>)> {
    let by_seq = event_id.parse::<i64>().ok();
    s.read_outbox(|tx| {
        let event = tx
            .event(event_id, by_seq)?
            .ok_or_else(|| StoreError::EventNotFound {
                event_id: event_id.to_owned(),
            })?;
        let deliveries = tx.deliveries(event.seq)?;
        Ok((event, deliveries))
    })
}

/// [`crate::model::OutboxStore::stats`]: one snapshot for every configured consumer.
pub(crate) fn stats(s: &impl OutboxBackend) -> Result<Vec<ConsumerStats>> {
    let configured = &s.outbox_config().index.outbox.consumers;
    s.read_outbox(|tx| {
        let mut out = Vec::with_capacity(configured.len());
        for c in configured {
            let mut stats = ConsumerStats {
                consumer: c.clone(),
                ..ConsumerStats::default()
            };
            for (status, n) in tx.open_status_counts(c)? {
                count_status(&mut stats, status, n);
            }
            count_status(&mut stats, DONE, tx.done_count(c)?);
            if let Some((seq, created_at)) = tx.low_watermark(c)? {
                stats.low_watermark_seq = Some(seq);
                stats.oldest_pending_created_at_ms = Some(created_at);
            }
            let runnable = tx.last_error(c, false)?;
            stats.last_error = latest_error(runnable, tx.last_error(c, true)?);
            out.push(stats);
        }
        Ok(out)
    })
}

/// [`crate::model::OutboxStore::has_unfinished`].
pub(crate) fn has_unfinished(s: &impl OutboxBackend, consumers: &[String]) -> Result<bool> {
    s.read_outbox(|tx| {
        for c in consumers {
            if tx.has_unfinished(c)? {
                return Ok(true);
            }
        }
        Ok(false)
    })
}

/// [`crate::model::OutboxStore::lag`]: one bounded scan of the oldest deliveries not applied.
pub(crate) fn lag(
    s: &impl OutboxBackend,
    consumer: &str,
    within: Option<&CtxUri>,
) -> Result<ConsumerLag> {
    s.check_consumer(consumer)?;
    let within = within.map(CtxUri::as_str);
    let now = s.outbox_clock().now_ms();
    let limit = i64::try_from(LAG_SCAN_LIMIT + 1).unwrap_or(i64::MAX);
    let scan = s.read_outbox(|tx| tx.lag_scan(consumer, within, limit))?;
    Ok(ConsumerLag {
        events: u64::try_from(scan.in_scope).unwrap_or(0),
        capped: u64::try_from(scan.examined).unwrap_or(0) > LAG_SCAN_LIMIT,
        oldest_age_ms: scan.oldest.map(|t| u64::try_from(now - t).unwrap_or(0)),
    })
}
