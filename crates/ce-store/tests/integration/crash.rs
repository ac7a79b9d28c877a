//! Crash safety (DESIGN.md §5): a child process writes under load and is killed with
//! SIGKILL at a random moment; after reopening, every acknowledged write is present, every
//! acknowledged event is in the outbox with a delivery per consumer, and the store holds no
//! half-written state. Twenty kills in a row on the same data directory.
//!
//! The child is this test binary re-executed on [`crash_child`], which does nothing unless
//! `CE_CRASH_CHILD_DIR` is set. It prints `OP` before each operation and `ACK` (or `ERR`)
//! after it returned, flushing each line, so the parent knows which writes were
//! acknowledged and which single one was in flight when the kill came.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ce_core::{ContextNode, CtxUri, SystemClock};
use ce_store::{
    ContextFs, LinkRequest, OutboxStore, PutMode, PutRequest, RelationStore, SqliteStore,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::common::{self, uri};

const DIR_ENV: &str = "CE_CRASH_CHILD_DIR";
const SEED_ENV: &str = "CE_CRASH_CHILD_SEED";
const ITERATIONS: u64 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Put,
    Rm,
    Mv,
    Link,
    Unlink,
}

/// An operation the child starts (`OP` line).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OpLine {
    n: u64,
    kind: Kind,
    a: CtxUri,
    b: Option<CtxUri>,
}

/// An acknowledged operation (`ACK` line).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AckLine {
    n: u64,
    version: u64,
    changed: bool,
    events: Vec<String>,
}

/// An operation the parent knows of: acknowledged, or in flight when the child died.
#[derive(Debug, Clone)]
struct Record {
    op: OpLine,
    ack: Option<AckLine>,
}

const REL: &str = "refs";

fn random_uri(rng: &mut StdRng) -> CtxUri {
    let mut u = format!("ctx://crash/d{}", rng.random_range(0..4));
    if rng.random_bool(0.85) {
        u.push_str(&format!("/n{}", rng.random_range(0..6)));
        if rng.random_bool(0.4) {
            u.push_str(&format!("/m{}", rng.random_range(0..3)));
        }
    }
    uri(&u)
}

/// The child: writes until it is killed. A no-op in a normal test run.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(DIR_ENV) else {
        return;
    };
    let seed: u64 = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let store =
        SqliteStore::open(Path::new(&dir), common::two_consumers()).expect("child opens store");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = std::io::stdout();
    // libtest has printed "test crash::crash_child ... " without a newline: end that line.
    if writeln!(out).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let kind = match rng.random_range(0..100) {
            0..70 => Kind::Put,
            70..78 => Kind::Rm,
            78..86 => Kind::Mv,
            86..96 => Kind::Link,
            _ => Kind::Unlink,
        };
        let a = random_uri(&mut rng);
        let b = matches!(kind, Kind::Mv | Kind::Link | Kind::Unlink).then(|| random_uri(&mut rng));
        let op = OpLine {
            n,
            kind,
            a: a.clone(),
            b: b.clone(),
        };
        if writeln!(out, "OP {}", serde_json::to_string(&op).expect("json"))
            .and_then(|()| out.flush())
            .is_err()
        {
            return;
        }
        let res = match (kind, b) {
            (Kind::Put, _) => {
                let mode =
                    [PutMode::Replace, PutMode::Merge, PutMode::Append][rng.random_range(0..3)];
                let req = PutRequest {
                    mode,
                    content: Some(format!("v{n} ")),
                    abstract_text: rng.random_bool(0.3).then(|| format!("a{n}")),
                    ..PutRequest::default()
                };
                store.put(&a, req)
            }
            (Kind::Rm, _) => store.rm(&a, rng.random_bool(0.8), None, None),
            (Kind::Mv, Some(b)) => store.mv(&a, &b, None),
            (Kind::Link, Some(b)) => store.link(LinkRequest {
                from: a,
                to: b,
                relation_type: REL.into(),
                weight: 1.0,
                reason: String::new(),
                trace_id: None,
            }),
            (Kind::Unlink, Some(b)) => store.unlink(&a, &b, REL, None),
            (_, None) => unreachable!("two-uri ops always have b"),
        };
        let line = match res {
            Ok(o) => format!(
                "ACK {}",
                serde_json::to_string(&AckLine {
                    n,
                    version: o.version,
                    changed: o.changed,
                    events: o.event_ids
                })
                .expect("json")
            ),
            Err(_) => format!("ERR {n}"),
        };
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

