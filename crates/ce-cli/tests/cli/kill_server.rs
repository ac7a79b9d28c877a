//! Crash safety of the real server (DESIGN.md §5): `ce serve` (hash embedder, workers
//! running) takes HTTP writes from 4 client threads — put / merge / append / rm / mv / link /
//! unlink on a small URI space, so operations collide — and is killed with SIGKILL at a
//! seeded random moment, then restarted on the same data directory, again and again. After
//! each kill, every write the server acknowledged (2xx, with its version) is in the store, at
//! its version or later, unless an operation that may come after it in real time (one that
//! had not been answered when it was sent, or was in flight at the kill) can explain the
//! difference; every acknowledged event has a delivery per consumer. At the end the workers
//! drain: every consumer at lag 0 with nothing dead, and the vector and keyword indexes hold
//! exactly the projection of the source (same record ids, each at its node's version, no
//! duplicates), the relation index as many edges as the source.
//!
//! `CE_KILLS` sets the number of kills (default 40); `CE_SEED` replays a run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ce_core::{Config, CtxUri, IndexProjector};
use ce_index::keyword::KeywordIndex as _;
use ce_index::vector::StoredRecord;
use ce_server::{Engine, EngineOptions};
use ce_store::{ContextFs as _, OutboxFilter, OutboxStore as _, RelationStore as _, SqliteStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::harness::{Ce, eventually};

const REL: &str = "refs";
const THREADS: u64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put,
    Rm,
    Mv,
    Link,
    Unlink,
}

/// A write that was sent: answered 2xx (`ack`), or of unknown outcome (in flight at the
/// kill, or a 5xx). Refused writes (4xx) changed nothing and are not kept.
#[derive(Debug, Clone)]
struct Op {
    kind: Kind,
    a: CtxUri,
    b: Option<CtxUri>,
    /// Logical time the request was sent.
    start: u64,
    /// Logical time the answer arrived (the kill for an unanswered one).
    end: u64,
    ack: Option<Ack>,
}

#[derive(Debug, Clone)]
struct Ack {
    version: u64,
    changed: bool,
    events: Vec<String>,
}

fn uri(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("uri")
}

fn random_uri(rng: &mut StdRng) -> CtxUri {
    let mut u = format!("ctx://k/d{}", rng.random_range(0..3));
    if rng.random_bool(0.85) {
        u.push_str(&format!("/n{}", rng.random_range(0..5)));
        if rng.random_bool(0.3) {
            u.push_str(&format!("/m{}", rng.random_range(0..2)));
        }
    }
    uri(&u)
}

/// Writes through `url` until the server dies or `stop` is set; returns what it sent.
fn client(url: String, seed: u64, clock: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    let agent = super::harness::agent();
    let mut ops = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let kind = match rng.random_range(0..100) {
            0..65 => Kind::Put,
            65..75 => Kind::Rm,
            75..85 => Kind::Mv,
            85..95 => Kind::Link,
            _ => Kind::Unlink,
        };
        let a = random_uri(&mut rng);
        let b = matches!(kind, Kind::Mv | Kind::Link | Kind::Unlink).then(|| random_uri(&mut rng));
        let (path, body) = match (kind, &b) {
            (Kind::Put, _) => {
                let mode = ["replace", "merge", "append"][rng.random_range(0..3)];
                let mut body =
                    json!({"uri": a, "mode": mode, "content": format!("v{seed}-{n} text ")});
                if rng.random_bool(0.3) {
                    body["abstract"] = json!(format!("abstract {n}"));
                }
                ("/v1/put", body)
            }
            (Kind::Rm, _) => (
                "/v1/rm",
                json!({"uri": a, "recursive": rng.random_bool(0.8)}),
            ),
            (Kind::Mv, Some(b)) => ("/v1/mv", json!({"from": a, "to": b})),
            (Kind::Link, Some(b)) => ("/v1/link", json!({"from": a, "to": b, "type": REL})),
            (Kind::Unlink, Some(b)) => ("/v1/unlink", json!({"from": a, "to": b, "type": REL})),
            (_, None) => unreachable!("two-uri ops have b"),
        };
        let start = clock.fetch_add(1, Ordering::SeqCst);
        let res = agent
            .post(format!("{url}{path}"))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes());
        let mut op = Op {
            kind,
            a,
            b,
            start,
            end: u64::MAX,
            ack: None,
        };
        let Ok(mut res) = res else {
            ops.push(op); // the server died with it in flight
            return ops;
        };
        let status = res.status().as_u16();
        let text = res.body_mut().read_to_string().unwrap_or_default();
        match status {
            200..=299 => {
                let v: Value = match serde_json::from_str(&text) {
                    Ok(v) => v,
                    Err(_) => {
                        ops.push(op); // cut off by the kill after the status line
                        return ops;
                    }
                };
                op.end = clock.fetch_add(1, Ordering::SeqCst);
                op.ack = Some(Ack {
                    version: v["version"].as_u64().expect("version"),
                    changed: v["changed"].as_bool().expect("changed"),
                    events: v["event_ids"]
                        .as_array()
                        .expect("event_ids")
                        .iter()
                        .map(|e| e.as_str().expect("event id").to_owned())
                        .collect(),
                });
                ops.push(op);
            }
            400..=499 => {} // refused: nothing happened
            _ => ops.push(op),
        }
    }
    ops
}

