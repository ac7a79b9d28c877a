//! The derive consumer end to end over a real store (SQLite and PostgreSQL): the outbox
//! worker loop, [`DeriveHandler`] and the fenced write-backs, under random writes and
//! injected generator faults.
//!
//! The property (issue 16): after the drain, every node of a derived type lacking a user
//! layer has a derived one computed from its *current* inputs (its text is what the
//! extractive generator gives for them now, its input hash theirs), and no user layer was
//! ever overwritten (checked after every step). A derivation older than the newest inputs
//! cannot survive the check, since the check recomputes from the final state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ce_core::{
    Clock, Config, ContextNode, CtxUri, IndexProjector, LayerOrigin, Level, ManualClock,
};
use ce_derive::{
    Budget, Child, DeriveError, DeriveHandler, DeriveInput, DeriveSettings, Derived, Extractive,
    Generator, GeneratorIdentity, InlineExtractive,
};
use ce_index::worker::{IndexWorker, WorkerConfig};
use ce_store::derive::LeafDeriver;
use ce_store::postgres::PgStore;
use ce_store::{PutMode, PutRequest, SourceStore, SqliteStore, WriteOp};
use ce_testkit::backends::{Backend, Place};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};

const T0: i64 = 1_773_482_400_000;

/// Extractive, but failing some inputs on purpose: timeouts and rate limits (retryable)
/// and unusable answers (permanent: the handler falls back to extractive itself).
struct Faulty {
    inner: Extractive,
    identity: GeneratorIdentity,
    calls: AtomicU64,
    /// Fail the k-th input of every `period` (0: never).
    period: AtomicU64,
    /// Writes committed while the next call runs — between the consumer's read of its
    /// inputs and its write-back, the window the coalescing fence guards.
    during: std::sync::Mutex<Vec<(CtxUri, String)>>,
    store: std::sync::OnceLock<Arc<dyn SourceStore>>,
    /// A second worker that applies those writes' events during the call, so that the
    /// paused derivation's write-back arrives after a newer one.
    nested: std::sync::OnceLock<IndexWorker>,
}

impl Generator for Faulty {
    fn identity(&self) -> &GeneratorIdentity {
        &self.identity
    }

