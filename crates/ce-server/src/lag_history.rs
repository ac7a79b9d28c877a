//! The server's own recent lag samples: a ring buffer in memory, sampled periodically by
//! `ce serve` (every [`SAMPLE_INTERVAL`], over the last [`WINDOW`]), so that the console can
//! draw each consumer's lag over the last hour without a time-series database. It starts
//! empty at every start of the server and holds what this process saw; the durable truth
//! stays the outbox (`GET /v1/status`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use ce_core::Millis;
use serde::{Deserialize, Serialize};

use crate::status::ConsumerStatus;

/// How often `ce serve` samples the lag.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// How far back the samples reach.
pub const WINDOW: Duration = Duration::from_secs(3600);
/// Samples kept: one window's worth.
const CAPACITY: usize = (WINDOW.as_secs() / SAMPLE_INTERVAL.as_secs()) as usize;

/// One consumer's lag at one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConsumerLagSample {
    /// The consumer.
    pub consumer: String,
    /// Deliveries not applied yet (pending + claimed + retry_wait).
    pub lag_events: u64,
    /// Age of the oldest of them, in seconds (0 without lag).
    pub lag_seconds: f64,
    /// Dead deliveries.
    pub dead: u64,
}

/// Every consumer's lag at one time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LagSample {
    /// When it was taken (the store's clock).
    pub at_ms: Millis,
    /// Per consumer.
    pub consumers: Vec<ConsumerLagSample>,
}

/// `GET /v1/status/lag`: the samples, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LagHistoryAnswer {
    /// Seconds between samples.
    pub interval_seconds: u64,
    /// Seconds the samples reach back at most.
    pub window_seconds: u64,
    /// Oldest first; empty until the server has sampled once.
    pub samples: Vec<LagSample>,
}

/// The ring buffer.
#[derive(Debug, Default)]
pub struct LagHistory {
    samples: Mutex<VecDeque<LagSample>>,
}

impl LagHistory {
    /// Records the lag of `consumers` at `at_ms`, forgetting the oldest sample beyond the
    /// window.
    pub fn record(&self, at_ms: Millis, consumers: &[ConsumerStatus]) {
        let sample = LagSample {
            at_ms,
            consumers: consumers
                .iter()
                .map(|c| ConsumerLagSample {
                    consumer: c.consumer.clone(),
                    lag_events: c.lag_events,
                    lag_seconds: c.lag_seconds,
                    dead: c.dead,
                })
                .collect(),
        };
        let mut q = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if q.len() == CAPACITY {
            q.pop_front();
        }
        q.push_back(sample);
    }

    /// The samples, oldest first.
    pub fn answer(&self) -> LagHistoryAnswer {
        let q = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        LagHistoryAnswer {
            interval_seconds: SAMPLE_INTERVAL.as_secs(),
            window_seconds: WINDOW.as_secs(),
            samples: q.iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{ConsumerStatus, Validation};

    fn status(lag: u64) -> ConsumerStatus {
        ConsumerStatus {
            consumer: "vector".into(),
            pending: lag,
            claimed: 0,
            retry_wait: 0,
            done: 0,
            dead: 0,
            low_watermark_seq: None,
            oldest_pending_created_at_ms: None,
            lag_events: lag,
            lag_seconds: 0.0,
            last_error: None,
            validation: Validation::Partial,
            validation_reason: String::new(),
            applied: false,
        }
    }

    #[test]
    fn keeps_one_window_oldest_first() {
        let h = LagHistory::default();
        for i in 0..(CAPACITY as u64 + 5) {
            h.record(i as Millis, &[status(i)]);
        }
        let a = h.answer();
        assert_eq!(a.samples.len(), CAPACITY);
        assert_eq!(a.samples[0].at_ms, 5);
        assert_eq!(a.samples[0].consumers[0].lag_events, 5);
        let last = a.samples.last().expect("sample");
        assert_eq!(last.consumers[0].lag_events, CAPACITY as u64 + 4);
    }
}
