//! The queue state machine shared by both durable queues: the outbox's deliveries (one per
//! consumer and event) and workflow jobs. It owns the rules no SQL should decide twice:
//!
//! - a claim is a random token plus a lease end; a transition on a claimed row runs only for
//!   the live claim (same token, lease not over) — the fence;
//! - a failure goes to a retry after a jittered exponential backoff, or dead when it is not
//!   retryable or the retries are spent (spec §3.3, §8.2);
//! - an expired lease makes the row runnable again, so a crashed worker loses nothing.
//!
//! Each queue maps its stored statuses onto [`Phase`] and its errors onto [`Lost`]; the
//! dialect code reads and writes the rows, this module decides.

use ce_core::Millis;
use ce_core::config::OutboxConfig;
use rand::Rng as _;

/// Where a queue row is in its life, whatever the queue calls its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Runnable now or later: pending, delayed, waiting for a retry.
    Waiting,
    /// Held by a claim (claimed / running) until its lease ends.
    Claimed,
    /// Finished successfully (done / completed).
    Done,
    /// Failed for good (dead-lettered).
    Dead,
    /// Stopped on request before it finished (jobs only).
    Cancelled,
}

/// The fencing columns of the row a claim names, read (and on PostgreSQL locked) in the
/// transaction of the transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRow {
    /// The row's phase.
    pub(crate) phase: Phase,
    /// The queue's own name for its status, for messages (`retry_wait`, `delayed`, …).
    pub(crate) status: &'static str,
    /// The token of the claim that holds or last held it.
    pub(crate) token: Option<String>,
    /// The end of that claim's lease.
    pub(crate) until: Option<Millis>,
    /// Failures counted so far.
    pub(crate) attempts: u32,
}

/// Why a fenced transition may not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The row does not exist.
    Missing,
    /// The claim is not the live one; the text says what the row's state is.
    Conflict(String),
}

/// Whether a fenced transition by the claim with `token` may run at `now`:
/// `Ok(Some(attempts))` when it is the live claim (claimed, same token, lease not over),
/// `Ok(None)` when the row is already done and `done_is_ok` (a repeated acknowledgement);
/// otherwise why not.
pub(crate) fn fence(
    row: Option<&LeaseRow>,
    token: &str,
    now: Millis,
    done_is_ok: bool,
) -> Result<Option<u32>, Lost> {
    let Some(row) = row else {
        return Err(Lost::Missing);
    };
    let same_token = row.token.as_deref() == Some(token);
    let claimed = row.phase == Phase::Claimed;
    if claimed && same_token && row.until.is_some_and(|u| now < u) {
        return Ok(Some(row.attempts));
    }
    if row.phase == Phase::Done && done_is_ok {
        return Ok(None);
    }
    Err(Lost::Conflict(match (claimed, same_token) {
        (true, true) => "the lease expired".to_owned(),
        (true, false) => "claimed by a newer claim".to_owned(),
        (false, _) => format!("status is {}", row.status),
    }))
}

/// A new claim token: the fence that only the live claim passes.
pub(crate) fn new_claim_token() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// How a queue retries failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RetryPolicy {
    /// Failures after which a row goes dead (when `dead_letter`).
    pub(crate) max_retries: u32,
    /// The first backoff, in seconds.
    pub(crate) base_seconds: u32,
    /// The backoff cap, in seconds.
    pub(crate) max_seconds: u32,
    /// Jitter as a fraction of the backoff (0..=1).
    pub(crate) jitter_ratio: f64,
    /// Whether exhausted rows go dead (if false they keep retrying at the cap).
    pub(crate) dead_letter: bool,
}

impl From<&OutboxConfig> for RetryPolicy {
    fn from(o: &OutboxConfig) -> RetryPolicy {
        RetryPolicy {
            max_retries: o.max_retries,
            base_seconds: o.retry_base_seconds,
            max_seconds: o.retry_max_seconds,
            jitter_ratio: o.retry_jitter_ratio,
            dead_letter: o.dead_letter_enabled,
        }
    }
}

/// Where a failed row goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum AfterFailure {
    /// Runnable again at `visible_at`, with `attempts` failures counted.
    Retry {
        /// Failures counted, this one included (capped at `max_retries`).
        attempts: u32,
        /// When it can be claimed again.
        visible_at: Millis,
    },
    /// Dead, with `attempts` failures counted (unchanged: a permanent failure is not a
    /// retry, and an exhausted row already counted its last one).
    Dead {
        /// Failures counted.
        attempts: u32,
    },
}

