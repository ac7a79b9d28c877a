//! The convergence simulation (DESIGN.md §5, issue 5), in process, over the three consumers
//! at once: a real source store (SQLite, and PostgreSQL) takes seeded random put / update / metadata-only update /
//! mv / rm / link / unlink writes while 4 workers per consumer (vector, keyword, relation)
//! apply the outbox under faults injected at these rates while faults are on:
//!
//! | fault                                   | rate  | unit                                  |
//! |-----------------------------------------|-------|---------------------------------------|
//! | embed timeout                           | 10 %  | embed call                            |
//! | embed 5xx (503, retryable)              | 5 %   | embed call                            |
//! | text refused for good (400)             | 0.5 % | distinct text (every call carrying it) |
//! | embed rate limit (DESIGN §5; not in #5) | 5 %   | embed call                            |
//! | index write failure                     | 5 %   | index write call (any of the 3)       |
//! | worker kill mid-batch                   | 2 %   | batch that writes to its index        |
//! | lease expiry by clock jump              | 1 %   | claimed batch                         |
//! | duplicate delivery                      | 5 %   | delivery (event × consumer)           |
//!
//! - A killed batch dies (a panic caught by its runner, which then starts over) right after
//!   its first index write is applied: the index holds part of the batch, nothing is
//!   acknowledged, the claims stay until their lease expires and another worker redoes them.
//!   (A batch that writes nothing — only no-op events, or nodes the index already holds —
//!   has no work a kill could interrupt; the rate counts the batches that write.)
//! - A lease jump advances the clock past the lease once the batch is claimed, before it is
//!   applied: other workers may claim its events while it still applies them, its late acks
//!   are refused (a late ack never makes an event dead), and the work is redone.
//! - A duplicate re-appends a copy of a delivered event for one consumer a few writes later.
//! - A refused text fails only the URIs whose texts the provider refuses (`worker::apply`
//!   splits a refused call until the refused texts are alone, `worker::bisect`), hence only
//!   the events whose operations include one of them — not the whole call or claimed batch —
//!   and of those, the events for which it is the failure the worker
//!   reports (`worker::ack`: an event's first failed operation; an operation's first failed
//!   URI); the worker marks those dead. The test learns them from the worker's own report
//!   (`WorkerCallbacks::on_event_failure`, non-retryable, on the thread whose batch saw the
//!   injected error, for an event of that batch) and whether the delivery is dead right
//!   after that ack (an ack refused because the lease was lost leaves the event to be
//!   redone).
//!
//! Besides, the keyword index fails every write for the first half of the history, during
//! which the other two consumers reach lag 0; what the outage made dead is requeued.
//!
//! After the faults stop and the outbox drains, the dead set is exactly the
//! injected-permanent set; those are requeued and drained, and then every index equals the
//! projection of the source (0 lost, 0 extra, 0 stale), each consumer is applied_valid (lag
//! 0, nothing dead), vectors are the embeddings of their texts, and a metadata-only update
//! of every node embeds nothing.
//!
//! CI runs many seeds of a short history ([`SHORT_WRITES`]; `CE_SIM_SEEDS` sets how many)
//! and one seed of a long one (`CE_PROPTEST_CASES` scales it), on each backend (fewer short
//! seeds on PostgreSQL); `CE_SEED` replays one seed.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ce_core::{
    Config, CtxUri, DeliveryStatus, EventPayload, IndexProjector, IndexRecord, ManualClock,
    OutboxEvent, OutboxEventCreate,
};
use ce_embed::hash::HashEmbedder;
use ce_embed::{EmbedError, Embedder, ModelIdentity};
use ce_index::IndexError;
use ce_index::keyword::memory::MemoryKeywordIndex;
use ce_index::relation::RelationIndex;
use ce_index::relation::memory::MemoryRelationIndex;
use ce_index::vector::memory::MemoryVectorIndex;
use ce_index::vector::{NodeWrite, StoredRecord, StoredVector, SyncOutcome, VectorIndex as _};
use ce_index::worker::target::{IndexKind, IndexTarget, KeywordTarget, VectorTarget};
use ce_index::worker::{IndexWorker, WorkError, WorkerCallbacks, WorkerConfig};
use ce_store::{LinkRequest, PutMode, PutRequest, WriteOutcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{
    Backend, Env, Store, WrappedRelations, backend_tests, unless_refused, uri, worker_config,
};
use crate::relation::expected_edges;

const CONSUMERS: [&str; 3] = ["vector", "keyword", "relation"];
const VECTOR: usize = 0;
const KEYWORD: usize = 1;
const RELATION: usize = 2;

/// Per embed call.
const EMBED_TIMEOUT: f64 = 0.10;
/// Per embed call: a retryable 503.
const EMBED_5XX: f64 = 0.05;
/// Per distinct text, decided the first time the text is sent while faults are on: the
/// provider refuses it (a non-retryable 400 for every call that carries it), as a real
/// provider refuses an input it cannot embed.
const EMBED_PERMANENT: f64 = 0.005;
/// Per embed call (not in issue 5's list; DESIGN.md §5 names rate limits).
const EMBED_RATE_LIMIT: f64 = 0.05;
/// Per index write call (`write_nodes` of the vector and keyword targets, `write_owners`).
const WRITE_FAILURE: f64 = 0.05;
/// Per batch that writes to its index (rolled at its first write).
const WORKER_KILL: f64 = 0.02;
/// Per claimed batch.
const LEASE_JUMP: f64 = 0.01;
/// Per delivery (one event to one consumer).
const DUPLICATE: f64 = 0.05;

/// The message of the injected permanent embed error (it ends up in `last_error`).
const PERMANENT: &str = "injected permanent failure";

/// Writes per seed in the many-seeds tier.
const SHORT_WRITES: usize = 60;
/// Seeds of the many-seeds tier unless `CE_SIM_SEEDS` says otherwise.
const SHORT_SEEDS: u32 = 250;
/// The same on PostgreSQL, whose runs cost more (a database per seed, round trips).
const SHORT_SEEDS_PG: u32 = 25;
/// Writes of the long history.
const LONG_WRITES: usize = 300;

backend_tests!(
    three_indexes_converge_under_faults_over_many_seeds,
    three_indexes_converge_under_faults_over_a_long_history,
);

fn three_indexes_converge_under_faults_over_many_seeds(backend: Backend) {
    let n = std::env::var("CE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(match backend {
            Backend::Sqlite => SHORT_SEEDS,
            Backend::Postgres => SHORT_SEEDS_PG,
        });
    run_seeds(
        backend,
        "three_indexes_converge_under_faults_over_many_seeds",
        n,
        SHORT_WRITES,
    );
}

