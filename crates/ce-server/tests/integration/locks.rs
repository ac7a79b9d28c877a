//! rm / mv / import under path locks through the engine (docs/locks.md, docs/store.md):
//! an import's lifecycle lock makes a concurrent rm of the subtree busy until the import is
//! indexed; a holder that lost its lease cannot write after the next holder did; rm of a
//! missing path still cleans the indexes.

use std::path::Path;
use std::time::{Duration, Instant};

use ce_core::{Classify as _, Config, CtxUri, ErrorCode};
use ce_lock::{LockManager, LockRequest};
use ce_server::guarded::write_fences;
use ce_server::{Engine, EngineOptions};
use ce_store::layout::ImportOptions;
use ce_store::{
    ContextFs as _, HoldStore as _, OutboxStore as _, PutRequest, SqliteStore, WriteOp,
};

fn u(s: &str) -> CtxUri {
    CtxUri::parse(s).expect("uri")
}

fn config(extra: &str) -> Config {
    Config::from_toml(&format!(
        "[index.embedding]\nprovider = \"hash\"\n[lock]\nwait_ms = 200\n{extra}"
    ))
    .expect("config")
}

fn engine(dir: &Path, cfg: Config, run_workers: bool) -> Engine {
    let options = EngineOptions {
        workers: 1,
        run_workers,
        role: "test".into(),
        consumers: Vec::new(),
    };
    Engine::open_with(dir, cfg, options).expect("engine")
}

fn text(s: &str) -> PutRequest {
    PutRequest {
        abstract_text: Some(s.into()),
        content: Some(format!("{s} in full")),
        ..PutRequest::default()
    }
}

/// A directory in the node layout: plain files become leaves.
fn tree_on_disk(n: usize) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    for i in 0..n {
        let sub = d.path().join(format!("part{}", i % 3));
        std::fs::create_dir_all(&sub).expect("mkdir");
        std::fs::write(
            sub.join(format!("doc{i}.md")),
            format!("document number {i}"),
        )
        .expect("write");
    }
    d
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_import_keeps_its_subtree_locked_until_it_is_indexed() {
    import_holds_its_subtree("provider = \"filesystem\"");
}

#[test]
fn an_import_holds_its_subtree_with_the_memory_provider() {
    import_holds_its_subtree("provider = \"memory\"");
}

