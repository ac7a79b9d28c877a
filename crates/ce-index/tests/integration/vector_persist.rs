//! Persistence of the embedded vector index: records, versions and the model survive a
//! reopen; the graph comes back from a matching snapshot or is rebuilt from the stored
//! vectors when the snapshot is missing, stale or damaged.

use std::collections::BTreeMap;
use std::path::Path;

use ce_core::{Classify as _, CtxUri};
use ce_embed::ModelIdentity;
use ce_index::IndexError;
use ce_index::vector::embedded::bench::clustered_vectors;
use ce_index::vector::embedded::{EmbeddedOptions, EmbeddedVectorIndex, LoadStep, SearchStrategy};
use ce_index::vector::{SearchFilter, SyncOutcome, VectorIndex, VectorRecord};
use serde_json::json;

use crate::common::{nr, open, record, snapshot, uri};

const DIM: usize = 16;

fn model() -> ModelIdentity {
    ModelIdentity {
        provider: "hash".into(),
        model: "test".into(),
        dimension: DIM,
    }
}

/// Fills `idx` through every kind of write: 400 upserts, overwrites with new vectors,
/// payload-only syncs, removes, a subtree delete and a move.
fn fill(idx: &EmbeddedVectorIndex) -> Vec<Vec<f32>> {
    idx.bind_model(&model()).expect("bind");
    let vs = clustered_vectors(460, DIM, 12, 0.05, 7);
    let recs: Vec<VectorRecord> = (0..400)
        .map(|i| VectorRecord {
            record: record(
                &format!("ctx://acc/resources/g{}/d{i}", i % 8),
                (i % 3) as u8,
                &[("tag", json!(i % 5))],
            ),
            vector: vs[i].clone(),
        })
        .collect();
    for chunk in recs.chunks(100) {
        idx.upsert(chunk).expect("upsert");
    }
    // New vectors for some ids (graph remove + add), payload-only for others.
    let over: Vec<VectorRecord> = recs[..30]
        .iter()
        .enumerate()
        .map(|(j, r)| VectorRecord {
            record: r.record.clone(),
            vector: vs[400 + j].clone(),
        })
        .collect();
    idx.upsert(&over).expect("overwrite");
    for k in 0..10 {
        let u = format!("ctx://acc/notes/n{k}");
        let mut r = nr(&u, 0, Some(vs[430 + k].clone()));
        r.record.filters.insert("tag".into(), json!(k % 5));
        assert_eq!(
            idx.sync_node(&uri(&u), 3, vec![r]).expect("sync"),
            SyncOutcome::Applied
        );
        let mut p = nr(&u, 0, None);
        p.record.filters.insert("tag".into(), json!(9));
        assert_eq!(
            idx.sync_node(&uri(&u), 4, vec![p]).expect("payload"),
            SyncOutcome::Applied
        );
    }
    idx.remove_node(&uri("ctx://acc/notes/n9"), 5)
        .expect("remove");
    idx.delete_by_uri(&uri("ctx://acc/resources/g7"), true)
        .expect("delete subtree");
    idx.move_uri(&uri("ctx://acc/resources/g6"), &uri("ctx://acc/archive/g6"))
        .expect("move");
    vs
}

/// Writes after [`fill`]: a vector added, a subtree of vectors removed.
fn late_add_and_delete(idx: &EmbeddedVectorIndex, vs: &[Vec<f32>]) {
    idx.upsert(&[VectorRecord {
        record: record("ctx://acc/late/x", 0, &[]),
        vector: vs[1].clone(),
    }])
    .expect("late write");
    idx.delete_by_uri(&uri("ctx://acc/resources/g0"), true)
        .expect("late delete");
}

/// Writes after [`fill`]: [`late_add_and_delete`], then a vector replaced and a move (no
/// graph change).
fn late_writes(idx: &EmbeddedVectorIndex, vs: &[Vec<f32>]) {
    late_add_and_delete(idx, vs);
    idx.upsert(&[VectorRecord {
        record: record("ctx://acc/resources/g1/d1", 1, &[("tag", json!(1))]),
        vector: vs[2].clone(),
    }])
    .expect("late overwrite");
    idx.move_uri(&uri("ctx://acc/resources/g2"), &uri("ctx://acc/archive/g2"))
        .expect("late move");
}

fn queries(vs: &[Vec<f32>]) -> Vec<(Vec<f32>, SearchFilter)> {
    let filters = [
        SearchFilter::default(),
        SearchFilter {
            meta: BTreeMap::from([("tag".into(), json!(2))]),
            ..SearchFilter::default()
        },
        SearchFilter {
            subtree: Some(uri("ctx://acc/archive")),
            ..SearchFilter::default()
        },
    ];
    vs.iter()
        .step_by(37)
        .flat_map(|q| filters.iter().map(move |f| (q.clone(), f.clone())))
        .collect()
}