fn three_indexes_converge_under_faults_over_a_long_history(backend: Backend) {
    run_seeds(
        backend,
        "three_indexes_converge_under_faults_over_a_long_history",
        ce_core::test_cases(1),
        LONG_WRITES,
    );
}

/// Runs the simulation for `n` random seeds (or `CE_SEED` alone), printing the seed of a
/// failing run and, at the end, what was injected over all of them.
fn run_seeds(backend: Backend, test: &str, n: u32, writes: usize) {
    quiet_kills();
    let seeds: Vec<u64> = match std::env::var("CE_SEED") {
        Ok(_) => vec![crate::common::seed(test)],
        Err(_) => (0..n).map(|_| rand::random()).collect(),
    };
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    for &seed in &seeds {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| converge(backend, seed, writes, &tally))) {
            eprintln!(
                "{test}: seed {seed} failed; replay with CE_SEED={seed} cargo test -p ce-index \
                 --test integration convergence::{}::{test}",
                format!("{backend:?}").to_lowercase()
            );
            resume_unwind(p);
        }
    }
    eprintln!(
        "{test} on {backend:?}: {} seeds of {writes} writes in {:.1?}: {}",
        seeds.len(),
        started.elapsed(),
        tally.summary()
    );
    if seeds.len() >= 100 {
        // Over this many seeds every kind of fault shows up; if one never does, the
        // simulation no longer injects it.
        for (what, n) in tally.kinds() {
            assert!(n > 0, "{test}: no {what} over {} seeds", seeds.len());
        }
    }
}

/// A worker killed mid-batch: the panic payload its runner catches (and does not print).
struct Killed;

/// Silences the panics of killed workers; every other panic is reported as before.
fn quiet_kills() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Killed>() {
                previous(info);
            }
        }));
    });
}

/// Counts of what was injected and what it did, over every seed of a test.
#[derive(Default)]
struct Tally {
    embed_calls: AtomicU64,
    timeouts: AtomicU64,
    server_errors: AtomicU64,
    permanent: AtomicU64,
    rate_limits: AtomicU64,
    writes: AtomicU64,
    write_failures: AtomicU64,
    batches: AtomicU64,
    writing_batches: AtomicU64,
    kills: AtomicU64,
    jumps: AtomicU64,
    /// Acks of jumped batches the store refused.
    late_acks_refused: AtomicU64,
    deliveries: AtomicU64,
    duplicates: AtomicU64,
    /// Events in flight in batches that saw a permanent embed error.
    permanent_in_flight: AtomicU64,
    dead: AtomicU64,
    /// Events the worker failed permanently whose ack was refused (lease lost): redone.
    permanent_redone: AtomicU64,
}

impl Tally {
    fn bump(n: &AtomicU64) {
        n.fetch_add(1, SeqCst);
    }

