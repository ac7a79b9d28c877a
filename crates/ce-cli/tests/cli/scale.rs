//! Scale-out through the real binary (issue 6): several `ce worker` processes share one
//! PostgreSQL outbox and write to one pgvector destination.
//!
//! The embedding provider is the loopback OpenAI-compatible endpoint of
//! [`super::fake_embeddings`] with injected failures: a request with a text marked POISON is
//! refused for good (400 for the whole request; the worker splits it until the POISON text is
//! alone), a request with a text marked FLAKY fails twice with 503 and then succeeds (retried,
//! then done). The dead deliveries must be exactly those of the POISON nodes: no innocent node
//! that shared a request with a POISON text dies. The endpoint sees every embedding in flight;
//! every node's text is unique, so one text in flight twice would be one event applied by two
//! workers at once.
//!
//! - `four_worker_processes_share_fifty_thousand_events`: 4 processes, 50,000 events, one
//!   process killed with SIGKILL mid-run and replaced;
//! - `workers_reconnect_after_their_connections_are_killed`: the server terminates every
//!   connection of the database (`pg_terminate_backend`) repeatedly mid-run.
//!
//! Both end with: every delivery done or dead, dead exactly for the poisoned nodes, and the
//! pgvector table holding exactly the records the projection of the source gives.

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_core::{Config, CtxUri, IndexProjector};
use ce_store::postgres::PgStore;
use ce_store::{ConsumerStats, ContextFs as _, OutboxStore as _, PutRequest, WriteOp};
use ce_testkit::pg::TestDb;

use super::fake_embeddings::{FLAKY, FakeEmbeddings, POISON};
use super::harness::Ce;

/// One store database, one pgvector database, the fake provider and the config they share.
struct Cluster {
    db: TestDb,
    vectors: TestDb,
    fake: FakeEmbeddings,
    config: String,
    store: Arc<PgStore>,
}

impl Cluster {
    fn new(label: &str) -> Cluster {
        let db = TestDb::create(label);
        let vectors = ce_testkit::pgvector::test_db(label);
        let fake = FakeEmbeddings::start(false);
        let config = format!(
            "{}[store]\nurl = \"{}\"\n\
             [index.outbox]\nconsumers = [\"vector\"]\nretry_base_seconds = 1\n\
             retry_max_seconds = 30\nmax_retries = 10\n\
             [index.worker]\npoll_interval_ms = 200\nclaim_limit = 100\n\
             [index.vector]\ndestination = \"pgvector\"\npgvector_url = \"{}\"\n",
            fake.embedding_config(8),
            db.url(),
            vectors.url()
        );
        let cfg = Config::from_toml(&config).expect("config");
        let store = Arc::new(PgStore::open(db.url(), cfg).expect("open store"));
        Cluster {
            db,
            vectors,
            fake,
            config,
            store,
        }
    }

    /// Writes `parents × leaves` nodes (each with a unique text; every 97th poisoned, every
    /// 53rd flaky); returns the URIs of the poisoned ones.
    fn seed(&self, parents: usize, leaves: usize) -> Seeded {
        let mut poisoned = BTreeSet::new();
        for p in 0..parents {
            let mut ops = Vec::with_capacity(leaves);
            for l in 0..leaves {
                let i = p * leaves + l;
                let uri = format!("ctx://acc/resources/p{p}/n{l}");
                let mark = if i % 97 == 13 {
                    poisoned.insert(uri.clone());
                    POISON
                } else if i % 53 == 7 {
                    FLAKY
                } else {
                    ""
                };
                ops.push(WriteOp::Put {
                    uri: CtxUri::parse(&uri).expect("uri"),
                    req: PutRequest {
                        abstract_text: Some(format!("node {i} {mark} in p{p}")),
                        ..PutRequest::default()
                    },
                });
            }
            self.store.apply_batch(ops).expect("seed batch");
        }
        Seeded { poisoned }
    }

