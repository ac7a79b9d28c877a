//! Failpoint crash sweep (issue 5; DESIGN.md §5 "crash safety"). For every crash point of
//! `ce_core::failpoint::POINTS`, a scenario runs the real `ce` (debug build) with
//! `CE_FAILPOINT=<point>:<n>` where the point is on the path, and asserts that the process
//! died there: SIGABRT, with `failpoint <point>: aborting` on stderr. A scenario that never
//! reaches its point fails. Then it restarts `ce serve` without the failpoint and checks:
//!
//! 1. **ledger**: the source holds exactly what the acknowledged writes made, with or without
//!    the one write in flight at the crash, and a put at least at its acknowledged version;
//! 2. **locks**: right after the restart, moving the written subtree away and back succeeds
//!    with no `busy` (TREE locks over every path the workload locked; `lock.wait_ms` (3 s)
//!    exceeds `lock.lock_expire_secs` (1 s), so the dead process's leases must have gone
//!    stale); after an import crash, the import runs again;
//! 3. **convergence**: once the restarted server has drained (every consumer lag 0, nothing
//!    dead, `applied_valid`), `status` counts exactly the records the source projects (one
//!    per non-empty level, fallbacks included, and one per edge). Vector and keyword search
//!    find every projected record at the node's current version, and `related` finds every
//!    edge with nothing dropped;
//! 4. **holds**: the store's `holds` table empties (the restarted server adopted the import's
//!    hold and ended it), and then `rm -r` of both subtrees succeeds at once;
//!
//! then the indexes converge again on the emptied tree and the server stops cleanly.
//!
//! The workload is one client writing sequentially: HTTP put / link / unlink / rm / mv
//! (leaves and directories) under [`W`], and one `ce import` (local CLI, while the server
//! runs) into [`IMP`]. A model replays the acknowledged writes, so the state after the
//! restart must equal the model, either without or with the write that was in flight.
//!
//! `back_and_forth_moves_under_two_workers_converge` reproduces without a crash a bug the
//! sweep found: two workers of one consumer applying consecutive moves of one subtree.
//!
//! [`SCENARIOS`] maps every point to the scenario that passes it, and a point without one
//! fails the sweep. The scenarios run in parallel, one data directory each. A scenario that
//! fails keeps its data directory (logs `serve-*.log`) and names it. The sweep is seeded:
//! `CE_SEED` replays it, and `CE_SWEEP_POINTS=a,b` runs only those points.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use ce_core::failpoint;
use ce_store::{HoldStore as _, SqliteStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::harness::{Ce, eventually};

/// The subtree the HTTP writes go to.
const W: &str = "ctx://acc/w";
/// Where the workload's `ce import` goes.
const IMP: &str = "ctx://acc/imp";
/// The relation type of every edge.
const REFS: &str = "refs";
/// Fast leases and locks: the shortest claim lease the configuration allows (a claim left by
/// a dead worker is taken over after it), locks stale after 1 s.
const CONFIG: &str = "[index.worker]\npoll_interval_ms = 50\nlease_seconds = 15\n\
heartbeat_seconds = 2\n\n[lock]\nlock_expire_secs = 1.0\nwait_ms = 3000\n";
/// Writes per workload (the client stops earlier when the server dies).
const MAX_OPS: usize = 40;
/// How long an armed process may take to reach its point once the writes are done.
const REACH_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a drain may take (claims of a dead worker wait for their 15 s lease).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the import's hold may last after the drain (the hold keeper ticks every 500 ms).
const HOLD_END_TIMEOUT: Duration = Duration::from_secs(10);
const SIGABRT: i32 = 6;

/// The process a scenario arms, and when.
#[derive(Debug, Clone, Copy)]
enum Crash {
    /// `ce serve`, armed at its n-th pass (`nth` range, seeded) while the client writes.
    /// With `term`, the server is sent SIGTERM once the writes are done (a point on the
    /// shutdown path).
    Serve { nth: (u64, u64), term: bool },
    /// The workload's `ce import`.
    Import,
    /// `ce repair reconcile`, after the writes have drained and the server has stopped.
    Reconcile,
}

/// How a point is reached.
struct Scenario {
    point: &'static str,
    crash: Crash,
    how: &'static str,
}

const fn serve(point: &'static str, lo: u64, hi: u64, how: &'static str) -> Scenario {
    Scenario {
        point,
        crash: Crash::Serve {
            nth: (lo, hi),
            term: false,
        },
        how,
    }
}

/// Point → scenario. Every entry of `failpoint::POINTS` needs one.
const SCENARIOS: &[Scenario] = &[
    serve(
        "store.before_commit",
        2,
        25,
        "n-th source write of `ce serve` (the 1st is at startup) under HTTP writes",
    ),
    serve(
        "store.after_commit",
        2,
        25,
        "n-th source write of `ce serve`, committed, before the reply",
    ),
    serve(
        "outbox.after_claim",
        1,
        10,
        "n-th non-empty claim of the server's workers while writes flow",
    ),
    serve(
        "worker.after_embed",
        1,
        6,
        "n-th vector / keyword chunk, embedded, before its index write",
    ),
    serve(
        "worker.after_index_write",
        1,
        6,
        "n-th vector / keyword chunk written, before mark_done",
    ),
    serve(
        "worker.mid_ack",
        1,
        8,
        "n-th batch, after its mark_done, before its failures are marked",
    ),
    serve(
        "worker.after_ack",
        1,
        8,
        "n-th batch acknowledged, before the next claim",
    ),
    Scenario {
        point: "vector.mid_snapshot",
        crash: Crash::Serve {
            nth: (1, 1),
            term: true,
        },
        how: "SIGTERM to `ce serve` after the writes: the shutdown snapshot (or an upkeep one)",
    },
    serve(
        "index.before_commit",
        1,
        8,
        "n-th keyword / relation index transaction of the workers",
    ),
    serve(
        "lock.after_acquire",
        1,
        4,
        "n-th HTTP rm / mv, holding its lease, before it writes",
    ),
    serve(
        "lock.before_release",
        1,
        4,
        "n-th HTTP rm / mv, written, before its lease is released",
    ),
    Scenario {
        point: "lock.after_hand_off",
        crash: Crash::Import,
        how: "`ce import` (local) while `ce serve` runs; the import runs again after restart",
    },
    serve(
        "holds.after_adopt",
        1,
        1,
        "`ce serve` adopts the hold of a `ce import` made while it runs",
    ),
    serve(
        "holds.before_end",
        1,
        1,
        "`ce serve` releases that hold once the import is indexed, before ending it",
    ),
    serve(
        "http.before_reply",
        1,
        25,
        "n-th HTTP reply (a write's answer) of `ce serve`",
    ),
    Scenario {
        point: "reconcile.mid",
        crash: Crash::Reconcile,
        how: "`ce repair reconcile` after the writes drained and the server stopped",
    },
];

/// Points whose crash and recovery a dedicated test checks (their workload is not the
/// sweep's HTTP writes): point → the test.
const COVERED_ELSEWHERE: &[(&str, &str)] = &[
    (
        "session.phase1.after_lock",
        "sessions::a_crash_before_publish_or_inside_phase_1_leaves_no_archive_and_no_job",
    ),
    (
        "session.phase2.after_extract",
        "sessions::a_crash_mid_extraction_resumes_from_the_saved_archive_without_duplicates",
    ),
    (
        "session.phase2.before_commit",
        "sessions::a_crash_before_the_merge_transaction_merges_once_on_resume",
    ),
    (
        "session.phase2.between_windows",
        "sessions::a_crash_between_windows_resumes_at_the_next_window_without_asking_again",
    ),
];

#[test]
fn every_failpoint_crashes_and_recovers() {
    let seed = ce_testkit::seed("crash_sweep::every_failpoint_crashes_and_recovers");
    let listed: Vec<&str> = failpoint::POINTS.iter().map(|(p, _)| *p).collect();
    let unswept: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|p| !SCENARIOS.iter().any(|s| s.point == *p))
        .filter(|p| !COVERED_ELSEWHERE.iter().any(|(c, _)| c == p))
        .collect();
    let unknown: Vec<&str> = SCENARIOS
        .iter()
        .map(|s| s.point)
        .filter(|p| !listed.contains(p))
        .collect();
    assert!(
        unswept.is_empty() && unknown.is_empty(),
        "crash points without a scenario: {unswept:?}; scenarios of unknown points: {unknown:?}"
    );
    let only: Option<Vec<String>> = std::env::var("CE_SWEEP_POINTS")
        .ok()
        .map(|v| v.split(',').map(|p| p.trim().to_owned()).collect());
    let started = Instant::now();
    let results: Vec<(&Scenario, u64, Result<Outcome>)> = std::thread::scope(|scope| {
        let running: Vec<_> = listed
            .iter()
            .filter_map(|p| SCENARIOS.iter().find(|s| s.point == *p))
            .filter(|s| only.as_ref().is_none_or(|o| o.iter().any(|p| p == s.point)))
            .map(|sc| {
                let seed = seed ^ fnv(sc.point);
                (sc, seed, scope.spawn(move || run(sc, seed)))
            })
            .collect();
        running
            .into_iter()
            .map(|(sc, seed, h)| {
                let r = h
                    .join()
                    .unwrap_or_else(|p| Err(anyhow!("the scenario panicked: {p:?}")));
                (sc, seed, r)
            })
            .collect()
    });
    let mut table = String::new();
    let mut failed = Vec::new();
    for (sc, seed, r) in &results {
        let line = match r {
            Ok(o) => format!(
                "ok    {:<26} nth {:<3} acked {:<3} {:>5.1} s  in flight: {}",
                sc.point,
                o.nth,
                o.acked,
                o.took.as_secs_f64(),
                o.in_flight.as_deref().unwrap_or("-"),
            ),
            Err(e) => {
                failed.push(format!(
                    "{} (scenario seed {seed}; {}):\n    {e:#}",
                    sc.point, sc.how
                ));
                format!("FAIL  {:<26} {}", sc.point, sc.how)
            }
        };
        table.push_str(&line);
        table.push('\n');
    }
    eprintln!(
        "crash sweep: {} points in {:.1} s (CE_SEED={seed})\n{table}",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} of {} crash points failed (replay with CE_SEED={seed}):\n  {}",
        failed.len(),
        results.len(),
        failed.join("\n  ")
    );
}

