//! The outbox written once (spec §3, DESIGN.md decision 3): every [`OutboxStore`] method over
//! the row primitives of an open transaction ([`OutboxReadTx`], [`OutboxTx`]), which each
//! backend implements with its own SQL and row mapping (`sqlite/outbox.rs`,
//! `postgres/outbox.rs`). Who may make a transition, where it leads and what a repair touches
//! is decided here, as `crate::txn` decides what a source write means; the queue's pure rules
//! (phases, the lease fence, backoff) come from `crate::queue`.
//!
//! - [`deliver`]: appends, claims and the fenced transitions (renew, done, failed)
//! - [`repair`]: dead deliveries counted, requeued or forced done
//! - [`report`]: list, show, stats and lag
//! - [`rows`]: stored status codes, column lists and decoding the dialects share
//!
//! A backend implements [`OutboxBackend`] (its transaction runners) and gets the public trait
//! from [`impl_outbox_store!`].
//!
//! [`OutboxStore`]: crate::model::OutboxStore

pub(crate) mod deliver;
pub(crate) mod journal;
pub(crate) mod repair;
pub(crate) mod report;
pub(crate) mod rows;

use ce_core::{Clock, Config, Delivery, EventPayload, Millis, OutboxEvent};

use self::rows::{DONE, DeadParams, FORCED_DONE_LAST_ERROR_SQL, FenceRow, PENDING};
use crate::error::Result;
use crate::model::{ConsumerError, DeliveryRow, FORCED_DONE_CODE, JournalExtent};

/// How a write transaction of the outbox commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// A journal write (append, consumer back-fill): ordered with the source writes and
    /// durable at commit.
    Journal,
    /// Delivery bookkeeping (claim, renew, done, failed): it replays safely, so a crash may
    /// roll it back (not synced at commit).
    Bookkeeping,
    /// A repair a human confirmed (requeue, force done): durable at commit.
    Repair,
}

/// A store's configuration and clock ([`impl_outbox_store!`] implements it from the store's
/// `config` and `clock` fields).
pub(crate) trait OutboxSettings {
    /// The store's configuration.
    fn outbox_config(&self) -> &Config;
    /// The store's clock.
    fn outbox_clock(&self) -> &dyn Clock;
}

/// The transaction runners of a backend, as the outbox uses them.
pub(crate) trait OutboxBackend: OutboxSettings {
    /// Runs `f` in one write transaction of kind `commit` with the time at which its locks
    /// were taken; commits when it returns `Ok`.
    fn write_outbox<T>(
        &self,
        commit: Commit,
        f: impl FnOnce(&mut dyn OutboxTx, Millis) -> Result<T>,
    ) -> Result<T>;
    /// Runs `f` in one read-only snapshot.
    fn read_outbox<T>(&self, f: impl FnOnce(&mut dyn OutboxReadTx) -> Result<T>) -> Result<T>;

    /// Refuses a consumer that is not configured.
    fn check_consumer(&self, consumer: &str) -> Result<()> {
        rows::check_consumer(&self.outbox_config().index.outbox.consumers, consumer)
    }
}

/// What `list` selects ([`crate::model::OutboxFilter`] with its defaults applied).
#[derive(Debug)]
pub(crate) struct ListQuery<'a> {
    /// Only this stored status.
    pub(crate) status: Option<i64>,
    /// Only this consumer.
    pub(crate) consumer: Option<&'a str>,
    /// Only this event type.
    pub(crate) event_type: Option<&'static str>,
    /// Rows after this sequence ...
    pub(crate) after_seq: i64,
    /// ... or after `(after_seq, after_consumer)` when set (consumers compare bytewise).
    pub(crate) after_consumer: Option<&'a str>,
    /// At most this many rows.
    pub(crate) limit: i64,
    /// The configured consumers (others' rows are never listed).
    pub(crate) configured: &'a [String],
}

/// What the lag scan read: among the consumer's oldest deliveries not applied yet (at most
/// the scan limit), how many there were, how many are in scope, and the oldest append time
/// of those.
#[derive(Debug)]
pub(crate) struct LagScan {
    /// Deliveries examined.
    pub(crate) examined: i64,
    /// Of those, the ones of events within the scope.
    pub(crate) in_scope: i64,
    /// The oldest append time among those in scope.
    pub(crate) oldest: Option<Millis>,
}

/// A claim of the first runnable deliveries of one consumer.
#[derive(Debug)]
pub(crate) struct ClaimRows<'a> {
    /// The consumer.
    pub(crate) consumer: &'a str,
    /// The claiming worker.
    pub(crate) worker_id: &'a str,
    /// The claim's fencing token.
    pub(crate) token: &'a str,
    /// Runnable at this time (visible, or lease over).
    pub(crate) now: Millis,
    /// The lease end.
    pub(crate) until: Millis,
    /// At most this many.
    pub(crate) limit: i64,
}