#[test]
fn an_import_holds_its_subtree_with_the_redis_provider() {
    let url = std::env::var("CE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let service = format!("ce-server-test-{}", uuid::Uuid::now_v7().simple());
    import_holds_its_subtree(&format!(
        "provider = \"redis\"\nredis_url = \"{url}\"\nservice_name = \"{service}\""
    ));
}

fn import_holds_its_subtree(lock_config: &str) {
    let data = tempfile::tempdir().expect("tempdir");
    let src = tree_on_disk(12);
    let into = u("ctx://acc/resources/books");
    let cfg = config(lock_config);
    // No workers yet: the import's hold cannot end.
    let e = engine(data.path(), cfg.clone(), false);
    let (report, hold) = e
        .import(src.path(), &into, ImportOptions::default())
        .expect("import");
    let hold = hold.expect("an import that wrote holds its subtree");
    assert_eq!(
        report.nodes_written,
        12 + 4,
        "12 leaves, 3 folders and the root"
    );
    let store = SqliteStore::open(data.path(), cfg.clone()).expect("store");
    let import_seq = store
        .list(&ce_store::OutboxFilter {
            limit: Some(10_000),
            ..ce_store::OutboxFilter::default()
        })
        .expect("outbox")
        .iter()
        .map(|r| r.event.seq)
        .max()
        .expect("the import appended events");
    let holds = store.holds().expect("holds");
    assert_eq!(holds.len(), 1);
    assert_eq!((holds[0].id.as_str(), &holds[0].at), (hold.as_str(), &into));
    let shown = e.status().expect("status").holds;
    assert_eq!(shown.len(), 1, "status lists the hold: {shown:?}");
    assert_eq!(
        (shown[0].id.as_str(), shown[0].at.as_str()),
        (hold.as_str(), into.as_str())
    );

    // The lease was handed off and nobody renews it; within its lifetime an rm is busy.
    let err = e
        .rm(&into, true, None, None)
        .expect_err("rm during the import's hold");
    assert_eq!(err.code(), ErrorCode::Busy, "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("busy"), "{err}");
    // A write next to the subtree is not affected.
    e.rm(&u("ctx://acc/resources"), true, None, None)
        .expect_err("the parent's TREE lock conflicts with the import below it");
    e.put(&u("ctx://acc/notes/x"), text("elsewhere"))
        .expect("unrelated write");
    e.rm(&u("ctx://acc/notes/x"), false, None, None)
        .expect("unrelated rm");
    drop(e);

    // An engine with workers adopts the hold, indexes the import, then ends the hold.
    let e = engine(data.path(), cfg, true);
    wait_until("the hold to end", Duration::from_secs(60), || {
        store.holds().expect("holds").is_empty()
    });
    let status = e.status().expect("status");
    assert!(status.holds.is_empty(), "{:?}", status.holds);
    // Every consumer applied the import's events first (the derive consumer's write-backs
    // append later events, which the indexes apply as ordinary updates).
    for c in &status.consumers {
        assert!(
            c.low_watermark_seq.is_none_or(|seq| seq > import_seq),
            "{} applied the import first: {c:?}",
            c.consumer
        );
    }
    let out = e.rm(&into, true, None, None).expect("rm after the hold");
    assert_eq!(out.nodes_affected, 16);
}

#[test]
fn a_failed_import_leaves_no_hold_and_no_lock() {
    let data = tempfile::tempdir().expect("tempdir");
    let e = engine(data.path(), config(""), false);
    let into = u("ctx://acc/imp");
    let src = tempfile::tempdir().expect("tempdir");
    std::fs::write(src.path().join(".meta.json"), "{ not json").expect("write");
    e.import(src.path(), &into, ImportOptions::default())
        .expect_err("bad layout");
    let store = SqliteStore::open(data.path(), config("")).expect("store");
    assert!(store.holds().expect("holds").is_empty());
    e.put(&u("ctx://acc/imp/a"), text("a")).expect("put");
    e.rm(&into, true, None, None)
        .expect("the import's lock was given back");
}

#[test]
fn a_holder_that_lost_its_lease_cannot_write_after_the_next_holder() {
    let data = tempfile::tempdir().expect("tempdir");
    let cfg = config("lock_expire_secs = 1.0\n");
    let e = engine(data.path(), cfg.clone(), false);
    e.put(&u("ctx://acc/docs/a"), text("a")).expect("put");
    let store = SqliteStore::open(data.path(), cfg.clone()).expect("store");
    let locks = LockManager::from_config(&cfg.lock, data.path()).expect("locks");

    // The first holder takes the subtree, then stalls past its lease: the lease is handed
    // off (nobody renews it), as a paused process would stop renewing.
    let first = locks
        .acquire(&[LockRequest::tree(u("ctx://acc/docs"))])
        .expect("first");
    let stale_fences = write_fences(&first);
    let _stalled = first.hand_off();
    std::thread::sleep(Duration::from_millis(1_300));

    // The next holder gets the lock once the first is stale, and writes.
    e.rm(&u("ctx://acc/docs/a"), false, None, None)
        .expect("the next holder removes a");
    // The first holder wakes up and tries to write with its old token: refused, nothing
    // written.
    let err = store
        .apply_fenced(
            &stale_fences,
            vec![WriteOp::Put {
                uri: u("ctx://acc/docs/a"),
                req: text("resurrected by a stale holder"),
            }],
        )
        .expect_err("stale holder");
    assert_eq!(err.code(), ErrorCode::LeaseLost, "{err}");
    assert!(
        store
            .read_node(&u("ctx://acc/docs/a"))
            .expect("read")
            .is_none()
    );
}

#[test]
fn rm_of_a_missing_path_cleans_leftover_index_records() {
    let data = tempfile::tempdir().expect("tempdir");
    let cfg = config("");
    let e = engine(data.path(), cfg.clone(), false);
    e.put(&u("ctx://acc/docs/a"), text("alpha")).expect("put");
    e.drain(&|_| {}).expect("drain");
    let indexed = |e: &Engine| e.status().expect("status").index_records;
    assert!(indexed(&e) > 0);
    // Remove the node behind the engine's back in a way that leaves the index records: the
    // source forgets it, but its DELETE event is dropped (a crash between two steps of an
    // older version, an index restored from a backup).
    let store = SqliteStore::open(data.path(), cfg.clone()).expect("store");
    store
        .rm(&u("ctx://acc/docs/a"), false, None, None)
        .expect("rm");
    assert!(store.stats().expect("stats").iter().all(|s| s.pending > 0));
    drop(e);
    // Simulate the lost event: mark every pending delivery done without applying it.
    for c in ["vector", "keyword", "relation"] {
        loop {
            let batch = store.claim_batch(c, "eater", 100).expect("claim");
            if batch.is_empty() {
                break;
            }
            for ev in &batch {
                store.mark_done(&ev.claim).expect("done");
            }
        }
    }
    let e = engine(data.path(), cfg, false);
    e.drain(&|_| {}).expect("drain");
    assert!(indexed(&e) > 0, "the leftover records are still there");
    let err = e
        .rm(&u("ctx://acc/docs/a"), false, None, None)
        .expect_err("already gone");
    assert_eq!(err.code(), ErrorCode::NotFound);
    e.drain(&|_| {}).expect("drain");
    assert_eq!(
        indexed(&e),
        0,
        "rm of the missing path removed the leftovers"
    );
}

#[test]
fn rm_and_mv_release_their_locks() {
    let data = tempfile::tempdir().expect("tempdir");
    let cfg = config("");
    let e = engine(data.path(), cfg.clone(), false);
    e.put(&u("ctx://acc/a/x"), text("x")).expect("put");
    e.mv(&u("ctx://acc/a"), &u("ctx://acc/b"), None)
        .expect("mv");
    // A move between accounts locks in both provider scopes.
    e.mv(&u("ctx://acc/b"), &u("ctx://acc2/b"), None)
        .expect("mv across accounts");
    e.mv(&u("ctx://acc2/b"), &u("ctx://acc/b"), None)
        .expect("and back");
    e.rm(&u("ctx://acc/b"), true, None, None).expect("rm");
    // Nothing is left locked: another manager on the same lock directory takes every path.
    let locks = LockManager::from_config(&cfg.lock, data.path()).expect("locks");
    for p in [
        "ctx://acc/a",
        "ctx://acc/b",
        "ctx://acc/b/x",
        "ctx://acc2/b",
    ] {
        locks
            .try_acquire(&[LockRequest::tree(u(p))])
            .unwrap_or_else(|err| panic!("{p} still locked: {err}"));
    }
}

#[test]
fn a_reader_never_sees_a_moving_node_at_both_or_neither_uri() {
    let data = tempfile::tempdir().expect("tempdir");
    let cfg = config("");
    let e = std::sync::Arc::new(engine(data.path(), cfg.clone(), false));
    let (a, b) = (u("ctx://acc/left/n"), u("ctx://acc/right/n"));
    e.put(&a, text("moving")).expect("put");
    e.put(&u("ctx://acc/right/other"), text("x")).expect("put");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, a, b) = (stop.clone(), a.clone(), b.clone());
        let store = SqliteStore::open(data.path(), cfg).expect("store");
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let found = store
                    .read_nodes(&[a.clone(), b.clone()])
                    .expect("read")
                    .len();
                assert_eq!(
                    found, 1,
                    "read {reads}: the node at {found} of its two URIs"
                );
                reads += 1;
            }
            reads
        })
    };
    for i in 0..100 {
        let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        e.mv(from, to, None).expect("mv");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let reads = reader.join().expect("reader");
    assert!(reads > 0);
}