    fn kinds(&self) -> [(&'static str, u64); 8] {
        [
            ("embed timeout", self.timeouts.load(SeqCst)),
            ("embed 5xx", self.server_errors.load(SeqCst)),
            ("permanent embed error", self.permanent.load(SeqCst)),
            ("dead event", self.dead.load(SeqCst)),
            ("index write failure", self.write_failures.load(SeqCst)),
            ("worker kill", self.kills.load(SeqCst)),
            ("lease jump", self.jumps.load(SeqCst)),
            ("duplicate delivery", self.duplicates.load(SeqCst)),
        ]
    }

    fn summary(&self) -> String {
        let l = |n: &AtomicU64| n.load(SeqCst);
        format!(
            "while faults were on: embed calls {} (timeouts {}, 5xx {}, permanent {}, rate \
             limits {}); index writes {} (failed {}); batches {} (lease jumps {}, late acks \
             refused {}), writing {} \
             (killed {}); deliveries {} (duplicated {}); dead {} of {} events in flight with a \
             permanent error, {} more redone after a refused ack",
            l(&self.embed_calls),
            l(&self.timeouts),
            l(&self.server_errors),
            l(&self.permanent),
            l(&self.rate_limits),
            l(&self.writes),
            l(&self.write_failures),
            l(&self.batches),
            l(&self.jumps),
            l(&self.late_acks_refused),
            l(&self.writing_batches),
            l(&self.kills),
            l(&self.deliveries),
            l(&self.duplicates),
            l(&self.dead),
            l(&self.permanent_in_flight),
            l(&self.permanent_redone),
        )
    }
}

/// The batch the current worker thread is running (set by its runner around `run_once`).
#[derive(Default)]
struct Batch {
    /// Set on runner threads only: calls from the test thread inject nothing.
    active: bool,
    /// Whether an event was claimed (the first `on_event_start` arms the batch's faults).
    started: bool,
    /// The claimed events.
    in_flight: Vec<String>,
    /// The batch wrote to its index (its kill was rolled).
    wrote: bool,
    /// The clock jumped past the lease while the batch was in flight.
    jumped: bool,
    /// An embed call of this batch failed with the injected permanent error.
    permanent: bool,
}

thread_local! {
    static BATCH: RefCell<Batch> = RefCell::new(Batch::default());
}

/// A non-retryable failure a worker reported for an event.
#[derive(Clone)]
struct Hit {
    consumer: &'static str,
    event_id: String,
    error: String,
    /// The failure is the injected permanent embed error of this event's batch.
    injected: bool,
    /// The delivery was dead right after the ack (else the ack was refused: redone).
    dead: bool,
}

/// What the fault wrappers, observers and runners of one run share.
struct Sim {
    store: Store,
    clock: ManualClock,
    lease_ms: i64,
    /// Whether faults are injected.
    faults: AtomicBool,
    rng: Mutex<StdRng>,
    tally: Arc<Tally>,
    stop: AtomicBool,
    /// Per consumer: while set, its runners start no batch.
    hold: [AtomicBool; 3],
    /// Per consumer: runners inside `run_once`.
    busy: [AtomicUsize; 3],
    /// Runners with claimed events in flight.
    working: AtomicUsize,
    hits: Mutex<Vec<Hit>>,
    /// Expectations broken on worker threads (a panic, a late ack that made an event dead).
    broken: Mutex<Vec<String>>,
    /// Whether the provider refuses each text it has seen while faults were on.
    refused: Mutex<BTreeMap<String, bool>>,
}

impl Sim {
    /// A uniform draw in [0, 1) while faults are on, else `None`.
    fn draw(&self) -> Option<f64> {
        self.faults
            .load(SeqCst)
            .then(|| self.rng.lock().expect("rng").random())
    }

    /// Whether the provider refuses one of `texts` (each decided once, [`EMBED_PERMANENT`]).
    fn refuses(&self, texts: &[&str]) -> bool {
        let mut refused = self.refused.lock().expect("refused");
        let mut any = false;
        for t in texts {
            let r = match refused.get(*t) {
                Some(r) => *r,
                None => {
                    let r = self.roll(EMBED_PERMANENT);
                    refused.insert((*t).to_owned(), r);
                    r
                }
            };
            any |= r;
        }
        any
    }

    fn roll(&self, rate: f64) -> bool {
        self.draw().is_some_and(|r| r < rate)
    }

    /// After an index write: the first of a batch may kill the worker.
    fn after_write(&self) {
        let first = BATCH.with_borrow_mut(|b| {
            let first = b.active && !b.wrote;
            b.wrote |= first;
            first
        });
        if first && self.faults.load(SeqCst) {
            Tally::bump(&self.tally.writing_batches);
            if self.roll(WORKER_KILL) {
                Tally::bump(&self.tally.kills);
                std::panic::panic_any(Killed);
            }
        }
    }

    /// Stops new batches of `consumers` and waits for those in flight to finish.
    fn hold(&self, consumers: &[usize]) {
        for &c in consumers {
            self.hold[c].store(true, SeqCst);
        }
        while consumers.iter().any(|&c| self.busy[c].load(SeqCst) > 0) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn release(&self, consumers: &[usize]) {
        for &c in consumers {
            self.hold[c].store(false, SeqCst);
        }
    }

    fn check_broken(&self, what: &str) {
        let broken = self.broken.lock().expect("broken");
        assert!(broken.is_empty(), "{what}: {broken:?}");
    }

    /// Advances time over backoffs and expired leases while the runners work, until `done`:
    /// by 31 s when no batch is in flight, else by 2 s (live heartbeats keep their leases, so
    /// leases expire by the injected jumps and killed workers, not by the harness).
    fn settle(&self, what: &str, done: impl Fn() -> bool) {
        for _ in 0..20_000 {
            self.check_broken(what);
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
            let step = if self.working.load(SeqCst) == 0 {
                31_000
            } else {
                2_000
            };
            self.clock.advance(step);
        }
        panic!("{what}: {:?}", self.store.stats());
    }
}

/// The hashing embedder with injected faults; counts the texts it embeds.
struct FaultyEmbedder {
    inner: HashEmbedder,
    sim: Arc<Sim>,
    texts: AtomicU64,
}

impl Embedder for FaultyEmbedder {
    fn identity(&self) -> &ModelIdentity {
        self.inner.identity()
    }

