//! Shared helpers: the backends under test, seeds, whole-store snapshots and the
//! source-of-truth invariants every suite checks.
//!
//! Every suite goes through the backend traits and runs on each [`Backend`]: a test body is
//! a function of the backend, and [`backend_tests!`] generates its `sqlite::` and
//! `postgres::` `#[test]`s. The PostgreSQL variants use a fresh database of the machine's
//! server (`ce_testkit::pg`); they fail, never skip, when it is unreachable.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use ce_core::{
    Classify, Clock, Config, ContextNode, CtxUri, ErrorCode, EventPayload, ManualClock, Millis,
    OutboxEvent, RelationEdge,
};
use ce_store::postgres::PgStore;
use ce_store::{
    DeliveryRow, Failure, Job, JobFilter, MAX_LIST_LIMIT, NodeStamp, OutboxFilter, SourceStore,
    SqliteStore, StoreError,
};

/// A fixed start time for manual clocks (2026-03-14T10:00:00Z).
pub const T0: i64 = 1_773_482_400_000;

/// A store under test, whatever its backend.
pub type Store = Arc<dyn SourceStore>;

pub use ce_testkit::backend_tests;
pub use ce_testkit::backends::{Backend, Place};

/// Opens (or reopens) the store that lives in a [`Place`].
pub trait OpenStore {
    /// The store of this place, on `clock`.
    fn open(&self, config: Config, clock: Arc<dyn Clock>) -> Store;
}

impl OpenStore for Place {
    fn open(&self, config: Config, clock: Arc<dyn Clock>) -> Store {
        match self {
            Place::Dir(dir) => Arc::new(
                SqliteStore::open_with_clock(dir.path(), config, clock).expect("open sqlite store"),
            ),
            Place::Db(db) => Arc::new(
                PgStore::open_with_clock(db.url(), config, clock).expect("open postgres store"),
            ),
        }
    }
}

/// A store of `backend` in a fresh place with a manual clock at [`T0`]. Bind the place
/// (`let (_place, s, clock) = ...`): the store lives as long as it.
pub fn fresh(backend: Backend, config: Config) -> (Place, Store, ManualClock) {
    let place = backend.place();
    let clock = ManualClock::new(T0);
    let store = place.open(config, Arc::new(clock.clone()));
    (place, store, clock)
}

/// Opens a `SqliteStore` in `dir`, for the suites about SQLite files (crash).
pub fn open(dir: &Path, config: Config, clock: Arc<dyn Clock>) -> SqliteStore {
    SqliteStore::open_with_clock(dir, config, clock).expect("open store")
}

/// The configuration of the outbox suites: two consumers, spec defaults otherwise.
pub fn two_consumers() -> Config {
    let mut c = Config::default();
    c.index.outbox.consumers = vec!["vector".into(), "keyword".into()];
    c
}

/// The failure of a claimed delivery with `code`, classified `retryable`.
pub fn failure(message: &str, code: ErrorCode, retryable: bool) -> Failure<'_> {
    Failure {
        code,
        retryable,
        message,
    }
}

/// Parses a URI literal.
pub fn uri(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("valid uri literal")
}

pub use ce_testkit::seed;

/// A model test's move of the manual clock.
#[derive(Debug, Clone, Copy)]
pub enum Advance {
    /// A fixed step.
    By(Millis),
    /// Exactly onto the nearest future deadline (a run-at or a lease end).
    ToNextDeadline,
    /// One millisecond before the nearest future deadline.
    JustBeforeNextDeadline,
}

impl Advance {
    /// The time to move to from `now`, given the nearest future deadline; `None` when the
    /// clock stays.
    pub fn target(self, now: Millis, next_deadline: Option<Millis>) -> Option<Millis> {
        let to = match self {
            Advance::By(ms) => Some(now + ms),
            Advance::ToNextDeadline => next_deadline,
            Advance::JustBeforeNextDeadline => next_deadline.map(|t| t - 1),
        };
        to.filter(|t| *t > now)
    }
}

/// The answer of one model-test step: what differs from the model, if anything.
pub type Step = Result<(), String>;

