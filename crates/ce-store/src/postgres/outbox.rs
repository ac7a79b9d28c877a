//! The outbox on PostgreSQL (being ported from `sqlite/outbox.rs`).

use super::PgStore;
use crate::error::Result;
use crate::model::{
    Claim, ClaimedEvent, ConsumerStats, DeadCounts, DeadFilter, DeliveryRow, OutboxFilter,
    OutboxStore,
};
use ce_core::{Delivery, EventPayload, Millis, OutboxEvent, OutboxEventCreate};

/// Appends `payloads` to the journal inside `tx`, with a pending delivery per consumer.
pub(super) fn append_events_tx(
    _tx: &mut super::Tx<'_>,
    _consumers: &[String],
    _payloads: Vec<EventPayload>,
    _now: Millis,
) -> Result<Vec<OutboxEvent>> {
    unimplemented!()
}

impl PgStore {
    pub(super) fn register_consumers(&self) -> Result<()> {
        Ok(())
    }
}

impl OutboxStore for PgStore {
    fn append(&self, _event: OutboxEventCreate) -> Result<OutboxEvent> {
        unimplemented!()
    }
    fn append_batch(&self, _events: Vec<OutboxEventCreate>) -> Result<Vec<OutboxEvent>> {
        unimplemented!()
    }
    fn append_batch_for(
        &self,
        _consumers: &[String],
        _events: Vec<OutboxEventCreate>,
    ) -> Result<Vec<OutboxEvent>> {
        unimplemented!()
    }
    fn claim_batch(
        &self,
        _consumer: &str,
        _worker_id: &str,
        _limit: usize,
    ) -> Result<Vec<ClaimedEvent>> {
        unimplemented!()
    }
    fn renew(&self, _claim: &Claim) -> Result<Millis> {
        unimplemented!()
    }
    fn mark_done(&self, _claim: &Claim) -> Result<()> {
        unimplemented!()
    }
    fn mark_done_batch(&self, _claims: &[Claim]) -> Result<Vec<Result<()>>> {
        unimplemented!()
    }
    fn mark_failed(
        &self,
        _claim: &Claim,
        _error: &str,
        _error_code: &str,
        _retryable: bool,
    ) -> Result<ce_core::DeliveryStatus> {
        unimplemented!()
    }
    fn requeue_dead(&self, _consumer: Option<&str>, _seqs: Option<&[i64]>) -> Result<u64> {
        unimplemented!()
    }
    fn count_dead(&self, _filter: &DeadFilter) -> Result<DeadCounts> {
        unimplemented!()
    }
    fn requeue_dead_matching(&self, _filter: &DeadFilter) -> Result<DeadCounts> {
        unimplemented!()
    }
    fn force_done(&self, _filter: &DeadFilter) -> Result<DeadCounts> {
        unimplemented!()
    }
    fn list(&self, _filter: &OutboxFilter) -> Result<Vec<DeliveryRow>> {
        unimplemented!()
    }
    fn show(&self, _event_id: &str) -> Result<(OutboxEvent, Vec<Delivery>)> {
        unimplemented!()
    }
    fn stats(&self) -> Result<Vec<ConsumerStats>> {
        unimplemented!()
    }
    fn consumers(&self) -> Vec<String> {
        self.config.index.outbox.consumers.clone()
    }
}
