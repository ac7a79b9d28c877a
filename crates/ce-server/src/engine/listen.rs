//! Wake-ups across processes on PostgreSQL (DESIGN.md decision 12): a source write that
//! appended events sends `NOTIFY ce_outbox` in its transaction, and PostgreSQL delivers it
//! after the commit to every session that listens — so a write made by `ce put` in another
//! process, or on another host, wakes this process's workers at once.
//!
//! One thread per engine with running workers: its own connection
//! ([`PgStore::connect_client`]), `LISTEN` on [`NOTIFY_CHANNEL`], and [`Wakeup::notify`] for
//! every notification. Any error drops the connection; the thread reconnects with capped
//! exponential backoff, warning once per outage, and wakes the workers after reconnecting
//! (hints sent meanwhile are lost). Hints are never needed for correctness: workers still
//! poll every `index.worker.poll_interval_ms`, so a lost hint only delays.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ce_index::worker::runner::Wakeup;
use ce_store::postgres::{NOTIFY_CHANNEL, PgStore};
use postgres::fallible_iterator::FallibleIterator as _;
use tracing::{debug, info, warn};

/// How long one wait for notifications lasts: the bound on how late a stop is noticed.
const TICK: Duration = Duration::from_millis(250);
/// How long a quiet connection goes unchecked (a dead peer may not close the socket).
const PING_EVERY: Duration = Duration::from_secs(15);
/// First wait before reconnecting; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The counter of notifications received, in the Prometheus export.
pub const NOTIFICATIONS_METRIC: &str = "ce_outbox_notifications_total";

/// A running listener thread; stopped by [`Listener::stop`] or on drop.
pub struct Listener {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Starts listening on `store`'s database, waking `wake` on every notification.
    pub fn start(store: Arc<PgStore>, wake: Arc<Wakeup>) -> Listener {
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), received.clone());
        let thread = std::thread::Builder::new()
            .name("ce-listen".into())
            .spawn(move || run(&store, &wake, &s, &r))
            .map_err(|e| warn!(error = %e, "cannot start the outbox listener: polling only"))
            .ok();
        Listener {
            stop,
            received,
            thread,
        }
    }

    /// Notifications received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Stops the thread and waits for it (within about [`TICK`], or a connect timeout when
    /// it is connecting).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Reconnects until stopped.
fn run(store: &PgStore, wake: &Wakeup, stop: &AtomicBool, received: &AtomicU64) {
    let mut backoff = MIN_BACKOFF;
    // Since when the listener has been without a connection (warned once per outage).
    let mut outage: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        let err = match store.connect_client() {
            Ok(mut client) => match client.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}")) {
                Ok(()) => {
                    match outage.take() {
                        Some(since) => info!(
                            down_ms = since.elapsed().as_millis() as u64,
                            "outbox listener reconnected"
                        ),
                        None => debug!(channel = NOTIFY_CHANNEL, "outbox listener connected"),
                    }
                    backoff = MIN_BACKOFF;
                    // Commits made while no one listened sent hints nobody got.
                    wake.notify();
                    match listen(&mut client, wake, stop, received) {
                        Ok(()) => return,
                        Err(e) => e.to_string(),
                    }
                }
                Err(e) => ce_store::StoreError::from(e).to_string(),
            },
            Err(e) => e.to_string(),
        };
        if outage.is_none() {
            warn!(error = %err, retry_max_ms = MAX_BACKOFF.as_millis() as u64, "outbox listener lost its connection: workers poll until it is back");
            outage = Some(Instant::now());
        } else {
            debug!(error = %err, "outbox listener still disconnected");
        }
        sleep_unless_stopped(backoff, stop);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Waits for notifications on a listening `client` until stopped (`Ok`) or the connection
/// fails (`Err`).
fn listen(
    client: &mut postgres::Client,
    wake: &Wakeup,
    stop: &AtomicBool,
    received: &AtomicU64,
) -> Result<(), postgres::Error> {
    let mut quiet_since = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut got = false;
        {
            let mut notifications = client.notifications();
            let mut it = notifications.timeout_iter(TICK);
            while it.next()?.is_some() {
                wake.notify();
                received.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(NOTIFICATIONS_METRIC).increment(1);
                got = true;
                if stop.load(Ordering::SeqCst) {
                    break;
                }
            }
        }
        if got {
            quiet_since = Instant::now();
        } else if client.is_closed() || quiet_since.elapsed() >= PING_EVERY {
            // `None` also means "disconnected": make sure the session is alive.
            client.is_valid(Duration::from_secs(5))?;
            quiet_since = Instant::now();
        }
    }
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use ce_core::{Config, CtxUri};
    use ce_store::{ContextFs as _, PutRequest, SourceStore};
    use ce_testkit::pg::TestDb;

    use super::*;
    use crate::engine::{Engine, EngineOptions};

    /// Whether `store`'s keyword consumer has nothing pending or claimed.
    fn keyword_idle(store: &dyn SourceStore) -> bool {
        store
            .stats()
            .expect("stats")
            .iter()
            .any(|s| s.consumer == "keyword" && s.pending + s.claimed == 0)
    }

    fn wait_idle(store: &dyn SourceStore, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !keyword_idle(store) {
            assert!(
                Instant::now() < deadline,
                "{what}: not indexed (the workers poll only every 60 s)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Writes from another store handle (another process, as far as PostgreSQL knows) wake
    /// the engine's workers, also after the listener's connection was killed.
    #[test]
    fn notifications_wake_the_workers_and_survive_a_lost_connection() {
        let db = TestDb::create("listen");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::from_toml(&format!(
            "[store]\nurl = \"{}\"\n[index.embedding]\nprovider = \"hash\"\n\
             [index.outbox]\nconsumers = [\"keyword\"]\n[index.worker]\npoll_interval_ms = 60000\n",
            db.url()
        ))
        .expect("config");
        let options = EngineOptions {
            workers: 1,
            role: "test".into(),
            ..EngineOptions::default()
        };
        let engine = Engine::open_with(dir.path(), config.clone(), options).expect("engine");
        assert_eq!(engine.running_workers(), 1);
        let writer = PgStore::open(db.url(), config).expect("second store");
        let put = |uri: &str| {
            let req = PutRequest {
                content: Some("woken".into()),
                ..PutRequest::default()
            };
            writer
                .put(&CtxUri::parse(uri).expect("uri"), req)
                .expect("put");
        };
        // Let the listener connect and the workers go idle.
        std::thread::sleep(Duration::from_millis(500));
        put("ctx://acc/a");
        wait_idle(&writer, "first write");
        assert!(engine.notifications_received() >= 1);

        // Every connection to the database dies (a server restart, as clients see it).
        let before = engine.notifications_received();
        assert!(
            db.terminate_connections() >= 1,
            "the listener was connected"
        );
        std::thread::sleep(Duration::from_millis(300));
        put("ctx://acc/b");
        wait_idle(&writer, "write after the lost connection");
        put("ctx://acc/c");
        wait_idle(&writer, "write after the reconnection");
        assert!(engine.notifications_received() > before);

        // Shutdown stops the listener promptly.
        let t0 = Instant::now();
        engine.shutdown();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(engine.notifications_received(), 0, "the listener is gone");
    }
}