/// Returns a [`Step`] failure with the formatted message unless `$cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}
pub(crate) use ensure;

/// Runs the steps of one model-test case in order, `step` applying one op and comparing the
/// store with the model; the first failure names its step and op.
pub fn check_steps<O: std::fmt::Debug>(
    ops: &[O],
    mut step: impl FnMut(usize, &O) -> Step,
) -> Result<(), proptest::test_runner::TestCaseError> {
    for (i, op) in ops.iter().enumerate() {
        step(i, op).map_err(|e| {
            proptest::test_runner::TestCaseError::fail(format!("step {i} {op:?}: {e}"))
        })?;
    }
    Ok(())
}

/// Runs the model-based property test `name`: `cases` cases of `strategy` (scaled by
/// `CE_PROPTEST_CASES`), seeded by [`seed`], each run by `case` on one place of `backend`
/// that the case resets (a database per case would cost more than the case on PostgreSQL).
/// Panics with the seed to replay and the minimal failing case.
pub fn run_model<S>(
    name: &str,
    backend: Backend,
    cases: u32,
    strategy: S,
    case: impl Fn(&mut Place, S::Value) -> Result<(), proptest::test_runner::TestCaseError>,
) where
    S: proptest::strategy::Strategy,
    S::Value: std::fmt::Debug,
{
    use proptest::test_runner::TestError;
    let seed = seed(name);
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(cases), 4096);
    let place = std::cell::RefCell::new(backend.place());
    match runner.run(&strategy, |v| case(&mut place.borrow_mut(), v)) {
        Ok(()) => {}
        Err(TestError::Fail(why, v)) => {
            panic!("{name} failed (replay with CE_SEED={seed}): {why}\nminimal case:\n{v:#?}")
        }
        Err(e) => panic!("{name} aborted (CE_SEED={seed}): {e}"),
    }
}

/// Every delivery row, in (seq, consumer) order.
pub fn all_deliveries(s: &dyn SourceStore) -> Vec<DeliveryRow> {
    s.list(&OutboxFilter {
        limit: Some(u32::MAX),
        ..OutboxFilter::default()
    })
    .expect("list deliveries")
}

/// Every event of the journal, by sequence.
pub fn all_events(s: &dyn SourceStore) -> BTreeMap<i64, OutboxEvent> {
    all_deliveries(s)
        .into_iter()
        .map(|r| (r.event.seq, r.event))
        .collect()
}

/// The whole state of a store: nodes, edges, events, deliveries and jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Every node, in URI order.
    pub nodes: Vec<ContextNode>,
    /// Every edge, by owner.
    pub edges: Vec<RelationEdge>,
    /// Every delivery with its event.
    pub outbox: Vec<DeliveryRow>,
    /// Every job, newest first.
    pub jobs: Vec<Job>,
}

/// Every job, newest first.
pub fn all_jobs(s: &dyn SourceStore) -> Vec<Job> {
    s.list_jobs(&JobFilter {
        limit: MAX_LIST_LIMIT as usize,
        ..JobFilter::default()
    })
    .expect("list jobs")
}

/// Reads the whole state.
pub fn snapshot(s: &dyn SourceStore) -> Snapshot {
    let nodes = s.read_subtree(&CtxUri::root()).expect("read_subtree(root)");
    let uris: Vec<CtxUri> = nodes.iter().map(|n| n.uri.clone()).collect();
    assert_eq!(
        s.subtree_uris(&CtxUri::root()).expect("subtree_uris(root)"),
        uris,
        "subtree_uris agrees with read_subtree"
    );
    let stamps: Vec<(CtxUri, NodeStamp)> = nodes
        .iter()
        .map(|n| {
            let stamp = NodeStamp {
                version: n.version,
                updated_at: n.updated_at_ms,
            };
            (n.uri.clone(), stamp)
        })
        .collect();
    assert_eq!(
        s.subtree_stamps(&CtxUri::root())
            .expect("subtree_stamps(root)"),
        stamps,
        "subtree_stamps agrees with read_subtree"
    );
    let mut asked = uris.clone();
    asked.push(CtxUri::parse("ctx://never/there").expect("uri"));
    let expected: Vec<Option<NodeStamp>> =
        stamps.iter().map(|(_, s)| Some(*s)).chain([None]).collect();
    assert_eq!(s.stamps(&asked).expect("stamps"), expected, "stamps agrees");
    let mut edges = Vec::new();
    for n in &nodes {
        edges.extend(s.get_edges(&n.uri).expect("get_edges"));
    }
    Snapshot {
        nodes,
        edges,
        outbox: all_deliveries(s),
        jobs: all_jobs(s),
    }
}