    fn embed_texts(&self, texts: &[&str], timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        let t = &self.sim.tally;
        if let Some(r) = self.sim.draw() {
            Tally::bump(&t.embed_calls);
            let mut edge = EMBED_TIMEOUT;
            if r < edge {
                Tally::bump(&t.timeouts);
                return Err(EmbedError::Timeout { after: timeout });
            }
            edge += EMBED_5XX;
            if r < edge {
                Tally::bump(&t.server_errors);
                return Err(EmbedError::Provider {
                    status: Some(503),
                    message: "unavailable".into(),
                    retryable: true,
                });
            }
            edge += EMBED_RATE_LIMIT;
            if r < edge {
                Tally::bump(&t.rate_limits);
                return Err(EmbedError::RateLimited {
                    retry_after: Some(Duration::from_millis(1)),
                    message: "slow down".into(),
                });
            }
            if self.sim.refuses(texts) {
                Tally::bump(&t.permanent);
                BATCH.with_borrow_mut(|b| b.permanent = true);
                return Err(EmbedError::Provider {
                    status: Some(400),
                    message: PERMANENT.into(),
                    retryable: false,
                });
            }
        }
        self.texts.fetch_add(texts.len() as u64, SeqCst);
        self.inner.embed_texts(texts, timeout)
    }
}

/// Whether an index write call fails (while faults are on).
fn write_fails(sim: &Sim) -> bool {
    let Some(r) = sim.draw() else {
        return false;
    };
    Tally::bump(&sim.tally.writes);
    let fails = r < WRITE_FAILURE;
    if fails {
        Tally::bump(&sim.tally.write_failures);
    }
    fails
}

/// A worker target with injected write failures, kills and lease jumps; its writes also
/// fail while `failing` is set (an outage).
struct FaultyTarget {
    inner: Arc<dyn IndexTarget>,
    sim: Arc<Sim>,
    failing: AtomicBool,
}

impl IndexTarget for FaultyTarget {
    fn kind(&self) -> IndexKind {
        self.inner.kind()
    }
    fn uses_vectors(&self) -> bool {
        self.inner.uses_vectors()
    }
    fn bind_model(&self, model: &ModelIdentity) -> ce_index::Result<()> {
        self.inner.bind_model(model)
    }
    fn get(&self, uris: &[CtxUri]) -> ce_index::Result<Vec<StoredRecord>> {
        self.inner.get(uris)
    }
    fn vectors(&self, uris: &[CtxUri]) -> ce_index::Result<Vec<StoredVector>> {
        self.inner.vectors(uris)
    }
    fn list_under(&self, uri: &CtxUri) -> ce_index::Result<Vec<StoredRecord>> {
        self.inner.list_under(uri)
    }
    fn write_nodes(
        &self,
        writes: &[NodeWrite],
    ) -> ce_index::Result<Vec<ce_index::Result<SyncOutcome>>> {
        let out = if self.failing.load(SeqCst) {
            Err(IndexError::Unavailable("injected outage".into()))
        } else if write_fails(&self.sim) {
            Err(IndexError::Unavailable("injected write failure".into()))
        } else {
            self.inner.write_nodes(writes)
        };
        self.sim.after_write();
        out
    }
}

/// Tracks the events in flight, jumps the clock past the lease of some claimed batches, and
/// records every non-retryable failure a worker of `consumer` reports.
struct Observer {
    sim: Arc<Sim>,
    consumer: &'static str,
    worker_id: String,
}

impl WorkerCallbacks for Observer {
    fn on_event_start(&self, event: &OutboxEvent) -> Result<(), String> {
        let first = BATCH.with_borrow_mut(|b| {
            b.in_flight.push(event.event_id.clone());
            let first = b.active && !b.started;
            b.started |= first;
            first
        });
        if first {
            self.sim.working.fetch_add(1, SeqCst);
            if self.sim.faults.load(SeqCst) {
                Tally::bump(&self.sim.tally.batches);
            }
            if self.sim.roll(LEASE_JUMP) {
                Tally::bump(&self.sim.tally.jumps);
                BATCH.with_borrow_mut(|b| b.jumped = true);
                self.sim.clock.advance(self.sim.lease_ms + 1_000);
            }
        }
        Ok(())
    }

    fn on_event_success(&self, event: &OutboxEvent, _latency_ms: u64) -> Result<(), String> {
        if !BATCH.with_borrow(|b| b.jumped) {
            return Ok(());
        }
        // A late ack is refused: it succeeds only when another worker already applied the
        // event (the claim of record is then that worker's).
        let (_, deliveries) = self
            .sim
            .store
            .show(&event.event_id)
            .map_err(|e| e.to_string())?;
        let d = deliveries.iter().find(|d| d.consumer == self.consumer);
        if d.is_none_or(|d| {
            d.status != DeliveryStatus::Done || d.claimed_by.as_deref() == Some(&self.worker_id)
        }) {
            self.sim.broken.lock().expect("broken").push(format!(
                "{}: the late ack of {} was accepted: {d:?}",
                self.worker_id, event.event_id
            ));
        }
        Ok(())
    }