/// What a reopen must preserve: the records, and the hits (ids and score bits) of every
/// query through the planner (exact on these small candidate sets, hence identical).
/// Hits forced through the graph are kept apart: a rebuilt graph is another approximation of
/// the same data (HNSW insertion order and threads differ), so only their recall is compared.
struct Observed {
    records: Vec<String>,
    planned: Vec<String>,
    graph: Vec<Vec<String>>,
}

fn same(a: &Observed, b: &Observed, what: &str) {
    assert_eq!(a.records, b.records, "{what}: records");
    assert_eq!(a.planned, b.planned, "{what}: planned search results");
    let (mut common, mut total) = (0, 0);
    for (x, y) in a.graph.iter().zip(&b.graph) {
        total += y.len();
        common += x.iter().filter(|id| y.contains(id)).count();
    }
    assert!(
        common as f64 >= 0.9 * total as f64,
        "{what}: graph results overlap {common}/{total}"
    );
}

fn observe(idx: &EmbeddedVectorIndex, qs: &[(Vec<f32>, SearchFilter)]) -> Observed {
    let records = snapshot(idx)
        .into_iter()
        .map(|s| {
            format!(
                "{} v{} {}",
                s.record.id,
                s.node_version,
                serde_json::to_string(&s.record).expect("json")
            )
        })
        .collect();
    let mut planned = Vec::new();
    let mut graph = Vec::new();
    for (q, f) in qs {
        let r = idx
            .search_with(q, f, 8, SearchStrategy::Auto)
            .expect("search");
        planned.push(
            r.hits
                .iter()
                .map(|h| format!("{}:{}", h.record.id, h.score.to_bits()))
                .collect::<Vec<_>>()
                .join(","),
        );
        let r = idx
            .search_with(q, f, 8, SearchStrategy::Ann)
            .expect("search");
        assert_eq!(
            r.hits.len(),
            r.candidates.min(8),
            "graph search returns top_k"
        );
        graph.push(r.hits.into_iter().map(|h| h.record.id).collect());
    }
    Observed {
        records,
        planned,
        graph,
    }
}

fn snapshot_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs_err::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ann-") && !n.ends_with(".tmp"))
        .collect();
    v.sort();
    v
}

#[test]
fn reopen_restores_everything_with_and_without_a_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = fill(&idx);
    let qs = queries(&vs);
    let before = observe(&idx, &qs);
    let n = idx.count().expect("count");
    // Every vector into the graph: closing snapshots the graph (fresh vectors would be the
    // tail the next open reads back, see `the_fresh_tail_is_read_back_at_open`).
    idx.settle().expect("settle");
    drop(idx); // writes a snapshot

    assert_eq!(
        snapshot_files(dir.path()).len(),
        1,
        "one current snapshot: the graph file"
    );
    let idx = open(dir.path());
    assert!(idx.stats().opened_from_snapshot, "loaded from the snapshot");
    same(
        &observe(&idx, &qs),
        &before,
        "after a reopen from the snapshot",
    );
    idx.check_consistency().expect("consistent");
    idx.close_without_snapshot();

    let idx = open(dir.path());
    assert!(
        idx.stats().opened_from_snapshot,
        "the snapshot is still current"
    );
    idx.close_without_snapshot();
    for f in snapshot_files(dir.path()) {
        fs_err::remove_file(dir.path().join(f)).expect("remove snapshot");
    }
    let idx = open(dir.path());
    assert!(
        !idx.stats().opened_from_snapshot,
        "rebuilt from the stored vectors"
    );
    same(&observe(&idx, &qs), &before, "after a rebuild");
    idx.check_consistency().expect("consistent");
    assert_eq!(idx.count().expect("count"), n);
    // Versions and the model binding persisted too.
    assert_eq!(idx.model().expect("model"), Some(model()));
    assert_eq!(
        idx.sync_node(
            &uri("ctx://acc/notes/n1"),
            3,
            vec![nr("ctx://acc/notes/n1", 0, None)]
        )
        .expect("stale"),
        SyncOutcome::Stale
    );
    assert_eq!(
        idx.sync_node(
            &uri("ctx://acc/notes/n9"),
            5,
            vec![nr("ctx://acc/notes/n9", 0, Some(vs[0].clone()))]
        )
        .expect("stale after remove"),
        SyncOutcome::Stale
    );
}