/// Runs `op`, which must fail with `code` (and the given retryability), and checks that it
/// left the store exactly as it was.
#[track_caller]
pub fn assert_rejected<T: std::fmt::Debug>(
    s: &dyn SourceStore,
    code: ErrorCode,
    retryable: bool,
    op: impl FnOnce(&dyn SourceStore) -> ce_store::Result<T>,
) -> StoreError {
    let before = snapshot(s);
    let err = match op(s) {
        Ok(v) => panic!("expected a {code} error, got Ok({:.400})", format!("{v:?}")),
        Err(e) => e,
    };
    assert_eq!(err.code(), code, "code of {err}");
    assert_eq!(
        err.is_retryable(),
        retryable,
        "retryability of {err} ({code})"
    );
    let after = snapshot(s);
    assert!(
        before == after,
        "a rejected operation ({err}) changed the store"
    );
    err
}

/// Checks the invariants of the source of truth against its own outbox; returns what is
/// broken (empty when all hold).
///
/// - TR1: every node's parent is a node or the root, and `parent_uri` is the URI's parent.
/// - RL1: every edge joins two existing nodes.
/// - OB1: every node's current version is announced by an event (`UPSERT_CONTEXT` at that
///   version, or a `MOVE_CONTEXT` that brought it to its URI); its relation version too.
/// - OB2: no event announces a write that is absent: an `UPSERT_CONTEXT` (uri, v) has the
///   node at ≥ v unless a later delete or move took that URI away; same for relations.
/// - OB3: a `DELETE_CONTEXT` (uri, v) leaves the URI absent or re-created above v.
/// - OB4: every event has exactly one delivery per configured consumer, and no delivery is
///   `failed` at rest.
pub fn invariant_violations(s: &dyn SourceStore) -> Vec<String> {
    violations(&snapshot(s), &s.consumers())
}