impl RetryPolicy {
    /// The transition of a row that failed at `now` after `attempts` earlier failures: dead
    /// when not retryable or out of retries (with dead-lettering on), else a retry after a
    /// jittered backoff.
    pub(crate) fn after_failure(
        &self,
        attempts: u32,
        retryable: bool,
        now: Millis,
    ) -> AfterFailure {
        let exhausted = attempts >= self.max_retries;
        if !retryable || (exhausted && self.dead_letter) {
            return AfterFailure::Dead { attempts };
        }
        let n = (attempts + 1).min(self.max_retries);
        let wait = backoff_ms(
            n,
            self.base_seconds,
            self.max_seconds,
            self.jitter_ratio,
            rand::rng().random(),
        );
        AfterFailure::Retry {
            attempts: n,
            visible_at: now + wait,
        }
    }
}

/// The backoff before retry number `retry_count` (1-based): `min(base·2^(n-1), max)` plus up
/// to `jitter_ratio` of it, `unit` in 0..=1 choosing how much (spec §3.3, §8.2).
pub(crate) fn backoff_ms(
    retry_count: u32,
    base_s: u32,
    max_s: u32,
    jitter_ratio: f64,
    unit: f64,
) -> Millis {
    let exp = retry_count.saturating_sub(1).min(30);
    let delay = (u64::from(base_s) * 1000)
        .saturating_mul(1 << exp)
        .min(u64::from(max_s) * 1000);
    let jitter = (delay as f64 * jitter_ratio * unit.clamp(0.0, 1.0)) as u64;
    (delay + jitter) as Millis
}

/// The error text a failure records: at most 4096 characters.
pub(crate) fn stored_error(error: &str) -> String {
    error.chars().take(4096).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(phase: Phase, token: &str, until: Millis) -> LeaseRow {
        LeaseRow {
            phase,
            status: "some_status",
            token: Some(token.to_owned()),
            until: Some(until),
            attempts: 2,
        }
    }

    #[test]
    fn only_the_live_claim_passes_the_fence() {
        let live = row(Phase::Claimed, "t1", 100);
        assert_eq!(fence(Some(&live), "t1", 99, false), Ok(Some(2)));
        assert_eq!(
            fence(Some(&live), "t1", 100, false),
            Err(Lost::Conflict("the lease expired".into()))
        );
        assert_eq!(
            fence(Some(&live), "t0", 50, false),
            Err(Lost::Conflict("claimed by a newer claim".into()))
        );
        assert_eq!(fence(None, "t1", 50, true), Err(Lost::Missing));
        let done = row(Phase::Done, "t1", 100);
        assert_eq!(fence(Some(&done), "t1", 50, true), Ok(None));
        assert_eq!(
            fence(Some(&done), "t1", 50, false),
            Err(Lost::Conflict("status is some_status".into()))
        );
        for phase in [Phase::Waiting, Phase::Dead, Phase::Cancelled] {
            assert!(
                matches!(
                    fence(Some(&row(phase, "t1", 100)), "t1", 50, true),
                    Err(Lost::Conflict(_))
                ),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn failures_retry_with_backoff_then_die() {
        let p = RetryPolicy {
            max_retries: 3,
            base_seconds: 2,
            max_seconds: 300,
            jitter_ratio: 0.0,
            dead_letter: true,
        };
        assert_eq!(
            p.after_failure(0, true, 1_000),
            AfterFailure::Retry {
                attempts: 1,
                visible_at: 3_000
            }
        );
        assert_eq!(
            p.after_failure(2, true, 0),
            AfterFailure::Retry {
                attempts: 3,
                visible_at: 8_000
            }
        );
        assert_eq!(
            p.after_failure(3, true, 0),
            AfterFailure::Dead { attempts: 3 }
        );
        assert_eq!(
            p.after_failure(0, false, 0),
            AfterFailure::Dead { attempts: 0 }
        );
        let keep = RetryPolicy {
            dead_letter: false,
            ..p
        };
        assert_eq!(
            keep.after_failure(3, true, 0),
            AfterFailure::Retry {
                attempts: 3,
                visible_at: 8_000
            }
        );
    }

    #[test]
    fn backoff_doubles_caps_and_jitters() {
        assert_eq!(backoff_ms(1, 2, 300, 0.2, 0.0), 2_000);
        assert_eq!(backoff_ms(2, 2, 300, 0.2, 0.0), 4_000);
        assert_eq!(backoff_ms(8, 2, 300, 0.2, 0.0), 256_000);
        assert_eq!(backoff_ms(9, 2, 300, 0.2, 0.0), 300_000);
        assert_eq!(backoff_ms(40, 2, 300, 0.2, 0.0), 300_000);
        assert_eq!(backoff_ms(1, 2, 300, 0.2, 1.0), 2_400);
    }
}