#[test]
fn an_older_snapshot_catches_up_after_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = fill(&idx);
    idx.flush().expect("flush");
    assert_eq!(snapshot_files(dir.path()).len(), 1, "the graph file");
    assert!(idx.stats().snapshot_current);
    // Writes after the snapshot, then a crash (no snapshot at close): a vector added, a
    // subtree of vectors removed, a vector replaced, a move (no graph change).
    late_writes(&idx, &vs);
    assert!(!idx.stats().snapshot_current);
    let qs = queries(&vs);
    let before = observe(&idx, &qs);
    idx.close_without_snapshot();

    let idx = open(dir.path());
    let s = idx.stats();
    assert!(s.opened_from_snapshot, "the older snapshot is loaded");
    assert!(s.snapshot_catch_up > 50, "and caught up: {s:?}");
    assert!(!s.snapshot_current);
    same(&observe(&idx, &qs), &before, "the later writes are there");
    idx.check_consistency().expect("consistent");
    idx.flush().expect("flush");
    assert_eq!(
        snapshot_files(dir.path()).len(),
        1,
        "the older snapshot is replaced"
    );
    idx.close_without_snapshot();
    let idx = open(dir.path());
    assert_eq!(idx.stats().snapshot_catch_up, 0);
    same(&observe(&idx, &qs), &before, "after the new snapshot");
}

#[test]
fn damaged_snapshots_are_rebuilt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = fill(&idx);
    let qs = queries(&vs);
    let before = observe(&idx, &qs);
    idx.flush().expect("flush");
    idx.close_without_snapshot();
    let files = snapshot_files(dir.path());
    let good: Vec<(std::path::PathBuf, Vec<u8>)> = files
        .iter()
        .map(|f| {
            let p = dir.path().join(f);
            let b = fs_err::read(&p).expect("read snapshot");
            (p, b)
        })
        .collect();
    let restore = || {
        for (p, b) in &good {
            fs_err::write(p, b).expect("restore snapshot");
        }
    };
    // Each file in turn: garbage, truncated, missing.
    for (p, b) in &good {
        for bad in [
            Some(b"not a snapshot file".to_vec()),
            Some(b[..b.len() / 2].to_vec()),
            None,
        ] {
            restore();
            match bad {
                Some(bad) => fs_err::write(p, &bad).expect("damage snapshot"),
                None => fs_err::remove_file(p).expect("remove snapshot file"),
            }
            let idx = open(dir.path());
            assert!(
                !idx.stats().opened_from_snapshot,
                "{}: not loaded",
                p.display()
            );
            same(&observe(&idx, &qs), &before, "after a damaged snapshot");
            idx.check_consistency().expect("consistent");
            idx.close_without_snapshot();
        }
    }
    restore();
    let idx = open(dir.path());
    assert!(idx.stats().opened_from_snapshot);
    same(&observe(&idx, &qs), &before, "after restoring the snapshot");
}

/// A snapshot file the database does not name is never trusted, even one of the same
/// database id: here the database is restored from a backup next to a newer snapshot.
#[test]
fn snapshots_of_another_lineage_are_ignored() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (live, backup) = (tmp.path().join("live"), tmp.path().join("backup"));
    let idx = open(&live);
    let vs = fill(&idx);
    idx.flush().expect("flush");
    let qs = queries(&vs);
    let at_backup = observe(&idx, &qs);
    idx.close_without_snapshot();
    copy_dir(&live, &backup);
    // The live index moves on and snapshots a newer state...
    let idx = open(&live);
    idx.delete_by_uri(&uri("ctx://acc/resources/g3"), true)
        .expect("delete");
    idx.flush().expect("flush");
    drop(idx);
    // ...and the backup, which diverges with writes of its own, gets that newer snapshot
    // copied next to its own one.
    let idx = open(&backup);
    idx.upsert(&[VectorRecord {
        record: record("ctx://acc/only/in/backup", 0, &[]),
        vector: vs[3].clone(),
    }])
    .expect("diverge");
    let diverged = observe(&idx, &qs);
    idx.close_without_snapshot();
    for f in snapshot_files(&live) {
        fs_err::copy(live.join(&f), backup.join(&f)).expect("copy foreign snapshot");
    }
    let idx = open(&backup);
    assert!(
        idx.stats().opened_from_snapshot,
        "its own snapshot, caught up"
    );
    same(&observe(&idx, &qs), &diverged, "the backup's own state");
    idx.check_consistency().expect("consistent");
    idx.close_without_snapshot();
    // Without its own snapshot, the foreign one is still not used.
    let own: Vec<String> = snapshot_files(&backup)
        .into_iter()
        .filter(|f| !snapshot_files(&live).contains(f))
        .collect();
    assert_eq!(own.len(), 1);
    for f in own {
        fs_err::remove_file(backup.join(f)).expect("remove own snapshot");
    }
    let idx = open(&backup);
    assert!(
        !idx.stats().opened_from_snapshot,
        "the foreign snapshot is not trusted"
    );
    same(
        &observe(&idx, &qs),
        &diverged,
        "rebuilt from the backup's vectors",
    );
    idx.check_consistency().expect("consistent");
    drop(at_backup);
}