fn may_remove(op: &Op, u: &CtxUri) -> bool {
    matches!(op.kind, Kind::Rm | Kind::Mv) && u.is_within(&op.a)
}

fn may_create(op: &Op, u: &CtxUri) -> bool {
    match (op.kind, &op.b) {
        (Kind::Put, _) => op.a.is_within(u),
        (Kind::Mv, Some(t)) => t.is_within(u) || u.is_within(t),
        _ => false,
    }
}

/// Checks the acknowledged operations of one run (`ops`, all sent to the server that was just
/// killed) against the store: each is judged by the operations that may follow it.
fn check_run(s: &SqliteStore, ops: &[Op]) -> Vec<String> {
    let mut bad = Vec::new();
    let consumers = s.consumers().len();
    let mut deliveries: BTreeMap<String, usize> = BTreeMap::new();
    let rows = s
        .list(&OutboxFilter {
            limit: Some(u32::MAX),
            ..OutboxFilter::default()
        })
        .expect("outbox list");
    for r in rows {
        *deliveries.entry(r.event.event_id).or_default() += 1;
    }
    let nodes: BTreeMap<CtxUri, u64> = s
        .read_subtree(&CtxUri::root())
        .expect("read_subtree")
        .into_iter()
        .map(|n| (n.uri, n.version))
        .collect();
    let mut edges: BTreeSet<(CtxUri, CtxUri)> = BTreeSet::new();
    for u in nodes.keys() {
        for e in s.get_edges(u).expect("edges") {
            if e.relation_type == REL {
                edges.insert((e.from_uri, e.to_uri));
            }
        }
    }
    for (i, op) in ops.iter().enumerate() {
        let Some(ack) = &op.ack else { continue };
        for id in &ack.events {
            match deliveries.get(id) {
                Some(&n) if n == consumers => {}
                Some(&n) => bad.push(format!("{op:?}: event {id} has {n} deliveries")),
                None => bad.push(format!("{op:?}: acknowledged event {id} is lost")),
            }
        }
        // Operations that may take effect after this one: not answered before it was sent.
        let later: Vec<&Op> = ops
            .iter()
            .enumerate()
            .filter(|(j, o)| *j != i && o.end > op.start)
            .map(|(_, o)| o)
            .collect();
        let removed = |u: &CtxUri| later.iter().any(|o| may_remove(o, u));
        let created = |u: &CtxUri| later.iter().any(|o| may_create(o, u));
        let version = |u: &CtxUri| nodes.get(u).copied();
        match (op.kind, &op.b) {
            (Kind::Put, _) if !removed(&op.a) && version(&op.a).is_none_or(|v| v < ack.version) => {
                bad.push(format!(
                    "acknowledged put {op:?} v{} is lost: now {:?}",
                    ack.version,
                    version(&op.a)
                ));
            }
            (Kind::Rm, _) if !created(&op.a) && nodes.contains_key(&op.a) => {
                bad.push(format!("acknowledged rm {op:?} is undone"));
            }
            (Kind::Mv, Some(to)) if ack.changed => {
                if !removed(to) && version(to).is_none_or(|v| v < ack.version) {
                    bad.push(format!(
                        "acknowledged mv {op:?} v{} is lost: target {:?}",
                        ack.version,
                        version(to)
                    ));
                }
                if !created(&op.a) && nodes.contains_key(&op.a) {
                    bad.push(format!("acknowledged mv {op:?} left its source"));
                }
            }
            (Kind::Link, Some(to)) => {
                let pair = (op.a.clone(), to.clone());
                let touched = removed(&op.a)
                    || removed(to)
                    || later
                        .iter()
                        .any(|o| o.kind == Kind::Unlink && o.a == op.a && o.b.as_ref() == Some(to));
                if !touched && !edges.contains(&pair) {
                    bad.push(format!("acknowledged link {op:?} is lost"));
                }
            }
            (Kind::Unlink, Some(to)) => {
                let pair = (op.a.clone(), to.clone());
                let touched = created(&op.a)
                    || created(to)
                    || later
                        .iter()
                        .any(|o| o.kind == Kind::Link && o.a == op.a && o.b.as_ref() == Some(to));
                if !touched && edges.contains(&pair) {
                    bad.push(format!("acknowledged unlink {op:?} is undone"));
                }
            }
            _ => {}
        }
    }
    bad
}