/// Runs one child for `ms` milliseconds, kills it, and returns what it reported.
fn run_child(dir: &Path, seed: u64, ms: u64, log: &Path) -> Vec<Record> {
    let lines = ce_testkit::run_and_kill(
        &ce_testkit::test_name(module_path!(), "crash_child"),
        &[
            (DIR_ENV, dir.display().to_string()),
            (SEED_ENV, seed.to_string()),
        ],
        Duration::from_millis(ms),
        log,
    );

    let mut records: Vec<Record> = Vec::new();
    let mut open: Option<OpLine> = None;
    for l in lines {
        if let Some(j) = l.strip_prefix("OP ") {
            assert!(open.is_none(), "OP before the previous one ended: {l}");
            open = Some(serde_json::from_str(j).expect("OP line"));
        } else if let Some(j) = l.strip_prefix("ACK ") {
            let ack: AckLine = serde_json::from_str(j).expect("ACK line");
            let op = open.take().expect("ACK without OP");
            assert_eq!(op.n, ack.n, "ACK for another op");
            records.push(Record { op, ack: Some(ack) });
        } else if let Some(n) = l.strip_prefix("ERR ") {
            let op = open.take().expect("ERR without OP");
            assert_eq!(op.n.to_string(), n, "ERR for another op");
        }
    }
    if let Some(op) = open {
        records.push(Record { op, ack: None });
    }
    records
}

/// Whether `op` (acknowledged or in flight) may have removed `u`.
fn may_remove(op: &OpLine, u: &CtxUri) -> bool {
    match op.kind {
        Kind::Rm | Kind::Mv => u.is_within(&op.a),
        _ => false,
    }
}

/// Whether `op` may have (re)created `u`, or brought an edge to or from it (a move rewrites
/// the edges of the moved subtree).
fn may_create(op: &OpLine, u: &CtxUri) -> bool {
    match (op.kind, &op.b) {
        (Kind::Put, _) => op.a.is_within(u),
        (Kind::Mv, Some(t)) => t.is_within(u) || u.is_within(t),
        _ => false,
    }
}

/// What the operations after a point in the history may have done, per URI and per edge.
#[derive(Default)]
struct Later {
    removed: BTreeSet<CtxUri>,
    created: BTreeSet<CtxUri>,
    linked: BTreeSet<(CtxUri, CtxUri)>,
    unlinked: BTreeSet<(CtxUri, CtxUri)>,
}