#[test]
fn http_rm_of_a_locked_subtree_is_a_retryable_409_with_retry_after() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use ce_server::http::{AppState, KeyRing, router};
    use tower::ServiceExt as _;

    let data = tempfile::tempdir().expect("tempdir");
    let e = std::sync::Arc::new(engine(data.path(), config(""), false));
    let src = tree_on_disk(3);
    e.import(src.path(), &u("ctx://acc/imp"), ImportOptions::default())
        .expect("import");
    let app = router(
        AppState {
            engine: e.clone(),
            metrics: None,
            keys: std::sync::Arc::new(KeyRing::open()),
        },
        1 << 20,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let req = Request::post("/v1/rm")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"uri": "ctx://acc/imp", "recursive": true}"#))
        .expect("request");
    let res = rt.block_on(app.oneshot(req)).expect("infallible");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(
        res.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let body = rt
        .block_on(axum::body::to_bytes(res.into_body(), 1 << 16))
        .expect("body");
    let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(json["code"], "busy", "{json}");
    assert_eq!(json["retryable"], true, "{json}");
    assert!(
        json["message"]
            .as_str()
            .is_some_and(|m| m.contains("ctx://acc/imp")),
        "{json}"
    );
}

#[test]
fn a_second_import_of_the_same_target_takes_over_the_first_ones_hold() {
    let data = tempfile::tempdir().expect("tempdir");
    let e = engine(data.path(), config(""), false);
    let into = u("ctx://acc/kb");
    let (_, first) = e
        .import(tree_on_disk(3).path(), &into, ImportOptions::default())
        .expect("first import");
    let (_, second) = e
        .import(tree_on_disk(5).path(), &into, ImportOptions::default())
        .expect("a re-import does not wait for the first one's lease");
    assert_ne!(first, second);
    let second = second.expect("the second import wrote");
    let store = SqliteStore::open(data.path(), config("")).expect("store");
    let holds = store.holds().expect("holds");
    assert_eq!(
        holds.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
        [second.as_str()],
        "the second hold supersedes the first"
    );
    // Another target is not affected, and the subtree stays protected from rm.
    e.import(
        tree_on_disk(2).path(),
        &u("ctx://acc/other"),
        ImportOptions::default(),
    )
    .expect("another target");
    assert_eq!(
        e.rm(&into, true, None, None).expect_err("held").code(),
        ErrorCode::Busy
    );
}