/// A copy of the index directory `dir` without its snapshot files: opened, its graph is
/// rebuilt from the stored vectors (the oracle of a snapshot + tail).
fn without_snapshot(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir, copy.path());
    for f in snapshot_files(copy.path()) {
        fs_err::remove_file(copy.path().join(f)).expect("remove snapshot");
    }
    copy
}

fn copy_dir(from: &Path, to: &Path) {
    fs_err::create_dir_all(to).expect("mkdir");
    for e in fs_err::read_dir(from).expect("read dir") {
        let e = e.expect("entry");
        fs_err::copy(e.path(), to.join(e.file_name())).expect("copy");
    }
}

#[test]
fn one_open_instance_per_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let err = EmbeddedVectorIndex::open(dir.path()).expect_err("second open");
    assert!(matches!(err, IndexError::Held(_)), "{err}");
    assert_eq!(err.code(), ce_core::ErrorCode::Unavailable);
    assert!(err.is_retryable(), "{err}");
    // Another process may read what it holds meanwhile.
    let peek = EmbeddedVectorIndex::peek(dir.path())
        .expect("peek")
        .expect("an index");
    assert_eq!(peek.records, 0);
    assert!(
        EmbeddedVectorIndex::peek(&dir.path().join("none"))
            .expect("peek")
            .is_none()
    );
    drop(idx);
    let _again = open(dir.path());
}

#[test]
fn churn_keeps_the_graph_consistent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = clustered_vectors(1200, DIM, 10, 0.05, 9);
    for round in 0..12 {
        let recs: Vec<VectorRecord> = (0..100)
            .map(|i| VectorRecord {
                record: record(&format!("ctx://acc/c/d{i}"), 0, &[]),
                vector: vs[round * 100 + i].clone(),
            })
            .collect();
        idx.upsert(&recs).expect("overwrite all vectors");
        if round % 4 == 3 && round < 11 {
            idx.delete_by_uri(&CtxUri::root(), true)
                .expect("delete all");
        }
    }
    idx.settle().expect("settle");
    let s = idx.stats();
    assert_eq!(s.records, 100);
    assert_eq!((s.graph_vectors, s.fresh_vectors), (100, 0));
    idx.check_consistency().expect("consistent");
    let last = &vs[1100];
    let hit = &idx
        .search_with(last, &SearchFilter::default(), 1, SearchStrategy::Ann)
        .expect("search")
        .hits[0];
    assert_eq!(hit.record.uri, uri("ctx://acc/c/d0"));
    // Deleting most records leaves removed slots; a rebuild drops them.
    for i in 30..100 {
        idx.delete_by_uri(&uri(&format!("ctx://acc/c/d{i}")), false)
            .expect("delete");
    }
    assert!(idx.stats().tombstones >= 70, "{:?}", idx.stats());
    idx.rebuild_graph().expect("rebuild");
    let s = idx.stats();
    assert_eq!((s.records, s.graph_vectors, s.tombstones), (30, 30, 0));
    idx.check_consistency().expect("consistent");
}

/// Closing writes the graph as it is: vectors still fresh stay in the database and the next
/// open reads them back into the fresh segment (the tail), searchable at once, and the
/// background inserter moves them into the graph.
#[test]
fn the_fresh_tail_is_read_back_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paused = EmbeddedOptions {
        background_insert: false,
        ..EmbeddedOptions::default()
    };
    let idx = EmbeddedVectorIndex::open_with(dir.path(), paused.clone()).expect("open");
    let vs = fill(&idx);
    idx.insert_step(40)
        .expect("first build takes every fresh vector");
    let graph = idx.stats().graph_vectors;
    assert!(
        graph > 40,
        "an empty graph is built once from all fresh vectors"
    );
    assert_eq!(idx.stats().fresh_vectors, 0);
    // Later writes stay fresh (no background inserter).
    late_add_and_delete(&idx, &vs);
    let qs = queries(&vs);
    let before = observe(&idx, &qs);
    let s = idx.stats();
    assert_eq!(s.fresh_vectors, 1);
    assert!(!s.snapshot_current);
    drop(idx);

    let idx = EmbeddedVectorIndex::open_with(dir.path(), paused).expect("reopen");
    let s = idx.stats();
    assert!(s.opened_from_snapshot, "{s:?}");
    assert_eq!(s.fresh_vectors, 1, "the tail is fresh again: {s:?}");
    same(&observe(&idx, &qs), &before, "the tail is searchable");
    idx.check_consistency().expect("consistent");
    drop(idx);

    // With the background inserter, the tail reaches the graph by itself.
    let idx = EmbeddedVectorIndex::open(dir.path()).expect("reopen");
    let t = std::time::Instant::now();
    while idx.stats().fresh_vectors > 0 {
        assert!(t.elapsed().as_secs() < 30, "the inserter never ran");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    idx.check_consistency().expect("consistent");
    same(
        &observe(&idx, &qs),
        &before,
        "after the background insertion",
    );
}

