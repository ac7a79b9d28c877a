//! [`Flag`]: a flag threads wait on with a timeout, woken the moment it is set — the stop of
//! a periodic thread or of a job's heartbeat, the end of a drain pass.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Set once, never cleared; setting it wakes every thread waiting on it.
#[derive(Debug, Default)]
pub(crate) struct Flag {
    set: Mutex<bool>,
    woken: Condvar,
}

impl Flag {
    fn guard(&self) -> MutexGuard<'_, bool> {
        self.set.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets it and wakes every waiter.
    pub(crate) fn set(&self) {
        *self.guard() = true;
        self.woken.notify_all();
    }

    /// Waits up to `d`, or until it is set; whether it is set.
    pub(crate) fn wait(&self, d: Duration) -> bool {
        let (set, _) = self
            .woken
            .wait_timeout_while(self.guard(), d, |set| !*set)
            .unwrap_or_else(PoisonError::into_inner);
        *set
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn setting_the_flag_wakes_a_waiter() {
        let flag = Flag::default();
        let long = Duration::from_secs(120);
        let (waited, woke_set) = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let t = Instant::now();
                let set = flag.wait(long);
                (t.elapsed(), set)
            });
            // Most likely waiting by now; if not, `wait` sees the flag set and returns.
            std::thread::sleep(Duration::from_millis(50));
            flag.set();
            waiter.join().expect("waiter")
        });
        assert!(
            waited < long,
            "the waiter slept its whole timeout ({waited:?})"
        );
        assert!(woke_set && flag.wait(Duration::ZERO));
        // A set flag makes no one wait.
        let t = Instant::now();
        assert!(flag.wait(long));
        assert!(t.elapsed() < long);
        // An unset one waits its timeout and says so.
        assert!(!Flag::default().wait(Duration::from_millis(1)));
    }
}
