//! Running workers continuously: claim while there is work, then sleep until a wake-up hint
//! (sent right after each commit) or the poll interval, whichever comes first. A lost hint
//! only delays, never loses (DESIGN.md decision 12).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{error, info};

use super::IndexWorker;

/// A wake-up hint shared by writers (who `notify` after commit) and workers (who wait on it).
#[derive(Debug, Default)]
pub struct Wakeup {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Wakeup {
    /// A new hint channel.
    pub fn new() -> Arc<Self> {
        Arc::new(Wakeup::default())
    }

    /// Wakes every waiting worker.
    pub fn notify(&self) {
        *crate::lock(&self.generation) += 1;
        self.cv.notify_all();
    }

    /// The number of notifies so far (pass it to [`Wakeup::wait`]).
    pub fn current(&self) -> u64 {
        *crate::lock(&self.generation)
    }

    /// Waits until a notify after `seen` or `timeout`.
    pub fn wait(&self, seen: u64, timeout: Duration) {
        let g = crate::lock(&self.generation);
        let _unused = self.cv.wait_timeout_while(g, timeout, |g| *g == seen);
    }
}

/// Workers running on their own threads until [`WorkerPool::shutdown`].
pub struct WorkerPool {
    stop: Arc<AtomicBool>,
    wake: Arc<Wakeup>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts one thread per worker.
    pub fn start(
        workers: Vec<Arc<IndexWorker>>,
        wake: Arc<Wakeup>,
        poll_interval: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = workers
            .into_iter()
            .map(|w| {
                let (stop, wake) = (stop.clone(), wake.clone());
                std::thread::Builder::new()
                    .name(format!("ce-worker-{}", w.config().worker_id))
                    .spawn(move || run_loop(&w, &stop, &wake, poll_interval))
                    .unwrap_or_else(|e| panic!("cannot spawn a worker thread: {e}"))
            })
            .collect();
        WorkerPool {
            stop,
            wake,
            threads,
        }
    }

    /// Asks every worker to stop after its current batch and waits for them (a finished batch
    /// leaves no claim behind).
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The loop of one worker.
pub fn run_loop(w: &IndexWorker, stop: &AtomicBool, wake: &Wakeup, poll_interval: Duration) {
    let id = w.config().worker_id.clone();
    info!(worker_id = %id, consumer = %w.config().consumer, "worker started");
    while !stop.load(Ordering::SeqCst) {
        let seen = wake.current();
        match w.run_next() {
            Ok(r) if r.claimed > 0 => continue,
            Ok(_) => {}
            Err(e) => error!(worker_id = %id, error = %e, "claim failed"),
        }
        match w.paused_for() {
            // Rate-limited: hints do not shorten the pause (stop is still honoured).
            Some(pause) => std::thread::sleep(pause.min(Duration::from_millis(200))),
            None => wake.wait(seen, poll_interval),
        }
    }
    info!(worker_id = %id, "worker stopped");
}