/// Found by the sweep (a `worker.mid_ack` scenario, during the `mv` round trip right after
/// the restart), and reproduced here without any crash. Two workers of the vector consumer
/// apply two consecutive moves of one subtree concurrently. The later one reads the
/// records stored at its target URIs, finds the same texts and plans payload-only updates
/// (`vector: None`, keep the stored vector). The earlier one then moves those records away,
/// so the write fails with `invalid_field` "has no stored vector to keep". That error is not
/// retryable, so the delivery goes dead and the index misses the node until a reconcile or
/// requeue.
#[test]
fn back_and_forth_moves_under_two_workers_converge() {
    let ce = Ce::hash(CONFIG);
    let Started::Up(server) = Serve::start(&ce, None, "serve.log", "2").expect("ce serve starts")
    else {
        panic!("ce serve died at startup");
    };
    for d in 0..4 {
        server
            .post(
                "/v1/put",
                &json!({"uri": format!("{W}/d{d}/n"), "content": format!("alpha beta {d}")}),
            )
            .expect("put");
    }
    server.converged().expect("converged before the moves");
    let away = format!("{W}-moved");
    for _ in 0..30 {
        server
            .post("/v1/mv", &json!({"from": W, "to": away}))
            .expect("mv away");
        server
            .post("/v1/mv", &json!({"from": away, "to": W}))
            .expect("mv back");
    }
    if let Err(e) = server.converged() {
        let kept = ce.dir.keep();
        panic!("{e:#}\n(data dir kept: {})", kept.display());
    }
}

/// A stable 64-bit hash of a point's name (its scenario's seed does not depend on the order
/// of the table).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a scenario that passed did.
struct Outcome {
    nth: u64,
    acked: usize,
    in_flight: Option<String>,
    took: Duration,
}

