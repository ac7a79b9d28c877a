//! The outbox's row-level vocabulary both dialects share: stored status codes, column lists,
//! decoding of stored rows, a dead filter's parameters and the checks of an append.

use ce_core::config::OutboxConfig;
use ce_core::{
    Config, CoreError, Delivery, DeliveryStatus, EventPayload, EventType, Millis, OutboxEvent,
    OutboxEventCreate,
};

use crate::error::{Result, StoreError};
use crate::model::{ConsumerError, ConsumerStats, DeadFilter};
use crate::queue::{LeaseRow, Phase};

/// Stored delivery status `pending` ([`DeliveryStatus::as_i64`]).
pub(crate) const PENDING: i64 = 0;
/// Stored status `claimed`.
pub(crate) const CLAIMED: i64 = 1;
/// Stored status `retry_wait`.
pub(crate) const RETRY_WAIT: i64 = 2;
/// Stored status `done`.
pub(crate) const DONE: i64 = 3;
/// Stored status `dead` (`failed`, 4, is never at rest).
pub(crate) const DEAD: i64 = 5;

/// The columns of `events e` in the order [`decode_event`]'s callers read them.
pub(crate) const EVENT_COLUMNS: &str =
    "e.seq, e.event_id, e.event_type, e.uri, e.payload, e.created_at";
/// The columns of `deliveries d` in the order of [`StoredDelivery`]'s fields.
pub(crate) const DELIVERY_COLUMNS: &str = "d.consumer, d.seq, d.status, d.retry_count, \
     d.visible_at, d.claimed_by, d.claim_token, d.claimed_until, d.last_error, \
     d.error_code, d.updated_at";

/// The last error `force_done` records (SQL over the row's own columns, valid in both
/// dialects): the error the delivery died with, so it is told from an applied one.
pub(crate) const FORCED_DONE_LAST_ERROR_SQL: &str =
    "substr('forced done without applying (dead with '
        || coalesce(error_code, 'no code') || ': '
        || coalesce(last_error, '') || ')', 1, 4096)";

/// A new event id: unique and ordered by time.
pub(crate) fn new_event_id() -> String {
    format!("evt-{}", uuid::Uuid::now_v7().simple())
}

/// A claim's lease in milliseconds.
pub(crate) fn lease_ms(config: &Config) -> Millis {
    i64::from(config.index.worker.lease_seconds) * 1000
}

/// Refuses a consumer that is not configured.
pub(crate) fn check_consumer(configured: &[String], consumer: &str) -> Result<()> {
    if configured.iter().any(|c| c == consumer) {
        Ok(())
    } else {
        Err(StoreError::UnknownConsumer {
            name: consumer.to_owned(),
            configured: configured.to_vec(),
        })
    }
}

/// The payloads of an append for `consumers`: every consumer must be configured, there
/// must be one, and every payload must be valid. The journal never stores what it cannot
/// read back: one bad event would block every consumer at the head of its queue.
pub(crate) fn checked_payloads(
    configured: &[String],
    consumers: &[String],
    events: Vec<OutboxEventCreate>,
) -> Result<Vec<EventPayload>> {
    if let Some(c) = consumers.iter().find(|c| !configured.contains(c)) {
        return Err(StoreError::Core(CoreError::InvalidField {
            field: "consumer",
            reason: format!(
                "{c:?} is not a configured consumer (index.outbox.consumers: {configured:?})"
            ),
        }));
    }
    if consumers.is_empty() {
        return Err(StoreError::Core(CoreError::InvalidField {
            field: "consumer",
            reason: "an event needs at least one consumer".into(),
        }));
    }
    let payloads: Vec<EventPayload> = events.into_iter().map(|e| e.payload).collect();
    for p in &payloads {
        p.validate()?;
    }
    Ok(payloads)
}

/// Decodes a stored event; a payload that does not parse is corruption.
pub(crate) fn decode_event(
    seq: i64,
    event_id: String,
    event_type: &str,
    payload: &str,
    created_at_ms: Millis,
) -> Result<OutboxEvent> {
    let json: serde_json::Value = serde_json::from_str(payload)?;
    let payload = EventPayload::parse(event_type, &json)
        .map_err(|e| StoreError::Corrupt(format!("event {event_id}: {e}")))?;
    Ok(OutboxEvent {
        seq,
        event_type: payload.event_type(),
        uri: payload.uri().clone(),
        event_id,
        payload,
        created_at_ms,
    })
}

/// A `deliveries` row as stored ([`DELIVERY_COLUMNS`]).
#[derive(Debug)]
pub(crate) struct StoredDelivery {
    pub(crate) consumer: String,
    pub(crate) seq: i64,
    pub(crate) status: i64,
    pub(crate) retry_count: i64,
    pub(crate) visible_at: Option<Millis>,
    pub(crate) claimed_by: Option<String>,
    pub(crate) claim_token: Option<String>,
    pub(crate) claimed_until: Option<Millis>,
    pub(crate) last_error: Option<String>,
    pub(crate) error_code: Option<String>,
    pub(crate) updated_at: Millis,
}

impl StoredDelivery {
    /// The delivery; an unknown status is corruption. A claimed delivery's `visible_at`
    /// is its lease end, not a retry time, so it is not reported as one.
    pub(crate) fn decode(self) -> Result<Delivery> {
        let Some(status) = DeliveryStatus::from_i64(self.status) else {
            return Err(StoreError::Corrupt(format!(
                "delivery status {} is unknown",
                self.status
            )));
        };
        Ok(Delivery {
            consumer: self.consumer,
            seq: self.seq,
            status,
            retry_count: self.retry_count as u32,
            next_visible_at_ms: self
                .visible_at
                .filter(|_| status != DeliveryStatus::Claimed),
            claimed_by: self.claimed_by,
            claim_token: self.claim_token,
            claimed_until_ms: self.claimed_until,
            last_error: self.last_error,
            error_code: self.error_code,
            updated_at_ms: self.updated_at,
        })
    }
}

