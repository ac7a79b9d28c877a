//! A background thread that runs a step, waits as long as the step asks, and stops promptly
//! on [`Periodic::stop`] or drop (a step in progress finishes first). The vector index
//! upkeep, the repair schedule and the hold keeper each run on one.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::warn;

use crate::flag::Flag;

/// A running periodic thread.
pub struct Periodic {
    stop: Arc<Flag>,
    thread: Option<JoinHandle<()>>,
}

impl Periodic {
    /// Starts thread `name`: waits `first`, then runs `step` and waits the duration it
    /// returns, until stopped.
    pub fn start(
        name: &str,
        first: Duration,
        mut step: impl FnMut() -> Duration + Send + 'static,
    ) -> Periodic {
        let stop = Arc::new(Flag::default());
        let signal = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut wait = first;
                while !signal.wait(wait) {
                    wait = step();
                }
            })
            .map_err(|e| warn!(thread = name, error = %e, "cannot start a background thread"))
            .ok();
        Periodic { stop, thread }
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn runs_its_step_until_stopped_and_stops_promptly() {
        let runs = Arc::new(AtomicU32::new(0));
        let seen = runs.clone();
        let p = Periodic::start("test-periodic", Duration::ZERO, move || {
            seen.fetch_add(1, Ordering::SeqCst);
            Duration::from_millis(1)
        });
        while runs.load(Ordering::SeqCst) < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        p.stop();
        let after = runs.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(runs.load(Ordering::SeqCst), after, "no step after stop");
        // A long wait does not delay the stop.
        let slow = Periodic::start("test-periodic", Duration::from_secs(3600), || {
            Duration::from_secs(3600)
        });
        let t0 = std::time::Instant::now();
        slow.stop();
        assert!(t0.elapsed() < Duration::from_secs(60));
    }
}