/// The per-consumer entries of `/v1/status`.
fn consumers(status: &Value) -> Vec<Value> {
    status["consumers"].as_array().expect("consumers").clone()
}

/// Records of an index by id, with a check that no id appears twice.
fn by_id(name: &str, records: Vec<StoredRecord>, count: u64) -> BTreeMap<String, StoredRecord> {
    let n = records.len();
    let map: BTreeMap<String, StoredRecord> = records
        .into_iter()
        .map(|r| (r.record.id.clone(), r))
        .collect();
    assert_eq!(map.len(), n, "{name}: duplicate record ids");
    assert_eq!(count, n as u64, "{name}: count() differs from the listing");
    map
}

#[test]
fn sigkill_under_http_writes_keeps_acknowledged_writes_and_indexes_converge() {
    let seed = ce_testkit::seed("sigkill_under_http_writes");
    let kills: u64 = std::env::var("CE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let mut rng = StdRng::seed_from_u64(seed);
    // The shortest lease: claims of a killed server's workers are taken over soonest.
    let ce = Ce::hash(
        "[index.worker]\nlease_seconds = 15\nheartbeat_seconds = 5\npoll_interval_ms = 50\n",
    );
    let started = std::time::Instant::now();
    let clock = Arc::new(AtomicU64::new(0));
    let (mut acked, mut unknown) = (0usize, 0usize);
    for kill in 0..kills {
        let server = ce.serve(&["--workers", "2"]);
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (url, clock, stop) = (server.url.clone(), clock.clone(), stop.clone());
                let s = seed ^ (kill * THREADS + t).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                std::thread::spawn(move || client(url, s, clock, stop))
            })
            .collect();
        let ms = rng.random_range(100..=1500);
        std::thread::sleep(Duration::from_millis(ms));
        drop(server); // SIGKILL, reaped
        let at_kill = clock.fetch_add(1, Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        let mut ops: Vec<Op> = Vec::new();
        for t in threads {
            ops.extend(t.join().expect("client thread"));
        }
        for op in &mut ops {
            if op.ack.is_none() {
                op.end = at_kill;
            }
        }
        acked += ops.iter().filter(|o| o.ack.is_some()).count();
        unknown += ops.iter().filter(|o| o.ack.is_none()).count();
        let store = SqliteStore::open(ce.data_dir(), Config::default()).expect("store reopens");
        let bad = check_run(&store, &ops);
        assert!(
            bad.is_empty(),
            "after kill {kill} ({ms} ms, CE_SEED={seed}):\n  {}",
            bad.join("\n  ")
        );
    }
    eprintln!(
        "{acked} acknowledged writes, {unknown} in flight, over {kills} kills in {:.1?}",
        started.elapsed()
    );
    assert!(acked > 0, "no write was ever acknowledged");

    // Convergence: a last server drains every consumer.
    let server = ce.serve(&["--workers", "2"]);
    let drained = eventually(Duration::from_secs(180), || {
        let (_, s) = server.get("/v1/status");
        consumers(&s)
            .iter()
            .all(|c| c["lag_events"] == 0)
            .then_some(s)
    });
    let status = drained.unwrap_or_else(|| {
        panic!(
            "CE_SEED={seed}: never drained: {}\n{}",
            server.get("/v1/status").1,
            server.log()
        )
    });
    for c in consumers(&status) {
        assert_eq!(c["dead"], 0, "CE_SEED={seed}: dead deliveries: {c}");
        assert_eq!(c["validation"], "applied_valid", "CE_SEED={seed}: {c}");
    }
    eprintln!("drained after {:.1?}", started.elapsed());
    let (code, _) = server.stop();
    assert_eq!(code, Some(0));

    let text = std::fs::read_to_string(ce.data_dir().join("ce.toml")).expect("ce.toml");
    let config = Config::from_toml(&text).expect("config");
    let engine = Engine::open_with(
        ce.data_dir(),
        config,
        EngineOptions {
            run_workers: false,
            ..EngineOptions::default()
        },
    )
    .expect("engine opens");
    let store = engine.store();
    let nodes = store.read_subtree(&CtxUri::root()).expect("read");
    let projector = IndexProjector::default();
    let mut want: BTreeMap<String, (CtxUri, u64, String)> = BTreeMap::new();
    let mut edges = BTreeSet::new();
    for n in &nodes {
        for r in projector.build_context_records(n).records {
            want.insert(r.id.clone(), (r.uri.clone(), n.version, r.text.clone()));
        }
        for e in store.get_edges(&n.uri).expect("edges") {
            edges.insert((e.from_uri, e.to_uri, e.relation_type));
        }
    }
    let root = CtxUri::root();
    let vector = engine.index().expect("vector index");
    let keyword = engine.keyword_index().expect("keyword index");
    let indexes = [
        (
            "vector",
            by_id(
                "vector",
                vector.list_under(&root).expect("list"),
                vector.count().expect("count"),
            ),
        ),
        (
            "keyword",
            by_id(
                "keyword",
                keyword.list_under(&root).expect("list"),
                keyword.count().expect("count"),
            ),
        ),
    ];
    for (name, got) in &indexes {
        let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<_> = got
            .values()
            .filter(|r| !want.contains_key(&r.record.id))
            .map(|r| format!("{}#{:?}", r.record.uri, r.record.level))
            .collect();
        let stale: Vec<_> = got
            .values()
            .filter_map(|r| {
                let (u, v, text) = want.get(&r.record.id)?;
                (r.node_version != *v || r.record.text != *text)
                    .then(|| format!("{u} v{} (node v{v})", r.node_version))
            })
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && stale.is_empty(),
            "CE_SEED={seed}: {name} index differs from the source projection: missing {missing:?}, extra {extra:?}, stale {stale:?}"
        );
    }
    assert_eq!(
        status["relation_records"].as_u64(),
        Some(edges.len() as u64),
        "CE_SEED={seed}: relation index size vs source edges"
    );
    assert_eq!(status["index_records"].as_u64(), Some(want.len() as u64));
    assert_eq!(status["keyword_records"].as_u64(), Some(want.len() as u64));
    engine.shutdown();
}