/// [`invariant_violations`] of a snapshot taken already.
pub fn violations(snap: &Snapshot, consumers: &[String]) -> Vec<String> {
    let mut bad = Vec::new();
    let nodes: BTreeMap<&CtxUri, &ContextNode> = snap.nodes.iter().map(|n| (&n.uri, n)).collect();
    for n in &snap.nodes {
        let parent = n.uri.parent().unwrap_or_else(CtxUri::root);
        if n.parent_uri != parent {
            bad.push(format!("TR1: {} has parent_uri {}", n.uri, n.parent_uri));
        }
        if !parent.is_root() && !nodes.contains_key(&parent) {
            bad.push(format!("TR1: parent of {} is missing", n.uri));
        }
    }
    for e in &snap.edges {
        for end in [&e.from_uri, &e.to_uri] {
            if !nodes.contains_key(end) {
                bad.push(format!(
                    "RL1: edge {} -> {} names missing {end}",
                    e.from_uri, e.to_uri
                ));
            }
        }
    }

    let consumers: BTreeSet<&str> = consumers.iter().map(String::as_str).collect();
    let mut per_event: BTreeMap<i64, BTreeSet<&str>> = BTreeMap::new();
    let mut events: BTreeMap<i64, &OutboxEvent> = BTreeMap::new();
    for r in &snap.outbox {
        if r.delivery.status == ce_core::DeliveryStatus::Failed {
            bad.push(format!(
                "OB4: delivery {}/{} is failed at rest",
                r.delivery.consumer, r.event.seq
            ));
        }
        if !per_event
            .entry(r.event.seq)
            .or_default()
            .insert(&r.delivery.consumer)
        {
            bad.push(format!(
                "OB4: two deliveries for {}/{}",
                r.delivery.consumer, r.event.seq
            ));
        }
        events.insert(r.event.seq, &r.event);
    }
    for (seq, cs) in &per_event {
        if *cs != consumers {
            bad.push(format!(
                "OB4: event {seq} has deliveries for {cs:?}, want {consumers:?}"
            ));
        }
    }

    // The last delete or move that took each subtree away, and every move target.
    let mut last_taken: BTreeMap<&CtxUri, i64> = BTreeMap::new();
    let mut upserted: BTreeSet<(&CtxUri, u64)> = BTreeSet::new();
    let mut related: BTreeSet<(&CtxUri, u64)> = BTreeSet::new();
    let mut move_targets: BTreeSet<&CtxUri> = BTreeSet::new();
    for (seq, e) in &events {
        match &e.payload {
            EventPayload::UpsertContext(p) => {
                upserted.insert((&p.uri, p.expected_node_version));
            }
            EventPayload::UpsertRelation(p) => {
                related.insert((&p.uri, p.relation_version));
            }
            EventPayload::MoveContext(p) => {
                move_targets.insert(&p.to_uri);
                last_taken.insert(&p.from_uri, *seq);
            }
            EventPayload::DeleteContext(p) => {
                last_taken.insert(&p.uri, *seq);
            }
        }
    }
    let self_and_ancestors = |u: &CtxUri| {
        let mut v = u.ancestors();
        v.push(u.clone());
        v
    };
    let taken_after = |seq: i64, uri: &CtxUri| {
        self_and_ancestors(uri)
            .iter()
            .any(|a| last_taken.get(a).is_some_and(|s| *s > seq))
    };
    let moved_in = |u: &CtxUri| {
        self_and_ancestors(u)
            .iter()
            .any(|a| move_targets.contains(a))
    };
    for n in &snap.nodes {
        if !upserted.contains(&(&n.uri, n.version)) && !moved_in(&n.uri) {
            bad.push(format!(
                "OB1: {} at version {} has no event",
                n.uri, n.version
            ));
        }
        if n.relation_version > 0
            && !related.contains(&(&n.uri, n.relation_version))
            && !moved_in(&n.uri)
        {
            bad.push(format!(
                "OB1: {} at relation version {} has no event",
                n.uri, n.relation_version
            ));
        }
    }
    for (seq, e) in &events {
        match &e.payload {
            EventPayload::UpsertContext(p) => {
                let ok = nodes
                    .get(&p.uri)
                    .is_some_and(|n| n.version >= p.expected_node_version)
                    || taken_after(*seq, &p.uri);
                if !ok {
                    bad.push(format!(
                        "OB2: event {seq} announces {} v{} but the node is absent or older",
                        p.uri, p.expected_node_version
                    ));
                }
            }
            EventPayload::UpsertRelation(p) => {
                let ok = nodes
                    .get(&p.uri)
                    .is_some_and(|n| n.relation_version >= p.relation_version)
                    || taken_after(*seq, &p.uri);
                if !ok {
                    bad.push(format!(
                        "OB2: event {seq} announces relations of {} v{} but the node is absent or older",
                        p.uri, p.relation_version
                    ));
                }
            }
            EventPayload::DeleteContext(p) => {
                if let Some(n) = nodes.get(&p.uri)
                    && n.version <= p.expected_deleted_version
                {
                    bad.push(format!(
                        "OB3: {} deleted at v{} still exists at v{}",
                        p.uri, p.expected_deleted_version, n.version
                    ));
                }
            }
            EventPayload::MoveContext(p) => {
                if !nodes.contains_key(&p.to_uri) && !taken_after(*seq, &p.to_uri) {
                    bad.push(format!(
                        "OB2: move {seq} to {} but the target is absent",
                        p.to_uri
                    ));
                }
            }
        }
    }
    bad
}

/// Panics with every broken invariant.
#[track_caller]
pub fn assert_invariants(s: &dyn SourceStore) {
    let bad = invariant_violations(s);
    assert!(
        bad.is_empty(),
        "store invariants broken:\n  {}",
        bad.join("\n  ")
    );
}