    fn on_event_failure(
        &self,
        event: &OutboxEvent,
        error: &WorkError,
        retryable: bool,
    ) -> Result<(), String> {
        if retryable {
            return Ok(());
        }
        let (permanent, in_flight) =
            BATCH.with_borrow(|b| (b.permanent, b.in_flight.contains(&event.event_id)));
        let dead = self
            .sim
            .store
            .show(&event.event_id)
            .map_err(|e| e.to_string())?
            .1
            .iter()
            .any(|d| {
                d.consumer == self.consumer
                    && d.status == DeliveryStatus::Dead
                    && d.last_error
                        .as_deref()
                        .is_some_and(|m| m.contains(PERMANENT))
            });
        self.sim.hits.lock().expect("hits").push(Hit {
            consumer: self.consumer,
            event_id: event.event_id.clone(),
            error: error.message.clone(),
            injected: permanent && in_flight && error.message.contains(PERMANENT),
            dead,
        });
        Ok(())
    }
}

/// Runs `worker` (of consumer `c`) until the run stops, batch after batch; a killed batch
/// starts the worker over (it keeps no state: its claims simply expire).
fn run_worker(worker: &IndexWorker, c: usize, sim: &Sim) {
    while !sim.stop.load(SeqCst) {
        if sim.hold[c].load(SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        sim.busy[c].fetch_add(1, SeqCst);
        if sim.hold[c].load(SeqCst) {
            sim.busy[c].fetch_sub(1, SeqCst);
            continue;
        }
        BATCH.with_borrow_mut(|b| {
            *b = Batch {
                active: true,
                ..Batch::default()
            }
        });
        let ran = catch_unwind(AssertUnwindSafe(|| worker.run_once(16)));
        let batch = BATCH.take();
        if batch.started {
            sim.working.fetch_sub(1, SeqCst);
        }
        if batch.permanent {
            sim.tally
                .permanent_in_flight
                .fetch_add(batch.in_flight.len() as u64, SeqCst);
        }
        sim.busy[c].fetch_sub(1, SeqCst);
        match ran {
            Ok(Ok(r)) => {
                if batch.jumped {
                    if r.failed > 0 {
                        sim.broken.lock().expect("broken").push(format!(
                            "{}: a batch whose lease expired made {} events dead",
                            worker.config().worker_id,
                            r.failed
                        ));
                    }
                    // Every ack of the batch but those of events already done elsewhere.
                    sim.tally
                        .late_acks_refused
                        .fetch_add(r.retried as u64, SeqCst);
                }
                if r.claimed == 0 {
                    std::thread::sleep(Duration::from_millis(3));
                }
            }
            // The claim itself failed (e.g. the store was busy): try again.
            Ok(Err(_)) => std::thread::sleep(Duration::from_millis(1)),
            Err(p) if p.is::<Killed>() => {}
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                let id = &worker.config().worker_id;
                sim.broken
                    .lock()
                    .expect("broken")
                    .push(format!("worker {id} panicked: {msg}"));
                return;
            }
        }
    }
}

/// The runner threads of one run; dropping it stops and joins them.
struct Runners {
    sim: Arc<Sim>,
    threads: Vec<JoinHandle<()>>,
}

impl Runners {
    fn start(sim: &Arc<Sim>, workers: Vec<(usize, IndexWorker)>) -> Runners {
        let threads = workers
            .into_iter()
            .map(|(c, w)| {
                let sim = sim.clone();
                std::thread::spawn(move || run_worker(&w, c, &sim))
            })
            .collect();
        Runners {
            sim: sim.clone(),
            threads,
        }
    }
}

impl Drop for Runners {
    fn drop(&mut self) {
        self.sim.stop.store(true, SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn env(backend: Backend) -> Env {
    Env::on(backend, &CONSUMERS, |cfg| cfg.index.outbox.max_retries = 20)
}

fn wcfg(id: &str, consumer: &str) -> WorkerConfig {
    let mut c = worker_config(id, consumer);
    c.default_rate_limit_pause = Duration::from_millis(1);
    // Several index writes per batch, so chunking is exercised everywhere.
    c.vector_upsert_batch_size = 5;
    c
}

/// The projection of the whole source, as the vector and keyword indexes must hold it.
pub(crate) fn expected_records(env: &Env) -> BTreeMap<String, IndexRecord> {
    let p = IndexProjector::default();
    env.store
        .read_subtree(&CtxUri::root())
        .expect("read")
        .iter()
        .flat_map(|n| p.build_context_records(n).records)
        .map(|r| (r.id.clone(), r))
        .collect()
}

pub(crate) fn records_of(target: &dyn IndexTarget) -> BTreeMap<String, IndexRecord> {
    target
        .list_under(&CtxUri::root())
        .expect("list")
        .into_iter()
        .map(|s| (s.record.id.clone(), s.record))
        .collect()
}

/// What a failed check needs to be understood without a replay (the workers' interleaving is
/// not fixed by the seed): for each URI of `records` (`uri#level`), the source's state and the
/// journal's events that touched it or an ancestor, with their delivery to `consumer`.
fn history<'a>(env: &Env, consumer: &str, records: impl Iterator<Item = &'a String>) -> String {
    let uris: BTreeSet<&str> = records.filter_map(|r| r.split('#').next()).collect();
    let mut rows = Vec::new();
    let mut after_seq = None;
    loop {
        let page = env
            .store
            .list(&ce_store::OutboxFilter {
                consumer: Some(consumer.to_owned()),
                after_seq,
                limit: Some(ce_store::MAX_LIST_LIMIT),
                ..ce_store::OutboxFilter::default()
            })
            .expect("list");
        after_seq = page.last().map(|r| r.event.seq);
        let done = page.len() < ce_store::MAX_LIST_LIMIT as usize;
        rows.extend(page);
        if done {
            break;
        }
    }
    let mut out = String::new();
    for u in uris {
        let at = uri(u);
        let touches = |p: &CtxUri| at.is_within(p) || p.is_within(&at);
        out.push_str(&format!(
            "{u}: source {:?}\n",
            env.store
                .versions(std::slice::from_ref(&at))
                .expect("versions")
        ));
        for r in &rows {
            let hit = match &r.event.payload {
                EventPayload::UpsertContext(p) => touches(&p.uri),
                EventPayload::DeleteContext(p) => touches(&p.uri),
                EventPayload::MoveContext(p) => touches(&p.from_uri) || touches(&p.to_uri),
                _ => false,
            };
            if hit {
                out.push_str(&format!(
                    "  seq {} {:?} -> {:?} retries {}\n",
                    r.event.seq, r.event.payload, r.delivery.status, r.delivery.retry_count
                ));
            }
        }
    }
    out
}

/// Missing, extra and stale records of `got` against `want`.
pub(crate) fn diff(
    want: &BTreeMap<String, IndexRecord>,
    got: &BTreeMap<String, IndexRecord>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let show = |r: &IndexRecord| format!("{}#{}", r.uri, r.level);
    let missing = want
        .iter()
        .filter(|(k, _)| !got.contains_key(*k))
        .map(|(_, r)| show(r))
        .collect();
    let extra = got
        .iter()
        .filter(|(k, _)| !want.contains_key(*k))
        .map(|(_, r)| show(r))
        .collect();
    let stale = want
        .iter()
        .filter(|(k, r)| got.get(*k).is_some_and(|g| g != *r))
        .map(|(_, r)| show(r))
        .collect();
    (missing, extra, stale)
}

/// One random write; what it committed, if anything (refused writes are part of the game).
fn random_write(env: &Env, rng: &mut StdRng) -> Option<WriteOutcome> {
    let names = ["a", "b", "c", "d"];
    let pick = |rng: &mut StdRng| {
        let depth = rng.random_range(1..=3);
        let segs: Vec<&str> = (0..depth)
            .map(|_| names[rng.random_range(0..names.len())])
            .collect();
        uri(&format!("ctx://acc/{}", segs.join("/")))
    };
    let u = pick(rng);
    let res = match rng.random_range(0..100) {
        0..=41 => {
            let req = PutRequest {
                abstract_text: Some(format!("abs {}", rng.random_range(0..20))),
                content: Some(format!("content {}", rng.random_range(0..20))),
                ..PutRequest::default()
            };
            env.store.put(&u, req)
        }
        42..=56 => {
            let mut req = PutRequest {
                mode: PutMode::Merge,
                ..PutRequest::default()
            };
            req.meta
                .insert("k".into(), serde_json::json!(rng.random_range(0..5)));
            env.store.put(&u, req)
        }
        57..=68 => env.store.mv(&u, &pick(rng), None),
        69..=78 => env.store.rm(&u, true, None, None),
        79..=91 => env.store.link(LinkRequest {
            from: u,
            to: pick(rng),
            relation_type: ["rel", "cites"][rng.random_range(0..2)].into(),
            weight: 1.0,
            reason: String::new(),
            trace_id: None,
        }),
        _ => {
            let e = unless_refused(env.store.get_edges(&u))?.first().cloned()?;
            env.store.unlink(&u, &e.to_uri, &e.relation_type, None)
        }
    };
    unless_refused(res)
}

fn converge(backend: Backend, seed: u64, writes: usize, tally: &Arc<Tally>) {
    let env = env(backend);
    let sim = Arc::new(Sim {
        store: env.store.clone(),
        clock: env.clock.clone(),
        lease_ms: i64::from(Config::default().index.worker.lease_seconds) * 1000,
        faults: AtomicBool::new(true),
        rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)),
        tally: tally.clone(),
        stop: AtomicBool::new(false),
        hold: Default::default(),
        busy: Default::default(),
        working: AtomicUsize::new(0),
        hits: Mutex::new(Vec::new()),
        broken: Mutex::new(Vec::new()),
        refused: Mutex::new(BTreeMap::new()),
    });
    let emb = Arc::new(FaultyEmbedder {
        inner: HashEmbedder::new(16),
        sim: sim.clone(),
        texts: AtomicU64::new(0),
    });
    let vector_index = Arc::new(MemoryVectorIndex::new());
    let vector = Arc::new(FaultyTarget {
        inner: Arc::new(VectorTarget(vector_index.clone())),
        sim: sim.clone(),
        failing: AtomicBool::new(false),
    });
    let keyword = Arc::new(FaultyTarget {
        inner: Arc::new(KeywordTarget(Arc::new(MemoryKeywordIndex::new()))),
        sim: sim.clone(),
        // The keyword outage: every write fails for the first half of the history.
        failing: AtomicBool::new(true),
    });
    let relation_index = Arc::new(MemoryRelationIndex::new());
    // Relation writes with injected failures, kills and lease jumps.
    let relations = {
        let sim = sim.clone();
        WrappedRelations::new(relation_index.clone(), move |inner, writes| {
            let out = if write_fails(&sim) {
                Err(IndexError::Unavailable("injected write failure".into()))
            } else {
                inner.write_owners(writes)
            };
            sim.after_write();
            out
        })
    };