/// Runs one scenario in a fresh data directory, kept (and named) when it fails.
fn run(sc: &Scenario, seed: u64) -> Result<Outcome> {
    let ce = Ce::hash(CONFIG);
    let started = Instant::now();
    match scenario(&ce, sc, seed) {
        Ok(mut o) => {
            o.took = started.elapsed();
            Ok(o)
        }
        Err(e) => {
            let kept = ce.dir.keep();
            Err(e.context(format!(
                "failpoint {} (data dir kept: {})",
                sc.point,
                kept.display()
            )))
        }
    }
}

fn scenario(ce: &Ce, sc: &Scenario, seed: u64) -> Result<Outcome> {
    let mut rng = StdRng::seed_from_u64(seed);
    let import = ImportTree::write(&ce.data_dir().join("import-src"), &mut rng)?;
    let nth = match sc.crash {
        Crash::Serve { nth: (lo, hi), .. } => rng.random_range(lo..=hi),
        Crash::Import | Crash::Reconcile => 1,
    };
    let arm = format!("{}:{nth}", sc.point);
    let workers = rng.random_range(1..=2u32).to_string();
    let mut client = Client {
        ce,
        rng,
        import: &import,
        import_at: 0,
        model: Model::default(),
        floors: BTreeMap::new(),
        acked: 0,
        in_flight: None,
    };
    client.import_at = client.rng.random_range(0..6);

    // Phase 1: the workload, and the crash.
    let serve_arm = matches!(sc.crash, Crash::Serve { .. }).then_some(arm.as_str());
    match Serve::start(ce, serve_arm, "serve-crash.log", &workers)? {
        Started::Died(status, log) => {
            // Killed at startup, before any write: still a crash at the point.
            expect_abort(status, &log, sc.point, "ce serve (at startup)")?;
        }
        Started::Up(mut server) => {
            let import_arm = matches!(sc.crash, Crash::Import).then_some(arm.as_str());
            client.work(&server, import_arm)?;
            match sc.crash {
                Crash::Serve { term, .. } => {
                    if term && server.alive()? {
                        server.signal("TERM")?;
                    }
                    let status = server.wait_exit(REACH_TIMEOUT)?.ok_or_else(|| {
                        anyhow!(
                            "`ce serve` with CE_FAILPOINT={arm} never reached its point \
                             ({} writes acknowledged)",
                            client.acked
                        )
                    })?;
                    expect_abort(status, &server.log(), sc.point, "ce serve")?;
                }
                Crash::Import => {
                    ensure!(
                        client
                            .in_flight
                            .as_ref()
                            .is_some_and(|o| matches!(o, Op::Import)),
                        "the workload never ran its `ce import`"
                    );
                    server.stop()?;
                }
                Crash::Reconcile => {
                    ensure!(client.in_flight.is_none(), "a write was lost: {client:?}");
                    server.drained()?;
                    server.stop()?;
                    // A write the indexes have not seen: the reconcile has events to emit.
                    client.local_put(MAX_OPS)?;
                    let out = ce
                        .command(&["repair", "reconcile"])
                        .env(failpoint::VAR, &arm)
                        .output()
                        .context("ce repair reconcile runs")?;
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    ensure!(
                        out.status.signal() == Some(SIGABRT),
                        "`ce repair reconcile` with CE_FAILPOINT={arm} exited ({}) without \
                         reaching its point (it must find the put the indexes lack and emit events \
                         for it)\n{stderr}",
                        out.status
                    );
                    expect_abort(out.status, &stderr, sc.point, "ce repair reconcile")?;
                }
            }
        }
    }

    // Phase 2: restart without the failpoint, then check.
    let Started::Up(server) = Serve::start(ce, None, "serve-recover.log", &workers)? else {
        bail!("the restarted `ce serve` died at startup");
    };
    let fate = client.check_ledger(&server)?;
    server.locks_free()?;
    if matches!(sc.crash, Crash::Import) {
        // The dead import's lease must have gone stale: the import runs again.
        let out = ce
            .command(&["--json", "import", path_str(&import.dir)?, "--into", IMP])
            .env_remove(failpoint::VAR)
            .output()
            .context("ce import runs")?;
        ensure!(
            out.status.success(),
            "the import after the crash failed ({}; the dead import's lock never freed?): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    server.converged().context("after the restart")?;
    server.holds_ended(ce)?;
    server.remove_all()?;
    server.converged().context("after rm -r of every subtree")?;
    let status = server.get("/v1/status")?;
    for key in ["index_records", "keyword_records", "relation_records"] {
        ensure!(
            status[key] == 0,
            "{key} left after removing everything: {status}"
        );
    }
    server.stop()?;
    Ok(Outcome {
        nth,
        acked: client.acked,
        in_flight: client
            .in_flight
            .as_ref()
            .map(|o| format!("{}{fate}", o.short())),
        took: Duration::ZERO,
    })
}

/// Asserts that a process died by the failpoint `point`.
fn expect_abort(status: ExitStatus, stderr: &str, point: &str, what: &str) -> Result<()> {
    ensure!(
        status.signal() == Some(SIGABRT),
        "{what} did not abort at {point}: {status}\n{}",
        tail(stderr)
    );
    let said = format!("failpoint {point}: aborting");
    ensure!(
        stderr.contains(&said),
        "{what} aborted, but its stderr lacks {said:?}:\n{}",
        tail(stderr)
    );
    Ok(())
}

/// The last lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow!("{} is not UTF-8", p.display()))
}

// --- the model ---------------------------------------------------------------------------

/// The layers of a node with text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Layers {
    abstract_text: String,
    overview: String,
    content: String,
}

/// What the source holds under [`W`] and [`IMP`], as far as the workload decides it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Model {
    /// The directories `W/dX` (containers).
    dirs: BTreeSet<String>,
    /// The leaves `W/dX/nY`.
    leaves: BTreeMap<String, Layers>,
    /// The imported nodes with text.
    imported: BTreeMap<String, Layers>,
    /// Edges (from, to, type).
    edges: BTreeSet<(String, String, String)>,
}