/// The outbox stats of `ce` as (consumer, pending, claimed, retry_wait, done) rows.
fn delivery_counts(ce: &Ce) -> Vec<(String, u64, u64, u64, u64)> {
    ce.json(&["outbox", "stats"])
        .as_array()
        .expect("stats")
        .iter()
        .map(|c| {
            let n = |k: &str| c[k].as_u64().expect("count");
            (
                c["consumer"].as_str().expect("consumer").to_owned(),
                n("pending"),
                n("claimed"),
                n("retry_wait"),
                n("done"),
            )
        })
        .collect()
}

/// A server killed mid-indexing (a crash right after its first claim committed, with
/// `lease_seconds = 300`) leaves claims behind; the server restarted on the same data
/// directory holds the embedded store alone, so it takes those claims back at once: every
/// delivery is done long before the lease would have run out.
#[test]
fn a_restarted_server_takes_back_its_dead_predecessors_claims_at_once() {
    let ce = Ce::hash("[index.worker]\nlease_seconds = 300\n");
    let src = tempfile::tempdir().expect("tempdir");
    for i in 0..20 {
        std::fs::write(
            src.path().join(format!("doc{i:02}.md")),
            format!("document {i} about restarts"),
        )
        .expect("write");
    }
    ce.json(&[
        "import",
        src.path().to_str().expect("utf-8 path"),
        "--into",
        "ctx://acc/kb",
    ]);
    let crashed = ce
        .command(&["serve", "--bind", "127.0.0.1:0"])
        .env(ce_core::failpoint::VAR, "outbox.after_claim")
        .output()
        .expect("ce serve runs");
    assert!(
        !crashed.status.success(),
        "the failpoint did not stop the server: {}",
        String::from_utf8_lossy(&crashed.stderr)
    );
    let left: u64 = delivery_counts(&ce).iter().map(|c| c.2).sum();
    assert!(
        left > 0,
        "the crash left no claim: {:?}",
        delivery_counts(&ce)
    );

    let t0 = std::time::Instant::now();
    let server = ce.serve(&[]);
    let drained = eventually(Duration::from_secs(90), || {
        let counts = delivery_counts(&ce);
        counts
            .iter()
            .all(|(_, pending, claimed, retry, done)| {
                (*pending, *claimed, *retry) == (0, 0, 0) && *done > 0
            })
            .then_some(counts)
    });
    assert!(
        drained.is_some(),
        "the restarted server waited for the dead claims' leases: {:?}\n{}",
        delivery_counts(&ce),
        server.log()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(300),
        "{:?}",
        t0.elapsed()
    );
    assert!(
        server
            .log()
            .contains("claims left by an earlier process released"),
        "{}",
        server.log()
    );
}