/// Checks every acknowledged operation of `history` against the reopened store. The history
/// is swept backwards so that each operation is judged by what the later ones may have done.
fn check_acknowledged(s: &SqliteStore, history: &[Record]) -> Vec<String> {
    let mut bad = Vec::new();
    let consumers = s.consumers().len();
    let mut deliveries: BTreeMap<String, usize> = BTreeMap::new();
    for r in common::all_deliveries(s) {
        *deliveries.entry(r.event.event_id).or_default() += 1;
    }
    let nodes: BTreeMap<CtxUri, ContextNode> = s
        .read_subtree(&CtxUri::root())
        .expect("read_subtree")
        .into_iter()
        .map(|n| (n.uri.clone(), n))
        .collect();
    let mut edges: BTreeSet<(CtxUri, CtxUri)> = BTreeSet::new();
    for u in nodes.keys() {
        for e in s.get_edges(u).expect("edges") {
            edges.insert((e.from_uri, e.to_uri));
        }
    }
    // Every URI the history names, with its ancestors.
    let mut universe: BTreeSet<CtxUri> = BTreeSet::new();
    for r in history {
        for u in std::iter::once(&r.op.a).chain(r.op.b.as_ref()) {
            universe.insert(u.clone());
            universe.extend(u.ancestors());
        }
    }
    let mut later = Later::default();
    for r in history.iter().rev() {
        let op = &r.op;
        if let Some(ack) = &r.ack {
            for id in &ack.events {
                match deliveries.get(id) {
                    Some(&n) if n == consumers => {}
                    Some(&n) => bad.push(format!("op {op:?}: event {id} has {n} deliveries")),
                    None => bad.push(format!("op {op:?}: acknowledged event {id} is lost")),
                }
            }
            let version = |u: &CtxUri| nodes.get(u).map(|n| n.version);
            match (op.kind, &op.b) {
                (Kind::Put, _)
                    if !later.removed.contains(&op.a)
                        && version(&op.a).is_none_or(|v| v < ack.version) =>
                {
                    bad.push(format!(
                        "acknowledged put {op:?} v{} is lost: now {:?}",
                        ack.version,
                        version(&op.a)
                    ));
                }
                (Kind::Rm, _) if !later.created.contains(&op.a) && nodes.contains_key(&op.a) => {
                    bad.push(format!("acknowledged rm {op:?} is undone"));
                }
                (Kind::Mv, Some(to)) if ack.changed => {
                    if !later.removed.contains(to) && version(to).is_none_or(|v| v < ack.version) {
                        bad.push(format!(
                            "acknowledged mv {op:?} v{} is lost: target {:?}",
                            ack.version,
                            version(to)
                        ));
                    }
                    if !later.created.contains(&op.a) && nodes.contains_key(&op.a) {
                        bad.push(format!("acknowledged mv {op:?} left its source"));
                    }
                }
                (Kind::Link, Some(to)) => {
                    let pair = (op.a.clone(), to.clone());
                    let touched = later.removed.contains(&op.a)
                        || later.removed.contains(to)
                        || later.unlinked.contains(&pair);
                    if !touched && !edges.contains(&pair) {
                        bad.push(format!("acknowledged link {op:?} is lost"));
                    }
                }
                (Kind::Unlink, Some(to)) => {
                    let pair = (op.a.clone(), to.clone());
                    let touched = later.linked.contains(&pair)
                        || later.created.contains(&op.a)
                        || later.created.contains(to);
                    if !touched && edges.contains(&pair) {
                        bad.push(format!("acknowledged unlink {op:?} is undone"));
                    }
                }
                _ => {}
            }
        }
        // Fold this operation (acknowledged or in flight) into what "later" may have done.
        for u in &universe {
            if may_remove(op, u) {
                later.removed.insert(u.clone());
            }
            if may_create(op, u) {
                later.created.insert(u.clone());
            }
        }
        if let Some(b) = &op.b {
            match op.kind {
                Kind::Link => {
                    later.linked.insert((op.a.clone(), b.clone()));
                }
                Kind::Unlink => {
                    later.unlinked.insert((op.a.clone(), b.clone()));
                }
                _ => {}
            }
        }
    }
    bad
}

#[test]
fn sigkill_keeps_every_acknowledged_write() {
    if std::env::var_os(DIR_ENV).is_some() {
        return; // never recurse inside a child
    }
    let seed = common::seed("sigkill_keeps_every_acknowledged_write");
    let mut rng = StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let mut history: Vec<Record> = Vec::new();
    let mut acked = 0usize;
    for it in 0..ITERATIONS {
        let ms = rng.random_range(50..=400);
        let log = tmp.path().join(format!("child-{it}.log"));
        let records = run_child(&dir, seed.wrapping_add(it), ms, &log);
        acked += records.iter().filter(|r| r.ack.is_some()).count();
        history.extend(records);

        let s = common::open(&dir, common::two_consumers(), Arc::new(SystemClock));
        let mut bad = check_acknowledged(&s, &history);
        bad.extend(common::invariant_violations(&s));
        assert!(
            bad.is_empty(),
            "after kill {it} ({ms} ms, CE_SEED={seed}):\n  {}",
            bad.join("\n  ")
        );
    }
    eprintln!("{acked} acknowledged operations over {ITERATIONS} kills");
    assert!(acked > 0, "the child never acknowledged anything");
}