/// An index opens without its graph: a process that only writes commits to the database and
/// neither loads nor rewrites the snapshot; the next load catches up those writes from the
/// snapshot, and finds what a rebuild from the stored vectors finds.
#[test]
fn writes_alone_leave_the_graph_unloaded_and_the_next_load_catches_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = fill(&idx);
    assert!(!idx.resident(), "writes alone do not load the graph");
    idx.flush().expect("flush loads, settles and snapshots");
    assert!(idx.resident());
    drop(idx);
    let files = snapshot_files(dir.path());
    assert_eq!(files.len(), 1, "the graph file");

    // A command that only writes: an add, a subtree removed, a replaced vector, a move.
    let idx = open(dir.path());
    late_writes(&idx, &vs);
    assert!(!idx.resident(), "still not loaded");
    drop(idx);
    assert_eq!(
        snapshot_files(dir.path()),
        files,
        "the snapshot is untouched"
    );

    // The oracle: the same database with no snapshot, its graph built from the vectors.
    let rebuilt = without_snapshot(dir.path());
    let qs = queries(&vs);
    let oracle = open(rebuilt.path());
    let expected = observe(&oracle, &qs);
    assert!(!oracle.stats().opened_from_snapshot);

    let idx = open(dir.path());
    let s = idx.stats();
    assert!(s.resident && s.opened_from_snapshot, "{s:?}");
    assert_eq!(
        s.fresh_vectors, 2,
        "the two new vectors are the tail: {s:?}"
    );
    assert!(s.snapshot_catch_up > 50, "and the removed ones left: {s:?}");
    same(&observe(&idx, &qs), &expected, "snapshot + tail");
    idx.check_consistency().expect("consistent");
}

/// A load beside the writers (what the background inserter runs once a writer has added
/// enough vectors without the graph): the writes committed while it reads — an add, a
/// subtree removed, a replaced vector, a move (filter data only: no generation) — are caught
/// up, and the loaded index answers as one that loaded after them. Both with a snapshot (the
/// read is snapshot + tail) and without (every vector read into the fresh segment).
#[test]
fn a_load_beside_the_writers_catches_up_what_they_commit_meanwhile() {
    for with_snapshot in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let idx = open(dir.path());
        let vs = fill(&idx);
        if with_snapshot {
            idx.flush().expect("flush");
            drop(idx);
            let reopened = open(dir.path());
            check_load_beside_writes(&reopened, dir.path(), &vs, with_snapshot);
        } else {
            check_load_beside_writes(&idx, dir.path(), &vs, with_snapshot);
        }
    }

    fn check_load_beside_writes(
        idx: &EmbeddedVectorIndex,
        dir: &Path,
        vs: &[Vec<f32>],
        snap: bool,
    ) {
        assert!(!idx.resident());
        let mut steps = Vec::new();
        let loaded = idx
            .load_concurrently(&mut |step| {
                assert!(
                    !idx.resident(),
                    "the state is swapped only after the writes"
                );
                match step {
                    // Committed before the read (which sees them), and caught up as well:
                    // filter data changed (no generation), then that record removed.
                    LoadStep::Started => {
                        idx.upsert(&[VectorRecord {
                            record: record("ctx://acc/resources/g3/d35", 2, &[("tag", json!(9))]),
                            vector: vs[35].clone(),
                        }])
                        .expect("payload only");
                        idx.delete_by_uri(&uri("ctx://acc/resources/g3/d35"), false)
                            .expect("delete");
                    }
                    // Committed after the read.
                    LoadStep::Read => late_writes(idx, vs),
                }
                steps.push(step);
            })
            .expect("load");
        assert!(loaded && idx.resident(), "snapshot {snap}");
        assert_eq!(steps, [LoadStep::Started, LoadStep::Read]);
        assert!(
            !idx.load_concurrently(&mut |_| {}).expect("again"),
            "loaded already"
        );
        let s = idx.stats();
        assert_eq!(s.opened_from_snapshot, snap, "{s:?}");
        // The oracle: the same database loaded from scratch, its graph built from the vectors.
        let qs = queries(vs);
        let rebuilt = without_snapshot(dir);
        let oracle = open(rebuilt.path());
        same(
            &observe(idx, &qs),
            &observe(&oracle, &qs),
            &format!("caught up (snapshot {snap})"),
        );
        idx.check_consistency().expect("consistent");
    }
}

