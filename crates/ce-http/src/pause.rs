//! A rate-limit pause shared by every caller of one provider (issue 13): after a 429 that
//! says how long to wait (`Retry-After`), no caller sends a request until the wait is over,
//! so N workers on one provider send one request per window, not N.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest pause honoured: a `Retry-After` beyond it (a far HTTP-date, a broken gateway)
/// pauses for this long, then the next request asks again.
pub const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// When calls may go out again; shared by reference (one per provider client).
#[derive(Debug, Default)]
pub struct RateLimitPause {
    until: Mutex<Option<Instant>>,
}

impl RateLimitPause {
    /// Pauses callers for `wait` from now (at most [`MAX_PAUSE`]); a pause already running
    /// longer is kept.
    pub fn extend(&self, wait: Duration) {
        let Some(t) = Instant::now().checked_add(wait.min(MAX_PAUSE)) else {
            return;
        };
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        if until.is_none_or(|u| u < t) {
            *until = Some(t);
        }
    }

    /// How long callers must still wait; `None` once the pause is over.
    pub fn remaining(&self) -> Option<Duration> {
        let until = (*self.until.lock().unwrap_or_else(|p| p.into_inner()))?;
        until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_only_grows_and_is_capped() {
        let p = RateLimitPause::default();
        assert_eq!(p.remaining(), None);
        p.extend(Duration::from_secs(60));
        let left = p.remaining().expect("paused");
        assert!(left > Duration::from_secs(59) && left <= Duration::from_secs(60));
        p.extend(Duration::from_secs(1));
        assert!(
            p.remaining().expect("still") > Duration::from_secs(59),
            "kept the longer"
        );
        p.extend(Duration::from_secs(u64::MAX));
        let left = p.remaining().expect("capped");
        assert!(
            left > Duration::from_secs(3599) && left <= MAX_PAUSE,
            "{left:?}"
        );
        let q = RateLimitPause::default();
        q.extend(Duration::ZERO);
        assert_eq!(q.remaining(), None);
    }
}