/// The fencing columns of the delivery a claim names, read (and on PostgreSQL locked)
/// in the transaction of the transition.
#[derive(Debug)]
pub(crate) struct FenceRow {
    pub(crate) status: i64,
    pub(crate) token: Option<String>,
    pub(crate) until: Option<Millis>,
    pub(crate) retry_count: i64,
}

impl FenceRow {
    /// The row as the queue state machine sees it.
    pub(crate) fn lease(&self) -> LeaseRow {
        let status = DeliveryStatus::from_i64(self.status);
        LeaseRow {
            phase: match status {
                Some(DeliveryStatus::Claimed) => Phase::Claimed,
                Some(DeliveryStatus::Done) => Phase::Done,
                Some(DeliveryStatus::Dead) => Phase::Dead,
                _ => Phase::Waiting,
            },
            status: status.map_or("unknown", DeliveryStatus::as_str),
            token: self.token.clone(),
            until: self.until,
            attempts: u32::try_from(self.retry_count).unwrap_or(u32::MAX),
        }
    }
}

/// The parameters 1 to 9 of a dead-delivery condition from a [`DeadParams`] `p`, with
/// `configured` the configured consumers as the dialect binds them.
macro_rules! dead_params {
    ($p:expr, $configured:expr) => {
        [
            &$p.consumer,
            &$p.error_code,
            &$p.min_seq,
            &$p.max_seq,
            &$p.exhausted_only,
            &$p.max_retries,
            &$p.event_type,
            &$p.subtree,
            $configured,
        ]
    };
}
pub(crate) use dead_params;

/// A [`DeadFilter`]'s values as the parameters of each backend's dead-delivery
/// condition, in its parameter order.
#[derive(Debug)]
pub(crate) struct DeadParams {
    /// Only this consumer.
    pub(crate) consumer: Option<String>,
    /// Only this error code.
    pub(crate) error_code: Option<String>,
    /// Lowest sequence (inclusive).
    pub(crate) min_seq: i64,
    /// Highest sequence (inclusive).
    pub(crate) max_seq: i64,
    /// Only deliveries with at least `max_retries` failures.
    pub(crate) exhausted_only: bool,
    /// `index.outbox.max_retries`.
    pub(crate) max_retries: i64,
    /// Only this event type.
    pub(crate) event_type: Option<&'static str>,
    /// Only events at or below this URI (`None` for no subtree or the root).
    pub(crate) subtree: Option<String>,
    /// The configured consumers (others' deliveries are never touched).
    pub(crate) configured: Vec<String>,
}

impl DeadParams {
    /// The parameters of `filter`; an unknown consumer is refused.
    pub(crate) fn new(filter: &DeadFilter, o: &OutboxConfig) -> Result<DeadParams> {
        if let Some(c) = &filter.consumer {
            check_consumer(&o.consumers, c)?;
        }
        Ok(DeadParams {
            consumer: filter.consumer.clone(),
            error_code: filter.error_code.clone(),
            min_seq: filter.min_seq.unwrap_or(i64::MIN),
            max_seq: filter.max_seq.unwrap_or(i64::MAX),
            exhausted_only: filter.exhausted_only,
            max_retries: i64::from(o.max_retries),
            event_type: filter.event_type.map(EventType::as_str),
            subtree: filter
                .subtree
                .as_ref()
                .filter(|u| !u.is_root())
                .map(|u| u.as_str().to_owned()),
            configured: o.consumers.clone(),
        })
    }
}

/// Adds `n` deliveries of stored status `status` to `s`.
pub(crate) fn count_status(s: &mut ConsumerStats, status: i64, n: i64) {
    let n = n as u64;
    match status {
        PENDING => s.pending = n,
        CLAIMED => s.claimed = n,
        RETRY_WAIT => s.retry_wait = n,
        DONE => s.done = n,
        DEAD => s.dead = n,
        _ => {}
    }
}

/// A recorded failure as `stats` reports it.
pub(crate) fn consumer_error(
    seq: i64,
    event_id: String,
    code: Option<String>,
    message: Option<String>,
    at_ms: Millis,
    status: i64,
) -> ConsumerError {
    ConsumerError {
        seq,
        event_id,
        code: code.unwrap_or_default(),
        message: message.unwrap_or_default(),
        at_ms,
        dead: status == DEAD,
    }
}

/// The more recent of two failures (by time, then sequence).
pub(crate) fn latest_error(
    last: Option<ConsumerError>,
    e: Option<ConsumerError>,
) -> Option<ConsumerError> {
    match (last, e) {
        (Some(l), Some(e)) if (e.at_ms, e.seq) > (l.at_ms, l.seq) => Some(e),
        (Some(l), _) => Some(l),
        (None, e) => e,
    }
}

#[cfg(test)]
mod tests {
    use ce_core::DeliveryStatus;

    use super::{CLAIMED, DEAD, DONE, PENDING, RETRY_WAIT};

    #[test]
    fn status_codes_are_the_core_ones() {
        for (code, status) in [
            (PENDING, DeliveryStatus::Pending),
            (CLAIMED, DeliveryStatus::Claimed),
            (RETRY_WAIT, DeliveryStatus::RetryWait),
            (DONE, DeliveryStatus::Done),
            (DEAD, DeliveryStatus::Dead),
        ] {
            assert_eq!(status.as_i64(), code, "{status:?}");
        }
    }
}