/// Writers go on while loads run beside them, again and again: every load ends consistent
/// with the database (whatever it read, whatever was committed meanwhile).
#[test]
fn loads_beside_a_busy_writer_stay_consistent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = fill(&idx);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let u = format!("ctx://acc/busy/b{}", i % 50);
                let v = &vs[i % vs.len()];
                let put = |tag: usize| {
                    idx.upsert(&[VectorRecord {
                        record: record(&u, 0, &[("tag", json!(tag))]),
                        vector: v.clone(),
                    }])
                    .expect("upsert");
                };
                // Add (or replace the vector of) one record, then change its filter data
                // only, and remove every third.
                put(i % 5);
                put(i % 5 + 1);
                if i.is_multiple_of(3) {
                    idx.delete_by_uri(&uri(&u), false).expect("delete");
                }
                i += 1;
            }
            i
        });
        // Stops the writer however this thread leaves the scope (a failed check included).
        let stopping = StopOnDrop(&stop);
        for round in 0..12 {
            idx.unload().expect("unload");
            assert!(
                idx.load_concurrently(&mut |_| {}).expect("load"),
                "round {round}"
            );
            idx.check_consistency()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        drop(stopping);
        let writes = writer.join().expect("writer");
        assert!(writes > 12, "the writer wrote meanwhile: {writes}");
    });
    idx.check_consistency().expect("consistent at the end");
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// With the background inserter, a writer that reaches the unloaded limit does not load
/// itself: the inserter loads beside it, and the index ends loaded and consistent.
#[test]
fn the_background_inserter_loads_once_a_writer_reaches_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = EmbeddedOptions {
        // 40 vectors of 16 dimensions: the limit is 20.
        fresh_max_bytes: 40 * (DIM * 4 + 32),
        ..EmbeddedOptions::default()
    };
    let idx = EmbeddedVectorIndex::open_with(dir.path(), options).expect("open");
    idx.bind_model(&model()).expect("bind");
    let vs = clustered_vectors(200, DIM, 4, 0.05, 3);
    for (i, v) in vs.iter().enumerate() {
        idx.upsert(&[VectorRecord {
            record: record(&format!("ctx://acc/r/d{i}"), 0, &[]),
            vector: v.clone(),
        }])
        .expect("upsert");
        if i < 19 {
            assert!(!idx.resident(), "{i} vectors");
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !idx.resident() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(idx.resident(), "the inserter loaded the graph");
    assert_eq!(idx.stats().records, 200);
    let hits = idx
        .search(&vs[145], &SearchFilter::default(), 1)
        .expect("search");
    assert_eq!(hits[0].record.uri.as_str(), "ctx://acc/r/d145");
    idx.check_consistency().expect("consistent");
}

/// A writer that adds many vectors without the graph loads it once they reach half the
/// fresh segment's bound, and from then on works like a loaded index.
#[test]
fn a_writer_loads_the_graph_once_enough_vectors_wait_for_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = EmbeddedOptions {
        // 40 vectors of 16 dimensions (64 bytes + 32 of bookkeeping each): the limit is 20.
        fresh_max_bytes: 40 * (DIM * 4 + 32),
        background_insert: false,
        ..EmbeddedOptions::default()
    };
    let idx = EmbeddedVectorIndex::open_with(dir.path(), options).expect("open");
    idx.bind_model(&model()).expect("bind");
    let vs = clustered_vectors(60, DIM, 4, 0.05, 3);
    let recs: Vec<VectorRecord> = vs
        .iter()
        .enumerate()
        .map(|(i, v)| VectorRecord {
            record: record(&format!("ctx://acc/r/d{i}"), 0, &[]),
            vector: v.clone(),
        })
        .collect();
    idx.upsert(&recs[..10]).expect("upsert");
    assert!(!idx.resident(), "10 of 20");
    idx.upsert(&recs[10..20]).expect("upsert");
    assert!(idx.resident(), "20 waiting vectors load the graph");
    let s = idx.stats();
    assert_eq!((s.records, s.fresh_vectors), (20, 20), "{s:?}");
    idx.upsert(&recs[20..]).expect("upsert");
    assert_eq!(idx.stats().records, 60);
    let hits = idx
        .search(&vs[45], &SearchFilter::default(), 1)
        .expect("search");
    assert_eq!(hits[0].record.uri.as_str(), "ctx://acc/r/d45");
    idx.check_consistency().expect("consistent");
}