/// `u` is `root` or below it.
fn within(u: &str, root: &str) -> bool {
    u == root || u.strip_prefix(root).is_some_and(|r| r.starts_with('/'))
}

/// `u` with the prefix `from` replaced by `to` when within `from`.
fn moved(u: &str, from: &str, to: &str) -> String {
    if within(u, from) {
        format!("{to}{}", &u[from.len()..])
    } else {
        u.to_owned()
    }
}

fn parent(u: &str) -> &str {
    u.rsplit_once('/').map_or(u, |(p, _)| p)
}

/// A write of the workload.
#[derive(Debug, Clone)]
enum Op {
    Put {
        uri: String,
        abstract_text: String,
        content: String,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink {
        from: String,
        to: String,
    },
    Rm {
        uri: String,
        recursive: bool,
    },
    Mv {
        from: String,
        to: String,
    },
    Import,
}

impl Op {
    /// A one-line description.
    fn short(&self) -> String {
        match self {
            Op::Put { uri, .. } => format!("put {uri}"),
            Op::Link { from, to } => format!("link {from} {to}"),
            Op::Unlink { from, to } => format!("unlink {from} {to}"),
            Op::Rm { uri, recursive } => format!("rm{} {uri}", if *recursive { " -r" } else { "" }),
            Op::Mv { from, to } => format!("mv {from} {to}"),
            Op::Import => format!("import {IMP}"),
        }
    }
}

impl Model {
    /// Applies a write the way the store does (relations follow rm and mv of their ends).
    fn apply(&mut self, op: &Op, import: &ImportTree) {
        match op {
            Op::Put {
                uri,
                abstract_text,
                content,
            } => {
                self.dirs.insert(parent(uri).to_owned());
                self.leaves.insert(
                    uri.clone(),
                    Layers {
                        abstract_text: abstract_text.clone(),
                        overview: String::new(),
                        content: content.clone(),
                    },
                );
            }
            Op::Link { from, to } => {
                self.edges.insert((from.clone(), to.clone(), REFS.into()));
            }
            Op::Unlink { from, to } => {
                self.edges.remove(&(from.clone(), to.clone(), REFS.into()));
            }
            Op::Rm { uri, .. } => {
                self.dirs.remove(uri);
                self.leaves.retain(|u, _| !within(u, uri));
                self.edges
                    .retain(|(a, b, _)| !within(a, uri) && !within(b, uri));
            }
            Op::Mv { from, to } => {
                if self.dirs.remove(from) {
                    self.dirs.insert(to.clone());
                } else {
                    self.dirs.insert(parent(to).to_owned());
                }
                self.leaves = std::mem::take(&mut self.leaves)
                    .into_iter()
                    .map(|(u, l)| (moved(&u, from, to), l))
                    .collect();
                self.edges = std::mem::take(&mut self.edges)
                    .into_iter()
                    .map(|(a, b, t)| (moved(&a, from, to), moved(&b, from, to), t))
                    .collect();
            }
            Op::Import => {
                self.imported = import.nodes.clone();
                self.edges.extend(import.edges.iter().cloned());
            }
        }
    }

    /// What differs between `self` (expected) and `actual`.
    fn diff(&self, actual: &Model) -> String {
        fn set<T: Ord + std::fmt::Debug>(
            out: &mut Vec<String>,
            what: &str,
            e: &BTreeSet<T>,
            a: &BTreeSet<T>,
        ) {
            let missing: Vec<_> = e.difference(a).collect();
            let extra: Vec<_> = a.difference(e).collect();
            if !missing.is_empty() {
                out.push(format!("{what} missing {missing:?}"));
            }
            if !extra.is_empty() {
                out.push(format!("{what} extra {extra:?}"));
            }
        }
        fn map(
            out: &mut Vec<String>,
            what: &str,
            e: &BTreeMap<String, Layers>,
            a: &BTreeMap<String, Layers>,
        ) {
            let (ek, ak) = (e.keys().collect(), a.keys().collect());
            set(out, what, &ek, &ak);
            for (u, l) in e {
                if let Some(al) = a.get(u).filter(|al| *al != l) {
                    out.push(format!("{what} {u}: expected {l:?}, found {al:?}"));
                }
            }
        }
        let mut out = Vec::new();
        set(&mut out, "dirs", &self.dirs, &actual.dirs);
        map(&mut out, "leaves", &self.leaves, &actual.leaves);
        map(&mut out, "imported", &self.imported, &actual.imported);
        set(&mut out, "edges", &self.edges, &actual.edges);
        out.join("; ")
    }
}

/// The tree the workload imports: nodes with every kind of layer, a container, a plain file
/// and a relative relation.
struct ImportTree {
    dir: PathBuf,
    nodes: BTreeMap<String, Layers>,
    edges: BTreeSet<(String, String, String)>,
}

impl ImportTree {
    fn write(dir: &Path, rng: &mut StdRng) -> Result<Self> {
        let mut nodes = BTreeMap::new();
        let file = |rel: &str, text: &str| -> Result<()> {
            let p = dir.join(rel);
            let parent = p.parent().ok_or_else(|| anyhow!("no parent"))?;
            std::fs::create_dir_all(parent).with_context(|| parent.display().to_string())?;
            std::fs::write(&p, text).with_context(|| p.display().to_string())
        };
        let root = Layers {
            abstract_text: format!("imported {}", words(rng, 4)),
            ..Layers::default()
        };
        file(".abstract.md", &root.abstract_text)?;
        nodes.insert(IMP.to_owned(), root);
        let alpha = Layers {
            content: words(rng, 8),
            ..Layers::default()
        };
        file("notes/alpha/content.md", &alpha.content)?;
        file(
            "notes/alpha/.relations.json",
            &json!([{"to": "notes/beta", "type": REFS}]).to_string(),
        )?;
        nodes.insert(format!("{IMP}/notes/alpha"), alpha);
        let beta = Layers {
            abstract_text: words(rng, 3),
            overview: words(rng, 5),
            content: words(rng, 9),
        };
        file("notes/beta/.abstract.md", &beta.abstract_text)?;
        file("notes/beta/.overview.md", &beta.overview)?;
        file("notes/beta/content.md", &beta.content)?;
        nodes.insert(format!("{IMP}/notes/beta"), beta);
        let gamma = Layers {
            content: words(rng, 6),
            ..Layers::default()
        };
        file("notes/gamma.md", &gamma.content)?;
        nodes.insert(format!("{IMP}/notes/gamma.md"), gamma);
        let edges = BTreeSet::from([(
            format!("{IMP}/notes/alpha"),
            format!("{IMP}/notes/beta"),
            REFS.to_owned(),
        )]);
        Ok(ImportTree {
            dir: dir.to_path_buf(),
            nodes,
            edges,
        })
    }
}

const VOCABULARY: &[&str] = &[
    "amber", "basalt", "cobalt", "dune", "ember", "fjord", "granite", "harbor", "indigo",
    "juniper", "kelp", "lagoon", "meadow", "nebula", "obsidian", "prairie", "quartz", "river",
    "saffron", "tundra", "umber", "valley", "willow", "zephyr",
];

fn words(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| VOCABULARY[rng.random_range(0..VOCABULARY.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

// --- the client and its ledger --------------------------------------------------------------

/// The writing client: generates writes valid in its model, sends them one at a time and
/// keeps the ledger of those acknowledged.
struct Client<'a> {
    ce: &'a Ce,
    rng: StdRng,
    import: &'a ImportTree,
    /// The index of the write that is the import.
    import_at: usize,
    /// The state the acknowledged writes made.
    model: Model,
    /// Acknowledged put versions not touched by a later write.
    floors: BTreeMap<String, u64>,
    acked: usize,
    /// The write in flight when the server (or the import) died.
    in_flight: Option<Op>,
}

impl std::fmt::Debug for Client<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} acked, in flight {:?}", self.acked, self.in_flight)
    }
}