/// The new state of one delivery after a fenced transition; the claim (`claimed_by`,
/// `claim_token`) stays recorded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeliveryUpdate<'a> {
    /// The stored status.
    pub(crate) status: i64,
    /// The failures counted.
    pub(crate) retry_count: i64,
    /// When a pending or waiting delivery can be claimed, or a claimed one's lease end
    /// (`None` for a terminal one).
    pub(crate) visible_at: Option<Millis>,
    /// A new lease end (`None` keeps the recorded one).
    pub(crate) claimed_until: Option<Millis>,
    /// A new `(error_code, last_error)` (`None` keeps the recorded one).
    pub(crate) error: Option<(&'a str, &'a str)>,
}

/// What a repair does to the dead deliveries it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadChange {
    /// Back to pending, visible now, with a fresh retry budget (the last error is kept).
    Requeue,
    /// Done without applying: the error code becomes [`FORCED_DONE_CODE`] and the last
    /// error says what it died with.
    ForceDone,
}

impl DeadChange {
    /// The `SET` list of the change on `deliveries` (valid in both dialects), `now` being
    /// the placeholder of the time.
    pub(crate) fn set_sql(self, now: &str) -> String {
        match self {
            DeadChange::Requeue => format!(
                "status = {PENDING}, retry_count = 0, visible_at = {now}, updated_at = {now}"
            ),
            DeadChange::ForceDone => format!(
                "status = {DONE}, visible_at = NULL, updated_at = {now},
                 error_code = '{FORCED_DONE_CODE}', last_error = {FORCED_DONE_LAST_ERROR_SQL}"
            ),
        }
    }
}

