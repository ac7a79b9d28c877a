//! How many deliveries a worker claims next (spec §9.3, back-pressure).
//!
//! A claimed batch costs a fixed price besides its events: a claim transaction and an
//! acknowledgement transaction on the source (each a commit), one index write transaction,
//! and in the keyword index a rewrite of every posting block the batch touches. When the
//! queue is deep and a round is cheap (removals, payload-only edits, an embedder that answers
//! fast) that price is most of the work: draining the removal of 9,900 documents with all
//! three index consumers took ~1.0 s in rounds of 100 events and ~0.9 s in rounds of 200
//! (docs/benchmarks.md, 2026-12-07). When a round is expensive (a local model embedding
//! hundreds of texts) its own work dominates, and larger claims would only delay the first
//! events of each batch and take work away from the consumer's other workers.
//!
//! So a worker claims `claim_limit` events first and doubles its next claim, up to
//! `max_inflight_events`, each time a round claimed all it asked for (the queue was deeper)
//! and took less than [`GROW_BELOW`]; a round slower than [`SHRINK_ABOVE`] halves it again,
//! never below `claim_limit`. A round that found the queue shallower than its claim leaves
//! the size as it is: the next claim takes what there is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A round faster than this that claimed all it asked for doubles the next claim.
pub const GROW_BELOW: Duration = Duration::from_millis(100);

/// A round slower than this halves the next claim.
pub const SHRINK_ABOVE: Duration = Duration::from_millis(400);

/// The next claim of one worker, adapted to how its rounds go.
#[derive(Debug)]
pub struct ClaimSize {
    next: AtomicUsize,
    floor: usize,
    ceiling: usize,
    grow_below: Duration,
    shrink_above: Duration,
}

impl ClaimSize {
    /// Claims from `claim_limit` (the first claim and the least) up to `max_inflight_events`.
    pub fn new(claim_limit: usize, max_inflight_events: usize) -> Self {
        let ceiling = max_inflight_events.max(1);
        let floor = claim_limit.clamp(1, ceiling);
        ClaimSize {
            next: AtomicUsize::new(floor),
            floor,
            ceiling,
            grow_below: GROW_BELOW,
            shrink_above: SHRINK_ABOVE,
        }
    }

    /// The same bounds with other round times (tests that must not depend on the machine's
    /// speed).
    pub fn with_round_times(mut self, grow_below: Duration, shrink_above: Duration) -> Self {
        self.grow_below = grow_below;
        self.shrink_above = shrink_above;
        self
    }

    /// The claims of a worker with `cfg`.
    pub fn of(cfg: &super::WorkerConfig) -> Self {
        Self::new(cfg.claim_limit, cfg.max_inflight_events)
    }

    /// How many deliveries to claim next.
    pub fn next(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    /// Records a round that asked for `limit` deliveries, got `claimed` and took `took`.
    pub fn observe(&self, limit: usize, claimed: usize, took: Duration) {
        let current = self.next();
        let next = if took > self.shrink_above {
            (current / 2).max(self.floor)
        } else if claimed >= limit && took < self.grow_below {
            current.saturating_mul(2).min(self.ceiling)
        } else {
            current
        };
        if next != current {
            self.next.store(next, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const FAST: Duration = Duration::from_millis(5);
    const SLOW: Duration = Duration::from_millis(900);

    #[test]
    fn a_deep_cheap_queue_grows_the_claim_to_the_inflight_bound() {
        let s = ClaimSize::new(100, 500);
        assert_eq!(s.next(), 100);
        s.observe(100, 100, FAST);
        assert_eq!(s.next(), 200);
        s.observe(200, 200, FAST);
        assert_eq!(s.next(), 400);
        s.observe(400, 400, FAST);
        assert_eq!(s.next(), 500, "capped by max_inflight_events");
        s.observe(500, 500, FAST);
        assert_eq!(s.next(), 500);
    }

    #[test]
    fn a_shallow_queue_or_a_middling_round_keeps_the_claim() {
        let s = ClaimSize::new(100, 500);
        s.observe(100, 37, FAST);
        assert_eq!(s.next(), 100, "the queue was shallower than the claim");
        s.observe(100, 100, Duration::from_millis(200));
        assert_eq!(s.next(), 100, "neither fast nor slow");
    }

    #[test]
    fn a_slow_round_halves_the_claim_down_to_the_configured_one() {
        let s = ClaimSize::new(100, 800);
        for limit in [100, 200, 400] {
            s.observe(limit, limit, FAST);
        }
        assert_eq!(s.next(), 800);
        s.observe(800, 800, SLOW);
        assert_eq!(s.next(), 400);
        s.observe(400, 10, SLOW);
        assert_eq!(s.next(), 200, "a slow round shrinks whatever it claimed");
        s.observe(200, 200, SLOW);
        s.observe(100, 100, SLOW);
        assert_eq!(s.next(), 100, "never below claim_limit");
    }

    #[test]
    fn a_claim_limit_above_the_inflight_bound_is_capped() {
        let s = ClaimSize::new(500, 200);
        assert_eq!(s.next(), 200);
        s.observe(200, 200, FAST);
        assert_eq!(s.next(), 200);
        s.observe(200, 200, SLOW);
        assert_eq!(s.next(), 200);
    }

    proptest! {
        /// Whatever the rounds, the claim stays within [claim_limit, max_inflight_events]
        /// (claim_limit capped by the bound), and only a full fast round makes it grow.
        #[test]
        fn the_claim_stays_within_its_bounds(
            claim_limit in 1_usize..600,
            inflight in 1_usize..2000,
            rounds in prop::collection::vec((0_usize..3000, 0_u64..1000), 0..60),
        ) {
            let s = ClaimSize::new(claim_limit, inflight);
            let floor = claim_limit.min(inflight);
            for (claimed, ms) in rounds {
                let limit = s.next();
                let claimed = claimed.min(limit);
                let took = Duration::from_millis(ms);
                s.observe(limit, claimed, took);
                let next = s.next();
                prop_assert!(next >= floor && next <= inflight, "{next} outside [{floor}, {inflight}]");
                if next > limit {
                    prop_assert!(claimed == limit && took < GROW_BELOW);
                }
                if next < limit {
                    prop_assert!(took > SHRINK_ABOVE);
                }
            }
        }
    }
}