/// What a closing process does (`close_graph`): graph insertion stops for good — a running
/// step within a few vectors, a first build of the whole graph included — and the graph is
/// written as it is. Nothing is lost: every vector is in the graph or still fresh, searches
/// answer as the oracle's, and the next open reads the rest back as the tail.
#[test]
fn closing_stops_graph_insertion_and_keeps_every_vector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    idx.bind_model(&model()).expect("bind");
    let vs = clustered_vectors(4_800, DIM, 12, 0.05, 11);
    let recs: Vec<VectorRecord> = vs
        .iter()
        .enumerate()
        .map(|(i, v)| VectorRecord {
            record: record(
                &format!("ctx://acc/resources/g{}/d{i}", i % 8),
                0,
                &[("tag", json!(i % 5))],
            ),
            vector: v.clone(),
        })
        .collect();
    // Loaded, with an empty graph: the background inserter's first step builds the graph
    // from every fresh vector, and the close lands while it runs or before it starts. (Under
    // the exact limit, so that planned searches are exact and compare bit for bit.)
    idx.load().expect("load");
    idx.upsert(&recs).expect("upsert");
    idx.close_graph().expect("close");
    let s = idx.stats();
    assert_eq!(s.graph_vectors + s.fresh_vectors, 4_800, "{s:?}");
    // Stopped for good: nothing moves into the graph any more, and writes stay fresh.
    idx.settle().expect("settle");
    let late = VectorRecord {
        record: record("ctx://acc/late/x", 0, &[]),
        vector: vs[1].clone(),
    };
    idx.upsert(std::slice::from_ref(&late)).expect("late write");
    let after = idx.stats();
    assert_eq!(
        (after.graph_vectors, after.fresh_vectors),
        (s.graph_vectors, s.fresh_vectors + 1),
        "{after:?}"
    );

    // The oracle: the same database with no snapshot, its graph built from the vectors.
    let rebuilt = without_snapshot(dir.path());
    let qs = queries(&vs[..400]);
    let oracle = open(rebuilt.path());
    let expected = observe(&oracle, &qs);
    same(&observe(&idx, &qs), &expected, "after the close");
    idx.check_consistency().expect("consistent");
    drop(idx);

    let idx = open(dir.path());
    let s = idx.stats();
    assert_eq!(s.records, 4_801, "{s:?}");
    same(&observe(&idx, &qs), &expected, "reopened");
    idx.check_consistency().expect("consistent");
}

/// Rewrites `vectors.db` in `dir` into layout 1: records keyed by a unique `id`, a plain
/// index on `(uri, level)` (what files written before 2026-12-06 hold).
fn downgrade_to_layout_1(dir: &Path) {
    crate::common::key_records_by_id(
        &dir.join("vectors.db"),
        "CREATE TABLE records (
             id TEXT PRIMARY KEY NOT NULL, uri TEXT NOT NULL, parent_uri TEXT NOT NULL,
             level INTEGER NOT NULL, account_id TEXT NOT NULL, owner_space TEXT NOT NULL,
             context_type TEXT NOT NULL, category TEXT NOT NULL, node_version INTEGER NOT NULL,
             filters TEXT NOT NULL, record TEXT NOT NULL, vector BLOB NOT NULL,
             key INTEGER NOT NULL UNIQUE
         )",
        "id, uri, parent_uri, level, account_id, owner_space, context_type, category, \
         node_version, filters, record, vector, key",
        1,
    );
}

/// Rewrites the rows of `vectors.db` in `dir` into layout 2: the vector as little-endian
/// `f32`s, the whole record as JSON in `record` (what files written before 2026-12-06 hold).
fn downgrade_to_layout_2(dir: &Path, idx_records: &[ce_index::vector::StoredRecord]) {
    let c = rusqlite::Connection::open(dir.join("vectors.db")).expect("open");
    let rows: Vec<(i64, Vec<u8>)> = c
        .prepare("SELECT key, vector FROM records")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .expect("rows");
    for (key, blob) in rows {
        let v = ce_embed::half::decode(&blob).expect("a stored vector");
        let f32s: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        c.execute(
            "UPDATE records SET vector = ?1 WHERE key = ?2",
            rusqlite::params![f32s, key],
        )
        .expect("vector");
    }
    for s in idx_records {
        let whole = serde_json::to_string(&s.record).expect("json");
        let n = c
            .execute(
                "UPDATE records SET record = ?1 WHERE uri = ?2 AND level = ?3",
                rusqlite::params![whole, s.record.uri.as_str(), s.record.level.as_u8()],
            )
            .expect("record");
        assert_eq!(n, 1);
    }
    c.execute(
        "UPDATE meta SET value = '2' WHERE key = 'schema_version'",
        [],
    )
    .expect("version");
}