#[test]
fn a_one_shot_drain_ends_the_holds_it_applied() {
    let data = tempfile::tempdir().expect("tempdir");
    let e = engine(data.path(), config(""), false);
    let into = u("ctx://acc/kb");
    e.import(tree_on_disk(4).path(), &into, ImportOptions::default())
        .expect("import");
    assert_eq!(e.status().expect("status").holds.len(), 1);
    assert_eq!(
        e.rm(&into, true, None, None).expect_err("held").code(),
        ErrorCode::Busy
    );
    // `ce worker --once`: the drain applies the import and ends its hold.
    e.drain(&|_| {}).expect("drain");
    assert!(e.status().expect("status").holds.is_empty());
    e.rm(&into, true, None, None)
        .expect("the subtree is free once indexed");
}

#[test]
fn an_import_that_changes_nothing_holds_nothing_unless_an_earlier_one_still_waits() {
    let data = tempfile::tempdir().expect("tempdir");
    let e = engine(data.path(), config(""), false);
    let into = u("ctx://acc/kb");
    let src = tree_on_disk(4);
    let (_, first) = e
        .import(src.path(), &into, ImportOptions::default())
        .expect("import");
    let first = first.expect("the first import wrote");
    // Unchanged, but the first import's events still wait: its hold carries on as this one.
    let (report, again) = e
        .import(src.path(), &into, ImportOptions::default())
        .expect("re-import");
    assert_eq!((report.events, report.nodes_written), (0, 0));
    let again = again.expect("the earlier hold is superseded, not dropped");
    let err = e.rm(&into, true, None, None).expect_err("held");
    assert_eq!(err.code(), ErrorCode::Busy, "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&again) && !msg.contains(&first), "{msg}");
    e.drain(&|_| {}).expect("drain");
    let (_, none) = e
        .import(src.path(), &into, ImportOptions::default())
        .expect("re-import after indexing");
    assert_eq!(none, None, "nothing to index, nothing held");
    assert!(e.status().expect("status").holds.is_empty());
    e.rm(&into, true, None, None).expect("free at once");
}