    let mut workers: Vec<(usize, IndexWorker)> = Vec::new();
    for i in 0..4 {
        let observer = |c: usize| -> Arc<dyn WorkerCallbacks> {
            Arc::new(Observer {
                sim: sim.clone(),
                consumer: CONSUMERS[c],
                worker_id: format!("{}-{i}", CONSUMERS[c]),
            })
        };
        let w = |c: usize, target: Arc<dyn IndexTarget>, e: Option<Arc<dyn Embedder>>| {
            let consumer = CONSUMERS[c];
            IndexWorker::for_target(
                wcfg(&format!("{consumer}-{i}"), consumer),
                env.store.clone(),
                target,
                e,
                IndexProjector::default(),
            )
            .expect("worker")
            .with_callback(observer(c))
        };
        let e: Arc<dyn Embedder> = emb.clone();
        workers.push((VECTOR, w(VECTOR, vector.clone(), Some(e))));
        workers.push((KEYWORD, w(KEYWORD, keyword.clone(), None)));
        let r: Arc<dyn RelationIndex> = relations.clone();
        let rw = IndexWorker::for_relations(
            wcfg(&format!("relation-{i}"), "relation"),
            env.store.clone(),
            r,
        )
        .expect("relation worker")
        .with_callback(observer(RELATION));
        workers.push((RELATION, rw));
    }
    let runners = Runners::start(&sim, workers);