    /// A worker process with its own data directory; its log (`info`, the default of
    /// `ce worker`) goes to [`WORKER_LOG`] there, shown when the run stalls
    /// ([`Cluster::wait_settled`]).
    fn worker(&self) -> (Ce, Child) {
        let ce = Ce::new();
        ce.write_config(&self.config);
        let log = std::fs::File::create(ce.data_dir().join(WORKER_LOG)).expect("worker log");
        let child = ce
            .command(&["worker", "--consumer", "vector", "--workers", "2"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("ce worker starts");
        (ce, child)
    }

    /// The outbox counts of the vector consumer.
    fn vector_stats(&self) -> ConsumerStats {
        self.store
            .stats()
            .expect("stats")
            .into_iter()
            .find(|s| s.consumer == "vector")
            .expect("vector stats")
    }

    /// (done, dead, open) deliveries of the vector consumer.
    fn progress(&self) -> (u64, u64, u64) {
        let s = self.vector_stats();
        (s.done, s.dead, s.pending + s.claimed + s.retry_wait)
    }

    /// Waits until no delivery is open, failing after `timeout` with the state of every
    /// delivery and of every worker process (exit status and the end of its log).
    fn wait_settled(&self, timeout: Duration, workers: &mut [(Ce, Child)]) {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.vector_stats();
            if s.pending + s.claimed + s.retry_wait == 0 {
                return;
            }
            if Instant::now() >= deadline {
                let mut report = format!(
                    "not settled after {timeout:?}: {} done, {} dead, {} pending, {} claimed, \
                     {} retrying\n",
                    s.done, s.dead, s.pending, s.claimed, s.retry_wait
                );
                for (ce, child) in workers.iter_mut() {
                    let log =
                        std::fs::read_to_string(ce.data_dir().join(WORKER_LOG)).unwrap_or_default();
                    let lines: Vec<&str> = log.lines().collect();
                    let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                    report.push_str(&format!(
                        "--- worker {} (exit: {:?}), last lines of its log:\n{tail}\n",
                        ce.data_dir().display(),
                        child.try_wait().expect("wait")
                    ));
                }
                panic!("{report}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The final checks shared by the tests.
    fn check(&self, seeded: &Seeded, events: u64) {
        let poisoned = &seeded.poisoned;
        let (done, dead, open) = self.progress();
        assert_eq!(open, 0);
        assert_eq!(
            done + dead,
            events,
            "every event is done or dead, none lost"
        );
        // Dead exactly for the poisoned nodes.
        let mut db = ce_testkit::pg::connect(self.db.url());
        let dead_uris: BTreeSet<String> = db
            .query(
                "SELECT e.uri FROM deliveries d JOIN events e ON e.seq = d.seq
                 WHERE d.consumer = 'vector' AND d.status = 5",
                &[],
            )
            .expect("dead deliveries")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let missed: Vec<_> = poisoned.difference(&dead_uris).take(5).collect();
        assert!(missed.is_empty(), "poisoned nodes not dead: {missed:?}");
        let innocent: Vec<_> = dead_uris.difference(poisoned).take(5).collect();
        assert!(innocent.is_empty(), "innocent nodes dead: {innocent:?}");
        assert_eq!(
            self.fake.overlaps(),
            0,
            "an event was embedded by two workers at once"
        );

        // The pgvector table equals the projection of the source, minus poisoned nodes.
        let projector = IndexProjector::default();
        let root = CtxUri::parse("ctx://acc").expect("uri");
        let mut expected = BTreeSet::new();
        for n in self.store.read_subtree(&root).expect("subtree") {
            if dead_uris.contains(n.uri.as_str()) {
                continue;
            }
            for r in projector.build_context_records(&n).records {
                expected.insert(r.id);
            }
        }
        let mut c = ce_testkit::pg::connect(self.vectors.url());
        let stored: BTreeSet<String> = c
            .query(&format!("SELECT id FROM {}", VECTOR_TABLE), &[])
            .expect("read pgvector records")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let missing: Vec<_> = expected.difference(&stored).take(5).collect();
        let extra: Vec<_> = stored.difference(&expected).take(5).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "pgvector differs from the projection: {} expected, {} stored; missing {missing:?}, extra {extra:?}",
            expected.len(),
            stored.len()
        );
    }
}

/// What [`Cluster::seed`] wrote.
struct Seeded {
    poisoned: BTreeSet<String>,
}

/// A worker process's log, in its data directory.
const WORKER_LOG: &str = "worker.log";

/// The pgvector destination's record table.
const VECTOR_TABLE: &str = "ce_vector_records";

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn four_worker_processes_share_fifty_thousand_events() {
    let cluster = Cluster::new("scale4");
    // 50,000 leaves under 200 parents, plus the parents and their two ancestors.
    let seeded = cluster.seed(200, 250);
    let events = cluster.progress().2;
    assert_eq!(events, 50_202);

    let mut workers: Vec<(Ce, Child)> = (0..4).map(|_| cluster.worker()).collect();
    // Kill one process mid-run (SIGKILL: its claims stay until their leases expire) and
    // start a replacement.
    let started = Instant::now();
    while cluster.progress().0 < events / 4 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no progress: {:?}",
            cluster.progress()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    kill(&mut workers[0].1);
    workers[0] = cluster.worker();

    cluster.wait_settled(Duration::from_secs(600), &mut workers);
    for (_, child) in &mut workers {
        kill(child);
    }
    cluster.check(&seeded, events);
}

#[test]
fn workers_reconnect_after_their_connections_are_killed() {
    let cluster = Cluster::new("reconnect");
    let seeded = cluster.seed(20, 200);
    let events = cluster.progress().2;
    let mut workers: Vec<(Ce, Child)> = (0..2).map(|_| cluster.worker()).collect();
    // Kill every connection to the store database several times while the workers run.
    let mut killed = 0;
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(400));
        killed += cluster.db.terminate_connections();
    }
    assert!(killed > 0, "the workers were connected");
    cluster.wait_settled(Duration::from_secs(300), &mut workers);
    for (ce, child) in &mut workers {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "a worker exited instead of reconnecting ({})",
            ce.data_dir().display()
        );
        kill(child);
    }
    cluster.check(&seeded, events);
}