impl Client<'_> {
    fn leaf_uri(&mut self, dirs: u32) -> String {
        let d = self.rng.random_range(0..dirs);
        let n = self.rng.random_range(0..4);
        format!("{W}/d{d}/n{n}")
    }

    /// A write valid in the current model.
    fn next_op(&mut self, i: usize) -> Op {
        let leaves: Vec<String> = self.model.leaves.keys().cloned().collect();
        let dirs: Vec<String> = self.model.dirs.iter().cloned().collect();
        let own_edges: Vec<(String, String)> = self
            .model
            .edges
            .iter()
            .filter(|(a, _, _)| within(a, W))
            .map(|(a, b, _)| (a.clone(), b.clone()))
            .collect();
        loop {
            let pick = |rng: &mut StdRng, v: &[String]| v[rng.random_range(0..v.len())].clone();
            match self.rng.random_range(0..100) {
                0..45 => {
                    let uri = self.leaf_uri(4);
                    let abstract_text = if self.rng.random_bool(0.3) {
                        format!("summary {} op{i}", words(&mut self.rng, 3))
                    } else {
                        String::new()
                    };
                    let n = self.rng.random_range(4..10);
                    let content = format!("{} op{i}", words(&mut self.rng, n));
                    return Op::Put {
                        uri,
                        abstract_text,
                        content,
                    };
                }
                45..57 if leaves.len() >= 2 => {
                    let from = pick(&mut self.rng, &leaves);
                    let to = pick(&mut self.rng, &leaves);
                    if from != to {
                        return Op::Link { from, to };
                    }
                }
                57..62 if !own_edges.is_empty() => {
                    let (from, to) = own_edges[self.rng.random_range(0..own_edges.len())].clone();
                    return Op::Unlink { from, to };
                }
                62..74 if !leaves.is_empty() => {
                    return Op::Rm {
                        uri: pick(&mut self.rng, &leaves),
                        recursive: false,
                    };
                }
                74..86 if !leaves.is_empty() => {
                    let from = pick(&mut self.rng, &leaves);
                    let to = self.leaf_uri(6);
                    if !self.model.leaves.contains_key(&to) {
                        return Op::Mv { from, to };
                    }
                }
                86..91 if !dirs.is_empty() => {
                    return Op::Rm {
                        uri: pick(&mut self.rng, &dirs),
                        recursive: true,
                    };
                }
                91..100 if !dirs.is_empty() => {
                    let from = pick(&mut self.rng, &dirs);
                    let to = format!("{W}/d{}", self.rng.random_range(0..6));
                    if !self.model.dirs.contains(&to) {
                        return Op::Mv { from, to };
                    }
                }
                _ => {}
            }
        }
    }

    /// Writes until [`MAX_OPS`] or the first write without an answer (the server died, or
    /// the import aborted); `import_arm` arms the import.
    fn work(&mut self, server: &Serve, import_arm: Option<&str>) -> Result<()> {
        for i in 0..MAX_OPS {
            let op = if i == self.import_at {
                Op::Import
            } else {
                self.next_op(i)
            };
            let version = match &op {
                Op::Import => self.run_import(import_arm)?,
                _ => server.write(&op)?,
            };
            let Some(version) = version else {
                self.in_flight = Some(op);
                return Ok(());
            };
            self.acked += 1;
            match &op {
                Op::Put { uri, .. } => {
                    self.floors.insert(uri.clone(), version);
                }
                Op::Rm { uri: u, .. } | Op::Mv { from: u, .. } => {
                    self.floors.retain(|f, _| !within(f, u));
                }
                _ => {}
            }
            self.model.apply(&op, self.import);
        }
        ensure!(import_arm.is_none(), "the armed import was never in flight");
        Ok(())
    }

    /// Writes one put with the local CLI (no server running).
    fn local_put(&mut self, i: usize) -> Result<()> {
        let op = loop {
            if let op @ Op::Put { .. } = self.next_op(i) {
                break op;
            }
        };
        let Op::Put {
            uri,
            abstract_text,
            content,
        } = &op
        else {
            bail!("not a put: {op:?}");
        };
        let mut args = vec!["--json", "put", uri.as_str(), "--content", content.as_str()];
        if !abstract_text.is_empty() {
            args.extend(["--abstract", abstract_text.as_str()]);
        }
        let out = self
            .ce
            .command(&args)
            .env_remove(failpoint::VAR)
            .output()
            .context("ce put runs")?;
        ensure!(
            out.status.success(),
            "ce put failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let ack: Value = serde_json::from_slice(&out.stdout).context("ce put answers JSON")?;
        self.floors
            .insert(uri.clone(), ack["version"].as_u64().unwrap_or(0));
        self.acked += 1;
        self.model.apply(&op, self.import);
        Ok(())
    }

    /// Runs the workload's `ce import`: `Some(0)` when acknowledged, `None` when it died by
    /// the failpoint `arm`.
    fn run_import(&self, arm: Option<&str>) -> Result<Option<u64>> {
        let mut cmd = self.ce.command(&[
            "--json",
            "import",
            path_str(&self.import.dir)?,
            "--into",
            IMP,
        ]);
        match arm {
            Some(a) => cmd.env(failpoint::VAR, a),
            None => cmd.env_remove(failpoint::VAR),
        };
        let out = cmd.output().context("ce import runs")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(arm) = arm {
            let point = arm.split(':').next().unwrap_or(arm);
            expect_abort(out.status, &stderr, point, "ce import")?;
            return Ok(None);
        }
        ensure!(
            out.status.success(),
            "ce import failed ({}): {stderr}",
            out.status
        );
        Ok(Some(0))
    }

    /// Checks the restarted source against the ledger; says whether the write in flight
    /// (if any) is there.
    fn check_ledger(&self, server: &Serve) -> Result<&'static str> {
        let (actual, versions) = server.read_model()?;
        let without = &self.model;
        let mut with = self.model.clone();
        if let Some(op) = &self.in_flight {
            with.apply(op, self.import);
        }
        ensure!(
            actual == *without || (self.in_flight.is_some() && actual == with),
            "acknowledged writes lost or changed ({self:?}):\n    without the write in \
             flight: {}\n    with it: {}",
            without.diff(&actual),
            with.diff(&actual)
        );
        for (uri, floor) in &self.floors {
            if let Some(v) = versions.get(uri) {
                ensure!(
                    v >= floor,
                    "{uri} is at version {v}, below its acknowledged put (version {floor})"
                );
            }
        }
        Ok(
            match (&self.in_flight, actual == *without, actual == with) {
                (None, ..) => "",
                (Some(_), true, true) => " (a no-op)",
                (Some(_), true, false) => " (absent)",
                (Some(_), false, _) => " (present)",
            },
        )
    }
}