    let mut rng = StdRng::seed_from_u64(seed);
    // Duplicates to deliver: (due at write, consumer, payload).
    let mut duplicates: Vec<(usize, &str, EventPayload)> = Vec::new();
    let deliver_duplicates = |due: usize, duplicates: &mut Vec<(usize, &str, EventPayload)>| {
        let (now, later): (Vec<_>, Vec<_>) = duplicates.drain(..).partition(|d| d.0 <= due);
        *duplicates = later;
        for (_, consumer, payload) in now {
            env.store
                .append_batch_for(&[consumer.to_owned()], vec![OutboxEventCreate { payload }])
                .expect("duplicate");
            Tally::bump(&tally.duplicates);
        }
    };
    for i in 0..writes {
        if i == writes / 2 {
            // The end of the keyword index's outage: meanwhile the other consumers caught up
            // completely, while every keyword write failed.
            sim.settle(
                &format!("seed {seed}: vector and relation did not catch up"),
                || env.open_deliveries(Some("vector")) + env.open_deliveries(Some("relation")) == 0,
            );
            // The keyword consumer shows its failure once a batch of it has failed: on a loaded
            // machine its first batch may still be in flight here (claimed, no error yet).
            let shows_failure = || {
                let k = env
                    .store
                    .stats()
                    .expect("stats")
                    .into_iter()
                    .find(|s| s.consumer == "keyword")
                    .expect("keyword");
                k.pending + k.claimed + k.retry_wait + k.dead > 0 && k.last_error.is_some()
            };
            sim.settle(
                &format!("seed {seed}: the failing keyword consumer shows no failure"),
                shows_failure,
            );
            // No keyword batch is in flight across the fix, so none that saw the outage can
            // go dead after the requeue.
            sim.hold(&[KEYWORD]);
            keyword.failing.store(false, SeqCst);
            // What the outage made dead is requeued, as an operator would after the fix.
            env.store
                .requeue_dead(Some("keyword"), None)
                .expect("requeue");
            sim.release(&[KEYWORD]);
        }
        if let Some(o) = random_write(&env, &mut rng) {
            for id in &o.event_ids {
                for consumer in CONSUMERS {
                    Tally::bump(&tally.deliveries);
                    if rng.random::<f64>() < DUPLICATE {
                        let (event, _) = env.store.show(id).expect("show");
                        let due = i + rng.random_range(0..10);
                        duplicates.push((due, consumer, event.payload));
                    }
                }
            }
        }
        deliver_duplicates(i, &mut duplicates);
        if i % 10 == 0 {
            env.clock.advance(rng.random_range(0..5_000));
            std::thread::sleep(Duration::from_millis(rng.random_range(0..3)));
        }
    }
    deliver_duplicates(usize::MAX, &mut duplicates);