/// A file of layout 2 (`f32` vectors, whole records) is re-labelled when opened and read as
/// it is: the same records, the same hits and score bits (its `f32`s are the values a
/// layout-3 row decodes to); a row rewritten takes the new form, and the file reopens.
#[test]
fn a_layout_2_file_is_read_as_it_is_and_rewritten_row_by_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = fill(&idx);
    let qs = queries(&vs);
    let before = observe(&idx, &qs);
    let stored = snapshot(&idx);
    idx.settle().expect("settle");
    drop(idx);
    let db = dir.path().join("vectors.db");
    let form = |uri: &str| -> (i64, bool) {
        rusqlite::Connection::open(&db)
            .expect("open")
            .query_row(
                "SELECT length(vector), json_extract(record, '$.uri') IS NOT NULL
                 FROM records WHERE uri = ?1 AND level = 0",
                [uri],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("row")
    };
    let (first, other) = ("ctx://acc/resources/g0/d0", "ctx://acc/resources/g3/d3");
    let (half, whole) = ((1 + 2 * DIM) as i64, (4 * DIM) as i64);
    assert_eq!(form(first), (half, false), "layout 3 rows");
    downgrade_to_layout_2(dir.path(), &stored);
    assert_eq!(form(first), (whole, true), "layout 2 rows");

    let idx = open(dir.path());
    same(&observe(&idx, &qs), &before, "layout 2, read as it is");
    idx.check_consistency().expect("consistent");
    let version: String = rusqlite::Connection::open(&db)
        .expect("open")
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .expect("version");
    assert_eq!(version, "3");
    // One row rewritten with a new vector: the new form, beside rows of the old one.
    let rewritten = VectorRecord {
        record: record(first, 0, &[("tag", json!(0))]),
        vector: vs[450].clone(),
    };
    idx.upsert(std::slice::from_ref(&rewritten))
        .expect("upsert");
    drop(idx);
    assert_eq!(form(first), (half, false));
    assert_eq!(form(other), (whole, true));
    let idx = open(dir.path());
    let got = idx
        .get(&[uri(first)])
        .expect("get")
        .into_iter()
        .find(|s| s.record.level.as_u8() == 0)
        .expect("the rewritten record");
    assert_eq!(got.record, rewritten.record);
    assert_eq!(
        idx.vectors(&[uri(first)]).expect("vectors")[0].vector,
        ce_embed::half::round(&vs[450])
    );
    idx.check_consistency().expect("consistent");
}

/// The indexes of `records` in the file at `path`: name and whether it is unique.
fn record_indexes(path: &Path) -> Vec<(String, bool)> {
    let c = rusqlite::Connection::open(path).expect("open");
    let mut v: Vec<(String, bool)> = c
        .prepare("SELECT name, \"unique\" FROM pragma_index_list('records')")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .expect("index list");
    v.sort();
    v
}

#[test]
fn a_layout_1_file_is_rekeyed_by_node_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = open(dir.path());
    let vs = fill(&idx);
    let qs = queries(&vs);
    let before = observe(&idx, &qs);
    idx.settle().expect("settle");
    drop(idx);
    downgrade_to_layout_1(dir.path());
    let db = dir.path().join("vectors.db");
    assert!(
        record_indexes(&db)
            .iter()
            .any(|(n, u)| n.starts_with("sqlite_autoindex") && *u),
        "layout 1 has the unique id index: {:?}",
        record_indexes(&db)
    );

    let idx = open(dir.path());
    same(&observe(&idx, &qs), &before, "after the migration");
    idx.check_consistency().expect("consistent");
    let c = rusqlite::Connection::open(&db).expect("open");
    let version: String = c
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .expect("version");
    assert_eq!(version, "3");
    // The key's own unique index stays; the one on `id` is gone, `(uri, level)` is unique.
    let indexes = record_indexes(&db);
    assert_eq!(
        indexes.iter().filter(|(_, u)| *u).count(),
        2,
        "unique: key and (uri, level): {indexes:?}"
    );
    assert!(
        indexes.contains(&("records_by_node".into(), true)),
        "{indexes:?}"
    );
    // Writes go on at the new key (adds, deletes, an overwrite, a move) exactly as on a
    // file that never had the old layout.
    late_writes(&idx, &vs);
    idx.check_consistency().expect("consistent after writes");
    let other = tempfile::tempdir().expect("tempdir");
    let never = open(other.path());
    fill(&never);
    late_writes(&never, &vs);
    same(
        &observe(&idx, &qs),
        &observe(&never, &qs),
        "migrated vs never migrated, after the same writes",
    );
}