// --- the server ----------------------------------------------------------------------------

/// A running `ce serve`.
struct Serve {
    child: Child,
    stdout: BufReader<ChildStdout>,
    url: String,
    log_path: PathBuf,
    agent: ureq::Agent,
}

enum Started {
    Up(Serve),
    /// The process exited before listening: its status and log.
    Died(ExitStatus, String),
}

/// An HTTP answer, or none (the connection failed: the server is gone).
type Answer = Option<(u16, Value)>;

impl Serve {
    /// Starts `ce serve --bind 127.0.0.1:0 --workers N`, armed with `arm` if given.
    fn start(ce: &Ce, arm: Option<&str>, log: &str, workers: &str) -> Result<Started> {
        let log_path = ce.data_dir().join(log);
        let file = std::fs::File::create(&log_path).context("log file")?;
        let mut cmd = ce.command(&["serve", "--bind", "127.0.0.1:0", "--workers", workers]);
        match arm {
            Some(a) => cmd.env(failpoint::VAR, a),
            None => cmd.env_remove(failpoint::VAR),
        };
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .spawn()
            .context("ce serve starts")?;
        let mut stdout = BufReader::new(child.stdout.take().context("stdout piped")?);
        let mut line = String::new();
        stdout.read_line(&mut line).context("first line")?;
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let status = child.wait().context("ce serve exits")?;
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if status.signal().is_some() {
                return Ok(Started::Died(status, log));
            }
            bail!(
                "ce serve did not start ({status}): {line:?}\n{}",
                tail(&log)
            );
        };
        Ok(Started::Up(Serve {
            url: format!("http://{addr}"),
            child,
            stdout,
            log_path,
            agent: super::harness::agent(),
        }))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Sends a request (`body`: POST); `None` when no complete answer came back.
    fn request(&self, path: &str, body: Option<&Value>) -> Result<Answer> {
        let url = format!("{}{path}", self.url);
        let res = match body {
            Some(b) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(b.to_string().as_bytes()),
            None => self.agent.get(&url).call(),
        };
        let Ok(mut res) = res else { return Ok(None) };
        let status = res.status().as_u16();
        let Ok(text) = res.body_mut().read_to_string() else {
            return Ok(None);
        };
        let v = serde_json::from_str(&text)
            .with_context(|| format!("{path}: not JSON (status {status}): {text:?}"))?;
        Ok(Some((status, v)))
    }

    /// `GET path`, expecting 200.
    fn get(&self, path: &str) -> Result<Value> {
        match self.request(path, None)? {
            Some((200, v)) => Ok(v),
            other => bail!("GET {path}: {other:?}\n{}", tail(&self.log())),
        }
    }

    /// `GET path`: `None` on 404.
    fn get_opt(&self, path: &str) -> Result<Option<Value>> {
        match self.request(path, None)? {
            Some((200, v)) => Ok(Some(v)),
            Some((404, _)) => Ok(None),
            other => bail!("GET {path}: {other:?}\n{}", tail(&self.log())),
        }
    }

