//! The delivery state machine (spec §3.2–§3.4): appends create pending deliveries, a claim
//! takes the first runnable ones of a consumer under one fresh token, and every later
//! transition (renew, done, failed) is fenced by that token and the lease.
//!
//! A fenced transition locks its delivery row first and judges the lease by the clock read
//! once the lock is held, so a concurrent claim of the row either committed before (its
//! token is seen) or waits for this transaction (PostgreSQL; SQLite's single writer holds
//! the lock already).

use std::collections::BTreeMap;

use ce_core::{Clock, DeliveryStatus, Millis, OutboxEvent, OutboxEventCreate, failpoint};

use super::rows::{CLAIMED, DONE, FenceRow, checked_payloads, lease_ms};
use super::{ClaimRows, Commit, DeliveryUpdate, OutboxBackend, OutboxTx};
use crate::error::{Result, StoreError};
use crate::model::{Claim, ClaimedEvent, Failure};
use crate::queue::{self, AfterFailure, Lost, RetryPolicy, new_claim_token, stored_error};

/// [`crate::model::OutboxStore::append_batch_for`].
pub(crate) fn append_batch_for(
    s: &impl OutboxBackend,
    consumers: &[String],
    events: Vec<OutboxEventCreate>,
) -> Result<Vec<OutboxEvent>> {
    let configured = &s.outbox_config().index.outbox.consumers;
    let payloads = checked_payloads(configured, consumers, events)?;
    let targeted = !configured.iter().all(|c| consumers.contains(c));
    s.write_outbox(Commit::Journal, |tx, now| {
        tx.append_events(consumers, targeted, payloads, now)
    })
}

/// [`crate::model::OutboxStore::claim_batch`]: one transaction, one token for the batch.
pub(crate) fn claim_batch(
    s: &impl OutboxBackend,
    consumer: &str,
    worker_id: &str,
    limit: usize,
) -> Result<Vec<ClaimedEvent>> {
    s.check_consumer(consumer)?;
    if limit == 0 {
        return Ok(Vec::new());
    }
    let lease = lease_ms(s.outbox_config());
    let token = new_claim_token();
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let claimed = s.write_outbox(Commit::Bookkeeping, |tx, now| {
        let until = now + lease;
        let mut rows = tx.claim_rows(&ClaimRows {
            consumer,
            worker_id,
            token: &token,
            now,
            until,
            limit,
        })?;
        rows.sort_unstable();
        let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let events = tx.events(&seqs)?;
        if events.len() != seqs.len() {
            return Err(StoreError::Corrupt(format!(
                "{} of the claimed deliveries have no event",
                seqs.len() - events.len()
            )));
        }
        Ok(events
            .into_iter()
            .zip(rows)
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
                retry_count: u32::try_from(retry_count).unwrap_or(u32::MAX),
            })
            .collect::<Vec<_>>())
    })?;
    if !claimed.is_empty() {
        failpoint::hit("outbox.after_claim");
    }
    Ok(claimed)
}

/// Locks the delivery `claim` names and judges the claim ([`queue::fence`]) at the time
/// read once the lock is held: `Some(retry_count)` for the live claim, `None` for a delivery
/// already done when `done_is_ok`, else `EventNotFound` or a `ClaimConflict` that says what
/// the delivery's state is; and that time.
fn lock_and_fence(
    tx: &mut dyn OutboxTx,
    clock: &dyn Clock,
    claim: &Claim,
    done_is_ok: bool,
) -> Result<(Option<u32>, Millis)> {
    let row = tx.lock_delivery(&claim.consumer, claim.seq)?;
    let now = clock.now_ms();
    let lease = row.as_ref().map(FenceRow::lease);
    // A delivery the journal pruned was done: it answers as a done one does.
    if lease.is_none() && claim.seq <= tx.through_seq(&claim.consumer)? {
        if done_is_ok {
            return Ok((None, now));
        }
        return Err(StoreError::ClaimConflict {
            event_id: claim.event_id.clone(),
            consumer: claim.consumer.clone(),
            state: "status is done (pruned from the journal)".to_owned(),
        });
    }
    let fenced =
        queue::fence(lease.as_ref(), &claim.token, now, done_is_ok).map_err(|lost| match lost {
            Lost::Missing => StoreError::EventNotFound {
                event_id: claim.event_id.clone(),
            },
            Lost::Conflict(state) => StoreError::ClaimConflict {
                event_id: claim.event_id.clone(),
                consumer: claim.consumer.clone(),
                state,
            },
        })?;
    Ok((fenced, now))
}

/// The retry count of the live claim (a fence that refuses done deliveries never answers
/// `None`: that would be a broken invariant).
fn live(fenced: Option<u32>, what: &str) -> Result<u32> {
    fenced.ok_or_else(|| StoreError::Corrupt(format!("{what} of a done delivery")))
}

/// [`crate::model::OutboxStore::renew`]: the live claim's lease ends a lease from now.
pub(crate) fn renew(s: &impl OutboxBackend, claim: &Claim) -> Result<Millis> {
    let lease = lease_ms(s.outbox_config());
    s.write_outbox(Commit::Bookkeeping, |tx, _| {
        let (fenced, now) = lock_and_fence(tx, s.outbox_clock(), claim, false)?;
        let retry_count = live(fenced, "renew")?;
        let until = now + lease;
        let renewed = DeliveryUpdate {
            status: CLAIMED,
            retry_count: i64::from(retry_count),
            visible_at: Some(until),
            claimed_until: Some(until),
            error: None,
        };
        tx.update_delivery(&claim.consumer, claim.seq, &renewed, now)?;
        Ok(until)
    })
}