/// The outbox's reads inside one transaction (one snapshot).
pub(crate) trait OutboxReadTx {
    /// The events `seqs` (sorted, distinct) in that order; a missing one is left out.
    fn events(&mut self, seqs: &[i64]) -> Result<Vec<OutboxEvent>>;
    /// The event whose id is `event_id` or whose sequence is `seq` (the first by sequence).
    fn event(&mut self, event_id: &str, seq: Option<i64>) -> Result<Option<OutboxEvent>>;
    /// Every delivery of event `seq`, by consumer (bytewise).
    fn deliveries(&mut self, seq: i64) -> Result<Vec<Delivery>>;
    /// The rows `q` selects with their events, by (sequence, consumer).
    fn list_rows(&mut self, q: &ListQuery<'_>) -> Result<Vec<DeliveryRow>>;
    /// `(stored status, count)` of each status other than done that `consumer` has
    /// deliveries in, read from the partial indexes of the runnable and the dead deliveries.
    fn open_status_counts(&mut self, consumer: &str) -> Result<Vec<(i64, i64)>>;
    /// How many deliveries of `consumer` are done: the maintained count
    /// ([`OutboxTx::add_done`]), never a count of the rows.
    fn done_count(&mut self, consumer: &str) -> Result<i64>;
    /// Whether `consumer` has a delivery pending or claimed (one probe of the runnable
    /// partial index; retry-wait deliveries are not counted).
    fn has_unfinished(&mut self, consumer: &str) -> Result<bool>;
    /// The oldest delivery of `consumer` not done or dead: its sequence and append time.
    fn low_watermark(&mut self, consumer: &str) -> Result<Option<(i64, Millis)>>;
    /// The most recent recorded failure among `consumer`'s runnable deliveries, or among its
    /// dead ones when `dead` (each query stays inside one partial index).
    fn last_error(&mut self, consumer: &str, dead: bool) -> Result<Option<ConsumerError>>;
    /// The lag scan of `consumer` over its oldest `limit` deliveries not applied yet, scoped
    /// to events on `within` or below it (every event when `None`).
    fn lag_scan(&mut self, consumer: &str, within: Option<&str>, limit: i64) -> Result<LagScan>;
    /// The consumer of each dead delivery `p` selects.
    fn dead_consumers(&mut self, p: &DeadParams) -> Result<Vec<String>>;
    /// The newest sequence `consumer` covers without a delivery row (0: none, or unknown):
    /// a missing delivery at or below it was done and pruned.
    fn through_seq(&mut self, consumer: &str) -> Result<i64>;
    /// When the journal's oldest event was appended (`None`: the journal is empty).
    fn oldest_event_at(&mut self) -> Result<Option<Millis>>;
    /// The consumers flagged for a rebuild, by name.
    fn flagged_rebuilds(&mut self) -> Result<Vec<String>>;
    /// The journal's extent: events held, the oldest and newest sequence, `pruned_through`.
    fn journal_extent(&mut self) -> Result<JournalExtent>;
}

/// The outbox's row writes inside one write transaction.
pub(crate) trait OutboxTx: OutboxReadTx {
    /// Appends `payloads` to the journal with a pending delivery per consumer of
    /// `consumers`; `targeted` marks events meant for those consumers only (not for every
    /// configured one), which a back-fill never hands to another consumer.
    fn append_events(
        &mut self,
        consumers: &[String],
        targeted: bool,
        payloads: Vec<EventPayload>,
        now: Millis,
    ) -> Result<Vec<OutboxEvent>>;
    /// Records `consumer` (a known one is left as it is) and returns the newest sequence it
    /// covers: its newest delivery, or its recorded `through_seq` when that is newer (its
    /// deliveries were pruned, or it was given a rebuild).
    fn add_consumer(&mut self, consumer: &str, now: Millis) -> Result<i64>;
    /// The newest untargeted event pruned from the journal (0: none).
    fn pruned_through(&mut self) -> Result<i64>;
    /// Gives `consumer` a pending delivery for every untargeted journal event after `after`;
    /// returns how many it got.
    fn back_fill(&mut self, consumer: &str, after: i64, now: Millis) -> Result<u64>;
    /// Flags `consumer` for a rebuild from the source and records it as covering the journal
    /// up to its newest event (the rebuild covers what the journal no longer holds).
    fn flag_rebuild(&mut self, consumer: &str) -> Result<()>;
    /// Clears `consumer`'s rebuild flag; whether it was set.
    fn clear_rebuild(&mut self, consumer: &str) -> Result<bool>;
    /// Deletes at most `limit` done deliveries last changed before `cutoff`; the consumer and
    /// sequence of each.
    fn prune_deliveries(&mut self, cutoff: Millis, limit: i64) -> Result<Vec<(String, i64)>>;
    /// Raises `consumer`'s `through_seq` to `seq` if it is lower.
    fn raise_through(&mut self, consumer: &str, seq: i64) -> Result<()>;
    /// Adds `delta` to `consumer`'s count of done deliveries: every write that makes a
    /// delivery done or deletes a done one calls it in its transaction, as its last
    /// statement (docs/store.md "Done counts").
    fn add_done(&mut self, consumer: &str, delta: i64) -> Result<()>;
    /// Deletes at most `limit` events appended before `cutoff` that no delivery of a known
    /// consumer refers to, never the newest event (its sequence is the journal's position:
    /// holds and knowledge-base items record it); the sequence of each and whether it was
    /// targeted.
    fn prune_events(&mut self, cutoff: Millis, limit: i64) -> Result<Vec<(i64, bool)>>;
    /// Raises the journal's `pruned_through` to `seq` if it is lower.
    fn raise_pruned_through(&mut self, seq: i64) -> Result<()>;
    /// Claims the first runnable deliveries `c` names; `(seq, retry_count)` of each.
    fn claim_rows(&mut self, c: &ClaimRows<'_>) -> Result<Vec<(i64, i64)>>;
    /// The fencing columns of one delivery, locked until the transaction ends.
    fn lock_delivery(&mut self, consumer: &str, seq: i64) -> Result<Option<FenceRow>>;
    /// Marks done each delivery of `consumer` in `claims` (sequence, token; sorted by
    /// sequence) whose claim is live at `now` — claimed, with that token, lease not over:
    /// the fence of [`crate::queue::fence`] — locking the rows in sequence order; the
    /// claims marked (sequence, token). The others are left as they are.
    fn done_live(
        &mut self,
        consumer: &str,
        claims: &[(i64, &str)],
        now: Millis,
    ) -> Result<Vec<(i64, String)>>;
    /// Writes the new state of one delivery.
    fn update_delivery(
        &mut self,
        consumer: &str,
        seq: i64,
        u: &DeliveryUpdate<'_>,
        now: Millis,
    ) -> Result<()>;
    /// Requeues the dead deliveries of `consumer` (every consumer when `None`) with a
    /// sequence in `seqs` (any when `None`); returns how many.
    fn requeue_dead(
        &mut self,
        consumer: Option<&str>,
        seqs: Option<&[i64]>,
        now: Millis,
    ) -> Result<u64>;
    /// Applies `change` to the dead deliveries `p` selects; the consumer of each.
    fn change_dead(
        &mut self,
        p: &DeadParams,
        change: DeadChange,
        now: Millis,
    ) -> Result<Vec<String>>;
}

/// Implements [`crate::model::OutboxStore`] (and [`OutboxSettings`]) for a store that
/// implements [`OutboxBackend`] and has `config` and `clock` fields.
macro_rules! impl_outbox_store {
    ($store:ty) => {
        impl $crate::outbox::OutboxSettings for $store {
            fn outbox_config(&self) -> &ce_core::Config {
                &self.config
            }

            fn outbox_clock(&self) -> &dyn ce_core::Clock {
                self.clock.as_ref()
            }
        }

        impl $crate::model::OutboxStore for $store {
            fn append_batch_for(
                &self,
                consumers: &[String],
                events: Vec<ce_core::OutboxEventCreate>,
            ) -> $crate::Result<Vec<ce_core::OutboxEvent>> {
                $crate::outbox::deliver::append_batch_for(self, consumers, events)
            }

            fn claim_batch(
                &self,
                consumer: &str,
                worker_id: &str,
                limit: usize,
            ) -> $crate::Result<Vec<$crate::model::ClaimedEvent>> {
                $crate::outbox::deliver::claim_batch(self, consumer, worker_id, limit)
            }

            fn renew(&self, claim: &$crate::model::Claim) -> $crate::Result<ce_core::Millis> {
                $crate::outbox::deliver::renew(self, claim)
            }

            fn mark_done(&self, claim: &$crate::model::Claim) -> $crate::Result<()> {
                $crate::outbox::deliver::mark_done(self, claim)
            }

            fn mark_done_batch(
                &self,
                claims: &[$crate::model::Claim],
            ) -> $crate::Result<Vec<$crate::Result<()>>> {
                $crate::outbox::deliver::mark_done_batch(self, claims)
            }

            fn mark_failed(
                &self,
                claim: &$crate::model::Claim,
                failure: &$crate::model::Failure<'_>,
            ) -> $crate::Result<ce_core::DeliveryStatus> {
                $crate::outbox::deliver::mark_failed(self, claim, failure)
            }

            fn requeue_dead(
                &self,
                consumer: Option<&str>,
                seqs: Option<&[i64]>,
            ) -> $crate::Result<u64> {
                $crate::outbox::repair::requeue_dead(self, consumer, seqs)
            }

            fn count_dead(
                &self,
                filter: &$crate::model::DeadFilter,
            ) -> $crate::Result<$crate::model::DeadCounts> {
                $crate::outbox::repair::count_dead(self, filter)
            }

            fn requeue_dead_matching(
                &self,
                filter: &$crate::model::DeadFilter,
            ) -> $crate::Result<$crate::model::DeadCounts> {
                $crate::outbox::repair::change_dead(
                    self,
                    filter,
                    $crate::outbox::DeadChange::Requeue,
                )
            }

            fn force_done(
                &self,
                filter: &$crate::model::DeadFilter,
            ) -> $crate::Result<$crate::model::DeadCounts> {
                $crate::outbox::repair::change_dead(
                    self,
                    filter,
                    $crate::outbox::DeadChange::ForceDone,
                )
            }

            fn list(
                &self,
                filter: &$crate::model::OutboxFilter,
            ) -> $crate::Result<Vec<$crate::model::DeliveryRow>> {
                $crate::outbox::report::list(self, filter)
            }

            fn show(
                &self,
                event_id: &str,
            ) -> $crate::Result<(ce_core::OutboxEvent, Vec<ce_core::Delivery>)> {
                $crate::outbox::report::show(self, event_id)
            }

            fn stats(&self) -> $crate::Result<Vec<$crate::model::ConsumerStats>> {
                $crate::outbox::report::stats(self)
            }

            fn has_unfinished(&self, consumers: &[String]) -> $crate::Result<bool> {
                $crate::outbox::report::has_unfinished(self, consumers)
            }

            fn lag(
                &self,
                consumer: &str,
                within: Option<&ce_core::CtxUri>,
            ) -> $crate::Result<$crate::model::ConsumerLag> {
                $crate::outbox::report::lag(self, consumer, within)
            }

            fn prune_journal(
                &self,
                retain_ms: ce_core::Millis,
                chunk: usize,
            ) -> $crate::Result<$crate::model::JournalPruned> {
                $crate::outbox::journal::prune(self, retain_ms, chunk)
            }

            fn journal(&self) -> $crate::Result<$crate::model::JournalExtent> {
                $crate::outbox::OutboxBackend::read_outbox(self, |tx| tx.journal_extent())
            }

            fn rebuilds_needed(&self) -> $crate::Result<Vec<String>> {
                $crate::outbox::OutboxBackend::read_outbox(self, |tx| tx.flagged_rebuilds())
            }

            fn rebuild_queued(&self, consumer: &str) -> $crate::Result<bool> {
                $crate::outbox::journal::rebuild_queued(self, consumer)
            }

            fn consumers(&self) -> Vec<String> {
                $crate::outbox::OutboxSettings::outbox_config(self)
                    .index
                    .outbox
                    .consumers
                    .clone()
            }
        }
    };
}
pub(crate) use impl_outbox_store;