    /// `POST path`, expecting 200.
    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        match self.request(path, Some(body))? {
            Some((200, v)) => Ok(v),
            other => bail!("POST {path} {body}: {other:?}\n{}", tail(&self.log())),
        }
    }

    /// Sends one workload write: the acknowledged version, or `None` without an answer. An
    /// error answer fails the scenario (every write is valid in the model).
    fn write(&self, op: &Op) -> Result<Option<u64>> {
        let (path, body) = match op {
            Op::Put {
                uri,
                abstract_text,
                content,
            } => (
                "/v1/put",
                json!({"uri": uri, "abstract": abstract_text, "content": content}),
            ),
            Op::Link { from, to } => ("/v1/link", json!({"from": from, "to": to, "type": REFS})),
            Op::Unlink { from, to } => {
                ("/v1/unlink", json!({"from": from, "to": to, "type": REFS}))
            }
            Op::Rm { uri, recursive } => ("/v1/rm", json!({"uri": uri, "recursive": recursive})),
            Op::Mv { from, to } => ("/v1/mv", json!({"from": from, "to": to})),
            Op::Import => bail!("the import is not an HTTP write"),
        };
        match self.request(path, Some(&body))? {
            None => Ok(None),
            Some((200, v)) => Ok(Some(v["version"].as_u64().unwrap_or(0))),
            Some((status, v)) => bail!("{op:?} refused ({status}): {v}"),
        }
    }

    fn alive(&mut self) -> Result<bool> {
        Ok(self.child.try_wait().context("try_wait")?.is_none())
    }

    fn signal(&self, sig: &str) -> Result<()> {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .context("kill runs")?
            .success();
        ensure!(ok, "kill -{sig} failed");
        Ok(())
    }

    /// Waits for the process to exit, at most `timeout`.
    fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().context("try_wait")? {
                return Ok(Some(s));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM: the server must stop cleanly (exit 0, `stopped`).
    fn stop(mut self) -> Result<()> {
        self.signal("TERM")?;
        let status = self
            .wait_exit(Duration::from_secs(60))?
            .ok_or_else(|| anyhow!("ce serve did not stop on SIGTERM"))?;
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).context("stdout")?;
        ensure!(
            status.success() && rest.trim_end().ends_with("stopped"),
            "ce serve did not stop cleanly ({status}): {rest:?}\n{}",
            tail(&self.log())
        );
        Ok(())
    }

    /// Waits until every consumer has lag 0; then nothing may be dead and every consumer is
    /// `applied_valid`. Returns the status.
    fn drained(&self) -> Result<Value> {
        let lagging = |s: &Value| -> Option<bool> {
            Some(
                s["consumers"]
                    .as_array()?
                    .iter()
                    .any(|c| c["lag_events"] != 0),
            )
        };
        let status = eventually(DRAIN_TIMEOUT, || {
            let s = self.get("/v1/status").ok()?;
            (lagging(&s) == Some(false)).then_some(s)
        });
        let Some(status) = status else {
            bail!(
                "the outbox never drained: {}\n{}",
                self.get("/v1/status")?,
                tail(&self.log())
            );
        };
        for c in status["consumers"].as_array().context("consumers")? {
            ensure!(
                c["dead"] == 0 && c["validation"] == "applied_valid",
                "consumer not applied_valid after the drain: {c}"
            );
        }
        ensure!(status["ready"] == true, "not ready: {status}");
        Ok(status)
    }

    /// The stats of the subtree at `uri` (empty when it does not exist).
    fn tree(&self, uri: &str) -> Result<Vec<Value>> {
        Ok(self
            .get_opt(&format!("/v1/tree?uri={uri}"))?
            .map(|v| v.as_array().cloned().unwrap_or_default())
            .unwrap_or_default())
    }

    /// The raw layers of a node whose `layer_bytes` are `bytes`.
    fn layers(&self, uri: &str, bytes: [u64; 3]) -> Result<Layers> {
        let mut texts = [String::new(), String::new(), String::new()];
        for (level, text) in texts.iter_mut().enumerate() {
            if bytes[level] > 0 {
                let c = self.get(&format!("/v1/cat?uri={uri}&level={level}"))?;
                *text = c["text"].as_str().context("text")?.to_owned();
            }
        }
        let [abstract_text, overview, content] = texts;
        Ok(Layers {
            abstract_text,
            overview,
            content,
        })
    }

    /// The layers a client wrote: [`Self::layers`] without the L0 / L1 that are derived or
    /// pending (the derive consumer's, not the workload's; the convergence check compares
    /// them with the indexes, this one compares the client's writes with the model).
    fn client_layers(&self, uri: &str, bytes: [u64; 3]) -> Result<Layers> {
        let mut l = self.layers(uri, bytes)?;
        if bytes[0] == 0 && bytes[1] == 0 {
            return Ok(l);
        }
        let stat = self.get(&format!("/v1/stat?uri={uri}"))?;
        let by_client = |layer: &str| stat["provenance"][layer]["origin"] == "user";
        if !by_client("abstract") {
            l.abstract_text.clear();
        }
        if !by_client("overview") {
            l.overview.clear();
        }
        Ok(l)
    }

    /// The outgoing edges of `uri` in the source.
    fn edges(&self, uri: &str) -> Result<BTreeSet<(String, String, String)>> {
        let r = self.get(&format!("/v1/relations?uri={uri}"))?;
        r["outgoing"]
            .as_array()
            .context("outgoing")?
            .iter()
            .map(|e| {
                let s = |k: &str| e[k].as_str().map(str::to_owned).context("edge field");
                Ok((s("from_uri")?, s("to_uri")?, s("relation_type")?))
            })
            .collect()
    }

    /// The source under [`W`] and [`IMP`] as a model, with every node's version.
    fn read_model(&self) -> Result<(Model, BTreeMap<String, u64>)> {
        let mut m = Model::default();
        let mut versions = BTreeMap::new();
        let mut all = Vec::new();
        for n in self.tree(W)? {
            let uri = n["uri"].as_str().context("uri")?.to_owned();
            versions.insert(uri.clone(), n["version"].as_u64().unwrap_or(0));
            match uri
                .strip_prefix(&format!("{W}/"))
                .map(|r| r.split('/').count())
            {
                None => {}
                Some(1) => {
                    m.dirs.insert(uri.clone());
                }
                Some(_) => {
                    m.leaves
                        .insert(uri.clone(), self.client_layers(&uri, layer_bytes(&n)?)?);
                }
            }
            all.push(uri);
        }
        for n in self.tree(IMP)? {
            let uri = n["uri"].as_str().context("uri")?.to_owned();
            let bytes = layer_bytes(&n)?;
            let layers = self.client_layers(&uri, bytes)?;
            if layers != Layers::default() {
                m.imported.insert(uri.clone(), layers);
            }
            all.push(uri);
        }
        for uri in &all {
            m.edges.extend(self.edges(uri)?);
        }
        Ok((m, versions))
    }

    /// Checks that the drained indexes hold exactly what the source projects.
    fn converged(&self) -> Result<()> {
        let status = self.drained()?;
        let mut records = 0u64;
        let mut edges = 0u64;
        for n in self.tree("ctx://acc")? {
            let uri = n["uri"].as_str().context("uri")?;
            let version = &n["version"];
            let bytes = layer_bytes(&n)?;
            let projected = projected_levels(&self.layers(uri, bytes)?);
            records += projected.len() as u64;
            // A folder's derived roll-up is indexed but not a flat-search hit (hierarchical
            // search seeds on it): its records are counted, not searched for.
            let stat = if bytes[2] == 0 {
                Some(self.get(&format!("/v1/stat?uri={uri}"))?)
            } else {
                None
            };
            let rollup = |level: u8| {
                let layer = if level == 0 { "abstract" } else { "overview" };
                stat.as_ref()
                    .is_some_and(|s| s["provenance"][layer]["origin"] == "derived")
            };
            for (level, text) in projected.iter().filter(|(l, _)| !rollup(*l)) {
                for mode in ["vector", "keyword"] {
                    // The node's own record among the best hits of its subtree (a child
                    // whose text is a part of the node's can rank first).
                    let r = self.post(
                        "/v1/search",
                        &json!({"query": text, "mode": mode, "level": level,
                                "subtree": uri, "top_k": 10}),
                    )?;
                    let own = r["hits"]
                        .as_array()
                        .and_then(|hits| hits.iter().find(|h| h["uri"] == uri));
                    let hit = own.unwrap_or(&Value::Null);
                    let exact = mode == "keyword" || hit["score"].as_f64() >= Some(0.999);
                    ensure!(
                        hit["uri"] == uri
                            && hit["version"] == *version
                            && hit["level"] == *level
                            && exact,
                        "{mode} index: no record of level {level} of {uri} at version {version} \
                         for its text {text:?}: {r}"
                    );
                }
            }
            let source = self.edges(uri)?;
            edges += source.len() as u64;
            let rel = self.get(&format!("/v1/related?uri={uri}&direction=out&limit=1000"))?;
            let indexed: BTreeSet<(String, String, String)> = rel["edges"]
                .as_array()
                .context("edges")?
                .iter()
                .map(|e| {
                    let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                    (s("from_uri"), s("to_uri"), s("relation_type"))
                })
                .collect();
            ensure!(
                indexed == source && rel["dropped_by_hydration"] == 0,
                "relation index of {uri}: {rel}, the source has {source:?}"
            );
        }
        for (key, want) in [
            ("index_records", records),
            ("keyword_records", records),
            ("relation_records", edges),
        ] {
            ensure!(
                status[key] == want,
                "{key} is {}, the source projects {want} (missing, stale or duplicate \
                 records): {status}",
                status[key]
            );
        }
        Ok(())
    }

    /// A write that must not be refused as `busy`; 404 (nothing there) is fine.
    fn locked_write(&self, path: &str, body: &Value) -> Result<()> {
        match self.request(path, Some(body))? {
            Some((200 | 404, _)) => Ok(()),
            other => bail!(
                "POST {path} {body}: {other:?} (a lock of the dead process never freed, or \
                 the import's hold never ended)\n{}",
                tail(&self.log())
            ),
        }
    }

    /// Moves [`W`] away and back: both moves take TREE locks over every path the workload
    /// locked there, so a lease of the dead process must have gone stale.
    fn locks_free(&self) -> Result<()> {
        let away = format!("{W}-moved");
        self.locked_write("/v1/mv", &json!({"from": W, "to": away}))?;
        self.locked_write("/v1/mv", &json!({"from": away, "to": W}))
    }

    /// Waits until no hold is left (the restarted server ended the import's, if any).
    fn holds_ended(&self, ce: &Ce) -> Result<()> {
        let toml = format!("{}{CONFIG}", super::harness::HASH_EMBEDDER);
        let config = ce_core::Config::from_toml(&toml).context("config")?;
        let store = SqliteStore::open(ce.data_dir(), config).context("the store opens")?;
        let left = eventually(HOLD_END_TIMEOUT, || {
            store.holds().ok().filter(|h| h.is_empty())
        });
        ensure!(
            left.is_some(),
            "holds never ended after the drain: {:?}\n{}",
            store.holds(),
            tail(&self.log())
        );
        Ok(())
    }

    /// `rm -r` of every subtree the workload wrote.
    fn remove_all(&self) -> Result<()> {
        for root in [W, IMP] {
            self.locked_write("/v1/rm", &json!({"uri": root, "recursive": true}))?;
        }
        Ok(())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn layer_bytes(n: &Value) -> Result<[u64; 3]> {
    let b = n["layer_bytes"].as_array().context("layer_bytes")?;
    let at = |i: usize| b.get(i).and_then(Value::as_u64).context("layer size");
    Ok([at(0)?, at(1)?, at(2)?])
}

/// The records a node projects: (level, text) for every non-empty level, with the spec's
/// fallbacks (L0 ← L1 / L2 cut to 200 characters, L1 ← L2 cut to 1000).
fn projected_levels(l: &Layers) -> Vec<(u8, String)> {
    let cut = |s: &str, n: usize| ce_core::projector::truncate_chars(s, n);
    let l0 = [
        l.abstract_text.clone(),
        cut(&l.overview, 200),
        cut(&l.content, 200),
    ]
    .into_iter()
    .find(|t| !t.is_empty());
    let l1 = [l.overview.clone(), cut(&l.content, 1000)]
        .into_iter()
        .find(|t| !t.is_empty());
    let l2 = Some(l.content.clone()).filter(|t| !t.is_empty());
    [l0, l1, l2]
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| Some((i as u8, t?)))
        .collect()
}