/// Marks the delivery of `claim` done inside `tx`; whether it became done now (a done one
/// stays as it is). The caller counts it ([`OutboxTx::add_done`]).
fn fence_done(tx: &mut dyn OutboxTx, clock: &dyn Clock, claim: &Claim) -> Result<bool> {
    let (fenced, now) = lock_and_fence(tx, clock, claim, true)?;
    let Some(retry_count) = fenced else {
        return Ok(false);
    };
    let applied = DeliveryUpdate {
        status: DONE,
        retry_count: i64::from(retry_count),
        visible_at: None,
        claimed_until: None,
        error: None,
    };
    tx.update_delivery(&claim.consumer, claim.seq, &applied, now)?;
    Ok(true)
}

/// [`crate::model::OutboxStore::mark_done`]: repeating it on a done delivery succeeds.
pub(crate) fn mark_done(s: &impl OutboxBackend, claim: &Claim) -> Result<()> {
    s.write_outbox(Commit::Bookkeeping, |tx, _| {
        if fence_done(tx, s.outbox_clock(), claim)? {
            tx.add_done(&claim.consumer, 1)?;
        }
        Ok(())
    })
}

/// [`crate::model::OutboxStore::mark_done_batch`]: one transaction, one answer per claim.
/// Rows are locked in key order (stable, so repeated claims of one delivery keep their
/// order), so batches that share rows cannot deadlock.
///
/// The live claims of each consumer are marked in one set-wise step ([`OutboxTx::done_live`]:
/// on PostgreSQL one statement for the batch instead of a lock and an update per delivery);
/// only the claims it did not mark (already done, lost, missing, or one delivery claimed
/// twice in the batch) go through the one-by-one fence, which tells those apart.
pub(crate) fn mark_done_batch(s: &impl OutboxBackend, claims: &[Claim]) -> Result<Vec<Result<()>>> {
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by(|&a, &b| {
        (&claims[a].consumer, claims[a].seq).cmp(&(&claims[b].consumer, claims[b].seq))
    });
    s.write_outbox(Commit::Bookkeeping, |tx, _| {
        let now = s.outbox_clock().now_ms();
        let mut marked = vec![false; claims.len()];
        // Per consumer, the deliveries this transaction made done: counted last, in
        // consumer order (the counts' rows are each transaction's last locks).
        let mut counted: BTreeMap<&str, i64> = BTreeMap::new();
        for group in order.chunk_by(|&a, &b| claims[a].consumer == claims[b].consumer) {
            // A delivery claimed more than once in the batch is answered claim by claim, in
            // the given order (the first live one marks it, a stale one before it is lost).
            let once: Vec<usize> = group
                .chunk_by(|&a, &b| claims[a].seq == claims[b].seq)
                .filter_map(|same| (same.len() == 1).then_some(same[0]))
                .collect();
            let live: Vec<(i64, &str)> = once
                .iter()
                .map(|&i| (claims[i].seq, claims[i].token.as_str()))
                .collect();
            let consumer = claims[group[0]].consumer.as_str();
            let mut done_now = tx.done_live(consumer, &live, now)?;
            *counted.entry(consumer).or_default() += done_now.len() as i64;
            done_now.sort_unstable();
            for &i in &once {
                marked[i] = done_now
                    .binary_search_by_key(&claims[i].seq, |(seq, _)| *seq)
                    .is_ok_and(|at| done_now[at].1 == claims[i].token);
            }
        }
        let mut out: Vec<(usize, Result<()>)> = Vec::with_capacity(claims.len());
        for i in order {
            if marked[i] {
                out.push((i, Ok(())));
                continue;
            }
            match fence_done(tx, s.outbox_clock(), &claims[i]) {
                Ok(now_done) => {
                    if now_done {
                        *counted.entry(claims[i].consumer.as_str()).or_default() += 1;
                    }
                    out.push((i, Ok(())));
                }
                // A lost claim does not stop the others.
                Err(e @ (StoreError::ClaimConflict { .. } | StoreError::EventNotFound { .. })) => {
                    out.push((i, Err(e)));
                }
                Err(e) => return Err(e),
            }
        }
        for (consumer, n) in counted {
            if n > 0 {
                tx.add_done(consumer, n)?;
            }
        }
        out.sort_by_key(|(i, _)| *i);
        Ok(out.into_iter().map(|(_, r)| r).collect())
    })
}

/// [`crate::model::OutboxStore::mark_failed`]: `retry_wait` after a jittered backoff, or
/// `dead` (spec §3.3); the error is recorded either way.
pub(crate) fn mark_failed(
    s: &impl OutboxBackend,
    claim: &Claim,
    failure: &Failure<'_>,
) -> Result<DeliveryStatus> {
    let policy = RetryPolicy::from(&s.outbox_config().index.outbox);
    let message = stored_error(failure.message);
    s.write_outbox(Commit::Bookkeeping, |tx, _| {
        let (fenced, now) = lock_and_fence(tx, s.outbox_clock(), claim, false)?;
        let retry_count = live(fenced, "mark_failed")?;
        let (status, attempts, visible_at) =
            match policy.after_failure(retry_count, failure.retryable, now) {
                AfterFailure::Retry {
                    attempts,
                    visible_at,
                } => (DeliveryStatus::RetryWait, attempts, Some(visible_at)),
                AfterFailure::Dead { attempts } => (DeliveryStatus::Dead, attempts, None),
            };
        let failed = DeliveryUpdate {
            status: status.as_i64(),
            retry_count: i64::from(attempts),
            visible_at,
            claimed_until: None,
            error: Some((failure.code.as_str(), &message)),
        };
        tx.update_delivery(&claim.consumer, claim.seq, &failed, now)?;
        Ok(status)
    })
}