    fn derive(
        &self,
        inputs: &[DeriveInput],
        budget: Budget,
        timeout: Duration,
    ) -> Vec<Result<Derived, DeriveError>> {
        let period = self.period.load(Ordering::Relaxed);
        let writes = std::mem::take(&mut *self.during.lock().expect("during"));
        if let Some(store) = self.store.get() {
            for (u, text) in writes {
                if store.read_node(&u).expect("read").is_some() {
                    let merge = PutRequest {
                        mode: PutMode::Merge,
                        content: Some(text),
                        ..PutRequest::default()
                    };
                    store.put(&u, merge).expect("concurrent put");
                    if let Some(w) = self.nested.get() {
                        w.run_once(100).expect("nested run_once");
                    }
                }
            }
        }
        self.inner
            .derive(inputs, budget, timeout)
            .into_iter()
            .map(|r| {
                let n = self.calls.fetch_add(1, Ordering::Relaxed);
                match (period, n % period.max(1)) {
                    (0, _) => r,
                    (_, 0) => Err(DeriveError::Timeout { after: timeout }),
                    (_, 1) => Err(DeriveError::RateLimited {
                        retry_after: Some(Duration::ZERO),
                        message: "slow down".into(),
                    }),
                    (_, 2) => Err(DeriveError::InvalidAnswer("not JSON".into())),
                    _ => r,
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Put content on leaf `leaf` of folder `folder`.
    Put { folder: u8, leaf: u8, text: u8 },
    /// Append to a leaf.
    Append { folder: u8, leaf: u8, text: u8 },
    /// A client writes the leaf's abstract.
    UserAbstract { folder: u8, leaf: u8 },
    /// The client hands the leaf's abstract back to derivation.
    HandBack { folder: u8, leaf: u8 },
    /// Move a leaf to another folder.
    Mv { folder: u8, leaf: u8, to: u8 },
    /// Remove a leaf.
    Rm { folder: u8, leaf: u8 },
    /// Let a worker apply up to n events.
    Work { worker: u8, n: u8 },
    /// A content change (merge) committed during the next generator call.
    Concurrent { folder: u8, leaf: u8, text: u8 },
}

const TEXTS: [&str; 4] = [
    "Rust is a systems language. It has no garbage collector. Ownership rules keep memory safe.",
    "The outbox pattern writes events with the data. A worker applies them later. Retries are safe.",
    "向量检索把文本变成向量。关键词检索匹配词项。两者可以融合。",
    "Tea is brewed with hot water. Green tea needs cooler water than black tea.",
];

fn leaf_uri(folder: u8, leaf: u8) -> CtxUri {
    CtxUri::parse(&format!("ctx://acc/resources/f{folder}/n{leaf}")).expect("uri")
}

fn op() -> impl Strategy<Value = Op> {
    let (f, l, t) = (0..3u8, 0..4u8, 0..4u8);
    prop_oneof![
        4 => (f.clone(), l.clone(), t.clone()).prop_map(|(folder, leaf, text)| Op::Put { folder, leaf, text }),
        1 => (f.clone(), l.clone(), t).prop_map(|(folder, leaf, text)| Op::Append { folder, leaf, text }),
        1 => (f.clone(), l.clone()).prop_map(|(folder, leaf)| Op::UserAbstract { folder, leaf }),
        1 => (f.clone(), l.clone()).prop_map(|(folder, leaf)| Op::HandBack { folder, leaf }),
        1 => (f.clone(), l.clone(), f.clone()).prop_map(|(folder, leaf, to)| Op::Mv { folder, leaf, to }),
        1 => (f, l).prop_map(|(folder, leaf)| Op::Rm { folder, leaf }),
        3 => (0..2u8, 1..12u8).prop_map(|(worker, n)| Op::Work { worker, n }),
        2 => (0..3u8, 0..4u8, 0..4u8).prop_map(|(folder, leaf, text)| Op::Concurrent { folder, leaf, text }),
    ]
}

fn config() -> Config {
    let mut config = Config::default();
    config.index.outbox.consumers = vec!["derive".into()];
    config
}

/// Opens the store; `inline`: leaves of at most that many characters are derived in their
/// write transaction by the extractive generator (docs/derive.md, "Derived at write time").
fn open(place: &Place, clock: &ManualClock, inline: Option<usize>) -> Arc<dyn SourceStore> {
    let deriver = inline
        .map(|max| Arc::new(InlineExtractive::new(Budget::default(), max)) as Arc<dyn LeafDeriver>);
    open_with(place, clock, deriver)
}

/// Opens the store with `deriver` deriving leaves at write time.
fn open_with(
    place: &Place,
    clock: &ManualClock,
    deriver: Option<Arc<dyn LeafDeriver>>,
) -> Arc<dyn SourceStore> {
    let config = config();
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    match place {
        Place::Dir(d) => {
            let store = SqliteStore::open_with_clock(d.path(), config, clock).expect("sqlite");
            store.set_leaf_deriver_opt(deriver);
            Arc::new(store)
        }
        Place::Db(db) => {
            let store = PgStore::open_with_clock(db.url(), config, clock).expect("pg");
            store.set_leaf_deriver_opt(deriver);
            Arc::new(store)
        }
    }
}

/// The handler's settings: default limits and types, `batch_size` nodes per call.
fn settings(batch_size: usize) -> DeriveSettings {
    DeriveSettings {
        budget: Budget::default(),
        batch_size,
        timeout: Duration::from_secs(5),
        max_tokens_per_day: 0,
        types: Config::default().derive.derived_types(),
    }
}

struct Rig {
    store: Arc<dyn SourceStore>,
    faulty: Arc<Faulty>,
    workers: Vec<IndexWorker>,
    clock: ManualClock,
    /// The user abstracts the model expects: a client's text is never overwritten.
    user: BTreeMap<CtxUri, String>,
}

impl Rig {
    fn new(place: &Place, inline: Option<usize>) -> Self {
        let clock = ManualClock::new(T0);
        let store = open(place, &clock, inline);
        let faulty = Arc::new(Faulty {
            inner: Extractive::default(),
            identity: GeneratorIdentity {
                generator: "faulty".into(),
                version: 1,
                model: None,
            },
            calls: AtomicU64::new(0),
            period: AtomicU64::new(8),
            during: std::sync::Mutex::new(Vec::new()),
            store: std::sync::OnceLock::new(),
            nested: std::sync::OnceLock::new(),
        });
        faulty.store.set(store.clone()).ok();
        let settings = settings(4);
        let mut workers: Vec<IndexWorker> = (0..3)
            .map(|i| {
                let handler = DeriveHandler::new(
                    store.clone(),
                    faulty.clone(),
                    settings.clone(),
                    IndexProjector::default(),
                    Arc::new(clock.clone()),
                );
                let mut cfg = WorkerConfig::from_config(&config(), &format!("w{i}"), "derive");
                cfg.default_rate_limit_pause = Duration::ZERO;
                IndexWorker::for_ops(cfg, store.clone(), Arc::new(handler))
            })
            .collect();
        if let Some(w) = workers.pop() {
            faulty.nested.set(w).ok();
        }
        Rig {
            store,
            faulty,
            workers,
            clock,
            user: BTreeMap::new(),
        }
    }

    fn step(&mut self, op: &Op) {
        let s = &self.store;
        let put = |u: &CtxUri, req: PutRequest| {
            s.put(u, req).expect("put");
        };
        match *op {
            Op::Put { folder, leaf, text } => {
                let u = leaf_uri(folder, leaf);
                put(
                    &u,
                    PutRequest {
                        content: Some(TEXTS[text as usize].into()),
                        ..PutRequest::default()
                    },
                );
                self.user.remove(&u);
            }
            Op::Append { folder, leaf, text } => {
                let u = leaf_uri(folder, leaf);
                if s.read_node(&u).expect("read").is_some() {
                    put(
                        &u,
                        PutRequest {
                            mode: PutMode::Append,
                            content: Some(format!(" {}", TEXTS[text as usize])),
                            ..PutRequest::default()
                        },
                    );
                }
            }
            Op::UserAbstract { folder, leaf } => {
                let u = leaf_uri(folder, leaf);
                if s.read_node(&u).expect("read").is_some() {
                    let text = format!("user abstract of {u}");
                    put(
                        &u,
                        PutRequest {
                            mode: PutMode::Merge,
                            abstract_text: Some(text.clone()),
                            ..PutRequest::default()
                        },
                    );
                    self.user.insert(u, text);
                }
            }
            Op::HandBack { folder, leaf } => {
                let u = leaf_uri(folder, leaf);
                if s.read_node(&u).expect("read").is_some() {
                    put(
                        &u,
                        PutRequest {
                            mode: PutMode::Merge,
                            derive: vec![Level::L0],
                            ..PutRequest::default()
                        },
                    );
                    self.user.remove(&u);
                }
            }
            Op::Mv { folder, leaf, to } => {
                let (from, dest) = (leaf_uri(folder, leaf), leaf_uri(to, leaf));
                if from != dest
                    && s.read_node(&from).expect("read").is_some()
                    && s.read_node(&dest).expect("read").is_none()
                {
                    s.mv(&from, &dest, None).expect("mv");
                    if let Some(t) = self.user.remove(&from) {
                        self.user.insert(dest, t);
                    }
                }
            }
            Op::Rm { folder, leaf } => {
                let u = leaf_uri(folder, leaf);
                if s.read_node(&u).expect("read").is_some() {
                    s.rm(&u, true, None, None).expect("rm");
                    self.user.remove(&u);
                }
            }
            Op::Concurrent { folder, leaf, text } => {
                let u = leaf_uri(folder, leaf);
                let text = format!("{} (edited)", TEXTS[text as usize]);
                self.faulty.during.lock().expect("during").push((u, text));
            }
            Op::Work { worker, n } => {
                self.workers[worker as usize]
                    .run_once(n as usize)
                    .expect("run_once");
                self.clock.advance(60_000);
            }
        }
        self.check_user_layers();
    }

    fn check_user_layers(&self) {
        for (u, text) in &self.user {
            let n = self
                .store
                .read_node(u)
                .expect("read")
                .expect("a user node is live");
            assert_eq!(
                &n.layers.abstract_text, text,
                "{u}: a user layer was overwritten"
            );
            assert!(n.provenance.abstract_origin.is_user(), "{u}");
        }
    }

    /// Faults off, then work until the outbox holds nothing open for derive.
    fn drain(&mut self) {
        self.faulty.period.store(0, Ordering::Relaxed);
        for _ in 0..200 {
            let done = self.workers[0].run_once(100).expect("run_once");
            self.clock.advance(3_600_000);
            if done.claimed == 0 {
                let open: u64 = self
                    .store
                    .stats()
                    .expect("stats")
                    .iter()
                    .map(|c| c.pending + c.claimed + c.retry_wait)
                    .sum();
                if open == 0 {
                    return;
                }
            }
        }
        panic!("the derive consumer did not drain");
    }

    /// Every derived node's layers are what the generator gives for its current inputs.
    fn check_derived(&self) {
        let nodes = self
            .store
            .read_subtree(&CtxUri::parse("ctx://acc").expect("uri"))
            .expect("read");
        assert_eq!(
            self.store.count_dirty().expect("dirty"),
            0,
            "no key left dirty"
        );
        let budget = Budget::default();
        let extractive = Extractive::default();
        let projector = IndexProjector::default();
        let by_parent = |p: &CtxUri| -> Vec<&ContextNode> {
            nodes.iter().filter(|n| &n.parent_uri == p).collect()
        };
        for n in &nodes {
            if n.context_type != ce_core::ContextType::Resource {
                continue;
            }
            let children = by_parent(&n.uri);
            let input = if children.is_empty() {
                DeriveInput::Leaf {
                    content: n.layers.content.clone(),
                }
            } else {
                DeriveInput::Container {
                    content: n.layers.content.clone(),
                    children: children
                        .iter()
                        .map(|c| Child {
                            name: c.uri.name().to_owned(),
                            abstract_text: projector.level_text(c, Level::L0).unwrap_or_default(),
                        })
                        .collect(),
                }
            };
            let want =
                extractive.derive(std::slice::from_ref(&input), budget, Duration::from_secs(5));
            let want = want[0].clone().expect("extractive never fails");
            let hashes = [
                input.hash(self.faulty.identity(), budget),
                input.hash(extractive.identity(), budget),
            ];
            for (level, text) in [
                (Level::L0, &want.abstract_text),
                (Level::L1, &want.overview),
            ] {
                let origin = n.provenance.get(level).expect("L0/L1");
                match origin {
                    LayerOrigin::User => continue,
                    LayerOrigin::Derived(d) => {
                        assert!(
                            hashes.contains(&d.input_hash),
                            "{} L{level}: derived from old inputs",
                            n.uri
                        );
                    }
                    other => panic!("{} L{level}: {other:?} after the drain", n.uri),
                }
                let stored = match level {
                    Level::L0 => &n.layers.abstract_text,
                    _ => &n.layers.overview,
                };
                assert_eq!(
                    stored,
                    &text.clone().unwrap_or_default(),
                    "{} L{level}",
                    n.uri
                );
            }
        }
    }
}

fn derived_layers_follow_the_current_inputs(backend: Backend) {
    derived_layers_follow(backend, None);
}

/// The same with leaves of at most 150 characters derived at write time: the texts are
/// 60–95 characters, so appends make leaves that cross the limit both ways, and a leaf
/// derived at write time and one left to the consumer meet in the same folders.
fn derived_layers_follow_the_current_inputs_with_leaves_derived_at_write(backend: Backend) {
    derived_layers_follow(backend, Some(150));
}

fn derived_layers_follow(backend: Backend, inline: Option<usize>) {
    let place = std::cell::RefCell::new(backend.place());
    let cases = ce_core::test_cases(if backend == Backend::Postgres { 6 } else { 16 });
    let mut runner = TestRunner::new(PropConfig {
        cases,
        failure_persistence: None,
        ..PropConfig::default()
    });
    runner
        .run(&prop::collection::vec(op(), 5..40), |ops| {
            place.borrow_mut().reset();
            let place = place.borrow();
            let mut rig = Rig::new(&place, inline);
            for op in &ops {
                rig.step(op);
            }
            rig.drain();
            rig.check_user_layers();
            rig.check_derived();
            Ok(())
        })
        .expect("property");
}

/// A derive worker with the extractive generator.
fn extractive_worker(store: &Arc<dyn SourceStore>, clock: &ManualClock) -> IndexWorker {
    let handler = DeriveHandler::new(
        store.clone(),
        Arc::new(Extractive::default()),
        settings(16),
        IndexProjector::default(),
        Arc::new(clock.clone()),
    );
    let cfg = WorkerConfig::from_config(&config(), "w", "derive");
    IndexWorker::for_ops(cfg, store.clone(), Arc::new(handler))
}

/// `n`'s L0 / L1 are what the extractive generator derives from its content, with its
/// identity and input hash.
fn expect_derived_by_extractive(n: &ContextNode) {
    let extractive = Extractive::default();
    let input = DeriveInput::Leaf {
        content: n.layers.content.clone(),
    };
    let want = extractive.derive(
        std::slice::from_ref(&input),
        Budget::default(),
        Duration::from_secs(5),
    );
    let want = want[0].clone().expect("extractive never fails");
    assert_eq!(Some(&n.layers.abstract_text), want.abstract_text.as_ref());
    assert_eq!(Some(&n.layers.overview), want.overview.as_ref());
    for level in [Level::L0, Level::L1] {
        match n.provenance.get(level).expect("L0/L1") {
            LayerOrigin::Derived(d) => {
                assert_eq!(d.generator, extractive.identity().key());
                assert_eq!(
                    d.input_hash,
                    input.hash(extractive.identity(), Budget::default())
                );
            }
            other => panic!("{} L{level}: {other:?}", n.uri),
        }
    }
}

/// [`InlineExtractive`], counting the leaves it is asked for one by one and in batches.
#[derive(Debug)]
struct Counting {
    inner: InlineExtractive,
    one_by_one: AtomicU64,
    batched: AtomicU64,
}

impl LeafDeriver for Counting {
    fn derive_leaf(&self, node: &ContextNode, now: i64) -> Option<ce_store::derive::LeafLayers> {
        self.one_by_one.fetch_add(1, Ordering::Relaxed);
        self.inner.derive_leaf(node, now)
    }

    fn derive_leaves(
        &self,
        contents: &[&str],
        now: i64,
    ) -> Vec<Option<ce_store::derive::PreparedLeaf>> {
        self.batched
            .fetch_add(contents.len() as u64, Ordering::Relaxed);
        self.inner.derive_leaves(contents, now)
    }
}

/// A batch of new leaves (an import) is derived before its transaction, on every core:
/// each short leaf gets what its write would derive, a long one is left to the consumer, a
/// client's abstract stays, and the same batch again changes nothing.
fn a_batch_of_new_leaves_is_derived_before_its_transaction(backend: Backend) {
    let place = backend.place();
    let clock = ManualClock::new(T0);
    let counting = Arc::new(Counting {
        inner: InlineExtractive::new(Budget::default(), 120),
        one_by_one: AtomicU64::new(0),
        batched: AtomicU64::new(0),
    });
    let store = open_with(&place, &clock, Some(counting.clone()));
    let leaf = |i: usize| CtxUri::parse(&format!("ctx://acc/resources/kb/n{i:03}")).expect("uri");
    let batch = || -> Vec<WriteOp> {
        (0..100)
            .map(|i| {
                let text = TEXTS[i % TEXTS.len()];
                let content = match i % 10 {
                    // Longer than the limit.
                    9 => format!("{text} {}", TEXTS[(i + 1) % TEXTS.len()]),
                    _ => format!("{text} Note {i}."),
                };
                let abstract_text = (i % 10 == 7).then(|| format!("Mine {i}."));
                WriteOp::Put {
                    uri: leaf(i),
                    req: PutRequest {
                        content: Some(content),
                        abstract_text,
                        ..PutRequest::default()
                    },
                }
            })
            .collect()
    };
    let out = store.apply_fenced(&[], batch()).expect("import");
    assert!(out.iter().all(|o| o.changed && o.version == 1));
    let calls = || {
        (
            counting.batched.load(Ordering::Relaxed),
            counting.one_by_one.load(Ordering::Relaxed),
        )
    };
    assert_eq!(
        calls(),
        (100, 10),
        "every new leaf prepared; in the transaction, only the long ones were tried again"
    );
    for i in 0..100 {
        let n = store.read_node(&leaf(i)).expect("read").expect("live");
        match i % 10 {
            9 => assert!(n.provenance.abstract_origin.is_pending(), "{}", n.uri),
            7 => {
                assert_eq!(n.layers.abstract_text, format!("Mine {i}."));
                assert!(n.provenance.abstract_origin.is_user());
                assert!(matches!(
                    n.provenance.overview_origin,
                    LayerOrigin::Derived(_)
                ));
            }
            _ => expect_derived_by_extractive(&n),
        }
    }
    let again = store.apply_fenced(&[], batch()).expect("again");
    assert!(
        again.iter().all(|o| !o.changed),
        "an unchanged batch changes nothing"
    );
    assert_eq!(calls(), (100, 10), "and derives nothing: no leaf is new");

    // A batch of mostly existing nodes is not prepared: its new leaf is derived in the
    // transaction.
    let mut mixed = batch();
    mixed.push(WriteOp::Put {
        uri: leaf(100),
        req: PutRequest {
            content: Some(TEXTS[0].to_owned()),
            ..PutRequest::default()
        },
    });
    store.apply_fenced(&[], mixed).expect("mixed");
    assert_eq!(calls(), (100, 11));
    expect_derived_by_extractive(&store.read_node(&leaf(100)).expect("read").expect("live"));
}

/// A leaf within the limit is written with the layers the consumer would derive for it —
/// one node version, no key left for it — while a longer one is left pending to the
/// consumer as before; a metadata edit re-derives nothing and dirties nothing, a content
/// edit derives again in its write.
fn a_small_leaf_is_derived_in_its_write(backend: Backend) {
    let place = backend.place();
    let clock = ManualClock::new(T0);
    let store = open(&place, &clock, Some(120));
    let (small, long) = (leaf_uri(0, 0), leaf_uri(0, 1));
    let folder = small.parent().expect("folder");
    let put = |u: &CtxUri, req: PutRequest| store.put(u, req).expect("put");
    let content = |text: &str| PutRequest {
        content: Some(text.to_owned()),
        ..PutRequest::default()
    };
    put(&small, content(TEXTS[0]));
    put(&long, content(&TEXTS[1..].concat()));

    let expect_derived = expect_derived_by_extractive;
    let read = |u: &CtxUri| store.read_node(u).expect("read").expect("live");
    let n = read(&small);
    assert_eq!(n.version, 1, "written once");
    expect_derived(&n);
    assert!(read(&long).provenance.abstract_origin.is_pending());
    let open_keys = |store: &Arc<dyn SourceStore>| -> Vec<CtxUri> {
        let keys = store.dirty_within(&CtxUri::parse("ctx://acc").expect("uri"));
        keys.expect("dirty").into_iter().map(|k| k.uri).collect()
    };
    let keys = open_keys(&store);
    assert!(
        keys.contains(&folder) && keys.contains(&long) && !keys.contains(&small),
        "the folders and the long leaf wait for the consumer, the small leaf does not: {keys:?}"
    );

    let worker = extractive_worker(&store, &clock);
    while worker.run_once(100).expect("run_once").claimed > 0 {}
    assert_eq!(read(&small).version, 1, "the consumer found it current");
    let l = read(&long);
    assert_eq!(l.version, 2, "written back by the consumer");
    expect_derived(&l);
    assert!(open_keys(&store).is_empty());

    let derivations = || store.derive_usage(T0).expect("usage").derivations;
    let before = derivations();
    let meta = PutRequest {
        mode: PutMode::Merge,
        meta: [("k".to_owned(), serde_json::json!(1))]
            .into_iter()
            .collect(),
        ..PutRequest::default()
    };
    put(&small, meta);
    let m = read(&small);
    assert_eq!(m.version, 2);
    assert_eq!(m.provenance, n.provenance, "nothing derived again");
    assert!(
        open_keys(&store).is_empty(),
        "a metadata edit dirties nothing"
    );
    assert_eq!(derivations(), before, "and derives nothing");

    let edit = PutRequest {
        mode: PutMode::Merge,
        content: Some(TEXTS[3].to_owned()),
        ..PutRequest::default()
    };
    put(&small, edit);
    let e = read(&small);
    assert_eq!(e.version, 3);
    expect_derived(&e);
    assert_ne!(e.layers.abstract_text, n.layers.abstract_text);
    assert_eq!(derivations(), before + 1, "counted in the day's usage");
    assert_eq!(
        open_keys(&store),
        vec![folder],
        "only the folder, whose child's abstract changed"
    );
}

ce_testkit::backend_tests!(
    a_batch_of_new_leaves_is_derived_before_its_transaction,
    derived_layers_follow_the_current_inputs,
    derived_layers_follow_the_current_inputs_with_leaves_derived_at_write,
    a_small_leaf_is_derived_in_its_write,
);