    // The faults stop and the outbox drains.
    sim.faults.store(false, SeqCst);
    // A history whose last removals emptied the tree ends with one put, so that the checks
    // below compare indexes holding something.
    if expected_records(&env).is_empty() {
        let req = PutRequest {
            content: Some("the last word".into()),
            ..PutRequest::default()
        };
        env.store.put(&uri("ctx://acc/z"), req).expect("final put");
    }
    let all_open = || env.open_deliveries(None) == 0;
    sim.settle(&format!("seed {seed}: outbox did not drain"), all_open);
    // No ack is then between its store write and its report.
    let all = [VECTOR, KEYWORD, RELATION];
    sim.hold(&all);
    sim.check_broken(&format!("seed {seed}"));
    let hits = sim.hits.lock().expect("hits").clone();
    let stray: Vec<String> = hits
        .iter()
        .filter(|h| !h.injected)
        .map(|h| format!("{} {}: {}", h.consumer, h.event_id, h.error))
        .collect();
    assert!(
        stray.is_empty(),
        "seed {seed}: non-retryable failures that were not injected: {stray:?}"
    );
    let injected: BTreeSet<(String, String)> = hits
        .iter()
        .filter(|h| h.dead)
        .map(|h| (h.consumer.to_owned(), h.event_id.clone()))
        .collect();
    let dead: BTreeSet<(String, String)> = env
        .dead()
        .into_iter()
        .map(|r| (r.delivery.consumer, r.event.event_id))
        .collect();
    assert_eq!(
        dead, injected,
        "seed {seed}: the dead set (left) is not the injected-permanent set (right)"
    );
    tally.dead.fetch_add(dead.len() as u64, SeqCst);
    let redone: BTreeSet<(&str, &str)> = hits
        .iter()
        .filter(|h| !h.dead)
        .map(|h| (h.consumer, h.event_id.as_str()))
        .collect();
    tally
        .permanent_redone
        .fetch_add(redone.len() as u64, SeqCst);
    // The operator requeues them once the provider is fixed; they drain without faults.
    let requeued = env.store.requeue_dead(None, None).expect("requeue");
    assert_eq!(requeued, dead.len() as u64, "seed {seed}: requeued");
    sim.release(&all);
    sim.settle(
        &format!("seed {seed}: the requeued events did not drain"),
        all_open,
    );

    let check = |phase: &str| {
        sim.check_broken(&format!("seed {seed}, {phase}"));
        let want = expected_records(&env);
        assert!(
            !want.is_empty(),
            "seed {seed}: the simulation left nothing to index"
        );
        for (name, got) in [
            ("vector", records_of(vector.as_ref())),
            ("keyword", records_of(keyword.as_ref())),
        ] {
            let (missing, extra, stale) = diff(&want, &got);
            assert!(
                missing.is_empty() && extra.is_empty() && stale.is_empty(),
                "seed {seed}, {phase}, {name}: missing {missing:?} extra {extra:?} stale {stale:?}\n{}",
                history(&env, name, missing.iter().chain(&extra).chain(&stale))
            );
        }
        let edges = relation_index.list_under(&CtxUri::root()).expect("edges");
        assert_eq!(
            edges,
            expected_edges(&env.store),
            "seed {seed}, {phase}: relation"
        );
        // Every consumer is applied_valid: lag 0 and nothing dead.
        for s in env.store.stats().expect("stats") {
            assert_eq!(
                (s.pending + s.claimed + s.retry_wait, s.dead),
                (0, 0),
                "seed {seed}, {phase}: {s:?}"
            );
        }
        // Every stored vector is the embedding of its record's current text.
        let stored = vector_index.list_under(&CtxUri::root()).expect("list");
        let nodes: Vec<CtxUri> = stored
            .iter()
            .map(|s| s.record.uri.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let vectors: BTreeMap<String, StoredVector> = vector_index
            .vectors(&nodes)
            .expect("vectors")
            .into_iter()
            .map(|v| (v.id.clone(), v))
            .collect();
        for s in &stored {
            let want = emb
                .inner
                .embed_texts(&[&s.record.text], Duration::from_secs(5))
                .expect("embed");
            let got = vectors.get(&s.record.id);
            let hash = s
                .record
                .metadata
                .get("content_hash")
                .and_then(|h| h.as_str());
            assert!(
                got.is_some_and(|v| want
                    .first()
                    .is_some_and(|w| v.vector == ce_embed::half::round(w))
                    && v.text_hash.as_deref() == hash),
                "seed {seed}: the vector of {} level {} is not its text's: {got:?}, want {want:?}\n{}",
                s.record.uri,
                s.record.level,
                history(
                    &env,
                    "vector",
                    [format!("{}#{}", s.record.uri, s.record.level)].iter()
                )
            );
        }
    };
    check("after the faults");

    // A metadata-only update of every node: every index follows, nothing is embedded.
    let texts_before = emb.texts.load(SeqCst);
    for n in env.store.read_subtree(&CtxUri::root()).expect("read") {
        let mut req = PutRequest {
            mode: PutMode::Merge,
            ..PutRequest::default()
        };
        req.meta
            .insert("phase".into(), serde_json::json!("meta-only"));
        env.store.put(&n.uri, req).expect("meta put");
    }
    sim.settle(
        &format!("seed {seed}: meta-only updates did not drain"),
        all_open,
    );
    drop(runners);
    check("after the metadata-only updates");
    assert_eq!(
        emb.texts.load(SeqCst),
        texts_before,
        "seed {seed}: a metadata-only update was embedded"
    );
}
